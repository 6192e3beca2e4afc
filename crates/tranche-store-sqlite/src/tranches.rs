//! Tranches: due ones, their input lines, and compare-and-set transitions.

use std::collections::HashMap;

use futures::TryFutureExt;
use futures::stream::{BoxStream, StreamExt, TryStreamExt};
use sqlx::{Row, Sqlite, Transaction};
use tranche_core::{JobId, LeaseToken, ProviderKind, TrancheId};
use tranche_store::rows::*;
use tranche_store::*;

use crate::SqliteStore;
use crate::pages::{JsonRow, Page, read_pages};

/// A tranche whose ids span less than this many times its size is read as one id range.
pub(crate) const DENSE_SPAN: i64 = 4;

#[async_trait::async_trait]
impl TrancheStore for SqliteStore {
    async fn due_tranches(&self, now: i64) -> StoreResult<Vec<TrancheRecord>> {
        let rows = sqlx::query(concat!(
            "SELECT * FROM tranches WHERE state NOT IN ('done', 'failed') AND not_before <= ?
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
            " THEN MAX(not_before, (lease_expires_at + 999) / 1000) ELSE not_before END)
             FROM tranches WHERE state NOT IN ('done', 'failed')"
        ))
        .fetch_one(&self.pool)
        .await?;
        Ok(row.try_get(0)?)
    }

