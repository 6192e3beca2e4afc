//! The application layer's error type: what a use case could not do, and whether the caller
//! asked for something impossible (bad input, unknown job or tenant, bad configuration) or the
//! system failed.

use std::path::PathBuf;

use tranche_core::input::Rejected;
use tranche_core::{JobId, JobState};
use tranche_engine::{EngineError, SubmitError};
use tranche_store::StoreError;

/// Why a use case failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AppError {
    /// The input was refused whole; nothing was stored.
    #[error("{}", .0.to_string().trim_end())]
    Rejected(Rejected),
    #[error("cannot read `{path}`: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write `{path}`: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`{0}` is not a job id (job ids look like job_0195…)")]
    BadJobId(String),
    #[error("no job {0} in this store")]
    NoSuchJob(JobId),
    #[error("job {id} has already ended ({state})")]
    JobEnded { id: JobId, state: JobState },
    #[error(
        "job {id} is not awaiting review (it is {state}); only a job run with --review-sample waits for one, once its requests are answered"
    )]
    NotAwaitingReview { id: JobId, state: JobState },
    /// A tenant name that cannot be one (empty, too long, `:` or a control character).
    #[error("{name:?} is not a tenant name: {reason}")]
    BadTenantName { name: String, reason: &'static str },
    #[error("tenant `{0}` exists already (revoke it first to give it a new token)")]
    TenantExists(String),
    #[error("no tenant `{0}` with a live token in this store")]
    NoSuchTenant(String),
    /// Configuration that cannot work: a bad value in a flag, the environment or the file.
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Blob(#[from] tranche_blob::BlobError),
    #[error("the store holds a result that is not JSON: {0}")]
    Corrupt(String),
}

impl AppError {
    /// Whether the caller asked for something that cannot be done (the CLI exits 2): bad
    /// input, an unknown or finished job, a bad, taken or unknown tenant name, bad
    /// configuration.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            Self::Rejected(_)
                | Self::Read { .. }
                | Self::Write { .. }
                | Self::BadJobId(_)
                | Self::NoSuchJob(_)
                | Self::NotAwaitingReview { .. }
                | Self::JobEnded { .. }
                | Self::BadTenantName { .. }
                | Self::TenantExists(_)
                | Self::NoSuchTenant(_)
                | Self::Config(_)
        )
    }
}

impl AppError {
    pub(crate) fn from_submit(error: SubmitError, path: Option<PathBuf>) -> Self {
        match error {
            SubmitError::Rejected(rejected) => Self::Rejected(rejected),
            SubmitError::Read(source) => {
                Self::Read { path: path.unwrap_or_else(|| PathBuf::from("-")), source }
            }
            SubmitError::Store(e) => Self::Store(e),
            SubmitError::Blob(e) => Self::Blob(e),
            other => Self::Config(other.to_string()),
        }
    }
}
