//! The provider-neutral store of files and batches, and the batch life cycle on the virtual clock.
//!
//! Nothing runs in the background. Every read first calls [`Sim::sync`], which moves each live
//! batch forward to the current virtual time: phase changes happen at their exact virtual instants
//! (so a batch read once after a long advance looks the same as one polled every second), lines run
//! at `requests_per_second`, and output/error files (or, for Anthropic, the inline results) appear
//! when the batch ends. Wire shapes are not decided here: each batch carries a [`Dialect`] that runs
//! its lines and renders their results.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::clock::{Clock, secs};
use crate::config::{LineFaultKind, SimConfig};
use crate::model::{self, Corruption, ModelOutput, ModelRejection, PromptCache, RunContext};
use crate::stats::{ByProvider, LedgerEntry, LedgerOutcome, SimStats};
use crate::validate::{self, BatchError, PlannedLine, ValidInput};

/// How long a batch may run: the only `completion_window` there is, `24h`.
pub(crate) const COMPLETION_WINDOW_SECONDS: i64 = 86_400;
/// Default expiry of batch input files and of output/error files: 30 days.
pub(crate) const DEFAULT_FILE_EXPIRY_SECONDS: i64 = 2_592_000;

/// Which provider surface an object belongs to (for stats, the ledger and line faults).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Provider {
    OpenAi,
    Azure,
    Anthropic,
}

impl Provider {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::OpenAi => "openai",
            Self::Azure => "azure",
            Self::Anthropic => "anthropic",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Self> {
        match s {
            "openai" => Some(Self::OpenAi),
            "azure" => Some(Self::Azure),
            "anthropic" => Some(Self::Anthropic),
            _ => None,
        }
    }
}

/// A random lowercase hex id with a prefix, e.g. `file-<32 hex>`.
pub(crate) fn new_id(prefix: &str) -> String {
    format!("{prefix}{:032x}", rand::random::<u128>())
}

/// A random UUID-style id with a prefix, e.g. `batch_6caaf24d-54a5-46be-b1b7-518884fcbdde`.
pub(crate) fn new_uuid_id(prefix: &str) -> String {
    let h = format!("{:032x}", rand::random::<u128>());
    format!("{prefix}{}-{}-4{}-b{}-{}", &h[..8], &h[8..12], &h[13..16], &h[17..20], &h[20..])
}

// ---------------------------------------------------------------------------------------------
// Files

/// A stored file (uploaded, or written by a batch).
#[derive(Debug, Clone)]
pub(crate) struct FileRecord {
    pub id: String,
    pub provider: Provider,
    pub purpose: String,
    pub filename: String,
    pub created_at: i64,
    pub expires_at: Option<i64>,
    pub content: Bytes,
    /// Creation order; list order and pagination cursors use it.
    pub seq: u64,
}

impl FileRecord {
    pub(crate) fn bytes(&self) -> u64 {
        u64::try_from(self.content.len()).unwrap_or(u64::MAX)
    }

    fn live_at(&self, now: i64) -> bool {
        self.expires_at.is_none_or(|e| now < e)
    }
}

/// Live files by creation order, plus the order of every id ever issued (so a cursor naming a
/// deleted or expired file still pages correctly).
#[derive(Debug, Default)]
pub(crate) struct Files {
    by_seq: BTreeMap<u64, FileRecord>,
    seq_of: HashMap<String, u64>,
    next_seq: u64,
}

impl Files {
    fn insert(&mut self, mut record: FileRecord) -> FileRecord {
        self.next_seq += 1;
        record.seq = self.next_seq;
        self.seq_of.insert(record.id.clone(), record.seq);
        self.by_seq.insert(record.seq, record.clone());
        record
    }

    pub(crate) fn get(&self, id: &str) -> Option<&FileRecord> {
        self.seq_of.get(id).and_then(|seq| self.by_seq.get(seq))
    }

    fn remove(&mut self, id: &str) -> Option<FileRecord> {
        let seq = self.seq_of.get(id)?;
        self.by_seq.remove(seq)
    }

    /// Drops files whose expiry has passed (they answer 404 from then on).
    fn purge_expired(&mut self, now: i64) {
        self.by_seq.retain(|_, f| f.live_at(now));
    }

    /// Live files of a provider with `purpose`, with or without an expiry.
    pub(crate) fn count(&self, provider: Provider, purpose: &str, with_expiry: bool) -> u64 {
        let n = self
            .by_seq
            .values()
            .filter(|f| {
                f.provider == provider
                    && f.purpose == purpose
                    && f.expires_at.is_some() == with_expiry
            })
            .count();
        u64::try_from(n).unwrap_or(u64::MAX)
    }

    /// One page of files in creation order (`descending` = newest first), after the cursor.
    pub(crate) fn page(
        &self,
        provider: Provider,
        purpose: Option<&str>,
        descending: bool,
        after: Option<&str>,
        limit: usize,
    ) -> (Vec<&FileRecord>, bool) {
        let after_seq = after.and_then(|a| self.seq_of.get(a).copied());
        let in_range = |seq: u64| match after_seq {
            None => true,
            Some(a) if descending => seq < a,
            Some(a) => seq > a,
        };
        let iter: Box<dyn Iterator<Item = &FileRecord>> = if descending {
            Box::new(self.by_seq.values().rev())
        } else {
            Box::new(self.by_seq.values())
        };
        let mut matching = iter
            .filter(|f| f.provider == provider)
            .filter(|f| in_range(f.seq))
            .filter(|f| purpose.is_none_or(|p| f.purpose == p));
        let page: Vec<&FileRecord> = matching.by_ref().take(limit).collect();
        let has_more = matching.next().is_some();
        (page, has_more)
    }
}

