//! Reading records out of rows.

use sqlx::Row;
use sqlx::sqlite::SqliteRow;
use tranche_core::{AccountId, EngineId};
use tranche_store::*;

use crate::{json_opt, parse, to_u64};

pub(crate) fn attempt_info(row: &SqliteRow) -> StoreResult<AttemptInfo> {
    let n = |i: usize| -> StoreResult<u32> {
        let v: i64 = row.try_get(i)?;
        Ok(u32::try_from(v).unwrap_or(u32::MAX))
    };
    Ok(AttemptInfo { attempts: n(0)?, max_attempts: n(1)?, batch_returns: n(2)? })
}

pub(crate) fn job_from_row(row: &SqliteRow) -> StoreResult<JobRecord> {
    let id: String = row.try_get("id")?;
    let provider: String = row.try_get("provider")?;
    let state: String = row.try_get("state")?;
    let settings: String = row.try_get("settings")?;
    Ok(JobRecord {
        id: parse("job id", &id)?,
        provider: parse("provider", &provider)?,
        state: parse("job state", &state)?,
        source: row.try_get("source")?,
        settings: serde_json::from_str(&settings)
            .map_err(|e| StoreError::Corrupt(format!("job settings: {e}")))?,
        accepted: to_u64(row.try_get("accepted")?),
        last_error: json_opt(row.try_get("last_error")?)?,
        cancel_requested: row.try_get::<i64, _>("cancel_requested")? != 0,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        finished_at: row.try_get("finished_at")?,
    })
}

pub(crate) fn tranche_from_row(row: &SqliteRow) -> StoreResult<TrancheRecord> {
    let id: String = row.try_get("id")?;
    let provider: String = row.try_get("provider")?;
    let endpoint: String = row.try_get("endpoint")?;
    let state: String = row.try_get("state")?;
    Ok(TrancheRecord {
        id: parse("tranche id", &id)?,
        provider: parse("provider", &provider)?,
        endpoint: parse("endpoint", &endpoint)?,
        model: row.try_get("model")?,
        state: parse("tranche state", &state)?,
        request_count: to_u64(row.try_get("request_count")?),
        bytes: to_u64(row.try_get("bytes")?),
        input_file_id: row.try_get("input_file_id")?,
        batch_id: row.try_get("batch_id")?,
        batch_status: row.try_get("batch_status")?,
        output_file_id: row.try_get("output_file_id")?,
        error_file_id: row.try_get("error_file_id")?,
        results_url: row.try_get("results_url")?,
        batch_errors: json_opt(row.try_get("batch_errors")?)?,
        last_error: json_opt(row.try_get("last_error")?)?,
        not_before: row.try_get("not_before")?,
        est_tokens: to_u64(row.try_get("est_tokens")?),
        cancel_requested: row.try_get::<i64, _>("cancel_requested")? != 0,
        lease_owner: row.try_get::<Option<String>, _>("lease_owner")?.map(EngineId::from_stored),
        lease_expires_at: row.try_get("lease_expires_at")?,
        account: row.try_get::<Option<String>, _>("account")?.map(AccountId::from_stored),
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}
