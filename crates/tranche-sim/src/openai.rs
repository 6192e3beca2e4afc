//! The OpenAI surface: Files and Batches routes under `/v1`, bearer auth, and the wire shapes
//! (file and batch objects, list pages, result lines, errors) as the OpenAI spec describes them.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, FromRequest, Multipart, Path, Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::BytesMut;
use serde_json::{Map, Value, json};

use crate::AppState;
use crate::clock::secs;
use crate::config::LineFaultKind;
use crate::state::{
    self, BatchRecord, DEFAULT_FILE_EXPIRY_SECONDS, Dialect, FileRecord, LineKind, LineResult,
    NewBatch, Provider, Sink, StoreError, lock, new_id,
};
use crate::validate::Limits;

const PROVIDER: Provider = Provider::OpenAi;

/// Purposes a client may upload with.
const UPLOAD_PURPOSES: [&str; 6] =
    ["assistants", "batch", "fine-tune", "vision", "user_data", "evals"];

/// `CreateBatchRequest.endpoint` enum.
const BATCH_ENDPOINTS: [&str; 8] = [
    "/v1/responses",
    "/v1/chat/completions",
    "/v1/embeddings",
    "/v1/completions",
    "/v1/moderations",
    "/v1/images/generations",
    "/v1/images/edits",
    "/v1/videos",
];

/// `CreateBatchRequest` fields.
const CREATE_BATCH_FIELDS: [&str; 5] =
    ["input_file_id", "endpoint", "completion_window", "metadata", "output_expires_after"];

/// Bounds of `expires_after.seconds` and `output_expires_after.seconds`.
const MIN_EXPIRY_SECONDS: i64 = 3_600;
const MAX_EXPIRY_SECONDS: i64 = 2_592_000;

/// Stream file content in pieces of this size.
const CONTENT_CHUNK: usize = 64 * 1024;

/// The OpenAI routes, with bearer auth on each of them.
pub(crate) fn router(state: AppState) -> Router<AppState> {
    Router::new()
        .route("/v1/files", post(upload_file).layer(DefaultBodyLimit::disable()).get(list_files))
        .route("/v1/files/{file_id}", get(retrieve_file).delete(delete_file))
        .route("/v1/files/{file_id}/content", get(file_content))
        .route("/v1/batches", post(create_batch).get(list_batches))
        .route("/v1/batches/{batch_id}", get(retrieve_batch))
        .route("/v1/batches/{batch_id}/cancel", post(cancel_batch))
        .route_layer(middleware::from_fn_with_state(state, auth))
        .layer(middleware::map_response(with_request_id))
}

// ---------------------------------------------------------------------------------------------
// Errors

/// An error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`, all four keys
/// always present.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    status: StatusCode,
    message: String,
    kind: &'static str,
    param: Option<String>,
    code: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), kind, param: None, code: None }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", message)
    }

    fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    fn param(mut self, param: &str) -> Self {
        self.param = Some(param.to_owned());
        self
    }

    fn code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    fn missing(param: &str) -> Self {
        Self::invalid(format!("Missing required parameter: '{param}'."))
            .param(param)
            .code("missing_required_parameter")
    }

    fn bad_value(param: &str, message: String) -> Self {
        Self::invalid(message).param(param).code("invalid_value")
    }

    fn unknown_argument(name: &str) -> Self {
        Self::invalid(format!("Unrecognized request argument supplied: {name}"))
    }

    fn no_such_file(id: &str) -> Self {
        Self::not_found(format!("No such File object: {id}")).param("id")
    }

    fn no_such_batch(id: &str) -> Self {
        Self::not_found(format!("No batch found with id '{id}'."))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        });
        (self.status, axum::Json(body)).into_response()
    }
}

/// The answer for a path or method that does not exist, as OpenAI gives it.
pub(crate) async fn invalid_url(req: Request) -> ApiError {
    ApiError::not_found(format!("Invalid URL ({} {})", req.method(), req.uri().path()))
}

// ---------------------------------------------------------------------------------------------
// Middleware

