//! Conformance tests of the Azure OpenAI and Anthropic surfaces, HTTP faults, token counts and
//! prompt caching, answer faults, enqueued-token limits, and several providers and simulators side
//! by side, over real HTTP against `Simulator::spawn`.
//!
//! No test waits on the wall clock for a batch: simulators run at speed 0 and tests advance
//! virtual time.

#![expect(
    clippy::unwrap_used,
    clippy::panic,
    reason = "test helpers fail loudly; clippy.toml's test allowances cover only #[test] functions"
)]

mod anthropic;
mod azure;
mod caching;
mod cross;
mod helpers;
mod http_faults;
mod model;
