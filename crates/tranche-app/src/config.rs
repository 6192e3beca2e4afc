//! Engine configuration: how a deployment runs, the same for every engine of it. Layered, each
//! layer over the next: flags > environment (`TRANCHE_POLL_INTERVAL`, ...) > `tranche.toml` (in
//! the data folder, or the file `TRANCHE_CONFIG` names) > defaults.
//!
//! What a job asks for is not here: that is `JobSettings`, stored with the job. Nothing here
//! is secret (keys come from the providers' own environment variables), and none of it is
//! logged.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};
use tranche_blob::BlobStore;
use tranche_core::ProviderKind;
use tranche_core::price::PriceTable;
use tranche_engine::{EngineConfig, FileLimits};

use crate::error::AppError;

/// The file a deployment's engines read, unless `TRANCHE_CONFIG` names another.
pub const CONFIG_FILE: &str = "tranche.toml";

/// The environment variable that names the configuration file.
pub const CONFIG_ENV: &str = "TRANCHE_CONFIG";

/// Engine settings as a layer gives them: each field set or not. Keys are the same in
/// `tranche.toml`, in the environment (upper case, `TRANCHE_` before them) and as flags
/// (`--poll-interval`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSettings {
    /// Seconds between two polls of a running batch [default: 30; 60 for Azure and
    /// Anthropic]; when set, it holds for every provider.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub poll_interval: Option<f64>,
    /// A batch goes out once this many requests of one provider, endpoint and model wait...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_batch_size: Option<usize>,
    /// ...or once the oldest has waited this many seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_wait: Option<f64>,
    /// At most this many requests per batch (the provider's own limit is the ceiling).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_batch_requests: Option<usize>,
    /// At most this many bytes of input per batch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_batch_bytes: Option<u64>,
    /// Enqueued-token budget per model.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub token_budgets: BTreeMap<String, u64>,
    /// Enqueued-token budget for models without their own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_token_budget: Option<u64>,
    /// The most of each model's enqueued-token budget one tenant may hold, as a share
    /// (0 < share ≤ 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant_token_share: Option<f64>,
    /// The most unfinished batches (each at most one input file) one tenant may have on a
    /// provider account.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant_max_files: Option<u64>,
    /// Seconds a lease on a step or on planning lasts unless renewed [default: 60].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<f64>,
    /// How many times a request is sent at most, for jobs that do not say [default: 3].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// Seconds an uploaded input file lives at the provider before it expires.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_expires_after: Option<u64>,
    /// Where bytes rest: `file:///path` or `s3://bucket/prefix` [default: `blobs` in the data
    /// folder]. Every engine of a deployment must use the same.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blob_store: Option<String>,
    /// How many tranches one engine steps at once [default: 4].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parallel_steps: Option<usize>,
    /// How many of those steps may move a file's bytes at once (write an input file, copy
    /// result files, ingest them) [default: 1].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transfer_steps: Option<usize>,
    /// Seconds between two cleanups of each account's provider files by the workers (one
    /// worker of the deployment does each) [default: 3600; 0: never].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub janitor_interval: Option<f64>,
    /// Seconds a file named like tranche's but unknown to the store is kept before a cleanup
    /// deletes it [default: 86400].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub orphan_grace: Option<f64>,
    /// How many files a provider's account may hold, by provider (`[file_limits.azure]`,
    /// `with_expiry`, `without_expiry`) [default: Azure 10,000 and 500].
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub file_limits: BTreeMap<ProviderKind, FileLimits>,
    /// A price file of the bundled table's shape whose entries override or add to it (a
    /// relative path is read from the data folder).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prices: Option<PathBuf>,
}

/// The periodic cleanup's interval when the configuration names none.
const JANITOR_INTERVAL: Duration = Duration::from_secs(3600);