async fn auth(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim)
        .filter(|t| !t.is_empty());
    let Some(token) = token else {
        return ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
        )
        .into_response();
    };
    let accepted = match &lock(&state.sim).config.api_key {
        Some(expected) => expected == token,
        None => true,
    };
    if !accepted {
        // The key itself is never echoed back.
        return ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "Incorrect API key provided.",
        )
        .code("invalid_api_key")
        .into_response();
    }
    next.run(req).await
}

async fn with_request_id(mut res: Response) -> Response {
    if let Ok(v) = HeaderValue::from_str(&new_id("req_")) {
        res.headers_mut().insert("x-request-id", v);
    }
    res
}

// ---------------------------------------------------------------------------------------------
// Files

fn file_json(f: &FileRecord) -> Value {
    json!({
        "id": f.id,
        "object": "file",
        "bytes": f.bytes(),
        "created_at": f.created_at,
        "expires_at": f.expires_at,
        "filename": f.filename,
        "purpose": f.purpose,
        "status": "processed",
        "status_details": null,
    })
}

/// Parses an expiry given as text form fields or JSON values.
fn parse_expiry(
    anchor: Option<&str>,
    seconds: Option<&str>,
    prefix: &str,
) -> Result<Option<i64>, ApiError> {
    let anchor_param = format!("{prefix}.anchor");
    let seconds_param = format!("{prefix}.seconds");
    match (anchor, seconds) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err(ApiError::missing(&anchor_param)),
        (Some(_), None) => Err(ApiError::missing(&seconds_param)),
        (Some(anchor), Some(seconds)) => {
            if anchor != "created_at" {
                return Err(ApiError::bad_value(
                    &anchor_param,
                    format!("Invalid value: '{anchor}'. Supported values are: 'created_at'."),
                ));
            }
            let Ok(n) = seconds.trim().parse::<i64>() else {
                return Err(ApiError::invalid(format!(
                    "Invalid '{seconds_param}': expected an integer, but got '{seconds}' instead."
                ))
                .param(&seconds_param)
                .code("invalid_type"));
            };
            check_expiry_range(n, &seconds_param).map(Some)
        }
    }
}

fn check_expiry_range(n: i64, param: &str) -> Result<i64, ApiError> {
    if n < MIN_EXPIRY_SECONDS {
        return Err(ApiError::invalid(format!(
            "Invalid '{param}': integer below minimum value. Expected a value >= {MIN_EXPIRY_SECONDS}, but got {n} instead."
        ))
        .param(param)
        .code("integer_below_min_value"));
    }
    if n > MAX_EXPIRY_SECONDS {
        return Err(ApiError::invalid(format!(
            "Invalid '{param}': integer above maximum value. Expected a value <= {MAX_EXPIRY_SECONDS}, but got {n} instead."
        ))
        .param(param)
        .code("integer_above_max_value"));
    }
    Ok(n)
}

fn multipart_error(e: impl std::fmt::Display) -> ApiError {
    ApiError::invalid(format!("Could not parse multipart form: {e}"))
}