// ---------------------------------------------------------------------------------------------
// Batches

/// The batch status machine shared by OpenAI and Azure OpenAI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BatchStatus {
    Validating,
    Failed,
    InProgress,
    Finalizing,
    Completed,
    Expired,
    Cancelling,
    Cancelled,
}

impl BatchStatus {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Validating => "validating",
            Self::Failed => "failed",
            Self::InProgress => "in_progress",
            Self::Finalizing => "finalizing",
            Self::Completed => "completed",
            Self::Expired => "expired",
            Self::Cancelling => "cancelling",
            Self::Cancelled => "cancelled",
        }
    }

    pub(crate) fn is_terminal(self) -> bool {
        matches!(self, Self::Failed | Self::Completed | Self::Expired | Self::Cancelled)
    }

    /// Azure's capitalised spelling in its legacy REST examples (`Validating`, `InProgress`).
    pub(crate) fn capitalised(self) -> &'static str {
        match self {
            Self::Validating => "Validating",
            Self::Failed => "Failed",
            Self::InProgress => "InProgress",
            Self::Finalizing => "Finalizing",
            Self::Completed => "Completed",
            Self::Expired => "Expired",
            Self::Cancelling => "Cancelling",
            Self::Cancelled => "Cancelled",
        }
    }
}

/// What became of one line, handed to a [`Dialect`] to render.
#[derive(Debug)]
pub(crate) enum LineKind<'a> {
    /// The model answered; the response body.
    Succeeded(&'a Value),
    /// An injected fault.
    Fault(LineFaultKind),
    /// The request body was unusable for the endpoint.
    Invalid(&'a ModelRejection),
    /// The completion window ended before the line ran.
    Expired,
    /// The batch was cancelled before the line ran.
    Cancelled,
}

/// One line's result, with the ids the simulator assigned.
#[derive(Debug)]
pub(crate) struct LineResult<'a> {
    pub custom_id: &'a str,
    /// Id of the result line (`batch_req_…`).
    pub line_id: &'a str,
    /// Id of the upstream request (`req_…`).
    pub request_id: &'a str,
    pub kind: LineKind<'a>,
}

/// Which result file a rendered line goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sink {
    Output,
    Error,
}

/// A provider's rules for batches: ids, how a line runs, how result lines look, where they go.
pub(crate) trait Dialect: Send + Sync + fmt::Debug {
    fn provider(&self) -> Provider;

    /// A fresh batch id.
    fn new_batch_id(&self) -> String {
        new_id("batch_")
    }

    /// One result line, without the trailing newline, and the file it belongs in.
    fn render(&self, line: &LineResult<'_>) -> (Sink, Vec<u8>);

    /// Runs one planned line (`raw` as planned at create) against the model.
    fn execute(
        &self,
        endpoint: &str,
        raw: &[u8],
        ctx: &mut RunContext<'_>,
    ) -> Result<ModelOutput, ModelRejection> {
        let body = validate::parse_line(raw)
            .and_then(|mut v| v.get_mut("body").map(Value::take))
            .unwrap_or(Value::Null);
        model::run(endpoint, &body, ctx)
    }

    /// Whether a batch expires when its 24 h window ends.
    fn expires(&self) -> bool {
        true
    }

    /// Whether an error file is written even when no line failed (Azure: a zero-byte file).
    fn always_error_file(&self) -> bool {
        false
    }

    /// Whether results stay with the batch (Anthropic's `results_url`) instead of becoming files.
    fn inline_results(&self) -> bool {
        false
    }
}

/// Usage summed over the lines that ran successfully.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// The part of `input_tokens` read from the prompt cache.
    pub cached_tokens: u64,
}

/// What became of the lines so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RequestCounts {
    /// Lines of a validated batch.
    pub total: u64,
    /// Lines that ran and succeeded.
    pub completed: u64,
    /// Lines that ran and failed.
    pub failed: u64,
    /// Lines never run because the batch was cancelled.
    pub cancelled: u64,
    /// Lines never run because the batch expired.
    pub expired: u64,
}

