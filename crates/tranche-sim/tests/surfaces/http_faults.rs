//! HTTP faults: each provider's error shape, Retry-After, seeded determinism, operation and
//! provider filters, dropped connections and latency, and the config JSON of the issue.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tranche_sim::{HttpFault, HttpFaultKind, SimConfig};

use crate::helpers::{KEY, TestSim, anthropic_error, azure_error, frozen, openai_error};

fn with_faults(faults: Vec<HttpFault>) -> SimConfig {
    SimConfig { faults, ..frozen() }
}

#[tokio::test]
async fn each_provider_answers_in_its_own_shape() {
    let mut rate_limit = HttpFault::status("any", "list", 429);
    rate_limit.retry_after = Some(3);
    let t = TestSim::new(with_faults(vec![rate_limit])).await;

    let r = t.openai().get("/batches").await;
    let e = openai_error(&r, 429);
    assert_eq!(e["code"], "rate_limit_exceeded");
    assert_eq!(e["type"], "requests");
    assert_eq!(r.headers["retry-after"], "3");

    for azure in [t.azure_legacy(), t.azure_v1()] {
        let r = azure.get("/files").await;
        assert_eq!(azure_error(&r, 429)["code"], "429");
        assert_eq!(r.headers["retry-after"], "3");
    }

    let r = t.anthropic().get("/v1/messages/batches").await;
    anthropic_error(&r, 429, "rate_limit_error");
    assert_eq!(r.headers["retry-after"], "3");

    // Other operations are untouched.
    assert_eq!(t.openai().get("/batches/batch_x").await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn server_errors_and_overload() {
    let mut overloaded = HttpFault::status("anthropic", "create", 529);
    overloaded.code = Some("overloaded_error".to_owned());
    let mut custom = HttpFault::status("openai", "upload", 503);
    custom.code = Some("engine_overloaded".to_owned());
    custom.message = Some("Try later.".to_owned());
    let t = TestSim::new(with_faults(vec![
        overloaded,
        custom,
        HttpFault::status("azure", "create", 500),
        HttpFault::status("openai", "retrieve", 500),
    ]))
    .await;
    let r = t.anthropic().post("/v1/messages/batches", &json!({"requests": []})).await;
    assert_eq!(anthropic_error(&r, 529, "overloaded_error")["message"], "Overloaded");
    let r = t.openai().upload_with("{}", &[]).await;
    let e = openai_error(&r, 503);
    assert_eq!(
        (e["code"].as_str(), e["message"].as_str()),
        (Some("engine_overloaded"), Some("Try later."))
    );
    let r = t.azure_v1().post("/batches", &json!({})).await;
    assert_eq!(azure_error(&r, 500)["code"], "500");
    let r = t.openai().get("/files/file-x").await;
    assert_eq!(openai_error(&r, 500)["type"], "server_error");
    // Nothing reached the store.
    assert_eq!(t.sim.stats().files_uploaded, 0);
}

#[tokio::test]
async fn auth_comes_before_faults() {
    let t = TestSim::new(with_faults(vec![HttpFault::status("any", "any", 500)])).await;
    let r = TestSim::send(t.client.get(t.url("/v1/files")).bearer_auth("wrong")).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(t.openai().get("/files").await.status, StatusCode::INTERNAL_SERVER_ERROR);
    // The control surface is never faulted.
    let r = TestSim::send(t.client.get(t.url("/sim/stats"))).await;
    assert_eq!(r.status, StatusCode::OK);
}

async fn hit_pattern(seed: u64) -> Vec<bool> {
    let mut fault = HttpFault::status("openai", "list", 500);
    fault.rate = 0.5;
    let t = TestSim::new(SimConfig { seed, ..with_faults(vec![fault]) }).await;
    let mut hits = Vec::new();
    for _ in 0..40 {
        hits.push(t.openai().get("/files").await.status == StatusCode::INTERNAL_SERVER_ERROR);
    }
    hits
}

#[tokio::test]
async fn faults_are_seeded_and_deterministic() {
    let a = hit_pattern(11).await;
    let b = hit_pattern(11).await;
    let c = hit_pattern(12).await;
    assert_eq!(a, b, "same seed, same faults");
    assert_ne!(a, c, "another seed, other faults");
    let hits = a.iter().filter(|h| **h).count();
    assert!((8..=32).contains(&hits), "rate 0.5 over 40 requests: {hits}");
}

#[tokio::test]
async fn dropped_connections_send_nothing() {
    let mut drop = HttpFault::status("openai", "list", 0);
    drop.kind = Some(HttpFaultKind::Drop);
    let t = TestSim::new(with_faults(vec![drop])).await;
    let mut stream = tokio::net::TcpStream::connect(t.sim.addr()).await.unwrap();
    let request =
        format!("GET /v1/files HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let read =
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut buf)).await.unwrap();
    assert!(read.is_err() || buf.is_empty(), "got {:?}", String::from_utf8_lossy(&buf));
    let err = t.client.get(t.url("/v1/files")).bearer_auth(KEY).send().await.unwrap_err();
    assert!(!err.is_status(), "{err}");
    // Other operations still answer.
    assert_eq!(t.openai().get("/batches/batch_x").await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn latency_delays_the_answer() {
    let mut slow = HttpFault::status("azure", "list", 0);
    slow.status = None;
    slow.latency_ms = 300;
    assert_eq!(slow.effective_kind(), HttpFaultKind::Latency);
    let t = TestSim::new(with_faults(vec![slow])).await;
    let start = Instant::now();
    let r = t.azure_v1().get("/files").await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(start.elapsed() >= Duration::from_millis(300));
    let start = Instant::now();
    assert_eq!(t.openai().get("/files").await.status, StatusCode::OK);
    assert!(start.elapsed() < Duration::from_millis(300));
}

#[tokio::test]
async fn the_documented_config_json_is_accepted_at_run_time() {
    let t = TestSim::new(frozen()).await;
    let example = json!({"seed": 7, "azure": {"max_input_files_without_expiry": 500, "max_input_files_with_expiry": 10000},
        "processing": {"requests_per_second": 1000},
        "faults": [{"provider": "openai", "operation": "create", "status": 429, "code": "rate_limit_exceeded", "rate": 0.2, "retry_after": 1}],
        "line_faults": [{"provider": "any", "kind": "fatal", "rate": 0.05}],
        "api_key": KEY});
    let r = TestSim::send(t.client.post(t.url("/sim/config")).json(&example)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["faults"][0]["retry_after"], 1);
    assert_eq!(t.sim.config().faults.len(), 1);
    for bad in [
        json!({"faults": [{"operation": "explode", "status": 500}]}),
        json!({"faults": [{"provider": "nobody", "status": 500}]}),
        json!({"faults": [{"status": 200}]}),
        json!({"faults": [{"status": 500, "rate": 2}]}),
        json!({"line_faults": [{"kind": "melt", "rate": 0.1}]}),
    ] {
        let r = TestSim::send(t.client.post(t.url("/sim/config")).json(&bad)).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}");
    }
    // The handle's fault controls.
    t.sim.set_faults(vec![HttpFault::status("openai", "any", 503)]);
    assert_eq!(t.openai().get("/files").await.status, StatusCode::SERVICE_UNAVAILABLE);
    t.sim.set_faults(Vec::new());
    assert_eq!(t.openai().get("/files").await.status, StatusCode::OK);
    let config: Value = TestSim::send(t.client.get(t.url("/sim/config"))).await.body;
    assert!(config.get("api_key").is_none());
    assert_eq!(config["azure"]["max_input_files_without_expiry"], 500);
}
