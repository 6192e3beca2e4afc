//! Run-time configuration of a simulator: seed, clock speed, auth, processing pace, per-provider
//! limits and quirks, HTTP faults and line faults.
//!
//! Every struct deserializes with defaults for missing fields, so `{}` is a valid config, and unknown
//! fields are rejected so that a typo in a test or in `POST /sim/config` does not pass silently.
//! `tranche sim --config FILE` reads the same JSON.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::SimError;
use crate::state::Provider;

/// OpenAI's per-file upload limit: "Individual files can be up to 512 MB".
pub const DEFAULT_MAX_FILE_BYTES: u64 = 512 * 1024 * 1024;

/// The whole configuration of one simulator instance.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SimConfig {
    /// Seeds output order, line faults and HTTP faults. Default 7.
    pub seed: u64,
    /// Virtual seconds per wall second (0 freezes the clock). Default 1.0.
    pub speed: f64,
    /// If set, the key every provider surface requires (else 401), unless that provider has its
    /// own `api_key`; if unset, any non-empty key is accepted. A missing key is always 401. Never
    /// serialized, never printed.
    #[serde(skip_serializing)]
    pub api_key: Option<String>,
    /// How fast batches move through their states.
    pub processing: ProcessingConfig,
    /// Per-line failures and bad answers injected while a batch runs.
    pub line_faults: Vec<LineFault>,
    /// Largest accepted upload, in bytes (`400 File is too large.` above it). Default 512 MiB.
    pub max_file_bytes: u64,
    /// Faults injected into HTTP operations (429, 5xx, latency, dropped connections).
    pub faults: Vec<HttpFault>,
    /// OpenAI limits.
    pub openai: OpenAiConfig,
    /// Azure OpenAI limits, quotas and quirks.
    pub azure: AzureConfig,
    /// Anthropic limits.
    pub anthropic: AnthropicConfig,
    /// The folder in which the simulator makes its spool folder (a fresh temporary directory
    /// holding file contents, batch lines and results, and the ledger, removed when the
    /// simulator is dropped). Default: the system's temporary directory. Read once at spawn;
    /// changing it at run time has no effect.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spool_dir: Option<PathBuf>,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            seed: 7,
            speed: 1.0,
            api_key: None,
            processing: ProcessingConfig::default(),
            line_faults: Vec::new(),
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            faults: Vec::new(),
            openai: OpenAiConfig::default(),
            azure: AzureConfig::default(),
            anthropic: AnthropicConfig::default(),
            spool_dir: None,
        }
    }
}

fn redacted(key: Option<&String>) -> Option<&'static str> {
    key.map(|_| "<redacted>")
}

impl fmt::Debug for SimConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimConfig")
            .field("seed", &self.seed)
            .field("speed", &self.speed)
            .field("api_key", &redacted(self.api_key.as_ref()))
            .field("processing", &self.processing)
            .field("line_faults", &self.line_faults)
            .field("max_file_bytes", &self.max_file_bytes)
            .field("faults", &self.faults)
            .field("openai", &self.openai)
            .field("azure", &self.azure)
            .field("anthropic", &self.anthropic)
            .field("spool_dir", &self.spool_dir)
            .finish()
    }
}

fn bad<T>(msg: String) -> Result<T, SimError> {
    Err(SimError::InvalidConfig(msg))
}

fn check_provider(field: &str, provider: &str) -> Result<(), SimError> {
    if provider != "any" && Provider::parse(provider).is_none() {
        return bad(format!(
            "{field} must be one of any, openai, azure, anthropic; got {provider:?}"
        ));
    }
    Ok(())
}

fn check_rate(field: &str, rate: f64) -> Result<(), SimError> {
    if !(rate.is_finite() && (0.0..=1.0).contains(&rate)) {
        return bad(format!("{field} must be between 0 and 1, got {rate}"));
    }
    Ok(())
}

