//! The Azure OpenAI adapter (Global / Data Zone Batch): the OpenAI-shaped wire (`oai`) on the v1
//! surface `{endpoint}/openai/v1/...` or the dated surface `{endpoint}/openai/...?api-version=`,
//! with an `api-key` header or an Entra ID bearer token, and Azure's expiry range (14–30 days).
//!
//! Surface selection, which scripts rely on: an API version (`OPENAI_API_VERSION`, or
//! `AzureConfig::api_version`) selects the dated surface; without one the v1 surface is used.
//! The `model` of every input line is the deployment name; the engine writes it into the body.

use std::fmt;

use secrecy::SecretString;
use tranche_core::ProviderKind;

use crate::error::ConfigError;
use crate::http::RetryPolicy;
use crate::oai::{self, Auth, EndpointStyle, OaiClient, OaiSettings};

const PROVIDER: ProviderKind = ProviderKind::Azure;

/// The file and output expiry Azure accepts, in seconds: "a number between 1209600-2592000"
/// (14 to 30 days).
pub const EXPIRY_RANGE: std::ops::RangeInclusive<u64> = 1_209_600..=2_592_000;

/// Most requests in one Azure batch input file.
pub const MAX_REQUESTS_PER_FILE: usize = 100_000;

/// Largest Azure batch input file (200 MB, without bring-your-own storage).
pub const MAX_FILE_BYTES: u64 = 200 * 1024 * 1024;

/// How the secret in `AzureConfig::api_key` is sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AzureAuth {
    /// An API key, as the `api-key` header.
    #[default]
    ApiKey,
    /// A Microsoft Entra ID token, as `Authorization: Bearer`.
    BearerToken,
}

/// Which of Azure's two URL layouts the adapter speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AzureSurface {
    /// `{endpoint}/openai/v1/files|batches`, no `api-version`.
    V1,
    /// `{endpoint}/openai/files|batches?api-version=...`.
    Legacy,
}

/// How to reach an Azure OpenAI resource. `Debug` never shows the key.
#[derive(Debug, Clone)]
pub struct AzureConfig {
    /// The resource endpoint, e.g. `https://my-resource.openai.azure.com` (a trailing `/openai`
    /// or `/openai/v1` is tolerated and dropped).
    pub endpoint: String,
    /// The API key, or an Entra ID token when `auth` is `BearerToken`.
    pub api_key: SecretString,
    pub auth: AzureAuth,
    /// `Some` selects the dated surface with this `api-version`; `None` the v1 surface.
    pub api_version: Option<String>,
    /// `expires_after` seconds for uploaded input files; default 14 days; 1209600..=2592000.
    /// `None` uploads without an expiry: Azure then keeps the file until it is deleted and counts
    /// it against the resource's quota of 500 such files.
    pub file_expires_after: Option<u64>,
    /// `output_expires_after` seconds for output and error files; default 14 days;
    /// 1209600..=2592000; `None` sends none.
    pub output_expires_after: Option<u64>,
}

impl AzureConfig {
    /// The dated API version used when the dated surface is asked for without one.
    pub const DEFAULT_API_VERSION: &str = "2024-10-21";
    pub const DEFAULT_FILE_EXPIRES_AFTER: u64 = 1_209_600;
    pub const DEFAULT_OUTPUT_EXPIRES_AFTER: u64 = 1_209_600;

    /// The v1 surface with the defaults, this endpoint and this API key.
    pub fn new(endpoint: impl Into<String>, api_key: SecretString) -> Self {
        Self {
            endpoint: endpoint.into(),
            api_key,
            auth: AzureAuth::ApiKey,
            api_version: None,
            file_expires_after: Some(Self::DEFAULT_FILE_EXPIRES_AFTER),
            output_expires_after: Some(Self::DEFAULT_OUTPUT_EXPIRES_AFTER),
        }
    }

    /// Switches to the dated surface with `api_version` (default `2024-10-21`).
    pub fn with_legacy_api_version(mut self, api_version: Option<String>) -> Self {
        self.api_version =
            Some(api_version.unwrap_or_else(|| Self::DEFAULT_API_VERSION.to_owned()));
        self
    }

    /// Reads the variables the official SDK reads: `AZURE_OPENAI_ENDPOINT` (required),
    /// `AZURE_OPENAI_API_KEY` (or else `AZURE_OPENAI_AD_TOKEN`, sent as a bearer token) and
    /// `OPENAI_API_VERSION` (set: the dated surface with that version; unset or empty: the v1
    /// surface). Each override wins over its variable.
    pub fn from_env(
        endpoint_override: Option<String>,
        api_version_override: Option<String>,
    ) -> Result<Self, ConfigError> {
        Self::from_lookup(endpoint_override, api_version_override, |name| std::env::var(name).ok())
    }

