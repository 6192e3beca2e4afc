//! Writing a tranche's input file and uploading it, with the intent recorded first.

use std::path::{Path, PathBuf};

use futures::TryStreamExt;
use tokio::io::{AsyncWriteExt, BufWriter};
use tracing::{debug, info};
use tranche_blob::BlobKey;
use tranche_core::codec;
use tranche_core::{Endpoint, ProviderKind, TrancheId, TrancheState};
use tranche_providers::{Provider, ProviderFiles, UploadedFile};
use tranche_store::{FilePurpose, FileRecord, InputBody, TrancheRecord, TrancheUpdate};

use crate::engine::{Engine, StepError};
use crate::error::EngineError;
use crate::lease::Lease;

impl Engine {
    pub(crate) async fn upload(
        &self,
        provider: &dyn Provider,
        tranche: &TrancheRecord,
        lease: &Lease,
    ) -> Result<(), StepError> {
        let now = self.now();
        self.transition(lease, TrancheUpdate::to(TrancheState::Uploading, now)).await?;
        let path = self.input_path(tranche.id, lease);
        self.write_input(provider, tranche.id, &path).await?;
        lease.ensure().await?;
        let uploaded = provider.upload_path(tranche.id, &path).await?;
        self.uploaded(tranche, lease, &uploaded).await?;
        if let Err(e) = tokio::fs::remove_file(&path).await {
            debug!(path = %path.display(), error = %e, "could not remove the uploaded input file");
        }
        info!(tranche = %tranche.id, "uploaded input file");
        Ok(())
    }

    /// Records the tranche's input file at the provider (uploaded now, or found after a
    /// restart) and moves the tranche to `uploaded`.
    pub(crate) async fn uploaded(
        &self,
        tranche: &TrancheRecord,
        lease: &Lease,
        file: &UploadedFile,
    ) -> Result<(), StepError> {
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
        let mut update = TrancheUpdate::to(TrancheState::Uploaded, self.now());
        update.input_file_id = Some(file.id.as_str().to_owned());
        Ok(self.transition(lease, update).await?)
    }

    /// Where a step writes a tranche's input file: named by the step's lease, so that two
    /// engines never write one path.
    pub(crate) fn input_path(&self, tranche: TrancheId, lease: &Lease) -> PathBuf {
        self.config.outbox_dir.join(format!("tranche-{tranche}.{}.jsonl", lease.token()))
    }

    pub(crate) async fn write_input(
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
        let kind = provider.kind();
        let mut buf = Vec::new();
        // Bodies resting in the blob store come in request order, one after another in their
        // job's object: they are read in runs of one range each and copied, never parsed.
        let mut run = BodyRun::default();
        while let Some(line) = lines.try_next().await? {
            match line.body {
                InputBody::Text(text) => {
                    self.flush_run(&mut run, kind, &mut out, path).await?;
                    buf.clear();
                    codec::write_input_line_json(
                        kind,
                        &mut buf,
                        &line.wire_id,
                        line.endpoint,
                        &text,
                    );
                    out.write_all(&buf).await.map_err(EngineError::io("writing", path))?;
                }
                InputBody::InObject { object, offset, len } => {
                    if !run.extends(&object, offset, len) {
                        self.flush_run(&mut run, kind, &mut out, path).await?;
                        run.start(object, offset);
                    }
                    run.push(line.wire_id, line.endpoint, offset, len);
                }
            }
        }
        self.flush_run(&mut run, kind, &mut out, path).await?;
        out.flush().await.map_err(EngineError::io("writing", path))?;
        out.into_inner().sync_all().await.map_err(EngineError::io("syncing", path))?;
        Ok(())
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
        out: &mut BufWriter<tokio::fs::File>,
        path: &Path,
    ) -> Result<(), EngineError> {
        if run.lines.is_empty() {
            return Ok(());
        }
        let key = BlobKey::new(run.object.clone())?;
        let bytes = self.config.blobs.get_range(&key, run.start..run.end).await?;
        let mut buf = Vec::new();
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
        out.write_all(&buf).await.map_err(EngineError::io("writing", path))
    }
}
