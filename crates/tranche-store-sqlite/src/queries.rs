//! The views `status` and `results` show.

use futures::stream::{BoxStream, StreamExt, TryStreamExt};
use sqlx::Row;
use tranche_core::{JobId, TrancheState};
use tranche_store::rows::{parse, result_from_row, to_u64, tranche_from_row};
use tranche_store::*;

use crate::SqliteStore;

#[async_trait::async_trait]
impl QueryStore for SqliteStore {
    async fn job_counts(&self, id: JobId) -> StoreResult<RequestCounts> {
        // Kept by `requests_keep_job_counters`: one row, whatever the job's size.
        let row = sqlx::query(
            "SELECT accepted, n_pending, n_queued, n_succeeded, n_failed, n_cancelled, n_cached,
                    n_retried
             FROM jobs WHERE id = ?",
        )
        .bind(id.to_string())
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(RequestCounts::default()) };
        let n = |i: usize| -> StoreResult<u64> { Ok(to_u64(row.try_get(i)?)) };
        Ok(RequestCounts {
            accepted: n(0)?,
            pending: n(1)?,
            queued: n(2)?,
            succeeded: n(3)?,
            failed: n(4)?,
            cancelled: n(5)?,
            cached: n(6)?,
            retried: n(7)?,
        })
    }

    async fn job_tokens(&self, id: JobId) -> StoreResult<TokenTotals> {
        // What the providers billed, every attempt counted once (the usage ledger), so that
        // `status` and `cost` agree.
        let row = sqlx::query(
            "SELECT COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0)
             FROM usage_totals WHERE job_id = ? AND kind = 'billed'",
        )
        .bind(id.to_string())
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(TokenTotals::default()) };
        Ok(TokenTotals {
            input_tokens: to_u64(row.try_get(0)?),
            output_tokens: to_u64(row.try_get(1)?),
        })
    }

    async fn job_tranche_counts(&self, id: JobId) -> StoreResult<Vec<(TrancheState, u64)>> {
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

    async fn job_unfinished_tranches(&self, id: JobId) -> StoreResult<Vec<TrancheRecord>> {
        let rows = sqlx::query(
            "SELECT t.* FROM job_tranches AS j JOIN tranches AS t ON t.id = j.tranche_id
             WHERE j.job_id = ? AND t.state NOT IN ('done', 'failed')
             ORDER BY t.created_at, t.id",
        )
        .bind(id.to_string())
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(tranche_from_row).collect()
    }

    async fn job_file_counts(&self, id: JobId) -> StoreResult<FileCounts> {
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

    fn job_results(&self, id: JobId) -> BoxStream<'_, StoreResult<ResultRow>> {
        // A job's requests take increasing ids in input order (its writer numbers them), so
        // the job's id range, read in rowid order, is its input order: no sort of the whole
        // job, which at a million requests is a temporary B-tree of all its rows. The `+`
        // keeps the job filter from choosing an index over the range.
        sqlx::query(
            "SELECT r.id, r.custom_id, r.wire_id, r.tranche_id, r.state, o.output, r.error,
                    r.output_object, r.output_offset, r.output_length, r.cached, r.attempts,
                    r.max_attempts, r.input_tokens, r.output_tokens, r.endpoint
             FROM requests AS r LEFT JOIN request_outputs AS o ON o.request_id = r.id
             WHERE r.id BETWEEN (SELECT MIN(id) FROM requests WHERE job_id = ?1)
                            AND (SELECT MAX(id) FROM requests WHERE job_id = ?1)
               AND +r.job_id = ?1
             ORDER BY r.id",
        )
        .bind(id.to_string())
        .fetch(&self.pool)
        .map_err(StoreError::from)
        .and_then(|row| async move { result_from_row(&row) })
        .boxed()
    }
}
