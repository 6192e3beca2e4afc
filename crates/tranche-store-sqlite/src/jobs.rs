//! Jobs: recording them (through `writer.rs`), moving them through their life, cancelling.

use sqlx::Row;
use tranche_core::{JobId, JobState, TrancheId};
use tranche_store::rows::*;
use tranche_store::*;

use crate::SqliteStore;
use crate::keys_off::WriteTx;
use crate::writer::SqliteJobWriter;

/// The columns a job is read from, in a statement that stays a string literal (`concat!`).
macro_rules! job_columns {
    () => {
        "SELECT id, provider, state, source, settings, accepted, last_error, cancel_requested,
                created_at, updated_at, finished_at, review_verdict, reviewed_by, reviewed_at,
                paused_error
         FROM jobs"
    };
}

#[async_trait::async_trait]
impl JobStore for SqliteStore {
    async fn begin_job(&self, job: NewJob) -> StoreResult<Box<dyn JobWriter>> {
        let settings = serde_json::to_string(&job.settings)
            .map_err(|e| StoreError::Corrupt(format!("job settings: {e}")))?;
        // Every key the job's writer writes holds by construction: its requests name the job
        // its commit inserts, its bodies the requests inserted before them (`keys_off.rs`).
        let mut tx = WriteTx::begin_unchecked(&self.pool, self.in_memory).await?;
        if let Some(check) = &job.answer_check {
            crate::answers::record_check(tx.conn(), check, job.created_at).await?;
        }
        // The transaction holds the write lock until commit, so the ids after the largest one
        // stay free for this job's requests: they are assigned here, in input order.
        let row =
            sqlx::query("SELECT COALESCE(MAX(id), 0) FROM requests").fetch_one(tx.conn()).await?;
        let last_id: i64 = row.try_get(0)?;
        Ok(Box::new(SqliteJobWriter::new(tx, job, settings, last_id)))
    }

