//! The engine: its adapters, store and settings, the reconciler loop (`drive`, `tick`), and how
//! one leased step is dispatched and its failures recorded.
//!
//! A tranche's life: `planned` → `uploading` → `uploaded` → `creating` → `submitted` (polled
//! until the batch ends) → `collecting` (result files copied to raw storage) → `ingesting`
//! (lines matched to requests by wire id) → `cleaning` (provider files deleted) → `done`.
//! An upstream failure that cannot be retried ends the tranche `failed`, with every one of its
//! requests failed with that error. Each step lives in `steps/`; adoption after a restart in
//! `recover.rs`; cancels in `cancel.rs`; what failures mean in `policy.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, info, warn};
use tranche_blob::BlobRef;
use tranche_core::{
    Clock, EngineId, JobState, LeaseToken, ProviderKind, RequestState, SystemClock, TrancheState,
};
use tranche_providers::{InputTransport, Provider, UpstreamError};
use tranche_store::{
    AttemptOutcome, BlobRecord, IngestWriter, Store, TrancheRecord, TrancheUpdate,
};

use crate::config::EngineConfig;
use crate::error::EngineError;
use crate::lease::{EnsureError, Lease, LeaseLost, Subject, engine_id};
use crate::policy::{self, whole_secs};

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

    /// Every configured adapter.
    pub fn all(&self) -> impl Iterator<Item = &Arc<dyn Provider>> {
        self.adapters.values()
    }
}

/// The reconciler. Cheap to clone; clones share one engine id (and so take turns with other
/// engines, not with each other: drive one clone at a time).
#[derive(Debug, Clone)]
pub struct Engine {
    pub(crate) id: EngineId,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) providers: Providers,
    pub(crate) config: EngineConfig,
    /// Where the engine reads the time (the store judges leases by its own).
    pub(crate) clock: Arc<dyn Clock>,
}

fn upstream_json(e: &UpstreamError) -> serde_json::Value {
    serde_json::to_value(e).unwrap_or_else(|_| serde_json::json!({ "message": e.to_string() }))
}

impl Engine {
    pub fn new(store: Arc<dyn Store>, providers: Providers, config: EngineConfig) -> Self {
        Self { id: engine_id(), store, providers, config, clock: Arc::new(SystemClock) }
    }

    /// The same engine reading the time from `clock` (tests step a [`tranche_core::ManualClock`]).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The same engine cleaning up provider files every `interval` (`None`: never).
    pub fn with_janitor(mut self, interval: Option<Duration>) -> Self {
        self.config.janitor_interval = interval;
        self
    }

    /// The current time in unix seconds, by the engine's clock.
    pub fn now(&self) -> i64 {
        self.clock.now()
    }

    /// The record of an object just written whole, as the store keeps it.
    pub(crate) fn record_of(&self, stored: &BlobRef) -> BlobRecord {
        BlobRecord {
            key: stored.key.to_string(),
            size: stored.size,
            sha256: stored.sha256.clone(),
            created_at: self.now(),
        }
    }

    /// The name this engine's leases carry (`status` shows it).
    pub fn id(&self) -> &EngineId {
        &self.id
    }

    pub fn store(&self) -> &dyn Store {
        &*self.store
    }

    /// The store, to keep beside the engine (a progress bar reading it while the engine works).
    pub fn shared_store(&self) -> Arc<dyn Store> {
        Arc::clone(&self.store)
    }

