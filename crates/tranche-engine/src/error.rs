//! The engine's error type: what stops the engine itself (not what fails a request).

use std::path::PathBuf;

use tranche_core::ProviderKind;

/// A failure the engine cannot record and carry on from.
///
/// Upstream errors are not here: they are recorded on the tranche, request or job they
/// belong to, and the engine goes on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    #[error(transparent)]
    Store(#[from] tranche_store::StoreError),
    #[error(transparent)]
    Blob(#[from] tranche_blob::BlobError),
    #[error("{action} `{path}`: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no {0} provider is configured; pass its credentials (see `tranche run --help`)")]
    ProviderNotConfigured(ProviderKind),
    /// Stored state that contradicts itself (an answer where its record says it is not).
    #[error("stored data is inconsistent: {0}")]
    Corrupt(String),
    #[error("the answer check {id} cannot be used: {reason}")]
    AnswerCheck { id: String, reason: String },
    #[error("a tranche step stopped unexpectedly: {0}")]
    StepPanicked(#[source] tokio::task::JoinError),
}

impl EngineError {
    /// Whether the store was busy with another engine: the work is tried again, never given
    /// up.
    pub fn is_contention(&self) -> bool {
        matches!(self, Self::Store(e) if e.is_contention())
    }

    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { action, path, source }
    }
}
