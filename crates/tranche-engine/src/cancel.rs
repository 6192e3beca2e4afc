//! Cancelling a job: its waiting requests at once, its own batches at the provider, its share
//! of batches it shares with other jobs detached.

use tracing::info;
use tranche_core::{JobId, TrancheState};
use tranche_providers::{BatchId, InputTransport, Provider};
use tranche_store::{AttemptOutcome, TrancheRecord, TrancheUpdate};

use crate::engine::{Engine, StepError};
use crate::error::EngineError;
use crate::lease::Lease;
use crate::policy::Failure;

impl Engine {
    /// Carries out a cancel the user asked for. Returns true when the tranche needs no other
    /// step this round.
    pub(crate) async fn cancel_step(
        &self,
        provider: &dyn Provider,
        tranche: &TrancheRecord,
        lease: &Lease,
    ) -> Result<bool, StepError> {
        let now = self.now();
        match tranche.state {
            // A create whose outcome is unknown may have made a batch: it is adopted (and
            // cancelled at the provider next round) before anything ends here.
            TrancheState::Creating if self.adopt_batch(provider, tranche, lease).await? => Ok(true),
            // Likewise an upload never recorded: the file is recorded, so cleaning deletes it.
            TrancheState::Uploading if provider.transport() == InputTransport::UploadFile => {
                if let Some(file) = provider.find_batch_file(tranche.id).await? {
                    self.uploaded(tranche, lease, &file).await?;
                }
                self.cancel_unsent(tranche, lease, now).await
            }
            TrancheState::Planned
            | TrancheState::Uploading
            | TrancheState::Uploaded
            | TrancheState::Creating => self.cancel_unsent(tranche, lease, now).await,
            TrancheState::Submitted => {
                let sent =
                    matches!(tranche.batch_status.as_deref(), Some("cancelling" | "cancelled"));
                if let (Some(batch_id), false) = (tranche.batch_id.as_deref(), sent) {
                    lease.ensure().await?;
                    let batch = provider.cancel_batch(&BatchId::new(batch_id)).await?;
                    let mut update = TrancheUpdate::to(TrancheState::Submitted, now);
                    update.batch_status = Some(batch.status.as_str().to_owned());
                    self.transition(lease, update).await?;
                    info!(tranche = %tranche.id, batch = %batch_id, "asked the provider to cancel the batch");
                    return Ok(true);
                }
                Ok(false)
            }
            _ => Ok(false),
        }
    }

    /// Ends a tranche's requests as cancelled before any batch of them exists; cleaning then
    /// deletes any input file.
    async fn cancel_unsent(
        &self,
        tranche: &TrancheRecord,
        lease: &Lease,
        now: i64,
    ) -> Result<bool, StepError> {
        let error = serde_json::json!({
            "provider": tranche.provider, "status": null, "error_type": null,
            "code": "job_cancelled", "message": "the job was cancelled before this request was sent",
            "param": null, "request_id": null, "retryable": false,
        })
        .to_string();
        let mut writer = self.store.begin_ingest(tranche.id, lease.held()).await?;
        for (wire_id, info) in writer.unanswered().await? {
            let update = self.failure_update(
                info,
                Failure::UserCancel,
                AttemptOutcome::Cancelled,
                None,
                &error,
                now,
            );
            writer.record(&wire_id, &update).await?;
        }
        self.commit(lease, writer, TrancheState::Cleaning, now).await?;
        info!(tranche = %tranche.id, "cancelled before submission");
        Ok(true)
    }

    /// Cancels a job: its waiting requests at once, the batches holding only its requests at
    /// the provider, and its share of batches it shares with other jobs. Returns how many
    /// requests were cancelled at once.
    pub async fn cancel_job(&self, job: JobId) -> Result<u64, EngineError> {
        let now = self.now();
        let mut cancelled = self.store.cancel_job(job, now).await?;
        for (tranche, exclusive) in self.store.job_live_tranches(job).await? {
            if exclusive {
                self.store.request_tranche_cancel(tranche.id, now).await?;
            } else {
                cancelled += self.store.detach_job(job, tranche.id, now).await?;
            }
        }
        Ok(cancelled)
    }
}