    pub fn providers(&self) -> &Providers {
        &self.providers
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub(crate) fn provider(&self, kind: ProviderKind) -> Result<&Arc<dyn Provider>, EngineError> {
        self.providers.get(kind).ok_or(EngineError::ProviderNotConfigured(kind))
    }

    /// Whole seconds until the next poll of a batch at `provider`, with up to 10% jitter so
    /// that many tranches do not poll in lockstep.
    pub(crate) fn poll_delay(&self, provider: ProviderKind) -> i64 {
        let base = whole_secs(self.config.poll_interval_for(provider));
        let jitter = base / 10;
        if jitter > 0 { base + rand::random_range(0..=jitter) } else { base }
    }

    /// One round: plan waiting requests, move every due tranche one step, settle jobs. Each
    /// tranche is stepped under its lease; one that another engine holds is left to it.
    pub async fn tick(&self) -> Result<(), EngineError> {
        self.tick_counted().await.map(|_| ())
    }

    /// [`Engine::tick`], answering how many tranches it stepped.
    async fn tick_counted(&self) -> Result<usize, EngineError> {
        self.plan_all().await?;
        let mut stepped = 0;
        for due in self.store.due_tranches(self.now()).await? {
            let Some((tranche, lease)) = self.take(&due).await? else { continue };
            self.step_and_release(tranche, lease).await?;
            stepped += 1;
        }
        self.settle_jobs().await?;
        Ok(stepped)
    }

    /// Plans the waiting requests of every provider this engine has an adapter for.
    pub(crate) async fn plan_all(&self) -> Result<(), EngineError> {
        for kind in ProviderKind::ALL {
            if self.providers.get(kind).is_some() {
                self.plan(kind).await?;
            }
        }
        Ok(())
    }

    /// Takes the lease of a due tranche, answering it as the lease shows it; `None` when
    /// another engine holds it, or when it is another account's or provider's (an engine steps
    /// only tranches of accounts it has credentials for; tranches made before accounts were
    /// recorded go to any engine of their provider).
    pub(crate) async fn take(
        &self,
        due: &TrancheRecord,
    ) -> Result<Option<(TrancheRecord, Lease)>, EngineError> {
        let Some(provider) = self.providers.get(due.provider) else { return Ok(None) };
        if due.account.as_ref().is_some_and(|account| *account != provider.account()) {
            return Ok(None);
        }
        let token = LeaseToken::new();
        let Some((tranche, grant)) = self
            .store
            .lease_tranche(due.id, &self.id, token, self.config.lease, self.now())
            .await?
        else {
            debug!(tranche = %due.id, "another engine has the tranche");
            return Ok(None);
        };
        let lease = Lease::hold(
            self.store.clone(),
            Subject::Tranche(tranche.id),
            token,
            self.config.lease,
            grant,
            Some(tranche.state),
        );
        Ok(Some((tranche, lease)))
    }

    /// Steps a tranche taken with [`Engine::take`], then hands its lease back.
    pub(crate) async fn step_and_release(
        &self,
        tranche: TrancheRecord,
        lease: Lease,
    ) -> Result<(), EngineError> {
        let result = self.step(tranche, &lease).await;
        lease.release().await;
        result
    }

    /// Moves one tranche, whose lease this engine holds, one step. A step whose lease passed
    /// to another engine stops before its next side effect and changes nothing more.
    pub(crate) async fn step(
        &self,
        tranche: TrancheRecord,
        lease: &Lease,
    ) -> Result<(), EngineError> {
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
                    let mut update = TrancheUpdate::to(tranche.state, self.now());
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
    pub(crate) async fn transition(
        &self,
        lease: &Lease,
        update: TrancheUpdate,
    ) -> Result<(), Abandoned> {
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
        let now = self.now();
        let error = upstream_json(e);
        // The state the step had reached (it may have recorded an intent since it began).
        let reached = lease.held().state;
        let credentials = policy::waits_for_credentials(e.status, reached);
        let storage_full = policy::is_storage_limit(e.code.as_deref(), &e.message)
            && reached == TrancheState::Uploading;
        if storage_full {
            return self.wait_for_storage(tranche, lease, e, &error).await;
        }
        if e.retryable() || credentials {
            let wait = policy::upstream_wait(e.retry_after, self.config.retry_backoff);
            if credentials {
                warn!(tranche = %tranche.id, error = %e, retry_in = ?wait, "the provider refused tranche's credentials; the batch runs on and the tranche waits for them to work");
            } else {
                warn!(tranche = %tranche.id, error = %e, retry_in = ?wait, "retryable upstream failure");
            }
            // The state stays whatever intent the step recorded: an upload or create whose
            // answer was lost is looked for before it is repeated.
            let deferred = self
                .store
                .defer_tranche(tranche.id, lease.token(), &error, now + whole_secs(wait), now)
                .await?;
            return if deferred { Ok(()) } else { Err(Abandoned::Lost) };
        }
        // The batch has ended or will never be made: its input file is not needed again.
        if let Err(e) = self.remove_input(tranche.id).await {
            warn!(tranche = %tranche.id, error = %e, "could not remove the tranche's input file");
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
                // Its files are of no use now: none is left behind at the provider.
                self.delete_files_quietly(tranche).await;
                // A token-limit refusal at create is a whole-batch failure: the requests wait
                // for room. Anything else stops the tranche and fails its requests.
                let kind = policy::stopped_by(e.code.as_deref());
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

    /// An upload refused because the account's file storage is full: a safe cleanup deletes
    /// what tranche's ended tranches left there and old orphans, and the tranche waits (its
    /// intent to upload kept) for the files its other batches hold to be freed, instead of
    /// failing its requests, each wait twice the last. When nothing of tranche's will free
    /// any, its jobs pause.
    async fn wait_for_storage(
        &self,
        tranche: &TrancheRecord,
        lease: &Lease,
        e: &UpstreamError,
        error: &serde_json::Value,
    ) -> Result<(), Abandoned> {
        let now = self.now();
        let account = tranche.account.as_ref();
        let freed = self.free_storage(tranche.provider).await;
        let holding =
            self.store.tranches_holding_files(tranche.provider, account, tranche.id).await?;
        // The wait before this one, when it too was for room in the storage.
        let previous = tranche
            .last_error
            .as_ref()
            .is_some_and(|last| {
                let message = last["message"].as_str().unwrap_or_default();
                policy::is_storage_limit(last["code"].as_str(), message)
            })
            .then(|| {
                Duration::from_secs(
                    u64::try_from(tranche.not_before - tranche.updated_at).unwrap_or(0),
                )
            });
        let wait = policy::storage_wait(e.retry_after, self.config.retry_backoff, previous);
        if freed == 0 && holding == 0 {
            // Waiting for tranche's own files cannot help: the jobs pause (not fail) until an
            // upload succeeds; `run` stops and says why, a worker keeps trying.
            warn!(tranche = %tranche.id, error = %e, retry_in = ?wait, "the provider's file storage is full and nothing of tranche's will free it; its jobs pause");
            self.store.set_jobs_paused(tranche.id, Some(error), now).await?;
        } else {
            warn!(tranche = %tranche.id, error = %e, freed, holding, retry_in = ?wait, "the provider's file storage is full; the tranche waits for its own files to be freed");
        }
        let deferred = self
            .store
            .defer_tranche(tranche.id, lease.token(), error, now + whole_secs(wait), now)
            .await?;
        if deferred { Ok(()) } else { Err(Abandoned::Lost) }
    }

    /// Commits an ingest writer begun under `lease`, moving the tranche to `next`.
    pub(crate) async fn commit(
        &self,
        lease: &Lease,
        writer: Box<dyn IngestWriter>,
        next: TrancheState,
        now: i64,
    ) -> Result<(), Abandoned> {
        if !writer.commit(next, now).await? {
            return Err(Abandoned::Lost);
        }
        lease.moved_to(next);
        Ok(())
    }
}

/// Why a step stopped short: its lease passed to another engine (nothing more is done), or
/// the engine itself failed.
#[derive(Debug)]
pub(crate) enum Abandoned {
    Lost,
    Engine(EngineError),
}

/// A step's failure: the provider's (recorded on the tranche, then carried on from), or the
/// step was abandoned.
#[derive(Debug)]
pub(crate) enum StepError {
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