/// A batch and everything needed to move it forward.
#[derive(Debug)]
pub(crate) struct BatchRecord {
    pub id: String,
    pub seq: u64,
    pub dialect: Arc<dyn Dialect>,
    pub endpoint: String,
    pub input_file_id: String,
    pub completion_window: String,
    pub metadata: Option<Map<String, Value>>,
    /// Lifetime of the output and error files, counted from their creation (None: no expiry).
    pub output_expires_seconds: Option<i64>,
    pub status: BatchStatus,
    pub created_at: f64,
    pub expires_at: f64,
    pub in_progress_at: Option<f64>,
    pub finalizing_at: Option<f64>,
    pub completed_at: Option<f64>,
    pub failed_at: Option<f64>,
    pub expired_at: Option<f64>,
    pub cancelling_at: Option<f64>,
    pub cancelled_at: Option<f64>,
    /// Shown once validation has passed.
    pub model: Option<String>,
    /// Shown once validation has failed.
    pub errors: Option<Vec<BatchError>>,
    pub request_counts: RequestCounts,
    pub usage: Usage,
    pub output_file_id: Option<String>,
    pub error_file_id: Option<String>,
    /// Inline results (Anthropic), once the batch has ended.
    pub results: Option<Bytes>,
    /// Requests in the batch as submitted (Anthropic's `request_counts.processing`).
    pub declared_total: u64,
    /// The model and estimated prompt tokens this batch holds against an enqueued-token limit
    /// while it is not terminal.
    pub queue_model: Option<String>,
    pub enqueued_tokens: u64,
    /// The validation verdict, decided at create and revealed when `validating` ends.
    verdict: Option<Result<ValidInput, Vec<BatchError>>>,
    /// The lines once validation passed; emptied when the batch ends.
    lines: Vec<PlannedLine>,
    /// Indices into `lines` in the (shuffled) order they run.
    order: Vec<u32>,
    /// How many of `order` have run.
    done: usize,
    /// Progress anchor: `anchor_done` lines had run at virtual time `anchor_t`.
    anchor_t: f64,
    anchor_done: usize,
    /// Rendered result lines with the input index they belong to, in the order they were written.
    out_lines: Vec<(u32, Vec<u8>)>,
    err_lines: Vec<(u32, Vec<u8>)>,
}

impl BatchRecord {
    pub(crate) fn provider(&self) -> Provider {
        self.dialect.provider()
    }
}

/// Everything about a batch the create call decides (request already validated by the wire layer).
#[derive(Debug)]
pub(crate) struct NewBatch {
    pub dialect: Arc<dyn Dialect>,
    pub endpoint: String,
    pub input_file_id: String,
    pub completion_window: String,
    pub metadata: Option<Map<String, Value>>,
    pub output_expires_seconds: Option<i64>,
}

/// Why a create or cancel was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StoreError {
    FileNotFound,
    BatchNotFound,
    WrongPurpose(String),
    /// Cancel on a batch in this status.
    CannotCancel(BatchStatus),
    /// Delete of a batch that has not ended.
    CannotDelete(BatchStatus),
}

/// Input of a new batch read out of the store, to be validated outside the lock.
#[derive(Debug)]
pub(crate) struct BatchInput {
    pub content: Bytes,
    pub seed: u64,
}

// ---------------------------------------------------------------------------------------------
// The simulator state

/// One simulator: config, clock and store behind one mutex.
#[derive(Debug)]
pub(crate) struct Sim {
    pub config: SimConfig,
    pub clock: Clock,
    pub files: Files,
    batches: BTreeMap<u64, BatchRecord>,
    batch_seq_of: HashMap<String, u64>,
    next_batch_seq: u64,
    /// Batches not yet terminal.
    active: BTreeSet<u64>,
    counters: ByProvider,
    ledger: Vec<LedgerEntry>,
    /// How many times each (provider, custom_id) has run; retryable faults are drawn per attempt.
    attempts: HashMap<(Provider, String), u32>,
    /// Prompt prefixes seen so far, for cached-token counts.
    prompt_cache: PromptCache,
    /// How many requests each HTTP fault (by position) has been drawn for.
    fault_draws: Vec<u64>,
}

/// The shared handle to a simulator's state.
pub(crate) type SharedSim = Arc<Mutex<Sim>>;

