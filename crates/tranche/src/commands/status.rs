//! `tranche status [JOB] [--json]`.

use std::process::ExitCode;

use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use tranche_core::JobId;
use tranche_store::{JobRecord, Store};

use crate::args::{Global, StatusArgs};
use crate::context;
use crate::exit::{CmdResult, Exit};
use crate::render;

pub fn parse_job(text: &str) -> Result<JobId, Exit> {
    text.parse::<JobId>()
        .map_err(|e| Exit::usage(anyhow::anyhow!("{e} (job ids look like job_0195…)")))
}

/// The stored job a command-line argument names; a usage error when there is none.
pub async fn find_job(store: &dyn Store, text: &str) -> Result<JobRecord, Exit> {
    let id = parse_job(text)?;
    store.job(id).await?.ok_or_else(|| Exit::usage(anyhow::anyhow!("no job {id} in this store")))
}

pub async fn run(global: &Global, args: StatusArgs) -> CmdResult {
    let store = context::open_store(global).await?;
    let Some(job) = args.job else {
        let jobs = store.recent_jobs(20).await?;
        if args.json {
            let mut all = Vec::new();
            for job in &jobs {
                all.push(render::job_status(&*store, job).await?);
            }
            render::println(&serde_json::Value::Array(all).to_string());
            return Ok(ExitCode::SUCCESS);
        }
        let mut table = Table::new();
        table.load_preset(UTF8_FULL_CONDENSED);
        table.set_header(vec![
            "job",
            "state",
            "provider",
            "accepted",
            "succeeded",
            "failed",
            "pending",
            "source",
        ]);
        for job in &jobs {
            let counts = store.job_counts(job.id).await?;
            table.add_row(vec![
                job.id.to_string(),
                job.state.to_string(),
                job.provider.to_string(),
                counts.accepted.to_string(),
                counts.succeeded.to_string(),
                counts.failed.to_string(),
                counts.open().to_string(),
                job.source.clone().unwrap_or_default(),
            ]);
        }
        render::println(&table.to_string());
        return Ok(ExitCode::SUCCESS);
    };
    let job = find_job(&*store, &job).await?;
    let status = render::job_status(&*store, &job).await?;
    if args.json {
        render::println(&status.to_string());
    } else {
        render::println(&serde_json::to_string_pretty(&status).unwrap_or_default());
    }
    Ok(ExitCode::SUCCESS)
}
