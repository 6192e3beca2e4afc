//! Helpers shared by the binary's integration tests: a `tranche sim` child process and a
//! fresh data folder per test.

#![allow(dead_code, reason = "each test binary uses a different part")]

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_tranche");

/// A `tranche sim` child process, killed when dropped.
pub struct Sim {
    pub child: Child,
    /// The child's temporary directory, where its spool folder goes: a killed simulator
    /// cannot remove its own, so this removes it after the kill.
    _tmp: tempfile::TempDir,
    pub openai: String,
    pub azure: String,
    pub anthropic: String,
}

impl Sim {
    pub fn start(extra: &[&str]) -> Sim {
        let tmp = tempfile::tempdir().unwrap();
        let mut child = Command::new(BIN)
            .env("TMPDIR", tmp.path())
            .args(["sim", "--port", "0"])
            .args(if extra.contains(&"--speed") { &[][..] } else { &["--speed", "200"][..] })
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start tranche sim");
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let mut urls = HashMap::new();
        while urls.len() < 3 {
            let line = lines.next().expect("sim printed its URLs").unwrap();
            if let Some((name, url)) = line.split_once(": ")
                && ["openai", "azure", "anthropic"].contains(&name)
            {
                urls.insert(name.to_owned(), url.trim().to_owned());
            }
        }
        // Keep draining stdout so the child never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Sim {
            child,
            _tmp: tmp,
            openai: urls["openai"].clone(),
            azure: urls["azure"].clone(),
            anthropic: urls["anthropic"].clone(),
        }
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Env {
    pub dir: tempfile::TempDir,
}

impl Env {
    pub fn new() -> Env {
        Env { dir: tempfile::tempdir().unwrap() }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn tranche(&self) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.env("TRANCHE_DATA_DIR", self.path("state"))
            .env_remove("TRANCHE_DATABASE_URL")
            .env_remove("TRANCHE_CONFIG");
        // Engine settings from the developer's environment must not leak into a test.
        for key in ["POLL_INTERVAL", "MIN_BATCH_SIZE", "MAX_WAIT", "MAX_BATCH_REQUESTS"] {
            cmd.env_remove(format!("TRANCHE_{key}"));
        }
        for key in ["MAX_BATCH_BYTES", "DEFAULT_TOKEN_BUDGET", "LEASE", "MAX_ATTEMPTS"] {
            cmd.env_remove(format!("TRANCHE_{key}"));
        }
        cmd.env_remove("TRANCHE_FILE_EXPIRES_AFTER")
            .env_remove("OPENAI_BASE_URL")
            .env_remove("OPENAI_API_VERSION")
            .env_remove("AZURE_OPENAI_ENDPOINT")
            .env_remove("ANTHROPIC_BASE_URL")
            .env("AZURE_OPENAI_API_KEY", "azure-test-key")
            .env("ANTHROPIC_API_KEY", "sk-ant-test-key")
            .env("OPENAI_API_KEY", "sk-test-key")
            .current_dir(self.dir.path());
        cmd
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.path(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    pub fn status_json(&self, job: Option<&str>) -> Value {
        let mut cmd = self.tranche();
        cmd.arg("status").arg("--json");
        if let Some(job) = job {
            cmd.arg(job);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

pub fn text(out: &Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `n` tranche lines over two models; each user message starts with its key, which the
/// simulator echoes in its answer.
pub fn tranche_lines(n: usize) -> String {
    (0..n)
        .map(|i| {
            let model = if i % 3 == 0 { "gpt-4.1-mini" } else { "gpt-4o-mini" };
            let line = serde_json::json!({
                "key": format!("doc:{i}"),
                "body": {"model": model, "messages": [{"role": "user", "content": format!("doc:{i} says hello {}", "x".repeat(i % 17))}]},
            });
            format!("{line}\n")
        })
        .collect()
}

pub fn read_results(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}