/// Locks the state; a panic elsewhere while holding the lock does not make the data unusable.
pub(crate) fn lock(sim: &Mutex<Sim>) -> MutexGuard<'_, Sim> {
    sim.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Sim {
    pub(crate) fn new(config: SimConfig) -> Self {
        Self::with_clock(Clock::new(config.speed), config)
    }

    pub(crate) fn with_clock(clock: Clock, config: SimConfig) -> Self {
        Self {
            config,
            clock,
            files: Files::default(),
            batches: BTreeMap::new(),
            batch_seq_of: HashMap::new(),
            next_batch_seq: 0,
            active: BTreeSet::new(),
            counters: ByProvider::default(),
            ledger: Vec::new(),
            attempts: HashMap::new(),
            prompt_cache: PromptCache::default(),
            fault_draws: Vec::new(),
        }
    }

    /// Brings every batch and file up to the current virtual time; returns that time.
    pub(crate) fn sync(&mut self) -> f64 {
        let now = self.clock.now_f64();
        let active: Vec<u64> = self.active.iter().copied().collect();
        for seq in active {
            let Some(batch) = self.batches.get_mut(&seq) else {
                continue;
            };
            let mut fx = Effects {
                config: &self.config,
                files: &mut self.files,
                counters: &mut self.counters,
                ledger: &mut self.ledger,
                attempts: &mut self.attempts,
                cache: &mut self.prompt_cache,
            };
            step(batch, now, &mut fx);
            if batch.status.is_terminal() {
                self.active.remove(&seq);
            }
        }
        self.files.purge_expired(secs(now));
        now
    }

    /// Replaces the config: runs everything up to now under the old one, then switches.
    pub(crate) fn set_config(&mut self, config: SimConfig) {
        let now = self.sync();
        self.clock.set_speed(config.speed);
        self.config = config;
        self.fault_draws.clear();
        for seq in &self.active {
            if let Some(b) = self.batches.get_mut(seq) {
                b.anchor_t = now;
                b.anchor_done = b.done;
            }
        }
    }

    pub(crate) fn stats(&mut self) -> SimStats {
        self.sync();
        let mut split = self.counters;
        for f in self.files.by_seq.values() {
            split.get_mut(f.provider).files_live += 1;
        }
        SimStats::from_split(split)
    }

    pub(crate) fn ledger(&mut self) -> Vec<LedgerEntry> {
        self.sync();
        self.ledger.clone()
    }

    /// Draws whether the HTTP fault at `index` (of `config.faults`) hits this request: seeded by the
    /// config's seed, the fault's position and how many requests it has been drawn for.
    pub(crate) fn draw_fault(&mut self, index: usize, rate: f64) -> bool {
        if self.fault_draws.len() <= index {
            self.fault_draws.resize(index + 1, 0);
        }
        let Some(n) = self.fault_draws.get_mut(index) else {
            return false;
        };
        *n += 1;
        let count = n.to_le_bytes();
        let seed = self.config.seed.to_le_bytes();
        let index = u64::try_from(index).unwrap_or(u64::MAX).to_le_bytes();
        unit_hash(&[b"http-fault", &seed, &index, &count]) < rate
    }

    // --- files ---------------------------------------------------------------------------

    /// Stores an uploaded file. `expires_after` is seconds from creation, if any.
    pub(crate) fn upload_file(
        &mut self,
        provider: Provider,
        purpose: String,
        filename: String,
        content: Bytes,
        expires_after: Option<i64>,
    ) -> FileRecord {
        let now = secs(self.sync());
        self.counters.get_mut(provider).files_uploaded += 1;
        self.files.insert(FileRecord {
            id: new_id("file-"),
            provider,
            purpose,
            filename,
            created_at: now,
            expires_at: expires_after.map(|s| now + s),
            content,
            seq: 0,
        })
    }

    pub(crate) fn file(&mut self, provider: Provider, id: &str) -> Option<FileRecord> {
        self.sync();
        self.files.get(id).filter(|f| f.provider == provider).cloned()
    }

    pub(crate) fn delete_file(&mut self, provider: Provider, id: &str) -> Result<(), StoreError> {
        self.sync();
        match self.files.get(id) {
            Some(f) if f.provider == provider => {}
            _ => return Err(StoreError::FileNotFound),
        }
        self.files.remove(id);
        self.counters.get_mut(provider).files_deleted += 1;
        Ok(())
    }

    // --- batches -------------------------------------------------------------------------

    /// First half of a create: the input file's content, checked to exist with purpose `batch`.
    pub(crate) fn batch_input(
        &mut self,
        provider: Provider,
        input_file_id: &str,
    ) -> Result<BatchInput, StoreError> {
        self.sync();
        let file = self
            .files
            .get(input_file_id)
            .filter(|f| f.provider == provider)
            .ok_or(StoreError::FileNotFound)?;
        if file.purpose != "batch" {
            return Err(StoreError::WrongPurpose(file.purpose.clone()));
        }
        Ok(BatchInput { content: file.content.clone(), seed: self.config.seed })
    }

    /// Second half of a create: records the batch, `validating`, with its verdict decided.
    pub(crate) fn insert_batch(
        &mut self,
        new: NewBatch,
        verdict: Result<ValidInput, Vec<BatchError>>,
        order: Vec<u32>,
    ) -> &BatchRecord {
        let now = self.sync();
        let provider = new.dialect.provider();
        self.counters.get_mut(provider).batches_created += 1;
        self.next_batch_seq += 1;
        let seq = self.next_batch_seq;
        let id = new.dialect.new_batch_id();
        let (queue_model, enqueued_tokens, declared_total) = match &verdict {
            Ok(valid) => (
                valid.model.clone(),
                valid.estimated_tokens,
                u64::try_from(valid.lines.len()).unwrap_or(u64::MAX),
            ),
            Err(_) => (None, 0, 0),
        };
        let record = BatchRecord {
            id: id.clone(),
            seq,
            dialect: new.dialect,
            endpoint: new.endpoint,
            input_file_id: new.input_file_id,
            completion_window: new.completion_window,
            metadata: new.metadata,
            output_expires_seconds: new.output_expires_seconds,
            status: BatchStatus::Validating,
            created_at: now,
            expires_at: (secs(now) + COMPLETION_WINDOW_SECONDS) as f64,
            in_progress_at: None,
            finalizing_at: None,
            completed_at: None,
            failed_at: None,
            expired_at: None,
            cancelling_at: None,
            cancelled_at: None,
            model: None,
            errors: None,
            request_counts: RequestCounts::default(),
            usage: Usage::default(),
            output_file_id: None,
            error_file_id: None,
            results: None,
            declared_total,
            queue_model,
            enqueued_tokens,
            verdict: Some(verdict),
            lines: Vec::new(),
            order,
            done: 0,
            anchor_t: now,
            anchor_done: 0,
            out_lines: Vec::new(),
            err_lines: Vec::new(),
        };
        self.batch_seq_of.insert(id, seq);
        self.active.insert(seq);
        self.batches.entry(seq).or_insert(record)
    }

    pub(crate) fn batch(&mut self, provider: Provider, id: &str) -> Option<&BatchRecord> {
        self.sync();
        self.batch_ref(provider, id)
    }

    fn batch_ref(&self, provider: Provider, id: &str) -> Option<&BatchRecord> {
        self.batch_seq_of
            .get(id)
            .and_then(|seq| self.batches.get(seq))
            .filter(|b| b.provider() == provider)
    }

    /// Estimated prompt tokens held by unfinished batches of `provider` for `model`.
    pub(crate) fn enqueued_tokens(&mut self, provider: Provider, model: &str) -> u64 {
        self.sync();
        self.active
            .iter()
            .filter_map(|seq| self.batches.get(seq))
            .filter(|b| b.provider() == provider && b.queue_model.as_deref() == Some(model))
            .map(|b| b.enqueued_tokens)
            .sum()
    }

    /// Requests held by unfinished batches of `provider`.
    pub(crate) fn queued_requests(&mut self, provider: Provider) -> u64 {
        self.sync();
        self.active
            .iter()
            .filter_map(|seq| self.batches.get(seq))
            .filter(|b| b.provider() == provider)
            .map(|b| b.declared_total)
            .sum()
    }

    /// Removes an ended batch (Anthropic's delete).
    pub(crate) fn delete_batch(&mut self, provider: Provider, id: &str) -> Result<(), StoreError> {
        self.sync();
        let seq = self.batch_ref(provider, id).map(|b| b.seq).ok_or(StoreError::BatchNotFound)?;
        let status = self.batches.get(&seq).map(|b| b.status).ok_or(StoreError::BatchNotFound)?;
        if !status.is_terminal() {
            return Err(StoreError::CannotDelete(status));
        }
        self.batches.remove(&seq);
        self.batch_seq_of.remove(id);
        Ok(())
    }

    /// Newest first, between the cursors: `after` pages toward older batches, `before` toward
    /// newer ones (the page is the `limit` batches closest to `before`, still newest first).
    pub(crate) fn batch_page_between(
        &mut self,
        provider: Provider,
        after: Option<&str>,
        before: Option<&str>,
        limit: usize,
    ) -> (Vec<&BatchRecord>, bool) {
        self.sync();
        let after_seq = after.and_then(|a| self.batch_seq_of.get(a).copied());
        let before_seq = before.and_then(|b| self.batch_seq_of.get(b).copied());
        let in_range = |b: &&BatchRecord| {
            b.provider() == provider
                && after_seq.is_none_or(|a| b.seq < a)
                && before_seq.is_none_or(|s| b.seq > s)
        };
        if before.is_some() && after.is_none() {
            // Oldest first from the cursor upward, then reversed to newest first.
            let mut matching = self.batches.values().filter(in_range);
            let mut page: Vec<&BatchRecord> = matching.by_ref().take(limit).collect();
            let has_more = matching.next().is_some();
            page.reverse();
            return (page, has_more);
        }
        let mut matching = self.batches.values().rev().filter(in_range);
        let page: Vec<&BatchRecord> = matching.by_ref().take(limit).collect();
        let has_more = matching.next().is_some();
        (page, has_more)
    }

    /// Newest first, after the cursor.
    pub(crate) fn batch_page(
        &mut self,
        provider: Provider,
        after: Option<&str>,
        limit: usize,
    ) -> (Vec<&BatchRecord>, bool) {
        self.sync();
        let after_seq = after.and_then(|a| self.batch_seq_of.get(a).copied());
        let mut matching = self
            .batches
            .values()
            .rev()
            .filter(|b| b.provider() == provider)
            .filter(|b| after_seq.is_none_or(|a| b.seq < a));
        let page: Vec<&BatchRecord> = matching.by_ref().take(limit).collect();
        let has_more = matching.next().is_some();
        (page, has_more)
    }

    /// Starts cancelling. Already `cancelling`: unchanged (idempotent).
    pub(crate) fn cancel_batch(
        &mut self,
        provider: Provider,
        id: &str,
    ) -> Result<&BatchRecord, StoreError> {
        let now = self.sync();
        let seq = self
            .batch_seq_of
            .get(id)
            .copied()
            .filter(|seq| self.batches.get(seq).is_some_and(|b| b.provider() == provider))
            .ok_or(StoreError::BatchNotFound)?;
        let batch = self.batches.get_mut(&seq).ok_or(StoreError::BatchNotFound)?;
        match batch.status {
            BatchStatus::Validating | BatchStatus::InProgress => {
                batch.status = BatchStatus::Cancelling;
                batch.cancelling_at = Some(now);
            }
            BatchStatus::Cancelling => {}
            other => return Err(StoreError::CannotCancel(other)),
        }
        Ok(batch)
    }
}

