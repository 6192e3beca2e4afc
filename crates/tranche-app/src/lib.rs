//! tranche's application layer: the use cases the CLI and the HTTP server share (submit, views,
//! export, cancel, cost, tenants and their tokens) and the deployment's layered configuration. Callers go through [`App`];
//! only this crate and the engine touch the store, and only through its traits.

mod config;
mod cost;
mod database;
mod error;
mod export;
mod idempotency;
mod metrics;
mod migrate;
mod providers;
mod review;
mod tenants;
mod views;

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use tokio::io::BufReader;
use tranche_blob::BlobStore;
use tranche_core::{JobId, JobSettings, JobState, ProviderKind};
use tranche_store::{JobRecord, Store};
use tranche_store_postgres::PgStore;
use tranche_store_sqlite::SqliteStore;

use crate::database::Database;

pub use config::{CONFIG_ENV, CONFIG_FILE, EngineSettings, config_file};
pub use cost::{
    CostTotals, FileEstimate, JobCost, ModelCost, Monthly, PeriodCost, Savings, TokenCounts,
    estimate_file, parse_day,
};
pub use error::AppError;
pub use export::{ExportFormat, ExportOptions};
pub use idempotency::STALE_CLAIM;
pub use metrics::{Metrics, ModelUsage};
pub use migrate::{MigrationReport, migrate_sqlite_to_postgres};
pub use providers::{ProviderOptions, provider, providers};
pub use review::{DEFAULT_SAMPLE, ReviewItem, default_seed};
pub use tenants::Tenant;
pub use tranche_engine::{
    CleanupOptions, CleanupReport, Engine, EngineConfig, EngineError, FileAudit, FilesError,
    Providers, PruneReport, ReparseError, ReparseReport, Submitted, Until,
};
pub use tranche_store::JobRecord as Job;
pub use tranche_store::{ErrorCarrier, UpstreamErrorCount};
pub use tranche_store::{JobFilter, KeyClaim, Rejected, TenantRecord};
pub use views::{
    CountsView, JobRow, JobStatus, Leased, Outcome, Progress, Summary, Upstream, Waiting,
    upstream_text,
};

/// A job's results exported into the blob store. Its keys are printed as JSON: add, never
/// rename.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Exported {
    /// The object's key in the blob store.
    pub object: String,
    /// The object's full address (the blob store's URL and the key).
    pub url: String,
    pub lines: u64,
    pub bytes: u64,
    /// Lower-case hex SHA-256 of the object.
    pub sha256: String,
}

/// The use cases over one store. Cheap to clone.
#[derive(Debug, Clone)]
pub struct App {
    store: Arc<dyn Store>,
    /// Where the deployment's bytes rest (answers are read from it when exported).
    blobs: BlobStore,
}

impl App {
    /// Opens the store at `database` (a SQLite file path or `sqlite:` URL, or a `postgres://`
    /// URL of a database that exists), bringing its schema up to date, over the deployment's
    /// blob store `blobs`.
    pub async fn open(database: &str, blobs: BlobStore) -> Result<Self, AppError> {
        let store: Arc<dyn Store> = match Database::parse(database)? {
            Database::Sqlite(path) => Arc::new(SqliteStore::open(path).await?),
            Database::Postgres(url) => Arc::new(PgStore::open(url).await?),
        };
        Ok(Self { store, blobs })
    }

    /// An engine over this store. Refused when its blob store is not the deployment's: the
    /// first engine records the blob store, every later one must use the same.
    pub async fn engine(
        &self,
        providers: Providers,
        config: EngineConfig,
    ) -> Result<Engine, AppError> {
        let proposed = config.blobs.url();
        let recorded = self.store.deployment_fact("blob_store", proposed).await?;
        if recorded != proposed {
            return Err(AppError::Config(format!(
                "this deployment's bytes are in the blob store `{recorded}`, but this engine was started with `{proposed}`; every engine of a deployment must use the same (--blob-store or TRANCHE_BLOB_STORE)"
            )));
        }
        Ok(Engine::new(Arc::clone(&self.store), providers, config))
    }

    /// Closes the store (SQLite checkpoints its log).
    pub async fn close(&self) {
        self.store.close().await;
    }

    /// Accepts the JSONL file at `path` as one job, or refuses it whole. Needs no provider
    /// credentials: encoding lines is pure.
    pub async fn submit_file(
        &self,
        engine: &Engine,
        path: &Path,
        provider: ProviderKind,
        settings: JobSettings,
    ) -> Result<Submitted, AppError> {
        let file = tokio::fs::File::open(path)
            .await
            .map_err(|source| AppError::Read { path: path.to_owned(), source })?;
        let source = Some(path.display().to_string());
        engine
            .submit(BufReader::with_capacity(1 << 20, file), provider, settings, source)
            .await
            .map_err(|e| AppError::from_submit(e, Some(path.to_owned())))
    }

