//! The `/sim` control surface, stats and ledger, run-time config, and independent instances.

use reqwest::StatusCode;
use serde_json::{Value, json};
use tranche_sim::{LedgerEntry, LedgerOutcome, SimConfig, SimStats, Simulator, UploadEntry};

use crate::helpers::{TestSim, chat_file, frozen, paced};

#[tokio::test]
async fn stats_and_ledger_count_what_ran() {
    let t = TestSim::new(frozen()).await;
    let n = 4;
    let b = t.start(&chat_file(n)).await;
    let id = b["id"].as_str().unwrap().to_owned();
    t.sim.advance(60.0);
    let b = t.batch(&id).await;
    assert_eq!(b["status"], "completed");

    let stats = t.sim.stats();
    assert_eq!(stats.files_uploaded, 1);
    assert_eq!(stats.files_live, 2, "input + output");
    assert_eq!(stats.batches_created, 1);
    assert_eq!(stats.requests_billed, n as u64);
    assert_eq!(stats.tokens_billed, b["usage"]["total_tokens"].as_u64().unwrap());
    assert_eq!(stats.by_provider.openai.requests_billed, n as u64);
    assert_eq!(stats.by_provider.azure, Default::default());

    let http: SimStats = t
        .client
        .get(format!("{}/sim/stats", t.sim.base_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(http, stats);

    let ledger = t.sim.ledger();
    assert_eq!(ledger.len(), n);
    for e in &ledger {
        assert_eq!(e.provider, "openai");
        assert_eq!(e.batch_id, id);
        assert_eq!(e.outcome, LedgerOutcome::Succeeded);
        assert!(e.input_tokens >= 1 && e.output_tokens >= 1);
    }
    let billed: u64 = ledger.iter().map(|e| e.input_tokens + e.output_tokens).sum();
    assert_eq!(billed, stats.tokens_billed);

    let res = t.client.get(format!("{}/sim/ledger", t.sim.base_url())).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let text = res.text().await.unwrap();
    let lines: Vec<LedgerEntry> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines, ledger);
    let first: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    for key in ["provider", "batch_id", "custom_id", "outcome", "input_tokens", "output_tokens"] {
        assert!(first.as_object().unwrap().contains_key(key));
    }
}

#[tokio::test]
async fn uploads_lists_every_uploaded_file_deleted_ones_included() {
    let t = TestSim::new(frozen()).await;
    let b = t.start(&chat_file(2)).await;
    let input = b["input_file_id"].as_str().unwrap().to_owned();
    let (status, _) = t.delete(&format!("/files/{input}")).await;
    assert_eq!(status, StatusCode::OK);
    let uploads = t.sim.uploads();
    assert_eq!(uploads.len(), 1);
    assert_eq!(
        (uploads[0].file_id.as_str(), uploads[0].provider.as_str()),
        (input.as_str(), "openai")
    );
    assert_eq!(uploads[0].purpose, "batch");
    let http: Vec<UploadEntry> = t
        .client
        .get(format!("{}/sim/uploads", t.sim.base_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(http, uploads);
    assert_eq!(t.sim.stats().files_live, 0, "the file itself is gone");
}

#[tokio::test]
async fn clock_endpoints_move_virtual_time() {
    let t = TestSim::new(frozen()).await;
    let base = t.sim.base_url();
    let clock: Value =
        t.client.get(format!("{base}/sim/clock")).send().await.unwrap().json().await.unwrap();
    assert_eq!(clock["now"], t.sim.now());
    assert_eq!(clock["speed"], 0.0);
    let before = t.sim.now();
    let moved: Value = t
        .client
        .post(format!("{base}/sim/clock/advance"))
        .json(&json!({"seconds": 90}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(moved["now"], before + 90);
    assert_eq!(t.sim.now(), before + 90);
    let res = t
        .client
        .post(format!("{base}/sim/clock/advance"))
        .json(&json!({"seconds": -5}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn virtual_time_runs_at_the_configured_speed() {
    // A fast clock: no advance needed, the wall clock carries the batch (a 1 h jump is instant).
    let t = TestSim::new(SimConfig { speed: 1_000_000.0, ..SimConfig::default() }).await;
    let start = t.sim.now();
    let b = t.start(&chat_file(2)).await;
    let mut status = Value::Null;
    for _ in 0..1000 {
        status = t.batch(b["id"].as_str().unwrap()).await["status"].clone();
        if status == "completed" {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(status, "completed");
    assert!(t.sim.now() > start);
}

#[tokio::test]
async fn config_can_be_replaced_at_run_time() {
    let t = TestSim::new(paced(1.0)).await;
    let b = t.start(&chat_file(100)).await;
    let id = b["id"].as_str().unwrap().to_owned();
    t.sim.advance(2.0 + 10.0);
    assert_eq!(t.batch(&id).await["request_counts"]["completed"], 10);

    // Over HTTP: 10x faster from now on; lines already run stay run.
    let base = t.sim.base_url();
    let mut config = t.sim.config();
    config.processing.requests_per_second = 10.0;
    let mut body = serde_json::to_value(&config).unwrap();
    body["api_key"] = json!(crate::helpers::KEY);
    let res = t.client.post(format!("{base}/sim/config")).json(&body).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let echoed: Value = res.json().await.unwrap();
    assert!(echoed.get("api_key").is_none(), "the key is never sent back");
    t.sim.advance(2.0);
    assert_eq!(t.batch(&id).await["request_counts"]["completed"], 30);

    let res = t
        .client
        .post(format!("{base}/sim/config"))
        .json(&json!({"speed": -1}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    let res =
        t.client.post(format!("{base}/sim/config")).json(&json!({"sped": 1})).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);

    // Through the handle.
    let mut config = t.sim.config();
    config.processing.requests_per_second = 1000.0;
    t.sim.set_config(config);
    t.sim.advance(10.0);
    assert_eq!(t.batch(&id).await["status"], "completed");
}

#[tokio::test]
async fn two_simulators_side_by_side_are_independent() {
    let a = TestSim::new(frozen()).await;
    let b = TestSim::new(frozen()).await;
    assert_ne!(a.sim.addr(), b.sim.addr());
    let file_id = a.upload(&chat_file(2)).await;
    let (status, _) = b.get(&format!("/files/{file_id}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, list) = b.get("/files").await;
    assert_eq!(list["data"], json!([]));

    let b_now = b.sim.now();
    a.sim.advance(1000.0);
    assert_eq!(b.sim.now(), b_now);
    assert_eq!(a.sim.stats().files_uploaded, 1);
    assert_eq!(b.sim.stats().files_uploaded, 0);
}

#[tokio::test]
async fn shutdown_stops_serving_and_spawn_on_binds_the_given_address() {
    let sim = Simulator::spawn(frozen()).await.unwrap();
    let url = format!("{}/sim/health", sim.base_url());
    let client = reqwest::Client::new();
    assert_eq!(client.get(&url).send().await.unwrap().status(), StatusCode::OK);
    sim.shutdown().await;
    assert!(client.get(&url).send().await.is_err());

    let addr = "127.0.0.1:0".parse().unwrap();
    let sim = Simulator::spawn_on(addr, frozen()).await.unwrap();
    assert!(sim.openai_base_url().ends_with("/v1"));
    let bad = Simulator::spawn(SimConfig { speed: f64::NAN, ..frozen() }).await;
    assert!(bad.is_err());
}
