//! `tranche reparse JOB [--schema FILE]`: judge a job's answers again from its stored raw
//! results, with no provider call.

use std::process::ExitCode;

use tranche_app::{App, ReparseError};

use crate::args::{EngineArgs, Global, ReparseArgs, read_schema};
use crate::context;
use crate::exit::{CmdResult, Exit};
use crate::render;

pub async fn run(app: App, global: &Global, args: ReparseArgs) -> CmdResult {
    let job = app.find_job(&args.job).await?;
    let schema = args
        .schema
        .as_deref()
        .map(read_schema)
        .transpose()
        .map_err(|e| Exit::usage(anyhow::anyhow!(e)))?;
    // Reading result lines needs the provider's parser, not its credentials: without them
    // the answers are still judged, only unreadable lines cannot be read again.
    let engine = match context::engine(
        &app,
        global,
        &args.provider,
        Some(job.provider),
        &EngineArgs::default(),
    )
    .await
    {
        Ok(engine) => engine,
        Err(_) => context::recording_engine(&app, global).await?,
    };
    let report = engine.reparse(&job, schema).await.map_err(|e| match e {
        ReparseError::NotEnded(..) | ReparseError::Cancelled(_) | ReparseError::Schema(_) => {
            Exit::usage(anyhow::Error::from(e))
        }
        other => Exit::from(anyhow::Error::from(other)),
    })?;
    if args.json {
        let text =
            serde_json::to_string(&report).map_err(|e| Exit::from(anyhow::Error::from(e)))?;
        render::println(&text);
    } else {
        render::println(&format!(
            "job {}: {} answer(s) judged again: {} now succeed, {} now fail, {} go out again, {} line(s) still unreadable",
            job.id,
            report.judged,
            report.promoted,
            report.demoted,
            report.resent,
            report.undecodable
        ));
        if report.resent > 0 {
            render::println(&format!(
                "the job is open again: `tranche worker --until-idle` sends them (then `tranche status {}`)",
                job.id
            ));
        }
    }
    Ok(ExitCode::SUCCESS)
}
