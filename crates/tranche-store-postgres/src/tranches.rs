//! Tranches: due ones, their input lines, and compare-and-set transitions.

use futures::stream::{BoxStream, StreamExt, TryStreamExt};
use sqlx::Row;
use tranche_core::{LeaseToken, ProviderKind, TrancheId};
use tranche_store::rows::*;
use tranche_store::*;

use crate::PgStore;

#[async_trait::async_trait]
impl TrancheStore for PgStore {
    async fn due_tranches(&self, now: i64) -> StoreResult<Vec<TrancheRecord>> {
        let rows = sqlx::query(concat!(
            "SELECT * FROM tranches WHERE state NOT IN ('done', 'failed') AND not_before <= $1
               AND (lease_token IS NULL OR lease_expires_at <= ",
            db_now_ms!(),
            ") ORDER BY created_at, id"
        ))
        .bind(now)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(tranche_from_row).collect()
    }

    async fn next_due(&self) -> StoreResult<Option<i64>> {
        // A tranche another engine holds is due when its lease lapses, not before.
        let row = sqlx::query(concat!(
            "SELECT MIN(CASE WHEN lease_token IS NOT NULL AND lease_expires_at > ",
            db_now_ms!(),
            " THEN GREATEST(not_before, (lease_expires_at + 999) / 1000) ELSE not_before END)
             FROM tranches WHERE state NOT IN ('done', 'failed')"
        ))
        .fetch_one(&self.pool)
        .await?;
        Ok(row.try_get(0)?)
    }

    async fn tranche(&self, id: TrancheId) -> StoreResult<Option<TrancheRecord>> {
        let row = sqlx::query("SELECT * FROM tranches WHERE id = $1")
            .bind(id.to_string())
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| tranche_from_row(&r)).transpose()
    }

    fn tranche_input(&self, id: TrancheId) -> BoxStream<'_, StoreResult<InputLine>> {
        // In request order: a job's bodies follow one another in its body object, so the
        // engine reads them in few, long ranges.
        sqlx::query(
            "SELECT r.wire_id, r.endpoint, b.body, j.body_object, r.body_offset, r.body_length,
                    r.job_id
             FROM requests AS r
             JOIN jobs AS j ON j.id = r.job_id
             LEFT JOIN request_bodies AS b ON b.request_id = r.id
             WHERE r.tranche_id = $1 AND r.state = 'queued' ORDER BY r.id",
        )
        .bind(id.to_string())
        .fetch(&self.pool)
        .map_err(StoreError::from)
        .and_then(|row| async move { input_line_from_row(&row) })
        .boxed()
    }

    async fn tranche_input_bytes(&self, id: TrancheId) -> StoreResult<u64> {
        let bytes: i64 = sqlx::query_scalar(
            "SELECT COALESCE(SUM(wire_bytes), 0)::BIGINT FROM requests
             WHERE tranche_id = $1 AND state = 'queued'",
        )
        .bind(id.to_string())
        .fetch_one(&self.pool)
        .await?;
        Ok(to_u64(bytes))
    }

    async fn update_tranche(
        &self,
        id: TrancheId,
        held: Held,
        update: TrancheUpdate,
    ) -> StoreResult<bool> {
        let done = sqlx::query(
            "UPDATE tranches SET
                state = $1,
                input_file_id = COALESCE($2, input_file_id),
                batch_id = COALESCE($3, batch_id),
                batch_status = COALESCE($4, batch_status),
                output_file_id = COALESCE($5, output_file_id),
                error_file_id = COALESCE($6, error_file_id),
                results_url = COALESCE($7, results_url),
                batch_errors = COALESCE($8, batch_errors),
                last_error = $9,
                not_before = $10,
                updated_at = $11
             WHERE id = $12 AND state = $13 AND lease_token = $14",
        )
        .bind(update.state.as_str())
        .bind(update.input_file_id)
        .bind(update.batch_id)
        .bind(update.batch_status)
        .bind(update.output_file_id)
        .bind(update.error_file_id)
        .bind(update.results_url)
        .bind(update.batch_errors.map(|v| v.to_string()))
        .bind(update.last_error.map(|v| v.to_string()))
        .bind(update.not_before)
        .bind(update.at)
        .bind(id.to_string())
        .bind(held.state.as_str())
        .bind(held.token.to_string())
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn defer_tranche(
        &self,
        id: TrancheId,
        token: LeaseToken,
        last_error: &serde_json::Value,
        not_before: i64,
        at: i64,
    ) -> StoreResult<bool> {
        let done = sqlx::query(
            "UPDATE tranches SET last_error = $1, not_before = $2, updated_at = $3
             WHERE id = $4 AND lease_token = $5",
        )
        .bind(last_error.to_string())
        .bind(not_before)
        .bind(at)
        .bind(id.to_string())
        .bind(token.to_string())
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn request_tranche_cancel(&self, id: TrancheId, at: i64) -> StoreResult<()> {
        sqlx::query(
            "UPDATE tranches SET cancel_requested = true, not_before = $1, updated_at = $1
             WHERE id = $2",
        )
        .bind(at)
        .bind(id.to_string())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn tranche_has_wire_id(&self, tranche: TrancheId, wire_id: &str) -> StoreResult<bool> {
        let row = sqlx::query(
            "SELECT 1 FROM requests WHERE tranche_id = $1 AND wire_id = $2 AND state = 'queued'
             LIMIT 1",
        )
        .bind(tranche.to_string())
        .bind(wire_id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.is_some())
    }

    async fn tranche_of_batch(
        &self,
        provider: ProviderKind,
        batch_id: &str,
    ) -> StoreResult<Option<TrancheId>> {
        let row = sqlx::query("SELECT id FROM tranches WHERE provider = $1 AND batch_id = $2")
            .bind(provider.as_str())
            .bind(batch_id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|row| {
            let id: String = row.try_get(0)?;
            parse("tranche id", &id)
        })
        .transpose()
    }
}
