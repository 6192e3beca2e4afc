//! Provider files, tracked until deleted.

use sqlx::Row;
use tranche_core::{AccountId, ProviderKind, TrancheId, TrancheState};
use tranche_store::rows::{parse, to_i64, to_u64};
use tranche_store::*;

use crate::PgStore;

#[async_trait::async_trait]
impl FileStore for PgStore {
    async fn record_file(&self, file: &FileRecord) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO provider_files (provider, file_id, purpose, tranche_id, filename, bytes,
                                         expires_at, created_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
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
            "UPDATE provider_files SET deleted_at = COALESCE(deleted_at, $1) WHERE provider = $2 AND file_id = $3",
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
            "SELECT file_id FROM provider_files WHERE tranche_id = $1 AND deleted_at IS NULL ORDER BY created_at, file_id",
        )
        .bind(tranche.to_string())
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
    }

    async fn tranche_uploads(&self, tranche: TrancheId) -> StoreResult<u64> {
        let row = sqlx::query(
            "SELECT COUNT(*) FROM provider_files WHERE tranche_id = $1 AND purpose = 'batch_input'",
        )
        .bind(tranche.to_string())
        .fetch_one(&self.pool)
        .await?;
        Ok(to_u64(row.try_get(0)?))
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
             WHERE t.provider = $1 AND t.account IS NOT DISTINCT FROM $2 AND t.id != $3
               AND t.state NOT IN ('done', 'failed')",
        )
        .bind(provider.as_str())
        .bind(account.map(AccountId::as_str))
        .bind(except.to_string())
        .fetch_one(&self.pool)
        .await?;
        Ok(to_u64(row.try_get(0)?))
    }

    async fn file_owners(
        &self,
        provider: ProviderKind,
        file_ids: &[String],
    ) -> StoreResult<Vec<FileOwner>> {
        let rows = sqlx::query(
            "SELECT f.file_id, f.tranche_id, t.state FROM provider_files AS f
             JOIN tranches AS t ON t.id = f.tranche_id
             WHERE f.provider = $1 AND f.file_id = ANY($2)",
        )
        .bind(provider.as_str())
        .bind(file_ids)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let tranche: String = row.try_get(1)?;
                let state: String = row.try_get(2)?;
                Ok(FileOwner {
                    file_id: row.try_get(0)?,
                    tranche_id: parse("tranche id", &tranche)?,
                    tranche_state: parse("tranche state", &state)?,
                })
            })
            .collect()
    }

    async fn tranche_states(
        &self,
        tranches: &[TrancheId],
    ) -> StoreResult<Vec<(TrancheId, TrancheState)>> {
        let ids: Vec<String> = tranches.iter().map(ToString::to_string).collect();
        let rows = sqlx::query("SELECT id, state FROM tranches WHERE id = ANY($1)")
            .bind(ids)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| {
                let id: String = row.try_get(0)?;
                let state: String = row.try_get(1)?;
                Ok((parse("tranche id", &id)?, parse("tranche state", &state)?))
            })
            .collect()
    }

    async fn uploads_since(
        &self,
        provider: ProviderKind,
        account: Option<&AccountId>,
        since: i64,
    ) -> StoreResult<u64> {
        let row = sqlx::query(
            "SELECT COUNT(*) FROM provider_files AS f JOIN tranches AS t ON t.id = f.tranche_id
             WHERE f.provider = $1 AND f.purpose = 'batch_input' AND f.created_at >= $2
               AND t.account IS NOT DISTINCT FROM $3",
        )
        .bind(provider.as_str())
        .bind(since)
        .bind(account.map(AccountId::as_str))
        .fetch_one(&self.pool)
        .await?;
        Ok(to_u64(row.try_get(0)?))
    }

    async fn account_used(&self, account: &AccountId) -> StoreResult<bool> {
        let row = sqlx::query("SELECT EXISTS (SELECT 1 FROM tranches WHERE account = $1)")
            .bind(account.as_str())
            .fetch_one(&self.pool)
            .await?;
        Ok(row.try_get(0)?)
    }

    async fn record_file_audit(&self, audit: &FileAuditCounts) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO file_audits (account, at, total, inputs_with_expiry, inputs_without_expiry)
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(audit.account.as_str())
        .bind(audit.at)
        .bind(to_i64(audit.total))
        .bind(to_i64(audit.inputs_with_expiry))
        .bind(to_i64(audit.inputs_without_expiry))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn first_file_audit(
        &self,
        account: &AccountId,
        since: i64,
    ) -> StoreResult<Option<FileAuditCounts>> {
        let row = sqlx::query(
            "SELECT at, total, inputs_with_expiry, inputs_without_expiry FROM file_audits
             WHERE account = $1 AND at >= $2 ORDER BY at LIMIT 1",
        )
        .bind(account.as_str())
        .bind(since)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|row| {
            Ok(FileAuditCounts {
                account: account.clone(),
                at: row.try_get(0)?,
                total: to_u64(row.try_get(1)?),
                inputs_with_expiry: to_u64(row.try_get(2)?),
                inputs_without_expiry: to_u64(row.try_get(3)?),
            })
        })
        .transpose()
    }
}
