//! Polling a submitted batch until it ends, then recording its result files.

use tracing::{debug, info};
use tranche_core::TrancheState;
use tranche_providers::{BatchId, FileId, Provider};
use tranche_store::{FilePurpose, FileRecord, TrancheRecord, TrancheUpdate};

use crate::engine::{Engine, StepError};
use crate::error::EngineError;
use crate::lease::Lease;

impl Engine {
    pub(crate) async fn poll(
        &self,
        provider: &dyn Provider,
        tranche: &TrancheRecord,
        lease: &Lease,
    ) -> Result<(), StepError> {
        let Some(batch_id) = tranche.batch_id.as_deref() else {
            return Err(StepError::from(EngineError::Store(tranche_store::StoreError::Corrupt(
                format!("tranche {} is submitted but has no batch id", tranche.id),
            ))));
        };
        let batch = provider.retrieve_batch(&BatchId::new(batch_id)).await?;
        let now = self.now();
        if !batch.status.is_terminal() {
            let mut update = TrancheUpdate::to(TrancheState::Submitted, now);
            update.batch_status = Some(batch.status.as_str().to_owned());
            update.not_before = now + self.poll_delay(tranche.provider);
            self.transition(lease, update).await?;
            debug!(tranche = %tranche.id, status = %batch.status, "batch still running");
            return Ok(());
        }
        for (file, purpose) in [
            (&batch.output_file_id, FilePurpose::BatchOutput),
            (&batch.error_file_id, FilePurpose::BatchError),
        ] {
            if let Some(file) = file {
                self.store
                    .record_file(&FileRecord {
                        provider: tranche.provider,
                        file_id: file.as_str().to_owned(),
                        purpose,
                        tranche_id: tranche.id,
                        filename: None,
                        bytes: None,
                        expires_at: None,
                        created_at: now,
                    })
                    .await?;
            }
        }
        let mut update = TrancheUpdate::to(TrancheState::Collecting, now);
        update.batch_status = Some(batch.status.as_str().to_owned());
        update.output_file_id = batch.output_file_id.map(FileId::into_string);
        update.error_file_id = batch.error_file_id.map(FileId::into_string);
        update.results_url = batch.results_url;
        if !batch.errors.is_empty() {
            update.batch_errors = serde_json::to_value(&batch.errors).ok();
        }
        self.transition(lease, update).await?;
        info!(tranche = %tranche.id, status = %batch.status, "batch ended");
        Ok(())
    }
}
