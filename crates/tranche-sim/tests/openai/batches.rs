//! Batches: life cycle on the virtual clock, output files, validation failures, cancel, expiry,
//! create-time errors and list pagination.

use std::collections::HashSet;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{
    TestSim, assert_error_shape, chat_file, chat_line, frozen, ids, jsonl, paced,
};

fn custom_ids(lines: &[Value]) -> Vec<String> {
    lines.iter().map(|l| l["custom_id"].as_str().unwrap().to_owned()).collect()
}

#[tokio::test]
async fn life_cycle_validating_in_progress_finalizing_completed() {
    let t = TestSim::new(paced(1.0)).await;
    let n = 5;
    let batch = t.start(&chat_file(n)).await;
    let id = batch["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("batch_"));
    assert_eq!(batch["object"], "batch");
    assert_eq!(batch["status"], "validating");
    assert_eq!(batch["endpoint"], "/v1/chat/completions");
    assert_eq!(batch["completion_window"], "24h");
    let created = batch["created_at"].as_i64().unwrap();
    assert_eq!(batch["expires_at"].as_i64().unwrap(), created + 86_400);
    assert_eq!(batch["request_counts"], json!({"total": 0, "completed": 0, "failed": 0}));
    for key in [
        "model",
        "errors",
        "output_file_id",
        "error_file_id",
        "in_progress_at",
        "finalizing_at",
        "completed_at",
        "failed_at",
        "expired_at",
        "cancelling_at",
        "cancelled_at",
        "metadata",
    ] {
        assert!(batch.as_object().unwrap().contains_key(key), "missing {key}");
        assert_eq!(batch[key], Value::Null, "{key}");
    }
    assert_eq!(batch["usage"]["input_tokens_details"]["cached_tokens"], 0);
    assert_eq!(batch["usage"]["output_tokens_details"]["reasoning_tokens"], 0);

    t.sim.advance(1.0);
    assert_eq!(t.batch(&id).await["status"], "validating");

    t.sim.advance(1.0);
    let b = t.batch(&id).await;
    assert_eq!(b["status"], "in_progress");
    assert_eq!(b["in_progress_at"].as_i64().unwrap(), created + 2);
    assert_eq!(b["model"], "gpt-4o-mini");
    assert_eq!(b["request_counts"]["total"], n);

    t.sim.advance(2.0);
    let b = t.batch(&id).await;
    assert_eq!(b["status"], "in_progress");
    assert_eq!(b["request_counts"]["completed"], 2);

    t.sim.advance(3.0);
    let b = t.batch(&id).await;
    assert_eq!(b["status"], "finalizing");
    assert_eq!(b["finalizing_at"].as_i64().unwrap(), created + 2 + 5);
    assert_eq!(b["output_file_id"], Value::Null);

    t.sim.advance(2.0);
    let b = t.batch(&id).await;
    assert_eq!(b["status"], "completed");
    assert_eq!(b["completed_at"].as_i64().unwrap(), created + 9);
    assert_eq!(b["request_counts"], json!({"total": n, "completed": n, "failed": 0}));
    assert_eq!(b["error_file_id"], Value::Null);
    let usage = &b["usage"];
    assert!(usage["input_tokens"].as_u64().unwrap() >= n as u64);
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["input_tokens"].as_u64().unwrap() + usage["output_tokens"].as_u64().unwrap()
    );

    // The output file: every custom_id exactly once, not in input order, documented line shape.
    let out_id = b["output_file_id"].as_str().unwrap();
    let (_, meta) = t.get(&format!("/files/{out_id}")).await;
    assert_eq!(meta["purpose"], "batch_output");
    assert_eq!(meta["filename"], format!("{id}_output.jsonl"));
    assert_eq!(meta["created_at"].as_i64().unwrap(), created + 9);
    assert_eq!(meta["expires_at"].as_i64().unwrap(), created + 9 + 2_592_000);
    let lines = jsonl(&t.content(out_id).await);
    let got = custom_ids(&lines);
    assert_ne!(got, ids(n), "output must not be in input order");
    let mut sorted = got;
    sorted.sort();
    let mut want = ids(n);
    want.sort();
    assert_eq!(sorted, want);
    let mut tokens = 0;
    for line in &lines {
        assert!(line["id"].as_str().unwrap().starts_with("batch_req_"));
        assert_eq!(line["error"], Value::Null);
        let response = &line["response"];
        assert_eq!(response["status_code"], 200);
        assert!(response["request_id"].as_str().unwrap().starts_with("req_"));
        let body = &response["body"];
        assert_eq!(body["object"], "chat.completion");
        assert_eq!(body["model"], "gpt-4o-mini");
        assert_eq!(body["choices"][0]["message"]["role"], "assistant");
        assert_eq!(body["choices"][0]["finish_reason"], "stop");
        tokens += body["usage"]["total_tokens"].as_u64().unwrap();
    }
    assert_eq!(tokens, usage["total_tokens"].as_u64().unwrap());
}

