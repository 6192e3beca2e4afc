//! tranche-sim: a local, wire-faithful simulator of LLM batch APIs with a virtual clock.
//!
//! One port serves three providers and a control surface:
//! - OpenAI Files + Batches under `/v1` (bearer auth): base URL `http://127.0.0.1:P/v1`;
//! - Azure OpenAI Files + Batches under `/openai/v1` and the dated `/openai/...?api-version=`
//!   (`api-key` or bearer): endpoint `http://127.0.0.1:P`;
//! - Anthropic Message Batches under `/v1/messages/batches` (`x-api-key` or bearer, plus
//!   `anthropic-version`): base URL `http://127.0.0.1:P`;
//! - `/sim` (no auth): stats, ledger, clock, config.
//!
//! It is both a product (`tranche sim --port P`) and the ground truth for tranche's tests: several
//! simulators can run side by side in one process, all state lives in the instance, and nothing
//! sleeps (but an injected latency fault). Batches move on a virtual clock (unix time at spawn + wall time × speed + explicit
//! advances) that tests step forward:
//!
//! ```no_run
//! # async fn demo() -> Result<(), tranche_sim::SimError> {
//! use tranche_sim::{SimConfig, Simulator};
//! let sim = Simulator::spawn(SimConfig { speed: 0.0, ..SimConfig::default() }).await?;
//! let base = sim.openai_base_url(); // "http://127.0.0.1:PORT/v1"
//! // ... upload a file and create a batch against `base`, then:
//! sim.advance(3600.0);
//! sim.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! Its memory does not grow with file sizes or line counts: file contents, each batch's lines and
//! results, and the ledger live on disk in a spool folder of its own (a temporary directory,
//! removed when the simulator is dropped; see [`SimConfig::spool_dir`]). Uploads are streamed to
//! it and downloads are streamed from it.
//!
//! Modules: `clock` (virtual time), `config` (run-time settings), `state` (provider-neutral store
//! and batch life cycle), `spool` (the on-disk storage), `shuffle` (the order lines run in),
//! `validate` (JSONL input checks), `model` and `schema` (the deterministic fake model), `tokens`
//! (token counts), `cache` (prompt caching), `openai` (OpenAI and Azure routes and wire shapes),
//! `anthropic` (Message Batches), `faults` (HTTP fault injection), `time` (wire timestamps),
//! `control` (`/sim`), `stats` (counters, ledger).

mod anthropic;
mod cache;
mod clock;
mod config;
mod control;
mod error;
mod faults;
mod model;
mod openai;
mod schema;
mod shuffle;
mod spool;
mod state;
mod stats;
mod time;
mod tokens;
mod validate;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, BodyDataStream, Bytes};
use futures::StreamExt;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use config::{
    AZURE_API_VERSIONS, AnthropicConfig, AzureConfig, DEFAULT_MAX_FILE_BYTES, FAULT_OPERATIONS,
    HttpFault, HttpFaultKind, LineFault, LineFaultKind, OpenAiConfig, ProcessingConfig, SimConfig,
};
pub use error::SimError;
pub use stats::{ByProvider, LedgerEntry, LedgerOutcome, ProviderStats, SimStats, UploadEntry};

use state::{SharedSim, Sim, lock};

/// State shared by every route of one simulator.
#[derive(Debug, Clone)]
pub(crate) struct AppState {
    pub(crate) sim: SharedSim,
    /// The bound address (for absolute URLs when a request has no `Host`).
    pub(crate) addr: SocketAddr,
}

/// The whole HTTP surface of one simulator.
fn app(state: AppState) -> Router {
    Router::new()
        .merge(openai::router(state.clone()))
        .merge(anthropic::router(&state))
        .merge(control::router())
        .fallback(openai::invalid_url)
        .method_not_allowed_fallback(openai::invalid_url)
        .with_state(state)
        .layer(axum::middleware::from_fn(read_body_first))
}

