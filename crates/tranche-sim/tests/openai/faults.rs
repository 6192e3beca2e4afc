//! Line faults: error-file shapes, determinism per seed, fresh draws for retryable faults.

use std::collections::HashSet;

use serde_json::Value;
use tranche_sim::{LedgerOutcome, LineFault, LineFaultKind, SimConfig};

use crate::helpers::{TestSim, chat_file, chat_line, frozen, ids};

fn with_fault(kind: LineFaultKind, rate: f64, seed: u64) -> SimConfig {
    SimConfig {
        seed,
        line_faults: vec![LineFault { provider: "openai".to_owned(), kind, rate }],
        ..frozen()
    }
}

async fn run(t: &TestSim, content: &str) -> (Value, Vec<Value>, Vec<Value>) {
    let b = t.start(content).await;
    t.sim.advance(3600.0);
    let b = t.batch(b["id"].as_str().unwrap()).await;
    assert_eq!(b["status"], "completed");
    let (out, err) = t.results(&b).await;
    (b, out, err)
}

#[tokio::test]
async fn fatal_faults_at_rate_one_fill_the_error_file() {
    let t = TestSim::new(with_fault(LineFaultKind::Fatal, 1.0, 7)).await;
    let n = 6;
    let (b, out, err) = run(&t, &chat_file(n)).await;
    assert_eq!(b["output_file_id"], Value::Null);
    assert_eq!(b["request_counts"]["failed"], n);
    assert_eq!(b["request_counts"]["completed"], 0);
    assert!(out.is_empty());
    assert_eq!(err.len(), n);
    for line in &err {
        assert!(line["id"].as_str().unwrap().starts_with("batch_req_"));
        assert_eq!(line["error"], Value::Null);
        let response = &line["response"];
        assert_eq!(response["status_code"], 400);
        assert!(response["request_id"].as_str().unwrap().starts_with("req_"));
        let e = &response["body"]["error"];
        assert_eq!(e["type"], "invalid_request_error");
        assert_eq!(e["code"], "context_length_exceeded");
        assert_eq!(e["param"], "messages");
        assert!(
            e["message"].as_str().unwrap().starts_with("This model's maximum context length is")
        );
    }
    let stats = t.sim.stats();
    assert_eq!((stats.requests_billed, stats.tokens_billed), (0, 0));
    let ledger = t.sim.ledger();
    assert_eq!(ledger.len(), n);
    assert!(ledger.iter().all(|e| e.outcome == LedgerOutcome::FailedFatal && e.input_tokens == 0));
}

#[tokio::test]
async fn retryable_faults_are_500_server_errors() {
    let t = TestSim::new(with_fault(LineFaultKind::Retryable, 1.0, 7)).await;
    let (_, out, err) = run(&t, &chat_file(3)).await;
    assert!(out.is_empty());
    assert_eq!(err.len(), 3);
    for line in &err {
        assert_eq!(line["response"]["status_code"], 500);
        assert_eq!(line["response"]["body"]["error"]["type"], "server_error");
        assert!(line["response"]["body"]["error"].as_object().unwrap().contains_key("code"));
    }
    assert!(t.sim.ledger().iter().all(|e| e.outcome == LedgerOutcome::FailedRetryable));
}

#[tokio::test]
async fn faults_for_another_provider_do_not_apply() {
    let mut config = with_fault(LineFaultKind::Fatal, 1.0, 7);
    config.line_faults[0].provider = "anthropic".to_owned();
    let t = TestSim::new(config).await;
    let (_, out, err) = run(&t, &chat_file(3)).await;
    assert_eq!((out.len(), err.len()), (3, 0));
}

fn failed_ids(err: &[Value]) -> HashSet<String> {
    err.iter().map(|l| l["custom_id"].as_str().unwrap().to_owned()).collect()
}

#[tokio::test]
async fn partial_faults_are_deterministic_per_seed() {
    let n = 60;
    let mut sets = Vec::new();
    for seed in [1, 1, 2] {
        let t = TestSim::new(with_fault(LineFaultKind::Fatal, 0.5, seed)).await;
        let (b, out, err) = run(&t, &chat_file(n)).await;
        assert_eq!(out.len() + err.len(), n);
        assert_eq!(b["request_counts"]["failed"], err.len());
        assert!(!err.is_empty() && !out.is_empty(), "rate 0.5 over {n} lines");
        sets.push(failed_ids(&err));
    }
    assert_eq!(sets[0], sets[1], "same seed, same failures");
    assert_ne!(sets[0], sets[2], "another seed, other failures");
}

#[tokio::test]
async fn retryable_faults_are_drawn_afresh_on_retry_but_fatal_ones_stick() {
    let n = 40;
    for (kind, sticky) in [(LineFaultKind::Retryable, false), (LineFaultKind::Fatal, true)] {
        let t = TestSim::new(with_fault(kind, 0.5, 3)).await;
        let (_, _, err) = run(&t, &chat_file(n)).await;
        let failed = failed_ids(&err);
        assert!(!failed.is_empty());
        let retry: Vec<String> = ids(n)
            .into_iter()
            .filter(|id| failed.contains(id))
            .map(|id| chat_line(&id, "gpt-4o-mini", &format!("Classify {id}")))
            .collect();
        let (_, out, err2) = run(&t, &retry.join("\n")).await;
        if sticky {
            assert!(out.is_empty(), "a fatal fault fails the same line again");
            assert_eq!(failed_ids(&err2), failed);
        } else {
            assert!(!out.is_empty(), "a retried line gets a new draw");
        }
    }
}
