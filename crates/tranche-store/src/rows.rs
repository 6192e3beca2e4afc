//! What the SQL backends share: records read out of stored rows, whatever the database (each
//! backend's row type reads through sqlx's driver-neutral `Row`), and the conversions between
//! stored and domain values.

use std::str::FromStr;

use sqlx::{ColumnIndex, Decode, Row, Type};
use tranche_core::{AccountId, Endpoint, EngineId, JobId, TokenUsage};

use crate::error::{StoreError, StoreResult};
use crate::records::{
    AttemptInfo, InputBody, InputLine, JobRecord, OutputRef, PendingGroup, ResultRow, Review,
    ReviewVerdict, TenantLoad, TenantRecord, TrancheRecord, UsageRow,
};

/// A value a row of database `DB` can be read as.
pub trait Stored<DB: sqlx::Database>: for<'r> Decode<'r, DB> + Type<DB> {}

impl<DB: sqlx::Database, T> Stored<DB> for T where T: for<'r> Decode<'r, DB> + Type<DB> {}

/// A stored row's columns as the records need them, by name or by position. Every sqlx row
/// whose database stores text, 64-bit integers and flags is one (SQLite keeps flags as 0 or 1,
/// PostgreSQL as BOOLEAN; both read as `bool`).
pub trait StoredRow {
    fn text(&self, column: &str) -> StoreResult<String>;
    fn opt_text(&self, column: &str) -> StoreResult<Option<String>>;
    fn int(&self, column: &str) -> StoreResult<i64>;
    fn opt_int(&self, column: &str) -> StoreResult<Option<i64>>;
    fn flag(&self, column: &str) -> StoreResult<bool>;
    fn text_at(&self, index: usize) -> StoreResult<String>;
    fn opt_text_at(&self, index: usize) -> StoreResult<Option<String>>;
    fn int_at(&self, index: usize) -> StoreResult<i64>;
    fn opt_int_at(&self, index: usize) -> StoreResult<Option<i64>>;
    fn flag_at(&self, index: usize) -> StoreResult<bool>;
}

impl<R> StoredRow for R
where
    R: Row,
    for<'a> &'a str: ColumnIndex<R>,
    usize: ColumnIndex<R>,
    String: Stored<R::Database>,
    i64: Stored<R::Database>,
    bool: Stored<R::Database>,
{
    fn text(&self, column: &str) -> StoreResult<String> {
        Ok(self.try_get(column)?)
    }
    fn opt_text(&self, column: &str) -> StoreResult<Option<String>> {
        Ok(self.try_get(column)?)
    }
    fn int(&self, column: &str) -> StoreResult<i64> {
        Ok(self.try_get(column)?)
    }
    fn opt_int(&self, column: &str) -> StoreResult<Option<i64>> {
        Ok(self.try_get(column)?)
    }
    fn flag(&self, column: &str) -> StoreResult<bool> {
        Ok(self.try_get(column)?)
    }
    fn text_at(&self, index: usize) -> StoreResult<String> {
        Ok(self.try_get(index)?)
    }
    fn opt_text_at(&self, index: usize) -> StoreResult<Option<String>> {
        Ok(self.try_get(index)?)
    }
    fn int_at(&self, index: usize) -> StoreResult<i64> {
        Ok(self.try_get(index)?)
    }
    fn opt_int_at(&self, index: usize) -> StoreResult<Option<i64>> {
        Ok(self.try_get(index)?)
    }
    fn flag_at(&self, index: usize) -> StoreResult<bool> {
        Ok(self.try_get(index)?)
    }
}

/// A stored string read back as the domain value it was written from.
pub fn parse<T: FromStr>(what: &str, s: &str) -> StoreResult<T>
where
    T::Err: std::fmt::Display,
{
    s.parse::<T>().map_err(|e| StoreError::Corrupt(format!("{what}: {e}")))
}

/// Stored JSON text, if any, as a value.
pub fn json_opt(s: Option<String>) -> StoreResult<Option<serde_json::Value>> {
    s.map(|s| serde_json::from_str(&s).map_err(|e| StoreError::Corrupt(format!("json: {e}"))))
        .transpose()
}

/// The start (UTC midnight, unix seconds) of the day a time falls in: the usage ledger's
/// granularity.
pub fn day_of(at: i64) -> i64 {
    at - at.rem_euclid(86_400)
}

