//! What a store shows to a metrics scrape (`MetricsStore::metrics_snapshot`): jobs, requests
//! and tranches by state, billed tokens by provider and model, and the upstream errors jobs
//! and tranches carry. Every figure is an aggregate over counters and small tables (jobs,
//! tranches, the usage ledger), never over requests.

use tranche_core::{JobState, TrancheState};

use crate::records::{RequestCounts, UsageRow};

/// The store's figures at one moment (one read transaction).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetricsSnapshot {
    /// Jobs by state, the states that have any, by state name.
    pub jobs: Vec<(JobState, u64)>,
    /// Requests by state: the sums of every job's counters (pruned jobs keep theirs).
    pub requests: RequestCounts,
    /// Tranches by state, the states that have any, by state name.
    pub tranches: Vec<(TrancheState, u64)>,
    /// Billed usage (kind `billed`) by provider and model over every job and day, by
    /// provider then model.
    pub billed: Vec<UsageRow>,
    /// How many jobs and tranches carry an upstream error now, by what carries it, provider
    /// and code.
    pub upstream_errors: Vec<UpstreamErrorCount>,
}

/// What carries an upstream error: a job (its pause, else its last error) or a tranche (its
/// last error, cleared by its next transition).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ErrorCarrier {
    Job,
    Tranche,
}

impl ErrorCarrier {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Job => "job",
            Self::Tranche => "tranche",
        }
    }
}

impl std::str::FromStr for ErrorCarrier {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "job" => Ok(Self::Job),
            "tranche" => Ok(Self::Tranche),
            other => Err(format!("unknown error carrier {other:?}")),
        }
    }
}

/// How many jobs or tranches carry an upstream error of one provider and code. The code is
/// the provider's own (`code`), else its error type (`error_type`, `type`), else `none`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamErrorCount {
    pub carrier: ErrorCarrier,
    pub provider: String,
    pub code: String,
    pub count: u64,
}
