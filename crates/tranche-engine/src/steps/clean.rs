//! Deleting a tranche's provider files once its results are safe, and its input file in the
//! blob store.

use tracing::{debug, info, warn};
use tranche_core::TrancheState;
use tranche_providers::{BatchId, FileId, Provider};
use tranche_store::{TrancheRecord, TrancheUpdate};

use crate::engine::{Engine, StepError};
use crate::lease::Lease;

impl Engine {
    pub(crate) async fn clean(
        &self,
        provider: &dyn Provider,
        tranche: &TrancheRecord,
        lease: &Lease,
    ) -> Result<(), StepError> {
        for file in self.store.live_files(tranche.id).await? {
            lease.ensure().await?;
            provider.delete_file(&FileId::new(file.as_str())).await?;
            self.store.mark_file_deleted(tranche.provider, &file, self.now()).await?;
            debug!(tranche = %tranche.id, file = %file, "deleted provider file");
        }
        // A batch whose requests travelled inline (Anthropic) holds them, and its results, at
        // the provider until deleted; elsewhere deleting a batch is a no-op.
        if let Some(batch) = &tranche.batch_id {
            lease.ensure().await?;
            provider.delete_batch(&BatchId::new(batch.as_str())).await?;
        }
        self.remove_input(tranche.id).await?;
        self.transition(lease, TrancheUpdate::to(TrancheState::Done, self.now())).await?;
        info!(tranche = %tranche.id, "tranche done");
        Ok(())
    }

    /// Deletes a tranche's live provider files as far as the provider lets it, for a tranche
    /// that has failed: what cannot be deleted now is logged and left to expire.
    pub(crate) async fn delete_files_quietly(&self, tranche: &TrancheRecord) {
        let Ok(provider) = self.provider(tranche.provider) else { return };
        let files = match self.store.live_files(tranche.id).await {
            Ok(files) => files,
            Err(e) => {
                warn!(tranche = %tranche.id, error = %e, "cannot list the tranche's files");
                return;
            }
        };
        for file in files {
            match provider.delete_file(&FileId::new(file.as_str())).await {
                Ok(()) => {
                    if let Err(e) =
                        self.store.mark_file_deleted(tranche.provider, &file, self.now()).await
                    {
                        warn!(tranche = %tranche.id, file = %file, error = %e, "cannot record a deleted file");
                    }
                }
                Err(e) => {
                    warn!(tranche = %tranche.id, file = %file, error = %e, "cannot delete a failed tranche's file; it is left to expire");
                }
            }
        }
    }
}
