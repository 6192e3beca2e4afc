//! Shared-prompt cache marks: an Anthropic tranche's requests that share a system prompt long
//! enough to cache go out with a `cache_control` breakpoint on it, in the bytes sent only;
//! every other line, and every line of a job that turned it off, goes out as given.

#![expect(clippy::unwrap_used, clippy::panic, reason = "test helpers fail loudly")]

use std::collections::BTreeMap;

use serde_json::{Value, json};
use tranche_blob::{BlobKey, BlobStore};
use tranche_core::hash::canonical_json;
use tranche_core::{
    CacheSharedPrompt, Endpoint, JobId, JobSettings, JobState, ProviderKind, TrancheId,
    TrancheState,
};
use tranche_engine::Engine;
use tranche_sim::{HttpFault, SimConfig};
use tranche_test_support::harness::Harness;

/// A system prompt well above Claude Sonnet 4.5's minimum of 1,024 tokens.
fn long_prompt(topic: &str) -> String {
    format!("You label {topic} by intent, urgency and product area, and answer in one word. ")
        .repeat(120)
}

/// A tranche line keyed `key` whose system prompt is `system` (none when null).
fn line(key: &str, system: Value) -> Value {
    let mut body = json!({"model": "claude-sonnet-4-5", "max_tokens": 32,
        "messages": [{"role": "user", "content": format!("{key} says hello")}]});
    if !system.is_null() {
        body["system"] = system;
    }
    json!({"key": key, "body": body})
}

fn text(lines: &[Value]) -> String {
    lines.iter().map(|l| format!("{l}\n")).collect()
}

/// Nine requests: four share a long prompt (to be marked), two a short one, one has a long
/// prompt of its own, one marks its own prompt, one has none.
fn mixed_lines() -> Vec<Value> {
    let own_mark = json!([{"type": "text", "text": long_prompt("tickets"),
                           "cache_control": {"type": "ephemeral", "ttl": "1h"}}]);
    vec![
        line("a0", json!(long_prompt("tickets"))),
        line("a1", json!(long_prompt("tickets"))),
        line("a2", json!(long_prompt("tickets"))),
        line("a3", json!(long_prompt("tickets"))),
        line("s0", json!("Be brief.")),
        line("s1", json!("Be brief.")),
        line("u0", json!(long_prompt("invoices"))),
        line("m0", own_mark),
        line("n0", Value::Null),
    ]
}

async fn anthropic_engine(setup: &Harness) -> Engine {
    setup.anthropic_engine_with(|_| {}).await
}

async fn submit(engine: &Engine, lines: &[Value], cache: CacheSharedPrompt) -> JobId {
    let settings = JobSettings {
        task: Some("t".into()),
        endpoint: Endpoint::AnthropicMessages,
        cache_shared_prompt: cache,
        ..JobSettings::default()
    };
    engine
        .submit(text(lines).as_bytes(), ProviderKind::Anthropic, settings, None)
        .await
        .unwrap()
        .job_id
}

fn input_key(tranche: TrancheId) -> BlobKey {
    BlobKey::new(format!("tranches/{tranche}/input.jsonl")).unwrap()
}

/// Ticks (the simulator's clock stopped, so the batch stays in progress) until `job`'s one
/// tranche has its batch; the tranche and its input file as sent.
async fn sent(setup: &Harness, engine: &Engine, job: JobId) -> (TrancheId, Vec<u8>) {
    for _ in 0..10 {
        engine.tick().await.unwrap();
        let tranches = engine.store().job_unfinished_tranches(job).await.unwrap();
        if let [t] = tranches.as_slice()
            && t.state == TrancheState::Submitted
        {
            let blobs = BlobStore::local(&setup.dir.path().join("blobs"));
            return (t.id, blobs.get(&input_key(t.id)).await.unwrap().to_vec());
        }
    }
    panic!("job {job}'s batch was not created")
}

/// The `params` text of each line of an input file, by the user message it carries (`a0 says
/// hello` → `a0`).
fn params_by_key(file: &[u8]) -> BTreeMap<String, String> {
    let file = std::str::from_utf8(file).unwrap();
    file.lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            let key = v["params"]["messages"][0]["content"].as_str().unwrap();
            let key = key.split(' ').next().unwrap().to_owned();
            let at = l.find(",\"params\":").unwrap() + ",\"params\":".len();
            (key, l[at..l.len() - 1].to_owned())
        })
        .collect()
}

