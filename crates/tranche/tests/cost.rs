//! `tranche cost` against `tranche sim`: a job's report equals the simulator's billing ledger
//! token for token and the bundled batch prices to a fraction of a cent, for OpenAI (its own
//! prompt cache) and Anthropic (cache writes and reads at `cache_control` breakpoints); answers
//! reused from earlier results show as savings; periods and tenants; the estimate before a job
//! is within a stated tolerance of what it then bills.

#![expect(clippy::unwrap_used, clippy::panic, reason = "a test fails loudly")]

mod support;

use std::collections::BTreeSet;

use serde_json::{Value, json};
use support::{Env, Sim, text};
use tranche_test_support::probe::ledger_tokens;

/// A system prompt far above every cache minimum (about 2,000 tokens).
fn long_prompt() -> String {
    (0..250).map(|i| format!("Rule {i}: answer in one line. ")).collect()
}

/// `n` requests sharing the long system prompt, for `provider`.
fn shared_prompt_lines(provider: &str, n: usize) -> String {
    (0..n)
        .map(|i| {
            let question = format!("doc:{i} says hello");
            let body = match provider {
                "anthropic" => json!({
                    "model": "claude-sonnet-4-5", "max_tokens": 40,
                    "system": [{"type": "text", "text": long_prompt(),
                                "cache_control": {"type": "ephemeral"}}],
                    "messages": [{"role": "user", "content": question}]}),
                _ => json!({
                    "model": "gpt-4o-mini", "max_tokens": 40,
                    "messages": [{"role": "system", "content": long_prompt()},
                                 {"role": "user", "content": question}]}),
            };
            format!("{}\n", json!({"key": format!("doc:{i}"), "body": body}))
        })
        .collect()
}

/// The simulator's ledger for one provider, summed: (input, cached, cache writes, output), and
/// the models it names.
fn ledger(root: &str, provider: &str) -> ([u64; 4], BTreeSet<String>) {
    let t = ledger_tokens(root, provider);
    ([t.input, t.cached_input, t.cache_write_input, t.output], t.models)
}

fn json_out(env: &Env, args: &[&str]) -> Value {
    let out = env.tranche().args(args).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)))
}

/// Runs `input` on `provider` at the simulator, returning the job id.
fn run(env: &Env, sim: &tranche_test_support::sim_process::SimProcess, provider: &str) -> String {
    let base = if provider == "anthropic" { &sim.anthropic } else { &sim.openai };
    let input = env.path("input.jsonl");
    let status = json_out(
        env,
        &[
            "run",
            input.to_str().unwrap(),
            "--task",
            "greet",
            "--provider",
            provider,
            "--base-url",
            base,
            "--poll-interval",
            "0.1",
            "--json",
        ],
    );
    status["job_id"].as_str().unwrap().to_owned()
}

#[track_caller]
fn close(actual: &Value, expected: f64) {
    let actual = actual.as_f64().unwrap_or_else(|| panic!("not a number: {actual}"));
    assert!((actual - expected).abs() < 1e-9, "{actual} != {expected}");
}

/// The exact keys of `tranche cost JOB --json`.
fn assert_keys(report: &Value) {
    let keys: BTreeSet<&str> = report.as_object().unwrap().keys().map(String::as_str).collect();
    let expected =
        ["job_id", "currency", "tokens", "cost", "sync_cost", "savings", "unpriced_models"];
    assert_eq!(keys, expected.into_iter().collect(), "{report}");
    let tokens: BTreeSet<&str> =
        report["tokens"].as_object().unwrap().keys().map(String::as_str).collect();
    let expected = ["input", "cached_input", "cache_write_input", "output"];
    assert_eq!(tokens, expected.into_iter().collect());
    let savings: BTreeSet<&str> =
        report["savings"].as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(savings, ["batch", "cache", "dedup"].into_iter().collect());
}

