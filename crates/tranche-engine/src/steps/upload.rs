//! Writing a tranche's input file into the blob store and uploading it from there, with the
//! intent recorded first.

use tracing::info;
use tranche_core::TrancheState;
use tranche_providers::{Provider, UploadedFile};
use tranche_store::{FilePurpose, FileRecord, TrancheRecord, TrancheUpdate};

use crate::engine::{Engine, StepError};
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
        let input = self.write_input(provider, tranche.id).await?;
        lease.ensure().await?;
        let uploaded =
            provider.upload_batch_file(tranche.id, self.input_body(&input).await?).await?;
        self.uploaded(tranche, lease, &uploaded).await?;
        info!(tranche = %tranche.id, bytes = input.blob.size, "uploaded input file");
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
        self.transition(lease, update).await?;
        // The account has room again: jobs paused for a full file storage resume.
        self.store.set_jobs_paused(tranche.id, None, self.now()).await?;
        Ok(())
    }
}