/// A count or size as stored (databases have signed 64-bit integers).
pub fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A stored count or size; a negative one (never written) reads as 0.
pub fn to_u64(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

fn to_u32(n: i64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Where a queued request stands: `attempts`, `max_attempts`, `batch_returns` first, then
/// `job_id` by name.
pub fn attempt_info(row: &impl StoredRow) -> StoreResult<AttemptInfo> {
    Ok(AttemptInfo {
        job_id: parse("job id", &row.text("job_id")?)?,
        attempts: to_u32(row.int_at(0)?),
        max_attempts: to_u32(row.int_at(1)?),
        batch_returns: to_u32(row.int_at(2)?),
    })
}

/// A job from a row of `jobs`.
pub fn job_from_row(row: &impl StoredRow) -> StoreResult<JobRecord> {
    Ok(JobRecord {
        id: parse("job id", &row.text("id")?)?,
        provider: parse("provider", &row.text("provider")?)?,
        state: parse("job state", &row.text("state")?)?,
        source: row.opt_text("source")?,
        settings: serde_json::from_str(&row.text("settings")?)
            .map_err(|e| StoreError::Corrupt(format!("job settings: {e}")))?,
        accepted: to_u64(row.int("accepted")?),
        last_error: json_opt(row.opt_text("last_error")?)?,
        cancel_requested: row.flag("cancel_requested")?,
        created_at: row.int("created_at")?,
        updated_at: row.int("updated_at")?,
        finished_at: row.opt_int("finished_at")?,
        review: review_from_row(row)?,
        paused: json_opt(row.opt_text("paused_error")?)?,
    })
}

fn review_from_row(row: &impl StoredRow) -> StoreResult<Option<Review>> {
    let verdict = match row.opt_text("review_verdict")?.as_deref() {
        None => return Ok(None),
        Some("approved") => ReviewVerdict::Approved,
        Some("rejected") => ReviewVerdict::Rejected,
        Some(other) => return Err(StoreError::Corrupt(format!("review verdict `{other}`"))),
    };
    Ok(Some(Review {
        verdict,
        by: row.opt_text("reviewed_by")?.unwrap_or_default(),
        at: row.opt_int("reviewed_at")?.unwrap_or_default(),
    }))
}

/// A tenant from a row of `tenants` (its token's hash is never read back).
pub fn tenant_from_row(row: &impl StoredRow) -> StoreResult<TenantRecord> {
    Ok(TenantRecord {
        name: row.text("name")?,
        admin: row.flag("admin")?,
        created_at: row.int("created_at")?,
        revoked_at: row.opt_int("revoked_at")?,
    })
}

/// What one tenant holds, from a row of `tenant, account, model, enqueued tokens, unfinished
/// tranches` (`PlanStore::tenant_loads`).
pub fn tenant_load_from_row(row: &impl StoredRow) -> StoreResult<TenantLoad> {
    Ok(TenantLoad {
        tenant: row.opt_text_at(0)?,
        account: row.opt_text_at(1)?.map(AccountId::from_stored),
        model: row.text_at(2)?,
        enqueued_tokens: to_u64(row.int_at(3)?),
        live_tranches: to_u64(row.int_at(4)?),
    })
}

/// A group of waiting requests, from a row of `endpoint, model, answer check, tenant, count,
/// oldest acceptance` (`PlanStore::pending_groups`).
pub fn pending_group_from_row(row: &impl StoredRow) -> StoreResult<PendingGroup> {
    Ok(PendingGroup {
        endpoint: parse::<Endpoint>("endpoint", &row.text_at(0)?)?,
        model: row.text_at(1)?,
        answer_check: row.opt_text_at(2)?,
        tenant: row.opt_text_at(3)?,
        count: to_u64(row.int_at(4)?),
        oldest_accepted_at: row.int_at(5)?,
    })
}

/// A tranche from a row of `tranches`.
pub fn tranche_from_row(row: &impl StoredRow) -> StoreResult<TrancheRecord> {
    Ok(TrancheRecord {
        id: parse("tranche id", &row.text("id")?)?,
        provider: parse("provider", &row.text("provider")?)?,
        endpoint: parse("endpoint", &row.text("endpoint")?)?,
        model: row.text("model")?,
        answer_check: row.opt_text("answer_check")?,
        state: parse("tranche state", &row.text("state")?)?,
        request_count: to_u64(row.int("request_count")?),
        bytes: to_u64(row.int("bytes")?),
        input_file_id: row.opt_text("input_file_id")?,
        batch_id: row.opt_text("batch_id")?,
        batch_status: row.opt_text("batch_status")?,
        output_file_id: row.opt_text("output_file_id")?,
        error_file_id: row.opt_text("error_file_id")?,
        results_url: row.opt_text("results_url")?,
        batch_errors: json_opt(row.opt_text("batch_errors")?)?,
        last_error: json_opt(row.opt_text("last_error")?)?,
        not_before: row.int("not_before")?,
        est_tokens: to_u64(row.int("est_tokens")?),
        cancel_requested: row.flag("cancel_requested")?,
        lease_owner: row.opt_text("lease_owner")?.map(EngineId::from_stored),
        lease_expires_at: row.int("lease_expires_at")?,
        account: row.opt_text("account")?.map(AccountId::from_stored),
        created_at: row.int("created_at")?,
        updated_at: row.int("updated_at")?,
    })
}

/// A request's outcome from the columns `job_results` selects, in its order.
pub fn result_from_row(row: &impl StoredRow) -> StoreResult<ResultRow> {
    let output = match (row.opt_text_at(5)?, row.opt_text_at(7)?) {
        (Some(text), _) => Some(OutputRef::Text(text)),
        (None, Some(object)) => match (row.opt_int_at(8)?, row.opt_int_at(9)?) {
            (Some(offset), Some(len)) => {
                Some(OutputRef::InObject { object, offset: to_u64(offset), len: to_u64(len) })
            }
            _ => None,
        },
        (None, None) => None,
    };
    Ok(ResultRow {
        request_id: row.int_at(0)?,
        custom_id: row.text_at(1)?,
        wire_id: row.text_at(2)?,
        tranche_id: row.opt_text_at(3)?.map(|t| parse("tranche id", &t)).transpose()?,
        endpoint: parse("endpoint", &row.text_at(15)?)?,
        state: parse("request state", &row.text_at(4)?)?,
        output,
        error: row.opt_text_at(6)?,
        cached: row.flag_at(10)?,
        attempts: to_u32(row.int_at(11)?),
        max_attempts: to_u32(row.int_at(12)?),
        input_tokens: row.opt_int_at(13)?.map(to_u64),
        output_tokens: row.opt_int_at(14)?.map(to_u64),
    })
}

/// A request body from its columns: kept in the database (`text`), or a range of its job's body
/// object; `None` when neither is there.
pub fn input_body(
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

/// One line of a tranche's input, from a row of `wire_id, endpoint, body, body_object,
/// body_offset, body_length, job_id` (`TrancheStore::tranche_input`).
pub fn input_line_from_row(row: &impl StoredRow) -> StoreResult<InputLine> {
    let job_id = parse("job id", &row.text_at(6)?)?;
    input_line_of_job(row, job_id, row.opt_text_at(3)?)
}

/// One line of a tranche's input of the job `job_id`, whose bodies not kept in the database lie
/// in `body_object`, from a row that holds `wire_id, endpoint, body` and then, in columns 4 and
/// 5, `body_offset, body_length` (what column 3 holds is the caller's).
pub fn input_line_of_job(
    row: &impl StoredRow,
    job_id: JobId,
    body_object: Option<String>,
) -> StoreResult<InputLine> {
    let range = (row.opt_int_at(4)?, row.opt_int_at(5)?);
    let body = input_body(row.opt_text_at(2)?, body_object, range)
        .ok_or_else(|| StoreError::Corrupt("a request has no body".to_owned()))?;
    Ok(InputLine {
        wire_id: row.text_at(0)?,
        job_id,
        endpoint: parse("endpoint", &row.text_at(1)?)?,
        body,
    })
}

/// One row of a usage query: kind, provider, model, then the sums of `requests` and of each
/// token column in the table's order.
pub fn usage_from_row(row: &impl StoredRow) -> StoreResult<UsageRow> {
    let n = |i: usize| -> StoreResult<u64> { Ok(to_u64(row.int_at(i)?)) };
    Ok(UsageRow {
        kind: parse("usage kind", &row.text_at(0)?)?,
        provider: parse("provider", &row.text_at(1)?)?,
        model: row.text_at(2)?,
        requests: n(3)?,
        tokens: TokenUsage {
            input: n(4)?,
            cached_input: n(5)?,
            cache_write_5m: n(6)?,
            cache_write_1h: n(7)?,
            output: n(8)?,
            reasoning: n(9)?,
        },
    })
}

/// Binds a usage's six token counts (or six NULLs) in the ledger's column order: input, cached
/// input, 5-minute and 1-hour cache writes, output, reasoning.
pub fn bind_tokens<'q, DB>(
    query: sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments>,
    tokens: Option<&TokenUsage>,
) -> sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments>
where
    DB: sqlx::Database,
    for<'t> Option<i64>: sqlx::Encode<'t, DB> + Type<DB>,
{
    let n = |f: fn(&TokenUsage) -> u64| tokens.map(|t| to_i64(f(t)));
    query
        .bind(n(|t| t.input))
        .bind(n(|t| t.cached_input))
        .bind(n(|t| t.cache_write_5m))
        .bind(n(|t| t.cache_write_1h))
        .bind(n(|t| t.output))
        .bind(n(|t| t.reasoning))
}
