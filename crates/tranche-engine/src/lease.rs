//! Leases an engine holds while it works: on one tranche for one step, or on a named duty
//! (planning a provider's pool). Renewed in the background while the work runs, checked before
//! every side effect, handed back when the work ends.
//!
//! The store judges expiry by its own clock and answers how long a lease has left; the holder
//! counts that down on its monotonic clock. For SQLite the store's clock is the clock of the
//! host whose engine runs the statement (engines on one SQLite file share a host); a jump of
//! that clock can shorten a lease by up to one renewal period.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tracing::{debug, warn};
use tranche_core::{EngineId, LeaseToken, TrancheId, TrancheState};
use tranche_store::{Held, LeaseGrant, Store, StoreError};

/// What a lease is on.
#[derive(Debug, Clone)]
pub(crate) enum Subject {
    Tranche(TrancheId),
    Duty(String),
}

/// The lease passed to another engine (or could not be renewed in time): the work stops
/// before its next side effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeaseLost;

#[derive(Debug)]
struct Shared {
    /// When the lease lapses, on this process's monotonic clock.
    deadline: Mutex<Instant>,
    lost: AtomicBool,
}

impl Shared {
    fn set_deadline(&self, grant: LeaseGrant) {
        *self.deadline.lock().unwrap_or_else(PoisonError::into_inner) =
            Instant::now() + grant.remaining;
    }

    fn remaining(&self) -> Duration {
        self.deadline
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .saturating_duration_since(Instant::now())
    }
}

/// A lease held by this engine. Dropping it stops the renewals; [`Lease::release`] also hands
/// it back at once.
#[derive(Debug)]
pub(crate) struct Lease {
    store: Arc<dyn Store>,
    subject: Subject,
    token: LeaseToken,
    duration: Duration,
    /// A side effect starts only with at least this much of the lease left.
    margin: Duration,
    shared: Arc<Shared>,
    /// The tranche state this lease last saw or wrote (tranche leases only): what the next
    /// compare-and-set expects.
    state: Mutex<Option<TrancheState>>,
    heartbeat: JoinHandle<()>,
}

impl Lease {
    /// Starts holding a lease the store just granted, renewing it every third of its length.
    pub(crate) fn hold(
        store: Arc<dyn Store>,
        subject: Subject,
        token: LeaseToken,
        duration: Duration,
        grant: LeaseGrant,
        state: Option<TrancheState>,
    ) -> Self {
        let shared = Arc::new(Shared {
            deadline: Mutex::new(Instant::now() + grant.remaining),
            lost: AtomicBool::new(false),
        });
        let heartbeat = tokio::spawn(heartbeat(
            store.clone(),
            subject.clone(),
            token,
            duration,
            Arc::clone(&shared),
        ));
        Self {
            store,
            subject,
            token,
            duration,
            margin: duration / 4,
            shared,
            state: Mutex::new(state),
            heartbeat,
        }
    }

    pub(crate) fn token(&self) -> LeaseToken {
        self.token
    }

    pub(crate) fn subject(&self) -> &Subject {
        &self.subject
    }

    /// What a compare-and-set of the leased tranche expects.
    pub(crate) fn held(&self) -> Held {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        Held { token: self.token, state: state.unwrap_or(TrancheState::Planned) }
    }

    /// Records that the leased tranche moved to `state` under this lease.
    pub(crate) fn moved_to(&self, state: TrancheState) {
        *self.state.lock().unwrap_or_else(PoisonError::into_inner) = Some(state);
    }

    /// Called before every side effect: fails when the lease is lost, and renews it first when
    /// less than the safety margin is left, so that the effect never runs on a lease about to
    /// pass to another engine.
    pub(crate) async fn ensure(&self) -> Result<(), EnsureError> {
        if self.shared.lost.load(Ordering::Acquire) {
            return Err(EnsureError::Lost(LeaseLost));
        }
        if self.shared.remaining() >= self.margin {
            return Ok(());
        }
        match renew(&*self.store, &self.subject, self.token, self.duration).await? {
            Some(grant) if grant.remaining >= self.margin => {
                self.shared.set_deadline(grant);
                Ok(())
            }
            _ => {
                self.shared.lost.store(true, Ordering::Release);
                Err(EnsureError::Lost(LeaseLost))
            }
        }
    }