impl SimConfig {
    /// Checks ranges: speed ≥ 0, requests_per_second > 0, phase durations ≥ 0, fault rates in 0..=1,
    /// fault providers, operations and statuses known, expiry bounds ordered, limits positive.
    pub fn validate(&self) -> Result<(), SimError> {
        if !(self.speed.is_finite() && self.speed >= 0.0) {
            return bad(format!("speed must be a finite number >= 0, got {}", self.speed));
        }
        let p = &self.processing;
        if !(p.requests_per_second.is_finite() && p.requests_per_second > 0.0) {
            return bad(format!(
                "processing.requests_per_second must be > 0, got {}",
                p.requests_per_second
            ));
        }
        for (name, v) in [
            ("validating_seconds", p.validating_seconds),
            ("finalizing_seconds", p.finalizing_seconds),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return bad(format!("processing.{name} must be >= 0, got {v}"));
            }
        }
        for (i, fault) in self.line_faults.iter().enumerate() {
            check_rate(&format!("line_faults[{i}].rate"), fault.rate)?;
            check_provider(&format!("line_faults[{i}].provider"), &fault.provider)?;
        }
        for (i, fault) in self.faults.iter().enumerate() {
            fault.validate(i)?;
        }
        let a = &self.azure;
        if a.min_expiry_seconds > a.max_expiry_seconds || a.min_expiry_seconds < 1 {
            return bad(format!(
                "azure.min_expiry_seconds ({}) must be >= 1 and <= azure.max_expiry_seconds ({})",
                a.min_expiry_seconds, a.max_expiry_seconds
            ));
        }
        for (name, v) in [
            ("openai.max_requests_per_batch", self.openai.max_requests_per_batch),
            ("azure.max_requests_per_batch", a.max_requests_per_batch),
            ("anthropic.max_requests_per_batch", self.anthropic.max_requests_per_batch),
        ] {
            if v == 0 {
                return bad(format!("{name} must be >= 1"));
            }
        }
        Ok(())
    }

    /// The same config with out-of-range numbers replaced by safe values (for
    /// [`crate::SimHandle::set_config`], which cannot fail).
    pub(crate) fn sanitized(mut self) -> Self {
        let d = Self::default();
        if !(self.speed.is_finite() && self.speed >= 0.0) {
            self.speed = 0.0;
        }
        let p = &mut self.processing;
        if !(p.requests_per_second.is_finite() && p.requests_per_second > 0.0) {
            p.requests_per_second = d.processing.requests_per_second;
        }
        if !(p.validating_seconds.is_finite() && p.validating_seconds >= 0.0) {
            p.validating_seconds = d.processing.validating_seconds;
        }
        if !(p.finalizing_seconds.is_finite() && p.finalizing_seconds >= 0.0) {
            p.finalizing_seconds = d.processing.finalizing_seconds;
        }
        let clamp = |r: f64| if r.is_finite() { r.clamp(0.0, 1.0) } else { 0.0 };
        for fault in &mut self.line_faults {
            fault.rate = clamp(fault.rate);
        }
        for fault in &mut self.faults {
            fault.rate = clamp(fault.rate);
        }
        // Faults that do not validate (unknown provider, operation or status) are dropped.
        let faults = std::mem::take(&mut self.faults);
        self.faults = faults
            .into_iter()
            .enumerate()
            .filter(|(i, f)| f.validate(*i).is_ok())
            .map(|(_, f)| f)
            .collect();
        if self.azure.min_expiry_seconds > self.azure.max_expiry_seconds {
            self.azure.min_expiry_seconds = d.azure.min_expiry_seconds;
            self.azure.max_expiry_seconds = d.azure.max_expiry_seconds;
        }
        self.openai.max_requests_per_batch = self.openai.max_requests_per_batch.max(1);
        self.azure.max_requests_per_batch = self.azure.max_requests_per_batch.max(1);
        self.anthropic.max_requests_per_batch = self.anthropic.max_requests_per_batch.max(1);
        self
    }

    /// The key a provider surface requires, if any.
    pub(crate) fn key_for(&self, provider: Provider) -> Option<&str> {
        let own = match provider {
            Provider::OpenAi => self.openai.api_key.as_deref(),
            Provider::Azure => self.azure.api_key.as_deref(),
            Provider::Anthropic => self.anthropic.api_key.as_deref(),
        };
        own.or(self.api_key.as_deref())
    }
}

/// Pace of the batch life cycle, in virtual seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProcessingConfig {
    /// Lines executed per virtual second while `in_progress`. Default 1000.
    pub requests_per_second: f64,
    /// Time spent in `validating` (hidden inside `in_progress` for Anthropic). Default 2.
    pub validating_seconds: f64,
    /// Time spent in `finalizing` (and in `cancelling` / `canceling`). Default 2.
    pub finalizing_seconds: f64,
}

impl Default for ProcessingConfig {
    fn default() -> Self {
        Self { requests_per_second: 1000.0, validating_seconds: 2.0, finalizing_seconds: 2.0 }
    }
}

