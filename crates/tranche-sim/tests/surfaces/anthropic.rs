//! Anthropic Message Batches: life cycle, request counts, results, cancel, expiry, retention,
//! list pagination, delete, auth and version headers, and every error body.

use std::collections::HashSet;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tranche_sim::{LedgerOutcome, LineFault, LineFaultKind};

use crate::helpers::{KEY, TestSim, anthropic_error, frozen, message_request, paced};

fn requests(n: usize) -> Vec<Value> {
    (0..n).map(|i| message_request(&format!("req-{i}"), &format!("Question {i}"))).collect()
}

fn is_rfc3339(v: &Value) -> bool {
    let s = v.as_str().unwrap_or_default();
    s.len() == "2024-09-24T18:37:24.100435Z".len() && s.ends_with('Z') && s.as_bytes()[10] == b'T'
}

#[tokio::test]
async fn life_cycle_counts_stay_processing_until_the_end() {
    let t = TestSim::new(paced(1.0)).await;
    let ant = t.anthropic();
    let created = ant.create(requests(4)).await;
    let id = created["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("msgbatch_01"));
    let keys: HashSet<&str> = created.as_object().unwrap().keys().map(String::as_str).collect();
    let want: HashSet<&str> = [
        "id",
        "type",
        "processing_status",
        "request_counts",
        "ended_at",
        "created_at",
        "expires_at",
        "archived_at",
        "cancel_initiated_at",
        "results_url",
    ]
    .into();
    assert_eq!(keys, want);
    assert_eq!(created["type"], "message_batch");
    assert_eq!(created["processing_status"], "in_progress");
    assert_eq!(
        created["request_counts"],
        json!({"processing": 4, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0})
    );
    for key in ["ended_at", "archived_at", "cancel_initiated_at", "results_url"] {
        assert_eq!(created[key], Value::Null, "{key}");
    }
    assert!(is_rfc3339(&created["created_at"]) && is_rfc3339(&created["expires_at"]));

    // Half-way: still all processing.
    t.sim.advance(4.0);
    let b = ant.batch(&id).await;
    assert_eq!(b["processing_status"], "in_progress");
    assert_eq!(b["request_counts"]["processing"], 4);
    let r = ant.get(&format!("/v1/messages/batches/{id}/results")).await;
    anthropic_error(&r, 400, "invalid_request_error");

    t.sim.advance(60.0);
    let b = ant.batch(&id).await;
    assert_eq!(b["processing_status"], "ended");
    assert_eq!(
        b["request_counts"],
        json!({"processing": 0, "succeeded": 4, "errored": 0, "canceled": 0, "expired": 0})
    );
    assert!(is_rfc3339(&b["ended_at"]));
    assert_eq!(
        b["results_url"],
        format!("{}/v1/messages/batches/{id}/results", t.sim.anthropic_base_url())
    );

    let results = ant.results(&id).await;
    let got: Vec<&str> = results.iter().map(|r| r["custom_id"].as_str().unwrap()).collect();
    assert_eq!(got.len(), 4);
    assert_ne!(got, ["req-0", "req-1", "req-2", "req-3"], "results are not in input order");
    for r in &results {
        assert_eq!(r.as_object().unwrap().len(), 2);
        assert_eq!(r["result"]["type"], "succeeded");
        let m = &r["result"]["message"];
        assert_eq!(m["type"], "message");
        assert_eq!(m["role"], "assistant");
        assert_eq!(m["model"], "claude-sonnet-4-5");
        assert_eq!(m["content"][0]["type"], "text");
        assert_eq!(m["stop_reason"], "end_turn");
        assert_eq!(m["stop_sequence"], Value::Null);
        assert!(m["usage"]["input_tokens"].as_u64().unwrap() >= 1);
        assert!(m["usage"]["output_tokens"].as_u64().unwrap() >= 1);
    }
    let stats = t.sim.stats();
    assert_eq!(stats.by_provider.anthropic.batches_created, 1);
    assert_eq!(stats.by_provider.anthropic.requests_billed, 4);
    assert_eq!(stats.by_provider.anthropic.files_live, 0);
    assert!(t.sim.ledger().iter().all(|e| e.provider == "anthropic" && e.batch_id == id));
}

#[tokio::test]
async fn invalid_params_become_errored_results_and_are_not_billed() {
    let t = TestSim::new(frozen()).await;
    let ant = t.anthropic();
    let mut reqs = requests(2);
    reqs.push(json!({"custom_id": "no-max", "params": {"model": "m", "messages": [{"role": "user", "content": "x"}]}}));
    reqs.push(json!({"custom_id": "stream", "params": {"model": "m", "max_tokens": 5, "stream": true, "messages": [{"role": "user", "content": "x"}]}}));
    let b = ant.create(reqs).await;
    let id = b["id"].as_str().unwrap();
    t.sim.advance(60.0);
    let b = ant.batch(id).await;
    assert_eq!(b["request_counts"]["succeeded"], 2);
    assert_eq!(b["request_counts"]["errored"], 2);
    for r in ant.results(id).await {
        if r["custom_id"] == "no-max" || r["custom_id"] == "stream" {
            let e = &r["result"];
            assert_eq!(e["type"], "errored");
            assert_eq!(e["error"]["type"], "error");
            assert_eq!(e["error"]["error"]["type"], "invalid_request_error");
            assert!(e["error"]["request_id"].as_str().unwrap().starts_with("req_"));
        }
    }
    assert_eq!(t.sim.stats().requests_billed, 2);
    let invalid =
        t.sim.ledger().iter().filter(|e| e.outcome == LedgerOutcome::FailedInvalid).count();
    assert_eq!(invalid, 2);
}

#[tokio::test]
async fn cancel_then_ended_with_canceled_results() {
    let t = TestSim::new(paced(1.0)).await;
    let ant = t.anthropic();
    let b = ant.create(requests(6)).await;
    let id = b["id"].as_str().unwrap().to_owned();
    t.sim.advance(2.0 + 2.0);
    let c = ant.post(&format!("/v1/messages/batches/{id}/cancel"), &Value::Null).await;
    assert_eq!(c.status, StatusCode::OK);
    assert_eq!(c.body["processing_status"], "canceling");
    assert!(is_rfc3339(&c.body["cancel_initiated_at"]));
    assert_eq!(c.body["request_counts"]["processing"], 6);
    // Canceling again is harmless.
    let again = ant.post(&format!("/v1/messages/batches/{id}/cancel"), &Value::Null).await;
    assert_eq!(again.body["processing_status"], "canceling");
    let r = ant.delete(&format!("/v1/messages/batches/{id}")).await;
    anthropic_error(&r, 400, "invalid_request_error");
    t.sim.advance(10.0);
    let b = ant.batch(&id).await;
    assert_eq!(b["processing_status"], "ended");
    assert_eq!(
        b["request_counts"],
        json!({"processing": 0, "succeeded": 2, "errored": 0, "canceled": 4, "expired": 0})
    );
    let results = ant.results(&id).await;
    let canceled: Vec<&Value> =
        results.iter().filter(|r| r["result"]["type"] == "canceled").collect();
    assert_eq!(canceled.len(), 4);
    assert!(canceled.iter().all(|r| r["result"] == json!({"type": "canceled"})));
    assert_eq!(t.sim.stats().requests_billed, 2);
    let r = ant.post(&format!("/v1/messages/batches/{id}/cancel"), &Value::Null).await;
    anthropic_error(&r, 400, "invalid_request_error");
    // Delete once ended; then it is gone.
    let r = ant.delete(&format!("/v1/messages/batches/{id}")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body, json!({"id": id, "type": "message_batch_deleted"}));
    anthropic_error(&ant.get(&format!("/v1/messages/batches/{id}")).await, 404, "not_found_error");
    anthropic_error(
        &ant.delete(&format!("/v1/messages/batches/{id}")).await,
        404,
        "not_found_error",
    );
}

#[tokio::test]
async fn expiry_after_24_hours_gives_expired_results() {
    let t = TestSim::new(paced(0.001)).await;
    let ant = t.anthropic();
    let b = ant.create(requests(200)).await;
    let id = b["id"].as_str().unwrap().to_owned();
    t.sim.advance(86_399.0);
    assert_eq!(ant.batch(&id).await["processing_status"], "in_progress");
    t.sim.advance(2.0);
    let b = ant.batch(&id).await;
    assert_eq!(b["processing_status"], "ended");
    assert_eq!(b["ended_at"], b["expires_at"]);
    let counts = &b["request_counts"];
    let succeeded = counts["succeeded"].as_u64().unwrap();
    assert_eq!(succeeded, 86);
    assert_eq!(counts["expired"].as_u64().unwrap(), 200 - succeeded);
    let results = ant.results(&id).await;
    assert_eq!(results.iter().filter(|r| r["result"] == json!({"type": "expired"})).count(), 114);
    assert_eq!(t.sim.ledger().len(), 86);
}

#[tokio::test]
async fn results_are_unavailable_29_days_after_created_at() {
    let t = TestSim::new(frozen()).await;
    let ant = t.anthropic();
    let b = ant.create(requests(1)).await;
    let id = b["id"].as_str().unwrap().to_owned();
    t.sim.advance(29.0 * 86_400.0 - 1.0);
    let b = ant.batch(&id).await;
    assert_eq!(b["archived_at"], Value::Null);
    assert_eq!(ant.results(&id).await.len(), 1);
    t.sim.advance(1.0);
    let b = ant.batch(&id).await;
    assert!(is_rfc3339(&b["archived_at"]));
    let r = ant.get(&format!("/v1/messages/batches/{id}/results")).await;
    anthropic_error(&r, 404, "not_found_error");
}

#[tokio::test]
async fn list_is_newest_first_with_after_and_before_ids() {
    let t = TestSim::new(frozen()).await;
    let ant = t.anthropic();
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(
            ant.create(vec![message_request(&format!("r{i}"), "x")]).await["id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    let newest: Vec<String> = ids.iter().rev().cloned().collect();
    let page_ids = |v: &Value| -> Vec<String> {
        v["data"].as_array().unwrap().iter().map(|b| b["id"].as_str().unwrap().to_owned()).collect()
    };
    let p1 = ant.get("/v1/messages/batches?limit=2").await.body;
    assert_eq!(page_ids(&p1), newest[..2]);
    assert_eq!(p1["has_more"], true);
    assert_eq!(p1["first_id"], newest[0].as_str());
    assert_eq!(p1["last_id"], newest[1].as_str());
    let p2 = ant.get(&format!("/v1/messages/batches?limit=2&after_id={}", newest[1])).await.body;
    assert_eq!(page_ids(&p2), newest[2..4]);
    let p3 = ant.get(&format!("/v1/messages/batches?limit=2&after_id={}", newest[3])).await.body;
    assert_eq!(page_ids(&p3), newest[4..]);
    assert_eq!(p3["has_more"], false);
    // Backwards from the oldest: the two just newer than it, still newest first.
    let back = ant.get(&format!("/v1/messages/batches?limit=2&before_id={}", newest[4])).await.body;
    assert_eq!(page_ids(&back), newest[2..4]);
    assert_eq!(back["has_more"], true);
    let back = ant.get(&format!("/v1/messages/batches?limit=5&before_id={}", newest[2])).await.body;
    assert_eq!(page_ids(&back), newest[..2]);
    assert_eq!(back["has_more"], false);
    let all = ant.get("/v1/messages/batches?limit=1000").await.body;
    assert_eq!(page_ids(&all), newest);
    assert_eq!(all.as_object().unwrap().len(), 4);
    for bad in ["0", "1001", "x"] {
        let r = ant.get(&format!("/v1/messages/batches?limit={bad}")).await;
        anthropic_error(&r, 400, "invalid_request_error");
    }
    let empty = TestSim::new(frozen()).await;
    let body = empty.anthropic().get("/v1/messages/batches").await.body;
    assert_eq!(body, json!({"data": [], "has_more": false, "first_id": null, "last_id": null}));
}

#[tokio::test]
async fn create_errors_are_synchronous_400s() {
    let mut config = frozen();
    config.anthropic.max_requests_per_batch = 3;
    let t = TestSim::new(config).await;
    let ant = t.anthropic();
    let long = "a".repeat(65);
    let cases = [
        (
            json!({"requests": [message_request("ticket:1", "x")]}),
            "requests.0.custom_id: String should match pattern '^[a-zA-Z0-9_-]{1,64}$'",
        ),
        (
            json!({"requests": [message_request(&long, "x")]}),
            "requests.0.custom_id: String should have at most 64 characters",
        ),
        (
            json!({"requests": [message_request("", "x")]}),
            "requests.0.custom_id: String should have at least 1 character",
        ),
        (
            json!({"requests": [message_request("a", "x"), message_request("a", "y")]}),
            "requests.1.custom_id: Duplicate custom_id 'a'; each custom_id must be unique within a batch.",
        ),
        (
            json!({"requests": []}),
            "requests: List should have at least 1 item after validation, not 0",
        ),
        (
            json!({"requests": requests(4)}),
            "requests: List should have at most 3 items after validation, not 4",
        ),
        (json!({}), "requests: Field required"),
        (json!({"requests": [{"custom_id": "a"}]}), "requests.0.params: Field required"),
    ];
    for (body, message) in cases {
        let r = ant.post("/v1/messages/batches", &body).await;
        assert_eq!(anthropic_error(&r, 400, "invalid_request_error")["message"], message);
    }
    let r = TestSim::send(
        crate::helpers::Ant::headers(t.client.post(t.url("/v1/messages/batches"))).body("{oops"),
    )
    .await;
    anthropic_error(&r, 400, "invalid_request_error");
    assert_eq!(t.sim.stats().batches_created, 0);
}

#[tokio::test]
async fn oversized_create_is_413_request_too_large() {
    let mut config = frozen();
    config.anthropic.max_body_bytes = 1000;
    let t = TestSim::new(config).await;
    let big: Vec<Value> =
        (0..20).map(|i| message_request(&format!("r{i}"), &"x".repeat(100))).collect();
    let r = t.anthropic().post("/v1/messages/batches", &json!({"requests": big})).await;
    anthropic_error(&r, 413, "request_too_large");
    assert_eq!(
        TestSim::new(frozen()).await.sim.config().anthropic.max_body_bytes,
        256 * 1024 * 1024
    );
}

#[tokio::test]
async fn bodies_above_two_megabytes_are_accepted() {
    let t = TestSim::new(frozen()).await;
    let big: Vec<Value> =
        (0..30).map(|i| message_request(&format!("r{i}"), &"x".repeat(100_000))).collect();
    let b = t.anthropic().create(big).await;
    assert_eq!(b["request_counts"]["processing"], 30);
}

#[tokio::test]
async fn queue_limit_answers_429() {
    let mut config = paced(0.001);
    config.anthropic.max_queued_requests = Some(5);
    let t = TestSim::new(config).await;
    let ant = t.anthropic();
    ant.create(requests(4)).await;
    let r = ant.post("/v1/messages/batches", &json!({"requests": requests(2)})).await;
    anthropic_error(&r, 429, "rate_limit_error");
    ant.create(requests(1)).await;
}

#[tokio::test]
async fn auth_and_version_headers() {
    let t = TestSim::new(frozen()).await;
    let url = t.url("/v1/messages/batches");
    let v = ("anthropic-version", "2023-06-01");
    let ok = [
        t.client.get(&url).header("x-api-key", KEY).header(v.0, v.1),
        t.client.get(&url).bearer_auth(KEY).header(v.0, v.1),
        t.client.get(&url).bearer_auth(KEY).header(v.0, "2026-10-21"),
    ];
    for req in ok {
        let r = TestSim::send(req).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        assert!(r.headers.get("request-id").unwrap().to_str().unwrap().starts_with("req_"));
    }
    let r = TestSim::send(t.client.get(&url).header(v.0, v.1)).await;
    assert_eq!(
        anthropic_error(&r, 401, "authentication_error")["message"],
        "x-api-key header is required"
    );
    let r = TestSim::send(t.client.get(&url).header("x-api-key", "nope").header(v.0, v.1)).await;
    assert_eq!(anthropic_error(&r, 401, "authentication_error")["message"], "invalid x-api-key");
    assert!(!r.text.contains("nope"));
    let r = TestSim::send(t.client.get(&url).header("x-api-key", KEY)).await;
    assert_eq!(
        anthropic_error(&r, 400, "invalid_request_error")["message"],
        "anthropic-version: header is required"
    );
    for bad in ["latest", "2023-13-01", "2023-6-1"] {
        let r = TestSim::send(t.client.get(&url).header("x-api-key", KEY).header(v.0, bad)).await;
        anthropic_error(&r, 400, "invalid_request_error");
    }
    let r = t.anthropic().get("/v1/messages/batches/msgbatch_nope").await;
    anthropic_error(&r, 404, "not_found_error");
    let r = t.anthropic().get("/v1/messages/nothing").await;
    anthropic_error(&r, 404, "not_found_error");
}

#[tokio::test]
async fn line_faults_become_errored_or_spoiled_results() {
    for (kind, check) in [
        (LineFaultKind::Fatal, "invalid_request_error"),
        (LineFaultKind::Retryable, "api_error"),
        (LineFaultKind::InvalidJson, "invalid_json"),
        (LineFaultKind::SchemaViolation, "schema_violation"),
    ] {
        let mut config = frozen();
        config.line_faults.push(LineFault { provider: "anthropic".to_owned(), kind, rate: 1.0 });
        let t = TestSim::new(config).await;
        let ant = t.anthropic();
        let schema = json!({"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]});
        let reqs: Vec<Value> = (0..3)
            .map(|i| {
                json!({"custom_id": format!("r{i}"), "params": {"model": "m", "max_tokens": 500,
                "output_format": {"type": "json_schema", "schema": schema},
                "messages": [{"role": "user", "content": "label it"}]}})
            })
            .collect();
        let b = ant.create(reqs).await;
        t.sim.advance(60.0);
        let results = ant.results(b["id"].as_str().unwrap()).await;
        for r in &results {
            match check {
                "invalid_json" | "schema_violation" => {
                    assert_eq!(r["result"]["type"], "succeeded");
                    let text = r["result"]["message"]["content"][0]["text"].as_str().unwrap();
                    let parsed = serde_json::from_str::<Value>(text);
                    if check == "invalid_json" {
                        assert!(parsed.is_err(), "{text}");
                    } else {
                        assert!(parsed.unwrap().get("label").is_none(), "{text}");
                    }
                }
                error_type => {
                    assert_eq!(r["result"]["type"], "errored");
                    assert_eq!(r["result"]["error"]["error"]["type"], error_type);
                }
            }
        }
        let billed = t.sim.stats().requests_billed;
        assert_eq!(billed, if check.ends_with("_error") { 0 } else { 3 }, "{check}");
    }
}
