//! Turning global flags and the environment into a store, providers and an engine.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tracing_subscriber::EnvFilter;
use tranche_engine::{Engine, EngineConfig, Providers};
use tranche_providers::{OpenAiConfig, OpenAiProvider, http_client};
use tranche_store::Store;

use crate::args::{EngineArgs, Global, ProviderArgs};
use crate::exit::Exit;

/// Logs go to stderr; stdout is for results and JSON.
pub fn init_tracing(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info,sqlx=warn",
        _ => "debug,sqlx=warn,hyper=info,reqwest=info",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let _ =
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

/// The database location: `--db`, else `<data-dir>/tranche.db`.
pub fn db_location(global: &Global) -> String {
    global
        .db
        .clone()
        .unwrap_or_else(|| global.data_dir.join("tranche.db").to_string_lossy().into_owned())
}

pub async fn open_store(global: &Global) -> Result<Store, Exit> {
    let location = db_location(global);
    Store::open(&location).await.map_err(|e| Exit::from(anyhow::Error::from(e)))
}

pub fn engine_config(data_dir: &Path, args: &EngineArgs) -> Result<EngineConfig, Exit> {
    let poll =
        Duration::try_from_secs_f64(args.poll_interval).ok().filter(|d| !d.is_zero()).ok_or_else(
            || Exit::usage(anyhow::anyhow!("--poll-interval must be a positive number of seconds")),
        )?;
    Ok(EngineConfig {
        poll_interval: poll,
        retry_backoff: poll.min(Duration::from_secs(5)),
        max_batch_requests: args.max_batch_requests,
        max_batch_bytes: args.max_batch_bytes,
        ..EngineConfig::in_dir(data_dir)
    })
}

/// The OpenAI adapter from `OPENAI_API_KEY`, `OPENAI_BASE_URL` and the flags.
pub fn openai(args: &ProviderArgs) -> Result<Arc<OpenAiProvider>, Exit> {
    let mut config = OpenAiConfig::from_env(args.base_url.clone()).map_err(|e| {
        Exit::usage(anyhow::Error::from(e).context("configuring the openai provider"))
    })?;
    if let Some(seconds) = args.file_expires_after {
        config.file_expires_after = Some(seconds);
    }
    let http = http_client().context("building the HTTP client").map_err(Exit::from)?;
    let provider =
        OpenAiProvider::new(config, http).map_err(|e| Exit::usage(anyhow::Error::from(e)))?;
    Ok(Arc::new(provider))
}

pub async fn engine(
    global: &Global,
    provider: &ProviderArgs,
    args: &EngineArgs,
) -> Result<Engine, Exit> {
    let store = open_store(global).await?;
    let providers = Providers::new().with(openai(provider)?);
    Ok(Engine::new(store, providers, engine_config(&global.data_dir, args)?))
}
