//! Recording a tranche's results inside one transaction.

use sqlx::postgres::PgRow;
use sqlx::{Postgres, Row, Transaction};
use tranche_core::{TokenUsage, TrancheId, TrancheState};
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
        let mut tx = self.begin_write().await?;
        let provider: Option<String> =
            sqlx::query_scalar("SELECT provider FROM tranches WHERE id = $1")
                .bind(tranche.to_string())
                .fetch_optional(&mut *tx)
                .await?;
        Ok(Box::new(PgIngestWriter {
            tx,
            tranche: tranche.to_string(),
            provider: provider.unwrap_or_default(),
            held,
        }))
    }
}

/// Records the results of one tranche inside one transaction.
#[derive(Debug)]
pub(crate) struct PgIngestWriter {
    tx: Transaction<'static, Postgres>,
    tranche: String,
    /// The tranche's provider, under which its usage is counted.
    provider: String,
    held: Held,
}

/// One chunk of success lines, one array per column (as they are bound).
#[derive(Debug, Default)]
struct Lines<'a> {
    wire_id: Vec<&'a str>,
    status_code: Vec<i64>,
    model: Vec<Option<&'a str>>,
    input_tokens: Vec<Option<i64>>,
    cached_input_tokens: Vec<Option<i64>>,
    cache_write_5m_tokens: Vec<Option<i64>>,
    cache_write_1h_tokens: Vec<Option<i64>>,
    output_tokens: Vec<Option<i64>>,
    reasoning_tokens: Vec<Option<i64>>,
    output_object: Vec<Option<&'a str>>,
    output_offset: Vec<Option<i64>>,
    output_length: Vec<Option<i64>>,
    output: Vec<Option<&'a str>>,
}

