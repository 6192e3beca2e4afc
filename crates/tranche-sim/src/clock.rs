//! The virtual clock: unix time at spawn, plus wall time elapsed × speed, plus every explicit advance.
//!
//! Nothing in the simulator sleeps. Batch progress is a pure function of this clock, evaluated
//! whenever state is read, so tests move time forward with [`Clock::advance`] instead of waiting.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A step-able clock in fractional virtual unix seconds.
#[derive(Debug, Clone)]
pub(crate) struct Clock {
    /// Virtual time at `wall_base`.
    base: f64,
    /// The wall instant `base` refers to.
    wall_base: Instant,
    /// Virtual seconds per wall second.
    speed: f64,
}

impl Clock {
    /// Starts at the current unix time, on a whole second (so a frozen clock reads round numbers).
    pub(crate) fn new(speed: f64) -> Self {
        let unix =
            SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
        Self::starting_at(unix.floor(), speed)
    }

    /// Starts at a given virtual time (used by tests).
    pub(crate) fn starting_at(unix: f64, speed: f64) -> Self {
        Self { base: unix, wall_base: Instant::now(), speed: sanitize_speed(speed) }
    }

    /// Current virtual time in fractional seconds.
    pub(crate) fn now_f64(&self) -> f64 {
        self.base + self.wall_base.elapsed().as_secs_f64() * self.speed
    }

    /// Current virtual time in whole unix seconds (what the wire shows).
    pub(crate) fn now(&self) -> i64 {
        secs(self.now_f64())
    }

    pub(crate) fn speed(&self) -> f64 {
        self.speed
    }

    /// Moves virtual time forward; negative or non-finite amounts are ignored (time never runs back).
    pub(crate) fn advance(&mut self, seconds: f64) {
        if seconds.is_finite() && seconds > 0.0 {
            self.base += seconds;
        }
    }

    /// Changes the speed from now on without moving the current virtual time.
    pub(crate) fn set_speed(&mut self, speed: f64) {
        self.base = self.now_f64();
        self.wall_base = Instant::now();
        self.speed = sanitize_speed(speed);
    }
}

/// Whole seconds of a fractional virtual time (floor).
pub(crate) fn secs(t: f64) -> i64 {
    // Virtual unix seconds fit an i64 by a wide margin; `as` saturates on overflow.
    t.floor() as i64
}

fn sanitize_speed(speed: f64) -> f64 {
    if speed.is_finite() && speed >= 0.0 { speed } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frozen_clock_only_moves_on_advance() {
        let mut clock = Clock::starting_at(1_000.0, 0.0);
        assert_eq!(clock.now(), 1_000);
        clock.advance(2.5);
        assert_eq!(clock.now(), 1_002);
        clock.advance(-100.0);
        clock.advance(f64::NAN);
        assert_eq!(clock.now(), 1_002);
        clock.advance(0.5);
        assert_eq!(clock.now(), 1_003);
    }

    #[test]
    fn speed_change_keeps_current_time() {
        let mut clock = Clock::starting_at(50.0, 0.0);
        clock.advance(10.0);
        clock.set_speed(0.0);
        assert_eq!(clock.now(), 60);
        clock.set_speed(-3.0);
        assert!((clock.speed() - 0.0).abs() < f64::EPSILON);
    }

    #[test]
    fn real_clock_starts_near_unix_now() {
        let clock = Clock::new(1.0);
        assert!(clock.now() > 1_700_000_000);
    }
}
