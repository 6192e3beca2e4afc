//! Run-time configuration of a simulator: seed, clock speed, auth, processing pace and line faults.
//!
//! Every struct deserializes with defaults for missing fields, so `{}` is a valid config, and unknown
//! fields are rejected so that a typo in a test or in `POST /sim/config` does not pass silently.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::SimError;
use crate::state::Provider;

/// OpenAI's per-file upload limit: "Individual files can be up to 512 MB".
pub const DEFAULT_MAX_FILE_BYTES: u64 = 512 * 1024 * 1024;

/// The whole configuration of one simulator instance.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SimConfig {
    /// Seeds output order and line faults. Default 7.
    pub seed: u64,
    /// Virtual seconds per wall second (0 freezes the clock). Default 1.0.
    pub speed: f64,
    /// If set, the bearer token must equal it (else 401); if unset, any non-empty bearer token is
    /// accepted. A missing token is always 401. Never serialized, never printed.
    #[serde(skip_serializing)]
    pub api_key: Option<String>,
    /// How fast batches move through their states.
    pub processing: ProcessingConfig,
    /// Per-line failures injected while a batch runs.
    pub line_faults: Vec<LineFault>,
    /// Largest accepted upload, in bytes (`400 File is too large.` above it). Default 512 MiB.
    pub max_file_bytes: u64,
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
        }
    }
}

impl fmt::Debug for SimConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimConfig")
            .field("seed", &self.seed)
            .field("speed", &self.speed)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("processing", &self.processing)
            .field("line_faults", &self.line_faults)
            .field("max_file_bytes", &self.max_file_bytes)
            .finish()
    }
}

impl SimConfig {
    /// Checks ranges: speed ≥ 0, requests_per_second > 0, phase durations ≥ 0, fault rates in 0..=1,
    /// fault providers known.
    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |msg: String| Err(SimError::InvalidConfig(msg));
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
            if !(fault.rate.is_finite() && (0.0..=1.0).contains(&fault.rate)) {
                return bad(format!(
                    "line_faults[{i}].rate must be between 0 and 1, got {}",
                    fault.rate
                ));
            }
            if fault.provider != "any" && Provider::parse(&fault.provider).is_none() {
                return bad(format!(
                    "line_faults[{i}].provider must be one of any, openai, azure, anthropic; got {:?}",
                    fault.provider
                ));
            }
        }
        Ok(())
    }

    /// The same config with out-of-range numbers replaced by defaults (for [`crate::SimHandle::set_config`],
    /// which cannot fail).
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
        for fault in &mut self.line_faults {
            fault.rate = if fault.rate.is_finite() { fault.rate.clamp(0.0, 1.0) } else { 0.0 };
        }
        self
    }
}

/// Pace of the batch life cycle, in virtual seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProcessingConfig {
    /// Lines executed per virtual second while `in_progress`. Default 1000.
    pub requests_per_second: f64,
    /// Time spent in `validating`. Default 2.
    pub validating_seconds: f64,
    /// Time spent in `finalizing` (and in `cancelling`). Default 2.
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
    #[serde(default = "any_provider")]
    pub provider: String,
    pub kind: LineFaultKind,
    /// Probability in 0..=1.
    pub rate: f64,
}

fn any_provider() -> String {
    "any".to_owned()
}

impl LineFault {
    pub(crate) fn applies_to(&self, provider: Provider) -> bool {
        self.provider == "any" || self.provider == provider.as_str()
    }
}

/// What a faulted line looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LineFaultKind {
    /// A non-retryable request error (400 `context_length_exceeded`). Sticky: the same custom_id
    /// fails the same way on every attempt.
    Fatal,
    /// A transient server error (500 `server_error`). Drawn afresh on each attempt of a custom_id.
    Retryable,
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
    fn unknown_fields_and_bad_ranges_are_rejected() {
        assert!(serde_json::from_str::<SimConfig>(r#"{"sped":1}"#).is_err());
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
    }

    #[test]
    fn api_key_is_never_printed_or_serialized() {
        let cfg = SimConfig { api_key: Some("sk-secret".into()), ..SimConfig::default() };
        assert!(!format!("{cfg:?}").contains("sk-secret"));
        assert!(!serde_json::to_string(&cfg).unwrap().contains("sk-secret"));
    }
}
