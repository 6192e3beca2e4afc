//! The simulator the benchmark runs against: in this process (the default, as `tranche demo`
//! wires it), or in a child process so that its memory and CPU can be told apart from the
//! engine's.
//!
//! Either way the clock is frozen (speed 0) and the benchmark moves it with one large advance,
//! and lines run at a billion per virtual second, so the simulator's pacing is never what is
//! measured: its processing is the CPU work of running every line, reported as its own phase.

use std::process::Stdio;

use anyhow::{Context as _, bail};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tranche_sim::{ProcessingConfig, SimConfig, SimHandle, SimStats, Simulator};

use crate::procfs::Proc;

/// Where the simulator runs.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum SimMode {
    /// In the benchmark's own process: the setup; its memory counts in the peak RSS.
    InProcess,
    /// In a child process (this binary with `--serve-sim`): peak RSS is then the engine's alone.
    Child,
}

impl SimMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InProcess => "in-process",
            Self::Child => "child",
        }
    }
}

/// The simulator's settings: frozen clock, no faults, effectively unlimited pace.
pub fn config() -> SimConfig {
    SimConfig {
        speed: 0.0,
        processing: ProcessingConfig { requests_per_second: 1.0e9, ..ProcessingConfig::default() },
        ..SimConfig::default()
    }
}

/// A running simulator.
#[derive(Debug)]
pub enum Sim {
    InProcess(SimHandle),
    Child { child: Box<Child>, stdin: ChildStdin, base_url: String, http: reqwest::Client },
}

impl Sim {
    pub async fn start(mode: SimMode) -> anyhow::Result<Self> {
        match mode {
            SimMode::InProcess => Ok(Self::InProcess(
                Simulator::spawn(config()).await.context("starting the simulator")?,
            )),
            SimMode::Child => {
                let exe = std::env::current_exe().context("finding this binary")?;
                let mut child = Command::new(exe)
                    .arg("--serve-sim")
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::inherit())
                    .kill_on_drop(true)
                    .spawn()
                    .context("starting the simulator process")?;
                let stdin = child.stdin.take().context("the simulator's stdin")?;
                let stdout = child.stdout.take().context("the simulator's stdout")?;
                let mut line = String::new();
                BufReader::new(stdout)
                    .read_line(&mut line)
                    .await
                    .context("reading the simulator's address")?;
                let base_url = line.trim().to_owned();
                if !base_url.starts_with("http://") {
                    bail!("the simulator process did not announce its address (got {line:?})");
                }
                Ok(Self::Child {
                    child: Box::new(child),
                    stdin,
                    base_url,
                    http: reqwest::Client::new(),
                })
            }
        }
    }

    fn base_url(&self) -> String {
        match self {
            Self::InProcess(handle) => handle.base_url(),
            Self::Child { base_url, .. } => base_url.clone(),
        }
    }

    /// The `base_url` for the OpenAI adapter.
    pub fn openai_base_url(&self) -> String {
        format!("{}/v1", self.base_url())
    }

    /// The child's process, when the simulator runs in one.
    pub fn process(&self) -> Option<Proc> {
        match self {
            Self::InProcess(_) => None,
            Self::Child { child, .. } => child.id().map(Proc::Pid),
        }
    }

    /// Moves the virtual clock; the simulator runs every line that falls due, synchronously.
    pub async fn advance(&self, seconds: f64) -> anyhow::Result<()> {
        match self {
            Self::InProcess(handle) => {
                handle.advance(seconds);
                Ok(())
            }
            Self::Child { base_url, http, .. } => {
                http.post(format!("{base_url}/sim/clock/advance"))
                    .json(&serde_json::json!({ "seconds": seconds }))
                    .send()
                    .await
                    .and_then(reqwest::Response::error_for_status)
                    .context("advancing the simulator's clock")?;
                Ok(())
            }
        }
    }

    pub async fn stats(&self) -> anyhow::Result<SimStats> {
        match self {
            Self::InProcess(handle) => Ok(handle.stats()),
            Self::Child { base_url, http, .. } => http
                .get(format!("{base_url}/sim/stats"))
                .send()
                .await
                .and_then(reqwest::Response::error_for_status)
                .context("reading the simulator's stats")?
                .json::<SimStats>()
                .await
                .context("decoding the simulator's stats"),
        }
    }

    pub async fn shutdown(self) {
        match self {
            Self::InProcess(handle) => handle.shutdown().await,
            Self::Child { mut child, stdin, .. } => {
                // Closing stdin tells the child to stop.
                drop(stdin);
                if child.wait().await.is_err() {
                    let _ = child.kill().await;
                }
            }
        }
    }
}

/// The child side of [`SimMode::Child`]: serves a simulator, announces its address on stdout,
/// and stops when stdin closes.
pub async fn serve_until_stdin_closes() -> anyhow::Result<()> {
    let handle = Simulator::spawn(config()).await.context("starting the simulator")?;
    let mut stdout = tokio::io::stdout();
    stdout.write_all(format!("{}\n", handle.base_url()).as_bytes()).await?;
    stdout.flush().await?;
    let mut sink = Vec::new();
    tokio::io::stdin().read_to_end(&mut sink).await.context("waiting on stdin")?;
    handle.shutdown().await;
    Ok(())
}