    fn from_lookup(
        endpoint_override: Option<String>,
        api_version_override: Option<String>,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let set = |value: Option<String>| value.filter(|v| !v.trim().is_empty());
        let endpoint = set(endpoint_override)
            .or_else(|| set(lookup("AZURE_OPENAI_ENDPOINT")))
            .ok_or(ConfigError::MissingEnv { var: "AZURE_OPENAI_ENDPOINT", provider: PROVIDER })?;
        let (secret, auth) = match (lookup("AZURE_OPENAI_API_KEY"), lookup("AZURE_OPENAI_AD_TOKEN"))
        {
            (Some(key), _) if !key.trim().is_empty() => (key, AzureAuth::ApiKey),
            (_, Some(token)) if !token.trim().is_empty() => (token, AzureAuth::BearerToken),
            (Some(_), _) | (_, Some(_)) => {
                return Err(ConfigError::EmptyApiKey { provider: PROVIDER });
            }
            (None, None) => {
                return Err(ConfigError::MissingEnv {
                    var: "AZURE_OPENAI_API_KEY",
                    provider: PROVIDER,
                });
            }
        };
        let mut config = Self::new(endpoint.trim(), SecretString::from(secret));
        config.auth = auth;
        config.api_version = set(api_version_override)
            .or_else(|| set(lookup("OPENAI_API_VERSION")))
            .map(|v| v.trim().to_owned());
        config.validate()?;
        Ok(config)
    }

    /// The surface this configuration selects.
    pub fn surface(&self) -> AzureSurface {
        if self.api_version.is_some() { AzureSurface::Legacy } else { AzureSurface::V1 }
    }

    /// Checks the endpoint, the API version, the key and both expiries.
    pub fn validate(&self) -> Result<(), ConfigError> {
        oai::parse_base_url(&self.endpoint)?;
        if let Some(version) = &self.api_version
            && (version.is_empty()
                || !version.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.'))
        {
            return Err(ConfigError::InvalidApiVersion {
                value: version.clone(),
                provider: PROVIDER,
            });
        }
        oai::check_expiry("file_expires_after", self.file_expires_after, &EXPIRY_RANGE)?;
        oai::check_expiry("output_expires_after", self.output_expires_after, &EXPIRY_RANGE)?;
        oai::check_secret(PROVIDER, wire_auth(self.auth), &self.api_key)
    }

    /// `{endpoint}/openai/v1` or `{endpoint}/openai`.
    fn surface_url(&self) -> Result<reqwest::Url, ConfigError> {
        let mut url = oai::parse_base_url(&self.endpoint)?;
        let mut segments: Vec<String> = url
            .path_segments()
            .map(|s| s.filter(|s| !s.is_empty()).map(str::to_owned).collect())
            .unwrap_or_default();
        if segments.ends_with(&["openai".to_owned(), "v1".to_owned()]) {
            segments.truncate(segments.len() - 2);
        } else if segments.last().is_some_and(|s| s == "openai") {
            segments.pop();
        }
        segments.push("openai".to_owned());
        if self.surface() == AzureSurface::V1 {
            segments.push("v1".to_owned());
        }
        let invalid = || ConfigError::InvalidBaseUrl {
            url: self.endpoint.clone(),
            reason: "it cannot have a path".to_owned(),
        };
        url.path_segments_mut().map_err(|()| invalid())?.clear().extend(&segments);
        Ok(url)
    }
}

fn wire_auth(auth: AzureAuth) -> Auth {
    match auth {
        AzureAuth::ApiKey => Auth::ApiKeyHeader,
        AzureAuth::BearerToken => Auth::Bearer,
    }
}

/// The Azure OpenAI Batch adapter.
#[derive(Clone)]
pub struct AzureProvider {
    client: OaiClient,
    surface: AzureSurface,
    api_version: Option<String>,
}

impl fmt::Debug for AzureProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AzureProvider")
            .field("surface", &self.surface)
            .field("client", &self.client)
            .finish()
    }
}

impl AzureProvider {
    /// An adapter using the shared `http` client (see `http_client`).
    pub fn new(config: AzureConfig, http: reqwest::Client) -> Result<Self, ConfigError> {
        config.validate()?;
        let surface = config.surface();
        let settings = OaiSettings {
            provider: PROVIDER,
            base_url: config.surface_url()?,
            api_version: config.api_version.clone(),
            auth: wire_auth(config.auth),
            secret: config.api_key,
            file_expires_after: config.file_expires_after,
            output_expires_after: config.output_expires_after,
            // Azure's examples create with `"endpoint": "/chat/completions"`.
            endpoint_style: EndpointStyle::WithoutV1,
        };
        Ok(Self {
            client: OaiClient::new(settings, http),
            surface,
            api_version: config.api_version,
        })
    }

