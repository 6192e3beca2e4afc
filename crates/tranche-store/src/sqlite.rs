//! The SQLite store: one file in WAL mode, migrations embedded in the binary.

use std::borrow::Cow;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use futures::stream::{BoxStream, StreamExt, TryStreamExt};
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{Row, SqlSafeStr, Sqlite, Transaction};
use tranche_core::{Endpoint, JobId, JobState, ProviderKind, TrancheId, TrancheState};

use crate::error::{StoreError, StoreResult};
use crate::records::*;

fn migrator() -> Migrator {
    Migrator::with_migrations(vec![Migration::new(
        1,
        Cow::Borrowed("init"),
        MigrationType::Simple,
        include_str!("../migrations/sqlite/0001_init.sql").into_sql_str(),
        false,
    )])
}

/// The store. Cheap to clone; clones share one connection pool.
#[derive(Debug, Clone)]
pub struct Store {
    pool: SqlitePool,
}

fn parse<T: FromStr>(what: &str, s: &str) -> StoreResult<T>
where
    T::Err: std::fmt::Display,
{
    s.parse::<T>().map_err(|e| StoreError::Corrupt(format!("{what}: {e}")))
}

fn json_opt(s: Option<String>) -> StoreResult<Option<serde_json::Value>> {
    s.map(|s| serde_json::from_str(&s).map_err(|e| StoreError::Corrupt(format!("json: {e}"))))
        .transpose()
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn to_u64(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

impl Store {
    /// Opens (creating if missing) the database at a `sqlite:` URL or a plain file path, and
    /// brings its schema up to date.
    pub async fn open(location: &str) -> StoreResult<Self> {
        let path = location
            .strip_prefix("sqlite://")
            .or_else(|| location.strip_prefix("sqlite:"))
            .unwrap_or(location);
        let in_memory = path == ":memory:" || path.is_empty();
        if let Some(parent) =
            Path::new(path).parent().filter(|p| !in_memory && !p.as_os_str().is_empty())
        {
            std::fs::create_dir_all(parent).map_err(|source| StoreError::CreateDir {
                location: location.to_owned(),
                source,
            })?;
        }
        let options = if in_memory {
            SqliteConnectOptions::from_str("sqlite::memory:")
        } else {
            Ok(SqliteConnectOptions::new().filename(path))
        }
        .map_err(|source| StoreError::Open { location: location.to_owned(), source })?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .foreign_keys(true)
        .busy_timeout(Duration::from_secs(30));
        let pool = SqlitePoolOptions::new()
            // An in-memory database lives in one connection.
            .max_connections(if in_memory { 1 } else { 4 })
            .connect_with(options)
            .await
            .map_err(|source| StoreError::Open { location: location.to_owned(), source })?;
        migrator().run(&pool).await?;
        Ok(Self { pool })
    }

    /// Closes every connection, checkpointing the WAL.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    // ---- jobs ------------------------------------------------------------------------------

    /// Starts recording a job. Nothing is visible to others until [`JobWriter::commit`];
    /// dropping the writer stores nothing.
    pub async fn begin_job(&self, job: NewJob) -> StoreResult<JobWriter> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO jobs (id, provider, state, source, settings, accepted, created_at, updated_at)
             VALUES (?, ?, 'pending', ?, ?, 0, ?, ?)",
        )
        .bind(job.id.to_string())
        .bind(job.provider.as_str())
        .bind(job.source.as_deref())
        .bind(job.settings.to_string())
        .bind(job.created_at)
        .bind(job.created_at)
        .execute(&mut *tx)
        .await?;
        Ok(JobWriter { tx, job: job.id, provider: job.provider, accepted: 0 })
    }

    pub async fn job(&self, id: JobId) -> StoreResult<Option<JobRecord>> {
        let row = sqlx::query(
            "SELECT id, provider, state, source, settings, accepted, last_error,
                    cancel_requested, created_at, updated_at, finished_at
             FROM jobs WHERE id = ?",
        )
        .bind(id.to_string())
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| job_from_row(&r)).transpose()
    }

    /// The newest jobs first.
    pub async fn recent_jobs(&self, limit: u32) -> StoreResult<Vec<JobRecord>> {
        let rows = sqlx::query(
            "SELECT id, provider, state, source, settings, accepted, last_error,
                    cancel_requested, created_at, updated_at, finished_at
             FROM jobs ORDER BY created_at DESC, id DESC LIMIT ?",
        )
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(job_from_row).collect()
    }

    /// Jobs that are not in a terminal state.
    pub async fn open_jobs(&self) -> StoreResult<Vec<JobRecord>> {
        let rows = sqlx::query(
            "SELECT id, provider, state, source, settings, accepted, last_error,
                    cancel_requested, created_at, updated_at, finished_at
             FROM jobs WHERE state IN ('pending', 'running') ORDER BY id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(job_from_row).collect()
    }

    pub async fn set_job_state(
        &self,
        id: JobId,
        state: JobState,
        last_error: Option<&serde_json::Value>,
        at: i64,
    ) -> StoreResult<()> {
        let finished_at = state.is_terminal().then_some(at);
        sqlx::query(
            "UPDATE jobs SET state = ?, last_error = COALESCE(?, last_error), updated_at = ?,
                    finished_at = COALESCE(finished_at, ?)
             WHERE id = ?",
        )
        .bind(state.as_str())
        .bind(last_error.map(serde_json::Value::to_string))
        .bind(at)
        .bind(finished_at)
        .bind(id.to_string())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn job_counts(&self, id: JobId) -> StoreResult<RequestCounts> {
        let rows =
            sqlx::query("SELECT state, COUNT(*) FROM requests WHERE job_id = ? GROUP BY state")
                .bind(id.to_string())
                .fetch_all(&self.pool)
                .await?;
        let mut counts = RequestCounts::default();
        for row in rows {
            let state: String = row.try_get(0)?;
            let n: i64 = row.try_get(1)?;
            counts.add(parse("request state", &state)?, to_u64(n));
        }
        let row = sqlx::query(
            "SELECT COALESCE(SUM(cached), 0), COALESCE(SUM(attempts > 1), 0)
             FROM requests WHERE job_id = ?",
        )
        .bind(id.to_string())
        .fetch_one(&self.pool)
        .await?;
        counts.cached = to_u64(row.try_get(0)?);
        counts.retried = to_u64(row.try_get(1)?);
        Ok(counts)
    }

    pub async fn job_tokens(&self, id: JobId) -> StoreResult<TokenTotals> {
        let row = sqlx::query(
            "SELECT COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0)
             FROM requests WHERE job_id = ?",
        )
        .bind(id.to_string())
        .fetch_one(&self.pool)
        .await?;
        Ok(TokenTotals {
            input_tokens: to_u64(row.try_get(0)?),
            output_tokens: to_u64(row.try_get(1)?),
        })
    }

    /// How many of the tranches holding a job's requests are in each state.
    pub async fn job_tranche_counts(&self, id: JobId) -> StoreResult<Vec<(TrancheState, u64)>> {
        let rows = sqlx::query(
            "SELECT t.state, COUNT(*) FROM tranches t
             WHERE t.id IN (SELECT DISTINCT tranche_id FROM requests
                            WHERE job_id = ? AND tranche_id IS NOT NULL)
             GROUP BY t.state ORDER BY t.state",
        )
        .bind(id.to_string())
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let state: String = row.try_get(0)?;
                let n: i64 = row.try_get(1)?;
                Ok((parse("tranche state", &state)?, to_u64(n)))
            })
            .collect()
    }

    /// A job's requests in input order, with their outcomes.
    pub fn job_results(&self, id: JobId) -> BoxStream<'_, StoreResult<ResultRow>> {
        sqlx::query(
            "SELECT custom_id, state, output, error FROM requests WHERE job_id = ? ORDER BY line",
        )
        .bind(id.to_string())
        .fetch(&self.pool)
        .map_err(StoreError::from)
        .and_then(|row| async move {
            let state: String = row.try_get(1)?;
            Ok(ResultRow {
                custom_id: row.try_get(0)?,
                state: parse("request state", &state)?,
                output: row.try_get(2)?,
                error: row.try_get(3)?,
            })
        })
        .boxed()
    }

    // ---- planning --------------------------------------------------------------------------

    /// Requests of one provider waiting for a tranche whose backoff has passed, in the order
    /// they were accepted.
    pub async fn pending_items(
        &self,
        provider: ProviderKind,
        now: i64,
    ) -> StoreResult<Vec<PendingItem>> {
        let rows = sqlx::query(
            "SELECT id, endpoint, model, wire_bytes, wire_id, accepted_at, est_tokens FROM requests
             WHERE state = 'pending' AND provider = ? AND not_before <= ? ORDER BY endpoint, model, id",
        )
        .bind(provider.as_str())
        .bind(now)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let endpoint: String = row.try_get(1)?;
                Ok(PendingItem {
                    request_id: row.try_get(0)?,
                    endpoint: parse::<Endpoint>("endpoint", &endpoint)?,
                    model: row.try_get(2)?,
                    wire_bytes: to_u64(row.try_get(3)?),
                    wire_id: row.try_get(4)?,
                    accepted_at: row.try_get(5)?,
                    est_tokens: to_u64(row.try_get(6)?),
                })
            })
            .collect()
    }

    /// Answers waiting requests of one provider from an earlier succeeded result with the same
    /// custom id and input hash (from any job), at no cost. Returns how many were answered.
    pub async fn answer_from_earlier(&self, provider: ProviderKind, now: i64) -> StoreResult<u64> {
        let done = sqlx::query(
            "UPDATE requests SET
                state = 'succeeded', cached = 1, finished_at = ?1, error = NULL,
                input_tokens = NULL, output_tokens = NULL,
                output = (SELECT p.output FROM requests AS p
                          WHERE p.custom_id = requests.custom_id AND p.input_hash = requests.input_hash
                            AND p.state = 'succeeded' AND p.cached = 0
                          ORDER BY p.finished_at DESC, p.id DESC LIMIT 1)
             WHERE state = 'pending' AND provider = ?2
               AND EXISTS (SELECT 1 FROM requests AS p
                           WHERE p.custom_id = requests.custom_id AND p.input_hash = requests.input_hash
                             AND p.state = 'succeeded' AND p.cached = 0)",
        )
        .bind(now)
        .bind(provider.as_str())
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// Estimated tokens per model in tranches that are, or are about to be, at the provider.
    pub async fn enqueued_tokens(&self, provider: ProviderKind) -> StoreResult<Vec<(String, u64)>> {
        let rows = sqlx::query(
            "SELECT model, COALESCE(SUM(est_tokens), 0) FROM tranches
             WHERE provider = ? AND state IN ('planned', 'uploading', 'uploaded', 'creating', 'submitted')
             GROUP BY model ORDER BY model",
        )
        .bind(provider.as_str())
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|row| Ok((row.try_get(0)?, to_u64(row.try_get(1)?)))).collect()
    }

    /// Marks a job as cancelled by its user and cancels its requests that are still waiting
    /// for a tranche. Returns how many requests that cancelled.
    pub async fn cancel_job(&self, id: JobId, at: i64) -> StoreResult<u64> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("UPDATE jobs SET cancel_requested = 1, updated_at = ? WHERE id = ?")
            .bind(at)
            .bind(id.to_string())
            .execute(&mut *tx)
            .await?;
        let done = sqlx::query(
            "UPDATE requests SET state = 'cancelled', finished_at = ?, tranche_id = NULL
             WHERE job_id = ? AND state = 'pending'",
        )
        .bind(at)
        .bind(id.to_string())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected())
    }

    /// The unfinished tranches holding a job's queued requests, each with whether the job's
    /// requests are the only ones in it.
    pub async fn job_live_tranches(&self, id: JobId) -> StoreResult<Vec<(TrancheRecord, bool)>> {
        let rows = sqlx::query(
            "SELECT t.*, NOT EXISTS (SELECT 1 FROM requests o
                                     WHERE o.tranche_id = t.id AND o.job_id <> ?1) AS exclusive
             FROM tranches t
             WHERE t.state NOT IN ('done', 'failed')
               AND t.id IN (SELECT DISTINCT tranche_id FROM requests
                            WHERE job_id = ?1 AND state = 'queued' AND tranche_id IS NOT NULL)
             ORDER BY t.created_at, t.id",
        )
        .bind(id.to_string())
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| Ok((tranche_from_row(row)?, row.try_get::<i64, _>("exclusive")? != 0)))
            .collect()
    }

    /// Asks for a tranche's batch to be cancelled at the provider (the engine does it).
    pub async fn request_tranche_cancel(&self, id: TrancheId, at: i64) -> StoreResult<()> {
        sqlx::query(
            "UPDATE tranches SET cancel_requested = 1, not_before = ?, updated_at = ? WHERE id = ?",
        )
        .bind(at)
        .bind(at)
        .bind(id.to_string())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Ends a job's queued requests in a tranche shared with other jobs as cancelled; the
    /// tranche goes on for the others, and their results for this job are ignored.
    pub async fn detach_job(&self, job: JobId, tranche: TrancheId, at: i64) -> StoreResult<u64> {
        let done = sqlx::query(
            "UPDATE requests SET state = 'cancelled', finished_at = ?
             WHERE job_id = ? AND tranche_id = ? AND state = 'queued'",
        )
        .bind(at)
        .bind(job.to_string())
        .bind(tranche.to_string())
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// Records a tranche and claims its requests, in one transaction. Requests no longer
    /// pending are not claimed; the tranche's count is what was claimed. Returns that count.
    pub async fn create_tranche(
        &self,
        tranche: &NewTranche,
        request_ids: &[i64],
    ) -> StoreResult<u64> {
        let mut tx = self.pool.begin().await?;
        let id = tranche.id.to_string();
        sqlx::query(
            "INSERT INTO tranches (id, provider, endpoint, model, state, request_count, bytes,
                                   est_tokens, created_at, updated_at)
             VALUES (?, ?, ?, ?, 'planned', 0, ?, ?, ?, ?)",
        )
        .bind(&id)
        .bind(tranche.provider.as_str())
        .bind(tranche.endpoint.as_str())
        .bind(&tranche.model)
        .bind(to_i64(tranche.bytes))
        .bind(to_i64(tranche.est_tokens))
        .bind(tranche.created_at)
        .bind(tranche.created_at)
        .execute(&mut *tx)
        .await?;
        let mut claimed = 0u64;
        for request_id in request_ids {
            let done = sqlx::query(
                "UPDATE requests SET state = 'queued', tranche_id = ? WHERE id = ? AND state = 'pending'",
            )
            .bind(&id)
            .bind(request_id)
            .execute(&mut *tx)
            .await?;
            claimed += done.rows_affected();
        }
        sqlx::query("UPDATE tranches SET request_count = ? WHERE id = ?")
            .bind(to_i64(claimed))
            .bind(&id)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "UPDATE jobs SET state = 'running', updated_at = ?
             WHERE state = 'pending' AND id IN (SELECT DISTINCT job_id FROM requests WHERE tranche_id = ?)",
        )
        .bind(tranche.created_at)
        .bind(&id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(claimed)
    }

    // ---- tranches --------------------------------------------------------------------------

    /// Tranches with work left whose backoff has passed, oldest first.
    pub async fn due_tranches(&self, now: i64) -> StoreResult<Vec<TrancheRecord>> {
        let rows = sqlx::query(
            "SELECT * FROM tranches WHERE state NOT IN ('done', 'failed') AND not_before <= ?
             ORDER BY created_at, id",
        )
        .bind(now)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(tranche_from_row).collect()
    }

    /// The earliest time any unfinished tranche is due, if there is one.
    pub async fn next_due(&self) -> StoreResult<Option<i64>> {
        let row = sqlx::query(
            "SELECT MIN(not_before) FROM tranches WHERE state NOT IN ('done', 'failed')",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(row.try_get(0)?)
    }

    pub async fn tranche(&self, id: TrancheId) -> StoreResult<Option<TrancheRecord>> {
        let row = sqlx::query("SELECT * FROM tranches WHERE id = ?")
            .bind(id.to_string())
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| tranche_from_row(&r)).transpose()
    }

    /// The tranche's input lines, in request order.
    pub fn tranche_input(&self, id: TrancheId) -> BoxStream<'_, StoreResult<InputLine>> {
        sqlx::query("SELECT wire_id, endpoint, body FROM requests WHERE tranche_id = ? AND state = 'queued' ORDER BY id")
            .bind(id.to_string())
            .fetch(&self.pool)
            .map_err(StoreError::from)
            .and_then(|row| async move {
                let endpoint: String = row.try_get(1)?;
                Ok(InputLine {
                    wire_id: row.try_get(0)?,
                    endpoint: parse("endpoint", &endpoint)?,
                    body: row.try_get(2)?,
                })
            })
            .boxed()
    }

    /// Moves a tranche to a new state, recording the fields the step learned.
    pub async fn update_tranche(&self, id: TrancheId, update: TrancheUpdate) -> StoreResult<()> {
        sqlx::query(
            "UPDATE tranches SET
                state = ?,
                input_file_id = COALESCE(?, input_file_id),
                batch_id = COALESCE(?, batch_id),
                batch_status = COALESCE(?, batch_status),
                output_file_id = COALESCE(?, output_file_id),
                error_file_id = COALESCE(?, error_file_id),
                results_url = COALESCE(?, results_url),
                batch_errors = COALESCE(?, batch_errors),
                last_error = ?,
                not_before = ?,
                updated_at = ?
             WHERE id = ?",
        )
        .bind(update.state.as_str())
        .bind(update.input_file_id)
        .bind(update.batch_id)
        .bind(update.batch_status)
        .bind(update.output_file_id)
        .bind(update.error_file_id)
        .bind(update.results_url)
        .bind(update.batch_errors.map(|v| v.to_string()))
        .bind(update.last_error.map(|v| v.to_string()))
        .bind(update.not_before)
        .bind(update.at)
        .bind(id.to_string())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// How many tranches holding a job's requests still have work left (cleanup included).
    pub async fn job_open_tranches(&self, id: JobId) -> StoreResult<u64> {
        let row = sqlx::query(
            "SELECT COUNT(*) FROM tranches
             WHERE state NOT IN ('done', 'failed')
               AND id IN (SELECT DISTINCT tranche_id FROM requests WHERE job_id = ? AND tranche_id IS NOT NULL)",
        )
        .bind(id.to_string())
        .fetch_one(&self.pool)
        .await?;
        Ok(to_u64(row.try_get(0)?))
    }

    /// Whether a request with `wire_id` waits in `tranche`.
    pub async fn tranche_has_wire_id(
        &self,
        tranche: TrancheId,
        wire_id: &str,
    ) -> StoreResult<bool> {
        let row = sqlx::query("SELECT 1 FROM requests WHERE tranche_id = ? AND wire_id = ? AND state = 'queued' LIMIT 1")
            .bind(tranche.to_string())
            .bind(wire_id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.is_some())
    }

    /// The tranche that recorded a provider batch, if any.
    pub async fn tranche_of_batch(
        &self,
        provider: ProviderKind,
        batch_id: &str,
    ) -> StoreResult<Option<TrancheId>> {
        let row = sqlx::query("SELECT id FROM tranches WHERE provider = ? AND batch_id = ?")
            .bind(provider.as_str())
            .bind(batch_id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|row| {
            let id: String = row.try_get(0)?;
            parse("tranche id", &id)
        })
        .transpose()
    }

    /// The jobs with requests in a tranche.
    pub async fn jobs_of_tranche(&self, tranche: TrancheId) -> StoreResult<Vec<JobId>> {
        let rows = sqlx::query(
            "SELECT DISTINCT job_id FROM requests WHERE tranche_id = ? ORDER BY job_id",
        )
        .bind(tranche.to_string())
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let id: String = row.try_get(0)?;
                parse("job id", &id)
            })
            .collect()
    }

    /// Puts a tranche off until `not_before`, recording why, without touching its state (which
    /// may have moved to an "-ing" intent since the caller read it).
    pub async fn defer_tranche(
        &self,
        id: TrancheId,
        last_error: &serde_json::Value,
        not_before: i64,
        at: i64,
    ) -> StoreResult<()> {
        sqlx::query(
            "UPDATE tranches SET last_error = ?, not_before = ?, updated_at = ? WHERE id = ?",
        )
        .bind(last_error.to_string())
        .bind(not_before)
        .bind(at)
        .bind(id.to_string())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    // ---- provider files --------------------------------------------------------------------

    /// Records a provider file (idempotent: a second record of the same file changes nothing).
    pub async fn record_file(&self, file: &FileRecord) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO provider_files (provider, file_id, purpose, tranche_id, filename, bytes,
                                         expires_at, created_at)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)
             ON CONFLICT (provider, file_id) DO NOTHING",
        )
        .bind(file.provider.as_str())
        .bind(&file.file_id)
        .bind(file.purpose.as_str())
        .bind(file.tranche_id.to_string())
        .bind(file.filename.as_deref())
        .bind(file.bytes.map(to_i64))
        .bind(file.expires_at)
        .bind(file.created_at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn mark_file_deleted(
        &self,
        provider: ProviderKind,
        file_id: &str,
        at: i64,
    ) -> StoreResult<()> {
        sqlx::query(
            "UPDATE provider_files SET deleted_at = COALESCE(deleted_at, ?) WHERE provider = ? AND file_id = ?",
        )
        .bind(at)
        .bind(provider.as_str())
        .bind(file_id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Files of a tranche not yet deleted, as (file id, purpose).
    pub async fn live_files(&self, tranche: TrancheId) -> StoreResult<Vec<String>> {
        let rows = sqlx::query(
            "SELECT file_id FROM provider_files WHERE tranche_id = ? AND deleted_at IS NULL ORDER BY created_at, file_id",
        )
        .bind(tranche.to_string())
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
    }

    /// File counts over the tranches that hold a job's requests.
    pub async fn job_file_counts(&self, id: JobId) -> StoreResult<FileCounts> {
        let row = sqlx::query(
            "SELECT
                COALESCE(SUM(purpose = 'batch_input'), 0),
                COALESCE(SUM(purpose <> 'batch_input'), 0),
                COALESCE(SUM(deleted_at IS NOT NULL), 0),
                COALESCE(SUM(deleted_at IS NULL), 0)
             FROM provider_files
             WHERE tranche_id IN (SELECT DISTINCT tranche_id FROM requests
                                  WHERE job_id = ? AND tranche_id IS NOT NULL)",
        )
        .bind(id.to_string())
        .fetch_one(&self.pool)
        .await?;
        Ok(FileCounts {
            uploaded: to_u64(row.try_get(0)?),
            created_by_provider: to_u64(row.try_get(1)?),
            deleted: to_u64(row.try_get(2)?),
            live: to_u64(row.try_get(3)?),
        })
    }

    // ---- results ---------------------------------------------------------------------------

    /// Starts recording a tranche's results, in one transaction.
    pub async fn begin_ingest(&self, tranche: TrancheId) -> StoreResult<IngestWriter> {
        let tx = self.pool.begin().await?;
        Ok(IngestWriter { tx, tranche: tranche.to_string() })
    }
}

/// Which fields a tranche step learned; `None` leaves a field as it was.
#[derive(Debug, Clone)]
pub struct TrancheUpdate {
    pub state: TrancheState,
    pub input_file_id: Option<String>,
    pub batch_id: Option<String>,
    pub batch_status: Option<String>,
    pub output_file_id: Option<String>,
    pub error_file_id: Option<String>,
    pub results_url: Option<String>,
    pub batch_errors: Option<serde_json::Value>,
    /// Replaces the last error (`None` clears it).
    pub last_error: Option<serde_json::Value>,
    pub not_before: i64,
    pub at: i64,
}

impl TrancheUpdate {
    /// A plain move to `state`, due at once.
    pub fn to(state: TrancheState, at: i64) -> Self {
        Self {
            state,
            input_file_id: None,
            batch_id: None,
            batch_status: None,
            output_file_id: None,
            error_file_id: None,
            results_url: None,
            batch_errors: None,
            last_error: None,
            not_before: at,
            at,
        }
    }
}

/// Records a job's requests inside one transaction.
#[derive(Debug)]
pub struct JobWriter {
    tx: Transaction<'static, Sqlite>,
    job: JobId,
    provider: ProviderKind,
    accepted: u64,
}

impl JobWriter {
    pub async fn add(&mut self, request: &NewRequest<'_>) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO requests (job_id, line, custom_id, wire_id, provider, endpoint, model, body,
                                   wire_bytes, input_hash, state, max_attempts, est_tokens,
                                   accepted_at)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?)",
        )
        .bind(self.job.to_string())
        .bind(to_i64(request.line))
        .bind(request.custom_id)
        .bind(request.wire_id)
        .bind(self.provider.as_str())
        .bind(request.endpoint.as_str())
        .bind(request.model)
        .bind(request.body)
        .bind(to_i64(request.wire_bytes))
        .bind(request.input_hash)
        .bind(i64::from(request.max_attempts))
        .bind(to_i64(request.est_tokens))
        .bind(request.accepted_at)
        .execute(&mut *self.tx)
        .await?;
        self.accepted += 1;
        Ok(())
    }

    /// How many requests were added so far.
    pub fn accepted(&self) -> u64 {
        self.accepted
    }

    /// Makes the job and all its requests visible at once. Returns how many were accepted.
    pub async fn commit(mut self) -> StoreResult<u64> {
        sqlx::query("UPDATE jobs SET accepted = ? WHERE id = ?")
            .bind(to_i64(self.accepted))
            .bind(self.job.to_string())
            .execute(&mut *self.tx)
            .await?;
        self.tx.commit().await?;
        Ok(self.accepted)
    }
}

