//! One benchmark run: generate the input, measure the I/O floor, then push the input through
//! the real engine and store against the simulator, timing each phase apart.
//!
//! Phases are driven with `Engine::tick` and ended by watching tranche states in the store.
//! Every tick moves every due tranche one step, so with no faults all tranches move in lock
//! step and the steps can be timed one by one: all tranches uploaded, all created, all
//! collected, all ingested, the job settled.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use secrecy::SecretString;
use tracing::info;
use tranche_core::JobSettings;
use tranche_core::{Endpoint, JobId, ProviderKind, TrancheState};
use tranche_engine::{Engine, EngineConfig, Providers};
use tranche_providers::{OpenAiConfig, OpenAiProvider, http_client};
use tranche_store::Store;
use tranche_store_postgres::PgStore;
use tranche_store_sqlite::SqliteStore;

use crate::floor;
use crate::input;
use crate::procfs::{PeakTracker, Proc};
use crate::report::{Disk, Group, Outcome, Phase, Report};
use crate::sim::{Sim, SimMode};

/// Settings of one run.
#[derive(Debug, Clone)]
pub struct RunSettings {
    pub requests: u64,
    pub body_bytes: usize,
    pub max_batch_requests: usize,
    /// Where to make the run's working folder (removed afterwards unless `keep`).
    pub dir: Option<PathBuf>,
    pub keep: bool,
    pub sim: SimMode,
    /// A `postgres://` URL of an empty database to use instead of a SQLite file in the
    /// working folder.
    pub db: Option<String>,
}

/// A tick-driven phase that has not ended after this many ticks is stuck.
const MAX_TICKS: u32 = 10_000;

/// Virtual seconds the simulator's clock is moved by: far more than any batch here needs at
/// a billion lines per second, far less than the 24 h completion window.
const ADVANCE_SECONDS: f64 = 3_600.0;

/// Times phases and samples memory and CPU around them.
struct Meter {
    this: PeakTracker,
    sim: Option<(Proc, PeakTracker)>,
    phases: Vec<Phase>,
    observer: Duration,
}

/// CPU totals at one moment.
#[derive(Clone, Copy)]
struct Cpu {
    this: Option<f64>,
    sim: Option<f64>,
}

impl Meter {
    fn cpu(&self) -> Cpu {
        Cpu {
            this: Proc::This.cpu_seconds(),
            sim: self.sim.as_ref().and_then(|(p, _)| p.cpu_seconds()),
        }
    }

    /// Starts a phase: resets the peaks so that the phase's own peak can be read at its end.
    fn begin(&mut self) {
        self.this.phase_peak();
        if let Some((_, sim)) = &mut self.sim {
            sim.phase_peak();
        }
    }

    fn end(&mut self, name: &str, group: Group, seconds: f64, cpu: Cpu, ticks: u32) {
        let peak_rss = self.this.phase_peak();
        let rss_after = Proc::This.memory().map_or(0, |m| m.rss);
        let sim_rss_after = self.sim.as_mut().map(|(p, tracker)| {
            tracker.phase_peak();
            p.memory().map_or(0, |m| m.rss)
        });
        info!(phase = name, seconds = format!("{seconds:.2}"), ticks, "phase done");
        self.phases.push(Phase {
            name: name.to_owned(),
            group,
            seconds,
            cpu_seconds: cpu.this,
            sim_cpu_seconds: cpu.sim,
            ticks,
            peak_rss,
            rss_after,
            sim_rss_after,
        });
    }

    /// Times one action that is not a tick loop.
    async fn once<T, F: Future<Output = anyhow::Result<T>>>(
        &mut self,
        name: &str,
        group: Group,
        action: F,
    ) -> anyhow::Result<T> {
        self.begin();
        let before = self.cpu();
        let started = Instant::now();
        let value = action.await?;
        let seconds = started.elapsed().as_secs_f64();
        let after = self.cpu();
        self.end(name, group, seconds, diff(before, after), 0);
        Ok(value)
    }
}

fn diff(before: Cpu, after: Cpu) -> Cpu {
    let sub = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| (b - a).max(0.0));
    Cpu { this: sub(before.this, after.this), sim: sub(before.sim, after.sim) }
}

fn add(a: Cpu, b: Cpu) -> Cpu {
    let plus = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => Some(a + b),
        (a, b) => a.or(b),
    };
    Cpu { this: plus(a.this, b.this), sim: plus(a.sim, b.sim) }
}

