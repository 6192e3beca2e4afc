//! Crash and fault tests: `tranche worker` killed with SIGKILL at seeded random moments, and
//! providers failing a fifth of their calls; nothing may be lost, repeated or created twice.

#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test helpers fail loudly"
)]

mod support;

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use serde_json::Value;
use support::{Env, Sim, read_results, text, tranche_lines};

fn get(url: &str) -> String {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async { reqwest::get(url).await.unwrap().text().await.unwrap() })
}

/// Every batch the simulator holds for `provider`, by the tranche id in its metadata.
fn batches_by_tranche(sim: &Sim) -> BTreeMap<String, usize> {
    let mut by_tranche = BTreeMap::new();
    let mut after: Option<String> = None;
    loop {
        let mut url = format!("{}/batches?limit=100", sim.openai);
        if let Some(after) = &after {
            url.push_str(&format!("&after={after}"));
        }
        let page: Value = serde_json::from_str(&get_authed(&url)).unwrap();
        for batch in page["data"].as_array().unwrap() {
            let tranche = batch["metadata"]["tranche_id"].as_str().unwrap_or("none").to_owned();
            *by_tranche.entry(tranche).or_insert(0) += 1;
        }
        if page["has_more"] != true {
            return by_tranche;
        }
        after = page["last_id"].as_str().map(str::to_owned);
    }
}

/// A GET with the test key, repeated through the faults the simulator injects.
fn get_authed(url: &str) -> String {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let client = reqwest::Client::new();
        for _ in 0..100 {
            if let Ok(response) = client.get(url).bearer_auth("sk-test-key").send().await
                && response.status().is_success()
                && let Ok(text) = response.text().await
            {
                return text;
            }
        }
        panic!("GET {url} kept failing")
    })
}

/// How many times the simulator billed each custom id.
fn billed(sim: &Sim) -> BTreeMap<String, usize> {
    let base = sim.openai.trim_end_matches("/v1");
    let mut billed = BTreeMap::new();
    for line in get(&format!("{base}/sim/ledger")).lines() {
        let entry: Value = serde_json::from_str(line).unwrap();
        if entry["outcome"] == "succeeded" {
            *billed.entry(entry["custom_id"].as_str().unwrap().to_owned()).or_insert(0) += 1;
        }
    }
    billed
}

fn stats(sim: &Sim) -> Value {
    let base = sim.openai.trim_end_matches("/v1");
    serde_json::from_str(&get(&format!("{base}/sim/stats"))).unwrap()
}

/// Checks the invariants after a job of `n` requests ran to its end.
fn assert_exactly_once(env: &Env, sim: &Sim, job: &str, n: usize) {
    let status = env.status_json(Some(job));
    let counts = &status["counts"];
    assert_eq!(status["state"], "done", "{status}");
    assert_eq!(counts["accepted"], n as u64);
    assert_eq!(counts["succeeded"], n as u64, "{status}");
    let out = env
        .tranche()
        .args(["results", job, "--out", env.path("r.jsonl").to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let results = read_results(&env.path("r.jsonl"));
    assert_eq!(results.len(), n);
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r["status"], "succeeded");
        let answer = r["output"]["choices"][0]["message"]["content"].as_str().unwrap();
        assert!(
            answer.contains(&format!("\"doc:{i} says hello")),
            "result {i} is another request's answer"
        );
    }
    let billed = billed(sim);
    assert_eq!(billed.len(), n, "every request was run");
    assert!(billed.values().all(|&times| times == 1), "a request was billed twice: {billed:?}");
    let batches = batches_by_tranche(sim);
    assert!(
        batches.values().all(|&count| count == 1),
        "a tranche's batch was created twice: {batches:?}"
    );
    assert_eq!(stats(sim)["files_live"], 0, "files left at the provider");
}

