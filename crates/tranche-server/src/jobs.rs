//! `/v1/jobs`: submit (a JSON body, or NDJSON streamed with the settings in the query string),
//! list, show, cancel, results (NDJSON) and cost, each for the caller's jobs only.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tokio::io::BufReader;
use tokio_util::io::StreamReader;
use tranche_app::{ExportOptions, Job, JobFilter};
use tranche_core::{JobId, JobState, RequestState};

use crate::ApiState;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::settings::{ApiSettings, QuerySettings};

/// What a submission answers once its job is durably committed (exact keys).
#[derive(Debug, Serialize)]
pub struct Accepted {
    pub job_id: String,
    pub accepted: u64,
}

/// A JSON submission.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonJob {
    #[serde(default)]
    settings: ApiSettings,
    requests: Vec<Box<RawValue>>,
}

fn is_ndjson(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-ndjson"))
}

/// `POST /v1/jobs`.
pub async fn submit(
    State(state): State<ApiState>,
    caller: Caller,
    Query(query): Query<QuerySettings>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    // Intake beyond the configured concurrency is turned away at once, never queued.
    let _permit = state.intake.clone().try_acquire_owned().map_err(|_| {
        ApiError::TooManyRequests(format!(
            "{} submissions are being taken in already; try again shortly",
            state.limits.max_concurrent_intake
        ))
    })?;
    let limits = state.limits;
    let submitted = if is_ndjson(&headers) {
        let settings = ApiSettings::try_from(query)?;
        let (provider, settings) = settings.job(&caller.0.name)?;
        // Streamed: the body is read line by line as it arrives, never held whole; the
        // counters stop it at the limits.
        let over = Arc::new(AtomicBool::new(false));
        let lines = Arc::new(AtomicU64::new(0));
        let (seen, flag, count) = (Arc::new(AtomicU64::new(0)), over.clone(), lines.clone());
        let stream = body.into_data_stream().map(move |chunk| {
            let chunk = chunk.map_err(io::Error::other)?;
            let bytes = seen.fetch_add(chunk.len() as u64, Ordering::Relaxed) + chunk.len() as u64;
            let newlines = chunk.iter().filter(|b| **b == b'\n').count() as u64;
            let n = count.fetch_add(newlines, Ordering::Relaxed) + newlines;
            if bytes > limits.max_body_bytes || n > limits.max_requests_per_job {
                flag.store(true, Ordering::Relaxed);
                return Err(io::Error::other("over the intake limits"));
            }
            Ok::<Bytes, io::Error>(chunk)
        });
        let reader = BufReader::new(StreamReader::new(stream));
        let result = state.app.submit(&state.engine, reader, provider, settings, None).await;
        if over.load(Ordering::Relaxed) {
            return Err(too_large(limits));
        }
        result?
    } else {
        let bytes = axum::body::to_bytes(body, limits.max_body_bytes as usize)
            .await
            .map_err(|_| too_large(limits))?;
        let job: JsonJob = serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::bad_input(format!("the body is not a job: {e}")))?;
        if job.requests.len() as u64 > limits.max_requests_per_job {
            return Err(too_large(limits));
        }
        let (provider, settings) = job.settings.job(&caller.0.name)?;
        let mut lines = Vec::with_capacity(bytes.len());
        for request in &job.requests {
            lines.extend_from_slice(request.get().as_bytes());
            lines.push(b'\n');
        }
        state.app.submit(&state.engine, lines.as_slice(), provider, settings, None).await?
    };
    let accepted = Accepted { job_id: submitted.job_id.to_string(), accepted: submitted.accepted };
    Ok((StatusCode::ACCEPTED, Json(accepted)).into_response())
}

fn too_large(limits: crate::Limits) -> ApiError {
    ApiError::TooLarge(format!(
        "a job is at most {} bytes and {} requests; split it, or raise the server's limits",
        limits.max_body_bytes, limits.max_requests_per_job
    ))
}

