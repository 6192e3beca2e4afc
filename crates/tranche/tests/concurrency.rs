//! Many engines on one store: three `tranche worker` processes, a `tranche run` of a second job
//! and a `tranche cancel` of a third, with workers SIGKILLed at seeded random moments. Nothing
//! may be uploaded or created twice, every request ends in one terminal state, and no engine
//! stops with an error because another one had the database.

#![expect(clippy::unwrap_used, reason = "test helpers fail loudly")]

mod support;

use std::fs::File;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use serde_json::Value;
use support::{Env, Sim, text};
use tranche_test_support::inputs::task_lines;
use tranche_test_support::probe;
use tranche_test_support::sim_process::SimProcess;

fn submit(env: &Env, task: &str, n: usize) -> String {
    let input = env.write(&format!("{task}.jsonl"), &task_lines(task, n));
    let out = env
        .tranche()
        .args(["submit", input.to_str().unwrap(), "--task", task, "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    answer["job_id"].as_str().unwrap().to_owned()
}

/// The engine flags every process shares: fast polls, short leases (a killed worker's work
/// resumes a second later), small batches (many tranches to race for).
const ENGINE: [&str; 6] = ["--poll-interval", "0.02", "--lease", "1", "--max-batch-requests", "40"];

struct Workers<'a> {
    env: &'a Env,
    sim: &'a SimProcess,
    children: Vec<Child>,
    spawned: usize,
    /// When the newest worker was started.
    last_spawn: Instant,
}

impl Workers<'_> {
    fn spawn(&mut self) -> Child {
        self.spawned += 1;
        self.last_spawn = Instant::now();
        let log = File::create(self.env.path(&format!("worker-{}.log", self.spawned))).unwrap();
        self.env
            .tranche()
            .args(["worker", "--base-url", &self.sim.openai])
            .args(ENGINE)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap()
    }
}

