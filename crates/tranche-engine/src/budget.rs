//! Budgets: a request of a job with a budget joins a tranche only while its worst case, added
//! to what the job has been billed and what its requests in flight may still cost, stays within
//! the budget; once nothing of the job is in flight and its next request would pass it, the
//! requests left end cancelled (`budget_exceeded`). So a job never costs more than its budget.

use std::collections::HashMap;

use tracing::info;
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
    /// A request of the job did not fit: the job's later requests wait too (they go in order).
    blocked: bool,
    /// Requests admitted in this pass.
    admitted: u64,
}

/// The budgets of the jobs one planning pass meets, each read once.
#[derive(Debug, Default)]
pub(crate) struct Budgets {
    jobs: HashMap<JobId, Option<JobBudget>>,
}

/// What a job's billed usage cost, rounded up to the nanodollar (an unpriced model cannot be
/// billed here: a budget is refused at submit for a model without a price).
pub(crate) async fn billed(
    store: &dyn Store,
    prices: &PriceTable,
    job: JobId,
) -> Result<Usd, EngineError> {
    let mut total = Costs::default();
    for row in store.job_usage(job).await? {
        if row.kind != UsageKind::Billed {
            continue;
        }
        if let Some(price) = prices.lookup(row.provider, &row.model) {
            total += costs(&row.tokens, &price, &prices.rules(row.provider));
        }
    }
    Ok(Usd::ceil(total.cost))
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
        if job.blocked || job.committed.saturating_add(cost) > job.budget {
            job.blocked = true;
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
        let spent = billed(store, &engine.config().prices, id).await?;
        let in_flight = store.job_queued_cost(id).await?;
        Ok(Some(JobBudget {
            budget,
            committed: spent.saturating_add(in_flight),
            blocked: false,
            admitted: 0,
        }))
    }

    /// Ends the waiting requests of every job whose next request did not fit while nothing of
    /// it is in flight: no result to come can make room.
    pub(crate) async fn settle(
        &self,
        engine: &Engine,
        provider: ProviderKind,
        now: i64,
    ) -> Result<(), EngineError> {
        for (id, job) in &self.jobs {
            let Some(job) = job.as_ref().filter(|j| j.blocked && j.admitted == 0) else { continue };
            if engine.store().job_queued_cost(*id).await? > Usd::ZERO {
                continue;
            }
            let error = LineError {
                provider,
                status: None,
                error_type: None,
                code: Some(BUDGET_EXCEEDED.to_owned()),
                message: format!(
                    "the job's budget of {} would be passed: its next request may cost more than the {} left",
                    job.budget,
                    Usd::from_nanos(job.budget.nanos().saturating_sub(job.committed.nanos())),
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
