//! `/v1/jobs/{id}/review`, `approve` and `reject`: a person (or a tool) looks at a sample of a
//! job's answers beside their inputs, then lets them stand or rejects some or all. The decider
//! recorded is the calling tenant.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tranche_app::{DEFAULT_SAMPLE, Rejected, default_seed};

use crate::ApiState;
use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};
use crate::jobs::owned;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SampleQuery {
    sample: Option<u32>,
    seed: Option<u64>,
}

#[utoipa::path(get, path = "/v1/jobs/{id}/review", tag = "review",
    params(("id" = String, Path), ("sample" = Option<u32>, Query), ("seed" = Option<u64>, Query)),
    responses((status = 200, body = Object), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
/// `GET /v1/jobs/{id}/review`: the answers `tranche review --json` shows.
pub async fn show(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
    Query(query): Query<SampleQuery>,
) -> Result<Response, ApiError> {
    let job = owned(&state, &caller, &id).await?;
    let n = query.sample.or(job.settings.review_sample).unwrap_or(DEFAULT_SAMPLE);
    let seed = query.seed.or(job.settings.review_seed).unwrap_or_else(|| default_seed(job.id));
    let items = state.app.review_sample(&job, n, seed).await?;
    Ok(Json(serde_json::json!({"job_id": job.id.to_string(), "seed": seed, "items": items}))
        .into_response())
}

#[utoipa::path(post, path = "/v1/jobs/{id}/approve", tag = "review", params(("id" = String, Path)),
    responses((status = 200, body = Object), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody)),
    security(("bearer" = [])))]
/// `POST /v1/jobs/{id}/approve`.
pub async fn approve(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let job = owned(&state, &caller, &id).await?;
    state.app.decide_review(&job, &caller.0.name, Rejected::None).await?;
    Ok(Json(serde_json::json!({"job_id": job.id.to_string(), "rejected": 0})).into_response())
}

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RejectBody {
    /// The answers rejected; none named: every succeeded one.
    #[serde(default)]
    custom_ids: Vec<String>,
}

#[utoipa::path(post, path = "/v1/jobs/{id}/reject", tag = "review", params(("id" = String, Path)),
    request_body(content = Option<RejectBody>, content_type = "application/json"),
    responses((status = 200, body = Object), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody)),
    security(("bearer" = [])))]
/// `POST /v1/jobs/{id}/reject` with `{"custom_ids": [...]}` (or no body: all).
pub async fn reject(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
    body: Option<Json<RejectBody>>,
) -> Result<Response, ApiError> {
    let job = owned(&state, &caller, &id).await?;
    let body = body.map(|Json(b)| b).unwrap_or_default();
    let rejected =
        if body.custom_ids.is_empty() { Rejected::All } else { Rejected::Only(&body.custom_ids) };
    let n = state.app.decide_review(&job, &caller.0.name, rejected).await?;
    Ok(Json(serde_json::json!({"job_id": job.id.to_string(), "rejected": n})).into_response())
}
