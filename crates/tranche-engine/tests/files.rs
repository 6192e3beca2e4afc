//! Provider files and batches on every path: none left behind when a tranche fails, an input
//! file the provider lost uploaded again, credentials that stop working waited out, Anthropic
//! batches deleted once their results are stored.

#![expect(clippy::unwrap_used, reason = "test helpers fail loudly")]

use std::sync::Arc;

use secrecy::SecretString;
use serde_json::json;
use tranche_core::{JobState, TrancheState};
use tranche_providers::{
    AnthropicConfig, AnthropicProvider, AzureConfig, AzureProvider, FileId, Provider, http_client,
};
use tranche_sim::{HttpFault, SimConfig};
use tranche_test_support::harness::{Harness, keyed_lines, submit};
use tranche_test_support::inputs::anthropic_lines;

fn with_faults(setup: &Harness, faults: serde_json::Value) {
    let faults: Vec<HttpFault> = serde_json::from_value(faults).unwrap();
    setup.sim.set_config(SimConfig { speed: 0.0, faults, ..SimConfig::default() });
}

#[tokio::test]
async fn an_input_file_the_provider_lost_is_uploaded_again() {
    let setup = Harness::new().await;
    let engine = setup.engine(None).await;
    let job = submit(&engine, &keyed_lines(10)).await;
    // One round plans and uploads both tranches; then someone's cleanup deletes their inputs.
    engine.tick().await.unwrap();
    let tranches = engine.store().job_unfinished_tranches(job).await.unwrap();
    assert_eq!(tranches.len(), 2);
    let adapter = setup.openai_at(setup.sim.openai_base_url());
    for t in &tranches {
        assert_eq!(t.state, TrancheState::Uploaded);
        adapter.delete_file(&FileId::new(t.input_file_id.clone().unwrap())).await.unwrap();
    }
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
    assert_eq!(engine.store().job_counts(job).await.unwrap().succeeded, 10);
    for t in &tranches {
        assert_eq!(engine.store().tranche_uploads(t.id).await.unwrap(), 2);
    }
    let stats = setup.sim.stats();
    assert_eq!((stats.batches_created, stats.requests_billed, stats.files_live), (2, 10, 0));
}

#[tokio::test]
async fn a_tranche_refused_at_create_leaves_no_file_behind() {
    let setup = Harness::new().await;
    with_faults(&setup, json!([{"operation": "create", "status": 400, "code": "invalid_value"}]));
    let engine = setup.engine(None).await;
    let job = submit(&engine, &keyed_lines(6)).await;
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Failed);
    let stats = setup.sim.stats();
    assert_eq!(stats.files_uploaded, 2);
    assert_eq!(stats.files_live, 0, "both inputs deleted");
    assert_eq!(engine.store().job_file_counts(job).await.unwrap().live, 0);
}

#[tokio::test]
async fn credentials_refused_while_a_batch_runs_are_waited_out() {
    let setup = Harness::new().await;
    let engine = setup.engine(None).await;
    let job = submit(&engine, &keyed_lines(4)).await;
    engine.tick().await.unwrap();
    engine.tick().await.unwrap();
    let tranches = engine.store().job_unfinished_tranches(job).await.unwrap();
    assert!(tranches.iter().all(|t| t.state == TrancheState::Submitted), "{tranches:?}");
    // The key is rotated: every poll answers 401 for a while.
    with_faults(&setup, json!([{"operation": "retrieve", "status": 401}]));
    for _ in 0..5 {
        engine.tick().await.unwrap();
        setup.sim.advance(1.0);
    }
    let record = engine.store().job(job).await.unwrap().unwrap();
    assert!(!record.state.is_terminal(), "the job waits: {:?}", record.state);
    for t in engine.store().job_unfinished_tranches(job).await.unwrap() {
        assert_eq!(t.state, TrancheState::Submitted);
        assert_eq!(t.last_error.unwrap()["status"], 401, "status says why");
    }
    with_faults(&setup, json!([]));
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
    assert_eq!(engine.store().job_counts(job).await.unwrap().succeeded, 4);
}