/// Validates and orders a batch input outside the lock.
pub(crate) fn plan_batch(
    input: &BatchInput,
    endpoint: &str,
    rules: &validate::Rules,
) -> (Result<ValidInput, Vec<BatchError>>, Vec<u32>) {
    let verdict = validate::validate(&input.content, endpoint, rules);
    let order = match &verdict {
        Ok(valid) => shuffled_order(&valid.lines, input.seed),
        Err(_) => Vec::new(),
    };
    (verdict, order)
}

/// A seeded permutation of the lines that is never the identity for two or more lines.
pub(crate) fn shuffled_order(lines: &[PlannedLine], seed: u64) -> Vec<u32> {
    let n = u32::try_from(lines.len()).unwrap_or(u32::MAX);
    let mut order: Vec<u32> = (0..n).collect();
    let mut h = Sha256::new();
    h.update(seed.to_le_bytes());
    for l in lines {
        h.update(l.custom_id.as_bytes());
        h.update([0]);
    }
    let digest = h.finalize();
    let mut word = [0u8; 8];
    word.copy_from_slice(&digest[..8]);
    let mut rng = StdRng::seed_from_u64(u64::from_le_bytes(word));
    order.shuffle(&mut rng);
    if order.len() >= 2 && order.windows(2).all(|w| w[0] < w[1]) {
        order.rotate_left(1);
    }
    order
}

