//! The results pipeline through the real binary against `tranche sim`: answers checked against
//! a schema, re-parsed without provider traffic, and held for review until approved.

#![expect(clippy::unwrap_used, reason = "test helpers fail loudly")]

mod support;

use serde_json::{Value, json};
use support::{Env, Sim, read_results, text};
use tranche_test_support::inputs::{label_schema, structured_lines};
use tranche_test_support::probe;

/// `tranche run FILE` against `sim` with `args`; its output.
fn run(env: &Env, sim: &str, input: &std::path::Path, args: &[&str]) -> std::process::Output {
    env.tranche()
        .args(["run", input.to_str().unwrap(), "--base-url", sim, "--poll-interval", "0.05"])
        .args(args)
        .output()
        .unwrap()
}

fn json_of(out: &std::process::Output) -> Value {
    assert!(out.status.success(), "{}", text(out));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn schema_violations_fail_by_name_and_a_relaxed_reparse_promotes_them_without_traffic() {
    let env = Env::new();
    let config = env.write(
        "sim.json",
        r#"{"line_faults": [{"provider": "any", "kind": "schema_violation", "rate": 0.1}]}"#,
    );
    let sim = Sim::start(&["--config", config.to_str().unwrap()]);
    let input = env.write("input.jsonl", &structured_lines(200, &json!({})));
    let schema = env.write("schema.json", &label_schema().to_string());
    let relaxed = env.write("relaxed.json", r#"{"type": "object"}"#);
    let out = run(
        &env,
        &sim.openai,
        &input,
        &[
            "--task",
            "triage",
            "--schema",
            schema.to_str().unwrap(),
            "--on-invalid",
            "fail",
            "--json",
            "--out",
            env.path("results.jsonl").to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(1), "some requests failed: {}", text(&out));
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    let job = status["job_id"].as_str().unwrap().to_owned();
    let results = read_results(&env.path("results.jsonl"));
    let failed: Vec<&Value> = results.iter().filter(|r| r["status"] == "failed").collect();
    assert!(failed.len() > 5 && failed.len() < 45, "about 10% of 200: {}", failed.len());
    for r in &results {
        if r["status"] == "failed" {
            assert_eq!(r["error"]["code"], "invalid_output", "{r}");
            let message = r["error"]["message"].as_str().unwrap();
            assert!(
                message.contains("label") || message.contains("sim_unexpected_field"),
                "{message}"
            );
        } else {
            assert_eq!(r["status"], "succeeded", "{r}");
        }
    }
    let billed = probe::stats(sim.root())["requests_billed"].clone();
    assert_eq!(billed, 200);

    let out = env
        .tranche()
        .args(["reparse", &job, "--schema", relaxed.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    let report = json_of(&out);
    assert_eq!(report["promoted"], failed.len(), "{report}");
    assert_eq!((report["demoted"].as_u64(), report["resent"].as_u64()), (Some(0), Some(0)));
    assert_eq!(probe::stats(sim.root())["requests_billed"], billed, "no provider traffic");
    let status = env.status_json(Some(&job));
    assert_eq!(
        (status["state"].as_str(), status["counts"]["succeeded"].as_u64()),
        (Some("done"), Some(200))
    );

    // Export: the answer parsed under the job's schema, its usage, the provider's raw line.
    let out =
        env.tranche().args(["results", &job, "--status", "succeeded", "--raw"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 200);
    for line in &lines {
        assert!(line["answer"].is_object(), "{line}");
        assert_eq!(
            line["answer"],
            serde_json::from_str::<Value>(
                line["output"]["choices"][0]["message"]["content"].as_str().unwrap()
            )
            .unwrap()
        );
        assert!(line["usage"]["input_tokens"].as_u64().unwrap() > 0, "{line}");
        assert_eq!(line["raw"]["custom_id"], line["custom_id"], "{line}");
        assert_eq!(line["raw"]["response"]["body"], line["output"]);
    }
    let out = env.tranche().args(["results", &job, "--format", "csv"]).output().unwrap();
    let csv = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(csv.lines().next(), Some("custom_id,key,status,answer,error_code,error_message"));
    assert_eq!(csv.lines().count(), 201);
    assert!(csv.lines().nth(1).unwrap().starts_with("k0:triage:v1,k0,succeeded,\"{"), "{csv}");
    let out = env.tranche().args(["results", &job, "--status", "pending"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));

    // A schema that is not one is refused, and so is a file that is not JSON, by name.
    let bad = env.write("bad.json", r#"{"type": 5}"#);
    let out =
        env.tranche().args(["reparse", &job, "--schema", bad.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("schema"), "{}", text(&out));
    let broken = env.write("broken.json", "{\"type\": ");
    let out = run(&env, &sim.openai, &input, &["--schema", broken.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("broken.json: not JSON at line 1"), "{}", text(&out));
}

#[test]
fn a_review_sample_job_waits_in_needs_review_until_approved() {
    let env = Env::new();
    let sim = Sim::start(&[]);
    let input = env.write("input.jsonl", &structured_lines(60, &json!({})));
    let out =
        run(&env, &sim.openai, &input, &["--task", "triage", "--review-sample", "20", "--json"]);
    assert_eq!(out.status.code(), Some(4), "the job awaits review: {}", text(&out));
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    let job = status["job_id"].as_str().unwrap().to_owned();
    assert_eq!(status["state"], "needs_review");
    // A worker has nothing to do for it.
    let out = env
        .tranche()
        .args(["worker", "--until-idle", "--base-url", &sim.openai, "--poll-interval", "0.05"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));

    let review = |extra: &[&str]| -> Vec<Value> {
        let out = env.tranche().args(["review", &job, "--json"]).args(extra).output().unwrap();
        serde_json::from_value(json_of(&out)).unwrap()
    };
    let sample = review(&[]);
    assert_eq!(sample.len(), 20);
    for item in &sample {
        let key = item["key"].as_str().unwrap();
        assert_eq!(item["custom_id"], format!("{key}:triage:v1"));
        let question = item["input"]["messages"][0]["content"].as_str().unwrap();
        assert_eq!(question, format!("{key} question"), "the input beside its answer");
        assert!(item["output"]["choices"][0]["message"]["content"].is_string());
    }
    assert_eq!(review(&[]), sample, "the same seed draws the same sample");
    let other = review(&["--review-seed", "7"]);
    assert_eq!(other.len(), 20);
    assert_ne!(other, sample, "another seed, another draw");
    assert_eq!(review(&["--review-seed", "7"]), other);

    // Unreviewed answers are exported only when asked for, marked staged.
    let out = env.tranche().args(["results", &job]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).trim().is_empty(), "nothing approved yet");
    let out = env.tranche().args(["results", &job, "--staged"]).output().unwrap();
    let staged: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(staged.len(), 60);
    assert!(staged.iter().all(|r| r["stage"] == "staged"), "{}", staged[0]);

    let out = env.tranche().args(["approve", &job, "--by", "ana"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let status = env.status_json(Some(&job));
    assert_eq!(status["state"], "done");
    assert_eq!(
        (status["review"]["verdict"].as_str(), status["review"]["by"].as_str()),
        (Some("approved"), Some("ana"))
    );
    let out = env.tranche().args(["approve", &job]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "only a job awaiting review: {}", text(&out));
    let out = env.tranche().args(["results", &job]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 60);

    // Rejecting named answers ends them failed; the rest stand and the job is done.
    let out =
        run(&env, &sim.openai, &input, &["--task", "again", "--review-sample", "5", "--json"]);
    let second = serde_json::from_slice::<Value>(&out.stdout).unwrap()["job_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let out = env.tranche().args(["reject", &second, "--custom-id", "nope"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("not a succeeded answer of job"), "{}", text(&out));
    let out =
        env.tranche().args(["reject", &second, "--custom-id", "k3:again:v1"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let status = env.status_json(Some(&second));
    assert_eq!(
        (status["state"].as_str(), status["counts"]["failed"].as_u64()),
        (Some("done"), Some(1))
    );
    let out = env.tranche().args(["results", &second, "--status", "failed"]).output().unwrap();
    let failed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (failed["custom_id"].as_str(), failed["error"]["code"].as_str()),
        (Some("k3:again:v1"), Some("rejected_in_review"))
    );
}