/// The keys the environment may set, each as `TRANCHE_<KEY>`.
const ENV_KEYS: [&str; 17] = [
    "poll_interval",
    "min_batch_size",
    "max_wait",
    "max_batch_requests",
    "max_batch_bytes",
    "default_token_budget",
    "tenant_token_share",
    "tenant_max_files",
    "lease",
    "max_attempts",
    "file_expires_after",
    "blob_store",
    "parallel_steps",
    "transfer_steps",
    "janitor_interval",
    "orphan_grace",
    "prices",
];

/// Where the configuration file is: the one `TRANCHE_CONFIG` names, else `tranche.toml` in the
/// data folder. The second is optional; a file `TRANCHE_CONFIG` names must exist.
pub fn config_file(data_dir: &Path) -> (PathBuf, bool) {
    match std::env::var_os(CONFIG_ENV).filter(|v| !v.is_empty()) {
        Some(path) => (PathBuf::from(path), true),
        None => (data_dir.join(CONFIG_FILE), false),
    }
}

impl EngineSettings {
    /// The settings in force: `flags` over the environment over the file over defaults.
    pub fn layered(data_dir: &Path, flags: &EngineSettings) -> Result<Self, AppError> {
        let (file, required) = config_file(data_dir);
        let mut figment = Figment::new();
        if file.is_file() {
            figment = figment.merge(Toml::file_exact(&file));
        } else if required {
            return Err(AppError::Config(format!(
                "{CONFIG_ENV} names `{}`, which is not a file",
                file.display()
            )));
        }
        figment = figment
            .merge(Env::prefixed("TRANCHE_").only(&ENV_KEYS))
            .merge(Serialized::defaults(flags));
        figment.extract().map_err(|e| {
            AppError::Config(format!("engine configuration ({}): {e}", file.display()))
        })
    }

    /// The engine configuration these settings make, for a deployment whose files live in
    /// `data_dir`.
    pub fn engine_config(&self, data_dir: &Path) -> Result<EngineConfig, AppError> {
        let mut config = EngineConfig::in_dir(data_dir);
        if let Some(poll) = self.poll_interval {
            let poll = seconds("poll_interval", poll, false)?;
            config.poll_interval = poll;
            config.provider_poll_intervals.clear();
            config.retry_backoff = poll.min(config.retry_backoff);
        }
        if let Some(n) = self.min_batch_size {
            config.min_batch_size = n.max(1);
        }
        if let Some(wait) = self.max_wait {
            config.max_wait = seconds("max_wait", wait, true)?;
        }
        config.max_batch_requests = self.max_batch_requests;
        config.max_batch_bytes = self.max_batch_bytes;
        config.token_budgets = self.token_budgets.clone();
        config.default_token_budget = self.default_token_budget;
        if let Some(share) = self.tenant_token_share {
            if !(share > 0.0 && share <= 1.0) {
                return Err(AppError::Config(format!(
                    "tenant_token_share must be above 0 and at most 1, got {share}"
                )));
            }
            config.tenant_token_share = Some(share);
        }
        if let Some(n) = self.tenant_max_files {
            config.tenant_max_files = Some(at_least_one("tenant_max_files", n)?);
        }
        if let Some(lease) = self.lease {
            config.lease = seconds("lease", lease, false)?;
        }
        if let Some(url) = &self.blob_store {
            config.blobs =
                BlobStore::open(url).map_err(|e| AppError::Config(format!("blob_store: {e}")))?;
        }
        if let Some(n) = self.max_attempts {
            config.max_attempts = at_least_one("max_attempts", n)?;
        }
        if let Some(n) = self.parallel_steps {
            config.parallel_steps = at_least_one("parallel_steps", n)?;
        }
        if let Some(n) = self.transfer_steps {
            config.transfer_steps = at_least_one("transfer_steps", n)?;
        }
        if let Some(grace) = self.orphan_grace {
            config.orphan_grace = seconds("orphan_grace", grace, true)?;
        }
        config.prices = self.price_table(data_dir)?;
        for (provider, limits) in &self.file_limits {
            let entry = config.file_limits.entry(*provider).or_default();
            entry.with_expiry = limits.with_expiry.or(entry.with_expiry);
            entry.without_expiry = limits.without_expiry.or(entry.without_expiry);
        }
        Ok(config)
    }

