//! Recording a tranche's results inside one transaction.

use sqlx::sqlite::SqliteRow;
use sqlx::{QueryBuilder, Row, Sqlite, Transaction};
use tranche_core::{RequestState, TokenUsage, TrancheId, TrancheState};
use tranche_store::rows::*;
use tranche_store::*;

use crate::{INGEST_ROWS, SqliteStore};

/// The columns a successful result line is staged with, in both temporary tables: its status,
/// what it was billed, and where its output rests. A macro so that the statements stay string
/// literals (`concat!`).
macro_rules! result_columns {
    () => {
        "status_code   INTEGER NOT NULL,
         model         TEXT,
         input_tokens  INTEGER,
         cached_input_tokens   INTEGER,
         cache_write_5m_tokens INTEGER,
         cache_write_1h_tokens INTEGER,
         output_tokens INTEGER,
         reasoning_tokens      INTEGER,
         output_object TEXT,
         output_offset INTEGER,
         output_length INTEGER"
    };
}

/// The staged successes of an ingest, keyed (and so sorted) by request id, until they are
/// applied to `requests` in one pass in id order. Temporary: private to its connection.
const CREATE_STAGED: &str = concat!(
    "CREATE TEMP TABLE IF NOT EXISTS ingest_staged (
        request_id    INTEGER PRIMARY KEY,
        attempt       INTEGER NOT NULL,",
    result_columns!(),
    ", output_text TEXT)"
);

// The statements that read the staged successes with their requests walk the staged rows and
// look each request up by id (`CROSS JOIN` fixes that order). Left to choose, SQLite may walk
// the whole of `requests` through an index whose order serves the `GROUP BY` (it did through
// the index on job and state, since dropped) and look each up among the staged: every ingest
// then reads every request of every job, 186 ms against 25 for a tranche of 50,000 in a
// database of 1,000,000.

/// Moves the counters of the staged requests' jobs, once per job. (A macro, and
/// [`BILL_STAGED`]'s too, so that a test can ask for their plans with `concat!`.)
macro_rules! count_staged {
    () => {
        "UPDATE jobs SET n_queued = n_queued - d.n,
        n_succeeded = n_succeeded + d.n, n_retried = n_retried + d.retried,
        input_tokens = input_tokens + d.input, output_tokens = output_tokens + d.output
     FROM (SELECT r.job_id, COUNT(*) AS n,
                  SUM((s.attempt > 1) - (r.attempts > 1)) AS retried,
                  SUM(COALESCE(s.input_tokens, 0) - COALESCE(r.input_tokens, 0)) AS input,
                  SUM(COALESCE(s.output_tokens, 0) - COALESCE(r.output_tokens, 0)) AS output
           FROM temp.ingest_staged AS s CROSS JOIN requests AS r ON r.id = s.request_id
           WHERE r.state = 'queued'
           GROUP BY r.job_id) AS d
     WHERE jobs.id = d.job_id"
    };
}
const COUNT_STAGED: &str = count_staged!();

macro_rules! bill_staged {
    () => {
        concat!(
            "INSERT INTO usage_totals
        (job_id, kind, provider, model, day, requests, input_tokens, cached_input_tokens,
         cache_write_5m_tokens, cache_write_1h_tokens, output_tokens, reasoning_tokens)
     SELECT r.job_id, 'billed', ?, s.model, ?, COUNT(*), SUM(s.input_tokens),
            SUM(s.cached_input_tokens), SUM(s.cache_write_5m_tokens),
            SUM(s.cache_write_1h_tokens), SUM(s.output_tokens), SUM(s.reasoning_tokens)
     FROM temp.ingest_staged AS s CROSS JOIN requests AS r ON r.id = s.request_id
     WHERE s.model IS NOT NULL
     GROUP BY r.job_id, s.model
     ON CONFLICT (job_id, kind, provider, model, day) DO UPDATE SET ",
            usage_add!()
        )
    };
}
/// Adds what the staged successes were billed to the usage ledger, by job and model.
const BILL_STAGED: &str = bill_staged!();

