//! Planning: cutting a provider's waiting requests into tranches, as the one engine holding
//! that pool's planning lease, within the batch limits, the enqueued-token budget and the
//! tenants' shares, the tenants taking turns.

use std::collections::{BTreeMap, HashSet, VecDeque};

use tracing::{debug, info, warn};
use tranche_core::plan::{GroupKey, PlanItem, PlannedTranche, Planner, TrancheLimits};
use tranche_core::{JobState, LeaseToken, ProviderKind, TrancheId};
use tranche_providers::InputTransport;
use tranche_store::{NewTranche, PendingGroup};

use crate::budget::Budgets;
use crate::engine::Engine;
use crate::error::EngineError;
use crate::lease::{Lease, Subject};
use crate::policy;
use crate::shares::{Caps, Shares};

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

    /// Cuts every waiting request of one provider into tranches. Each group (endpoint, model,
    /// check and tenant) is read in pages, its tenants taking turns a tranche each, so memory
    /// holds, per tenant of a family, a page and the tranches it filled, however many
    /// requests wait.
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
        let mut pass = Pass {
            enqueued: self.store.enqueued_tokens(kind).await?.into_iter().collect(),
            shares: Shares::new(self.store.tenant_loads(kind).await?),
            budgets: Budgets::default(),
        };
        // Pooling thresholds: a group goes out once it is large enough or old enough. Groups
        // that may share a batch but for their tenant (the same endpoint, model and check)
        // are one family; its tenants take turns.
        let mut families: Vec<Vec<PendingGroup>> = Vec::new();
        for group in groups {
            let due = policy::pool_is_due(
                group.count,
                group.oldest_accepted_at,
                now,
                self.config.min_batch_size,
                self.config.max_wait,
            );
            if !due {
                continue;
            }
            match families.last_mut() {
                Some(family) if same_family(&family[0], &group) => family.push(group),
                _ => families.push(vec![group]),
            }
        }
        for family in families {
            if self.plan_family(kind, family, now, &mut pass, duty).await? == Stop::LeaseLost {
                info!(provider = %kind, "the planning lease passed to another engine; planning stops");
                return Ok(());
            }
        }
        pass.budgets.settle(self, kind, now).await
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

    /// Cuts a family's waiting requests (one endpoint, model and answer check; one group per
    /// tenant) into tranches, the tenants taking turns a tranche each, the one holding least
    /// of the model's enqueued tokens first. A tenant at its cap waits while the others go
    /// on; once the model's budget is full, the family waits.
    async fn plan_family(
        &self,
        kind: ProviderKind,
        family: Vec<PendingGroup>,
        now: i64,
        pass: &mut Pass,
        duty: (&str, LeaseToken),
    ) -> Result<Stop, EngineError> {
        let limits = self.config.limits(kind);
        let mut turns: Vec<Cursor> =
            family.into_iter().map(|group| Cursor::new(kind, group, limits)).collect();
        turns.sort_by_cached_key(|c| {
            (pass.shares.tokens(c.tenant(), &c.key.model), c.tenant().map(str::to_owned))
        });
        let mut turns = VecDeque::from(turns);
        let provider = self.provider(kind)?;
        let (account, max_files) = (provider.account(), self.file_cap(provider.as_ref()));
        while let Some(mut cursor) = turns.pop_front() {
            if pass.shares.files_full(cursor.tenant(), &account, max_files) {
                debug!(
                    tenant = cursor.tenant().unwrap_or("-"),
                    "a tenant's batches wait for its files to free up"
                );
                continue;
            }
            let Some(planned) = self.next_tranche(&mut cursor, now, &mut pass.budgets).await?
            else {
                continue;
            };
            match self.claim(planned, &cursor.group, pass, duty).await? {
                None => turns.push_back(cursor),
                Some(Stop::TenantFull) => {
                    debug!(tenant = cursor.tenant().unwrap_or("-"), model = %cursor.key.model, "a tenant's tranches wait for its share to free up");
                }
                Some(stop) => return Ok(stop),
            }
        }
        Ok(Stop::Drained)
    }

    /// The next tranche of a group's waiting requests, read in keyset pages (memory holds a
    /// page and the tranches it filled, however many requests wait); `None` once they run
    /// out. A request whose job's budget cannot hold it waits.
    async fn next_tranche(
        &self,
        cursor: &mut Cursor,
        now: i64,
        budgets: &mut Budgets,
    ) -> Result<Option<PlannedTranche<(i64, u64)>>, EngineError> {
        const PAGE: u32 = 4_096;
        loop {
            if let Some(planned) = cursor.ready.pop_front() {
                return Ok(Some(planned));
            }
            let Some(planner) = cursor.planner.as_mut() else { return Ok(None) };
            let page = self
                .store
                .pending_page(cursor.key.provider, cursor.group.pool(), now, cursor.after, PAGE)
                .await?;
            let Some(last) = page.last() else {
                cursor.ready.extend(cursor.planner.take().map(Planner::finish).unwrap_or_default());
                continue;
            };
            cursor.after = last.request_id;
            for item in page {
                let hash = wire_hash(&item.wire_id);
                if cursor.wire_ids.contains(&hash) || !budgets.admits(self, &item).await? {
                    continue;
                }
                cursor.wire_ids.insert(hash);
                let item = PlanItem {
                    group: cursor.key.clone(),
                    bytes: item.wire_bytes,
                    item: (item.request_id, item.est_tokens),
                };
                // Submission refuses requests larger than a batch, so this cannot fail; if a
                // stored request somehow is, it waits rather than being dropped.
                match planner.push(item) {
                    Ok(Some(full)) => {
                        // The item just pushed opened the next tranche, alone so far.
                        cursor.wire_ids.clear();
                        cursor.wire_ids.insert(hash);
                        cursor.ready.push_back(full);
                    }
                    Ok(None) => {}
                    Err(e) => warn!(error = %e, "a stored request exceeds the batch size limit"),
                }
            }
        }
    }

    /// Records a planned tranche of one tenant's group and claims its requests, unless it
    /// would overflow the model's enqueued-token budget or the tenant's caps. Returns why
    /// planning stops, if it does.
    async fn claim(
        &self,
        planned: PlannedTranche<(i64, u64)>,
        group: &PendingGroup,
        pass: &mut Pass,
        duty: (&str, LeaseToken),
    ) -> Result<Option<Stop>, EngineError> {
        let est_tokens: u64 = planned.items.iter().map(|(_, tokens)| tokens).sum();
        let model = planned.group.model;
        let provider = self.provider(planned.group.provider)?;
        let account = provider.account();
        let tenant = group.tenant.as_deref();
        let caps = Caps {
            tokens: self.config.tenant_token_cap(&model),
            files: self.file_cap(provider.as_ref()),
        };
        if !pass.shares.admits(tenant, (&model, &account), est_tokens, caps) {
            return Ok(Some(Stop::TenantFull));
        }
        let queued = pass.enqueued.get(&model).copied().unwrap_or(0);
        let budget = self.config.token_budget(&model);
        if !policy::admits(queued, est_tokens, budget) {
            debug!(model = %model, queued, est_tokens, ?budget, "tranche waits for enqueued-token room");
            return Ok(Some(Stop::ModelFull));
        }
        let ids: Vec<i64> = planned.items.iter().map(|(id, _)| *id).collect();
        let tranche = NewTranche {
            id: TrancheId::new(),
            account,
            est_tokens,
            provider: planned.group.provider,
            endpoint: planned.group.endpoint,
            model,
            answer_check: group.answer_check.clone(),
            tenant: group.tenant.clone(),
            bytes: planned.bytes,
            created_at: self.now(),
        };
        match self.store.create_tranche(&tranche, &ids, duty).await? {
            None => Ok(Some(Stop::LeaseLost)),
            Some(0) => {
                debug!(model = %tranche.model, "the planned requests were claimed already");
                Ok(None)
            }
            Some(claimed) => {
                *pass.enqueued.entry(tranche.model.clone()).or_insert(0) += est_tokens;
                pass.shares.add(tenant, (&tranche.model, &tranche.account), est_tokens);
                info!(tranche = %tranche.id, model = %tranche.model, tenant = tenant.unwrap_or("-"), requests = claimed, est_tokens, "planned tranche");
                let now = self.now();
                self.store
                    .move_jobs_of_tranche(tranche.id, JobState::Pending, JobState::Running, now)
                    .await?;
                Ok(None)
            }
        }
    }
}

