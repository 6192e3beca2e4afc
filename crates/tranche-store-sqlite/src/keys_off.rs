//! A connection taken from the pool with SQLite's foreign-key checks off, for a write whose
//! keys hold by construction, which never goes back to the pool with them off.
//!
//! SQLite checks a foreign key row by row, and an `UPDATE` that sets a column a foreign key
//! names cannot be done in one pass: it first gathers the rowids it will change into a temporary
//! table, then seeks each row again (and looks its old and new parent up). A claim sets its
//! requests' `tranche_seq`, every one to the tranche it has just inserted: with the checks on,
//! 50,000 requests claimed in 0.129 s of CPU, with them off in 0.079 (Python's sqlite3 on a copy
//! of a 100,000-request run's database, the best of 3 each).
//!
//! An ingest writes an attempt a success, each naming the request it found through
//! `requests_by_tranche` and that request's tranche. Checked, each attempt looks its request up
//! by rowid in `requests`; results come back in any order, so every call of lines walks the
//! whole tranche's rows again, and with a cache of 64 pages each walk reads them from the file:
//! 50,000 successes of a shuffled result file staged in calls of 8,192 read 8,383 pages (137 MB)
//! with the checks and 2,328 (38 MB) without (Python's sqlite3 on a copy of a run's database,
//! the lines in the simulator's order).
//!
//! `PRAGMA foreign_keys` holds for the connection, and cannot change inside a transaction: it is
//! turned off before the transaction and on again after it. A connection given up before that
//! (an error, a cancelled future) is closed rather than returned to the pool, so that no later
//! statement runs unchecked, and closing it rolls back a transaction left open on it. An
//! in-memory database lives in its one connection, which cannot be closed: there the checks stay
//! on.

use sqlx::pool::PoolConnection;
use sqlx::{Sqlite, SqliteConnection, Transaction};
use tranche_store::StoreResult;

/// A pooled connection with foreign-key checks off (see the module's note); dropped, it is
/// closed, unless [`KeysOff::restore`] turned the checks on again first.
#[derive(Debug)]
pub(crate) struct KeysOff {
    conn: PoolConnection<Sqlite>,
    /// Whether the checks are still off.
    off: bool,
}

impl KeysOff {
    /// Takes a connection from `pool` (a file database's: an in-memory one has a single
    /// connection, which cannot be closed) and turns its foreign-key checks off.
    pub async fn take(pool: &sqlx::SqlitePool) -> StoreResult<Self> {
        let mut keys = Self { conn: pool.acquire().await?, off: true };
        sqlx::query("PRAGMA foreign_keys = OFF").execute(keys.conn()).await?;
        Ok(keys)
    }

    /// The connection, to begin a transaction on.
    pub fn conn(&mut self) -> &mut SqliteConnection {
        &mut self.conn
    }

    /// Turns the checks on again and gives the connection back to the pool.
    pub async fn restore(mut self) -> StoreResult<()> {
        if self.off {
            sqlx::query("PRAGMA foreign_keys = ON").execute(self.conn()).await?;
            // A no-op inside a transaction: the connection goes back only once it took.
            let on: i64 = sqlx::query_scalar("PRAGMA foreign_keys").fetch_one(self.conn()).await?;
            self.off = on != 1;
        }
        Ok(())
    }
}

impl Drop for KeysOff {
    fn drop(&mut self) {
        if self.off {
            self.conn.close_on_drop();
        }
    }
}

