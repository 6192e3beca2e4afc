//! Helpers shared by the binary's integration tests: a `tranche sim` child process and a
//! fresh data folder per test.

#![allow(dead_code, reason = "each test binary uses a different part")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use tranche_test_support::sim_process::SimProcess;

pub const BIN: &str = env!("CARGO_BIN_EXE_tranche");

/// `tranche sim` as a child process of this build's binary.
pub struct Sim;

impl Sim {
    pub fn start(extra: &[&str]) -> SimProcess {
        SimProcess::start(Path::new(BIN), extra)
    }
}

/// A fresh data folder, and where its commands keep state: the folder alone, or (a host of a
/// deployment that shares them) a database URL and a blob store.
pub struct Env {
    pub dir: tempfile::TempDir,
    shared: Option<Shared>,
}

/// A database and a blob store every host's commands use.
#[derive(Debug, Clone)]
pub struct Shared {
    pub database: String,
    pub blobs: PathBuf,
}

impl Env {
    pub fn new() -> Env {
        Env { dir: tempfile::tempdir().unwrap(), shared: None }
    }

    /// A host whose commands keep their state in `shared`, not in its own folder.
    pub fn on(shared: &Shared) -> Env {
        Env { dir: tempfile::tempdir().unwrap(), shared: Some(shared.clone()) }
    }

    /// Where this host's commands keep bytes.
    pub fn blob_dir(&self) -> PathBuf {
        self.shared.as_ref().map_or_else(|| self.path("state/blobs"), |s| s.blobs.clone())
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn tranche(&self) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.env("TRANCHE_DATA_DIR", self.path("state"))
            .env_remove("TRANCHE_DATABASE_URL")
            .env_remove("TRANCHE_CONFIG")
            .env_remove("TRANCHE_BLOB_STORE");
        // Engine settings from the developer's environment must not leak into a test.
        for key in ["POLL_INTERVAL", "MIN_BATCH_SIZE", "MAX_WAIT", "MAX_BATCH_REQUESTS"] {
            cmd.env_remove(format!("TRANCHE_{key}"));
        }
        for key in ["MAX_BATCH_BYTES", "DEFAULT_TOKEN_BUDGET", "LEASE", "MAX_ATTEMPTS"] {
            cmd.env_remove(format!("TRANCHE_{key}"));
        }
        cmd.env_remove("TRANCHE_FILE_EXPIRES_AFTER")
            .env_remove("TRANCHE_JANITOR_INTERVAL")
            .env_remove("TRANCHE_ORPHAN_GRACE")
            .env_remove("OPENAI_BASE_URL")
            .env_remove("OPENAI_API_VERSION")
            .env_remove("AZURE_OPENAI_ENDPOINT")
            .env_remove("ANTHROPIC_BASE_URL")
            .env("AZURE_OPENAI_API_KEY", "azure-test-key")
            .env("ANTHROPIC_API_KEY", "sk-ant-test-key")
            .env("OPENAI_API_KEY", "sk-test-key")
            .current_dir(self.dir.path());
        if let Some(shared) = &self.shared {
            cmd.env("TRANCHE_DATABASE_URL", &shared.database)
                .env("TRANCHE_BLOB_STORE", format!("file://{}", shared.blobs.display()));
        }
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

pub fn read_results(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}