    /// Hands the lease back so that another engine may take the work at once.
    pub(crate) async fn release(self) {
        self.heartbeat.abort();
        let released = match &self.subject {
            Subject::Tranche(id) => self.store.release_tranche_lease(*id, self.token).await,
            Subject::Duty(name) => self.store.release_duty(name, self.token).await,
        };
        if let Err(e) = released {
            // It lapses on its own.
            debug!(error = %e, "could not hand a lease back; it will expire");
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.heartbeat.abort();
    }
}

/// Why [`Lease::ensure`] refused.
#[derive(Debug)]
pub(crate) enum EnsureError {
    Lost(LeaseLost),
    Store(StoreError),
}

impl From<StoreError> for EnsureError {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

async fn renew(
    store: &dyn Store,
    subject: &Subject,
    token: LeaseToken,
    duration: Duration,
) -> Result<Option<LeaseGrant>, StoreError> {
    match subject {
        Subject::Tranche(id) => store.renew_tranche_lease(*id, token, duration).await,
        Subject::Duty(name) => store.renew_duty(name, token, duration).await,
    }
}

/// Renews the lease every third of its length until it is lost or the holder drops it.
async fn heartbeat(
    store: Arc<dyn Store>,
    subject: Subject,
    token: LeaseToken,
    duration: Duration,
    shared: Arc<Shared>,
) {
    let every = (duration / 3).max(Duration::from_millis(10));
    loop {
        tokio::time::sleep(every).await;
        match renew(&*store, &subject, token, duration).await {
            Ok(Some(grant)) => shared.set_deadline(grant),
            Ok(None) => {
                warn!(?subject, "lease passed to another engine");
                shared.lost.store(true, Ordering::Release);
                return;
            }
            // A busy database: try again at the next beat; `ensure` refuses once it lapses.
            Err(e) => debug!(?subject, error = %e, "could not renew a lease"),
        }
    }
}

/// This engine's id: host name, process id and a suffix unique to the engine.
pub(crate) fn engine_id() -> EngineId {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    EngineId::new(&host, std::process::id())
}

#[cfg(test)]
mod tests {
    use tranche_store::conformance;
    use tranche_store_sqlite::SqliteStore;

    use super::*;

    /// A store holding one planned tranche.
    async fn store_with_tranche() -> (tempfile::TempDir, Arc<dyn Store>, TrancheId) {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(SqliteStore::open(&dir.path().join("t.db").to_string_lossy()).await.unwrap());
        conformance::add_job(&*store, 1, "m").await;
        let (tranche, _) = conformance::claim_all(&*store, "m").await;
        (dir, store, tranche)
    }

    async fn take(
        store: &Arc<dyn Store>,
        id: TrancheId,
        name: &str,
        duration: Duration,
    ) -> Option<Lease> {
        let token = LeaseToken::new();
        let engine = EngineId::new(name, 1);
        let (record, grant) =
            store.lease_tranche(id, &engine, token, duration, 10).await.unwrap()?;
        Some(Lease::hold(
            store.clone(),
            Subject::Tranche(id),
            token,
            duration,
            grant,
            Some(record.state),
        ))
    }

    #[tokio::test]
    async fn renewals_keep_a_lease_past_its_length_and_release_hands_it_back() {
        let (_dir, store, id) = store_with_tranche().await;
        let short = Duration::from_millis(300);
        let lease = take(&store, id, "a", short).await.unwrap();
        tokio::time::sleep(short * 3).await;
        assert!(take(&store, id, "b", short).await.is_none(), "the heartbeat kept it");
        lease.ensure().await.unwrap();
        lease.release().await;
        assert!(take(&store, id, "b", short).await.is_some(), "handed back at once");
    }

    #[tokio::test]
    async fn a_side_effect_does_not_start_on_a_lease_that_passed_on() {
        let (_dir, store, id) = store_with_tranche().await;
        let short = Duration::from_millis(200);
        let lease = take(&store, id, "a", short).await.unwrap();
        // The holder stalls: its renewals stop, the lease lapses and another engine takes it.
        lease.heartbeat.abort();
        tokio::time::sleep(short * 2).await;
        let other = take(&store, id, "b", Duration::from_secs(30)).await.unwrap();
        assert!(matches!(lease.ensure().await, Err(EnsureError::Lost(LeaseLost))));
        other.ensure().await.unwrap();
    }

    #[tokio::test]
    async fn a_lease_with_less_than_the_margin_left_is_renewed_before_a_side_effect() {
        let (_dir, store, id) = store_with_tranche().await;
        let long = Duration::from_secs(40);
        let lease = take(&store, id, "a", long).await.unwrap();
        lease.heartbeat.abort();
        // As if a long step used most of the lease: less than a quarter is left.
        lease.shared.set_deadline(LeaseGrant { remaining: Duration::from_secs(2) });
        assert!(lease.shared.remaining() < lease.margin);
        lease.ensure().await.unwrap();
        assert!(lease.shared.remaining() > Duration::from_secs(30), "renewed to its full length");
    }
}
