//! The reconciler: moves every unfinished tranche one step at a time, recording each
//! step's outcome before the next starts.
//!
//! A tranche's life: `planned` → `uploading` → `uploaded` → `creating` → `submitted` (polled
//! until the batch ends) → `collecting` (result files copied to raw storage) → `ingesting`
//! (lines matched to requests by wire id) → `cleaning` (provider files deleted) → `done`.
//! An upstream failure that cannot be retried ends the tranche `failed`, with every one of its
//! requests failed with that error.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use tranche_core::codec;
use tranche_core::plan::{GroupKey, PlanItem, PlannedTranche, Planner, TrancheLimits};
use tranche_core::{
    Endpoint, EngineId, JobId, JobState, LeaseToken, ProviderKind, RequestState, TrancheId,
    TrancheState,
};
use tranche_providers::{
    BatchId, BatchInput, BatchStatus, CreateBatch, FileId, InputTransport, LineError, LineOutcome,
    Provider, UpstreamError,
};
use tranche_store::{
    AttemptInfo, AttemptOutcome, FilePurpose, FileRecord, IngestWriter, NewTranche, ResultUpdate,
    Store, Success, TrancheRecord, TrancheUpdate,
};

use crate::error::EngineError;
use crate::lease::{EnsureError, Lease, LeaseLost, Subject, engine_id};
use crate::unix_now;

/// The configured provider adapters, by provider.
#[derive(Debug, Clone, Default)]
pub struct Providers {
    adapters: BTreeMap<ProviderKind, Arc<dyn Provider>>,
}

impl Providers {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with(mut self, provider: Arc<dyn Provider>) -> Self {
        self.adapters.insert(provider.kind(), provider);
        self
    }

    pub fn get(&self, kind: ProviderKind) -> Option<&Arc<dyn Provider>> {
        self.adapters.get(&kind)
    }
}

/// How the engine works. Paths are where it keeps files of its own.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Raw result files, one folder per tranche.
    pub raw_dir: PathBuf,
    /// Input files being built before upload.
    pub outbox_dir: PathBuf,
    /// How long to wait between two polls of a running batch...
    pub poll_interval: Duration,
    /// ...unless its provider has its own interval here (Azure advises at least 60 s).
    pub provider_poll_intervals: BTreeMap<ProviderKind, Duration>,
    /// The first wait after a retryable upstream failure.
    pub retry_backoff: Duration,
    /// Lower the providers' per-batch request limit.
    pub max_batch_requests: Option<usize>,
    /// Lower the providers' per-batch byte limit.
    pub max_batch_bytes: Option<u64>,
    /// How many times a request is sent at most, unless its job says otherwise.
    pub max_attempts: u32,
    /// How many whole-batch failures (validation, token limit) may return a request to the
    /// pool without spending an attempt.
    pub max_batch_returns: u32,
    /// A group's requests wait until there are this many of them...
    pub min_batch_size: usize,
    /// ...or until the oldest has waited this long.
    pub max_wait: Duration,
    /// Enqueued-token budget per model (estimated input + `max_tokens` of every request in
    /// batches at the provider). Tranches that would overflow it wait.
    pub token_budgets: BTreeMap<String, u64>,
    /// The budget for models not named in `token_budgets`; `None` admits everything.
    pub default_token_budget: Option<u64>,
    /// How long a lease on a tranche step (or on planning) lasts unless renewed. An engine
    /// that dies holding one delays that work by at most this long; a step starts no side
    /// effect with less than a quarter of it left.
    pub lease: Duration,
}

impl EngineConfig {
    /// Defaults for a data folder (`./.tranche` by default).
    pub fn in_dir(data_dir: &Path) -> Self {
        Self {
            raw_dir: data_dir.join("raw"),
            outbox_dir: data_dir.join("outbox"),
            poll_interval: Duration::from_secs(30),
            provider_poll_intervals: BTreeMap::from([
                (ProviderKind::Azure, Duration::from_secs(60)),
                (ProviderKind::Anthropic, Duration::from_secs(60)),
            ]),
            retry_backoff: Duration::from_secs(5),
            max_batch_requests: None,
            max_batch_bytes: None,
            max_attempts: 3,
            max_batch_returns: 3,
            min_batch_size: 1,
            max_wait: Duration::ZERO,
            token_budgets: BTreeMap::new(),
            default_token_budget: None,
            lease: Duration::from_secs(60),
        }
    }

    /// How long to wait between two polls of a batch at `provider`.
    pub fn poll_interval_for(&self, provider: ProviderKind) -> Duration {
        self.provider_poll_intervals.get(&provider).copied().unwrap_or(self.poll_interval)
    }

    /// The enqueued-token budget of a model, if it has one.
    pub fn token_budget(&self, model: &str) -> Option<u64> {
        self.token_budgets.get(model).copied().or(self.default_token_budget)
    }

    /// The wait before a request's `attempt`-th try (1-based), doubling from `retry_backoff`.
    pub fn retry_delay(&self, attempt: u32) -> Duration {
        let factor = 2u32.saturating_pow(attempt.saturating_sub(1).min(10));
        self.retry_backoff.saturating_mul(factor).min(Duration::from_secs(3600))
    }

    pub fn limits(&self, provider: ProviderKind) -> TrancheLimits {
        TrancheLimits::for_provider(provider).lowered(self.max_batch_requests, self.max_batch_bytes)
    }
}

/// When [`Engine::drive`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// When this job has reached a terminal state.
    JobEnds(JobId),
    /// When no job has work left.
    Idle,
    /// Only when cancelled.
    Cancelled,
}

/// The reconciler. Cheap to clone; clones share one engine id (and so take turns with other
/// engines, not with each other: drive one clone at a time).
#[derive(Debug, Clone)]
pub struct Engine {
    id: EngineId,
    store: Store,
    providers: Providers,
    config: EngineConfig,
}

/// A hash of a wire id, to tell duplicates apart while planning without keeping the ids.
fn wire_hash(wire_id: &str) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    BuildHasherDefault::<DefaultHasher>::default().hash_one(wire_id)
}

fn upstream_json(e: &UpstreamError) -> serde_json::Value {
    serde_json::to_value(e).unwrap_or_else(|_| serde_json::json!({ "message": e.to_string() }))
}

fn line_error_json(e: &LineError) -> String {
    serde_json::to_string(e).unwrap_or_else(|_| e.message.clone())
}

