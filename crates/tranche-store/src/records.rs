//! Plain records the store reads and writes.

use std::time::Duration;

use serde::{Deserialize, Serialize};
pub use tranche_core::AttemptOutcome;
use tranche_core::{
    AccountId, Endpoint, EngineId, InputHash, JobId, JobSettings, JobState, LeaseToken,
    ProviderKind, RequestState, TokenUsage, TrancheId, TrancheState, Usd,
};

/// A job as first recorded.
#[derive(Debug, Clone)]
pub struct NewJob {
    pub id: JobId,
    pub provider: ProviderKind,
    /// Where the input came from (a file name), for display.
    pub source: Option<String>,
    /// What the job asks for (its tenant included).
    pub settings: JobSettings,
    /// The blob-store object its requests' bodies rest in (one a line), when they rest there.
    pub body_object: Option<String>,
    /// The check its answers must pass (its id is `settings.answer_check`), recorded once.
    pub answer_check: Option<NewAnswerCheck>,
    pub created_at: i64,
}

/// An answer check as recorded: a JSON Schema and whether fenced JSON passes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewAnswerCheck {
    pub id: String,
    /// The schema's JSON text.
    pub schema: String,
    pub lenient_json: bool,
}

/// Who approved or rejected a job's answers, and when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Review {
    pub verdict: ReviewVerdict,
    pub by: String,
    pub at: i64,
}

/// What a person decided about a job's answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReviewVerdict {
    /// Every answer stands.
    Approved,
    /// Some (or all) answers were rejected; the rest stand.
    Rejected,
}

impl ReviewVerdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Approved => "approved",
            Self::Rejected => "rejected",
        }
    }
}

/// Where a new request's body is kept.
#[derive(Debug, Clone, Copy)]
pub enum RequestBody<'a> {
    /// In the database (jobs accepted without a blob store).
    Stored(&'a str),
    /// Bytes `offset..offset + len` of the job's body object in the blob store.
    InObject { offset: u64, len: u64 },
}

/// One request as first recorded.
#[derive(Debug, Clone, Copy)]
pub struct NewRequest<'a> {
    pub line: u64,
    pub custom_id: &'a str,
    /// The id the provider sees.
    pub wire_id: &'a str,
    pub endpoint: Endpoint,
    pub model: &'a str,
    pub body: RequestBody<'a>,
    /// The size of the request's line in the provider's input.
    pub wire_bytes: u64,
    pub input_hash: InputHash,
    /// How many times the request may be sent before it ends failed.
    pub max_attempts: u32,
    /// Estimated input + output tokens, for enqueued-token admission.
    pub est_tokens: u64,
    /// The most it may cost, for a job with a budget.
    pub max_cost: Option<Usd>,
    pub accepted_at: i64,
}

/// A stored job.
#[derive(Debug, Clone, Serialize)]
pub struct JobRecord {
    pub id: JobId,
    pub provider: ProviderKind,
    pub state: JobState,
    pub source: Option<String>,
    pub settings: JobSettings,
    pub accepted: u64,
    /// The upstream error that stopped the job, if one did.
    pub last_error: Option<serde_json::Value>,
    pub cancel_requested: bool,
    pub created_at: i64,
    pub updated_at: i64,
    pub finished_at: Option<i64>,
    /// The review of its answers, once a person decided.
    pub review: Option<Review>,
    /// The upstream error that paused it (its account's file storage is full with nothing of
    /// tranche's to free it); it resumes once an upload succeeds.
    pub paused: Option<serde_json::Value>,
}

/// A tenant of the HTTP server: a name and whether it may act for every tenant. The token it
/// authenticates with is stored only as its SHA-256, never here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TenantRecord {
    pub name: String,
    /// May see and act on every tenant's jobs, and manage tenants.
    pub admin: bool,
    pub created_at: i64,
    /// When its token was revoked; a revoked tenant authenticates no more.
    pub revoked_at: Option<i64>,
}

/// Which jobs a list shows: newest first by (created_at, id), a page at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobFilter<'a> {
    /// Only jobs recorded with this tenant (`None`: every job, with or without one).
    pub tenant: Option<&'a str>,
    /// Only jobs in this state.
    pub state: Option<JobState>,
    /// The keyset cursor: only jobs after this one in the list's order (the next page). A job
    /// this store does not know lists nothing.
    pub before: Option<JobId>,
    /// At most this many jobs.
    pub limit: u32,
}

