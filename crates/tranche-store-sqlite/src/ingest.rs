//! Recording a tranche's results inside one transaction.

use std::sync::Arc;

use sqlx::sqlite::SqliteRow;
use sqlx::{QueryBuilder, Row, Sqlite, SqliteConnection};
use tranche_core::{RequestState, TokenUsage, TrancheId, TrancheState};
use tranche_store::rows::*;
use tranche_store::*;

use crate::keys_off::WriteTx;
use crate::tranches::DENSE_SPAN;
use crate::values::{Batch, Binds};
use crate::{INGEST_ROWS, SqliteStore};

// A success is written once, as its attempt (output range included), by a statement that
// finds its request in SQL. Its request is filled from there when the writer needs the
// requests as they stand (a failure to record, the unanswered, the commit): the statements
// below walk the tranche's attempts and requests in id order, so that results that arrive
// shuffled still rewrite the rows in order, and take the requests queued in this tranche that
// hold a succeeded attempt in it. A request leaves `queued` when its result is recorded, so
// an attempt staged is applied once. They walk one of two ways, chosen by how the tranche's
// ids lie (parameters: ?1 the tranche's number, ?2 and ?3 its first and last queued request):
// - `dense`: the attempts of the tranche's id range, in key order (a claim takes pending
//   requests in id order, so a tranche's ids nearly always form one run), each request found
//   by its rowid. The attempts lead: read in key order they are a walk, where looking each up
//   by its two-column key was a search. `+a.request_id` and `+r.tranche_seq` keep SQLite from
//   leading with the requests (through their rowid range or `requests_by_tranche`).
// - `sparse`: `requests_by_tranche` (requests sent again, spread thin over the ids), each
//   attempt found by its key; `+r.id` keeps SQLite off the rowid range.

/// The requests about to be answered and their attempts, as a `WHERE` over `requests AS r` and
/// `attempts AS a`. [`answered_from`] gives a `SELECT` its `FROM` in the walk's order; an
/// `UPDATE requests AS r ... FROM attempts AS a` takes the same conditions.
macro_rules! answered {
    (dense) => {
        "a.request_id BETWEEN ?2 AND ?3 AND a.tranche_seq = ?1 AND a.outcome = 'succeeded'
         AND r.id = +a.request_id AND +r.tranche_seq = ?1 AND r.state = 'queued'"
    };
    (sparse) => {
        "r.tranche_seq = ?1 AND r.state = 'queued' AND +r.id BETWEEN ?2 AND ?3
         AND a.request_id = r.id AND a.tranche_seq = ?1 AND a.outcome = 'succeeded'"
    };
}

/// The `FROM` of a `SELECT` over [`answered`], the walk's leading table first (`CROSS JOIN`
/// keeps that order).
macro_rules! answered_from {
    (dense) => {
        "FROM attempts AS a CROSS JOIN requests AS r WHERE "
    };
    (sparse) => {
        "FROM requests AS r CROSS JOIN attempts AS a WHERE "
    };
}

/// What the requests about to be answered add up to: how many, how many of them were
/// retried, how their tokens change their job's, and what they were billed. By job and the
/// model that answered (`grouped`: a sort of every row, whose memory grows with the tranche);
/// or all together (`whole`), with the least and greatest job and model and how many name a
/// model, which tell whether they form one group (one job, one model or none: nearly every
/// tranche), and then are its sums, read without a sort.
macro_rules! sum_answered {
    ($walk:tt, grouped) => {
        concat!(
            "SELECT r.job_id, a.model, ",
            sums_answered!(),
            " ",
            answered_from!($walk),
            answered!($walk),
            " GROUP BY r.job_id, a.model
             ORDER BY r.job_id"
        )
    };
    ($walk:tt, whole) => {
        concat!(
            "SELECT MIN(r.job_id), MIN(a.model), ",
            sums_answered!(),
            ", MAX(r.job_id), MAX(a.model), COUNT(a.model) ",
            answered_from!($walk),
            answered!($walk)
        )
    };
}

