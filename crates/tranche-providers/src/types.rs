//! Provider-neutral values of the batch lifecycle: file and batch ids, batch objects and result lines.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tranche_core::{Endpoint, ProviderKind, TokenUsage, TrancheId};

use crate::body::{Body, Members};

macro_rules! string_id {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            pub fn new(id: impl Into<String>) -> Self {
                Self(id.into())
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }

            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

string_id!(
    /// A provider's id for a file (`file-abc123`).
    FileId
);
string_id!(
    /// A provider's id for a batch (`batch_abc123`, `msgbatch_...`).
    BatchId
);

/// A file the provider accepted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadedFile {
    pub id: FileId,
    pub bytes: u64,
    pub filename: String,
    /// Unix seconds.
    pub created_at: i64,
    /// Unix seconds; `None` when the provider keeps the file until it is deleted.
    pub expires_at: Option<i64>,
}

/// A file the account holds, as the provider lists it (any purpose, whoever uploaded it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteFile {
    pub id: FileId,
    /// The name it was uploaded under; empty when the provider gives none.
    pub filename: String,
    /// `batch`, `batch_output`, `fine-tune`, ...; empty when the provider gives none.
    pub purpose: String,
    pub bytes: u64,
    /// Unix seconds.
    pub created_at: i64,
    /// Unix seconds; `None` when the file is kept until it is deleted.
    pub expires_at: Option<i64>,
}

/// One page of a file listing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilePage {
    pub data: Vec<RemoteFile>,
    pub has_more: bool,
    /// The cursor for the next page (`after`).
    pub last_id: Option<FileId>,
}

/// Where a provider batch is in its life (OpenAI's eight statuses; other providers map onto them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchStatus {
    Validating,
    InProgress,
    Finalizing,
    Completed,
    Failed,
    Expired,
    Cancelling,
    Cancelled,
}

impl BatchStatus {
    /// Completed, failed, expired and cancelled batches never change again.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Expired | Self::Cancelled)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Validating => "validating",
            Self::InProgress => "in_progress",
            Self::Finalizing => "finalizing",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Expired => "expired",
            Self::Cancelling => "cancelling",
            Self::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for BatchStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A batch-level error (for example why validation failed), as the provider reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchErrorEntry {
    pub code: Option<String>,
    pub message: String,
    /// 1-based line of the input file, when the error is about one line.
    pub line: Option<u64>,
    pub param: Option<String>,
}

/// How many requests of a batch are done.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RequestCounts {
    pub total: u64,
    pub completed: u64,
    pub failed: u64,
}

/// A batch as the provider currently sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteBatch {
    pub id: BatchId,
    pub status: BatchStatus,
    pub endpoint: Option<String>,
    pub input_file_id: Option<FileId>,
    /// `None` until there is an output file (an empty id on the wire also reads as `None`).
    pub output_file_id: Option<FileId>,
    pub error_file_id: Option<FileId>,
    pub request_counts: RequestCounts,
    pub errors: Vec<BatchErrorEntry>,
    pub metadata: BTreeMap<String, String>,
    /// Unix seconds.
    pub created_at: i64,
    pub expires_at: Option<i64>,
    /// Where the results can be fetched, for providers that serve them from a URL rather than
    /// as files (Anthropic's `results_url`).
    #[serde(default)]
    pub results_url: Option<String>,
}

impl RemoteBatch {
    /// The tranche this batch was created for, from its `tranche_id` metadata.
    pub fn tranche_id(&self) -> Option<TrancheId> {
        self.metadata.get(crate::TRANCHE_ID_METADATA_KEY)?.parse().ok()
    }
}

/// One page of a batch listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchPage {
    pub data: Vec<RemoteBatch>,
    pub has_more: bool,
    /// The cursor for the next page (`after`).
    pub last_id: Option<BatchId>,
}

/// A page of batches as both wire formats list them (`data`, `has_more`, `last_id`).
#[derive(Debug, Deserialize)]
pub(crate) struct WirePage<T> {
    #[serde(default = "Vec::new")]
    data: Vec<T>,
    #[serde(default)]
    has_more: Option<bool>,
    #[serde(default)]
    last_id: Option<String>,
}

