//! The store conformance suite against SQLite: a fresh database file per check.

use std::sync::Arc;

use tranche_store::conformance::Fresh;
use tranche_store_sqlite::SqliteStore;

#[expect(clippy::unwrap_used, reason = "test setup fails loudly")]
async fn fresh() -> Fresh {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("nested/t.db").to_string_lossy()).await.unwrap();
    Fresh { store: Arc::new(store), guard: Box::new(dir) }
}

tranche_store::store_conformance!(fresh);
