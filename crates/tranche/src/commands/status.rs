//! `tranche status [JOB] [--json]`.

use std::process::ExitCode;

use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};

use tranche_app::App;

use crate::args::StatusArgs;
use crate::exit::{CmdResult, Exit};
use crate::render;

fn to_json(value: &impl serde::Serialize) -> Result<String, Exit> {
    serde_json::to_string(value).map_err(|e| Exit::from(anyhow::Error::from(e)))
}

pub async fn run(app: App, args: StatusArgs) -> CmdResult {
    let Some(job) = args.job else {
        let jobs = app.recent_jobs(20).await?;
        if args.json {
            let mut all = Vec::new();
            for row in &jobs {
                all.push(app.status(&row.job).await?);
            }
            render::println(&to_json(&all)?);
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
        for row in &jobs {
            table.add_row(vec![
                row.job.id.to_string(),
                row.job.state.to_string(),
                row.job.provider.to_string(),
                row.counts.accepted.to_string(),
                row.counts.succeeded.to_string(),
                row.counts.failed.to_string(),
                row.counts.pending.to_string(),
                row.job.source.clone().unwrap_or_default(),
            ]);
        }
        render::println(&table.to_string());
        return Ok(ExitCode::SUCCESS);
    };
    let job = app.find_job(&job).await?;
    let status = app.status(&job).await?;
    if args.json {
        render::println(&to_json(&status)?);
    } else {
        render::println(&serde_json::to_string_pretty(&status).unwrap_or_default());
    }
    Ok(ExitCode::SUCCESS)
}
