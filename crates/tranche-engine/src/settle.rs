//! Settling jobs: a job ends once its requests are terminal and its tranches cleaned up.

use tracing::info;

use crate::engine::Engine;
use crate::error::EngineError;
use crate::policy;

impl Engine {
    /// Ends every job whose requests have all reached a terminal state and whose tranches
    /// are cleaned up.
    pub(crate) async fn settle_jobs(&self) -> Result<(), EngineError> {
        for job in self.store.open_jobs().await? {
            if self.store.job_has_open_requests(job.id).await?
                || self.store.job_open_tranches(job.id).await? > 0
            {
                continue;
            }
            let counts = self.store.job_counts(job.id).await?;
            // Answers to review wait for a person; a job without one has nothing to review.
            let awaits_review = job.settings.review_sample.is_some()
                && job.review.is_none()
                && counts.succeeded > 0;
            let state =
                policy::job_outcome(job.cancel_requested, job.last_error.is_some(), awaits_review);
            // Compare-and-set: another engine may have settled it a moment ago.
            if self.store.set_job_state(job.id, state, None, self.now()).await? {
                info!(job = %job.id, state = %state, succeeded = counts.succeeded, failed = counts.failed, "job ended");
            }
        }
        Ok(())
    }
}
