//! Answers after they arrive: answer checks, the review of a job's answers, and a re-parse's
//! verdicts.

use sqlx::{Row, SqliteConnection};
use tranche_core::{JobId, JobSettings, RequestState};
use tranche_store::rows::{input_body, to_i64};
use tranche_store::*;

use crate::SqliteStore;

/// Records an answer check once (a check is its id: the same id is the same check).
pub(crate) async fn record_check(
    conn: &mut SqliteConnection,
    check: &NewAnswerCheck,
    at: i64,
) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO answer_checks (id, schema, lenient_json, created_at) VALUES (?, ?, ?, ?)
         ON CONFLICT (id) DO NOTHING",
    )
    .bind(&check.id)
    .bind(&check.schema)
    .bind(check.lenient_json)
    .bind(at)
    .execute(conn)
    .await?;
    Ok(())
}

#[async_trait::async_trait]
impl AnswerStore for SqliteStore {
    async fn answer_check(&self, id: &str) -> StoreResult<Option<NewAnswerCheck>> {
        let row = sqlx::query("SELECT id, schema, lenient_json FROM answer_checks WHERE id = ?")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|row| {
            Ok(NewAnswerCheck {
                id: row.try_get(0)?,
                schema: row.try_get(1)?,
                lenient_json: row.try_get::<i64, _>(2)? != 0,
            })
        })
        .transpose()
    }

    async fn decide_review(
        &self,
        job: JobId,
        review: &Review,
        rejected: Rejected<'_>,
        error: &str,
    ) -> StoreResult<Option<u64>> {
        let mut tx = self.begin_write().await?;
        let decided = sqlx::query(
            "UPDATE jobs SET state = 'done', awaits_review = 0, review_verdict = ?, reviewed_by = ?,
                    reviewed_at = ?, updated_at = ?
             WHERE id = ? AND state = 'needs_review'",
        )
        .bind(review.verdict.as_str())
        .bind(&review.by)
        .bind(review.at)
        .bind(review.at)
        .bind(job.to_string())
        .execute(&mut *tx)
        .await?;
        if decided.rows_affected() == 0 {
            return Ok(None);
        }
        // The job's answers that end failed: all of them, or only those of the custom ids given
        // (`?4`, a JSON list, NULL for all).
        const REJECT: &str = concat!(
            "UPDATE requests SET recount = 0, state = 'failed', error = ?2, finished_at = ?3
             WHERE state = 'succeeded'
               AND (?4 IS NULL OR custom_id IN (SELECT value FROM json_each(?4))) AND ",
            job_rows!()
        );
        let ids = match rejected {
            Rejected::None => {
                tx.commit().await?;
                return Ok(Some(0));
            }
            Rejected::All => None,
            Rejected::Only(ids) => Some(crate::json_list("custom ids", ids)?),
        };
        let reject =
            sqlx::query(REJECT).bind(job.to_string()).bind(error).bind(review.at).bind(ids);
        let rejected = reject.execute(&mut *tx).await?.rows_affected();
        tx.commit().await?;
        Ok(Some(rejected))
    }

    async fn set_job_check(
        &self,
        job: JobId,
        settings: &JobSettings,
        check: Option<&NewAnswerCheck>,
        at: i64,
    ) -> StoreResult<()> {
        let text = serde_json::to_string(settings)
            .map_err(|e| StoreError::Corrupt(format!("job settings: {e}")))?;
        let mut tx = self.begin_write().await?;
        if let Some(check) = check {
            record_check(&mut tx, check, at).await?;
        }
        sqlx::query("UPDATE jobs SET settings = ?, updated_at = ? WHERE id = ?")
            .bind(text)
            .bind(at)
            .bind(job.to_string())
            .execute(&mut *tx)
            .await?;
        sqlx::query(concat!("UPDATE requests SET answer_check = ?2 WHERE ", job_rows!()))
            .bind(job.to_string())
            .bind(check.map(|c| c.id.as_str()))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn apply_verdicts(&self, job: JobId, verdicts: &[Verdict], at: i64) -> StoreResult<u64> {
        let mut tx = self.begin_write().await?;
        let mut changed = 0;
        for verdict in verdicts {
            // A request sent again keeps no answer; one that ends keeps the answer judged.
            let (range, text) = match (&verdict.output, verdict.state) {
                (_, RequestState::Pending) | (None, _) => (None, None),
                (Some(OutputRef::InObject { object, offset, len }), _) => {
                    (Some((object.as_str(), to_i64(*offset), to_i64(*len))), None)
                }
                (Some(OutputRef::Text(text)), _) => (None, Some(text.as_str())),
            };
            let done = sqlx::query(
                "UPDATE requests SET recount = 0, state = ?1, error = ?2,
                        finished_at = CASE WHEN ?1 = 'pending' THEN NULL ELSE ?3 END,
                        not_before = ?4,
                        tranche_seq = CASE WHEN ?1 = 'pending' THEN NULL ELSE tranche_seq END,
                        output_object = ?5, output_offset = ?6, output_length = ?7
                 WHERE id = ?8 AND job_id = ?9 AND state IN ('succeeded', 'failed')",
            )
            .bind(verdict.state.as_str())
            .bind(verdict.error.as_deref())
            .bind(at)
            .bind(verdict.not_before)
            .bind(range.map(|r| r.0))
            .bind(range.map(|r| r.1))
            .bind(range.map(|r| r.2))
            .bind(verdict.request_id)
            .bind(job.to_string())
            .execute(&mut *tx)
            .await?;
            changed += done.rows_affected();
            if text.is_none() {
                sqlx::query("DELETE FROM request_outputs WHERE request_id = ?")
                    .bind(verdict.request_id)
                    .execute(&mut *tx)
                    .await?;
            }
        }
        tx.commit().await?;
        Ok(changed)
    }

    async fn reopen_job(&self, job: JobId, at: i64) -> StoreResult<bool> {
        let done = sqlx::query(
            "UPDATE jobs SET state = 'running', finished_at = NULL, last_error = NULL,
                    updated_at = ?
             WHERE id = ? AND state IN ('done', 'needs_review', 'failed')",
        )
        .bind(at)
        .bind(job.to_string())
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn request_body(&self, job: JobId, custom_id: &str) -> StoreResult<Option<InputBody>> {
        let row = sqlx::query(
            "SELECT b.body, j.body_object, r.body_offset, r.body_length
             FROM requests AS r
             JOIN jobs AS j ON j.id = r.job_id
             LEFT JOIN request_bodies AS b ON b.request_id = r.id
             WHERE r.job_id = ? AND r.custom_id = ?",
        )
        .bind(job.to_string())
        .bind(custom_id)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(None) };
        Ok(input_body(row.try_get(0)?, row.try_get(1)?, (row.try_get(2)?, row.try_get(3)?)))
    }
}
