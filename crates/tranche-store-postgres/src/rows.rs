//! Reading records out of rows.

use sqlx::Row;
use sqlx::postgres::PgRow;
use tranche_core::{AccountId, EngineId};
use tranche_store::*;

use crate::{json_opt, parse, to_u64};

pub(crate) fn attempt_info(row: &PgRow) -> StoreResult<AttemptInfo> {
    let n = |i: usize| -> StoreResult<u32> {
        let v: i64 = row.try_get(i)?;
        Ok(u32::try_from(v).unwrap_or(u32::MAX))
    };
    let job: String = row.try_get("job_id")?;
    Ok(AttemptInfo {
        job_id: parse("job id", &job)?,
        attempts: n(0)?,
        max_attempts: n(1)?,
        batch_returns: n(2)?,
    })
}

pub(crate) fn job_from_row(row: &PgRow) -> StoreResult<JobRecord> {
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
        cancel_requested: row.try_get("cancel_requested")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        finished_at: row.try_get("finished_at")?,
        review: review_from_row(row)?,
        paused: json_opt(row.try_get("paused_error")?)?,
    })
}

fn review_from_row(row: &PgRow) -> StoreResult<Option<Review>> {
    let verdict: Option<String> = row.try_get("review_verdict")?;
    let verdict = match verdict.as_deref() {
        None => return Ok(None),
        Some("approved") => ReviewVerdict::Approved,
        Some("rejected") => ReviewVerdict::Rejected,
        Some(other) => return Err(StoreError::Corrupt(format!("review verdict `{other}`"))),
    };
    Ok(Some(Review {
        verdict,
        by: row.try_get::<Option<String>, _>("reviewed_by")?.unwrap_or_default(),
        at: row.try_get::<Option<i64>, _>("reviewed_at")?.unwrap_or_default(),
    }))
}

pub(crate) fn tranche_from_row(row: &PgRow) -> StoreResult<TrancheRecord> {
    let id: String = row.try_get("id")?;
    let provider: String = row.try_get("provider")?;
    let endpoint: String = row.try_get("endpoint")?;
    let state: String = row.try_get("state")?;
    Ok(TrancheRecord {
        id: parse("tranche id", &id)?,
        provider: parse("provider", &provider)?,
        endpoint: parse("endpoint", &endpoint)?,
        model: row.try_get("model")?,
        answer_check: row.try_get("answer_check")?,
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
        cancel_requested: row.try_get("cancel_requested")?,
        lease_owner: row.try_get::<Option<String>, _>("lease_owner")?.map(EngineId::from_stored),
        lease_expires_at: row.try_get("lease_expires_at")?,
        account: row.try_get::<Option<String>, _>("account")?.map(AccountId::from_stored),
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

/// A request's outcome from the columns `job_results` selects, in its order.
pub(crate) fn result_from_row(row: &PgRow) -> StoreResult<ResultRow> {
    let tranche: Option<String> = row.try_get(3)?;
    let state: String = row.try_get(4)?;
    let endpoint: String = row.try_get(15)?;
    let text: Option<String> = row.try_get(5)?;
    let object: Option<String> = row.try_get(7)?;
    let range: (Option<i64>, Option<i64>) = (row.try_get(8)?, row.try_get(9)?);
    let output = match (text, object, range) {
        (Some(text), _, _) => Some(OutputRef::Text(text)),
        (None, Some(object), (Some(offset), Some(len))) => {
            Some(OutputRef::InObject { object, offset: to_u64(offset), len: to_u64(len) })
        }
        _ => None,
    };
    let count = |i: usize| -> StoreResult<u32> {
        Ok(u32::try_from(row.try_get::<i64, _>(i)?).unwrap_or(u32::MAX))
    };
    Ok(ResultRow {
        request_id: row.try_get(0)?,
        custom_id: row.try_get(1)?,
        wire_id: row.try_get(2)?,
        tranche_id: tranche.map(|t| parse("tranche id", &t)).transpose()?,
        endpoint: parse("endpoint", &endpoint)?,
        state: parse("request state", &state)?,
        output,
        error: row.try_get(6)?,
        cached: row.try_get(10)?,
        attempts: count(11)?,
        max_attempts: count(12)?,
        input_tokens: row.try_get::<Option<i64>, _>(13)?.map(to_u64),
        output_tokens: row.try_get::<Option<i64>, _>(14)?.map(to_u64),
    })
}

/// A request body from its columns: kept in the database (`text`), or a range of its job's body
/// object; `None` when neither is there.
pub(crate) fn input_body(
    text: Option<String>,
    object: Option<String>,
    range: (Option<i64>, Option<i64>),
) -> Option<InputBody> {
    match (text, object, range) {
        (Some(text), _, _) => Some(InputBody::Text(text)),
        (None, Some(object), (Some(offset), Some(len))) => {
            Some(InputBody::InObject { object, offset: to_u64(offset), len: to_u64(len) })
        }
        _ => None,
    }
}
