//! The OpenAI-shaped surfaces: Files and Batches as OpenAI serves them under `/v1` (bearer auth),
//! and as Azure OpenAI serves them under `/openai/v1` and the legacy `/openai/...?api-version=`
//! (`api-key` header or bearer). One set of handlers serves all three; a [`Surface`] carries the
//! differences: auth, api-version, error shape, expiry bounds, the Azure file quota, deployment
//! names, limits, and Azure's legacy wire quirks.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::multipart::Field;
use axum::extract::{DefaultBodyLimit, FromRequest, Multipart, Path, Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use serde_json::{Map, Value, json};
use tokio::io::AsyncWriteExt;

use crate::AppState;
use crate::clock::secs;
use crate::config::{LineFaultKind, SimConfig};
use crate::faults;
use crate::model::{self, ModelOutput, ModelRejection, RunContext};
use crate::spool::{FileBody, Spool};
use crate::state::{
    self, BatchRecord, BatchStatus, DEFAULT_FILE_EXPIRY_SECONDS, Dialect, FileRecord, LineKind,
    LineResult, NewBatch, Provider, Sink, StoreError, lock, new_id, new_uuid_id,
};
use crate::time::azure_iso;
use crate::validate::{BatchError, Rules, strip_v1};

/// Which OpenAI-shaped surface a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Surface {
    /// `https://api.openai.com/v1`.
    OpenAi,
    /// Azure's v1 surface, `{endpoint}/openai/v1` (no `api-version` needed).
    AzureV1,
    /// Azure's dated surface, `{endpoint}/openai/...?api-version=`.
    AzureLegacy,
}

impl Surface {
    pub(crate) fn provider(self) -> Provider {
        match self {
            Self::OpenAi => Provider::OpenAi,
            Self::AzureV1 | Self::AzureLegacy => Provider::Azure,
        }
    }

    fn is_azure(self) -> bool {
        self != Self::OpenAi
    }
}

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

/// Endpoints Azure batches run (given with or without `/v1`); embeddings are not supported.
const AZURE_BATCH_ENDPOINTS: [&str; 2] = ["/chat/completions", "/responses"];

/// `CreateBatchRequest` fields.
const CREATE_BATCH_FIELDS: [&str; 5] =
    ["input_file_id", "endpoint", "completion_window", "metadata", "output_expires_after"];

/// OpenAI's bounds of `expires_after.seconds` and `output_expires_after.seconds`.
const OPENAI_EXPIRY_BOUNDS: (i64, i64) = (3_600, 2_592_000);

/// `api-version` values the Azure v1 surface accepts besides the configured dated ones.
const AZURE_V1_VERSIONS: [&str; 3] = ["preview", "latest", "v1"];

/// Azure's answer to a missing or wrong key.
const AZURE_ACCESS_DENIED: &str = "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid key for an active subscription and use a correct regional API endpoint for your resource.";

/// Buffer of the writer an upload is streamed to disk through.
const UPLOAD_BUFFER: usize = 64 * 1024;

/// The OpenAI routes under `/v1` and the Azure routes under `/openai/v1` and `/openai`.
pub(crate) fn router(state: AppState) -> Router<AppState> {
    Router::new()
        .merge(surface_router(&state, Surface::OpenAi, "/v1"))
        .merge(surface_router(&state, Surface::AzureV1, "/openai/v1"))
        .merge(surface_router(&state, Surface::AzureLegacy, "/openai"))
}

fn surface_router(state: &AppState, surface: Surface, prefix: &str) -> Router<AppState> {
    Router::new()
        .route(
            &format!("{prefix}/files"),
            post(upload_file).layer(DefaultBodyLimit::disable()).get(list_files),
        )
        .route(&format!("{prefix}/files/{{file_id}}"), get(retrieve_file).delete(delete_file))
        .route(&format!("{prefix}/files/{{file_id}}/content"), get(file_content))
        .route(&format!("{prefix}/batches"), post(create_batch).get(list_batches))
        .route(&format!("{prefix}/batches/{{batch_id}}"), get(retrieve_batch))
        .route(&format!("{prefix}/batches/{{batch_id}}/cancel"), post(cancel_batch))
        // Outermost last: api-version, then auth, then faults, then the handler.
        .route_layer(middleware::from_fn_with_state(
            (state.clone(), surface.provider()),
            faults::inject,
        ))
        .route_layer(middleware::from_fn_with_state((state.clone(), surface), auth))
        .route_layer(middleware::from_fn_with_state((state.clone(), surface), api_version))
        .layer(Extension(surface))
        .layer(middleware::map_response_with_state(surface, with_request_id))
}

// ---------------------------------------------------------------------------------------------
// Errors