/// One kind of per-line failure, applied to each line independently with probability `rate`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LineFault {
    /// `"openai"`, `"azure"`, `"anthropic"` or `"any"` (default).
    #[serde(default = "any")]
    pub provider: String,
    pub kind: LineFaultKind,
    /// Probability in 0..=1.
    pub rate: f64,
}

fn any() -> String {
    "any".to_owned()
}

impl LineFault {
    pub(crate) fn applies_to(&self, provider: Provider) -> bool {
        self.provider == "any" || self.provider == provider.as_str()
    }
}

/// What a faulted line looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LineFaultKind {
    /// A non-retryable request error (OpenAI/Azure 400 `context_length_exceeded`; Anthropic an
    /// `errored` result with `invalid_request_error`). Sticky: the same custom_id fails the same
    /// way on every attempt.
    Fatal,
    /// A transient server error (OpenAI/Azure 500 `server_error`; Anthropic an `errored` result with
    /// `api_error`). Drawn afresh on each attempt of a custom_id.
    Retryable,
    /// A successful, billed answer whose text is not valid JSON. Drawn afresh per attempt.
    InvalidJson,
    /// A successful, billed answer that is JSON but does not fit the requested schema. Drawn
    /// afresh per attempt.
    SchemaViolation,
}

impl LineFaultKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Fatal => "fatal",
            Self::Retryable => "retryable",
            Self::InvalidJson => "invalid_json",
            Self::SchemaViolation => "schema_violation",
        }
    }

    /// Whether the same custom_id draws the same verdict on every attempt.
    pub(crate) fn sticky(self) -> bool {
        matches!(self, Self::Fatal)
    }

    /// Whether the line still runs and is billed, only with a bad answer.
    pub(crate) fn corrupts_answer(self) -> bool {
        matches!(self, Self::InvalidJson | Self::SchemaViolation)
    }
}

/// The HTTP operations a fault can target.
pub const FAULT_OPERATIONS: [&str; 8] =
    ["upload", "create", "retrieve", "list", "content", "delete", "cancel", "any"];

/// A fault injected into HTTP operations, answered in the target provider's own error shape.
///
/// `status` 400..=599 answers that status (with `Retry-After: retry_after` if set); `status: 0` or
/// `kind: "drop"` closes the connection without a response; no status at all only adds
/// `latency_ms` (a real delay in the server). Each matching request draws with probability `rate`
/// from a generator seeded by `seed`, the fault's position and the count of matching requests, so
/// the same sequence of requests meets the same faults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpFault {
    /// `"openai"`, `"azure"`, `"anthropic"` or `"any"` (default).
    #[serde(default = "any")]
    pub provider: String,
    /// One of [`FAULT_OPERATIONS`] (default `"any"`).
    #[serde(default = "any")]
    pub operation: String,
    /// HTTP status to answer, or 0 to drop the connection.
    #[serde(default)]
    pub status: Option<u16>,
    /// `"error"` (default when a status is given), `"drop"` or `"latency"`.
    #[serde(default)]
    pub kind: Option<HttpFaultKind>,
    /// Error code (OpenAI `error.code`, Azure `error.code`; for Anthropic, used as `error.type`
    /// when it names one, e.g. `overloaded_error`). Default: the provider's usual code for the
    /// status.
    #[serde(default)]
    pub code: Option<String>,
    /// Error message. Default: the provider's usual message for the status.
    #[serde(default)]
    pub message: Option<String>,
    /// Probability in 0..=1 (default 1).
    #[serde(default = "one")]
    pub rate: f64,
    /// Seconds for the `Retry-After` header.
    #[serde(default)]
    pub retry_after: Option<u64>,
    /// Real delay before answering, in milliseconds.
    #[serde(default)]
    pub latency_ms: u64,
}

fn one() -> f64 {
    1.0
}

/// What an [`HttpFault`] does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HttpFaultKind {
    /// Answer `status` with an error body.
    Error,
    /// Close the connection without answering.
    Drop,
    /// Only delay (`latency_ms`), then serve normally.
    Latency,
    /// Carry the request out, then close the connection without answering: the side effect
    /// happened but the client never learns of it (a lost response after a commit).
    DropAfter,
}

