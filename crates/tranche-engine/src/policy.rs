//! Pure policy: what a failure means for a request's retry budget.

/// How a request's failure counts against its retry budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// Worth sending again (5xx, 429, overloaded, expired, cancelled by the provider).
    Retryable,
    /// Sending it again cannot help (a 4xx such as `context_length_exceeded`).
    Fatal,
    /// The whole batch failed (validation, token limit): back to the pool without spending an
    /// attempt, a bounded number of times.
    WholeBatch,
    /// The user cancelled the job.
    UserCancel,
}
