//! Planning: cutting a provider's waiting requests into tranches, as the one engine holding
//! that pool's planning lease, within the batch limits and the enqueued-token budget.

use std::collections::{BTreeMap, HashSet};

use tracing::{debug, info, warn};
use tranche_core::plan::{GroupKey, PlanItem, PlannedTranche, Planner};
use tranche_core::{Endpoint, JobState, LeaseToken, ProviderKind, TrancheId};
use tranche_store::NewTranche;

use crate::budget::Budgets;
use crate::engine::Engine;
use crate::error::EngineError;
use crate::lease::{Lease, Subject};
use crate::policy;

/// A hash of a wire id, to tell duplicates apart while planning without keeping the ids.
fn wire_hash(wire_id: &str) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    BuildHasherDefault::<DefaultHasher>::default().hash_one(wire_id)
}

impl Engine {
    /// Plans a provider's waiting requests, as the one engine holding its planning lease
    /// (another engine planning the same pool at once would only cut smaller tranches, but
    /// claims stay serialised all the same).
    pub(crate) async fn plan(&self, kind: ProviderKind) -> Result<(), EngineError> {
        let duty = format!("plan:{kind}");
        let token = LeaseToken::new();
        let Some(grant) =
            self.store.acquire_duty(&duty, &self.id, token, self.config.lease).await?
        else {
            debug!(provider = %kind, "another engine is planning");
            return Ok(());
        };
        let lease = Lease::hold(
            self.store.clone(),
            Subject::Duty(duty.clone()),
            token,
            self.config.lease,
            grant,
            None,
        );
        let result = self.plan_pool(kind, (&duty, token)).await;
        lease.release().await;
        result
    }

    /// Cuts every waiting request of one provider into tranches. Each group (endpoint +
    /// model) is read in pages and each tranche is claimed as soon as it is full, so memory
    /// holds one page and one tranche, however many requests wait.
    async fn plan_pool(
        &self,
        kind: ProviderKind,
        duty: (&str, LeaseToken),
    ) -> Result<(), EngineError> {
        let now = self.now();
        // A request of a cancelled job that a retry returned to the pool (its ingest began
        // before the cancel) is cancelled now, never sent.
        for job in self.store.open_jobs().await?.iter().filter(|job| job.cancel_requested) {
            let cancelled = self.store.cancel_job(job.id, now).await?;
            if cancelled > 0 {
                info!(job = %job.id, requests = cancelled, "cancelled requests returned to a cancelled job's pool");
            }
        }
        let answered = self.answer_from_earlier(kind, now).await?;
        if answered > 0 {
            info!(provider = %kind, requests = answered, "answered from earlier results at no cost");
        }
        let groups = self.store.pending_groups(kind, now).await?;
        if groups.is_empty() {
            return Ok(());
        }
        let mut enqueued: BTreeMap<String, u64> =
            self.store.enqueued_tokens(kind).await?.into_iter().collect();
        let mut budgets = Budgets::default();
        for group in groups {
            // Pooling thresholds: a group goes out once it is large enough or old enough.
            if !policy::pool_is_due(
                group.count,
                group.oldest_accepted_at,
                now,
                self.config.min_batch_size,
                self.config.max_wait,
            ) {
                continue;
            }
            let check = group.answer_check.as_deref();
            self.plan_group(
                kind,
                (group.endpoint, group.model.clone(), check),
                now,
                (&mut enqueued, &mut budgets),
                duty,
            )
            .await?;
        }
        budgets.settle(self, kind, now).await
    }

    /// Answers waiting requests whose custom id and input hash already have a succeeded
    /// result (from any job) with that result, at no cost: a changed body is a new version and
    /// runs. Returns how many were answered.
    async fn answer_from_earlier(&self, kind: ProviderKind, now: i64) -> Result<u64, EngineError> {
        const PAGE: u32 = 1_024;
        let (mut answered, mut after) = (0, 0);
        loop {
            let answers = self.store.earlier_answers(kind, after, PAGE).await?;
            let Some(last) = answers.last() else { break };
            after = last.request_id;
            answered += self.store.answer_from(&answers, now).await?;
        }
        Ok(answered)
    }