/// Records the results of one tranche inside one transaction.
#[derive(Debug)]
pub struct IngestWriter {
    tx: Transaction<'static, Sqlite>,
    tranche: String,
}

impl IngestWriter {
    /// Records the result for the request with `wire_id` in this tranche. Returns false when
    /// no queued request of the tranche has that id (unknown, or already recorded).
    /// Where the queued request with `wire_id` in this tranche stands, if there is one.
    pub async fn attempt_info(&mut self, wire_id: &str) -> StoreResult<Option<AttemptInfo>> {
        let row = sqlx::query(
            "SELECT attempts, max_attempts, batch_returns FROM requests
             WHERE tranche_id = ? AND wire_id = ? AND state = 'queued'",
        )
        .bind(&self.tranche)
        .bind(wire_id)
        .fetch_optional(&mut *self.tx)
        .await?;
        row.map(|row| attempt_info(&row)).transpose()
    }

    /// The tranche's requests that have no result yet, with where each stands.
    pub async fn unanswered(&mut self) -> StoreResult<Vec<(String, AttemptInfo)>> {
        let rows = sqlx::query(
            "SELECT attempts, max_attempts, batch_returns, wire_id FROM requests
             WHERE tranche_id = ? AND state = 'queued' ORDER BY id",
        )
        .bind(&self.tranche)
        .fetch_all(&mut *self.tx)
        .await?;
        rows.iter().map(|row| Ok((row.try_get(3)?, attempt_info(row)?))).collect()
    }