    /// Accepts the JSONL lines `input` gives as one job (streamed: lines are read as they come,
    /// never held whole), or refuses it whole. `source` names where it came from, for display.
    pub async fn submit<R: tokio::io::AsyncBufRead + Unpin>(
        &self,
        engine: &Engine,
        input: R,
        provider: ProviderKind,
        settings: JobSettings,
        source: Option<String>,
    ) -> Result<Submitted, AppError> {
        engine
            .submit(input, provider, settings, source)
            .await
            .map_err(|e| AppError::from_submit(e, None))
    }

    /// A job's results as `export` writes them, as a stream of chunks of whole lines that
    /// owns what it reads (for a server's response body): produced by a task of its own, a
    /// few chunks ahead of the reader.
    pub fn export_stream(
        &self,
        job: JobRecord,
        options: ExportOptions,
    ) -> futures::stream::BoxStream<'static, Result<Vec<u8>, AppError>> {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let app = self.clone();
        tokio::spawn(async move {
            let mut sink = export::ChannelSink(tx);
            let written =
                export::write_results(&*app.store, &app.blobs, &job, options, &mut sink).await;
            if let Err(e) = written {
                // A reader that left has nothing to be told.
                let _ = sink.0.send(Err(e)).await;
            }
        });
        Box::pin(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        }))
    }

    /// The job a caller names (`job_…`).
    pub async fn find_job(&self, text: &str) -> Result<JobRecord, AppError> {
        let id = text.parse::<JobId>().map_err(|_| AppError::BadJobId(text.to_owned()))?;
        self.job(id).await
    }

    pub async fn job(&self, id: JobId) -> Result<JobRecord, AppError> {
        self.store.job(id).await?.ok_or(AppError::NoSuchJob(id))
    }

    /// The newest jobs first, with their counts.
    pub async fn recent_jobs(&self, limit: u32) -> Result<Vec<JobRow>, AppError> {
        let mut rows = Vec::new();
        for job in self.store.recent_jobs(limit).await? {
            let counts = self.store.job_counts(job.id).await?.into();
            rows.push(JobRow { job, counts });
        }
        Ok(rows)
    }

    /// The status object of one job.
    pub async fn status(&self, job: &JobRecord) -> Result<JobStatus, AppError> {
        let store = &*self.store;
        let tranches = store
            .job_tranche_counts(job.id)
            .await?
            .into_iter()
            .map(|(state, n)| (state.as_str().to_owned(), n))
            .collect();
        let unfinished = store.job_unfinished_tranches(job.id).await?;
        let leases = unfinished
            .iter()
            .filter_map(|t| {
                Some(Leased {
                    tranche_id: t.id.to_string(),
                    state: t.state,
                    engine: t.lease_owner.as_ref()?.as_str().to_owned(),
                    lease_expires_at_ms: t.lease_expires_at,
                })
            })
            .collect();
        let waiting = unfinished
            .into_iter()
            .filter_map(|t| {
                Some(Waiting {
                    tranche_id: t.id.to_string(),
                    state: t.state,
                    not_before: t.not_before,
                    reason: t.last_error?,
                })
            })
            .collect();
        Ok(JobStatus {
            job_id: job.id.to_string(),
            state: job.state,
            provider: job.provider.as_str().to_owned(),
            tenant: job.settings.tenant.clone(),
            source: job.source.clone(),
            created_at: job.created_at,
            finished_at: job.finished_at,
            counts: store.job_counts(job.id).await?.into(),
            tranches,
            tokens: store.job_tokens(job.id).await?,
            files: store.job_file_counts(job.id).await?,
            upstream: job.last_error.as_ref().or(job.paused.as_ref()).and_then(Upstream::of),
            error: job.last_error.clone().or_else(|| job.paused.clone()),
            waiting,
            leases,
            review: job.review.clone(),
            paused: job.paused.is_some() && !job.state.is_terminal(),
        })
    }

    /// How far a running job has come.
    pub async fn progress(&self, job: JobId) -> Result<Progress, AppError> {
        let counts = self.store.job_counts(job).await?;
        Ok(Progress {
            done: counts.succeeded + counts.failed + counts.cancelled,
            tranches: self.store.job_tranche_counts(job).await?,
        })
    }

    /// What a job did.
    pub async fn summary(&self, job: JobId) -> Result<Summary, AppError> {
        Ok(Summary {
            counts: self.store.job_counts(job).await?.into(),
            tranches: self.store.job_tranche_counts(job).await?.iter().map(|(_, n)| n).sum(),
            tokens: self.store.job_tokens(job).await?,
            files: self.store.job_file_counts(job).await?,
        })
    }

    /// How a job ended.
    pub async fn outcome(&self, job: &JobRecord) -> Result<Outcome, AppError> {
        if job.state == JobState::Failed {
            let error = job.last_error.clone().unwrap_or_default();
            return Ok(Outcome::Stopped(error));
        }
        if job.state == JobState::NeedsReview {
            return Ok(Outcome::AwaitsReview);
        }
        if let (Some(error), false) = (&job.paused, job.state.is_terminal()) {
            return Ok(Outcome::Paused(error.clone()));
        }
        let counts = self.store.job_counts(job.id).await?;
        Ok(if counts.failed > 0 || counts.cancelled > 0 {
            Outcome::SomeFailed
        } else {
            Outcome::Succeeded
        })
    }

    /// Writes a job's results to `out`, one line per request in input order, as `options`
    /// say. Returns how many results.
    pub async fn export(
        &self,
        job: &JobRecord,
        options: ExportOptions,
        out: &mut dyn Write,
    ) -> Result<u64, AppError> {
        self.export_into(job, options, out, Path::new("results")).await
    }

    /// Writes a job's results to the file at `path`.
    pub async fn export_to(
        &self,
        job: &JobRecord,
        options: ExportOptions,
        path: &Path,
    ) -> Result<u64, AppError> {
        let write_error = |source| AppError::Write { path: path.to_owned(), source };
        let file = std::fs::File::create(path).map_err(write_error)?;
        self.export_into(job, options, &mut std::io::BufWriter::new(file), path).await
    }

    async fn export_into(
        &self,
        job: &JobRecord,
        options: ExportOptions,
        out: &mut dyn Write,
        path: &Path,
    ) -> Result<u64, AppError> {
        let mut sink = export::WriteSink { out, path };
        let n = export::write_results(&*self.store, &self.blobs, job, options, &mut sink).await?;
        sink.out.flush().map_err(|source| AppError::Write { path: path.to_owned(), source })?;
        Ok(n)
    }

    /// Writes a job's results into the blob store as `exports/<job>/results.jsonl` (replacing
    /// an earlier export; whole or not at all), for readers that fetch them from there.
    pub async fn export_to_blob_store(
        &self,
        job: &JobRecord,
        options: ExportOptions,
    ) -> Result<Exported, AppError> {
        let key = tranche_engine::export_key(job.id)?;
        let mut writer = self.blobs.writer(&key);
        let mut sink = export::BlobSink(&mut writer);
        let lines =
            match export::write_results(&*self.store, &self.blobs, job, options, &mut sink).await {
                Ok(lines) => lines,
                Err(e) => {
                    let _ = writer.abort().await;
                    return Err(e);
                }
            };
        let stored = writer.finish().await?;
        self.store
            .record_blob(&tranche_store::BlobRecord {
                key: stored.key.to_string(),
                size: stored.size,
                sha256: stored.sha256.clone(),
                created_at: tranche_core::Clock::now(&tranche_core::SystemClock),
            })
            .await?;
        Ok(Exported {
            url: format!("{}/{}", self.blobs.url(), stored.key),
            object: stored.key.to_string(),
            lines,
            bytes: stored.size,
            sha256: stored.sha256,
        })
    }

    /// Cancels a job that has not ended: its waiting requests at once, its own batches at the
    /// provider (which `engine` then carries out), its share of shared batches detached.
    /// Returns how many requests were cancelled at once.
    pub async fn cancel(&self, engine: &Engine, job: &JobRecord) -> Result<u64, AppError> {
        if job.state.is_terminal() {
            return Err(AppError::JobEnded { id: job.id, state: job.state });
        }
        Ok(engine.cancel_job(job.id).await?)
    }

    /// Prunes the jobs that ended more than `older_than` ago: their request rows, their
    /// bodies and the raw result files no job left reads; their summaries stay (`status`
    /// still shows them, `results` has nothing left to export). `dry_run` counts and removes
    /// nothing. A pruned job's answers are no longer reused by later identical requests.
    pub async fn prune(
        &self,
        engine: &Engine,
        older_than: std::time::Duration,
        dry_run: bool,
    ) -> Result<PruneReport, AppError> {
        Ok(engine.prune(older_than, dry_run).await?)
    }
}
