//! A tranche's input file, assembled from the byte ranges of its requests' bodies: streamed
//! straight into the upload of a file-based batch (whose length the provider is told first), or
//! written into the blob store for a batch that carries its requests inline. Bodies are copied,
//! never parsed, but in an Anthropic tranche whose requests share a system prompt long enough to
//! cache: those go out with a cache mark on it (`tranche_core::cache_marks`).

use std::collections::{HashMap, HashSet};

use bytes::Bytes;
use futures::channel::mpsc;
use futures::{SinkExt, StreamExt, TryStreamExt};
use tracing::debug;
use tranche_blob::{BlobKey, BlobRef, BlobWriter};
use tranche_core::cache_marks::{self, PromptId, SharedPrompt};
use tranche_core::codec;
use tranche_core::{CacheSharedPrompt, Endpoint, JobId, ProviderKind, TrancheId};
use tranche_providers::{Provider, UploadBody};
use tranche_store::InputBody;

use crate::engine::Engine;
use crate::error::EngineError;
use crate::layout::input_key;

impl Engine {
    /// Writes the tranche's input file into the blob store (`tranches/<id>/input.jsonl`),
    /// assembled from the byte ranges of its requests' bodies. It is rebuilt from the store
    /// every time, so a retry never sends a stale file; two engines that both write it write
    /// the same bytes, and the object is replaced whole.
    pub(crate) async fn write_input(
        &self,
        provider: &dyn Provider,
        tranche: TrancheId,
    ) -> Result<InputObject, EngineError> {
        let mut blob = self.config.blobs.writer(&input_key(tranche)?);
        let mut out = InputWriter::new(Sink::Blob(&mut blob));
        let assembled = self.assemble(provider.kind(), tranche, &mut out).await;
        let (lines, line_bytes) = (out.lines, out.line_bytes);
        if let Err(e) = assembled {
            let _ = blob.abort().await;
            return Err(e);
        }
        let blob = blob.finish().await?;
        self.store.record_blob(&self.record_of(&blob)).await?;
        Ok(InputObject { blob, lines, line_bytes })
    }

    /// The size in bytes of the input file of a tranche whose lines go out unmarked (an
    /// OpenAI or Azure one), measured line by line from the store: no body is read. (What
    /// submit recorded, `TrancheStore::tranche_input_bytes`, is the same sum without a row
    /// read; this is for lines it measured otherwise.)
    pub(crate) async fn input_len(
        &self,
        kind: ProviderKind,
        tranche: TrancheId,
    ) -> Result<u64, EngineError> {
        let mut lines = self.store.tranche_input(tranche);
        let mut len = 0;
        while let Some(line) = lines.try_next().await? {
            let body_len = match &line.body {
                InputBody::Text(text) => text.len() as u64,
                InputBody::InObject { len, .. } => *len,
            };
            len += codec::input_line_len(kind, &line.wire_id, line.endpoint, body_len);
        }
        Ok(len)
    }

    /// Assembles the input file of a tranche whose lines go out unmarked into `upload`, the
    /// body of an upload in progress that was told it is `len` bytes. The provider never holds
    /// all `len` bytes of a file that comes out at another length: the piece that completes
    /// them is sent once nothing more came, and a failure ends the body in an error.
    pub(crate) async fn send_input(
        &self,
        kind: ProviderKind,
        tranche: TrancheId,
        upload: mpsc::Sender<std::io::Result<Bytes>>,
        len: u64,
    ) -> Result<Sent, EngineError> {
        let mut upload = Upload { tx: upload, left: len, last: None, over: false, ended: false };
        let walked = {
            let mut out = InputWriter::new(Sink::Upload(&mut upload));
            let mut pass =
                Pass::Write { kind, out: &mut out, marks: None, buf: Vec::new(), marked: 0 };
            self.walk(tranche, &mut pass).await
        };
        let (failure, other_length) = match walked {
            Err(_) if upload.ended => return Ok(Sent::Done),
            Ok(()) if upload.left == 0 => {
                if let Some(last) = upload.last.take() {
                    // An upload that stopped reading first has its own outcome.
                    let _ = upload.tx.send(Ok(last)).await;
                }
                return Ok(Sent::Done);
            }
            Ok(()) => {
                let assembled = len - upload.left;
                let message = format!(
                    "the input file of {tranche} came to {assembled} bytes, not the {len} measured"
                );
                (EngineError::Corrupt(message), true)
            }
            Err(e) => (e, upload.over),
        };
        let _ = upload.tx.send(Err(std::io::Error::other(failure.to_string()))).await;
        if other_length { Ok(Sent::OtherLength(failure)) } else { Err(failure) }
    }