    async fn tranche(&self, id: TrancheId) -> StoreResult<Option<TrancheRecord>> {
        let row = sqlx::query("SELECT * FROM tranches WHERE id = ?")
            .bind(id.to_string())
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| tranche_from_row(&r)).transpose()
    }

    fn tranche_input(&self, id: TrancheId) -> BoxStream<'_, StoreResult<InputLine>> {
        let tranche = id.to_string();
        async move {
            // In request order: a job's bodies follow one another in its body object, so the
            // engine reads them in few, long ranges. A tranche's ids mostly form one run (a
            // claim takes pending requests in id order), read in rowid order with no sort, a
            // page at a time; one spread thin (requests sent again, many groups interleaved)
            // is found through `requests_by_tranche` and sorted, row by row.
            let mut tx = self.pool.begin().await?;
            let (seq, first, last, count): (Option<i64>, Option<i64>, Option<i64>, i64) =
                sqlx::query_as(
                    "SELECT t.seq, MIN(r.id), MAX(r.id), COUNT(r.id)
                     FROM tranches AS t
                          LEFT JOIN requests AS r ON r.tranche_seq = t.seq AND r.state = 'queued'
                     WHERE t.id = ?",
                )
                .bind(&tranche)
                .fetch_one(&mut *tx)
                .await?;
            let lines = match (seq, first, last) {
                (Some(seq), Some(first), Some(last)) if last - first < DENSE_SPAN * count => {
                    let jobs = TrancheJobs::read(&mut tx, &tranche).await?;
                    dense_input(tx, seq, first - 1, last, jobs)
                }
                (None, ..) => futures::stream::empty().boxed(),
                (Some(seq), ..) => {
                    tx.commit().await?;
                    sqlx::query(
                        "SELECT r.wire_id, r.endpoint, b.body, j.body_object, r.body_offset,
                                r.body_length, r.job_id
                         FROM requests AS r
                         JOIN jobs AS j ON j.id = r.job_id
                         LEFT JOIN request_bodies AS b ON b.request_id = r.id
                         WHERE r.tranche_seq = ? AND r.state = 'queued' ORDER BY r.id",
                    )
                    .bind(seq)
                    .fetch(&self.pool)
                    .map_err(StoreError::from)
                    .and_then(|row| async move { input_line_from_row(&row) })
                    .boxed()
                }
            };
            Ok::<_, StoreError>(lines)
        }
        .try_flatten_stream()
        .boxed()
    }

    async fn tranche_input_bytes(&self, id: TrancheId) -> StoreResult<u64> {
        let bytes: i64 = sqlx::query_scalar(
            "SELECT COALESCE(SUM(r.wire_bytes), 0)
             FROM tranches AS t JOIN requests AS r ON r.tranche_seq = t.seq
             WHERE t.id = ? AND r.state = 'queued'",
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
                state = ?,
                input_file_id = COALESCE(?, input_file_id),
                batch_id = COALESCE(?, batch_id),
                batch_status = COALESCE(?, batch_status),
                output_file_id = COALESCE(?, output_file_id),
                error_file_id = COALESCE(?, error_file_id),
                results_url = COALESCE(?, results_url),
                batch_errors = COALESCE(?, batch_errors),
                last_error = ?,
                not_before = ?,
                updated_at = ?
             WHERE id = ? AND state = ? AND lease_token = ?",
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
            "UPDATE tranches SET last_error = ?, not_before = ?, updated_at = ?
             WHERE id = ? AND lease_token = ?",
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
            "UPDATE tranches SET cancel_requested = 1, not_before = ?, updated_at = ? WHERE id = ?",
        )
        .bind(at)
        .bind(at)
        .bind(id.to_string())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn tranche_has_wire_id(&self, tranche: TrancheId, wire_id: &str) -> StoreResult<bool> {
        let row = sqlx::query(
            "SELECT 1 FROM requests
             WHERE tranche_seq = (SELECT seq FROM tranches WHERE id = ?) AND wire_id = ?
               AND state = 'queued' LIMIT 1",
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
        let row = sqlx::query("SELECT id FROM tranches WHERE provider = ? AND batch_id = ?")
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

/// The jobs whose requests a tranche holds, by their row number. A page of the tranche's input
/// names each line's job by that number instead of by its id and body object, which every line
/// of a job repeats: 100,000 lines were 15 MB of pages with them, 6 MB without. A run of
/// 10,000 requests under callgrind: 4,225 M instructions against 4,261.
#[derive(Debug)]
struct TrancheJobs(HashMap<i64, (JobId, Option<String>)>);

impl TrancheJobs {
    /// The jobs of the tranche `tranche` as `job_tranches` lists them: a claim lists the jobs
    /// of the requests it queues, and a job leaves the list only with its requests in the
    /// tranche (`detach_job`), so every job of a queued request is there.
    async fn read(tx: &mut Transaction<'static, Sqlite>, tranche: &str) -> StoreResult<Self> {
        let rows: Vec<(i64, String, Option<String>)> = sqlx::query_as(
            "SELECT j.rowid, j.id, j.body_object
             FROM job_tranches AS t JOIN jobs AS j ON j.id = t.job_id
             WHERE t.tranche_id = ?",
        )
        .bind(tranche)
        .fetch_all(&mut **tx)
        .await?;
        let jobs = rows
            .into_iter()
            .map(|(number, id, object)| Ok((number, (parse("job id", &id)?, object))))
            .collect::<StoreResult<_>>()?;
        Ok(Self(jobs))
    }

    /// A line of a page of [`dense_input`]: wire id, endpoint, body, job number, body offset
    /// and length (then its request's id).
    fn line(&self, row: &JsonRow) -> StoreResult<InputLine> {
        let number = row.int_at(3)?;
        let (job_id, object) = self.0.get(&number).ok_or_else(|| {
            StoreError::Corrupt(format!(
                "a queued request's job (row {number}) is not its tranche's"
            ))
        })?;
        input_line_of_job(row, *job_id, object.clone())
    }
}

/// The input lines of the tranche numbered `seq`, whose ids form one run, from `after`
/// (exclusive) to `last`, a page at a time, every page read from the snapshot of `tx`; `jobs`
/// are the tranche's.
fn dense_input(
    tx: Transaction<'static, Sqlite>,
    seq: i64,
    after: i64,
    last: i64,
    jobs: TrancheJobs,
) -> BoxStream<'static, StoreResult<InputLine>> {
    let read = move |mut tx: Transaction<'static, Sqlite>, after| async move {
        let row = sqlx::query(concat!(
            "SELECT json_group_array(json_array(wire_id, endpoint, body, job, body_offset,
                            body_length, id)),
                        MAX(id), COUNT(*)
                 FROM (SELECT r.id, r.wire_id, r.endpoint, b.body, j.rowid AS job,
                              r.body_offset, r.body_length
                       FROM requests AS r
                       JOIN jobs AS j ON j.id = r.job_id
                       LEFT JOIN request_bodies AS b ON b.request_id = r.id
                       WHERE r.id > ? AND r.id <= ? AND +r.tranche_seq = ? AND r.state = 'queued'
                       ORDER BY r.id LIMIT ",
            page_rows!(),
            ")"
        ))
        .bind(after)
        .bind(last)
        .bind(seq)
        .fetch_one(&mut *tx)
        .await?;
        Ok((tx, Page::from_row(&row, 6)?))
    };
    read_pages(tx, after, read, move |row: &JsonRow| jobs.line(row))
}
