//! Blocking probes of a running simulator, for tests that check what a provider saw: its
//! counters, its billing ledger, every upload, every batch by the tranche in its metadata.

use std::collections::BTreeMap;

use serde_json::Value;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// A GET of the simulator's control surface (no auth).
pub fn get(url: &str) -> String {
    runtime().block_on(async { reqwest::get(url).await.unwrap().text().await.unwrap() })
}

/// `POST /sim/config` of the simulator at `root`: its configuration from now on.
pub fn set_config(root: &str, config: &Value) {
    runtime().block_on(async {
        let url = format!("{root}/sim/config");
        let response = reqwest::Client::new().post(&url).json(config).send().await.unwrap();
        assert!(response.status().is_success(), "POST {url}: {}", response.status());
    });
}

/// A GET with `key`, repeated through the faults the simulator may inject.
pub fn get_authed(url: &str, key: &str) -> Value {
    runtime().block_on(async {
        let client = reqwest::Client::new();
        for _ in 0..100 {
            if let Ok(response) = client.get(url).bearer_auth(key).send().await
                && response.status().is_success()
                && let Ok(text) = response.text().await
            {
                return serde_json::from_str(&text).unwrap();
            }
        }
        panic!("GET {url} kept failing")
    })
}

/// `GET /sim/stats` of the simulator at `root`.
pub fn stats(root: &str) -> Value {
    serde_json::from_str(&get(&format!("{root}/sim/stats"))).unwrap()
}

/// How many times the simulator billed each custom id (successful runs in its ledger).
pub fn billed(root: &str) -> BTreeMap<String, usize> {
    let mut billed = BTreeMap::new();
    for line in get(&format!("{root}/sim/ledger")).lines() {
        let entry: Value = serde_json::from_str(line).unwrap();
        if entry["outcome"] == "succeeded" {
            *billed.entry(entry["custom_id"].as_str().unwrap().to_owned()).or_insert(0) += 1;
        }
    }
    billed
}

/// The tokens the simulator billed one provider (`"openai"`, `"azure"`, `"anthropic"`), summed
/// over its ledger, as `tranche cost` names them, and the models its entries name.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LedgerTokens {
    /// Every billed input token, cache reads and writes included.
    pub input: u64,
    pub cached_input: u64,
    pub cache_write_input: u64,
    pub output: u64,
    pub models: std::collections::BTreeSet<String>,
}

/// [`LedgerTokens`] of the simulator at `root` for `provider`.
pub fn ledger_tokens(root: &str, provider: &str) -> LedgerTokens {
    let mut sums = LedgerTokens::default();
    for line in get(&format!("{root}/sim/ledger")).lines() {
        let e: Value = serde_json::from_str(line).unwrap();
        if e["provider"] != provider {
            continue;
        }
        let n = |k: &str| e[k].as_u64().unwrap_or(0);
        sums.input += n("input_tokens");
        sums.cached_input += n("cached_tokens");
        sums.cache_write_input += n("cache_write_5m_tokens") + n("cache_write_1h_tokens");
        sums.output += n("output_tokens");
        if let Some(model) = e["model"].as_str() {
            sums.models.insert(model.to_owned());
        }
    }
    sums
}

/// How many files each file name was uploaded as (deleted files included).
pub fn uploads_by_name(root: &str) -> BTreeMap<String, usize> {
    let uploads: Vec<Value> = serde_json::from_str(&get(&format!("{root}/sim/uploads"))).unwrap();
    let mut by_name = BTreeMap::new();
    for upload in &uploads {
        *by_name.entry(upload["filename"].as_str().unwrap().to_owned()).or_insert(0) += 1;
    }
    by_name
}

/// Every OpenAI batch the simulator holds, counted by the tranche id in its metadata.
pub fn batches_by_tranche(openai_base_url: &str, key: &str) -> BTreeMap<String, usize> {
    let mut by_tranche = BTreeMap::new();
    let mut after: Option<String> = None;
    loop {
        let mut url = format!("{openai_base_url}/batches?limit=100");
        if let Some(after) = &after {
            url.push_str(&format!("&after={after}"));
        }
        let page = get_authed(&url, key);
        for batch in page["data"].as_array().unwrap() {
            let tranche = batch["metadata"]["tranche_id"].as_str().unwrap_or("none").to_owned();
            *by_tranche.entry(tranche).or_insert(0) += 1;
        }
        if page["has_more"] != true {
            return by_tranche;
        }
        after = page["last_id"].as_str().map(str::to_owned);
    }
}
