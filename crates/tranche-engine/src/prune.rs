//! Retention: forgetting jobs that ended long ago. A pruned job keeps its summary (state,
//! counts, token totals, settings), its tranches and the provider files recorded; it loses
//! its request rows, its request bodies, its exports, and the raw result files no other job
//! still reads
//! (tranches are shared across jobs, and answers reused from earlier jobs point into their raw
//! files). Nothing of a job that has not ended is touched.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use tracing::info;
use tranche_blob::BlobKey;
use tranche_core::{JobId, TrancheId};

use crate::engine::Engine;
use crate::error::EngineError;
use crate::layout::{INPUT_FOLDER, RAW_FOLDER, body_key, export_folder, raw_key, tranche_of};
use crate::policy::whole_secs;

/// What a prune removed, or would remove when dry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PruneReport {
    /// Whether nothing was removed, only counted.
    pub dry_run: bool,
    /// Jobs pruned.
    pub jobs: u64,
    /// Request rows removed from the database.
    pub requests: u64,
    /// Objects removed from the blob store.
    pub objects: u64,
    /// Their bytes.
    pub bytes: u64,
}

impl Engine {
    /// Prunes every job that ended more than `older_than` ago (`dry_run`: counts what would
    /// go and removes nothing). Request rows go first, for every such job, then the bytes no
    /// job left needs: a prune that stops half-way is finished by the next, and no job still
    /// kept ever points at a removed object.
    pub async fn prune(
        &self,
        older_than: Duration,
        dry_run: bool,
    ) -> Result<PruneReport, EngineError> {
        let now = self.now();
        let jobs = self.store.prunable_jobs(now.saturating_sub(whole_secs(older_than))).await?;
        let ids: Vec<JobId> = jobs.iter().map(|(job, _)| job.id).collect();
        let mut report = PruneReport { dry_run, ..PruneReport::default() };
        for (job, rows_kept) in &jobs {
            report.jobs += 1;
            if dry_run {
                report.requests += if *rows_kept { job.accepted } else { 0 };
            } else {
                report.requests += self.store.prune_job_rows(job.id, now).await?;
            }
        }
        if jobs.is_empty() {
            return Ok(report);
        }
        let mut objects = Vec::new();
        for &job in &ids {
            let body = body_key(job)?;
            if let Some(size) = self.config.blobs.size(&body).await? {
                objects.push((body, size));
            }
            objects.extend(self.config.blobs.list(&export_folder(job)?).await?);
        }
        objects.extend(self.released_tranche_files(&ids).await?);
        let mut removed = Vec::new();
        for (key, size) in objects {
            if !dry_run {
                self.config.blobs.delete(&key).await?;
                removed.push(key.to_string());
            }
            report.objects += 1;
            report.bytes += size;
        }
        self.store.forget_blobs(&removed).await?;
        if !dry_run {
            for &job in &ids {
                self.store.job_pruned(job, now).await?;
            }
        }
        info!(?report, "pruned");
        Ok(report)
    }

    /// The files of tranches no job needs any more, besides the jobs being pruned
    /// (`pruning`): raw results and leftover input files, found by a sweep of the blob store
    /// so that a prune that stopped half-way leaves nothing behind for good.
    async fn released_tranche_files(
        &self,
        pruning: &[JobId],
    ) -> Result<Vec<(BlobKey, u64)>, EngineError> {
        let mut by_tranche: BTreeMap<TrancheId, Vec<(BlobKey, u64)>> = BTreeMap::new();
        for folder in [RAW_FOLDER, INPUT_FOLDER] {
            for (key, size) in self.config.blobs.list(&BlobKey::new(folder)?).await? {
                if let Some(tranche) = tranche_of(key.as_str()) {
                    by_tranche.entry(tranche).or_default().push((key, size));
                }
            }
        }
        let mut released = Vec::new();
        for (tranche, files) in by_tranche {
            let outputs = raw_key(tranche, "output.jsonl")?;
            if !self.store.tranche_in_use(tranche, outputs.as_str(), pruning).await? {
                released.extend(files);
            }
        }
        Ok(released)
    }
}
