//! The views `status` and `results` show.

use futures::TryFutureExt;
use futures::stream::{BoxStream, StreamExt};
use sqlx::Row;
use tranche_core::{JobId, TrancheState};
use tranche_store::rows::{parse, result_from_row, to_u64, tranche_from_row};
use tranche_store::*;

use crate::SqliteStore;
use crate::pages::{Page, read_pages};

#[async_trait::async_trait]
impl QueryStore for SqliteStore {
    async fn job_counts(&self, id: JobId) -> StoreResult<RequestCounts> {
        // Kept by `requests_keep_job_counters`: one row, whatever the job's size.
        let row = sqlx::query(
            "SELECT accepted, n_pending, n_queued, n_succeeded, n_failed, n_cancelled, n_cached,
                    n_retried
             FROM jobs WHERE id = ?",
        )
        .bind(id.to_string())
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(RequestCounts::default()) };
        let n = |i: usize| -> StoreResult<u64> { Ok(to_u64(row.try_get(i)?)) };
        Ok(RequestCounts {
            accepted: n(0)?,
            pending: n(1)?,
            queued: n(2)?,
            succeeded: n(3)?,
            failed: n(4)?,
            cancelled: n(5)?,
            cached: n(6)?,
            retried: n(7)?,
        })
    }

    async fn job_tokens(&self, id: JobId) -> StoreResult<TokenTotals> {
        // What the providers billed, every attempt counted once (the usage ledger), so that
        // `status` and `cost` agree.
        let row = sqlx::query(
            "SELECT COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0)
             FROM usage_totals WHERE job_id = ? AND kind = 'billed'",
        )
        .bind(id.to_string())
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(TokenTotals::default()) };
        Ok(TokenTotals {
            input_tokens: to_u64(row.try_get(0)?),
            output_tokens: to_u64(row.try_get(1)?),
        })
    }

    async fn job_tranche_counts(&self, id: JobId) -> StoreResult<Vec<(TrancheState, u64)>> {
        let rows = sqlx::query(
            "SELECT t.state, COUNT(*) FROM job_tranches AS j JOIN tranches AS t ON t.id = j.tranche_id
             WHERE j.job_id = ?
             GROUP BY t.state ORDER BY t.state",
        )
        .bind(id.to_string())
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let state: String = row.try_get(0)?;
                let n: i64 = row.try_get(1)?;
                Ok((parse("tranche state", &state)?, to_u64(n)))
            })
            .collect()
    }

    async fn job_unfinished_tranches(&self, id: JobId) -> StoreResult<Vec<TrancheRecord>> {
        let rows = sqlx::query(
            "SELECT t.* FROM job_tranches AS j JOIN tranches AS t ON t.id = j.tranche_id
             WHERE j.job_id = ? AND t.state NOT IN ('done', 'failed')
             ORDER BY t.created_at, t.id",
        )
        .bind(id.to_string())
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(tranche_from_row).collect()
    }

    async fn job_file_counts(&self, id: JobId) -> StoreResult<FileCounts> {
        let row = sqlx::query(
            "SELECT
                COALESCE(SUM(purpose = 'batch_input'), 0),
                COALESCE(SUM(purpose <> 'batch_input'), 0),
                COALESCE(SUM(deleted_at IS NOT NULL), 0),
                COALESCE(SUM(deleted_at IS NULL), 0)
             FROM provider_files
             WHERE tranche_id IN (SELECT tranche_id FROM job_tranches WHERE job_id = ?)",
        )
        .bind(id.to_string())
        .fetch_one(&self.pool)
        .await?;
        Ok(FileCounts {
            uploaded: to_u64(row.try_get(0)?),
            created_by_provider: to_u64(row.try_get(1)?),
            deleted: to_u64(row.try_get(2)?),
            live: to_u64(row.try_get(3)?),
        })
    }

    fn job_results(&self, id: JobId) -> BoxStream<'_, StoreResult<ResultRow>> {
        let job = id.to_string();
        async move {
            // One read transaction: every page is read from the same snapshot, as one
            // statement would be.
            let mut tx = self.pool.begin().await?;
            // A job's requests take increasing ids in input order (its writer numbers them),
            // so the job's id range, read in rowid order, is its input order: no sort of the
            // whole job, which at a million requests is a temporary B-tree of all its rows.
            let (first, last): (Option<i64>, Option<i64>) =
                sqlx::query_as("SELECT first_request, last_request FROM jobs WHERE id = ?")
                    .bind(&job)
                    .fetch_one(&mut *tx)
                    .await?;
            let last = last.unwrap_or(0);
            let read = move |mut tx, after| {
                let job = job.clone();
                async move {
                    let page = results_page(&mut tx, &job, after, last).await?;
                    Ok((tx, page))
                }
            };
            Ok::<_, StoreError>(read_pages(tx, first.map_or(0, |f| f - 1), read, result_from_row))
        }
        .try_flatten_stream()
        .boxed()
    }
}

