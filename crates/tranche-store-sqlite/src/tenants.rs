//! Tenants of the HTTP server and the hashes of their tokens (the tokens themselves are never
//! stored): added, found by a token's hash, listed and revoked.

use tranche_store::rows::tenant_from_row;
use tranche_store::*;

use crate::SqliteStore;

#[async_trait::async_trait]
impl TenantStore for SqliteStore {
    async fn add_tenant(
        &self,
        name: &str,
        token_hash: &str,
        admin: bool,
        at: i64,
    ) -> StoreResult<bool> {
        // Only the unique index on unrevoked names is a conflict this answers; a repeated
        // token hash is an error.
        let done = sqlx::query(
            "INSERT INTO tenants (token_hash, name, admin, created_at)
             VALUES (?, ?, ?, ?)
             ON CONFLICT (name) WHERE revoked_at IS NULL DO NOTHING",
        )
        .bind(token_hash)
        .bind(name)
        .bind(admin)
        .bind(at)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn tenant_by_token(&self, token_hash: &str) -> StoreResult<Option<TenantRecord>> {
        let row = sqlx::query(
            "SELECT name, admin, created_at, revoked_at FROM tenants
             WHERE token_hash = ? AND revoked_at IS NULL",
        )
        .bind(token_hash)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| tenant_from_row(&r)).transpose()
    }

    async fn tenants(&self) -> StoreResult<Vec<TenantRecord>> {
        let rows = sqlx::query(
            "SELECT name, admin, created_at, revoked_at FROM tenants
             ORDER BY name, created_at, revoked_at IS NULL, token_hash",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(tenant_from_row).collect()
    }

    async fn revoke_tenant(&self, name: &str, at: i64) -> StoreResult<bool> {
        let done =
            sqlx::query("UPDATE tenants SET revoked_at = ? WHERE name = ? AND revoked_at IS NULL")
                .bind(at)
                .bind(name)
                .execute(&self.pool)
                .await?;
        Ok(done.rows_affected() == 1)
    }
}
