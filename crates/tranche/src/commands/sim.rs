//! `tranche sim`: serve the provider simulator until stopped.

use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::Context as _;
use tranche_sim::{SimConfig, Simulator};

use crate::args::SimArgs;
use crate::exit::{CmdResult, Exit};
use crate::render;
use crate::shutdown::Shutdown;

pub async fn run(args: SimArgs, stop: Shutdown) -> CmdResult {
    let mut config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read `{}`", path.display()))
                .map_err(Exit::usage)?;
            serde_json::from_str::<SimConfig>(&text)
                .with_context(|| {
                    format!("`{}` is not a valid simulator configuration", path.display())
                })
                .map_err(Exit::usage)?
        }
        None => SimConfig::default(),
    };
    if let Some(speed) = args.speed {
        config.speed = speed;
    }
    config.validate().map_err(Exit::usage)?;
    let handle = Simulator::spawn_on(SocketAddr::new(args.host, args.port), config)
        .await
        .context("starting the simulator")
        .map_err(Exit::from)?;
    render::println(&format!("tranche sim listening on {}", handle.base_url()));
    render::println(&format!("openai: {}", handle.openai_base_url()));
    render::println(&format!("azure: {}", handle.azure_endpoint()));
    render::println(&format!("anthropic: {}", handle.anthropic_base_url()));
    let server = handle.wait();
    tokio::select! {
        result = server => result.context("the simulator stopped").map_err(Exit::from)?,
        // Returning drops the simulator, which removes its spool folder.
        () = stop.wait() => {}
    }
    Ok(ExitCode::SUCCESS)
}
