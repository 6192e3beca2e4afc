//! tranche's SQLite store: one file in WAL mode, migrations embedded in the binary. Write
//! transactions take the write lock up front, and a busy database is waited for; leases are
//! judged by SQLite's clock. Implements every `tranche_store` trait.
//!
//! A statement that changes a request's state, `cached`, attempts or tokens sets
//! `recount = 0`: that is what makes the counter trigger keep its job's counters (migration
//! 27). Only the claim and the apply of a tranche's successes leave it out, as they count
//! their rows themselves.

use std::borrow::Cow;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{SqlSafeStr, Sqlite, Transaction};
use tranche_core::JobId;
use tranche_store::{DeploymentStore, Store, StoreError, StoreResult};

/// The database's clock in unix milliseconds, as an SQL expression. A macro so that statements
/// stay string literals (`concat!`), never built at run time. Leases are judged by it.
macro_rules! db_now_ms {
    () => {
        "CAST(unixepoch('subsec') * 1000 AS INTEGER)"
    };
}

/// The jobs with a request waiting or in a batch, as a `WHERE` condition over `jobs`: word for
/// word the condition of the partial index `jobs_in_flight` (migration `0030`), which SQLite
/// reads only for a statement that states it. A macro so that statements stay string literals
/// (`concat!`).
macro_rules! jobs_in_flight {
    () => {
        "(n_pending > 0 OR n_queued > 0)"
    };
}

/// The rows a page holds ([`pages::PAGE_ROWS`]) as a literal, for a page's `LIMIT`. A bound
/// `LIMIT` makes SQLite (3.51) prepare the statement again at every execution: the planner may
/// plan by the value, so binding it expires the statement. Written into the text, the page's
/// statement is prepared once (a 100,000-request run prepared its input and results pages 198
/// times). A macro so that statements stay string literals (`concat!`).
macro_rules! page_rows {
    () => {
        "1024"
    };
}

/// The requests of the job bound as `?1`, as a `WHERE` condition: the job's id range
/// (`jobs.first_request` to `last_request`, migration `0029`; its writer numbers them in one
/// run), read in rowid order, with the job checked on each row (`+` keeps SQLite from looking
/// for an index on it). With an alias, the condition names the table by it. A macro so that
/// statements stay string literals (`concat!`).
macro_rules! job_rows {
    () => {
        "id BETWEEN (SELECT first_request FROM jobs WHERE id = ?1)
             AND (SELECT last_request FROM jobs WHERE id = ?1) AND +job_id = ?1"
    };
    ($alias:literal) => {
        concat!(
            $alias,
            ".id BETWEEN (SELECT first_request FROM jobs WHERE id = ?1)
             AND (SELECT last_request FROM jobs WHERE id = ?1) AND +",
            $alias,
            ".job_id = ?1"
        )
    };
}

/// What a `usage_totals` upsert adds to the row it meets: every count of the row proposed.
/// A macro so that the statements stay string literals (`concat!`).
macro_rules! usage_add {
    () => {
        "requests = requests + excluded.requests,
         input_tokens = input_tokens + excluded.input_tokens,
         cached_input_tokens = cached_input_tokens + excluded.cached_input_tokens,
         cache_write_5m_tokens = cache_write_5m_tokens + excluded.cache_write_5m_tokens,
         cache_write_1h_tokens = cache_write_1h_tokens + excluded.cache_write_1h_tokens,
         output_tokens = output_tokens + excluded.output_tokens,
         reasoning_tokens = reasoning_tokens + excluded.reasoning_tokens"
    };
}

mod answers;
mod blobs;
mod files;
mod groups;
mod idempotency;
mod ingest;
mod jobs;
mod keys_off;
mod leases;
mod metrics;
mod pages;
mod plan;
mod prune;
mod queries;
#[cfg(test)]
mod query_plans;
mod tenants;
mod tranches;
mod usage;
mod values;
mod writer;