/// When a tick-driven phase ends.
#[derive(Debug, Clone, Copy)]
enum Until {
    /// Every request is claimed by a tranche and every tranche is at least in this state.
    AllAtLeast(TrancheState),
    /// The job has ended.
    JobEnds,
}

/// Ticks the engine until `until` holds; the checks between ticks are not timed.
async fn drive(
    meter: &mut Meter,
    engine: &Engine,
    job: JobId,
    name: &str,
    group: Group,
    until: Until,
) -> anyhow::Result<()> {
    meter.begin();
    let mut seconds = 0.0;
    let mut cpu = Cpu { this: None, sim: None };
    for ticks in 1..=MAX_TICKS {
        let before = meter.cpu();
        let started = Instant::now();
        engine.tick().await.with_context(|| format!("a tick of phase `{name}`"))?;
        seconds += started.elapsed().as_secs_f64();
        cpu = add(cpu, diff(before, meter.cpu()));
        let watching = Instant::now();
        let done = reached(engine.store(), job, until).await?;
        meter.observer += watching.elapsed();
        if done {
            meter.end(name, group, seconds, cpu, ticks);
            return Ok(());
        }
    }
    bail!("phase `{name}` did not end within {MAX_TICKS} ticks")
}

async fn reached(store: &dyn Store, job: JobId, until: Until) -> anyhow::Result<bool> {
    match until {
        Until::AllAtLeast(state) => {
            let tranches = store.job_tranche_counts(job).await?;
            if tranches.iter().any(|(s, _)| *s == TrancheState::Failed) {
                let record = store.job(job).await?;
                let error = record.and_then(|j| j.last_error).unwrap_or_default();
                bail!("a tranche failed: {error}");
            }
            if tranches.is_empty() || tranches.iter().any(|(s, _)| *s < state) {
                return Ok(false);
            }
            Ok(store.job_counts(job).await?.pending == 0)
        }
        Until::JobEnds => Ok(store.job(job).await?.is_some_and(|j| j.state.is_terminal())),
    }
}

fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// Bytes of every file under `dir` (one level of folders deep, as raw results are kept).
fn tree_size(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => tree_size(&e.path()),
            _ => e.metadata().map_or(0, |m| m.len()),
        })
        .sum()
}

/// The run's working folder: a fresh temporary folder, inside `dir` when given.
fn workdir(settings: &RunSettings) -> anyhow::Result<tempfile::TempDir> {
    let mut builder = tempfile::Builder::new();
    builder.prefix("tranche-bench-");
    match &settings.dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create `{}`", dir.display()))?;
            builder.tempdir_in(dir)
        }
        None => builder.tempdir(),
    }
    .context("creating the working folder")
}

/// Runs the benchmark once.
pub async fn run(settings: &RunSettings) -> anyhow::Result<Report> {
    let work = workdir(settings)?;
    let root = work.path().to_path_buf();
    info!(dir = %root.display(), requests = settings.requests, "working folder");
    let result = run_in(settings, &root).await;
    if settings.keep {
        let kept = work.keep();
        info!(dir = %kept.display(), "kept the working folder");
    } else {
        let started = Instant::now();
        work.close().context("removing the working folder")?;
        info!(
            seconds = format!("{:.1}", started.elapsed().as_secs_f64()),
            "removed the working folder"
        );
    }
    result
}

