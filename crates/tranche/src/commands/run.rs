//! `tranche run` (submit, then work until the job ends) and `tranche submit`.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use tokio::io::BufReader;
use tokio_util::sync::CancellationToken;
use tranche_core::{JobSettings, JobState};
use tranche_engine::{Engine, Providers, SubmitError, Submitted, Until};
use tranche_store::{JobRecord, Store};

use crate::args::{EngineArgs, Global, InputArgs, RunArgs, SubmitArgs};
use crate::context;
use crate::exit::{self, CmdResult, Exit};
use crate::render::{self, JobProgress};

/// What the flags ask of a job.
pub fn job_settings(args: &InputArgs) -> JobSettings {
    JobSettings {
        task: args.task.clone(),
        version: Some(args.task_version.clone()),
        endpoint: args.endpoint(),
        model: args.model.clone(),
        max_attempts: args.max_attempts,
        tenant: args.tenant.clone(),
    }
}

/// Accepts `file` as a job, or explains why not (exit code 2 for bad input).
pub async fn submit_file(
    engine: &Engine,
    file: &Path,
    args: &InputArgs,
) -> Result<Submitted, Exit> {
    let handle = tokio::fs::File::open(file)
        .await
        .with_context(|| format!("cannot open `{}`", file.display()))
        .map_err(Exit::usage)?;
    let source = Some(file.display().to_string());
    engine.submit(BufReader::new(handle), args.provider, job_settings(args), source).await.map_err(
        |e| match e {
            SubmitError::Rejected(rejected) => {
                Exit::usage(anyhow::anyhow!("{}", rejected.to_string().trim_end()))
            }
            SubmitError::Read(e) => {
                Exit::usage(anyhow::Error::from(e).context(format!("reading `{}`", file.display())))
            }
            other => Exit::from(anyhow::Error::from(other)),
        },
    )
}

pub async fn submit(global: &Global, args: SubmitArgs) -> CmdResult {
    // Accepting a job sends nothing, so it needs no provider credentials.
    let store = context::open_store(global).await?;
    let config = context::engine_config(&global.data_dir, &EngineArgs::default())?;
    let engine = Engine::new(store, Providers::new(), config);
    let submitted = submit_file(&engine, &args.file, &args.input).await?;
    if args.json {
        render::println(&serde_json::json!({ "job_id": submitted.job_id.to_string() }).to_string());
    } else {
        render::println(&format!("accepted {} requests", submitted.accepted));
        render::println(&submitted.job_id.to_string());
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn run(global: &Global, args: RunArgs) -> CmdResult {
    let started = Instant::now();
    let engine =
        context::engine(global, &args.provider, Some(args.input.provider), &args.engine).await?;
    let submitted = submit_file(&engine, &args.file, &args.input).await?;
    tracing::info!(job = %submitted.job_id, accepted = submitted.accepted, "job accepted");
    let job = drive_job(&engine, submitted).await?;
    if let Some(out) = &args.out {
        write_results_file(engine.store(), &job, out).await?;
    }
    if args.json {
        let status = render::job_status(engine.store(), &job).await?;
        render::println(&status.to_string());
    } else {
        let table = render::summary_table(engine.store(), &job, started.elapsed()).await?;
        render::println(&table.to_string());
        if let Some(out) = &args.out {
            render::println(&format!("results: {}", out.display()));
        } else {
            render::println(&format!("results: tranche results {} --out results.jsonl", job.id));
        }
    }
    job_exit(engine.store(), &job).await
}

/// Works until the job ends, with a progress bar; ctrl-c stops working (the job stays).
pub async fn drive_job(engine: &Engine, submitted: Submitted) -> Result<JobRecord, Exit> {
    let progress = JobProgress::new(submitted.accepted);
    let cancel = CancellationToken::new();
    let on_signal = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            on_signal.cancel();
        }
    });
    let store = engine.shared_store();
    let job_id = submitted.job_id;
    let (tx, mut rx) = tokio::sync::watch::channel(());
    let updater = {
        let store = Arc::clone(&store);
        async move {
            while rx.changed().await.is_ok() {
                progress.update(&*store, job_id).await;
            }
            progress.update(&*store, job_id).await;
            progress.finish();
        }
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
    let job =
        store.job(job_id).await?.context("the job vanished from the store").map_err(Exit::from)?;
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

pub async fn write_results_file(
    store: &dyn Store,
    job: &JobRecord,
    out: &Path,
) -> Result<u64, Exit> {
    let file = std::fs::File::create(out)
        .with_context(|| format!("cannot create `{}`", out.display()))
        .map_err(Exit::usage)?;
    let mut writer = std::io::BufWriter::new(file);
    render::write_results(store, job.id, &mut writer).await.map_err(Exit::from)
}

/// 0 when every request succeeded, 1 when some failed, 3 when an upstream failure stopped it.
pub async fn job_exit(store: &dyn Store, job: &JobRecord) -> CmdResult {
    let counts = store.job_counts(job.id).await?;
    match job.state {
        JobState::Failed => {
            let detail = job.last_error.as_ref().map(upstream_text).unwrap_or_default();
            Err(Exit {
                code: exit::UPSTREAM,
                error: anyhow::anyhow!("job {} stopped by an upstream failure: {detail}", job.id),
            })
        }
        _ if counts.failed > 0 || counts.cancelled > 0 => {
            Ok(ExitCode::from(exit::JOB_FAILED_REQUESTS))
        }
        _ => Ok(ExitCode::from(exit::SUCCESS)),
    }
}

/// `openai returned 400 code: message (request id …)` from a stored upstream error.
pub fn upstream_text(error: &serde_json::Value) -> String {
    let field = |name: &str| {
        error.get(name).and_then(|v| {
            v.as_str().map(str::to_owned).or_else(|| v.as_u64().map(|n| n.to_string()))
        })
    };
    let provider = field("provider").unwrap_or_else(|| "the provider".to_owned());
    let code = field("code").or_else(|| field("error_type"));
    let mut text = match field("status").as_deref() {
        Some(status @ ("401" | "403")) => {
            let code = code.map(|c| format!(" {c}")).unwrap_or_default();
            format!(
                "{provider} rejected tranche's credentials ({status}{code}); check the API key tranche uses for {provider}"
            )
        }
        Some(status) => {
            let code = code.map(|c| format!(" {c}")).unwrap_or_default();
            format!("{provider} returned {status}{code}")
        }
        None => {
            let code = code.map(|c| format!(" {c}")).unwrap_or_default();
            format!("{provider} failed{code}")
        }
    };
    text.push_str(&format!(": {}", field("message").unwrap_or_default()));
    if let Some(id) = field("request_id") {
        text.push_str(&format!(" (request id {id})"));
    }
    text
}
