//! An engine harness: an in-process simulator on a stopped virtual clock, a fresh data folder,
//! and engines built over one store there, as after a restart each time one is asked for.

use std::sync::Arc;
use std::time::Duration;

use secrecy::SecretString;
use tranche_core::{JobId, JobSettings, ProviderKind};
use tranche_engine::{Engine, EngineConfig, Providers};
use tranche_providers::{
    AnthropicConfig, AnthropicProvider, OpenAiConfig, OpenAiProvider, Provider, http_client,
};
use tranche_sim::{SimConfig, SimHandle, Simulator};
use tranche_store::Store;
use tranche_store_sqlite::SqliteStore;

/// The simulator and the folder a test's engines share.
#[derive(Debug)]
pub struct Harness {
    pub dir: tempfile::TempDir,
    pub sim: SimHandle,
}

impl Harness {
    /// A simulator whose clock moves only when the test advances it.
    pub async fn new() -> Self {
        let sim = Simulator::spawn(SimConfig { speed: 0.0, ..SimConfig::default() }).await.unwrap();
        Self { dir: tempfile::tempdir().unwrap(), sim }
    }

    /// The store in the harness's folder (a new connection pool each time, as another
    /// process would have).
    pub async fn store(&self) -> Arc<dyn Store> {
        let path = self.dir.path().join("t.db");
        Arc::new(SqliteStore::open(&path.to_string_lossy()).await.unwrap())
    }

    /// A fresh engine over the same store and folders, polling without delay.
    pub async fn engine(&self, max_batch_requests: Option<usize>) -> Engine {
        self.engine_with(|c| c.max_batch_requests = max_batch_requests).await
    }

    /// A fresh engine whose configuration `tune` adjusts.
    pub async fn engine_with(&self, tune: impl FnOnce(&mut EngineConfig)) -> Engine {
        self.engine_at(self.sim.openai_base_url(), tune).await
    }

    /// A fresh engine over the same store whose OpenAI adapter reaches `base_url`.
    pub async fn engine_at(
        &self,
        base_url: String,
        tune: impl FnOnce(&mut EngineConfig),
    ) -> Engine {
        self.engine_over(Arc::new(self.openai_at(base_url)), tune).await
    }

    /// An OpenAI adapter reaching `base_url`.
    pub fn openai_at(&self, base_url: String) -> OpenAiProvider {
        let mut config = OpenAiConfig::new(SecretString::from("sk-test"));
        config.base_url = base_url;
        OpenAiProvider::new(config, http_client().unwrap()).unwrap()
    }

    /// A fresh engine over the same store whose Anthropic adapter reaches the simulator, its
    /// configuration adjusted by `tune`.
    pub async fn anthropic_engine_with(&self, tune: impl FnOnce(&mut EngineConfig)) -> Engine {
        let mut config = AnthropicConfig::new(SecretString::from("sk-ant-test"));
        config.base_url = self.sim.anthropic_base_url();
        let adapter = AnthropicProvider::new(config, http_client().unwrap()).unwrap();
        self.engine_over(Arc::new(adapter), tune).await
    }

    /// A fresh engine over the same store reaching its provider through `provider`.
    pub async fn engine_over(
        &self,
        provider: Arc<dyn Provider>,
        tune: impl FnOnce(&mut EngineConfig),
    ) -> Engine {
        let mut engine_config = EngineConfig {
            poll_interval: Duration::ZERO,
            retry_backoff: Duration::ZERO,
            ..EngineConfig::in_dir(self.dir.path())
        };
        engine_config.provider_poll_intervals.clear();
        tune(&mut engine_config);
        Engine::new(self.store().await, Providers::new().with(provider), engine_config)
    }
}

/// Submits `text` (tranche lines) as one OpenAI job of task `t`.
pub async fn submit(engine: &Engine, text: &str) -> JobId {
    let settings = JobSettings { task: Some("t".into()), ..JobSettings::default() };
    engine.submit(text.as_bytes(), ProviderKind::Openai, settings, None).await.unwrap().job_id
}

/// `n` tranche lines keyed `k0`, `k1`, ... over two models (alternating), each message
/// starting with its key.
pub fn keyed_lines(n: usize) -> String {
    (0..n)
        .map(|i| {
            let model = if i % 2 == 0 { "gpt-4o-mini" } else { "gpt-4.1-mini" };
            format!(
                "{}\n",
                serde_json::json!({"key": format!("k{i}"), "body": {"model": model, "messages": [{"role": "user", "content": format!("k{i} question")}]}})
            )
        })
        .collect()
}

impl Harness {
    /// Ticks `engine` (advancing the simulator's clock a second between ticks) until `job`
    /// ends; its end state.
    pub async fn run_to_end(&self, engine: &Engine, job: JobId) -> tranche_core::JobState {
        for _ in 0..300 {
            engine.tick().await.unwrap();
            let state = engine.store().job(job).await.unwrap().unwrap().state;
            if state.is_terminal() {
                return state;
            }
            self.sim.advance(1.0);
        }
        panic!("job {job} did not end");
    }

    /// The simulator's ledger by custom id: every run of each request, in order.
    pub fn ledger_by_custom_id(
        &self,
    ) -> std::collections::BTreeMap<String, Vec<tranche_sim::LedgerOutcome>> {
        let mut map = std::collections::BTreeMap::<String, Vec<_>>::new();
        for entry in self.sim.ledger() {
            map.entry(entry.custom_id).or_default().push(entry.outcome);
        }
        map
    }
}
