//! The simulator's own control surface under `/sim` (no auth): stats, ledger, uploads, clock
//! and config.

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::AppState;
use crate::config::SimConfig;
use crate::openai::{ApiError, stream_body};
use crate::state::{Sim, lock};

pub(crate) fn router() -> Router<AppState> {
    Router::new()
        .route("/sim/health", get(health))
        .route("/sim/stats", get(stats))
        .route("/sim/ledger", get(ledger))
        .route("/sim/uploads", get(uploads))
        .route("/sim/clock", get(clock))
        .route("/sim/clock/advance", post(advance))
        .route("/sim/config", get(get_config).post(set_config))
}

async fn health() -> axum::Json<Value> {
    axum::Json(json!({"ok": true}))
}

async fn stats(State(state): State<AppState>) -> Response {
    let stats = lock(&state.sim).stats();
    axum::Json(stats).into_response()
}

/// Every file clients uploaded, deleted ones included.
async fn uploads(State(state): State<AppState>) -> Response {
    axum::Json(lock(&state.sim).uploads()).into_response()
}

/// The ledger as JSONL, streamed from its file on disk.
async fn ledger(State(state): State<AppState>) -> Response {
    let body = lock(&state.sim).ledger_body();
    let res = match body {
        Ok(body) => stream_body(body, "application/x-ndjson").await,
        Err(e) => Err(ApiError::internal(format!("cannot read the ledger: {e}"))),
    };
    res.unwrap_or_else(IntoResponse::into_response)
}

fn clock_json(sim: &Sim) -> Value {
    json!({"now": sim.clock.now(), "speed": sim.clock.speed()})
}

async fn clock(State(state): State<AppState>) -> axum::Json<Value> {
    axum::Json(clock_json(&lock(&state.sim)))
}

async fn advance(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<axum::Json<Value>, ApiError> {
    let seconds = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v.get("seconds").and_then(Value::as_f64))
        .filter(|s| s.is_finite() && *s >= 0.0)
        .ok_or_else(|| ApiError::invalid("Expected a JSON body {\"seconds\": N} with N >= 0."))?;
    let mut sim = lock(&state.sim);
    sim.clock.advance(seconds);
    sim.sync();
    Ok(axum::Json(clock_json(&sim)))
}

async fn get_config(State(state): State<AppState>) -> axum::Json<SimConfig> {
    axum::Json(lock(&state.sim).config.clone())
}

async fn set_config(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<axum::Json<SimConfig>, ApiError> {
    let config: SimConfig = serde_json::from_slice(&body)
        .map_err(|e| ApiError::invalid(format!("Invalid simulator config: {e}")))?;
    config.validate().map_err(|e| ApiError::invalid(e.to_string()))?;
    let mut sim = lock(&state.sim);
    sim.set_config(config);
    Ok(axum::Json(sim.config.clone()))
}