    /// Records the result for the request with `wire_id` in this tranche. Returns false when
    /// no queued request of the tranche has that id (unknown, or already recorded). A request
    /// whose new state is `pending` leaves the tranche and returns to the pool.
    pub async fn record(&mut self, wire_id: &str, update: &ResultUpdate<'_>) -> StoreResult<bool> {
        let row = sqlx::query(
            "UPDATE requests SET state = ?1, output = ?2, error = ?3, input_tokens = ?4,
                    output_tokens = ?5, finished_at = ?6,
                    attempts = attempts + ?7, batch_returns = batch_returns + (1 - ?7),
                    tranche_id = CASE WHEN ?1 = 'pending' THEN NULL ELSE tranche_id END,
                    not_before = ?8
             WHERE tranche_id = ?9 AND wire_id = ?10 AND state = 'queued'
             RETURNING id, attempts",
        )
        .bind(update.state.as_str())
        .bind(update.output)
        .bind(update.error)
        .bind(update.input_tokens.map(to_i64))
        .bind(update.output_tokens.map(to_i64))
        .bind(update.state.is_terminal().then_some(update.at))
        .bind(i64::from(update.spends_attempt))
        .bind(update.not_before)
        .bind(&self.tranche)
        .bind(wire_id)
        .fetch_optional(&mut *self.tx)
        .await?;
        let Some(row) = row else { return Ok(false) };
        self.insert_attempt(&row, update).await?;
        Ok(true)
    }

