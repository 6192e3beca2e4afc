//! HTTP fault injection: each provider surface runs this middleware (after auth), which matches the
//! request's provider and operation against `config.faults`, draws with the fault's rate from a
//! seeded generator, and then delays, answers an error in the provider's own shape (with
//! `Retry-After`), or drops the connection without a response.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;

use crate::AppState;
use crate::anthropic::AnthropicError;
use crate::config::{HttpFault, HttpFaultKind};
use crate::openai::{ApiError, Surface};
use crate::state::{Provider, lock};

/// The fault operation of a request: `upload`, `create`, `retrieve`, `list`, `content`,
/// `delete`, `cancel`, or `other`.
pub(crate) fn operation(method: &Method, path: &str) -> &'static str {
    let rest = ["/openai/v1/", "/openai/", "/v1/messages/", "/v1/"]
        .iter()
        .find_map(|prefix| path.strip_prefix(prefix))
        .unwrap_or(path);
    let segments: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    match (method, segments.as_slice()) {
        (&Method::POST, ["files"]) => "upload",
        (&Method::POST, ["batches"]) => "create",
        (&Method::GET, ["files" | "batches"]) => "list",
        (&Method::GET, ["files" | "batches", _]) => "retrieve",
        (&Method::DELETE, ["files" | "batches", _]) => "delete",
        (&Method::GET, ["files", _, "content"] | ["batches", _, "results"]) => "content",
        (&Method::POST, ["batches", _, "cancel"]) => "cancel",
        _ => "other",
    }
}

/// The fault that hits this request, if any (the first configured one whose draw hits).
fn draw(state: &AppState, provider: Provider, operation: &str) -> Option<HttpFault> {
    let mut sim = lock(&state.sim);
    let faults = sim.config.faults.clone();
    faults
        .into_iter()
        .enumerate()
        .filter(|(_, f)| f.matches(provider, operation))
        .find(|(i, f)| sim.draw_fault(*i, f.rate))
        .map(|(_, f)| f)
}

/// The middleware: `State` carries the simulator and the provider of the surface.
pub(crate) async fn inject(
    State((state, provider)): State<(AppState, Provider)>,
    req: Request,
    next: Next,
) -> Response {
    let op = operation(req.method(), req.uri().path());
    let Some(fault) = draw(&state, provider, op) else {
        return next.run(req).await;
    };
    if fault.latency_ms > 0 {
        // A server-side delay on the wall clock: that is what latency is.
        tokio::time::sleep(Duration::from_millis(fault.latency_ms)).await;
    }
    match fault.effective_kind() {
        HttpFaultKind::Latency => next.run(req).await,
        HttpFaultKind::Drop => dropped(),
        HttpFaultKind::DropAfter => {
            let _carried_out = next.run(req).await;
            dropped()
        }
        HttpFaultKind::Error => {
            let status = fault
                .status
                .and_then(|s| StatusCode::from_u16(s).ok())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            error_response(provider, status, &fault)
        }
    }
}

/// A response whose body fails before its first byte: the server closes the connection without
/// sending a status line, as a dropped connection looks to the client.
fn dropped() -> Response {
    let failing = futures::stream::once(async {
        Err::<Bytes, std::io::Error>(std::io::Error::other(
            "connection dropped by a simulated fault",
        ))
    });
    Response::new(Body::from_stream(failing))
}

/// The provider's usual answer for `status`, with the fault's code and message if given.
fn error_response(provider: Provider, status: StatusCode, fault: &HttpFault) -> Response {
    // A 429 always says when to come back (1 s unless configured).
    let retry = fault.retry_after.or((status == StatusCode::TOO_MANY_REQUESTS).then_some(1));
    let retry_text =
        retry.map_or_else(String::new, |s| format!(" Please retry after {s} seconds."));
    match provider {
        Provider::OpenAi | Provider::Azure => {
            let (kind, code, message) = match status.as_u16() {
                429 => (
                    "requests",
                    Some("rate_limit_exceeded"),
                    format!("Rate limit reached for requests.{retry_text}"),
                ),
                401 => (
                    "invalid_request_error",
                    Some("invalid_api_key"),
                    "Incorrect API key provided.".to_owned(),
                ),
                503 => {
                    ("server_error", None, "The server is overloaded or not ready yet.".to_owned())
                }
                s if s >= 500 => (
                    "server_error",
                    None,
                    "The server had an error while processing your request. Sorry about that!"
                        .to_owned(),
                ),
                _ => ("invalid_request_error", None, "The request was rejected.".to_owned()),
            };
            let message = fault.message.clone().unwrap_or(message);
            let mut error = ApiError::new(status, kind, message).retry_after(retry);
            if let Some(code) = fault.code.as_deref().or(code) {
                error = error.code(code);
            }
            if provider == Provider::Azure && fault.code.is_none() {
                // Azure's rate-limit and server errors carry the status as their code.
                error = error.azure_code(&status.as_u16().to_string());
            }
            let surface =
                if provider == Provider::Azure { Surface::AzureV1 } else { Surface::OpenAi };
            error.render(surface)
        }
        Provider::Anthropic => {
            let (kind, message) = match status.as_u16() {
                429 => (
                    "rate_limit_error",
                    format!("Number of requests has exceeded your rate limit.{retry_text}"),
                ),
                529 => ("overloaded_error", "Overloaded".to_owned()),
                401 => ("authentication_error", "invalid x-api-key".to_owned()),
                403 => (
                    "permission_error",
                    "Your API key does not have permission to use the specified resource."
                        .to_owned(),
                ),
                404 => ("not_found_error", "Not found".to_owned()),
                413 => (
                    "request_too_large",
                    "Request exceeds the maximum allowed number of bytes.".to_owned(),
                ),
                504 => ("timeout_error", "Request timed out.".to_owned()),
                s if s >= 500 => ("api_error", "Internal server error".to_owned()),
                _ => ("invalid_request_error", "The request was rejected.".to_owned()),
            };
            // A configured code names the error type when it is one (e.g. `overloaded_error`).
            let kind = fault.code.as_deref().filter(|c| c.ends_with("_error")).unwrap_or(kind);
            let message = fault.message.clone().unwrap_or(message);
            AnthropicError::new(status, kind, message).retry_after(retry).into_response_now()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_by_method_and_path() {
        let cases = [
            (Method::POST, "/v1/files", "upload"),
            (Method::GET, "/v1/files", "list"),
            (Method::GET, "/openai/files/file-1", "retrieve"),
            (Method::DELETE, "/openai/v1/files/file-1", "delete"),
            (Method::GET, "/v1/files/file-1/content", "content"),
            (Method::POST, "/v1/batches", "create"),
            (Method::GET, "/openai/batches", "list"),
            (Method::GET, "/v1/batches/b", "retrieve"),
            (Method::POST, "/openai/v1/batches/b/cancel", "cancel"),
            (Method::POST, "/v1/messages/batches", "create"),
            (Method::GET, "/v1/messages/batches", "list"),
            (Method::GET, "/v1/messages/batches/m", "retrieve"),
            (Method::DELETE, "/v1/messages/batches/m", "delete"),
            (Method::POST, "/v1/messages/batches/m/cancel", "cancel"),
            (Method::GET, "/v1/messages/batches/m/results", "content"),
            (Method::PUT, "/v1/files", "other"),
        ];
        for (method, path, op) in cases {
            assert_eq!(operation(&method, path), op, "{method} {path}");
        }
    }
}