impl HttpFault {
    /// A fault answering `status` on every matching request.
    pub fn status(provider: &str, operation: &str, status: u16) -> Self {
        Self {
            provider: provider.to_owned(),
            operation: operation.to_owned(),
            status: Some(status),
            kind: None,
            code: None,
            message: None,
            rate: 1.0,
            retry_after: None,
            latency_ms: 0,
        }
    }

    /// What this fault does, from `kind` and `status`.
    pub fn effective_kind(&self) -> HttpFaultKind {
        match (self.kind, self.status) {
            (Some(kind), _) => kind,
            (None, Some(0)) => HttpFaultKind::Drop,
            (None, Some(_)) => HttpFaultKind::Error,
            (None, None) => HttpFaultKind::Latency,
        }
    }

    fn validate(&self, i: usize) -> Result<(), SimError> {
        check_rate(&format!("faults[{i}].rate"), self.rate)?;
        check_provider(&format!("faults[{i}].provider"), &self.provider)?;
        if !FAULT_OPERATIONS.contains(&self.operation.as_str()) {
            return bad(format!(
                "faults[{i}].operation must be one of {}; got {:?}",
                FAULT_OPERATIONS.join(", "),
                self.operation
            ));
        }
        match (self.effective_kind(), self.status) {
            (HttpFaultKind::Error, Some(s)) if (400..=599).contains(&s) => Ok(()),
            (HttpFaultKind::Error, s) => {
                bad(format!("faults[{i}].status must be between 400 and 599, got {s:?}"))
            }
            (HttpFaultKind::Drop | HttpFaultKind::DropAfter | HttpFaultKind::Latency, _) => Ok(()),
        }
    }

    pub(crate) fn matches(&self, provider: Provider, operation: &str) -> bool {
        (self.provider == "any" || self.provider == provider.as_str())
            && (self.operation == "any" || self.operation == operation)
    }
}

/// OpenAI limits.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OpenAiConfig {
    /// Overrides the top-level `api_key` for this provider. Never serialized.
    #[serde(skip_serializing)]
    pub api_key: Option<String>,
    /// Enqueued prompt tokens allowed per model (`"*"` applies to models not named). A batch that
    /// would pass the limit fails validation with `token_limit_exceeded`. Default: no limits.
    pub enqueued_token_limits: BTreeMap<String, u64>,
    /// Most requests per batch (default 50,000).
    pub max_requests_per_batch: usize,
    /// Largest batch input file (default 209,715,200 bytes).
    pub max_batch_input_bytes: u64,
    /// Bytes of live files the project may store; an upload past it is refused with `400`
    /// "You have exceeded your file storage quota." (default 2.5 TB: "each project can store
    /// up to 2.5 TB of files in total").
    pub max_storage_bytes: u64,
}

impl Default for OpenAiConfig {
    fn default() -> Self {
        Self {
            api_key: None,
            enqueued_token_limits: BTreeMap::new(),
            max_requests_per_batch: 50_000,
            max_batch_input_bytes: 209_715_200,
            max_storage_bytes: 2_500_000_000_000,
        }
    }
}

impl fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("api_key", &redacted(self.api_key.as_ref()))
            .field("enqueued_token_limits", &self.enqueued_token_limits)
            .field("max_requests_per_batch", &self.max_requests_per_batch)
            .field("max_batch_input_bytes", &self.max_batch_input_bytes)
            .field("max_storage_bytes", &self.max_storage_bytes)
            .finish()
    }
}

/// The `api-version` values the legacy Azure surface accepts by default.
pub const AZURE_API_VERSIONS: [&str; 5] = [
    "2024-10-21",
    "2024-10-01-preview",
    "2025-03-01-preview",
    "2025-04-01-preview",
    "2024-07-01-preview",
];

