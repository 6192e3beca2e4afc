//! Who calls: every `/v1` call carries a tenant's bearer token; a tenant sees only its own jobs
//! (an admin's token sees all), and another tenant's job looks exactly like no job.

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use tranche_app::{Job, Tenant};

use crate::ApiState;
use crate::error::ApiError;

/// The tenant a call's token belongs to.
#[derive(Debug, Clone)]
pub struct Caller(pub Tenant);

impl FromRequestParts<ApiState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, ApiError> {
        let token = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or(ApiError::Unauthorized)?;
        match state.app.authenticate(token).await? {
            Some(tenant) => Ok(Self(tenant)),
            None => Err(ApiError::Unauthorized),
        }
    }
}

impl Caller {
    /// Whether the caller may see `job`.
    pub fn owns(&self, job: &Job) -> bool {
        self.0.admin || job.settings.tenant.as_deref() == Some(self.0.name.as_str())
    }

    /// The tenant whose jobs a listing shows: the caller's, or every tenant's for an admin.
    pub fn scope(&self) -> Option<&str> {
        (!self.0.admin).then_some(self.0.name.as_str())
    }
}
