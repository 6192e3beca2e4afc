//! What a job asks for: stored with the job, and obeyed by whichever engine works on it.
//!
//! How a deployment runs (planning limits, token budgets, poll interval, lease length) is not
//! here: that is each engine's configuration, the same for every engine of a deployment.

use serde::{Deserialize, Serialize};

use crate::input::InputOptions;
use crate::{Endpoint, ProviderKind};

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
        };
        let json = serde_json::to_string(&settings).unwrap();
        assert_eq!(serde_json::from_str::<JobSettings>(&json).unwrap(), settings);
        // As the first versions stored them: an untyped bag, some keys null or missing.
        let old: JobSettings = serde_json::from_str(
            r#"{"task":"t","version":"v1","endpoint":"/v1/chat/completions","model":null,"max_attempts":null}"#,
        )
        .unwrap();
        assert_eq!((old.task.as_deref(), old.tenant), (Some("t"), None));
        assert_eq!(serde_json::from_str::<JobSettings>("{}").unwrap(), JobSettings::default());
        let options = settings.input_options(ProviderKind::Azure);
        assert_eq!(
            (options.provider, options.tenant.as_deref()),
            (ProviderKind::Azure, Some("acme"))
        );
    }
}
