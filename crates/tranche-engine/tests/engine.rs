//! The engine against an in-process simulator on a virtual clock.

#![expect(clippy::unwrap_used, reason = "test helpers fail loudly")]

use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use secrecy::SecretString;
use tranche_core::input::InputOptions;
use tranche_core::{JobId, JobState, ProviderKind, RequestState};
use tranche_engine::{Engine, EngineConfig, Providers};
use tranche_providers::{OpenAiConfig, OpenAiProvider, http_client};
use tranche_sim::{SimConfig, SimHandle, Simulator};
use tranche_store::Store;

struct Setup {
    dir: tempfile::TempDir,
    sim: SimHandle,
}

impl Setup {
    async fn new() -> Setup {
        let sim = Simulator::spawn(SimConfig { speed: 0.0, ..SimConfig::default() }).await.unwrap();
        Setup { dir: tempfile::tempdir().unwrap(), sim }
    }

    /// A fresh engine over the same store and folders, as after a restart.
    async fn engine(&self, max_batch_requests: Option<usize>) -> Engine {
        let store = Store::open(&self.dir.path().join("t.db").to_string_lossy()).await.unwrap();
        let mut config = OpenAiConfig::new(SecretString::from("sk-test"));
        config.base_url = self.sim.openai_base_url();
        let provider = OpenAiProvider::new(config, http_client().unwrap()).unwrap();
        let engine_config = EngineConfig {
            poll_interval: Duration::ZERO,
            max_batch_requests,
            ..EngineConfig::in_dir(self.dir.path())
        };
        Engine::new(store, Providers::new().with(Arc::new(provider)), engine_config)
    }
}

fn lines(n: usize) -> String {
    (0..n)
        .map(|i| {
            let model = if i % 2 == 0 { "gpt-4o-mini" } else { "gpt-4.1-mini" };
            format!(
                "{}\n",
                serde_json::json!({"key": format!("k{i}"), "body": {"model": model, "messages": [{"role": "user", "content": format!("k{i} question")}]}})
            )
        })
        .collect()
}

async fn submit(engine: &Engine, text: &str) -> JobId {
    let options =
        InputOptions { task: Some("t".into()), ..InputOptions::new(ProviderKind::Openai) };
    engine.submit(text.as_bytes(), options, None, serde_json::json!({})).await.unwrap().job_id
}

#[tokio::test]
async fn a_restart_after_every_step_still_matches_every_request_once() {
    let setup = Setup::new().await;
    let job = submit(&setup.engine(Some(30)).await, &lines(100)).await;
    let mut rounds = 0;
    loop {
        // Every round runs on a brand-new engine: all it knows comes from the store.
        let engine = setup.engine(Some(30)).await;
        engine.tick().await.unwrap();
        let state = engine.store().job(job).await.unwrap().unwrap().state;
        engine.store().close().await;
        if state.is_terminal() {
            assert_eq!(state, JobState::Done);
            break;
        }
        setup.sim.advance(1.0);
        rounds += 1;
        assert!(rounds < 200, "the job did not finish");
    }
    let engine = setup.engine(None).await;
    let counts = engine.store().job_counts(job).await.unwrap();
    assert_eq!((counts.accepted, counts.succeeded, counts.open()), (100, 100, 0));
    let rows: Vec<_> = engine.store().job_results(job).try_collect().await.unwrap();
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(row.custom_id, format!("k{i}:t:v1"));
        assert_eq!(row.state, RequestState::Succeeded);
        let output: serde_json::Value =
            serde_json::from_str(row.output.as_deref().unwrap()).unwrap();
        let answer = output["choices"][0]["message"]["content"].as_str().unwrap();
        assert!(answer.contains(&format!("\"k{i} question")), "{answer}");
    }
    // 50 + 50 requests at 30 per batch: 2 × (30, 20) = 4 batches, each created once.
    let stats = setup.sim.stats();
    assert_eq!(stats.batches_created, 4);
    assert_eq!(stats.files_live, 0);
    assert_eq!(stats.requests_billed, 100);
    let raw = std::fs::read_dir(setup.dir.path().join("raw")).unwrap().count();
    assert_eq!(raw, 4, "each tranche's raw results are kept");
}

#[tokio::test]
async fn a_fatal_upstream_error_fails_the_job_and_keeps_provider_status_and_code() {
    let setup = Setup::new().await;
    // The simulator only accepts another key, so every call answers 401.
    setup.sim.set_config(SimConfig {
        speed: 0.0,
        api_key: Some("sk-other".into()),
        ..SimConfig::default()
    });
    let engine = setup.engine(None).await;
    let job = submit(&engine, &lines(4)).await;
    for _ in 0..10 {
        engine.tick().await.unwrap();
        if engine.store().job(job).await.unwrap().unwrap().state.is_terminal() {
            break;
        }
    }
    let record = engine.store().job(job).await.unwrap().unwrap();
    assert_eq!(record.state, JobState::Failed);
    let error = record.last_error.unwrap();
    assert_eq!(error["provider"], "openai");
    assert_eq!(error["status"], 401);
    assert!(!error.to_string().contains("sk-test"), "the key leaked: {error}");
    let counts = engine.store().job_counts(job).await.unwrap();
    assert_eq!((counts.failed, counts.open()), (4, 0));
    let rows: Vec<_> = engine.store().job_results(job).try_collect().await.unwrap();
    let row_error: serde_json::Value =
        serde_json::from_str(rows[0].error.as_deref().unwrap()).unwrap();
    assert_eq!(row_error["status"], 401);
    assert_eq!(setup.sim.stats().batches_created, 0);
}

#[tokio::test]
async fn an_empty_input_is_rejected_and_stores_nothing() {
    let setup = Setup::new().await;
    let engine = setup.engine(None).await;
    let options =
        InputOptions { task: Some("t".into()), ..InputOptions::new(ProviderKind::Openai) };
    let err = engine.submit(&b"\n\n"[..], options, None, serde_json::json!({})).await.unwrap_err();
    assert!(err.to_string().contains("no requests"), "{err}");
    assert!(engine.store().recent_jobs(5).await.unwrap().is_empty());
}
