//! tranche's HTTP API: jobs in and results out, per tenant, over the application layer (the
//! same use cases as the CLI). No engine logic lives here: a submission is the app's submit, a
//! cancel the app's cancel; the worker that carries jobs out runs beside the API (`tranche
//! serve`) or elsewhere on the same store.
//!
//! [`router`] is the whole API, for tests to call without a socket; [`serve`] runs it on a
//! listener until a shutdown future resolves.

mod auth;
mod error;
mod events;
mod files;
mod health;
mod intake;
mod jobs;
mod metrics;
mod openapi;
mod review;
mod settings;

use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post};
use tokio::net::TcpListener;
use tranche_app::{App, Engine};
use tranche_core::price::PriceTable;

pub use error::ApiError;
pub use openapi::document as openapi;
pub use settings::ApiSettings;

/// What a server accepts at most.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Bytes of one submission's body.
    pub max_body_bytes: u64,
    /// Requests in one job.
    pub max_requests_per_job: u64,
    /// Submissions taken in at once; more are answered 429.
    pub max_concurrent_intake: usize,
    /// Submissions of one tenant taken in at once (its share of the above).
    pub max_tenant_intake: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: 256 * 1024 * 1024,
            max_requests_per_job: 1_000_000,
            max_concurrent_intake: 8,
            max_tenant_intake: 4,
        }
    }
}

/// Everything a handler reaches: the app, an engine that records (submit, cancel), the
/// deployment's prices and the limits. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ApiState {
    app: App,
    engine: Engine,
    prices: Arc<PriceTable>,
    limits: Limits,
    intake: Arc<intake::Intake>,
    /// An engine holding the providers' credentials, for the provider files audit.
    files: Option<Engine>,
}

impl ApiState {
    pub fn new(app: App, engine: Engine, prices: PriceTable, limits: Limits) -> Self {
        let intake =
            Arc::new(intake::Intake::new(limits.max_concurrent_intake, limits.max_tenant_intake));
        Self { app, engine, prices: Arc::new(prices), limits, intake, files: None }
    }

    /// The engine (with the providers' credentials) the provider files audit asks.
    pub fn with_files(mut self, engine: Engine) -> Self {
        self.files = Some(engine);
        self
    }
}

/// The whole API.
pub fn router(state: ApiState) -> Router {
    let v1 = Router::new()
        .route("/jobs", post(jobs::submit).get(jobs::list))
        .route("/jobs/{id}", get(jobs::show))
        .route("/jobs/{id}/cancel", post(jobs::cancel))
        .route("/jobs/{id}/results", get(jobs::results))
        .route("/jobs/{id}/cost", get(jobs::cost))
        .route("/jobs/{id}/events", get(events::events))
        .route("/jobs/{id}/review", get(review::show))
        .route("/jobs/{id}/approve", post(review::approve))
        .route("/jobs/{id}/reject", post(review::reject))
        .route("/files/audit", get(files::audit));
    Router::new()
        .nest("/v1", v1)
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(metrics::metrics))
        .route("/openapi.json", get(openapi::serve))
        .fallback(health::unknown_path)
        .with_state(state)
}

/// Serves the API on `listener` until `shutdown` resolves, then finishes the calls under way.
pub async fn serve(
    listener: TcpListener,
    state: ApiState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state)).with_graceful_shutdown(shutdown).await
}
