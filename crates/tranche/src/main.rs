//! The `tranche` binary: argument handling and printing around the library crates.

mod args;
mod commands;
mod context;
mod demo_data;
mod exit;
mod malloc;
mod render;
mod shutdown;

use std::process::ExitCode;

use clap::Parser;

use crate::args::{Cli, Command};
use crate::exit::Exit;
use crate::shutdown::Shutdown;

fn main() -> ExitCode {
    // Before anything else runs: this may start the process again.
    malloc::tune();
    let cli = Cli::parse();
    context::init_tracing(cli.global.verbose);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => return Exit::from(anyhow::Error::from(e)).report(),
    };
    let global = &cli.global;
    let result = runtime.block_on(async {
        match cli.command {
            Command::Demo(args) => commands::demo::run(global, args).await,
            Command::Run(args) => {
                with_app(global, |app| commands::run::run(app, global, args)).await
            }
            Command::Submit(args) => {
                with_app(global, |app| commands::run::submit(app, global, args)).await
            }
            Command::Worker(args) => {
                // Listened for before the store is opened, which may take a while.
                let stop = Shutdown::listen();
                with_app(global, |app| commands::worker::run(app, global, args, stop)).await
            }
            Command::Status(args) => with_app(global, |app| commands::status::run(app, args)).await,
            Command::Results(args) => {
                with_app(global, |app| commands::results::run(app, args)).await
            }
            Command::Cancel(args) => {
                with_app(global, |app| commands::cancel::run(app, global, args)).await
            }
            Command::Review(args) => {
                with_app(global, |app| commands::review::show(app, args)).await
            }
            Command::Approve(args) => {
                with_app(global, |app| commands::review::approve(app, args)).await
            }
            Command::Reject(args) => {
                with_app(global, |app| commands::review::reject(app, args)).await
            }
            Command::Reparse(args) => {
                with_app(global, |app| commands::reparse::run(app, global, args)).await
            }
            Command::Prune(args) => {
                with_app(global, |app| commands::prune::run(app, global, args)).await
            }
            Command::Files(args) => {
                with_app(global, |app| commands::files::run(app, global, args)).await
            }
            Command::Cost(args) => commands::cost::run(global, args).await,
            Command::Tenants(args) => {
                with_app(global, |app| commands::tenants::run(app, args)).await
            }
            Command::Serve(args) => {
                let stop = Shutdown::listen();
                with_app(global, |app| commands::serve::run(app, global, args, stop)).await
            }
            Command::Sim(args) => commands::sim::run(args, Shutdown::listen()).await,
            Command::Migrate(args) => commands::migrate::run(global, args).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(exit) => exit.report(),
    }
}

/// Runs a command over the application, then closes its store, so that SQLite checkpoints its
/// log instead of leaving it for the next process to read.
async fn with_app<F, Fut>(global: &args::Global, command: F) -> exit::CmdResult
where
    F: FnOnce(tranche_app::App) -> Fut,
    Fut: Future<Output = exit::CmdResult>,
{
    let app = context::open_app(global).await?;
    let result = command(app.clone()).await;
    app.close().await;
    result
}
