//! The `tranche` binary: argument handling and printing around the library crates.

mod args;
mod commands;
mod context;
mod demo_data;
mod exit;
mod render;

use std::process::ExitCode;

use clap::Parser;

use crate::args::{Cli, Command};
use crate::exit::Exit;

fn main() -> ExitCode {
    let cli = Cli::parse();
    context::init_tracing(cli.global.verbose);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => return Exit::from(anyhow::Error::from(e)).report(),
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Demo(args) => commands::demo::run(&cli.global, args).await,
            Command::Run(args) => commands::run::run(&cli.global, args).await,
            Command::Submit(args) => commands::run::submit(&cli.global, args).await,
            Command::Worker(args) => commands::worker::run(&cli.global, args).await,
            Command::Status(args) => commands::status::run(&cli.global, args).await,
            Command::Results(args) => commands::results::run(&cli.global, args).await,
            Command::Cancel(args) => commands::cancel::run(&cli.global, args).await,
            Command::Sim(args) => commands::sim::run(args).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(exit) => exit.report(),
    }
}
