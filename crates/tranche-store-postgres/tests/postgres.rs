//! What only the PostgreSQL backend has: engines on several hosts sharing one database, and
//! the transactions that keep them apart.

mod common;

use std::sync::Arc;
use std::time::Duration;

use sqlx::{Connection, PgConnection};
use tranche_core::{Endpoint, EngineId, JobState, LeaseToken};
use tranche_store::{JobStore, NewJob, NewRequest, RequestBody, StoreError, conformance};
use tranche_store_postgres::PgStore;

fn request<'a>(line: u64, custom_id: &'a str) -> NewRequest<'a> {
    NewRequest {
        line,
        custom_id,
        wire_id: custom_id,
        endpoint: Endpoint::ChatCompletions,
        model: "m",
        body: RequestBody::Stored("{}"),
        wire_bytes: 2,
        input_hash: tranche_core::InputHash::from_bytes([0; 32]),
        max_attempts: 3,
        est_tokens: 1,
        max_cost: None,
        accepted_at: 100,
    }
}

fn new_job() -> NewJob {
    NewJob {
        id: tranche_core::JobId::new(),
        provider: tranche_core::ProviderKind::Openai,
        source: None,
        settings: tranche_core::JobSettings::default(),
        body_object: None,
        answer_check: None,
        created_at: 100,
    }
}

/// A repeated custom id is named with both lines, whether the first is stored already (an
/// earlier chunk) or in the same chunk; the failed statement leaves the transaction usable for
/// the look-up, and the dropped job stores nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_custom_ids_are_named_with_their_first_line() {
    let fresh = common::fresh().await;
    let store = &*fresh.store;
    let job = new_job();
    let id = job.id;
    let mut writer = store.begin_job(job).await.unwrap();
    writer.add(&request(1, "a")).await.unwrap();
    writer.flush().await.unwrap();
    writer.add(&request(2, "b")).await.unwrap();
    writer.add(&request(3, "a")).await.unwrap();
    writer.add(&request(4, "b")).await.unwrap();
    let Err(StoreError::DuplicateCustomIds(repeats)) = writer.flush().await else {
        unreachable!("the repeats are found")
    };
    let named: Vec<_> =
        repeats.iter().map(|r| (r.line, r.custom_id.as_str(), r.first_line)).collect();
    assert_eq!(named, [(3, "a", 1), (4, "b", 2)]);
    drop(writer);
    assert!(store.job(id).await.unwrap().is_none());
    // The writer's ids were taken from the sequence; later jobs take later ones.
    let next = conformance::add_job(store, 2, "m").await;
    assert_eq!(store.job(next).await.unwrap().unwrap().accepted, 2);
}

/// Engines started together on an empty database migrate it once between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_opening_at_once_migrate_once() {
    let mut scratch = common::scratch().await;
    let opens = (0..4).map(|_| PgStore::open(&scratch.url));
    for store in futures::future::join_all(opens).await {
        scratch.stores.push(Arc::new(store.unwrap()));
    }
    let id = conformance::add_job(&*scratch.stores[0], 3, "m").await;
    assert_eq!(scratch.stores[3].job(id).await.unwrap().unwrap().accepted, 3);
}

/// A row another engine holds past the lock timeout is contention, to be tried again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_held_past_the_lock_timeout_is_contention() {
    let mut scratch = common::scratch().await;
    let url = format!("{}?options[lock_timeout]=100ms", scratch.url);
    let store = Arc::new(PgStore::open(&url).await.unwrap());
    scratch.stores.push(store.clone());
    let id = conformance::add_job(&*store, 1, "m").await;
    let mut other = PgConnection::connect(&scratch.url).await.unwrap();
    let mut tx = other.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE")
        .bind(id.to_string())
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    let err = store.set_job_state(id, JobState::Running, None, 101).await.unwrap_err();
    assert!(err.is_contention(), "{err}");
    tx.rollback().await.unwrap();
    assert!(store.set_job_state(id, JobState::Running, None, 102).await.unwrap());
    other.close().await.unwrap();
}

/// Engines racing for one due tranche: exactly one takes its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_engines_lease_a_tranche_once() {
    let fresh = common::fresh().await;
    let store = &*fresh.store;
    conformance::add_job(store, 3, "m").await;
    let (tranche, _) = conformance::claim_all(store, "m").await;
    let leases = (0..8u32).map(|i| async move {
        let engine = EngineId::new("host", i);
        store
            .lease_tranche(tranche, &engine, LeaseToken::new(), Duration::from_secs(60), i64::MAX)
            .await
            .unwrap()
    });
    let granted = futures::future::join_all(leases).await;
    assert_eq!(granted.iter().filter(|g| g.is_some()).count(), 1, "{granted:?}");
}
