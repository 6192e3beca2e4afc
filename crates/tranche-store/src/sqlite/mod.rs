//! The SQLite store: one file in WAL mode, migrations embedded in the binary; write
//! transactions take the write lock up front, and a busy database is waited for.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use futures::stream::{BoxStream, StreamExt, TryStreamExt};
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{QueryBuilder, Row, SqlSafeStr, Sqlite, Transaction};
use tranche_core::{
    Endpoint, EngineId, JobId, JobState, LeaseToken, ProviderKind, TrancheId, TrancheState,
};

use crate::error::{DuplicateCustomId, StoreError, StoreResult};
use crate::records::*;

mod leases;

fn migrator() -> Migrator {
    let migration = |version, name, sql: &'static str| {
        Migration::new(
            version,
            Cow::Borrowed(name),
            MigrationType::Simple,
            sql.into_sql_str(),
            false,
        )
    };
    Migrator::with_migrations(vec![
        migration(1, "init", include_str!("../../migrations/sqlite/0001_init.sql")),
        migration(
            2,
            "lean requests",
            include_str!("../../migrations/sqlite/0002_lean_requests.sql"),
        ),
        migration(3, "leases", include_str!("../../migrations/sqlite/0003_leases.sql")),
    ])
}

/// Rows per multi-row `INSERT` at submit: 12 bound values a row, far below SQLite's limit of
/// 32,766 per statement, and large enough that a statement's fixed cost is paid rarely.
const INSERT_ROWS: usize = 256;

