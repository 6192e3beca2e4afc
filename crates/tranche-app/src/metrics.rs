//! What a metrics scrape shows (`GET /metrics`): jobs, requests and tranches in every state
//! (zeros included, so a series never vanishes), the upstream errors jobs and tranches carry
//! now, and each provider and model's billed tokens and, where the price table prices the
//! model, its cost. Read from the store's aggregates (`MetricsStore`), priced as a job's cost
//! is; never a scan of requests.

use tranche_core::price::PriceTable;
use tranche_core::{JobState, ProviderKind, RequestState, TrancheState};
use tranche_store::{MetricsSnapshot, RequestCounts, UpstreamErrorCount};

use crate::App;
use crate::cost::{TokenCounts, price_rows};
use crate::error::AppError;

/// The deployment's figures at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct Metrics {
    /// Jobs in each state, every state listed in its order.
    pub jobs: Vec<(JobState, u64)>,
    /// Requests in each state (summed from the job counters), every state listed.
    pub requests: Vec<(RequestState, u64)>,
    /// Tranches in each state, every state listed.
    pub tranches: Vec<(TrancheState, u64)>,
    /// Jobs and tranches carrying an upstream error now, by carrier, provider and code.
    pub upstream_errors: Vec<UpstreamErrorCount>,
    /// Billed usage by provider and model, over every job and day.
    pub models: Vec<ModelUsage>,
}

/// One provider and model's billed usage.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelUsage {
    pub provider: ProviderKind,
    pub model: String,
    pub tokens: TokenCounts,
    /// What the provider billed, in USD; `None` when the price table does not price the model.
    pub cost_usd: Option<f64>,
}

impl App {
    /// The deployment's figures, billed usage priced by `prices` as `job_cost` prices it.
    pub async fn metrics(&self, prices: &PriceTable) -> Result<Metrics, AppError> {
        Ok(metrics_of(self.store.metrics_snapshot().await?, prices))
    }
}

/// Every state of `all` with its count in `counts` (0 when absent).
fn every_state<S: Copy + PartialEq>(all: &[S], counts: &[(S, u64)]) -> Vec<(S, u64)> {
    all.iter().map(|s| (*s, counts.iter().filter(|(c, _)| c == s).map(|(_, n)| n).sum())).collect()
}

fn request_count(counts: &RequestCounts, state: RequestState) -> u64 {
    match state {
        RequestState::Pending => counts.pending,
        RequestState::Queued => counts.queued,
        RequestState::Succeeded => counts.succeeded,
        RequestState::Failed => counts.failed,
        RequestState::Cancelled => counts.cancelled,
    }
}

fn metrics_of(snapshot: MetricsSnapshot, prices: &PriceTable) -> Metrics {
    let (_, by_model) = price_rows(&snapshot.billed, prices);
    Metrics {
        jobs: every_state(JobState::ALL, &snapshot.jobs),
        requests: RequestState::ALL
            .iter()
            .map(|s| (*s, request_count(&snapshot.requests, *s)))
            .collect(),
        tranches: every_state(TrancheState::ALL, &snapshot.tranches),
        upstream_errors: snapshot.upstream_errors,
        models: by_model
            .into_iter()
            .map(|m| ModelUsage {
                provider: m.provider,
                tokens: m.tokens.into(),
                cost_usd: m.costs.map(|c| c.cost),
                model: m.model,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use tranche_core::TokenUsage;
    use tranche_store::{UsageKind, UsageRow};

    use super::*;

    #[test]
    fn every_state_is_listed_and_only_priced_models_have_a_cost() {
        let tokens = TokenUsage {
            input: 1_000_000,
            cached_input: 200_000,
            output: 1_000_000,
            ..TokenUsage::default()
        };
        let row = |model: &str| UsageRow {
            kind: UsageKind::Billed,
            provider: ProviderKind::Openai,
            model: model.to_owned(),
            requests: 3,
            tokens,
        };
        let snapshot = MetricsSnapshot {
            jobs: vec![(JobState::Done, 2)],
            requests: RequestCounts { accepted: 7, succeeded: 5, queued: 2, ..Default::default() },
            tranches: vec![(TrancheState::Submitted, 1)],
            billed: vec![row("gpt-4o-mini"), row("house-model")],
            upstream_errors: Vec::new(),
        };
        let metrics = metrics_of(snapshot, &PriceTable::bundled());
        assert_eq!(metrics.jobs.len(), JobState::ALL.len());
        assert!(metrics.jobs.contains(&(JobState::Done, 2)));
        assert!(metrics.jobs.contains(&(JobState::Pending, 0)), "a state with none shows 0");
        assert_eq!(
            metrics.requests,
            [
                (RequestState::Pending, 0),
                (RequestState::Queued, 2),
                (RequestState::Succeeded, 5),
                (RequestState::Failed, 0),
                (RequestState::Cancelled, 0),
            ]
        );
        assert_eq!(metrics.tranches.len(), TrancheState::ALL.len());
        assert!(metrics.tranches.contains(&(TrancheState::Submitted, 1)));
        let [priced, unpriced] = &metrics.models[..] else { panic!("{:?}", metrics.models) };
        assert_eq!(priced.tokens.input, 1_000_000);
        assert_eq!(priced.tokens.cached_input, 200_000);
        // gpt-4o-mini in a batch, per million: 800,000 uncached input at $0.075, 200,000
        // cached at $0.0375, 1,000,000 output at $0.30.
        let cost = priced.cost_usd.unwrap();
        assert!((cost - 0.3675).abs() < 1e-12, "{cost}");
        assert_eq!(unpriced.model, "house-model");
        assert_eq!(unpriced.cost_usd, None, "no price, no cost");
    }
}
