//! Copying a SQLite store into an empty PostgreSQL database (`tranche migrate`): every table of
//! the SQLite schema as this build leaves it (`SQLITE_SCHEMA`), read in keyset pages inside one
//! read transaction (a consistent snapshot) and written in array-bound chunks inside one
//! PostgreSQL transaction, so that a failed copy leaves the target as it was. Named leases are
//! not copied: they are transient, and the next engine takes them afresh.

use std::path::Path;

use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sqlx::{Connection, Row};
use tranche_store::StoreError;

use crate::PgStore;

/// The SQLite schema this copier reads: the last of the SQLite store's migrations, whose
/// tables PostgreSQL's schema mirrors (indexes differ). SQLite's `attempts` also keeps where a
/// success's answer rests, which its ingest fills the request from; the request carries the
/// same, and that is what is copied. Its `requests.recount` (migration 27) holds nothing: it
/// only marks which statements SQLite's counter trigger follows, and is not copied. Its
/// `requests.input_hash` holds the hash's bytes (migration 28), PostgreSQL's its hex digits.
/// Its `jobs.first_request` and `last_request` (migration 29) only find a job's requests in
/// SQLite, and are not copied.
const SQLITE_SCHEMA: i64 = 30;

/// Rows read per page and written per statement (memory stays bounded by one page).
const PAGE: i64 = 1000;

/// Rows per page for tables holding whole bodies or answers.
const TEXT_PAGE: i64 = 100;

/// Why a copy did not happen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImportError {
    /// The target holds jobs, tranches or tenants already.
    #[error(
        "the PostgreSQL database already holds {jobs} job(s), {tranches} tranche(s) and {tenants} tenant(s); migrate only into an empty database"
    )]
    NotEmpty { jobs: i64, tranches: i64, tenants: i64 },
    /// The source's schema is not the one this version copies.
    #[error(
        "the SQLite store's schema is at migration {found}, this tranche copies migration {SQLITE_SCHEMA}; open it with this version of tranche first"
    )]
    Schema { found: i64 },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for ImportError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(StoreError::Database(e))
    }
}

/// What a copy moved: rows per table, in the order they were copied.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImportReport {
    pub tables: Vec<(&'static str, u64)>,
}

/// Copies one table in keyset pages: `select` binds the keys of the previous page's last row
/// (selected under the names `keys` gives: `k`, or `k1` and `k2`, or `kr` and `kt`) and the
/// page size; `insert` binds one array per column,
/// in the order given.
macro_rules! copy_table {
    ($src:expr, $tx:expr, $report:expr, $name:literal, page = $page:expr,
     select = $select:literal, insert = $insert:literal,
     keys = [$($key:ident: $kty:ty = $kinit:expr),+],
     columns = [$($col:ident: $cty:ty),+ $(,)?]) => {{
        $(let mut $key: $kty = $kinit;)+
        let mut copied = 0u64;
        loop {
            let rows = sqlx::query($select)
                $(.bind($key.clone()))+
                .bind($page)
                .fetch_all(&mut *$src)
                .await?;
            let Some(last) = rows.last() else { break };
            $($key = last.try_get::<$kty, _>(stringify!($key))?;)+
            $(
                let $col = rows
                    .iter()
                    .map(|row| row.try_get::<$cty, _>(stringify!($col)))
                    .collect::<Result<Vec<_>, _>>()?;
            )+
            sqlx::query($insert)$(.bind($col))+.execute(&mut *$tx).await?;
            copied += u64::try_from(rows.len()).unwrap_or(u64::MAX);
        }
        $report.tables.push(($name, copied));
    }};
}

