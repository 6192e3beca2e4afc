//! Counters and the request ledger: what the simulator stored and what it would have billed.
//!
//! "Billed" means a line the simulator actually ran successfully (answers spoiled by an
//! `invalid_json` or `schema_violation` fault included: the provider ran them); faulted, invalid,
//! expired and cancelled lines cost nothing, as with the real providers (Anthropic: `errored`,
//! `canceled` and `expired` results are not billed).

use serde::{Deserialize, Serialize};

use crate::state::Provider;

/// Counters of one provider surface (or their sum).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderStats {
    /// Files uploaded by clients (batch output and error files are not counted).
    pub files_uploaded: u64,
    /// Files deleted by clients.
    pub files_deleted: u64,
    /// Files currently stored: not deleted and not expired, output and error files included.
    pub files_live: u64,
    pub batches_created: u64,
    /// Lines run successfully.
    pub requests_billed: u64,
    /// Input plus output tokens of the billed lines (input with cache reads and writes).
    pub tokens_billed: u64,
}

impl ProviderStats {
    fn add(&mut self, other: &Self) {
        self.files_uploaded += other.files_uploaded;
        self.files_deleted += other.files_deleted;
        self.files_live += other.files_live;
        self.batches_created += other.batches_created;
        self.requests_billed += other.requests_billed;
        self.tokens_billed += other.tokens_billed;
    }
}

/// The counters split by provider surface.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ByProvider {
    pub openai: ProviderStats,
    pub azure: ProviderStats,
    pub anthropic: ProviderStats,
}

impl ByProvider {
    pub(crate) fn get_mut(&mut self, provider: Provider) -> &mut ProviderStats {
        match provider {
            Provider::OpenAi => &mut self.openai,
            Provider::Azure => &mut self.azure,
            Provider::Anthropic => &mut self.anthropic,
        }
    }
}

/// One file a client uploaded, as `GET /sim/uploads` lists it (deleted files included), so
/// that a test can tell whether a client uploaded one input twice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadEntry {
    pub provider: String,
    pub file_id: String,
    pub filename: String,
    pub purpose: String,
    pub created_at: i64,
}

/// Body of `GET /sim/stats`: totals over all providers, then the split.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimStats {
    pub files_uploaded: u64,
    pub files_deleted: u64,
    pub files_live: u64,
    pub batches_created: u64,
    pub requests_billed: u64,
    pub tokens_billed: u64,
    pub by_provider: ByProvider,
}

impl SimStats {
    pub(crate) fn from_split(by_provider: ByProvider) -> Self {
        let mut total = ProviderStats::default();
        for p in [&by_provider.openai, &by_provider.azure, &by_provider.anthropic] {
            total.add(p);
        }
        Self {
            files_uploaded: total.files_uploaded,
            files_deleted: total.files_deleted,
            files_live: total.files_live,
            batches_created: total.batches_created,
            requests_billed: total.requests_billed,
            tokens_billed: total.tokens_billed,
            by_provider,
        }
    }
}

/// How a line the simulator ran ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LedgerOutcome {
    /// Ran and answered; billed.
    Succeeded,
    /// Injected non-retryable fault (HTTP 400); not billed.
    FailedFatal,
    /// Injected retryable fault (HTTP 500); not billed.
    FailedRetryable,
    /// The request body was unusable for its endpoint (HTTP 400; Anthropic `errored`
    /// `invalid_request_error`); not billed.
    FailedInvalid,
    /// Ran and answered with text that is not valid JSON (an injected fault); billed.
    InvalidJson,
    /// Ran and answered with JSON that violates the requested schema (an injected fault); billed.
    SchemaViolation,
}

impl LedgerOutcome {
    /// Whether the request was billed.
    pub fn billed(self) -> bool {
        matches!(self, Self::Succeeded | Self::InvalidJson | Self::SchemaViolation)
    }
}

/// One request the simulator ran (one line of `GET /sim/ledger`). Lines that never ran (expired,
/// cancelled) have no entry. Token counts are 0 when the request was not billed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerEntry {
    /// `"openai"`, `"azure"` or `"anthropic"`.
    pub provider: String,
    pub batch_id: String,
    pub custom_id: String,
    pub outcome: LedgerOutcome,
    /// The model the response names (for a line without a response, the model the request
    /// names, or empty).
    #[serde(default)]
    pub model: String,
    /// Every billed input token: uncached, read from the prompt cache, and written to it.
    pub input_tokens: u64,
    /// The part of `input_tokens` read from the prompt cache.
    #[serde(default)]
    pub cached_tokens: u64,
    /// The part of `input_tokens` written to a 5-minute cache entry (Anthropic).
    #[serde(default)]
    pub cache_write_5m_tokens: u64,
    /// The part of `input_tokens` written to a 1-hour cache entry (Anthropic).
    #[serde(default)]
    pub cache_write_1h_tokens: u64,
    /// Billed output tokens.
    pub output_tokens: u64,
    /// The part of `output_tokens` spent reasoning.
    #[serde(default)]
    pub reasoning_tokens: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_sum_the_split() {
        let mut split = ByProvider::default();
        split.get_mut(Provider::OpenAi).files_uploaded = 2;
        split.get_mut(Provider::Anthropic).files_uploaded = 3;
        split.get_mut(Provider::Azure).tokens_billed = 10;
        let stats = SimStats::from_split(split);
        assert_eq!(stats.files_uploaded, 5);
        assert_eq!(stats.tokens_billed, 10);
        let json = serde_json::to_value(stats).unwrap();
        assert_eq!(json["by_provider"]["anthropic"]["files_uploaded"], 3);
    }

    #[test]
    fn outcome_wire_names() {
        assert_eq!(
            serde_json::to_string(&LedgerOutcome::FailedRetryable).unwrap(),
            "\"failed_retryable\""
        );
    }
}