#[async_trait::async_trait]
impl IngestStore for SqliteStore {
    async fn begin_ingest(
        &self,
        tranche: TrancheId,
        held: Held,
    ) -> StoreResult<Box<dyn IngestWriter>> {
        let mut tx = self.begin_write().await?;
        sqlx::query(CREATE_STAGED).execute(&mut *tx).await?;
        sqlx::query("DELETE FROM temp.ingest_staged").execute(&mut *tx).await?;
        // A tranche that is not there has no requests to record (and its move fails).
        let (provider, seq, claimed): (String, i64, i64) =
            sqlx::query_as("SELECT provider, seq, request_count FROM tranches WHERE id = ?")
                .bind(tranche.to_string())
                .fetch_optional(&mut *tx)
                .await?
                .unwrap_or_default();
        Ok(Box::new(SqliteIngestWriter {
            tx,
            provider,
            tranche: tranche.to_string(),
            seq,
            claimed: to_u64(claimed),
            moved: 0,
            held,
            staged: false,
            texts: false,
            finished_at: 0,
        }))
    }
}

/// Records the results of one tranche inside one transaction.
#[derive(Debug)]
pub(crate) struct SqliteIngestWriter {
    tx: Transaction<'static, Sqlite>,
    tranche: String,
    /// The tranche's number, by which its requests and attempts name it.
    seq: i64,
    /// How many requests the tranche was planned with: all it can ever hold.
    claimed: u64,
    /// How many of them this writer has moved on from `queued`. Once it has moved all, none
    /// is left to look for.
    moved: u64,
    /// The tranche's provider, under which its usage is counted.
    provider: String,
    held: Held,
    /// Successes are staged and not yet applied to `requests`.
    staged: bool,
    /// Some staged success carries its output as text.
    texts: bool,
    /// When the staged successes were recorded.
    finished_at: i64,
}

impl SqliteIngestWriter {
    /// Stages the successes of one chunk of lines (see [`push_stage`]). Returns how many
    /// requests were staged.
    async fn stage_chunk(&mut self, chunk: &[Success]) -> StoreResult<u64> {
        let mut stage = QueryBuilder::<Sqlite>::new("");
        self.texts |= push_stage(&mut stage, self.seq, chunk);
        // Not kept prepared, though a full chunk's statement is the same text every time: kept,
        // staging 100,000 results took 0.33-0.36 s against 0.47-0.62, but a build that kept it
        // peaked 3 MB higher at 100,000 requests, and peak RSS at 1,000,000 must stay within
        // 1.2 times that of 10,000. (Builds without it later peaked 1-2 MB higher too, so
        // what the statement itself holds is not settled.)
        let staged = stage.build().persistent(false).execute(&mut *self.tx).await?.rows_affected();
        self.staged |= staged > 0;
        Ok(staged)
    }