fn migrator() -> Migrator {
    let migration = |version, name, sql: &'static str| {
        // A migration that opens `-- no-transaction` runs its own (SQLite can only turn
        // foreign keys off outside one).
        let no_tx = sql.starts_with("-- no-transaction");
        Migration::new(
            version,
            Cow::Borrowed(name),
            MigrationType::Simple,
            sql.into_sql_str(),
            no_tx,
        )
    };
    Migrator::with_migrations(vec![
        migration(1, "init", include_str!("../migrations/sqlite/0001_init.sql")),
        migration(2, "lean requests", include_str!("../migrations/sqlite/0002_lean_requests.sql")),
        migration(3, "leases", include_str!("../migrations/sqlite/0003_leases.sql")),
        migration(4, "job counters", include_str!("../migrations/sqlite/0004_job_counters.sql")),
        migration(
            5,
            "tenants and accounts",
            include_str!("../migrations/sqlite/0005_tenants_and_accounts.sql"),
        ),
        migration(6, "deployment", include_str!("../migrations/sqlite/0006_deployment.sql")),
        migration(
            7,
            "bodies by reference",
            include_str!("../migrations/sqlite/0007_bodies_by_reference.sql"),
        ),
        migration(
            8,
            "outputs by reference",
            include_str!("../migrations/sqlite/0008_outputs_by_reference.sql"),
        ),
        migration(9, "prune", include_str!("../migrations/sqlite/0009_prune.sql")),
        migration(10, "blob objects", include_str!("../migrations/sqlite/0010_blob_objects.sql")),
        migration(11, "review", include_str!("../migrations/sqlite/0011_review.sql")),
        migration(12, "answer checks", include_str!("../migrations/sqlite/0012_answer_checks.sql")),
        migration(13, "paused jobs", include_str!("../migrations/sqlite/0013_paused_jobs.sql")),
        migration(14, "file audits", include_str!("../migrations/sqlite/0014_file_audits.sql")),
        migration(15, "usage ledger", include_str!("../migrations/sqlite/0015_usage_ledger.sql")),
        migration(16, "tenants", include_str!("../migrations/sqlite/0016_tenants.sql")),
        migration(
            17,
            "idempotency keys",
            include_str!("../migrations/sqlite/0017_idempotency_keys.sql"),
        ),
        migration(
            18,
            "tranche tenants",
            include_str!("../migrations/sqlite/0018_tranche_tenants.sql"),
        ),
        migration(19, "bulk counters", include_str!("../migrations/sqlite/0019_bulk_counters.sql")),
        migration(
            20,
            "partial tranche index",
            include_str!("../migrations/sqlite/0020_partial_tranche_index.sql"),
        ),
        migration(
            21,
            "no job state index",
            include_str!("../migrations/sqlite/0021_no_job_state_index.sql"),
        ),
        migration(
            22,
            "attempts without rowid",
            include_str!("../migrations/sqlite/0022_attempts_without_rowid.sql"),
        ),
        migration(
            23,
            "tranche numbers",
            include_str!("../migrations/sqlite/0023_tranche_numbers.sql"),
        ),
        migration(24, "custom id key", include_str!("../migrations/sqlite/0024_custom_id_key.sql")),
        migration(
            25,
            "attempt outputs",
            include_str!("../migrations/sqlite/0025_attempt_outputs.sql"),
        ),
        migration(
            26,
            "cheap row checks",
            include_str!("../migrations/sqlite/0026_cheap_row_checks.sql"),
        ),
        migration(
            27,
            "counted updates",
            include_str!("../migrations/sqlite/0027_counted_updates.sql"),
        ),
        migration(
            28,
            "input hash bytes",
            include_str!("../migrations/sqlite/0028_input_hash_bytes.sql"),
        ),
        migration(29, "job id ranges", include_str!("../migrations/sqlite/0029_job_id_ranges.sql")),
        migration(
            30,
            "jobs in flight",
            include_str!("../migrations/sqlite/0030_jobs_in_flight.sql"),
        ),
    ])
}

/// Whether any request of `job` waits in the pool, read from its counters (which follow every
/// committed change): a statement over the job's waiting requests reads all of its requests,
/// since no index has their state by job.
pub(crate) async fn has_pending(
    tx: &mut Transaction<'static, Sqlite>,
    job: JobId,
) -> StoreResult<bool> {
    let pending: Option<i64> = sqlx::query_scalar("SELECT n_pending FROM jobs WHERE id = ?")
        .bind(job.to_string())
        .fetch_optional(&mut **tx)
        .await?;
    Ok(pending.unwrap_or(0) > 0)
}

/// Connections to a database file. Two against four: peak RSS of `tranche run` at 1,000,000
/// requests 58 MB against 74 MB, and no more CPU (less, within the noise, at 100,000).
const CONNECTIONS: u32 = 2;

/// The size in bytes of a new database's pages.
const PAGE_SIZE: u32 = 16384;

/// Rows per multi-row `INSERT` at submit: 16 bound values a row, far below SQLite's limit of
/// 32,766 per statement, and large enough that a statement's fixed cost is paid rarely.
const INSERT_ROWS: usize = 256;

/// Result lines recorded per statement at ingest.
const INGEST_ROWS: usize = 512;

/// The SQLite store. Cheap to clone; clones share one connection pool.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    /// Whether the database lives in its one connection (`sqlite::memory:`).
    in_memory: bool,
}

/// A list as one JSON array, bound as a single parameter and read back with `json_each`
/// (however many items there are, and no SQL built from them).
fn json_list<T: serde::Serialize + ?Sized>(what: &str, items: &T) -> StoreResult<String> {
    serde_json::to_string(items).map_err(|e| StoreError::Corrupt(format!("{what}: {e}")))
}