/// The sums of [`sum_answered`], columns [`ANSWERED`] to [`BILLED`]'s end.
macro_rules! sums_answered {
    () => {
        "COUNT(*), SUM((a.attempt > 1) - (r.attempts > 1)),
         SUM(COALESCE(a.input_tokens, 0) - COALESCE(r.input_tokens, 0)),
         SUM(COALESCE(a.output_tokens, 0) - COALESCE(r.output_tokens, 0)),
         SUM(a.input_tokens), SUM(a.cached_input_tokens), SUM(a.cache_write_5m_tokens),
         SUM(a.cache_write_1h_tokens), SUM(a.output_tokens), SUM(a.reasoning_tokens)"
    };
}

/// Ends the requests answered `succeeded`, each with its attempt's count, tokens and output
/// range (?4 when they finished).
///
/// `OR FAIL`: a statement that may stop halfway (a CHECK or NOT NULL failing) makes SQLite
/// copy every page it changes to a statement journal first, so that it can undo just that
/// statement. One that fails here fails the whole ingest, which is rolled back, so it may keep
/// what it did before failing, and writes no journal (12 MB a tranche of 50,000). It changes
/// no column a foreign key names: an immediate foreign key needs the journal whatever the
/// statement says.
macro_rules! apply_answered {
    ($walk:tt) => {
        concat!(
            "UPDATE OR FAIL requests AS r SET state = 'succeeded', error = NULL, not_before = 0,
                finished_at = ?4, attempts = a.attempt, input_tokens = a.input_tokens,
                output_tokens = a.output_tokens, output_object = a.output_object,
                output_offset = a.output_offset, output_length = a.output_length
             FROM attempts AS a
             WHERE ",
            answered!($walk)
        )
    };
}

// The columns of a row of [`sum_answered`]: the job and model, the sums, and (`whole` only)
// what tells whether its rows form one group.
const JOB: usize = 0;
const MODEL: usize = 1;
const ANSWERED: usize = 2;
const RETRIED: usize = 3;
const INPUT_CHANGE: usize = 4;
const OUTPUT_CHANGE: usize = 5;
/// The six billed token counts, in the usage ledger's order.
const BILLED: std::ops::Range<usize> = 6..12;
const LAST_JOB: usize = 12;
const LAST_MODEL: usize = 13;
const NAMING_A_MODEL: usize = 14;

/// The statements that answer the staged successes, walking the requests one way.
#[derive(Debug)]
struct Answer {
    whole: &'static str,
    grouped: &'static str,
    apply: &'static str,
}

const DENSE: Answer = Answer {
    whole: sum_answered!(dense, whole),
    grouped: sum_answered!(dense, grouped),
    apply: apply_answered!(dense),
};

const SPARSE: Answer = Answer {
    whole: sum_answered!(sparse, whole),
    grouped: sum_answered!(sparse, grouped),
    apply: apply_answered!(sparse),
};

/// Adds `requests` attempts of `job_id` billed by `model` to the usage ledger; their six token
/// counts are bound after.
fn bill<'q>(
    job_id: &'q str,
    provider: &'q str,
    model: &'q str,
    at: i64,
    requests: i64,
) -> sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments> {
    sqlx::query(concat!(
        "INSERT INTO usage_totals
            (job_id, kind, provider, model, day, requests, input_tokens, cached_input_tokens,
             cache_write_5m_tokens, cache_write_1h_tokens, output_tokens, reasoning_tokens)
         VALUES (?, 'billed', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
         ON CONFLICT (job_id, kind, provider, model, day) DO UPDATE SET ",
        usage_add!()
    ))
    .bind(job_id)
    .bind(provider)
    .bind(model)
    .bind(day_of(at))
    .bind(requests)
}

/// The columns of an attempt that a success writes. (A macro so that the statements stay
/// string literals.)
macro_rules! attempt_columns {
    () => {
        "request_id, attempt, tranche_seq, outcome, status_code, created_at, model, input_tokens,
         cached_input_tokens, cache_write_5m_tokens, cache_write_1h_tokens, output_tokens,
         reasoning_tokens, output_object, output_offset, output_length"
    };
}

/// Where a call's successes are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Staging {
    /// Straight into `attempts`: the tranche's wire ids follow its request ids (keys in input
    /// order), so a call's lines, sorted by wire id, land in key order.
    Attempts,
    /// Into `temp.ingest_sorted`, keyed by request id, and from there into `attempts` in key
    /// order once the call's lines are all in. With keys in random order, a call's lines
    /// sorted by wire id land all over the tranche's attempts: written straight, 100,000
    /// results took 7-20% more of a run's CPU than through a temporary table (each line
    /// rewrote a page the small cache had dropped, and the log took every rewrite).
    Sorted,
}