async fn upload_file(State(state): State<AppState>, req: Request) -> Result<Response, ApiError> {
    let max_bytes = lock(&state.sim).config.max_file_bytes;
    let max_bytes = usize::try_from(max_bytes).unwrap_or(usize::MAX);
    let mut multipart = Multipart::from_request(req, &state).await.map_err(multipart_error)?;

    let mut content: Option<Bytes> = None;
    let mut filename = None;
    let mut too_large = false;
    let mut purpose = None;
    let mut anchor = None;
    let mut seconds = None;
    let mut unknown = None;
    while let Some(mut field) = multipart.next_field().await.map_err(multipart_error)? {
        let name = field.name().unwrap_or_default().to_owned();
        match name.as_str() {
            "file" => {
                filename = Some(field.file_name().unwrap_or("upload").to_owned());
                let mut buf = BytesMut::new();
                // Read to the end even when too large, so the client gets the answer, not a reset.
                while let Some(chunk) = field.chunk().await.map_err(multipart_error)? {
                    if too_large || buf.len() + chunk.len() > max_bytes {
                        too_large = true;
                        buf = BytesMut::new();
                        continue;
                    }
                    buf.extend_from_slice(&chunk);
                }
                content = Some(buf.freeze());
            }
            "purpose" => purpose = Some(field.text().await.map_err(multipart_error)?),
            "expires_after[anchor]" | "expires_after.anchor" => {
                anchor = Some(field.text().await.map_err(multipart_error)?);
            }
            "expires_after[seconds]" | "expires_after.seconds" => {
                seconds = Some(field.text().await.map_err(multipart_error)?);
            }
            _ => {
                unknown.get_or_insert(name);
                // Drain it; the request is refused once the whole form has been read.
                while field.chunk().await.map_err(multipart_error)?.is_some() {}
            }
        }
    }
    if let Some(name) = unknown {
        return Err(ApiError::unknown_argument(&name));
    }
    if too_large {
        return Err(ApiError::invalid("File is too large."));
    }
    let (Some(content), Some(filename)) = (content, filename) else {
        return Err(ApiError::missing("file"));
    };
    let Some(purpose) = purpose else {
        return Err(ApiError::missing("purpose"));
    };
    if !UPLOAD_PURPOSES.contains(&purpose.as_str()) {
        return Err(ApiError::bad_value(
            "purpose",
            format!(
                "Invalid value: '{purpose}'. Supported values are: 'assistants', 'batch', 'fine-tune', 'vision', 'user_data', and 'evals'."
            ),
        ));
    }
    if purpose == "batch" && !filename.ends_with(".jsonl") {
        return Err(ApiError::invalid("Invalid file format for Batch API. Must be .jsonl"));
    }
    let expiry = parse_expiry(anchor.as_deref(), seconds.as_deref(), "expires_after")?;
    // "By default, files with purpose=batch expire after 30 days".
    let expiry = expiry.or((purpose == "batch").then_some(DEFAULT_FILE_EXPIRY_SECONDS));
    let record = lock(&state.sim).upload_file(PROVIDER, purpose, filename, content, expiry);
    Ok(axum::Json(file_json(&record)).into_response())
}

fn parse_limit(
    query: &HashMap<String, String>,
    default: usize,
    max: usize,
) -> Result<usize, ApiError> {
    let Some(raw) = query.get("limit") else {
        return Ok(default);
    };
    match raw.parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(ApiError::invalid(format!(
            "Invalid 'limit': expected an integer between 1 and {max}, but got '{raw}' instead."
        ))
        .param("limit")
        .code("invalid_value")),
    }
}

fn list_json(data: Vec<Value>, has_more: bool) -> Value {
    let first_id = data.first().and_then(|v| v.get("id")).cloned();
    let last_id = data.last().and_then(|v| v.get("id")).cloned();
    json!({
        "object": "list",
        "data": data,
        "first_id": first_id,
        "last_id": last_id,
        "has_more": has_more,
    })
}

async fn list_files(
    State(state): State<AppState>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<axum::Json<Value>, ApiError> {
    let limit = parse_limit(&query, 10_000, 10_000)?;
    let descending = match query.get("order").map(String::as_str) {
        None | Some("desc") => true,
        Some("asc") => false,
        Some(other) => {
            return Err(ApiError::bad_value(
                "order",
                format!("Invalid value: '{other}'. Supported values are: 'asc' and 'desc'."),
            ));
        }
    };
    let purpose = query.get("purpose").map(String::as_str);
    let after = query.get("after").map(String::as_str);
    let mut sim = lock(&state.sim);
    sim.sync();
    let (page, has_more) = sim.files.page(PROVIDER, purpose, descending, after, limit);
    let data = page.into_iter().map(file_json).collect();
    Ok(axum::Json(list_json(data, has_more)))
}

async fn retrieve_file(
    State(state): State<AppState>,
    Path(file_id): Path<String>,
) -> Result<axum::Json<Value>, ApiError> {
    let file = lock(&state.sim)
        .file(PROVIDER, &file_id)
        .ok_or_else(|| ApiError::no_such_file(&file_id))?;
    Ok(axum::Json(file_json(&file)))
}

async fn delete_file(
    State(state): State<AppState>,
    Path(file_id): Path<String>,
) -> Result<axum::Json<Value>, ApiError> {
    lock(&state.sim)
        .delete_file(PROVIDER, &file_id)
        .map_err(|_| ApiError::no_such_file(&file_id))?;
    Ok(axum::Json(json!({"id": file_id, "object": "file", "deleted": true})))
}

async fn file_content(
    State(state): State<AppState>,
    Path(file_id): Path<String>,
) -> Result<Response, ApiError> {
    let file = lock(&state.sim)
        .file(PROVIDER, &file_id)
        .ok_or_else(|| ApiError::no_such_file(&file_id))?;
    let content = file.content;
    let len = content.len();
    // Zero-copy slices of the stored body, sent one after another.
    let chunks = (0..len.div_ceil(CONTENT_CHUNK)).map(move |i| {
        let start = i * CONTENT_CHUNK;
        Ok::<_, Infallible>(content.slice(start..(start + CONTENT_CHUNK).min(len)))
    });
    let body = Body::from_stream(futures::stream::iter(chunks));
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::CONTENT_LENGTH, len)
        .body(body)
        .map_err(|e| ApiError::internal(format!("cannot build the response: {e}")))
}