impl SqliteStore {
    /// Opens (creating if missing) the database at a `sqlite:` URL or a plain file path, and
    /// brings its schema up to date.
    pub async fn open(location: &str) -> StoreResult<Self> {
        let path = location
            .strip_prefix("sqlite://")
            .or_else(|| location.strip_prefix("sqlite:"))
            .unwrap_or(location);
        let in_memory = path == ":memory:" || path.is_empty();
        if let Some(parent) =
            Path::new(path).parent().filter(|p| !in_memory && !p.as_os_str().is_empty())
        {
            std::fs::create_dir_all(parent).map_err(|source| StoreError::CreateDir {
                location: location.to_owned(),
                source,
            })?;
        }
        let options = if in_memory {
            SqliteConnectOptions::from_str("sqlite::memory:")
        } else {
            Ok(SqliteConnectOptions::new().filename(path))
        }
        .map_err(|source| StoreError::Open { location: location.to_owned(), source })?
        .create_if_missing(true)
        // Pages of 16 KiB in a new database (one made before keeps its 4 KiB: a WAL database's
        // page size is fixed). The bulk statements over a job's requests visit a quarter of the
        // pages: 100,000 requests inserted in 20% less CPU, claimed and updated with their
        // results in 20% less. The caches below are sized in bytes, so they hold as much.
        .page_size(PAGE_SIZE)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .foreign_keys(true)
        .busy_timeout(Duration::from_secs(30))
        // The bundled SQLite keeps temporary files (statement journals, temporary tables,
        // sorts) in memory by default; a statement over a whole tranche would then hold
        // megabytes. On disk they are bounded by the page cache like everything else.
        .pragma("temp_store", "file")
        // After a checkpoint, a log larger than this is cut back, so that a big job's log does
        // not stay on disk (and make every later open read it) for the life of the database.
        .pragma("journal_size_limit", "67108864")
        // A checkpoint when the log holds 4,096 pages (in a new database 64 MiB, the size it
        // is cut back to anyway) instead of SQLite's 1,000: a page rewritten by many commits
        // is copied into the database, and synced, once per checkpoint. A 100,000-request
        // run wrote the database 5,299 times against 7,054, and spent 3-6% less CPU (14
        // alternating pairs in two sittings).
        .pragma("wal_autocheckpoint", "4096")
        // Page caches of a fixed size, whatever the job's: 1 MiB of the database's pages and
        // 512 KiB of temporary tables' a connection (SQLite's default is 2 MiB of each). The
        // pages left out are a read from the OS's cache away. Peak RSS of `tranche run` at
        // 1,000,000 requests: 40.5 MB against 46.8 with the defaults; at 100,000, 35.2 against
        // 42.3; at 10,000, 34.8 against 35.9. CPU the same within the noise.
        .pragma("cache_size", "-1024")
        .pragma("temp.cache_size", "-512")
        // Rows cross from SQLite's worker thread to the caller through a channel of this many;
        // a deep one lets either side run on for a page of rows instead of waking the other
        // for every few (sqlx's default is 50).
        .row_buffer_size(512);
        let pool = SqlitePoolOptions::new()
            // An in-memory database lives in one connection. A file needs few: SQLite lets
            // one connection write at a time, so more connections add only readers, and each
            // brings its own caches (1 MiB of pages, 512 KiB of temporary tables), statements
            // and buffers.
            .max_connections(if in_memory { 1 } else { CONNECTIONS })
            .connect_with(options)
            .await
            .map_err(|source| StoreError::Open { location: location.to_owned(), source })?;
        // Engines started together on a database that needs migrating race to apply the same
        // migration (sqlx's SQLite migrator takes no lock): the loser finds it applied when it
        // tries again.
        let mut tries = 0u64;
        loop {
            match migrator().run(&pool).await {
                Ok(()) => break,
                Err(e) if tries >= 10 => return Err(StoreError::Migrate(Box::new(e))),
                Err(_) => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(100 * tries)).await;
                }
            }
        }
        Ok(Self { pool, in_memory })
    }

    /// Starts a transaction that writes. `BEGIN IMMEDIATE` takes the write lock at once (waiting
    /// out the busy timeout), so that it never fails half-way when another engine wrote since
    /// it first read, as a deferred transaction would.
    async fn begin_write(&self) -> StoreResult<Transaction<'static, Sqlite>> {
        Ok(self.pool.begin_with("BEGIN IMMEDIATE").await?)
    }
}

#[async_trait::async_trait]
impl DeploymentStore for SqliteStore {
    async fn deployment_fact(&self, key: &str, proposed: &str) -> StoreResult<String> {
        sqlx::query(
            "INSERT INTO deployment (key, value) VALUES (?, ?) ON CONFLICT (key) DO NOTHING",
        )
        .bind(key)
        .bind(proposed)
        .execute(&self.pool)
        .await?;
        let row = sqlx::query("SELECT value FROM deployment WHERE key = ?")
            .bind(key)
            .fetch_one(&self.pool)
            .await?;
        Ok(sqlx::Row::try_get(&row, 0)?)
    }
}

#[async_trait::async_trait]
impl Store for SqliteStore {
    async fn close(&self) {
        self.pool.close().await;
    }
}

#[cfg(test)]
mod tests {
    use sqlx::Row;

    use super::*;

    /// A database in `dir` with the first `migrations` applied, foreign keys on.
    async fn migrated_to(dir: &tempfile::TempDir, migrations: usize) -> SqlitePool {
        let options = SqliteConnectOptions::new()
            .filename(dir.path().join("old.db"))
            .create_if_missing(true)
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new().max_connections(1).connect_with(options).await.unwrap();
        let mut older = migrator();
        older.migrations.to_mut().truncate(migrations);
        older.run(&pool).await.unwrap();
        pool
    }

    /// A new database has pages of [`PAGE_SIZE`]; one made with SQLite's default keeps its
    /// pages of 4 KiB and opens as before.
    #[tokio::test]
    async fn new_databases_have_large_pages_and_older_ones_keep_theirs() {
        let dir = tempfile::tempdir().unwrap();
        let fresh = dir.path().join("new.db");
        let store = SqliteStore::open(&fresh.to_string_lossy()).await.unwrap();
        let size: i64 =
            sqlx::query_scalar("PRAGMA page_size").fetch_one(&store.pool).await.unwrap();
        assert_eq!(size, i64::from(PAGE_SIZE));
        let older = migrated_to(&dir, 1).await;
        older.close().await;
        let store = SqliteStore::open(&dir.path().join("old.db").to_string_lossy()).await.unwrap();
        let size: i64 =
            sqlx::query_scalar("PRAGMA page_size").fetch_one(&store.pool).await.unwrap();
        assert_eq!(size, 4096);
        let jobs: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM jobs").fetch_one(&store.pool).await.unwrap();
        assert_eq!(jobs, 0, "migrated and readable");
    }

