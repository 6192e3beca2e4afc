//! tranche's reconciler: takes jobs from input to stored, matched results through a provider.
//!
//! Every step reads its starting point from the store and records its outcome there before
//! the next step starts, so a restarted engine continues where the last one stopped. The
//! engine never speaks HTTP itself; it goes through `tranche_providers::Provider`.

mod cancel;
mod config;
mod drive;
mod engine;
mod error;
mod layout;
mod lease;
mod policy;
mod prune;
mod recover;
mod settle;
mod steps;
mod submit;

pub use config::{EngineConfig, Until};
pub use engine::{Engine, Providers};
pub use error::EngineError;
pub use layout::export_key;
pub use prune::PruneReport;
pub use submit::{SubmitError, Submitted};