/// Whole seconds, rounded down: a sub-second interval makes the tranche due at once, and
/// [`Engine::drive`]'s own sleep paces it.
fn secs(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

#[derive(Deserialize)]
struct UsageOnly {
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(alias = "prompt_tokens")]
    input_tokens: Option<u64>,
    #[serde(alias = "completion_tokens")]
    output_tokens: Option<u64>,
}

fn usage_of(body: &RawValue) -> (Option<u64>, Option<u64>) {
    match serde_json::from_str::<UsageOnly>(body.get()) {
        Ok(UsageOnly { usage: Some(u) }) => (u.input_tokens, u.output_tokens),
        _ => (None, None),
    }
}

impl Engine {
    pub fn new(store: Store, providers: Providers, config: EngineConfig) -> Self {
        Self { id: engine_id(), store, providers, config }
    }

    /// The name this engine's leases carry (`status` shows it).
    pub fn id(&self) -> &EngineId {
        &self.id
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn providers(&self) -> &Providers {
        &self.providers
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    fn provider(&self, kind: ProviderKind) -> Result<&Arc<dyn Provider>, EngineError> {
        self.providers.get(kind).ok_or(EngineError::ProviderNotConfigured(kind))
    }

    /// Whole seconds until the next poll of a batch at `provider`, with up to 10% jitter so
    /// that many tranches do not poll in lockstep.
    fn poll_delay(&self, provider: ProviderKind) -> i64 {
        let base = secs(self.config.poll_interval_for(provider));
        let jitter = base / 10;
        if jitter > 0 { base + rand::random_range(0..=jitter) } else { base }
    }

    /// Works until `until` holds or `cancel` fires, calling `on_tick` after every round.
    pub async fn drive(
        &self,
        until: Until,
        cancel: &CancellationToken,
        mut on_tick: impl FnMut(),
    ) -> Result<(), EngineError> {
        loop {
            let wait = match self.round(until, &mut on_tick).await {
                Ok(None) => return Ok(()),
                Ok(Some(wait)) => wait,
                // Another engine holds the database past the busy timeout: losing a race is
                // not an error; try again shortly.
                Err(e) if e.is_contention() => {
                    warn!(error = %e, "the store is busy; trying again");
                    self.config
                        .poll_interval
                        .clamp(Duration::from_millis(50), Duration::from_secs(1))
                }
                Err(e) => return Err(e),
            };
            tokio::select! {
                () = cancel.cancelled() => return Ok(()),
                () = tokio::time::sleep(wait.max(Duration::from_millis(5))) => {}
            }
        }
    }

    /// One round of [`Engine::drive`]: a tick, then how long to wait before the next, or
    /// `None` when `until` holds.
    async fn round(
        &self,
        until: Until,
        on_tick: &mut impl FnMut(),
    ) -> Result<Option<Duration>, EngineError> {
        self.tick().await?;
        on_tick();
        match until {
            Until::JobEnds(job) => {
                if self.store.job(job).await?.is_none_or(|j| j.state.is_terminal()) {
                    return Ok(None);
                }
            }
            Until::Idle => {
                if self.store.open_jobs().await?.is_empty() {
                    return Ok(None);
                }
            }
            Until::Cancelled => {}
        }
        let wait = match self.store.next_due().await? {
            Some(due) => {
                let now = unix_now();
                if due <= now {
                    Duration::from_millis(0)
                } else {
                    Duration::from_secs(u64::try_from(due - now).unwrap_or(0))
                }
            }
            None => self.config.poll_interval,
        };
        Ok(Some(wait.min(self.config.poll_interval)))
    }

    /// One round: plan waiting requests, move every due tranche one step, settle jobs. Each
    /// tranche is stepped under its lease; one that another engine holds is left to it.
    pub async fn tick(&self) -> Result<(), EngineError> {
        for kind in ProviderKind::ALL {
            if self.providers.get(kind).is_some() {
                self.plan(kind).await?;
            }
        }
        for due in self.store.due_tranches(unix_now()).await? {
            // An engine steps only tranches of providers it has an adapter for.
            if self.providers.get(due.provider).is_none() {
                continue;
            }
            let token = LeaseToken::new();
            let Some((tranche, grant)) = self
                .store
                .lease_tranche(due.id, &self.id, token, self.config.lease, unix_now())
                .await?
            else {
                debug!(tranche = %due.id, "another engine has the tranche");
                continue;
            };
            let state = tranche.state;
            let lease = Lease::hold(
                self.store.clone(),
                Subject::Tranche(tranche.id),
                token,
                self.config.lease,
                grant,
                Some(state),
            );
            let result = self.step(tranche, &lease).await;
            lease.release().await;
            result?;
        }
        self.settle_jobs().await
    }

    /// Plans a provider's waiting requests, as the one engine holding its planning lease
    /// (another engine planning the same pool at once would only cut smaller tranches, but
    /// claims stay serialised all the same).
    async fn plan(&self, kind: ProviderKind) -> Result<(), EngineError> {
        let duty = format!("plan:{kind}");
        let token = LeaseToken::new();
        let Some(grant) =
            self.store.acquire_duty(&duty, &self.id, token, self.config.lease).await?
        else {
            debug!(provider = %kind, "another engine is planning");
            return Ok(());
        };
        let lease = Lease::hold(
            self.store.clone(),
            Subject::Duty(duty.clone()),
            token,
            self.config.lease,
            grant,
            None,
        );
        let result = self.plan_pool(kind, (&duty, token)).await;
        lease.release().await;
        result
    }

    /// Cuts every waiting request of one provider into tranches. Each group (endpoint +
    /// model) is read in pages and each tranche is claimed as soon as it is full, so memory
    /// holds one page and one tranche, however many requests wait.
    async fn plan_pool(
        &self,
        kind: ProviderKind,
        duty: (&str, LeaseToken),
    ) -> Result<(), EngineError> {
        let now = unix_now();
        let answered = self.store.answer_from_earlier(kind, now).await?;
        if answered > 0 {
            info!(provider = %kind, requests = answered, "answered from earlier results at no cost");
        }
        let groups = self.store.pending_groups(kind, now).await?;
        if groups.is_empty() {
            return Ok(());
        }
        let max_wait = i64::try_from(self.config.max_wait.as_secs()).unwrap_or(i64::MAX);
        let mut enqueued: BTreeMap<String, u64> =
            self.store.enqueued_tokens(kind).await?.into_iter().collect();
        for group in groups {
            // Pooling thresholds: a group goes out once it is large enough or old enough.
            let count = usize::try_from(group.count).unwrap_or(usize::MAX);
            if count < self.config.min_batch_size
                && now.saturating_sub(group.oldest_accepted_at) < max_wait
            {
                continue;
            }
            self.plan_group(kind, group.endpoint, group.model, now, &mut enqueued, duty).await?;
        }
        Ok(())
    }

    /// Cuts one group's waiting requests into tranches, until they run out or a tranche has to
    /// wait for enqueued-token room.
    async fn plan_group(
        &self,
        kind: ProviderKind,
        endpoint: Endpoint,
        model: String,
        now: i64,
        enqueued: &mut BTreeMap<String, u64>,
        duty: (&str, LeaseToken),
    ) -> Result<(), EngineError> {
        const PAGE: u32 = 4_096;
        let key = GroupKey { provider: kind, endpoint, model };
        let mut planner = Planner::new(self.config.limits(kind));
        // Two requests with one wire id (the same custom id in two jobs) must never share a
        // batch: the later one waits for the next round, and so another tranche. Hashes of
        // the open tranche's wire ids are enough to tell (a collision only delays a request).
        let mut wire_ids = HashSet::new();
        let mut after = 0;
        loop {
            let page =
                self.store.pending_page(kind, (endpoint, &key.model), now, after, PAGE).await?;
            let Some(last) = page.last() else { break };
            after = last.request_id;
            for item in page {
                let hash = wire_hash(&item.wire_id);
                if !wire_ids.insert(hash) {
                    continue;
                }
                let item = PlanItem {
                    group: key.clone(),
                    bytes: item.wire_bytes,
                    item: (item.request_id, item.est_tokens),
                };
                // Submission refuses requests larger than a batch, so this cannot fail; if a
                // stored request somehow is, it waits rather than being dropped.
                match planner.push(item) {
                    Ok(Some(full)) => {
                        // The item just pushed opened the next tranche, alone so far.
                        wire_ids.clear();
                        wire_ids.insert(hash);
                        if !self.claim(full, enqueued, duty).await? {
                            return Ok(());
                        }
                    }
                    Ok(None) => {}
                    Err(e) => warn!(error = %e, "a stored request exceeds the batch size limit"),
                }
            }
        }
        for planned in planner.finish() {
            if !self.claim(planned, enqueued, duty).await? {
                break;
            }
        }
        Ok(())
    }

    /// Records a planned tranche and claims its requests, unless it would overflow the model's
    /// enqueued-token budget. Returns false when planning stops: the tranche has to wait for
    /// room, or the planning lease passed to another engine.
    async fn claim(
        &self,
        planned: PlannedTranche<(i64, u64)>,
        enqueued: &mut BTreeMap<String, u64>,
        duty: (&str, LeaseToken),
    ) -> Result<bool, EngineError> {
        let est_tokens: u64 = planned.items.iter().map(|(_, tokens)| tokens).sum();
        let model = planned.group.model;
        let queued = enqueued.get(&model).copied().unwrap_or(0);
        if let Some(budget) = self.config.token_budget(&model) {
            // A tranche larger than the whole budget still goes out alone, or it never would.
            if queued > 0 && queued.saturating_add(est_tokens) > budget {
                debug!(model = %model, queued, est_tokens, budget, "tranche waits for enqueued-token room");
                return Ok(false);
            }
        }
        *enqueued.entry(model.clone()).or_insert(0) += est_tokens;
        let ids: Vec<i64> = planned.items.iter().map(|(id, _)| *id).collect();
        let tranche = NewTranche {
            id: TrancheId::new(),
            est_tokens,
            provider: planned.group.provider,
            endpoint: planned.group.endpoint,
            model,
            bytes: planned.bytes,
            created_at: unix_now(),
        };
        match self.store.create_tranche(&tranche, &ids, duty).await? {
            None => {
                info!(provider = %tranche.provider, "the planning lease passed to another engine; planning stops");
                Ok(false)
            }
            Some(0) => {
                debug!(model = %tranche.model, "the planned requests were claimed already");
                Ok(true)
            }
            Some(claimed) => {
                info!(tranche = %tranche.id, model = %tranche.model, requests = claimed, est_tokens, "planned tranche");
                Ok(true)
            }
        }
    }

    /// Moves one tranche, whose lease this engine holds, one step. A step whose lease passed
    /// to another engine stops before its next side effect and changes nothing more.
    async fn step(&self, tranche: TrancheRecord, lease: &Lease) -> Result<(), EngineError> {
        let id = tranche.id;
        match self.step_leased(tranche, lease).await {
            Ok(()) => Ok(()),
            Err(Abandoned::Lost) => {
                info!(tranche = %id, "the tranche's lease passed to another engine; step abandoned");
                Ok(())
            }
            Err(Abandoned::Engine(e)) => {
                warn!(tranche = %id, error = %e, "tranche step failed");
                Err(e)
            }
        }
    }

    /// The step itself; upstream failures are recorded on the tranche, so only a lost lease or
    /// the engine's own failure comes out.
    async fn step_leased(&self, tranche: TrancheRecord, lease: &Lease) -> Result<(), Abandoned> {
        let provider = Arc::clone(self.provider(tranche.provider).map_err(Abandoned::Engine)?);
        let id = tranche.id;
        if tranche.cancel_requested {
            match self.cancel_step(&*provider, &tranche, lease).await {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(StepError::Upstream(e)) if !e.retryable() => {
                    // The batch may have ended already; it will be collected as it is.
                    warn!(tranche = %id, error = %e, "the provider refused the cancel; collecting the batch as it ends");
                    let mut update = TrancheUpdate::to(tranche.state, unix_now());
                    update.batch_status = Some("cancelling".to_owned());
                    update.last_error = Some(upstream_json(&e));
                    return self.transition(lease, update).await;
                }
                Err(StepError::Upstream(e)) => {
                    return self.upstream_failed(&tranche, lease, &e).await;
                }
                Err(StepError::Abandoned(a)) => return Err(a),
            }
        }
        let result = match tranche.state {
            TrancheState::Planned if provider.transport() == InputTransport::UploadFile => {
                self.upload(&*provider, &tranche, lease).await
            }
            TrancheState::Uploading if provider.transport() == InputTransport::UploadFile => {
                self.adopt_or_upload(&*provider, &tranche, lease).await
            }
            TrancheState::Planned | TrancheState::Uploading => {
                self.create(&*provider, &tranche, lease).await
            }
            TrancheState::Uploaded => self.create(&*provider, &tranche, lease).await,
            TrancheState::Creating => self.adopt_or_create(&*provider, &tranche, lease).await,
            TrancheState::Submitted => self.poll(&*provider, &tranche, lease).await,
            TrancheState::Collecting => self.collect(&*provider, &tranche, lease).await,
            TrancheState::Ingesting => self.ingest(&*provider, &tranche, lease).await,
            TrancheState::Cleaning => self.clean(&*provider, &tranche, lease).await,
            TrancheState::Done | TrancheState::Failed => Ok(()),
        };
        match result {
            Ok(()) => Ok(()),
            Err(StepError::Upstream(e)) => self.upstream_failed(&tranche, lease, &e).await,
            Err(StepError::Abandoned(a)) => Err(a),
        }
    }

    /// Records a transition of the leased tranche: a compare-and-set on the lease and the state
    /// this engine last saw. A lost compare-and-set abandons the step.
    async fn transition(&self, lease: &Lease, update: TrancheUpdate) -> Result<(), Abandoned> {
        let Subject::Tranche(id) = lease.subject() else {
            return Err(Abandoned::Lost);
        };
        let state = update.state;
        if !self.store.update_tranche(*id, lease.held(), update).await? {
            return Err(Abandoned::Lost);
        }
        lease.moved_to(state);
        Ok(())
    }

    async fn upstream_failed(
        &self,
        tranche: &TrancheRecord,
        lease: &Lease,
        e: &UpstreamError,
    ) -> Result<(), Abandoned> {
        let now = unix_now();
        let error = upstream_json(e);
        if e.retryable() {
            let wait =
                e.retry_after.unwrap_or(self.config.retry_backoff).max(self.config.retry_backoff);
            warn!(tranche = %tranche.id, error = %e, retry_in = ?wait, "retryable upstream failure");
            // The state stays whatever intent the step recorded: an upload or create whose
            // answer was lost is looked for before it is repeated.
            let deferred = self
                .store
                .defer_tranche(tranche.id, lease.token(), &error, now + secs(wait), now)
                .await?;
            return if deferred { Ok(()) } else { Err(Abandoned::Lost) };
        }
        match tranche.state {
            TrancheState::Cleaning => {
                // Results are safe; a file that cannot be deleted expires at the provider.
                warn!(tranche = %tranche.id, error = %e, "could not delete a provider file; leaving it to expire");
                let mut update = TrancheUpdate::to(TrancheState::Done, now);
                update.last_error = Some(error);
                self.transition(lease, update).await?;
            }
            _ => {
                // A token-limit refusal at create is a whole-batch failure: the requests wait
                // for room. Anything else stops the tranche and fails its requests.
                let kind = if e.code.as_deref() == Some("token_limit_exceeded") {
                    Failure::WholeBatch
                } else {
                    Failure::Fatal
                };
                warn!(tranche = %tranche.id, error = %e, "upstream failure stopped the tranche");
                let message = error.to_string();
                let mut writer = self.store.begin_ingest(tranche.id, lease.held()).await?;
                let mut failed = 0u64;
                for (wire_id, info) in writer.unanswered().await? {
                    let update = self.failure_update(
                        info,
                        kind,
                        AttemptOutcome::Errored,
                        e.status,
                        &message,
                        now,
                    );
                    let ended = update.state == RequestState::Failed;
                    if writer.record(&wire_id, &update).await? && ended {
                        failed += 1;
                    }
                }
                self.commit(lease, writer, TrancheState::Failed, now).await?;
                let mut update = TrancheUpdate::to(TrancheState::Failed, now);
                update.last_error = Some(error.clone());
                self.transition(lease, update).await?;
                if failed > 0 {
                    for job in self.store.jobs_of_tranche(tranche.id).await? {
                        self.store.set_job_state(job, JobState::Running, Some(&error), now).await?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Commits an ingest writer begun under `lease`, moving the tranche to `next`.
    async fn commit(
        &self,
        lease: &Lease,
        writer: IngestWriter,
        next: TrancheState,
        now: i64,
    ) -> Result<(), Abandoned> {
        if !writer.commit(next, now).await? {
            return Err(Abandoned::Lost);
        }
        lease.moved_to(next);
        Ok(())
    }

    /// Carries out a cancel the user asked for. Returns true when the tranche needs no other
    /// step this round.
    async fn cancel_step(
        &self,
        provider: &dyn Provider,
        tranche: &TrancheRecord,
        lease: &Lease,
    ) -> Result<bool, StepError> {
        let now = unix_now();
        match tranche.state {
            TrancheState::Planned
            | TrancheState::Uploading
            | TrancheState::Uploaded
            | TrancheState::Creating => {
                // No batch exists yet: end the requests here; cleaning deletes any input file.
                let error = serde_json::json!({
                    "provider": tranche.provider, "status": null, "error_type": null,
                    "code": "job_cancelled", "message": "the job was cancelled before this request was sent",
                    "param": null, "request_id": null, "retryable": false,
                })
                .to_string();
                let mut writer = self.store.begin_ingest(tranche.id, lease.held()).await?;
                for (wire_id, info) in writer.unanswered().await? {
                    let update = self.failure_update(
                        info,
                        Failure::UserCancel,
                        AttemptOutcome::Cancelled,
                        None,
                        &error,
                        now,
                    );
                    writer.record(&wire_id, &update).await?;
                }
                self.commit(lease, writer, TrancheState::Cleaning, now).await?;
                info!(tranche = %tranche.id, "cancelled before submission");
                Ok(true)
            }
            TrancheState::Submitted => {
                let sent =
                    matches!(tranche.batch_status.as_deref(), Some("cancelling" | "cancelled"));
                if let (Some(batch_id), false) = (tranche.batch_id.as_deref(), sent) {
                    lease.ensure().await?;
                    let batch = provider.cancel_batch(&BatchId::new(batch_id)).await?;
                    let mut update = TrancheUpdate::to(TrancheState::Submitted, now);
                    update.batch_status = Some(batch.status.as_str().to_owned());
                    self.transition(lease, update).await?;
                    info!(tranche = %tranche.id, batch = %batch_id, "asked the provider to cancel the batch");
                    return Ok(true);
                }
                Ok(false)
            }
            _ => Ok(false),
        }
    }

    /// Cancels a job: its waiting requests at once, the batches holding only its requests at
    /// the provider, and its share of batches it shares with other jobs. Returns how many
    /// requests were cancelled at once.
    pub async fn cancel_job(&self, job: JobId) -> Result<u64, EngineError> {
        let now = unix_now();
        let mut cancelled = self.store.cancel_job(job, now).await?;
        for (tranche, exclusive) in self.store.job_live_tranches(job).await? {
            if exclusive {
                self.store.request_tranche_cancel(tranche.id, now).await?;
            } else {
                cancelled += self.store.detach_job(job, tranche.id, now).await?;
            }
        }
        Ok(cancelled)
    }

    /// An upload was about to happen when the last engine stopped: adopt the file if the
    /// provider has it, upload otherwise.
    async fn adopt_or_upload(
        &self,
        provider: &dyn Provider,
        tranche: &TrancheRecord,
        lease: &Lease,
    ) -> Result<(), StepError> {
        let Some(file) = provider.find_batch_file(tranche.id).await? else {
            return self.upload(provider, tranche, lease).await;
        };
        self.store
            .record_file(&FileRecord {
                provider: tranche.provider,
                file_id: file.id.as_str().to_owned(),
                purpose: FilePurpose::BatchInput,
                tranche_id: tranche.id,
                filename: Some(file.filename.clone()),
                bytes: Some(file.bytes),
                expires_at: file.expires_at,
                created_at: file.created_at,
            })
            .await?;
        let mut update = TrancheUpdate::to(TrancheState::Uploaded, unix_now());
        update.input_file_id = Some(file.id.as_str().to_owned());
        self.transition(lease, update).await?;
        info!(tranche = %tranche.id, file = %file.id, "adopted an input file uploaded before a restart");
        Ok(())
    }

    /// A create was about to happen when the last engine stopped (or failed without an
    /// answer): adopt the batch if the provider has it, create it otherwise, and wait when
    /// the provider's batches cannot tell.
    async fn adopt_or_create(
        &self,
        provider: &dyn Provider,
        tranche: &TrancheRecord,
        lease: &Lease,
    ) -> Result<(), StepError> {
        match self.find_batch(provider, tranche, lease).await? {
            Adoption::Found(batch) => {
                let now = unix_now();
                let mut update = TrancheUpdate::to(TrancheState::Submitted, now);
                update.batch_id = Some(batch.id.as_str().to_owned());
                update.batch_status = Some(batch.status.as_str().to_owned());
                self.transition(lease, update).await?;
                info!(tranche = %tranche.id, batch = %batch.id, "adopted a batch created before a restart");
                Ok(())
            }
            Adoption::NotFound => self.create(provider, tranche, lease).await,
            Adoption::Ambiguous(candidates) => {
                let now = unix_now();
                let mut update = TrancheUpdate::to(TrancheState::Creating, now);
                update.last_error = Some(serde_json::json!({
                    "provider": tranche.provider, "status": null, "error_type": null,
                    "code": "adoption_ambiguous",
                    "message": format!(
                        "{candidates} running batch(es) at the provider could be this tranche's ({} requests, created after it was planned); waiting for their results to tell, rather than guessing or creating it again",
                        tranche.request_count
                    ),
                    "param": null, "request_id": null, "retryable": true,
                }));
                update.not_before = now + self.poll_delay(tranche.provider);
                self.transition(lease, update).await?;
                warn!(tranche = %tranche.id, candidates, "cannot tell which batch is this tranche's; waiting");
                Ok(())
            }
        }
    }

    /// Looks for the tranche's batch among the provider's batches created since it was planned:
    /// by `tranche_id` metadata where batches carry it, else by request count among batches no
    /// other tranche has recorded.
    async fn find_batch(
        &self,
        provider: &dyn Provider,
        tranche: &TrancheRecord,
        lease: &Lease,
    ) -> Result<Adoption, StepError> {
        const CLOCK_SLACK: i64 = 300;
        let since = tranche.created_at - CLOCK_SLACK;
        let mut after = None;
        let mut candidates = Vec::new();
        loop {
            let page = provider.list_batches(after.as_ref(), 100).await?;
            let mut older = false;
            for batch in page.data {
                if batch.created_at < since {
                    older = true;
                    continue;
                }
                if provider.has_batch_metadata() {
                    if batch.tranche_id() == Some(tranche.id) {
                        return Ok(Adoption::Found(Box::new(batch)));
                    }
                } else if batch.request_counts.total == tranche.request_count
                    && self
                        .store
                        .tranche_of_batch(tranche.provider, batch.id.as_str())
                        .await?
                        .is_none()
                {
                    candidates.push(batch);
                }
            }
            // Lists are newest first: once a page reaches batches older than the tranche, stop.
            if older || !page.has_more || page.last_id.is_none() {
                break;
            }
            after = page.last_id;
        }
        if candidates.is_empty() {
            return Ok(Adoption::NotFound);
        }
        // Count and time make a batch a candidate, never a certainty: another tranche's lost
        // create looks the same. Only the results' custom ids settle it.
        self.confirm_by_results(provider, tranche, lease, candidates).await
    }

    /// Among candidate batches without metadata, finds the one whose results name this
    /// tranche's requests. Only batches that have ended have results: while any candidate
    /// runs, the tranche waits; once all have ended and none is its own, it is created.
    async fn confirm_by_results(
        &self,
        provider: &dyn Provider,
        tranche: &TrancheRecord,
        lease: &Lease,
        candidates: Vec<tranche_providers::RemoteBatch>,
    ) -> Result<Adoption, StepError> {
        let mut running = 0;
        let dir = self.config.raw_dir.join(tranche.id.to_string());
        tokio::fs::create_dir_all(&dir).await.map_err(EngineError::io("creating", &dir))?;
        for batch in candidates {
            let Some(url) = batch.results_url.as_deref().filter(|_| batch.status.is_terminal())
            else {
                running += 1;
                continue;
            };
            let probe = dir.join(format!("candidate-{}.{}.jsonl", batch.id, lease.token()));
            provider.download_results(url, &probe).await?;
            let first = tokio::fs::read_to_string(&probe)
                .await
                .map_err(EngineError::io("reading", &probe))?
                .lines()
                .find(|l| !l.trim().is_empty())
                .and_then(|line| provider.parse_result_line(line).ok())
                .map(|line| line.wire_id);
            let _ = tokio::fs::remove_file(&probe).await;
            if let Some(wire_id) = first
                && self.store.tranche_has_wire_id(tranche.id, &wire_id).await?
            {
                return Ok(Adoption::Found(Box::new(batch)));
            }
        }
        Ok(if running == 0 { Adoption::NotFound } else { Adoption::Ambiguous(running) })
    }

    async fn upload(
        &self,
        provider: &dyn Provider,
        tranche: &TrancheRecord,
        lease: &Lease,
    ) -> Result<(), StepError> {
        let now = unix_now();
        self.transition(lease, TrancheUpdate::to(TrancheState::Uploading, now)).await?;
        let path = self.input_path(tranche.id, lease);
        self.write_input(provider, tranche.id, &path).await?;
        lease.ensure().await?;
        let uploaded = provider.upload_batch_file(tranche.id, &path).await?;
        let now = unix_now();
        self.store
            .record_file(&FileRecord {
                provider: tranche.provider,
                file_id: uploaded.id.as_str().to_owned(),
                purpose: FilePurpose::BatchInput,
                tranche_id: tranche.id,
                filename: Some(uploaded.filename.clone()),
                bytes: Some(uploaded.bytes),
                expires_at: uploaded.expires_at,
                created_at: uploaded.created_at,
            })
            .await?;
        let mut update = TrancheUpdate::to(TrancheState::Uploaded, now);
        update.input_file_id = Some(uploaded.id.into_string());
        self.transition(lease, update).await?;
        if let Err(e) = tokio::fs::remove_file(&path).await {
            debug!(path = %path.display(), error = %e, "could not remove the uploaded input file");
        }
        info!(tranche = %tranche.id, "uploaded input file");
        Ok(())
    }

    /// Where a step writes a tranche's input file: named by the step's lease, so that two
    /// engines never write one path.
    fn input_path(&self, tranche: TrancheId, lease: &Lease) -> PathBuf {
        self.config.outbox_dir.join(format!("tranche-{tranche}.{}.jsonl", lease.token()))
    }

    async fn write_input(
        &self,
        provider: &dyn Provider,
        tranche: TrancheId,
        path: &Path,
    ) -> Result<(), EngineError> {
        tokio::fs::create_dir_all(&self.config.outbox_dir)
            .await
            .map_err(EngineError::io("creating the outbox", &self.config.outbox_dir))?;
        let file =
            tokio::fs::File::create(path).await.map_err(EngineError::io("creating", path))?;
        let mut out = BufWriter::new(file);
        let mut lines = self.store.tranche_input(tranche);
        let mut buf = Vec::new();
        while let Some(line) = lines.try_next().await? {
            buf.clear();
            let body = RawValue::from_string(line.body).map_err(|e| {
                EngineError::Store(tranche_store::StoreError::Corrupt(format!("request body: {e}")))
            })?;
            codec::write_input_line(provider.kind(), &mut buf, &line.wire_id, line.endpoint, &body);
            out.write_all(&buf).await.map_err(EngineError::io("writing", path))?;
        }
        out.flush().await.map_err(EngineError::io("writing", path))?;
        out.into_inner().sync_all().await.map_err(EngineError::io("syncing", path))?;
        Ok(())
    }

    async fn create(
        &self,
        provider: &dyn Provider,
        tranche: &TrancheRecord,
        lease: &Lease,
    ) -> Result<(), StepError> {
        let inline_path = self.input_path(tranche.id, lease);
        let file_id;
        let input = match provider.transport() {
            InputTransport::UploadFile => {
                let Some(input) = tranche.input_file_id.as_deref() else {
                    // An upload that was never recorded: upload again.
                    return self.upload(provider, tranche, lease).await;
                };
                file_id = FileId::new(input);
                BatchInput::File(&file_id)
            }
            InputTransport::Inline => {
                // Rebuilt from the store every time, so a retry never sends a stale file.
                self.write_input(provider, tranche.id, &inline_path).await?;
                BatchInput::Inline(&inline_path)
            }
        };
        let now = unix_now();
        self.transition(lease, TrancheUpdate::to(TrancheState::Creating, now)).await?;
        lease.ensure().await?;
        let batch = provider
            .create_batch(CreateBatch { tranche_id: tranche.id, input, endpoint: tranche.endpoint })
            .await?;
        if provider.transport() == InputTransport::Inline
            && let Err(e) = tokio::fs::remove_file(&inline_path).await
        {
            debug!(path = %inline_path.display(), error = %e, "could not remove the sent input file");
        }
        let now = unix_now();
        let mut update = TrancheUpdate::to(TrancheState::Submitted, now);
        update.batch_id = Some(batch.id.as_str().to_owned());
        update.batch_status = Some(batch.status.as_str().to_owned());
        update.not_before = now + self.poll_delay(tranche.provider);
        self.transition(lease, update).await?;
        info!(tranche = %tranche.id, batch = %batch.id, "created batch");
        Ok(())
    }

    async fn poll(
        &self,
        provider: &dyn Provider,
        tranche: &TrancheRecord,
        lease: &Lease,
    ) -> Result<(), StepError> {
        let Some(batch_id) = tranche.batch_id.as_deref() else {
            return Err(StepError::from(EngineError::Store(tranche_store::StoreError::Corrupt(
                format!("tranche {} is submitted but has no batch id", tranche.id),
            ))));
        };
        let batch = provider.retrieve_batch(&BatchId::new(batch_id)).await?;
        let now = unix_now();
        if !batch.status.is_terminal() {
            let mut update = TrancheUpdate::to(TrancheState::Submitted, now);
            update.batch_status = Some(batch.status.as_str().to_owned());
            update.not_before = now + self.poll_delay(tranche.provider);
            self.transition(lease, update).await?;
            debug!(tranche = %tranche.id, status = %batch.status, "batch still running");
            return Ok(());
        }
        for (file, purpose) in [
            (&batch.output_file_id, FilePurpose::BatchOutput),
            (&batch.error_file_id, FilePurpose::BatchError),
        ] {
            if let Some(file) = file {
                self.store
                    .record_file(&FileRecord {
                        provider: tranche.provider,
                        file_id: file.as_str().to_owned(),
                        purpose,
                        tranche_id: tranche.id,
                        filename: None,
                        bytes: None,
                        expires_at: None,
                        created_at: now,
                    })
                    .await?;
            }
        }
        let mut update = TrancheUpdate::to(TrancheState::Collecting, now);
        update.batch_status = Some(batch.status.as_str().to_owned());
        update.output_file_id = batch.output_file_id.map(FileId::into_string);
        update.error_file_id = batch.error_file_id.map(FileId::into_string);
        update.results_url = batch.results_url;
        if !batch.errors.is_empty() {
            update.batch_errors = serde_json::to_value(&batch.errors).ok();
        }
        self.transition(lease, update).await?;
        info!(tranche = %tranche.id, status = %batch.status, "batch ended");
        Ok(())
    }

    fn raw_path(&self, tranche: TrancheId, name: &str) -> PathBuf {
        self.config.raw_dir.join(tranche.to_string()).join(name)
    }

    async fn collect(
        &self,
        provider: &dyn Provider,
        tranche: &TrancheRecord,
        lease: &Lease,
    ) -> Result<(), StepError> {
        let dir = self.config.raw_dir.join(tranche.id.to_string());
        tokio::fs::create_dir_all(&dir).await.map_err(EngineError::io("creating", &dir))?;
        for (file, name) in
            [(&tranche.output_file_id, "output.jsonl"), (&tranche.error_file_id, "errors.jsonl")]
        {
            let Some(file) = file else { continue };
            let dest = self.raw_path(tranche.id, name);
            if tokio::fs::try_exists(&dest).await.unwrap_or(false) {
                continue;
            }
            // Download beside the final name and rename, so a crash never leaves a partial
            // file that looks whole; the partial file is named by this step's lease.
            let partial = partial_path(&dest, lease);
            let bytes = provider.download_file(&FileId::new(file.as_str()), &partial).await?;
            tokio::fs::rename(&partial, &dest)
                .await
                .map_err(EngineError::io("renaming", &partial))?;
            info!(tranche = %tranche.id, file = %file, bytes, "stored raw results");
        }
        if let Some(url) = &tranche.results_url {
            let dest = self.raw_path(tranche.id, "output.jsonl");
            if !tokio::fs::try_exists(&dest).await.unwrap_or(false) {
                let partial = partial_path(&dest, lease);
                let bytes = provider.download_results(url, &partial).await?;
                tokio::fs::rename(&partial, &dest)
                    .await
                    .map_err(EngineError::io("renaming", &partial))?;
                info!(tranche = %tranche.id, bytes, "stored raw results");
            }
        }
        self.transition(lease, TrancheUpdate::to(TrancheState::Ingesting, unix_now())).await?;
        Ok(())
    }

    async fn ingest(
        &self,
        provider: &dyn Provider,
        tranche: &TrancheRecord,
        lease: &Lease,
    ) -> Result<(), StepError> {
        let now = unix_now();
        let mut writer = self.store.begin_ingest(tranche.id, lease.held()).await?;
        /// Successful lines recorded per call; failures are few and kept until the end.
        const SUCCESS_CHUNK: usize = 512;
        let (mut matched, mut unknown, mut unparsable) = (0u64, 0u64, 0u64);
        let mut successes = Vec::with_capacity(SUCCESS_CHUNK);
        let mut failures = Vec::new();
        for name in ["output.jsonl", "errors.jsonl"] {
            let path = self.raw_path(tranche.id, name);
            let file = match tokio::fs::File::open(&path).await {
                Ok(file) => file,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(EngineError::io("opening", &path)(e).into()),
            };
            let mut lines = BufReader::new(file).lines();
            while let Some(line) =
                lines.next_line().await.map_err(EngineError::io("reading", &path))?
            {
                if line.trim().is_empty() {
                    continue;
                }
                let parsed = match provider.parse_result_line(&line) {
                    Ok(parsed) => parsed,
                    Err(e) => {
                        unparsable += 1;
                        warn!(tranche = %tranche.id, file = name, error = %e, "unparsable result line");
                        continue;
                    }
                };
                match parsed.outcome {
                    LineOutcome::Succeeded { status_code, body, .. } => {
                        let (input_tokens, output_tokens) = usage_of(&body);
                        successes.push(Success {
                            wire_id: parsed.wire_id,
                            status_code,
                            output: String::from(Box::<str>::from(body)),
                            input_tokens,
                            output_tokens,
                        });
                        if successes.len() >= SUCCESS_CHUNK {
                            let sent = successes.len() as u64;
                            let recorded = writer.record_successes(&mut successes, now).await?;
                            matched += recorded;
                            unknown += sent - recorded;
                        }
                    }
                    // Failures are decided one by one (each by its own retry budget), after
                    // the successes: a provider that answered a request twice, once well,
                    // has answered it.
                    LineOutcome::Failed(e) => failures.push((parsed.wire_id, e)),
                }
            }
        }
        let sent = successes.len() as u64;
        let recorded = writer.record_successes(&mut successes, now).await?;
        matched += recorded;
        unknown += sent - recorded;
        for (wire_id, e) in failures {
            let Some(info) = writer.attempt_info(&wire_id).await? else {
                unknown += 1;
                warn!(tranche = %tranche.id, wire_id = %wire_id, "result line matches no waiting request");
                continue;
            };
            let (outcome, kind) = match e.code.as_deref() {
                Some("batch_expired") => (AttemptOutcome::Expired, Failure::Retryable),
                Some("batch_cancelled") if tranche.cancel_requested => {
                    (AttemptOutcome::Cancelled, Failure::UserCancel)
                }
                Some("batch_cancelled") => (AttemptOutcome::Cancelled, Failure::Retryable),
                _ if e.retryable => (AttemptOutcome::Errored, Failure::Retryable),
                _ => (AttemptOutcome::Errored, Failure::Fatal),
            };
            let error = line_error_json(&e);
            let update = self.failure_update(info, kind, outcome, e.status, &error, now);
            if writer.record(&wire_id, &update).await? {
                matched += 1;
            } else {
                unknown += 1;
                warn!(tranche = %tranche.id, wire_id = %wire_id, "result line matches no waiting request");
            }
        }
        let (kind, error, outcome) = self.rest_outcome(tranche);
        let error = error.to_string();
        let mut missing = 0u64;
        for (wire_id, info) in writer.unanswered().await? {
            let update = self.failure_update(info, kind, outcome, None, &error, now);
            missing += u64::from(writer.record(&wire_id, &update).await?);
        }
        self.commit(lease, writer, TrancheState::Cleaning, now).await?;
        info!(tranche = %tranche.id, matched, missing, unknown, unparsable, "ingested results");
        Ok(())
    }

    /// What a failure means for one request: retried later, or ended.
    fn failure_update<'a>(
        &self,
        info: AttemptInfo,
        kind: Failure,
        outcome: AttemptOutcome,
        status_code: Option<u16>,
        error: &'a str,
        now: i64,
    ) -> ResultUpdate<'a> {
        let (state, spends_attempt, not_before) = match kind {
            Failure::Retryable if info.attempts + 1 < info.max_attempts => {
                let wait = self.config.retry_delay(info.attempts + 1);
                (RequestState::Pending, true, now + secs(wait))
            }
            Failure::WholeBatch if info.batch_returns < self.config.max_batch_returns => {
                let wait = self.config.retry_delay(info.batch_returns + 1);
                (RequestState::Pending, false, now + secs(wait))
            }
            Failure::UserCancel => (RequestState::Cancelled, false, 0),
            Failure::Retryable | Failure::Fatal | Failure::WholeBatch => {
                (RequestState::Failed, true, 0)
            }
        };
        ResultUpdate {
            state,
            outcome,
            status_code,
            output: None,
            error: Some(error),
            input_tokens: None,
            output_tokens: None,
            spends_attempt,
            not_before,
            at: now,
        }
    }

    /// What becomes of requests the batch's files did not mention.
    fn rest_outcome(
        &self,
        tranche: &TrancheRecord,
    ) -> (Failure, serde_json::Value, AttemptOutcome) {
        let status = tranche.batch_status.as_deref().and_then(|s| {
            serde_json::from_value::<BatchStatus>(serde_json::Value::String(s.to_owned())).ok()
        });
        let provider = tranche.provider.as_str();
        match status {
            Some(BatchStatus::Failed) => {
                let first = tranche
                    .batch_errors
                    .as_ref()
                    .and_then(|e| e.as_array())
                    .and_then(|a| a.first())
                    .cloned()
                    .unwrap_or_default();
                let code = first.get("code").cloned().unwrap_or(serde_json::Value::Null);
                let message = first
                    .get("message")
                    .and_then(|m| m.as_str())
                    .unwrap_or("the provider failed the batch")
                    .to_owned();
                (
                    Failure::WholeBatch,
                    serde_json::json!({
                        "provider": provider, "status": null, "error_type": "batch_failed",
                        "code": code, "message": message, "param": first.get("param"),
                        "line": first.get("line"), "request_id": null, "retryable": false,
                        "batch_errors": tranche.batch_errors,
                    }),
                    AttemptOutcome::Errored,
                )
            }
            Some(BatchStatus::Cancelled | BatchStatus::Cancelling) => (
                if tranche.cancel_requested { Failure::UserCancel } else { Failure::Retryable },
                serde_json::json!({
                    "provider": provider, "status": null, "error_type": null, "code": "batch_cancelled",
                    "message": "the batch was cancelled before this request ran", "param": null,
                    "request_id": null, "retryable": true,
                }),
                AttemptOutcome::Cancelled,
            ),
            Some(BatchStatus::Expired) => (
                Failure::Retryable,
                serde_json::json!({
                    "provider": provider, "status": null, "error_type": null, "code": "batch_expired",
                    "message": "the batch expired before this request ran", "param": null,
                    "request_id": null, "retryable": true,
                }),
                AttemptOutcome::Expired,
            ),
            _ => (
                Failure::Retryable,
                serde_json::json!({
                    "provider": provider, "status": null, "error_type": null, "code": "missing_result",
                    "message": "the batch ended without a result line for this request", "param": null,
                    "request_id": null, "retryable": true,
                }),
                AttemptOutcome::Missing,
            ),
        }
    }

    async fn clean(
        &self,
        provider: &dyn Provider,
        tranche: &TrancheRecord,
        lease: &Lease,
    ) -> Result<(), StepError> {
        for file in self.store.live_files(tranche.id).await? {
            lease.ensure().await?;
            provider.delete_file(&FileId::new(file.as_str())).await?;
            self.store.mark_file_deleted(tranche.provider, &file, unix_now()).await?;
            debug!(tranche = %tranche.id, file = %file, "deleted provider file");
        }
        self.transition(lease, TrancheUpdate::to(TrancheState::Done, unix_now())).await?;
        info!(tranche = %tranche.id, "tranche done");
        Ok(())
    }

    /// Ends every job whose requests have all reached a terminal state and whose tranches
    /// are cleaned up.
    async fn settle_jobs(&self) -> Result<(), EngineError> {
        for job in self.store.open_jobs().await? {
            if self.store.job_has_open_requests(job.id).await?
                || self.store.job_open_tranches(job.id).await? > 0
            {
                continue;
            }
            let counts = self.store.job_counts(job.id).await?;
            let state = if job.cancel_requested {
                JobState::Cancelled
            } else if job.last_error.is_some() {
                JobState::Failed
            } else {
                JobState::Done
            };
            // Compare-and-set: another engine may have settled it a moment ago.
            if self.store.set_job_state(job.id, state, None, unix_now()).await? {
                info!(job = %job.id, state = %state, succeeded = counts.succeeded, failed = counts.failed, "job ended");
            }
        }
        Ok(())
    }
}

/// A partial download beside `dest`, named by the step's lease.
fn partial_path(dest: &Path, lease: &Lease) -> PathBuf {
    let name = dest.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    dest.with_file_name(format!("{name}.{}.partial", lease.token()))
}

/// What the provider's batch list says about a tranche whose create was not recorded.
#[derive(Debug)]
enum Adoption {
    Found(Box<tranche_providers::RemoteBatch>),
    NotFound,
    Ambiguous(usize),
}

/// How a request's failure counts against its retry budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// Worth sending again (5xx, 429, overloaded, expired, cancelled by the provider).
    Retryable,
    /// Sending it again cannot help (a 4xx such as `context_length_exceeded`).
    Fatal,
    /// The whole batch failed (validation, token limit): back to the pool without spending an
    /// attempt, a bounded number of times.
    WholeBatch,
    /// The user cancelled the job.
    UserCancel,
}

/// Why a step stopped short: its lease passed to another engine (nothing more is done), or
/// the engine itself failed.
#[derive(Debug)]
enum Abandoned {
    Lost,
    Engine(EngineError),
}

/// A step's failure: the provider's (recorded on the tranche, then carried on from), or the
/// step was abandoned.
#[derive(Debug)]
enum StepError {
    Upstream(UpstreamError),
    Abandoned(Abandoned),
}

impl From<UpstreamError> for StepError {
    fn from(e: UpstreamError) -> Self {
        Self::Upstream(e)
    }
}

impl From<Abandoned> for StepError {
    fn from(a: Abandoned) -> Self {
        Self::Abandoned(a)
    }
}

impl From<EngineError> for StepError {
    fn from(e: EngineError) -> Self {
        Self::Abandoned(Abandoned::Engine(e))
    }
}

impl From<tranche_store::StoreError> for StepError {
    fn from(e: tranche_store::StoreError) -> Self {
        Self::Abandoned(Abandoned::Engine(EngineError::Store(e)))
    }
}

impl From<tranche_store::StoreError> for Abandoned {
    fn from(e: tranche_store::StoreError) -> Self {
        Self::Engine(EngineError::Store(e))
    }
}

impl From<EnsureError> for StepError {
    fn from(e: EnsureError) -> Self {
        match e {
            EnsureError::Lost(LeaseLost) => Self::Abandoned(Abandoned::Lost),
            EnsureError::Store(e) => e.into(),
        }
    }
}
