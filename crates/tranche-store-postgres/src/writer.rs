//! Recording a job's requests inside one transaction, many rows per statement: each column of
//! a chunk is bound as one array and the rows are read back with `UNNEST`.

use std::collections::HashMap;

use sqlx::{Connection, Postgres, Row, Transaction};
use tranche_core::ProviderKind;
use tranche_store::rows::{to_i64, to_u64};
use tranche_store::*;

use crate::INSERT_ROWS;

/// The request rows waiting in a [`PgJobWriter`] for their multi-row insert, one array per
/// column (as they are bound).
#[derive(Debug, Default)]
struct Chunk {
    line: Vec<i64>,
    custom_id: Vec<String>,
    wire_id: Vec<String>,
    endpoint: Vec<&'static str>,
    model: Vec<String>,
    wire_bytes: Vec<i64>,
    input_hash: Vec<String>,
    max_attempts: Vec<i64>,
    est_tokens: Vec<i64>,
    max_cost: Vec<Option<i64>>,
    accepted_at: Vec<i64>,
    /// The body's range in the job's body object, when it rests there.
    body_offset: Vec<Option<i64>>,
    body_length: Vec<Option<i64>>,
    /// Bodies kept in the database, by the index of their row in the chunk.
    bodies: Vec<(usize, String)>,
}

impl Chunk {
    fn with_capacity(n: usize) -> Self {
        Self {
            line: Vec::with_capacity(n),
            custom_id: Vec::with_capacity(n),
            wire_id: Vec::with_capacity(n),
            endpoint: Vec::with_capacity(n),
            model: Vec::with_capacity(n),
            wire_bytes: Vec::with_capacity(n),
            input_hash: Vec::with_capacity(n),
            max_attempts: Vec::with_capacity(n),
            est_tokens: Vec::with_capacity(n),
            max_cost: Vec::with_capacity(n),
            accepted_at: Vec::with_capacity(n),
            body_offset: Vec::with_capacity(n),
            body_length: Vec::with_capacity(n),
            bodies: Vec::new(),
        }
    }

    fn len(&self) -> usize {
        self.line.len()
    }

    fn clear(&mut self) {
        self.line.clear();
        self.custom_id.clear();
        self.wire_id.clear();
        self.endpoint.clear();
        self.model.clear();
        self.wire_bytes.clear();
        self.input_hash.clear();
        self.max_attempts.clear();
        self.est_tokens.clear();
        self.max_cost.clear();
        self.accepted_at.clear();
        self.body_offset.clear();
        self.body_length.clear();
        self.bodies.clear();
    }
}

/// Records a job's requests inside one transaction, many rows per statement.
#[derive(Debug)]
pub(crate) struct PgJobWriter {
    tx: Transaction<'static, Postgres>,
    job: String,
    provider: ProviderKind,
    accepted: u64,
    chunk: Chunk,
    /// The job's body object, recorded when the job commits.
    body_object: Option<BlobRecord>,
    /// The answer check every request of the job carries.
    answer_check: Option<String>,
}

impl PgJobWriter {
    pub(crate) fn new(
        tx: Transaction<'static, Postgres>,
        job: String,
        provider: ProviderKind,
        answer_check: Option<String>,
    ) -> Self {
        Self {
            tx,
            job,
            provider,
            accepted: 0,
            chunk: Chunk::with_capacity(INSERT_ROWS),
            body_object: None,
            answer_check,
        }
    }

    /// The buffered rows whose custom id an earlier row of the job (stored, or buffered
    /// before them) already has.
    async fn duplicates(&mut self) -> StoreResult<Vec<DuplicateCustomId>> {
        let stored = sqlx::query(
            "SELECT custom_id, line FROM requests WHERE job_id = $1 AND custom_id = ANY($2)",
        )
        .bind(self.job.as_str())
        .bind(&self.chunk.custom_id)
        .fetch_all(&mut *self.tx)
        .await?;
        let mut first: HashMap<&str, i64> = HashMap::with_capacity(self.chunk.len());
        for row in &stored {
            first.insert(row.try_get(0)?, row.try_get(1)?);
        }
        let mut duplicates = Vec::new();
        for (custom_id, &line) in self.chunk.custom_id.iter().zip(&self.chunk.line) {
            match first.get(custom_id.as_str()) {
                Some(&first_line) => duplicates.push(DuplicateCustomId {
                    line: to_u64(line),
                    custom_id: custom_id.clone(),
                    first_line: to_u64(first_line),
                }),
                None => {
                    first.insert(custom_id.as_str(), line);
                }
            }
        }
        Ok(duplicates)
    }
}