/// The most request body the simulator reads before answering.
const MAX_REQUEST_BYTES: u64 = 1 << 30;

/// A request body shared by the route, which reads what it needs, and [`read_body_first`], which
/// reads and drops the rest afterwards.
struct BodyTap {
    stream: BodyDataStream,
    read: u64,
    over_limit: bool,
    ended: bool,
}

impl BodyTap {
    async fn next_chunk(&mut self) -> Option<Result<Bytes, axum::Error>> {
        if self.ended {
            return None;
        }
        let item = self.stream.next().await;
        match &item {
            Some(Ok(chunk)) => {
                self.read += u64::try_from(chunk.len()).unwrap_or(u64::MAX);
                if self.read > MAX_REQUEST_BYTES {
                    self.over_limit = true;
                    self.ended = true;
                    return Some(Err(axum::Error::new("request body too large")));
                }
            }
            Some(Err(_)) | None => self.ended = true,
        }
        item
    }
}

/// Makes sure every request body has been read to its end before the answer goes out. A real
/// API reads the upload before it answers 401 or 400; answering early and closing the connection
/// would show a client a broken pipe (a transport error) instead of the error body the provider
/// sends. The body is not held in memory: the route streams what it needs (an upload goes to
/// disk), and whatever it left is read and dropped here before its answer is sent.
async fn read_body_first(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let too_large =
        || (axum::http::StatusCode::PAYLOAD_TOO_LARGE, "request body too large").into_response();
    let (parts, body) = req.into_parts();
    let tap = Arc::new(tokio::sync::Mutex::new(BodyTap {
        stream: body.into_data_stream(),
        read: 0,
        over_limit: false,
        ended: false,
    }));
    let shared = futures::stream::unfold(tap.clone(), |tap| async move {
        let item = tap.lock().await.next_chunk().await;
        item.map(|chunk| (chunk, tap))
    });
    let res = next.run(axum::extract::Request::from_parts(parts, Body::from_stream(shared))).await;
    let mut rest = tap.lock().await;
    while let Some(Ok(_)) = rest.next_chunk().await {}
    if rest.over_limit { too_large() } else { res }
}

/// Starts simulators.
#[derive(Debug, Clone, Copy)]
pub struct Simulator;

impl Simulator {
    /// Serves a new simulator on `127.0.0.1` at a free port.
    pub async fn spawn(config: SimConfig) -> Result<SimHandle, SimError> {
        Self::spawn_on(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), config).await
    }

    /// Serves a new simulator on `addr` (port 0 picks a free port).
    pub async fn spawn_on(addr: SocketAddr, config: SimConfig) -> Result<SimHandle, SimError> {
        config.validate()?;
        let listener =
            TcpListener::bind(addr).await.map_err(|source| SimError::Bind { addr, source })?;
        let local = listener.local_addr().map_err(|source| SimError::Bind { addr, source })?;
        let sim = Sim::new(config).map_err(SimError::Spool)?;
        let spool_dir = sim.spool.path().to_path_buf();
        let sim: SharedSim = Arc::new(Mutex::new(sim));
        let router = app(AppState { sim: sim.clone(), addr: local });
        let (shutdown, signal) = oneshot::channel::<()>();
        let server = axum::serve(listener, router).with_graceful_shutdown(async move {
            // Fires on an explicit shutdown and when the handle is dropped.
            signal.await.ok();
        });
        let join = tokio::spawn(async move { server.await });
        tracing::info!(addr = %local, spool = %spool_dir.display(), "tranche simulator listening");
        Ok(SimHandle { addr: local, sim, spool_dir, shutdown, join })
    }
}

/// A running simulator. Dropping it stops the server.
#[derive(Debug)]
pub struct SimHandle {
    addr: SocketAddr,
    sim: SharedSim,
    spool_dir: PathBuf,
    shutdown: oneshot::Sender<()>,
    join: JoinHandle<std::io::Result<()>>,
}

