//! The provider adapters an engine calls, from each provider's own environment variables (the
//! official SDKs' names) and the deployment's options. Keys stay in the adapters' secret types.

use std::sync::Arc;

use tranche_core::ProviderKind;
use tranche_engine::Providers;
use tranche_providers::{
    AnthropicConfig, AnthropicProvider, AzureConfig, AzureProvider, OpenAiConfig, OpenAiProvider,
    Provider, http_client,
};

use crate::error::AppError;

/// Where the providers are reached, besides their environment variables.
#[derive(Debug, Clone, Default)]
pub struct ProviderOptions {
    /// The chosen provider's base URL (for a worker serving every provider: OpenAI's).
    pub base_url: Option<String>,
    /// The Azure OpenAI resource endpoint.
    pub azure_endpoint: Option<String>,
    /// A dated Azure API version selects the legacy surface; without one, v1.
    pub azure_api_version: Option<String>,
    /// The Anthropic API base URL.
    pub anthropic_base_url: Option<String>,
    /// Seconds an uploaded input file lives at the provider.
    pub file_expires_after: Option<u64>,
}

fn configuring(provider: ProviderKind) -> impl FnOnce(tranche_providers::ConfigError) -> AppError {
    move |e| AppError::Config(format!("configuring the {provider} provider: {e}"))
}

/// One provider's adapter. `base_url` is the generic base URL, applied when this provider is
/// the one chosen.
pub fn provider(
    kind: ProviderKind,
    options: &ProviderOptions,
    base_url: Option<String>,
) -> Result<Arc<dyn Provider>, AppError> {
    let http =
        http_client().map_err(|e| AppError::Config(format!("building the HTTP client: {e}")))?;
    let adapter: Arc<dyn Provider> = match kind {
        ProviderKind::Openai => {
            let mut config = OpenAiConfig::from_env(base_url).map_err(configuring(kind))?;
            if let Some(seconds) = options.file_expires_after {
                config.file_expires_after = Some(seconds);
            }
            Arc::new(OpenAiProvider::new(config, http).map_err(configuring(kind))?)
        }
        ProviderKind::Azure => {
            let endpoint = options.azure_endpoint.clone().or(base_url);
            let mut config = AzureConfig::from_env(endpoint, options.azure_api_version.clone())
                .map_err(configuring(kind))?;
            if let Some(seconds) = options.file_expires_after {
                config.file_expires_after = Some(seconds);
            }
            Arc::new(AzureProvider::new(config, http).map_err(configuring(kind))?)
        }
        ProviderKind::Anthropic => {
            let base = base_url.or_else(|| options.anthropic_base_url.clone());
            let config = AnthropicConfig::from_env(base).map_err(configuring(kind))?;
            Arc::new(AnthropicProvider::new(config, http).map_err(configuring(kind))?)
        }
    };
    Ok(adapter)
}

/// The adapters for a use case. With `chosen`, exactly that one (its configuration must be
/// complete); without, every provider whose credentials are in the environment (a worker).
pub fn providers(
    options: &ProviderOptions,
    chosen: Option<ProviderKind>,
) -> Result<Providers, AppError> {
    if let Some(kind) = chosen {
        return Ok(Providers::new().with(provider(kind, options, options.base_url.clone())?));
    }
    let present = |var: &str| std::env::var(var).is_ok_and(|v| !v.trim().is_empty());
    let mut providers = Providers::new();
    let mut any = false;
    if present("OPENAI_API_KEY") {
        providers =
            providers.with(provider(ProviderKind::Openai, options, options.base_url.clone())?);
        any = true;
    }
    if options.azure_endpoint.is_some()
        && (present("AZURE_OPENAI_API_KEY") || present("AZURE_OPENAI_AD_TOKEN"))
    {
        providers = providers.with(provider(ProviderKind::Azure, options, None)?);
        any = true;
    }
    if present("ANTHROPIC_API_KEY") {
        providers = providers.with(provider(ProviderKind::Anthropic, options, None)?);
        any = true;
    }
    if !any {
        return Err(AppError::Config(
            "no provider credentials: set OPENAI_API_KEY, AZURE_OPENAI_ENDPOINT with AZURE_OPENAI_API_KEY, or ANTHROPIC_API_KEY"
                .to_owned(),
        ));
    }
    Ok(providers)
}
