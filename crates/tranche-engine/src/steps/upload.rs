//! Writing a tranche's input file and uploading it, with the intent recorded first.

use std::path::{Path, PathBuf};

use futures::TryStreamExt;
use serde_json::value::RawValue;
use tokio::io::{AsyncWriteExt, BufWriter};
use tracing::{debug, info};
use tranche_core::codec;
use tranche_core::{TrancheId, TrancheState};
use tranche_providers::{Provider, ProviderFiles, UploadedFile};
use tranche_store::{FilePurpose, FileRecord, TrancheRecord, TrancheUpdate};

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
}