    /// The price table in force: the bundled one, under the file `prices` names.
    pub fn price_table(&self, data_dir: &Path) -> Result<PriceTable, AppError> {
        let mut table = PriceTable::bundled();
        if let Some(path) = &self.prices {
            let path = data_dir.join(path);
            let text = std::fs::read_to_string(&path)
                .map_err(|source| AppError::Read { path: path.clone(), source })?;
            let user = PriceTable::from_toml(&text)
                .map_err(|e| AppError::Config(format!("prices (`{}`): {e}", path.display())))?;
            table.overlay(user);
        }
        Ok(table)
    }

    /// How often a worker cleans up provider files; `None`: never.
    pub fn janitor_interval(&self) -> Result<Option<Duration>, AppError> {
        match self.janitor_interval {
            None => Ok(Some(JANITOR_INTERVAL)),
            Some(interval) => {
                Ok(Some(seconds("janitor_interval", interval, true)?).filter(|d| !d.is_zero()))
            }
        }
    }
}

/// `n`, a count that must be at least 1, else a clear error naming `key`.
fn at_least_one<T: Copy + PartialEq + From<u8>>(key: &str, n: T) -> Result<T, AppError> {
    if n == T::from(0) {
        return Err(AppError::Config(format!("{key} must be at least 1")));
    }
    Ok(n)
}

fn seconds(key: &str, value: f64, allow_zero: bool) -> Result<Duration, AppError> {
    Duration::try_from_secs_f64(value).ok().filter(|d| allow_zero || !d.is_zero()).ok_or_else(
        || {
            AppError::Config(format!(
                "{key} must be a {} number of seconds, not {value}",
                if allow_zero { "non-negative" } else { "positive" }
            ))
        },
    )
}

#[cfg(test)]
mod tests {
    #![expect(clippy::result_large_err, reason = "figment's Jail returns its own error type")]

    use figment::Jail;

    use super::*;

    fn layered(jail: &Jail, flags: &EngineSettings) -> EngineSettings {
        EngineSettings::layered(jail.directory(), flags).unwrap()
    }

