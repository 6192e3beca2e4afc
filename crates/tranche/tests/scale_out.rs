//! Scale-out on PostgreSQL: workers on separate data folders (as on separate hosts) share one
//! database and one blob store and nothing else; one is SIGKILLed mid-run and the others
//! finish. Every tranche is created once and every request billed once; status, results and
//! cancel work from any host.

#![expect(clippy::unwrap_used, reason = "test helpers fail loudly")]

mod support;

use std::fs::File;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{Env, Shared, Sim, read_results, text};
use tranche_test_support::inputs::tranche_lines;
use tranche_test_support::postgres::{self, Scratch};
use tranche_test_support::probe;

/// A scratch database and blob store, and the guards that remove them.
fn deployment() -> (Shared, Scratch, tempfile::TempDir) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let database = runtime.block_on(postgres::scratch());
    let blobs = tempfile::tempdir().unwrap();
    let shared = Shared { database: database.url.clone(), blobs: blobs.path().to_owned() };
    (shared, database, blobs)
}

fn submit(host: &Env, n: usize) -> String {
    let input = host.write("input.jsonl", &tranche_lines(n));
    let out = host
        .tranche()
        .args(["submit", input.to_str().unwrap(), "--task", "greet", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    answer["job_id"].as_str().unwrap().to_owned()
}

/// Workers that are killed if the test fails.
struct Workers(Vec<Child>);

impl Drop for Workers {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[test]
fn workers_on_four_hosts_finish_a_job_with_one_of_them_killed() {
    let hosts: usize =
        std::env::var("TRANCHE_SCALE_WORKERS").ok().and_then(|v| v.parse().ok()).unwrap_or(4);
    let n = 600;
    let (shared, _database, _blobs) = deployment();
    let sim = Sim::start(&["--speed", "30"]);
    let job = submit(&Env::on(&shared), n);
    let hosts: Vec<Env> = (0..hosts).map(|_| Env::on(&shared)).collect();
    let mut workers = Workers(
        hosts
            .iter()
            .map(|host| {
                host.tranche()
                    .args(["worker", "--base-url", &sim.openai, "--poll-interval", "0.02"])
                    .args(["--max-batch-requests", "40", "--lease", "1"])
                    .stdout(Stdio::null())
                    .stderr(File::create(host.path("worker.log")).unwrap())
                    .spawn()
                    .unwrap()
            })
            .collect(),
    );
    // One host dies mid-run, holding whatever leases it held.
    let observer = Env::on(&shared);
    std::thread::sleep(Duration::from_millis(250));
    workers.0[0].kill().unwrap(); // SIGKILL
    workers.0[0].wait().unwrap();
    assert_ne!(observer.status_json(Some(&job))["state"], "done", "killed before the end");

    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let status = observer.status_json(Some(&job));
        if status["state"] == "done" {
            break;
        }
        let logs: Vec<String> = hosts
            .iter()
            .map(|h| std::fs::read_to_string(h.path("worker.log")).unwrap_or_default())
            .collect();
        assert!(Instant::now() < deadline, "the job did not finish: {status}\n{logs:#?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    for child in &mut workers.0[1..] {
        let pid = child.id().to_string();
        assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        assert!(child.wait().unwrap().success(), "a worker stopped with an error");
    }

    // Any host reads the job and its results.
    let status = observer.status_json(Some(&job));
    assert_eq!(status["counts"]["succeeded"], n as u64, "{status}");
    let out = observer
        .tranche()
        .args(["results", &job, "--out", observer.path("r.jsonl").to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let results = read_results(&observer.path("r.jsonl"));
    assert_eq!(results.len(), n);
    for (i, r) in results.iter().enumerate() {
        let answer = r["output"]["choices"][0]["message"]["content"].as_str().unwrap();
        assert!(answer.contains(&format!("\"doc:{i} says hello")), "result {i} is another's");
    }
    // Claimed, uploaded and created once each; billed once each.
    let batches = probe::batches_by_tranche(&sim.openai, "sk-test-key");
    assert_eq!(batches.len() as u64, n as u64 / 40);
    assert!(batches.values().all(|&c| c == 1), "a tranche's batch was created twice: {batches:?}");
    let uploads = probe::uploads_by_name(sim.root());
    assert!(uploads.values().all(|&c| c == 1), "a tranche's file was uploaded twice: {uploads:?}");
    let billed = probe::billed(sim.root());
    assert_eq!(billed.len(), n);
    assert!(billed.values().all(|&c| c == 1), "a request was billed twice");
    // No host kept state of its own.
    for host in hosts.iter().chain([&observer]) {
        assert!(!host.path("state/tranche.db").exists());
    }
}

#[test]
fn a_job_submitted_on_one_host_is_cancelled_from_another_and_seen_from_a_third() {
    let (shared, _database, _blobs) = deployment();
    let job = submit(&Env::on(&shared), 5);
    let out = Env::on(&shared).tranche().args(["cancel", &job]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let status = Env::on(&shared).status_json(Some(&job));
    assert_eq!(status["state"], "cancelled", "{status}");
    assert_eq!(status["counts"]["cancelled"], 5);
}

#[test]
fn a_database_of_a_scheme_tranche_does_not_know_is_refused_by_name() {
    let env = Env::new();
    let out =
        env.tranche().args(["status", "--db", "mysql://root@127.0.0.1/test"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("mysql://") && stderr.contains("postgres://"), "{stderr}");
    assert!(!env.path("mysql:").exists(), "nothing was made of it");
}
