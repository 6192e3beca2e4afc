//! How an engine works: the deployment's settings (paths, poll intervals, retry backoff,
//! planning limits, token budgets, lease length), and when `Engine::drive` returns.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tranche_blob::BlobStore;
use tranche_core::plan::TrancheLimits;
use tranche_core::price::PriceTable;

use crate::janitor::FileLimits;
use crate::policy::Retries;
use tranche_core::{JobId, ProviderKind};

/// How the engine works. Paths are where it keeps files of its own.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Where bytes rest: jobs' request bodies, tranches' input files while their batches are
    /// made, raw result files (`raw/<tranche>/output.jsonl`, `errors.jsonl`) exactly as the
    /// provider returned them. One per deployment.
    pub blobs: BlobStore,
    /// Raw result folders of data folders made before the blob store (`<data-dir>/raw`); a
    /// tranche's files found there are moved into the blob store when it needs them.
    pub legacy_raw_dir: PathBuf,
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
    /// The most of a model's enqueued-token budget one tenant's tranches may hold, as a
    /// share (0 < share ≤ 1), so that room stays for the others; `None`: no cap but the
    /// budget. Jobs without a tenant count as one tenant.
    pub tenant_token_share: Option<f64>,
    /// The most unfinished tranches (each holding at most one input file at the provider) one
    /// tenant may have on an account, so that its share of the account's file quota is
    /// capped; `None`: no cap. Applies to providers that take input as files.
    pub tenant_max_files: Option<u64>,
    /// How long a lease on a tranche step (or on planning) lasts unless renewed. An engine
    /// that dies holding one delays that work by at most this long; a step starts no side
    /// effect with less than a quarter of it left.
    pub lease: Duration,
    /// How many tranches `Engine::drive` steps at once (writing one tranche's file while
    /// another's batch is created and a third's results are ingested).
    pub parallel_steps: usize,
    /// How many of those steps may move a file's bytes at once: write an input file (or
    /// send a batch's requests inline), copy result files, or ingest them. Each holds buffers
    /// and store caches while it runs, so this, not the job's size, bounds the engine's
    /// memory; the other steps (creating batches, polling, cleaning up) still run beside them.
    pub transfer_steps: usize,
    /// How many files each provider's accounts may hold, for the audit's forecast (Azure:
    /// 500 batch input files without expiry, 10,000 with).
    pub file_limits: BTreeMap<ProviderKind, FileLimits>,
    /// A file named like tranche's but unknown to the store is deleted only once it is this
    /// old (another installation, or an upload whose record was lost, may still need it).
    pub orphan_grace: Duration,
    /// How often `Engine::drive` cleans up each account's provider files (once across all
    /// engines of the store); `None`: never.
    pub janitor_interval: Option<Duration>,
    /// What models cost: the bundled table under the deployment's own file. Budgets are kept
    /// by it.
    pub prices: PriceTable,
}

impl EngineConfig {
    /// Defaults for a data folder (`./.tranche` by default).
    pub fn in_dir(data_dir: &Path) -> Self {
        Self {
            blobs: BlobStore::local(&data_dir.join("blobs")),
            legacy_raw_dir: data_dir.join("raw"),
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
            tenant_token_share: None,
            tenant_max_files: None,
            lease: Duration::from_secs(60),
            parallel_steps: 4,
            // One: a million requests then peak at 31-34 MB, within 1.2 times the 28-31 that
            // 10,000 take; with two at once they peaked at 39.
            transfer_steps: 1,
            file_limits: BTreeMap::from([(ProviderKind::Azure, FileLimits::AZURE)]),
            orphan_grace: Duration::from_secs(24 * 3600),
            janitor_interval: None,
            prices: PriceTable::bundled(),
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

    /// The most of `model`'s enqueued tokens one tenant may hold, when both a budget and a
    /// tenant share are set (at least one token).
    pub fn tenant_token_cap(&self, model: &str) -> Option<u64> {
        let (budget, share) = (self.token_budget(model)?, self.tenant_token_share?);
        // Budgets are far below 2^52 tokens, so the f64 product is exact enough.
        let cap = (budget as f64 * share).floor() as u64;
        Some(cap.max(1))
    }

    /// The wait before a request's `attempt`-th try (1-based), doubling from `retry_backoff`.
    pub fn retry_delay(&self, attempt: u32) -> Duration {
        self.retries().delay(attempt)
    }

    /// The retry settings policy decides by.
    pub(crate) fn retries(&self) -> Retries {
        Retries { backoff: self.retry_backoff, max_batch_returns: self.max_batch_returns }
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
