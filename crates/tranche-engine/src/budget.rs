//! Budgets: a request of a job with a budget joins a tranche only while its worst case, added
//! to what the job has been billed and what its requests in flight may still cost, stays within
//! the budget; once nothing of the job is in flight and its next request would pass it, the
//! requests left end cancelled (`budget_exceeded`). So a job never costs more than its budget.

use std::collections::HashMap;

use tracing::{info, warn};
use tranche_core::price::{Costs, PriceTable, costs};
use tranche_core::{JobId, ProviderKind, Usd};
use tranche_providers::LineError;
use tranche_store::{PendingItem, Store, UsageKind};

use crate::engine::Engine;
use crate::error::EngineError;

/// The error code of a request cancelled because its job's budget could not pay for it.
pub const BUDGET_EXCEEDED: &str = "budget_exceeded";

/// What one job's budget holds during a planning pass.
#[derive(Debug)]
struct JobBudget {
    budget: Usd,
    /// Billed so far, plus the worst case of what is in flight and of what this pass admitted.
    committed: Usd,
    /// The worst case of the first request that did not fit: the job's later requests wait
    /// too (they go in order).
    blocked: Option<Usd>,
    /// Requests admitted in this pass.
    admitted: u64,
}

/// The budgets of the jobs one planning pass meets, each read once.
#[derive(Debug, Default)]
pub(crate) struct Budgets {
    jobs: HashMap<JobId, Option<JobBudget>>,
}

/// What a job's billed usage cost, rounded up to the nanodollar; `None` when a result names a
/// model the table does not price (submit refuses a budget for an unpriced request model, but
/// a response may name another): then nothing more of the job may go out.
pub(crate) async fn billed(
    store: &dyn Store,
    prices: &PriceTable,
    job: JobId,
) -> Result<Option<Usd>, EngineError> {
    let mut total = Costs::default();
    for row in store.job_usage(job).await? {
        if row.kind != UsageKind::Billed {
            continue;
        }
        let Some(price) = prices.lookup(row.provider, &row.model) else {
            warn!(job = %job, model = %row.model, "a result names a model without a price; the job's budget admits nothing more");
            return Ok(None);
        };
        total += costs(&row.tokens, &price, &prices.rules(row.provider));
    }
    Ok(Some(Usd::ceil(total.cost)))
}

impl Budgets {
    /// Whether `item` may join a tranche now; if so, its worst case is held for it.
    pub(crate) async fn admits(
        &mut self,
        engine: &Engine,
        item: &PendingItem,
    ) -> Result<bool, EngineError> {
        let Some(cost) = item.max_cost else { return Ok(true) };
        if !self.jobs.contains_key(&item.job_id) {
            let loaded = self.load(engine, item.job_id).await?;
            self.jobs.insert(item.job_id, loaded);
        }
        let Some(Some(job)) = self.jobs.get_mut(&item.job_id) else { return Ok(true) };
        if job.blocked.is_some() {
            return Ok(false);
        }
        if job.committed.saturating_add(cost) > job.budget {
            job.blocked = Some(cost);
            return Ok(false);
        }
        job.committed = job.committed.saturating_add(cost);
        job.admitted += 1;
        Ok(true)
    }

    async fn load(&self, engine: &Engine, id: JobId) -> Result<Option<JobBudget>, EngineError> {
        let store = engine.store();
        let Some(budget) = store.job(id).await?.and_then(|job| job.settings.budget) else {
            return Ok(None);
        };
        // What is in flight first, then the bill: a result ingested between the two reads is
        // counted twice (the safe side), never not at all.
        let in_flight = store.job_queued_cost(id).await?;
        let spent = billed(store, &engine.config().prices, id).await?;
        // A bill that cannot be priced leaves no room.
        let committed = spent.map_or(budget, |spent| spent.saturating_add(in_flight));
        Ok(Some(JobBudget { budget, committed, blocked: None, admitted: 0 }))
    }

    /// Ends the waiting requests of every job whose next request did not fit while nothing of
    /// it is in flight: no result to come can make room. The bill is read again first (results
    /// ingested during the pass may have left room; then the next pass admits the request).
    pub(crate) async fn settle(
        &self,
        engine: &Engine,
        provider: ProviderKind,
        now: i64,
    ) -> Result<(), EngineError> {
        for (id, job) in &self.jobs {
            let Some((job, next)) = job
                .as_ref()
                .filter(|j| j.admitted == 0)
                .and_then(|j| j.blocked.map(|next| (j, next)))
            else {
                continue;
            };
            if engine.store().job_counts(*id).await?.queued > 0 {
                continue;
            }
            let spent = billed(engine.store(), &engine.config().prices, *id).await?;
            if spent.is_some_and(|spent| spent.saturating_add(next) <= job.budget) {
                continue;
            }
            let error = LineError {
                provider,
                status: None,
                error_type: None,
                code: Some(BUDGET_EXCEEDED.to_owned()),
                message: format!(
                    "the job's budget of {} would be passed: its next request may cost {}, more than is left",
                    job.budget, next,
                ),
                param: None,
                request_id: None,
                retryable: false,
            };
            let error = serde_json::to_string(&error).unwrap_or_else(|_| error.message.clone());
            let ended = engine.store().end_waiting(*id, &error, now).await?;
            if ended > 0 {
                info!(job = %id, requests = ended, budget = %job.budget, "budget reached; the requests left are cancelled");
            }
        }
        Ok(())
    }
}