    /// Every connection's page caches are of the fixed size that keeps memory flat as a job
    /// grows, for the database and for temporary tables alike; and every connection lets the
    /// log grow to the size it is cut back to before it checkpoints.
    #[tokio::test]
    async fn every_connection_caches_a_fixed_number_of_pages_and_checkpoints_a_full_log() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("t.db").to_string_lossy()).await.unwrap();
        // Each connection is held while the next is asked for, so that every one is checked.
        let mut held = Vec::new();
        for _ in 0..CONNECTIONS {
            let mut conn = store.pool.acquire().await.unwrap();
            let main: i64 =
                sqlx::query_scalar("PRAGMA cache_size").fetch_one(&mut *conn).await.unwrap();
            let temp: i64 =
                sqlx::query_scalar("PRAGMA temp.cache_size").fetch_one(&mut *conn).await.unwrap();
            assert_eq!((main, temp), (-1024, -512), "KiB, as SQLite gives a negative size");
            let log_pages: i64 = sqlx::query_scalar("PRAGMA wal_autocheckpoint")
                .fetch_one(&mut *conn)
                .await
                .unwrap();
            let log_limit: i64 = sqlx::query_scalar("PRAGMA journal_size_limit")
                .fetch_one(&mut *conn)
                .await
                .unwrap();
            assert_eq!(log_pages * i64::from(PAGE_SIZE), log_limit, "the log's pages, its bytes");
            held.push(conn);
        }
    }

    /// A database made by the first schema, with a finished request and a waiting one, keeps
    /// their bodies, output and tranche links through the second migration.
    #[tokio::test]
    async fn the_lean_requests_migration_keeps_bodies_outputs_and_links() {
        let dir = tempfile::tempdir().unwrap();
        let pool = migrated_to(&dir, 1).await;
        for sql in [
            "INSERT INTO jobs (id, provider, state, settings, accepted, created_at, updated_at)
             VALUES ('job_1', 'openai', 'running', '{}', 2, 1, 1)",
            "INSERT INTO tranches (id, provider, endpoint, model, state, request_count, bytes,
                                   created_at, updated_at)
             VALUES ('tr_1', 'openai', '/v1/chat/completions', 'm', 'done', 1, 10, 1, 1)",
            "INSERT INTO requests (id, job_id, line, custom_id, wire_id, provider, endpoint, model,
                                   body, wire_bytes, input_hash, state, tranche_id, max_attempts,
                                   est_tokens, accepted_at, output)
             VALUES (1, 'job_1', 1, 'a', 'a', 'openai', '/v1/chat/completions', 'm', '{\"x\":1}',
                     10, 'h', 'succeeded', 'tr_1', 3, 1, 1, '{\"ok\":1}'),
                    (2, 'job_1', 2, 'b', 'b', 'openai', '/v1/chat/completions', 'm', '{\"x\":2}',
                     10, 'h', 'pending', NULL, 3, 1, 1, NULL)",
        ] {
            sqlx::query(sql).execute(&pool).await.unwrap();
        }
        migrator().run(&pool).await.unwrap();
        let row = sqlx::query(
            "SELECT (SELECT group_concat(body, ';') FROM request_bodies),
                    (SELECT group_concat(request_id || '=' || output, ';') FROM request_outputs),
                    (SELECT group_concat(job_id || '>' || tranche_id, ';') FROM job_tranches)",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        let got: (String, String, String) =
            (row.try_get(0).unwrap(), row.try_get(1).unwrap(), row.try_get(2).unwrap());
        assert_eq!(got.0, r#"{"x":1};{"x":2}"#);
        assert_eq!(got.1, r#"1={"ok":1}"#);
        assert_eq!(got.2, "job_1>tr_1");
    }

    /// A database at migration 22 keeps every request's and attempt's tranche, bodies, outputs
    /// and counters through the move to tranche numbers, with every foreign key whole.
    #[tokio::test]
    async fn tranche_numbers_keep_every_link() {
        let dir = tempfile::tempdir().unwrap();
        let pool = migrated_to(&dir, 22).await;
        for sql in [
            "INSERT INTO jobs (id, provider, state, settings, accepted, created_at, updated_at,
                               n_pending, n_queued, n_succeeded)
             VALUES ('job_1', 'openai', 'running', '{}', 3, 1, 1, 1, 1, 1)",
            "INSERT INTO tranches (id, provider, endpoint, model, state, request_count, bytes,
                                   created_at, updated_at)
             VALUES ('tr_a', 'openai', '/v1/chat/completions', 'm', 'done', 1, 10, 1, 1),
                    ('tr_b', 'openai', '/v1/chat/completions', 'm', 'submitted', 1, 10, 2, 2)",
            "INSERT INTO requests (id, job_id, line, custom_id, wire_id, provider, endpoint, model,
                                   wire_bytes, input_hash, state, tranche_id, attempts,
                                   max_attempts, est_tokens, accepted_at, output_object,
                                   output_offset, output_length)
             VALUES (1, 'job_1', 1, 'a', 'a', 'openai', '/v1/chat/completions', 'm', 10, 'h',
                     'succeeded', 'tr_a', 1, 3, 1, 1, 'raw/x', 0, 5),
                    (2, 'job_1', 2, 'b', 'b', 'openai', '/v1/chat/completions', 'm', 10, 'h',
                     'queued', 'tr_b', 1, 3, 1, 1, NULL, NULL, NULL),
                    (3, 'job_1', 3, 'c', 'c', 'openai', '/v1/chat/completions', 'm', 10, 'h',
                     'pending', NULL, 0, 3, 1, 1, NULL, NULL, NULL)",
            "INSERT INTO attempts (request_id, attempt, tranche_id, outcome, created_at)
             VALUES (1, 1, 'tr_a', 'succeeded', 5), (2, 1, 'tr_a', 'expired', 5)",
            "INSERT INTO request_bodies (request_id, body) VALUES (3, '{\"x\":3}')",
            "INSERT INTO request_outputs (request_id, output) VALUES (1, '{\"ok\":1}')",
        ] {
            sqlx::query(sql).execute(&pool).await.unwrap();
        }
        migrator().run(&pool).await.unwrap();
        let links: Vec<(i64, Option<String>)> = sqlx::query_as(
            "SELECT r.id, t.id FROM requests AS r LEFT JOIN tranches AS t ON t.seq = r.tranche_seq
             ORDER BY r.id",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        assert_eq!(links, [(1, Some("tr_a".into())), (2, Some("tr_b".into())), (3, None)]);
        let attempts: Vec<(i64, String, String)> = sqlx::query_as(
            "SELECT a.request_id, t.id, a.outcome
             FROM attempts AS a JOIN tranches AS t ON t.seq = a.tranche_seq ORDER BY 1",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        assert_eq!(
            attempts,
            [(1, "tr_a".into(), "succeeded".into()), (2, "tr_a".into(), "expired".into())]
        );
        let kept: (String, String) = sqlx::query_as(
            "SELECT (SELECT body FROM request_bodies WHERE request_id = 3),
                    (SELECT output FROM request_outputs WHERE request_id = 1)",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(kept, (r#"{"x":3}"#.into(), r#"{"ok":1}"#.into()));
        let broken: Vec<sqlx::sqlite::SqliteRow> =
            sqlx::query("PRAGMA foreign_key_check").fetch_all(&pool).await.unwrap();
        assert!(broken.is_empty(), "{} rows point nowhere", broken.len());
        // The counter trigger came back with the table (it counts a statement that sets
        // `recount`, migration 27), and a new request can name a tranche.
        sqlx::query(
            "UPDATE requests SET recount = 0, state = 'queued', tranche_seq = 2 WHERE id = 3",
        )
        .execute(&pool)
        .await
        .unwrap();
        let counts: (i64, i64) =
            sqlx::query_as("SELECT n_pending, n_queued FROM jobs").fetch_one(&pool).await.unwrap();
        assert_eq!(counts, (0, 2));
        let stray =
            sqlx::query("UPDATE requests SET tranche_seq = 99 WHERE id = 3").execute(&pool).await;
        assert!(stray.is_err(), "a request names a tranche that is not there");
    }

    /// A database at migration 23 keeps every request, attempt, body and output, with every
    /// foreign key whole, through the move of the unique key to `(custom_id, job_id)`; a custom
    /// id stays unique within its job only, and the counters still follow the requests.
    #[tokio::test]
    async fn the_custom_id_key_keeps_every_row_and_stays_unique_within_a_job() {
        let dir = tempfile::tempdir().unwrap();
        let pool = migrated_to(&dir, 23).await;
        for sql in [
            "INSERT INTO jobs (id, provider, state, settings, accepted, created_at, updated_at,
                               n_pending, n_queued)
             VALUES ('job_1', 'openai', 'running', '{}', 2, 1, 1, 1, 1),
                    ('job_2', 'openai', 'running', '{}', 1, 1, 1, 1, 0)",
            "INSERT INTO tranches (id, seq, provider, endpoint, model, state, request_count, bytes,
                                   created_at, updated_at)
             VALUES ('tr_a', 1, 'openai', '/v1/chat/completions', 'm', 'submitted', 1, 10, 1, 1)",
            "INSERT INTO requests (id, job_id, line, custom_id, wire_id, provider, endpoint, model,
                                   wire_bytes, input_hash, state, tranche_seq, attempts,
                                   max_attempts, est_tokens, accepted_at)
             VALUES (1, 'job_1', 1, 'a', 'a', 'openai', '/v1/chat/completions', 'm', 10, 'h',
                     'queued', 1, 1, 3, 1, 1),
                    (2, 'job_1', 2, 'b', 'b', 'openai', '/v1/chat/completions', 'm', 10, 'h',
                     'pending', NULL, 0, 3, 1, 1),
                    (3, 'job_2', 1, 'a', 'a', 'openai', '/v1/chat/completions', 'm', 10, 'h',
                     'pending', NULL, 0, 3, 1, 1)",
            "INSERT INTO attempts (request_id, attempt, tranche_seq, outcome, created_at)
             VALUES (1, 1, 1, 'expired', 5)",
            "INSERT INTO request_bodies (request_id, body) VALUES (2, '{\"x\":2}')",
            "INSERT INTO request_outputs (request_id, output) VALUES (1, '{\"ok\":1}')",
        ] {
            sqlx::query(sql).execute(&pool).await.unwrap();
        }
        migrator().run(&pool).await.unwrap();
        let rows: Vec<(i64, String, String, Option<i64>)> =
            sqlx::query_as("SELECT id, job_id, custom_id, tranche_seq FROM requests ORDER BY id")
                .fetch_all(&pool)
                .await
                .unwrap();
        assert_eq!(
            rows,
            [
                (1, "job_1".into(), "a".into(), Some(1)),
                (2, "job_1".into(), "b".into(), None),
                (3, "job_2".into(), "a".into(), None)
            ]
        );
        let kept: (i64, String, String) = sqlx::query_as(
            "SELECT (SELECT COUNT(*) FROM attempts WHERE request_id = 1 AND tranche_seq = 1),
                    (SELECT body FROM request_bodies WHERE request_id = 2),
                    (SELECT output FROM request_outputs WHERE request_id = 1)",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(kept, (1, r#"{"x":2}"#.into(), r#"{"ok":1}"#.into()));
        // Migration 25 gives attempts a place for their answer; an older one has none.
        let answer: (Option<String>, Option<i64>) = sqlx::query_as(
            "SELECT output_object, output_length FROM attempts WHERE request_id = 1",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(answer, (None, None));
        let broken: Vec<sqlx::sqlite::SqliteRow> =
            sqlx::query("PRAGMA foreign_key_check").fetch_all(&pool).await.unwrap();
        assert!(broken.is_empty(), "{} rows point nowhere", broken.len());
        let insert = |id: i64, job: &'static str| {
            sqlx::query(
                "INSERT INTO requests (id, job_id, line, custom_id, wire_id, provider, endpoint,
                                       model, wire_bytes, input_hash, state, max_attempts,
                                       est_tokens, accepted_at)
                 VALUES (?, ?, 9, 'b', 'b', 'openai', '/v1/chat/completions', 'm', 10, X'68',
                         'pending', 3, 1, 1)",
            )
            .bind(id)
            .bind(job)
            .execute(&pool)
        };
        let duplicate = insert(4, "job_1").await.unwrap_err();
        assert!(
            duplicate.as_database_error().is_some_and(|e| e.is_unique_violation()),
            "{duplicate}"
        );
        insert(4, "job_2").await.expect("one custom id in two jobs");
        sqlx::query("UPDATE requests SET recount = 0, state = 'succeeded' WHERE id = 1")
            .execute(&pool)
            .await
            .unwrap();
        let counts: (i64, i64) =
            sqlx::query_as("SELECT n_queued, n_succeeded FROM jobs WHERE id = 'job_1'")
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(counts, (0, 1));
    }

    /// A database at migration 25 keeps every request, attempt (its answer's place included),
    /// body and output through the rebuild that makes their checks cheap; a state or outcome
    /// outside the lists is still refused, a request pointing at no tranche fails its
    /// transaction's commit, and the counters follow the requests a statement recounts.
    #[tokio::test]
    async fn cheap_row_checks_keep_every_row_and_refuse_what_they_refused() {
        let dir = tempfile::tempdir().unwrap();
        let pool = migrated_to(&dir, 25).await;
        for sql in [
            "INSERT INTO jobs (id, provider, state, settings, accepted, created_at, updated_at,
                               n_pending, n_queued)
             VALUES ('job_1', 'openai', 'running', '{}', 2, 1, 1, 1, 1)",
            "INSERT INTO tranches (id, seq, provider, endpoint, model, state, request_count, bytes,
                                   created_at, updated_at)
             VALUES ('tr_a', 1, 'openai', '/v1/chat/completions', 'm', 'submitted', 1, 10, 1, 1)",
            "INSERT INTO requests (id, job_id, line, custom_id, wire_id, provider, endpoint, model,
                                   wire_bytes, input_hash, state, tranche_seq, attempts,
                                   max_attempts, est_tokens, accepted_at)
             VALUES (1, 'job_1', 1, 'a', 'a', 'openai', '/v1/chat/completions', 'm', 10, 'h',
                     'queued', 1, 1, 3, 1, 1),
                    (2, 'job_1', 2, 'b', 'b', 'openai', '/v1/chat/completions', 'm', 10, 'h',
                     'pending', NULL, 0, 3, 1, 1)",
            "INSERT INTO attempts (request_id, attempt, tranche_seq, outcome, created_at,
                                   output_object, output_offset, output_length)
             VALUES (1, 1, 1, 'succeeded', 5, 'raw/x', 7, 9)",
            "INSERT INTO request_bodies (request_id, body) VALUES (2, '{\"x\":2}')",
            "INSERT INTO request_outputs (request_id, output) VALUES (1, '{\"ok\":1}')",
        ] {
            sqlx::query(sql).execute(&pool).await.unwrap();
        }
        migrator().run(&pool).await.unwrap();
        let rows: Vec<(i64, String, Option<i64>)> =
            sqlx::query_as("SELECT id, state, tranche_seq FROM requests ORDER BY id")
                .fetch_all(&pool)
                .await
                .unwrap();
        assert_eq!(rows, [(1, "queued".into(), Some(1)), (2, "pending".into(), None)]);
        let kept: (String, String, i64, String, String) = sqlx::query_as(
            "SELECT a.outcome, a.output_object, a.output_offset,
                    (SELECT body FROM request_bodies WHERE request_id = 2),
                    (SELECT output FROM request_outputs WHERE request_id = 1)
             FROM attempts AS a WHERE a.request_id = 1 AND a.tranche_seq = 1",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(
            kept,
            ("succeeded".into(), "raw/x".into(), 7, r#"{"x":2}"#.into(), r#"{"ok":1}"#.into())
        );
        let broken: Vec<sqlx::sqlite::SqliteRow> =
            sqlx::query("PRAGMA foreign_key_check").fetch_all(&pool).await.unwrap();
        assert!(broken.is_empty(), "{} rows point nowhere", broken.len());
        for bad in [
            "UPDATE requests SET state = 'lost' WHERE id = 2",
            "INSERT INTO attempts (request_id, attempt, tranche_seq, outcome, created_at)
             VALUES (2, 1, 1, 'vanished', 5)",
        ] {
            let refused = sqlx::query(bad).execute(&pool).await.unwrap_err();
            assert!(
                refused.as_database_error().is_some_and(|e| e.is_check_violation()),
                "{bad}: {refused}"
            );
        }
        // A foreign key is checked at the commit: the statement passes, the commit does not,
        // and nothing of the transaction stays.
        let mut tx = pool.begin().await.unwrap();
        sqlx::query("UPDATE requests SET tranche_seq = 99 WHERE id = 2")
            .execute(&mut *tx)
            .await
            .expect("checked at the commit");
        let refused = tx.commit().await.unwrap_err();
        assert!(
            refused.as_database_error().is_some_and(|e| e.is_foreign_key_violation()),
            "{refused}"
        );
        let seq: Option<i64> = sqlx::query_scalar("SELECT tranche_seq FROM requests WHERE id = 2")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(seq, None);
        // Each state the rule names is still taken, and counted by the trigger.
        for state in ["queued", "succeeded", "failed", "cancelled", "pending"] {
            sqlx::query("UPDATE requests SET recount = 0, state = ? WHERE id = 2")
                .bind(state)
                .execute(&pool)
                .await
                .unwrap();
        }
        let counts: (i64, i64) =
            sqlx::query_as("SELECT n_pending, n_queued FROM jobs").fetch_one(&pool).await.unwrap();
        assert_eq!(counts, (1, 1));
        // A statement that does not set `recount` (a claim, an apply: they count their rows
        // themselves) is not counted by the trigger.
        sqlx::query("UPDATE requests SET state = 'cancelled' WHERE id = 2")
            .execute(&pool)
            .await
            .unwrap();
        let counts: (i64, i64) = sqlx::query_as("SELECT n_pending, n_cancelled FROM jobs")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(counts, (1, 0));
    }

    /// A database at migration 27 keeps every request through the rebuild (28) that keeps input
    /// hashes as bytes: a hash of hex digits becomes its 32 bytes (equal hashes stay equal),
    /// anything else keeps its bytes; attempts and bodies still point at their requests, the
    /// indexes and the counter trigger are back, and running the rebuild again changes nothing.
    #[tokio::test]
    async fn input_hashes_become_their_bytes_and_everything_else_stays() {
        let dir = tempfile::tempdir().unwrap();
        let pool = migrated_to(&dir, 27).await;
        let hex = "e13279429fc4b7ca6fd261de83ef9999071b475598c9bbb442beaa184ad0b8f8";
        for sql in [
            "INSERT INTO jobs (id, provider, state, settings, accepted, created_at, updated_at,
                               n_pending, n_queued)
             VALUES ('job_1', 'openai', 'running', '{}', 3, 1, 1, 2, 1)",
            "INSERT INTO tranches (id, seq, provider, endpoint, model, state, request_count, bytes,
                                   created_at, updated_at)
             VALUES ('tr_a', 1, 'openai', '/v1/chat/completions', 'm', 'submitted', 1, 10, 1, 1)",
        ] {
            sqlx::query(sql).execute(&pool).await.unwrap();
        }
        for (id, hash, state, seq) in
            [(1, hex, "queued", Some(1)), (2, hex, "pending", None), (3, "h", "pending", None)]
        {
            sqlx::query(
                "INSERT INTO requests (id, job_id, line, custom_id, wire_id, provider, endpoint,
                                       model, wire_bytes, input_hash, state, tranche_seq,
                                       max_attempts, est_tokens, accepted_at)
                 VALUES (?1, 'job_1', ?1, 'k' || ?1, 'k' || ?1, 'openai',
                         '/v1/chat/completions', 'm', 10, ?2, ?3, ?4, 3, 1, 1)",
            )
            .bind(id)
            .bind(hash)
            .bind(state)
            .bind(seq)
            .execute(&pool)
            .await
            .unwrap();
        }
        for sql in [
            "INSERT INTO attempts (request_id, attempt, tranche_seq, outcome, created_at)
             VALUES (1, 1, 1, 'expired', 5)",
            "INSERT INTO request_bodies (request_id, body) VALUES (2, '{\"x\":2}')",
        ] {
            sqlx::query(sql).execute(&pool).await.unwrap();
        }
        let mut to_28 = migrator();
        to_28.migrations.to_mut().truncate(28);
        to_28.run(&pool).await.unwrap();
        let digest = hex.parse::<tranche_core::InputHash>().unwrap().as_bytes().to_vec();
        let read = || async {
            sqlx::query_as::<_, (i64, Vec<u8>, String, Option<i64>)>(
                "SELECT id, input_hash, state, tranche_seq FROM requests ORDER BY id",
            )
            .fetch_all(&pool)
            .await
            .unwrap()
        };
        let want = vec![
            (1, digest.clone(), "queued".to_owned(), Some(1)),
            (2, digest.clone(), "pending".to_owned(), None),
            (3, b"h".to_vec(), "pending".to_owned(), None),
        ];
        assert_eq!(read().await, want);
        let kept: (i64, String) = sqlx::query_as(
            "SELECT (SELECT COUNT(*) FROM attempts WHERE request_id = 1 AND tranche_seq = 1),
                    (SELECT body FROM request_bodies WHERE request_id = 2)",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(kept, (1, r#"{"x":2}"#.into()));
        let broken: Vec<sqlx::sqlite::SqliteRow> =
            sqlx::query("PRAGMA foreign_key_check").fetch_all(&pool).await.unwrap();
        assert!(broken.is_empty(), "{} rows point nowhere", broken.len());
        let mut indexes: Vec<String> = sqlx::query_scalar(
            "SELECT name FROM sqlite_schema WHERE tbl_name = 'requests' AND type = 'index'
             ORDER BY name",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        indexes.sort();
        assert_eq!(
            indexes,
            [
                "requests_by_job",
                "requests_by_tranche",
                "requests_pending",
                "requests_reused_outputs",
                "sqlite_autoindex_requests_1"
            ]
        );
        // A hash is stored as bytes only.
        let text = sqlx::query("UPDATE requests SET input_hash = 'h' WHERE id = 3")
            .execute(&pool)
            .await
            .unwrap_err();
        assert!(text.to_string().contains("cannot store TEXT value in BLOB column"), "{text}");
        // The counter trigger follows a statement that recounts.
        sqlx::query("UPDATE requests SET recount = 0, state = 'succeeded' WHERE id = 1")
            .execute(&pool)
            .await
            .unwrap();
        let counts: (i64, i64) = sqlx::query_as("SELECT n_queued, n_succeeded FROM jobs")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(counts, (0, 1));
        // Run again (two engines migrating at once), the rebuild keeps every hash as it is.
        sqlx::raw_sql(include_str!("../migrations/sqlite/0028_input_hash_bytes.sql"))
            .execute(&pool)
            .await
            .unwrap();
        let mut again = want;
        again[0].2 = "succeeded".to_owned();
        assert_eq!(read().await, again);
    }

    /// A database at migration 28 gives each job the range of its request ids, the least and
    /// the greatest (a job without requests none), and drops `requests_by_job`; a statement
    /// over a job's requests takes only the job's, even where another job's ids lie inside its
    /// range, and reads them by rowid.
    #[tokio::test]
    async fn jobs_name_their_id_ranges_and_are_read_by_them() {
        let dir = tempfile::tempdir().unwrap();
        let pool = migrated_to(&dir, 28).await;
        sqlx::query(
            "INSERT INTO jobs (id, provider, state, settings, accepted, created_at, updated_at,
                               n_pending)
             VALUES ('job_1', 'openai', 'running', '{}', 2, 1, 1, 2),
                    ('job_2', 'openai', 'running', '{}', 1, 1, 1, 1),
                    ('job_3', 'openai', 'running', '{}', 0, 1, 1, 0)",
        )
        .execute(&pool)
        .await
        .unwrap();
        for (id, job) in [(1, "job_1"), (2, "job_2"), (3, "job_1")] {
            sqlx::query(
                "INSERT INTO requests (id, job_id, line, custom_id, wire_id, provider, endpoint,
                                       model, wire_bytes, input_hash, state, max_attempts,
                                       est_tokens, accepted_at)
                 VALUES (?1, ?2, ?1, 'k' || ?1, 'k' || ?1, 'openai', '/v1/chat/completions',
                         'm', 10, X'00', 'pending', 3, 1, 1)",
            )
            .bind(id)
            .bind(job)
            .execute(&pool)
            .await
            .unwrap();
        }
        migrator().run(&pool).await.unwrap();
        let ranges: Vec<(String, Option<i64>, Option<i64>)> =
            sqlx::query_as("SELECT id, first_request, last_request FROM jobs ORDER BY id")
                .fetch_all(&pool)
                .await
                .unwrap();
        assert_eq!(
            ranges,
            [
                ("job_1".into(), Some(1), Some(3)),
                ("job_2".into(), Some(2), Some(2)),
                ("job_3".into(), None, None)
            ]
        );
        let gone: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM sqlite_schema WHERE name = 'requests_by_job'")
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(gone, 0);
        let of = |job: &'static str| {
            sqlx::query_scalar::<_, String>(concat!(
                "SELECT group_concat(id, ',') FROM (SELECT id FROM requests WHERE ",
                job_rows!(),
                " ORDER BY id)"
            ))
            .bind(job)
            .fetch_optional(&pool)
        };
        assert_eq!(of("job_1").await.unwrap(), Some("1,3".into()));
        assert_eq!(of("job_2").await.unwrap(), Some("2".into()));
        let none: Option<Option<String>> = sqlx::query_scalar(concat!(
            "SELECT group_concat(id, ',') FROM requests WHERE ",
            job_rows!()
        ))
        .bind("job_3")
        .fetch_optional(&pool)
        .await
        .unwrap();
        assert_eq!(none, Some(None), "a job without requests has none");
        pool.close().await;
        let store = SqliteStore::open(&dir.path().join("old.db").to_string_lossy()).await.unwrap();
        for (statement, walk) in [
            (
                concat!("SELECT COUNT(*) FROM requests AS r WHERE ", job_rows!("r")),
                "SEARCH r USING INTEGER PRIMARY KEY (rowid>? AND rowid<?)",
            ),
            (
                concat!(
                    "UPDATE requests SET recount = 0 WHERE state = 'pending' AND ",
                    job_rows!()
                ),
                "SEARCH requests USING INTEGER PRIMARY KEY (rowid>? AND rowid<?)",
            ),
            (
                concat!("DELETE FROM requests WHERE ", job_rows!()),
                "SEARCH requests USING INTEGER PRIMARY KEY (rowid>? AND rowid<?)",
            ),
        ] {
            let plan = query_plans::plan_of(&store, statement, &[1]).await;
            assert!(plan.iter().any(|step| step == walk), "{statement}: {plan:?}");
        }
    }
}
