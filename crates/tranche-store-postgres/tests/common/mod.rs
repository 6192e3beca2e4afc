//! A store on a scratch PostgreSQL database per check (see `tranche_test_support::postgres`).

#![expect(clippy::unwrap_used, reason = "test setup fails loudly")]

use std::sync::Arc;

use tranche_store::conformance::Fresh;
use tranche_store_postgres::PgStore;
pub use tranche_test_support::postgres::scratch;

/// A store on a new, empty scratch database, as the conformance suite takes it.
pub async fn fresh() -> Fresh {
    let mut scratch = scratch().await;
    let store = Arc::new(PgStore::open(&scratch.url).await.unwrap());
    scratch.stores.push(store.clone());
    Fresh { store, guard: Box::new(scratch) }
}