/// A uniform number in [0, 1) from a hash of the given parts.
fn unit_hash(parts: &[&[u8]]) -> f64 {
    let mut h = Sha256::new();
    for p in parts {
        h.update(u64::try_from(p.len()).unwrap_or(0).to_le_bytes());
        h.update(p);
    }
    let d = h.finalize();
    let mut word = [0u8; 8];
    word.copy_from_slice(&d[..8]);
    // 53 random bits make an exact f64 in [0, 1).
    (u64::from_le_bytes(word) >> 11) as f64 / (1u64 << 53) as f64
}

// ---------------------------------------------------------------------------------------------
// The life cycle

/// The parts of the state a batch step may touch besides the batch itself.
struct Effects<'a> {
    config: &'a SimConfig,
    files: &'a mut Files,
    counters: &'a mut ByProvider,
    ledger: &'a mut Vec<LedgerEntry>,
    attempts: &'a mut HashMap<(Provider, String), u32>,
    cache: &'a mut PromptCache,
}

/// Moves one batch forward to virtual time `t`, phase by phase.
fn step(b: &mut BatchRecord, t: f64, fx: &mut Effects<'_>) {
    let p = fx.config.processing.clone();
    loop {
        match b.status {
            BatchStatus::Validating => {
                let end = b.created_at + p.validating_seconds;
                if b.dialect.expires() && end >= b.expires_at && t >= b.expires_at {
                    reveal_verdict(b);
                    expire(b, fx);
                    return;
                }
                if t < end {
                    return;
                }
                match b.verdict.take() {
                    Some(Ok(valid)) => {
                        b.request_counts.total = u64::try_from(valid.lines.len()).unwrap_or(0);
                        b.model = valid.model;
                        b.lines = valid.lines;
                        b.status = BatchStatus::InProgress;
                        b.in_progress_at = Some(end);
                        b.anchor_t = end;
                        b.anchor_done = 0;
                    }
                    Some(Err(errors)) => {
                        b.errors = Some(errors);
                        b.status = BatchStatus::Failed;
                        b.failed_at = Some(end);
                        b.order.clear();
                        return;
                    }
                    None => {
                        // Unreachable in practice: the verdict is always set at create.
                        b.status = BatchStatus::Failed;
                        b.failed_at = Some(end);
                        return;
                    }
                }
            }
            BatchStatus::InProgress => {
                let total = b.order.len();
                let rps = p.requests_per_second;
                let remaining = total.saturating_sub(b.anchor_done);
                let finish_t = b.anchor_t + remaining as f64 / rps;
                let expires = b.dialect.expires();
                let horizon = if expires { t.min(b.expires_at) } else { t };
                let target = if horizon >= finish_t {
                    total
                } else {
                    let ran = ((horizon - b.anchor_t).max(0.0) * rps).floor();
                    // Below `remaining`, so it fits a usize.
                    (b.anchor_done + ran as usize).min(total)
                };
                while b.done < target {
                    let ran_at = b.anchor_t + (b.done + 1 - b.anchor_done) as f64 / rps;
                    run_line(b, ran_at.min(horizon), fx);
                }
                if b.done >= total {
                    b.status = BatchStatus::Finalizing;
                    b.finalizing_at = Some(finish_t.min(horizon));
                    continue;
                }
                if expires && t >= b.expires_at {
                    expire(b, fx);
                }
                return;
            }
            BatchStatus::Finalizing => {
                let start = b.finalizing_at.unwrap_or(t);
                let end = start + p.finalizing_seconds;
                if t < end {
                    return;
                }
                b.status = BatchStatus::Completed;
                b.completed_at = Some(end);
                write_result_files(b, end, fx);
                return;
            }
            BatchStatus::Cancelling => {
                let start = b.cancelling_at.unwrap_or(t);
                let end = start + p.finalizing_seconds;
                if t < end {
                    return;
                }
                reveal_verdict(b);
                settle_unrun(b, false);
                b.status = BatchStatus::Cancelled;
                b.cancelled_at = Some(end);
                write_result_files(b, end, fx);
                return;
            }
            BatchStatus::Failed
            | BatchStatus::Completed
            | BatchStatus::Expired
            | BatchStatus::Cancelled => return,
        }
    }
}

/// Makes the lines of a still-validating batch known (if the file was valid) so that they can be
/// reported as expired or cancelled.
fn reveal_verdict(b: &mut BatchRecord) {
    if let Some(Ok(valid)) = b.verdict.take() {
        b.request_counts.total = u64::try_from(valid.lines.len()).unwrap_or(0);
        b.model = valid.model;
        b.lines = valid.lines;
    }
    if b.lines.is_empty() {
        b.order.clear();
    }
}