/// An error of an OpenAI-shaped surface. OpenAI renders it as
/// `{"error": {"message", "type", "param", "code"}}` (all four keys always present); Azure as
/// `{"error": {"code", "message"}}` (plus `param` when there is one).
#[derive(Debug, Clone)]
pub(crate) struct ApiError(Box<ErrorDetails>);

/// The parts of an [`ApiError`] (boxed: errors travel in `Result`s on hot paths).
#[derive(Debug, Clone)]
pub(crate) struct ErrorDetails {
    status: StatusCode,
    message: String,
    kind: String,
    param: Option<String>,
    code: Option<String>,
    /// Azure's code when it differs from OpenAI's.
    azure_code: Option<String>,
    retry_after: Option<u64>,
}

impl std::ops::Deref for ApiError {
    type Target = ErrorDetails;
    fn deref(&self) -> &ErrorDetails {
        &self.0
    }
}

impl std::ops::DerefMut for ApiError {
    fn deref_mut(&mut self) -> &mut ErrorDetails {
        &mut self.0
    }
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, kind: &str, message: impl Into<String>) -> Self {
        Self(Box::new(ErrorDetails {
            status,
            message: message.into(),
            kind: kind.to_owned(),
            param: None,
            code: None,
            azure_code: None,
            retry_after: None,
        }))
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", message)
    }

    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    fn param(mut self, param: &str) -> Self {
        self.param = Some(param.to_owned());
        self
    }

    pub(crate) fn code(mut self, code: &str) -> Self {
        self.code = Some(code.to_owned());
        self
    }

    pub(crate) fn azure_code(mut self, code: &str) -> Self {
        self.azure_code = Some(code.to_owned());
        self
    }

    pub(crate) fn retry_after(mut self, seconds: Option<u64>) -> Self {
        self.retry_after = seconds;
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

    /// Azure's code for this error: its own, OpenAI's, or one by status.
    fn azure_code_value(&self) -> String {
        if let Some(code) = self.azure_code.clone().or_else(|| self.code.clone()) {
            return code;
        }
        match self.status.as_u16() {
            400 => "BadRequest",
            401 => "401",
            404 => "NotFound",
            409 => "Conflict",
            429 => "429",
            500 => "InternalServerError",
            503 => "ServiceUnavailable",
            _ => return self.status.as_u16().to_string(),
        }
        .to_owned()
    }

    /// The response in the shape of `surface`.
    pub(crate) fn render(self, surface: Surface) -> Response {
        let azure_code = self.azure_code_value();
        let e = *self.0;
        let body = if surface.is_azure() {
            let mut error = Map::new();
            error.insert("code".to_owned(), Value::from(azure_code));
            error.insert("message".to_owned(), Value::from(e.message));
            if let Some(param) = e.param {
                error.insert("param".to_owned(), Value::from(param));
            }
            json!({"error": error})
        } else {
            json!({
                "error": {
                    "message": e.message,
                    "type": e.kind,
                    "param": e.param,
                    "code": e.code,
                }
            })
        };
        let mut res = (e.status, axum::Json(body)).into_response();
        if let Some(seconds) = e.retry_after {
            res.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        res
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.render(Surface::OpenAi)
    }
}

/// The answer for a path or method that does not exist, in the shape of the provider whose paths
/// it resembles.
pub(crate) async fn invalid_url(req: Request) -> Response {
    let path = req.uri().path();
    if path.starts_with("/v1/messages") {
        return crate::anthropic::not_found_path(req.method(), path);
    }
    if path == "/openai" || path.starts_with("/openai/") {
        return ApiError::not_found("Resource not found")
            .azure_code("404")
            .render(Surface::AzureV1);
    }
    ApiError::not_found(format!("Invalid URL ({} {})", req.method(), path)).into_response()
}

// ---------------------------------------------------------------------------------------------
// Middleware

fn bearer(req: &Request) -> Option<&str> {
    req.headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

async fn auth(
    State((state, surface)): State<(AppState, Surface)>,
    req: Request,
    next: Next,
) -> Response {
    let provider = surface.provider();
    let token = if surface.is_azure() {
        req.headers()
            .get("api-key")
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .or_else(|| bearer(&req))
    } else {
        bearer(&req)
    };
    let accepted = token.map(|token| match lock(&state.sim).config.key_for(provider) {
        Some(expected) => expected == token,
        None => true,
    });
    match (surface.is_azure(), accepted) {
        (_, Some(true)) => next.run(req).await,
        (true, _) => {
            // The key itself is never echoed back.
            ApiError::new(StatusCode::UNAUTHORIZED, "invalid_request_error", AZURE_ACCESS_DENIED)
                .azure_code("401")
                .render(surface)
        }
        (false, None) => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
        )
        .into_response(),
        (false, Some(false)) => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "Incorrect API key provided.",
        )
        .code("invalid_api_key")
        .into_response(),
    }
}