/// The body of `line` as tranche stores it and sends it unmarked: canonical JSON.
fn as_given(line: &Value) -> String {
    canonical_json(&line["body"])
}

#[tokio::test]
async fn requests_sharing_a_long_system_prompt_are_marked_and_the_rest_sent_as_given() {
    let setup = Harness::new().await;
    let engine = anthropic_engine(&setup).await;
    let lines = mixed_lines();
    let job = submit(&engine, &lines, CacheSharedPrompt::Auto).await;
    let (_, file) = sent(&setup, &engine, job).await;
    let params = params_by_key(&file);
    assert_eq!(params.len(), 9);
    for l in &lines {
        let key = l["key"].as_str().unwrap();
        let sent = &params[key];
        if key.starts_with('a') {
            let v: Value = serde_json::from_str(sent).unwrap();
            assert_eq!(
                v["system"],
                json!([{"type": "text", "text": long_prompt("tickets"),
                        "cache_control": {"type": "ephemeral"}}]),
                "{key}"
            );
            let mut unmarked = v.clone();
            unmarked["system"] = json!(long_prompt("tickets"));
            assert_eq!(unmarked, l["body"], "{key}: nothing else changed");
            assert_eq!(*sent, canonical_json(&v), "{key}: canonical");
        } else {
            // Short, unique, already marked or no prompt at all: byte for byte as stored.
            assert_eq!(*sent, as_given(l), "{key}");
        }
    }
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
    assert_eq!(engine.store().job_counts(job).await.unwrap().succeeded, 9);
    let ledger = setup.ledger_by_custom_id();
    assert_eq!(ledger.len(), 9);
    assert!(ledger.values().all(|runs| runs.len() == 1), "each answered once: {ledger:?}");

    // The mark is not part of a request's identity: the same lines again are answered from
    // the first job's results, not sent.
    let again = submit(&engine, &lines, CacheSharedPrompt::Auto).await;
    assert_eq!(setup.run_to_end(&engine, again).await, JobState::Done);
    let counts = engine.store().job_counts(again).await.unwrap();
    assert_eq!((counts.succeeded, counts.cached), (9, 9));
    assert_eq!(setup.sim.stats().batches_created, 1);
}

#[tokio::test]
async fn a_job_that_turns_it_off_sends_every_body_as_given() {
    let setup = Harness::new().await;
    let engine = anthropic_engine(&setup).await;
    let lines = mixed_lines();
    let job = submit(&engine, &lines, CacheSharedPrompt::Off).await;
    let (_, file) = sent(&setup, &engine, job).await;
    let params = params_by_key(&file);
    assert_eq!(params.len(), 9);
    for l in &lines {
        assert_eq!(params[l["key"].as_str().unwrap()], as_given(l));
    }
    assert!(
        !String::from_utf8(file).unwrap().contains("\"cache_control\":{\"type\":\"ephemeral\"}")
    );
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
    assert_eq!(engine.store().job_counts(job).await.unwrap().succeeded, 9);
}

#[tokio::test]
async fn in_a_shared_tranche_only_the_requests_of_jobs_that_ask_are_counted_and_marked() {
    let setup = Harness::new().await;
    let engine = anthropic_engine(&setup).await;
    let prompt = json!(long_prompt("tickets"));
    // Two requests of a job that asks share the prompt with two of a job that does not; a
    // third job that asks has it once, which with the first job's makes three.
    let first = [line("a0", prompt.clone()), line("a1", prompt.clone())];
    let off = [line("o0", prompt.clone()), line("o1", prompt.clone())];
    let third = [line("b0", prompt.clone())];
    let jobs = [
        submit(&engine, &first, CacheSharedPrompt::Auto).await,
        submit(&engine, &off, CacheSharedPrompt::Off).await,
        submit(&engine, &third, CacheSharedPrompt::Auto).await,
    ];
    let (tranche, file) = sent(&setup, &engine, jobs[0]).await;
    for job in jobs {
        let tranches = engine.store().job_unfinished_tranches(job).await.unwrap();
        assert_eq!(tranches.iter().map(|t| t.id).collect::<Vec<_>>(), [tranche], "one tranche");
    }
    let params = params_by_key(&file);
    assert_eq!(params.len(), 5);
    for l in first.iter().chain(&third) {
        let v: Value = serde_json::from_str(&params[l["key"].as_str().unwrap()]).unwrap();
        assert_eq!(v["system"][0]["cache_control"], json!({"type": "ephemeral"}), "{l}");
    }
    for l in &off {
        assert_eq!(params[l["key"].as_str().unwrap()], as_given(l));
    }
    for job in jobs {
        assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
    }
    assert_eq!(setup.ledger_by_custom_id().len(), 5);
}

