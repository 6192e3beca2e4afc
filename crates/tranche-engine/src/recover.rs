//! Recovery after a restart or a lost answer: an upload or create whose outcome is unknown
//! is looked for at the provider (file by name, batch by metadata or by results) before it is
//! repeated.

use futures::TryStreamExt;
use tracing::{info, warn};
use tranche_core::TrancheState;
use tranche_providers::Provider;
use tranche_store::{TrancheRecord, TrancheUpdate};

use crate::engine::{Engine, StepError};
use crate::lease::Lease;

/// What the provider's batch list says about a tranche whose create was not recorded.
#[derive(Debug)]
enum Adoption {
    Found(Box<tranche_providers::RemoteBatch>),
    NotFound,
    Ambiguous(usize),
}

impl Engine {
    /// An upload was about to happen when the last engine stopped: adopt the file if the
    /// provider has it, upload otherwise.
    pub(crate) async fn adopt_or_upload(
        &self,
        provider: &dyn Provider,
        tranche: &TrancheRecord,
        lease: &Lease,
    ) -> Result<(), StepError> {
        let Some(file) = provider.find_batch_file(tranche.id).await? else {
            return self.upload(provider, tranche, lease).await;
        };
        self.uploaded(tranche, lease, &file).await?;
        info!(tranche = %tranche.id, file = %file.id, "adopted an input file uploaded before a restart");
        Ok(())
    }

    /// A create was about to happen when the last engine stopped (or failed without an
    /// answer): adopt the batch if the provider has it, create it otherwise, and wait when
    /// the provider's batches cannot tell.
    pub(crate) async fn adopt_or_create(
        &self,
        provider: &dyn Provider,
        tranche: &TrancheRecord,
        lease: &Lease,
    ) -> Result<(), StepError> {
        if self.adopt_batch(provider, tranche, lease).await? {
            return Ok(());
        }
        self.create(provider, tranche, lease).await
    }

    /// Adopts the batch a create whose outcome is unknown may have made: returns true when
    /// the tranche's next step is settled (the batch was adopted, or the tranche waits while
    /// the provider's batches cannot tell), false when the provider has no batch of it.
    pub(crate) async fn adopt_batch(
        &self,
        provider: &dyn Provider,
        tranche: &TrancheRecord,
        lease: &Lease,
    ) -> Result<bool, StepError> {
        match self.find_batch(provider, tranche).await? {
            Adoption::Found(batch) => {
                let now = self.now();
                let mut update = TrancheUpdate::to(TrancheState::Submitted, now);
                update.batch_id = Some(batch.id.as_str().to_owned());
                update.batch_status = Some(batch.status.as_str().to_owned());
                self.transition(lease, update).await?;
                info!(tranche = %tranche.id, batch = %batch.id, "adopted a batch created before a restart");
                Ok(true)
            }
            Adoption::NotFound => Ok(false),
            Adoption::Ambiguous(candidates) => {
                let now = self.now();
                let mut update = TrancheUpdate::to(TrancheState::Creating, now);
                update.last_error = Some(serde_json::json!({
                    "provider": tranche.provider, "status": null, "error_type": null,
                    "code": "adoption_ambiguous",
                    "message": format!(
                        "{candidates} running batch(es) at the provider could be this tranche's ({} requests, created after it was planned); waiting for their results to tell, rather than guessing or creating it again",
                        tranche.request_count
                    ),
                    "param": null, "request_id": null, "retryable": true,
                }));
                update.not_before = now + self.poll_delay(tranche.provider);
                self.transition(lease, update).await?;
                warn!(tranche = %tranche.id, candidates, "cannot tell which batch is this tranche's; waiting");
                Ok(true)
            }
        }
    }

    /// Looks for the tranche's batch among the provider's batches created since it was planned:
    /// by `tranche_id` metadata where batches carry it, else by request count among batches no
    /// other tranche has recorded.
    async fn find_batch(
        &self,
        provider: &dyn Provider,
        tranche: &TrancheRecord,
    ) -> Result<Adoption, StepError> {
        const CLOCK_SLACK: i64 = 300;
        let since = tranche.created_at - CLOCK_SLACK;
        let mut after = None;
        let mut candidates = Vec::new();
        loop {
            let page = provider.list_batches(after.as_ref(), 100).await?;
            let mut older = false;
            for batch in page.data {
                if batch.created_at < since {
                    older = true;
                    continue;
                }
                if provider.has_batch_metadata() {
                    if batch.tranche_id() == Some(tranche.id) {
                        return Ok(Adoption::Found(Box::new(batch)));
                    }
                } else if batch.request_counts.total == tranche.request_count
                    && self
                        .store
                        .tranche_of_batch(tranche.provider, batch.id.as_str())
                        .await?
                        .is_none()
                {
                    candidates.push(batch);
                }
            }
            // Lists are newest first: once a page reaches batches older than the tranche, stop.
            if older || !page.has_more || page.last_id.is_none() {
                break;
            }
            after = page.last_id;
        }
        if candidates.is_empty() {
            return Ok(Adoption::NotFound);
        }
        // Count and time make a batch a candidate, never a certainty: another tranche's lost
        // create looks the same. Only the results' custom ids settle it.
        self.confirm_by_results(provider, tranche, candidates).await
    }

    /// Among candidate batches without metadata, finds the one whose results name this
    /// tranche's requests. Only batches that have ended have results: while any candidate
    /// runs, the tranche waits; once all have ended and none is its own, it is created. A
    /// candidate gone before its results were read (another tranche took it, ended and
    /// deleted it) is no reason to fail this one.
    async fn confirm_by_results(
        &self,
        provider: &dyn Provider,
        tranche: &TrancheRecord,
        candidates: Vec<tranche_providers::RemoteBatch>,
    ) -> Result<Adoption, StepError> {
        let mut running = 0;
        for batch in candidates {
            let Some(url) = batch.results_url.as_deref().filter(|_| batch.status.is_terminal())
            else {
                running += 1;
                continue;
            };
            // The first result line is enough: read until it is whole, then stop.
            let mut results = match provider.download_results(url).await {
                Ok(download) => download.stream,
                // Gone since it was listed. A tranche that recorded it since has ended with
                // it (and deleted it): not this one's. Otherwise it cannot tell yet; the next
                // look no longer lists it. Either way the tranche looking does not fail.
                Err(e) if e.status == Some(404) => {
                    if self
                        .store
                        .tranche_of_batch(tranche.provider, batch.id.as_str())
                        .await?
                        .is_none()
                    {
                        running += 1;
                    }
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let mut head = Vec::new();
            while !head.contains(&b'\n') {
                match results.try_next().await? {
                    Some(chunk) => head.extend_from_slice(&chunk),
                    None => break,
                }
            }
            let first = String::from_utf8_lossy(&head)
                .lines()
                .find(|l| !l.trim().is_empty())
                .and_then(|line| provider.parse_result_line(line).ok())
                .map(|line| line.wire_id);
            if let Some(wire_id) = first
                && self.store.tranche_has_wire_id(tranche.id, &wire_id).await?
            {
                return Ok(Adoption::Found(Box::new(batch)));
            }
        }
        Ok(if running == 0 { Adoption::NotFound } else { Adoption::Ambiguous(running) })
    }
}
