//! `/v1/jobs`: submit (a JSON body, or NDJSON streamed with the settings in the query string),
//! list, show, cancel, results (NDJSON) and cost, each for the caller's jobs only.

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncSeekExt, AsyncWriteExt, BufReader};
use tranche_app::{ExportOptions, Job, JobFilter, KeyClaim};
use tranche_core::{JobId, JobState, RequestState};

use crate::ApiState;
use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};
use crate::settings::{ApiSettings, QuerySettings};

/// What a submission answers once its job is durably committed (exact keys).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Accepted {
    pub job_id: String,
    pub accepted: u64,
}

/// A JSON submission: the job's settings and its requests, each a tranche line (`{"key",
/// "body"}`) or an OpenAI batch line.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JsonJob {
    #[serde(default)]
    settings: ApiSettings,
    #[schema(value_type = Vec<Object>)]
    requests: Vec<Box<RawValue>>,
}

fn is_ndjson(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-ndjson"))
}

/// The `Idempotency-Key` header, if given: 1 to 255 visible ASCII characters.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get("idempotency-key") else { return Ok(None) };
    let key = value
        .to_str()
        .ok()
        .map(str::trim)
        .filter(|k| !k.is_empty() && k.len() <= 255 && k.bytes().all(|b| b.is_ascii_graphic()));
    key.map(|k| Some(k.to_owned())).ok_or_else(|| {
        ApiError::bad_input("Idempotency-Key must be 1 to 255 visible ASCII characters")
    })
}

/// A submission's fingerprint for its idempotency key: how it was sent (JSON or NDJSON), its
/// query string and its body, hashed as they arrive. A submission without a key is not hashed.
#[derive(Debug)]
struct Fingerprint(Option<Sha256>);

impl Fingerprint {
    fn new(ndjson: bool, query: Option<&str>) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(if ndjson { b"ndjson\n" as &[u8] } else { b"json\n" });
        hasher.update(query.unwrap_or("").as_bytes());
        hasher.update(b"\n");
        Self(Some(hasher))
    }

    fn none() -> Self {
        Self(None)
    }

    fn update(&mut self, bytes: &[u8]) {
        if let Some(hasher) = &mut self.0 {
            hasher.update(bytes);
        }
    }

    fn hex(self) -> String {
        self.0.map(|h| hex::encode(h.finalize())).unwrap_or_default()
    }
}

#[utoipa::path(post, path = "/v1/jobs", tag = "jobs",
    description = "Submit a job: a JSON body, or `application/x-ndjson` streamed with the settings in the query string.",
    request_body(content = JsonJob, content_type = "application/json"),
    params(("Idempotency-Key" = Option<String>, Header, description = "The same key and body give the same job")),
    responses(
        (status = 202, body = Accepted, description = "Committed durably"),
        (status = 400, body = ErrorBody, description = "Refused whole; every bad line located"),
        (status = 401, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 429, body = ErrorBody)),
    security(("bearer" = [])))]
/// `POST /v1/jobs`. With an `Idempotency-Key`, the same key and body give the same job (the
/// job is not submitted again) and the same key with another body is 409.
pub async fn submit(
    State(state): State<ApiState>,
    caller: Caller,
    Query(query): Query<QuerySettings>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    // Intake beyond the configured concurrency, in all or of this tenant, is turned away at
    // once, never queued.
    let _slot = state.intake.enter(&caller.0.name)?;
    let ndjson = is_ndjson(&headers);
    let tenant = caller.0.name.clone();
    let Some(key) = idempotency_key(&headers)? else {
        let mut none = Fingerprint::none();
        let submitted = accept(&state, &caller, query, ndjson, body, &mut none).await?;
        return Ok(accepted(submitted.job_id.to_string(), submitted.accepted));
    };
    let mut fingerprint = Fingerprint::new(ndjson, uri.query());
    match state.app.claim_key(&tenant, &key).await? {
        KeyClaim::Claimed => {
            match accept(&state, &caller, query, ndjson, body, &mut fingerprint).await {
                Ok(submitted) => {
                    let hash = fingerprint.hex();
                    state.app.complete_key(&tenant, &key, &hash, submitted.job_id).await?;
                    Ok(accepted(submitted.job_id.to_string(), submitted.accepted))
                }
                Err(e) => {
                    state.app.release_key(&tenant, &key).await?;
                    Err(e)
                }
            }
        }
        KeyClaim::Held { job: Some(job), body_sha256: Some(hash) } => {
            // The body is read to tell the same submission from another, never stored.
            let mut chunks = body.into_data_stream();
            let mut seen = 0u64;
            while let Some(chunk) = chunks.next().await {
                let chunk =
                    chunk.map_err(|e| ApiError::bad_input(format!("reading the body: {e}")))?;
                seen += chunk.len() as u64;
                if seen > state.limits.max_body_bytes {
                    return Err(too_large(state.limits));
                }
                fingerprint.update(&chunk);
            }
            if fingerprint.hex() != hash {
                return Err(ApiError::Conflict {
                    code: "idempotency_key_reused",
                    message: format!(
                        "Idempotency-Key {key} was used for another submission (job {job}); use a new key for a new job"
                    ),
                });
            }
            let job = state.app.job(job).await?;
            Ok(accepted(job.id.to_string(), job.accepted))
        }
        KeyClaim::Held { .. } => Err(ApiError::Conflict {
            code: "idempotency_key_in_use",
            message: format!(
                "a submission with Idempotency-Key {key} is still being taken in; ask again shortly"
            ),
        }),
    }
}

