//! tranche's reconciler: takes jobs from input to stored, matched results through a provider.
//!
//! Every step reads its starting point from the store and records its outcome there before
//! the next step starts, so a restarted engine continues where the last one stopped. The
//! engine never speaks HTTP itself; it goes through `tranche_providers::Provider`.

mod budget;
mod cancel;
mod config;
mod drive;
mod engine;
mod error;
mod janitor;
mod judge;
mod layout;
mod lease;
mod outputs;
mod policy;
mod prune;
mod raw;
mod recover;
mod reparse;
mod settle;
mod shares;
mod steps;
mod submit;

pub use budget::BUDGET_EXCEEDED;
pub use config::{EngineConfig, Until};
pub use engine::{Engine, Providers};
pub use error::EngineError;
pub use janitor::{
    CleanedFile, CleanupOptions, CleanupReport, DaysToLimit, FailedDelete, FileAudit, FileClass,
    FileLimits, FileTally, FilesError,
};
pub use judge::{INVALID_OUTPUT, REJECTED_IN_REVIEW, UNDECODABLE_RESULT};
pub use layout::export_key;
pub use outputs::read_outputs;
pub use prune::PruneReport;
pub use reparse::{ReparseError, ReparseReport};
pub use submit::{SubmitError, Submitted};
