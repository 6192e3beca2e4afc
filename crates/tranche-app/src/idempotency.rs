//! Idempotency keys of submissions, per tenant: the same key and body give the same job, the
//! same key with another body is a conflict. A claim a submission never completed (its server
//! died) is taken over after [`STALE_CLAIM`].

use std::time::Duration;

use tranche_core::{Clock, JobId, SystemClock};
use tranche_store::KeyClaim;

use crate::App;
use crate::error::AppError;

/// How long an unfinished claim holds its key.
pub const STALE_CLAIM: Duration = Duration::from_secs(3600);

impl App {
    /// Claims `key` for `tenant`'s submission, or says what holds it.
    pub async fn claim_key(&self, tenant: &str, key: &str) -> Result<KeyClaim, AppError> {
        let now = SystemClock.now();
        let stale_before = now - i64::try_from(STALE_CLAIM.as_secs()).unwrap_or(i64::MAX);
        Ok(self.store.claim_key(tenant, key, now, stale_before).await?)
    }

    /// Completes a claim with the job its submission made and the submission's SHA-256.
    pub async fn complete_key(
        &self,
        tenant: &str,
        key: &str,
        body_sha256: &str,
        job: JobId,
    ) -> Result<(), AppError> {
        Ok(self.store.complete_key(tenant, key, body_sha256, job).await?)
    }

    /// Gives a claim up: its submission was refused.
    pub async fn release_key(&self, tenant: &str, key: &str) -> Result<(), AppError> {
        Ok(self.store.release_key(tenant, key).await?)
    }
}
