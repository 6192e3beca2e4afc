//! Provider files, tracked until deleted.

use sqlx::Row;
use tranche_core::{AccountId, ProviderKind, TrancheId};
use tranche_store::*;

use crate::{SqliteStore, to_i64};

#[async_trait::async_trait]
impl FileStore for SqliteStore {
    async fn record_file(&self, file: &FileRecord) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO provider_files (provider, file_id, purpose, tranche_id, filename, bytes,
                                         expires_at, created_at)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)
             ON CONFLICT (provider, file_id) DO NOTHING",
        )
        .bind(file.provider.as_str())
        .bind(&file.file_id)
        .bind(file.purpose.as_str())
        .bind(file.tranche_id.to_string())
        .bind(file.filename.as_deref())
        .bind(file.bytes.map(to_i64))
        .bind(file.expires_at)
        .bind(file.created_at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn mark_file_deleted(
        &self,
        provider: ProviderKind,
        file_id: &str,
        at: i64,
    ) -> StoreResult<()> {
        sqlx::query(
            "UPDATE provider_files SET deleted_at = COALESCE(deleted_at, ?) WHERE provider = ? AND file_id = ?",
        )
        .bind(at)
        .bind(provider.as_str())
        .bind(file_id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn live_files(&self, tranche: TrancheId) -> StoreResult<Vec<String>> {
        let rows = sqlx::query(
            "SELECT file_id FROM provider_files WHERE tranche_id = ? AND deleted_at IS NULL ORDER BY created_at, file_id",
        )
        .bind(tranche.to_string())
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
    }

    async fn tranche_uploads(&self, tranche: TrancheId) -> StoreResult<u64> {
        let row = sqlx::query(
            "SELECT COUNT(*) FROM provider_files WHERE tranche_id = ? AND purpose = 'batch_input'",
        )
        .bind(tranche.to_string())
        .fetch_one(&self.pool)
        .await?;
        Ok(crate::to_u64(row.try_get(0)?))
    }

    async fn leftover_files(
        &self,
        provider: ProviderKind,
        account: Option<&AccountId>,
    ) -> StoreResult<Vec<String>> {
        let rows = sqlx::query(
            "SELECT f.file_id FROM provider_files AS f JOIN tranches AS t ON t.id = f.tranche_id
             WHERE f.provider = ? AND f.deleted_at IS NULL AND t.state IN ('done', 'failed')
               AND t.account IS ?
             ORDER BY f.created_at, f.file_id",
        )
        .bind(provider.as_str())
        .bind(account.map(AccountId::as_str))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
    }

    async fn tranches_holding_files(
        &self,
        provider: ProviderKind,
        account: Option<&AccountId>,
        except: TrancheId,
    ) -> StoreResult<u64> {
        let row = sqlx::query(
            "SELECT COUNT(DISTINCT t.id) FROM tranches AS t
             JOIN provider_files AS f ON f.tranche_id = t.id AND f.deleted_at IS NULL
             WHERE t.provider = ? AND t.account IS ? AND t.id != ?
               AND t.state NOT IN ('done', 'failed')",
        )
        .bind(provider.as_str())
        .bind(account.map(AccountId::as_str))
        .bind(except.to_string())
        .fetch_one(&self.pool)
        .await?;
        Ok(crate::to_u64(row.try_get(0)?))
    }
}
