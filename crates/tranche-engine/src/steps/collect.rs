//! Copying a batch's result files into the blob store, streamed exactly as the provider returns
//! them and whole or not at all, before anything parses them or deletes them at the provider.

use bytes::Bytes;
use futures::TryStreamExt;
use tracing::{debug, info, warn};
use tranche_core::{TrancheId, TrancheState};
use tranche_providers::{FileId, Provider};
use tranche_store::{TrancheRecord, TrancheUpdate};

use crate::engine::{Engine, StepError};
use crate::error::EngineError;
use crate::layout::raw_key;
use crate::lease::Lease;

/// Where a raw result file came from at the provider.
enum Source<'a> {
    File(&'a str),
    ResultsUrl(&'a str),
}

impl Engine {
    /// Whether the raw file `name` of `tranche` is in the blob store, moving it there first
    /// from a data folder made before the blob store when it is found there.
    pub(crate) async fn has_raw(
        &self,
        tranche: TrancheId,
        name: &str,
    ) -> Result<bool, EngineError> {
        let key = raw_key(tranche, name)?;
        if let Some(size) = self.config.blobs.size(&key).await? {
            // Read only while it is what was recorded (older folders recorded nothing).
            return Ok(match self.store.blob(key.as_str()).await? {
                Some(recorded) if recorded.size != size => {
                    warn!(tranche = %tranche, file = name, size, recorded = recorded.size, "raw results differ from what was stored; collecting them again");
                    false
                }
                _ => true,
            });
        }
        let legacy = self.config.legacy_raw_dir.join(tranche.to_string()).join(name);
        if tokio::fs::try_exists(&legacy).await.unwrap_or(false) {
            let stored = self.config.blobs.put_file(&key, &legacy).await?;
            self.store.record_blob(&self.record_of(&stored)).await?;
            info!(tranche = %tranche, bytes = stored.size, "moved raw results into the blob store");
            if let Err(e) = tokio::fs::remove_file(&legacy).await {
                debug!(path = %legacy.display(), error = %e, "could not remove a moved raw file");
            }
            return Ok(true);
        }
        Ok(false)
    }

    pub(crate) async fn collect(
        &self,
        provider: &dyn Provider,
        tranche: &TrancheRecord,
        lease: &Lease,
    ) -> Result<(), StepError> {
        let mut sources = Vec::new();
        if let Some(file) = &tranche.output_file_id {
            sources.push(("output.jsonl", Source::File(file)));
        } else if let Some(url) = &tranche.results_url {
            sources.push(("output.jsonl", Source::ResultsUrl(url)));
        }
        if let Some(file) = &tranche.error_file_id {
            sources.push(("errors.jsonl", Source::File(file)));
        }
        for (name, source) in sources {
            if self.has_raw(tranche.id, name).await? {
                continue;
            }
            // Streamed from the provider straight into the blob store: the object becomes
            // visible only once whole, so a crash or a broken transfer leaves nothing that
            // looks collected.
            let download = match source {
                Source::File(file) => match provider.download_file(&FileId::new(file)).await {
                    Ok(download) => download,
                    Err(e) if e.status == Some(404) => {
                        // Gone before it was copied (expired, or someone's cleanup): what it
                        // held is lost, and the batch's requests it answered go out again.
                        warn!(tranche = %tranche.id, file = %file, error = %e, "a result file the provider no longer has; its requests are sent again");
                        self.store.mark_file_deleted(tranche.provider, file, self.now()).await?;
                        let key = raw_key(tranche.id, name).map_err(EngineError::from)?;
                        let stored = self
                            .config
                            .blobs
                            .put(&key, Bytes::new())
                            .await
                            .map_err(EngineError::from)?;
                        self.store.record_blob(&self.record_of(&stored)).await?;
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                },
                Source::ResultsUrl(url) => provider.download_results(url).await?,
            };
            let mut writer =
                self.config.blobs.writer(&raw_key(tranche.id, name).map_err(EngineError::from)?);
            let mut stream = download.stream;
            let mut bytes = 0u64;
            loop {
                let chunk = match stream.try_next().await {
                    Ok(Some(chunk)) => chunk,
                    Ok(None) => break,
                    Err(e) => {
                        let _ = writer.abort().await;
                        return Err(e.into());
                    }
                };
                bytes += chunk.len() as u64;
                if let Err(e) = writer.write(&chunk).await {
                    let _ = writer.abort().await;
                    return Err(EngineError::from(e).into());
                }
            }
            let stored = writer.finish().await.map_err(EngineError::from)?;
            self.store.record_blob(&self.record_of(&stored)).await?;
            info!(tranche = %tranche.id, file = name, bytes, sha256 = %stored.sha256, "stored raw results");
        }
        self.transition(lease, TrancheUpdate::to(TrancheState::Ingesting, self.now())).await?;
        Ok(())
    }
}
