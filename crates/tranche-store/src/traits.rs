//! What a store can do, one trait per capability: jobs, views, planning and claims, tranches,
//! provider files, ingest, leases and tenants. Every backend implements all of them (`Store`) and
//! passes the conformance suite; the engine and the CLI see only these traits.
//!
//! Timestamps in records are given by the caller (unix seconds by the engine's clock); leases
//! alone are judged by the store's own clock.

use std::time::Duration;

use futures::stream::BoxStream;
use tranche_core::{
    AccountId, EngineId, JobId, JobSettings, JobState, LeaseToken, ProviderKind, TrancheId,
    TrancheState, Usd,
};

use crate::error::StoreResult;
use crate::metrics::MetricsSnapshot;
use crate::records::*;

/// Recording jobs and moving them through their life.
#[async_trait::async_trait]
pub trait JobStore: Send + Sync {
    /// Starts recording a job. Nothing is visible to others until [`JobWriter::commit`];
    /// dropping the writer stores nothing.
    async fn begin_job(&self, job: NewJob) -> StoreResult<Box<dyn JobWriter>>;

    async fn job(&self, id: JobId) -> StoreResult<Option<JobRecord>>;

    /// The newest jobs first.
    async fn recent_jobs(&self, limit: u32) -> StoreResult<Vec<JobRecord>>;

    /// Jobs as `filter` picks them, newest first by (created_at, id): a tenant's or every
    /// job, in one state or any, starting after the cursor job `before` (keyset pages, served
    /// by an index on (tenant, created_at, id) and one on (created_at, id)).
    async fn list_jobs(&self, filter: JobFilter<'_>) -> StoreResult<Vec<JobRecord>>;

    /// Jobs that are not in a terminal state.
    async fn open_jobs(&self) -> StoreResult<Vec<JobRecord>>;

    /// Moves an open job to `state` (compare-and-set: a job that has ended stays as it
    /// ended). Returns whether it moved.
    async fn set_job_state(
        &self,
        id: JobId,
        state: JobState,
        last_error: Option<&serde_json::Value>,
        at: i64,
    ) -> StoreResult<bool>;

    /// Pauses (`Some(error)`) or resumes (`None`) every open job with requests in `tranche`.
    /// Returns how many changed.
    async fn set_jobs_paused(
        &self,
        tranche: TrancheId,
        error: Option<&serde_json::Value>,
        at: i64,
    ) -> StoreResult<u64>;

    /// Moves every job with requests in `tranche` from `from` to `to`. Returns how many moved.
    async fn move_jobs_of_tranche(
        &self,
        tranche: TrancheId,
        from: JobState,
        to: JobState,
        at: i64,
    ) -> StoreResult<u64>;

    /// Whether any of a job's requests is still waiting or in a tranche.
    async fn job_has_open_requests(&self, id: JobId) -> StoreResult<bool>;

    /// How many tranches holding a job's requests still have work left (cleanup included).
    async fn job_open_tranches(&self, id: JobId) -> StoreResult<u64>;

    /// The jobs with requests in a tranche.
    async fn jobs_of_tranche(&self, tranche: TrancheId) -> StoreResult<Vec<JobId>>;

    /// Marks a job as cancelled by its user and cancels its requests that are still waiting
    /// for a tranche. Returns how many requests that cancelled.
    async fn cancel_job(&self, id: JobId, at: i64) -> StoreResult<u64>;

    /// The unfinished tranches holding a job's queued requests, each with whether the job's
    /// requests are the only ones in it.
    async fn job_live_tranches(&self, id: JobId) -> StoreResult<Vec<(TrancheRecord, bool)>>;

    /// Ends a job's queued requests in a tranche shared with other jobs as cancelled; the
    /// tranche goes on for the others, and their results for this job are ignored.
    async fn detach_job(&self, job: JobId, tranche: TrancheId, at: i64) -> StoreResult<u64>;
}

/// Records a job's requests inside one transaction.
#[async_trait::async_trait]
pub trait JobWriter: Send {
    /// Adds a request; ids are given in the order requests are added.
    async fn add(&mut self, request: &NewRequest<'_>) -> StoreResult<()>;

    /// Writes what is buffered. Fails with [`crate::StoreError::DuplicateCustomIds`], writing
    /// none of it, when a request repeats a custom id of the job; the job is then to be
    /// dropped, not committed.
    async fn flush(&mut self) -> StoreResult<()>;

    /// How many requests were added so far.
    fn accepted(&self) -> u64;

    /// The job's body object, whole: recorded with the job when it commits.
    fn body_object(&mut self, object: BlobRecord);

    /// Makes the job and all its requests visible at once. Returns how many were accepted.
    async fn commit(self: Box<Self>) -> StoreResult<u64>;
}

/// What `status` and `results` show: each costs what it shows, not what the job holds.
#[async_trait::async_trait]
pub trait QueryStore: Send + Sync {
    async fn job_counts(&self, id: JobId) -> StoreResult<RequestCounts>;

