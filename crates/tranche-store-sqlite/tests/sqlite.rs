//! What only the SQLite backend has: a database file that outlives the process.

use tranche_store::{JobStore, Store, conformance};
use tranche_store_sqlite::SqliteStore;

#[tokio::test]
async fn reopening_keeps_everything() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db").to_string_lossy().into_owned();
    let store = SqliteStore::open(&path).await.unwrap();
    let id = conformance::add_job(&store, 2, "m").await;
    store.close().await;
    let store = SqliteStore::open(&format!("sqlite://{path}")).await.unwrap();
    assert_eq!(store.job(id).await.unwrap().unwrap().accepted, 2);
}
