//! The figures a metrics scrape shows: jobs, requests and tranches by state, billed tokens by
//! provider and model, and the upstream errors jobs and tranches carry, each an aggregate over
//! the job counters, the tranches, or the usage ledger, read in one transaction.

use sqlx::Row;
use tranche_store::rows::{parse, to_u64, usage_from_row};
use tranche_store::*;

use crate::PgStore;

#[async_trait::async_trait]
impl MetricsStore for PgStore {
    async fn metrics_snapshot(&self) -> StoreResult<MetricsSnapshot> {
        // One snapshot for every figure (read committed would take one per statement); a
        // transaction that only reads never fails to serialize.
        let mut tx =
            self.pool.begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY").await?;
        let rows = sqlx::query("SELECT state, COUNT(*) FROM jobs GROUP BY state ORDER BY state")
            .fetch_all(&mut *tx)
            .await?;
        let jobs = rows
            .iter()
            .map(|row| Ok((parse("job state", row.try_get(0)?)?, to_u64(row.try_get(1)?))))
            .collect::<StoreResult<Vec<_>>>()?;
        let row = sqlx::query(
            // SUM of BIGINT is NUMERIC in PostgreSQL: cast back.
            "SELECT COALESCE(SUM(accepted), 0)::bigint, COALESCE(SUM(n_pending), 0)::bigint,
                    COALESCE(SUM(n_queued), 0)::bigint, COALESCE(SUM(n_succeeded), 0)::bigint,
                    COALESCE(SUM(n_failed), 0)::bigint, COALESCE(SUM(n_cancelled), 0)::bigint,
                    COALESCE(SUM(n_cached), 0)::bigint, COALESCE(SUM(n_retried), 0)::bigint
             FROM jobs",
        )
        .fetch_one(&mut *tx)
        .await?;
        let n = |i: usize| -> StoreResult<u64> { Ok(to_u64(row.try_get(i)?)) };
        let requests = RequestCounts {
            accepted: n(0)?,
            pending: n(1)?,
            queued: n(2)?,
            succeeded: n(3)?,
            failed: n(4)?,
            cancelled: n(5)?,
            cached: n(6)?,
            retried: n(7)?,
        };
        let rows =
            sqlx::query("SELECT state, COUNT(*) FROM tranches GROUP BY state ORDER BY state")
                .fetch_all(&mut *tx)
                .await?;
        let tranches = rows
            .iter()
            .map(|row| Ok((parse("tranche state", row.try_get(0)?)?, to_u64(row.try_get(1)?))))
            .collect::<StoreResult<Vec<_>>>()?;
        let rows = sqlx::query(
            "SELECT kind, provider, model, SUM(requests)::bigint, SUM(input_tokens)::bigint,
                    SUM(cached_input_tokens)::bigint, SUM(cache_write_5m_tokens)::bigint,
                    SUM(cache_write_1h_tokens)::bigint, SUM(output_tokens)::bigint,
                    SUM(reasoning_tokens)::bigint
             FROM usage_totals WHERE kind = 'billed'
             GROUP BY kind, provider, model ORDER BY provider, model",
        )
        .fetch_all(&mut *tx)
        .await?;
        let billed = rows.iter().map(usage_from_row).collect::<StoreResult<Vec<_>>>()?;
        // A job's error is its pause while it waits for room, else its last error; a
        // tranche's is the last one, which its next transition clears. Errors that name no
        // provider are not upstream's.
        let rows = sqlx::query(
            "SELECT carrier, provider, code, COUNT(*) FROM (
                 SELECT carrier,
                        e::jsonb ->> 'provider' AS provider,
                        COALESCE(e::jsonb ->> 'code', e::jsonb ->> 'error_type',
                                 e::jsonb ->> 'type', 'none') AS code
                 FROM (SELECT 'job'::text AS carrier, COALESCE(paused_error, last_error) AS e
                       FROM jobs WHERE paused_error IS NOT NULL OR last_error IS NOT NULL
                       UNION ALL
                       SELECT 'tranche', last_error FROM tranches WHERE last_error IS NOT NULL) AS errors) AS upstream
             WHERE provider IS NOT NULL
             GROUP BY carrier, provider, code ORDER BY carrier, provider, code",
        )
        .fetch_all(&mut *tx)
        .await?;
        let upstream_errors = rows
            .iter()
            .map(|row| {
                Ok(UpstreamErrorCount {
                    carrier: parse("error carrier", row.try_get(0)?)?,
                    provider: row.try_get(1)?,
                    code: row.try_get(2)?,
                    count: to_u64(row.try_get(3)?),
                })
            })
            .collect::<StoreResult<Vec<_>>>()?;
        tx.commit().await?;
        Ok(MetricsSnapshot { jobs, requests, tranches, billed, upstream_errors })
    }
}