    /// Replaces the retry policy for reads and deletes (default: 5 attempts, at most 30 s apart).
    pub fn with_retry_policy(mut self, retry: RetryPolicy) -> Self {
        self.client.retry = retry;
        self
    }

    pub fn surface(&self) -> AzureSurface {
        self.surface
    }

    /// The `api-version` sent on the dated surface.
    pub fn api_version(&self) -> Option<&str> {
        self.api_version.as_deref()
    }

    /// Where `files` and `batches` live: `{endpoint}/openai/v1` or `{endpoint}/openai`.
    pub fn base_url(&self) -> &str {
        self.client.base_url().as_str()
    }
}

crate::oai::forward_provider!(AzureProvider);

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::provider::Provider;
    use crate::types::LineOutcome;
    use serde_json::value::RawValue;
    use tranche_core::Endpoint;

    const KEY: &str = "azure-key-0123456789abcdef";

    fn lookup(pairs: &[(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        let env: HashMap<&str, &str> = pairs.iter().copied().collect();
        move |name: &str| env.get(name).map(|v| (*v).to_owned())
    }

    fn provider(config: AzureConfig) -> AzureProvider {
        AzureProvider::new(config, reqwest::Client::new()).unwrap()
    }

    #[test]
    fn the_api_version_selects_the_surface() {
        let base = [
            ("AZURE_OPENAI_ENDPOINT", "https://res.openai.azure.com/"),
            ("AZURE_OPENAI_API_KEY", KEY),
        ];
        let v1 = AzureConfig::from_lookup(None, None, lookup(&base)).unwrap();
        assert_eq!(v1.surface(), AzureSurface::V1);
        assert_eq!(v1.api_version, None);
        assert_eq!(v1.auth, AzureAuth::ApiKey);
        assert_eq!(v1.file_expires_after, Some(1_209_600));
        assert_eq!(v1.output_expires_after, Some(1_209_600));
        let p = provider(v1);
        assert_eq!(p.surface(), AzureSurface::V1);
        assert_eq!(p.base_url(), "https://res.openai.azure.com/openai/v1");
        assert_eq!(
            p.client.url(&["batches", "batch_1"]).as_str(),
            "https://res.openai.azure.com/openai/v1/batches/batch_1"
        );

        let mut env = base.to_vec();
        env.push(("OPENAI_API_VERSION", "2025-04-01-preview"));
        let legacy = AzureConfig::from_lookup(None, None, lookup(&env)).unwrap();
        assert_eq!(legacy.surface(), AzureSurface::Legacy);
        let p = provider(legacy);
        assert_eq!(p.api_version(), Some("2025-04-01-preview"));
        assert_eq!(p.base_url(), "https://res.openai.azure.com/openai");
        assert_eq!(
            p.client.url(&["files", "file-1", "content"]).as_str(),
            "https://res.openai.azure.com/openai/files/file-1/content?api-version=2025-04-01-preview"
        );

        // Overrides win over the environment; an empty OPENAI_API_VERSION is unset.
        let over = AzureConfig::from_lookup(
            Some("http://127.0.0.1:9".into()),
            Some("2024-10-21".into()),
            lookup(&env),
        )
        .unwrap();
        assert_eq!(over.endpoint, "http://127.0.0.1:9");
        assert_eq!(over.api_version.as_deref(), Some("2024-10-21"));
        let mut env = base.to_vec();
        env.push(("OPENAI_API_VERSION", ""));
        let empty = AzureConfig::from_lookup(None, None, lookup(&env)).unwrap();
        assert_eq!(empty.surface(), AzureSurface::V1);
    }

    #[test]
    fn legacy_default_version() {
        let config = AzureConfig::new("https://r.openai.azure.com", SecretString::from(KEY))
            .with_legacy_api_version(None);
        assert_eq!(config.api_version.as_deref(), Some("2024-10-21"));
        assert_eq!(config.surface(), AzureSurface::Legacy);
    }

    #[test]
    fn endpoint_forms() {
        for (endpoint, surface_v1, surface_legacy) in [
            (
                "https://r.openai.azure.com",
                "https://r.openai.azure.com/openai/v1",
                "https://r.openai.azure.com/openai",
            ),
            (
                "https://r.openai.azure.com/openai/v1/",
                "https://r.openai.azure.com/openai/v1",
                "https://r.openai.azure.com/openai",
            ),
            (
                "https://r.openai.azure.com/openai",
                "https://r.openai.azure.com/openai/v1",
                "https://r.openai.azure.com/openai",
            ),
            (
                "http://127.0.0.1:8080/proxy",
                "http://127.0.0.1:8080/proxy/openai/v1",
                "http://127.0.0.1:8080/proxy/openai",
            ),
        ] {
            let config = AzureConfig::new(endpoint, SecretString::from(KEY));
            assert_eq!(provider(config.clone()).base_url(), surface_v1, "{endpoint}");
            let legacy = config.with_legacy_api_version(None);
            assert_eq!(provider(legacy).base_url(), surface_legacy, "{endpoint}");
        }
    }

    #[test]
    fn ad_token_and_missing_settings() {
        let token = AzureConfig::from_lookup(
            None,
            None,
            lookup(&[
                ("AZURE_OPENAI_ENDPOINT", "https://r.openai.azure.com"),
                ("AZURE_OPENAI_AD_TOKEN", "eyJ0eXAi.token"),
            ]),
        )
        .unwrap();
        assert_eq!(token.auth, AzureAuth::BearerToken);

        let err = AzureConfig::from_lookup(None, None, lookup(&[("AZURE_OPENAI_API_KEY", KEY)]))
            .unwrap_err();
        assert_eq!(
            err,
            ConfigError::MissingEnv { var: "AZURE_OPENAI_ENDPOINT", provider: PROVIDER }
        );
        let err = AzureConfig::from_lookup(
            None,
            None,
            lookup(&[("AZURE_OPENAI_ENDPOINT", "https://r.openai.azure.com")]),
        )
        .unwrap_err();
        assert!(err.to_string().contains("AZURE_OPENAI_API_KEY"), "{err}");
        let err = AzureConfig::from_lookup(
            None,
            None,
            lookup(&[
                ("AZURE_OPENAI_ENDPOINT", "https://r.openai.azure.com"),
                ("AZURE_OPENAI_API_KEY", " "),
            ]),
        )
        .unwrap_err();
        assert_eq!(err, ConfigError::EmptyApiKey { provider: PROVIDER });
    }

    #[test]
    fn validation() {
        let good = AzureConfig::new("https://r.openai.azure.com", SecretString::from(KEY));
        assert!(good.validate().is_ok());
        let mut none = good.clone();
        none.file_expires_after = None;
        none.output_expires_after = None;
        assert!(none.validate().is_ok());
        for (file, output, field) in [
            (Some(3_600), Some(1_209_600), "file_expires_after"),
            (Some(1_209_599), Some(1_209_600), "file_expires_after"),
            (Some(1_209_600), Some(2_592_001), "output_expires_after"),
        ] {
            let mut bad = good.clone();
            bad.file_expires_after = file;
            bad.output_expires_after = output;
            assert!(
                matches!(bad.validate(), Err(ConfigError::ExpiryOutOfRange { field: f, .. }) if f == field),
                "{file:?} {output:?}"
            );
        }
        let mut max = good.clone();
        max.file_expires_after = Some(2_592_000);
        assert!(max.validate().is_ok());
        let bad = good.clone().with_legacy_api_version(Some("2024-10-21&x=1".into()));
        assert!(matches!(bad.validate(), Err(ConfigError::InvalidApiVersion { .. })));
        let mut bad = good;
        bad.endpoint = "res.openai.azure.com".into();
        assert!(matches!(bad.validate(), Err(ConfigError::InvalidBaseUrl { .. })));
        let bad = AzureConfig::new("https://r.openai.azure.com", SecretString::from("k\ney"));
        let err = AzureProvider::new(bad, reqwest::Client::new()).unwrap_err();
        assert_eq!(err, ConfigError::InvalidApiKey { provider: PROVIDER });
    }

    #[test]
    fn debug_never_shows_the_key() {
        let config = AzureConfig::new("https://r.openai.azure.com", SecretString::from(KEY));
        assert!(!format!("{config:?}").contains(KEY));
        assert!(!format!("{:?}", provider(config)).contains(KEY));
    }

    #[test]
    fn lines_are_azure_lines() {
        let p = provider(AzureConfig::new("https://r.openai.azure.com", SecretString::from(KEY)));
        assert_eq!(p.kind(), ProviderKind::Azure);
        let body =
            RawValue::from_string(r#"{"model":"gpt-4o-batch","messages":[]}"#.into()).unwrap();
        let mut out = Vec::new();
        tranche_core::codec::write_input_line(
            p.kind(),
            &mut out,
            "task-0",
            Endpoint::ChatCompletions,
            &body,
        );
        let line: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(line["url"], "/v1/chat/completions");
        assert_eq!(line["body"]["model"], "gpt-4o-batch");
        let parsed = p
            .parse_result_line(r#"{"custom_id":"task-0","response":{"body":{"error":{"code":"429","message":"busy"}},"request_id":"r","status_code":429},"error":null}"#)
            .unwrap();
        let LineOutcome::Failed(err) = parsed.outcome else { panic!("expected a failure") };
        assert_eq!(err.provider, ProviderKind::Azure);
        assert_eq!(err.code.as_deref(), Some("429"));
        assert!(err.retryable);
    }
}