fn accepted(job_id: String, accepted: u64) -> Response {
    (StatusCode::ACCEPTED, Json(Accepted { job_id, accepted })).into_response()
}

/// Takes a submission in: parsed, checked and committed whole by the app, or refused whole.
async fn accept(
    state: &ApiState,
    caller: &Caller,
    query: QuerySettings,
    ndjson: bool,
    body: Body,
    fingerprint: &mut Fingerprint,
) -> Result<tranche_app::Submitted, ApiError> {
    let limits = state.limits;
    if ndjson {
        let settings = ApiSettings::try_from(query)?;
        let (provider, settings) = settings.job(&caller.0.name)?;
        // The upload is spooled to a file of its own first, never held in memory, so that the
        // job's transaction lasts as long as parsing and storing it, not as long as the
        // client takes to send it (on SQLite, one open write transaction holds every other
        // writer); the counters stop it at the limits.
        let spool = tempfile::tempfile()
            .map_err(|e| ApiError::Internal(format!("a spool file for the upload: {e}")))?;
        let mut spool = tokio::fs::File::from_std(spool);
        let (mut bytes, mut lines) = (0u64, 0u64);
        let mut chunks = body.into_data_stream();
        while let Some(chunk) = chunks.next().await {
            let chunk =
                chunk.map_err(|e| ApiError::bad_input(format!("reading the upload: {e}")))?;
            bytes += chunk.len() as u64;
            lines += chunk.iter().filter(|b| **b == b'\n').count() as u64;
            if bytes > limits.max_body_bytes || lines > limits.max_requests_per_job {
                return Err(too_large(limits));
            }
            fingerprint.update(&chunk);
            spool
                .write_all(&chunk)
                .await
                .map_err(|e| ApiError::Internal(format!("spooling the upload: {e}")))?;
        }
        spool
            .seek(std::io::SeekFrom::Start(0))
            .await
            .map_err(|e| ApiError::Internal(format!("reading the spooled upload: {e}")))?;
        let reader = BufReader::with_capacity(1 << 20, spool);
        Ok(state.app.submit(&state.engine, reader, provider, settings, None).await?)
    } else {
        let bytes = axum::body::to_bytes(body, limits.max_body_bytes as usize)
            .await
            .map_err(|_| too_large(limits))?;
        fingerprint.update(&bytes);
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
        Ok(state.app.submit(&state.engine, lines.as_slice(), provider, settings, None).await?)
    }
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

#[utoipa::path(get, path = "/v1/jobs/{id}", tag = "jobs", params(("id" = String, Path)),
    responses((status = 200, body = Object, description = "The `status --json` object"),
        (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
/// `GET /v1/jobs/{id}`: the same object as `tranche status --json`.
pub async fn show(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let job = owned(&state, &caller, &id).await?;
    Ok(Json(state.app.status(&job).await?).into_response())
}

#[utoipa::path(post, path = "/v1/jobs/{id}/cancel", tag = "jobs", params(("id" = String, Path)),
    responses((status = 200, body = Object), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody)),
    security(("bearer" = [])))]
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

#[utoipa::path(get, path = "/v1/jobs/{id}/results", tag = "jobs",
    params(("id" = String, Path), ("status" = Option<String>, Query, description = "succeeded, failed or cancelled")),
    responses((status = 200, content_type = "application/x-ndjson", body = String,
        description = "One line per request: custom_id, key, status, output, error, answer, usage"),
        (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
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
        std::io::Error::other(e.to_string())
    });
    Ok(([(CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(chunks)).into_response())
}

#[utoipa::path(get, path = "/v1/jobs/{id}/cost", tag = "jobs", params(("id" = String, Path)),
    responses((status = 200, body = Object, description = "The `cost JOB --json` object"),
        (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
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

#[utoipa::path(get, path = "/v1/jobs", tag = "jobs",
    params(("state" = Option<String>, Query), ("cursor" = Option<String>, Query), ("limit" = Option<u32>, Query)),
    responses((status = 200, body = Object, description = "`{\"jobs\": [...], \"next_cursor\"}`"),
        (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
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
