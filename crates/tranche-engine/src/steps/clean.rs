//! Deleting a tranche's provider files once its results are safe, and its input file in the
//! blob store.

use tracing::{debug, info};
use tranche_core::TrancheState;
use tranche_providers::{FileId, Provider};
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
        self.remove_input(tranche.id).await?;
        self.transition(lease, TrancheUpdate::to(TrancheState::Done, self.now())).await?;
        info!(tranche = %tranche.id, "tranche done");
        Ok(())
    }
}