impl PgStore {
    /// Copies the SQLite store in the file `sqlite_file` (its schema must be at
    /// `SQLITE_SCHEMA`, as the SQLite store's `open` leaves it) into this database, which must
    /// hold no job, no tranche and no tenant. All or nothing: one transaction. Rows keep their
    /// ids, request ids continue after the largest copied, and jobs keep their counters as they
    /// are (the counters' trigger follows updates only, so the copy's inserts do not count
    /// again).
    pub async fn import_sqlite(&self, sqlite_file: &Path) -> Result<ImportReport, ImportError> {
        let options = SqliteConnectOptions::new()
            .filename(sqlite_file)
            .read_only(true)
            .create_if_missing(false)
            .busy_timeout(std::time::Duration::from_secs(30));
        let mut conn = SqliteConnection::connect_with(&options).await.map_err(|source| {
            StoreError::Open { location: sqlite_file.display().to_string(), source }
        })?;
        // One read transaction: in WAL mode every page reads the same snapshot, whatever an
        // engine still writes meanwhile.
        let mut src = conn.begin().await?;
        let found: Option<i64> =
            sqlx::query_scalar("SELECT MAX(version) FROM _sqlx_migrations WHERE success")
                .fetch_one(&mut *src)
                .await?;
        let found = found.unwrap_or(0);
        if found != SQLITE_SCHEMA {
            return Err(ImportError::Schema { found });
        }

        let mut tx = self.begin_write().await?;
        // No engine writes the target's jobs or tranches while it is checked and filled, and a
        // second copy started at once waits, then finds it full.
        sqlx::query("LOCK TABLE jobs, tranches, tenants IN EXCLUSIVE MODE")
            .execute(&mut *tx)
            .await?;
        let row = sqlx::query(
            "SELECT (SELECT COUNT(*) FROM jobs) AS jobs, (SELECT COUNT(*) FROM tranches) AS tranches,
                    (SELECT COUNT(*) FROM tenants) AS tenants",
        )
        .fetch_one(&mut *tx)
        .await?;
        let (jobs, tranches, tenants): (i64, i64, i64) =
            (row.try_get("jobs")?, row.try_get("tranches")?, row.try_get("tenants")?);
        if jobs > 0 || tranches > 0 || tenants > 0 {
            return Err(ImportError::NotEmpty { jobs, tranches, tenants });
        }

        let mut report = ImportReport::default();
        // Parents before children, so that every foreign key finds its row.
        copy_table!(src, tx, report, "jobs", page = PAGE,
            select = "SELECT rowid AS k, id, provider, state, source, settings, accepted,
                             last_error, cancel_requested, created_at, updated_at, finished_at,
                             n_pending, n_queued, n_succeeded, n_failed, n_cancelled, n_cached,
                             n_retried, input_tokens, output_tokens, tenant, body_object,
                             pruned_at, bytes_pruned_at, awaits_review, review_verdict,
                             reviewed_by, reviewed_at, paused_error
                      FROM jobs WHERE rowid > ? ORDER BY rowid LIMIT ?",
            insert = "INSERT INTO jobs (id, provider, state, source, settings, accepted,
                             last_error, cancel_requested, created_at, updated_at, finished_at,
                             n_pending, n_queued, n_succeeded, n_failed, n_cancelled, n_cached,
                             n_retried, input_tokens, output_tokens, tenant, body_object,
                             pruned_at, bytes_pruned_at, awaits_review, review_verdict,
                             reviewed_by, reviewed_at, paused_error)
                      SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[],
                             $5::text[], $6::bigint[], $7::text[], $8::boolean[], $9::bigint[],
                             $10::bigint[], $11::bigint[], $12::bigint[], $13::bigint[],
                             $14::bigint[], $15::bigint[], $16::bigint[], $17::bigint[],
                             $18::bigint[], $19::bigint[], $20::bigint[], $21::text[],
                             $22::text[], $23::bigint[], $24::bigint[], $25::boolean[],
                             $26::text[], $27::text[], $28::bigint[], $29::text[])",
            keys = [k: i64 = i64::MIN],
            columns = [id: String, provider: String, state: String, source: Option<String>,
                settings: String, accepted: i64, last_error: Option<String>,
                cancel_requested: bool, created_at: i64, updated_at: i64,
                finished_at: Option<i64>, n_pending: i64, n_queued: i64, n_succeeded: i64,
                n_failed: i64, n_cancelled: i64, n_cached: i64, n_retried: i64,
                input_tokens: i64, output_tokens: i64, tenant: Option<String>,
                body_object: Option<String>, pruned_at: Option<i64>,
                bytes_pruned_at: Option<i64>, awaits_review: bool,
                review_verdict: Option<String>, reviewed_by: Option<String>,
                reviewed_at: Option<i64>, paused_error: Option<String>]
        );
        copy_table!(src, tx, report, "tranches", page = PAGE,
            select = "SELECT rowid AS k, id, provider, endpoint, model, state, request_count,
                             bytes, input_file_id, batch_id, batch_status, output_file_id,
                             error_file_id, results_url, batch_errors, last_error, not_before,
                             est_tokens, cancel_requested, created_at, updated_at, lease_owner,
                             lease_token, lease_expires_at, account, answer_check, tenant
                      FROM tranches WHERE rowid > ? ORDER BY rowid LIMIT ?",
            insert = "INSERT INTO tranches (id, provider, endpoint, model, state, request_count,
                             bytes, input_file_id, batch_id, batch_status, output_file_id,
                             error_file_id, results_url, batch_errors, last_error, not_before,
                             est_tokens, cancel_requested, created_at, updated_at, lease_owner,
                             lease_token, lease_expires_at, account, answer_check, tenant)
                      SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[],
                             $5::text[], $6::bigint[], $7::bigint[], $8::text[], $9::text[],
                             $10::text[], $11::text[], $12::text[], $13::text[], $14::text[],
                             $15::text[], $16::bigint[], $17::bigint[], $18::boolean[],
                             $19::bigint[], $20::bigint[], $21::text[], $22::text[],
                             $23::bigint[], $24::text[], $25::text[], $26::text[])",
            keys = [k: i64 = i64::MIN],
            columns = [id: String, provider: String, endpoint: String, model: String,
                state: String, request_count: i64, bytes: i64, input_file_id: Option<String>,
                batch_id: Option<String>, batch_status: Option<String>,
                output_file_id: Option<String>, error_file_id: Option<String>,
                results_url: Option<String>, batch_errors: Option<String>,
                last_error: Option<String>, not_before: i64, est_tokens: i64,
                cancel_requested: bool, created_at: i64, updated_at: i64,
                lease_owner: Option<String>, lease_token: Option<String>,
                lease_expires_at: i64, account: Option<String>, answer_check: Option<String>,
                tenant: Option<String>]
        );
        copy_table!(src, tx, report, "requests", page = PAGE,
            // SQLite names a request's tranche by its number, PostgreSQL by its id.
            select = "SELECT r.id AS k, r.id, r.job_id, r.line, r.custom_id, r.wire_id,
                             r.provider, r.endpoint, r.model, r.wire_bytes,
                             lower(hex(r.input_hash)) AS input_hash,
                             r.state, t.id AS tranche_id, r.attempts, r.max_attempts,
                             r.batch_returns, r.cached, r.est_tokens, r.accepted_at,
                             r.not_before, r.error, r.input_tokens, r.output_tokens,
                             r.finished_at, r.body_offset, r.body_length, r.output_object,
                             r.output_offset, r.output_length, r.answer_check, r.max_cost
                      FROM requests AS r LEFT JOIN tranches AS t ON t.seq = r.tranche_seq
                      WHERE r.id > ? ORDER BY r.id LIMIT ?",
            insert = "INSERT INTO requests (id, job_id, line, custom_id, wire_id, provider,
                             endpoint, model, wire_bytes, input_hash, state, tranche_id,
                             attempts, max_attempts, batch_returns, cached, est_tokens,
                             accepted_at, not_before, error, input_tokens, output_tokens,
                             finished_at, body_offset, body_length, output_object,
                             output_offset, output_length, answer_check, max_cost)
                      SELECT * FROM UNNEST($1::bigint[], $2::text[], $3::bigint[], $4::text[],
                             $5::text[], $6::text[], $7::text[], $8::text[], $9::bigint[],
                             $10::text[], $11::text[], $12::text[], $13::bigint[],
                             $14::bigint[], $15::bigint[], $16::boolean[], $17::bigint[],
                             $18::bigint[], $19::bigint[], $20::text[], $21::bigint[],
                             $22::bigint[], $23::bigint[], $24::bigint[], $25::bigint[],
                             $26::text[], $27::bigint[], $28::bigint[], $29::text[],
                             $30::bigint[])",
            keys = [k: i64 = i64::MIN],
            columns = [id: i64, job_id: String, line: i64, custom_id: String, wire_id: String,
                provider: String, endpoint: String, model: String, wire_bytes: i64,
                input_hash: String, state: String, tranche_id: Option<String>, attempts: i64,
                max_attempts: i64, batch_returns: i64, cached: bool, est_tokens: i64,
                accepted_at: i64, not_before: i64, error: Option<String>,
                input_tokens: Option<i64>, output_tokens: Option<i64>,
                finished_at: Option<i64>, body_offset: Option<i64>, body_length: Option<i64>,
                output_object: Option<String>, output_offset: Option<i64>,
                output_length: Option<i64>, answer_check: Option<String>,
                max_cost: Option<i64>]
        );
        copy_table!(src, tx, report, "request_bodies", page = TEXT_PAGE,
            select = "SELECT request_id AS k, request_id, body
                      FROM request_bodies WHERE request_id > ? ORDER BY request_id LIMIT ?",
            insert = "INSERT INTO request_bodies (request_id, body)
                      SELECT * FROM UNNEST($1::bigint[], $2::text[])",
            keys = [k: i64 = i64::MIN],
            columns = [request_id: i64, body: String]
        );
        // The identity column takes the copied ids as they are.
        copy_table!(src, tx, report, "request_outputs", page = TEXT_PAGE,
            select = "SELECT id AS k, id, request_id, output
                      FROM request_outputs WHERE id > ? ORDER BY id LIMIT ?",
            insert = "INSERT INTO request_outputs (id, request_id, output) OVERRIDING SYSTEM VALUE
                      SELECT * FROM UNNEST($1::bigint[], $2::bigint[], $3::text[])",
            keys = [k: i64 = i64::MIN],
            columns = [id: i64, request_id: i64, output: String]
        );
        copy_table!(src, tx, report, "attempts", page = PAGE,
            // Stored without a rowid: paged by its key.
            select = "SELECT a.request_id AS kr, a.tranche_seq AS kt, a.request_id, a.attempt,
                             t.id AS tranche_id, a.outcome, a.status_code, a.error,
                             a.created_at, a.model, a.input_tokens, a.cached_input_tokens,
                             a.cache_write_5m_tokens, a.cache_write_1h_tokens,
                             a.output_tokens, a.reasoning_tokens
                      FROM attempts AS a JOIN tranches AS t ON t.seq = a.tranche_seq
                      WHERE (a.request_id, a.tranche_seq) > (?, ?)
                      ORDER BY a.request_id, a.tranche_seq LIMIT ?",
            insert = "INSERT INTO attempts (request_id, attempt, tranche_id, outcome, status_code,
                             error, created_at, model, input_tokens, cached_input_tokens,
                             cache_write_5m_tokens, cache_write_1h_tokens, output_tokens,
                             reasoning_tokens)
                      SELECT * FROM UNNEST($1::bigint[], $2::bigint[], $3::text[], $4::text[],
                             $5::bigint[], $6::text[], $7::bigint[], $8::text[], $9::bigint[],
                             $10::bigint[], $11::bigint[], $12::bigint[], $13::bigint[],
                             $14::bigint[])",
            keys = [kr: i64 = i64::MIN, kt: i64 = i64::MIN],
            columns = [request_id: i64, attempt: i64, tranche_id: String, outcome: String,
                status_code: Option<i64>, error: Option<String>, created_at: i64,
                model: Option<String>, input_tokens: Option<i64>,
                cached_input_tokens: Option<i64>, cache_write_5m_tokens: Option<i64>,
                cache_write_1h_tokens: Option<i64>, output_tokens: Option<i64>,
                reasoning_tokens: Option<i64>]
        );
        copy_table!(src, tx, report, "usage_totals", page = PAGE,
            select = "SELECT rowid AS k, job_id, kind, provider, model, day, requests,
                             input_tokens, cached_input_tokens, cache_write_5m_tokens,
                             cache_write_1h_tokens, output_tokens, reasoning_tokens
                      FROM usage_totals WHERE rowid > ? ORDER BY rowid LIMIT ?",
            insert = "INSERT INTO usage_totals (job_id, kind, provider, model, day, requests,
                             input_tokens, cached_input_tokens, cache_write_5m_tokens,
                             cache_write_1h_tokens, output_tokens, reasoning_tokens)
                      SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[],
                             $5::bigint[], $6::bigint[], $7::bigint[], $8::bigint[],
                             $9::bigint[], $10::bigint[], $11::bigint[], $12::bigint[])",
            keys = [k: i64 = i64::MIN],
            columns = [job_id: String, kind: String, provider: String, model: String, day: i64,
                requests: i64, input_tokens: i64, cached_input_tokens: i64,
                cache_write_5m_tokens: i64, cache_write_1h_tokens: i64, output_tokens: i64,
                reasoning_tokens: i64]
        );
        copy_table!(src, tx, report, "provider_files", page = PAGE,
            select = "SELECT rowid AS k, provider, file_id, purpose, tranche_id, filename, bytes,
                             expires_at, created_at, deleted_at
                      FROM provider_files WHERE rowid > ? ORDER BY rowid LIMIT ?",
            insert = "INSERT INTO provider_files (provider, file_id, purpose, tranche_id, filename,
                             bytes, expires_at, created_at, deleted_at)
                      SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[],
                             $5::text[], $6::bigint[], $7::bigint[], $8::bigint[], $9::bigint[])",
            keys = [k: i64 = i64::MIN],
            columns = [provider: String, file_id: String, purpose: String, tranche_id: String,
                filename: Option<String>, bytes: Option<i64>, expires_at: Option<i64>,
                created_at: i64, deleted_at: Option<i64>]
        );
        // A table without rowid: pages by its primary key.
        copy_table!(src, tx, report, "job_tranches", page = PAGE,
            select = "SELECT job_id AS k1, tranche_id AS k2, job_id, tranche_id
                      FROM job_tranches WHERE (job_id, tranche_id) > (?, ?)
                      ORDER BY job_id, tranche_id LIMIT ?",
            insert = "INSERT INTO job_tranches (job_id, tranche_id)
                      SELECT * FROM UNNEST($1::text[], $2::text[])",
            keys = [k1: String = String::new(), k2: String = String::new()],
            columns = [job_id: String, tranche_id: String]
        );
        // The facts of the deployment (the blob store the bytes rest in) come with its rows:
        // the source's win over any an engine recorded on the empty target.
        copy_table!(src, tx, report, "deployment", page = PAGE,
            select = "SELECT key AS k, key, value FROM deployment WHERE key > ? ORDER BY key LIMIT ?",
            insert = "INSERT INTO deployment (key, value)
                      SELECT * FROM UNNEST($1::text[], $2::text[])
                      ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
            keys = [k: String = String::new()],
            columns = [key: String, value: String]
        );
        // The blob store's objects stay where they are; their records name them.
        copy_table!(src, tx, report, "blob_objects", page = PAGE,
            select = "SELECT key AS k, key, size, sha256, created_at
                      FROM blob_objects WHERE key > ? ORDER BY key LIMIT ?",
            insert = "INSERT INTO blob_objects (key, size, sha256, created_at)
                      SELECT * FROM UNNEST($1::text[], $2::bigint[], $3::text[], $4::bigint[])
                      ON CONFLICT (key) DO NOTHING",
            keys = [k: String = String::new()],
            columns = [key: String, size: i64, sha256: String, created_at: i64]
        );
        copy_table!(src, tx, report, "answer_checks", page = TEXT_PAGE,
            select = "SELECT rowid AS k, id, schema, lenient_json, created_at
                      FROM answer_checks WHERE rowid > ? ORDER BY rowid LIMIT ?",
            insert = "INSERT INTO answer_checks (id, schema, lenient_json, created_at)
                      SELECT * FROM UNNEST($1::text[], $2::text[], $3::boolean[], $4::bigint[])
                      ON CONFLICT (id) DO NOTHING",
            keys = [k: i64 = i64::MIN],
            columns = [id: String, schema: String, lenient_json: bool, created_at: i64]
        );
        copy_table!(src, tx, report, "file_audits", page = PAGE,
            select = "SELECT rowid AS k, account, at, total, inputs_with_expiry,
                             inputs_without_expiry
                      FROM file_audits WHERE rowid > ? ORDER BY rowid LIMIT ?",
            insert = "INSERT INTO file_audits (account, at, total, inputs_with_expiry,
                             inputs_without_expiry)
                      SELECT * FROM UNNEST($1::text[], $2::bigint[], $3::bigint[], $4::bigint[],
                             $5::bigint[])",
            keys = [k: i64 = i64::MIN],
            columns = [account: String, at: i64, total: i64, inputs_with_expiry: i64,
                inputs_without_expiry: i64]
        );

        // Tenants with the hashes of their tokens (revoked ones too: who had access, and until
        // when); their tokens keep working against the new database.
        copy_table!(src, tx, report, "tenants", page = PAGE,
            select = "SELECT rowid AS k, token_hash, name, admin, created_at, revoked_at
                      FROM tenants WHERE rowid > ? ORDER BY rowid LIMIT ?",
            insert = "INSERT INTO tenants (token_hash, name, admin, created_at, revoked_at)
                      SELECT * FROM UNNEST($1::text[], $2::text[], $3::boolean[], $4::bigint[],
                             $5::bigint[])",
            keys = [k: i64 = i64::MIN],
            columns = [token_hash: String, name: String, admin: bool, created_at: i64,
                revoked_at: Option<i64>]
        );

        copy_table!(src, tx, report, "idempotency_keys", page = PAGE,
            select = "SELECT rowid AS k, tenant, key, body_sha256, job_id, created_at
                      FROM idempotency_keys WHERE rowid > ? ORDER BY rowid LIMIT ?",
            insert = "INSERT INTO idempotency_keys (tenant, key, body_sha256, job_id, created_at)
                      SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[],
                             $5::bigint[])",
            keys = [k: i64 = i64::MIN],
            columns = [tenant: String, key: String, body_sha256: Option<String>,
                job_id: Option<String>, created_at: i64]
        );

        // The schema's two sequences continue after the copied ids: request ids (taken by the
        // job writer) and the identity of `request_outputs`.
        sqlx::query(
            "SELECT setval('request_ids', (SELECT COALESCE(MAX(id), 0) + 1 FROM requests), false)",
        )
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "SELECT setval(pg_get_serial_sequence('request_outputs', 'id'),
                           (SELECT COALESCE(MAX(id), 0) + 1 FROM request_outputs), false)",
        )
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        src.rollback().await?;
        conn.close().await?;
        Ok(report)
    }
}