/// Azure's `api-version` rules: required on the legacy surface (404 `Resource not found` without
/// one, as Azure answers), one of the configured dated versions; optional on the v1 surface.
async fn api_version(
    State((state, surface)): State<(AppState, Surface)>,
    req: Request,
    next: Next,
) -> Response {
    if !surface.is_azure() {
        return next.run(req).await;
    }
    let version = req.uri().query().and_then(|q| {
        q.split('&').find_map(|pair| pair.strip_prefix("api-version=")).map(str::to_owned)
    });
    let known = |v: &str| lock(&state.sim).config.azure.api_versions.iter().any(|k| k == v);
    let verdict = match (surface, version.as_deref()) {
        (Surface::AzureLegacy, None | Some("")) => {
            Some(ApiError::not_found("Resource not found").azure_code("404"))
        }
        (Surface::AzureV1, None) => None,
        (Surface::AzureV1, Some(v)) if AZURE_V1_VERSIONS.contains(&v) || known(v) => None,
        (Surface::AzureLegacy, Some(v)) if known(v) => None,
        _ => Some(ApiError::invalid("API version not supported").azure_code("BadRequest")),
    };
    match verdict {
        Some(error) => error.render(surface),
        None => next.run(req).await,
    }
}

async fn with_request_id(State(surface): State<Surface>, mut res: Response) -> Response {
    let id = new_id("req_");
    if let Ok(v) = HeaderValue::from_str(&id) {
        res.headers_mut().insert("x-request-id", v.clone());
        if surface.is_azure() {
            res.headers_mut().insert("apim-request-id", v);
        }
    }
    res
}

/// Turns a handler result into a response in the surface's shape.
fn respond<T: IntoResponse>(surface: Surface, result: Result<T, ApiError>) -> Response {
    match result {
        Ok(ok) => ok.into_response(),
        Err(e) => e.render(surface),
    }
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

/// The bounds of expiry seconds on a surface.
fn expiry_bounds(surface: Surface, config: &SimConfig) -> (i64, i64) {
    if surface.is_azure() {
        (config.azure.min_expiry_seconds, config.azure.max_expiry_seconds)
    } else {
        OPENAI_EXPIRY_BOUNDS
    }
}

/// Parses an expiry given as text form fields or JSON values.
fn parse_expiry(
    anchor: Option<&str>,
    seconds: Option<&str>,
    prefix: &str,
    bounds: (i64, i64),
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
            check_expiry_range(n, &seconds_param, bounds).map(Some)
        }
    }
}

fn check_expiry_range(n: i64, param: &str, (min, max): (i64, i64)) -> Result<i64, ApiError> {
    if n < min {
        return Err(ApiError::invalid(format!(
            "Invalid '{param}': integer below minimum value. Expected a value >= {min}, but got {n} instead."
        ))
        .param(param)
        .code("integer_below_min_value"));
    }
    if n > max {
        return Err(ApiError::invalid(format!(
            "Invalid '{param}': integer above maximum value. Expected a value <= {max}, but got {n} instead."
        ))
        .param(param)
        .code("integer_above_max_value"));
    }
    Ok(n)
}

fn multipart_error(e: impl std::fmt::Display) -> ApiError {
    ApiError::invalid(format!("Could not parse multipart form: {e}"))
}

fn spool_error(e: &std::io::Error) -> ApiError {
    ApiError::internal(format!("The simulator could not store the file: {e}"))
}

/// Streams an uploaded file part to a new spool file; `None` when it is larger than `max_bytes`
/// (the part is still read to its end, so the client gets the answer, not a reset).
async fn spool_upload(
    field: &mut Field<'_>,
    spool: &Spool,
    max_bytes: u64,
) -> Result<Option<FileBody>, ApiError> {
    let file = spool.file("upload");
    let created = tokio::fs::File::create(file.path()).await.map_err(|e| spool_error(&e))?;
    let mut out = tokio::io::BufWriter::with_capacity(UPLOAD_BUFFER, created);
    let mut size = 0u64;
    let mut too_large = false;
    while let Some(chunk) = field.chunk().await.map_err(multipart_error)? {
        if too_large {
            continue;
        }
        size += u64::try_from(chunk.len()).unwrap_or(u64::MAX);
        if size > max_bytes {
            too_large = true;
            continue;
        }
        out.write_all(&chunk).await.map_err(|e| spool_error(&e))?;
    }
    if too_large {
        return Ok(None);
    }
    out.flush().await.map_err(|e| spool_error(&e))?;
    drop(out);
    Ok(Some(FileBody::whole(file, size)))
}

async fn upload_file(
    Extension(surface): Extension<Surface>,
    State(state): State<AppState>,
    req: Request,
) -> Response {
    respond(surface, upload_file_inner(surface, state, req).await)
}

