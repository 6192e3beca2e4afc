//! Adopting the batch of a create whose answer was lost, at a provider whose batches carry no
//! metadata (Anthropic): candidates are told apart by their results, and a candidate whose
//! results cannot be read makes the tranche looking wait, never fail.

#![expect(clippy::unwrap_used, reason = "test helpers fail loudly")]

use serde_json::{Value, json};
use tranche_core::{Endpoint, JobSettings, JobState, ProviderKind, TrancheState};
use tranche_sim::{HttpFault, SimConfig};
use tranche_test_support::harness::Harness;

fn faults(faults: &[Value]) -> SimConfig {
    let faults = faults.iter().map(|f| serde_json::from_value::<HttpFault>(f.clone()).unwrap());
    SimConfig { speed: 0.0, faults: faults.collect(), ..SimConfig::default() }
}

#[tokio::test]
async fn a_candidate_whose_results_cannot_be_read_makes_the_tranche_wait_not_fail() {
    let setup = Harness::new().await;
    // Every create is carried out and its answer lost: two batches of one request each, which
    // only their results tell apart.
    setup.sim.set_config(faults(&[
        json!({"provider": "anthropic", "operation": "create", "kind": "drop_after"}),
    ]));
    // One request a batch.
    let engine = setup.anthropic_engine_with(|c| c.max_batch_requests = Some(1)).await;
    let lines: String = ["a", "b"]
        .iter()
        .map(|key| {
            let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 16,
                              "messages": [{"role": "user", "content": format!("{key} says hello")}]});
            format!("{}\n", json!({"key": key, "body": body}))
        })
        .collect();
    let settings = JobSettings {
        task: Some("t".into()),
        endpoint: Endpoint::AnthropicMessages,
        ..JobSettings::default()
    };
    let job = engine
        .submit(lines.as_bytes(), ProviderKind::Anthropic, settings, None)
        .await
        .unwrap()
        .job_id;
    for _ in 0..4 {
        engine.tick().await.unwrap();
    }
    assert_eq!(setup.sim.stats().batches_created, 2);

    // The batches end, and reading their results answers 404, as for a batch another tranche
    // took, ended and deleted after this one listed it.
    setup.sim.set_config(faults(&[
        json!({"provider": "anthropic", "operation": "content", "status": 404}),
    ]));
    setup.sim.advance(3_600.0);
    for _ in 0..4 {
        engine.tick().await.unwrap();
    }
    let store = engine.store();
    let tranches = store.job_unfinished_tranches(job).await.unwrap();
    assert_eq!(tranches.len(), 2);
    assert!(tranches.iter().all(|t| t.state == TrancheState::Creating), "{tranches:?}");
    assert_eq!(store.job_counts(job).await.unwrap().failed, 0);

    // Once results can be read, each tranche adopts its own batch; none is created again.
    setup.sim.set_config(SimConfig { speed: 0.0, ..SimConfig::default() });
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
    assert_eq!(store.job_counts(job).await.unwrap().succeeded, 2);
    assert_eq!(setup.sim.stats().batches_created, 2, "a batch was created again");
    assert!(setup.ledger_by_custom_id().values().all(|runs| runs.len() == 1));
}