    async fn job_tokens(&self, id: JobId) -> StoreResult<TokenTotals>;

    /// How many of the tranches holding a job's requests are in each state.
    async fn job_tranche_counts(&self, id: JobId) -> StoreResult<Vec<(TrancheState, u64)>>;

    /// The tranches holding a job's requests that still have work left, oldest first: what
    /// `status` shows waiting or leased. Costs the job's tranches, not its requests.
    async fn job_unfinished_tranches(&self, id: JobId) -> StoreResult<Vec<TrancheRecord>>;

    /// File counts over the tranches that hold a job's requests.
    async fn job_file_counts(&self, id: JobId) -> StoreResult<FileCounts>;

    /// A job's requests in input order, with their outcomes.
    fn job_results(&self, id: JobId) -> BoxStream<'_, StoreResult<ResultRow>>;
}

/// What a metrics scrape shows: figures over every job and tranche, each an aggregate over
/// counters and small tables (jobs, tranches, the usage ledger), never a scan of requests.
#[async_trait::async_trait]
pub trait MetricsStore: Send + Sync {
    /// Jobs, requests and tranches by state, billed tokens by provider and model, and the
    /// upstream errors jobs and tranches carry now, read in one transaction.
    async fn metrics_snapshot(&self) -> StoreResult<MetricsSnapshot>;
}

/// Waiting requests, and claiming them into tranches.
#[async_trait::async_trait]
pub trait PlanStore: Send + Sync {
    /// Requests of one provider waiting for a tranche whose backoff has passed, grouped by
    /// endpoint, model, answer check and their jobs' tenant.
    async fn pending_groups(
        &self,
        provider: ProviderKind,
        now: i64,
    ) -> StoreResult<Vec<PendingGroup>>;

    /// Up to `limit` requests of one group (endpoint, model, answer check, tenant) waiting
    /// for a tranche whose backoff has passed, with ids above `after`, in the order they were
    /// accepted (keyset pages: memory does not grow with the number of waiting requests).
    /// A request identical (custom id, input hash, answer check) to one of another job in a
    /// tranche, or waiting since before it, is left out: it waits for that one's answer.
    async fn pending_page(
        &self,
        provider: ProviderKind,
        group: Pool<'_>,
        now: i64,
        after: i64,
        limit: u32,
    ) -> StoreResult<Vec<PendingItem>>;

    /// Up to `limit` waiting requests of one provider with ids above `after`, in id order,
    /// each with an earlier request of the same custom id and input hash that succeeded (not
    /// itself answered that way): the newest such. The engine decides which of them to answer
    /// from it.
    async fn earlier_answers(
        &self,
        provider: ProviderKind,
        after: i64,
        limit: u32,
    ) -> StoreResult<Vec<EarlierAnswer>>;

    /// Answers each waiting request with its earlier request's output: succeeded, marked
    /// cached, at no cost. A request no longer waiting is left alone. Returns how many were
    /// answered.
    async fn answer_from(&self, answers: &[EarlierAnswer], at: i64) -> StoreResult<u64>;

    /// Estimated tokens per model in tranches that are, or are about to be, at the provider.
    async fn enqueued_tokens(&self, provider: ProviderKind) -> StoreResult<Vec<(String, u64)>>;

    /// What each tenant's tranches of one provider that have not ended hold, per account
    /// and model (one aggregate over the live tranches).
    async fn tenant_loads(&self, provider: ProviderKind) -> StoreResult<Vec<TenantLoad>>;