    /// Applies the staged successes to `requests` and `attempts`, in request id order.
    async fn apply_staged(&mut self) -> StoreResult<()> {
        let at = self.finished_at;
        if !self.staged {
            return Ok(());
        }
        // Every staged request is queued in this tranche (staged as such, in this
        // transaction): its job's counters move once per job here, not once per request.
        crate::pause_counters(&mut self.tx, true).await?;
        sqlx::query(COUNT_STAGED).execute(&mut *self.tx).await?;
        // `OR FAIL`: a statement that may stop halfway (a CHECK or NOT NULL failing) makes
        // SQLite copy every page it changes to a statement journal first, so that it can undo
        // just that statement. One that fails here fails the whole ingest, which is rolled
        // back, so it may keep what it did before failing, and writes no journal (12 MB a
        // tranche of 50,000). It changes no column a foreign key names: an immediate foreign
        // key needs the journal whatever the statement says.
        //
        // `id IN (SELECT ...)` walks the staged ids in order and seeks each row; an
        // `UPDATE ... FROM` the staging table may be planned as a scan of all of `requests`.
        // The staged values come in one row value: one lookup of the staged row, not one per
        // column.
        let applied = sqlx::query(
            "UPDATE OR FAIL requests SET state = 'succeeded', error = NULL, not_before = 0, finished_at = ?,
                (attempts, input_tokens, output_tokens, output_object, output_offset, output_length) =
                    (SELECT attempt, input_tokens, output_tokens, output_object, output_offset,
                            output_length
                     FROM temp.ingest_staged AS s WHERE s.request_id = requests.id)
             WHERE id IN (SELECT request_id FROM temp.ingest_staged) AND state = 'queued'",
        )
        .bind(at)
        .execute(&mut *self.tx)
        .await?;
        self.moved += applied.rows_affected();
        crate::pause_counters(&mut self.tx, false).await?;
        if self.texts {
            // Outputs given as text (not by reference) are kept in the database.
            sqlx::query(
                "INSERT OR IGNORE INTO request_outputs (request_id, output)
                 SELECT request_id, output_text FROM temp.ingest_staged
                 WHERE output_text IS NOT NULL",
            )
            .execute(&mut *self.tx)
            .await?;
        }
        sqlx::query(
            "INSERT INTO attempts (request_id, attempt, tranche_seq, outcome, status_code, created_at,
                                   model, input_tokens, cached_input_tokens, cache_write_5m_tokens,
                                   cache_write_1h_tokens, output_tokens, reasoning_tokens)
             SELECT request_id, attempt, ?, 'succeeded', status_code, ?, model, input_tokens,
                    cached_input_tokens, cache_write_5m_tokens, cache_write_1h_tokens,
                    output_tokens, reasoning_tokens
             FROM temp.ingest_staged
             WHERE true
             ON CONFLICT (request_id, tranche_seq) DO NOTHING",
        )
        .bind(self.seq)
        .bind(at)
        .execute(&mut *self.tx)
        .await?;
        // Every staged request was queued in this tranche, so each is a new attempt, counted
        // here once; the transaction commits with the tranche's move or not at all.
        sqlx::query(BILL_STAGED)
            .bind(&self.provider)
            .bind(day_of(at))
            .execute(&mut *self.tx)
            .await?;
        sqlx::query("DELETE FROM temp.ingest_staged").execute(&mut *self.tx).await?;
        self.staged = false;
        self.texts = false;
        Ok(())
    }

    async fn insert_attempt(
        &mut self,
        row: &SqliteRow,
        update: &ResultUpdate<'_>,
    ) -> StoreResult<()> {
        let request_id: i64 = row.try_get(0)?;
        let attempt: i64 = row.try_get(1)?;
        let billed = update.billed;
        let insert = sqlx::query(
            "INSERT INTO attempts (request_id, attempt, tranche_seq, outcome, status_code, error,
                                   created_at, model, input_tokens, cached_input_tokens,
                                   cache_write_5m_tokens, cache_write_1h_tokens, output_tokens,
                                   reasoning_tokens)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
             ON CONFLICT (request_id, tranche_seq) DO NOTHING",
        )
        .bind(request_id)
        .bind(attempt)
        .bind(self.seq)
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
             VALUES (?, 'billed', ?, ?, ?, 1, ?, ?, ?, ?, ?, ?)
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

