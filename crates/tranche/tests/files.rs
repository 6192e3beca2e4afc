//! `tranche files audit` and `tranche files cleanup` against `tranche sim`: the audit's exact
//! keys and counts match the simulator's own, and cleanup takes other applications' files only
//! when asked.

#![expect(clippy::unwrap_used, reason = "tests fail loudly")]

mod support;

use std::collections::BTreeSet;

use serde_json::Value;
use support::{Env, Sim, text};
use tranche_test_support::foreign::Foreign;
use tranche_test_support::inputs::tranche_lines;
use tranche_test_support::probe;

fn keys(value: &Value) -> BTreeSet<&str> {
    value.as_object().unwrap().keys().map(String::as_str).collect()
}

/// Runs `tranche files ARGS --provider azure` against the simulator's Azure surface; its JSON.
fn files(env: &Env, azure: &str, args: &[&str]) -> Value {
    let out = env
        .tranche()
        .arg("files")
        .args(args)
        .args(["--provider", "azure", "--azure-endpoint", azure, "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn azure_files_live(root: &str) -> u64 {
    probe::stats(root)["by_provider"]["azure"]["files_live"].as_u64().unwrap()
}

#[test]
fn the_audit_matches_the_simulator_and_cleanup_takes_foreign_files_only_when_asked() {
    let sim = Sim::start(&[]);
    let env = Env::new();
    // Another application left two files without expiry.
    let foreign = Foreign::azure(&sim.azure);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let theirs: BTreeSet<String> = runtime.block_on(async {
        BTreeSet::from([
            foreign.upload("old-app.jsonl", None).await,
            foreign.upload("upload", None).await,
        ])
    });
    // A job of tranche's runs to the end and leaves none.
    let input = env.write("input.jsonl", &tranche_lines(4));
    let out = env
        .tranche()
        .args(["run", input.to_str().unwrap(), "--task", "t", "--provider", "azure"])
        .args(["--base-url", &sim.azure, "--poll-interval", "0.1"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));

    let audit = files(&env, &sim.azure, &["audit"]);
    assert_eq!(keys(&audit), BTreeSet::from(["accounts"]));
    let account = &audit["accounts"][0];
    assert_eq!(audit["accounts"].as_array().unwrap().len(), 1);
    assert_eq!(
        keys(account),
        BTreeSet::from([
            "provider",
            "endpoint",
            "files",
            "limits",
            "uploads_7d",
            "uploads_30d",
            "days_to_limit"
        ])
    );
    let f = &account["files"];
    assert_eq!(
        keys(f),
        BTreeSet::from([
            "total",
            "with_expiry",
            "without_expiry",
            "owned",
            "orphaned",
            "foreign",
            "by_purpose"
        ])
    );
    assert_eq!(account["provider"], "azure");
    assert_eq!(f["total"].as_u64().unwrap(), azure_files_live(sim.root()));
    assert_eq!((f["total"].as_u64(), f["without_expiry"].as_u64()), (Some(2), Some(2)));
    assert_eq!((f["owned"].as_u64(), f["foreign"].as_u64()), (Some(0), Some(2)));
    assert_eq!(f["by_purpose"], serde_json::json!({"batch": 2}));
    assert_eq!(account["limits"], serde_json::json!({"with_expiry": 10000, "without_expiry": 500}));
    let uploaded = &env.status_json(None)[0]["files"]["uploaded"];
    assert!(uploaded.as_u64().unwrap() > 0);
    assert_eq!((&account["uploads_7d"], &account["uploads_30d"]), (uploaded, uploaded));
    assert_eq!(
        account["days_to_limit"],
        serde_json::json!({"with_expiry": null, "without_expiry": null})
    );

    // A dry run names them and deletes nothing; without --include-foreign nothing goes.
    let dry = files(&env, &sim.azure, &["cleanup", "--dry-run", "--include-foreign"]);
    let named: BTreeSet<String> = dry["accounts"][0]["deleted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(named, theirs);
    assert_eq!(azure_files_live(sim.root()), 2);
    let safe = files(&env, &sim.azure, &["cleanup"]);
    assert_eq!(safe["accounts"][0]["deleted"], serde_json::json!([]));
    assert_eq!(azure_files_live(sim.root()), 2);
    let asked = files(&env, &sim.azure, &["cleanup", "--include-foreign"]);
    assert_eq!(asked["accounts"][0]["deleted"].as_array().unwrap().len(), 2);
    assert_eq!(azure_files_live(sim.root()), 0);
    let after = files(&env, &sim.azure, &["audit"]);
    assert_eq!(after["accounts"][0]["files"]["total"], 0);
}

#[test]
fn an_account_without_files_is_refused_by_name() {
    let env = Env::new();
    let out = env.tranche().args(["files", "audit", "--provider", "anthropic"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("carry their requests inline"));
}

#[test]
fn a_worker_cleans_up_orphans_of_an_account_it_works_for() {
    let sim = Sim::start(&[]);
    let env = Env::new();
    let input = env.write("input.jsonl", &tranche_lines(2));
    let out = env
        .tranche()
        .args(["run", input.to_str().unwrap(), "--task", "t", "--base-url", &sim.openai])
        .args(["--poll-interval", "0.1"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    // A file named like tranche's that this data folder never made (another folder's, lost).
    let foreign = Foreign::openai(&sim.openai);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let orphan_name = format!("tranche-{}.jsonl", tranche_core::TrancheId::new());
    let orphan = runtime.block_on(foreign.upload(&orphan_name, None));
    let loose = runtime.block_on(foreign.upload("theirs.jsonl", None));
    let out = env
        .tranche()
        .args(["worker", "--until-idle", "--base-url", &sim.openai, "--azure-endpoint", &sim.azure])
        .args(["--anthropic-base-url", &sim.anthropic, "--poll-interval", "0.1"])
        .env("TRANCHE_ORPHAN_GRACE", "0")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(!runtime.block_on(foreign.has_file(&orphan)), "the orphan is gone");
    assert!(runtime.block_on(foreign.has_file(&loose)), "a foreign file stays");
}
