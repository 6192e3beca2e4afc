//! Setup shared by tranche's tests, so that each test file says what it checks rather than how
//! to stand up a server: a scripted HTTP server that records what it was sent, a `tranche sim`
//! child process with probes of its control surface, input generators, an engine harness over an
//! in-process simulator and a fresh store, a scratch PostgreSQL database per test, and a real
//! S3-compatible server on loopback.
//!
//! Test code: helpers fail loudly (they panic) instead of returning errors.

#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test helpers fail loudly"
)]

pub mod foreign;
pub mod harness;
pub mod inputs;
pub mod postgres;
pub mod probe;
pub mod python;
pub mod s3;
pub mod scripted;
pub mod sim_process;