/// The successes of one call, keyed (and so sorted) by request id. Temporary: private to its
/// connection, and it holds at most one call (the engine's 8,192 lines, about 800 KB).
const CREATE_SORTED: &str = "CREATE TEMP TABLE IF NOT EXISTS ingest_sorted (
        request_id INTEGER PRIMARY KEY, attempt INTEGER NOT NULL,
        tranche_seq INTEGER NOT NULL, outcome TEXT NOT NULL, status_code INTEGER,
        created_at INTEGER NOT NULL, model TEXT, input_tokens INTEGER,
        cached_input_tokens INTEGER, cache_write_5m_tokens INTEGER,
        cache_write_1h_tokens INTEGER, output_tokens INTEGER, reasoning_tokens INTEGER,
        output_object TEXT, output_offset INTEGER, output_length INTEGER)";

/// Lines of a tranche sampled (in wire-id order) to tell whether its wire ids follow its ids.
const ORDER_SAMPLE: i64 = 4096;

#[async_trait::async_trait]
impl IngestStore for SqliteStore {
    async fn begin_ingest(
        &self,
        tranche: TrancheId,
        held: Held,
    ) -> StoreResult<Box<dyn IngestWriter>> {
        // Every key an ingest writes holds by construction: an attempt names the request it was
        // found as in this tranche's index, and that request's tranche; an output, its request.
        // Checked, each attempt looked its request up, and a tranche's results walk its rows
        // again call after call (`keys_off.rs`).
        let mut tx = WriteTx::begin_unchecked(&self.pool, self.in_memory).await?;
        // An in-memory database keeps its checks: they are made at the commit (this
        // transaction's end), so that no statement of the ingest can fail halfway on one. What
        // keeps the successes' insert (`OR IGNORE`) and the answers (`OR FAIL`) from writing a
        // statement journal is that the keys of requests and attempts are declared deferred
        // (migration `0026`): SQLite decides on the journal when it compiles a statement, from
        // the declaration, whatever this says.
        sqlx::query("PRAGMA defer_foreign_keys = ON").execute(tx.conn()).await?;
        // A tranche that is not there has no requests to record (and its move fails). The
        // ids of its queued requests are read from `requests_by_tranche` alone.
        let (provider, seq, claimed, first, last, queued): (
            Option<String>,
            Option<i64>,
            Option<i64>,
            Option<i64>,
            Option<i64>,
            i64,
        ) = sqlx::query_as(
            "SELECT t.provider, t.seq, t.request_count, MIN(r.id), MAX(r.id), COUNT(r.id)
             FROM tranches AS t
                  LEFT JOIN requests AS r ON r.tranche_seq = t.seq AND r.state = 'queued'
             WHERE t.id = ?",
        )
        .bind(tranche.to_string())
        .fetch_one(tx.conn())
        .await?;
        let (first, last) = (first.unwrap_or(0), last.unwrap_or(-1));
        let answer = if last - first < DENSE_SPAN * queued { &DENSE } else { &SPARSE };
        let staging = staging_for(tx.conn(), seq.unwrap_or_default()).await?;
        Ok(Box::new(SqliteIngestWriter {
            tx,
            provider: provider.unwrap_or_default(),
            tranche: tranche.to_string(),
            seq: seq.unwrap_or_default(),
            claimed: to_u64(claimed.unwrap_or_default()),
            moved: 0,
            held,
            ids: (first, last),
            answer,
            staging,
            staged: false,
            finished_at: 0,
        }))
    }
}