    /// Writes the tranche's lines into `out`. An Anthropic tranche whose jobs ask for it is
    /// read twice: once to find the system prompts its requests share, once to write them
    /// marked (see [`Engine::shared_prompts`]); every other line is copied byte for byte.
    async fn assemble(
        &self,
        kind: ProviderKind,
        tranche: TrancheId,
        out: &mut InputWriter<'_>,
    ) -> Result<(), EngineError> {
        let marks = match kind {
            ProviderKind::Anthropic => self.shared_prompts(tranche).await?,
            ProviderKind::Openai | ProviderKind::Azure => None,
        };
        let mut pass = Pass::Write { kind, out, marks: marks.as_ref(), buf: Vec::new(), marked: 0 };
        self.walk(tranche, &mut pass).await?;
        if let Pass::Write { marked: marked @ 1.., .. } = pass {
            debug!(%tranche, requests = marked, "marked shared system prompts for caching");
        }
        Ok(())
    }

    /// The system prompts of an Anthropic tranche that go out with a cache mark: those of
    /// requests of jobs with `cache_shared_prompt = auto` that at least two such requests share
    /// and that reach the model's minimum cacheable length. `None`, and no body read, when no
    /// job of the tranche asks; `None` after reading them when there is nothing to mark. What
    /// it keeps is one entry per distinct prompt, whatever the number of requests; each
    /// shared prompt's tokens are counted once.
    async fn shared_prompts(&self, tranche: TrancheId) -> Result<Option<Marks>, EngineError> {
        let mut auto = HashSet::new();
        for job in self.store.jobs_of_tranche(tranche).await? {
            let Some(record) = self.store.job(job).await? else { continue };
            if record.settings.cache_shared_prompt == CacheSharedPrompt::Auto {
                auto.insert(job);
            }
        }
        if auto.is_empty() {
            return Ok(None);
        }
        let mut counts = PromptCounts { auto, seen: HashMap::new() };
        self.walk(tranche, &mut Pass::Count(&mut counts)).await?;
        let marked: HashSet<PromptId> =
            counts.seen.into_iter().filter_map(|(id, seen)| seen.marked.then_some(id)).collect();
        Ok((!marked.is_empty()).then_some(Marks { auto: counts.auto, marked }))
    }

    /// Runs `pass` over the tranche's input lines in order, each with its body. Bodies
    /// resting in the blob store come in request order, one after another in their job's
    /// object: they are read in runs of one range each.
    async fn walk(&self, tranche: TrancheId, pass: &mut Pass<'_, '_>) -> Result<(), EngineError> {
        let mut lines = self.store.tranche_input(tranche);
        let mut run = BodyRun::default();
        while let Some(line) = lines.try_next().await? {
            if !pass.wants(line.job_id) {
                continue;
            }
            match line.body {
                InputBody::Text(text) => {
                    self.flush_run(&mut run, pass).await?;
                    pass.line(&line.wire_id, line.endpoint, line.job_id, &text);
                    pass.flush(1).await?;
                }
                InputBody::InObject { object, offset, len } => {
                    if !run.extends(&object, offset, len) {
                        self.flush_run(&mut run, pass).await?;
                        run.start(object, offset);
                    }
                    run.push(RunLine {
                        wire_id: line.wire_id,
                        endpoint: line.endpoint,
                        job: line.job_id,
                        offset,
                        len,
                    });
                }
            }
        }
        self.flush_run(&mut run, pass).await
    }

    /// The tranche's input file, streamed from the blob store.
    pub(crate) async fn input_body(&self, input: &InputObject) -> Result<UploadBody, EngineError> {
        let stream = self.config.blobs.stream(&input.blob.key).await?;
        Ok(UploadBody {
            stream: stream.map_err(std::io::Error::other).boxed(),
            len: input.blob.size,
        })
    }

    /// Removes the tranche's input file from the blob store (its batch has ended, or will
    /// never be made).
    pub(crate) async fn remove_input(&self, tranche: TrancheId) -> Result<(), EngineError> {
        let key = input_key(tranche)?;
        self.config.blobs.delete(&key).await?;
        Ok(self.store.forget_blobs(&[key.to_string()]).await?)
    }
}