    /// The most a job's requests in flight (queued in tranches) may still cost: what its
    /// budget holds for them until their results are billed.
    async fn job_queued_cost(&self, job: JobId) -> StoreResult<Usd>;

    /// Ends a job's waiting requests cancelled with `error` (JSON): its budget cannot pay for
    /// them. A request identical to one of another job still waiting or in flight keeps
    /// waiting: that one's answer may answer it at no cost. Returns how many.
    async fn end_waiting(&self, job: JobId, error: &str, at: i64) -> StoreResult<u64>;

    /// Records a tranche and claims its requests, in one transaction, while the planning duty
    /// `duty` is still held with its token. Requests no longer pending are not claimed; the
    /// tranche's count is what was claimed. Returns that count (a tranche that would claim
    /// none is not recorded), or `None` when the duty's lease passed to another engine (then
    /// nothing is recorded).
    async fn create_tranche(
        &self,
        tranche: &NewTranche,
        request_ids: &[i64],
        duty: (&str, LeaseToken),
    ) -> StoreResult<Option<u64>>;
}

/// Tranches and their compare-and-set transitions.
#[async_trait::async_trait]
pub trait TrancheStore: Send + Sync {
    /// Tranches with work left whose backoff has passed and that no engine holds a live
    /// lease on, oldest first. Stepping one takes its lease first.
    async fn due_tranches(&self, now: i64) -> StoreResult<Vec<TrancheRecord>>;

    /// The earliest time any unfinished tranche is due, if there is one: for one leased by an
    /// engine, not before its lease lapses.
    async fn next_due(&self) -> StoreResult<Option<i64>>;

    async fn tranche(&self, id: TrancheId) -> StoreResult<Option<TrancheRecord>>;

    /// The tranche's input lines, in request order.
    fn tranche_input(&self, id: TrancheId) -> BoxStream<'_, StoreResult<InputLine>>;

    /// The bytes of the tranche's input lines as submit measured them: the sum of what each
    /// of its queued requests recorded as `wire_bytes` (0 for a tranche that is not there).
    /// The size of its input file where no line grows on the way out, read without a row
    /// coming back.
    async fn tranche_input_bytes(&self, id: TrancheId) -> StoreResult<u64>;

    /// Moves a tranche to a new state, recording the fields the step learned: a
    /// compare-and-set on the lease and state in `held`. Returns false, changing nothing, when
    /// either is no longer what the caller holds.
    async fn update_tranche(
        &self,
        id: TrancheId,
        held: Held,
        update: TrancheUpdate,
    ) -> StoreResult<bool>;

    /// Puts a tranche off until `not_before`, recording why, without touching its state (the
    /// "-ing" intent the step recorded stays). Compares the lease token; returns whether the
    /// tranche was still held.
    async fn defer_tranche(
        &self,
        id: TrancheId,
        token: LeaseToken,
        last_error: &serde_json::Value,
        not_before: i64,
        at: i64,
    ) -> StoreResult<bool>;

    /// Asks for a tranche's batch to be cancelled at the provider (the engine does it).
    async fn request_tranche_cancel(&self, id: TrancheId, at: i64) -> StoreResult<()>;

    /// Whether a request with `wire_id` waits in `tranche`.
    async fn tranche_has_wire_id(&self, tranche: TrancheId, wire_id: &str) -> StoreResult<bool>;

    /// The tranche that recorded a provider batch, if any.
    async fn tranche_of_batch(
        &self,
        provider: ProviderKind,
        batch_id: &str,
    ) -> StoreResult<Option<TrancheId>>;
}

/// Files tranche uploaded to, or had created at, a provider.
#[async_trait::async_trait]
pub trait FileStore: Send + Sync {
    /// Records a provider file (idempotent: a second record of the same file changes nothing).
    async fn record_file(&self, file: &FileRecord) -> StoreResult<()>;

    async fn mark_file_deleted(
        &self,
        provider: ProviderKind,
        file_id: &str,
        at: i64,
    ) -> StoreResult<()>;

    /// Ids of a tranche's files not yet deleted, oldest first.
    async fn live_files(&self, tranche: TrancheId) -> StoreResult<Vec<String>>;

