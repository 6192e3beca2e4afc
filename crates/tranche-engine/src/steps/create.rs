//! Creating a tranche's batch at the provider, with the intent recorded first.

use tracing::{info, warn};
use tranche_core::TrancheState;
use tranche_providers::{
    BatchInput, CreateBatch, FileId, InlineInput, InputTransport, Provider, UpstreamError,
};
use tranche_store::{TrancheRecord, TrancheUpdate};

use crate::engine::{Engine, StepError};
use crate::lease::Lease;

impl Engine {
    pub(crate) async fn create(
        &self,
        provider: &dyn Provider,
        tranche: &TrancheRecord,
        lease: &Lease,
    ) -> Result<(), StepError> {
        let file_id;
        let input = match provider.transport() {
            InputTransport::UploadFile => {
                let Some(input) = tranche.input_file_id.as_deref() else {
                    // An upload that was never recorded: upload again.
                    return self.upload(provider, tranche, lease).await;
                };
                file_id = FileId::new(input);
                BatchInput::File(&file_id)
            }
            InputTransport::Inline => {
                let input = self.write_input(provider, tranche.id).await?;
                BatchInput::Inline(InlineInput {
                    lines: self.input_body(&input).await?,
                    count: input.lines,
                    line_bytes: input.line_bytes,
                })
            }
        };
        let now = self.now();
        self.transition(lease, TrancheUpdate::to(TrancheState::Creating, now)).await?;
        lease.ensure().await?;
        let created = provider
            .create_batch(CreateBatch { tranche_id: tranche.id, input, endpoint: tranche.endpoint })
            .await;
        let batch = match created {
            Ok(batch) => batch,
            Err(e) if !e.retryable() && e.param.as_deref() == Some("input_file_id") => {
                return self.input_file_refused(provider, tranche, lease, e).await;
            }
            Err(e) => return Err(e.into()),
        };
        let now = self.now();
        let mut update = TrancheUpdate::to(TrancheState::Submitted, now);
        update.batch_id = Some(batch.id.as_str().to_owned());
        update.batch_status = Some(batch.status.as_str().to_owned());
        update.not_before = now + self.poll_delay(tranche.provider);
        self.transition(lease, update).await?;
        info!(tranche = %tranche.id, batch = %batch.id, "created batch");
        Ok(())
    }

    /// A create refused for its input file: when the provider no longer has the file (it
    /// expired, or someone's cleanup deleted it) it is uploaded again from the tranche's bytes,
    /// at most [`REUPLOADS`] times; otherwise the refusal stands.
    async fn input_file_refused(
        &self,
        provider: &dyn Provider,
        tranche: &TrancheRecord,
        lease: &Lease,
        e: UpstreamError,
    ) -> Result<(), StepError> {
        let (Some(old), InputTransport::UploadFile) =
            (&tranche.input_file_id, provider.transport())
        else {
            return Err(e.into());
        };
        let uploads = self.store.tranche_uploads(tranche.id).await?;
        if uploads > REUPLOADS || provider.find_batch_file(tranche.id).await?.is_some() {
            return Err(e.into());
        }
        warn!(tranche = %tranche.id, file = %old, error = %e, "the provider no longer has the input file; uploading it again");
        self.store.mark_file_deleted(tranche.provider, old, self.now()).await?;
        self.upload(provider, tranche, lease).await
    }
}

/// How many times a tranche's input file is uploaded again after the provider lost it.
const REUPLOADS: u64 = 3;