impl Engine {
    /// The most unfinished tranches one tenant may have on an account of `provider`: the
    /// configured cap, for a provider that takes input as uploaded files.
    fn file_cap(&self, provider: &dyn tranche_providers::Provider) -> Option<u64> {
        self.config.tenant_max_files.filter(|_| provider.transport() == InputTransport::UploadFile)
    }
}

/// What one planning pass of a provider keeps track of as it claims.
struct Pass {
    /// Enqueued tokens per model.
    enqueued: BTreeMap<String, u64>,
    shares: Shares,
    budgets: Budgets,
}

/// Why a family's planning stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// Its waiting requests ran out (or wait for their jobs' budgets).
    Drained,
    /// The tenant's next tranche would pass its share: that tenant waits.
    TenantFull,
    /// The model's enqueued-token budget is full: the family waits for room.
    ModelFull,
    /// The planning lease passed to another engine: this pass claims nothing more.
    LeaseLost,
}

/// Whether two groups may share a batch but for their tenant.
fn same_family(a: &PendingGroup, b: &PendingGroup) -> bool {
    (a.endpoint, &a.model, &a.answer_check) == (b.endpoint, &b.model, &b.answer_check)
}

/// One tenant's group being cut into tranches a tranche at a time.
struct Cursor {
    group: PendingGroup,
    key: GroupKey,
    /// `None` once the group's pages ran out (its last tranche is then in `ready`).
    planner: Option<Planner<(i64, u64)>>,
    /// Tranches cut from the last page, not claimed yet.
    ready: VecDeque<PlannedTranche<(i64, u64)>>,
    /// The last request id read.
    after: i64,
    /// Two requests with one wire id (the same custom id in two jobs) must never share a
    /// batch: the later one waits for the next round, and so another tranche. Hashes of the
    /// open tranche's wire ids are enough to tell (a collision only delays a request).
    wire_ids: HashSet<u64>,
}

impl Cursor {
    fn new(provider: ProviderKind, group: PendingGroup, limits: TrancheLimits) -> Self {
        let key = GroupKey { provider, endpoint: group.endpoint, model: group.model.clone() };
        Self {
            group,
            key,
            planner: Some(Planner::new(limits)),
            ready: VecDeque::new(),
            after: 0,
            wire_ids: HashSet::new(),
        }
    }

    fn tenant(&self) -> Option<&str> {
        self.group.tenant.as_deref()
    }
}