/// How many of a job's requests are in each state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestCounts {
    pub accepted: u64,
    pub pending: u64,
    pub queued: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub cancelled: u64,
    /// Succeeded requests answered from an earlier identical request, at no cost.
    pub cached: u64,
    /// Requests that needed more than one attempt.
    pub retried: u64,
}

impl RequestCounts {
    pub fn add(&mut self, state: RequestState, n: u64) {
        self.accepted += n;
        match state {
            RequestState::Pending => self.pending += n,
            RequestState::Queued => self.queued += n,
            RequestState::Succeeded => self.succeeded += n,
            RequestState::Failed => self.failed += n,
            RequestState::Cancelled => self.cancelled += n,
        }
    }

    /// Requests not yet in a terminal state.
    pub fn open(&self) -> u64 {
        self.pending + self.queued
    }
}

/// Token totals a job was billed for, every attempt counted once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TokenTotals {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// A request waiting to be planned: just what the planner needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingItem {
    pub request_id: i64,
    pub wire_id: String,
    pub est_tokens: u64,
    pub wire_bytes: u64,
    pub job_id: JobId,
    /// The most it may cost, when its job has a budget.
    pub max_cost: Option<Usd>,
}

/// A waiting request, and an earlier request with the same custom id and input hash that
/// succeeded: the answer it may be given at no cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EarlierAnswer {
    pub request_id: i64,
    pub answered_by: i64,
}

/// One tenant's requests of one provider, endpoint, model and answer check waiting for a
/// tranche: what one tranche may hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingGroup {
    pub endpoint: Endpoint,
    pub model: String,
    /// The check their answers must pass (one tranche holds one check).
    pub answer_check: Option<String>,
    /// Their jobs' tenant (`None`: jobs recorded without one). One tranche holds one
    /// tenant's requests, so tenants take turns and their shares can be capped.
    pub tenant: Option<String>,
    pub count: u64,
    /// When the group's oldest request was accepted (pooling thresholds wait on it).
    pub oldest_accepted_at: i64,
}

impl PendingGroup {
    /// The group, to read its requests by.
    pub fn pool(&self) -> Pool<'_> {
        Pool {
            endpoint: self.endpoint,
            model: &self.model,
            answer_check: self.answer_check.as_deref(),
            tenant: self.tenant.as_deref(),
        }
    }
}

/// Which waiting requests a page reads: one [`PendingGroup`] of a provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool<'a> {
    pub endpoint: Endpoint,
    pub model: &'a str,
    pub answer_check: Option<&'a str>,
    pub tenant: Option<&'a str>,
}

/// What one tenant holds of a provider's capacity, per account and model: the estimated
/// tokens of its tranches that are (or are about to be) at the provider, and how many of its
/// tranches have not ended (each holds at most one input file there until it is cleaned).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantLoad {
    pub tenant: Option<String>,
    pub account: Option<AccountId>,
    pub model: String,
    pub enqueued_tokens: u64,
    pub live_tranches: u64,
}

/// A tranche as first recorded.
#[derive(Debug, Clone)]
pub struct NewTranche {
    pub id: TrancheId,
    /// The provider account its batch is to live on.
    pub account: AccountId,
    pub est_tokens: u64,
    pub provider: ProviderKind,
    pub endpoint: Endpoint,
    pub model: String,
    /// The check its answers must pass.
    pub answer_check: Option<String>,
    /// The tenant whose requests it holds.
    pub tenant: Option<String>,
    pub bytes: u64,
    pub created_at: i64,
}

/// A stored tranche.
#[derive(Debug, Clone, Serialize)]
pub struct TrancheRecord {
    pub id: TrancheId,
    pub provider: ProviderKind,
    pub endpoint: Endpoint,
    pub model: String,
    /// The check its answers must pass.
    pub answer_check: Option<String>,
    pub state: TrancheState,
    pub request_count: u64,
    pub bytes: u64,
    pub input_file_id: Option<String>,
    pub batch_id: Option<String>,
    pub batch_status: Option<String>,
    pub output_file_id: Option<String>,
    pub error_file_id: Option<String>,
    /// Where the provider serves the results, when not as files.
    pub results_url: Option<String>,
    /// Whole-batch errors the provider reported (JSON array).
    pub batch_errors: Option<serde_json::Value>,
    /// The last upstream error met while working on this tranche.
    pub last_error: Option<serde_json::Value>,
    /// Do not work on it before this time (backoff).
    pub not_before: i64,
    /// Estimated tokens of its requests, for enqueued-token admission.
    pub est_tokens: u64,
    /// The user cancelled every job with requests in it.
    pub cancel_requested: bool,
    /// The engine stepping it, while one holds its lease (an expired lease may linger here).
    pub lease_owner: Option<EngineId>,
    /// When that lease lapses, in unix milliseconds of the database's clock.
    pub lease_expires_at: i64,
    /// The provider account its batch lives on (`None` for tranches made before accounts
    /// were recorded).
    pub account: Option<AccountId>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// A lease just taken or renewed: how long it has left, as the database judged it. The holder
/// counts down from there on its own monotonic clock, so clocks of other hosts never matter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseGrant {
    pub remaining: Duration,
}