/// The next page of a job's results: its requests after id `after`, up to `last`, in id order.
async fn results_page(
    tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
    job: &str,
    after: i64,
    last: i64,
) -> StoreResult<Page> {
    // The `+` keeps the job filter from choosing an index over the id range. Each row holds
    // its tranche's number, named below.
    let row = sqlx::query(concat!(
        "SELECT json_group_array(json_array(id, custom_id, wire_id, tranche_seq, state, output,
                    error, output_object, output_offset, output_length, cached, attempts,
                    max_attempts, input_tokens, output_tokens, endpoint)),
                MAX(id), COUNT(*)
         FROM (SELECT r.id, r.custom_id, r.wire_id, r.tranche_seq, r.state, o.output,
                      r.error, r.output_object, r.output_offset, r.output_length, r.cached,
                      r.attempts, r.max_attempts, r.input_tokens, r.output_tokens, r.endpoint
               FROM requests AS r LEFT JOIN request_outputs AS o ON o.request_id = r.id
               WHERE r.id > ?2 AND r.id <= ?3 AND +r.job_id = ?1
               ORDER BY r.id LIMIT ",
        page_rows!(),
        ")"
    ))
    .bind(job)
    .bind(after)
    .bind(last)
    .fetch_one(&mut **tx)
    .await?;
    name_tranches(tx, Page::from_row(&row, 0)?, TRANCHE_AT).await
}

/// The column of a results page's rows that holds the request's tranche.
const TRANCHE_AT: usize = 3;

/// Puts each row's tranche id (text) at column `at` in place of the tranche's number there.
/// The few numbers of a page are looked up together, where a join looked each row's up again
/// and the page carried its 36-character id a row: exporting 100,000 results took 4.07 G
/// instructions against 4.23 G (callgrind), for the same lines.
async fn name_tranches(
    tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
    page: Page,
    at: usize,
) -> StoreResult<Page> {
    let mut numbers = std::collections::BTreeSet::new();
    for row in &page.rows {
        numbers.extend(row.peek_opt_int(at)?);
    }
    if numbers.is_empty() {
        return Ok(page);
    }
    let ids: Vec<(i64, String)> = sqlx::query_as(
        "SELECT seq, id FROM tranches WHERE seq IN (SELECT value FROM json_each(?))",
    )
    .bind(crate::json_list("tranche numbers", &numbers)?)
    .fetch_all(&mut **tx)
    .await?;
    let ids: std::collections::HashMap<i64, String> = ids.into_iter().collect();
    for row in &page.rows {
        let Some(seq) = row.peek_opt_int(at)? else { continue };
        let id = ids.get(&seq).ok_or_else(|| {
            StoreError::Corrupt(format!("a request names tranche number {seq}, which is not there"))
        })?;
        row.put(at, serde_json::Value::String(id.clone()))?;
    }
    Ok(page)
}
