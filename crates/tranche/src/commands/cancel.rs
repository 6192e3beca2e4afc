//! `tranche cancel JOB`: cancel a job and, unless `--no-wait`, carry the cancel out.

use std::process::ExitCode;

use tokio_util::sync::CancellationToken;
use tranche_app::{App, Until};

use crate::args::{CancelArgs, Global};
use crate::context;
use crate::exit::{CmdResult, Exit};
use crate::render;

pub async fn run(app: App, global: &Global, args: CancelArgs) -> CmdResult {
    let job = app.find_job(&args.job).await?;
    let id = job.id;
    if args.no_wait {
        // Recording the cancel calls no provider; a worker carries it out.
        let engine = context::recording_engine(&app, global).await?;
        let cancelled = app.cancel(&engine, &job).await?;
        tracing::info!(job = %id, cancelled, "cancel recorded");
    } else {
        let engine =
            context::engine(&app, global, &args.provider, Some(job.provider), &args.engine).await?;
        let cancelled = app.cancel(&engine, &job).await?;
        tracing::info!(job = %id, cancelled, "cancel recorded");
        engine.drive(Until::JobEnds(id), &CancellationToken::new(), || {}).await?;
    }
    let job = app.job(id).await?;
    if args.json {
        let status = app.status(&job).await?;
        let text =
            serde_json::to_string(&status).map_err(|e| Exit::from(anyhow::Error::from(e)))?;
        render::println(&text);
    } else {
        render::println(&format!("job {id}: {}", job.state));
    }
    Ok(ExitCode::SUCCESS)
}
