//! `tranche run` (submit, then work until the job ends) and `tranche submit`.

use std::process::ExitCode;
use std::time::Instant;

use tokio_util::sync::CancellationToken;
use tranche_app::{App, Engine, ExportOptions, Job, Outcome, Submitted, Until, upstream_text};

use crate::args::{Global, RunArgs, SubmitArgs};
use crate::context;
use crate::exit::{self, CmdResult, Exit};
use crate::render::{self, JobProgress};

pub async fn submit(app: App, global: &Global, args: SubmitArgs) -> CmdResult {
    // Accepting a job sends nothing, so it needs no provider credentials.
    let engine = context::recording_engine(&app, global).await?;
    let settings = args.input.job_settings().map_err(|e| Exit::usage(anyhow::anyhow!(e)))?;
    let submitted = app.submit_file(&engine, &args.file, args.input.provider, settings).await?;
    if args.json {
        render::println(&serde_json::json!({ "job_id": submitted.job_id.to_string() }).to_string());
    } else {
        render::println(&format!("accepted {} requests", submitted.accepted));
        render::println(&submitted.job_id.to_string());
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn run(app: App, global: &Global, args: RunArgs) -> CmdResult {
    let started = Instant::now();
    let engine =
        context::engine(&app, global, &args.provider, Some(args.input.provider), &args.engine)
            .await?;
    let settings = args.input.job_settings().map_err(|e| Exit::usage(anyhow::anyhow!(e)))?;
    let submitted = app.submit_file(&engine, &args.file, args.input.provider, settings).await?;
    tracing::info!(job = %submitted.job_id, accepted = submitted.accepted, "job accepted");
    let job = drive_job(&app, &engine, submitted).await?;
    if let Some(out) = &args.out {
        app.export_to(&job, ExportOptions::default(), out).await?;
    }
    if args.json {
        let status = app.status(&job).await?;
        let text =
            serde_json::to_string(&status).map_err(|e| Exit::from(anyhow::Error::from(e)))?;
        render::println(&text);
    } else {
        let prices = context::engine_settings(global, &args.engine, &args.provider)?
            .price_table(&global.data_dir)?;
        let table = render::summary_table(&app, &job, started.elapsed(), &prices).await?;
        render::println(&table.to_string());
        if let Some(out) = &args.out {
            render::println(&format!("results: {}", out.display()));
        } else {
            render::println(&format!("results: tranche results {} --out results.jsonl", job.id));
        }
    }
    job_exit(&app, &job).await
}

/// Works until the job ends, with a progress bar; ctrl-c stops working (the job stays).
pub async fn drive_job(app: &App, engine: &Engine, submitted: Submitted) -> Result<Job, Exit> {
    let progress = JobProgress::new(submitted.accepted);
    let cancel = CancellationToken::new();
    let on_signal = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            on_signal.cancel();
        }
    });
    let job_id = submitted.job_id;
    let (tx, mut rx) = tokio::sync::watch::channel(());
    let updater = async {
        while rx.changed().await.is_ok() {
            progress.update(app, job_id).await;
        }
        progress.update(app, job_id).await;
        progress.finish();
    };
    let driver = async {
        let result = engine.drive(Until::JobEnds(job_id), &cancel, || {
            let _ = tx.send(());
        });
        let result = result.await;
        drop(tx);
        result
    };
    let (result, ()) = tokio::join!(driver, updater);
    result?;
    let job = app.job(job_id).await?;
    if cancel.is_cancelled() && !job.state.is_terminal() {
        return Err(Exit {
            code: 130,
            error: anyhow::anyhow!(
                "interrupted; job {job_id} is stored and continues with `tranche worker`"
            ),
        });
    }
    Ok(job)
}

/// 0 when every request succeeded, 1 when some failed, 3 when an upstream failure stopped or
/// paused it, 4 when its answers await review.
pub async fn job_exit(app: &App, job: &Job) -> CmdResult {
    match app.outcome(job).await? {
        Outcome::Stopped(error) => Err(Exit {
            code: exit::UPSTREAM,
            error: anyhow::anyhow!(
                "job {} stopped by an upstream failure: {}",
                job.id,
                upstream_text(&error)
            ),
        }),
        Outcome::Paused(error) => Err(Exit {
            code: exit::UPSTREAM,
            error: anyhow::anyhow!(
                "job {} is paused: {}; it is kept, and a worker (`tranche worker`) finishes it once the account has room",
                job.id,
                upstream_text(&error)
            ),
        }),
        Outcome::AwaitsReview => Err(Exit {
            code: exit::AWAITS_REVIEW,
            error: anyhow::anyhow!(
                "job {id} awaits review: `tranche review {id}`, then `tranche approve {id}` or `tranche reject {id}`",
                id = job.id
            ),
        }),
        Outcome::SomeFailed => Ok(ExitCode::from(exit::JOB_FAILED_REQUESTS)),
        Outcome::Succeeded => Ok(ExitCode::from(exit::SUCCESS)),
    }
}