fn submit(env: &Env, n: usize) -> String {
    let input = env.write("input.jsonl", &tranche_lines(n));
    let out = env
        .tranche()
        .args(["submit", input.to_str().unwrap(), "--task", "greet"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8(out.stdout).unwrap().lines().last().unwrap().trim().to_owned()
}

#[test]
fn a_worker_killed_at_random_moments_loses_repeats_and_doubles_nothing() {
    let kills: usize =
        std::env::var("TRANCHE_CRASH_KILLS").ok().and_then(|v| v.parse().ok()).unwrap_or(50);
    let seed: u64 =
        std::env::var("TRANCHE_CRASH_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(7);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let sim = Sim::start(&["--speed", "30"]);
    let env = Env::new();
    let job = submit(&env, 300);
    let worker = |until_idle: bool| {
        let mut cmd = env.tranche();
        cmd.args([
            "worker",
            "--base-url",
            &sim.openai,
            "--poll-interval",
            "0.02",
            "--max-batch-requests",
            "40",
            // A killed worker's leases lapse after a second; the next one takes over then.
            "--lease",
            "1",
        ]);
        if until_idle {
            cmd.arg("--until-idle");
        }
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        cmd
    };
    for _ in 0..kills {
        let mut child = worker(false).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(rng.random_range(15..220)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
    }
    let out = worker(true).stdout(Stdio::piped()).stderr(Stdio::piped()).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_exactly_once(&env, &sim, &job, 300);
}

#[test]
fn a_fifth_of_provider_calls_failing_changes_no_result() {
    // Besides 429s, 500s and dropped connections, a third of uploads and creates are carried
    // out but their answers lost: only adoption keeps those from being done twice.
    let env = Env::new();
    let config = env.write(
        "faults.json",
        r#"{"seed": 11, "faults": [
            {"provider": "any", "operation": "any", "status": 429, "rate": 0.07, "retry_after": 0},
            {"provider": "any", "operation": "any", "status": 500, "rate": 0.07},
            {"provider": "any", "operation": "any", "status": 0, "kind": "drop", "rate": 0.06},
            {"provider": "any", "operation": "upload", "kind": "drop_after", "rate": 0.3},
            {"provider": "any", "operation": "create", "kind": "drop_after", "rate": 0.3}
        ]}"#,
    );
    let sim = Sim::start(&["--config", config.to_str().unwrap(), "--speed", "30"]);
    let job = submit(&env, 200);
    let out = env
        .tranche()
        .args([
            "worker",
            "--until-idle",
            "--base-url",
            &sim.openai,
            "--poll-interval",
            "0.02",
            "--max-batch-requests",
            "25",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_exactly_once(&env, &sim, &job, 200);
}

#[test]
fn anthropic_overload_and_lost_creates_change_no_result() {
    let env = Env::new();
    let config = env.write(
        "faults.json",
        r#"{"seed": 5, "faults": [
            {"provider": "anthropic", "operation": "any", "status": 529, "rate": 0.1},
            {"provider": "anthropic", "operation": "any", "status": 500, "rate": 0.05},
            {"provider": "anthropic", "operation": "any", "status": 0, "kind": "drop", "rate": 0.05},
            {"provider": "anthropic", "operation": "create", "kind": "drop_after", "rate": 0.6}
        ]}"#,
    );
    let sim = Sim::start(&["--config", config.to_str().unwrap(), "--speed", "30"]);
    let lines: String = (0..120)
        .map(|i| {
            format!(
                "{}\n",
                serde_json::json!({"key": format!("doc:{i}"), "body": {"model": "claude-sonnet-4-5", "max_tokens": 32,
                    "messages": [{"role": "user", "content": format!("doc:{i} says hello")}]}})
            )
        })
        .collect();
    let input = env.write("input.jsonl", &lines);
    let out = env
        .tranche()
        .args([
            "run",
            input.to_str().unwrap(),
            "--task",
            "greet",
            "--provider",
            "anthropic",
            "--base-url",
            &sim.anthropic,
        ])
        .args(["--poll-interval", "0.02", "--max-batch-requests", "25", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["counts"]["succeeded"], 120, "{status}");
    let billed = billed(&sim);
    assert_eq!(billed.len(), 120);
    assert!(billed.values().all(|&times| times == 1), "a request was billed twice: {billed:?}");
    let tranches = status["tranches"]["done"].as_u64().unwrap();
    assert_eq!(
        stats(&sim)["by_provider"]["anthropic"]["batches_created"].as_u64().unwrap(),
        tranches,
        "a batch was created twice"
    );
}