#[test]
fn an_openai_job_costs_what_the_ledger_bills_and_reused_answers_are_saved() {
    let sim = Sim::start(&[]);
    let env = Env::new();
    env.write("input.jsonl", &shared_prompt_lines("openai", 40));
    let estimate =
        json_out(&env, &["cost", "estimate", "input.jsonl", "--task", "greet", "--json"]);
    let job = run(&env, &sim, "openai");
    let report = json_out(&env, &["cost", &job, "--json"]);
    assert_keys(&report);
    let ([input, cached, written, output], models) = ledger(sim.root(), "openai");
    assert!(cached > 0, "the simulator's cache served the shared prompt");
    assert_eq!(written, 0, "OpenAI bills no cache writes");
    let t = &report["tokens"];
    assert_eq!(
        [t["input"].as_u64(), t["cached_input"].as_u64(), t["output"].as_u64()],
        [Some(input), Some(cached), Some(output)],
        "{report}"
    );
    assert_eq!(t["cache_write_input"], 0);
    assert_eq!(report["currency"], "USD");
    assert_eq!(report["unpriced_models"], json!([]));
    assert_eq!(models.len(), 1, "{models:?}");
    // gpt-4o-mini: $0.15 input, $0.075 cached input, $0.60 output per million; batch half.
    let per_m = |n: u64, usd: f64| n as f64 * usd / 1e6;
    let cost = (per_m(input - cached, 0.15) + per_m(cached, 0.075) + per_m(output, 0.60)) * 0.5;
    let sync = per_m(input, 0.15) + per_m(output, 0.60);
    let sync_cached = per_m(input - cached, 0.15) + per_m(cached, 0.075) + per_m(output, 0.60);
    close(&report["cost"], cost);
    close(&report["sync_cost"], sync);
    close(&report["savings"]["cache"], sync - sync_cached);
    close(&report["savings"]["batch"], sync - (sync - sync_cached) - cost);
    close(&report["savings"]["dedup"], 0.0);

    // The estimate counted the input the simulator billed to within 2% (both count with
    // tiktoken's o200k_base; the provider's message framing is the estimate's convention) and
    // bounded the cost.
    let estimated = estimate["input_tokens"].as_u64().unwrap() as f64;
    assert!((estimated - input as f64).abs() <= 0.02 * input as f64, "{estimate} vs {input}");
    assert_eq!(estimate["requests"], 40);
    assert_eq!(estimate["max_output_tokens"], 40 * 40);
    assert!(estimate["cost_max"].as_f64().unwrap() >= cost, "{estimate}");
    assert!(estimate["sync_cost_max"].as_f64().unwrap() >= sync, "{estimate}");
    // The seed's monthly formula: runs × (input × price × (1 − hit rate × (1 − cached/input)) ×
    // batch + output × price × batch), at the file's worst-case output.
    let monthly = json_out(&env, &["cost", "estimate", "input.jsonl", "--task", "greet", "--json"]);
    assert!(monthly.get("monthly").is_none(), "only when asked");
    let args = ["--per-month", "30", "--cache-hit-rate", "0.5", "--json"];
    let monthly = json_out(
        &env,
        &[&["cost", "estimate", "input.jsonl", "--task", "greet"][..], &args[..]].concat(),
    );
    let (inp, out) = (estimated, estimate["max_output_tokens"].as_f64().unwrap());
    let per_run = (inp * 0.15 * (1.0 - 0.5 * (1.0 - 0.075 / 0.15)) + out * 0.60) / 1e6 * 0.5;
    close(&monthly["monthly"]["cost"], 30.0 * per_run);

    // A re-parse reads the raw results again and counts nothing again.
    let out = env.tranche().args(["reparse", &job]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(json_out(&env, &["cost", &job, "--json"]), report, "a re-parse counts nothing");

    // The same file again: every answer comes from the first job, nothing is billed, and the
    // first job's synchronous price is what dedup saved.
    let again = run(&env, &sim, "openai");
    let second = json_out(&env, &["cost", &again, "--json"]);
    assert_eq!(second["tokens"]["input"], 0, "{second}");
    close(&second["cost"], 0.0);
    close(&second["savings"]["dedup"], sync);
    assert_eq!(ledger(sim.root(), "openai").0[0], input, "nothing billed twice");

    // Since today: both jobs; another tenant: nothing.
    let today = today();
    let period = json_out(&env, &["cost", "--since", &today, "--json"]);
    close(&period["cost"], cost);
    close(&period["savings"]["dedup"], sync);
    let none = json_out(&env, &["cost", "--since", &today, "--tenant", "acme", "--json"]);
    assert_eq!(none["tokens"]["input"], 0);
    // A person's report names the model and the amounts.
    let out = env.tranche().args(["cost", &job]).output().unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("gpt-4o-mini") && shown.contains("saved by batching"), "{shown}");
}

