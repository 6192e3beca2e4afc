//! Printing: status objects, result lines, progress bars and summary tables.

use std::io::Write;
use std::time::Duration;

use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use futures::TryStreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use serde_json::value::RawValue;
use tranche_core::{CustomId, JobId, RequestState};
use tranche_store::{JobRecord, Store, StoreError};

/// Writes `text` and a newline to stdout.
pub fn println(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{text}");
}

/// The `status --json` object of one job.
pub async fn job_status(
    store: &dyn Store,
    job: &JobRecord,
) -> Result<serde_json::Value, StoreError> {
    let counts = store.job_counts(job.id).await?;
    let tranches: serde_json::Map<String, serde_json::Value> = store
        .job_tranche_counts(job.id)
        .await?
        .into_iter()
        .map(|(state, n)| (state.as_str().to_owned(), n.into()))
        .collect();
    let tokens = store.job_tokens(job.id).await?;
    let files = store.job_file_counts(job.id).await?;
    let live = store.job_live_tranches(job.id).await?;
    // Which engine is stepping which of the job's tranches (leases the database has not yet
    // seen lapse; one whose engine died shows until it does).
    let leases: Vec<serde_json::Value> = live
        .iter()
        .filter_map(|(tranche, _)| {
            let owner = tranche.lease_owner.as_ref()?;
            Some(serde_json::json!({
                "tranche_id": tranche.id.to_string(),
                "state": tranche.state.as_str(),
                "engine": owner.as_str(),
                "lease_expires_at_ms": tranche.lease_expires_at,
            }))
        })
        .collect();
    // Why unfinished tranches are held up (retry backoff, an adoption that waits), if they are.
    let waiting: Vec<serde_json::Value> = live
        .into_iter()
        .filter_map(|(tranche, _)| {
            let error = tranche.last_error?;
            Some(serde_json::json!({
                "tranche_id": tranche.id.to_string(),
                "state": tranche.state.as_str(),
                "not_before": tranche.not_before,
                "reason": error,
            }))
        })
        .collect();
    Ok(serde_json::json!({
        "job_id": job.id.to_string(),
        "state": job.state.as_str(),
        "provider": job.provider.as_str(),
        "tenant": job.settings.tenant,
        "source": job.source,
        "created_at": job.created_at,
        "finished_at": job.finished_at,
        "counts": {
            "accepted": counts.accepted,
            "succeeded": counts.succeeded,
            "failed": counts.failed,
            "cancelled": counts.cancelled,
            "pending": counts.open(),
            "cached": counts.cached,
            "retried": counts.retried,
        },
        "tranches": tranches,
        "tokens": tokens,
        "files": files,
        "error": job.last_error,
        "waiting": waiting,
        "leases": leases,
    }))
}

#[derive(Serialize)]
struct ResultLine<'a> {
    custom_id: &'a str,
    key: &'a str,
    status: &'a str,
    output: Option<Box<RawValue>>,
    error: Option<Box<RawValue>>,
}

fn status_name(state: RequestState) -> &'static str {
    match state {
        RequestState::Pending | RequestState::Queued => "pending",
        other => other.as_str(),
    }
}

/// Streams a job's results as JSONL, one line per request in input order. Returns the count.
pub async fn write_results(
    store: &dyn Store,
    job: JobId,
    out: &mut impl Write,
) -> anyhow::Result<u64> {
    let mut rows = store.job_results(job);
    let mut n = 0;
    while let Some(row) = rows.try_next().await? {
        let key = CustomId::parse(&row.custom_id)
            .map(|id| id.key().to_owned())
            .unwrap_or_else(|_| row.custom_id.clone());
        let line = ResultLine {
            custom_id: &row.custom_id,
            key: &key,
            status: status_name(row.state),
            output: row.output.map(RawValue::from_string).transpose()?,
            error: row.error.map(RawValue::from_string).transpose()?,
        };
        serde_json::to_writer(&mut *out, &line)?;
        out.write_all(b"\n")?;
        n += 1;
    }
    out.flush()?;
    Ok(n)
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

    pub async fn update(&self, store: &dyn Store, job: JobId) {
        let Ok(counts) = store.job_counts(job).await else { return };
        self.bar.set_position(counts.succeeded + counts.failed + counts.cancelled);
        if let Ok(tranches) = store.job_tranche_counts(job).await {
            let text: Vec<String> =
                tranches.iter().map(|(state, n)| format!("{n} {state}")).collect();
            self.bar.set_message(format!("tranches: {}", text.join(", ")));
        }
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// The summary table printed when a job ends.
pub async fn summary_table(
    store: &dyn Store,
    job: &JobRecord,
    elapsed: Duration,
) -> Result<Table, StoreError> {
    let counts = store.job_counts(job.id).await?;
    let tranches: u64 = store.job_tranche_counts(job.id).await?.iter().map(|(_, n)| n).sum();
    let files = store.job_file_counts(job.id).await?;
    let tokens = store.job_tokens(job.id).await?;
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
        ("still pending", counts.open().to_string()),
        ("tranches (provider batches)", tranches.to_string()),
        ("input tokens", tokens.input_tokens.to_string()),
        ("output tokens", tokens.output_tokens.to_string()),
        ("files uploaded", files.uploaded.to_string()),
        ("result files collected", files.created_by_provider.to_string()),
        (
            "provider files deleted",
            format!("{} of {}", files.deleted, files.uploaded + files.created_by_provider),
        ),
        ("elapsed", format!("{:.1} s", elapsed.as_secs_f64())),
    ];
    for (name, value) in rows {
        table.add_row(vec![name.to_owned(), value]);
    }
    Ok(table)
}
