//! Uploading a tranche's input file as it is assembled, with the intent recorded first.

use futures::StreamExt;
use futures::channel::mpsc;
use tracing::{info, warn};
use tranche_core::TrancheState;
use tranche_providers::{Provider, UploadBody, UploadedFile};
use tranche_store::{FilePurpose, FileRecord, TrancheRecord, TrancheUpdate};

use crate::engine::{Engine, StepError};
use crate::lease::Lease;
use crate::steps::input::Sent;

impl Engine {
    pub(crate) async fn upload(
        &self,
        provider: &dyn Provider,
        tranche: &TrancheRecord,
        lease: &Lease,
    ) -> Result<(), StepError> {
        let now = self.now();
        self.transition(lease, TrancheUpdate::to(TrancheState::Uploading, now)).await?;
        // Rebuilt from the store every time, so a retry never sends a stale file. It goes to
        // the provider as it is assembled, never written down first: the provider is told its
        // length, and a file that comes out otherwise fails to send. The length is what submit
        // measured of each line (no row read); should the file come out otherwise (requests
        // measured by an older submit), it is measured line by line and sent again.
        let kind = provider.kind();
        let mut len = self.store.tranche_input_bytes(tranche.id).await?;
        let mut measured_by_line = false;
        let file = loop {
            lease.ensure().await?;
            let (tx, rx) = mpsc::channel(UPLOAD_CHUNKS_IN_FLIGHT);
            let body = UploadBody { stream: rx.boxed(), len };
            let (sent, uploaded) = futures::join!(
                self.send_input(kind, tranche.id, tx, len),
                provider.upload_batch_file(tranche.id, body),
            );
            let mismatch = match sent? {
                Sent::Done => break uploaded?,
                Sent::OtherLength(mismatch) => mismatch,
            };
            if let Ok(file) = uploaded {
                // Not expected (the provider never had all it was told of), never kept.
                let _ = provider.delete_file(&file.id).await;
            }
            if measured_by_line {
                return Err(mismatch.into());
            }
            warn!(tranche = %tranche.id, error = %mismatch, "measuring the input file line by line");
            len = self.input_len(kind, tranche.id).await?;
            measured_by_line = true;
        };
        self.uploaded(tranche, lease, &file).await?;
        info!(tranche = %tranche.id, bytes = len, "uploaded input file");
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

/// How many pieces of an input file (of about 256 KiB each) wait for the upload to take them.
const UPLOAD_CHUNKS_IN_FLIGHT: usize = 2;