// ---------------------------------------------------------------------------------------------
// Batches

fn opt_secs(t: Option<f64>) -> Option<i64> {
    t.map(secs)
}

fn batch_json(b: &BatchRecord) -> Value {
    let errors = b.errors.as_ref().map(|errs| {
        let data: Vec<Value> = errs
            .iter()
            .map(
                |e| json!({"code": e.code, "message": e.message, "param": e.param, "line": e.line}),
            )
            .collect();
        json!({"object": "list", "data": data})
    });
    json!({
        "id": b.id,
        "object": "batch",
        "endpoint": b.endpoint,
        "model": b.model,
        "errors": errors,
        "input_file_id": b.input_file_id,
        "completion_window": b.completion_window,
        "status": b.status.as_str(),
        "output_file_id": b.output_file_id,
        "error_file_id": b.error_file_id,
        "created_at": secs(b.created_at),
        "in_progress_at": opt_secs(b.in_progress_at),
        "expires_at": secs(b.expires_at),
        "finalizing_at": opt_secs(b.finalizing_at),
        "completed_at": opt_secs(b.completed_at),
        "failed_at": opt_secs(b.failed_at),
        "expired_at": opt_secs(b.expired_at),
        "cancelling_at": opt_secs(b.cancelling_at),
        "cancelled_at": opt_secs(b.cancelled_at),
        "request_counts": {
            "total": b.request_counts.total,
            "completed": b.request_counts.completed,
            "failed": b.request_counts.failed,
        },
        "usage": {
            "input_tokens": b.usage.input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": b.usage.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": b.usage.input_tokens + b.usage.output_tokens,
        },
        "metadata": b.metadata,
    })
}

fn parse_json_object(body: &Bytes) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ApiError::invalid("The request body must be a JSON object.")),
        Err(e) => Err(ApiError::invalid(format!(
            "We could not parse the JSON body of your request. ({e})"
        ))),
    }
}

fn required_str<'a>(obj: &'a Map<String, Value>, key: &str) -> Result<&'a str, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Err(ApiError::missing(key)),
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(ApiError::invalid(format!("Invalid type for '{key}': expected a string."))
            .param(key)
            .code("invalid_type")),
    }
}

fn check_metadata(value: Option<&Value>) -> Result<Option<Map<String, Value>>, ApiError> {
    let map = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(map)) => map,
        Some(_) => {
            return Err(ApiError::invalid("Invalid type for 'metadata': expected an object.")
                .param("metadata")
                .code("invalid_type"));
        }
    };
    if map.len() > 16 {
        return Err(ApiError::invalid(format!(
            "Invalid 'metadata': too many properties. Expected an object with at most 16 properties, but got an object with {} properties instead.",
            map.len()
        ))
        .param("metadata")
        .code("object_above_max_properties"));
    }
    for (k, v) in map {
        if k.chars().count() > 64 {
            return Err(ApiError::invalid(format!(
                "Invalid 'metadata': key '{k}' is longer than 64 characters."
            ))
            .param("metadata")
            .code("string_above_max_length"));
        }
        let Some(s) = v.as_str() else {
            return Err(ApiError::invalid(format!(
                "Invalid type for 'metadata.{k}': expected a string."
            ))
            .param(&format!("metadata.{k}"))
            .code("invalid_type"));
        };
        if s.chars().count() > 512 {
            return Err(ApiError::invalid(format!(
                "Invalid 'metadata.{k}': string too long. Expected a string with maximum length 512."
            ))
            .param(&format!("metadata.{k}"))
            .code("string_above_max_length"));
        }
    }
    Ok(Some(map.clone()))
}