async fn upload_file_inner(
    surface: Surface,
    state: AppState,
    req: Request,
) -> Result<Response, ApiError> {
    let (max_bytes, bounds, spool) = {
        let sim = lock(&state.sim);
        (sim.config.max_file_bytes, expiry_bounds(surface, &sim.config), sim.spool.clone())
    };
    let mut multipart = Multipart::from_request(req, &state).await.map_err(multipart_error)?;

    let mut content: Option<FileBody> = None;
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
                match spool_upload(&mut field, &spool, max_bytes).await? {
                    Some(body) => content = Some(body),
                    None => {
                        too_large = true;
                        content = Some(FileBody::default());
                    }
                }
            }
            "purpose" => purpose = Some(field.text().await.map_err(multipart_error)?),
            // The SDK's bracket form and the dotted form of Azure's curl examples.
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
    // The real API refuses a batch file named with another extension; one named without any
    // (the SDKs call raw bytes `upload`) is taken.
    let extension = std::path::Path::new(&filename).extension();
    if purpose == "batch" && extension.is_some_and(|e| e != "jsonl") {
        return Err(ApiError::invalid("Invalid file format for Batch API. Must be .jsonl"));
    }
    let expiry = parse_expiry(anchor.as_deref(), seconds.as_deref(), "expires_after", bounds)?;
    // OpenAI: "By default, files with purpose=batch expire after 30 days". Azure keeps files
    // without an expiry until they are deleted (and counts them against its quota).
    let expiry = if surface.is_azure() {
        expiry
    } else {
        expiry.or((purpose == "batch").then_some(DEFAULT_FILE_EXPIRY_SECONDS))
    };
    let provider = surface.provider();
    let mut sim = lock(&state.sim);
    if surface.is_azure() && purpose == "batch" {
        sim.sync();
        let with_expiry = expiry.is_some();
        let (max, which) = if with_expiry {
            (sim.config.azure.max_input_files_with_expiry, "with")
        } else {
            (sim.config.azure.max_input_files_without_expiry, "without")
        };
        if sim.files.count(provider, "batch", with_expiry) >= max {
            return Err(ApiError::invalid(format!(
                "The quota for files {which} expiry is reached. The maximum is {max}."
            ))
            .azure_code("quotaExceeded"));
        }
    }
    if !surface.is_azure() {
        sim.sync();
        let max = sim.config.openai.max_storage_bytes;
        if sim.files.stored_bytes(provider).saturating_add(content.len()) > max {
            // As OpenAI answers it (no code), seen in bespokelabsai/curator#189.
            return Err(ApiError::invalid(format!(
                "You have exceeded your file storage quota. Organizations are limited to {} of files. Please delete old files or attempt with a smaller file size.",
                storage_size(max)
            )));
        }
    }
    let record = sim.upload_file(provider, purpose, filename, content, expiry);
    Ok(axum::Json(file_json(&record)).into_response())
}

/// A storage size as OpenAI's message words it ("100 GB"); bytes below a gigabyte.
fn storage_size(bytes: u64) -> String {
    const GB: u64 = 1_000_000_000;
    if bytes >= GB && bytes.is_multiple_of(GB) {
        format!("{} GB", bytes / GB)
    } else {
        format!("{bytes} bytes")
    }
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
    Extension(surface): Extension<Surface>,
    State(state): State<AppState>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    respond(surface, list_files_inner(surface, &state, &query))
}

fn list_files_inner(
    surface: Surface,
    state: &AppState,
    query: &HashMap<String, String>,
) -> Result<axum::Json<Value>, ApiError> {
    let limit = parse_limit(query, 10_000, 10_000)?;
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
    let (page, has_more) = sim.files.page(surface.provider(), purpose, descending, after, limit);
    let data = page.into_iter().map(file_json).collect();
    Ok(axum::Json(list_json(data, has_more)))
}

async fn retrieve_file(
    Extension(surface): Extension<Surface>,
    State(state): State<AppState>,
    Path(file_id): Path<String>,
) -> Response {
    let file = lock(&state.sim).file(surface.provider(), &file_id);
    respond(
        surface,
        file.map(|f| axum::Json(file_json(&f))).ok_or_else(|| ApiError::no_such_file(&file_id)),
    )
}

async fn delete_file(
    Extension(surface): Extension<Surface>,
    State(state): State<AppState>,
    Path(file_id): Path<String>,
) -> Response {
    let result = lock(&state.sim)
        .delete_file(surface.provider(), &file_id)
        .map(|()| axum::Json(json!({"id": file_id, "object": "file", "deleted": true})))
        .map_err(|_| ApiError::no_such_file(&file_id));
    respond(surface, result)
}

async fn file_content(
    Extension(surface): Extension<Surface>,
    State(state): State<AppState>,
    Path(file_id): Path<String>,
) -> Response {
    let Some(file) = lock(&state.sim).file(surface.provider(), &file_id) else {
        return ApiError::no_such_file(&file_id).render(surface);
    };
    respond(surface, stream_body(file.content, "application/octet-stream").await)
}