async fn run_in(settings: &RunSettings, root: &Path) -> anyhow::Result<Report> {
    let mut this = PeakTracker::new(Proc::This);

    let input_path = root.join("input.jsonl");
    let started = Instant::now();
    let (requests, body_bytes) = (settings.requests, settings.body_bytes);
    let path = input_path.clone();
    let input_bytes =
        tokio::task::spawn_blocking(move || input::write_file(&path, requests, body_bytes))
            .await
            .context("the input generator stopped")?
            .context("writing the input")?;
    let generate_seconds = started.elapsed().as_secs_f64();
    info!(bytes = input_bytes, seconds = format!("{generate_seconds:.2}"), "input written");

    let (path, scratch) = (input_path.clone(), root.join("floor.scratch"));
    let floor = tokio::task::spawn_blocking(move || floor::measure(&path, &scratch))
        .await
        .context("the floor measurement stopped")?
        .context("measuring the I/O floor")?;
    info!(seconds = format!("{:.2}", floor.seconds()), "I/O floor measured");
    this.phase_peak();

    let sim = Sim::start(settings.sim).await?;
    let mut openai = OpenAiConfig::new(SecretString::from("sk-bench-key"));
    openai.base_url = sim.openai_base_url();
    let provider = OpenAiProvider::new(openai, http_client().context("building the HTTP client")?)
        .context("configuring the provider")?;
    let store: Arc<dyn Store> = match &settings.db {
        Some(url) => Arc::new(PgStore::open(url).await?),
        None => Arc::new(SqliteStore::open(&root.join("tranche.db").to_string_lossy()).await?),
    };
    let config = EngineConfig {
        poll_interval: Duration::ZERO,
        retry_backoff: Duration::from_millis(100),
        max_batch_requests: Some(settings.max_batch_requests),
        ..EngineConfig::in_dir(root)
    };
    let engine = Engine::new(store, Providers::new().with(Arc::new(provider)), config);
    let mut meter = Meter {
        this,
        sim: sim.process().map(|p| (p, PeakTracker::new(p))),
        phases: Vec::new(),
        observer: Duration::ZERO,
    };

    // 1. Parse + fingerprint + store, as `tranche run` feeds a file.
    let submitted = meter
        .once("submit (parse, hash, store)", Group::Submit, async {
            let file = tokio::fs::File::open(&input_path)
                .await
                .with_context(|| format!("cannot open `{}`", input_path.display()))?;
            let settings = JobSettings {
                task: Some(input::TASK.to_owned()),
                version: Some("v1".to_owned()),
                endpoint: Endpoint::ChatCompletions,
                ..JobSettings::default()
            };
            let source = Some(input_path.display().to_string());
            let input = tokio::io::BufReader::new(file);
            Ok(engine.submit(input, ProviderKind::Openai, settings, source).await?)
        })
        .await?;
    let job = submitted.job_id;

    // 2. Plan, write the input files, upload; then create the batches.
    let m = &mut meter;
    drive(
        m,
        &engine,
        job,
        "plan + write files + upload",
        Group::Send,
        Until::AllAtLeast(TrancheState::Uploaded),
    )
    .await?;
    drive(
        m,
        &engine,
        job,
        "create (simulator validates)",
        Group::Send,
        Until::AllAtLeast(TrancheState::Submitted),
    )
    .await?;

    // 3. The simulator runs every line (synchronously, inside the clock advance).
    m.once("simulator runs the lines", Group::Simulator, sim.advance(ADVANCE_SECONDS)).await?;

    // 4. Poll and download the raw results; then ingest them.
    drive(
        m,
        &engine,
        job,
        "collect (poll + download)",
        Group::Receive,
        Until::AllAtLeast(TrancheState::Ingesting),
    )
    .await?;
    drive(m, &engine, job, "ingest", Group::Receive, Until::AllAtLeast(TrancheState::Cleaning))
        .await?;

    // 5. Delete the provider files; the job settles.
    drive(m, &engine, job, "cleanup (delete files, settle)", Group::Cleanup, Until::JobEnds)
        .await?;

    let counts = engine.store().job_counts(job).await?;
    let tranches = engine.store().job_tranche_counts(job).await?.iter().map(|(_, n)| n).sum();
    let stats = sim.stats().await?;
    let outcome = Outcome {
        accepted: submitted.accepted,
        succeeded: counts.succeeded,
        failed: counts.failed,
        cancelled: counts.cancelled,
        sim_requests_billed: stats.requests_billed,
        sim_files_live: stats.files_live,
    };
    let disk = Disk {
        db_bytes: file_size(&root.join("tranche.db")),
        wal_bytes: file_size(&root.join("tranche.db-wal")),
        // The local blob store, where raw results rest (EngineConfig::in_dir puts it there).
        raw_bytes: tree_size(&root.join("blobs")),
    };
    let sim_peak_rss = meter.sim.as_mut().map(|(_, tracker)| tracker.lifetime());
    let peak_rss = meter.this.lifetime();
    let peak_rss_per_phase = meter.this.per_phase();
    engine.store().close().await;
    sim.shutdown().await;

    Ok(Report {
        requests: settings.requests,
        body_bytes: settings.body_bytes,
        input_bytes,
        max_batch_requests: settings.max_batch_requests,
        tranches,
        sim: settings.sim,
        generate_seconds,
        floor,
        phases: meter.phases,
        observer_seconds: meter.observer.as_secs_f64(),
        peak_rss,
        peak_rss_per_phase,
        sim_peak_rss,
        outcome,
        disk,
    })
}
