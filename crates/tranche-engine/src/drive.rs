//! The engine's loop: steps of several tranches at once, each started as soon as its tranche
//! is due, so that no tranche waits for the others (a batch is created as soon as its file is
//! uploaded, and collected as soon as it ends, while other tranches' files are still written).

use std::collections::HashSet;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::warn;
use tranche_core::{TrancheId, TrancheState};
use tranche_providers::InputTransport;

use crate::config::Until;
use crate::engine::Engine;
use crate::error::EngineError;

/// How far along its life a tranche is. Steps of tranches further along go first, so that a
/// batch is created as soon as its file is uploaded and collected as soon as it ends, rather
/// than after every other tranche's file is written (a file can expire waiting, and so can a
/// batch's results).
fn progress(state: TrancheState) -> u8 {
    match state {
        TrancheState::Planned | TrancheState::Uploading => 0,
        TrancheState::Uploaded | TrancheState::Creating => 1,
        TrancheState::Submitted => 2,
        TrancheState::Collecting => 3,
        TrancheState::Ingesting => 4,
        TrancheState::Cleaning | TrancheState::Done | TrancheState::Failed => 5,
    }
}

/// Whether a tranche's next step from `state` moves a file's bytes: writes its input file (or
/// sends its requests inline with the batch), copies its result files, or ingests them.
/// `transport` is its provider's (`None`: no adapter here; the step will fail at once).
fn moves_bytes(state: TrancheState, transport: Option<InputTransport>) -> bool {
    match state {
        TrancheState::Planned
        | TrancheState::Uploading
        | TrancheState::Collecting
        | TrancheState::Ingesting => true,
        // Adopting or making a batch sends its requests again where they travel inline.
        TrancheState::Creating => transport == Some(InputTransport::Inline),
        TrancheState::Uploaded
        | TrancheState::Submitted
        | TrancheState::Cleaning
        | TrancheState::Done
        | TrancheState::Failed => false,
    }
}

/// How often a driving engine looks whether a chore is due.
const CHORES_LOOK: Duration = Duration::from_secs(60);

/// The steps an engine runs at once, by tranche, and its chores (cleanups of provider files)
/// running beside them.
struct Running {
    tasks: JoinSet<(TrancheId, Result<(), EngineError>)>,
    tranches: HashSet<TrancheId>,
    /// Those of `tranches` whose step moves a file's bytes.
    transfers: HashSet<TrancheId>,
    chores: JoinSet<()>,
    /// When to look again whether a cleanup of provider files is due.
    chores_due: tokio::time::Instant,
}

impl Running {
    fn new() -> Self {
        Self {
            tasks: JoinSet::new(),
            tranches: HashSet::new(),
            transfers: HashSet::new(),
            chores: JoinSet::new(),
            chores_due: tokio::time::Instant::now(),
        }
    }

    fn len(&self) -> usize {
        self.tranches.len()
    }

    /// Records a step that ended: its engine failure, unless it only lost a race for the
    /// database (another engine held it past the busy timeout: the tranche is due again).
    fn ended(
        &mut self,
        joined: Result<(TrancheId, Result<(), EngineError>), tokio::task::JoinError>,
    ) -> Result<(), EngineError> {
        let (tranche, result) = joined.map_err(EngineError::StepPanicked)?;
        self.tranches.remove(&tranche);
        self.transfers.remove(&tranche);
        match result {
            Err(e) if e.is_contention() => {
                warn!(tranche = %tranche, error = %e, "the store is busy; the step will be tried again");
                Ok(())
            }
            other => other,
        }
    }

    /// Waits for every running step to end, answering the first failure. Chores are waited
    /// for too, unless the engine was told to stop: they are stopped (each delete they made
    /// is one the next cleanup need not make).
    async fn drain(&mut self, stopped: bool) -> Result<(), EngineError> {
        if stopped {
            self.chores.abort_all();
        }
        while self.chores.join_next().await.is_some() {}
        let mut first = Ok(());
        while let Some(joined) = self.tasks.join_next().await {
            if let Err(e) = self.ended(joined)
                && first.is_ok()
            {
                first = Err(e);
            }
        }
        first
    }
}