/// Records one chunk of success lines (see [`PgIngestWriter::record_chunk`]). A macro, so that
/// the statement stays a string literal (`concat!`) that a test can ask for its plan.
macro_rules! record_successes {
    () => {
        concat!(
            "WITH lines AS (
                SELECT * FROM UNNEST($2::text[], $3::bigint[], $4::bigint[], $5::bigint[],
                                     $6::text[], $7::bigint[], $8::bigint[], $9::text[],
                                     $11::text[], $12::bigint[], $13::bigint[], $14::bigint[],
                                     $15::bigint[])
                    WITH ORDINALITY AS l(wire_id, status_code, input_tokens, output_tokens,
                                         output_object, output_offset, output_length, output,
                                         model, cached_input_tokens, cache_write_5m_tokens,
                                         cache_write_1h_tokens, reasoning_tokens, n)
             ),
             first AS (SELECT DISTINCT ON (wire_id) * FROM lines ORDER BY wire_id, n),
             matched AS MATERIALIZED (
                SELECT q.id AS request_id, f.*
                FROM first AS f
                     CROSS JOIN LATERAL (SELECT id FROM requests
                                         WHERE tranche_id = $1 AND wire_id = f.wire_id
                                           AND state = 'queued') AS q
             ),
             answered AS (
                UPDATE requests AS r SET state = 'succeeded', error = NULL, not_before = 0,
                       finished_at = $10, attempts = r.attempts + 1,
                       input_tokens = f.input_tokens, output_tokens = f.output_tokens,
                       output_object = f.output_object, output_offset = f.output_offset,
                       output_length = f.output_length
                FROM matched AS f
                WHERE r.id = f.request_id
                  AND (r.tranche_id, r.state) IS NOT DISTINCT FROM ($1, 'queued')
                RETURNING r.id, r.attempts, r.job_id, f.status_code, f.output, f.model,
                          f.input_tokens, f.cached_input_tokens, f.cache_write_5m_tokens,
                          f.cache_write_1h_tokens, f.output_tokens, f.reasoning_tokens
             ),
             tried AS (
                INSERT INTO attempts (request_id, attempt, tranche_id, outcome, status_code,
                                      created_at, model, input_tokens, cached_input_tokens,
                                      cache_write_5m_tokens, cache_write_1h_tokens,
                                      output_tokens, reasoning_tokens)
                SELECT id, attempts, $1, 'succeeded', status_code, $10, model, input_tokens,
                       cached_input_tokens, cache_write_5m_tokens, cache_write_1h_tokens,
                       output_tokens, reasoning_tokens
                FROM answered
                ON CONFLICT (request_id, tranche_id) DO NOTHING
             ),
             -- Each answered request was queued in this tranche: a new attempt, counted here
             -- once; the transaction commits with the tranche's move or not at all.
             billed AS (
                INSERT INTO usage_totals
                    (job_id, kind, provider, model, day, requests, input_tokens,
                     cached_input_tokens, cache_write_5m_tokens, cache_write_1h_tokens,
                     output_tokens, reasoning_tokens)
                SELECT job_id, 'billed', $16, model, $17, COUNT(*), SUM(input_tokens),
                       SUM(cached_input_tokens), SUM(cache_write_5m_tokens),
                       SUM(cache_write_1h_tokens), SUM(output_tokens), SUM(reasoning_tokens)
                FROM answered WHERE model IS NOT NULL
                GROUP BY job_id, model
                ON CONFLICT (job_id, kind, provider, model, day) DO UPDATE SET ",
            usage_add!(),
            "
             ),
             kept AS (
                INSERT INTO request_outputs (request_id, output)
                SELECT id, output FROM answered WHERE output IS NOT NULL
                ON CONFLICT (request_id) DO NOTHING
             )
             SELECT COUNT(*) FROM answered"
        )
    };
}
const RECORD_SUCCESSES: &str = record_successes!();

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
            let billed = line.billed.as_ref();
            let tokens = |f: fn(&TokenUsage) -> u64| billed.map(|b| to_i64(f(&b.tokens)));
            lines.model.push(billed.map(|b| b.model.as_str()));
            lines.input_tokens.push(tokens(|t| t.input));
            lines.cached_input_tokens.push(tokens(|t| t.cached_input));
            lines.cache_write_5m_tokens.push(tokens(|t| t.cache_write_5m));
            lines.cache_write_1h_tokens.push(tokens(|t| t.cache_write_1h));
            lines.output_tokens.push(tokens(|t| t.output));
            lines.reasoning_tokens.push(tokens(|t| t.reasoning));
            lines.output_object.push(range.map(|r| r.0));
            lines.output_offset.push(range.map(|r| r.1));
            lines.output_length.push(range.map(|r| r.2));
            lines.output.push(text);
        }
        // The first line with a wire id is the one recorded (`DISTINCT ON` keeps it; a later
        // one, in another chunk, finds its request answered). Each request waiting in the
        // tranche with that wire id (planning never puts two in one batch; should two be
        // there, both are) is answered by it: looked up line by line in `requests_by_tranche`
        // (a lateral join, so the lines drive it whatever the statistics say), then updated by
        // id, re-checked there (a cancel may have moved it since) in a form that offers the
        // planner no index to start from. The statement before compared ids inside the join's
        // filter; planned without statistics (a fresh database, autovacuum not yet run) it
        // scanned the tranche's requests and ran the lookup for every pair of a line and a
        // request: a job of 10,000 requests took 47 s and 51 CPU-s of the server, against 3.0 s
        // and 2.5 CPU-s now.
        let row = sqlx::query(RECORD_SUCCESSES)
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
            .bind(&lines.model)
            .bind(&lines.cached_input_tokens)
            .bind(&lines.cache_write_5m_tokens)
            .bind(&lines.cache_write_1h_tokens)
            .bind(&lines.reasoning_tokens)
            .bind(&self.provider)
            .bind(day_of(at))
            .fetch_one(&mut *self.tx)
            .await?;
        Ok(to_u64(row.try_get(0)?))
    }

    async fn insert_attempt(&mut self, row: &PgRow, update: &ResultUpdate<'_>) -> StoreResult<()> {
        let request_id: i64 = row.try_get(0)?;
        let attempt: i64 = row.try_get(1)?;
        let billed = update.billed;
        let insert = sqlx::query(
            "INSERT INTO attempts (request_id, attempt, tranche_id, outcome, status_code, error,
                                   created_at, model, input_tokens, cached_input_tokens,
                                   cache_write_5m_tokens, cache_write_1h_tokens, output_tokens,
                                   reasoning_tokens)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
             ON CONFLICT (request_id, tranche_id) DO NOTHING",
        )
        .bind(request_id)
        .bind(attempt)
        .bind(&self.tranche)
        .bind(update.outcome.as_str())
        .bind(update.status_code.map(i64::from))
        .bind(update.error)
        .bind(update.at)
        .bind(billed.map(|b| b.model.as_str()));
        let inserted = bind_tokens(insert, billed.map(|b| &b.tokens))
            .execute(&mut *self.tx)
            .await?
            .rows_affected();
        let Some(billed) = billed.filter(|_| inserted == 1) else { return Ok(()) };
        let job_id: String = row.try_get(2)?;
        let upsert = sqlx::query(concat!(
            "INSERT INTO usage_totals
                (job_id, kind, provider, model, day, requests, input_tokens, cached_input_tokens,
                 cache_write_5m_tokens, cache_write_1h_tokens, output_tokens, reasoning_tokens)
             VALUES ($1, 'billed', $2, $3, $4, 1, $5, $6, $7, $8, $9, $10)
             ON CONFLICT (job_id, kind, provider, model, day) DO UPDATE SET ",
            usage_add!()
        ))
        .bind(job_id)
        .bind(&self.provider)
        .bind(&billed.model)
        .bind(day_of(update.at));
        bind_tokens(upsert, Some(&billed.tokens)).execute(&mut *self.tx).await?;
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
             RETURNING id, attempts, job_id",
        )
        .bind(update.state.as_str())
        .bind(update.error)
        .bind(update.billed.map(|b| to_i64(b.tokens.input)))
        .bind(update.billed.map(|b| to_i64(b.tokens.output)))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Success lines find their requests through `requests_by_tranche`, one lookup a line, in a
    /// database without statistics: no plan runs a lookup for every pair of a line and a
    /// request.
    #[tokio::test]
    async fn success_lines_look_their_requests_up_line_by_line() {
        let db = tranche_test_support::postgres::scratch().await;
        let store = PgStore::open(&db.url).await.unwrap();
        let mut conn = store.pool.acquire().await.unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(concat!("PREPARE chunk AS ", record_successes!())))
            .execute(&mut *conn)
            .await
            .unwrap();
        let plan: Vec<String> = sqlx::query_scalar(
            "EXPLAIN EXECUTE chunk(
                'tr_1', array_fill('w'::text, ARRAY[512]), array_fill(200, ARRAY[512]),
                array_fill(1, ARRAY[512]), array_fill(1, ARRAY[512]),
                array_fill('raw/o'::text, ARRAY[512]), array_fill(0, ARRAY[512]),
                array_fill(1, ARRAY[512]), array_fill(NULL::text, ARRAY[512]), 1,
                array_fill('m'::text, ARRAY[512]), array_fill(0, ARRAY[512]),
                array_fill(0, ARRAY[512]), array_fill(0, ARRAY[512]), array_fill(0, ARRAY[512]),
                'openai', 1)",
        )
        .fetch_all(&mut *conn)
        .await
        .unwrap();
        let plan = plan.join("\n");
        assert!(!plan.contains("SubPlan"), "{plan}");
        assert!(plan.contains("Index Scan using requests_by_tranche on requests"), "{plan}");
    }
}