/// A write transaction whose keys hold by construction (a claim's; a job's writer's and an
/// ingest's, held across many calls) that takes the write lock up front: on a file database, begun by hand on a [`KeysOff`] connection, since a
/// `Transaction` that owns its connection hands it back to the pool at its commit, before the
/// checks could be turned on again; in memory, an ordinary transaction with the checks on.
/// Dropped before [`WriteTx::commit`], it is rolled back (the unchecked connection is closed).
#[derive(Debug)]
pub(crate) enum WriteTx {
    Checked(Transaction<'static, Sqlite>),
    Unchecked(KeysOff),
}

impl WriteTx {
    /// Begins a write transaction on a connection of `pool` (`BEGIN IMMEDIATE`), unchecked
    /// unless the database is in memory. Every key written inside it must hold by construction.
    pub async fn begin_unchecked(pool: &sqlx::SqlitePool, in_memory: bool) -> StoreResult<Self> {
        if in_memory {
            return Ok(Self::Checked(pool.begin_with("BEGIN IMMEDIATE").await?));
        }
        let mut keys = KeysOff::take(pool).await?;
        sqlx::query("BEGIN IMMEDIATE").execute(keys.conn()).await?;
        Ok(Self::Unchecked(keys))
    }

    /// The connection the transaction runs on.
    pub fn conn(&mut self) -> &mut SqliteConnection {
        match self {
            Self::Checked(tx) => tx,
            Self::Unchecked(keys) => keys.conn(),
        }
    }

    /// Rolls back, and gives the connection back to the pool checked.
    pub async fn rollback(self) -> StoreResult<()> {
        match self {
            Self::Checked(tx) => tx.rollback().await?,
            Self::Unchecked(mut keys) => {
                sqlx::query("ROLLBACK").execute(keys.conn()).await?;
                keys.restore().await?;
            }
        }
        Ok(())
    }

    /// Commits, and gives the connection back to the pool checked.
    pub async fn commit(self) -> StoreResult<()> {
        match self {
            Self::Checked(tx) => tx.commit().await?,
            Self::Unchecked(mut keys) => {
                sqlx::query("COMMIT").execute(keys.conn()).await?;
                keys.restore().await?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SqliteStore;

    async fn keys_on(store: &SqliteStore) -> Vec<i64> {
        // Every connection the pool holds (it holds at most `CONNECTIONS`).
        let mut conns = Vec::new();
        for _ in 0..crate::CONNECTIONS {
            conns.push(store.pool.acquire().await.unwrap());
        }
        let mut on = Vec::new();
        for conn in &mut conns {
            on.push(
                sqlx::query_scalar("PRAGMA foreign_keys").fetch_one(&mut **conn).await.unwrap(),
            );
        }
        on
    }

    #[tokio::test]
    async fn no_connection_goes_back_to_the_pool_with_its_keys_off() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("t.db").to_string_lossy()).await.unwrap();
        // Restored: back on.
        let mut keys = KeysOff::take(&store.pool).await.unwrap();
        let off: i64 =
            sqlx::query_scalar("PRAGMA foreign_keys").fetch_one(keys.conn()).await.unwrap();
        assert_eq!(off, 0);
        keys.restore().await.unwrap();
        assert_eq!(keys_on(&store).await, [1, 1]);
        // Given up with the checks off (an error, a cancelled future): closed, and the pool
        // opens a new connection, checked, in its place.
        let keys = KeysOff::take(&store.pool).await.unwrap();
        drop(keys);
        assert_eq!(keys_on(&store).await, [1, 1]);
    }

    #[tokio::test]
    async fn claims_leave_every_key_whole_and_every_connection_checked() {
        use tranche_core::{AccountId, Endpoint, LeaseToken, ProviderKind, TrancheId};
        use tranche_store::{NewTranche, PlanStore, conformance};

        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("t.db").to_string_lossy()).await.unwrap();
        conformance::add_job(&store, 3, "m").await;
        conformance::claim_all(&store, "m").await;
        let claimed: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM requests WHERE tranche_seq IS NOT NULL")
                .fetch_one(&store.pool)
                .await
                .unwrap();
        assert_eq!(claimed, 3);
        let broken = sqlx::query("PRAGMA foreign_key_check").fetch_all(&store.pool).await.unwrap();
        assert!(broken.is_empty());
        assert_eq!(keys_on(&store).await, [1, 1]);
        // A claim refused half-way (its planner's lease is not held): rolled back, and the
        // connection it ran on checked again or gone.
        let tranche = NewTranche {
            id: TrancheId::new(),
            account: AccountId::new(ProviderKind::Openai, "http://127.0.0.1:9/v1"),
            est_tokens: 0,
            provider: ProviderKind::Openai,
            endpoint: Endpoint::ChatCompletions,
            model: "m".into(),
            answer_check: None,
            tenant: None,
            bytes: 0,
            created_at: 2,
        };
        let refused = store.create_tranche(&tranche, &[1], ("plan:none", LeaseToken::new()));
        assert_eq!(refused.await.unwrap(), None);
        assert_eq!(keys_on(&store).await, [1, 1]);
    }