/// Where the successes of the tranche numbered `seq` are written: straight into `attempts`
/// when its wire ids follow its request ids (no more than one in a hundred of the first
/// requests by wire id has a lower id than the one before), else sorted first (and the
/// temporary table for that made ready).
async fn staging_for(conn: &mut SqliteConnection, seq: i64) -> StoreResult<Staging> {
    // One row: the ids as a JSON array (read through `requests_by_tranche` in its order, with
    // no sort, and no row a request).
    let ids: String = sqlx::query_scalar(
        "SELECT json_group_array(id)
         FROM (SELECT id FROM requests WHERE tranche_seq = ? AND state = 'queued'
               ORDER BY wire_id LIMIT ?)",
    )
    .bind(seq)
    .bind(ORDER_SAMPLE)
    .fetch_one(&mut *conn)
    .await?;
    let ids: Vec<i64> = serde_json::from_str(&ids)
        .map_err(|e| StoreError::Corrupt(format!("a tranche's request ids: {e}")))?;
    let sampled = ids.len();
    let descents = ids.windows(2).filter(|pair| pair[1] < pair[0]).count();
    if descents * 100 <= sampled {
        return Ok(Staging::Attempts);
    }
    sqlx::query(CREATE_SORTED).execute(&mut *conn).await?;
    sqlx::query("DELETE FROM temp.ingest_sorted").execute(conn).await?;
    Ok(Staging::Sorted)
}

/// Records the results of one tranche inside one transaction.
#[derive(Debug)]
pub(crate) struct SqliteIngestWriter {
    tx: WriteTx,
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
    /// The first and last id of the requests queued in the tranche when the writer began:
    /// every request it can answer lies between.
    ids: (i64, i64),
    /// How the statements that answer staged successes walk the tranche's requests.
    answer: &'static Answer,
    /// Where successes are written.
    staging: Staging,
    /// Successes are written as attempts and their requests not yet answered.
    staged: bool,
    /// When the staged successes were recorded.
    finished_at: i64,
}

impl SqliteIngestWriter {
    /// Writes the successes of one chunk of lines as this writer stages them (see
    /// [`Staging::statement`]). Returns how many were written.
    async fn stage_chunk(&mut self, chunk: &[Success]) -> StoreResult<u64> {
        let binds = stage_binds(self.seq, self.finished_at, chunk)?;
        // A full chunk's statement is kept prepared ([`Batch::query`]). At 10,000 requests
        // under callgrind, 4.356 G instructions against 4.449; its statements' time at
        // 100,000, 0.55-0.61 s against 0.66-0.72. It holds a megabyte or two: peak RSS at
        // 10,000 28-30 MB against 28-29, at 1,000,000 33 against 31. (When successes went
        // through a temporary table, keeping it raised the peak by 3 MB.)
        let stage = self.staging.statement().query(chunk.len(), binds);
        Ok(stage.execute(self.tx.conn()).await?.rows_affected())
    }

    /// Writes a call's successes sorted in `temp.ingest_sorted` into `attempts`, in key
    /// order. Returns how many were written.
    async fn write_sorted(&mut self) -> StoreResult<u64> {
        let written = sqlx::query(concat!(
            "INSERT OR IGNORE INTO attempts (",
            attempt_columns!(),
            ") SELECT ",
            attempt_columns!(),
            " FROM temp.ingest_sorted ORDER BY request_id"
        ))
        .execute(self.tx.conn())
        .await?
        .rows_affected();
        sqlx::query("DELETE FROM temp.ingest_sorted").execute(self.tx.conn()).await?;
        Ok(written)
    }