    async fn insert_attempt(
        &mut self,
        row: &SqliteRow,
        update: &ResultUpdate<'_>,
    ) -> StoreResult<()> {
        let request_id: i64 = row.try_get(0)?;
        let attempt: i64 = row.try_get(1)?;
        sqlx::query(
            "INSERT INTO attempts (request_id, attempt, tranche_id, outcome, status_code, error, created_at)
             VALUES (?, ?, ?, ?, ?, ?, ?)
             ON CONFLICT (request_id, tranche_id) DO NOTHING",
        )
        .bind(request_id)
        .bind(attempt)
        .bind(&self.tranche)
        .bind(update.outcome.as_str())
        .bind(update.status_code.map(i64::from))
        .bind(update.error)
        .bind(update.at)
        .execute(&mut *self.tx)
        .await?;
        Ok(())
    }

    /// Makes all recorded results visible at once, and moves the tranche to `next`.
    pub async fn commit(mut self, next: TrancheState, at: i64) -> StoreResult<()> {
        sqlx::query("UPDATE tranches SET state = ?, updated_at = ?, not_before = ? WHERE id = ?")
            .bind(next.as_str())
            .bind(at)
            .bind(at)
            .bind(&self.tranche)
            .execute(&mut *self.tx)
            .await?;
        self.tx.commit().await?;
        Ok(())
    }
}

