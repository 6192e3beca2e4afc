//! The OpenAI adapter: Files and Batches at `https://api.openai.com/v1` with a bearer key, on the
//! OpenAI-shaped wire shared with Azure (`oai`).

use std::fmt;

use secrecy::SecretString;
use tranche_core::ProviderKind;

use crate::error::ConfigError;
use crate::http::RetryPolicy;
use crate::oai::{self, Auth, EndpointStyle, OaiClient, OaiSettings};

const PROVIDER: ProviderKind = ProviderKind::Openai;

/// The shortest and longest file expiry OpenAI accepts, in seconds (1 hour to 30 days).
pub const EXPIRY_RANGE: std::ops::RangeInclusive<u64> = 3_600..=2_592_000;

/// How to reach OpenAI. `Debug` never shows the key.
#[derive(Debug, Clone)]
pub struct OpenAiConfig {
    /// Default `https://api.openai.com/v1`.
    pub base_url: String,
    pub api_key: SecretString,
    /// `expires_after` seconds for uploaded input files; default 7 days; 3600..=2592000.
    /// `None` uploads without an expiry (OpenAI then keeps batch files 30 days).
    pub file_expires_after: Option<u64>,
    /// `output_expires_after` seconds for output and error files; default 30 days; 3600..=2592000.
    pub output_expires_after: Option<u64>,
}

impl OpenAiConfig {
    pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";
    pub const DEFAULT_FILE_EXPIRES_AFTER: u64 = 604_800;
    pub const DEFAULT_OUTPUT_EXPIRES_AFTER: u64 = 2_592_000;

    /// The defaults, with this key.
    pub fn new(api_key: SecretString) -> Self {
        Self {
            base_url: Self::DEFAULT_BASE_URL.to_owned(),
            api_key,
            file_expires_after: Some(Self::DEFAULT_FILE_EXPIRES_AFTER),
            output_expires_after: Some(Self::DEFAULT_OUTPUT_EXPIRES_AFTER),
        }
    }

    /// Reads `OPENAI_API_KEY` (required) and `OPENAI_BASE_URL`; `base_url_override` wins over both.
    pub fn from_env(base_url_override: Option<String>) -> Result<Self, ConfigError> {
        Self::from_lookup(base_url_override, |name| std::env::var(name).ok())
    }

    fn from_lookup(
        base_url_override: Option<String>,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let (key, base_url) = oai::key_and_base_url(
            PROVIDER,
            "OPENAI_API_KEY",
            "OPENAI_BASE_URL",
            base_url_override,
            lookup,
        )?;
        let mut config = Self::new(key);
        if let Some(url) = base_url {
            config.base_url = url;
        }
        config.validate()?;
        Ok(config)
    }

    /// Checks the key, the base URL and both expiries.
    pub fn validate(&self) -> Result<(), ConfigError> {
        oai::parse_base_url(&self.base_url)?;
        oai::check_expiry("file_expires_after", self.file_expires_after, &EXPIRY_RANGE)?;
        oai::check_expiry("output_expires_after", self.output_expires_after, &EXPIRY_RANGE)?;
        oai::check_secret(PROVIDER, Auth::Bearer, &self.api_key)
    }
}

/// The OpenAI Batch API adapter.
#[derive(Clone)]
pub struct OpenAiProvider {
    client: OaiClient,
}

impl fmt::Debug for OpenAiProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiProvider").field("client", &self.client).finish()
    }
}

impl OpenAiProvider {
    /// An adapter using the shared `http` client (see `http_client`).
    pub fn new(config: OpenAiConfig, http: reqwest::Client) -> Result<Self, ConfigError> {
        config.validate()?;
        let settings = OaiSettings {
            provider: PROVIDER,
            base_url: oai::parse_base_url(&config.base_url)?,
            api_version: None,
            auth: Auth::Bearer,
            secret: config.api_key,
            file_expires_after: config.file_expires_after,
            output_expires_after: config.output_expires_after,
            endpoint_style: EndpointStyle::Full,
        };
        Ok(Self { client: OaiClient::new(settings, http) })
    }