impl Engine {
    /// Works until `until` holds or `cancel` fires, calling `on_tick` after every round. Up
    /// to `parallel_steps` tranches are stepped at once; a step that ends starts the next
    /// round at once. Returning, it waits for the steps under way to end (each is short and
    /// leaves the store consistent; cancelling one mid-way would hold its lease until it
    /// lapses).
    pub async fn drive(
        &self,
        until: Until,
        cancel: &CancellationToken,
        mut on_tick: impl FnMut(),
    ) -> Result<(), EngineError> {
        let mut running = Running::new();
        let outcome = loop {
            let wait = match self.round(until, &mut running, &mut on_tick).await {
                Ok(None) => break Ok(()),
                Ok(Some(wait)) => wait,
                // Another engine holds the database past the busy timeout: losing a race is
                // not an error; try again shortly.
                Err(e) if e.is_contention() => {
                    warn!(error = %e, "the store is busy; trying again");
                    self.config
                        .poll_interval
                        .clamp(Duration::from_millis(50), Duration::from_secs(1))
                }
                Err(e) => break Err(e),
            };
            tokio::select! {
                () = cancel.cancelled() => break Ok(()),
                Some(joined) = running.tasks.join_next(), if running.len() > 0 => {
                    if let Err(e) = running.ended(joined) {
                        break Err(e);
                    }
                }
                () = tokio::time::sleep(wait.max(Duration::from_millis(5))) => {}
            }
        };
        let drained = running.drain(cancel.is_cancelled()).await;
        outcome.and(drained)
    }

    /// One round of [`Engine::drive`]: plan, start steps of due tranches not already under
    /// way (while there is room), settle jobs; then how long to wait before the next round, or
    /// `None` when `until` holds.
    async fn round(
        &self,
        until: Until,
        running: &mut Running,
        on_tick: &mut impl FnMut(),
    ) -> Result<Option<Duration>, EngineError> {
        self.plan_all().await?;
        let mut started = 0;
        let room = self.config.parallel_steps.max(1);
        let transfer_room = self.config.transfer_steps.max(1);
        let mut due = self.store.due_tranches(self.now()).await?;
        due.sort_by_key(|t| std::cmp::Reverse(progress(t.state)));
        for due in due {
            if running.len() >= room {
                break;
            }
            if running.tranches.contains(&due.id) {
                continue;
            }
            let transport = self.providers.get(due.provider).map(|p| p.transport());
            let transfer = moves_bytes(due.state, transport);
            // A transfer waits for room among the transfers; the steps behind it need not.
            if transfer && running.transfers.len() >= transfer_room {
                continue;
            }
            let Some((tranche, lease)) = self.take(&due).await? else { continue };
            let engine = self.clone();
            running.tranches.insert(tranche.id);
            if transfer {
                running.transfers.insert(tranche.id);
            }
            running.tasks.spawn(async move {
                let id = tranche.id;
                (id, engine.step_and_release(tranche, lease).await)
            });
            started += 1;
        }
        self.settle_jobs().await?;
        if let Some(interval) = self.config.janitor_interval
            && tokio::time::Instant::now() >= running.chores_due
        {
            // Looked at once a minute at most: the duty's lease spaces the cleanups out.
            running.chores_due = tokio::time::Instant::now() + interval.min(CHORES_LOOK);
            while running.chores.try_join_next().is_some() {}
            self.janitor_if_due(interval, &mut running.chores).await?;
        }
        on_tick();
        if self.until_holds(until).await? {
            return Ok(None);
        }
        let wait = match self.store.next_due().await? {
            Some(due) => Duration::from_secs(u64::try_from(due - self.now()).unwrap_or(0)),
            None => self.config.poll_interval,
        };
        let wait = wait.min(self.config.poll_interval);
        // Due work this engine cannot take (another account's or provider's tranche, or one
        // whose step is under way) is no reason to spin: a round that started nothing waits a
        // while, or until a step ends.
        let idle = self.config.poll_interval.min(Duration::from_secs(1));
        Ok(Some(if started == 0 && wait < idle { idle } else { wait }))
    }

    async fn until_holds(&self, until: Until) -> Result<bool, EngineError> {
        Ok(match until {
            // A paused job waits for room at the provider: a driver waiting for it stops.
            Until::JobEnds(job) => self
                .store
                .job(job)
                .await?
                .is_none_or(|j| j.state.is_terminal() || j.paused.is_some()),
            // A paused job still has work: a worker keeps trying it.
            Until::Idle => self.store.open_jobs().await?.is_empty(),
            Until::Cancelled => false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_that_move_a_files_bytes_are_told_from_the_others() {
        use InputTransport::{Inline, UploadFile};
        let moving = |state, transport| moves_bytes(state, Some(transport));
        for state in [TrancheState::Planned, TrancheState::Collecting, TrancheState::Ingesting] {
            assert!(moving(state, UploadFile) && moving(state, Inline), "{state:?}");
        }
        assert!(moving(TrancheState::Uploading, UploadFile));
        // Creating a batch from an uploaded file sends its id; an inline batch, its requests.
        assert!(!moving(TrancheState::Creating, UploadFile));
        assert!(moving(TrancheState::Creating, Inline));
        for state in [
            TrancheState::Uploaded,
            TrancheState::Submitted,
            TrancheState::Cleaning,
            TrancheState::Done,
            TrancheState::Failed,
        ] {
            assert!(!moving(state, UploadFile) && !moving(state, Inline), "{state:?}");
        }
    }
}
