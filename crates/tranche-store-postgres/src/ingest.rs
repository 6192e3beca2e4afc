//! Recording a tranche's results inside one transaction.

use sqlx::postgres::PgRow;
use sqlx::{Postgres, Row, Transaction};
use tranche_core::{TrancheId, TrancheState};
use tranche_store::rows::*;
use tranche_store::*;

use crate::{INGEST_ROWS, PgStore};

#[async_trait::async_trait]
impl IngestStore for PgStore {
    async fn begin_ingest(
        &self,
        tranche: TrancheId,
        held: Held,
    ) -> StoreResult<Box<dyn IngestWriter>> {
        // The tranche's row is not locked here: the holder renews its lease while it ingests.
        // Two engines ingesting the same tranche wait for each other's rows, and only the one
        // still holding the lease commits.
        let tx = self.begin_write().await?;
        Ok(Box::new(PgIngestWriter { tx, tranche: tranche.to_string(), held }))
    }
}

/// Records the results of one tranche inside one transaction.
#[derive(Debug)]
pub(crate) struct PgIngestWriter {
    tx: Transaction<'static, Postgres>,
    tranche: String,
    held: Held,
}

/// One chunk of success lines, one array per column (as they are bound).
#[derive(Debug, Default)]
struct Lines<'a> {
    wire_id: Vec<&'a str>,
    status_code: Vec<i64>,
    input_tokens: Vec<Option<i64>>,
    output_tokens: Vec<Option<i64>>,
    output_object: Vec<Option<&'a str>>,
    output_offset: Vec<Option<i64>>,
    output_length: Vec<Option<i64>>,
    output: Vec<Option<&'a str>>,
}

impl PgIngestWriter {
    /// Records one chunk of success lines in one statement: the requests they answer end
    /// succeeded, each with its attempt and (given as text) its output. Returns how many
    /// requests that answered.
    async fn record_chunk(&mut self, chunk: &[Success], at: i64) -> StoreResult<u64> {
        let mut lines = Lines::default();
        for line in chunk {
            let (range, text) = match &line.output {
                OutputRef::InObject { object, offset, len } => {
                    (Some((object.as_str(), to_i64(*offset), to_i64(*len))), None)
                }
                OutputRef::Text(text) => (None, Some(text.as_str())),
            };
            lines.wire_id.push(&line.wire_id);
            lines.status_code.push(i64::from(line.status_code));
            lines.input_tokens.push(line.input_tokens.map(to_i64));
            lines.output_tokens.push(line.output_tokens.map(to_i64));
            lines.output_object.push(range.map(|r| r.0));
            lines.output_offset.push(range.map(|r| r.1));
            lines.output_length.push(range.map(|r| r.2));
            lines.output.push(text);
        }
        // The first line with a wire id is the one recorded (`DISTINCT ON` keeps it; a later
        // one, in another chunk, finds its request answered). Each request waiting in the
        // tranche with that wire id is answered by it, looked up in `requests_by_tranche`.
        let row = sqlx::query(
            "WITH lines AS (
                SELECT * FROM UNNEST($2::text[], $3::bigint[], $4::bigint[], $5::bigint[],
                                     $6::text[], $7::bigint[], $8::bigint[], $9::text[])
                    WITH ORDINALITY AS l(wire_id, status_code, input_tokens, output_tokens,
                                         output_object, output_offset, output_length, output, n)
             ),
             first AS (SELECT DISTINCT ON (wire_id) * FROM lines ORDER BY wire_id, n),
             answered AS (
                UPDATE requests AS r SET state = 'succeeded', error = NULL, not_before = 0,
                       finished_at = $10, attempts = r.attempts + 1,
                       input_tokens = f.input_tokens, output_tokens = f.output_tokens,
                       output_object = f.output_object, output_offset = f.output_offset,
                       output_length = f.output_length
                FROM first AS f
                WHERE r.tranche_id = $1 AND r.state = 'queued' AND r.wire_id = f.wire_id
                RETURNING r.id, r.attempts, f.status_code, f.output
             ),
             tried AS (
                INSERT INTO attempts (request_id, attempt, tranche_id, outcome, status_code,
                                      created_at)
                SELECT id, attempts, $1, 'succeeded', status_code, $10 FROM answered
                ON CONFLICT (request_id, tranche_id) DO NOTHING
             ),
             kept AS (
                INSERT INTO request_outputs (request_id, output)
                SELECT id, output FROM answered WHERE output IS NOT NULL
                ON CONFLICT (request_id) DO NOTHING
             )
             SELECT COUNT(*) FROM answered",
        )
        .bind(&self.tranche)
        .bind(&lines.wire_id)
        .bind(&lines.status_code)
        .bind(&lines.input_tokens)
        .bind(&lines.output_tokens)
        .bind(&lines.output_object)
        .bind(&lines.output_offset)
        .bind(&lines.output_length)
        .bind(&lines.output)
        .bind(at)
        .fetch_one(&mut *self.tx)
        .await?;
        Ok(to_u64(row.try_get(0)?))
    }

    async fn insert_attempt(&mut self, row: &PgRow, update: &ResultUpdate<'_>) -> StoreResult<()> {
        let request_id: i64 = row.try_get(0)?;
        let attempt: i64 = row.try_get(1)?;
        sqlx::query(
            "INSERT INTO attempts (request_id, attempt, tranche_id, outcome, status_code, error,
                                   created_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (request_id, tranche_id) DO NOTHING",
        )
        .bind(request_id)
        .bind(attempt)
        .bind(&self.tranche)
        .bind(update.outcome.as_str())
        .bind(update.status_code.map(i64::from))
        .bind(update.error)
        .bind(update.at)
        .execute(&mut *self.tx)
        .await?;
        Ok(())
    }
}

