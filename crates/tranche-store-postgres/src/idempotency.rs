//! Idempotency keys of submissions: claimed in one statement (a stale, never completed claim
//! taken over), completed with the job, released when the submission was refused.

use sqlx::Row;
use tranche_core::JobId;
use tranche_store::rows::parse;
use tranche_store::*;

use crate::PgStore;

#[async_trait::async_trait]
impl IdempotencyStore for PgStore {
    async fn claim_key(
        &self,
        tenant: &str,
        key: &str,
        at: i64,
        stale_before: i64,
    ) -> StoreResult<KeyClaim> {
        // One statement: a new key is inserted, a stale unfinished claim refreshed; a live
        // claim or a completed key is left as it is and read back.
        let claimed = sqlx::query(
            "INSERT INTO idempotency_keys (tenant, key, created_at) VALUES ($1, $2, $3)
             ON CONFLICT (tenant, key) DO UPDATE SET created_at = excluded.created_at
             WHERE idempotency_keys.job_id IS NULL AND idempotency_keys.created_at < $4",
        )
        .bind(tenant)
        .bind(key)
        .bind(at)
        .bind(stale_before)
        .execute(&self.pool)
        .await?
        .rows_affected();
        if claimed == 1 {
            return Ok(KeyClaim::Claimed);
        }
        let row = sqlx::query(
            "SELECT job_id, body_sha256 FROM idempotency_keys WHERE tenant = $1 AND key = $2",
        )
        .bind(tenant)
        .bind(key)
        .fetch_one(&self.pool)
        .await?;
        let job: Option<String> = row.try_get(0)?;
        Ok(KeyClaim::Held {
            job: job.map(|j| parse::<JobId>("job id", &j)).transpose()?,
            body_sha256: row.try_get(1)?,
        })
    }

    async fn complete_key(
        &self,
        tenant: &str,
        key: &str,
        body_sha256: &str,
        job: JobId,
    ) -> StoreResult<()> {
        sqlx::query(
            "UPDATE idempotency_keys SET job_id = $1, body_sha256 = $2
             WHERE tenant = $3 AND key = $4 AND job_id IS NULL",
        )
        .bind(job.to_string())
        .bind(body_sha256)
        .bind(tenant)
        .bind(key)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn release_key(&self, tenant: &str, key: &str) -> StoreResult<()> {
        sqlx::query(
            "DELETE FROM idempotency_keys WHERE tenant = $1 AND key = $2 AND job_id IS NULL",
        )
        .bind(tenant)
        .bind(key)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}