#[test]
fn an_anthropic_job_prices_cache_writes_and_reads() {
    let sim = Sim::start(&[]);
    let env = Env::new();
    env.write("input.jsonl", &shared_prompt_lines("anthropic", 30));
    let estimate = json_out(
        &env,
        &[
            "cost",
            "estimate",
            "input.jsonl",
            "--task",
            "greet",
            "--provider",
            "anthropic",
            "--json",
        ],
    );
    let job = run(&env, &sim, "anthropic");
    let report = json_out(&env, &["cost", &job, "--json"]);
    assert_keys(&report);
    let ([input, read, written, output], _) = ledger(sim.root(), "anthropic");
    assert!(written > 0 && read > 0, "one write, then reads: {written} {read}");
    let t = &report["tokens"];
    let got = [t["input"].as_u64(), t["cached_input"].as_u64(), t["cache_write_input"].as_u64()];
    assert_eq!(got, [Some(input), Some(read), Some(written)], "{report}");
    assert_eq!(t["output"].as_u64(), Some(output));
    // claude-sonnet-4-5: $3 input, $15 output per million; reads 0.1x, 5-minute writes 1.25x,
    // both stacking with the batch's half.
    let per_m = |n: u64, usd: f64| n as f64 * usd / 1e6;
    let uncached = input - read - written;
    let billed_input = per_m(uncached, 3.0) + per_m(read, 0.3) + per_m(written, 3.75);
    let cost = (billed_input + per_m(output, 15.0)) * 0.5;
    let sync = per_m(input, 3.0) + per_m(output, 15.0);
    close(&report["cost"], cost);
    close(&report["sync_cost"], sync);
    close(&report["savings"]["cache"], per_m(input, 3.0) - billed_input);
    // The estimate counts as the simulator does (cl100k_base standing in for Claude's
    // tokenizer), to within 2%, and its worst case covers the bill.
    let estimated = estimate["input_tokens"].as_u64().unwrap() as f64;
    assert!((estimated - input as f64).abs() <= 0.02 * input as f64, "{estimate} vs {input}");
    assert!(estimate["cost_max"].as_f64().unwrap() >= cost, "{estimate}");
}

