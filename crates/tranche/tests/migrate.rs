//! `tranche migrate --to postgres://...`: a SQLite store with a finished job and a waiting one
//! moves into an empty PostgreSQL database; status and results read the same there, a worker
//! on PostgreSQL finishes the waiting job, and bad targets are refused as usage errors.

#![expect(clippy::unwrap_used, reason = "test helpers fail loudly")]

mod support;

use serde_json::Value;
use support::{Env, Sim, text};
use tranche_test_support::inputs::tranche_lines;
use tranche_test_support::postgres;

fn status(env: &Env, db: Option<&str>, job: &str) -> Value {
    let mut cmd = env.tranche();
    if let Some(db) = db {
        cmd.args(["--db", db]);
    }
    let out = cmd.args(["status", "--json", job]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn results(env: &Env, db: Option<&str>, job: &str) -> Vec<u8> {
    let mut cmd = env.tranche();
    if let Some(db) = db {
        cmd.args(["--db", db]);
    }
    let out = cmd.args(["results", job]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    out.stdout
}

#[test]
fn a_sqlite_store_moves_to_postgres_and_its_jobs_go_on_there() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let database = runtime.block_on(postgres::scratch());
    let url = database.url.clone();
    let sim = Sim::start(&[]);
    let env = Env::new();

    // A job run to the end on SQLite, and one accepted but not run.
    let input = env.write("input.jsonl", &tranche_lines(30));
    let out = env
        .tranche()
        .args(["run", input.to_str().unwrap(), "--task", "greet", "--json"])
        .args(["--base-url", &sim.openai, "--poll-interval", "0.05"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let done: Value = serde_json::from_slice(&out.stdout).unwrap();
    let first = done["job_id"].as_str().unwrap().to_owned();
    let out = env
        .tranche()
        .args(["submit", input.to_str().unwrap(), "--task", "other", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let submitted: Value = serde_json::from_slice(&out.stdout).unwrap();
    let second = submitted["job_id"].as_str().unwrap().to_owned();
    let before = [status(&env, None, &first), status(&env, None, &second)];
    let first_results = results(&env, None, &first);
    assert_eq!(first_results.split(|&b| b == b'\n').filter(|l| !l.is_empty()).count(), 30);

    // Bad targets are usage errors, and leave the database empty.
    for bad in ["mysql://root@127.0.0.1/db", "elsewhere.db"] {
        let out = env.tranche().args(["migrate", "--to", bad]).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}: {}", text(&out));
        assert!(String::from_utf8_lossy(&out.stderr).contains("postgres://"), "{}", text(&out));
    }
    let out = env.tranche().args(["--db", &url, "migrate", "--to", &url]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "a PostgreSQL source: {}", text(&out));

    let out = env.tranche().args(["migrate", "--to", &url, "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["tables"]["jobs"], 2, "{report}");
    assert_eq!(report["tables"]["requests"], 60, "{report}");
    assert!(report["tables"]["tranches"].as_u64().unwrap() >= 1, "{report}");
    assert!(report["tables"]["attempts"].as_u64().unwrap() >= 30, "{report}");

    // The same jobs, counts and results on PostgreSQL, with the same data folder's blobs.
    let after = [status(&env, Some(&url), &first), status(&env, Some(&url), &second)];
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(a["state"], b["state"]);
        assert_eq!(a["counts"], b["counts"]);
        assert_eq!(a["tranches"], b["tranches"]);
        assert_eq!(a["tokens"], b["tokens"]);
    }
    assert_eq!(results(&env, Some(&url), &first), first_results);

    // A second migration into the now full database is refused.
    let out = env.tranche().args(["migrate", "--to", &url]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("empty"), "{}", text(&out));

    // A worker on PostgreSQL finishes the waiting job.
    let out = env
        .tranche()
        .args(["--db", &url, "worker", "--until-idle", "--poll-interval", "0.05"])
        .args(["--base-url", &sim.openai])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let finished = status(&env, Some(&url), &second);
    assert_eq!(finished["state"], "done", "{finished}");
    assert_eq!(finished["counts"]["succeeded"], 30, "{finished}");
    assert_eq!(results(&env, Some(&url), &first), first_results);
    drop(database);
}
