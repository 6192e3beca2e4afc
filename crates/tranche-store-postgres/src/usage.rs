//! The usage ledger's reports: a job's sums, or a period's over every job or one tenant's.

use tranche_core::JobId;
use tranche_store::rows::{day_of, usage_from_row};
use tranche_store::*;

use crate::PgStore;

#[async_trait::async_trait]
impl UsageStore for PgStore {
    async fn job_usage(&self, job: JobId) -> StoreResult<Vec<UsageRow>> {
        // SUM of BIGINT is NUMERIC in PostgreSQL: cast back.
        let rows = sqlx::query(
            "SELECT kind, provider, model, SUM(requests)::bigint, SUM(input_tokens)::bigint,
                    SUM(cached_input_tokens)::bigint, SUM(cache_write_5m_tokens)::bigint,
                    SUM(cache_write_1h_tokens)::bigint, SUM(output_tokens)::bigint,
                    SUM(reasoning_tokens)::bigint
             FROM usage_totals WHERE job_id = $1
             GROUP BY kind, provider, model ORDER BY kind, provider, model",
        )
        .bind(job.to_string())
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(usage_from_row).collect()
    }

    async fn usage_since(&self, since: i64, tenant: Option<&str>) -> StoreResult<Vec<UsageRow>> {
        let rows = sqlx::query(
            "SELECT u.kind, u.provider, u.model, SUM(u.requests)::bigint,
                    SUM(u.input_tokens)::bigint, SUM(u.cached_input_tokens)::bigint,
                    SUM(u.cache_write_5m_tokens)::bigint, SUM(u.cache_write_1h_tokens)::bigint,
                    SUM(u.output_tokens)::bigint, SUM(u.reasoning_tokens)::bigint
             FROM usage_totals AS u JOIN jobs AS j ON j.id = u.job_id
             WHERE u.day >= $1 AND ($2::text IS NULL OR j.tenant = $2)
             GROUP BY u.kind, u.provider, u.model ORDER BY u.kind, u.provider, u.model",
        )
        .bind(day_of(since))
        .bind(tenant)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(usage_from_row).collect()
    }
}
