//! `tranche demo`: a sample job's whole life against an in-process simulator.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use secrecy::SecretString;
use tranche_app::{App, EngineConfig, ExportOptions, Providers};
use tranche_core::JobSettings;
use tranche_core::price::PriceTable;
use tranche_providers::{OpenAiConfig, OpenAiProvider, http_client};
use tranche_sim::{LineFault, LineFaultKind, ProcessingConfig, SimConfig, Simulator};

use crate::args::{DemoArgs, Global};
use crate::commands::run::drive_job;
use crate::demo_data::sample_lines;
use crate::exit::{CmdResult, Exit};
use crate::render;

pub async fn run(global: &Global, args: DemoArgs) -> CmdResult {
    let started = Instant::now();
    let dir = global.data_dir.join("demo");
    if dir.exists() {
        std::fs::remove_dir_all(&dir)
            .with_context(|| format!("cannot clear `{}`", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create `{}`", dir.display()))?;

    let sim = Simulator::spawn(SimConfig {
        speed: args.speed,
        processing: ProcessingConfig { requests_per_second: 20.0, ..ProcessingConfig::default() },
        line_faults: vec![LineFault {
            provider: "any".to_owned(),
            kind: LineFaultKind::Fatal,
            rate: args.fault_rate.clamp(0.0, 1.0),
        }],
        ..SimConfig::default()
    })
    .await
    .context("starting the simulator")?;
    render::println(&format!("simulated OpenAI Batch API at {}", sim.openai_base_url()));

    let mut openai = OpenAiConfig::new(SecretString::from("sk-demo-key"));
    openai.base_url = sim.openai_base_url();
    let provider = OpenAiProvider::new(openai, http_client().context("building the HTTP client")?)
        .context("configuring the provider")?;
    let blobs = EngineConfig::in_dir(&dir).blobs;
    let app = App::open(&dir.join("tranche.db").to_string_lossy(), blobs).await?;
    let config = EngineConfig {
        poll_interval: Duration::from_millis(250),
        retry_backoff: Duration::from_millis(500),
        ..EngineConfig::in_dir(&dir)
    };
    let engine = app.engine(Providers::new().with(Arc::new(provider)), config).await?;

    let input = dir.join("input.jsonl");
    std::fs::write(&input, sample_lines(args.requests))
        .with_context(|| format!("cannot write `{}`", input.display()))?;
    let settings = JobSettings {
        task: Some("triage".to_owned()),
        version: Some("v1".to_owned()),
        ..JobSettings::default()
    };
    let provider = tranche_core::ProviderKind::Openai;
    let prices = PriceTable::bundled();
    let estimate = tranche_app::estimate_file(&input, provider, &settings, &prices, None)?;
    render::println(&format!(
        "estimate: {} input tokens, at most {} output tokens: at most {} in a batch, {} synchronously",
        estimate.input_tokens,
        estimate.max_output_tokens,
        render::usd(estimate.cost_max),
        render::usd(estimate.sync_cost_max),
    ));
    let submitted = app.submit_file(&engine, &input, provider, settings).await?;
    render::println(&format!(
        "job {} accepted: {} requests from {}",
        submitted.job_id,
        submitted.accepted,
        input.display()
    ));

    let job = drive_job(&app, &engine, submitted).await?;
    let results = dir.join("results.jsonl");
    app.export_to(&job, ExportOptions::default(), &results).await?;
    let table = render::summary_table(&app, &job, started.elapsed(), &prices).await?;
    render::println(&table.to_string());
    let stats = sim.stats();
    render::println(&format!(
        "simulator: {} batches created, {} requests billed, {} files still at the provider",
        stats.batches_created, stats.requests_billed, stats.files_live
    ));
    render::println(&format!("results: {}", results.display()));
    render::println(&format!("state:   {}", dir.display()));
    app.close().await;
    sim.shutdown().await;
    if job.state.is_terminal() {
        Ok(ExitCode::SUCCESS)
    } else {
        Err(Exit::from(anyhow::anyhow!("the demo job did not finish")))
    }
}
