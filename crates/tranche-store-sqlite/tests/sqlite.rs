//! What only the SQLite backend has: a database file that outlives the process.

#![expect(clippy::unwrap_used, reason = "test helpers fail loudly")]

use tranche_core::{Endpoint, JobId, JobSettings, ProviderKind};
use tranche_store::{JobStore, NewJob, NewRequest, RequestBody, Store};
use tranche_store_sqlite::SqliteStore;

async fn add_job(store: &dyn Store, n: u64) -> JobId {
    let job = NewJob {
        id: JobId::new(),
        provider: ProviderKind::Openai,
        source: None,
        settings: JobSettings::default(),
        body_object: None,
        created_at: 1,
    };
    let id = job.id;
    let mut writer = store.begin_job(job).await.unwrap();
    for i in 0..n {
        let custom_id = format!("k{i}:t:v1");
        writer
            .add(&NewRequest {
                line: i + 1,
                custom_id: &custom_id,
                wire_id: &custom_id,
                endpoint: Endpoint::ChatCompletions,
                model: "m",
                body: RequestBody::Stored("{}"),
                wire_bytes: 2,
                input_hash: "00",
                max_attempts: 3,
                est_tokens: 1,
                accepted_at: 1,
            })
            .await
            .unwrap();
    }
    writer.commit().await.unwrap();
    id
}

#[tokio::test]
async fn reopening_keeps_everything() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db").to_string_lossy().into_owned();
    let store = SqliteStore::open(&path).await.unwrap();
    let id = add_job(&store, 2).await;
    store.close().await;
    let store = SqliteStore::open(&format!("sqlite://{path}")).await.unwrap();
    assert_eq!(store.job(id).await.unwrap().unwrap().accepted, 2);
}