    /// Replaces the retry policy for reads and deletes (default: 5 attempts, at most 30 s apart).
    pub fn with_retry_policy(mut self, retry: RetryPolicy) -> Self {
        self.client.retry = retry;
        self
    }

    pub fn base_url(&self) -> &str {
        self.client.base_url().as_str()
    }
}

crate::oai::forward_provider!(OpenAiProvider);

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::provider::Provider;

    impl OpenAiProvider {
        fn url(&self, segments: &[&str]) -> reqwest::Url {
            self.client.url(segments)
        }
    }

    #[test]
    fn config_from_env_and_validation() {
        let env: HashMap<&str, &str> = HashMap::from([
            ("OPENAI_API_KEY", "sk-abc-123456"),
            ("OPENAI_BASE_URL", "http://127.0.0.1:9/v1/"),
        ]);
        let lookup = |name: &str| env.get(name).map(|v| (*v).to_owned());
        let config = OpenAiConfig::from_lookup(None, lookup).unwrap();
        assert_eq!(config.base_url, "http://127.0.0.1:9/v1/");
        assert_eq!(config.file_expires_after, Some(604_800));
        assert_eq!(config.output_expires_after, Some(2_592_000));
        let provider = OpenAiProvider::new(config.clone(), reqwest::Client::new()).unwrap();
        assert_eq!(
            provider.url(&["batches", "b/1"]).as_str(),
            "http://127.0.0.1:9/v1/batches/b%2F1"
        );
        assert!(!format!("{config:?}").contains("sk-abc-123456"));
        assert!(!format!("{provider:?}").contains("sk-abc-123456"));

        let overridden =
            OpenAiConfig::from_lookup(Some("https://example.test/v1".into()), lookup).unwrap();
        assert_eq!(overridden.base_url, "https://example.test/v1");

        let missing = OpenAiConfig::from_lookup(None, |_| None).unwrap_err();
        assert!(missing.to_string().contains("OPENAI_API_KEY"));
        let empty = OpenAiConfig::from_lookup(None, |_| Some(String::new())).unwrap_err();
        assert_eq!(empty, ConfigError::EmptyApiKey { provider: ProviderKind::Openai });

        let mut bad = config.clone();
        bad.file_expires_after = Some(60);
        assert!(matches!(
            bad.validate(),
            Err(ConfigError::ExpiryOutOfRange { field: "file_expires_after", .. })
        ));
        let mut bad = config.clone();
        bad.output_expires_after = Some(2_592_001);
        assert!(matches!(
            bad.validate(),
            Err(ConfigError::ExpiryOutOfRange { field: "output_expires_after", .. })
        ));
        let mut none = config.clone();
        none.file_expires_after = None;
        assert!(none.validate().is_ok());
        let mut bad = config;
        bad.base_url = "ftp://x".into();
        assert!(matches!(bad.validate(), Err(ConfigError::InvalidBaseUrl { .. })));
        let mut bad = OpenAiConfig::new(SecretString::from("sk-with\nnewline"));
        bad.base_url = "http://localhost".into();
        let err = OpenAiProvider::new(bad, reqwest::Client::new()).unwrap_err();
        assert_eq!(err, ConfigError::InvalidApiKey { provider: ProviderKind::Openai });
        assert!(!err.to_string().contains("newline"));
    }

    #[test]
    fn parses_lines_as_openai() {
        let provider = OpenAiProvider::new(
            OpenAiConfig::new(SecretString::from("sk-test-secret-key-1234")),
            reqwest::Client::new(),
        )
        .unwrap();
        let line = r#"{"custom_id":"w","response":null,"error":{"code":"batch_expired","message":"late"}}"#;
        let crate::LineOutcome::Failed(err) = provider.parse_result_line(line).unwrap().outcome
        else {
            panic!("expected a failure")
        };
        assert_eq!(err.provider, ProviderKind::Openai);
        assert!(err.retryable);
    }
}
