//! Recording a job's requests inside one transaction, many rows per statement.

use std::collections::HashMap;
use std::sync::Arc;

use sqlx::{QueryBuilder, Row, Sqlite};
use tranche_store::rows::{to_i64, to_u64};
use tranche_store::*;

use crate::INSERT_ROWS;
use crate::keys_off::WriteTx;
use crate::values::{Batch, Binds};

/// A request's insert: the values every row of a job shares (its id, provider and answer
/// check) bound once a statement, as the select list's three placeholders; each row's own
/// from the `VALUES` list.
///
/// `OR FAIL`, its foreign keys not checked (a file database's writer runs unchecked,
/// `keys_off.rs`) or checked at the commit (in memory; migration `0026`): a statement that may
/// stop halfway makes SQLite copy every page it changes to a statement journal first, so that
/// it can undo just that statement (133 MB written to a temporary file while 100,000 requests
/// were accepted). A failed statement here fails the job, whose transaction is rolled back
/// whole, so it may keep the rows it wrote before failing; [`SqliteJobWriter::duplicates`]
/// reads none of them.
const INSERT_HEAD: &str =
    "INSERT OR FAIL INTO requests (id, job_id, line, custom_id, wire_id, provider,
        endpoint, model, wire_bytes, input_hash, state, max_attempts, est_tokens, accepted_at,
        body_offset, body_length, answer_check, max_cost)
    SELECT l.column1, ?, l.column2, l.column3, l.column4, ?, l.column5, l.column6, l.column7,
        l.column8, 'pending', l.column9, l.column10, l.column11, l.column12, l.column13, ?,
        l.column14
    FROM (VALUES ";
const INSERT_TAIL: &str = ") AS l";
/// Values bound once a statement, and once a row.
const SHARED_VALUES: usize = 3;
const ROW_VALUES: usize = 14;

static INSERT: Batch = Batch::new(INSERT_HEAD, ROW_VALUES, INSERT_ROWS, INSERT_TAIL);

/// A request row waiting in a [`JobWriter`] for its multi-row insert.
#[derive(Debug)]
struct RequestRow {
    id: i64,
    line: i64,
    custom_id: Arc<str>,
    wire_id: Arc<str>,
    endpoint: Arc<str>,
    model: Arc<str>,
    wire_bytes: i64,
    input_hash: [u8; 32],
    max_attempts: i64,
    est_tokens: i64,
    max_cost: Option<i64>,
    accepted_at: i64,
    /// The body's range in the job's body object, when it rests there.
    body_range: Option<(i64, i64)>,
}

/// Records a job's requests inside one transaction, many rows per statement.
///
/// The values every row repeats (job, provider, endpoint, model, answer check) are bound as
/// shared `Arc<str>`s and each row's own strings are handed over, not copied: sqlx binds a
/// borrowed `&str` by copying it into a new `Arc<String>`, two allocations a value.
#[derive(Debug)]
pub(crate) struct SqliteJobWriter {
    tx: WriteTx,
    job: Arc<str>,
    provider: Arc<str>,
    /// The endpoints and models rows have named so far (a few per job; at most
    /// [`SHARED_NAMES`] are kept, later ones bound as they come).
    names: HashMap<String, Arc<str>>,
    accepted: u64,
    /// The id the job's first request takes: its requests take the ids from here on, in one
    /// run (the writer holds the write lock).
    first_id: i64,
    /// The id given to the last request added.
    last_id: i64,
    rows: Vec<RequestRow>,
    bodies: Vec<(i64, String)>,
    /// The job's body object, recorded when the job commits.
    body_object: Option<BlobRecord>,
    /// The answer check every request of the job carries.
    answer_check: Option<Arc<str>>,
    /// The job's own row, inserted when it commits.
    row: JobRow,
}

/// What a job's row is inserted with besides its counts.
#[derive(Debug)]
struct JobRow {
    source: Option<String>,
    /// The settings as JSON.
    settings: String,
    tenant: Option<String>,
    /// The blob-store object its bodies rest in, by key.
    body_object: Option<String>,
    awaits_review: bool,
    created_at: i64,
}

/// The most endpoint and model names a writer shares between its rows.
const SHARED_NAMES: usize = 64;

impl SqliteJobWriter {
    pub(crate) fn new(tx: WriteTx, job: NewJob, settings: String, last_id: i64) -> Self {
        Self {
            tx,
            job: job.id.to_string().into(),
            provider: job.provider.as_str().into(),
            names: HashMap::new(),
            accepted: 0,
            first_id: last_id + 1,
            last_id,
            rows: Vec::with_capacity(INSERT_ROWS),
            bodies: Vec::with_capacity(INSERT_ROWS),
            body_object: None,
            answer_check: job.settings.answer_check.clone().map(Into::into),
            row: JobRow {
                source: job.source,
                tenant: job.settings.tenant.clone(),
                awaits_review: job.settings.review_sample.is_some(),
                settings,
                body_object: job.body_object,
                created_at: job.created_at,
            },
        }
    }

    /// `name` as a shared string, the same `Arc` for every row that names it.
    fn shared(&mut self, name: &str) -> Arc<str> {
        if let Some(shared) = self.names.get(name) {
            return Arc::clone(shared);
        }
        let shared: Arc<str> = name.into();
        if self.names.len() < SHARED_NAMES {
            self.names.insert(name.to_owned(), Arc::clone(&shared));
        }
        shared
    }

    /// The buffered rows whose custom id an earlier row of the job (stored by an earlier
    /// statement, or buffered before them) already has. The rows the failed statement wrote
    /// before it stopped are the buffered ones, and are not read as stored.
    async fn duplicates(&mut self) -> StoreResult<Vec<DuplicateCustomId>> {
        let first_buffered = self.rows.first().map_or(self.last_id + 1, |row| row.id);
        let mut select =
            QueryBuilder::<Sqlite>::new("SELECT custom_id, line FROM requests WHERE job_id = ");
        select.push_bind(Arc::clone(&self.job)).push(" AND id < ");
        select.push_bind(first_buffered).push(" AND custom_id IN (");
        let mut ids = select.separated(", ");
        for row in &self.rows {
            ids.push_bind(Arc::clone(&row.custom_id));
        }
        select.push(")");
        let stored = select.build().persistent(false).fetch_all(self.tx.conn()).await?;
        let mut first: HashMap<&str, i64> = HashMap::with_capacity(self.rows.len());
        for row in &stored {
            first.insert(row.try_get(0)?, row.try_get(1)?);
        }
        let mut duplicates = Vec::new();
        for row in &self.rows {
            match first.get(&*row.custom_id) {
                Some(&line) => duplicates.push(DuplicateCustomId {
                    line: to_u64(row.line),
                    custom_id: row.custom_id.to_string(),
                    first_line: to_u64(line),
                }),
                None => {
                    first.insert(&*row.custom_id, row.line);
                }
            }
        }
        Ok(duplicates)
    }
}

#[async_trait::async_trait]
impl JobWriter for SqliteJobWriter {
    async fn add(&mut self, request: &NewRequest<'_>) -> StoreResult<()> {
        self.last_id += 1;
        let endpoint = self.shared(request.endpoint.as_str());
        let model = self.shared(request.model);
        self.rows.push(RequestRow {
            id: self.last_id,
            line: to_i64(request.line),
            custom_id: request.custom_id.into(),
            wire_id: request.wire_id.into(),
            endpoint,
            model,
            wire_bytes: to_i64(request.wire_bytes),
            input_hash: *request.input_hash.as_bytes(),
            max_attempts: i64::from(request.max_attempts),
            est_tokens: to_i64(request.est_tokens),
            max_cost: request.max_cost.map(|c| to_i64(c.nanos())),
            accepted_at: request.accepted_at,
            body_range: match request.body {
                RequestBody::InObject { offset, len } => Some((to_i64(offset), to_i64(len))),
                RequestBody::Stored(_) => None,
            },
        });
        if let RequestBody::Stored(body) = request.body {
            self.bodies.push((self.last_id, body.to_owned()));
        }
        self.accepted += 1;
        if self.rows.len() >= INSERT_ROWS {
            self.flush().await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> StoreResult<()> {
        if self.rows.is_empty() {
            return Ok(());
        }
        let mut binds = Binds::with_capacity(SHARED_VALUES + self.rows.len() * ROW_VALUES);
        binds
            .add(Arc::clone(&self.job))?
            .add(Arc::clone(&self.provider))?
            .add(self.answer_check.clone())?;
        for r in &self.rows {
            binds
                .add(r.id)?
                .add(r.line)?
                .add(Arc::clone(&r.custom_id))?
                .add(Arc::clone(&r.wire_id))?
                .add(Arc::clone(&r.endpoint))?
                .add(Arc::clone(&r.model))?
                .add(r.wire_bytes)?
                .add(r.input_hash.to_vec())?
                .add(r.max_attempts)?
                .add(r.est_tokens)?
                .add(r.accepted_at)?
                .add(r.body_range.map(|(offset, _)| offset))?
                .add(r.body_range.map(|(_, len)| len))?
                .add(r.max_cost)?;
        }
        match INSERT.query(self.rows.len(), binds).execute(self.tx.conn()).await {
            Ok(_) => {}
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                let duplicates = self.duplicates().await?;
                self.rows.clear();
                self.bodies.clear();
                return Err(StoreError::DuplicateCustomIds(duplicates));
            }
            Err(e) => return Err(e.into()),
        }
        // Bodies kept in the database come with a full batch of requests or a shorter last one;
        // only the full batch's statement is worth keeping prepared.
        let persistent = self.rows.len() == INSERT_ROWS;
        self.rows.clear();
        if self.bodies.is_empty() {
            return Ok(());
        }
        let mut insert =
            QueryBuilder::<Sqlite>::new("INSERT OR FAIL INTO request_bodies (request_id, body) ");
        insert.push_values(self.bodies.drain(..), |mut row, (id, body)| {
            row.push_bind(id).push_bind(body);
        });
        insert.build().persistent(persistent).execute(self.tx.conn()).await?;
        Ok(())
    }

    fn accepted(&self) -> u64 {
        self.accepted
    }

    fn body_object(&mut self, object: BlobRecord) {
        self.body_object = Some(object);
    }

    async fn commit(mut self: Box<Self>) -> StoreResult<u64> {
        self.flush().await?;
        if let Some(object) = &self.body_object {
            crate::blobs::record(self.tx.conn(), object).await?;
        }
        // Every request of a new job is pending; the counters' trigger follows them from here.
        // The job's requests are the ids from its first to its last (none when it has none).
        // Its row is written once, last: inserted before its requests and counted after them,
        // its page went to the log early (the cache holds 64 pages) and was written again at
        // the end, and SQLite rewrites the checksum of every frame of the log from a frame a
        // transaction overwrites to its end, reading each back (a job of 100,000 requests: 814
        // frames of 16 KiB at its commit against 2,011; pages of its requests' b-trees still
        // go early and come back).
        let range = (self.accepted > 0).then_some((self.first_id, self.last_id));
        let row = &self.row;
        sqlx::query(
            "INSERT INTO jobs (id, provider, state, source, settings, tenant, body_object, accepted,
                               n_pending, first_request, last_request, awaits_review,
                               created_at, updated_at)
             VALUES (?1, ?2, 'pending', ?3, ?4, ?5, ?6, ?7, ?7, ?8, ?9, ?10, ?11, ?11)",
        )
        .bind(&*self.job)
        .bind(&*self.provider)
        .bind(row.source.as_deref())
        .bind(&row.settings)
        .bind(row.tenant.as_deref())
        .bind(row.body_object.as_deref())
        .bind(to_i64(self.accepted))
        .bind(range.map(|r| r.0))
        .bind(range.map(|r| r.1))
        .bind(row.awaits_review)
        .bind(row.created_at)
        .execute(self.tx.conn())
        .await?;
        self.tx.commit().await?;
        Ok(self.accepted)
    }
}
