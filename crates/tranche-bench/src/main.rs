//! `tranche-bench`: pushes N requests of about 1 KB through submit → plan → files → simulator →
//! collect → ingest → cleanup with the real engine and store, and prints per-phase throughput,
//! peak RSS and the I/O floor (read + write + SHA-256 of the same bytes).
//!
//! `cargo run --release -p tranche-bench -- --requests 1000000` runs once;
//! `--compare` runs this binary as separate processes at 10,000 and 1,000,000 requests and
//! compares their peak RSS and their distance from the I/O floor. Speed is reported, never
//! asserted.

mod floor;
mod input;
mod pipeline;
mod procfs;
mod report;
mod sim;

use std::io::{IsTerminal as _, Write};
use std::path::PathBuf;
use std::process::{ExitCode, Stdio};

use anyhow::{Context as _, bail};
use clap::Parser;
use tracing_subscriber::EnvFilter;

use crate::pipeline::RunSettings;
use crate::report::Report;
use crate::sim::SimMode;

/// Benchmark tranche's pipeline against the in-process simulator.
#[derive(Debug, Parser)]
#[command(name = "tranche-bench", version)]
struct Args {
    /// How many requests to push through.
    #[arg(long, default_value_t = 10_000)]
    requests: u64,
    /// Size of each request's `body` JSON, in bytes.
    #[arg(long, default_value_t = 1_000)]
    body_bytes: usize,
    /// Most requests per tranche (provider batch); OpenAI's limit by default.
    #[arg(long, default_value_t = 50_000)]
    max_batch_requests: usize,
    /// Where to put the run's working folder (a fresh sub-folder, removed afterwards);
    /// default: the system's temporary folder.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Keep the working folder instead of removing it.
    #[arg(long)]
    keep: bool,
    /// Where the simulator runs: `in-process` (the setup; its memory counts in the
    /// peak RSS) or `child` (a separate process, so the peak RSS is the engine's alone).
    #[arg(long, value_enum, default_value_t = SimMode::InProcess)]
    sim: SimMode,
    /// Run on the PostgreSQL database at this `postgres://` URL (it must exist and be empty)
    /// instead of a SQLite file in the working folder.
    #[arg(long)]
    db: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Run this binary once per `--compare-sizes` entry, each in its own process, and compare
    /// their peak RSS and their distance from the I/O floor.
    #[arg(long)]
    compare: bool,
    /// Request counts for `--compare`, smallest first.
    #[arg(long, value_delimiter = ',', default_value = "10000,1000000")]
    compare_sizes: Vec<u64>,
    /// Internal: serve a simulator for `--sim child` until stdin closes.
    #[arg(long, hide = true)]
    serve_sim: bool,
}

impl Args {
    fn settings(&self, requests: u64) -> RunSettings {
        RunSettings {
            requests,
            body_bytes: self.body_bytes,
            max_batch_requests: self.max_batch_requests,
            dir: self.dir.clone(),
            keep: self.keep,
            sim: self.sim,
            db: self.db.clone(),
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| EnvFilter::new("tranche_bench=info,warn")),
        )
        .init();
    let args = Args::parse();
    match run(args).await {
        Ok(code) => code,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.serve_sim {
        sim::serve_until_stdin_closes().await?;
        return Ok(ExitCode::SUCCESS);
    }
    if args.requests == 0 {
        bail!("--requests must be at least 1");
    }
    let smallest = input::MODELS.iter().map(|m| input::min_body_bytes(m)).max().unwrap_or(0);
    if args.body_bytes < smallest {
        bail!("--body-bytes must be at least {smallest} (a chat body with an empty message)");
    }
    let mut out = std::io::stdout().lock();
    if args.compare {
        let runs = compare(&args).await?;
        if args.json {
            let summary = serde_json::json!({ "runs": runs });
            writeln!(out, "{summary}")?;
        } else {
            for r in &runs {
                report::write_table(&mut out, r)?;
                writeln!(out)?;
            }
            report::write_comparison(&mut out, &runs)?;
        }
        return Ok(exit_code(&runs));
    }
    let report = pipeline::run(&args.settings(args.requests)).await?;
    if args.json {
        writeln!(out, "{}", serde_json::to_string(&report)?)?;
    } else {
        report::write_table(&mut out, &report)?;
    }
    Ok(exit_code(std::slice::from_ref(&report)))
}

/// Failure when a run lost or left behind anything; speed never fails a run.
fn exit_code(runs: &[Report]) -> ExitCode {
    if runs.iter().all(Report::complete) { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// Runs this binary once per size, each in a fresh process so that peak RSS is its own.
async fn compare(args: &Args) -> anyhow::Result<Vec<Report>> {
    let exe = std::env::current_exe().context("finding this binary")?;
    let mut runs = Vec::new();
    for &requests in &args.compare_sizes {
        tracing::info!(requests, "starting a run in its own process");
        let mut command = tokio::process::Command::new(&exe);
        command
            .args(["--requests", &requests.to_string()])
            .args(["--body-bytes", &args.body_bytes.to_string()])
            .args(["--max-batch-requests", &args.max_batch_requests.to_string()])
            .args(["--sim", args.sim.as_str()])
            .arg("--json")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if let Some(dir) = &args.dir {
            command.arg("--dir").arg(dir);
        }
        if args.keep {
            command.arg("--keep");
        }
        // `output()` would capture stderr too; `spawn` keeps it inherited, for progress.
        let child = command.spawn().context("starting the benchmark process")?;
        let output = child.wait_with_output().await.context("running the benchmark process")?;
        let text = String::from_utf8_lossy(&output.stdout);
        let report: Report =
            text.lines().rev().find_map(|line| serde_json::from_str(line).ok()).with_context(
                || format!("the run at {requests} requests printed no report ({})", output.status),
            )?;
        runs.push(report);
    }
    runs.sort_by_key(|r| r.requests);
    Ok(runs)
}