#[async_trait::async_trait]
impl JobWriter for PgJobWriter {
    async fn add(&mut self, request: &NewRequest<'_>) -> StoreResult<()> {
        let chunk = &mut self.chunk;
        if let RequestBody::Stored(body) = request.body {
            chunk.bodies.push((chunk.len(), body.to_owned()));
        }
        let range = match request.body {
            RequestBody::InObject { offset, len } => Some((to_i64(offset), to_i64(len))),
            RequestBody::Stored(_) => None,
        };
        chunk.line.push(to_i64(request.line));
        chunk.custom_id.push(request.custom_id.to_owned());
        chunk.wire_id.push(request.wire_id.to_owned());
        chunk.endpoint.push(request.endpoint.as_str());
        chunk.model.push(request.model.to_owned());
        chunk.wire_bytes.push(to_i64(request.wire_bytes));
        chunk.input_hash.push(request.input_hash.to_hex());
        chunk.max_attempts.push(i64::from(request.max_attempts));
        chunk.est_tokens.push(to_i64(request.est_tokens));
        chunk.max_cost.push(request.max_cost.map(|c| to_i64(c.nanos())));
        chunk.accepted_at.push(request.accepted_at);
        chunk.body_offset.push(range.map(|(offset, _)| offset));
        chunk.body_length.push(range.map(|(_, len)| len));
        self.accepted += 1;
        if self.chunk.len() >= INSERT_ROWS {
            self.flush().await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> StoreResult<()> {
        let n = self.chunk.len();
        if n == 0 {
            return Ok(());
        }
        // The chunk's ids, in input order: later chunks of the job take later values.
        let rows = sqlx::query("SELECT nextval('request_ids') FROM generate_series(1, $1)")
            .bind(to_i64(n as u64))
            .fetch_all(&mut *self.tx)
            .await?;
        let mut ids = rows.iter().map(|row| row.try_get(0)).collect::<Result<Vec<i64>, _>>()?;
        ids.sort_unstable();
        // A savepoint, so that a repeated custom id leaves the transaction usable for the
        // look-up that names it (a failed statement aborts a PostgreSQL transaction), and
        // none of the chunk written.
        let mut savepoint = self.tx.begin().await?;
        let chunk = &self.chunk;
        let inserted = sqlx::query(
            "INSERT INTO requests (id, job_id, line, custom_id, wire_id, provider, endpoint, model,
                                   wire_bytes, input_hash, state, max_attempts, est_tokens,
                                   accepted_at, body_offset, body_length, answer_check,
                                   max_cost)
             SELECT u.id, $1, u.line, u.custom_id, u.wire_id, $2, u.endpoint, u.model,
                    u.wire_bytes, u.input_hash, 'pending', u.max_attempts, u.est_tokens,
                    u.accepted_at, u.body_offset, u.body_length, $3, u.max_cost
             FROM UNNEST($4::bigint[], $5::bigint[], $6::text[], $7::text[], $8::text[],
                         $9::text[], $10::bigint[], $11::text[], $12::bigint[], $13::bigint[],
                         $14::bigint[], $15::bigint[], $16::bigint[], $17::bigint[])
                  AS u(id, line, custom_id, wire_id, endpoint, model, wire_bytes, input_hash,
                       max_attempts, est_tokens, accepted_at, body_offset, body_length,
                       max_cost)",
        )
        .bind(self.job.as_str())
        .bind(self.provider.as_str())
        .bind(self.answer_check.as_deref())
        .bind(&ids)
        .bind(&chunk.line)
        .bind(&chunk.custom_id)
        .bind(&chunk.wire_id)
        .bind(&chunk.endpoint)
        .bind(&chunk.model)
        .bind(&chunk.wire_bytes)
        .bind(&chunk.input_hash)
        .bind(&chunk.max_attempts)
        .bind(&chunk.est_tokens)
        .bind(&chunk.accepted_at)
        .bind(&chunk.body_offset)
        .bind(&chunk.body_length)
        .bind(&chunk.max_cost)
        .execute(&mut *savepoint)
        .await;
        match inserted {
            Ok(_) => savepoint.commit().await?,
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                savepoint.rollback().await?;
                let duplicates = self.duplicates().await?;
                self.chunk.clear();
                return Err(StoreError::DuplicateCustomIds(duplicates));
            }
            Err(e) => return Err(e.into()),
        }
        if !self.chunk.bodies.is_empty() {
            let (body_ids, bodies): (Vec<i64>, Vec<String>) =
                self.chunk.bodies.drain(..).map(|(i, body)| (ids[i], body)).unzip();
            sqlx::query(
                "INSERT INTO request_bodies (request_id, body)
                 SELECT * FROM UNNEST($1::bigint[], $2::text[])",
            )
            .bind(body_ids)
            .bind(bodies)
            .execute(&mut *self.tx)
            .await?;
        }
        self.chunk.clear();
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
            crate::blobs::record(&mut *self.tx, object).await?;
        }
        // Every request of a new job is pending; the counters' trigger follows them from here.
        sqlx::query("UPDATE jobs SET accepted = $1, n_pending = $1 WHERE id = $2")
            .bind(to_i64(self.accepted))
            .bind(&self.job)
            .execute(&mut *self.tx)
            .await?;
        self.tx.commit().await?;
        Ok(self.accepted)
    }
}
