//! Creating a tranche's batch at the provider, with the intent recorded first.

use tracing::{debug, info};
use tranche_core::TrancheState;
use tranche_providers::{BatchInput, CreateBatch, FileId, InlineInput, InputTransport, Provider};
use tranche_store::{TrancheRecord, TrancheUpdate};

use crate::engine::{Engine, StepError};
use crate::error::EngineError;
use crate::lease::Lease;

impl Engine {
    pub(crate) async fn create(
        &self,
        provider: &dyn Provider,
        tranche: &TrancheRecord,
        lease: &Lease,
    ) -> Result<(), StepError> {
        let inline_path = self.input_path(tranche.id, lease);
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
                // Rebuilt from the store every time, so a retry never sends a stale file.
                self.write_input(provider, tranche.id, &inline_path).await?;
                let lines = InlineInput::from_file(&inline_path)
                    .await
                    .map_err(EngineError::io("reading", &inline_path))?;
                BatchInput::Inline(lines)
            }
        };
        let now = self.now();
        self.transition(lease, TrancheUpdate::to(TrancheState::Creating, now)).await?;
        lease.ensure().await?;
        let batch = provider
            .create_batch(CreateBatch { tranche_id: tranche.id, input, endpoint: tranche.endpoint })
            .await?;
        if provider.transport() == InputTransport::Inline
            && let Err(e) = tokio::fs::remove_file(&inline_path).await
        {
            debug!(path = %inline_path.display(), error = %e, "could not remove the sent input file");
        }
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
