//! What a job asks for: stored with the job, and obeyed by whichever engine works on it.
//!
//! How a deployment runs (planning limits, token budgets, poll interval, lease length) is not
//! here: that is each engine's configuration, the same for every engine of a deployment.

use serde::{Deserialize, Serialize};

use crate::input::InputOptions;
use crate::{Endpoint, ProviderKind, Usd};

/// A job's settings. Stored as JSON; fields a later version adds default when read back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSettings {
    /// The task of tranche lines (`key:task:version`).
    #[serde(default)]
    pub task: Option<String>,
    /// Their version (`v1` when not given).
    #[serde(default)]
    pub version: Option<String>,
    /// Their endpoint.
    #[serde(default = "default_endpoint")]
    pub endpoint: Endpoint,
    /// The model for lines whose body has none.
    #[serde(default)]
    pub model: Option<String>,
    /// How many times a request is sent at most; the engine's default when not given.
    #[serde(default)]
    pub max_attempts: Option<u32>,
    /// Whose job it is: prefixes tranche lines' custom ids with `tenant::`; the HTTP server's
    /// tenants are the same names.
    #[serde(default)]
    pub tenant: Option<String>,
    /// The JSON Schema every answer must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<serde_json::Value>,
    /// The id of the answer check (schema and leniency) the engine made of `schema` when it
    /// accepted the job (see [`AnswerSchema::check_id`](crate::validate::AnswerSchema::check_id)).
    #[serde(default)]
    pub answer_check: Option<String>,
    /// Whether JSON inside a Markdown code fence passes the check.
    #[serde(default)]
    pub lenient_json: bool,
    /// What an answer that fails the check does: goes out again, or ends the request.
    #[serde(default)]
    pub on_invalid: OnInvalid,
    /// How many answers a person reviews before the job's answers are approved; `None`
    /// approves valid answers at once.
    #[serde(default)]
    pub review_sample: Option<u32>,
    /// The seed of the review sample [default: derived from the job id].
    #[serde(default)]
    pub review_seed: Option<u64>,
    /// The most the job may cost: its requests go out only while their worst case, added to
    /// what the job was billed and has in flight, stays within it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Usd>,
    /// Whether tranche marks a system prompt its Anthropic requests share for the provider's
    /// prompt cache (jobs stored before this setting read back as `auto`).
    #[serde(default)]
    pub cache_shared_prompt: CacheSharedPrompt,
}

/// Whether a job's Anthropic requests that share a long system prompt within a tranche carry
/// a `cache_control` breakpoint on it (see [`cache_marks`](crate::cache_marks)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheSharedPrompt {
    /// Marked when shared by two requests or more of a tranche and long enough to cache.
    #[default]
    Auto,
    /// Sent as given.
    Off,
}

impl CacheSharedPrompt {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Off => "off",
        }
    }
}

impl std::str::FromStr for CacheSharedPrompt {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "off" => Ok(Self::Off),
            other => Err(format!("`{other}` is not auto or off")),
        }
    }
}

/// What an answer that fails its job's check does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnInvalid {
    /// It goes out again, spending an attempt (failed once the attempts are spent).
    #[default]
    Retry,
    /// The request ends failed.
    Fail,
}

impl OnInvalid {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Retry => "retry",
            Self::Fail => "fail",
        }
    }
}

impl std::str::FromStr for OnInvalid {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "retry" => Ok(Self::Retry),
            "fail" => Ok(Self::Fail),
            other => Err(format!("`{other}` is not retry or fail")),
        }
    }
}

fn default_endpoint() -> Endpoint {
    Endpoint::ChatCompletions
}

impl Default for JobSettings {
    fn default() -> Self {
        Self {
            task: None,
            version: None,
            endpoint: default_endpoint(),
            model: None,
            max_attempts: None,
            tenant: None,
            schema: None,
            answer_check: None,
            lenient_json: false,
            on_invalid: OnInvalid::Retry,
            review_sample: None,
            review_seed: None,
            budget: None,
            cache_shared_prompt: CacheSharedPrompt::Auto,
        }
    }
}

impl JobSettings {
    /// How to read the job's input lines for `provider`.
    pub fn input_options(&self, provider: ProviderKind) -> InputOptions {
        InputOptions {
            provider,
            task: self.task.clone(),
            version: self.version.clone(),
            endpoint: self.endpoint,
            model: self.model.clone(),
            tenant: self.tenant.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_round_trip_and_older_records_still_read() {
        let settings = JobSettings {
            task: Some("intent".into()),
            version: Some("v3".into()),
            endpoint: Endpoint::Embeddings,
            model: Some("text-embedding-3-small".into()),
            max_attempts: Some(5),
            tenant: Some("acme".into()),
            schema: Some(serde_json::json!({"type": "object"})),
            answer_check: Some("ab12".into()),
            lenient_json: true,
            on_invalid: OnInvalid::Fail,
            review_sample: Some(20),
            review_seed: Some(7),
            budget: Some(Usd::from_nanos(12_500_000_000)),
            cache_shared_prompt: CacheSharedPrompt::Off,
        };
        let json = serde_json::to_string(&settings).unwrap();
        assert_eq!(serde_json::from_str::<JobSettings>(&json).unwrap(), settings);
        // As the first versions stored them: an untyped bag, some keys null or missing.
        let old: JobSettings = serde_json::from_str(
            r#"{"task":"t","version":"v1","endpoint":"/v1/chat/completions","model":null,"max_attempts":null}"#,
        )
        .unwrap();
        assert_eq!((old.task.as_deref(), old.tenant), (Some("t"), None));
        assert_eq!(
            (old.answer_check, old.on_invalid, old.review_sample),
            (None, OnInvalid::Retry, None)
        );
        assert_eq!(old.budget, None);
        assert!(json.contains(r#""budget":12.5"#), "{json}");
        assert_eq!(old.cache_shared_prompt, CacheSharedPrompt::Auto, "older jobs cache");
        assert_eq!(serde_json::from_str::<JobSettings>("{}").unwrap(), JobSettings::default());
        assert!(json.contains(r#""cache_shared_prompt":"off""#), "{json}");
        for value in [CacheSharedPrompt::Auto, CacheSharedPrompt::Off] {
            assert_eq!(value.as_str().parse::<CacheSharedPrompt>().unwrap(), value);
        }
        assert!("on".parse::<CacheSharedPrompt>().unwrap_err().contains("auto or off"));
        let options = settings.input_options(ProviderKind::Azure);
        assert_eq!(
            (options.provider, options.tenant.as_deref()),
            (ProviderKind::Azure, Some("acme"))
        );
    }
}
