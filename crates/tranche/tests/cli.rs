//! The real `tranche` binary against `tranche sim` on port 0, each test with a fresh store.

#![expect(clippy::unwrap_used, reason = "test helpers fail loudly")]

mod support;

use std::collections::HashMap;

use serde_json::Value;
use support::{Env, Sim, read_results, text};
use tranche_test_support::inputs::{anthropic_lines, tranche_lines};

#[test]
fn run_returns_one_matched_result_per_request() {
    let sim = Sim::start(&[]);
    let env = Env::new();
    let input = env.write("input.jsonl", &tranche_lines(1000));
    let out = env
        .tranche()
        .args(["run", input.to_str().unwrap(), "--task", "greet", "--version", "v2"])
        .args([
            "--base-url",
            &sim.openai,
            "--poll-interval",
            "0.1",
            "--max-batch-requests",
            "400",
            "--json",
        ])
        .args(["--out", env.path("results.jsonl").to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["state"], "done");
    assert_eq!(status["counts"]["accepted"], 1000);
    assert_eq!(status["counts"]["succeeded"], 1000);
    assert_eq!(status["counts"]["pending"], 0);
    // 334 + 666 requests over two models, at most 400 per batch: 1 + 2 tranches.
    assert_eq!(status["tranches"]["done"], 3, "{status}");
    assert_eq!(status["files"]["live"], 0, "every provider file was deleted: {status}");

    let results = read_results(&env.path("results.jsonl"));
    assert_eq!(results.len(), 1000);
    let mut seen = HashMap::new();
    for (i, r) in results.iter().enumerate() {
        let custom_id = r["custom_id"].as_str().unwrap().to_owned();
        *seen.entry(custom_id.clone()).or_insert(0) += 1;
        assert_eq!(custom_id, format!("doc:{i}:greet:v2"));
        assert_eq!(r["key"], format!("doc:{i}"));
        assert_eq!(r["status"], "succeeded");
        assert!(r["error"].is_null());
        let model = if i % 3 == 0 { "gpt-4.1-mini" } else { "gpt-4o-mini" };
        assert_eq!(r["output"]["model"], model);
        let answer = r["output"]["choices"][0]["message"]["content"].as_str().unwrap();
        assert!(
            answer.contains(&format!("\"doc:{i} says hello")),
            "result {i} is another request's answer: {answer}"
        );
    }
    assert!(seen.values().all(|&n| n == 1));
}

#[test]
fn submit_worker_status_results() {
    let sim = Sim::start(&[]);
    let env = Env::new();
    let openai_lines: String = (0..20)
        .map(|i| {
            format!(
                "{}\n",
                serde_json::json!({"custom_id": format!("request-{i}"), "method": "POST", "url": "/v1/embeddings", "body": {"model": "text-embedding-3-small", "input": format!("text {i}")}})
            )
        })
        .collect();
    let input = env.write("batch.jsonl", &openai_lines);

    let out = env
        .tranche()
        .args(["submit", input.to_str().unwrap(), "--base-url", &sim.openai])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let job = stdout.lines().last().unwrap().trim().to_owned();
    assert!(job.starts_with("job_"), "{stdout}");

    let status = env.status_json(Some(&job));
    assert_eq!(status["job_id"], job);
    assert_eq!(status["state"], "pending");
    assert_eq!(status["counts"]["accepted"], 20);
    assert_eq!(status["counts"]["pending"], 20);
    assert!(status["waiting"].as_array().is_some_and(Vec::is_empty), "{status}");

    let out = env
        .tranche()
        .args(["worker", "--until-idle", "--poll-interval", "0.1", "--base-url", &sim.openai])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));

    let status = env.status_json(Some(&job));
    assert_eq!(status["state"], "done");
    for (field, n) in
        [("accepted", 20), ("succeeded", 20), ("failed", 0), ("cancelled", 0), ("pending", 0)]
    {
        assert_eq!(status["counts"][field], n, "{field}: {status}");
    }

    let out = env.tranche().args(["results", &job]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 20);
    assert_eq!(lines[3]["custom_id"], "request-3");
    assert_eq!(lines[3]["key"], "request-3");
    assert_eq!(lines[3]["output"]["object"], "list");

    let out = env
        .tranche()
        .args(["submit", input.to_str().unwrap(), "--json", "--base-url", &sim.openai])
        .output()
        .unwrap();
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(json["job_id"].as_str().unwrap().starts_with("job_"));
}

