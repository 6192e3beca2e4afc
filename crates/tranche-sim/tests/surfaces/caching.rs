//! Token counts and prompt caching through the wire: chat usage by the counting convention,
//! OpenAI's automatic caching (1,024 tokens, steps of 128, per model), Anthropic's
//! `cache_control` breakpoints (minimum length, TTLs on the virtual clock, at most 4), and ledger
//! entries that carry every billed token kind and match the result lines.
//!
//! Expected token counts are computed here by hand: `tiktoken-rs` for the tokens of each string,
//! and the convention (3 per message, 3 priming, tools as compact JSON) applied in the test.

use std::collections::HashMap;

use serde_json::{Value, json};

use crate::helpers::{TestSim, frozen, jsonl};

fn o200k(s: &str) -> u64 {
    tiktoken_rs::o200k_base_singleton().encode_ordinary(s).len() as u64
}

fn cl100k(s: &str) -> u64 {
    tiktoken_rs::cl100k_base_singleton().encode_ordinary(s).len() as u64
}

/// Moves the virtual clock through `/sim/clock/advance`.
async fn advance(t: &TestSim, seconds: f64) {
    let r = TestSim::send(
        t.client.post(t.url("/sim/clock/advance")).json(&json!({"seconds": seconds})),
    )
    .await;
    assert!(r.status.is_success(), "{}", r.text);
}

/// `GET /sim/ledger`, by custom_id, for one batch.
async fn ledger(t: &TestSim, batch_id: &str) -> HashMap<String, Value> {
    let r = TestSim::send(t.client.get(t.url("/sim/ledger"))).await;
    jsonl(&r.text)
        .into_iter()
        .filter(|e| e["batch_id"] == batch_id)
        .map(|e| (e["custom_id"].as_str().unwrap().to_owned(), e))
        .collect()
}

fn chat(custom_id: &str, body: Value) -> String {
    json!({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body})
        .to_string()
}

/// Runs one OpenAI batch of chat lines to the end: the batch and its output lines by custom_id.
async fn run_openai(t: &TestSim, lines: &[String]) -> (Value, HashMap<String, Value>) {
    let oai = t.openai();
    let file = oai.upload(&(lines.join("\n") + "\n")).await;
    let b = oai.create(&file, "/v1/chat/completions").await;
    advance(t, 60.0).await;
    let b = oai.batch(b["id"].as_str().unwrap()).await;
    assert_eq!(b["status"], "completed", "{b}");
    let out = jsonl(&oai.content(b["output_file_id"].as_str().unwrap()).await)
        .into_iter()
        .map(|l| (l["custom_id"].as_str().unwrap().to_owned(), l["response"]["body"].clone()))
        .collect();
    (b, out)
}

/// A system prompt of about `n` hundred tokens.
fn policy(n: usize) -> String {
    "Refunds take five business days; parcels ship within two days of the order. ".repeat(n * 7)
}

