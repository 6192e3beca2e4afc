//! Leases on a tranche or a named duty, judged by the database's clock in milliseconds.

use std::time::Duration;

use sqlx::Row;
use tranche_core::{EngineId, LeaseToken, TrancheId};
use tranche_store::rows::*;
use tranche_store::*;

use crate::SqliteStore;

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn grant(remaining_ms: i64) -> LeaseGrant {
    LeaseGrant { remaining: Duration::from_millis(u64::try_from(remaining_ms).unwrap_or(0)) }
}

#[async_trait::async_trait]
impl LeaseStore for SqliteStore {
    async fn lease_tranche(
        &self,
        id: TrancheId,
        owner: &EngineId,
        token: LeaseToken,
        duration: Duration,
        now: i64,
    ) -> StoreResult<Option<(TrancheRecord, LeaseGrant)>> {
        let row = sqlx::query(concat!(
            "UPDATE tranches SET lease_owner = ?, lease_token = ?, lease_expires_at = ",
            db_now_ms!(),
            " + ?
             WHERE id = ? AND state NOT IN ('done', 'failed') AND not_before <= ?
               AND (lease_token IS NULL OR lease_expires_at <= ",
            db_now_ms!(),
            ")
             RETURNING *, lease_expires_at - ",
            db_now_ms!(),
            " AS remaining_ms"
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
            "UPDATE tranches SET lease_expires_at = ",
            db_now_ms!(),
            " + ? WHERE id = ? AND lease_token = ? RETURNING lease_expires_at - ",
            db_now_ms!(),
            " AS remaining_ms"
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
             WHERE id = ? AND lease_token = ?",
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
        let row = sqlx::query(concat!(
            "INSERT INTO leases (name, owner, token, expires_at) VALUES (?1, ?2, ?3, ",
            db_now_ms!(),
            " + ?4)
             ON CONFLICT (name) DO UPDATE
                SET owner = excluded.owner, token = excluded.token, expires_at = excluded.expires_at
                WHERE leases.expires_at <= ",
            db_now_ms!(),
            " RETURNING expires_at - ",
            db_now_ms!(),
            " AS remaining_ms"
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
            "UPDATE leases SET expires_at = ",
            db_now_ms!(),
            " + ? WHERE name = ? AND token = ? RETURNING expires_at - ",
            db_now_ms!(),
            " AS remaining_ms"
        ))
        .bind(millis(duration))
        .bind(name)
        .bind(token.to_string())
        .fetch_optional(&self.pool)
        .await?;
        row.map(|row| Ok(grant(row.try_get("remaining_ms")?))).transpose()
    }

    async fn release_duty(&self, name: &str, token: LeaseToken) -> StoreResult<()> {
        sqlx::query("DELETE FROM leases WHERE name = ? AND token = ?")
            .bind(name)
            .bind(token.to_string())
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}
