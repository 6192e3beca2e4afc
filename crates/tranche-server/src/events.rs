//! `GET /v1/jobs/{id}/events`: server-sent events of a job's state and progress, read from the
//! store (so an API-only node serves them as well as one with a worker): an event whenever what
//! `GET /v1/jobs/{id}` would show has changed, numbered in order, the last (`end`) once the job is
//! done, failed or cancelled.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde_json::{Value, json};
use tranche_app::{App, Job};
use tranche_core::JobState;

use crate::ApiState;
use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};
use crate::jobs::owned;

/// How often the store is read for changes.
const EVERY: Duration = Duration::from_millis(250);

/// What an event carries: the job's state, counts and tranches.
async fn snapshot(app: &App, job: &Job) -> Option<(Value, bool)> {
    let job = app.job(job.id).await.ok()?;
    let status = app.status(&job).await.ok()?;
    let body = json!({
        "job_id": status.job_id,
        "state": status.state,
        "counts": status.counts,
        "tranches": status.tranches,
        "paused": status.paused,
        "upstream": status.upstream,
    });
    // A job awaiting review waits for a person, who may still approve it: the stream goes on.
    let ended = matches!(job.state, JobState::Done | JobState::Failed | JobState::Cancelled);
    Some((body, ended))
}

struct Follow {
    app: App,
    job: Job,
    last: Option<Value>,
    seq: u64,
    ended: bool,
}

fn follow(app: App, job: Job) -> impl Stream<Item = Result<Event, Infallible>> {
    let start = Follow { app, job, last: None, seq: 0, ended: false };
    futures::stream::unfold(start, |mut f| async move {
        if f.ended {
            return None;
        }
        loop {
            match snapshot(&f.app, &f.job).await {
                Some((body, ended)) if f.last.as_ref() != Some(&body) || ended => {
                    f.seq += 1;
                    f.ended = ended;
                    let name = if ended { "end" } else { "status" };
                    let event = Event::default()
                        .id(f.seq.to_string())
                        .event(name)
                        .json_data(&body)
                        .unwrap_or_else(|_| Event::default().event(name));
                    f.last = Some(body);
                    return Some((Ok(event), f));
                }
                _ => tokio::time::sleep(EVERY).await,
            }
        }
    })
}

#[utoipa::path(get, path = "/v1/jobs/{id}/events", tag = "jobs", params(("id" = String, Path)),
    responses((status = 200, content_type = "text/event-stream", body = String,
        description = "`status` events, numbered, then `end`"),
        (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
/// `GET /v1/jobs/{id}/events`.
pub async fn events(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let job = owned(&state, &caller, &id).await?;
    Ok(Sse::new(follow(state.app.clone(), job)).keep_alive(KeepAlive::default()).into_response())
}
