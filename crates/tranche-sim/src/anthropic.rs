//! The Anthropic Message Batches surface under `/v1/messages/batches`: create (inline requests),
//! retrieve, list (newest first, `after_id`/`before_id`), cancel, results (JSONL at an absolute
//! `results_url` on the simulator itself) and delete. Auth is `x-api-key` or bearer; a well-formed
//! `anthropic-version` date is required; every response carries a `request-id` header and errors
//! are `{"type":"error","error":{"type","message"},"request_id"}`.
//!
//! The batch runs on the shared life cycle (its internal validating and finalizing phases show as
//! `in_progress`); `request_counts` stay in `processing` until it ends. `params` are checked only
//! when a request runs: a bad one becomes an `errored` result, as Anthropic validates them
//! asynchronously. custom_id format and duplicates are checked at create (HTTP 400).

use std::collections::{HashMap, HashSet};
use std::io;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::AppState;
use crate::config::LineFaultKind;
use crate::faults;
use crate::model::{self, ModelOutput, ModelRejection, RunContext, base62};
use crate::openai::stream_body;
use crate::spool::{FileBody, IndexWriter, LineWriter, Spool};
use crate::state::{
    self, BatchRecord, BatchStatus, Dialect, LineKind, LineResult, NewBatch, Provider, Sink,
    StoreError, lock,
};
use crate::time::rfc3339;
use crate::validate::ValidInput;

const PROVIDER: Provider = Provider::Anthropic;

/// The routes, each behind auth and the version check, with a `request-id` on every answer.
pub(crate) fn router(state: &AppState) -> Router<AppState> {
    Router::new()
        .route("/v1/messages/batches", post(create_batch).get(list_batches))
        .route("/v1/messages/batches/{id}", get(retrieve_batch).delete(delete_batch))
        .route("/v1/messages/batches/{id}/cancel", post(cancel_batch))
        .route("/v1/messages/batches/{id}/results", get(results))
        .route_layer(middleware::from_fn_with_state((state.clone(), PROVIDER), faults::inject))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth))
        .layer(middleware::map_response(with_request_id))
}

// ---------------------------------------------------------------------------------------------
// Errors

/// An error in Anthropic's shape: `{"type":"error","error":{"type","message"},"request_id"}`, with
/// the same id in the `request-id` header.
#[derive(Debug, Clone)]
pub(crate) struct AnthropicError {
    status: StatusCode,
    kind: String,
    message: String,
    retry_after: Option<u64>,
}

/// A request id in Anthropic's style (`req_011C…`).
fn request_id() -> String {
    format!("req_011C{}", base62(&[&rand::random::<u128>().to_le_bytes()], 20))
}

impl AnthropicError {
    pub(crate) fn new(status: StatusCode, kind: &str, message: impl Into<String>) -> Self {
        Self { status, kind: kind.to_owned(), message: message.into(), retry_after: None }
    }

    fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found_error", message)
    }

    fn no_such_batch(id: &str) -> Self {
        Self::not_found(format!("No message batch found with id '{id}'."))
    }

    pub(crate) fn retry_after(mut self, seconds: Option<u64>) -> Self {
        self.retry_after = seconds;
        self
    }

    pub(crate) fn into_response_now(self) -> Response {
        let id = request_id();
        let body = json!({
            "type": "error",
            "error": {"type": self.kind, "message": self.message},
            "request_id": id,
        });
        let mut res = (self.status, axum::Json(body)).into_response();
        if let Ok(v) = HeaderValue::from_str(&id) {
            res.headers_mut().insert("request-id", v);
        }
        if let Some(seconds) = self.retry_after {
            res.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        res
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        self.into_response_now()
    }
}

/// The answer for an unknown path under `/v1/messages`.
pub(crate) fn not_found_path(method: &Method, path: &str) -> Response {
    AnthropicError::not_found(format!("Not found: {method} {path}")).into_response()
}

// ---------------------------------------------------------------------------------------------
// Middleware

/// Whether `v` is a date `YYYY-MM-DD` (the shape of every `anthropic-version`).
fn well_formed_version(v: &str) -> bool {
    let parts: Vec<&str> = v.split('-').collect();
    let [y, m, d] = parts.as_slice() else {
        return false;
    };
    let num = |s: &str, len: usize| {
        (s.len() == len && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse::<u32>().ok())
    };
    matches!(
        (num(y, 4), num(m, 2), num(d, 2)),
        (Some(Some(_)), Some(Some(1..=12)), Some(Some(1..=31)))
    )
}