#[test]
fn a_model_without_a_price_is_unknown_until_a_price_file_names_it() {
    let sim = Sim::start(&[]);
    let env = Env::new();
    let line = json!({"key": "a", "body": {"model": "house-model-7", "max_tokens": 5,
                      "messages": [{"role": "user", "content": "hi"}]}});
    env.write("input.jsonl", &format!("{line}\n"));
    let job = run(&env, &sim, "openai");
    let report = json_out(&env, &["cost", &job, "--json"]);
    assert_eq!(report["unpriced_models"], json!(["house-model-7"]), "{report}");
    assert_eq!(report["cost"], Value::Null, "unknown, never zero");
    assert!(report["tokens"]["input"].as_u64().unwrap() > 0);
    env.write("prices.toml", "[openai.\"house-model-7\"]\ninput = 1.0\noutput = 2.0\n");
    let priced = json_out(&env, &["cost", &job, "--json", "--prices", "prices.toml"]);
    assert_eq!(priced["unpriced_models"], json!([]));
    let t = &priced["tokens"];
    let expected = (t["input"].as_f64().unwrap() + 2.0 * t["output"].as_f64().unwrap()) / 1e6;
    close(&priced["cost"], expected * 0.5);
    // A bad price file is refused by name.
    env.write("bad.toml", "[openai.\"house-model-7\"]\ninput = \"cheap\"\noutput = 2.0\n");
    let out = env.tranche().args(["cost", &job, "--prices", "bad.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("input"), "{}", text(&out));
    // And a bad date.
    let out = env.tranche().args(["cost", "--since", "last week"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

/// Today's date (UTC) as YYYY-MM-DD.
fn today() -> String {
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    now[..10].to_owned()
}

#[test]
fn a_budget_stops_the_job_before_it_costs_more() {
    let sim = Sim::start(&[]);
    let env = Env::new();
    let lines: String = (0..60)
        .map(|i| {
            let body = json!({"model": "gpt-4o-mini", "max_tokens": 40,
                              "messages": [{"role": "user", "content": format!("doc:{i} says hello")}]});
            format!("{}\n", json!({"key": format!("doc:{i}"), "body": body}))
        })
        .collect();
    let input = env.write("input.jsonl", &lines);
    let budget = 0.0002;
    let out = env
        .tranche()
        .args(["run", input.to_str().unwrap(), "--task", "greet", "--base-url", &sim.openai])
        .args(["--poll-interval", "0.1", "--max-batch-requests", "10", "--json"])
        .args(["--budget", &budget.to_string()])
        .output()
        .unwrap();
    let status: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    let job = status["job_id"].as_str().unwrap().to_owned();
    let counts = &status["counts"];
    let (succeeded, cancelled) =
        (counts["succeeded"].as_u64().unwrap(), counts["cancelled"].as_u64().unwrap());
    assert!(succeeded > 10 && cancelled > 0, "stopped mid-job: {status}");
    assert_eq!(succeeded + cancelled, 60, "{status}");
    let report = json_out(&env, &["cost", &job, "--json"]);
    let cost = report["cost"].as_f64().unwrap();
    assert!(cost <= budget, "{cost} > {budget}");
    // What the simulator billed is what the report says, and within the budget.
    let ([input, _, _, output], _) = ledger(sim.root(), "openai");
    let billed = (input as f64 * 0.15 + output as f64 * 0.60) / 1e6 * 0.5;
    assert!((billed - cost).abs() < 1e-9 && billed <= budget, "{billed} vs {cost}");
    // The requests left say why.
    let out = env.tranche().args(["results", &job, "--status", "cancelled"]).output().unwrap();
    let first: Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().next().unwrap()).unwrap();
    assert!(first["error"].to_string().contains("budget_exceeded"), "{first}");

    // A budget on a model without a price is refused at submit, naming the line and model.
    let line = json!({"key": "a", "body": {"model": "house-model-7", "max_tokens": 5,
                      "messages": [{"role": "user", "content": "hi"}]}});
    env.write("unpriced.jsonl", &format!("{line}\n"));
    let out = env
        .tranche()
        .args(["submit", "unpriced.jsonl", "--task", "t", "--budget", "5"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("line 1") && stderr.contains("house-model-7"), "{stderr}");
    let out = env.tranche().args(["submit", "unpriced.jsonl", "--budget", "-1"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    // Nor can a budget bound an image's cost.
    let line = json!({"key": "a", "body": {"model": "gpt-4o-mini", "max_tokens": 5,
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://example.invalid/a.png"}}]}]}});
    env.write("image.jsonl", &format!("{line}\n"));
    let out = env
        .tranche()
        .args(["submit", "image.jsonl", "--task", "t", "--budget", "5"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("image_url"), "{}", text(&out));
}

#[test]
fn a_shared_anthropic_prompt_is_cached_unless_turned_off() {
    // The same long system prompt, unmarked by the user: tranche marks it (auto), so the
    // simulator writes it once and reads it after; with `off` it bills every token as input.
    for (setting, cached) in [("auto", true), ("off", false)] {
        let sim = Sim::start(&[]);
        let env = Env::new();
        let lines: String = (0..20)
            .map(|i| {
                let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 20,
                    "system": long_prompt(),
                    "messages": [{"role": "user", "content": format!("doc:{i} says hello")}]});
                format!("{}\n", json!({"key": format!("doc:{i}"), "body": body}))
            })
            .collect();
        let input = env.write("input.jsonl", &lines);
        let out = env
            .tranche()
            .args(["run", input.to_str().unwrap(), "--task", "greet", "--provider", "anthropic"])
            .args(["--base-url", &sim.anthropic, "--poll-interval", "0.1", "--json"])
            .args(["--cache-shared-prompt", setting])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        let status: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(status["counts"]["succeeded"], 20, "{status}");
        let job = status["job_id"].as_str().unwrap();
        let report = json_out(&env, &["cost", job, "--json"]);
        let ([input, read, written, _], _) = ledger(sim.root(), "anthropic");
        let t = &report["tokens"];
        assert_eq!((t["input"].as_u64(), t["cached_input"].as_u64()), (Some(input), Some(read)));
        assert_eq!(t["cache_write_input"].as_u64(), Some(written));
        if cached {
            assert!(written > 0 && read > written, "one write, reads after: {report}");
            assert!(report["savings"]["cache"].as_f64().unwrap() > 0.0, "{report}");
        } else {
            assert_eq!((read, written), (0, 0), "{report}");
        }
    }
}
