//! Printing: lines on stdout, progress bars and summary tables.

use std::io::Write;
use std::time::Duration;

use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use indicatif::{ProgressBar, ProgressStyle};
use tranche_app::{App, AppError, CostTotals, Job, Summary};
use tranche_core::JobId;
use tranche_core::price::PriceTable;

/// Writes `text` and a newline to stdout.
pub fn println(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{text}");
}

/// A progress bar over a job's requests, on stderr (hidden when stderr is not a terminal).
#[derive(Debug)]
pub struct JobProgress {
    bar: ProgressBar,
}

impl JobProgress {
    pub fn new(total: u64) -> Self {
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:40.cyan/blue} {pos}/{len} requests  {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.enable_steady_tick(Duration::from_millis(120));
        Self { bar }
    }

    pub async fn update(&self, app: &App, job: JobId) {
        let Ok(progress) = app.progress(job).await else { return };
        self.bar.set_position(progress.done);
        let text: Vec<String> =
            progress.tranches.iter().map(|(state, n)| format!("{n} {state}")).collect();
        self.bar.set_message(format!("tranches: {}", text.join(", ")));
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// The summary table printed when a job ends, with what it cost.
pub async fn summary_table(
    app: &App,
    job: &Job,
    elapsed: Duration,
    prices: &PriceTable,
) -> Result<Table, AppError> {
    let Summary { counts, tranches, files, tokens } = app.summary(job.id).await?;
    let cost = app.job_cost(job, prices).await?;
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header(vec!["job", &job.id.to_string()]);
    let rows: Vec<(&str, String)> = vec![
        ("state", job.state.to_string()),
        ("requests", counts.accepted.to_string()),
        ("succeeded", counts.succeeded.to_string()),
        ("failed", counts.failed.to_string()),
        ("cancelled", counts.cancelled.to_string()),
        ("answered from earlier results", counts.cached.to_string()),
        ("needed a retry", counts.retried.to_string()),
        ("still pending", counts.pending.to_string()),
        ("tranches (provider batches)", tranches.to_string()),
        ("input tokens", tokens.input_tokens.to_string()),
        ("output tokens", tokens.output_tokens.to_string()),
        ("files uploaded", files.uploaded.to_string()),
        ("result files collected", files.created_by_provider.to_string()),
        (
            "provider files deleted",
            format!("{} of {}", files.deleted, files.uploaded + files.created_by_provider),
        ),
    ];
    let elapsed = ("elapsed", format!("{:.1} s", elapsed.as_secs_f64()));
    for (name, value) in rows.into_iter().chain(cost_rows(&cost.totals)).chain([elapsed]) {
        table.add_row(vec![name.to_owned(), value]);
    }
    Ok(table)
}

/// Dollars to the hundredth of a cent, or why there is no figure.
pub fn usd(amount: Option<f64>) -> String {
    amount.map_or_else(|| "unknown (unpriced model)".to_owned(), |v| format!("${v:.4}"))
}

/// The totals a person reads; also the cost rows of the demo's table.
pub fn cost_rows(totals: &CostTotals) -> Vec<(&'static str, String)> {
    let mut rows = vec![
        ("cost (batch, as billed)", usd(totals.cost)),
        ("synchronous cost, no cache", usd(totals.sync_cost)),
        ("saved by batching", usd(totals.savings.batch)),
        ("saved by the prompt cache", usd(totals.savings.cache)),
        ("saved by earlier results", usd(totals.savings.dedup)),
    ];
    if !totals.unpriced_models.is_empty() {
        rows.push(("unpriced models", totals.unpriced_models.join(", ")));
    }
    rows
}
