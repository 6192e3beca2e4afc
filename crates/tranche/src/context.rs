//! Turning global flags and the environment into a store, providers and an engine.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tracing_subscriber::EnvFilter;
use tranche_core::ProviderKind;
use tranche_engine::{Engine, EngineConfig, Providers};
use tranche_providers::{
    AnthropicConfig, AnthropicProvider, AzureConfig, AzureProvider, OpenAiConfig, OpenAiProvider,
    Provider, http_client,
};
use tranche_store::Store;
use tranche_store_sqlite::SqliteStore;

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

pub async fn open_store(global: &Global) -> Result<Arc<dyn Store>, Exit> {
    let location = db_location(global);
    SqliteStore::open(&location)
        .await
        .map(|s| Arc::new(s) as Arc<dyn Store>)
        .map_err(|e| Exit::from(anyhow::Error::from(e)))
}

fn seconds(flag: &str, value: f64, allow_zero: bool) -> Result<Duration, Exit> {
    Duration::try_from_secs_f64(value).ok().filter(|d| allow_zero || !d.is_zero()).ok_or_else(
        || {
            Exit::usage(anyhow::anyhow!(
                "{flag} must be a {} number of seconds",
                if allow_zero { "non-negative" } else { "positive" }
            ))
        },
    )
}

pub fn engine_config(data_dir: &Path, args: &EngineArgs) -> Result<EngineConfig, Exit> {
    let mut config = EngineConfig::in_dir(data_dir);
    if let Some(poll) = args.poll_interval {
        let poll = seconds("--poll-interval", poll, false)?;
        config.poll_interval = poll;
        config.provider_poll_intervals.clear();
        config.retry_backoff = poll.min(config.retry_backoff);
    }
    config.max_batch_requests = args.max_batch_requests;
    config.max_batch_bytes = args.max_batch_bytes;
    config.min_batch_size = args.min_batch_size.max(1);
    config.max_wait = seconds("--max-wait", args.max_wait, true)?;
    if let Some(lease) = args.lease {
        config.lease = seconds("--lease", lease, false)?;
    }
    config.default_token_budget = args.default_token_budget;
    let mut budgets = BTreeMap::new();
    for entry in &args.token_budgets {
        let (model, tokens) = entry
            .rsplit_once('=')
            .and_then(|(model, tokens)| Some((model.trim(), tokens.trim().parse::<u64>().ok()?)))
            .filter(|(model, _)| !model.is_empty())
            .ok_or_else(|| {
                Exit::usage(anyhow::anyhow!("--token-budget takes MODEL=TOKENS, got `{entry}`"))
            })?;
        budgets.insert(model.to_owned(), tokens);
    }
    config.token_budgets = budgets;
    Ok(config)
}

fn configuring(provider: ProviderKind) -> impl FnOnce(tranche_providers::ConfigError) -> Exit {
    move |e| {
        Exit::usage(anyhow::Error::from(e).context(format!("configuring the {provider} provider")))
    }
}

/// One provider's adapter from its environment variables and the flags. `base_url` is the
/// generic `--base-url`, applied when this provider is the one chosen.
pub fn provider(
    kind: ProviderKind,
    args: &ProviderArgs,
    base_url: Option<String>,
) -> Result<Arc<dyn Provider>, Exit> {
    let http = http_client().context("building the HTTP client").map_err(Exit::from)?;
    let adapter: Arc<dyn Provider> = match kind {
        ProviderKind::Openai => {
            let mut config = OpenAiConfig::from_env(base_url).map_err(configuring(kind))?;
            if let Some(seconds) = args.file_expires_after {
                config.file_expires_after = Some(seconds);
            }
            Arc::new(OpenAiProvider::new(config, http).map_err(configuring(kind))?)
        }
        ProviderKind::Azure => {
            let endpoint = args.azure_endpoint.clone().or(base_url);
            let mut config = AzureConfig::from_env(endpoint, args.azure_api_version.clone())
                .map_err(configuring(kind))?;
            if let Some(seconds) = args.file_expires_after {
                config.file_expires_after = Some(seconds);
            }
            Arc::new(AzureProvider::new(config, http).map_err(configuring(kind))?)
        }
        ProviderKind::Anthropic => {
            let base = base_url.or_else(|| args.anthropic_base_url.clone());
            let config = AnthropicConfig::from_env(base).map_err(configuring(kind))?;
            Arc::new(AnthropicProvider::new(config, http).map_err(configuring(kind))?)
        }
    };
    Ok(adapter)
}

/// The providers for a command. With `chosen`, exactly that one (its configuration must be
/// complete); without, every provider whose credentials are in the environment (`worker`).
pub fn providers(args: &ProviderArgs, chosen: Option<ProviderKind>) -> Result<Providers, Exit> {
    if let Some(kind) = chosen {
        return Ok(Providers::new().with(provider(kind, args, args.base_url.clone())?));
    }
    let present = |var: &str| std::env::var(var).is_ok_and(|v| !v.trim().is_empty());
    let mut providers = Providers::new();
    let mut any = false;
    if present("OPENAI_API_KEY") {
        providers = providers.with(provider(ProviderKind::Openai, args, args.base_url.clone())?);
        any = true;
    }
    if args.azure_endpoint.is_some()
        && (present("AZURE_OPENAI_API_KEY") || present("AZURE_OPENAI_AD_TOKEN"))
    {
        providers = providers.with(provider(ProviderKind::Azure, args, None)?);
        any = true;
    }
    if present("ANTHROPIC_API_KEY") {
        providers = providers.with(provider(ProviderKind::Anthropic, args, None)?);
        any = true;
    }
    if !any {
        return Err(Exit::usage(anyhow::anyhow!(
            "no provider credentials: set OPENAI_API_KEY, AZURE_OPENAI_ENDPOINT with AZURE_OPENAI_API_KEY, or ANTHROPIC_API_KEY"
        )));
    }
    Ok(providers)
}

pub async fn engine(
    global: &Global,
    provider_args: &ProviderArgs,
    chosen: Option<ProviderKind>,
    args: &EngineArgs,
) -> Result<Engine, Exit> {
    let providers = providers(provider_args, chosen)?;
    let store = open_store(global).await?;
    Ok(Engine::new(store, providers, engine_config(&global.data_dir, args)?))
}
