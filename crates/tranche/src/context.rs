//! Turning global flags, the environment and the configuration file into the application and
//! its engines.

use tracing_subscriber::EnvFilter;
use tranche_app::{App, Engine, EngineSettings};
use tranche_core::ProviderKind;

use crate::args::{EngineArgs, Global, ProviderArgs};
use crate::exit::Exit;

/// Logs go to stderr; stdout is for results and JSON.
pub fn init_tracing(verbose: u8) {
    let default = match verbose {
        // sqlx warns of a statement over a second, and of a connection waited for over two,
        // which on a busy store are most often waits for another step's write: shown from `-v`
        // on, not to every run.
        0 => "warn,sqlx::query=error,sqlx::pool::acquire=error",
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

pub async fn open_app(global: &Global) -> Result<App, Exit> {
    let settings = engine_settings(global, &EngineArgs::default(), &ProviderArgs::none())?;
    let blobs = settings.engine_config(&global.data_dir)?.blobs;
    Ok(App::open(&db_location(global), blobs).await?)
}

/// The engine settings in force: flags over environment over `tranche.toml` over defaults.
pub fn engine_settings(
    global: &Global,
    args: &EngineArgs,
    provider: &ProviderArgs,
) -> Result<EngineSettings, Exit> {
    let flags = args
        .settings(provider, global.blob_store.as_deref())
        .map_err(|e| Exit::usage(anyhow::anyhow!(e)))?;
    Ok(EngineSettings::layered(&global.data_dir, &flags)?)
}

/// An engine over `app` with the providers a command needs: exactly `chosen`, or every
/// provider whose credentials are set (a worker).
pub async fn engine(
    app: &App,
    global: &Global,
    provider_args: &ProviderArgs,
    chosen: Option<ProviderKind>,
    args: &EngineArgs,
) -> Result<Engine, Exit> {
    let settings = engine_settings(global, args, provider_args)?;
    let options = provider_args.options(settings.file_expires_after);
    let providers = tranche_app::providers(&options, chosen)?;
    Ok(app.engine(providers, settings.engine_config(&global.data_dir)?).await?)
}

/// An engine that only records (submit, cancel): no provider, so no credentials needed.
pub async fn recording_engine(app: &App, global: &Global) -> Result<Engine, Exit> {
    let settings = engine_settings(global, &EngineArgs::default(), &ProviderArgs::none())?;
    let config = settings.engine_config(&global.data_dir)?;
    Ok(app.engine(tranche_app::Providers::new(), config).await?)
}