#[tokio::test]
async fn a_prompt_one_request_of_a_job_has_is_not_marked() {
    let setup = Harness::new().await;
    let engine = anthropic_engine(&setup).await;
    let lines = [line("a0", json!(long_prompt("tickets"))), line("s0", json!("Be brief."))];
    let job = submit(&engine, &lines, CacheSharedPrompt::Auto).await;
    let (_, file) = sent(&setup, &engine, job).await;
    let params = params_by_key(&file);
    for l in &lines {
        assert_eq!(params[l["key"].as_str().unwrap()], as_given(l));
    }
}

#[tokio::test]
async fn the_file_written_again_by_another_engine_is_the_same_bytes() {
    let setup = Harness::new().await;
    let faults: Vec<HttpFault> =
        serde_json::from_value(json!([{"operation": "create", "status": 500}])).unwrap();
    setup.sim.set_config(SimConfig { speed: 0.0, faults, ..SimConfig::default() });
    let engine = anthropic_engine(&setup).await;
    let job = submit(&engine, &mixed_lines(), CacheSharedPrompt::Auto).await;
    // The create fails after the file was written; the next try, by a fresh engine, writes
    // it again from the store.
    engine.tick().await.unwrap();
    let tranches = engine.store().job_unfinished_tranches(job).await.unwrap();
    assert_eq!(tranches.len(), 1);
    let blobs = BlobStore::local(&setup.dir.path().join("blobs"));
    let first = blobs.get(&input_key(tranches[0].id)).await.unwrap().to_vec();
    assert!(String::from_utf8_lossy(&first).contains("\"cache_control\":{\"type\":\"ephemeral\"}"));
    setup.sim.set_config(SimConfig { speed: 0.0, ..SimConfig::default() });
    let engine = anthropic_engine(&setup).await;
    let (tranche, again) = sent(&setup, &engine, job).await;
    assert_eq!(tranche, tranches[0].id);
    assert_eq!(again, first, "identical bytes");
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
    assert_eq!(setup.sim.stats().batches_created, 1);
}

#[tokio::test]
async fn a_tranche_cut_at_the_byte_limit_still_fits_once_marked() {
    let lines: Vec<Value> =
        (0..6).map(|i| line(&format!("a{i}"), json!(long_prompt("tickets")))).collect();
    // Unmarked, the six make a file of `limit` bytes.
    let setup = Harness::new().await;
    let engine = anthropic_engine(&setup).await;
    let job = submit(&engine, &lines, CacheSharedPrompt::Off).await;
    let limit = sent(&setup, &engine, job).await.1.len() as u64;

    // Measured with the marks they may carry, they do not fit in one batch of that size.
    let setup = Harness::new().await;
    let engine = setup.anthropic_engine_with(|c| c.max_batch_bytes = Some(limit)).await;
    let job = submit(&engine, &lines, CacheSharedPrompt::Auto).await;
    for _ in 0..5 {
        engine.tick().await.unwrap();
    }
    let tranches = engine.store().job_unfinished_tranches(job).await.unwrap();
    assert!(tranches.len() >= 2, "{tranches:?}");
    let blobs = BlobStore::local(&setup.dir.path().join("blobs"));
    let mut marked = 0;
    for t in &tranches {
        assert_eq!(t.state, TrancheState::Submitted);
        let file = blobs.get(&input_key(t.id)).await.unwrap();
        assert!(file.len() as u64 <= limit, "{} bytes over {limit}", file.len());
        marked += String::from_utf8_lossy(&file).matches("\"cache_control\"").count();
    }
    assert!(marked >= 2, "the shared prompt still goes out marked");
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
    assert_eq!(setup.ledger_by_custom_id().len(), 6);
}