async fn auth(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let headers = req.headers();
    let token = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .or_else(|| {
            headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
                .map(str::trim)
                .filter(|t| !t.is_empty())
        });
    let Some(token) = token else {
        return AnthropicError::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "x-api-key header is required",
        )
        .into_response();
    };
    let accepted = match lock(&state.sim).config.key_for(PROVIDER) {
        Some(expected) => expected == token,
        None => true,
    };
    if !accepted {
        return AnthropicError::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "invalid x-api-key",
        )
        .into_response();
    }
    match headers.get("anthropic-version").map(|v| v.to_str().unwrap_or_default().trim()) {
        None | Some("") => {
            AnthropicError::invalid("anthropic-version: header is required").into_response()
        }
        Some(v) if !well_formed_version(v) => AnthropicError::invalid(format!(
            "anthropic-version: invalid version '{v}'. Expected a date such as '2023-06-01'."
        ))
        .into_response(),
        Some(_) => next.run(req).await,
    }
}

async fn with_request_id(mut res: Response) -> Response {
    if !res.headers().contains_key("request-id")
        && let Ok(v) = HeaderValue::from_str(&request_id())
    {
        res.headers_mut().insert("request-id", v);
    }
    res
}

// ---------------------------------------------------------------------------------------------
// Wire shapes

/// Anthropic's result lines: `{"custom_id", "result": {"type": ...}}`, all kept with the batch.
#[derive(Debug)]
struct AnthropicDialect;

fn errored(kind: &str, message: &str, request_id: &str) -> Value {
    json!({
        "type": "errored",
        "error": {"type": "error", "error": {"type": kind, "message": message}, "request_id": request_id},
    })
}

impl Dialect for AnthropicDialect {
    fn provider(&self) -> Provider {
        PROVIDER
    }

    fn new_batch_id(&self) -> String {
        format!("msgbatch_01{}", base62(&[&rand::random::<u128>().to_le_bytes()], 22))
    }

    fn inline_results(&self) -> bool {
        true
    }

    /// `request` is the spooled line `{"custom_id", "params"}` (see [`plan_requests`]).
    fn execute(
        &self,
        _endpoint: &str,
        mut request: Value,
        ctx: &mut RunContext<'_>,
    ) -> Result<ModelOutput, ModelRejection> {
        let params = request.get_mut("params").map(Value::take).unwrap_or(Value::Null);
        model::anthropic_message(&params, ctx)
    }

    fn render(&self, line: &LineResult<'_>) -> (Sink, Vec<u8>) {
        let result = match &line.kind {
            LineKind::Succeeded(message) => json!({"type": "succeeded", "message": message}),
            LineKind::Fault(LineFaultKind::Retryable) => {
                errored("api_error", "Internal server error", line.request_id)
            }
            LineKind::Fault(_) => errored(
                "invalid_request_error",
                "prompt is too long: 210000 tokens > 200000 maximum",
                line.request_id,
            ),
            LineKind::Invalid(rejection) => {
                errored("invalid_request_error", &rejection.message, line.request_id)
            }
            LineKind::Expired => json!({"type": "expired"}),
            LineKind::Cancelled => json!({"type": "canceled"}),
        };
        let line = json!({"custom_id": line.custom_id, "result": result});
        (Sink::Output, line.to_string().into_bytes())
    }
}

/// `http://HOST` as the client addressed the simulator (for an absolute `results_url`).
fn base_url(headers: &HeaderMap, state: &AppState) -> String {
    match headers.get(header::HOST).and_then(|h| h.to_str().ok()) {
        Some(host) if !host.is_empty() => format!("http://{host}"),
        _ => format!("http://{}", state.addr),
    }
}

fn ended_at(b: &BatchRecord) -> Option<f64> {
    b.completed_at.or(b.cancelled_at).or(b.expired_at).or(b.failed_at)
}

fn batch_json(b: &BatchRecord, base: &str, now: f64, retention: i64) -> Value {
    let ended = b.status.is_terminal();
    let processing_status = match b.status {
        BatchStatus::Cancelling => "canceling",
        _ if ended => "ended",
        _ => "in_progress",
    };
    let c = &b.request_counts;
    let counts = if ended {
        json!({"processing": 0, "succeeded": c.completed, "errored": c.failed, "canceled": c.cancelled, "expired": c.expired})
    } else {
        json!({"processing": b.declared_total, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0})
    };
    let archive_at = b.created_at + retention as f64;
    json!({
        "id": b.id,
        "type": "message_batch",
        "processing_status": processing_status,
        "request_counts": counts,
        "ended_at": ended_at(b).map(rfc3339),
        "created_at": rfc3339(b.created_at),
        "expires_at": rfc3339(b.expires_at),
        "archived_at": (now >= archive_at).then(|| rfc3339(archive_at)),
        "cancel_initiated_at": b.cancelling_at.map(rfc3339),
        "results_url": ended.then(|| format!("{base}/v1/messages/batches/{}/results", b.id)),
    })
}

