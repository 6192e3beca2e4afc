//! `tranche prune --older-than DURATION`: forget jobs that ended long ago, keeping their
//! summaries.

use std::process::ExitCode;

use tranche_app::App;

use crate::args::{Global, PruneArgs};
use crate::context;
use crate::exit::{CmdResult, Exit};
use crate::render;

pub async fn run(app: App, global: &Global, args: PruneArgs) -> CmdResult {
    // Pruning calls no provider.
    let engine = context::recording_engine(&app, global).await?;
    let report = app.prune(&engine, args.older_than, args.dry_run).await?;
    if args.json {
        let text =
            serde_json::to_string(&report).map_err(|e| Exit::from(anyhow::Error::from(e)))?;
        render::println(&text);
    } else {
        let verb = if report.dry_run { "would remove" } else { "removed" };
        render::println(&format!(
            "{} job(s): {verb} {} request(s) and {} object(s), {} bytes",
            report.jobs, report.requests, report.objects, report.bytes
        ));
    }
    Ok(ExitCode::SUCCESS)
}