/// What a compare-and-set transition of a tranche expects: the lease it holds and the state
/// it last saw. A transition that finds either changed changes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub token: LeaseToken,
    pub state: TrancheState,
}

/// One line of a tranche's input.
#[derive(Debug, Clone)]
pub struct InputLine {
    pub wire_id: String,
    /// The job the request is of (whose settings say how it is sent).
    pub job_id: JobId,
    pub endpoint: Endpoint,
    pub body: InputBody,
}

/// Where an input line's body is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputBody {
    /// The body itself (kept in the database).
    Text(String),
    /// Bytes `offset..offset + len` of the blob-store object `object`.
    InObject { object: String, offset: u64, len: u64 },
}

/// What a file at a provider is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FilePurpose {
    BatchInput,
    BatchOutput,
    BatchError,
}

impl FilePurpose {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BatchInput => "batch_input",
            Self::BatchOutput => "batch_output",
            Self::BatchError => "batch_error",
        }
    }
}

/// A file tranche uploaded to, or had created at, a provider.
#[derive(Debug, Clone)]
pub struct FileRecord {
    pub provider: ProviderKind,
    pub file_id: String,
    pub purpose: FilePurpose,
    pub tranche_id: TrancheId,
    pub filename: Option<String>,
    pub bytes: Option<u64>,
    pub expires_at: Option<i64>,
    pub created_at: i64,
}

/// A provider file this store knows, with the tranche it belongs to and where that stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileOwner {
    pub file_id: String,
    pub tranche_id: TrancheId,
    pub tranche_state: TrancheState,
}

/// What one audit of an account's files counted, kept so that later audits can tell how fast
/// the files the provider limits (batch input files) grow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileAuditCounts {
    pub account: AccountId,
    /// Unix seconds.
    pub at: i64,
    /// Every file the account holds.
    pub total: u64,
    /// Batch input files with an expiry.
    pub inputs_with_expiry: u64,
    /// Batch input files kept until deleted.
    pub inputs_without_expiry: u64,
}

/// How many provider files tranche has made and deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct FileCounts {
    pub uploaded: u64,
    pub created_by_provider: u64,
    pub deleted: u64,
    pub live: u64,
}

/// The result of one request within a tranche, as the engine decided it.
#[derive(Debug, Clone)]
pub struct ResultUpdate<'a> {
    /// The request's new state (terminal, or back to pending for a retry).
    pub state: RequestState,
    pub outcome: AttemptOutcome,
    pub status_code: Option<u16>,
    /// The provider's response body, for successes and for answers that failed their check
    /// (kept only when the request ends, so that a re-parse can read it).
    pub output: Option<&'a OutputRef>,
    /// The error as JSON, for failures.
    pub error: Option<&'a str>,
    /// What the provider billed for this attempt (an answer that failed its check was billed
    /// too); recorded once per attempt, in the usage ledger.
    pub billed: Option<&'a Billed>,
    /// Whether this result spends one of the request's attempts (a whole-batch failure
    /// returns requests to the pool without spending one).
    pub spends_attempt: bool,
    /// For a request returned to the pool: not before this time.
    pub not_before: i64,
    pub at: i64,
}

/// A successful result line, recorded with others of its tranche in one statement.
#[derive(Debug, Clone)]
pub struct Success {
    pub wire_id: String,
    pub status_code: u16,
    /// The provider's response body, as it returned it.
    pub output: OutputRef,
    /// What the provider billed for it, when the response says.
    pub billed: Option<Billed>,
}