impl SimHandle {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The simulator's spool folder: where it keeps file contents, batch lines and results, and
    /// the ledger (removed when the simulator is dropped).
    pub fn spool_dir(&self) -> &std::path::Path {
        &self.spool_dir
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://127.0.0.1:PORT/v1`: the `base_url` for OpenAI clients.
    pub fn openai_base_url(&self) -> String {
        format!("{}/v1", self.base_url())
    }

    /// `http://127.0.0.1:PORT`: the Azure OpenAI endpoint (`azure_endpoint` of `AzureOpenAI`;
    /// the v1 surface is under `/openai/v1`, the dated one under `/openai/...?api-version=`).
    pub fn azure_endpoint(&self) -> String {
        self.base_url()
    }

    /// `http://127.0.0.1:PORT`: the `base_url` for Anthropic clients.
    pub fn anthropic_base_url(&self) -> String {
        self.base_url()
    }

    /// Current virtual unix time in seconds.
    pub fn now(&self) -> i64 {
        lock(&self.sim).clock.now()
    }

    /// Moves the virtual clock forward (negative or non-finite amounts are ignored).
    pub fn advance(&self, seconds: f64) {
        let mut sim = lock(&self.sim);
        sim.clock.advance(seconds);
        sim.sync();
    }

    /// Counters, as `GET /sim/stats` returns them.
    pub fn stats(&self) -> SimStats {
        lock(&self.sim).stats()
    }

    /// Every file clients uploaded, as `GET /sim/uploads` returns them.
    pub fn uploads(&self) -> Vec<UploadEntry> {
        lock(&self.sim).uploads()
    }

    /// Every request run so far, as `GET /sim/ledger` returns them.
    pub fn ledger(&self) -> Vec<LedgerEntry> {
        lock(&self.sim).ledger()
    }

    /// The current config (its `api_key` included).
    pub fn config(&self) -> SimConfig {
        lock(&self.sim).config.clone()
    }

    /// Replaces the config at run time, like `POST /sim/config`. Batches are brought up to the
    /// current virtual time under the old config first. Out-of-range numbers fall back to safe
    /// values (use [`SimConfig::validate`] to reject them instead).
    pub fn set_config(&self, config: SimConfig) {
        if let Err(e) = config.validate() {
            tracing::warn!(error = %e, "simulator config out of range; using safe values");
        }
        lock(&self.sim).set_config(config.sanitized());
    }

    /// Changes the config in place at run time (e.g. `|c| c.faults.push(fault)`), like
    /// [`SimHandle::set_config`].
    pub fn update_config(&self, change: impl FnOnce(&mut SimConfig)) {
        let mut config = self.config();
        change(&mut config);
        self.set_config(config);
    }

    /// Replaces the HTTP faults (an empty list clears them).
    pub fn set_faults(&self, faults: Vec<HttpFault>) {
        self.update_config(|c| c.faults = faults);
    }

    /// Replaces the line faults (an empty list clears them).
    pub fn set_line_faults(&self, line_faults: Vec<LineFault>) {
        self.update_config(|c| c.line_faults = line_faults);
    }

    /// Stops the server gracefully and waits for it.
    pub async fn shutdown(self) {
        let Self { shutdown, join, .. } = self;
        shutdown.send(()).ok();
        match join.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "simulator server ended with an error"),
            Err(e) => tracing::warn!(error = %e, "simulator server task failed"),
        }
    }

    /// Serves until the server ends (for `tranche sim`; stop it by dropping the future, e.g. in a
    /// `select!` with ctrl-c).
    pub async fn wait(self) -> Result<(), SimError> {
        let Self { shutdown, join, .. } = self;
        let res = join.await;
        drop(shutdown);
        match res {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(SimError::Serve(e)),
            Err(e) => Err(SimError::Task(e.to_string())),
        }
    }
}