    /// How many input files were uploaded for a tranche (deleted ones included).
    async fn tranche_uploads(&self, tranche: TrancheId) -> StoreResult<u64>;

    /// How many of an account's tranches other than `except` hold live files at the provider
    /// and have not ended: files that will be freed when they are cleaned up.
    async fn tranches_holding_files(
        &self,
        provider: ProviderKind,
        account: Option<&AccountId>,
        except: TrancheId,
    ) -> StoreResult<u64>;

    /// Of `file_ids`, the ones recorded here (deleted or not), each with its tranche.
    async fn file_owners(
        &self,
        provider: ProviderKind,
        file_ids: &[String],
    ) -> StoreResult<Vec<FileOwner>>;

    /// Where each of `tranches` that this store knows stands.
    async fn tranche_states(
        &self,
        tranches: &[TrancheId],
    ) -> StoreResult<Vec<(TrancheId, TrancheState)>>;

    /// How many input files were uploaded for an account's tranches at or after `since`.
    async fn uploads_since(
        &self,
        provider: ProviderKind,
        account: Option<&AccountId>,
        since: i64,
    ) -> StoreResult<u64>;

    /// Whether any tranche went to the account (its files are tranche's business).
    async fn account_used(&self, account: &AccountId) -> StoreResult<bool>;

    /// Keeps what an audit counted.
    async fn record_file_audit(&self, audit: &FileAuditCounts) -> StoreResult<()>;

    /// The account's earliest audit at or after `since`.
    async fn first_file_audit(
        &self,
        account: &AccountId,
        since: i64,
    ) -> StoreResult<Option<FileAuditCounts>>;
}

/// Recording a tranche's results.
#[async_trait::async_trait]
pub trait IngestStore: Send + Sync {
    /// Starts recording a tranche's results, in one transaction, under the lease and state in
    /// `held` (compared again when the writer commits).
    async fn begin_ingest(
        &self,
        tranche: TrancheId,
        held: Held,
    ) -> StoreResult<Box<dyn IngestWriter>>;
}

/// Records the results of one tranche inside one transaction.
#[async_trait::async_trait]
pub trait IngestWriter: Send {
    /// Where the queued request with `wire_id` in this tranche stands, if there is one.
    async fn attempt_info(&mut self, wire_id: &str) -> StoreResult<Option<AttemptInfo>>;

    /// The tranche's requests that have no result yet, with where each stands.
    async fn unanswered(&mut self) -> StoreResult<Vec<(String, AttemptInfo)>>;

    /// Records the result for the request with `wire_id` in this tranche. Returns false when
    /// no queued request of the tranche has that id (unknown, or already recorded). A request
    /// whose new state is `pending` leaves the tranche and returns to the pool.
    async fn record(&mut self, wire_id: &str, update: &ResultUpdate<'_>) -> StoreResult<bool>;

    /// Records successful result lines, many at a time (`lines` is drained): each request
    /// with that wire id waiting in this tranche ends `succeeded` with the output, spending an
    /// attempt. A line whose wire id matches no waiting request (unknown, or recorded
    /// already) changes nothing. Returns how many lines were recorded.
    async fn record_successes(&mut self, lines: &mut Vec<Success>, at: i64) -> StoreResult<u64>;

    /// Makes all recorded results visible at once, and moves the tranche to `next`. Returns
    /// false, recording nothing, when the tranche's lease or state is no longer what the
    /// writer was begun with.
    async fn commit(self: Box<Self>, next: TrancheState, at: i64) -> StoreResult<bool>;
}

/// Leases: how engines on one store take turns. Judged by the store's own clock.
#[async_trait::async_trait]
pub trait LeaseStore: Send + Sync {
    /// Takes the lease on a tranche that has work left and is due at `now` (unix seconds),
    /// unless another engine holds an unexpired lease on it. Returns the tranche as it stands
    /// under the new lease, or `None` when it is not to be had (leased, finished, not due).
    async fn lease_tranche(
        &self,
        id: TrancheId,
        owner: &EngineId,
        token: LeaseToken,
        duration: Duration,
        now: i64,
    ) -> StoreResult<Option<(TrancheRecord, LeaseGrant)>>;

