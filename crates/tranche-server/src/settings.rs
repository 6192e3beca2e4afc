//! What a job asks for, as a caller gives it: the CLI's job options by name, in a JSON body's
//! `settings` or in the query string of an NDJSON upload. Unknown names are refused by name.

use serde::Deserialize;
use tranche_core::settings::CacheSharedPrompt;
use tranche_core::{Endpoint, JobSettings, OnInvalid, ProviderKind, Usd};

use crate::error::ApiError;

/// A job's settings in a JSON body. The tenant is never among them: it is the caller's.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApiSettings {
    pub task: Option<String>,
    pub version: Option<String>,
    /// `openai` (default), `azure` or `anthropic`.
    #[schema(value_type = Option<String>)]
    pub provider: Option<ProviderKind>,
    pub model: Option<String>,
    /// e.g. `/v1/chat/completions` (default), `/v1/messages` for Anthropic.
    #[schema(value_type = Option<String>)]
    pub endpoint: Option<Endpoint>,
    pub max_attempts: Option<u32>,
    /// An inline JSON Schema, never a path.
    #[schema(value_type = Option<Object>)]
    pub schema: Option<serde_json::Value>,
    /// `retry` (default) or `fail`.
    #[schema(value_type = Option<String>)]
    pub on_invalid: Option<OnInvalid>,
    pub lenient_json: Option<bool>,
    pub review_sample: Option<u32>,
    pub review_seed: Option<u64>,
    /// The most the job may cost, in US dollars.
    #[schema(value_type = Option<f64>)]
    pub budget: Option<Usd>,
    /// `auto` (default) or `off`.
    #[schema(value_type = Option<String>)]
    pub cache_shared_prompt: Option<CacheSharedPrompt>,
}

/// The same in a query string, where a schema is JSON text.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuerySettings {
    pub task: Option<String>,
    pub version: Option<String>,
    pub provider: Option<ProviderKind>,
    pub model: Option<String>,
    pub endpoint: Option<Endpoint>,
    pub max_attempts: Option<u32>,
    pub schema: Option<String>,
    pub on_invalid: Option<OnInvalid>,
    pub lenient_json: Option<bool>,
    pub review_sample: Option<u32>,
    pub review_seed: Option<u64>,
    pub budget: Option<Usd>,
    pub cache_shared_prompt: Option<CacheSharedPrompt>,
}

impl TryFrom<QuerySettings> for ApiSettings {
    type Error = ApiError;

    fn try_from(q: QuerySettings) -> Result<Self, ApiError> {
        let schema = q
            .schema
            .map(|text| serde_json::from_str(&text))
            .transpose()
            .map_err(|e| ApiError::bad_input(format!("settings.schema is not JSON: {e}")))?;
        Ok(Self {
            task: q.task,
            version: q.version,
            provider: q.provider,
            model: q.model,
            endpoint: q.endpoint,
            max_attempts: q.max_attempts,
            schema,
            on_invalid: q.on_invalid,
            lenient_json: q.lenient_json,
            review_sample: q.review_sample,
            review_seed: q.review_seed,
            budget: q.budget,
            cache_shared_prompt: q.cache_shared_prompt,
        })
    }
}

impl ApiSettings {
    /// The provider and the job's settings, for `tenant`'s job, with the CLI's defaults.
    pub fn job(self, tenant: &str) -> Result<(ProviderKind, JobSettings), ApiError> {
        let provider = self.provider.unwrap_or(ProviderKind::Openai);
        if self.max_attempts == Some(0) {
            return Err(ApiError::bad_input("settings.max_attempts must be at least 1"));
        }
        let endpoint = self.endpoint.unwrap_or(match provider {
            ProviderKind::Anthropic => Endpoint::AnthropicMessages,
            ProviderKind::Openai | ProviderKind::Azure => Endpoint::ChatCompletions,
        });
        let settings = JobSettings {
            task: self.task,
            version: Some(self.version.unwrap_or_else(|| "v1".to_owned())),
            endpoint,
            model: self.model,
            max_attempts: self.max_attempts,
            tenant: Some(tenant.to_owned()),
            schema: self.schema,
            answer_check: None,
            lenient_json: self.lenient_json.unwrap_or(false),
            on_invalid: self.on_invalid.unwrap_or_default(),
            review_sample: self.review_sample,
            review_seed: self.review_seed,
            budget: self.budget,
            cache_shared_prompt: self.cache_shared_prompt.unwrap_or_default(),
        };
        Ok((provider, settings))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_take_the_clis_defaults_and_the_callers_tenant() {
        let given: ApiSettings = serde_json::from_value(serde_json::json!({
            "task": "intent", "provider": "anthropic", "budget": 2.5, "on_invalid": "fail"
        }))
        .unwrap();
        let (provider, settings) = given.job("acme").unwrap();
        assert_eq!(provider, ProviderKind::Anthropic);
        assert_eq!(settings.endpoint, Endpoint::AnthropicMessages);
        assert_eq!(settings.version.as_deref(), Some("v1"));
        assert_eq!(settings.tenant.as_deref(), Some("acme"));
        assert_eq!(settings.budget, Some(Usd::from_nanos(2_500_000_000)));
        assert_eq!(settings.on_invalid, OnInvalid::Fail);
        let unknown = serde_json::from_value::<ApiSettings>(serde_json::json!({"tenant": "evil"}));
        assert!(unknown.unwrap_err().to_string().contains("tenant"), "refused by name");
        let query = QuerySettings { schema: Some("{not json".into()), ..QuerySettings::default() };
        assert!(ApiSettings::try_from(query).is_err());
    }
}