#[tokio::test]
async fn anthropic_batches_are_deleted_once_their_results_are_stored() {
    let setup = Harness::new().await;
    let mut config = AnthropicConfig::new(SecretString::from("sk-ant-test"));
    config.base_url = setup.sim.anthropic_base_url();
    let adapter = Arc::new(AnthropicProvider::new(config, http_client().unwrap()).unwrap());
    let engine = setup.engine_over(Arc::clone(&adapter) as Arc<dyn Provider>, |_| {}).await;
    let settings = tranche_core::JobSettings {
        task: Some("t".into()),
        endpoint: tranche_core::Endpoint::AnthropicMessages,
        ..tranche_core::JobSettings::default()
    };
    let job = engine
        .submit(
            anthropic_lines(5).as_bytes(),
            tranche_core::ProviderKind::Anthropic,
            settings,
            None,
        )
        .await
        .unwrap()
        .job_id;
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
    assert_eq!(engine.store().job_counts(job).await.unwrap().succeeded, 5);
    assert_eq!(setup.sim.stats().batches_created, 1);
    let page = adapter.list_batches(None, 100).await.unwrap();
    assert!(page.data.is_empty(), "the batch was deleted: {:?}", page.data);
}

#[tokio::test]
async fn a_job_larger_than_the_file_quota_completes_by_waiting_for_its_own_files() {
    let setup = Harness::new().await;
    let mut config = SimConfig { speed: 0.0, ..SimConfig::default() };
    config.azure.max_input_files_with_expiry = 3;
    setup.sim.set_config(config);
    let azure = AzureConfig::new(setup.sim.azure_endpoint(), SecretString::from("azure-key"));
    let adapter = Arc::new(AzureProvider::new(azure, http_client().unwrap()).unwrap());
    let engine = setup
        .engine_over(Arc::clone(&adapter) as Arc<dyn Provider>, |c| {
            c.max_batch_requests = Some(2);
        })
        .await;
    let settings = tranche_core::JobSettings { task: Some("t".into()), ..Default::default() };
    let lines = keyed_lines(20).replace("gpt-4.1-mini", "gpt-4o-mini");
    let job = engine
        .submit(lines.as_bytes(), tranche_core::ProviderKind::Azure, settings, None)
        .await
        .unwrap()
        .job_id;
    // Ten tranches, three files allowed: the first round uploads three and the rest wait,
    // saying why.
    engine.tick().await.unwrap();
    let waiting: Vec<_> = engine
        .store()
        .job_unfinished_tranches(job)
        .await
        .unwrap()
        .into_iter()
        .filter(|t| t.last_error.as_ref().is_some_and(|e| e["code"] == "quotaExceeded"))
        .collect();
    let all = engine.store().job_unfinished_tranches(job).await.unwrap();
    let seen: Vec<_> = all.iter().map(|t| (t.state, t.last_error.clone())).collect();
    assert_eq!(waiting.len(), 7, "the others wait for room: {seen:?}");
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
    assert_eq!(engine.store().job_counts(job).await.unwrap().succeeded, 20);
    let stats = setup.sim.stats();
    assert_eq!((stats.batches_created, stats.requests_billed, stats.files_live), (10, 20, 0));
}

#[tokio::test]
async fn a_result_file_gone_before_it_was_copied_sends_its_requests_again() {
    let setup = Harness::new().await;
    let engine = setup.engine(None).await;
    let job = submit(&engine, &keyed_lines(6)).await;
    // Step until the batches have ended and their results wait to be collected.
    let collecting = 'ended: {
        for _ in 0..50 {
            engine.tick().await.unwrap();
            setup.sim.advance(1.0);
            let tranches = engine.store().job_unfinished_tranches(job).await.unwrap();
            if tranches.iter().all(|t| t.state == TrancheState::Collecting) {
                break 'ended tranches;
            }
        }
        panic!("the batches never ended");
    };
    let adapter = setup.openai_at(setup.sim.openai_base_url());
    let gone = &collecting[0];
    adapter.delete_file(&FileId::new(gone.output_file_id.clone().unwrap())).await.unwrap();
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
    assert_eq!(engine.store().job_counts(job).await.unwrap().succeeded, 6);
    // The lost file's requests ran twice (their first answers were lost), the others once.
    let runs: Vec<usize> = setup.ledger_by_custom_id().values().map(Vec::len).collect();
    assert_eq!(runs.iter().filter(|n| **n == 2).count() as u64, gone.request_count);
    assert_eq!(runs.iter().sum::<usize>() as u64, 6 + gone.request_count);
    assert_eq!(setup.sim.stats().files_live, 0);
}