/// Pushes the statement that stages the successes of `chunk`, lines of the tranche numbered
/// `seq` sorted by wire id: SQL finds their requests (no request row comes back to this side),
/// looked up in `requests_by_tranche` line by line in that order (`CROSS JOIN` keeps the lines
/// as the outer loop), so that one call's chunks walk the index forwards. The index holds what
/// staging needs of a request (its id, that it is queued, its attempts): no request row is
/// read here. A request staged already (by an earlier line with its wire id) stays as it was
/// staged. Returns whether any line carries its output as text.
fn push_stage(stage: &mut QueryBuilder<Sqlite>, seq: i64, chunk: &[Success]) -> bool {
    stage.push(
        "INSERT OR IGNORE INTO temp.ingest_staged
            (request_id, attempt, status_code, model, input_tokens, cached_input_tokens,
             cache_write_5m_tokens, cache_write_1h_tokens, output_tokens, reasoning_tokens,
             output_object, output_offset, output_length, output_text)
         SELECT r.id, r.attempts + 1, l.column2, l.column3, l.column4, l.column5, l.column6,
                l.column7, l.column8, l.column9, l.column10, l.column11, l.column12, l.column13
         FROM (",
    );
    let mut texts = false;
    stage.push_values(chunk, |mut row, line| {
        let (range, text) = match &line.output {
            OutputRef::InObject { object, offset, len } => {
                (Some((object.as_str(), to_i64(*offset), to_i64(*len))), None)
            }
            OutputRef::Text(text) => {
                texts = true;
                (None, Some(text.as_str()))
            }
        };
        let billed = line.billed.as_ref();
        let tokens = |f: fn(&TokenUsage) -> u64| billed.map(|b| to_i64(f(&b.tokens)));
        row.push_bind(line.wire_id.as_str())
            .push_bind(i64::from(line.status_code))
            .push_bind(billed.map(|b| b.model.as_str()))
            .push_bind(tokens(|t| t.input))
            .push_bind(tokens(|t| t.cached_input))
            .push_bind(tokens(|t| t.cache_write_5m))
            .push_bind(tokens(|t| t.cache_write_1h))
            .push_bind(tokens(|t| t.output))
            .push_bind(tokens(|t| t.reasoning))
            .push_bind(range.map(|r| r.0))
            .push_bind(range.map(|r| r.1))
            .push_bind(range.map(|r| r.2))
            .push_bind(text);
    });
    stage.push(") AS l CROSS JOIN requests AS r WHERE r.tranche_seq = ");
    stage.push_bind(seq);
    stage.push(" AND r.wire_id = l.column1 AND r.state = 'queued'");
    texts
}

#[async_trait::async_trait]
impl IngestWriter for SqliteIngestWriter {
    async fn attempt_info(&mut self, wire_id: &str) -> StoreResult<Option<AttemptInfo>> {
        self.apply_staged().await?;
        let row = sqlx::query(
            "SELECT attempts, max_attempts, batch_returns, job_id FROM requests
             WHERE tranche_seq = ? AND wire_id = ? AND state = 'queued'",
        )
        .bind(self.seq)
        .bind(wire_id)
        .fetch_optional(&mut *self.tx)
        .await?;
        row.map(|row| attempt_info(&row)).transpose()
    }

    async fn unanswered(&mut self) -> StoreResult<Vec<(String, AttemptInfo)>> {
        self.apply_staged().await?;
        // Nearly every tranche has an answer for each of its requests: it is not read again
        // (a tranche of 50,000 in a database of 1,000,000: 27 ms).
        if self.moved >= self.claimed {
            return Ok(Vec::new());
        }
        let rows = sqlx::query(
            "SELECT attempts, max_attempts, batch_returns, wire_id, job_id FROM requests
             WHERE tranche_seq = ? AND state = 'queued' ORDER BY id",
        )
        .bind(self.seq)
        .fetch_all(&mut *self.tx)
        .await?;
        rows.iter().map(|row| Ok((row.try_get(3)?, attempt_info(row)?))).collect()
    }

    async fn record(&mut self, wire_id: &str, update: &ResultUpdate<'_>) -> StoreResult<bool> {
        self.apply_staged().await?;
        // An answer is kept with the request only once it ends (a request sent again has none).
        let kept = update.output.filter(|_| update.state.is_terminal());
        let range = match kept {
            Some(OutputRef::InObject { object, offset, len }) => {
                Some((object.as_str(), to_i64(*offset), to_i64(*len)))
            }
            _ => None,
        };
        let row = sqlx::query(
            "UPDATE requests SET state = ?1, error = ?2, input_tokens = ?3,
                    output_tokens = ?4, finished_at = ?5,
                    attempts = attempts + ?6, batch_returns = batch_returns + (1 - ?6),
                    tranche_seq = CASE WHEN ?1 = 'pending' THEN NULL ELSE tranche_seq END,
                    not_before = ?7, output_object = ?8, output_offset = ?9, output_length = ?10
             WHERE tranche_seq = ?11 AND wire_id = ?12 AND state = 'queued'
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
        .bind(self.seq)
        .bind(wire_id)
        .fetch_optional(&mut *self.tx)
        .await?;
        let Some(row) = row else { return Ok(false) };
        self.moved += u64::from(update.state != RequestState::Queued);
        self.insert_attempt(&row, update).await?;
        if let Some(OutputRef::Text(output)) = kept {
            let request_id: i64 = row.try_get(0)?;
            sqlx::query(
                "INSERT OR REPLACE INTO request_outputs (request_id, output) VALUES (?, ?)",
            )
            .bind(request_id)
            .bind(output)
            .execute(&mut *self.tx)
            .await?;
        }
        Ok(true)
    }

    async fn record_successes(&mut self, lines: &mut Vec<Success>, at: i64) -> StoreResult<u64> {
        self.finished_at = at;
        // All of a call's lines are sorted before their requests are looked up: the more
        // lines one forward walk of the index holds, the closer together their requests lie
        // (a tranche of 50,000 at 512 lines a walk: 13 µs a line; at 4,096: 5.6). The sort is
        // stable, so of two lines with one wire id the first is staged.
        lines.sort_by(|a, b| a.wire_id.cmp(&b.wire_id));
        let mut staged = 0;
        for chunk in lines.chunks(INGEST_ROWS) {
            staged += self.stage_chunk(chunk).await?;
        }
        lines.clear();
        Ok(staged)
    }

    async fn commit(mut self: Box<Self>, next: TrancheState, at: i64) -> StoreResult<bool> {
        self.apply_staged().await?;
        let moved = sqlx::query(
            "UPDATE tranches SET state = ?, updated_at = ?, not_before = ?
             WHERE id = ? AND state = ? AND lease_token = ?",
        )
        .bind(next.as_str())
        .bind(at)
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

    /// Staging walks the lines and looks each one's request up in `requests_by_tranche` by
    /// tranche and wire id, from the index alone: never a scan of `requests`, nor its rows.
    #[tokio::test]
    async fn staging_looks_each_lines_request_up_in_the_tranche_index() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("t.db").to_string_lossy()).await.unwrap();
        let mut conn = store.pool.acquire().await.unwrap();
        sqlx::query(CREATE_STAGED).execute(&mut *conn).await.unwrap();
        let lines: Vec<Success> = (0..3)
            .map(|i| Success {
                wire_id: format!("k{i}"),
                status_code: 200,
                output: OutputRef::InObject { object: "raw/x".into(), offset: 0, len: 2 },
                billed: None,
            })
            .collect();
        let mut stage = QueryBuilder::<Sqlite>::new("EXPLAIN QUERY PLAN ");
        assert!(!push_stage(&mut stage, 1, &lines), "no output as text");
        let plan: Vec<String> = stage
            .build()
            .fetch_all(&mut *conn)
            .await
            .unwrap()
            .iter()
            .map(|row| row.get(3))
            .collect();
        let requests: Vec<&String> = plan.iter().filter(|step| step.contains(" r ")).collect();
        assert_eq!(requests.len(), 1, "{plan:?}");
        assert!(
            requests[0].starts_with(
                "SEARCH r USING COVERING INDEX requests_by_tranche (tranche_seq=? AND wire_id=?)"
            ),
            "{plan:?}"
        );
        let lines_first = plan.iter().position(|step| step.ends_with("VALUES CLAUSE")).unwrap();
        let requests_at = plan.iter().position(|step| step.contains(" r ")).unwrap();
        assert!(lines_first < requests_at, "the lines are the outer loop: {plan:?}");
    }

    /// The statements over the staged successes look each request up by id: none reads
    /// `requests` whole, whatever the planner would prefer.
    #[tokio::test]
    async fn staged_successes_find_their_requests_by_id_not_by_scanning() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("t.db").to_string_lossy()).await.unwrap();
        let mut conn = store.pool.acquire().await.unwrap();
        sqlx::query(CREATE_STAGED).execute(&mut *conn).await.unwrap();
        for statement in [
            concat!("EXPLAIN QUERY PLAN ", count_staged!()),
            concat!("EXPLAIN QUERY PLAN ", bill_staged!()),
        ] {
            let plan: Vec<String> = sqlx::query(statement)
                .bind("openai")
                .bind(1)
                .fetch_all(&mut *conn)
                .await
                .unwrap_or_else(|e| panic!("{e}: {statement}"))
                .iter()
                .map(|row| row.get(3))
                .collect();
            let requests: Vec<&String> = plan.iter().filter(|step| step.contains(" r ")).collect();
            assert!(
                requests.iter().all(|step| step.starts_with("SEARCH r USING INTEGER PRIMARY KEY")),
                "{plan:?}"
            );
            assert!(plan.iter().any(|step| step == "SCAN s"), "{plan:?}");
        }
    }
}
