//! The provider-neutral store of files and batches, and the batch life cycle on the virtual clock.
//!
//! Nothing runs in the background. Every read first calls [`Sim::sync`], which moves each live
//! batch forward to the current virtual time: phase changes happen at their exact virtual instants
//! (so a batch read once after a long advance looks the same as one polled every second), lines run
//! at `requests_per_second`, and output/error files (or, for Anthropic, the inline results) appear
//! when the batch ends. Wire shapes are not decided here: each batch carries a [`Dialect`] that runs
//! its lines and renders their results.
//!
//! Nothing here holds file bytes or per-line data in memory: file contents, each batch's line
//! index and result lines, and the ledger are in the [`Spool`]; a batch runs its lines in a keyed
//! order computed position by position (`shuffle`), reading each line from disk when it runs.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::cache::PromptCache;
use crate::clock::{Clock, secs};
use crate::config::{LineFaultKind, SimConfig};
use crate::model::{self, Corruption, ModelOutput, ModelRejection, RunContext, TokenUsage};
use crate::spool::{
    FileBody, IndexWriter, LedgerLog, LineReader, ResultSink, Spool, SpoolWorker, SpooledLines,
};
use crate::stats::{ByProvider, LedgerEntry, LedgerOutcome, SimStats, UploadEntry};
use crate::validate::{self, BatchError, CustomIdOnly, ValidInput};

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
    /// The bytes, on disk in the spool.
    pub content: FileBody,
    /// Creation order; list order and pagination cursors use it.
    pub seq: u64,
}