/// The virtual now (after bringing batches up to it) and the results retention.
fn now_and_retention(sim: &mut state::Sim) -> (f64, i64) {
    (sim.sync(), sim.config.anthropic.results_retention_seconds)
}

// ---------------------------------------------------------------------------------------------
// Handlers

/// Whether a custom_id matches `^[a-zA-Z0-9_-]{1,64}$`.
fn valid_custom_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The requests of a create body as `(custom_id, params)`, or the 400 it deserves.
fn check_requests(
    value: &Value,
    max_requests: usize,
) -> Result<Vec<(&str, &Value)>, AnthropicError> {
    let Some(obj) = value.as_object() else {
        return Err(AnthropicError::invalid("Input should be a valid dictionary"));
    };
    if let Some(extra) = obj.keys().find(|k| *k != "requests") {
        return Err(AnthropicError::invalid(format!("{extra}: Extra inputs are not permitted")));
    }
    let requests = match obj.get("requests") {
        None => return Err(AnthropicError::invalid("requests: Field required")),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(AnthropicError::invalid("requests: Input should be a valid list")),
    };
    if requests.is_empty() {
        return Err(AnthropicError::invalid(
            "requests: List should have at least 1 item after validation, not 0",
        ));
    }
    if requests.len() > max_requests {
        return Err(AnthropicError::invalid(format!(
            "requests: List should have at most {max_requests} items after validation, not {}",
            requests.len()
        )));
    }
    let mut seen = HashSet::new();
    let mut lines = Vec::with_capacity(requests.len());
    for (i, request) in requests.iter().enumerate() {
        let Some(request) = request.as_object() else {
            return Err(AnthropicError::invalid(format!(
                "requests.{i}: Input should be a valid dictionary"
            )));
        };
        if let Some(extra) = request.keys().find(|k| *k != "custom_id" && *k != "params") {
            return Err(AnthropicError::invalid(format!(
                "requests.{i}.{extra}: Extra inputs are not permitted"
            )));
        }
        let custom_id = match request.get("custom_id") {
            None => {
                return Err(AnthropicError::invalid(format!(
                    "requests.{i}.custom_id: Field required"
                )));
            }
            Some(Value::String(s)) => s,
            Some(_) => {
                return Err(AnthropicError::invalid(format!(
                    "requests.{i}.custom_id: Input should be a valid string"
                )));
            }
        };
        if custom_id.is_empty() {
            return Err(AnthropicError::invalid(format!(
                "requests.{i}.custom_id: String should have at least 1 character"
            )));
        }
        if custom_id.len() > 64 {
            return Err(AnthropicError::invalid(format!(
                "requests.{i}.custom_id: String should have at most 64 characters"
            )));
        }
        if !valid_custom_id(custom_id) {
            return Err(AnthropicError::invalid(format!(
                "requests.{i}.custom_id: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'"
            )));
        }
        if !seen.insert(custom_id.as_str()) {
            return Err(AnthropicError::invalid(format!(
                "requests.{i}.custom_id: Duplicate custom_id '{custom_id}'; each custom_id must be unique within a batch."
            )));
        }
        let Some(params) = request.get("params") else {
            return Err(AnthropicError::invalid(format!("requests.{i}.params: Field required")));
        };
        lines.push((custom_id.as_str(), params));
    }
    Ok(lines)
}

fn spool_error(e: &io::Error) -> AnthropicError {
    AnthropicError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "api_error",
        format!("The simulator could not store the batch: {e}"),
    )
}

