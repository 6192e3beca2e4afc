//! `tranche worker`: work on every stored job until stopped.

use std::process::ExitCode;

use tokio_util::sync::CancellationToken;
use tranche_app::{App, Until};

use crate::args::{Global, WorkerArgs};
use crate::context;
use crate::exit::CmdResult;
use crate::shutdown::Shutdown;

pub async fn run(app: App, global: &Global, args: WorkerArgs, stop: Shutdown) -> CmdResult {
    let mut settings = context::engine_settings(global, &args.engine, &args.provider)?;
    settings.janitor_interval = args.janitor_interval.or(settings.janitor_interval);
    let engine = context::engine(&app, global, &args.provider, None, &args.engine)
        .await?
        .with_janitor(settings.janitor_interval()?);
    let cancel = CancellationToken::new();
    let on_signal = cancel.clone();
    tokio::spawn(async move {
        stop.wait().await;
        tracing::info!("stopping after the current step");
        on_signal.cancel();
    });
    let until = if args.until_idle { Until::Idle } else { Until::Cancelled };
    engine.drive(until, &cancel, || {}).await?;
    Ok(ExitCode::SUCCESS)
}