    /// Extends a tranche's lease held with `token` to `duration` from now. `None`: the lease
    /// passed to another engine (or was handed back), and the holder must stop.
    async fn renew_tranche_lease(
        &self,
        id: TrancheId,
        token: LeaseToken,
        duration: Duration,
    ) -> StoreResult<Option<LeaseGrant>>;

    /// Hands a tranche's lease back, so that another engine may step it at once.
    async fn release_tranche_lease(&self, id: TrancheId, token: LeaseToken) -> StoreResult<()>;

    /// Takes the named duty's lease unless another holder's is unexpired.
    async fn acquire_duty(
        &self,
        name: &str,
        owner: &EngineId,
        token: LeaseToken,
        duration: Duration,
    ) -> StoreResult<Option<LeaseGrant>>;

    /// Extends a duty's lease held with `token`; `None` when it passed on.
    async fn renew_duty(
        &self,
        name: &str,
        token: LeaseToken,
        duration: Duration,
    ) -> StoreResult<Option<LeaseGrant>>;

    /// Hands a duty's lease back.
    async fn release_duty(&self, name: &str, token: LeaseToken) -> StoreResult<()>;
}

/// Facts every engine of a deployment must agree on (the blob store it uses).
#[async_trait::async_trait]
pub trait DeploymentStore: Send + Sync {
    /// The recorded value of `key`, recording `proposed` first when there is none: the first
    /// engine decides, every later one compares.
    async fn deployment_fact(&self, key: &str, proposed: &str) -> StoreResult<String>;
}

/// Retention: forgetting the requests of jobs that ended long ago, keeping what they were.
#[async_trait::async_trait]
pub trait PruneStore: Send + Sync {
    /// Jobs that ended at or before `before` and still hold request rows or bytes, oldest first,
    /// each with whether its request rows are still there (a prune that stopped half-way
    /// removed them, not yet the bytes).
    async fn prunable_jobs(&self, before: i64) -> StoreResult<Vec<(JobRecord, bool)>>;

    /// Removes an ended job's request rows and everything kept per request (attempts, bodies
    /// and outputs held in the database), keeping the job itself with its counts and token
    /// totals, its tranches and the provider files recorded. Answers how many requests were
    /// removed; a job that has not ended is left whole (0).
    async fn prune_job_rows(&self, job: JobId, at: i64) -> StoreResult<u64>;

    /// Whether a tranche's files are still needed by a job other than those in `ignoring`:
    /// the tranche has not ended, such a job's requests were in it, or such a job answered
    /// requests from `outputs` (its raw output object). A tranche this store does not know
    /// is not its to judge: in use.
    async fn tranche_in_use(
        &self,
        tranche: TrancheId,
        outputs: &str,
        ignoring: &[JobId],
    ) -> StoreResult<bool>;

    /// Records that a pruned job's bytes are gone: it is not listed as prunable again.
    async fn job_pruned(&self, job: JobId, at: i64) -> StoreResult<()>;
}

/// The blob store's objects as recorded once whole (key, size, SHA-256): an object is
/// recorded only after it is complete, and checked against its record when read.
#[async_trait::async_trait]
pub trait BlobIndex: Send + Sync {
    /// Records an object that is now whole, replacing the record of an object written again
    /// under the same key.
    async fn record_blob(&self, blob: &BlobRecord) -> StoreResult<()>;

    /// The record of the object `key`, if there is one.
    async fn blob(&self, key: &str) -> StoreResult<Option<BlobRecord>>;

    /// Forgets the records of objects removed from the blob store.
    async fn forget_blobs(&self, keys: &[String]) -> StoreResult<()>;
}

/// Answers after they arrive: the checks they pass, the review of a job's answers, and a
/// re-parse's new verdicts.
#[async_trait::async_trait]
pub trait AnswerStore: Send + Sync {
    /// The answer check recorded under `id`.
    async fn answer_check(&self, id: &str) -> StoreResult<Option<NewAnswerCheck>>;

    /// Records what a person decided about a job awaiting review: the `rejected` answers end
    /// failed with `error`, the rest stand, and the job ends `done`. Returns how many answers
    /// were rejected, or `None` (changing nothing) when the job does not await review.
    async fn decide_review(
        &self,
        job: JobId,
        review: &Review,
        rejected: Rejected<'_>,
        error: &str,
    ) -> StoreResult<Option<u64>>;