impl<T: Into<RemoteBatch>> WirePage<T> {
    /// The page, with the last batch's id as the cursor when the provider sent none.
    pub(crate) fn into_page(self) -> BatchPage {
        let data: Vec<RemoteBatch> = self.data.into_iter().map(Into::into).collect();
        let last_id = self
            .last_id
            .filter(|id| !id.is_empty())
            .map(BatchId::new)
            .or_else(|| data.last().map(|batch| batch.id.clone()));
        BatchPage { data, has_more: self.has_more.unwrap_or(false), last_id }
    }
}

/// How a provider takes a batch's requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputTransport {
    /// Upload a JSONL file first, then create the batch from its id (OpenAI, Azure).
    UploadFile,
    /// Send the requests inside the create call (Anthropic).
    Inline,
}

/// A batch's input, as its provider's transport wants it.
#[derive(Debug)]
pub enum BatchInput<'a> {
    /// An uploaded file.
    File(&'a FileId),
    /// The input lines themselves (as `tranche_core::codec::write_input_line` writes them),
    /// sent in the create call.
    Inline(crate::streams::InlineInput),
}

/// What to create a batch from.
#[derive(Debug)]
pub struct CreateBatch<'a> {
    pub tranche_id: TrancheId,
    pub input: BatchInput<'a>,
    pub endpoint: Endpoint,
}

/// One line of a provider's output or error file, normalised.
#[derive(Debug, Clone)]
pub struct ResultLine {
    /// The `custom_id` tranche sent (its wire id, not the user's custom id).
    pub wire_id: String,
    pub outcome: LineOutcome,
}

/// How one request in a batch ended.
#[derive(Debug, Clone)]
pub enum LineOutcome {
    Succeeded {
        status_code: u16,
        request_id: Option<String>,
        /// Where the response body stands in the line that was parsed, exactly as the
        /// provider sent it: kept by reference, never copied.
        body: Range<usize>,
        /// The tokens the response reports using.
        usage: Usage,
    },
    Failed(LineError),
}

/// What a response reports it was billed for: the model that answered and its tokens by kind,
/// normalised to [`TokenUsage`] (every input token in `input`, cache reads and writes its parts).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    /// The model the response names (for Azure, the model behind the deployment).
    pub model: Option<String>,
    /// `None` when the response reports no usage.
    pub tokens: Option<TokenUsage>,
}

/// A response body's `model` and `usage`, as either provider family spells them: OpenAI's
/// `prompt_tokens`/`completion_tokens` (chat, completions, embeddings) or
/// `input_tokens`/`output_tokens` (Responses, Anthropic), with their details.
#[derive(Deserialize)]
struct WireBilled {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default, alias = "prompt_tokens")]
    input_tokens: Option<u64>,
    #[serde(default, alias = "completion_tokens")]
    output_tokens: Option<u64>,
    #[serde(default, alias = "input_tokens_details")]
    prompt_tokens_details: Option<InputDetails>,
    #[serde(default, alias = "output_tokens_details")]
    completion_tokens_details: Option<OutputDetails>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    cache_creation: Option<CacheCreation>,
}

#[derive(Deserialize)]
struct InputDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct OutputDetails {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct CacheCreation {
    #[serde(default)]
    ephemeral_5m_input_tokens: Option<u64>,
    #[serde(default)]
    ephemeral_1h_input_tokens: Option<u64>,
}

impl Usage {
    /// The usage an OpenAI-shaped response body reports (OpenAI and Azure): `prompt_tokens`
    /// (or `input_tokens`) already counts the cached part, `cached_tokens`. Everything else in
    /// the body is skipped, not built.
    pub(crate) fn openai(body: Body<'_>) -> Self {
        Self::read(body, |u| {
            let input = u.input_tokens.unwrap_or(0);
            TokenUsage {
                input,
                cached_input: u
                    .prompt_tokens_details
                    .and_then(|d| d.cached_tokens)
                    .unwrap_or(0)
                    .min(input),
                output: u.output_tokens.unwrap_or(0),
                reasoning: u
                    .completion_tokens_details
                    .and_then(|d| d.reasoning_tokens)
                    .unwrap_or(0),
                ..TokenUsage::default()
            }
        })
    }

