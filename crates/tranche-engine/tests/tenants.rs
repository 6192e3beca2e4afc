//! Tenants take turns when planning, and a tenant's share of a model's enqueued-token budget
//! and of an account's files can be capped.

#![expect(clippy::unwrap_used, reason = "test helpers fail loudly")]

use tranche_core::{JobId, JobSettings, JobState, ProviderKind, TrancheState};
use tranche_engine::Engine;
use tranche_test_support::harness::Harness;

/// `n` lines of equal token estimates, keyed `{prefix}10`, `{prefix}11`, ...
fn lines(prefix: &str, n: usize) -> String {
    (10..10 + n)
        .map(|i| {
            let line = serde_json::json!({"key": format!("{prefix}{i}"), "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": format!("k{i} question")}]}});
            format!("{line}\n")
        })
        .collect()
}

/// The estimate of one request of [`lines`].
fn one_request() -> u64 {
    tranche_core::tokens::estimate(
        r#"{"messages":[{"content":"k10 question","role":"user"}],"model":"gpt-4o-mini"}"#,
    )
}

async fn submit_as(engine: &Engine, tenant: &str, text: &str) -> JobId {
    let settings = JobSettings {
        task: Some("t".into()),
        tenant: Some(tenant.into()),
        ..JobSettings::default()
    };
    engine.submit(text.as_bytes(), ProviderKind::Openai, settings, None).await.unwrap().job_id
}

async fn queued(engine: &Engine, job: JobId) -> u64 {
    engine.store().job_counts(job).await.unwrap().queued
}

/// Unfinished tranches holding a job's requests.
async fn unfinished(engine: &Engine, job: JobId) -> u64 {
    let counts = engine.store().job_tranche_counts(job).await.unwrap();
    counts.iter().filter(|(state, _)| !state.is_terminal()).map(|(_, n)| n).sum()
}

#[tokio::test]
async fn a_tenant_arriving_behind_a_large_job_gets_the_next_turn() {
    let setup = Harness::new().await;
    // Room for two five-request batches at a time.
    let engine = setup
        .engine_with(|c| {
            c.max_batch_requests = Some(5);
            c.default_token_budget = Some(one_request() * 10);
        })
        .await;
    let large = submit_as(&engine, "a", &lines("a", 20)).await;
    let small = submit_as(&engine, "b", &lines("b", 5)).await;
    engine.tick().await.unwrap();
    assert_eq!(queued(&engine, small).await, 5, "b's batch went out in the first round");
    assert_eq!(queued(&engine, large).await, 5, "a took turns with b");
    let stored = engine.store().job_unfinished_tranches(small).await.unwrap();
    assert_eq!(stored.len(), 1, "b's requests share no batch with a's");
    assert_eq!(stored[0].request_count, 5);
    assert_eq!(setup.run_to_end(&engine, small).await, JobState::Done);
    assert_eq!(setup.run_to_end(&engine, large).await, JobState::Done);
    assert_eq!(setup.sim.stats().batches_created, 5);
}

#[tokio::test]
async fn a_tenants_token_share_leaves_room_for_the_others() {
    let setup = Harness::new().await;
    // Room for four batches, at most two of one tenant.
    let engine = setup
        .engine_with(|c| {
            c.max_batch_requests = Some(5);
            c.default_token_budget = Some(one_request() * 20);
            c.tenant_token_share = Some(0.5);
        })
        .await;
    let large = submit_as(&engine, "a", &lines("a", 20)).await;
    engine.tick().await.unwrap();
    assert_eq!(queued(&engine, large).await, 10, "a holds half the budget");
    let late = submit_as(&engine, "b", &lines("b", 10)).await;
    engine.tick().await.unwrap();
    assert_eq!(queued(&engine, late).await, 10, "the other half was b's to take");
    assert_eq!(setup.run_to_end(&engine, large).await, JobState::Done);
    assert_eq!(setup.run_to_end(&engine, late).await, JobState::Done);
}

#[tokio::test]
async fn a_tenants_files_are_capped_per_account() {
    let setup = Harness::new().await;
    let engine = setup
        .engine_with(|c| {
            c.max_batch_requests = Some(5);
            c.tenant_max_files = Some(1);
        })
        .await;
    let job = submit_as(&engine, "a", &lines("a", 20)).await;
    let other = submit_as(&engine, "b", &lines("b", 5)).await;
    let mut most = 0;
    for _ in 0..300 {
        engine.tick().await.unwrap();
        most = most.max(unfinished(&engine, job).await);
        if engine.store().job(job).await.unwrap().unwrap().state.is_terminal() {
            break;
        }
        setup.sim.advance(1.0);
    }
    assert_eq!(engine.store().job(job).await.unwrap().unwrap().state, JobState::Done);
    assert_eq!(most, 1, "one file of a's at a time");
    assert_eq!(setup.run_to_end(&engine, other).await, JobState::Done);
    let tranches = engine.store().job_tranche_counts(job).await.unwrap();
    assert_eq!(tranches, [(TrancheState::Done, 4)]);
}
