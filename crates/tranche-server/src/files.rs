//! `GET /v1/files/audit` (admin tokens only): what each provider account's file storage holds
//! and whose it is, as `tranche files audit --json` prints it. A provider's refusal answers 502
//! with the provider's own facts.

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use tranche_app::FilesError;

use crate::ApiState;
use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};

#[utoipa::path(get, path = "/v1/files/audit", tag = "files",
    responses((status = 200, body = Object, description = "The `files audit --json` object"),
        (status = 403, body = ErrorBody), (status = 502, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn audit(State(state): State<ApiState>, caller: Caller) -> Result<Response, ApiError> {
    if !caller.0.admin {
        return Err(ApiError::Forbidden(
            "the provider files audit needs an admin's token (tranche tenants add NAME --admin)"
                .to_owned(),
        ));
    }
    let mut accounts = Vec::new();
    if let Some(engine) = &state.files {
        for provider in engine.file_accounts() {
            let audit = engine.audit_files(provider.kind()).await.map_err(|e| match e {
                FilesError::Upstream(upstream) => {
                    ApiError::Upstream(serde_json::to_value(&upstream).unwrap_or_default())
                }
                other => ApiError::Internal(other.to_string()),
            })?;
            accounts.push(audit);
        }
    }
    Ok(Json(serde_json::json!({"accounts": accounts})).into_response())
}