impl Drop for Workers<'_> {
    /// A failed assertion must not leave workers running.
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Kills the child when dropped, unless it has ended.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits for the child until the deadline; past it, fails with every log the test's processes
/// wrote, so that a hang can be read from CI's output.
fn wait_with_deadline(env: &Env, child: &mut Child, deadline: Instant) -> std::process::ExitStatus {
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "a process did not finish in time\n{}", logs(env));
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn workers_a_run_and_a_cancel_on_one_store_repeat_and_lose_nothing() {
    let kills: usize =
        std::env::var("TRANCHE_CONCURRENCY_KILLS").ok().and_then(|v| v.parse().ok()).unwrap_or(12);
    let seed: u64 =
        std::env::var("TRANCHE_CONCURRENCY_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let sim = Sim::start(&["--speed", "30"]);
    let env = Env::new();
    let worked = submit(&env, "worked", 600);
    let cancelled = submit(&env, "cancelled", 300);

    let run_input = env.write("run.jsonl", &task_lines("run", 600));
    let mut run = Reaped(
        env.tranche()
            .args(["run", run_input.to_str().unwrap(), "--task", "run", "--json"])
            .args(["--base-url", &sim.openai])
            .args(ENGINE)
            .stdout(Stdio::piped())
            .stderr(File::create(env.path("run.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let mut workers = Workers {
        env: &env,
        sim: &sim,
        children: Vec::new(),
        spawned: 0,
        last_spawn: Instant::now(),
    };
    for _ in 0..3 {
        let child = workers.spawn();
        workers.children.push(child);
    }
    // The cancel comes while the engines are busy with the job (its batches take a few
    // seconds at this speed), amid the first kills.
    std::thread::sleep(Duration::from_millis(rng.random_range(100..400)));
    let out = env.tranche().args(["cancel", &cancelled]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    for _ in 0..kills {
        std::thread::sleep(Duration::from_millis(rng.random_range(40..400)));
        let victim = rng.random_range(0..workers.children.len());
        let mut child = workers.children.swap_remove(victim);
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let replacement = workers.spawn();
        workers.children.push(replacement);
    }

    let deadline = Instant::now() + Duration::from_secs(240);
    let status = wait_with_deadline(&env, &mut run.0, deadline);
    let mut stdout = String::new();
    std::io::Read::read_to_string(run.0.stdout.as_mut().unwrap(), &mut stdout).unwrap();
    assert!(status.success(), "tranche run: {status}\n{stdout}\n{}", log(&env, "run.log"));
    let run_status: Value = serde_json::from_str(&stdout).unwrap();
    let run_job = run_status["job_id"].as_str().unwrap().to_owned();

    // The surviving workers stop cleanly on SIGTERM; a last one finishes whatever is left. A
    // worker listens for it from its start, once the process is running: the newest may have
    // been spawned just now, so it is given a moment to start.
    std::thread::sleep(Duration::from_millis(500).saturating_sub(workers.last_spawn.elapsed()));
    for mut child in std::mem::take(&mut workers.children) {
        let pid = child.id().to_string();
        assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        let status = wait_with_deadline(&env, &mut child, Instant::now() + Duration::from_secs(60));
        assert!(status.success(), "a worker stopped with {status}");
    }
    let out = env
        .tranche()
        .args(["worker", "--until-idle", "--base-url", &sim.openai])
        .args(ENGINE)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));

    // No process gave up because another had the database.
    for n in 1..=workers.spawned {
        let log = log(&env, &format!("worker-{n}.log"));
        // The CLI reports what stopped it on a line of its own starting `error:`.
        assert!(!log.lines().any(|l| l.starts_with("error:")), "worker {n} failed:\n{log}");
        assert!(!log.contains("database is locked") || log.contains("trying again"), "{log}");
    }

    // Every request ended in exactly one terminal state.
    for (job, n) in [(&worked, 600u64), (&run_job, 600)] {
        let status = env.status_json(Some(job));
        assert_eq!(status["state"], "done", "{status}");
        assert_eq!(status["counts"]["succeeded"], n, "{status}");
        assert_eq!(status["counts"]["pending"], 0);
    }
    let status = env.status_json(Some(&cancelled));
    assert_eq!(status["state"], "cancelled", "{status}");
    let counts = &status["counts"];
    let ended = ["succeeded", "failed", "cancelled"].map(|k| counts[k].as_u64().unwrap());
    assert_eq!(ended.iter().sum::<u64>(), 300, "{status}");
    assert_eq!(counts["pending"], 0);

    // At the provider: each tranche's file uploaded once, its batch created once, each
    // request billed at most once (exactly once for the jobs that ran), no file left.
    let by_name = probe::uploads_by_name(sim.root());
    assert!(by_name.values().all(|&n| n == 1), "an input file was uploaded twice: {by_name:?}");
    let by_tranche = probe::batches_by_tranche(&sim.openai, "sk-test-key");
    for tranche in by_tranche.keys() {
        assert!(by_name.contains_key(&format!("tranche-{tranche}.jsonl")), "{tranche}");
    }
    assert!(by_tranche.values().all(|&n| n == 1), "a batch was created twice: {by_tranche:?}");
    let billed = probe::billed(sim.root());
    assert!(billed.values().all(|&n| n == 1), "a request was billed twice");
    for task in ["worked", "run"] {
        let ran = billed.keys().filter(|id| id.ends_with(&format!(":{task}:v1"))).count();
        assert_eq!(ran, 600, "{task}");
    }
    assert_eq!(probe::stats(sim.root())["files_live"], 0, "files left at the provider");
}

fn log(env: &Env, name: &str) -> String {
    std::fs::read_to_string(env.path(name)).unwrap_or_default()
}

/// The last lines of every log in the test's folder, each under its name.
fn logs(env: &Env) -> String {
    let mut names: Vec<String> = std::fs::read_dir(env.dir.path())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".log"))
        .collect();
    names.sort();
    let mut out = String::new();
    for name in names {
        let text = log(env, &name);
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(40)..];
        out.push_str(&format!("--- {name} (last {} of {} lines)\n", tail.len(), lines.len()));
        for line in tail {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}