    /// Cuts one group's waiting requests (endpoint, model, answer check) into tranches, until
    /// they run out or a tranche has to wait for enqueued-token room; a request whose job's
    /// budget cannot hold it waits.
    async fn plan_group(
        &self,
        kind: ProviderKind,
        (endpoint, model, check): (Endpoint, String, Option<&str>),
        now: i64,
        (enqueued, budgets): (&mut BTreeMap<String, u64>, &mut Budgets),
        duty: (&str, LeaseToken),
    ) -> Result<(), EngineError> {
        const PAGE: u32 = 4_096;
        let key = GroupKey { provider: kind, endpoint, model };
        let mut planner = Planner::new(self.config.limits(kind));
        // Two requests with one wire id (the same custom id in two jobs) must never share a
        // batch: the later one waits for the next round, and so another tranche. Hashes of
        // the open tranche's wire ids are enough to tell (a collision only delays a request).
        let mut wire_ids = HashSet::new();
        let mut after = 0;
        loop {
            let page = self
                .store
                .pending_page(kind, (endpoint, &key.model, check), now, after, PAGE)
                .await?;
            let Some(last) = page.last() else { break };
            after = last.request_id;
            for item in page {
                let hash = wire_hash(&item.wire_id);
                if wire_ids.contains(&hash) || !budgets.admits(self, &item).await? {
                    continue;
                }
                wire_ids.insert(hash);
                let item = PlanItem {
                    group: key.clone(),
                    bytes: item.wire_bytes,
                    item: (item.request_id, item.est_tokens),
                };
                // Submission refuses requests larger than a batch, so this cannot fail; if a
                // stored request somehow is, it waits rather than being dropped.
                match planner.push(item) {
                    Ok(Some(full)) => {
                        // The item just pushed opened the next tranche, alone so far.
                        wire_ids.clear();
                        wire_ids.insert(hash);
                        if !self.claim(full, check, enqueued, duty).await? {
                            return Ok(());
                        }
                    }
                    Ok(None) => {}
                    Err(e) => warn!(error = %e, "a stored request exceeds the batch size limit"),
                }
            }
        }
        for planned in planner.finish() {
            if !self.claim(planned, check, enqueued, duty).await? {
                break;
            }
        }
        Ok(())
    }

    /// Records a planned tranche and claims its requests, unless it would overflow the model's
    /// enqueued-token budget. Returns false when planning stops: the tranche has to wait for
    /// room, or the planning lease passed to another engine.
    async fn claim(
        &self,
        planned: PlannedTranche<(i64, u64)>,
        check: Option<&str>,
        enqueued: &mut BTreeMap<String, u64>,
        duty: (&str, LeaseToken),
    ) -> Result<bool, EngineError> {
        let est_tokens: u64 = planned.items.iter().map(|(_, tokens)| tokens).sum();
        let model = planned.group.model;
        let queued = enqueued.get(&model).copied().unwrap_or(0);
        let budget = self.config.token_budget(&model);
        if !policy::admits(queued, est_tokens, budget) {
            debug!(model = %model, queued, est_tokens, ?budget, "tranche waits for enqueued-token room");
            return Ok(false);
        }
        *enqueued.entry(model.clone()).or_insert(0) += est_tokens;
        let ids: Vec<i64> = planned.items.iter().map(|(id, _)| *id).collect();
        let account = self.provider(planned.group.provider)?.account();
        let tranche = NewTranche {
            id: TrancheId::new(),
            account,
            est_tokens,
            provider: planned.group.provider,
            endpoint: planned.group.endpoint,
            model,
            answer_check: check.map(str::to_owned),
            bytes: planned.bytes,
            created_at: self.now(),
        };
        match self.store.create_tranche(&tranche, &ids, duty).await? {
            None => {
                info!(provider = %tranche.provider, "the planning lease passed to another engine; planning stops");
                Ok(false)
            }
            Some(0) => {
                debug!(model = %tranche.model, "the planned requests were claimed already");
                Ok(true)
            }
            Some(claimed) => {
                info!(tranche = %tranche.id, model = %tranche.model, requests = claimed, est_tokens, "planned tranche");
                let now = self.now();
                self.store
                    .move_jobs_of_tranche(tranche.id, JobState::Pending, JobState::Running, now)
                    .await?;
                Ok(true)
            }
        }
    }
}
