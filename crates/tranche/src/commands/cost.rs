//! `tranche cost JOB | --since DATE [--tenant T] [--json]` and `tranche cost estimate FILE`.

use std::process::ExitCode;

use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use tranche_app::{CostTotals, ModelCost};
use tranche_core::price::PriceTable;

use crate::args::{CostArgs, CostCommand, EngineArgs, EstimateArgs, Global, ProviderArgs};
use crate::context;
use crate::exit::{CmdResult, Exit};
use crate::render;

/// The price table in force: the bundled one under `--prices`, `TRANCHE_PRICES` or the
/// configuration file's `prices`.
fn prices(global: &Global, file: Option<&std::path::Path>) -> Result<PriceTable, Exit> {
    // A file named on the command line is read from where the command runs.
    let prices = file
        .map(std::path::absolute)
        .transpose()
        .map_err(|e| Exit::usage(anyhow::anyhow!("--prices: {e}")))?;
    let args = EngineArgs { prices, ..EngineArgs::default() };
    let settings = context::engine_settings(global, &args, &ProviderArgs::none())?;
    Ok(settings.price_table(&global.data_dir)?)
}

pub async fn run(global: &Global, args: CostArgs) -> CmdResult {
    if let Some(CostCommand::Estimate(estimate)) = args.command {
        return run_estimate(global, estimate);
    }
    let prices = prices(global, args.prices.as_deref())?;
    let app = context::open_app(global).await?;
    let result = report(&app, &args, &prices).await;
    app.close().await;
    result
}

async fn report(app: &tranche_app::App, args: &CostArgs, prices: &PriceTable) -> CmdResult {
    let (heading, json, totals, by_model) = match (&args.job, &args.since) {
        (Some(job), _) => {
            let job = app.find_job(job).await?;
            let cost = app.job_cost(&job, prices).await?;
            (format!("job {}", cost.job_id), to_json(&cost)?, cost.totals, cost.by_model)
        }
        (None, Some(since)) => {
            let cost = app.period_cost(since, args.tenant.as_deref(), prices).await?;
            let whose = cost.tenant.as_deref().map(|t| format!(", tenant {t}")).unwrap_or_default();
            (format!("since {}{whose}", cost.since), to_json(&cost)?, cost.totals, cost.by_model)
        }
        (None, None) => return Err(Exit::usage(anyhow::anyhow!("name a job, or give --since"))),
    };
    if args.json {
        render::println(&json);
    } else {
        render::println(&models_table(&by_model).to_string());
        render::println(&totals_table(&heading, &totals).to_string());
    }
    Ok(ExitCode::SUCCESS)
}

fn to_json(value: &impl serde::Serialize) -> Result<String, Exit> {
    serde_json::to_string(value).map_err(|e| Exit::from(anyhow::Error::from(e)))
}

fn models_table(rows: &[ModelCost]) -> Table {
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header(vec![
        "provider",
        "model",
        "requests",
        "input",
        "cached",
        "cache write",
        "output",
        "cost",
        "sync cost",
    ]);
    for row in rows {
        let t = &row.tokens;
        table.add_row(vec![
            row.provider.to_string(),
            row.model.clone(),
            row.requests.to_string(),
            t.input.to_string(),
            t.cached_input.to_string(),
            t.cache_write().to_string(),
            t.output.to_string(),
            render::usd(row.costs.map(|c| c.cost)),
            render::usd(row.costs.map(|c| c.sync_cost)),
        ]);
    }
    table
}

fn totals_table(heading: &str, totals: &CostTotals) -> Table {
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header(vec!["cost", heading]);
    let t = &totals.tokens;
    let tokens = [
        ("input tokens", t.input),
        ("  read from the cache", t.cached_input),
        ("  written to the cache", t.cache_write_input),
        ("output tokens", t.output),
    ];
    for (name, n) in tokens {
        table.add_row(vec![name.to_owned(), n.to_string()]);
    }
    for (name, value) in render::cost_rows(totals) {
        table.add_row(vec![name.to_owned(), value]);
    }
    table
}

fn run_estimate(global: &Global, args: EstimateArgs) -> CmdResult {
    let prices = prices(global, args.prices.as_deref())?;
    let settings = args.input.job_settings().map_err(|e| Exit::usage(anyhow::anyhow!(e)))?;
    let provider = args.input.provider;
    let per_month = args.per_month.map(|runs| (runs, args.cache_hit_rate));
    let report = tranche_app::estimate_file(&args.file, provider, &settings, &prices, per_month)?;
    if args.json {
        render::println(&to_json(&report)?);
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header(vec!["estimate", &args.file.display().to_string()]);
    let mut rows = vec![
        ("requests", report.requests.to_string()),
        ("input tokens", report.input_tokens.to_string()),
        ("output tokens at most", report.max_output_tokens.to_string()),
        ("cost at most (batch)", render::usd(report.cost_max)),
        ("synchronous cost at most", render::usd(report.sync_cost_max)),
    ];
    if !report.unpriced_models.is_empty() {
        rows.push(("unpriced models", report.unpriced_models.join(", ")));
    }
    if report.unbounded_requests > 0 {
        let n = report.unbounded_requests;
        rows.push(("requests no worst case holds", format!("{n} (images, audio or files)")));
    }
    if let Some(m) = &report.monthly {
        let label = format!("{} runs a month, {:.0}% cache hits", m.runs, m.cache_hit_rate * 100.0);
        rows.push(("per month", format!("{} ({label})", render::usd(m.cost))));
    }
    for (name, value) in rows {
        table.add_row(vec![name.to_owned(), value]);
    }
    render::println(&table.to_string());
    Ok(ExitCode::SUCCESS)
}
