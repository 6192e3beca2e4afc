//! A tranche's input file: assembled into the blob store from the byte ranges of its requests'
//! bodies (copied, never parsed), streamed to the provider from there, removed once the batch
//! has ended.

use futures::{StreamExt, TryStreamExt};
use tranche_blob::{BlobKey, BlobRef, BlobWriter};
use tranche_core::codec;
use tranche_core::{Endpoint, ProviderKind, TrancheId};
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
        let mut out = InputWriter {
            blob: self.config.blobs.writer(&input_key(tranche)?),
            lines: 0,
            line_bytes: 0,
        };
        match self.assemble(provider.kind(), tranche, &mut out).await {
            Ok(()) => {}
            Err(e) => {
                let _ = out.blob.abort().await;
                return Err(e);
            }
        }
        let blob = out.blob.finish().await?;
        self.store.record_blob(&self.record_of(&blob)).await?;
        Ok(InputObject { blob, lines: out.lines, line_bytes: out.line_bytes })
    }

    async fn assemble(
        &self,
        kind: ProviderKind,
        tranche: TrancheId,
        out: &mut InputWriter,
    ) -> Result<(), EngineError> {
        let mut lines = self.store.tranche_input(tranche);
        let mut buf = Vec::new();
        // Bodies resting in the blob store come in request order, one after another in their
        // job's object: they are read in runs of one range each and copied, never parsed.
        let mut run = BodyRun::default();
        while let Some(line) = lines.try_next().await? {
            match line.body {
                InputBody::Text(text) => {
                    self.flush_run(&mut run, kind, out).await?;
                    buf.clear();
                    codec::write_input_line_json(
                        kind,
                        &mut buf,
                        &line.wire_id,
                        line.endpoint,
                        &text,
                    );
                    out.write(&buf, 1).await?;
                }
                InputBody::InObject { object, offset, len } => {
                    if !run.extends(&object, offset, len) {
                        self.flush_run(&mut run, kind, out).await?;
                        run.start(object, offset);
                    }
                    run.push(line.wire_id, line.endpoint, offset, len);
                }
            }
        }
        self.flush_run(&mut run, kind, out).await
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

/// The object an input file is written into, counting its lines.
struct InputWriter {
    blob: BlobWriter,
    lines: u64,
    line_bytes: u64,
}

impl InputWriter {
    /// Appends `lines` whole lines, each ended by `\n`.
    async fn write(&mut self, bytes: &[u8], lines: u64) -> Result<(), EngineError> {
        self.lines += lines;
        self.line_bytes += bytes.len() as u64 - lines;
        Ok(self.blob.write(bytes).await?)
    }
}

/// Input lines whose bodies lie close together in one blob-store object: read as one range.
#[derive(Debug, Default)]
struct BodyRun {
    object: String,
    start: u64,
    end: u64,
    lines: Vec<(String, Endpoint, u64, u64)>,
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

    fn push(&mut self, wire_id: String, endpoint: Endpoint, offset: u64, len: u64) {
        self.end = offset + len;
        self.lines.push((wire_id, endpoint, offset, len));
    }
}

impl Engine {
    /// Writes the lines of `run`, reading their bodies in one range, and empties it.
    async fn flush_run(
        &self,
        run: &mut BodyRun,
        kind: ProviderKind,
        out: &mut InputWriter,
    ) -> Result<(), EngineError> {
        if run.lines.is_empty() {
            return Ok(());
        }
        let key = BlobKey::new(run.object.clone())?;
        let bytes = self.config.blobs.get_range(&key, run.start..run.end).await?;
        let mut buf = Vec::new();
        let lines = run.lines.len() as u64;
        for (wire_id, endpoint, offset, len) in run.lines.drain(..) {
            let at = usize::try_from(offset - run.start).unwrap_or(usize::MAX);
            let body = bytes
                .get(at..at.saturating_add(usize::try_from(len).unwrap_or(usize::MAX)))
                .and_then(|b| std::str::from_utf8(b).ok())
                .ok_or_else(|| {
                    EngineError::Store(tranche_store::StoreError::Corrupt(format!(
                        "the body of {wire_id} is not at {offset}+{len} of `{key}`"
                    )))
                })?;
            codec::write_input_line_json(kind, &mut buf, &wire_id, endpoint, body);
        }
        out.write(&buf, lines).await
    }
}
