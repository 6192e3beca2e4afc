//! tranche's PostgreSQL store: one database shared by engines on many hosts, migrations embedded
//! in the binary. Writes run in ordinary transactions; claims skip rows another engine has
//! locked instead of waiting for them, and a lock, serialization or deadlock failure is
//! contention the engine retries. Leases are judged by PostgreSQL's clock. Implements every
//! `tranche_store` trait.

use std::borrow::Cow;
use std::str::FromStr;
use std::time::Duration;

use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Postgres, SqlSafeStr, Transaction};
use tranche_store::{DeploymentStore, Store, StoreError, StoreResult};

pub use import::{ImportError, ImportReport};

/// The database's clock in unix milliseconds, as an SQL expression. A macro so that statements
/// stay string literals (`concat!`), never built at run time. Leases are judged by it.
/// `clock_timestamp()`, not `now()`: the time the statement runs, not the time its transaction
/// began.
macro_rules! db_now_ms {
    () => {
        "(extract(epoch from clock_timestamp()) * 1000)::bigint"
    };
}

/// What a `usage_totals` upsert adds to the row it meets: every count of the row proposed.
/// A macro so that the statements stay string literals (`concat!`).
macro_rules! usage_add {
    () => {
        "requests = usage_totals.requests + excluded.requests,
         input_tokens = usage_totals.input_tokens + excluded.input_tokens,
         cached_input_tokens = usage_totals.cached_input_tokens + excluded.cached_input_tokens,
         cache_write_5m_tokens = usage_totals.cache_write_5m_tokens + excluded.cache_write_5m_tokens,
         cache_write_1h_tokens = usage_totals.cache_write_1h_tokens + excluded.cache_write_1h_tokens,
         output_tokens = usage_totals.output_tokens + excluded.output_tokens,
         reasoning_tokens = usage_totals.reasoning_tokens + excluded.reasoning_tokens"
    };
}

mod answers;
mod blobs;
mod files;
mod idempotency;
mod import;
mod ingest;
mod jobs;
mod leases;
mod metrics;
mod plan;
mod prune;
mod queries;
mod tenants;
mod tranches;
mod usage;
mod writer;

fn migrator() -> Migrator {
    let migration = |version, name, sql: &'static str| {
        Migration::new(
            version,
            Cow::Borrowed(name),
            MigrationType::Simple,
            sql.into_sql_str(),
            false,
        )
    };
    Migrator::with_migrations(vec![
        migration(1, "init", include_str!("../migrations/postgres/0001_init.sql")),
        migration(2, "usage ledger", include_str!("../migrations/postgres/0002_usage_ledger.sql")),
        migration(3, "tenants", include_str!("../migrations/postgres/0003_tenants.sql")),
        migration(
            4,
            "idempotency keys",
            include_str!("../migrations/postgres/0004_idempotency_keys.sql"),
        ),
        migration(
            5,
            "tranche tenants",
            include_str!("../migrations/postgres/0005_tranche_tenants.sql"),
        ),
        migration(
            6,
            "cheaper claims and answers",
            include_str!("../migrations/postgres/0006_cheaper_claims_and_answers.sql"),
        ),
    ])
}

/// Request rows per chunk at submit. Each chunk is one statement binding one array per column
/// (so the bind-parameter limit of 65,535 never comes near), and the same statement text
/// whatever the chunk's length, so it stays prepared.
const INSERT_ROWS: usize = 512;

/// Result lines recorded per statement at ingest.
const INGEST_ROWS: usize = 512;

/// How long a statement waits for a row another engine holds before it gives up with
/// `lock_not_available`, which the engine takes as contention and retries (SQLite's busy
/// timeout plays the same part).
const LOCK_TIMEOUT: &str = "30s";

/// The PostgreSQL store. Cheap to clone; clones share one connection pool.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
}

