//! `tranche review JOB`, `tranche approve JOB` and `tranche reject JOB [--custom-id ID ...]`:
//! a person looks at a sample of a job's answers, then lets them stand or rejects them.

use std::process::ExitCode;

use tranche_app::{App, DEFAULT_SAMPLE, Rejected, default_seed};

use crate::args::{DecideArgs, RejectArgs, ReviewArgs};
use crate::exit::{CmdResult, Exit};
use crate::render;

pub async fn show(app: App, args: ReviewArgs) -> CmdResult {
    let job = app.find_job(&args.job).await?;
    let n = args.sample.or(job.settings.review_sample).unwrap_or(DEFAULT_SAMPLE);
    let seed =
        args.review_seed.or(job.settings.review_seed).unwrap_or_else(|| default_seed(job.id));
    let items = app.review_sample(&job, n, seed).await?;
    if args.json {
        let text = serde_json::to_string(&items).map_err(|e| Exit::from(anyhow::Error::from(e)))?;
        render::println(&text);
        return Ok(ExitCode::SUCCESS);
    }
    render::println(&format!(
        "job {}: {} answer(s) drawn with seed {seed} ({})",
        job.id,
        items.len(),
        job.state
    ));
    for item in &items {
        render::println("");
        render::println(&format!("── {}", item.custom_id));
        render::println(&format!("input:  {}", item.input.get()));
        match &item.answer {
            Some(answer) => render::println(&format!("answer: {answer}")),
            None => render::println(&format!("output: {}", item.output.get())),
        }
    }
    render::println("");
    render::println(&format!(
        "then: tranche approve {id}   or   tranche reject {id} [--custom-id ID ...]",
        id = job.id
    ));
    Ok(ExitCode::SUCCESS)
}

pub async fn approve(app: App, args: DecideArgs) -> CmdResult {
    let job = app.find_job(&args.job).await?;
    app.decide_review(&job, &decider(&args), Rejected::None).await?;
    render::println(&format!("job {}: answers approved; done", job.id));
    Ok(ExitCode::SUCCESS)
}

pub async fn reject(app: App, args: RejectArgs) -> CmdResult {
    let job = app.find_job(&args.decide.job).await?;
    let rejected =
        if args.custom_ids.is_empty() { Rejected::All } else { Rejected::Only(&args.custom_ids) };
    let n = app.decide_review(&job, &decider(&args.decide), rejected).await?;
    render::println(&format!(
        "job {}: {n} answer(s) rejected (failed with rejected_in_review); done",
        job.id
    ));
    Ok(ExitCode::SUCCESS)
}

/// Who decided: `--by`, else the user's login name.
fn decider(args: &DecideArgs) -> String {
    args.by
        .clone()
        .or_else(|| std::env::var("USER").ok())
        .or_else(|| std::env::var("LOGNAME").ok())
        .filter(|name| !name.trim().is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}
