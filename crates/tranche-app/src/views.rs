//! Views of jobs for people and scripts: the status object (`status --json`, and the server's
//! job resource to come), the progress of a running job, and the summary of an ended one. Each
//! costs what it shows (counters and the job's tranches), never a scan of its requests.

use std::collections::BTreeMap;

use serde::Serialize;
use tranche_core::{JobState, TrancheState};
use tranche_store::{FileCounts, JobRecord, RequestCounts, TokenTotals};

/// A job's counts as shown: `pending` is every request not yet in a terminal state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CountsView {
    pub accepted: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub cancelled: u64,
    pub pending: u64,
    /// Answered from an earlier identical request, at no cost.
    pub cached: u64,
    /// Needed more than one attempt.
    pub retried: u64,
}

impl From<RequestCounts> for CountsView {
    fn from(c: RequestCounts) -> Self {
        Self {
            accepted: c.accepted,
            succeeded: c.succeeded,
            failed: c.failed,
            cancelled: c.cancelled,
            pending: c.open(),
            cached: c.cached,
            retried: c.retried,
        }
    }
}

/// An unfinished tranche held up, and why (retry backoff, an adoption that waits).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Waiting {
    pub tranche_id: String,
    pub state: TrancheState,
    pub not_before: i64,
    pub reason: serde_json::Value,
}

/// Which engine is stepping one of the job's tranches (a lease the store has not yet seen
/// lapse: one whose engine died shows until it does).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Leased {
    pub tranche_id: String,
    pub state: TrancheState,
    pub engine: String,
    pub lease_expires_at_ms: i64,
}

/// A job as `status --json` prints it. Its keys are an interface scripts rely on: add, never
/// rename.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobStatus {
    pub job_id: String,
    pub state: JobState,
    pub provider: String,
    pub tenant: Option<String>,
    pub source: Option<String>,
    pub created_at: i64,
    pub finished_at: Option<i64>,
    pub counts: CountsView,
    /// How many of the tranches holding its requests are in each state.
    pub tranches: BTreeMap<String, u64>,
    pub tokens: TokenTotals,
    pub files: FileCounts,
    /// The upstream error that stopped the job, if one did.
    pub error: Option<serde_json::Value>,
    /// The same error's provider facts, as the provider gave them (`400 quotaExceeded` stays
    /// `400 quotaExceeded`), when the error came from a provider.
    pub upstream: Option<Upstream>,
    pub waiting: Vec<Waiting>,
    pub leases: Vec<Leased>,
    /// Who approved or rejected its answers and when, once someone did.
    pub review: Option<tranche_store::Review>,
    /// Whether it waits for room at the provider (`error` says why).
    pub paused: bool,
}

/// A job in a list of jobs.
#[derive(Debug, Clone)]
pub struct JobRow {
    pub job: JobRecord,
    pub counts: CountsView,
}

/// A running job's progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    /// Requests in a terminal state.
    pub done: u64,
    pub tranches: Vec<(TrancheState, u64)>,
}

/// What an ended (or stopped) job did, for the summary table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub counts: CountsView,
    pub tranches: u64,
    pub tokens: TokenTotals,
    pub files: FileCounts,
}

/// How a job ended, as the CLI's exit codes tell it.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Every request succeeded (or the job has not ended).
    Succeeded,
    /// Some requests failed or were cancelled.
    SomeFailed,
    /// An upstream failure stopped it; the stored upstream error.
    Stopped(serde_json::Value),
    /// Its answers wait for a person's approval.
    AwaitsReview,
    /// The provider's file storage is full with nothing of tranche's to free it: the job waits
    /// for room (a worker resumes it); the upstream error.
    Paused(serde_json::Value),
}

/// What a provider answered, kept with a job it stopped: its own status, code, type, message
/// and request id. Printed as JSON: exact keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Upstream {
    pub provider: String,
    pub status: Option<u16>,
    pub code: Option<String>,
    #[serde(rename = "type")]
    pub error_type: Option<String>,
    pub message: String,
    pub request_id: Option<String>,
}

impl Upstream {
    /// The provider facts of a stored error (an `UpstreamError` or a line error, as JSON);
    /// `None` for an error that names no provider.
    pub fn of(error: &serde_json::Value) -> Option<Self> {
        let text = |name: &str| error.get(name).and_then(|v| v.as_str()).map(str::to_owned);
        Some(Self {
            provider: text("provider")?,
            status: error
                .get("status")
                .and_then(serde_json::Value::as_u64)
                .and_then(|s| u16::try_from(s).ok()),
            code: text("code"),
            error_type: text("error_type").or_else(|| text("type")),
            message: text("message").unwrap_or_default(),
            request_id: text("request_id"),
        })
    }
}

/// `openai returned 400 code: message (request id …)` from a stored upstream error.
pub fn upstream_text(error: &serde_json::Value) -> String {
    let field = |name: &str| {
        error.get(name).and_then(|v| {
            v.as_str().map(str::to_owned).or_else(|| v.as_u64().map(|n| n.to_string()))
        })
    };
    let provider = field("provider").unwrap_or_else(|| "the provider".to_owned());
    let code = field("code").or_else(|| field("error_type")).map(|c| format!(" {c}"));
    let code = code.unwrap_or_default();
    let mut text = match field("status").as_deref() {
        Some(status @ ("401" | "403")) => format!(
            "{provider} rejected tranche's credentials ({status}{code}); check the API key tranche uses for {provider}"
        ),
        Some(status) => format!("{provider} returned {status}{code}"),
        None => format!("{provider} failed{code}"),
    };
    text.push_str(&format!(": {}", field("message").unwrap_or_default()));
    if let Some(id) = field("request_id") {
        text.push_str(&format!(" (request id {id})"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_errors_keep_provider_status_code_message_and_request_id() {
        let error = serde_json::json!({"provider": "azure", "status": 400, "code": "quotaExceeded",
            "message": "The quota is reached.", "request_id": "req_1"});
        assert_eq!(
            upstream_text(&error),
            "azure returned 400 quotaExceeded: The quota is reached. (request id req_1)"
        );
        let auth = serde_json::json!({"provider": "openai", "status": 401, "message": "bad key"});
        assert!(upstream_text(&auth).contains("rejected tranche's credentials (401)"));
    }
}
