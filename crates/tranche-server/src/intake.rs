//! How many submissions are taken in at once: at most `max_concurrent_intake` in all, and at
//! most `max_tenant_intake` of one tenant's, so that one tenant streaming large jobs leaves
//! room for the others. Past either, a submission is answered 429 at once, never queued.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::ApiError;

/// The submissions under way.
#[derive(Debug)]
pub struct Intake {
    all: Arc<Semaphore>,
    total: usize,
    per_tenant: usize,
    tenants: Arc<Mutex<HashMap<String, usize>>>,
}

/// One submission's place; given back when dropped.
#[derive(Debug)]
pub struct Slot {
    _all: OwnedSemaphorePermit,
    tenant: String,
    tenants: Arc<Mutex<HashMap<String, usize>>>,
}

impl Intake {
    pub fn new(total: usize, per_tenant: usize) -> Self {
        let total = total.max(1);
        Self {
            all: Arc::new(Semaphore::new(total)),
            total,
            per_tenant: per_tenant.clamp(1, total),
            tenants: Arc::default(),
        }
    }

    /// A place for one of `tenant`'s submissions, or 429.
    pub fn enter(&self, tenant: &str) -> Result<Slot, ApiError> {
        let all = self.all.clone().try_acquire_owned().map_err(|_| {
            ApiError::TooManyRequests(format!(
                "{} submissions are being taken in already; try again shortly",
                self.total
            ))
        })?;
        let mut tenants = self.tenants.lock().map_err(|_| ApiError::Internal("intake".into()))?;
        let held = tenants.entry(tenant.to_owned()).or_insert(0);
        if *held >= self.per_tenant {
            return Err(ApiError::TooManyRequests(format!(
                "{} of tenant {tenant}'s submissions are being taken in already (its share); try again shortly",
                self.per_tenant
            )));
        }
        *held += 1;
        Ok(Slot { _all: all, tenant: tenant.to_owned(), tenants: self.tenants.clone() })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Ok(mut tenants) = self.tenants.lock()
            && let Some(held) = tenants.get_mut(&self.tenant)
        {
            *held = held.saturating_sub(1);
            if *held == 0 {
                tenants.remove(&self.tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_takes_its_share_and_leaves_room_for_others() {
        let intake = Intake::new(3, 2);
        let a1 = intake.enter("a").unwrap();
        let _a2 = intake.enter("a").unwrap();
        assert_eq!(intake.enter("a").unwrap_err().status().as_u16(), 429, "a's share is 2");
        let b1 = intake.enter("b").unwrap();
        assert_eq!(intake.enter("b").unwrap_err().status().as_u16(), 429, "3 in all");
        drop(a1);
        let _a3 = intake.enter("a").unwrap();
        drop(b1);
        assert!(intake.enter("b").is_ok(), "places are given back");
    }
}