/// A tranche's input file as written: the object, its lines and their bytes without line ends
/// (an inline create body's length follows from them).
#[derive(Debug)]
pub(crate) struct InputObject {
    pub(crate) blob: BlobRef,
    pub(crate) lines: u64,
    pub(crate) line_bytes: u64,
}

/// Where an input file's bytes go as it is assembled.
enum Sink<'s> {
    /// Into an object of the blob store.
    Blob(&'s mut BlobWriter),
    /// Straight into the body of an upload in progress.
    Upload(&'s mut Upload),
}

/// How the assembly of an input file into an upload ended, when it did not fail.
#[derive(Debug)]
pub(crate) enum Sent {
    /// Every measured byte went out, or the upload stopped reading first: the upload's own
    /// outcome is the step's.
    Done,
    /// The file came out at another length than measured (this error says which): the
    /// upload's body ended in an error before the provider had all it was told of.
    OtherLength(EngineError),
}

/// The body of an upload in progress, which was told that `left` more bytes come.
struct Upload {
    tx: mpsc::Sender<std::io::Result<Bytes>>,
    left: u64,
    /// The piece that brought `left` to 0, held back until no more comes.
    last: Option<Bytes>,
    /// More bytes came than measured.
    over: bool,
    /// The upload stopped reading.
    ended: bool,
}

/// An input file being assembled, counting its lines.
struct InputWriter<'s> {
    sink: Sink<'s>,
    lines: u64,
    line_bytes: u64,
}

impl<'s> InputWriter<'s> {
    fn new(sink: Sink<'s>) -> Self {
        Self { sink, lines: 0, line_bytes: 0 }
    }

    /// Appends `lines` whole lines, each ended by `\n`.
    async fn write(&mut self, bytes: Vec<u8>, lines: u64) -> Result<(), EngineError> {
        self.lines += lines;
        self.line_bytes += bytes.len() as u64 - lines;
        match &mut self.sink {
            Sink::Blob(blob) => Ok(blob.write(&bytes).await?),
            Sink::Upload(upload) => {
                let len = bytes.len() as u64;
                if len == 0 {
                    return Ok(());
                }
                if len > upload.left || upload.last.is_some() {
                    upload.over = true;
                    return Err(EngineError::Corrupt(format!(
                        "an input file came to more bytes than measured ({len} more, {} left)",
                        upload.left
                    )));
                }
                upload.left -= len;
                if upload.left == 0 {
                    upload.last = Some(Bytes::from(bytes));
                    return Ok(());
                }
                if upload.tx.send(Ok(Bytes::from(bytes))).await.is_err() {
                    upload.ended = true;
                    return Err(EngineError::Corrupt("the upload stopped reading".to_owned()));
                }
                Ok(())
            }
        }
    }
}

/// Input lines whose bodies lie close together in one blob-store object: read as one range.
#[derive(Debug, Default)]
struct BodyRun {
    object: String,
    start: u64,
    end: u64,
    lines: Vec<RunLine>,
}

/// One line of a [`BodyRun`]: its body is `offset..offset + len` of the run's object.
#[derive(Debug)]
struct RunLine {
    wire_id: String,
    endpoint: Endpoint,
    job: JobId,
    offset: u64,
    len: u64,
}

impl BodyRun {
    /// The longest range read at once.
    const MAX_BYTES: u64 = 1 << 20;
    /// The widest gap between two bodies still read in one range (another job's bodies, or a
    /// request that is not in this tranche).
    const MAX_GAP: u64 = 64 << 10;

    fn extends(&self, object: &str, offset: u64, len: u64) -> bool {
        !self.lines.is_empty()
            && self.object == object
            && offset >= self.end
            && offset - self.end <= Self::MAX_GAP
            && offset + len - self.start <= Self::MAX_BYTES
    }

    fn start(&mut self, object: String, offset: u64) {
        self.object = object;
        self.start = offset;
        self.end = offset;
    }

    fn push(&mut self, line: RunLine) {
        self.end = line.offset + line.len;
        self.lines.push(line);
    }
}

