//! Integration tests of the OpenAI surface, over real HTTP against `Simulator::spawn`.
//!
//! No test waits on the wall clock: simulators run at speed 0 and tests advance virtual time.

#![expect(
    clippy::unwrap_used,
    clippy::panic,
    reason = "test helpers fail loudly; clippy.toml's test allowances cover only #[test] functions"
)]

mod batches;
mod control;
mod faults;
mod files;
mod helpers;
mod memory;
mod spool;
