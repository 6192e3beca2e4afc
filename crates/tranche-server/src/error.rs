//! The API's errors, in one table: what each of tranche's own failures answers (status, type,
//! code), always as `{"error": {"type", "code", "message", "details"}}`. Nothing upstream is
//! flattened here: an upstream failure is a job's state, shown on the job, not an error of the
//! call that asks for it.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tranche_app::{AppError, Upstream, upstream_text};

/// The envelope every error answers with (the OpenAPI document's picture of it).
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// One error: its kind, its code, what happened, and where (bad input's lines, a provider's
/// own facts).
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    #[serde(rename = "type")]
    pub kind: String,
    pub code: String,
    pub message: String,
    #[schema(value_type = Object)]
    pub details: Value,
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The input was refused whole; `details` locates every bad line.
    #[error("{message}")]
    BadInput { code: &'static str, message: String, details: Value },
    #[error(
        "a valid bearer token is needed: Authorization: Bearer <token> (tranche tenants add NAME makes one)"
    )]
    Unauthorized,
    /// The call needs an admin's token.
    #[error("{0}")]
    Forbidden(String),
    /// No such job, or not the caller's (the two look the same).
    #[error("{0}")]
    NotFound(String),
    #[error("{message}")]
    Conflict { code: &'static str, message: String },
    #[error("{0}")]
    TooLarge(String),
    #[error("{0}")]
    TooManyRequests(String),
    /// A provider refused what the call asked of it: its own facts, kept whole.
    #[error("{}", upstream_text(.0))]
    Upstream(Value),
    /// tranche itself failed; the cause is logged, not sent.
    #[error("tranche failed to answer; the server log has the cause")]
    Internal(String),
}

/// One row of the table: what an error answers.
struct Row {
    status: StatusCode,
    kind: &'static str,
    code: &'static str,
}

impl ApiError {
    fn row(&self) -> Row {
        let row = |status, kind, code| Row { status, kind, code };
        match self {
            Self::BadInput { code, .. } => row(StatusCode::BAD_REQUEST, "invalid_request", code),
            Self::Unauthorized => row(StatusCode::UNAUTHORIZED, "authentication", "missing_token"),
            Self::Forbidden(_) => row(StatusCode::FORBIDDEN, "permission", "admin_only"),
            Self::Upstream(_) => row(StatusCode::BAD_GATEWAY, "upstream", "upstream_error"),
            Self::NotFound(_) => row(StatusCode::NOT_FOUND, "not_found", "not_found"),
            Self::Conflict { code, .. } => row(StatusCode::CONFLICT, "conflict", code),
            Self::TooLarge(_) => row(StatusCode::PAYLOAD_TOO_LARGE, "too_large", "too_large"),
            Self::TooManyRequests(_) => {
                row(StatusCode::TOO_MANY_REQUESTS, "rate_limited", "intake_busy")
            }
            Self::Internal(_) => row(StatusCode::INTERNAL_SERVER_ERROR, "internal", "internal"),
        }
    }

    pub fn status(&self) -> StatusCode {
        self.row().status
    }

    /// The body the error answers with.
    pub fn body(&self) -> Value {
        let row = self.row();
        let details = match self {
            Self::BadInput { details, .. } => details.clone(),
            Self::Upstream(error) => json!({"upstream": Upstream::of(error)}),
            _ => Value::Null,
        };
        json!({"error": {"type": row.kind, "code": row.code, "message": self.to_string(),
                         "details": details}})
    }

    pub fn bad_input(message: impl Into<String>) -> Self {
        Self::BadInput { code: "invalid_input", message: message.into(), details: Value::Null }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let Self::Internal(cause) = &self {
            tracing::error!(error = %cause, "a call failed inside tranche");
        }
        (self.status(), Json(self.body())).into_response()
    }
}

impl From<AppError> for ApiError {
    fn from(e: AppError) -> Self {
        match e {
            AppError::Rejected(rejected) => {
                let details: Vec<Value> = rejected
                    .errors
                    .iter()
                    .map(|e| json!({"line": e.line, "field": e.field, "reason": e.reason}))
                    .collect();
                let message = format!(
                    "the job was refused whole, nothing was stored: {} bad line(s)",
                    rejected.total
                );
                Self::BadInput { code: "invalid_input", message, details: Value::Array(details) }
            }
            AppError::BadJobId(_) | AppError::NoSuchJob(_) => Self::NotFound(e.to_string()),
            AppError::JobEnded { .. } => {
                Self::Conflict { code: "job_ended", message: e.to_string() }
            }
            AppError::NotAwaitingReview { .. } => {
                Self::Conflict { code: "not_awaiting_review", message: e.to_string() }
            }
            AppError::Config(message) => {
                Self::BadInput { code: "invalid_settings", message, details: Value::Null }
            }
            other if other.is_usage() => Self::bad_input(other.to_string()),
            other => Self::Internal(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_has_its_row_and_the_envelope() {
        let cases = [
            (ApiError::bad_input("x"), 400, "invalid_request", "invalid_input"),
            (ApiError::Unauthorized, 401, "authentication", "missing_token"),
            (ApiError::NotFound("no job".into()), 404, "not_found", "not_found"),
            (
                ApiError::Conflict { code: "job_ended", message: "m".into() },
                409,
                "conflict",
                "job_ended",
            ),
            (ApiError::TooLarge("big".into()), 413, "too_large", "too_large"),
            (ApiError::Forbidden("admins only".into()), 403, "permission", "admin_only"),
            (ApiError::TooManyRequests("busy".into()), 429, "rate_limited", "intake_busy"),
            (ApiError::Internal("db down".into()), 500, "internal", "internal"),
        ];
        for (error, status, kind, code) in cases {
            assert_eq!(error.status().as_u16(), status);
            let body = error.body();
            assert_eq!(
                (body["error"]["type"].as_str(), body["error"]["code"].as_str()),
                (Some(kind), Some(code))
            );
            assert!(body["error"]["message"].is_string());
            assert!(body["error"].as_object().unwrap().contains_key("details"));
        }
        // An upstream refusal keeps the provider's own status and code.
        let refused = ApiError::Upstream(json!({"provider": "azure", "status": 400,
            "code": "quotaExceeded", "message": "The quota is reached.", "request_id": "r1"}));
        assert_eq!(refused.status().as_u16(), 502);
        let body = refused.body();
        let upstream = &body["error"]["details"]["upstream"];
        assert_eq!(
            (upstream["status"].as_u64(), upstream["code"].as_str()),
            (Some(400), Some("quotaExceeded"))
        );
        assert!(
            body["error"]["message"].as_str().unwrap().contains("azure returned 400 quotaExceeded")
        );
        let internal = ApiError::Internal("password=hunter2".into()).body().to_string();
        assert!(!internal.contains("hunter2"), "an internal cause is logged, never sent");
    }
}