fn expire(b: &mut BatchRecord, fx: &mut Effects<'_>) {
    let at = b.expires_at;
    settle_unrun(b, true);
    b.status = BatchStatus::Expired;
    b.expired_at = Some(at);
    write_result_files(b, at, fx);
}

/// Renders every line that has not run as expired or cancelled.
fn settle_unrun(b: &mut BatchRecord, expired: bool) {
    let pending: Vec<u32> = b.order.get(b.done..).unwrap_or_default().to_vec();
    let n = u64::try_from(pending.len()).unwrap_or(u64::MAX);
    if expired {
        b.request_counts.expired += n;
    } else {
        b.request_counts.cancelled += n;
    }
    for idx in pending {
        let Some(line) = b.lines.get(idx as usize) else {
            continue;
        };
        let line_id = new_id("batch_req_");
        let request_id = new_id("req_");
        let result = LineResult {
            custom_id: &line.custom_id,
            line_id: &line_id,
            request_id: &request_id,
            kind: if expired { LineKind::Expired } else { LineKind::Cancelled },
        };
        let (sink, bytes) = b.dialect.render(&result);
        push_rendered(b, sink, idx, bytes);
    }
    b.done = b.order.len();
}

fn push_rendered(b: &mut BatchRecord, sink: Sink, idx: u32, bytes: Vec<u8>) {
    match sink {
        Sink::Output => b.out_lines.push((idx, bytes)),
        Sink::Error => b.err_lines.push((idx, bytes)),
    }
}

/// Draws the line fault of one attempt of `custom_id`, if any (the first configured fault that hits).
fn draw_line_fault(
    config: &SimConfig,
    provider: Provider,
    custom_id: &str,
    attempt: u32,
) -> Option<LineFaultKind> {
    let seed = config.seed.to_le_bytes();
    config
        .line_faults
        .iter()
        .enumerate()
        .filter(|(_, f)| f.applies_to(provider))
        .find(|(i, f)| {
            let index = u64::try_from(*i).unwrap_or(0).to_le_bytes();
            // Fatal faults stick to a custom_id; the others are drawn afresh per attempt.
            let attempt = if f.kind.sticky() { 0u32 } else { attempt }.to_le_bytes();
            let kind = f.kind.as_str().as_bytes();
            unit_hash(&[&seed, &index, kind, custom_id.as_bytes(), &attempt]) < f.rate
        })
        .map(|(_, f)| f.kind)
}

/// Runs the next line in order at virtual time `at`.
fn run_line(b: &mut BatchRecord, at: f64, fx: &mut Effects<'_>) {
    let Some(&idx) = b.order.get(b.done) else {
        return;
    };
    b.done += 1;
    let Some(line) = b.lines.get(idx as usize) else {
        return;
    };
    let provider = b.dialect.provider();
    let custom_id = line.custom_id.clone();
    let attempt_key = (provider, custom_id.clone());
    let attempt = fx.attempts.get(&attempt_key).copied().unwrap_or(0);
    *fx.attempts.entry(attempt_key).or_insert(0) += 1;
    let fault = draw_line_fault(fx.config, provider, &custom_id, attempt);

    let line_id = new_id("batch_req_");
    let request_id = new_id("req_");
    let result = |kind| LineResult {
        custom_id: &custom_id,
        line_id: &line_id,
        request_id: &request_id,
        kind,
    };
    let (outcome, output, rendered) = match fault {
        Some(kind) if !kind.corrupts_answer() => {
            let outcome = match kind {
                LineFaultKind::Retryable => LedgerOutcome::FailedRetryable,
                _ => LedgerOutcome::FailedFatal,
            };
            (outcome, None, b.dialect.render(&result(LineKind::Fault(kind))))
        }
        corrupt => {
            let (corruption, outcome) = match corrupt {
                Some(LineFaultKind::InvalidJson) => {
                    (Some(Corruption::InvalidJson), LedgerOutcome::InvalidJson)
                }
                Some(LineFaultKind::SchemaViolation) => {
                    (Some(Corruption::SchemaViolation), LedgerOutcome::SchemaViolation)
                }
                _ => (None, LedgerOutcome::Succeeded),
            };
            let mut ctx = RunContext {
                created: secs(at),
                nonce: &request_id,
                corruption,
                scope: provider.as_str(),
                cache: fx.cache,
            };
            match b.dialect.execute(&b.endpoint, &line.raw, &mut ctx) {
                Ok(out) => {
                    let rendered = b.dialect.render(&result(LineKind::Succeeded(&out.body)));
                    (outcome, Some(out), rendered)
                }
                Err(rejection) => (
                    LedgerOutcome::FailedInvalid,
                    None,
                    b.dialect.render(&result(LineKind::Invalid(&rejection))),
                ),
            }
        }
    };
    let (input_tokens, output_tokens, cached_tokens) =
        output.as_ref().map_or((0, 0, 0), |o| (o.input_tokens, o.output_tokens, o.cached_tokens));
    if output.is_some() {
        b.request_counts.completed += 1;
        b.usage.input_tokens += input_tokens;
        b.usage.output_tokens += output_tokens;
        b.usage.cached_tokens += cached_tokens;
        let c = fx.counters.get_mut(provider);
        c.requests_billed += 1;
        c.tokens_billed += input_tokens + output_tokens;
    } else {
        b.request_counts.failed += 1;
    }
    fx.ledger.push(LedgerEntry {
        provider: provider.as_str().to_owned(),
        batch_id: b.id.clone(),
        custom_id,
        outcome,
        input_tokens,
        output_tokens,
        cached_tokens,
    });
    let (sink, bytes) = rendered;
    push_rendered(b, sink, idx, bytes);
}