/// What the provider billed one attempt for: the model that answered and its tokens by kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Billed {
    /// The model the response names, or the tranche's when it names none.
    pub model: String,
    pub tokens: TokenUsage,
}

/// What claiming an idempotency key found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyClaim {
    /// The key is the caller's now: submit, then complete or release it.
    Claimed,
    /// Another submission holds it: completed (its job and body hash), or still under way.
    Held { job: Option<JobId>, body_sha256: Option<String> },
}

/// Whether a ledger row counts tokens a provider billed, or tokens an earlier result saved
/// (requests answered from it, at no cost).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UsageKind {
    Billed,
    Reused,
}

impl UsageKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Billed => "billed",
            Self::Reused => "reused",
        }
    }
}

impl std::str::FromStr for UsageKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "billed" => Ok(Self::Billed),
            "reused" => Ok(Self::Reused),
            other => Err(format!("unknown usage kind {other:?}")),
        }
    }
}

/// Tokens of one kind of usage, provider and model, summed over a job or a period.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageRow {
    pub kind: UsageKind,
    pub provider: ProviderKind,
    pub model: String,
    /// Attempts (billed) or requests (reused) counted.
    pub requests: u64,
    pub tokens: TokenUsage,
}

/// Where a request stands in its retry budget, for the engine to decide what a failure means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptInfo {
    /// The request's job (whose settings say what an invalid answer does).
    pub job_id: JobId,
    /// Attempts spent before this one.
    pub attempts: u32,
    pub max_attempts: u32,
    pub batch_returns: u32,
}

/// One request's outcome, as `tranche results` prints it and a re-parse reads it.
#[derive(Debug, Clone)]
pub struct ResultRow {
    pub request_id: i64,
    pub custom_id: String,
    pub wire_id: String,
    /// The tranche of its last attempt.
    pub tranche_id: Option<TrancheId>,
    pub endpoint: Endpoint,
    pub state: RequestState,
    pub output: Option<OutputRef>,
    pub error: Option<String>,
    /// Answered from an earlier identical request.
    pub cached: bool,
    pub attempts: u32,
    pub max_attempts: u32,
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
}

/// Which of a job's answers a review rejects.
#[derive(Debug, Clone, Copy)]
pub enum Rejected<'a> {
    /// None: the answers are approved.
    None,
    /// Every succeeded one.
    All,
    /// The answers of these custom ids (those that succeeded).
    Only(&'a [String]),
}

/// A re-parse's verdict on one ended request.
#[derive(Debug, Clone)]
pub struct Verdict {
    pub request_id: i64,
    /// `succeeded`, `failed`, or `pending` (sent again).
    pub state: RequestState,
    /// The error as JSON, for failures.
    pub error: Option<String>,
    /// The answer the verdict is on (kept unless the request goes out again).
    pub output: Option<OutputRef>,
    /// For a request sent again: not before this time.
    pub not_before: i64,
}

/// Where a succeeded request's output (the provider's response body) is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputRef {
    /// The output itself (kept in the database: requests answered before outputs rested in
    /// the blob store).
    Text(String),
    /// Bytes `offset..offset + len` of the blob-store object `object` (a raw result file).
    InObject { object: String, offset: u64, len: u64 },
}

/// Which fields a tranche step learned; `None` leaves a field as it was.
#[derive(Debug, Clone)]
pub struct TrancheUpdate {
    pub state: TrancheState,
    pub input_file_id: Option<String>,
    pub batch_id: Option<String>,
    pub batch_status: Option<String>,
    pub output_file_id: Option<String>,
    pub error_file_id: Option<String>,
    pub results_url: Option<String>,
    pub batch_errors: Option<serde_json::Value>,
    /// Replaces the last error (`None` clears it).
    pub last_error: Option<serde_json::Value>,
    pub not_before: i64,
    pub at: i64,
}

impl TrancheUpdate {
    /// A plain move to `state`, due at once.
    pub fn to(state: TrancheState, at: i64) -> Self {
        Self {
            state,
            input_file_id: None,
            batch_id: None,
            batch_status: None,
            output_file_id: None,
            error_file_id: None,
            results_url: None,
            batch_errors: None,
            last_error: None,
            not_before: at,
            at,
        }
    }
}

/// An object of the blob store, recorded once it is whole: what it must still be when read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobRecord {
    pub key: String,
    pub size: u64,
    /// Lower-case hex.
    pub sha256: String,
    pub created_at: i64,
}