/// Azure OpenAI limits, quotas and quirks.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AzureConfig {
    /// Overrides the top-level `api_key` for this provider (sent as `api-key` or bearer). Never
    /// serialized.
    #[serde(skip_serializing)]
    pub api_key: Option<String>,
    /// Live batch input files without an expiry allowed per resource (default 500).
    pub max_input_files_without_expiry: u64,
    /// Live batch input files with an expiry allowed per resource (default 10,000).
    pub max_input_files_with_expiry: u64,
    /// Lower bound of `expires_after.seconds` and `output_expires_after.seconds` (default 1,209,600).
    pub min_expiry_seconds: i64,
    /// Upper bound of the same (default 2,592,000).
    pub max_expiry_seconds: i64,
    /// `api-version` values the legacy `/openai/...` surface accepts.
    pub api_versions: Vec<String>,
    /// Known deployment names; a batch naming another fails with `model_not_found`. Empty (the
    /// default) accepts every name.
    pub deployments: Vec<String>,
    /// Enqueued tokens allowed per deployment (`"*"` for all others). Default: no limits.
    pub enqueued_token_limits: BTreeMap<String, u64>,
    /// Whether an over-limit create answers 400 `token_limit_exceeded` at once (Azure's
    /// "fail-fast" regions) instead of a batch that fails validation. Default false.
    pub token_limit_fail_fast: bool,
    /// Whether batches expire after 24 h. Azure's docs say they do not ("we don't expire the jobs
    /// that take longer"), so the default is false.
    pub expire_batches: bool,
    /// The legacy shapes of Azure's REST examples on the `/openai/...?api-version=` surface: ISO
    /// 8601 timestamps, capitalised statuses, null `request_counts` while validating, and result
    /// lines without `id` (on both surfaces). Default false.
    pub legacy_quirks: bool,
    /// Most requests per batch (default 100,000).
    pub max_requests_per_batch: usize,
    /// Largest batch input file (default 209,715,200 bytes).
    pub max_batch_input_bytes: u64,
}

impl Default for AzureConfig {
    fn default() -> Self {
        Self {
            api_key: None,
            max_input_files_without_expiry: 500,
            max_input_files_with_expiry: 10_000,
            min_expiry_seconds: 1_209_600,
            max_expiry_seconds: 2_592_000,
            api_versions: AZURE_API_VERSIONS.iter().map(|v| (*v).to_owned()).collect(),
            deployments: Vec::new(),
            enqueued_token_limits: BTreeMap::new(),
            token_limit_fail_fast: false,
            expire_batches: false,
            legacy_quirks: false,
            max_requests_per_batch: 100_000,
            max_batch_input_bytes: 209_715_200,
        }
    }
}

impl fmt::Debug for AzureConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AzureConfig")
            .field("api_key", &redacted(self.api_key.as_ref()))
            .field("max_input_files_without_expiry", &self.max_input_files_without_expiry)
            .field("max_input_files_with_expiry", &self.max_input_files_with_expiry)
            .field("min_expiry_seconds", &self.min_expiry_seconds)
            .field("max_expiry_seconds", &self.max_expiry_seconds)
            .field("api_versions", &self.api_versions)
            .field("deployments", &self.deployments)
            .field("enqueued_token_limits", &self.enqueued_token_limits)
            .field("token_limit_fail_fast", &self.token_limit_fail_fast)
            .field("expire_batches", &self.expire_batches)
            .field("legacy_quirks", &self.legacy_quirks)
            .field("max_requests_per_batch", &self.max_requests_per_batch)
            .field("max_batch_input_bytes", &self.max_batch_input_bytes)
            .finish()
    }
}

/// Anthropic limits.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AnthropicConfig {
    /// Overrides the top-level `api_key` for this provider (sent as `x-api-key` or bearer). Never
    /// serialized.
    #[serde(skip_serializing)]
    pub api_key: Option<String>,
    /// Most requests per batch (default 100,000).
    pub max_requests_per_batch: usize,
    /// Largest create body; above it the create answers 413 `request_too_large` (default 256 MiB).
    pub max_body_bytes: u64,
    /// How long results stay downloadable after `created_at` (default 29 days).
    pub results_retention_seconds: i64,
    /// Requests allowed in processing across all unfinished batches (the "batch queue" rate
    /// limit); a create that would pass it answers 429 `rate_limit_error`. Default: no limit.
    pub max_queued_requests: Option<u64>,
}

impl Default for AnthropicConfig {
    fn default() -> Self {
        Self {
            api_key: None,
            max_requests_per_batch: 100_000,
            max_body_bytes: 256 * 1024 * 1024,
            results_retention_seconds: 29 * 86_400,
            max_queued_requests: None,
        }
    }
}