impl FileRecord {
    pub(crate) fn bytes(&self) -> u64 {
        self.content.len()
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

    /// Bytes of a provider's live files.
    pub(crate) fn stored_bytes(&self, provider: Provider) -> u64 {
        self.by_seq.values().filter(|f| f.provider == provider).map(FileRecord::bytes).sum()
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

    /// Runs one line (`request`: the parsed line as planned at create) against the model.
    fn execute(
        &self,
        endpoint: &str,
        mut request: Value,
        ctx: &mut RunContext<'_>,
    ) -> Result<ModelOutput, ModelRejection> {
        let body = request.get_mut("body").map(Value::take).unwrap_or(Value::Null);
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
    /// Usage summed over the lines that ran successfully.
    pub usage: TokenUsage,
    pub output_file_id: Option<String>,
    pub error_file_id: Option<String>,
    /// Inline results (Anthropic), once the batch has ended.
    pub results: Option<FileBody>,
    /// Requests in the batch as submitted (Anthropic's `request_counts.processing`).
    pub declared_total: u64,
    /// The model and estimated prompt tokens this batch holds against an enqueued-token limit
    /// while it is not terminal.
    pub queue_model: Option<String>,
    pub enqueued_tokens: u64,
    /// The validation verdict, decided at create and revealed when `validating` ends.
    verdict: Option<Result<ValidInput, Vec<BatchError>>>,
    /// The lines (on disk, with their run order) once validation passed; dropped when the batch
    /// ends.
    lines: Option<SpooledLines>,
    /// How many lines have run (positions `0..done` of the run order).
    done: u64,
    /// Progress anchor: `anchor_done` lines had run at virtual time `anchor_t`.
    anchor_t: f64,
    anchor_done: u64,
    /// Rendered result lines bound for the output and error files (or the inline results), in
    /// the order they were written.
    out: ResultSink,
    err: ResultSink,
}

impl BatchRecord {
    pub(crate) fn provider(&self) -> Provider {
        self.dialect.provider()
    }

    /// Lines of the validated input (0 before validation has passed).
    fn total(&self) -> u64 {
        self.lines.as_ref().map_or(0, SpooledLines::count)
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
    pub content: FileBody,
    pub seed: u64,
    pub spool: Arc<Spool>,
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
    /// Where file contents, batch lines and results live.
    pub spool: Arc<Spool>,
    /// The thread that validates batch inputs.
    pub worker: Arc<SpoolWorker>,
    /// Every line run so far, on disk.
    ledger: LedgerLog,
    /// Every file clients uploaded (one small entry per file, never its content).
    uploads: Vec<UploadEntry>,
    /// How many times each (provider, custom_id) has run; non-sticky line faults are drawn per
    /// attempt. Kept only while the config has such faults (otherwise attempts do not matter),
    /// and rebuilt from the ledger (one entry per run) when they appear.
    attempts: Option<HashMap<(Provider, String), u32>>,
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

/// Whether a config has line faults drawn afresh per attempt (then attempts are counted).
fn counts_attempts(config: &SimConfig) -> bool {
    config.line_faults.iter().any(|f| !f.kind.sticky())
}

impl Sim {
    /// A simulator with its spool folder in `config.spool_dir` (or the system's temporary
    /// directory).
    pub(crate) fn new(config: SimConfig) -> io::Result<Self> {
        let spool = Spool::new(config.spool_dir.as_deref())?;
        let ledger = LedgerLog::new(&spool)?;
        let mut sim = Self {
            clock: Clock::new(config.speed),
            config,
            files: Files::default(),
            batches: BTreeMap::new(),
            batch_seq_of: HashMap::new(),
            next_batch_seq: 0,
            active: BTreeSet::new(),
            counters: ByProvider::default(),
            spool: Arc::new(spool),
            worker: Arc::new(SpoolWorker::start()?),
            ledger,
            uploads: Vec::new(),
            attempts: None,
            prompt_cache: PromptCache::default(),
            fault_draws: Vec::new(),
        };
        sim.track_attempts();
        Ok(sim)
    }

    /// Starts or stops counting attempts as the config needs; a fresh count is rebuilt from the
    /// ledger.
    fn track_attempts(&mut self) {
        if !counts_attempts(&self.config) {
            self.attempts = None;
            return;
        }
        if self.attempts.is_some() {
            return;
        }
        let mut attempts = HashMap::new();
        let read = self.ledger.for_each(|entry| {
            if let Some(provider) = Provider::parse(&entry.provider) {
                *attempts.entry((provider, entry.custom_id)).or_insert(0u32) += 1;
            }
        });
        if let Err(e) = read {
            tracing::warn!(error = %e, "cannot read the ledger back; attempts are counted from now");
        }
        self.attempts = Some(attempts);
    }

    /// Bytes of result lines and write buffers the batches hold in memory right now (file
    /// contents and lines are never in memory; this is at most a line and a buffer per sink of
    /// a batch that is being stepped).
    #[cfg(test)]
    pub(crate) fn held_bytes(&self) -> usize {
        self.batches.values().map(|b| b.out.held_bytes() + b.err.held_bytes()).sum()
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
                spool: &self.spool,
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
        self.track_attempts();
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

    /// Every entry of the ledger (read back from disk).
    pub(crate) fn ledger(&mut self) -> Vec<LedgerEntry> {
        self.sync();
        let mut entries = Vec::new();
        if let Err(e) = self.ledger.for_each(|entry| entries.push(entry)) {
            tracing::warn!(error = %e, "cannot read the ledger back");
        }
        entries
    }

    /// The ledger as JSONL, up to now.
    pub(crate) fn ledger_body(&mut self) -> io::Result<FileBody> {
        self.sync();
        self.ledger.snapshot()
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
        content: FileBody,
        expires_after: Option<i64>,
    ) -> FileRecord {
        let now = secs(self.sync());
        self.counters.get_mut(provider).files_uploaded += 1;
        let record = self.files.insert(FileRecord {
            id: new_id("file-"),
            provider,
            purpose,
            filename,
            created_at: now,
            expires_at: expires_after.map(|s| now + s),
            content,
            seq: 0,
        });
        self.uploads.push(UploadEntry {
            provider: provider.as_str().to_owned(),
            file_id: record.id.clone(),
            filename: record.filename.clone(),
            purpose: record.purpose.clone(),
            created_at: record.created_at,
        });
        record
    }

    /// Every file clients uploaded so far, oldest first, deleted ones included.
    pub(crate) fn uploads(&self) -> Vec<UploadEntry> {
        self.uploads.clone()
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
        Ok(BatchInput {
            content: file.content.clone(),
            seed: self.config.seed,
            spool: self.spool.clone(),
        })
    }

    /// Second half of a create: records the batch, `validating`, with its verdict decided.
    pub(crate) fn insert_batch(
        &mut self,
        new: NewBatch,
        verdict: Result<ValidInput, Vec<BatchError>>,
    ) -> &BatchRecord {
        let now = self.sync();
        let provider = new.dialect.provider();
        self.counters.get_mut(provider).batches_created += 1;
        self.next_batch_seq += 1;
        let seq = self.next_batch_seq;
        let id = new.dialect.new_batch_id();
        let (queue_model, enqueued_tokens, declared_total) = match &verdict {
            Ok(valid) => (valid.model.clone(), valid.estimated_tokens, valid.lines.count()),
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
            usage: TokenUsage::default(),
            output_file_id: None,
            error_file_id: None,
            results: None,
            declared_total,
            queue_model,
            enqueued_tokens,
            verdict: Some(verdict),
            lines: None,
            done: 0,
            anchor_t: now,
            anchor_done: 0,
            out: ResultSink::default(),
            err: ResultSink::default(),
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

/// Validates a batch input outside the lock, reading it once from disk and writing the index of
/// its runnable lines to the spool. `Err` only for an I/O failure of the spool itself.
pub(crate) fn plan_batch(
    input: &BatchInput,
    endpoint: &str,
    rules: &validate::Rules,
) -> io::Result<Result<ValidInput, Vec<BatchError>>> {
    let mut index = IndexWriter::new(&input.spool, input.seed)?;
    // Index entries point into the spool file, where the content may start past its beginning.
    let base = input.content.offset();
    let verdict = validate::validate(
        input.content.reader()?,
        input.content.len(),
        endpoint,
        rules,
        |start, len| input.content.read_span(start, len),
        |start, len, custom_id| index.push(base + start, len, custom_id),
    )?;
    Ok(match verdict {
        Ok(checked) => Ok(ValidInput {
            lines: index.finish(input.content.clone())?,
            model: checked.model,
            estimated_tokens: checked.estimated_tokens,
        }),
        Err(errors) => Err(errors),
    })
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
    spool: &'a Spool,
    files: &'a mut Files,
    counters: &'a mut ByProvider,
    ledger: &'a mut LedgerLog,
    attempts: &'a mut Option<HashMap<(Provider, String), u32>>,
    cache: &'a mut PromptCache,
}

/// Logs a failed read or write of the spool (the simulator's own disk, not a client's error).
fn spool_trouble(batch_id: &str, what: &str, e: &io::Error) {
    tracing::warn!(batch = batch_id, error = %e, "spool I/O failed: {what}");
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
                        b.request_counts.total = valid.lines.count();
                        b.model = valid.model;
                        b.lines = Some(valid.lines);
                        b.status = BatchStatus::InProgress;
                        b.in_progress_at = Some(end);
                        b.anchor_t = end;
                        b.anchor_done = 0;
                    }
                    Some(Err(errors)) => {
                        b.errors = Some(errors);
                        b.status = BatchStatus::Failed;
                        b.failed_at = Some(end);
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
                let total = b.total();
                let rps = p.requests_per_second;
                let remaining = total.saturating_sub(b.anchor_done);
                let finish_t = b.anchor_t + remaining as f64 / rps;
                let expires = b.dialect.expires();
                let horizon = if expires { t.min(b.expires_at) } else { t };
                let target = if horizon >= finish_t {
                    total
                } else {
                    let ran = ((horizon - b.anchor_t).max(0.0) * rps).floor();
                    // Below `remaining`, so it fits a u64.
                    (b.anchor_done + ran as u64).min(total)
                };
                if b.done < target {
                    let reader = open_lines(b);
                    let mut buf = Vec::new();
                    while b.done < target {
                        let ran_at = b.anchor_t + (b.done + 1 - b.anchor_done) as f64 / rps;
                        run_line(b, reader.as_ref(), &mut buf, ran_at.min(horizon), fx);
                    }
                    close_sinks(b);
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
                settle_unrun(b, false, fx);
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
        b.request_counts.total = valid.lines.count();
        b.model = valid.model;
        b.lines = Some(valid.lines);
    }
}

fn expire(b: &mut BatchRecord, fx: &mut Effects<'_>) {
    let at = b.expires_at;
    settle_unrun(b, true, fx);
    b.status = BatchStatus::Expired;
    b.expired_at = Some(at);
    write_result_files(b, at, fx);
}

/// Opens the batch's lines for reading (None, logged, if that fails: its lines are then skipped).
fn open_lines(b: &BatchRecord) -> Option<LineReader> {
    let lines = b.lines.as_ref()?;
    match lines.reader() {
        Ok(reader) => Some(reader),
        Err(e) => {
            spool_trouble(&b.id, "opening the batch's lines", &e);
            None
        }
    }
}

/// Flushes the result writers at the end of a run of lines.
fn close_sinks(b: &mut BatchRecord) {
    for result in [b.out.close(), b.err.close()] {
        if let Err(e) = result {
            spool_trouble(&b.id, "writing result lines", &e);
        }
    }
}

/// Reads line `idx` into `buf` (None, logged, if it cannot be read).
fn read_line<'b>(
    batch_id: &str,
    reader: Option<&LineReader>,
    idx: u64,
    buf: &'b mut Vec<u8>,
) -> Option<&'b [u8]> {
    let reader = reader?;
    match reader.read(idx, buf) {
        Ok(()) => Some(buf.as_slice()),
        Err(e) => {
            spool_trouble(batch_id, "reading a line", &e);
            None
        }
    }
}

/// Renders every line that has not run as expired or cancelled.
fn settle_unrun(b: &mut BatchRecord, expired: bool, fx: &mut Effects<'_>) {
    let total = b.total();
    let n = total.saturating_sub(b.done);
    if expired {
        b.request_counts.expired += n;
    } else {
        b.request_counts.cancelled += n;
    }
    if n == 0 {
        return;
    }
    let reader = open_lines(b);
    let mut buf = Vec::new();
    while b.done < total {
        let Some(idx) = b.lines.as_ref().map(|l| l.order().at(b.done)) else {
            break;
        };
        b.done += 1;
        let Some(raw) = read_line(&b.id, reader.as_ref(), idx, &mut buf) else {
            continue;
        };
        let Ok(CustomIdOnly { custom_id }) = serde_json::from_slice(raw) else {
            continue;
        };
        let line_id = new_id("batch_req_");
        let request_id = new_id("req_");
        let result = LineResult {
            custom_id: &custom_id,
            line_id: &line_id,
            request_id: &request_id,
            kind: if expired { LineKind::Expired } else { LineKind::Cancelled },
        };
        let (sink, bytes) = b.dialect.render(&result);
        push_rendered(b, fx.spool, sink, idx, &bytes);
    }
    close_sinks(b);
    b.done = total;
}

/// Appends a rendered line to its sink (inline results keep every line in one).
fn push_rendered(b: &mut BatchRecord, spool: &Spool, sink: Sink, idx: u64, bytes: &[u8]) {
    let sink = if b.dialect.inline_results() { Sink::Output } else { sink };
    let written = match sink {
        Sink::Output => b.out.push(spool, idx, bytes),
        Sink::Error => b.err.push(spool, idx, bytes),
    };
    if let Err(e) = written {
        spool_trouble(&b.id, "writing a result line", &e);
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
fn run_line(
    b: &mut BatchRecord,
    reader: Option<&LineReader>,
    buf: &mut Vec<u8>,
    at: f64,
    fx: &mut Effects<'_>,
) {
    let Some(idx) = b.lines.as_ref().map(|l| l.order().at(b.done)) else {
        b.done = b.total();
        return;
    };
    b.done += 1;
    let Some(raw) = read_line(&b.id, reader, idx, buf) else {
        return;
    };
    let Some(mut request) = validate::parse_line(raw) else {
        spool_trouble(&b.id, "parsing a line", &io::Error::other("not JSON"));
        return;
    };
    let Some(custom_id) = request.get_mut("custom_id").map(Value::take).and_then(|v| match v {
        Value::String(s) => Some(s),
        _ => None,
    }) else {
        spool_trouble(&b.id, "parsing a line", &io::Error::other("no custom_id"));
        return;
    };
    let provider = b.dialect.provider();
    let attempt = match fx.attempts {
        Some(attempts) => {
            let count = attempts.entry((provider, custom_id.clone())).or_insert(0);
            *count += 1;
            *count - 1
        }
        // No fault is drawn per attempt: the attempt does not matter.
        None => 0,
    };
    let fault = draw_line_fault(fx.config, provider, &custom_id, attempt);
    // The model the line names (OpenAI `body`, Anthropic `params`), for an entry without a response.
    let requested_model = ["body", "params"]
        .iter()
        .find_map(|k| request.get(k)?.get("model")?.as_str())
        .unwrap_or_default()
        .to_owned();

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
                now: at,
                nonce: &request_id,
                corruption,
                scope: provider.as_str(),
                cache: fx.cache,
            };
            match b.dialect.execute(&b.endpoint, request, &mut ctx) {
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
    let usage = output.as_ref().map(|o| o.usage).unwrap_or_default();
    if output.is_some() {
        b.request_counts.completed += 1;
        b.usage.add(&usage);
        let c = fx.counters.get_mut(provider);
        c.requests_billed += 1;
        c.tokens_billed += usage.input_tokens + usage.output_tokens;
    } else {
        b.request_counts.failed += 1;
    }
    let entry = LedgerEntry {
        provider: provider.as_str().to_owned(),
        batch_id: b.id.clone(),
        custom_id,
        outcome,
        model: output.map(|o| o.model).unwrap_or(requested_model),
        input_tokens: usage.input_tokens,
        cached_tokens: usage.cached_tokens,
        cache_write_5m_tokens: usage.cache_write_5m_tokens,
        cache_write_1h_tokens: usage.cache_write_1h_tokens,
        output_tokens: usage.output_tokens,
        reasoning_tokens: usage.reasoning_tokens,
    };
    if let Err(e) = fx.ledger.append(&entry) {
        spool_trouble(&b.id, "writing the ledger", &e);
    }
    let (sink, bytes) = rendered;
    push_rendered(b, fx.spool, sink, idx, &bytes);
}

/// The finished file of a sink (empty, logged, if it cannot be finished).
fn finish_sink(batch_id: &str, sink: &mut ResultSink) -> (FileBody, u64) {
    let lines = sink.lines();
    match sink.finish() {
        Ok(body) => (body, lines),
        Err(e) => {
            spool_trouble(batch_id, "finishing a result file", &e);
            (FileBody::default(), lines)
        }
    }
}

/// Creates the output and error files (each only if it has lines, except an Azure error file) or,
/// for inline results, keeps them with the batch; drops the batch's lines.
fn write_result_files(b: &mut BatchRecord, at: f64, fx: &mut Effects<'_>) {
    let created_at = secs(at);
    let provider = b.dialect.provider();
    b.lines = None;
    let (out, out_lines) = finish_sink(&b.id, &mut b.out);
    let (err, err_lines) = finish_sink(&b.id, &mut b.err);
    if b.dialect.inline_results() {
        // Every line went to the output sink.
        b.results = Some(out);
        return;
    }
    // A batch that ran (not one that failed validation) gets an error file even when empty.
    let ran = b.status != BatchStatus::Failed;
    let always_err = ran && b.dialect.always_error_file();
    for (content, lines, suffix, slot, always) in [
        (out, out_lines, "output", &mut b.output_file_id, false),
        (err, err_lines, "error", &mut b.error_file_id, always_err),
    ] {
        if lines == 0 && !always {
            continue;
        }
        let record = fx.files.insert(FileRecord {
            id: new_id("file-"),
            provider,
            purpose: "batch_output".to_owned(),
            filename: format!("{}_{suffix}.jsonl", b.id),
            created_at,
            expires_at: b.output_expires_seconds.map(|s| created_at + s),
            content,
            seq: 0,
        });
        *slot = Some(record.id);
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    /// A simulator at speed 0 with its spool in a fresh temporary folder.
    fn sim() -> Sim {
        Sim::new(SimConfig { speed: 0.0, ..SimConfig::default() }).unwrap()
    }

    fn chat_line(custom_id: &str, pad: usize) -> String {
        serde_json::json!({
            "custom_id": custom_id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": "x".repeat(pad)}]},
        })
        .to_string()
    }

    /// Writes `text` to the spool as an uploaded batch input file.
    fn upload(sim: &mut Sim, text: &str) -> FileRecord {
        let file = sim.spool.file("test-upload");
        std::fs::write(file.path(), text).unwrap();
        let body = FileBody::whole(file, text.len() as u64);
        sim.upload_file(Provider::OpenAi, "batch".into(), "in.jsonl".into(), body, None)
    }

    fn rules() -> validate::Rules {
        validate::Rules::new(100_000, 50_000, usize::MAX)
    }

    #[test]
    fn planned_orders_are_permutations_and_never_identity() {
        let mut sim = sim();
        for n in 1..40 {
            let text: String = (0..n).map(|i| chat_line(&format!("c{i}"), 1) + "\n").collect();
            let file = upload(&mut sim, &text);
            for seed in 0..20 {
                let input =
                    BatchInput { content: file.content.clone(), seed, spool: sim.spool.clone() };
                let valid = plan_batch(&input, "/v1/chat/completions", &rules()).unwrap().unwrap();
                let order = valid.lines.order();
                let run: Vec<u64> = (0..order.len()).map(|k| order.at(k)).collect();
                let mut sorted = run.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (0..n).collect::<Vec<_>>());
                if n >= 2 {
                    assert!(run.windows(2).any(|w| w[0] > w[1]), "n={n} seed={seed}");
                }
                // Each position reads back the line it names.
                let reader = valid.lines.reader().unwrap();
                let mut buf = Vec::new();
                reader.read(run[0], &mut buf).unwrap();
                let line: Value = serde_json::from_slice(&buf).unwrap();
                assert_eq!(line["custom_id"], format!("c{}", run[0]));
            }
        }
    }

    /// Runs a batch over a multi-megabyte file and checks that the bytes stay on disk: the input,
    /// its index and the output file have their sizes there, and the state holds no line.
    #[test]
    fn batch_data_lives_on_disk_not_in_memory() {
        let mut sim = sim();
        let n = 4_000;
        let text: String = (0..n).map(|i| chat_line(&format!("c{i}"), 1_000) + "\n").collect();
        assert!(text.len() > 4_000_000);
        let file = upload(&mut sim, &text);
        let input_path = file.content.spool_file().unwrap().path().to_path_buf();
        assert_eq!(std::fs::metadata(&input_path).unwrap().len(), text.len() as u64);
        let file_id = file.id.clone();
        drop(file);

        let input = sim.batch_input(Provider::OpenAi, &file_id).unwrap();
        let verdict = plan_batch(&input, "/v1/chat/completions", &rules()).unwrap();
        drop(input);
        let new = NewBatch {
            dialect: Arc::new(TestDialect),
            endpoint: "/v1/chat/completions".into(),
            input_file_id: file_id.clone(),
            completion_window: "24h".into(),
            metadata: None,
            output_expires_seconds: None,
        };
        let id = sim.insert_batch(new, verdict).id.clone();
        // The index: 16 bytes a line, next to the input.
        let dir = sim.spool.path().to_path_buf();
        let index_files = || {
            std::fs::read_dir(&dir)
                .unwrap()
                .filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with("index-"))
                .map(|e| e.metadata().unwrap().len())
                .collect::<Vec<_>>()
        };
        assert_eq!(index_files(), vec![16 * n as u64]);

        // Half the lines run, then the rest.
        let validating = sim.config.processing.validating_seconds;
        sim.clock.advance(validating + (n / 2) as f64 / sim.config.processing.requests_per_second);
        sim.sync();
        let batch = sim.batch(Provider::OpenAi, &id).unwrap();
        assert_eq!(batch.status, BatchStatus::InProgress);
        assert!(batch.done > 0 && batch.done < n as u64, "{} lines ran", batch.done);
        let held = sim.held_bytes();
        assert!((2_000..2_400).contains(&held), "one held line a sink, about 1 KB each: {held}");
        sim.clock.advance(86_000.0);
        sim.sync();
        let batch = sim.batch(Provider::OpenAi, &id).unwrap();
        assert_eq!(batch.status, BatchStatus::Completed);
        assert!(batch.lines.is_none());
        let out_id = batch.output_file_id.clone().unwrap();
        let err_id = batch.error_file_id.clone().unwrap();
        assert_eq!(sim.held_bytes(), 0);
        assert!(index_files().is_empty(), "the index goes when the batch ends");

        for (id, sink) in [(&out_id, "output"), (&err_id, "error")] {
            let record = sim.files.get(id).unwrap().clone();
            let path = record.content.spool_file().unwrap().path().to_path_buf();
            let on_disk = std::fs::metadata(&path).unwrap().len();
            assert!(on_disk >= record.bytes(), "{sink}: {on_disk} < {}", record.bytes());
            let mut body = Vec::new();
            record.content.reader().unwrap().read_to_end(&mut body).unwrap();
            assert_eq!(body.len() as u64, record.bytes());
            let ids: BTreeSet<String> = body
                .split(|b| *b == b'\n')
                .filter(|l| !l.is_empty())
                .map(|l| serde_json::from_slice::<Value>(l).unwrap()["custom_id"].to_string())
                .collect();
            let expected = if sink == "output" { n - n / 10 } else { n / 10 };
            assert_eq!(ids.len(), expected, "{sink}");
        }
        let ledger = sim.ledger();
        assert_eq!(ledger.len(), n);
        assert_eq!(ledger[0].batch_id, id);

        // Deleting the files removes their bytes from disk.
        let out_path =
            sim.files.get(&out_id).unwrap().content.spool_file().unwrap().path().to_path_buf();
        sim.delete_file(Provider::OpenAi, &out_id).unwrap();
        sim.delete_file(Provider::OpenAi, &file_id).unwrap();
        assert!(!out_path.exists());
        assert!(!input_path.exists());
        drop(sim);
        assert!(!dir.exists(), "the spool folder goes with the simulator");
    }

    /// A dialect whose every tenth line fails (custom_id ending in 0), to fill both sinks.
    #[derive(Debug)]
    struct TestDialect;

    impl Dialect for TestDialect {
        fn provider(&self) -> Provider {
            Provider::OpenAi
        }

        fn render(&self, line: &LineResult<'_>) -> (Sink, Vec<u8>) {
            let sink = if line.custom_id.ends_with('0') { Sink::Error } else { Sink::Output };
            let body = serde_json::json!({"custom_id": line.custom_id, "pad": "y".repeat(1_050)});
            (sink, body.to_string().into_bytes())
        }
    }

    #[test]
    fn attempts_are_rebuilt_from_the_ledger_when_faults_need_them() {
        let mut sim = sim();
        let text: String = (0..5).map(|i| chat_line(&format!("c{i}"), 1) + "\n").collect();
        for _ in 0..2 {
            let file = upload(&mut sim, &text);
            let input = sim.batch_input(Provider::OpenAi, &file.id).unwrap();
            let verdict = plan_batch(&input, "/v1/chat/completions", &rules()).unwrap();
            let new = NewBatch {
                dialect: Arc::new(TestDialect),
                endpoint: "/v1/chat/completions".into(),
                input_file_id: file.id.clone(),
                completion_window: "24h".into(),
                metadata: None,
                output_expires_seconds: None,
            };
            sim.insert_batch(new, verdict);
            sim.clock.advance(1_000.0);
            sim.sync();
        }
        assert!(sim.attempts.is_none(), "no fault drawn per attempt, nothing counted");
        let mut config = sim.config.clone();
        config.line_faults.push(crate::config::LineFault {
            provider: "any".into(),
            kind: LineFaultKind::Retryable,
            rate: 0.0,
        });
        sim.set_config(config);
        let attempts = sim.attempts.as_ref().unwrap();
        assert_eq!(attempts.len(), 5);
        assert_eq!(attempts.get(&(Provider::OpenAi, "c3".to_owned())), Some(&2));
        sim.set_config(SimConfig { speed: 0.0, ..SimConfig::default() });
        assert!(sim.attempts.is_none());
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
                content: FileBody::default(),
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