    async fn job(&self, id: JobId) -> StoreResult<Option<JobRecord>> {
        let row = sqlx::query(
            "SELECT id, provider, state, source, settings, accepted, last_error,
                    cancel_requested, created_at, updated_at, finished_at, review_verdict,
                    reviewed_by, reviewed_at, paused_error
             FROM jobs WHERE id = ?",
        )
        .bind(id.to_string())
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| job_from_row(&r)).transpose()
    }

    async fn recent_jobs(&self, limit: u32) -> StoreResult<Vec<JobRecord>> {
        let rows = sqlx::query(
            "SELECT id, provider, state, source, settings, accepted, last_error,
                    cancel_requested, created_at, updated_at, finished_at, review_verdict,
                    reviewed_by, reviewed_at, paused_error
             FROM jobs ORDER BY created_at DESC, id DESC LIMIT ?",
        )
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(job_from_row).collect()
    }

    async fn list_jobs(&self, filter: JobFilter<'_>) -> StoreResult<Vec<JobRecord>> {
        // One statement per shape, so that each is a range of one index: a tenant's jobs by
        // `jobs_by_tenant`, every job by `jobs_by_created`; the cursor is the row (created_at,
        // id) of the job it names, and an unknown one compares as NULL, listing nothing.
        let state = filter.state.map(JobState::as_str);
        let before = filter.before.map(|id| id.to_string());
        let limit = i64::from(filter.limit);
        let query = match (filter.tenant, before) {
            (Some(tenant), Some(before)) => sqlx::query(concat!(
                job_columns!(),
                " WHERE tenant = ?1 AND (?2 IS NULL OR state = ?2)
                    AND (created_at, id) < (SELECT created_at, id FROM jobs WHERE id = ?3)
                  ORDER BY created_at DESC, id DESC LIMIT ?4"
            ))
            .bind(tenant)
            .bind(state)
            .bind(before),
            (Some(tenant), None) => sqlx::query(concat!(
                job_columns!(),
                " WHERE tenant = ?1 AND (?2 IS NULL OR state = ?2)
                  ORDER BY created_at DESC, id DESC LIMIT ?3"
            ))
            .bind(tenant)
            .bind(state),
            (None, Some(before)) => sqlx::query(concat!(
                job_columns!(),
                " WHERE (?1 IS NULL OR state = ?1)
                    AND (created_at, id) < (SELECT created_at, id FROM jobs WHERE id = ?2)
                  ORDER BY created_at DESC, id DESC LIMIT ?3"
            ))
            .bind(state)
            .bind(before),
            (None, None) => sqlx::query(concat!(
                job_columns!(),
                " WHERE (?1 IS NULL OR state = ?1) ORDER BY created_at DESC, id DESC LIMIT ?2"
            ))
            .bind(state),
        };
        let rows = query.bind(limit).fetch_all(&self.pool).await?;
        rows.iter().map(job_from_row).collect()
    }

    async fn open_jobs(&self) -> StoreResult<Vec<JobRecord>> {
        let rows = sqlx::query(
            "SELECT id, provider, state, source, settings, accepted, last_error,
                    cancel_requested, created_at, updated_at, finished_at, review_verdict,
                    reviewed_by, reviewed_at, paused_error
             FROM jobs WHERE state IN ('pending', 'running') ORDER BY id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(job_from_row).collect()
    }

    async fn set_job_state(
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

    async fn set_jobs_paused(
        &self,
        tranche: TrancheId,
        error: Option<&serde_json::Value>,
        at: i64,
    ) -> StoreResult<u64> {
        let done = sqlx::query(
            "UPDATE jobs SET paused_error = ?, updated_at = ?
             WHERE state IN ('pending', 'running') AND paused_error IS NOT ?
               AND id IN (SELECT job_id FROM job_tranches WHERE tranche_id = ?)",
        )
        .bind(error.map(serde_json::Value::to_string))
        .bind(at)
        .bind(error.map(serde_json::Value::to_string))
        .bind(tranche.to_string())
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    async fn move_jobs_of_tranche(
        &self,
        tranche: TrancheId,
        from: JobState,
        to: JobState,
        at: i64,
    ) -> StoreResult<u64> {
        let moved = sqlx::query(
            "UPDATE jobs SET state = ?, updated_at = ?
             WHERE state = ? AND id IN (SELECT job_id FROM job_tranches WHERE tranche_id = ?)",
        )
        .bind(to.as_str())
        .bind(at)
        .bind(from.as_str())
        .bind(tranche.to_string())
        .execute(&self.pool)
        .await?;
        Ok(moved.rows_affected())
    }

    async fn job_has_open_requests(&self, id: JobId) -> StoreResult<bool> {
        // The job's counters follow every committed change of its requests' states.
        let open: Option<i64> =
            sqlx::query_scalar("SELECT n_pending + n_queued > 0 FROM jobs WHERE id = ?")
                .bind(id.to_string())
                .fetch_optional(&self.pool)
                .await?;
        Ok(open.unwrap_or(0) != 0)
    }

    async fn job_open_tranches(&self, id: JobId) -> StoreResult<u64> {
        let row = sqlx::query(
            "SELECT COUNT(*) FROM job_tranches AS j JOIN tranches AS t ON t.id = j.tranche_id
             WHERE j.job_id = ? AND t.state NOT IN ('done', 'failed')",
        )
        .bind(id.to_string())
        .fetch_one(&self.pool)
        .await?;
        Ok(to_u64(row.try_get(0)?))
    }

    async fn jobs_of_tranche(&self, tranche: TrancheId) -> StoreResult<Vec<JobId>> {
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

    async fn cancel_job(&self, id: JobId, at: i64) -> StoreResult<u64> {
        let mut tx = self.begin_write().await?;
        sqlx::query("UPDATE jobs SET cancel_requested = 1, updated_at = ? WHERE id = ?")
            .bind(at)
            .bind(id.to_string())
            .execute(&mut *tx)
            .await?;
        // Planning calls this on every pass while a cancelled job stays open: with nothing
        // waiting (its counters say so) the job's requests are not read.
        if !crate::has_pending(&mut tx, id).await? {
            tx.commit().await?;
            return Ok(0);
        }
        let done = sqlx::query(concat!(
            "UPDATE requests SET recount = 0, state = 'cancelled', finished_at = ?2,
                    tranche_seq = NULL
             WHERE state = 'pending' AND ",
            job_rows!()
        ))
        .bind(id.to_string())
        .bind(at)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected())
    }

    async fn job_live_tranches(&self, id: JobId) -> StoreResult<Vec<(TrancheRecord, bool)>> {
        let rows = sqlx::query(concat!(
            "SELECT t.*, NOT EXISTS (SELECT 1 FROM requests o
                                     WHERE o.tranche_seq = t.seq AND o.state = 'queued'
                                       AND o.job_id <> ?1) AS exclusive
             FROM tranches t
             WHERE t.state NOT IN ('done', 'failed')
               AND t.seq IN (SELECT DISTINCT tranche_seq FROM requests
                             WHERE state = 'queued' AND tranche_seq IS NOT NULL AND ",
            job_rows!(),
            ")
             ORDER BY t.created_at, t.id"
        ))
        .bind(id.to_string())
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| Ok((tranche_from_row(row)?, row.try_get::<i64, _>("exclusive")? != 0)))
            .collect()
    }

    async fn detach_job(&self, job: JobId, tranche: TrancheId, at: i64) -> StoreResult<u64> {
        let mut tx = self.begin_write().await?;
        let done = sqlx::query(
            "UPDATE requests SET recount = 0, state = 'cancelled', finished_at = ?
             WHERE job_id = ? AND tranche_seq = (SELECT seq FROM tranches WHERE id = ?)
               AND state = 'queued'",
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
}