/// Checks a create body and writes its requests to the spool as the batch's lines, one
/// `{"custom_id", "params"}` object a line, or answers the 400 it deserves. The body is parsed in
/// memory (it is at most `max_body_bytes`); nothing of it is kept once the lines are on disk.
fn plan_requests(
    body: &[u8],
    max_requests: usize,
    spool: &Spool,
    seed: u64,
) -> Result<ValidInput, AnthropicError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        AnthropicError::invalid(format!("There was an issue with your request body: {e}"))
    })?;
    let requests = check_requests(&value, max_requests)?;
    let write = || -> io::Result<ValidInput> {
        let mut data = LineWriter::new(spool, "requests")?;
        let mut index = IndexWriter::new(spool, seed)?;
        let mut line = Vec::new();
        for (custom_id, params) in &requests {
            line.clear();
            line.extend_from_slice(b"{\"custom_id\":");
            serde_json::to_writer(&mut line, custom_id)?;
            line.extend_from_slice(b",\"params\":");
            serde_json::to_writer(&mut line, params)?;
            line.push(b'}');
            let start = data.push(&line)?;
            index.push(start, u64::try_from(line.len()).unwrap_or(u64::MAX), custom_id)?;
        }
        let lines = index.finish(data.finish()?)?;
        Ok(ValidInput { lines, model: None, estimated_tokens: 0 })
    };
    write().map_err(|e| spool_error(&e))
}

async fn create_batch(State(state): State<AppState>, req: Request) -> Response {
    let base = base_url(req.headers(), &state);
    let (max_body, max_requests, max_queued, seed, spool, worker) = {
        let sim = lock(&state.sim);
        let a = &sim.config.anthropic;
        let (spool, worker) = (sim.spool.clone(), sim.worker.clone());
        let seed = sim.config.seed;
        (a.max_body_bytes, a.max_requests_per_batch, a.max_queued_requests, seed, spool, worker)
    };
    let limit = usize::try_from(max_body).unwrap_or(usize::MAX);
    let Ok(body) = axum::body::to_bytes(req.into_body(), limit).await else {
        // Anthropic's answer above the batch size limit (from its proxy, in the same shape).
        return AnthropicError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
            format!("Request exceeds the maximum allowed number of bytes ({max_body})."),
        )
        .into_response();
    };
    let planned = worker.run(move || plan_requests(&body, max_requests, &spool, seed)).await;
    let valid = match planned {
        Some(Ok(planned)) => planned,
        Some(Err(e)) => return e.into_response(),
        None => {
            return AnthropicError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "api_error",
                "the batch could not be planned",
            )
            .into_response();
        }
    };
    let mut sim = lock(&state.sim);
    if let Some(max) = max_queued {
        let queued = sim.queued_requests(PROVIDER);
        let n = valid.lines.count();
        if queued + n > max {
            return AnthropicError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                format!(
                    "Number of requests in the batch processing queue would exceed your limit of {max}; {queued} requests are still processing."
                ),
            )
            .into_response();
        }
    }
    let new = NewBatch {
        dialect: Arc::new(AnthropicDialect),
        endpoint: "/v1/messages".to_owned(),
        input_file_id: String::new(),
        completion_window: "24h".to_owned(),
        metadata: None,
        output_expires_seconds: None,
    };
    let (now, retention) = now_and_retention(&mut sim);
    let batch = sim.insert_batch(new, Ok(valid));
    axum::Json(batch_json(batch, &base, now, retention)).into_response()
}

async fn retrieve_batch(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let base = base_url(&headers, &state);
    let mut sim = lock(&state.sim);
    let (now, retention) = now_and_retention(&mut sim);
    match sim.batch(PROVIDER, &id) {
        Some(b) => axum::Json(batch_json(b, &base, now, retention)).into_response(),
        None => AnthropicError::no_such_batch(&id).into_response(),
    }
}

async fn list_batches(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let base = base_url(&headers, &state);
    let limit = match query.get("limit").map(|l| l.parse::<usize>()) {
        None => 20,
        Some(Ok(n)) if (1..=1000).contains(&n) => n,
        Some(Ok(n)) if n < 1 => {
            return AnthropicError::invalid("limit: Input should be greater than or equal to 1")
                .into_response();
        }
        Some(Ok(_)) => {
            return AnthropicError::invalid("limit: Input should be less than or equal to 1000")
                .into_response();
        }
        Some(Err(_)) => {
            return AnthropicError::invalid(
                "limit: Input should be a valid integer, unable to parse string as an integer",
            )
            .into_response();
        }
    };
    let after = query.get("after_id").map(String::as_str);
    let before = query.get("before_id").map(String::as_str);
    let mut sim = lock(&state.sim);
    let (now, retention) = now_and_retention(&mut sim);
    let (page, has_more) = sim.batch_page_between(PROVIDER, after, before, limit);
    let data: Vec<Value> = page.into_iter().map(|b| batch_json(b, &base, now, retention)).collect();
    let first_id = data.first().and_then(|v| v.get("id")).cloned();
    let last_id = data.last().and_then(|v| v.get("id")).cloned();
    axum::Json(
        json!({"data": data, "has_more": has_more, "first_id": first_id, "last_id": last_id}),
    )
    .into_response()
}