    /// Answers the requests whose successes are staged: their jobs' counters and the usage
    /// ledger from one pass over them, then the requests themselves in another, each in id
    /// order.
    async fn apply_staged(&mut self) -> StoreResult<()> {
        if !self.staged {
            return Ok(());
        }
        let (first, last) = self.ids;
        let whole = sqlx::query(self.answer.whole)
            .bind(self.seq)
            .bind(first)
            .bind(last)
            .fetch_one(self.tx.conn())
            .await?;
        let answered: i64 = whole.try_get(ANSWERED)?;
        let named: i64 = whole.try_get(NAMING_A_MODEL)?;
        let one_job = whole.try_get::<Option<String>, _>(JOB)? == whole.try_get(LAST_JOB)?;
        let one_model = named == 0
            || (named == answered
                && whole.try_get::<Option<String>, _>(MODEL)? == whole.try_get(LAST_MODEL)?);
        let sums = if answered == 0 {
            Vec::new()
        } else if one_job && one_model {
            vec![whole]
        } else {
            // A few rows: one a job and model.
            sqlx::query(self.answer.grouped)
                .bind(self.seq)
                .bind(first)
                .bind(last)
                .fetch_all(self.tx.conn())
                .await?
        };
        // Counters move, and the ledger grows, by each job and model's sums.
        for row in &sums {
            let job_id: String = row.try_get(JOB)?;
            let answered: i64 = row.try_get(ANSWERED)?;
            sqlx::query(
                "UPDATE jobs SET n_queued = n_queued - ?1, n_succeeded = n_succeeded + ?1,
                        n_retried = n_retried + ?2, input_tokens = input_tokens + ?3,
                        output_tokens = output_tokens + ?4
                 WHERE id = ?5",
            )
            .bind(answered)
            .bind(row.try_get::<i64, _>(RETRIED)?)
            .bind(row.try_get::<i64, _>(INPUT_CHANGE)?)
            .bind(row.try_get::<i64, _>(OUTPUT_CHANGE)?)
            .bind(&job_id)
            .execute(self.tx.conn())
            .await?;
            // Each is a new attempt, counted here once; the transaction commits with the
            // tranche's move or not at all.
            let Some(model) = row.try_get::<Option<String>, _>(MODEL)? else { continue };
            let mut billed = bill(&job_id, &self.provider, &model, self.finished_at, answered);
            for column in BILLED {
                billed = billed.bind(row.try_get::<Option<i64>, _>(column)?);
            }
            billed.execute(self.tx.conn()).await?;
        }
        // Every request answered here is queued in this tranche: its job's counters moved
        // above, once per job and model, not once per request (the apply does not set
        // `recount`, so the counter trigger is not part of it).
        let applied = sqlx::query(self.answer.apply)
            .bind(self.seq)
            .bind(first)
            .bind(last)
            .bind(self.finished_at)
            .execute(self.tx.conn())
            .await?;
        self.moved += applied.rows_affected();
        self.staged = false;
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
            .execute(self.tx.conn())
            .await?
            .rows_affected();
        let Some(billed) = billed.filter(|_| inserted == 1) else { return Ok(()) };
        let job_id: String = row.try_get(2)?;
        let upsert = bill(&job_id, &self.provider, &billed.model, update.at, 1);
        bind_tokens(upsert, Some(&billed.tokens)).execute(self.tx.conn()).await?;
        Ok(())
    }
}

/// The head of [`Staging::statement`] writing into `$into`: when the successes were recorded is
/// its one placeholder.
macro_rules! stage_head {
    ($into:literal) => {
        concat!(
            "INSERT OR IGNORE INTO ",
            $into,
            " (",
            attempt_columns!(),
            ") SELECT r.id, r.attempts + 1, r.tranche_seq, 'succeeded', l.column2, ?,
                l.column3, l.column4, l.column5, l.column6, l.column7, l.column8, l.column9,
                l.column10, l.column11, l.column12
             FROM (VALUES "
        )
    };
}

/// The tail of [`Staging::statement`]: the tranche's number is its one placeholder.
const STAGE_TAIL: &str = ") AS l CROSS JOIN requests AS r
    WHERE r.tranche_seq = ? AND r.wire_id = l.column1 AND r.state = 'queued'";

/// Values bound for each line of [`Staging::statement`].
const STAGE_VALUES: usize = 12;

impl Staging {
    /// The statement that writes the successes of a chunk of lines, of one tranche and sorted
    /// by wire id, as attempts: SQL finds their requests (no request row comes back to this
    /// side), looked up in `requests_by_tranche` line by line in that order (`CROSS JOIN`
    /// keeps the lines as the outer loop), so that one call's chunks walk the index forwards.
    /// The index holds what this needs of a request (its id, that it is queued, its attempts):
    /// no request row is read here. A request with an attempt in this tranche already (an
    /// earlier line with its wire id) keeps it. Its values are [`stage_binds`].
    fn statement(self) -> &'static Batch {
        static ATTEMPTS: Batch =
            Batch::new(stage_head!("attempts"), STAGE_VALUES, INGEST_ROWS, STAGE_TAIL);
        static SORTED: Batch =
            Batch::new(stage_head!("temp.ingest_sorted"), STAGE_VALUES, INGEST_ROWS, STAGE_TAIL);
        match self {
            Staging::Attempts => &ATTEMPTS,
            Staging::Sorted => &SORTED,
        }
    }
}

