//! Retention: a finished job's request rows removed in one transaction, its summary kept, and
//! the questions that decide which bytes no other job needs.

use sqlx::Row;
use tranche_core::{JobId, TrancheId};
use tranche_store::rows::job_from_row;
use tranche_store::*;

use crate::SqliteStore;

/// Deletes the rows of `$table` that belong to the requests of the job bound as `?1`.
macro_rules! of_jobs_requests {
    ($table:literal) => {
        concat!(
            "DELETE FROM ",
            $table,
            " WHERE request_id IN (SELECT id FROM requests WHERE ",
            job_rows!(),
            ")"
        )
    };
}

#[async_trait::async_trait]
impl PruneStore for SqliteStore {
    async fn prunable_jobs(&self, before: i64) -> StoreResult<Vec<(JobRecord, bool)>> {
        let rows = sqlx::query(
            "SELECT *, pruned_at IS NULL AS rows_kept FROM jobs
             WHERE bytes_pruned_at IS NULL AND finished_at <= ?
               AND state IN ('done', 'failed', 'cancelled')
             ORDER BY finished_at, id",
        )
        .bind(before)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| Ok((job_from_row(row)?, row.try_get::<i64, _>("rows_kept")? != 0)))
            .collect()
    }

    async fn prune_job_rows(&self, job: JobId, at: i64) -> StoreResult<u64> {
        let id = job.to_string();
        let mut tx = self.begin_write().await?;
        let ended = sqlx::query(
            "UPDATE jobs SET pruned_at = COALESCE(pruned_at, ?)
             WHERE id = ? AND state IN ('done', 'failed', 'cancelled')",
        )
        .bind(at)
        .bind(&id)
        .execute(&mut *tx)
        .await?;
        if ended.rows_affected() == 0 {
            return Ok(0);
        }
        for statement in [
            of_jobs_requests!("attempts"),
            of_jobs_requests!("request_bodies"),
            of_jobs_requests!("request_outputs"),
        ] {
            sqlx::query(statement).bind(&id).execute(&mut *tx).await?;
        }
        let removed = sqlx::query(concat!("DELETE FROM requests WHERE ", job_rows!()))
            .bind(&id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(removed.rows_affected())
    }

    async fn tranche_in_use(
        &self,
        tranche: TrancheId,
        outputs: &str,
        ignoring: &[JobId],
    ) -> StoreResult<bool> {
        let ignoring = crate::json_list(
            "tranche ids",
            &ignoring.iter().map(ToString::to_string).collect::<Vec<_>>(),
        )?;
        let row = sqlx::query(
            "SELECT NOT EXISTS (SELECT 1 FROM tranches WHERE id = ?1 AND state IN ('done', 'failed'))
                 OR EXISTS (SELECT 1 FROM job_tranches AS jt JOIN jobs AS j ON j.id = jt.job_id
                            WHERE jt.tranche_id = ?1 AND j.pruned_at IS NULL
                              AND j.id NOT IN (SELECT value FROM json_each(?3)))
                 OR EXISTS (SELECT 1 FROM requests
                            WHERE cached = 1 AND output_object = ?2
                              AND job_id NOT IN (SELECT value FROM json_each(?3)))",
        )
        .bind(tranche.to_string())
        .bind(outputs)
        .bind(ignoring)
        .fetch_one(&self.pool)
        .await?;
        Ok(row.try_get::<i64, _>(0)? != 0)
    }

    async fn job_pruned(&self, job: JobId, at: i64) -> StoreResult<()> {
        sqlx::query(
            "UPDATE jobs SET bytes_pruned_at = COALESCE(bytes_pruned_at, ?)
             WHERE id = ? AND pruned_at IS NOT NULL",
        )
        .bind(at)
        .bind(job.to_string())
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}