    #[test]
    fn flags_win_over_the_environment_over_the_file_over_defaults() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            assert_eq!(layered(jail, &EngineSettings::default()), EngineSettings::default());
            jail.create_file(
                CONFIG_FILE,
                "poll_interval = 7.5\nmin_batch_size = 100\nlease = 20\n\n[token_budgets]\n\"gpt-4o-mini\" = 5000\n",
            )?;
            let file = layered(jail, &EngineSettings::default());
            assert_eq!(
                (file.poll_interval, file.min_batch_size, file.lease),
                (Some(7.5), Some(100), Some(20.0))
            );
            assert_eq!(file.token_budgets.get("gpt-4o-mini"), Some(&5000));
            jail.set_env("TRANCHE_MIN_BATCH_SIZE", "50");
            jail.set_env("TRANCHE_LEASE", "30");
            let env = layered(jail, &EngineSettings::default());
            assert_eq!(
                (env.poll_interval, env.min_batch_size, env.lease),
                (Some(7.5), Some(50), Some(30.0))
            );
            let flags = EngineSettings { lease: Some(2.0), ..EngineSettings::default() };
            let all = layered(jail, &flags);
            assert_eq!(
                (all.poll_interval, all.min_batch_size, all.lease),
                (Some(7.5), Some(50), Some(2.0))
            );
            let config = all.engine_config(jail.directory()).unwrap();
            assert_eq!(config.poll_interval, Duration::from_millis(7_500));
            assert!(config.provider_poll_intervals.is_empty(), "one interval for every provider");
            assert_eq!((config.min_batch_size, config.lease), (50, Duration::from_secs(2)));
            assert_eq!(config.token_budget("gpt-4o-mini"), Some(5000));
            Ok(())
        });
    }

    #[test]
    fn how_many_steps_move_files_at_once_is_configured_and_checked() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            let defaults = layered(jail, &EngineSettings::default());
            assert_eq!(defaults.engine_config(jail.directory()).unwrap().transfer_steps, 1);
            jail.create_file(CONFIG_FILE, "parallel_steps = 8\ntransfer_steps = 2\n")?;
            let file = layered(jail, &EngineSettings::default()).engine_config(jail.directory());
            let file = file.unwrap();
            assert_eq!((file.parallel_steps, file.transfer_steps), (8, 2));
            jail.set_env("TRANCHE_TRANSFER_STEPS", "3");
            let env = layered(jail, &EngineSettings::default()).engine_config(jail.directory());
            assert_eq!(env.unwrap().transfer_steps, 3);
            jail.set_env("TRANCHE_TRANSFER_STEPS", "0");
            let err = layered(jail, &EngineSettings::default())
                .engine_config(jail.directory())
                .unwrap_err();
            assert!(err.to_string().contains("transfer_steps must be at least 1"), "{err}");
            assert!(err.is_usage());
            Ok(())
        });
    }

    #[test]
    fn the_file_named_by_tranche_config_is_read_and_must_exist() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            jail.create_file("elsewhere.toml", "max_wait = 600\n")?;
            let path = jail.directory().join("elsewhere.toml");
            jail.set_env(CONFIG_ENV, path.display());
            let settings = layered(jail, &EngineSettings::default());
            assert_eq!(settings.max_wait, Some(600.0));
            jail.set_env(CONFIG_ENV, jail.directory().join("missing.toml").display());
            let err = EngineSettings::layered(jail.directory(), &EngineSettings::default());
            assert!(err.unwrap_err().to_string().contains("missing.toml"));
            Ok(())
        });
    }

    #[test]
    fn a_mistyped_key_or_a_bad_value_is_a_clear_error() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            jail.create_file(CONFIG_FILE, "pol_interval = 5\n")?;
            let err = EngineSettings::layered(jail.directory(), &EngineSettings::default());
            let text = err.unwrap_err().to_string();
            assert!(text.contains("pol_interval") && text.contains(CONFIG_FILE), "{text}");
            jail.create_file(CONFIG_FILE, "lease = 0\n")?;
            let settings = layered(jail, &EngineSettings::default());
            let err = settings.engine_config(jail.directory()).unwrap_err();
            assert!(err.to_string().contains("lease must be a positive number"), "{err}");
            assert!(err.is_usage());
            Ok(())
        });
    }

    #[test]
    fn tenant_shares_are_taken_from_file_and_environment_and_checked() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            let config = layered(jail, &EngineSettings::default());
            let config = config.engine_config(jail.directory()).unwrap();
            assert_eq!((config.tenant_token_share, config.tenant_max_files), (None, None));
            jail.create_file(
                CONFIG_FILE,
                "tenant_token_share = 0.25
default_token_budget = 1000
",
            )?;
            jail.set_env("TRANCHE_TENANT_MAX_FILES", "40");
            let config = layered(jail, &EngineSettings::default());
            let config = config.engine_config(jail.directory()).unwrap();
            assert_eq!(
                (config.tenant_token_share, config.tenant_max_files),
                (Some(0.25), Some(40))
            );
            assert_eq!(config.tenant_token_cap("any"), Some(250));
            jail.create_file(
                CONFIG_FILE,
                "tenant_token_share = 1.5
",
            )?;
            let settings = layered(jail, &EngineSettings::default());
            let err = settings.engine_config(jail.directory()).unwrap_err();
            assert!(err.to_string().contains("tenant_token_share must be above 0"), "{err}");
            jail.create_file(CONFIG_FILE, "")?;
            jail.set_env("TRANCHE_TENANT_MAX_FILES", "0");
            let settings = layered(jail, &EngineSettings::default());
            let err = settings.engine_config(jail.directory()).unwrap_err();
            assert!(err.to_string().contains("tenant_max_files must be at least 1"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn the_janitor_and_file_limits_take_their_defaults_and_overrides() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            let defaults = layered(jail, &EngineSettings::default());
            assert_eq!(defaults.janitor_interval().unwrap(), Some(JANITOR_INTERVAL));
            let config = defaults.engine_config(jail.directory()).unwrap();
            assert_eq!(config.orphan_grace, Duration::from_secs(86_400));
            assert_eq!(config.file_limits.get(&ProviderKind::Azure), Some(&FileLimits::AZURE));
            jail.create_file(
                CONFIG_FILE,
                "janitor_interval = 0\norphan_grace = 60\n\n[file_limits.azure]\nwithout_expiry = 100\n\n[file_limits.openai]\nwith_expiry = 7\n",
            )?;
            let set = layered(jail, &EngineSettings::default());
            assert_eq!(set.janitor_interval().unwrap(), None, "0 turns it off");
            let config = set.engine_config(jail.directory()).unwrap();
            assert_eq!(config.orphan_grace, Duration::from_secs(60));
            let azure = FileLimits { without_expiry: Some(100), ..FileLimits::AZURE };
            assert_eq!(config.file_limits.get(&ProviderKind::Azure), Some(&azure));
            let openai = FileLimits { with_expiry: Some(7), without_expiry: None };
            assert_eq!(config.file_limits.get(&ProviderKind::Openai), Some(&openai));
            jail.set_env("TRANCHE_JANITOR_INTERVAL", "90");
            let env = layered(jail, &EngineSettings::default());
            assert_eq!(env.janitor_interval().unwrap(), Some(Duration::from_secs(90)));
            jail.create_file(CONFIG_FILE, "[file_limits.azure]\nwith_expiri = 1\n")?;
            let err = EngineSettings::layered(jail.directory(), &EngineSettings::default());
            assert!(err.unwrap_err().to_string().contains("with_expiri"));
            Ok(())
        });
    }

    #[test]
    fn a_price_file_in_the_configuration_overlays_the_bundled_table() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            let bundled = layered(jail, &EngineSettings::default()).price_table(jail.directory());
            let bundled = bundled.unwrap();
            assert!(bundled.lookup(ProviderKind::Openai, "house-model").is_none());
            let mini = bundled.lookup(ProviderKind::Openai, "gpt-4o-mini").unwrap();
            jail.create_file("ours.toml", "[openai.\"house-model\"]\ninput = 1.5\noutput = 6.0\n\n[openai.\"gpt-4o-mini\"]\ninput = 0.2\noutput = 9.0\n")?;
            jail.create_file(CONFIG_FILE, "prices = \"ours.toml\"\n")?;
            let table = layered(jail, &EngineSettings::default()).price_table(jail.directory());
            let table = table.unwrap();
            assert_eq!(table.lookup(ProviderKind::Openai, "house-model").unwrap().input, 1.5);
            let overridden = table.lookup(ProviderKind::Openai, "gpt-4o-mini").unwrap();
            assert_eq!((overridden.input, overridden.output), (0.2, 9.0));
            assert_eq!(overridden.cached_input, mini.cached_input, "what it does not give stays");
            // The engine keeps budgets by the same table.
            let config = layered(jail, &EngineSettings::default());
            let config = config.engine_config(jail.directory()).unwrap();
            assert!(config.prices.lookup(ProviderKind::Openai, "house-model").is_some());
            // A missing file or a bad one is refused by name.
            jail.create_file(CONFIG_FILE, "prices = \"nowhere.toml\"\n")?;
            let err = layered(jail, &EngineSettings::default()).price_table(jail.directory());
            assert!(err.unwrap_err().to_string().contains("nowhere.toml"));
            jail.create_file("ours.toml", "[openai.\"house-model\"]\ninput = -1\noutput = 6.0\n")?;
            jail.create_file(CONFIG_FILE, "prices = \"ours.toml\"\n")?;
            let err = layered(jail, &EngineSettings::default()).price_table(jail.directory());
            let err = err.unwrap_err();
            assert!(err.is_usage() && err.to_string().contains("ours.toml"), "{err}");
            Ok(())
        });
    }
}