    /// A write begun unchecked is committed, or rolled back when given up, and either way
    /// leaves every pooled connection checked.
    #[tokio::test]
    async fn an_unchecked_write_commits_or_rolls_back_and_leaves_the_pool_checked() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("t.db").to_string_lossy()).await.unwrap();
        let rows = |name: &'static str| {
            let pool = store.pool.clone();
            async move {
                sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM deployment WHERE key = ?")
                    .bind(name)
                    .fetch_one(&pool)
                    .await
                    .unwrap()
            }
        };
        let write = |name: &'static str| {
            let pool = store.pool.clone();
            async move {
                let mut tx = WriteTx::begin_unchecked(&pool, false).await.unwrap();
                assert!(matches!(tx, WriteTx::Unchecked(_)));
                let off: i64 =
                    sqlx::query_scalar("PRAGMA foreign_keys").fetch_one(tx.conn()).await.unwrap();
                assert_eq!(off, 0);
                sqlx::query("INSERT INTO deployment (key, value) VALUES (?, 'v')")
                    .bind(name)
                    .execute(tx.conn())
                    .await
                    .unwrap();
                tx
            }
        };
        write("kept").await.commit().await.unwrap();
        assert_eq!(rows("kept").await, 1);
        assert_eq!(keys_on(&store).await, [1, 1]);
        drop(write("given up").await);
        assert_eq!(rows("given up").await, 0, "rolled back");
        assert_eq!(keys_on(&store).await, [1, 1]);
    }

    /// Jobs written and tranches ingested unchecked leave every key whole.
    #[tokio::test]
    async fn jobs_and_ingests_leave_every_key_whole() {
        use tranche_store::conformance;

        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("t.db").to_string_lossy()).await.unwrap();
        // A job given up first: it asks for an empty store.
        conformance::a_dropped_job_writer_stores_nothing(&store).await;
        conformance::successes_are_recorded_in_bulk_once_each(&store).await;
        conformance::results_are_recorded_once_and_the_rest_in_bulk(&store).await;
        let attempts: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM attempts")
            .fetch_one(&store.pool)
            .await
            .unwrap();
        assert!(attempts > 1_100, "{attempts}");
        let broken = sqlx::query("PRAGMA foreign_key_check").fetch_all(&store.pool).await.unwrap();
        assert!(broken.is_empty());
        assert_eq!(keys_on(&store).await, [1, 1]);
    }

    #[tokio::test]
    async fn an_in_memory_database_keeps_its_checks_and_its_connection() {
        let store = SqliteStore::open("sqlite::memory:").await.unwrap();
        sqlx::query("CREATE TABLE kept (x)").execute(&store.pool).await.unwrap();
        let mut tx = WriteTx::begin_unchecked(&store.pool, true).await.unwrap();
        assert!(matches!(tx, WriteTx::Checked(_)));
        let on: i64 = sqlx::query_scalar("PRAGMA foreign_keys").fetch_one(tx.conn()).await.unwrap();
        assert_eq!(on, 1);
        drop(tx);
        let tables: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM sqlite_schema WHERE name = 'kept'")
                .fetch_one(&store.pool)
                .await
                .unwrap();
        assert_eq!(tables, 1);
    }
}