/// The last string bound for a column, shared by the next value that is the same.
#[derive(Debug, Default)]
struct Reused(Option<Arc<str>>);

impl Reused {
    fn get(&mut self, value: &str) -> Arc<str> {
        match &self.0 {
            Some(last) if **last == *value => Arc::clone(last),
            _ => Arc::clone(self.0.insert(value.into())),
        }
    }
}

/// The values of [`Staging::statement`] for `chunk`, lines of the tranche numbered `seq`
/// recorded at `at`.
fn stage_binds(seq: i64, at: i64, chunk: &[Success]) -> StoreResult<Binds> {
    let mut binds = Binds::with_capacity(2 + chunk.len() * STAGE_VALUES);
    binds.add(at)?;
    // Nearly every line names the model and the raw object its neighbour names: bound as one
    // shared string, not copied into a new one a line.
    let (mut model, mut object) = (Reused::default(), Reused::default());
    for line in chunk {
        let range = match &line.output {
            OutputRef::InObject { object: name, offset, len } => {
                Some((object.get(name), to_i64(*offset), to_i64(*len)))
            }
            OutputRef::Text(_) => None,
        };
        let billed = line.billed.as_ref();
        let tokens = |f: fn(&TokenUsage) -> u64| billed.map(|b| to_i64(f(&b.tokens)));
        binds
            .add(line.wire_id.as_str())?
            .add(i64::from(line.status_code))?
            .add(billed.map(|b| model.get(&b.model)))?
            .add(tokens(|t| t.input))?
            .add(tokens(|t| t.cached_input))?
            .add(tokens(|t| t.cache_write_5m))?
            .add(tokens(|t| t.cache_write_1h))?
            .add(tokens(|t| t.output))?
            .add(tokens(|t| t.reasoning))?
            .add(range.as_ref().map(|r| Arc::clone(&r.0)))?
            .add(range.as_ref().map(|r| r.1))?
            .add(range.map(|r| r.2))?;
    }
    binds.add(seq)?;
    Ok(binds)
}

