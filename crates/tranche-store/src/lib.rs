//! tranche's persistence: jobs, requests, tranches, attempts and provider files.
//!
//! Only this crate speaks SQL. It stores what the engine decides and answers what the
//! engine and the CLI ask; it holds no business rules. Timestamps are given by the caller
//! (unix seconds), so the store never reads a clock.

mod error;
mod records;
mod sqlite;

pub use error::{DuplicateCustomId, StoreError, StoreResult};
pub use records::*;
pub use sqlite::{IngestWriter, JobWriter, Store, TrancheUpdate};
