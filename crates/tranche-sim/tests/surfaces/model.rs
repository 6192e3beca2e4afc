//! The deterministic model through the wire: cached-token fields, spoiled answers (invalid JSON,
//! schema violations) that are still billed, and OpenAI's enqueued-token limit (counted by the
//! same convention as the usage).

use serde_json::{Value, json};
use tranche_sim::{LedgerOutcome, LineFault, LineFaultKind};

use crate::helpers::{TestSim, frozen, jsonl, paced};

const SYSTEM: &str = "You classify customer support tickets into shipping, billing or other. ";

/// A system prompt well over OpenAI's 1,024-token caching minimum.
fn system() -> String {
    SYSTEM.repeat(100)
}

fn o200k(s: &str) -> u64 {
    tiktoken_rs::o200k_base_singleton().encode_ordinary(s).len() as u64
}

/// Prompt tokens of `shared_prefix_file(n, _)` by the counting convention.
fn shared_prefix_tokens(n: usize) -> u64 {
    (0..n)
        .map(|i| {
            3 + (3 + o200k("system") + o200k(&system()))
                + (3 + o200k("user") + o200k(&format!("Ticket {i}")))
        })
        .sum()
}

fn shared_prefix_file(n: usize, url: &str) -> String {
    let system = system();
    (0..n)
        .map(|i| {
            json!({"custom_id": format!("t{i}"), "method": "POST", "url": url, "body": {
                "model": "gpt-4o-mini",
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": format!("Ticket {i}")}]}})
            .to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn a_repeated_prompt_prefix_is_reported_as_cached() {
    let t = TestSim::new(frozen()).await;
    let oai = t.openai();
    let file = oai.upload(&shared_prefix_file(4, "/v1/chat/completions")).await;
    let b = oai.create(&file, "/v1/chat/completions").await;
    t.sim.advance(60.0);
    let b = oai.batch(b["id"].as_str().unwrap()).await;
    let lines = jsonl(&oai.content(b["output_file_id"].as_str().unwrap()).await);
    let cached: Vec<u64> = lines
        .iter()
        .map(|l| {
            l["response"]["body"]["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap()
        })
        .collect();
    // The first line to run wrote the cache; the other three read it, in steps of 128 tokens.
    assert_eq!(cached.iter().filter(|c| **c == 0).count(), 1, "{cached:?}");
    assert!(cached.iter().filter(|c| **c >= 1_024 && **c % 128 == 0).count() == 3);
    let total: u64 = cached.iter().sum();
    assert_eq!(b["usage"]["input_tokens_details"]["cached_tokens"], total);
    let ledger_cached: u64 = t.sim.ledger().iter().map(|e| e.cached_tokens).sum();
    assert_eq!(ledger_cached, total);
    for l in &lines {
        let usage = &l["response"]["body"]["usage"];
        assert!(
            usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap()
                < usage["prompt_tokens"].as_u64().unwrap()
        );
    }

    // The same prefix in a later batch (another provider surface keeps its own cache).
    let again = oai.upload(&shared_prefix_file(1, "/v1/chat/completions")).await;
    let b = oai.create(&again, "/v1/chat/completions").await;
    t.sim.advance(60.0);
    let b = oai.batch(b["id"].as_str().unwrap()).await;
    assert!(b["usage"]["input_tokens_details"]["cached_tokens"].as_u64().unwrap() > 0);
    let azure = t.azure_v1();
    let file = azure.upload(&shared_prefix_file(1, "/v1/chat/completions")).await;
    let b = azure.create(&file, "/chat/completions").await;
    t.sim.advance(60.0);
    assert_eq!(
        azure.batch(b["id"].as_str().unwrap()).await["usage"]["input_tokens_details"]["cached_tokens"],
        0
    );
}

#[tokio::test]
async fn spoiled_answers_are_billed_but_do_not_parse_or_fit() {
    let schema = json!({"type": "object", "properties": {"intent": {"type": "string", "enum": ["a", "b"]}}, "required": ["intent"], "additionalProperties": false});
    let line = |i: usize| {
        json!({"custom_id": format!("s{i}"), "method": "POST", "url": "/v1/chat/completions", "body": {
            "model": "gpt-4o-mini", "messages": [{"role": "user", "content": format!("q{i}")}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}})
        .to_string()
    };
    let content: String = (0..40).map(line).collect::<Vec<_>>().join("\n");
    let mut config = frozen();
    config.line_faults = vec![
        LineFault { provider: "openai".to_owned(), kind: LineFaultKind::InvalidJson, rate: 0.3 },
        LineFault {
            provider: "openai".to_owned(),
            kind: LineFaultKind::SchemaViolation,
            rate: 0.3,
        },
    ];
    let t = TestSim::new(config).await;
    let oai = t.openai();
    let file = oai.upload(&content).await;
    let b = oai.create(&file, "/v1/chat/completions").await;
    t.sim.advance(60.0);
    let b = oai.batch(b["id"].as_str().unwrap()).await;
    assert_eq!(b["request_counts"]["completed"], 40);
    assert_eq!(b["error_file_id"], Value::Null);
    let (mut bad_json, mut violations, mut good) = (0, 0, 0);
    for l in jsonl(&oai.content(b["output_file_id"].as_str().unwrap()).await) {
        assert_eq!(l["response"]["status_code"], 200);
        let text = l["response"]["body"]["choices"][0]["message"]["content"].as_str().unwrap();
        match serde_json::from_str::<Value>(text) {
            Err(_) => bad_json += 1,
            Ok(v)
                if ["a", "b"].contains(&v["intent"].as_str().unwrap_or(""))
                    && v.as_object().unwrap().len() == 1 =>
            {
                good += 1;
            }
            Ok(_) => violations += 1,
        }
    }
    let ledger = t.sim.ledger();
    let count = |o: LedgerOutcome| ledger.iter().filter(|e| e.outcome == o).count();
    assert_eq!(bad_json, count(LedgerOutcome::InvalidJson));
    assert_eq!(violations, count(LedgerOutcome::SchemaViolation));
    assert_eq!(good, count(LedgerOutcome::Succeeded));
    assert!(bad_json > 0 && violations > 0 && good > 0, "{bad_json} {violations} {good}");
    assert_eq!(t.sim.stats().requests_billed, 40);
    assert!(ledger.iter().all(|e| e.outcome.billed()));
}

#[tokio::test]
async fn openai_enqueued_token_limit_fails_the_batch() {
    // The limit is exactly one file's tokens: the first batch fits, the second does not.
    let limit = shared_prefix_tokens(10);
    let mut config = paced(0.001);
    config.openai.enqueued_token_limits.insert("*".to_owned(), limit);
    let t = TestSim::new(config).await;
    let oai = t.openai();
    let file = oai.upload(&shared_prefix_file(10, "/v1/chat/completions")).await;
    let first = oai.create(&file, "/v1/chat/completions").await;
    let second = oai.create(&file, "/v1/chat/completions").await;
    t.sim.advance(5.0);
    assert_eq!(oai.batch(first["id"].as_str().unwrap()).await["status"], "in_progress");
    let second = oai.batch(second["id"].as_str().unwrap()).await;
    assert_eq!(second["status"], "failed");
    let err = &second["errors"]["data"][0];
    assert_eq!(err["code"], "token_limit_exceeded");
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .starts_with("Enqueued token limit reached for gpt-4o-mini")
    );
    assert_eq!(err["line"], Value::Null);

    // One token less and even the first batch is over the limit.
    let mut config = paced(0.001);
    config.openai.enqueued_token_limits.insert("*".to_owned(), limit - 1);
    let t = TestSim::new(config).await;
    let oai = t.openai();
    let file = oai.upload(&shared_prefix_file(10, "/v1/chat/completions")).await;
    let first = oai.create(&file, "/v1/chat/completions").await;
    t.sim.advance(5.0);
    assert_eq!(oai.batch(first["id"].as_str().unwrap()).await["status"], "failed");
}
