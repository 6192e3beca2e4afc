//! Crash and fault tests: `tranche worker` killed with SIGKILL at seeded random moments (on
//! SQLite and on PostgreSQL), and providers failing a fifth of their calls; nothing may be
//! lost, repeated or created twice.

#![expect(clippy::unwrap_used, reason = "test helpers fail loudly")]

mod support;

use std::process::Stdio;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use serde_json::Value;
use support::{Env, Shared, Sim, read_results, text};
use tranche_test_support::inputs::{anthropic_lines, tranche_lines};
use tranche_test_support::sim_process::SimProcess;
use tranche_test_support::{postgres, probe};

/// Checks the invariants after a job of `n` requests ran to its end.
fn assert_exactly_once(env: &Env, sim: &SimProcess, job: &str, n: usize) {
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
    let billed = probe::billed(sim.root());
    assert_eq!(billed.len(), n, "every request was run");
    assert!(billed.values().all(|&times| times == 1), "a request was billed twice: {billed:?}");
    // The usage ledger counted every attempt once, whatever moment a worker died at.
    let out = env.tranche().args(["cost", job, "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let cost: Value = serde_json::from_slice(&out.stdout).unwrap();
    let ledger = probe::ledger_tokens(sim.root(), "openai");
    let counted = [&cost["tokens"]["input"], &cost["tokens"]["output"]];
    assert_eq!(counted, [ledger.input, ledger.output], "tokens counted twice or lost: {cost}");
    let batches = probe::batches_by_tranche(&sim.openai, "sk-test-key");
    assert!(
        batches.values().all(|&count| count == 1),
        "a tranche's batch was created twice: {batches:?}"
    );
    assert_eq!(probe::stats(sim.root())["files_live"], 0, "files left at the provider");
    assert_whole_objects(env);
}

/// Every object the store refers to is whole: each raw result file is complete JSONL (the
/// answers above were read from them), and no tranche input file outlived its batch. A writer
/// killed mid-object leaves at most a staging file beside the object's name, never the name.
fn assert_whole_objects(env: &Env) {
    let blobs = env.blob_dir();
    let raw: Vec<_> = std::fs::read_dir(blobs.join("raw"))
        .unwrap()
        .flat_map(|tranche| std::fs::read_dir(tranche.unwrap().path()).unwrap())
        .map(|file| file.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    assert!(!raw.is_empty());
    for path in raw {
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.is_empty() || text.ends_with('\n'), "{} is cut short", path.display());
        for line in text.lines() {
            let parsed: Result<Value, _> = serde_json::from_str(line);
            assert!(parsed.is_ok(), "{} holds a partial line: {line}", path.display());
        }
    }
    let inputs = std::fs::read_dir(blobs.join("tranches"))
        .map(|dir| dir.flat_map(|t| std::fs::read_dir(t.unwrap().path()).unwrap()).count())
        .unwrap_or(0);
    assert_eq!(inputs, 0, "input files outlived their batches");
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
    killed_at_random_moments(&Env::new(), "TRANCHE_CRASH_KILLS", 50);
}

#[test]
fn a_worker_killed_at_random_moments_on_postgresql_loses_repeats_and_doubles_nothing() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let database = runtime.block_on(postgres::scratch());
    let blobs = tempfile::tempdir().unwrap();
    let shared = Shared { database: database.url.clone(), blobs: blobs.path().to_owned() };
    let env = Env::on(&shared);
    killed_at_random_moments(&env, "TRANCHE_PG_CRASH_KILLS", 20);
    assert!(!env.path("state/tranche.db").exists(), "no SQLite database beside PostgreSQL");
}

/// A 300-request job worked by workers SIGKILLed at seeded random moments (`kills_var` sets
/// how many), then finished by one more: exactly once, whole objects.
fn killed_at_random_moments(env: &Env, kills_var: &str, default_kills: usize) {
    let kills: usize =
        std::env::var(kills_var).ok().and_then(|v| v.parse().ok()).unwrap_or(default_kills);
    let seed: u64 =
        std::env::var("TRANCHE_CRASH_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(7);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let sim = Sim::start(&["--speed", "30"]);
    let job = submit(env, 300);
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
    assert_exactly_once(env, &sim, &job, 300);
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
    let lines = anthropic_lines(120);
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
    let billed = probe::billed(sim.root());
    assert_eq!(billed.len(), 120);
    assert!(billed.values().all(|&times| times == 1), "a request was billed twice: {billed:?}");
    let tranches = status["tranches"]["done"].as_u64().unwrap();
    assert_eq!(
        probe::stats(sim.root())["by_provider"]["anthropic"]["batches_created"].as_u64().unwrap(),
        tranches,
        "a batch was created twice"
    );
}