    /// Gives a job a new answer check (`None`: none), its settings with it; the job's
    /// requests carry it from now on.
    async fn set_job_check(
        &self,
        job: JobId,
        settings: &JobSettings,
        check: Option<&NewAnswerCheck>,
        at: i64,
    ) -> StoreResult<()>;

    /// Applies a re-parse's verdicts to a job's ended requests (a request no longer ended is
    /// left alone). Returns how many changed.
    async fn apply_verdicts(&self, job: JobId, verdicts: &[Verdict], at: i64) -> StoreResult<u64>;

    /// Opens an ended (not cancelled) job again, for requests a re-parse sent back to the
    /// pool. Returns whether it moved.
    async fn reopen_job(&self, job: JobId, at: i64) -> StoreResult<bool>;

    /// Where one of a job's request bodies is.
    async fn request_body(&self, job: JobId, custom_id: &str) -> StoreResult<Option<InputBody>>;
}

/// The usage ledger: what providers billed each job for, and what earlier answers saved it,
/// summed by kind, provider and model. Written by ingest and by answering from earlier results,
/// once per attempt; kept when a job is pruned.
#[async_trait::async_trait]
pub trait UsageStore: Send + Sync {
    /// A job's usage.
    async fn job_usage(&self, job: JobId) -> StoreResult<Vec<UsageRow>>;

    /// Usage recorded from the day `since` (unix seconds) falls in onwards (the ledger keeps
    /// days), over every job, or one tenant's jobs.
    async fn usage_since(&self, since: i64, tenant: Option<&str>) -> StoreResult<Vec<UsageRow>>;
}

/// The HTTP server's tenants and the tokens they authenticate with, kept only as SHA-256 hex
/// (the token itself is never stored). A name has at most one unrevoked token; a revoked
/// name may be added again, with a new one.
#[async_trait::async_trait]
pub trait TenantStore: Send + Sync {
    /// Records a tenant with its token's hash. Returns false, recording nothing, when an
    /// unrevoked tenant of that name exists.
    async fn add_tenant(
        &self,
        name: &str,
        token_hash: &str,
        admin: bool,
        at: i64,
    ) -> StoreResult<bool>;

    /// The unrevoked tenant whose token has this hash.
    async fn tenant_by_token(&self, token_hash: &str) -> StoreResult<Option<TenantRecord>>;

    /// Every tenant ever added, revoked ones included, by name (then as added).
    async fn tenants(&self) -> StoreResult<Vec<TenantRecord>>;

    /// Revokes the unrevoked tenant of that name. Returns whether there was one.
    async fn revoke_tenant(&self, name: &str, at: i64) -> StoreResult<bool>;
}

/// Idempotency keys of submissions, per tenant: claimed before a job is accepted, completed
/// with the job and the body's hash once it is committed, released when it is refused.
#[async_trait::async_trait]
pub trait IdempotencyStore: Send + Sync {
    /// Claims `key` for `tenant` at `at`, or answers what holds it. A claim made before
    /// `stale_before` and never completed is taken over.
    async fn claim_key(
        &self,
        tenant: &str,
        key: &str,
        at: i64,
        stale_before: i64,
    ) -> StoreResult<KeyClaim>;

    /// Completes a claim with the job its submission made and the submission's hash.
    async fn complete_key(
        &self,
        tenant: &str,
        key: &str,
        body_sha256: &str,
        job: JobId,
    ) -> StoreResult<()>;

    /// Gives up a claim that was never completed (its submission was refused).
    async fn release_key(&self, tenant: &str, key: &str) -> StoreResult<()>;
}

/// A whole store: every capability, one backend.
#[async_trait::async_trait]
pub trait Store:
    JobStore
    + QueryStore
    + MetricsStore
    + PlanStore
    + TrancheStore
    + FileStore
    + IngestStore
    + LeaseStore
    + DeploymentStore
    + PruneStore
    + BlobIndex
    + AnswerStore
    + UsageStore
    + TenantStore
    + IdempotencyStore
    + std::fmt::Debug
{
    /// Closes every connection (SQLite checkpoints its log).
    async fn close(&self);
}