fn system_and_user(model: &str, system: &str, user: &str) -> Value {
    json!({"model": model, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": user}]})
}

/// Chat input tokens of a system and a user message by the convention, in o200k tokens.
fn system_and_user_tokens(system: &str, user: &str) -> u64 {
    3 + (3 + o200k("system") + o200k(system)) + (3 + o200k("user") + o200k(user))
}

#[tokio::test]
async fn chat_usage_follows_the_counting_convention() {
    let t = TestSim::new(frozen()).await;
    let tools = json!([{"type": "function", "function": {"name": "lookup_order",
        "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}}}]);
    let body = json!({"model": "gpt-4o-mini", "tools": tools, "messages": [
        {"role": "system", "content": "You label support tickets."},
        {"role": "user", "name": "ann", "content": [
            {"type": "text", "text": "Where is order 1234? "},
            {"type": "image_url", "image_url": {"url": "https://example.com/x.png"}},
            {"type": "text", "text": "It is late."}]}]});
    let (b, out) = run_openai(&t, &[chat("c0", body)]).await;
    let expected = 3
        + (3 + o200k("system") + o200k("You label support tickets."))
        + (3 + o200k("user") + o200k("Where is order 1234? It is late.") + o200k("ann") + 1)
        + o200k(&serde_json::to_string(&tools).unwrap());
    let body = &out["c0"];
    let usage = &body["usage"];
    assert_eq!(usage["prompt_tokens"], expected, "{usage}");
    let answer = body["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(usage["completion_tokens"], o200k(answer));
    assert_eq!(usage["total_tokens"], expected + o200k(answer));
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(usage["completion_tokens_details"]["reasoning_tokens"], 0);
    assert_eq!(b["usage"]["input_tokens"], expected);
    assert_eq!(b["usage"]["output_tokens"], o200k(answer));

    // gpt-4 counts in cl100k tokens.
    let (_, out) =
        run_openai(&t, &[chat("c1", system_and_user("gpt-4", "Be brief.", "naïve café, 東京"))])
            .await;
    let want = 3
        + (3 + cl100k("system") + cl100k("Be brief."))
        + (3 + cl100k("user") + cl100k("naïve café, 東京"));
    assert_eq!(out["c1"]["usage"]["prompt_tokens"], want);
}

#[tokio::test]
async fn openai_caches_prompts_of_1024_tokens_in_steps_of_128() {
    let t = TestSim::new(frozen()).await;
    // Short prompts are never cached, however often they repeat.
    let short = policy(2);
    assert!(system_and_user_tokens(&short, "Ticket 0") < 1_024);
    let lines: Vec<String> = (0..5)
        .map(|i| {
            chat(&format!("s{i}"), system_and_user("gpt-4o-mini", &short, &format!("Ticket {i}")))
        })
        .collect();
    for _ in 0..2 {
        let (b, out) = run_openai(&t, &lines).await;
        assert_eq!(b["usage"]["input_tokens_details"]["cached_tokens"], 0);
        assert!(out.values().all(|o| o["usage"]["prompt_tokens_details"]["cached_tokens"] == 0));
    }

    // A long shared system prompt: the first line to run writes, the others read.
    let long = policy(20);
    let lines: Vec<String> = (0..5)
        .map(|i| {
            chat(&format!("l{i}"), system_and_user("gpt-4o-mini", &long, &format!("Ticket {i}")))
        })
        .collect();
    let (b, out) = run_openai(&t, &lines).await;
    let mut cached_sum = 0;
    let mut misses = 0;
    for (id, o) in &out {
        let u = &o["usage"];
        let total = u["prompt_tokens"].as_u64().unwrap();
        assert_eq!(total, system_and_user_tokens(&long, &format!("Ticket {}", &id[1..])));
        let cached = u["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
        if cached == 0 {
            misses += 1;
        } else {
            assert!(cached >= 1_024 && cached % 128 == 0 && cached < total, "{u}");
            // The system prompt is shared; the user message is not.
            assert!(total - cached < 128 + 20, "{u}");
        }
        cached_sum += cached;
    }
    assert_eq!(misses, 1);
    assert_eq!(b["usage"]["input_tokens_details"]["cached_tokens"], cached_sum);

    // The ledger entries carry the usage of the result lines.
    let entries = ledger(&t, b["id"].as_str().unwrap()).await;
    assert_eq!(entries.len(), 5);
    for (id, o) in &out {
        let (u, e) = (&o["usage"], &entries[id]);
        assert_eq!(e["provider"], "openai");
        assert_eq!(e["outcome"], "succeeded");
        assert_eq!(e["model"], o["model"]);
        assert_eq!(e["input_tokens"], u["prompt_tokens"]);
        assert_eq!(e["cached_tokens"], u["prompt_tokens_details"]["cached_tokens"]);
        assert_eq!(e["output_tokens"], u["completion_tokens"]);
        assert_eq!(e["reasoning_tokens"], 0);
        assert_eq!(
            (&e["cache_write_5m_tokens"], &e["cache_write_1h_tokens"]),
            (&json!(0), &json!(0))
        );
    }

    // The same prompt for another model: no hit. For the same model in a later batch: a hit.
    let (_, out) =
        run_openai(&t, &[chat("m0", system_and_user("gpt-4.1-mini", &long, "Ticket 9"))]).await;
    assert_eq!(out["m0"]["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let (_, out) =
        run_openai(&t, &[chat("m1", system_and_user("gpt-4o-mini", &long, "Ticket 9"))]).await;
    assert!(
        out["m1"]["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() >= 1_024
    );
}

const SONNET: &str = "claude-sonnet-4-5";

fn marked(text: &str, ttl: Option<&str>) -> Value {
    let mut cc = json!({"type": "ephemeral"});
    if let Some(ttl) = ttl {
        cc["ttl"] = json!(ttl);
    }
    json!({"type": "text", "text": text, "cache_control": cc})
}

fn message(custom_id: &str, model: &str, system: Value, user: &str) -> Value {
    json!({"custom_id": custom_id, "params": {"model": model, "max_tokens": 64, "system": system,
        "messages": [{"role": "user", "content": user}]}})
}

/// Anthropic input tokens by the convention (cl100k stands in for Claude's tokenizer).
fn anthropic_tokens(system: &str, user: &str) -> u64 {
    3 + (3 + cl100k("system") + cl100k(system)) + (3 + cl100k("user") + cl100k(user))
}

/// Runs one Anthropic batch to the end: its results by custom_id, and its ledger entries.
async fn run_anthropic(
    t: &TestSim,
    requests: Vec<Value>,
) -> (HashMap<String, Value>, HashMap<String, Value>) {
    let ant = t.anthropic();
    let b = ant.create(requests).await;
    let id = b["id"].as_str().unwrap().to_owned();
    advance(t, 60.0).await;
    assert_eq!(ant.batch(&id).await["processing_status"], "ended");
    let results = ant
        .results(&id)
        .await
        .into_iter()
        .map(|r| (r["custom_id"].as_str().unwrap().to_owned(), r["result"].clone()))
        .collect();
    (results, ledger(t, &id).await)
}

/// The cache fields of a succeeded result: (read, 5-minute writes, 1-hour writes, uncached).
fn cache_use(result: &Value) -> (u64, u64, u64, u64) {
    assert_eq!(result["type"], "succeeded", "{result}");
    let u = &result["message"]["usage"];
    let n = |v: &Value| v.as_u64().unwrap();
    let (w5, w1) = (
        n(&u["cache_creation"]["ephemeral_5m_input_tokens"]),
        n(&u["cache_creation"]["ephemeral_1h_input_tokens"]),
    );
    assert_eq!(n(&u["cache_creation_input_tokens"]), w5 + w1, "{u}");
    (n(&u["cache_read_input_tokens"]), w5, w1, n(&u["input_tokens"]))
}

/// A ledger entry carries the usage of its result line.
fn assert_entry_matches(entry: &Value, result: &Value) {
    let (read, w5, w1, uncached) = cache_use(result);
    let u = &result["message"]["usage"];
    assert_eq!(entry["provider"], "anthropic");
    assert_eq!(entry["model"], result["message"]["model"]);
    assert_eq!(entry["input_tokens"], uncached + read + w5 + w1, "{entry} {u}");
    assert_eq!(entry["cached_tokens"], read);
    assert_eq!(entry["cache_write_5m_tokens"], w5);
    assert_eq!(entry["cache_write_1h_tokens"], w1);
    assert_eq!(entry["output_tokens"], u["output_tokens"]);
    assert_eq!(entry["reasoning_tokens"], 0);
}

#[tokio::test]
async fn anthropic_without_cache_control_never_caches() {
    let t = TestSim::new(frozen()).await;
    let doc = policy(20);
    let reqs = || {
        (0..4).map(|i| message(&format!("r{i}"), SONNET, json!(doc), &format!("Q{i}"))).collect()
    };
    for _ in 0..2 {
        let (results, entries) = run_anthropic(&t, reqs()).await;
        for (id, r) in &results {
            let (read, w5, w1, uncached) = cache_use(r);
            assert_eq!((read, w5, w1), (0, 0, 0), "{r}");
            assert_eq!(uncached, anthropic_tokens(&doc, &format!("Q{}", &id[1..])));
            assert_entry_matches(&entries[id], r);
        }
    }
}

#[tokio::test]
async fn anthropic_breakpoints_write_once_then_read() {
    let t = TestSim::new(frozen()).await;
    let doc = policy(20);
    let reqs = (0..4)
        .map(|i| message(&format!("r{i}"), SONNET, json!([marked(&doc, None)]), &format!("Q{i}")))
        .collect();
    let (results, entries) = run_anthropic(&t, reqs).await;
    // The system message up to its end is the breakpoint's prefix.
    let prefix = 3 + cl100k("system") + cl100k(&doc);
    let mut writes = 0;
    for (id, r) in &results {
        let (read, w5, w1, uncached) = cache_use(r);
        assert_eq!(read + w5 + w1 + uncached, anthropic_tokens(&doc, &format!("Q{}", &id[1..])));
        assert_eq!(w1, 0);
        if w5 > 0 {
            writes += 1;
            assert_eq!((w5, read), (prefix, 0), "{r}");
        } else {
            assert_eq!(read, prefix, "{r}");
        }
        assert_entry_matches(&entries[id], r);
    }
    assert_eq!(writes, 1, "the first request to run writes, the others read");

    // Below Sonnet's 1,024-token minimum: nothing cached, no error.
    let short = policy(2);
    let reqs = (0..3)
        .map(|i| message(&format!("s{i}"), SONNET, json!([marked(&short, None)]), "Q"))
        .collect();
    let (results, _) = run_anthropic(&t, reqs).await;
    for r in results.values() {
        assert_eq!(cache_use(r), (0, 0, 0, anthropic_tokens(&short, "Q")));
    }
    // The same long prompt is below Haiku 4.5's 4,096-token minimum.
    let reqs = (0..2)
        .map(|i| message(&format!("h{i}"), "claude-haiku-4-5", json!([marked(&doc, None)]), "Q"))
        .collect();
    let (results, _) = run_anthropic(&t, reqs).await;
    assert!(results.values().all(|r| cache_use(r).0 + cache_use(r).1 == 0));
}

#[tokio::test]
async fn anthropic_ttls_split_writes_and_expire_on_the_virtual_clock() {
    let t = TestSim::new(frozen()).await;
    let (five, hour) = (policy(20), format!("Hourly. {}", policy(20)));
    let reqs = |q: &str| {
        vec![
            message("five", SONNET, json!([marked(&five, None)]), q),
            message("hour", SONNET, json!([marked(&hour, Some("1h"))]), q),
        ]
    };
    let (results, entries) = run_anthropic(&t, reqs("first")).await;
    let (read, w5, w1, _) = cache_use(&results["five"]);
    assert!(read == 0 && w5 > 1_024 && w1 == 0);
    let (read, w5, w1, _) = cache_use(&results["hour"]);
    assert!(read == 0 && w5 == 0 && w1 > 1_024);
    assert_eq!(entries["hour"]["cache_write_1h_tokens"], w1);
    assert_entry_matches(&entries["hour"], &results["hour"]);

    // A minute later both are read (and the reads refresh them).
    let (results, _) = run_anthropic(&t, reqs("second")).await;
    assert!(cache_use(&results["five"]).0 > 1_024);
    assert!(cache_use(&results["hour"]).0 > 1_024);

    // Past five minutes without use: the 5-minute entry is written again, the 1-hour one read.
    advance(&t, 400.0).await;
    let (results, entries) = run_anthropic(&t, reqs("third")).await;
    let (read, w5, _, _) = cache_use(&results["five"]);
    assert!(read == 0 && w5 > 1_024, "{}", results["five"]);
    assert!(cache_use(&results["hour"]).0 > 1_024);
    assert_entry_matches(&entries["five"], &results["five"]);

    // Past an hour the 1-hour entry is gone too.
    advance(&t, 3_700.0).await;
    let (results, _) = run_anthropic(&t, reqs("fourth")).await;
    assert!(cache_use(&results["hour"]).2 > 1_024);
}

#[tokio::test]
async fn more_than_four_breakpoints_is_an_errored_unbilled_line() {
    let t = TestSim::new(frozen()).await;
    let blocks =
        |n: usize| json!((0..n).map(|i| marked(&format!("Part {i}. "), None)).collect::<Vec<_>>());
    let four = json!({"custom_id": "four", "params": {"model": SONNET, "max_tokens": 16,
        "messages": [{"role": "user", "content": blocks(4)}]}});
    let five = json!({"custom_id": "five", "params": {"model": SONNET, "max_tokens": 16,
        "messages": [{"role": "user", "content": blocks(5)}]}});
    let (results, entries) = run_anthropic(&t, vec![four, five]).await;
    assert_eq!(results["four"]["type"], "succeeded");
    let err = &results["five"];
    assert_eq!(err["type"], "errored");
    assert_eq!(err["error"]["error"]["type"], "invalid_request_error");
    assert_eq!(
        err["error"]["error"]["message"],
        "A maximum of 4 blocks with cache_control may be provided. Found 5."
    );
    let e = &entries["five"];
    assert_eq!(e["outcome"], "failed_invalid");
    assert_eq!(e["model"], SONNET);
    for key in [
        "input_tokens",
        "cached_tokens",
        "cache_write_5m_tokens",
        "cache_write_1h_tokens",
        "output_tokens",
    ] {
        assert_eq!(e[key], 0, "{key}");
    }
    assert_eq!(t.sim.stats().by_provider.anthropic.requests_billed, 1);
}