/// Result lines recorded per statement at ingest.
const INGEST_ROWS: usize = 512;

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
        .busy_timeout(Duration::from_secs(30))
        // The bundled SQLite keeps temporary files (statement journals, temporary tables,
        // sorts) in memory by default; a statement over a whole tranche would then hold
        // megabytes. On disk they are bounded by the page cache like everything else.
        .pragma("temp_store", "file");
        let pool = SqlitePoolOptions::new()
            // An in-memory database lives in one connection.
            .max_connections(if in_memory { 1 } else { 4 })
            .connect_with(options)
            .await
            .map_err(|source| StoreError::Open { location: location.to_owned(), source })?;
        migrator().run(&pool).await?;
        Ok(Self { pool })
    }

    /// Starts a transaction that writes. `BEGIN IMMEDIATE` takes the write lock at once (waiting
    /// out the busy timeout), so that it never fails half-way when another engine wrote since
    /// it first read, as a deferred transaction would.
    async fn begin_write(&self) -> StoreResult<Transaction<'static, Sqlite>> {
        Ok(self.pool.begin_with("BEGIN IMMEDIATE").await?)
    }

    /// Closes every connection, checkpointing the WAL.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    // ---- jobs ------------------------------------------------------------------------------

    /// Starts recording a job. Nothing is visible to others until [`JobWriter::commit`];
    /// dropping the writer stores nothing.
    pub async fn begin_job(&self, job: NewJob) -> StoreResult<JobWriter> {
        let mut tx = self.begin_write().await?;
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
        // The insert above holds the write lock until commit, so the ids after the largest one
        // stay free for this job's requests: they are assigned here, in input order.
        let row =
            sqlx::query("SELECT COALESCE(MAX(id), 0) FROM requests").fetch_one(&mut *tx).await?;
        let last_id: i64 = row.try_get(0)?;
        Ok(JobWriter {
            tx,
            job: job.id.to_string(),
            provider: job.provider,
            accepted: 0,
            last_id,
            rows: Vec::with_capacity(INSERT_ROWS),
            bodies: Vec::with_capacity(INSERT_ROWS),
        })
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

    /// Moves an open job to `state` (compare-and-set: a job that has ended stays as it
    /// ended). Returns whether it moved.
    pub async fn set_job_state(
        &self,
        id: JobId,
        state: JobState,
        last_error: Option<&serde_json::Value>,
        at: i64,
    ) -> StoreResult<bool> {
        let finished_at = state.is_terminal().then_some(at);
        let done = sqlx::query(
            "UPDATE jobs SET state = ?, last_error = COALESCE(?, last_error), updated_at = ?,
                    finished_at = COALESCE(finished_at, ?)
             WHERE id = ? AND state IN ('pending', 'running')",
        )
        .bind(state.as_str())
        .bind(last_error.map(serde_json::Value::to_string))
        .bind(at)
        .bind(finished_at)
        .bind(id.to_string())
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
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

    /// Whether any of a job's requests is still waiting or in a tranche.
    pub async fn job_has_open_requests(&self, id: JobId) -> StoreResult<bool> {
        let row = sqlx::query(
            "SELECT EXISTS (SELECT 1 FROM requests WHERE job_id = ? AND state IN ('pending', 'queued'))",
        )
        .bind(id.to_string())
        .fetch_one(&self.pool)
        .await?;
        Ok(row.try_get::<i64, _>(0)? != 0)
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
            "SELECT t.state, COUNT(*) FROM job_tranches AS j JOIN tranches AS t ON t.id = j.tranche_id
             WHERE j.job_id = ?
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
            "SELECT r.custom_id, r.state, o.output, r.error
             FROM requests AS r LEFT JOIN request_outputs AS o ON o.request_id = r.id
             WHERE r.job_id = ? ORDER BY r.line",
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
    pub async fn pending_groups(
        &self,
        provider: ProviderKind,
        now: i64,
    ) -> StoreResult<Vec<PendingGroup>> {
        let rows = sqlx::query(
            "SELECT endpoint, model, COUNT(*), MIN(accepted_at) FROM requests
             WHERE state = 'pending' AND provider = ? AND not_before <= ?
             GROUP BY endpoint, model ORDER BY endpoint, model",
        )
        .bind(provider.as_str())
        .bind(now)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let endpoint: String = row.try_get(0)?;
                Ok(PendingGroup {
                    endpoint: parse::<Endpoint>("endpoint", &endpoint)?,
                    model: row.try_get(1)?,
                    count: to_u64(row.try_get(2)?),
                    oldest_accepted_at: row.try_get(3)?,
                })
            })
            .collect()
    }

    /// Up to `limit` requests of one group waiting for a tranche whose backoff has passed,
    /// with ids above `after`, in the order they were accepted. Planning pages through a
    /// group with these, so memory does not grow with the number of waiting requests.
    pub async fn pending_page(
        &self,
        provider: ProviderKind,
        group: (Endpoint, &str),
        now: i64,
        after: i64,
        limit: u32,
    ) -> StoreResult<Vec<PendingItem>> {
        let rows = sqlx::query(
            "SELECT id, wire_bytes, wire_id, est_tokens FROM requests
             WHERE state = 'pending' AND provider = ? AND endpoint = ? AND model = ? AND id > ?
               AND not_before <= ?
             ORDER BY id LIMIT ?",
        )
        .bind(provider.as_str())
        .bind(group.0.as_str())
        .bind(group.1)
        .bind(after)
        .bind(now)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(PendingItem {
                    request_id: row.try_get(0)?,
                    wire_bytes: to_u64(row.try_get(1)?),
                    wire_id: row.try_get(2)?,
                    est_tokens: to_u64(row.try_get(3)?),
                })
            })
            .collect()
    }

    /// Answers waiting requests of one provider from an earlier succeeded result with the same
    /// custom id and input hash (from any job), at no cost. Returns how many were answered.
    pub async fn answer_from_earlier(&self, provider: ProviderKind, now: i64) -> StoreResult<u64> {
        let mut tx = self.begin_write().await?;
        // A pending request has no output yet (success is terminal), so the outputs copied
        // here mark exactly the requests answered.
        let copied = sqlx::query(
            "INSERT INTO request_outputs (request_id, output)
             SELECT id, output FROM (
                SELECT r.id AS id,
                       (SELECT o.output FROM requests AS p
                               JOIN request_outputs AS o ON o.request_id = p.id
                        WHERE p.custom_id = r.custom_id AND p.input_hash = r.input_hash
                          AND p.state = 'succeeded' AND p.cached = 0
                        ORDER BY p.finished_at DESC, p.id DESC LIMIT 1) AS output
                FROM requests AS r WHERE r.state = 'pending' AND r.provider = ?)
             WHERE output IS NOT NULL",
        )
        .bind(provider.as_str())
        .execute(&mut *tx)
        .await?;
        if copied.rows_affected() == 0 {
            return Ok(0);
        }
        let done = sqlx::query(
            "UPDATE requests SET
                state = 'succeeded', cached = 1, finished_at = ?, error = NULL,
                input_tokens = NULL, output_tokens = NULL
             WHERE state = 'pending' AND provider = ?
               AND EXISTS (SELECT 1 FROM request_outputs AS o WHERE o.request_id = requests.id)",
        )
        .bind(now)
        .bind(provider.as_str())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
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
        let mut tx = self.begin_write().await?;
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
        let mut tx = self.begin_write().await?;
        let done = sqlx::query(
            "UPDATE requests SET state = 'cancelled', finished_at = ?
             WHERE job_id = ? AND tranche_id = ? AND state = 'queued'",
        )
        .bind(at)
        .bind(job.to_string())
        .bind(tranche.to_string())
        .execute(&mut *tx)
        .await?;
        sqlx::query("DELETE FROM job_tranches WHERE job_id = ? AND tranche_id = ?")
            .bind(job.to_string())
            .bind(tranche.to_string())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(done.rows_affected())
    }

    /// Records a tranche and claims its requests, in one transaction, while the planning duty
    /// `duty` is still held with `token`. Requests no longer pending are not claimed; the
    /// tranche's count is what was claimed. Returns that count (a tranche that would claim
    /// none is not recorded), or `None` when the duty's lease passed to another engine (then
    /// nothing is recorded).
    pub async fn create_tranche(
        &self,
        tranche: &NewTranche,
        request_ids: &[i64],
        duty: (&str, LeaseToken),
    ) -> StoreResult<Option<u64>> {
        let mut tx = self.begin_write().await?;
        let held = sqlx::query("SELECT 1 FROM leases WHERE name = ? AND token = ?")
            .bind(duty.0)
            .bind(duty.1.to_string())
            .fetch_optional(&mut *tx)
            .await?;
        if held.is_none() {
            return Ok(None);
        }
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
        let ids = serde_json::to_string(request_ids)
            .map_err(|e| StoreError::Corrupt(format!("request ids: {e}")))?;
        let claimed = sqlx::query(
            "UPDATE requests SET state = 'queued', tranche_id = ?
             WHERE state = 'pending' AND id IN (SELECT value FROM json_each(?))",
        )
        .bind(&id)
        .bind(ids)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if claimed == 0 {
            // Dropping the transaction rolls the empty tranche back.
            return Ok(Some(0));
        }
        sqlx::query("UPDATE tranches SET request_count = ? WHERE id = ?")
            .bind(to_i64(claimed))
            .bind(&id)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT OR IGNORE INTO job_tranches (job_id, tranche_id)
             SELECT DISTINCT job_id, tranche_id FROM requests WHERE tranche_id = ?",
        )
        .bind(&id)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE jobs SET state = 'running', updated_at = ?
             WHERE state = 'pending' AND id IN (SELECT job_id FROM job_tranches WHERE tranche_id = ?)",
        )
        .bind(tranche.created_at)
        .bind(&id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Some(claimed))
    }

    // ---- tranches --------------------------------------------------------------------------

    /// Tranches with work left whose backoff has passed and that no engine holds a live
    /// lease on, oldest first. Stepping one takes its lease first ([`Store::lease_tranche`]).
    pub async fn due_tranches(&self, now: i64) -> StoreResult<Vec<TrancheRecord>> {
        let rows = sqlx::query(concat!(
            "SELECT * FROM tranches WHERE state NOT IN ('done', 'failed') AND not_before <= ?
               AND (lease_token IS NULL OR lease_expires_at <= ",
            leases::db_now_ms!(),
            ") ORDER BY created_at, id"
        ))
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

    /// The tranche's input lines, in wire id order (the index's, so nothing is sorted).
    pub fn tranche_input(&self, id: TrancheId) -> BoxStream<'_, StoreResult<InputLine>> {
        sqlx::query(
            "SELECT r.wire_id, r.endpoint, b.body
             FROM requests AS r JOIN request_bodies AS b ON b.request_id = r.id
             WHERE r.tranche_id = ? AND r.state = 'queued' ORDER BY r.wire_id",
        )
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

    /// Moves a tranche to a new state, recording the fields the step learned: a
    /// compare-and-set on the lease and state in `held`. Returns false, changing nothing, when
    /// either is no longer what the caller holds.
    pub async fn update_tranche(
        &self,
        id: TrancheId,
        held: Held,
        update: TrancheUpdate,
    ) -> StoreResult<bool> {
        let done = sqlx::query(
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
             WHERE id = ? AND state = ? AND lease_token = ?",
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
        .bind(held.state.as_str())
        .bind(held.token.to_string())
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// How many tranches holding a job's requests still have work left (cleanup included).
    pub async fn job_open_tranches(&self, id: JobId) -> StoreResult<u64> {
        let row = sqlx::query(
            "SELECT COUNT(*) FROM job_tranches AS j JOIN tranches AS t ON t.id = j.tranche_id
             WHERE j.job_id = ? AND t.state NOT IN ('done', 'failed')",
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
        let rows =
            sqlx::query("SELECT job_id FROM job_tranches WHERE tranche_id = ? ORDER BY job_id")
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

    /// Puts a tranche off until `not_before`, recording why, without touching its state (the
    /// "-ing" intent the step recorded stays). Compares the lease token; returns whether the
    /// tranche was still held.
    pub async fn defer_tranche(
        &self,
        id: TrancheId,
        token: LeaseToken,
        last_error: &serde_json::Value,
        not_before: i64,
        at: i64,
    ) -> StoreResult<bool> {
        let done = sqlx::query(
            "UPDATE tranches SET last_error = ?, not_before = ?, updated_at = ?
             WHERE id = ? AND lease_token = ?",
        )
        .bind(last_error.to_string())
        .bind(not_before)
        .bind(at)
        .bind(id.to_string())
        .bind(token.to_string())
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
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
             WHERE tranche_id IN (SELECT tranche_id FROM job_tranches WHERE job_id = ?)",
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

    /// Starts recording a tranche's results, in one transaction, under the lease and state in
    /// `held` (compared again when the writer commits).
    pub async fn begin_ingest(&self, tranche: TrancheId, held: Held) -> StoreResult<IngestWriter> {
        let mut tx = self.begin_write().await?;
        // Successes wait here, keyed (and so sorted) by request id, until they are applied to
        // `requests` in one pass in id order. Temporary: private to this connection.
        sqlx::query(
            "CREATE TEMP TABLE IF NOT EXISTS ingest_successes (
                request_id    INTEGER PRIMARY KEY,
                attempt       INTEGER NOT NULL,
                status_code   INTEGER NOT NULL,
                input_tokens  INTEGER,
                output_tokens INTEGER
             )",
        )
        .execute(&mut *tx)
        .await?;
        sqlx::query("DELETE FROM temp.ingest_successes").execute(&mut *tx).await?;
        Ok(IngestWriter { tx, tranche: tranche.to_string(), held, staged: false, finished_at: 0 })
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

/// A request row waiting in a [`JobWriter`] for its multi-row insert.
#[derive(Debug)]
struct RequestRow {
    id: i64,
    line: i64,
    custom_id: String,
    wire_id: String,
    endpoint: Endpoint,
    model: String,
    wire_bytes: i64,
    input_hash: String,
    max_attempts: i64,
    est_tokens: i64,
    accepted_at: i64,
}

/// Records a job's requests inside one transaction, many rows per statement.
#[derive(Debug)]
pub struct JobWriter {
    tx: Transaction<'static, Sqlite>,
    job: String,
    provider: ProviderKind,
    accepted: u64,
    /// The id given to the last request added.
    last_id: i64,
    rows: Vec<RequestRow>,
    bodies: Vec<(i64, String)>,
}

impl JobWriter {
    pub async fn add(&mut self, request: &NewRequest<'_>) -> StoreResult<()> {
        self.last_id += 1;
        self.rows.push(RequestRow {
            id: self.last_id,
            line: to_i64(request.line),
            custom_id: request.custom_id.to_owned(),
            wire_id: request.wire_id.to_owned(),
            endpoint: request.endpoint,
            model: request.model.to_owned(),
            wire_bytes: to_i64(request.wire_bytes),
            input_hash: request.input_hash.to_owned(),
            max_attempts: i64::from(request.max_attempts),
            est_tokens: to_i64(request.est_tokens),
            accepted_at: request.accepted_at,
        });
        self.bodies.push((self.last_id, request.body.to_owned()));
        self.accepted += 1;
        if self.rows.len() >= INSERT_ROWS {
            self.flush().await?;
        }
        Ok(())
    }

    /// Writes the buffered rows: one statement for the requests, one for their bodies. Fails
    /// with [`StoreError::DuplicateCustomIds`], writing none of them, when any repeats a
    /// custom id of the job; the job is then to be dropped, not committed.
    pub async fn flush(&mut self) -> StoreResult<()> {
        if self.rows.is_empty() {
            return Ok(());
        }
        // Only full-size statements are worth keeping prepared; the last, shorter one of a
        // job would only crowd the connection's statement cache.
        let persistent = self.rows.len() == INSERT_ROWS;
        let mut insert = QueryBuilder::<Sqlite>::new(
            "INSERT INTO requests (id, job_id, line, custom_id, wire_id, provider, endpoint, model,
                                   wire_bytes, input_hash, state, max_attempts, est_tokens,
                                   accepted_at) ",
        );
        let (job, provider) = (&self.job, self.provider.as_str());
        insert.push_values(self.rows.iter(), |mut row, r| {
            row.push_bind(r.id)
                .push_bind(job.as_str())
                .push_bind(r.line)
                .push_bind(r.custom_id.as_str())
                .push_bind(r.wire_id.as_str())
                .push_bind(provider)
                .push_bind(r.endpoint.as_str())
                .push_bind(r.model.as_str())
                .push_bind(r.wire_bytes)
                .push_bind(r.input_hash.as_str())
                .push("'pending'")
                .push_bind(r.max_attempts)
                .push_bind(r.est_tokens)
                .push_bind(r.accepted_at);
        });
        match insert.build().persistent(persistent).execute(&mut *self.tx).await {
            Ok(_) => {}
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                let duplicates = self.duplicates().await?;
                self.rows.clear();
                self.bodies.clear();
                return Err(StoreError::DuplicateCustomIds(duplicates));
            }
            Err(e) => return Err(e.into()),
        }
        self.rows.clear();
        let mut insert =
            QueryBuilder::<Sqlite>::new("INSERT INTO request_bodies (request_id, body) ");
        insert.push_values(self.bodies.drain(..), |mut row, (id, body)| {
            row.push_bind(id).push_bind(body);
        });
        insert.build().persistent(persistent).execute(&mut *self.tx).await?;
        Ok(())
    }

    /// The buffered rows whose custom id an earlier row of the job (stored, or buffered
    /// before them) already has.
    async fn duplicates(&mut self) -> StoreResult<Vec<DuplicateCustomId>> {
        let mut select =
            QueryBuilder::<Sqlite>::new("SELECT custom_id, line FROM requests WHERE job_id = ");
        select.push_bind(self.job.as_str()).push(" AND custom_id IN (");
        let mut ids = select.separated(", ");
        for row in &self.rows {
            ids.push_bind(row.custom_id.as_str());
        }
        select.push(")");
        let stored = select.build().persistent(false).fetch_all(&mut *self.tx).await?;
        let mut first: HashMap<&str, i64> = HashMap::with_capacity(self.rows.len());
        for row in &stored {
            first.insert(row.try_get(0)?, row.try_get(1)?);
        }
        let mut duplicates = Vec::new();
        for row in &self.rows {
            match first.get(row.custom_id.as_str()) {
                Some(&line) => duplicates.push(DuplicateCustomId {
                    line: to_u64(row.line),
                    custom_id: row.custom_id.clone(),
                    first_line: to_u64(line),
                }),
                None => {
                    first.insert(row.custom_id.as_str(), row.line);
                }
            }
        }
        Ok(duplicates)
    }

    /// How many requests were added so far.
    pub fn accepted(&self) -> u64 {
        self.accepted
    }

    /// Makes the job and all its requests visible at once. Returns how many were accepted.
    pub async fn commit(mut self) -> StoreResult<u64> {
        self.flush().await?;
        sqlx::query("UPDATE jobs SET accepted = ? WHERE id = ?")
            .bind(to_i64(self.accepted))
            .bind(&self.job)
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
    held: Held,
    /// Successes are staged and not yet applied to `requests`.
    staged: bool,
    /// When the staged successes were recorded.
    finished_at: i64,
}

impl IngestWriter {
    /// Records the result for the request with `wire_id` in this tranche. Returns false when
    /// no queued request of the tranche has that id (unknown, or already recorded).
    /// Where the queued request with `wire_id` in this tranche stands, if there is one.
    pub async fn attempt_info(&mut self, wire_id: &str) -> StoreResult<Option<AttemptInfo>> {
        self.apply_staged().await?;
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
        self.apply_staged().await?;
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
        self.apply_staged().await?;
        let row = sqlx::query(
            "UPDATE requests SET state = ?1, error = ?3, input_tokens = ?4,
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
        if let Some(output) = update.output {
            let request_id: i64 = row.try_get(0)?;
            sqlx::query(
                "INSERT OR REPLACE INTO request_outputs (request_id, output) VALUES (?, ?)",
            )
            .bind(request_id)
            .bind(output)
            .execute(&mut *self.tx)
            .await?;
        }
        Ok(true)
    }

    /// Records successful result lines, many per statement: each request with that wire id
    /// waiting in this tranche ends `succeeded` with the output, spending an attempt. A line
    /// whose wire id matches no waiting request (unknown, or recorded already) changes
    /// nothing. Returns how many lines were recorded.
    ///
    /// Outputs are appended as they come; the requests' own rows change in one pass in id
    /// order when the writer next reads, records a failure or commits, so that results
    /// arriving in random order do not make SQLite rewrite pages at random.
    pub async fn record_successes(
        &mut self,
        lines: &mut Vec<Success>,
        at: i64,
    ) -> StoreResult<u64> {
        self.finished_at = at;
        let mut recorded = 0;
        while !lines.is_empty() {
            let rest = lines.split_off(lines.len().min(INGEST_ROWS));
            let chunk = std::mem::replace(lines, rest);
            recorded += self.stage_chunk(chunk).await?;
        }
        Ok(recorded)
    }

    async fn stage_chunk(&mut self, chunk: Vec<Success>) -> StoreResult<u64> {
        // An IN list is looked up entry by entry in `requests_by_tranche`; SQLite 3.51 plans an
        // `UPDATE ... FROM (VALUES ...)` joined on the wire id as a scan of the tranche per line.
        let mut select = QueryBuilder::<Sqlite>::new(
            "SELECT id, attempts, wire_id FROM requests WHERE tranche_id = ",
        );
        select.push_bind(self.tranche.as_str()).push(" AND state = 'queued' AND wire_id IN (");
        let mut ids = select.separated(", ");
        for line in &chunk {
            ids.push_bind(line.wire_id.as_str());
        }
        select.push(") ORDER BY id");
        // Bulk statements differ in length, so none is kept prepared (each holds a large
        // program, and a connection's statement cache would keep dozens).
        let rows = select.build().persistent(false).fetch_all(&mut *self.tx).await?;
        if rows.is_empty() {
            return Ok(0);
        }
        // The first line with a wire id is the one recorded (a later one, in this chunk or
        // another, is ignored by the inserts below).
        let mut by_wire_id: HashMap<&str, &Success> = HashMap::with_capacity(chunk.len());
        for line in &chunk {
            by_wire_id.entry(line.wire_id.as_str()).or_insert(line);
        }
        let mut found = Vec::with_capacity(rows.len());
        for row in &rows {
            let wire_id: &str = row.try_get(2)?;
            let line = by_wire_id.get(wire_id).ok_or_else(|| {
                StoreError::Corrupt(format!("recorded a result for unknown wire id {wire_id}"))
            })?;
            found.push((row.try_get::<i64, _>(0)?, row.try_get::<i64, _>(1)? + 1, *line));
        }
        let mut stage = QueryBuilder::<Sqlite>::new(
            "INSERT OR IGNORE INTO temp.ingest_successes
                (request_id, attempt, status_code, input_tokens, output_tokens) ",
        );
        stage.push_values(found.iter(), |mut row, (id, attempt, line)| {
            row.push_bind(*id)
                .push_bind(*attempt)
                .push_bind(i64::from(line.status_code))
                .push_bind(line.input_tokens.map(to_i64))
                .push_bind(line.output_tokens.map(to_i64));
        });
        let staged = stage.build().persistent(false).execute(&mut *self.tx).await?.rows_affected();
        let mut outputs = QueryBuilder::<Sqlite>::new(
            "INSERT OR IGNORE INTO request_outputs (request_id, output) ",
        );
        outputs.push_values(found.iter(), |mut row, (id, _, line)| {
            row.push_bind(*id).push_bind(line.output.as_str());
        });
        outputs.build().persistent(false).execute(&mut *self.tx).await?;
        self.staged = true;
        Ok(staged)
    }

    /// Applies the staged successes to `requests` and `attempts`, in request id order.
    async fn apply_staged(&mut self) -> StoreResult<()> {
        let at = self.finished_at;
        if !self.staged {
            return Ok(());
        }
        // `id IN (SELECT ...)` walks the staged ids in order and seeks each row; an
        // `UPDATE ... FROM` the staging table may be planned as a scan of all of `requests`.
        sqlx::query(
            "UPDATE requests SET state = 'succeeded', error = NULL, not_before = 0, finished_at = ?,
                attempts = (SELECT attempt FROM temp.ingest_successes AS s WHERE s.request_id = requests.id),
                input_tokens = (SELECT input_tokens FROM temp.ingest_successes AS s WHERE s.request_id = requests.id),
                output_tokens = (SELECT output_tokens FROM temp.ingest_successes AS s WHERE s.request_id = requests.id)
             WHERE id IN (SELECT request_id FROM temp.ingest_successes)",
        )
        .bind(at)
        .execute(&mut *self.tx)
        .await?;
        sqlx::query(
            "INSERT INTO attempts (request_id, attempt, tranche_id, outcome, status_code, created_at)
             SELECT request_id, attempt, ?, 'succeeded', status_code, ? FROM temp.ingest_successes
             WHERE true
             ON CONFLICT (request_id, tranche_id) DO NOTHING",
        )
        .bind(&self.tranche)
        .bind(at)
        .execute(&mut *self.tx)
        .await?;
        sqlx::query("DELETE FROM temp.ingest_successes").execute(&mut *self.tx).await?;
        self.staged = false;
        Ok(())
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

    /// Makes all recorded results visible at once, and moves the tranche to `next`. Returns
    /// false, recording nothing, when the tranche's lease or state is
    /// no longer what the writer was begun with.
    pub async fn commit(mut self, next: TrancheState, at: i64) -> StoreResult<bool> {
        self.apply_staged().await?;
        let moved = sqlx::query(
            "UPDATE tranches SET state = ?, updated_at = ?, not_before = ?
             WHERE id = ? AND state = ? AND lease_token = ?",
        )
        .bind(next.as_str())
        .bind(at)
        .bind(at)
        .bind(&self.tranche)
        .bind(self.held.state.as_str())
        .bind(self.held.token.to_string())
        .execute(&mut *self.tx)
        .await?
        .rows_affected();
        if moved == 0 {
            // Dropping the transaction rolls every recorded result back.
            return Ok(false);
        }
        self.tx.commit().await?;
        Ok(true)
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
        lease_owner: row.try_get::<Option<String>, _>("lease_owner")?.map(EngineId::from_stored),
        lease_expires_at: row.try_get("lease_expires_at")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A database made by the first schema, with a finished request and a waiting one, keeps
    /// their bodies, output and tranche links through the second migration.
    #[tokio::test]
    async fn the_lean_requests_migration_keeps_bodies_outputs_and_links() {
        let dir = tempfile::tempdir().unwrap();
        let options = SqliteConnectOptions::new()
            .filename(dir.path().join("old.db"))
            .create_if_missing(true)
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new().max_connections(1).connect_with(options).await.unwrap();
        let mut first = migrator();
        first.migrations.to_mut().truncate(1);
        first.run(&pool).await.unwrap();
        for sql in [
            "INSERT INTO jobs (id, provider, state, settings, accepted, created_at, updated_at)
             VALUES ('job_1', 'openai', 'running', '{}', 2, 1, 1)",
            "INSERT INTO tranches (id, provider, endpoint, model, state, request_count, bytes,
                                   created_at, updated_at)
             VALUES ('tr_1', 'openai', '/v1/chat/completions', 'm', 'done', 1, 10, 1, 1)",
            "INSERT INTO requests (id, job_id, line, custom_id, wire_id, provider, endpoint, model,
                                   body, wire_bytes, input_hash, state, tranche_id, max_attempts,
                                   est_tokens, accepted_at, output)
             VALUES (1, 'job_1', 1, 'a', 'a', 'openai', '/v1/chat/completions', 'm', '{\"x\":1}',
                     10, 'h', 'succeeded', 'tr_1', 3, 1, 1, '{\"ok\":1}'),
                    (2, 'job_1', 2, 'b', 'b', 'openai', '/v1/chat/completions', 'm', '{\"x\":2}',
                     10, 'h', 'pending', NULL, 3, 1, 1, NULL)",
        ] {
            sqlx::query(sql).execute(&pool).await.unwrap();
        }
        migrator().run(&pool).await.unwrap();
        let row = sqlx::query(
            "SELECT (SELECT group_concat(body, ';') FROM request_bodies),
                    (SELECT group_concat(request_id || '=' || output, ';') FROM request_outputs),
                    (SELECT group_concat(job_id || '>' || tranche_id, ';') FROM job_tranches)",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        let got: (String, String, String) =
            (row.try_get(0).unwrap(), row.try_get(1).unwrap(), row.try_get(2).unwrap());
        assert_eq!(got.0, r#"{"x":1};{"x":2}"#);
        assert_eq!(got.1, r#"1={"ok":1}"#);
        assert_eq!(got.2, "job_1>tr_1");
    }
}