async fn cancel_batch(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let base = base_url(&headers, &state);
    let mut sim = lock(&state.sim);
    let (now, retention) = now_and_retention(&mut sim);
    match sim.cancel_batch(PROVIDER, &id) {
        Ok(b) => axum::Json(batch_json(b, &base, now, retention)).into_response(),
        Err(StoreError::CannotCancel(_)) => AnthropicError::invalid(format!(
            "Message batch {id} has already ended and can no longer be canceled."
        ))
        .into_response(),
        Err(_) => AnthropicError::no_such_batch(&id).into_response(),
    }
}

async fn delete_batch(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    match lock(&state.sim).delete_batch(PROVIDER, &id) {
        Ok(()) => axum::Json(json!({"id": id, "type": "message_batch_deleted"})).into_response(),
        Err(StoreError::CannotDelete(_)) => AnthropicError::invalid(format!(
            "Message batch {id} cannot be deleted while it is still processing. Cancel it first and wait until it has ended."
        ))
        .into_response(),
        Err(_) => AnthropicError::no_such_batch(&id).into_response(),
    }
}

async fn results(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    let content = match results_body(&state, &id) {
        Ok(content) => content,
        Err(e) => return e.into_response(),
    };
    match stream_body(content, "application/binary").await {
        Ok(res) => res,
        Err(_) => Response::new(Body::empty()),
    }
}

/// The results file of an ended batch, or why there is none.
fn results_body(state: &AppState, id: &str) -> Result<FileBody, AnthropicError> {
    let mut sim = lock(&state.sim);
    let now = sim.sync();
    let retention = sim.config.anthropic.results_retention_seconds;
    let Some(b) = sim.batch(PROVIDER, id) else {
        return Err(AnthropicError::no_such_batch(id));
    };
    if !b.status.is_terminal() {
        return Err(AnthropicError::invalid(format!(
            "Message batch {id} is still processing; results are available once it has ended."
        )));
    }
    if now >= b.created_at + retention as f64 {
        return Err(AnthropicError::not_found(format!(
            "The results of message batch {id} are no longer available: results are kept for 29 days after the batch was created."
        )));
    }
    Ok(b.results.clone().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_custom_ids() {
        for ok in ["2023-06-01", "2026-10-21"] {
            assert!(well_formed_version(ok), "{ok}");
        }
        for bad in ["2023-6-01", "2023-13-01", "latest", "2023-06-01x", "", "2023-06-00"] {
            assert!(!well_formed_version(bad), "{bad}");
        }
        assert!(valid_custom_id("req_1-A"));
        assert!(valid_custom_id(&"a".repeat(64)));
        assert!(!valid_custom_id(&"a".repeat(65)));
        assert!(!valid_custom_id("ticket:1"));
        assert!(!valid_custom_id(""));
    }

    #[test]
    fn create_bodies_are_checked() {
        let params =
            json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]});
        let body = |requests: Value| json!({"requests": requests}).to_string().into_bytes();
        let spool = Spool::new(None).unwrap();
        let plan = |body: &[u8], max| plan_requests(body, max, &spool, 7);
        let ok = plan(&body(json!([{"custom_id": "a", "params": params}])), 10).unwrap();
        assert_eq!(ok.lines.count(), 1);
        let mut line = Vec::new();
        ok.lines.reader().unwrap().read(0, &mut line).unwrap();
        let line: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(line, json!({"custom_id": "a", "params": params}));
        let cases = [
            (json!([]), "requests: List should have at least 1 item after validation, not 0"),
            (
                json!([{"custom_id": "a:b", "params": {}}]),
                "requests.0.custom_id: String should match pattern '^[a-zA-Z0-9_-]{1,64}$'",
            ),
            (
                json!([{"custom_id": "a".repeat(65), "params": {}}]),
                "requests.0.custom_id: String should have at most 64 characters",
            ),
            (
                json!([{"custom_id": "a", "params": {}}, {"custom_id": "a", "params": {}}]),
                "requests.1.custom_id: Duplicate custom_id 'a'; each custom_id must be unique within a batch.",
            ),
            (json!([{"custom_id": "a"}]), "requests.0.params: Field required"),
        ];
        for (requests, message) in cases {
            assert_eq!(plan(&body(requests), 10).unwrap_err().message, message);
        }
        let many: Vec<Value> =
            (0..3).map(|i| json!({"custom_id": format!("c{i}"), "params": {}})).collect();
        assert!(
            plan(&body(Value::Array(many)), 2).unwrap_err().message.contains("at most 2 items")
        );
    }
}
