//! Setup shared by tranche's tests, so that each test file says what it checks rather than how
//! to stand up a server: a scripted HTTP server that records what it was sent, a `tranche sim`
//! child process with probes of its control surface, input generators, and an engine harness
//! over an in-process simulator and a fresh store.
//!
//! Test code: helpers fail loudly (they panic) instead of returning errors.

#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test helpers fail loudly"
)]

pub mod harness;
pub mod inputs;
pub mod probe;
pub mod scripted;
pub mod sim_process;
