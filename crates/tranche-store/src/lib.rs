//! tranche's persistence as traits and records: jobs, requests, tranches, attempts, provider
//! files, leases and tenants. Backends (`tranche-store-sqlite`, `tranche-store-postgres`)
//! implement every trait, read their rows into records through `rows`, and pass the
//! conformance suite (`conformance`, behind the feature of that name); the engine and the CLI
//! see only the traits.
//!
//! A store holds no business rules: it records what the engine decides and answers what it
//! asks. Timestamps are given by the caller (unix seconds), except that leases are judged by
//! the store's own clock.

#[cfg(feature = "conformance")]
pub mod conformance;
mod error;
mod metrics;
mod records;
pub mod rows;
mod traits;

pub use error::{DuplicateCustomId, StoreError, StoreResult};
pub use metrics::{ErrorCarrier, MetricsSnapshot, UpstreamErrorCount};
pub use records::*;
pub use traits::MetricsStore;
pub use traits::{
    AnswerStore, BlobIndex, DeploymentStore, FileStore, IdempotencyStore, IngestStore,
    IngestWriter, JobStore, JobWriter, LeaseStore, PlanStore, PruneStore, QueryStore, Store,
    TenantStore, TrancheStore, UsageStore,
};
