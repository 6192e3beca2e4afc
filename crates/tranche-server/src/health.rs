//! `/healthz` (the process answers), `/readyz` (its store answers too), and the answer to a path
//! the API does not have.

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::ApiState;
use crate::error::ApiError;

#[utoipa::path(get, path = "/healthz", tag = "health", responses((status = 200, body = Object)))]
pub async fn healthz() -> Response {
    Json(json!({"status": "ok"})).into_response()
}

#[utoipa::path(get, path = "/readyz", tag = "health",
    responses((status = 200, body = Object), (status = 503, body = Object)))]
pub async fn readyz(State(state): State<ApiState>) -> Response {
    match state.app.recent_jobs(1).await {
        Ok(_) => Json(json!({"status": "ready"})).into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "the store does not answer");
            let body = json!({"status": "unavailable", "reason": "the store does not answer"});
            (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
        }
    }
}

pub async fn unknown_path(uri: Uri) -> ApiError {
    ApiError::NotFound(format!("no such path: {}", uri.path()))
}
