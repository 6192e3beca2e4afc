//! `tranche cancel JOB`: cancel a job and, unless `--no-wait`, carry the cancel out.

use std::process::ExitCode;

use tokio_util::sync::CancellationToken;
use tranche_engine::Until;

use crate::args::{CancelArgs, Global};
use crate::commands::status::find_job;
use crate::context;
use crate::exit::{CmdResult, Exit};
use crate::render;

pub async fn run(global: &Global, args: CancelArgs) -> CmdResult {
    let store = context::open_store(global).await?;
    let job = find_job(&*store, &args.job).await?;
    let id = job.id;
    if job.state.is_terminal() {
        return Err(Exit::usage(anyhow::anyhow!("job {id} has already ended ({})", job.state)));
    }
    let engine = context::engine(global, &args.provider, Some(job.provider), &args.engine).await?;
    let cancelled = engine.cancel_job(id).await?;
    tracing::info!(job = %id, cancelled, "cancel recorded");
    if !args.no_wait {
        engine.drive(Until::JobEnds(id), &CancellationToken::new(), || {}).await?;
    }
    let job = engine
        .store()
        .job(id)
        .await?
        .ok_or_else(|| Exit::from(anyhow::anyhow!("the job vanished from the store")))?;
    let status = render::job_status(engine.store(), &job).await?;
    if args.json {
        render::println(&status.to_string());
    } else {
        render::println(&format!("job {id}: {}", job.state));
    }
    Ok(ExitCode::SUCCESS)
}