fn check_output_expiry(value: Option<&Value>) -> Result<i64, ApiError> {
    let obj = match value {
        None | Some(Value::Null) => return Ok(DEFAULT_FILE_EXPIRY_SECONDS),
        Some(Value::Object(obj)) => obj,
        Some(_) => {
            return Err(ApiError::invalid(
                "Invalid type for 'output_expires_after': expected an object.",
            )
            .param("output_expires_after")
            .code("invalid_type"));
        }
    };
    if let Some(extra) = obj.keys().find(|k| *k != "anchor" && *k != "seconds") {
        return Err(ApiError::unknown_argument(&format!("output_expires_after.{extra}")));
    }
    let anchor = match obj.get("anchor") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => Some(other.to_string()),
    };
    let seconds = match obj.get("seconds") {
        None => None,
        Some(Value::Number(n)) => Some(n.to_string()),
        Some(other) => Some(other.to_string()),
    };
    parse_expiry(anchor.as_deref(), seconds.as_deref(), "output_expires_after")
        .map(|e| e.unwrap_or(DEFAULT_FILE_EXPIRY_SECONDS))
}

/// OpenAI's batch rules and result-line shapes.
#[derive(Debug)]
pub(crate) struct OpenAiDialect;

/// A JSON string literal (escaped by serde_json's own code).
fn quoted(s: &str) -> String {
    Value::from(s).to_string()
}