#[tokio::test]
async fn two_line_output_is_reversed_for_every_seed() {
    for seed in 0..6 {
        let t = TestSim::new(tranche_sim::SimConfig { seed, ..frozen() }).await;
        let b = t.start(&chat_file(2)).await;
        t.sim.advance(3600.0);
        let b = t.batch(b["id"].as_str().unwrap()).await;
        assert_eq!(b["status"], "completed");
        let (out, err) = t.results(&b).await;
        assert!(err.is_empty());
        assert_eq!(custom_ids(&out), [ids(2)[1].clone(), ids(2)[0].clone()]);
    }
}

#[tokio::test]
async fn output_expiry_and_metadata_are_kept() {
    let t = TestSim::new(frozen()).await;
    let file_id = t.upload(&chat_file(3)).await;
    let (status, b) = t
        .post(
            "/batches",
            &json!({
                "input_file_id": file_id,
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
                "metadata": {"tranche_id": "t-1"},
                "output_expires_after": {"anchor": "created_at", "seconds": 7200},
            }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{b}");
    assert_eq!(b["metadata"], json!({"tranche_id": "t-1"}));
    t.sim.advance(60.0);
    let b = t.batch(b["id"].as_str().unwrap()).await;
    assert_eq!(b["status"], "completed");
    let (_, meta) = t.get(&format!("/files/{}", b["output_file_id"].as_str().unwrap())).await;
    assert_eq!(meta["expires_at"].as_i64().unwrap(), meta["created_at"].as_i64().unwrap() + 7200);
    t.sim.advance(7200.0);
    let (status, _) = t.get(&format!("/files/{}", b["output_file_id"].as_str().unwrap())).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn structured_output_and_embeddings_batches() {
    let t = TestSim::new(frozen()).await;
    let schema = json!({"type": "object", "properties": {"intent": {"type": "string", "enum": ["refund", "bug", "other"]}, "urgent": {"type": "boolean"}}, "required": ["intent", "urgent"], "additionalProperties": false});
    let line = |i: usize| {
        json!({"custom_id": format!("s{i}"), "method": "POST", "url": "/v1/chat/completions", "body": {
            "model": "gpt-4o-mini", "messages": [{"role": "user", "content": format!("ticket {i}")}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "intent", "strict": true, "schema": schema}}}})
        .to_string()
    };
    let b = t.start(&(0..4).map(line).collect::<Vec<_>>().join("\n")).await;
    t.sim.advance(60.0);
    let (out, _) = t.results(&t.batch(b["id"].as_str().unwrap()).await).await;
    assert_eq!(out.len(), 4);
    for l in &out {
        let content = l["response"]["body"]["choices"][0]["message"]["content"].as_str().unwrap();
        let parsed: Value = serde_json::from_str(content).unwrap();
        assert!(["refund", "bug", "other"].contains(&parsed["intent"].as_str().unwrap()));
        assert_eq!(parsed["urgent"], true);
    }

    let emb = |i: usize| {
        json!({"custom_id": format!("e{i}"), "method": "POST", "url": "/v1/embeddings",
            "body": {"model": "text-embedding-3-small", "input": ["a", "b"]}})
        .to_string()
    };
    let file_id = t.upload(&(0..3).map(emb).collect::<Vec<_>>().join("\n")).await;
    let (_, b) = t
        .post("/batches", &json!({"input_file_id": file_id, "endpoint": "/v1/embeddings", "completion_window": "24h"}))
        .await;
    t.sim.advance(60.0);
    let (out, _) = t.results(&t.batch(b["id"].as_str().unwrap()).await).await;
    assert_eq!(out.len(), 3);
    let body = &out[0]["response"]["body"];
    assert_eq!(body["object"], "list");
    assert_eq!(body["data"].as_array().unwrap().len(), 2);
    assert_eq!(body["data"][0]["embedding"].as_array().unwrap().len(), 16);
}

async fn failed_with(content: &str) -> Value {
    let t = TestSim::new(frozen()).await;
    let b = t.start(content).await;
    assert_eq!(b["status"], "validating");
    t.sim.advance(2.0);
    let b = t.batch(b["id"].as_str().unwrap()).await;
    assert_eq!(b["status"], "failed", "{b}");
    assert_eq!(b["failed_at"].as_i64().unwrap(), b["created_at"].as_i64().unwrap() + 2);
    assert_eq!(b["in_progress_at"], Value::Null);
    assert_eq!(b["output_file_id"], Value::Null);
    assert_eq!(b["errors"]["object"], "list");
    assert_eq!(t.sim.stats().requests_billed, 0);
    b["errors"]["data"].clone()
}

#[tokio::test]
async fn invalid_json_line_fails_with_its_line_number() {
    let content =
        format!("{}\n{{not json\n{}\n", chat_line("a", "m", "x"), chat_line("b", "m", "y"));
    let errors = failed_with(&content).await;
    assert_eq!(errors[0]["code"], "invalid_json_line");
    assert_eq!(errors[0]["line"], 2);
    assert_eq!(errors[0]["message"], "This line is not parseable as valid JSON.");
    assert!(errors[0].as_object().unwrap().contains_key("param"));
}

#[tokio::test]
async fn duplicate_custom_id_fails() {
    let content =
        [chat_line("a", "m", "x"), chat_line("b", "m", "y"), chat_line("a", "m", "z")].join("\n");
    let errors = failed_with(&content).await;
    assert_eq!(errors[0]["code"], "duplicate_custom_id");
    assert_eq!(errors[0]["line"], 3);
}

#[tokio::test]
async fn model_mismatch_fails() {
    let content = [chat_line("a", "gpt-4o", "x"), chat_line("b", "gpt-4o-mini", "y")].join("\n");
    let errors = failed_with(&content).await;
    assert_eq!(errors[0]["code"], "model_mismatch");
    assert_eq!(errors[0]["line"], 2);
}

#[tokio::test]
async fn url_mismatch_and_empty_file_fail() {
    let content = chat_line("a", "m", "x").replace("/v1/chat/completions", "/v1/responses");
    assert_eq!(failed_with(&content).await[0]["code"], "url_mismatch");
    let errors = failed_with("").await;
    assert_eq!(errors[0]["code"], "empty_file");
    assert_eq!(errors[0]["line"], Value::Null);
}

#[tokio::test]
async fn create_rejects_bad_requests() {
    let t = TestSim::new(frozen()).await;
    let file_id = t.upload(&chat_file(1)).await;
    let (_, user_file) = t.upload_with("x", "user_data", &[]).await;
    let ok = json!({"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"});
    let with = |k: &str, v: Value| {
        let mut b = ok.clone();
        b[k] = v;
        b
    };
    let many: serde_json::Map<String, Value> =
        (0..17).map(|i| (format!("k{i}"), json!("v"))).collect();
    let cases = [
        (with("input_file_id", json!("file-nope")), "input_file_id"),
        (with("input_file_id", user_file["id"].clone()), "input_file_id"),
        (with("completion_window", json!("48h")), "completion_window"),
        (with("endpoint", json!("/v1/audio/speech")), "endpoint"),
        (with("metadata", Value::Object(many)), "metadata"),
        (with("metadata", json!({"k": "v".repeat(513)})), "metadata.k"),
        (
            with("output_expires_after", json!({"anchor": "created_at", "seconds": 60})),
            "output_expires_after.seconds",
        ),
        (json!({"endpoint": "/v1/chat/completions", "completion_window": "24h"}), "input_file_id"),
    ];
    for (body, param) in cases {
        let (status, res) = t.post("/batches", &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body} -> {res}");
        let err = assert_error_shape(&res);
        assert_eq!(err["type"], "invalid_request_error");
        assert_eq!(err["param"], param, "{res}");
    }
    let (status, res) = t.post("/batches", &with("surprise", json!(1))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_error_shape(&res);
    let res = t
        .client
        .post(format!("{}/batches", t.base))
        .bearer_auth(crate::helpers::KEY)
        .body("{oops")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert_error_shape(&res.json::<Value>().await.unwrap());
    assert_eq!(t.sim.stats().batches_created, 0);
}

#[tokio::test]
async fn cancel_keeps_done_lines_and_reports_the_rest() {
    let t = TestSim::new(paced(1.0)).await;
    let n = 10;
    let b = t.start(&chat_file(n)).await;
    let id = b["id"].as_str().unwrap().to_owned();
    t.sim.advance(2.0 + 3.0);
    let (status, c) = t.post(&format!("/batches/{id}/cancel"), &Value::Null).await;
    assert_eq!(status, StatusCode::OK, "{c}");
    assert_eq!(c["status"], "cancelling");
    assert_eq!(c["cancelling_at"], t.sim.now());
    assert_eq!(c["request_counts"]["completed"], 3);

    // Cancelling again is harmless; no more lines run while cancelling.
    t.sim.advance(1.0);
    let (status, again) = t.post(&format!("/batches/{id}/cancel"), &Value::Null).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(again["status"], "cancelling");
    assert_eq!(again["request_counts"]["completed"], 3);

    t.sim.advance(1.0);
    let b = t.batch(&id).await;
    assert_eq!(b["status"], "cancelled");
    assert_eq!(b["cancelled_at"].as_i64().unwrap(), c["cancelling_at"].as_i64().unwrap() + 2);
    let (out, err) = t.results(&b).await;
    assert_eq!(out.len(), 3);
    assert_eq!(err.len(), n - 3);
    for line in &err {
        assert_eq!(line["response"], Value::Null);
        assert_eq!(line["error"]["code"], "batch_cancelled");
    }
    let all: HashSet<String> = custom_ids(&out).into_iter().chain(custom_ids(&err)).collect();
    assert_eq!(all, ids(n).into_iter().collect());
    assert_eq!(t.sim.stats().requests_billed, 3);

    let (status, res) = t.post(&format!("/batches/{id}/cancel"), &Value::Null).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_error_shape(&res);
    let (status, res) = t.post("/batches/batch_nope/cancel", &Value::Null).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_error_shape(&res);
}

#[tokio::test]
async fn cancel_while_validating_runs_nothing() {
    let t = TestSim::new(frozen()).await;
    let b = t.start(&chat_file(4)).await;
    let id = b["id"].as_str().unwrap();
    let (_, c) = t.post(&format!("/batches/{id}/cancel"), &Value::Null).await;
    assert_eq!(c["status"], "cancelling");
    t.sim.advance(10.0);
    let b = t.batch(id).await;
    assert_eq!(b["status"], "cancelled");
    assert_eq!(b["in_progress_at"], Value::Null);
    let (out, err) = t.results(&b).await;
    assert!(out.is_empty());
    assert_eq!(err.len(), 4);
    assert!(t.sim.ledger().is_empty());
}

#[tokio::test]
async fn batch_expires_after_24_hours_with_batch_expired_lines() {
    // 1 line per 1000 virtual seconds: about 86 of 200 lines run in the window.
    let t = TestSim::new(paced(0.001)).await;
    let n = 200;
    let b = t.start(&chat_file(n)).await;
    let id = b["id"].as_str().unwrap().to_owned();
    let expires_at = b["expires_at"].as_i64().unwrap();

    t.sim.advance(86_399.0);
    assert_eq!(t.batch(&id).await["status"], "in_progress");
    t.sim.advance(10.0);
    let b = t.batch(&id).await;
    assert_eq!(b["status"], "expired");
    assert_eq!(b["expired_at"].as_i64().unwrap(), expires_at);
    let done = b["request_counts"]["completed"].as_u64().unwrap() as usize;
    assert_eq!(done, 86);

    let (out, err) = t.results(&b).await;
    assert_eq!(out.len(), done);
    assert_eq!(err.len(), n - done);
    for line in &err {
        assert!(line["id"].as_str().unwrap().starts_with("batch_req_"));
        assert_eq!(line["response"], Value::Null);
        assert_eq!(
            line["error"],
            json!({"code": "batch_expired", "message": "This request could not be executed before the completion window expired."})
        );
    }
    let mut all = custom_ids(&out);
    all.extend(custom_ids(&err));
    all.sort();
    let mut want = ids(n);
    want.sort();
    assert_eq!(all, want, "every custom_id exactly once");
    assert_eq!(t.sim.stats().requests_billed, done as u64);
    assert_eq!(t.sim.ledger().len(), done);
}

#[tokio::test]
async fn list_batches_newest_first_with_cursor() {
    let t = TestSim::new(frozen()).await;
    let mut created = Vec::new();
    for _ in 0..3 {
        created.push(t.start(&chat_file(1)).await["id"].as_str().unwrap().to_owned());
    }
    let (status, page) = t.get("/batches?limit=2").await;
    assert_eq!(status, StatusCode::OK);
    let ids_of = |p: &Value| -> Vec<String> {
        p["data"].as_array().unwrap().iter().map(|b| b["id"].as_str().unwrap().to_owned()).collect()
    };
    assert_eq!(ids_of(&page), [created[2].clone(), created[1].clone()]);
    assert_eq!(page["object"], "list");
    assert_eq!(page["has_more"], true);
    assert_eq!(page["first_id"], created[2].as_str());
    assert_eq!(page["last_id"], created[1].as_str());
    let (_, rest) = t.get(&format!("/batches?limit=2&after={}", created[1])).await;
    assert_eq!(ids_of(&rest), [created[0].clone()]);
    assert_eq!(rest["has_more"], false);
    let (_, all) = t.get("/batches").await;
    assert_eq!(ids_of(&all).len(), 3);
    for bad in ["/batches?limit=0", "/batches?limit=101"] {
        let (status, body) = t.get(bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_error_shape(&body);
    }
    let (status, body) = t.get("/batches/batch_unknown").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_error_shape(&body);
}

#[tokio::test]
async fn deleting_the_input_file_does_not_disturb_a_running_batch() {
    let t = TestSim::new(frozen()).await;
    let b = t.start(&chat_file(3)).await;
    let (status, _) = t.delete(&format!("/files/{}", b["input_file_id"].as_str().unwrap())).await;
    assert_eq!(status, StatusCode::OK);
    t.sim.advance(60.0);
    let b = t.batch(b["id"].as_str().unwrap()).await;
    assert_eq!(b["status"], "completed");
    assert_eq!(t.results(&b).await.0.len(), 3);
}

#[tokio::test]
async fn fifty_thousand_lines_is_the_limit() {
    let t = TestSim::new(frozen()).await;
    let ok = t.start(&chat_file(50_000)).await;
    let over = t.start(&chat_file(50_001)).await;
    t.sim.advance(2.0);
    let ok = t.batch(ok["id"].as_str().unwrap()).await;
    assert_eq!(ok["status"], "in_progress");
    assert_eq!(ok["request_counts"]["total"], 50_000);
    let over = t.batch(over["id"].as_str().unwrap()).await;
    assert_eq!(over["status"], "failed");
    assert_eq!(over["errors"]["data"][0]["code"], "too_many_tasks");
}
