//! `tranche serve`: the HTTP API and, unless `--no-worker`, a worker in one process, until
//! SIGTERM or ctrl-c (calls under way finish; the worker stops after its current step).

use std::process::ExitCode;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;
use tranche_app::{App, Providers, Until};
use tranche_server::{ApiState, Limits};

use crate::args::{Global, ServeArgs};
use crate::context;
use crate::exit::CmdResult;
use crate::render;
use crate::shutdown::Shutdown;

pub async fn run(app: App, global: &Global, args: ServeArgs, stop: Shutdown) -> CmdResult {
    let settings = context::engine_settings(global, &args.engine, &args.provider)?;
    let prices = settings.price_table(&global.data_dir)?;
    // Submissions and cancels only record; the worker (here or elsewhere) does the rest.
    let recorder = app.engine(Providers::new(), settings.engine_config(&global.data_dir)?).await?;
    let limits = Limits {
        max_body_bytes: args.max_body_bytes,
        max_requests_per_job: args.max_requests_per_job,
        max_concurrent_intake: args.max_concurrent_intake,
        max_tenant_intake: args.max_tenant_intake,
    };
    // The engine with the providers' credentials: the worker's, and the files audit's. An
    // API-only node needs none (its audit then lists no account).
    let engine = match context::engine(&app, global, &args.provider, None, &args.engine).await {
        Ok(engine) => Some(engine.with_janitor(settings.janitor_interval()?)),
        Err(e) if args.no_worker => {
            tracing::info!(reason = %e.error, "no provider engine: the files audit lists no account");
            None
        }
        Err(e) => return Err(e),
    };
    let mut state = ApiState::new(app.clone(), recorder, prices, limits);
    if let Some(engine) = &engine {
        state = state.with_files(engine.clone());
    }
    let listener = tokio::net::TcpListener::bind(args.addr)
        .await
        .with_context(|| format!("cannot listen on {}", args.addr))?;
    let addr = listener.local_addr().context("the listener's address")?;
    render::println(&format!("listening on http://{addr}"));
    let cancel = CancellationToken::new();
    let on_signal = cancel.clone();
    tokio::spawn(async move {
        stop.wait().await;
        tracing::info!("shutting down: finishing calls under way");
        on_signal.cancel();
    });
    let worker = if let Some(engine) = engine.filter(|_| !args.no_worker) {
        let cancel = cancel.clone();
        Some(tokio::spawn(async move { engine.drive(Until::Cancelled, &cancel, || {}).await }))
    } else {
        None
    };
    tranche_server::serve(listener, state, cancel.clone().cancelled_owned())
        .await
        .context("serving the API")?;
    cancel.cancel();
    if let Some(worker) = worker {
        worker.await.context("the worker stopped")??;
    }
    Ok(ExitCode::SUCCESS)
}