impl PgStore {
    /// Connects to the database at a `postgres://` URL (the database must exist) and brings its
    /// schema up to date. Statements wait at most 30 s for a row another engine holds, unless
    /// the URL sets `lock_timeout` itself.
    pub async fn open(url: &str) -> StoreResult<Self> {
        let location = redacted(url);
        let options = connect_options(url)
            .map_err(|source| StoreError::Open { location: location.clone(), source })?;
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(Duration::from_secs(60))
            .connect_with(options)
            .await
            .map_err(|source| StoreError::Open { location, source })?;
        // sqlx's PostgreSQL migrator holds an advisory lock while it runs: engines started
        // together on a database that needs migrating take turns, and the later ones find the
        // migrations applied.
        migrator().run(&pool).await.map_err(|e| StoreError::Migrate(Box::new(e)))?;
        Ok(Self { pool })
    }

    /// Starts a transaction that writes. Read committed: every compare-and-set is one statement
    /// whose condition PostgreSQL checks again on the row's newest version, and claims lock
    /// the rows they take.
    async fn begin_write(&self) -> StoreResult<Transaction<'static, Postgres>> {
        Ok(self.pool.begin().await?)
    }
}

/// The options every connection of the pool starts with: the URL's, then the settings tranche
/// relies on where the URL does not choose otherwise (`?options=-c lock_timeout=...`, `-c
/// jit=...`).
fn connect_options(url: &str) -> Result<PgConnectOptions, sqlx::Error> {
    let mut options = PgConnectOptions::from_str(url)?.application_name("tranche");
    let chosen = |name: &str| options.get_options().is_some_and(|o| o.contains(name));
    let mut settings = Vec::new();
    if !chosen("lock_timeout") {
        settings.push(("lock_timeout", LOCK_TIMEOUT));
    }
    // No JIT compilation. It pays off for long analytical queries; tranche's statements each
    // touch one chunk or one tranche, yet the planner prices some of them (a claim, an ingest
    // chunk over a table whose statistics are older than its rows) above `jit_above_cost` and
    // compiles them again at every execution. At 100,000 requests this machine's server spent
    // 53 to 68 CPU-s, 70% of it in LLVM, against 12 to 18 in runs where the estimates stayed
    // low.
    if !chosen("jit") {
        settings.push(("jit", "off"));
    }
    if !settings.is_empty() {
        options = options.options(settings);
    }
    Ok(options)
}

/// A URL without its password, for error messages.
fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    let Some((credentials, host)) = rest.rsplit_once('@') else { return url.to_owned() };
    match credentials.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_owned(),
    }
}

#[async_trait::async_trait]
impl DeploymentStore for PgStore {
    async fn deployment_fact(&self, key: &str, proposed: &str) -> StoreResult<String> {
        sqlx::query(
            "INSERT INTO deployment (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING",
        )
        .bind(key)
        .bind(proposed)
        .execute(&self.pool)
        .await?;
        let row = sqlx::query("SELECT value FROM deployment WHERE key = $1")
            .bind(key)
            .fetch_one(&self.pool)
            .await?;
        Ok(sqlx::Row::try_get(&row, 0)?)
    }
}

#[async_trait::async_trait]
impl Store for PgStore {
    async fn close(&self) {
        self.pool.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_turn_jit_off_and_wait_for_locks_unless_the_url_says_otherwise() {
        let options = |url: &str| connect_options(url).unwrap().get_options().map(str::to_owned);
        let defaults = options("postgres://u@h/db").unwrap();
        assert!(defaults.contains("-c lock_timeout=30s"), "{defaults}");
        assert!(defaults.contains("-c jit=off"), "{defaults}");
        let chosen = options("postgres://u@h/db?options[jit]=on&options[lock_timeout]=1s").unwrap();
        assert!(chosen.contains("jit=on") && !chosen.contains("jit=off"), "{chosen}");
        assert!(chosen.contains("lock_timeout=1s") && !chosen.contains("30s"), "{chosen}");
    }

    #[test]
    fn a_password_never_reaches_an_error_message() {
        assert_eq!(redacted("postgres://u:secret@h:5432/db"), "postgres://u:***@h:5432/db");
        assert_eq!(redacted("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redacted("postgres:///db"), "postgres:///db");
    }
}
