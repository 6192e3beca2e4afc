//! Time as the engine reads it: unix seconds from a clock that tests can set and step.
//!
//! The engine never calls the system clock itself; it asks a `Clock`, so that policy (backoff,
//! pooling by age) can be tested at any moment. Leases are judged by the store's own clock.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

/// A source of the current time in unix seconds.
pub trait Clock: Send + Sync + fmt::Debug {
    fn now(&self) -> i64;
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
    }
}

/// A clock that stands still until told to move; clones share one time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    pub fn at(now: i64) -> Self {
        Self(Arc::new(AtomicI64::new(now)))
    }

    pub fn set(&self, now: i64) {
        self.0.store(now, Ordering::SeqCst);
    }

    pub fn advance(&self, seconds: i64) {
        self.0.fetch_add(seconds, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told_and_clones_share_it() {
        let clock = ManualClock::at(1_000);
        let other = clock.clone();
        assert_eq!(clock.now(), 1_000);
        clock.advance(30);
        assert_eq!(other.now(), 1_030);
        other.set(5);
        assert_eq!(clock.now(), 5);
    }

    #[test]
    fn the_system_clock_is_after_2024() {
        assert!(SystemClock.now() > 1_704_067_200);
    }
}