    /// The usage an Anthropic message reports: `input_tokens` counts only what follows the
    /// last cache breakpoint, so cache reads and writes are added to it. Writes are split by
    /// lifetime where `cache_creation` gives the split, and counted as 5-minute writes (the
    /// default lifetime) where it does not.
    pub(crate) fn anthropic(message: Body<'_>) -> Self {
        Self::read(message, |u| {
            let read = u.cache_read_input_tokens.unwrap_or(0);
            let written = u.cache_creation_input_tokens.unwrap_or(0);
            let (write_5m, write_1h) = match u.cache_creation {
                Some(c) => {
                    let one_hour = c.ephemeral_1h_input_tokens.unwrap_or(0);
                    (
                        c.ephemeral_5m_input_tokens.unwrap_or(written.saturating_sub(one_hour)),
                        one_hour,
                    )
                }
                None => (written, 0),
            };
            TokenUsage {
                input: u.input_tokens.unwrap_or(0) + read + write_5m + write_1h,
                cached_input: read,
                cache_write_5m: write_5m,
                cache_write_1h: write_1h,
                output: u.output_tokens.unwrap_or(0),
                reasoning: 0,
            }
        })
    }

    fn read(body: Body<'_>, tokens: impl FnOnce(WireUsage) -> TokenUsage) -> Self {
        let strict = match body.members {
            Some(members) => WireBilled::of_members(members),
            None => serde_json::from_str::<WireBilled>(body.text),
        };
        let billed = strict.or_else(|_| WireBilled::lenient(body.text));
        match billed {
            Ok(b) => Self { model: b.model, tokens: b.usage.map(tokens) },
            Err(_) => Self::default(),
        }
    }
}

impl WireBilled {
    /// The strict read of a body whose members were read with its line: what reading the
    /// whole body as this type gives, from those two members alone.
    fn of_members(members: Members<'_>) -> Result<Self, serde_json::Error> {
        fn member<T: serde::de::DeserializeOwned>(
            raw: Option<&RawValue>,
        ) -> Result<Option<T>, serde_json::Error> {
            Ok(raw.map(|raw| serde_json::from_str::<Option<T>>(raw.get())).transpose()?.flatten())
        }
        Ok(Self { model: member(members.model)?, usage: member(members.usage)? })
    }

    /// The same read of a body the strict one refused (counts given as decimals, `prompt_tokens`
    /// beside `input_tokens`, a detail of another shape): every count that is a number is
    /// taken, so that an odd usage is still billed rather than lost.
    fn lenient(body: &str) -> Result<Self, serde_json::Error> {
        let body: serde_json::Value = serde_json::from_str(body)?;
        let model = body.get("model").and_then(|m| m.as_str()).map(str::to_owned);
        let usage = body.get("usage").filter(|u| u.is_object()).map(|u| {
            let n = |v: Option<&serde_json::Value>| {
                v.and_then(|x| x.as_u64().or_else(|| x.as_f64().map(|f| f.max(0.0).round() as u64)))
            };
            let at = |keys: &[&str]| keys.iter().find_map(|k| n(u.get(*k)));
            let detail = |parents: &[&str], key: &str| {
                parents.iter().find_map(|p| n(u.get(*p).and_then(|d| d.get(key))))
            };
            WireUsage {
                input_tokens: at(&["prompt_tokens", "input_tokens"]),
                output_tokens: at(&["completion_tokens", "output_tokens"]),
                prompt_tokens_details: Some(InputDetails {
                    cached_tokens: detail(
                        &["prompt_tokens_details", "input_tokens_details"],
                        "cached_tokens",
                    ),
                }),
                completion_tokens_details: Some(OutputDetails {
                    reasoning_tokens: detail(
                        &["completion_tokens_details", "output_tokens_details"],
                        "reasoning_tokens",
                    ),
                }),
                cache_creation_input_tokens: at(&["cache_creation_input_tokens"]),
                cache_read_input_tokens: at(&["cache_read_input_tokens"]),
                cache_creation: u.get("cache_creation").map(|c| CacheCreation {
                    ephemeral_5m_input_tokens: n(c.get("ephemeral_5m_input_tokens")),
                    ephemeral_1h_input_tokens: n(c.get("ephemeral_1h_input_tokens")),
                }),
            }
        });
        Ok(Self { model, usage })
    }
}

/// The byte range of `part` (a slice of `line`) within `line`.
pub(crate) fn range_within(line: &str, part: &str) -> Range<usize> {
    let start = (part.as_ptr() as usize).saturating_sub(line.as_ptr() as usize);
    start..start + part.len()
}

/// A per-line failure, with the same facts as `UpstreamError`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineError {
    pub provider: ProviderKind,
    /// The request's HTTP status; `None` when the request was never run (expired, cancelled).
    pub status: Option<u16>,
    pub error_type: Option<String>,
    pub code: Option<String>,
    pub message: String,
    pub param: Option<String>,
    pub request_id: Option<String>,
    /// Whether sending the same request again can succeed.
    pub retryable: bool,
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.provider)?;
        match (self.status, &self.error_type) {
            (Some(status), _) => write!(f, " returned {status}")?,
            (None, Some(_)) => f.write_str(" reported")?,
            (None, None) => f.write_str(" did not run the request")?,
        }
        match (&self.error_type, &self.code) {
            (Some(t), Some(c)) => write!(f, " {t}/{c}")?,
            (Some(x), None) | (None, Some(x)) => write!(f, " {x}")?,
            (None, None) => {}
        }
        write!(f, ": {}", self.message)?;
        if let Some(param) = &self.param {
            write!(f, " (param {param})")?;
        }
        if let Some(request_id) = &self.request_id {
            write!(f, " (request id {request_id})")?;
        }
        Ok(())
    }
}

