//! The blob store's objects as recorded once whole.

use sqlx::{Executor, Postgres, Row};
use tranche_store::rows::{to_i64, to_u64};
use tranche_store::*;

use crate::PgStore;

/// Records `blob` through `executor` (the pool, or a job's transaction).
pub(crate) async fn record<'c>(
    executor: impl Executor<'c, Database = Postgres>,
    blob: &BlobRecord,
) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO blob_objects (key, size, sha256, created_at) VALUES ($1, $2, $3, $4)
         ON CONFLICT (key) DO UPDATE SET size = excluded.size, sha256 = excluded.sha256,
                                         created_at = excluded.created_at",
    )
    .bind(&blob.key)
    .bind(to_i64(blob.size))
    .bind(&blob.sha256)
    .bind(blob.created_at)
    .execute(executor)
    .await?;
    Ok(())
}

#[async_trait::async_trait]
impl BlobIndex for PgStore {
    async fn record_blob(&self, blob: &BlobRecord) -> StoreResult<()> {
        record(&self.pool, blob).await
    }

    async fn blob(&self, key: &str) -> StoreResult<Option<BlobRecord>> {
        let row = sqlx::query("SELECT size, sha256, created_at FROM blob_objects WHERE key = $1")
            .bind(key)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|row| {
            Ok(BlobRecord {
                key: key.to_owned(),
                size: to_u64(row.try_get(0)?),
                sha256: row.try_get(1)?,
                created_at: row.try_get(2)?,
            })
        })
        .transpose()
    }

    async fn forget_blobs(&self, keys: &[String]) -> StoreResult<()> {
        sqlx::query("DELETE FROM blob_objects WHERE key = ANY($1)")
            .bind(keys)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}