/// Pushes the statement that keeps the outputs of `chunk` given as text (not by reference)
/// in the database, each for the request whose success in the tranche numbered `seq` it is:
/// a line whose request's attempt holds another output (an earlier line with its wire id)
/// keeps none.
fn push_texts(texts: &mut QueryBuilder<Sqlite>, seq: i64, chunk: &[Success]) {
    texts.push(
        "INSERT OR IGNORE INTO request_outputs (request_id, output) SELECT r.id, l.column2 FROM (",
    );
    let lines = chunk.iter().filter_map(|line| match &line.output {
        OutputRef::Text(text) => Some((line.wire_id.as_str(), text.as_str())),
        OutputRef::InObject { .. } => None,
    });
    texts.push_values(lines, |mut row, (wire_id, text)| {
        row.push_bind(wire_id).push_bind(text);
    });
    texts.push(") AS l CROSS JOIN requests AS r CROSS JOIN attempts AS a WHERE r.tranche_seq = ");
    texts.push_bind(seq);
    texts.push(
        " AND r.wire_id = l.column1 AND r.state = 'queued'
           AND a.request_id = r.id AND a.tranche_seq = r.tranche_seq
           AND a.outcome = 'succeeded' AND a.output_object IS NULL",
    );
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
        .fetch_optional(self.tx.conn())
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
        .fetch_all(self.tx.conn())
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
            "UPDATE requests SET recount = 0, state = ?1, error = ?2, input_tokens = ?3,
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
        .fetch_optional(self.tx.conn())
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
            .execute(self.tx.conn())
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
        if self.staging == Staging::Sorted {
            staged = self.write_sorted().await?;
        }
        self.staged |= staged > 0;
        // Outputs given as text (not by reference) are kept in the database, once their
        // attempts are written.
        if staged > 0 {
            for chunk in lines.chunks(INGEST_ROWS) {
                if chunk.iter().any(|line| matches!(line.output, OutputRef::Text(_))) {
                    let mut texts = QueryBuilder::<Sqlite>::new("");
                    push_texts(&mut texts, self.seq, chunk);
                    texts.build().persistent(false).execute(self.tx.conn()).await?;
                }
            }
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
        .execute(self.tx.conn())
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

    /// A string the same as the last is the last one shared; another is a new one.
    #[test]
    fn a_string_bound_again_is_shared_until_another_comes() {
        let mut reused = Reused::default();
        let first = reused.get("raw/a");
        let again = reused.get("raw/a");
        assert!(Arc::ptr_eq(&first, &again));
        let other = reused.get("raw/b");
        assert_eq!((&*other, Arc::ptr_eq(&first, &other)), ("raw/b", false));
        assert!(Arc::ptr_eq(&other, &reused.get("raw/b")));
    }

    /// Staging walks the lines and looks each one's request up in `requests_by_tranche` by
    /// tranche and wire id, from the index alone: never a scan of `requests`, nor its rows.
    #[tokio::test]
    async fn staging_looks_each_lines_request_up_in_the_tranche_index() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("t.db").to_string_lossy()).await.unwrap();
        let mut conn = store.pool.acquire().await.unwrap();
        let lines: Vec<Success> = (0..3)
            .map(|i| Success {
                wire_id: format!("k{i}"),
                status_code: 200,
                output: OutputRef::InObject { object: "raw/x".into(), offset: 0, len: 2 },
                billed: None,
            })
            .collect();
        let mut text = "EXPLAIN QUERY PLAN ".to_owned();
        text.push_str(&Staging::Attempts.statement().text(lines.len()));
        let binds = stage_binds(1, 0, &lines).unwrap().into_arguments();
        let plan: Vec<String> = sqlx::query_with(sqlx::AssertSqlSafe(text), binds)
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

    /// A tranche whose wire ids follow its request ids writes its successes straight into
    /// `attempts`; one whose wire ids do not (`k10` sorts before `k2`) sorts them first.
    #[tokio::test]
    async fn successes_are_sorted_first_only_when_wire_ids_do_not_follow_ids() {
        use tranche_store::conformance::{add_job, claim_all};
        for (requests, staging) in [(9, Staging::Attempts), (40, Staging::Sorted)] {
            let dir = tempfile::tempdir().unwrap();
            let store =
                SqliteStore::open(&dir.path().join("t.db").to_string_lossy()).await.unwrap();
            add_job(&store, requests, "m").await;
            claim_all(&store, "m").await;
            let mut tx = store.begin_write().await.unwrap();
            assert_eq!(staging_for(&mut tx, 1).await.unwrap(), staging, "{requests}");
        }
    }

    /// The statements that answer staged successes walk the tranche as told: its attempts in
    /// key order over its id range, each request by its rowid; or `requests_by_tranche`, each
    /// attempt by its key. Never a scan of `requests` or of `attempts`, whatever the planner
    /// would prefer.
    #[tokio::test]
    async fn answering_walks_the_tranche_as_told_and_finds_attempts_by_key() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("t.db").to_string_lossy()).await.unwrap();
        for (answer, walk, attempt, attempts_lead) in [
            (
                &DENSE,
                "INTEGER PRIMARY KEY (rowid=?)",
                "SEARCH a USING PRIMARY KEY (request_id>? AND request_id<?)",
                true,
            ),
            (
                &SPARSE,
                "INDEX requests_by_tranche (tranche_seq=?)",
                "SEARCH a USING PRIMARY KEY (request_id=? AND tranche_seq=?)",
                false,
            ),
        ] {
            for statement in [answer.whole, answer.grouped, answer.apply] {
                let plan = crate::query_plans::plan_of(&store, statement, &[1, 1, 10, 0]).await;
                let requests: Vec<&String> =
                    plan.iter().filter(|step| step.contains(" r ")).collect();
                assert!(
                    !requests.is_empty()
                        && requests
                            .iter()
                            .all(|step| step.starts_with("SEARCH r USING ") && step.ends_with(walk)),
                    "{walk}: {plan:?}"
                );
                let attempts: Vec<&String> =
                    plan.iter().filter(|step| step.contains(" a ")).collect();
                assert!(
                    !attempts.is_empty() && attempts.iter().all(|step| step.starts_with(attempt)),
                    "{plan:?}"
                );
                let at = |table: &str| plan.iter().position(|step| step.contains(table)).unwrap();
                assert_eq!(at(" a ") < at(" r "), attempts_lead, "{plan:?}");
            }
        }
    }
}