impl std::error::Error for LineError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_transparent_strings() {
        let id = FileId::new("file-abc");
        assert_eq!(serde_json::to_string(&id).unwrap(), r#""file-abc""#);
        assert_eq!(serde_json::from_str::<BatchId>(r#""batch_1""#).unwrap().as_str(), "batch_1");
        assert_eq!(id.to_string(), "file-abc");
    }

    #[test]
    fn status_terminality_and_names() {
        let all = [
            BatchStatus::Validating,
            BatchStatus::InProgress,
            BatchStatus::Finalizing,
            BatchStatus::Completed,
            BatchStatus::Failed,
            BatchStatus::Expired,
            BatchStatus::Cancelling,
            BatchStatus::Cancelled,
        ];
        for status in all {
            let json = serde_json::to_string(&status).unwrap();
            assert_eq!(json, format!("\"{}\"", status.as_str()));
        }
        let terminal: Vec<_> = all.into_iter().filter(|s| s.is_terminal()).collect();
        assert_eq!(
            terminal,
            [
                BatchStatus::Completed,
                BatchStatus::Failed,
                BatchStatus::Expired,
                BatchStatus::Cancelled
            ]
        );
    }

    #[test]
    fn line_error_display() {
        let err = LineError {
            provider: ProviderKind::Openai,
            status: Some(400),
            error_type: Some("invalid_request_error".into()),
            code: Some("context_length_exceeded".into()),
            message: "too long".into(),
            param: Some("messages".into()),
            request_id: Some("req_1".into()),
            retryable: false,
        };
        assert_eq!(
            err.to_string(),
            "openai returned 400 invalid_request_error/context_length_exceeded: too long (param messages) (request id req_1)"
        );
        let errored = LineError {
            provider: ProviderKind::Anthropic,
            status: None,
            error_type: Some("invalid_request_error".into()),
            code: None,
            message: "prompt is too long".into(),
            param: None,
            request_id: Some("req_2".into()),
            retryable: false,
        };
        assert_eq!(
            errored.to_string(),
            "anthropic reported invalid_request_error: prompt is too long (request id req_2)"
        );
        let expired = LineError {
            provider: ProviderKind::Anthropic,
            status: None,
            error_type: None,
            code: Some("batch_expired".into()),
            message: "the batch expired first".into(),
            param: None,
            request_id: None,
            retryable: true,
        };
        assert_eq!(
            expired.to_string(),
            "anthropic did not run the request batch_expired: the batch expired first"
        );
    }
}