#[async_trait::async_trait]
impl IngestWriter for PgIngestWriter {
    async fn attempt_info(&mut self, wire_id: &str) -> StoreResult<Option<AttemptInfo>> {
        let row = sqlx::query(
            "SELECT attempts, max_attempts, batch_returns, job_id FROM requests
             WHERE tranche_id = $1 AND wire_id = $2 AND state = 'queued'",
        )
        .bind(&self.tranche)
        .bind(wire_id)
        .fetch_optional(&mut *self.tx)
        .await?;
        row.map(|row| attempt_info(&row)).transpose()
    }

    async fn unanswered(&mut self) -> StoreResult<Vec<(String, AttemptInfo)>> {
        let rows = sqlx::query(
            "SELECT attempts, max_attempts, batch_returns, wire_id, job_id FROM requests
             WHERE tranche_id = $1 AND state = 'queued' ORDER BY id",
        )
        .bind(&self.tranche)
        .fetch_all(&mut *self.tx)
        .await?;
        rows.iter().map(|row| Ok((row.try_get(3)?, attempt_info(row)?))).collect()
    }

    async fn record(&mut self, wire_id: &str, update: &ResultUpdate<'_>) -> StoreResult<bool> {
        // An answer is kept with the request only once it ends (a request sent again has none).
        let kept = update.output.filter(|_| update.state.is_terminal());
        let range = match kept {
            Some(OutputRef::InObject { object, offset, len }) => {
                Some((object.as_str(), to_i64(*offset), to_i64(*len)))
            }
            _ => None,
        };
        let row = sqlx::query(
            "UPDATE requests SET state = $1, error = $2, input_tokens = $3,
                    output_tokens = $4, finished_at = $5,
                    attempts = attempts + $6, batch_returns = batch_returns + (1 - $6),
                    tranche_id = CASE WHEN $1 = 'pending' THEN NULL ELSE tranche_id END,
                    not_before = $7, output_object = $8, output_offset = $9, output_length = $10
             WHERE tranche_id = $11 AND wire_id = $12 AND state = 'queued'
             RETURNING id, attempts",
        )
        .bind(update.state.as_str())
        .bind(update.error)
        .bind(update.input_tokens.map(to_i64))
        .bind(update.output_tokens.map(to_i64))
        .bind(update.state.is_terminal().then_some(update.at))
        .bind(i64::from(update.spends_attempt))
        .bind(update.not_before)
        .bind(range.map(|r| r.0))
        .bind(range.map(|r| r.1))
        .bind(range.map(|r| r.2))
        .bind(&self.tranche)
        .bind(wire_id)
        .fetch_optional(&mut *self.tx)
        .await?;
        let Some(row) = row else { return Ok(false) };
        self.insert_attempt(&row, update).await?;
        if let Some(OutputRef::Text(output)) = kept {
            let request_id: i64 = row.try_get(0)?;
            sqlx::query(
                "INSERT INTO request_outputs (request_id, output) VALUES ($1, $2)
                 ON CONFLICT (request_id) DO UPDATE SET output = excluded.output",
            )
            .bind(request_id)
            .bind(output)
            .execute(&mut *self.tx)
            .await?;
        }
        Ok(true)
    }

    async fn record_successes(&mut self, lines: &mut Vec<Success>, at: i64) -> StoreResult<u64> {
        let mut recorded = 0;
        for chunk in lines.chunks(INGEST_ROWS) {
            recorded += self.record_chunk(chunk, at).await?;
        }
        lines.clear();
        Ok(recorded)
    }

    async fn commit(mut self: Box<Self>, next: TrancheState, at: i64) -> StoreResult<bool> {
        let moved = sqlx::query(
            "UPDATE tranches SET state = $1, updated_at = $2, not_before = $2
             WHERE id = $3 AND state = $4 AND lease_token = $5",
        )
        .bind(next.as_str())
        .bind(at)
        .bind(&self.tranche)
        .bind(self.held.state.as_str())
        .bind(self.held.token.to_string())
        .execute(&mut *self.tx)
        .await?
        .rows_affected();
        if moved == 0 {
            // Dropping the transaction rolls every recorded result back.
            return Ok(false);
        }
        self.tx.commit().await?;
        Ok(true)
    }
}