/// A response streaming `content` from its spool file, with its `Content-Length`.
pub(crate) async fn stream_body(
    content: FileBody,
    content_type: &str,
) -> Result<Response, ApiError> {
    let len = content.len();
    let stream = content
        .stream()
        .await
        .map_err(|e| ApiError::internal(format!("The simulator could not read the file: {e}")))?;
    let body = Body::from_stream(stream);
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, content_type)
        .header(header::CONTENT_LENGTH, len)
        .body(body)
        .map_err(|e| ApiError::internal(format!("cannot build the response: {e}")))
}

// ---------------------------------------------------------------------------------------------
// Batches

/// A batch timestamp: unix seconds, or with Azure's legacy quirks an ISO 8601 string.
fn stamp(t: Option<f64>, quirks: bool) -> Value {
    match t {
        None => Value::Null,
        Some(t) if quirks => Value::from(azure_iso(t)),
        Some(t) => Value::from(secs(t)),
    }
}

fn batch_json(b: &BatchRecord, quirks: bool) -> Value {
    let errors = b.errors.as_ref().map(|errs| {
        let data: Vec<Value> = errs
            .iter()
            .map(
                |e| json!({"code": e.code, "message": e.message, "param": e.param, "line": e.line}),
            )
            .collect();
        json!({"object": "list", "data": data})
    });
    let status = if quirks { b.status.capitalised() } else { b.status.as_str() };
    let counts = &b.request_counts;
    let request_counts = if quirks && b.status == BatchStatus::Validating {
        json!({"total": null, "completed": null, "failed": null})
    } else {
        json!({"total": counts.total, "completed": counts.completed, "failed": counts.failed})
    };
    json!({
        "id": b.id,
        "object": "batch",
        "endpoint": b.endpoint,
        "model": b.model,
        "errors": errors,
        "input_file_id": b.input_file_id,
        "completion_window": b.completion_window,
        "status": status,
        "output_file_id": b.output_file_id,
        "error_file_id": b.error_file_id,
        "created_at": stamp(Some(b.created_at), quirks),
        "in_progress_at": stamp(b.in_progress_at, quirks),
        "expires_at": stamp(Some(b.expires_at), quirks),
        "finalizing_at": stamp(b.finalizing_at, quirks),
        "completed_at": stamp(b.completed_at, quirks),
        "failed_at": stamp(b.failed_at, quirks),
        "expired_at": stamp(b.expired_at, quirks),
        "cancelling_at": stamp(b.cancelling_at, quirks),
        "cancelled_at": stamp(b.cancelled_at, quirks),
        "request_counts": request_counts,
        "usage": {
            "input_tokens": b.usage.input_tokens,
            "input_tokens_details": {"cached_tokens": b.usage.cached_tokens},
            "output_tokens": b.usage.output_tokens,
            "output_tokens_details": {"reasoning_tokens": b.usage.reasoning_tokens},
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

/// `output_expires_after` in seconds, if given (checked against `bounds`).
fn check_output_expiry(value: Option<&Value>, bounds: (i64, i64)) -> Result<Option<i64>, ApiError> {
    let obj = match value {
        None | Some(Value::Null) => return Ok(None),
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
    parse_expiry(anchor.as_deref(), seconds.as_deref(), "output_expires_after", bounds)
}

/// The batch rules and result-line shapes of OpenAI and Azure OpenAI.
#[derive(Debug)]
pub(crate) struct OpenAiDialect {
    surface_provider: Provider,
    /// Whether batches expire at 24 h (Azure: configurable, off by default).
    expires: bool,
    /// Whether result lines carry an `id` (Azure's legacy examples have none).
    line_ids: bool,
}

impl OpenAiDialect {
    fn for_surface(surface: Surface, config: &SimConfig) -> Self {
        match surface {
            Surface::OpenAi => {
                Self { surface_provider: Provider::OpenAi, expires: true, line_ids: true }
            }
            Surface::AzureV1 | Surface::AzureLegacy => Self {
                surface_provider: Provider::Azure,
                expires: config.azure.expire_batches,
                line_ids: !config.azure.legacy_quirks,
            },
        }
    }
}

/// A JSON string literal (escaped by serde_json's own code).
fn quoted(s: &str) -> String {
    Value::from(s).to_string()
}

/// One result line, `{"id", "custom_id", "response", "error"}` in the documented key order.
/// Built by hand because it is the hot path of a 50,000-line batch: `Value`'s Display is compiled
/// inside serde_json, generic serializers at this crate's (debug) optimization level.
fn result_line(
    line: &LineResult<'_>,
    with_id: bool,
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
    let id = if with_id { format!(r#""id":{},"#, quoted(line.line_id)) } else { String::new() };
    format!(
        r#"{{{id}"custom_id":{},"response":{response},"error":{error}}}"#,
        quoted(line.custom_id)
    )
    .into_bytes()
}

fn http_error_body(message: &str, kind: &str, param: Option<&str>, code: Option<&str>) -> Value {
    json!({"error": {"message": message, "type": kind, "param": param, "code": code}})
}

/// Azure's content-filter annotations, all clear.
fn content_filter_results() -> Value {
    let clear = json!({"filtered": false, "severity": "safe"});
    json!({
        "hate": clear, "self_harm": clear, "sexual": clear, "violence": clear,
        "jailbreak": {"filtered": false, "detected": false},
        "protected_material_code": {"filtered": false, "detected": false},
        "protected_material_text": {"filtered": false, "detected": false},
    })
}

impl Dialect for OpenAiDialect {
    fn provider(&self) -> Provider {
        self.surface_provider
    }

    fn new_batch_id(&self) -> String {
        match self.surface_provider {
            Provider::Azure => new_uuid_id("batch_"),
            _ => new_id("batch_"),
        }
    }

    fn expires(&self) -> bool {
        self.expires
    }

    fn always_error_file(&self) -> bool {
        // "Successful jobs will still generate an error_file_id, but it will be associated with
        // an empty file with zero bytes."
        self.surface_provider == Provider::Azure
    }

    fn execute(
        &self,
        endpoint: &str,
        mut request: Value,
        ctx: &mut RunContext<'_>,
    ) -> Result<ModelOutput, ModelRejection> {
        let body = request.get_mut("body").map(Value::take).unwrap_or(Value::Null);
        let mut out = model::run(endpoint, &body, ctx)?;
        if self.surface_provider == Provider::Azure
            && out.body.get("object").and_then(Value::as_str) == Some("chat.completion")
        {
            out.body["prompt_filter_results"] =
                json!([{"prompt_index": 0, "content_filter_results": content_filter_results()}]);
            if let Some(choices) = out.body.get_mut("choices").and_then(Value::as_array_mut) {
                for choice in choices {
                    choice["content_filter_results"] = content_filter_results();
                }
            }
        }
        Ok(out)
    }

    fn render(&self, line: &LineResult<'_>) -> (Sink, Vec<u8>) {
        let error_body;
        let (sink, response, error) = match &line.kind {
            LineKind::Succeeded(body) => (Sink::Output, Some((200, *body)), None),
            LineKind::Fault(LineFaultKind::Retryable) => {
                error_body = http_error_body(
                    "The server had an error while processing your request. Sorry about that!",
                    "server_error",
                    None,
                    None,
                );
                (Sink::Error, Some((500, &error_body)), None)
            }
            LineKind::Fault(_) => {
                error_body = http_error_body(
                    "This model's maximum context length is 128000 tokens. However, your messages resulted in 131072 tokens. Please reduce the length of the messages.",
                    "invalid_request_error",
                    Some("messages"),
                    Some("context_length_exceeded"),
                );
                (Sink::Error, Some((400, &error_body)), None)
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
        (sink, result_line(line, self.line_ids, response, error))
    }
}

/// The enqueued-token limit for `model`, if one is configured.
fn token_limit(limits: &std::collections::BTreeMap<String, u64>, model: &str) -> Option<u64> {
    limits.get(model).or_else(|| limits.get("*")).copied()
}

async fn create_batch(
    Extension(surface): Extension<Surface>,
    State(state): State<AppState>,
    body: Bytes,
) -> Response {
    respond(surface, create_batch_inner(surface, state, body).await)
}

async fn create_batch_inner(
    surface: Surface,
    state: AppState,
    body: Bytes,
) -> Result<axum::Json<Value>, ApiError> {
    let provider = surface.provider();
    let config = lock(&state.sim).config.clone();
    let obj = parse_json_object(&body)?;
    if let Some(extra) = obj.keys().find(|k| !CREATE_BATCH_FIELDS.contains(&k.as_str())) {
        return Err(ApiError::unknown_argument(extra));
    }
    let input_file_id = required_str(&obj, "input_file_id")?.to_owned();
    let endpoint = required_str(&obj, "endpoint")?.to_owned();
    if surface.is_azure() {
        if !AZURE_BATCH_ENDPOINTS.contains(&strip_v1(&endpoint)) {
            return Err(ApiError::bad_value(
                "endpoint",
                format!(
                    "Invalid value: '{endpoint}'. Supported values are: '/chat/completions' and '/responses' (with or without '/v1')."
                ),
            ));
        }
    } else if !BATCH_ENDPOINTS.contains(&endpoint.as_str()) {
        return Err(ApiError::bad_value(
            "endpoint",
            format!(
                "Invalid value: '{endpoint}'. Supported values are: {}.",
                BATCH_ENDPOINTS.map(|e| format!("'{e}'")).join(", ")
            ),
        ));
    }
    let completion_window = required_str(&obj, "completion_window")?.to_owned();
    // Azure: "If you set any other value than 24h your job will fail" (the batch, not the call).
    if completion_window != "24h" && !surface.is_azure() {
        return Err(ApiError::bad_value(
            "completion_window",
            format!("Invalid value: '{completion_window}'. Supported values are: '24h'."),
        ));
    }
    let metadata = check_metadata(obj.get("metadata"))?;
    let bounds = expiry_bounds(surface, &config);
    let output_expires_seconds = check_output_expiry(obj.get("output_expires_after"), bounds)?;
    // OpenAI's output files expire 30 days after the batch ends unless told otherwise.
    let output_expires_seconds = if surface.is_azure() {
        output_expires_seconds
    } else {
        output_expires_seconds.or(Some(DEFAULT_FILE_EXPIRY_SECONDS))
    };

    let input = lock(&state.sim)
        .batch_input(provider, &input_file_id)
        .map_err(|e| match e {
            StoreError::WrongPurpose(p) => ApiError::invalid(format!(
                "Invalid 'input_file_id': file {input_file_id} has purpose '{p}', but a batch input file must be uploaded with purpose 'batch'."
            ))
            .param("input_file_id"),
            _ => ApiError::invalid(format!("No such File object: {input_file_id}"))
                .param("input_file_id"),
        })?;
    let dialect: Arc<dyn Dialect> = Arc::new(OpenAiDialect::for_surface(surface, &config));
    let limits = if surface.is_azure() {
        &config.azure.enqueued_token_limits
    } else {
        &config.openai.enqueued_token_limits
    };
    let rules = if surface.is_azure() {
        Rules {
            azure: true,
            deployments: config.azure.deployments.clone(),
            count_tokens: !limits.is_empty(),
            ..Rules::new(
                config.azure.max_requests_per_batch,
                usize::MAX,
                usize::try_from(config.azure.max_batch_input_bytes).unwrap_or(usize::MAX),
            )
        }
    } else {
        Rules {
            count_tokens: !limits.is_empty(),
            ..Rules::new(
                config.openai.max_requests_per_batch,
                50_000,
                usize::try_from(config.openai.max_batch_input_bytes).unwrap_or(usize::MAX),
            )
        }
    };
    let ep = endpoint.clone();
    // Validation reads the whole file from disk: keep it off the async workers and out of the
    // lock.
    let worker = lock(&state.sim).worker.clone();
    let mut verdict = worker
        .run(move || state::plan_batch(&input, &ep, &rules))
        .await
        .ok_or_else(|| ApiError::internal("batch validation failed"))?
        .map_err(|e| ApiError::internal(format!("batch validation failed: {e}")))?;
    if completion_window != "24h" {
        verdict = Err(vec![BatchError {
            code: "invalid_request",
            message: format!(
                "The completion window '{completion_window}' is not supported. Only '24h' is supported."
            ),
            param: Some("completion_window".to_owned()),
            line: None,
        }]);
    }
    let mut sim = lock(&state.sim);
    if let Ok(valid) = &verdict
        && let Some(model) = &valid.model
        && let Some(limit) = token_limit(limits, model)
    {
        let enqueued = sim.enqueued_tokens(provider, model);
        if enqueued + valid.estimated_tokens > limit {
            let message = if surface.is_azure() {
                format!(
                    "The number of enqueued tokens has surpassed the configured limit of {limit} for the deployment '{model}'. Please either increase the limit or try again once the current jobs have finished."
                )
            } else {
                format!(
                    "Enqueued token limit reached for {model} in organization org-tranche-sim. Limit: {limit} enqueued tokens. Please try submitting your requests in chunks of at most {} tokens, or wait for in-progress batches to finish.",
                    limit.saturating_sub(enqueued)
                )
            };
            if surface.is_azure() && config.azure.token_limit_fail_fast {
                return Err(ApiError::invalid(message).code("token_limit_exceeded"));
            }
            verdict = Err(vec![BatchError {
                code: "token_limit_exceeded",
                message,
                param: None,
                line: None,
            }]);
        }
    }
    let new = NewBatch {
        dialect,
        endpoint,
        input_file_id,
        completion_window,
        metadata,
        output_expires_seconds,
    };
    let quirks = surface == Surface::AzureLegacy && config.azure.legacy_quirks;
    let batch = sim.insert_batch(new, verdict);
    Ok(axum::Json(batch_json(batch, quirks)))
}

/// Whether responses on `surface` use Azure's legacy quirks.
fn quirks(surface: Surface, config: &SimConfig) -> bool {
    surface == Surface::AzureLegacy && config.azure.legacy_quirks
}

async fn list_batches(
    Extension(surface): Extension<Surface>,
    State(state): State<AppState>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let limit = match parse_limit(&query, 20, 100) {
        Ok(limit) => limit,
        Err(e) => return e.render(surface),
    };
    let after = query.get("after").map(String::as_str);
    let mut sim = lock(&state.sim);
    let quirks = quirks(surface, &sim.config);
    let (page, has_more) = sim.batch_page(surface.provider(), after, limit);
    let data = page.into_iter().map(|b| batch_json(b, quirks)).collect();
    axum::Json(list_json(data, has_more)).into_response()
}

async fn retrieve_batch(
    Extension(surface): Extension<Surface>,
    State(state): State<AppState>,
    Path(batch_id): Path<String>,
) -> Response {
    let mut sim = lock(&state.sim);
    let quirks = quirks(surface, &sim.config);
    match sim.batch(surface.provider(), &batch_id) {
        Some(batch) => axum::Json(batch_json(batch, quirks)).into_response(),
        None => ApiError::no_such_batch(&batch_id).render(surface),
    }
}

async fn cancel_batch(
    Extension(surface): Extension<Surface>,
    State(state): State<AppState>,
    Path(batch_id): Path<String>,
) -> Response {
    let mut sim = lock(&state.sim);
    let quirks = quirks(surface, &sim.config);
    match sim.cancel_batch(surface.provider(), &batch_id) {
        Ok(batch) => axum::Json(batch_json(batch, quirks)).into_response(),
        Err(StoreError::CannotCancel(status)) => ApiError::new(
            StatusCode::CONFLICT,
            "invalid_request_error",
            format!("Cannot cancel a batch with status '{}'.", status.as_str()),
        )
        .render(surface),
        Err(_) => ApiError::no_such_batch(&batch_id).render(surface),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: (i64, i64) = OPENAI_EXPIRY_BOUNDS;

    #[test]
    fn expiry_forms_and_bounds() {
        assert_eq!(parse_expiry(None, None, "expires_after", B).unwrap(), None);
        assert_eq!(
            parse_expiry(Some("created_at"), Some("3600"), "expires_after", B).unwrap(),
            Some(3600)
        );
        let e = parse_expiry(Some("created_at"), Some("60"), "expires_after", B).unwrap_err();
        assert_eq!(e.code.as_deref(), Some("integer_below_min_value"));
        assert_eq!(e.param.as_deref(), Some("expires_after.seconds"));
        let e = parse_expiry(Some("created_at"), Some("2592001"), "x", B).unwrap_err();
        assert_eq!(e.code.as_deref(), Some("integer_above_max_value"));
        let e = parse_expiry(Some("last_active_at"), Some("3600"), "x", B).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("x.anchor"));
        assert!(parse_expiry(Some("created_at"), None, "x", B).is_err());
        assert!(parse_expiry(Some("created_at"), Some("soon"), "x", B).is_err());
        let azure = (1_209_600, 2_592_000);
        assert!(parse_expiry(Some("created_at"), Some("3600"), "x", azure).is_err());
        assert!(parse_expiry(Some("created_at"), Some("1209600"), "x", azure).is_ok());
    }

    #[test]
    fn output_expiry_from_json() {
        assert_eq!(check_output_expiry(None, B).unwrap(), None);
        let v = json!({"anchor": "created_at", "seconds": 7200});
        assert_eq!(check_output_expiry(Some(&v), B).unwrap(), Some(7200));
        let v = json!({"anchor": "created_at", "seconds": 10});
        assert!(check_output_expiry(Some(&v), B).is_err());
        let v = json!({"anchor": "created_at", "seconds": 7200.5});
        assert!(check_output_expiry(Some(&v), B).is_err());
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
        let d = OpenAiDialect::for_surface(Surface::OpenAi, &SimConfig::default());
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

        let mut quirky = SimConfig::default();
        quirky.azure.legacy_quirks = true;
        let d = OpenAiDialect::for_surface(Surface::AzureLegacy, &quirky);
        let (_, v) = parse(d.render(&line(LineKind::Succeeded(&body))));
        assert!(v.get("id").is_none());
        assert_eq!(v["custom_id"], "c1");
    }

    #[test]
    fn azure_error_shape_and_codes() {
        let quota =
            ApiError::invalid("The quota for files without expiry is reached. The maximum is 500.")
                .azure_code("quotaExceeded");
        assert_eq!(quota.azure_code_value(), "quotaExceeded");
        assert_eq!(ApiError::not_found("x").azure_code_value(), "NotFound");
        assert_eq!(
            ApiError::invalid("x").code("invalid_value").azure_code_value(),
            "invalid_value"
        );
    }

    #[test]
    fn statuses_render_lowercase() {
        assert_eq!(BatchStatus::InProgress.as_str(), "in_progress");
        assert_eq!(BatchStatus::InProgress.capitalised(), "InProgress");
    }
}