impl Engine {
    /// Passes the lines of `run` to `pass`, reading their bodies in one range, and empties it.
    async fn flush_run(
        &self,
        run: &mut BodyRun,
        pass: &mut Pass<'_, '_>,
    ) -> Result<(), EngineError> {
        if run.lines.is_empty() {
            return Ok(());
        }
        let key = BlobKey::new(run.object.clone())?;
        let bytes = self.config.blobs.get_range(&key, run.start..run.end).await?;
        let mut lines = 0;
        for line in run.lines.drain(..) {
            let (offset, len) = (line.offset, line.len);
            let at = usize::try_from(offset - run.start).unwrap_or(usize::MAX);
            let body = bytes
                .get(at..at.saturating_add(usize::try_from(len).unwrap_or(usize::MAX)))
                .and_then(|b| std::str::from_utf8(b).ok())
                .ok_or_else(|| {
                    EngineError::Store(tranche_store::StoreError::Corrupt(format!(
                        "the body of {} is not at {offset}+{len} of `{key}`",
                        line.wire_id
                    )))
                })?;
            pass.line(&line.wire_id, line.endpoint, line.job, body);
            lines += 1;
            if pass.buffered() >= Pass::FLUSH_BYTES {
                pass.flush(lines).await?;
                lines = 0;
            }
        }
        pass.flush(lines).await
    }
}

/// What a walk over a tranche's lines does with each.
enum Pass<'a, 'w> {
    /// Counts the requests of each system prompt (of jobs that ask for marks).
    Count(&'a mut PromptCounts),
    /// Writes each line into the file, marking the shared prompts of `marks`.
    Write {
        kind: ProviderKind,
        out: &'a mut InputWriter<'w>,
        marks: Option<&'a Marks>,
        /// The lines not yet written.
        buf: Vec<u8>,
        /// How many lines went out marked.
        marked: u64,
    },
}

impl Pass<'_, '_> {
    /// Lines written out once this many bytes of them wait: a run's lines are not all held
    /// twice (in the run and here) before they go.
    const FLUSH_BYTES: usize = 256 << 10;

    /// How many bytes of lines wait to be written.
    fn buffered(&self) -> usize {
        match self {
            Pass::Count(_) => 0,
            Pass::Write { buf, .. } => buf.len(),
        }
    }

    /// Whether the pass reads the bodies of `job`'s lines (counting skips jobs that do not
    /// ask for marks, so their bodies are not even read).
    fn wants(&self, job: JobId) -> bool {
        match self {
            Pass::Count(counts) => counts.auto.contains(&job),
            Pass::Write { .. } => true,
        }
    }

    fn line(&mut self, wire_id: &str, endpoint: Endpoint, job: JobId, body: &str) {
        match self {
            Pass::Count(counts) => counts.observe(body),
            Pass::Write { kind, marks, buf, marked, .. } => {
                let with_mark = marks.and_then(|m| m.apply(job, body));
                *marked += u64::from(with_mark.is_some());
                let body = with_mark.as_deref().unwrap_or(body);
                codec::write_input_line_json(*kind, buf, wire_id, endpoint, body);
            }
        }
    }

    /// Writes the `lines` whole lines passed since the last flush.
    async fn flush(&mut self, lines: u64) -> Result<(), EngineError> {
        if let Pass::Write { out, buf, .. } = self
            && !buf.is_empty()
        {
            let next = Vec::with_capacity(Self::FLUSH_BYTES + (64 << 10));
            out.write(std::mem::replace(buf, next), lines).await?;
        }
        Ok(())
    }
}

/// The first pass's tally: how many requests carry each system prompt.
struct PromptCounts {
    /// The tranche's jobs with `cache_shared_prompt = auto`.
    auto: HashSet<JobId>,
    seen: HashMap<PromptId, Seen>,
}

#[derive(Default)]
struct Seen {
    requests: u64,
    /// Shared and long enough: decided when a second request shows it.
    marked: bool,
}

impl PromptCounts {
    fn observe(&mut self, body: &str) {
        let Some(prompt) = SharedPrompt::of(body) else { return };
        let seen = self.seen.entry(prompt.id()).or_default();
        seen.requests += 1;
        if seen.requests == 2 {
            seen.marked = prompt.long_enough();
        }
    }
}

/// What the second pass marks: the requests of `auto` jobs whose prompt is in `marked`.
struct Marks {
    auto: HashSet<JobId>,
    marked: HashSet<PromptId>,
}

impl Marks {
    /// `body` marked, when it is to be.
    fn apply(&self, job: JobId, body: &str) -> Option<String> {
        if !self.auto.contains(&job) {
            return None;
        }
        let prompt = SharedPrompt::of(body)?;
        if !self.marked.contains(&prompt.id()) {
            return None;
        }
        cache_marks::marked_body(body)
    }
}
