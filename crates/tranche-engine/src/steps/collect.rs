//! Copying a batch's result files into raw storage, whole or not at all, before anything
//! parses them or deletes them at the provider.

use std::path::{Path, PathBuf};

use tracing::info;
use tranche_core::{TrancheId, TrancheState};
use tranche_providers::{FileId, Provider};
use tranche_store::{TrancheRecord, TrancheUpdate};

use crate::engine::{Engine, StepError};
use crate::error::EngineError;
use crate::lease::Lease;

/// A partial download beside `dest`, named by the step's lease.
fn partial_path(dest: &Path, lease: &Lease) -> PathBuf {
    let name = dest.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    dest.with_file_name(format!("{name}.{}.partial", lease.token()))
}

impl Engine {
    pub(crate) fn raw_path(&self, tranche: TrancheId, name: &str) -> PathBuf {
        self.config.raw_dir.join(tranche.to_string()).join(name)
    }

    pub(crate) async fn collect(
        &self,
        provider: &dyn Provider,
        tranche: &TrancheRecord,
        lease: &Lease,
    ) -> Result<(), StepError> {
        let dir = self.config.raw_dir.join(tranche.id.to_string());
        tokio::fs::create_dir_all(&dir).await.map_err(EngineError::io("creating", &dir))?;
        for (file, name) in
            [(&tranche.output_file_id, "output.jsonl"), (&tranche.error_file_id, "errors.jsonl")]
        {
            let Some(file) = file else { continue };
            let dest = self.raw_path(tranche.id, name);
            if tokio::fs::try_exists(&dest).await.unwrap_or(false) {
                continue;
            }
            // Download beside the final name and rename, so a crash never leaves a partial
            // file that looks whole; the partial file is named by this step's lease.
            let partial = partial_path(&dest, lease);
            let bytes = provider.download_file(&FileId::new(file.as_str()), &partial).await?;
            tokio::fs::rename(&partial, &dest)
                .await
                .map_err(EngineError::io("renaming", &partial))?;
            info!(tranche = %tranche.id, file = %file, bytes, "stored raw results");
        }
        if let Some(url) = &tranche.results_url {
            let dest = self.raw_path(tranche.id, "output.jsonl");
            if !tokio::fs::try_exists(&dest).await.unwrap_or(false) {
                let partial = partial_path(&dest, lease);
                let bytes = provider.download_results(url, &partial).await?;
                tokio::fs::rename(&partial, &dest)
                    .await
                    .map_err(EngineError::io("renaming", &partial))?;
                info!(tranche = %tranche.id, bytes, "stored raw results");
            }
        }
        self.transition(lease, TrancheUpdate::to(TrancheState::Ingesting, self.now())).await?;
        Ok(())
    }
}