/// The caller's job `id`, or "no such job" (another tenant's job looks the same).
pub(crate) async fn owned(state: &ApiState, caller: &Caller, id: &str) -> Result<Job, ApiError> {
    let not_found = || ApiError::NotFound(format!("no job {id}"));
    let id: JobId = id.parse().map_err(|_| not_found())?;
    let job = state.app.job(id).await.map_err(|_| not_found())?;
    if caller.owns(&job) { Ok(job) } else { Err(not_found()) }
}

/// `GET /v1/jobs/{id}`: the same object as `tranche status --json`.
pub async fn show(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let job = owned(&state, &caller, &id).await?;
    Ok(Json(state.app.status(&job).await?).into_response())
}

/// `POST /v1/jobs/{id}/cancel`.
pub async fn cancel(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let job = owned(&state, &caller, &id).await?;
    let cancelled = state.app.cancel(&state.engine, &job).await?;
    Ok(Json(serde_json::json!({"job_id": job.id.to_string(), "cancelled": cancelled}))
        .into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResultsQuery {
    status: Option<String>,
}

/// `GET /v1/jobs/{id}/results`: one JSON line per request, as `tranche results` writes them,
/// streamed.
pub async fn results(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
    Query(query): Query<ResultsQuery>,
) -> Result<Response, ApiError> {
    let job = owned(&state, &caller, &id).await?;
    let status = query
        .status
        .map(|s| match s.as_str() {
            "succeeded" => Ok(RequestState::Succeeded),
            "failed" => Ok(RequestState::Failed),
            "cancelled" => Ok(RequestState::Cancelled),
            other => Err(ApiError::bad_input(format!(
                "status={other}: expected succeeded, failed or cancelled"
            ))),
        })
        .transpose()?;
    let options = ExportOptions { status, ..ExportOptions::default() };
    let chunks = state.app.export_stream(job, options).map_ok(Bytes::from).map_err(|e| {
        tracing::error!(error = %e, "results stopped mid-stream");
        io::Error::other(e.to_string())
    });
    Ok(([(CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(chunks)).into_response())
}

/// `GET /v1/jobs/{id}/cost`: the same object as `tranche cost JOB --json`.
pub async fn cost(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let job = owned(&state, &caller, &id).await?;
    Ok(Json(state.app.job_cost(&job, &state.prices).await?).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    state: Option<JobState>,
    /// The last job id of the previous page.
    cursor: Option<String>,
    limit: Option<u32>,
}

/// One job in a listing.
#[derive(Debug, Serialize)]
struct Listed {
    job_id: String,
    state: JobState,
    provider: String,
    tenant: Option<String>,
    created_at: i64,
    finished_at: Option<i64>,
    counts: tranche_app::CountsView,
}

/// `GET /v1/jobs`: the caller's jobs, newest first, a page at a time (`next_cursor` gives the
/// next page; `null` on the last).
pub async fn list(
    State(state): State<ApiState>,
    caller: Caller,
    Query(query): Query<ListQuery>,
) -> Result<Response, ApiError> {
    const MAX: u32 = 100;
    let limit = query.limit.unwrap_or(20).clamp(1, MAX);
    let before = query
        .cursor
        .map(|c| {
            c.parse::<JobId>()
                .map_err(|_| ApiError::bad_input(format!("cursor={c} is not a job id")))
        })
        .transpose()?;
    let filter = JobFilter { tenant: caller.scope(), state: query.state, before, limit };
    let rows = state.app.list_jobs(filter).await?;
    let next_cursor =
        (rows.len() as u32 == limit).then(|| rows.last().map(|r| r.job.id.to_string())).flatten();
    let jobs: Vec<Listed> = rows
        .into_iter()
        .map(|row| Listed {
            job_id: row.job.id.to_string(),
            state: row.job.state,
            provider: row.job.provider.to_string(),
            tenant: row.job.settings.tenant.clone(),
            created_at: row.job.created_at,
            finished_at: row.job.finished_at,
            counts: row.counts,
        })
        .collect();
    Ok(Json(serde_json::json!({"jobs": jobs, "next_cursor": next_cursor})).into_response())
}