fn attempt_info(row: &SqliteRow) -> StoreResult<AttemptInfo> {
    let n = |i: usize| -> StoreResult<u32> {
        let v: i64 = row.try_get(i)?;
        Ok(u32::try_from(v).unwrap_or(u32::MAX))
    };
    Ok(AttemptInfo { attempts: n(0)?, max_attempts: n(1)?, batch_returns: n(2)? })
}

fn job_from_row(row: &SqliteRow) -> StoreResult<JobRecord> {
    let id: String = row.try_get("id")?;
    let provider: String = row.try_get("provider")?;
    let state: String = row.try_get("state")?;
    let settings: String = row.try_get("settings")?;
    Ok(JobRecord {
        id: parse("job id", &id)?,
        provider: parse("provider", &provider)?,
        state: parse("job state", &state)?,
        source: row.try_get("source")?,
        settings: serde_json::from_str(&settings)
            .map_err(|e| StoreError::Corrupt(format!("job settings: {e}")))?,
        accepted: to_u64(row.try_get("accepted")?),
        last_error: json_opt(row.try_get("last_error")?)?,
        cancel_requested: row.try_get::<i64, _>("cancel_requested")? != 0,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        finished_at: row.try_get("finished_at")?,
    })
}

fn tranche_from_row(row: &SqliteRow) -> StoreResult<TrancheRecord> {
    let id: String = row.try_get("id")?;
    let provider: String = row.try_get("provider")?;
    let endpoint: String = row.try_get("endpoint")?;
    let state: String = row.try_get("state")?;
    Ok(TrancheRecord {
        id: parse("tranche id", &id)?,
        provider: parse("provider", &provider)?,
        endpoint: parse("endpoint", &endpoint)?,
        model: row.try_get("model")?,
        state: parse("tranche state", &state)?,
        request_count: to_u64(row.try_get("request_count")?),
        bytes: to_u64(row.try_get("bytes")?),
        input_file_id: row.try_get("input_file_id")?,
        batch_id: row.try_get("batch_id")?,
        batch_status: row.try_get("batch_status")?,
        output_file_id: row.try_get("output_file_id")?,
        error_file_id: row.try_get("error_file_id")?,
        results_url: row.try_get("results_url")?,
        batch_errors: json_opt(row.try_get("batch_errors")?)?,
        last_error: json_opt(row.try_get("last_error")?)?,
        not_before: row.try_get("not_before")?,
        est_tokens: to_u64(row.try_get("est_tokens")?),
        cancel_requested: row.try_get::<i64, _>("cancel_requested")? != 0,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}