/// One result line, `{"id", "custom_id", "response", "error"}` in the documented key order.
/// Built by hand because it is the hot path of a 50,000-line batch: `Value`'s Display is compiled
/// inside serde_json, generic serializers at this crate's (debug) optimization level.
fn result_line(
    line: &LineResult<'_>,
    response: Option<(u16, &Value)>,
    error: Option<(&str, &str)>,
) -> Vec<u8> {
    let response = match response {
        Some((status, body)) => format!(
            r#"{{"status_code":{status},"request_id":{},"body":{body}}}"#,
            quoted(line.request_id)
        ),
        None => "null".to_owned(),
    };
    let error = match error {
        Some((code, message)) => {
            format!(r#"{{"code":{},"message":{}}}"#, quoted(code), quoted(message))
        }
        None => "null".to_owned(),
    };
    format!(
        r#"{{"id":{},"custom_id":{},"response":{response},"error":{error}}}"#,
        quoted(line.line_id),
        quoted(line.custom_id)
    )
    .into_bytes()
}

fn http_error_body(message: &str, kind: &str, param: Option<&str>, code: Option<&str>) -> Value {
    json!({"error": {"message": message, "type": kind, "param": param, "code": code}})
}

impl Dialect for OpenAiDialect {
    fn provider(&self) -> Provider {
        PROVIDER
    }

    fn limits(&self) -> Limits {
        Limits { max_tasks: 50_000, max_embedding_inputs: 50_000, max_input_bytes: 209_715_200 }
    }

    fn render(&self, line: &LineResult<'_>) -> (Sink, Vec<u8>) {
        let error_body;
        let (sink, response, error) = match &line.kind {
            LineKind::Succeeded(body) => (Sink::Output, Some((200, *body)), None),
            LineKind::Fault(LineFaultKind::Fatal) => {
                error_body = http_error_body(
                    "This model's maximum context length is 128000 tokens. However, your messages resulted in 131072 tokens. Please reduce the length of the messages.",
                    "invalid_request_error",
                    Some("messages"),
                    Some("context_length_exceeded"),
                );
                (Sink::Error, Some((400, &error_body)), None)
            }
            LineKind::Fault(LineFaultKind::Retryable) => {
                error_body = http_error_body(
                    "The server had an error while processing your request. Sorry about that!",
                    "server_error",
                    None,
                    None,
                );
                (Sink::Error, Some((500, &error_body)), None)
            }
            LineKind::Invalid(rejection) => {
                error_body = http_error_body(
                    &rejection.message,
                    "invalid_request_error",
                    rejection.param.as_deref(),
                    None,
                );
                (Sink::Error, Some((400, &error_body)), None)
            }
            LineKind::Expired => (
                Sink::Error,
                None,
                Some((
                    "batch_expired",
                    "This request could not be executed before the completion window expired.",
                )),
            ),
            LineKind::Cancelled => (
                Sink::Error,
                None,
                Some((
                    "batch_cancelled",
                    "This request was not executed because the batch was cancelled.",
                )),
            ),
        };
        (sink, result_line(line, response, error))
    }
}

async fn create_batch(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<axum::Json<Value>, ApiError> {
    let obj = parse_json_object(&body)?;
    if let Some(extra) = obj.keys().find(|k| !CREATE_BATCH_FIELDS.contains(&k.as_str())) {
        return Err(ApiError::unknown_argument(extra));
    }
    let input_file_id = required_str(&obj, "input_file_id")?.to_owned();
    let endpoint = required_str(&obj, "endpoint")?.to_owned();
    if !BATCH_ENDPOINTS.contains(&endpoint.as_str()) {
        return Err(ApiError::bad_value(
            "endpoint",
            format!(
                "Invalid value: '{endpoint}'. Supported values are: {}.",
                BATCH_ENDPOINTS.map(|e| format!("'{e}'")).join(", ")
            ),
        ));
    }
    let completion_window = required_str(&obj, "completion_window")?.to_owned();
    if completion_window != "24h" {
        return Err(ApiError::bad_value(
            "completion_window",
            format!("Invalid value: '{completion_window}'. Supported values are: '24h'."),
        ));
    }
    let metadata = check_metadata(obj.get("metadata"))?;
    let output_expires_seconds = check_output_expiry(obj.get("output_expires_after"))?;

    let input = lock(&state.sim)
        .batch_input(PROVIDER, &input_file_id)
        .map_err(|e| match e {
            StoreError::WrongPurpose(p) => ApiError::invalid(format!(
                "Invalid 'input_file_id': file {input_file_id} has purpose '{p}', but a batch input file must be uploaded with purpose 'batch'."
            ))
            .param("input_file_id"),
            _ => ApiError::invalid(format!("No such File object: {input_file_id}"))
                .param("input_file_id"),
        })?;
    let dialect: Arc<dyn Dialect> = Arc::new(OpenAiDialect);
    let limits = dialect.limits();
    let ep = endpoint.clone();
    // Validation of a large file is CPU work: keep it off the async workers and out of the lock.
    let (verdict, order) =
        tokio::task::spawn_blocking(move || state::plan_batch(&input, &ep, limits))
            .await
            .map_err(|e| ApiError::internal(format!("batch validation failed: {e}")))?;
    let new = NewBatch {
        dialect,
        endpoint,
        input_file_id,
        completion_window,
        metadata,
        output_expires_seconds,
    };
    let mut sim = lock(&state.sim);
    let batch = sim.insert_batch(new, verdict, order);
    Ok(axum::Json(batch_json(batch)))
}

async fn list_batches(
    State(state): State<AppState>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<axum::Json<Value>, ApiError> {
    let limit = parse_limit(&query, 20, 100)?;
    let after = query.get("after").map(String::as_str);
    let mut sim = lock(&state.sim);
    let (page, has_more) = sim.batch_page(PROVIDER, after, limit);
    let data = page.into_iter().map(batch_json).collect();
    Ok(axum::Json(list_json(data, has_more)))
}

async fn retrieve_batch(
    State(state): State<AppState>,
    Path(batch_id): Path<String>,
) -> Result<axum::Json<Value>, ApiError> {
    let mut sim = lock(&state.sim);
    let batch = sim.batch(PROVIDER, &batch_id).ok_or_else(|| ApiError::no_such_batch(&batch_id))?;
    Ok(axum::Json(batch_json(batch)))
}

async fn cancel_batch(
    State(state): State<AppState>,
    Path(batch_id): Path<String>,
) -> Result<axum::Json<Value>, ApiError> {
    let mut sim = lock(&state.sim);
    match sim.cancel_batch(PROVIDER, &batch_id) {
        Ok(batch) => Ok(axum::Json(batch_json(batch))),
        Err(StoreError::CannotCancel(status)) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "invalid_request_error",
            format!("Cannot cancel a batch with status '{}'.", status.as_str()),
        )),
        Err(_) => Err(ApiError::no_such_batch(&batch_id)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::BatchStatus;

    #[test]
    fn expiry_forms_and_bounds() {
        assert_eq!(parse_expiry(None, None, "expires_after").unwrap(), None);
        assert_eq!(
            parse_expiry(Some("created_at"), Some("3600"), "expires_after").unwrap(),
            Some(3600)
        );
        let e = parse_expiry(Some("created_at"), Some("60"), "expires_after").unwrap_err();
        assert_eq!(e.code, Some("integer_below_min_value"));
        assert_eq!(e.param.as_deref(), Some("expires_after.seconds"));
        let e = parse_expiry(Some("created_at"), Some("2592001"), "x").unwrap_err();
        assert_eq!(e.code, Some("integer_above_max_value"));
        let e = parse_expiry(Some("last_active_at"), Some("3600"), "x").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("x.anchor"));
        assert!(parse_expiry(Some("created_at"), None, "x").is_err());
        assert!(parse_expiry(Some("created_at"), Some("soon"), "x").is_err());
    }

    #[test]
    fn output_expiry_from_json() {
        assert_eq!(check_output_expiry(None).unwrap(), DEFAULT_FILE_EXPIRY_SECONDS);
        let v = json!({"anchor": "created_at", "seconds": 7200});
        assert_eq!(check_output_expiry(Some(&v)).unwrap(), 7200);
        let v = json!({"anchor": "created_at", "seconds": 10});
        assert!(check_output_expiry(Some(&v)).is_err());
        let v = json!({"anchor": "created_at", "seconds": 7200.5});
        assert!(check_output_expiry(Some(&v)).is_err());
    }

    #[test]
    fn metadata_limits() {
        let many: Map<String, Value> = (0..17).map(|i| (format!("k{i}"), json!("v"))).collect();
        assert!(check_metadata(Some(&Value::Object(many))).is_err());
        assert!(check_metadata(Some(&json!({"k".repeat(65): "v"}))).is_err());
        assert!(check_metadata(Some(&json!({"k": "v".repeat(513)}))).is_err());
        assert!(check_metadata(Some(&json!({"k": 1}))).is_err());
        assert!(check_metadata(Some(&json!({"k": "v"}))).unwrap().is_some());
    }

    #[test]
    fn result_lines_have_the_documented_shapes() {
        let d = OpenAiDialect;
        let body = json!({"object": "chat.completion"});
        let line = |kind| LineResult {
            custom_id: "c1",
            line_id: "batch_req_1",
            request_id: "req_1",
            kind,
        };
        let parse = |(sink, bytes): (Sink, Vec<u8>)| {
            (sink, serde_json::from_slice::<Value>(&bytes).unwrap())
        };

        let (sink, v) = parse(d.render(&line(LineKind::Succeeded(&body))));
        assert_eq!(sink, Sink::Output);
        assert_eq!(v["response"]["status_code"], 200);
        assert_eq!(v["response"]["body"], body);
        assert_eq!(v["error"], Value::Null);

        let (sink, v) = parse(d.render(&line(LineKind::Fault(LineFaultKind::Fatal))));
        assert_eq!(sink, Sink::Error);
        assert_eq!(v["response"]["status_code"], 400);
        assert_eq!(v["response"]["body"]["error"]["code"], "context_length_exceeded");
        assert_eq!(v["error"], Value::Null);

        let (_, v) = parse(d.render(&line(LineKind::Fault(LineFaultKind::Retryable))));
        assert_eq!(v["response"]["status_code"], 500);
        assert_eq!(v["response"]["body"]["error"]["type"], "server_error");

        let (sink, v) = parse(d.render(&line(LineKind::Expired)));
        assert_eq!(sink, Sink::Error);
        assert_eq!(v["response"], Value::Null);
        assert_eq!(v["error"]["code"], "batch_expired");
        assert_eq!(v["id"], "batch_req_1");
        assert_eq!(v["custom_id"], "c1");
    }

    #[test]
    fn statuses_render_lowercase() {
        assert_eq!(BatchStatus::InProgress.as_str(), "in_progress");
    }
}