impl fmt::Debug for AnthropicConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnthropicConfig")
            .field("api_key", &redacted(self.api_key.as_ref()))
            .field("max_requests_per_batch", &self.max_requests_per_batch)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("results_retention_seconds", &self.results_retention_seconds)
            .field("max_queued_requests", &self.max_queued_requests)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_json_is_the_default() {
        let cfg: SimConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(cfg, SimConfig::default());
        assert_eq!(cfg.seed, 7);
        assert!((cfg.processing.requests_per_second - 1000.0).abs() < f64::EPSILON);
        assert_eq!(cfg.azure.max_input_files_without_expiry, 500);
        assert_eq!(cfg.azure.api_versions.len(), 5);
    }

    #[test]
    fn partial_json_and_fault_defaults() {
        let cfg: SimConfig = serde_json::from_str(
            r#"{"speed":0,"processing":{"validating_seconds":5},"line_faults":[{"kind":"fatal","rate":0.5}]}"#,
        )
        .unwrap();
        assert!((cfg.processing.validating_seconds - 5.0).abs() < f64::EPSILON);
        assert!((cfg.processing.finalizing_seconds - 2.0).abs() < f64::EPSILON);
        assert_eq!(cfg.line_faults[0].provider, "any");
        assert_eq!(cfg.line_faults[0].kind, LineFaultKind::Fatal);
        cfg.validate().unwrap();
    }

    #[test]
    fn the_documented_example_parses() {
        let cfg: SimConfig = serde_json::from_str(
            r#"{"seed": 7, "azure": {"max_input_files_without_expiry": 500, "max_input_files_with_expiry": 10000},
                "processing": {"requests_per_second": 1000},
                "faults": [{"provider": "openai", "operation": "create", "status": 429, "code": "rate_limit_exceeded", "rate": 0.2, "retry_after": 1},
                           {"provider": "anthropic", "operation": "any", "status": 529, "rate": 0.1},
                           {"provider": "azure", "operation": "list", "status": 0, "rate": 0.1},
                           {"operation": "upload", "kind": "latency", "latency_ms": 20}],
                "line_faults": [{"provider": "any", "kind": "fatal", "rate": 0.05},
                                {"provider": "any", "kind": "retryable", "rate": 0.05},
                                {"provider": "any", "kind": "invalid_json", "rate": 0.05},
                                {"provider": "any", "kind": "schema_violation", "rate": 0.05}]}"#,
        )
        .unwrap();
        cfg.validate().unwrap();
        assert_eq!(cfg.faults[0].effective_kind(), HttpFaultKind::Error);
        assert_eq!(cfg.faults[2].effective_kind(), HttpFaultKind::Drop);
        assert_eq!(cfg.faults[3].effective_kind(), HttpFaultKind::Latency);
        assert!((cfg.faults[1].rate - 0.1).abs() < f64::EPSILON);
        assert_eq!(cfg.line_faults[3].kind, LineFaultKind::SchemaViolation);
    }

    #[test]
    fn unknown_fields_and_bad_ranges_are_rejected() {
        assert!(serde_json::from_str::<SimConfig>(r#"{"sped":1}"#).is_err());
        assert!(serde_json::from_str::<SimConfig>(r#"{"azure":{"quota":1}}"#).is_err());
        let mut cfg = SimConfig::default();
        cfg.line_faults.push(LineFault {
            provider: "any".into(),
            kind: LineFaultKind::Retryable,
            rate: 1.5,
        });
        assert!(cfg.validate().is_err());
        assert!((cfg.sanitized().line_faults[0].rate - 1.0).abs() < f64::EPSILON);
        let cfg = SimConfig { speed: -1.0, ..SimConfig::default() };
        assert!(cfg.validate().is_err());
        for fault in [
            HttpFault::status("nobody", "any", 500),
            HttpFault::status("any", "explode", 500),
            HttpFault::status("any", "any", 200),
        ] {
            let cfg = SimConfig { faults: vec![fault], ..SimConfig::default() };
            assert!(cfg.validate().is_err());
            assert!(cfg.sanitized().faults.is_empty());
        }
    }

    #[test]
    fn api_keys_are_never_printed_or_serialized() {
        let mut cfg = SimConfig { api_key: Some("sk-secret".into()), ..SimConfig::default() };
        cfg.azure.api_key = Some("az-secret".into());
        cfg.anthropic.api_key = Some("ant-secret".into());
        cfg.openai.api_key = Some("oa-secret".into());
        let printed = format!("{cfg:?}");
        let json = serde_json::to_string(&cfg).unwrap();
        for secret in ["sk-secret", "az-secret", "ant-secret", "oa-secret"] {
            assert!(!printed.contains(secret));
            assert!(!json.contains(secret));
        }
        assert_eq!(cfg.key_for(Provider::Azure), Some("az-secret"));
        cfg.azure.api_key = None;
        assert_eq!(cfg.key_for(Provider::Azure), Some("sk-secret"));
    }
}
