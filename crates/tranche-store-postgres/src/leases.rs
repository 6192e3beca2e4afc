//! Leases on a tranche or a named duty, judged by the database's clock in milliseconds. Each
//! statement reads the clock once (`now`), so that the expiry it compares, the expiry it
//! writes and the time it says is left agree.

use std::time::Duration;

use sqlx::Row;
use tranche_core::{EngineId, LeaseToken, TrancheId};
use tranche_store::rows::*;
use tranche_store::*;

use crate::PgStore;

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn grant(remaining_ms: i64) -> LeaseGrant {
    LeaseGrant { remaining: Duration::from_millis(u64::try_from(remaining_ms).unwrap_or(0)) }
}

#[async_trait::async_trait]
impl LeaseStore for PgStore {
    async fn lease_tranche(
        &self,
        id: TrancheId,
        owner: &EngineId,
        token: LeaseToken,
        duration: Duration,
        now: i64,
    ) -> StoreResult<Option<(TrancheRecord, LeaseGrant)>> {
        // The tranche is selected and locked in one go, skipped when another engine has it
        // locked (it is leasing or stepping it): `None`, as for a tranche leased already.
        // PostgreSQL checks the conditions again on the row it locks.
        let row = sqlx::query(concat!(
            "WITH now AS (SELECT ",
            db_now_ms!(),
            " AS ms)
             UPDATE tranches AS t SET lease_owner = $1, lease_token = $2,
                    lease_expires_at = now.ms + $3
             FROM now
             WHERE t.id = (SELECT d.id FROM tranches AS d, now
                           WHERE d.id = $4 AND d.state NOT IN ('done', 'failed')
                             AND d.not_before <= $5
                             AND (d.lease_token IS NULL OR d.lease_expires_at <= now.ms)
                           FOR NO KEY UPDATE OF d SKIP LOCKED)
             RETURNING t.*, t.lease_expires_at - now.ms AS remaining_ms"
        ))
        .bind(owner.as_str())
        .bind(token.to_string())
        .bind(millis(duration))
        .bind(id.to_string())
        .bind(now)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|row| Ok((tranche_from_row(&row)?, grant(row.try_get("remaining_ms")?))))
            .transpose()
    }

    async fn renew_tranche_lease(
        &self,
        id: TrancheId,
        token: LeaseToken,
        duration: Duration,
    ) -> StoreResult<Option<LeaseGrant>> {
        let row = sqlx::query(concat!(
            "WITH now AS (SELECT ",
            db_now_ms!(),
            " AS ms)
             UPDATE tranches SET lease_expires_at = now.ms + $1 FROM now
             WHERE id = $2 AND lease_token = $3
             RETURNING lease_expires_at - now.ms AS remaining_ms"
        ))
        .bind(millis(duration))
        .bind(id.to_string())
        .bind(token.to_string())
        .fetch_optional(&self.pool)
        .await?;
        row.map(|row| Ok(grant(row.try_get("remaining_ms")?))).transpose()
    }

    async fn release_tranche_lease(&self, id: TrancheId, token: LeaseToken) -> StoreResult<()> {
        sqlx::query(
            "UPDATE tranches SET lease_owner = NULL, lease_token = NULL, lease_expires_at = 0
             WHERE id = $1 AND lease_token = $2",
        )
        .bind(id.to_string())
        .bind(token.to_string())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn acquire_duty(
        &self,
        name: &str,
        owner: &EngineId,
        token: LeaseToken,
        duration: Duration,
    ) -> StoreResult<Option<LeaseGrant>> {
        // Two engines inserting the same name at once: the second waits for the first, then
        // takes the conflict path and finds its lease unexpired.
        let row = sqlx::query(concat!(
            "WITH now AS (SELECT ",
            db_now_ms!(),
            " AS ms)
             INSERT INTO leases (name, owner, token, expires_at)
             SELECT $1, $2, $3, now.ms + $4 FROM now
             ON CONFLICT (name) DO UPDATE
                SET owner = excluded.owner, token = excluded.token, expires_at = excluded.expires_at
                WHERE leases.expires_at <= (SELECT ms FROM now)
             RETURNING expires_at - (SELECT ms FROM now) AS remaining_ms"
        ))
        .bind(name)
        .bind(owner.as_str())
        .bind(token.to_string())
        .bind(millis(duration))
        .fetch_optional(&self.pool)
        .await?;
        row.map(|row| Ok(grant(row.try_get("remaining_ms")?))).transpose()
    }

    async fn renew_duty(
        &self,
        name: &str,
        token: LeaseToken,
        duration: Duration,
    ) -> StoreResult<Option<LeaseGrant>> {
        let row = sqlx::query(concat!(
            "WITH now AS (SELECT ",
            db_now_ms!(),
            " AS ms)
             UPDATE leases SET expires_at = now.ms + $1 FROM now
             WHERE name = $2 AND token = $3
             RETURNING expires_at - now.ms AS remaining_ms"
        ))
        .bind(millis(duration))
        .bind(name)
        .bind(token.to_string())
        .fetch_optional(&self.pool)
        .await?;
        row.map(|row| Ok(grant(row.try_get("remaining_ms")?))).transpose()
    }

    async fn release_duty(&self, name: &str, token: LeaseToken) -> StoreResult<()> {
        sqlx::query("DELETE FROM leases WHERE name = $1 AND token = $2")
            .bind(name)
            .bind(token.to_string())
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}