#[test]
fn failed_lines_keep_the_upstream_error_and_exit_1() {
    let env = Env::new();
    let config = env.write(
        "sim.json",
        r#"{"line_faults": [{"provider": "any", "kind": "fatal", "rate": 0.2}]}"#,
    );
    let sim = Sim::start(&["--config", config.to_str().unwrap()]);
    let input = env.write("input.jsonl", &tranche_lines(50));
    let out = env
        .tranche()
        .args([
            "run",
            input.to_str().unwrap(),
            "--task",
            "t",
            "--base-url",
            &sim.openai,
            "--poll-interval",
            "0.1",
        ])
        .args(["--out", env.path("r.jsonl").to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    let failed = status["counts"]["failed"].as_u64().unwrap();
    assert!(failed > 0 && failed < 50, "{status}");
    assert_eq!(status["counts"]["succeeded"].as_u64().unwrap() + failed, 50);
    let results = read_results(&env.path("r.jsonl"));
    let bad: Vec<&Value> = results.iter().filter(|r| r["status"] == "failed").collect();
    assert_eq!(bad.len() as u64, failed);
    for r in bad {
        assert!(r["output"].is_null());
        assert_eq!(r["error"]["provider"], "openai");
        assert_eq!(r["error"]["status"], 400);
        assert_eq!(r["error"]["code"], "context_length_exceeded");
        assert!(r["error"]["request_id"].as_str().is_some());
        assert_eq!(r["error"]["retryable"], false);
    }
}

/// Submits `text` and expects exit code 2, an error naming `needles`, and nothing stored.
#[track_caller]
fn rejected(text_in: &str, extra: &[&str], needles: &[&str]) {
    let env = Env::new();
    let input = env.write("bad.jsonl", text_in);
    let out = env
        .tranche()
        .args(["submit", input.to_str().unwrap(), "--base-url", "http://127.0.0.1:9/v1"])
        .args(extra)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    for needle in needles {
        assert!(stderr.contains(needle), "stderr lacks {needle:?}:\n{stderr}");
    }
    assert!(stderr.contains("nothing was stored"), "{stderr}");
    assert_eq!(env.status_json(None), Value::Array(vec![]), "a rejected file stored a job");
}

const GOOD: &str = r#"{"key":"a","body":{"model":"m","messages":[]}}"#;

#[test]
fn bad_input_is_refused_whole_with_line_and_field() {
    let task = ["--task", "t"];
    rejected(
        &format!("{GOOD}\n{{\"key\": \"b\", \"body\": \n"),
        &task,
        &["line 2", "invalid JSON"],
    );
    rejected(
        &format!("{GOOD}\n{{\"key\":\"b\"}}\n"),
        &task,
        &["line 2", "`body`", "missing field"],
    );
    rejected(
        &format!("{{\"key\":7,\"body\":{{}}}}\n{GOOD}\n"),
        &task,
        &["line 1", "`key`", "expected a string, found a number"],
    );
    rejected(
        r#"{"custom_id":"x","method":"POST","url":"/v1/chat","body":{"model":"m"}}"#,
        &[],
        &["line 1", "`url`", "unknown endpoint `/v1/chat`"],
    );
    rejected(
        r#"{"custom_id":"x","method":"GET","url":"/v1/chat/completions","body":{"model":"m"}}"#,
        &[],
        &["line 1", "`method`", "POST"],
    );
    rejected(
        &format!("{GOOD}\n{GOOD}\n{GOOD}\n"),
        &task,
        &["line 2", "line 3", "already used on line 1", "`custom_id`"],
    );
    rejected(
        r#"{"key":"a","body":{"messages":[]}}"#,
        &task,
        &["line 1", "`body.model`", "--model"],
    );
    rejected(GOOD, &[], &["line 1", "--task"]);
}

/// Accepting a job sends nothing, so it needs no key: `submit` works with an empty
/// environment for every provider, and still refuses an OpenAI batch line without a model.
#[test]
fn submit_needs_no_credentials() {
    let env = Env::new();
    let bare = |args: &[&str]| {
        let mut cmd = std::process::Command::new(support::BIN);
        cmd.env_clear()
            .env("TRANCHE_DATA_DIR", env.path("state"))
            .current_dir(env.dir.path())
            .arg("submit")
            .args(args);
        cmd.output().unwrap()
    };
    let openai = env.write(
        "openai.jsonl",
        r#"{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[]}}"#,
    );
    let anthropic = env.write(
        "anthropic.jsonl",
        r#"{"key":"a","body":{"model":"claude-x","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}}"#,
    );
    for (file, args) in [
        (&openai, vec!["--json"]),
        (&openai, vec!["--json", "--provider", "azure"]),
        (&anthropic, vec!["--json", "--provider", "anthropic", "--task", "t"]),
    ] {
        let mut all = vec![file.to_str().unwrap()];
        all.extend(args);
        let out = bare(&all);
        assert!(out.status.success(), "{}", text(&out));
        let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(answer["job_id"].as_str().unwrap().starts_with("job_"), "{answer}");
    }
    let no_model = env.write(
        "no-model.jsonl",
        &format!(
            "{}\n{}\n",
            r#"{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[]}}"#,
            r#"{"custom_id":"b","method":"POST","url":"/v1/chat/completions","body":{"messages":[]}}"#
        ),
    );
    let out = bare(&[no_model.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("line 2: `body.model`"), "{stderr}");
    assert!(stderr.contains("--model"), "{stderr}");
    // With --model, the same file is accepted.
    let out = bare(&[no_model.to_str().unwrap(), "--model", "gpt-4o-mini"]);
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn duplicate_custom_id_names_both_lines() {
    let env = Env::new();
    let text = format!("{GOOD}\n{}\n{GOOD}\n", r#"{"key":"b","body":{"model":"m"}}"#);
    let input = env.write("dup.jsonl", &text);
    let out =
        env.tranche().args(["submit", input.to_str().unwrap(), "--task", "t"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr
            .contains("line 3: `custom_id`: duplicate custom_id `a:t:v1`: already used on line 1"),
        "{stderr}"
    );
}

#[test]
fn usage_errors_exit_2() {
    let env = Env::new();
    let out = env.tranche().args(["submit", "missing.jsonl", "--task", "t"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.jsonl"));
    let out = env.tranche().args(["status", "not-a-job"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = env.tranche().args(["frobnicate"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let input = env.write("ok.jsonl", GOOD);
    let out = env
        .tranche()
        .env_remove("OPENAI_API_KEY")
        .args(["run", input.to_str().unwrap(), "--task", "t"])
        .output()
        .unwrap();
    // `run` calls the provider, so it needs the key (`submit` does not).
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("OPENAI_API_KEY"));
}

#[test]
fn demo_accounts_for_every_request() {
    let env = Env::new();
    let out = env
        .tranche()
        .env_remove("OPENAI_API_KEY")
        .args(["demo", "--requests", "300", "--speed", "100"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("0 files still at the provider"), "{stdout}");
    let results = read_results(&env.path("state/demo/results.jsonl"));
    assert_eq!(results.len(), 300);
    let done =
        results.iter().filter(|r| r["status"] == "succeeded" || r["status"] == "failed").count();
    assert_eq!(done, 300);
}

/// Tranche lines whose bodies are Anthropic Messages params.
/// Runs a 1,000-request job on one provider against `tranche sim` and checks every result.
fn run_on(provider: &str, extra: &[&str]) {
    let sim = Sim::start(&[]);
    let env = Env::new();
    let lines = if provider == "anthropic" { anthropic_lines(1000) } else { tranche_lines(1000) };
    let input = env.write("input.jsonl", &lines);
    let base = match provider {
        "azure" => sim.azure.clone(),
        "anthropic" => sim.anthropic.clone(),
        _ => sim.openai.clone(),
    };
    let out = env
        .tranche()
        .args([
            "run",
            input.to_str().unwrap(),
            "--task",
            "greet",
            "--provider",
            provider,
            "--base-url",
            &base,
        ])
        .args(["--poll-interval", "0.1", "--json", "--out", env.path("r.jsonl").to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap();
    assert!(out.status.success(), "{provider}: {}", text(&out));
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["provider"], provider);
    assert_eq!(status["counts"]["succeeded"], 1000, "{status}");
    assert_eq!(status["files"]["live"], 0, "{status}");
    let results = read_results(&env.path("r.jsonl"));
    assert_eq!(results.len(), 1000);
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r["custom_id"], format!("doc:{i}:greet:v1"));
        assert_eq!(r["status"], "succeeded");
        let answer = match provider {
            "anthropic" => r["output"]["content"][0]["text"].as_str().unwrap().to_owned(),
            _ => r["output"]["choices"][0]["message"]["content"].as_str().unwrap().to_owned(),
        };
        assert!(
            answer.contains(&format!("doc:{i} says hello")),
            "{provider} result {i} is another request's answer: {answer}"
        );
    }
}

#[test]
fn run_completes_on_azure_v1() {
    run_on("azure", &[]);
}

#[test]
fn run_completes_on_azure_legacy() {
    run_on("azure", &["--azure-api-version", "2024-10-21"]);
}

#[test]
fn run_completes_on_anthropic_with_derived_wire_ids() {
    run_on("anthropic", &[]);
}

/// Runs six Anthropic requests sharing a long system prompt with `extra` flags; the run's
/// engine log on the input file.
fn run_shared_prompt(extra: &[&str]) -> String {
    let sim = Sim::start(&[]);
    let env = Env::new();
    let system = "You label support tickets by intent, urgency and product area. ".repeat(150);
    let lines: String = (0..6)
        .map(|i| {
            let line = serde_json::json!({"key": format!("doc:{i}"), "body": {
                "model": "claude-sonnet-4-5", "max_tokens": 32, "system": system,
                "messages": [{"role": "user", "content": format!("doc:{i} says hello")}]}});
            format!("{line}\n")
        })
        .collect();
    let input = env.write("input.jsonl", &lines);
    let out = env
        .tranche()
        .env("RUST_LOG", "tranche_engine::steps::input=debug")
        .env("NO_COLOR", "1")
        .args(["run", input.to_str().unwrap(), "--task", "t", "--provider", "anthropic"])
        .args(["--base-url", &sim.anthropic, "--poll-interval", "0.1", "--json"])
        .args(extra)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["counts"]["succeeded"], 6, "{status}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_shared_system_prompt_is_marked_for_caching_unless_turned_off() {
    let log = run_shared_prompt(&[]);
    assert!(
        log.contains("marked shared system prompts for caching") && log.contains("requests=6"),
        "{log}"
    );
    let log = run_shared_prompt(&["--cache-shared-prompt", "off"]);
    assert!(!log.contains("marked shared system prompts"), "{log}");
    let env = Env::new();
    let out = env
        .tranche()
        .args(["submit", "in.jsonl", "--provider", "anthropic", "--cache-shared-prompt", "on"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not auto or off"), "{}", text(&out));
}

#[test]
fn anthropic_refuses_openai_chat_bodies() {
    let env = Env::new();
    let input = env.write("chat.jsonl", &tranche_lines(2));
    let out = env
        .tranche()
        .args(["submit", input.to_str().unwrap(), "--task", "t", "--provider", "anthropic"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("line 1") && stderr.contains("Messages API params"), "{stderr}");
}

#[test]
fn quota_exceeded_is_shown_verbatim_and_exits_3() {
    let env = Env::new();
    let config = env.write(
        "sim.json",
        r#"{"faults": [{"provider": "azure", "operation": "upload", "status": 400, "code": "quotaExceeded",
            "message": "The quota for files without expiry is reached. The maximum is 500."}]}"#,
    );
    let sim = Sim::start(&["--config", config.to_str().unwrap()]);
    let input = env.write("input.jsonl", &tranche_lines(5));
    let out = env
        .tranche()
        .args([
            "run",
            input.to_str().unwrap(),
            "--task",
            "t",
            "--provider",
            "azure",
            "--base-url",
            &sim.azure,
        ])
        .args(["--poll-interval", "0.1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("azure returned 400 quotaExceeded: The quota for files without expiry is reached. The maximum is 500."),
        "{stderr}"
    );
    let status = env.status_json(None);
    let error = &status[0]["error"];
    assert_eq!(error["provider"], "azure");
    assert_eq!(error["status"], 400);
    assert_eq!(error["code"], "quotaExceeded");
    // Beside it, the provider's own facts under exact keys.
    let upstream = &status[0]["upstream"];
    assert_eq!(
        (upstream["provider"].as_str(), upstream["status"].as_u64()),
        (Some("azure"), Some(400))
    );
    assert_eq!(upstream["code"], "quotaExceeded");
    assert!(upstream["message"].as_str().unwrap().contains("The maximum is 500"), "{upstream}");
    let keys: Vec<&str> = upstream.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys.len(), 6, "provider, status, code, type, message, request_id: {upstream}");
    // Nothing of tranche's holds files there: the job is paused, not failed...
    assert_eq!(
        (status[0]["state"].as_str(), status[0]["paused"].as_bool()),
        (Some("running"), Some(true))
    );
    assert_eq!(status[0]["counts"]["failed"], 0);
    // ...and a worker finishes it once the account has room.
    // The whole configuration is replaced: the speed the simulator was started with, no faults.
    tranche_test_support::probe::set_config(sim.root(), &serde_json::json!({"speed": 200.0}));
    let out = env
        .tranche()
        .args(["worker", "--until-idle", "--azure-endpoint", &sim.azure, "--poll-interval", "0.1"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let status = env.status_json(None);
    assert_eq!(
        (status[0]["state"].as_str(), status[0]["paused"].as_bool()),
        (Some("done"), Some(false))
    );
    assert_eq!(status[0]["counts"]["succeeded"], 5);
    assert!(status[0]["error"].is_null(), "{}", status[0]);
}

#[test]
fn api_keys_never_reach_logs_or_the_store() {
    let sim = Sim::start(&[]);
    let env = Env::new();
    let key = "sk-secret-7f3a9c1e5b2d4680";
    let input = env.write("input.jsonl", &tranche_lines(30));
    let out = env
        .tranche()
        .env("OPENAI_API_KEY", key)
        .env("RUST_LOG", "debug")
        .args([
            "-vv",
            "run",
            input.to_str().unwrap(),
            "--task",
            "t",
            "--base-url",
            &sim.openai,
            "--poll-interval",
            "0.1",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let logs = String::from_utf8_lossy(&out.stderr);
    assert!(logs.contains("DEBUG"), "debug logging was on");
    assert!(
        !logs.contains(key) && !String::from_utf8_lossy(&out.stdout).contains(key),
        "the key leaked into the output"
    );
    // Nothing under the data folder (database, WAL, raw results) holds the key.
    let mut stack = vec![env.path("state")];
    let mut files = 0;
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                files += 1;
                let bytes = std::fs::read(&path).unwrap();
                assert!(
                    !bytes.windows(key.len()).any(|w| w == key.as_bytes()),
                    "the key is in {}",
                    path.display()
                );
            }
        }
    }
    assert!(files >= 2, "checked the store and raw results");
}

/// Engine settings come in layers: `tranche.toml` in the data folder, then `TRANCHE_*` in the
/// environment, then flags; the job records its tenant.
#[test]
fn engine_settings_layer_file_environment_and_flags() {
    let sim = Sim::start(&[]);
    let env = Env::new();
    std::fs::create_dir_all(env.path("state")).unwrap();
    std::fs::write(
        env.path("state/tranche.toml"),
        "max_batch_requests = 10\npoll_interval = 0.1\n",
    )
    .unwrap();
    let input = env.write("input.jsonl", &tranche_lines(60));
    let run = |extra_env: &[(&str, &str)], flags: &[&str]| -> Value {
        let mut cmd = env.tranche();
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        let out = cmd
            .args(["run", input.to_str().unwrap(), "--task", "t", "--json"])
            .args(["--base-url", &sim.openai, "--tenant", "acme"])
            .args(flags)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let tranches = |status: &Value| status["tranches"]["done"].as_u64().unwrap();
    // 20 + 40 requests over two models: 10 per batch from the file...
    let from_file = run(&[], &[]);
    assert_eq!(tranches(&from_file), 6, "{from_file}");
    assert_eq!(from_file["tenant"], "acme");
    // ...20 from the environment, over the file (the first job's answers are reused, so a
    // new version runs)...
    let from_env = run(&[("TRANCHE_MAX_BATCH_REQUESTS", "20")], &["--version", "v2"]);
    assert_eq!(tranches(&from_env), 3, "{from_env}");
    // ...and 40 from the flag, over both.
    let from_flag = run(
        &[("TRANCHE_MAX_BATCH_REQUESTS", "20")],
        &["--version", "v3", "--max-batch-requests", "40"],
    );
    assert_eq!(tranches(&from_flag), 2, "{from_flag}");
}

#[test]
fn a_mistyped_setting_in_the_configuration_file_is_refused_by_name() {
    let env = Env::new();
    std::fs::create_dir_all(env.path("state")).unwrap();
    std::fs::write(env.path("state/tranche.toml"), "max_batch_request = 10\n").unwrap();
    let input = env.write("input.jsonl", &tranche_lines(2));
    let out = env
        .tranche()
        .args([
            "run",
            input.to_str().unwrap(),
            "--task",
            "t",
            "--base-url",
            "http://127.0.0.1:9/v1",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("max_batch_request") && stderr.contains("tranche.toml"), "{stderr}");
}

/// With `TRANCHE_BLOB_STORE=s3://...` the batches' raw results rest in S3-compatible storage,
/// not in the data folder; an engine started with another blob store is refused by name.
#[test]
fn raw_results_rest_in_the_configured_blob_store_and_engines_must_share_it() {
    let s3 = tranche_test_support::s3::S3Server::start("tranche-cli");
    let sim = Sim::start(&[]);
    let env = Env::new();
    let input = env.write("input.jsonl", &tranche_lines(30));
    let url = format!("s3://{}/deployment", s3.bucket);
    let options = s3.options();
    let run = |extra: &[&str]| {
        let mut cmd = env.tranche();
        for (key, value) in &options {
            cmd.env(key, value);
        }
        cmd.env("TRANCHE_BLOB_STORE", &url)
            .args(["run", input.to_str().unwrap(), "--task", "t", "--json"])
            .args([
                "--base-url",
                &sim.openai,
                "--poll-interval",
                "0.1",
                "--max-batch-requests",
                "10",
            ])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = run(&[]);
    assert!(out.status.success(), "{}", text(&out));
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    let tranches = status["tranches"]["done"].as_u64().unwrap();
    let blobs = tranche_blob::BlobStore::open_with_options(
        &url,
        options.iter().map(|(k, v)| (*k, v.as_str())),
    )
    .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let raw = runtime.block_on(blobs.list(&tranche_blob::BlobKey::new("raw").unwrap())).unwrap();
    assert_eq!(raw.len() as u64, tranches, "one output file per batch: {raw:?}");
    assert!(!env.path("state/blobs").exists(), "nothing rests in the data folder");
    assert!(!env.path("state/raw").exists());
    // No request body, input file or result passed through local disk: the data folder holds
    // the database alone.
    let local = files_under(&env.path("state"));
    assert!(local.iter().all(|f| f.extension().is_none_or(|e| e != "jsonl")), "{local:?}");
    let bodies =
        runtime.block_on(blobs.list(&tranche_blob::BlobKey::new("bodies").unwrap())).unwrap();
    assert_eq!(bodies.len(), 1, "{bodies:?}");
    let inputs =
        runtime.block_on(blobs.list(&tranche_blob::BlobKey::new("tranches").unwrap())).unwrap();
    assert!(inputs.is_empty(), "input files are removed once their batches end: {inputs:?}");
    // Results read back from the raw objects on S3.
    let job = status["job_id"].as_str().unwrap();
    let mut results = env.tranche();
    for (key, value) in &options {
        results.env(key, value);
    }
    let out = results.env("TRANCHE_BLOB_STORE", &url).args(["results", job]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let lines: Vec<Value> = out
        .stdout
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 30);
    assert!(
        lines.iter().all(|l| l["status"] == "succeeded" && l["output"].is_object()),
        "{lines:?}"
    );
    // The same export, into the blob store: the same bytes, whole, named in the answer.
    let mut export = env.tranche();
    for (key, value) in &options {
        export.env(key, value);
    }
    let exported = export
        .env("TRANCHE_BLOB_STORE", &url)
        .args(["results", job, "--to-blob-store"])
        .output()
        .unwrap();
    assert!(exported.status.success(), "{}", text(&exported));
    let answer: Value = serde_json::from_slice(&exported.stdout).unwrap();
    let object = format!("exports/{job}/results.jsonl");
    assert_eq!(answer["object"], object.as_str());
    assert_eq!(answer["url"], format!("{url}/{object}"));
    assert_eq!(
        (answer["lines"].as_u64(), answer["bytes"].as_u64()),
        (Some(30), Some(out.stdout.len() as u64))
    );
    let stored = runtime.block_on(blobs.get(&tranche_blob::BlobKey::new(object).unwrap())).unwrap();
    assert_eq!(stored.as_ref(), out.stdout.as_slice());
    let local = files_under(&env.path("state"));
    assert!(local.iter().all(|f| f.extension().is_none_or(|e| e != "jsonl")), "{local:?}");
    // Another blob store for the same deployment is refused, naming both.
    let out = run(&["--version", "v2", "--blob-store", "file:///tmp/elsewhere"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&url) && stderr.contains("file:///tmp/elsewhere"), "{stderr}");
}

#[test]
fn prune_forgets_ended_jobs_requests_and_bytes_and_keeps_their_summaries() {
    let sim = Sim::start(&[]);
    let env = Env::new();
    let input = env.write("input.jsonl", &tranche_lines(20));
    let out = env
        .tranche()
        .args(["run", input.to_str().unwrap(), "--task", "t", "--json"])
        .args(["--base-url", &sim.openai, "--poll-interval", "0.1"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let job = serde_json::from_slice::<Value>(&out.stdout).unwrap()["job_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let prune = |extra: &[&str]| env.tranche().arg("prune").args(extra).output().unwrap();
    // A job that ended a moment ago is not older than a day.
    let out = prune(&["--older-than", "1d", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report,
        serde_json::json!({"dry_run": false, "jobs": 0, "requests": 0, "objects": 0, "bytes": 0})
    );
    let out = env.tranche().args(["results", &job, "--to-blob-store"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let out = prune(&["--older-than", "0s", "--dry-run", "--json"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (report["dry_run"].as_bool(), report["jobs"].as_u64(), report["requests"].as_u64()),
        (Some(true), Some(1), Some(20))
    );
    // The job's bodies, its export and its batches' raw output files: everything in the blob
    // store.
    let stored = files_under(&env.path("state/blobs"));
    assert!(stored.len() >= 3, "{stored:?}");
    assert_eq!(report["objects"].as_u64(), Some(stored.len() as u64), "{report}");
    let out = prune(&["--older-than", "0s", "--json"]);
    let pruned: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(pruned["requests"], 20);
    assert_eq!(pruned["bytes"], report["bytes"]);
    assert!(files_under(&env.path("state/blobs")).is_empty());
    // The job's summary stays; its results are gone.
    let out = env.tranche().args(["status", &job, "--json"]).output().unwrap();
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (status["state"].as_str(), status["counts"]["succeeded"].as_u64()),
        (Some("done"), Some(20)),
        "{status}"
    );
    let out = env.tranche().args(["results", &job]).output().unwrap();
    assert!(out.status.success() && out.stdout.is_empty(), "{}", text(&out));
    // A duration that is not one is refused with what to write.
    let out = prune(&["--older-than", "soon"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("30d"), "{}", text(&out));
}

/// Every file under `dir`, at any depth.
fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_under(&path));
        } else {
            found.push(path);
        }
    }
    found
}

/// The environment a `tranche sim` started with `tunables` (if any) runs with, once it serves.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn environment_of_a_started_sim(tunables: Option<&str>) -> Vec<String> {
    use std::io::{BufRead, BufReader};
    let tmp = tempfile::tempdir().unwrap();
    let mut command = std::process::Command::new(support::BIN);
    command
        .env("TMPDIR", tmp.path())
        .env_remove("MALLOC_ARENA_MAX")
        .env_remove("MALLOC_MMAP_THRESHOLD_");
    match tunables {
        Some(value) => command.env("GLIBC_TUNABLES", value),
        None => command.env_remove("GLIBC_TUNABLES"),
    };
    let mut child = command
        .args(["sim", "--port", "0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // It prints where it listens only once it runs as it will.
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    let environ = std::fs::read(format!("/proc/{}/environ", child.id())).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(!first.is_empty(), "the simulator printed nothing");
    environ.split(|&b| b == 0).map(|v| String::from_utf8_lossy(v).into_owned()).collect()
}

/// The `GLIBC_TUNABLES` a process started with, from its environment as `/proc` shows it.
/// glibc 2.36 parses the variable where it lies, writing a NUL over each `:`, so the tunables
/// after the first show as entries of their own that follow it.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn tunables_in(env: &[String]) -> Option<String> {
    let at = env.iter().position(|v| v.starts_with("GLIBC_TUNABLES="))?;
    let mut parts = vec![env[at].trim_start_matches("GLIBC_TUNABLES=").to_owned()];
    parts.extend(env[at + 1..].iter().take_while(|v| v.starts_with("glibc.")).cloned());
    Some(parts.join(":"))
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn the_binary_runs_with_its_malloc_tunables_unless_the_user_set_them() {
    let env = environment_of_a_started_sim(None);
    assert_eq!(
        tunables_in(&env).as_deref(),
        Some(
            "glibc.malloc.arena_max=1:glibc.malloc.mmap_threshold=1048576:\
             glibc.malloc.trim_threshold=8388608"
        ),
        "the process started again with the tunables: {env:?}"
    );
    let env = environment_of_a_started_sim(Some("glibc.malloc.arena_max=3"));
    assert_eq!(
        tunables_in(&env).as_deref(),
        Some(
            "glibc.malloc.arena_max=3:glibc.malloc.mmap_threshold=1048576:\
             glibc.malloc.trim_threshold=8388608"
        ),
        "the user's cap stands"
    );
}
