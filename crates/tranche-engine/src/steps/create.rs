//! Creating a tranche's batch at the provider, with the intent recorded first.

use tracing::info;
use tranche_core::TrancheState;
use tranche_providers::{BatchInput, CreateBatch, FileId, InlineInput, InputTransport, Provider};
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
        let batch = provider
            .create_batch(CreateBatch { tranche_id: tranche.id, input, endpoint: tranche.endpoint })
            .await?;
        let now = self.now();
        let mut update = TrancheUpdate::to(TrancheState::Submitted, now);
        update.batch_id = Some(batch.id.as_str().to_owned());
        update.batch_status = Some(batch.status.as_str().to_owned());
        update.not_before = now + self.poll_delay(tranche.provider);
        self.transition(lease, update).await?;
        info!(tranche = %tranche.id, batch = %batch.id, "created batch");
        Ok(())
    }
}