/// Joins rendered lines into a JSONL file body. Output order must never equal input order when
/// there are two or more lines, whichever subset of lines ended up in this file.
fn join_lines(mut lines: Vec<(u32, Vec<u8>)>) -> Bytes {
    if lines.len() >= 2 && lines.windows(2).all(|w| w[0].0 < w[1].0) {
        lines.rotate_left(1);
    }
    let size = lines.iter().map(|(_, l)| l.len() + 1).sum();
    let mut out = Vec::with_capacity(size);
    for (_, l) in lines {
        out.extend_from_slice(&l);
        out.push(b'\n');
    }
    Bytes::from(out)
}

/// Creates the output and error files (each only if it has lines, except an Azure error file) or,
/// for inline results, keeps them with the batch; frees the batch's lines.
fn write_result_files(b: &mut BatchRecord, at: f64, fx: &mut Effects<'_>) {
    let created_at = secs(at);
    let provider = b.dialect.provider();
    let out = std::mem::take(&mut b.out_lines);
    let err = std::mem::take(&mut b.err_lines);
    b.lines = Vec::new();
    b.order = Vec::new();
    if b.dialect.inline_results() {
        let mut all = out;
        all.extend(err);
        b.results = Some(join_lines(all));
        return;
    }
    // A batch that ran (not one that failed validation) gets an error file even when empty.
    let ran = b.status != BatchStatus::Failed;
    let always_err = ran && b.dialect.always_error_file();
    for (lines, suffix, slot, always) in [
        (out, "output", &mut b.output_file_id, false),
        (err, "error", &mut b.error_file_id, always_err),
    ] {
        if lines.is_empty() && !always {
            continue;
        }
        let record = fx.files.insert(FileRecord {
            id: new_id("file-"),
            provider,
            purpose: "batch_output".to_owned(),
            filename: format!("{}_{suffix}.jsonl", b.id),
            created_at,
            expires_at: b.output_expires_seconds.map(|s| created_at + s),
            content: join_lines(lines),
            seq: 0,
        });
        *slot = Some(record.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(n: usize) -> Vec<PlannedLine> {
        (0..n).map(|i| PlannedLine { custom_id: format!("c{i}"), raw: Bytes::new() }).collect()
    }

    #[test]
    fn order_is_a_permutation_and_never_identity() {
        for n in 2..40 {
            for seed in 0..20 {
                let order = shuffled_order(&lines(n), seed);
                let mut sorted = order.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (0..n as u32).collect::<Vec<_>>());
                assert!(order.windows(2).any(|w| w[0] > w[1]), "n={n} seed={seed}");
            }
        }
        assert_eq!(shuffled_order(&lines(1), 3), vec![0]);
        assert_eq!(shuffled_order(&lines(9), 3), shuffled_order(&lines(9), 3));
    }

    #[test]
    fn joined_files_are_never_in_input_order() {
        let body = join_lines(vec![(1, b"b".to_vec()), (4, b"e".to_vec())]);
        assert_eq!(&body[..], b"e\nb\n");
        let body = join_lines(vec![(4, b"e".to_vec()), (1, b"b".to_vec())]);
        assert_eq!(&body[..], b"e\nb\n");
        assert_eq!(&join_lines(vec![(0, b"a".to_vec())])[..], b"a\n");
    }

    #[test]
    fn unit_hash_is_in_range_and_spread() {
        let xs: Vec<f64> = (0u32..1000).map(|i| unit_hash(&[b"x", &i.to_le_bytes()])).collect();
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
        let below_half = xs.iter().filter(|x| **x < 0.5).count();
        assert!((400..600).contains(&below_half));
    }

    #[test]
    fn file_pages_follow_creation_order() {
        let mut files = Files::default();
        for i in 0..5 {
            files.insert(FileRecord {
                id: format!("file-{i}"),
                provider: Provider::OpenAi,
                purpose: "batch".into(),
                filename: "x".into(),
                created_at: 0,
                expires_at: None,
                content: Bytes::new(),
                seq: 0,
            });
        }
        let ids = |v: Vec<&FileRecord>| v.iter().map(|f| f.id.clone()).collect::<Vec<_>>();
        let (page, more) = files.page(Provider::OpenAi, None, true, None, 2);
        assert_eq!(ids(page), ["file-4", "file-3"]);
        assert!(more);
        files.remove("file-3");
        let (page, more) = files.page(Provider::OpenAi, None, true, Some("file-3"), 2);
        assert_eq!(ids(page), ["file-2", "file-1"]);
        assert!(more);
        let (page, more) = files.page(Provider::OpenAi, None, false, Some("file-2"), 10);
        assert_eq!(ids(page), ["file-4"]);
        assert!(!more);
        let (page, _) = files.page(Provider::Azure, None, false, None, 10);
        assert!(page.is_empty());
    }
}
