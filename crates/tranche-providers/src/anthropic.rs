//! The Anthropic adapter: Message Batches at `https://api.anthropic.com/v1/messages/batches` with
//! `x-api-key` and `anthropic-version: 2023-06-01`. Requests travel inline in the create call
//! (streamed from the engine's local JSONL file); results stream from the batch's `results_url`.
//! Anthropic has no files, so the file operations answer `Unsupported`.

use std::fmt;

use reqwest::header::{ACCEPT, CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use reqwest::{Method, RequestBuilder, Url};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use tokio::io::{AsyncBufReadExt, BufReader};
use tranche_core::{Endpoint, ProviderKind, TrancheId};

use crate::body::{Body, BodyParts, read_line};
use crate::error::{
    ConfigError, ErrorKind, LineParseError, UpstreamError, error_type_is_retryable,
};
use crate::http::{self, RetryPolicy, account_of};
use crate::oai;
use crate::provider::Provider;
use crate::streams::{Download, UploadBody, trim_line_end};
use crate::time::{opt_timestamp, timestamp};
use crate::types::{
    BatchId, BatchInput, BatchPage, BatchStatus, CreateBatch, FileId, InputTransport, LineError,
    LineOutcome, RemoteBatch, RequestCounts, ResultLine, UploadedFile,
};
use crate::types::{Usage, WirePage, range_within};

const PROVIDER: ProviderKind = ProviderKind::Anthropic;

/// Most requests in one Message Batch.
pub const MAX_REQUESTS_PER_BATCH: usize = 100_000;

/// Largest create body ("256 MB"; above it Anthropic answers 413 `request_too_large`).
pub const MAX_BODY_BYTES: u64 = 256 * 1024 * 1024;

/// The create body around the requests: `{"requests":[` ... `]}`.
const BODY_PREFIX: &[u8] = b"{\"requests\":[";
const BODY_SUFFIX: &[u8] = b"]}";

/// How much of the create body is read from disk before it is handed to the connection.
const BODY_CHUNK: usize = 64 * 1024;

/// How to reach Anthropic. `Debug` never shows the key.
#[derive(Debug, Clone)]
pub struct AnthropicConfig {
    /// Default `https://api.anthropic.com` (paths start at `/v1/...`).
    pub base_url: String,
    pub api_key: SecretString,
    /// Sent as `anthropic-beta` on every call (it applies to the whole batch).
    pub beta: Option<String>,
}

impl AnthropicConfig {
    pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
    /// The `anthropic-version` header value.
    pub const API_VERSION: &str = "2023-06-01";

    /// The defaults, with this key.
    pub fn new(api_key: SecretString) -> Self {
        Self { base_url: Self::DEFAULT_BASE_URL.to_owned(), api_key, beta: None }
    }

    /// Reads `ANTHROPIC_API_KEY` (required) and `ANTHROPIC_BASE_URL`; `base_url_override` wins.
    pub fn from_env(base_url_override: Option<String>) -> Result<Self, ConfigError> {
        Self::from_lookup(base_url_override, |name| std::env::var(name).ok())
    }

    fn from_lookup(
        base_url_override: Option<String>,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let (key, base_url) = oai::key_and_base_url(
            PROVIDER,
            "ANTHROPIC_API_KEY",
            "ANTHROPIC_BASE_URL",
            base_url_override,
            lookup,
        )?;
        let mut config = Self::new(key);
        if let Some(url) = base_url {
            config.base_url = url;
        }
        config.validate()?;
        Ok(config)
    }

    /// Checks the base URL, the key and the beta header.
    pub fn validate(&self) -> Result<(), ConfigError> {
        oai::parse_base_url(&self.base_url)?;
        let key = self.api_key.expose_secret();
        if key.trim().is_empty() {
            return Err(ConfigError::EmptyApiKey { provider: PROVIDER });
        }
        if HeaderValue::from_str(key).is_err() {
            return Err(ConfigError::InvalidApiKey { provider: PROVIDER });
        }
        if let Some(beta) = &self.beta
            && (beta.trim().is_empty() || HeaderValue::from_str(beta).is_err())
        {
            return Err(ConfigError::InvalidHeader { name: "anthropic-beta" });
        }
        Ok(())
    }
}

/// The Anthropic Message Batches adapter.
#[derive(Clone)]
pub struct AnthropicProvider {
    http: reqwest::Client,
    base_url: Url,
    api_key: SecretString,
    beta: Option<String>,
    retry: RetryPolicy,
}

impl fmt::Debug for AnthropicProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnthropicProvider")
            .field("base_url", &self.base_url.as_str())
            .field("api_key", &"[REDACTED]")
            .field("beta", &self.beta)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

impl AnthropicProvider {
    /// An adapter using the shared `http` client (see `http_client`).
    pub fn new(config: AnthropicConfig, http: reqwest::Client) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self {
            http,
            base_url: oai::parse_base_url(&config.base_url)?,
            api_key: config.api_key,
            beta: config.beta,
            retry: RetryPolicy::default(),
        })
    }

    /// Replaces the retry policy for reads and deletes (default: 5 attempts, at most 30 s apart).
    pub fn with_retry_policy(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    pub fn base_url(&self) -> &str {
        self.base_url.as_str()
    }

    /// `base/v1/messages/batches/segments...`.
    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base_url.clone();
        // `new` checked that the base URL can take path segments.
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(["v1", "messages", "batches"]).extend(segments);
        }
        url
    }

    fn request(&self, method: Method, url: Url) -> RequestBuilder {
        let mut request = self
            .http
            .request(method, url)
            .header("anthropic-version", AnthropicConfig::API_VERSION);
        if let Ok(mut key) = HeaderValue::from_str(self.api_key.expose_secret()) {
            key.set_sensitive(true);
            request = request.header("x-api-key", key);
        }
        if let Some(beta) = &self.beta {
            request = request.header("anthropic-beta", beta);
        }
        request
    }

    /// Removes the key from any text the provider echoed back (invariant 8).
    fn redact(&self, err: UpstreamError) -> UpstreamError {
        err.redact(self.api_key.expose_secret())
    }

    /// A bodiless JSON call: sent once, or retried per the policy when `retry`.
    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        url: Url,
        retry: bool,
    ) -> Result<T, UpstreamError> {
        let path = url.path().to_owned();
        let result = http::call_json(PROVIDER, &self.retry, retry, &method, &path, || {
            self.request(method.clone(), url.clone())
        })
        .await;
        result.map_err(|err| self.redact(err))
    }

    /// Where to fetch a batch's results. A relative URL is taken under the configured base URL;
    /// an absolute one on another origin is fetched by its path through the configured base URL,
    /// so the key only ever goes where the configuration points. `Err` says why it is unusable.
    fn resolve_results_url(&self, raw: &str) -> Result<Url, String> {
        let raw = raw.trim();
        if raw.starts_with('/') {
            let (path, query) = match raw.split_once('?') {
                Some((path, query)) => (path, Some(query)),
                None => (raw, None),
            };
            return Ok(self.rebase(path, query));
        }
        let url = Url::parse(raw).map_err(|err| err.to_string())?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err("the scheme must be http or https".to_owned());
        }
        if url.origin() == self.base_url.origin() {
            return Ok(url);
        }
        tracing::debug!(
            base_url = %self.base_url,
            "results_url is on another origin; fetching its path through the configured base URL"
        );
        Ok(self.rebase(url.path(), url.query()))
    }

    /// `path` (and `query`) under the configured base URL, whose own path prefix is kept.
    fn rebase(&self, path: &str, query: Option<&str>) -> Url {
        let mut url = self.base_url.clone();
        let prefix = url.path().trim_end_matches('/').to_owned();
        let full = if prefix.is_empty() || path.starts_with(&format!("{prefix}/")) {
            path.to_owned()
        } else {
            format!("{prefix}{path}")
        };
        url.set_path(&full);
        url.set_query(query);
        url
    }

    fn unsupported(what: &str) -> UpstreamError {
        UpstreamError::new(PROVIDER, ErrorKind::Unsupported, what.to_owned())
    }
}

#[async_trait::async_trait]
impl Provider for AnthropicProvider {
    fn kind(&self) -> ProviderKind {
        PROVIDER
    }

    fn account(&self) -> tranche_core::AccountId {
        account_of(PROVIDER, &self.base_url)
    }

    fn has_batch_metadata(&self) -> bool {
        false
    }

    fn transport(&self) -> InputTransport {
        InputTransport::Inline
    }

    /// `{"custom_id": wire_id, "params": body}` and a newline; the endpoint is always Messages.
    async fn upload_batch_file(
        &self,
        _tranche: TrancheId,
        _body: UploadBody,
    ) -> Result<UploadedFile, UpstreamError> {
        Err(Self::unsupported("Message Batches carry their requests inline; there are no files"))
    }

    /// Streams the inline input file into `{"requests":[<line>,<line>,...]}` (each line's bytes
    /// as they are, never parsed), with an exact `Content-Length`. Never retried.
    async fn create_batch(&self, req: CreateBatch<'_>) -> Result<RemoteBatch, UpstreamError> {
        let BatchInput::Inline(input) = req.input else {
            return Err(Self::unsupported(
                "Message Batches carry their requests inline, not in an uploaded file",
            ));
        };
        let (lines, bytes) = (input.count, input.line_bytes);
        let length = create_body_length(lines, bytes);
        let body = reqwest::Body::wrap_stream(create_body_stream(input.lines.into_reader()));

        let method = Method::POST;
        let url = self.url(&[]);
        let url_path = url.path().to_owned();
        tracing::debug!(tranche = %req.tranche_id, requests = lines, bytes = length, "creating message batch");
        // Not retried: a second create would be a second batch.
        let result: Result<WireMessageBatch, UpstreamError> = async {
            let request = self
                .request(method.clone(), url)
                .header(CONTENT_TYPE, "application/json")
                .header(CONTENT_LENGTH, length)
                .body(body);
            let response = http::send(PROVIDER, request, &method, &url_path).await?;
            http::read_json(PROVIDER, response, &method, &url_path).await
        }
        .await;
        Ok(result.map_err(|err| self.redact(err))?.into())
    }

    async fn retrieve_batch(&self, id: &BatchId) -> Result<RemoteBatch, UpstreamError> {
        let batch: WireMessageBatch =
            self.call(Method::GET, self.url(&[id.as_str()]), true).await?;
        Ok(batch.into())
    }

    /// One page, newest first; `limit` clamped to 1..=1000; `after` is `after_id`.
    async fn list_batches(
        &self,
        after: Option<&BatchId>,
        limit: u32,
    ) -> Result<BatchPage, UpstreamError> {
        let mut url = self.url(&[]);
        {
            let mut query = url.query_pairs_mut();
            query.append_pair("limit", &limit.clamp(1, 1000).to_string());
            if let Some(after) = after {
                query.append_pair("after_id", after.as_str());
            }
        }
        let list: WirePage<WireMessageBatch> = self.call(Method::GET, url, true).await?;
        Ok(list.into_page())
    }

    async fn cancel_batch(&self, id: &BatchId) -> Result<RemoteBatch, UpstreamError> {
        let url = self.url(&[id.as_str(), "cancel"]);
        let batch: WireMessageBatch = self.call(Method::POST, url, false).await?;
        Ok(batch.into())
    }

    async fn download_file(&self, _id: &FileId) -> Result<Download, UpstreamError> {
        Err(Self::unsupported("Message Batches have no files; results come from `results_url`"))
    }

    async fn delete_file(&self, _id: &FileId) -> Result<(), UpstreamError> {
        Err(Self::unsupported("Message Batches have no files to delete"))
    }

    /// Streams the results JSONL to `dest`; retried on transient failures.
    async fn download_results(&self, results_url: &str) -> Result<Download, UpstreamError> {
        let url = self.resolve_results_url(results_url).map_err(|why| {
            UpstreamError::new(
                PROVIDER,
                ErrorKind::Decode,
                format!("results_url `{results_url}` is not usable: {why}"),
            )
        })?;
        let method = Method::GET;
        let path = url.path().to_owned();
        let result = http::with_retries(&self.retry, true, || async {
            let request =
                self.request(method.clone(), url.clone()).header(ACCEPT, "application/binary");
            http::send(PROVIDER, request, &method, &path).await
        })
        .await;
        let response = result.map_err(|err| self.redact(err))?;
        Ok(http::into_download(PROVIDER, response, &method, &path))
    }

    /// `DELETE /v1/messages/batches/{id}` (only once it has ended); 404 counts as deleted.
    async fn delete_batch(&self, id: &BatchId) -> Result<(), UpstreamError> {
        let url = self.url(&[id.as_str()]);
        match self.call::<serde_json::Value>(Method::DELETE, url, true).await {
            Ok(_) => Ok(()),
            Err(err) if err.kind == ErrorKind::Http && err.status == Some(404) => {
                tracing::debug!(batch_id = %id, "message batch already gone");
                Ok(())
            }
            Err(err) => Err(err),
        }
    }

    fn parse_result_line(&self, line: &str) -> Result<ResultLine, LineParseError> {
        parse_anthropic_result_line(line)
    }
}

fn is_blank(line: &[u8]) -> bool {
    line.iter().all(u8::is_ascii_whitespace)
}

/// The create body's length for `lines` lines of `bytes` bytes in total.
fn create_body_length(lines: u64, bytes: u64) -> u64 {
    BODY_PREFIX.len() as u64 + bytes + lines.saturating_sub(1) + BODY_SUFFIX.len() as u64
}

/// Where the create body stream is.
struct BodyState<R> {
    reader: BufReader<R>,
    line: Vec<u8>,
    started: bool,
    first: bool,
    done: bool,
}

/// `{"requests":[` + the file's non-blank lines joined by `,` + `]}`, read in chunks of about
/// `BODY_CHUNK` bytes: at most one chunk and one line are held at a time.
fn create_body_stream<R: tokio::io::AsyncRead + Send + Unpin + 'static>(
    lines: R,
) -> impl futures::Stream<Item = std::io::Result<Vec<u8>>> + Send + 'static {
    let state = BodyState {
        reader: BufReader::new(lines),
        line: Vec::new(),
        started: false,
        first: true,
        done: false,
    };
    futures::stream::unfold(state, |mut st| async move {
        if st.done {
            return None;
        }
        let mut chunk = Vec::with_capacity(BODY_CHUNK + 1024);
        if !st.started {
            st.started = true;
            chunk.extend_from_slice(BODY_PREFIX);
        }
        while chunk.len() < BODY_CHUNK {
            st.line.clear();
            match st.reader.read_until(b'\n', &mut st.line).await {
                Ok(0) => {
                    chunk.extend_from_slice(BODY_SUFFIX);
                    st.done = true;
                    break;
                }
                Ok(_) => {
                    let content = trim_line_end(&st.line);
                    if is_blank(content) {
                        continue;
                    }
                    if !st.first {
                        chunk.push(b',');
                    }
                    st.first = false;
                    chunk.extend_from_slice(content);
                }
                Err(err) => {
                    st.done = true;
                    return Some((Err(err), st));
                }
            }
        }
        Some((Ok(chunk), st))
    })
}

/// Reads one line of a Message Batch results file.
fn parse_anthropic_result_line(line: &str) -> Result<ResultLine, LineParseError> {
    let whole = line;
    let line = line.trim();
    if line.is_empty() {
        return Err(LineParseError::Empty);
    }
    // One pass over the line, its message placed and its billed members kept raw, where it
    // can be.
    let wire = read_line(
        line,
        |wire: WireIndividualResponse<BodyParts<'_>>| wire.map_message(|m| m.in_line(line)),
        |wire: WireIndividualResponse<&RawValue>| wire.map_message(|raw| Some(Body::whole(raw))),
    )?;
    let never_ran = |code: &str, message: &str| {
        LineOutcome::Failed(LineError {
            provider: PROVIDER,
            status: None,
            error_type: None,
            code: Some(code.to_owned()),
            message: message.to_owned(),
            param: None,
            request_id: None,
            retryable: true,
        })
    };
    let outcome = match wire.result.kind.as_str() {
        "succeeded" => {
            let message = wire.result.message.ok_or(LineParseError::MissingBody { status: 200 })?;
            LineOutcome::Succeeded {
                status_code: 200,
                request_id: None,
                body: range_within(whole, message.text),
                usage: Usage::anthropic(message),
            }
        }
        "errored" => LineOutcome::Failed(errored(wire.result.error)),
        "canceled" => never_ran(
            "batch_cancelled",
            "the batch was canceled before this request was sent to the model",
        ),
        "expired" => never_ran(
            "batch_expired",
            "the batch reached its 24 hour expiration before this request could be sent to the model",
        ),
        other => {
            return Err(LineParseError::Invalid(format!("unknown result type `{other}`")));
        }
    };
    Ok(ResultLine { wire_id: wire.custom_id, outcome })
}

/// An `errored` result's `ErrorResponse` (`{"type":"error","error":{"type","message"},
/// "request_id"}`, or the bare error object older results carried) as a `LineError`.
fn errored(response: Option<WireErrorResponse>) -> LineError {
    let response = response.unwrap_or_default();
    let (error_type, message) = match response.error {
        Some(inner) => (inner.kind, inner.message),
        None if response.kind.as_deref() != Some("error") => (response.kind, response.message),
        None => (None, response.message),
    };
    LineError {
        provider: PROVIDER,
        status: None,
        retryable: error_type.as_deref().is_none_or(error_type_is_retryable),
        message: message
            .filter(|m| !m.is_empty())
            .or_else(|| error_type.clone())
            .unwrap_or_else(|| "the request errored".to_owned()),
        error_type,
        code: None,
        param: None,
        request_id: response.request_id.filter(|id| !id.is_empty()),
    }
}

/// A line of a results file, its message read as `M`.
#[derive(Debug, Deserialize)]
#[serde(bound(deserialize = "M: Deserialize<'de>"))]
struct WireIndividualResponse<M> {
    custom_id: String,
    result: WireResult<M>,
}

#[derive(Debug, Deserialize)]
#[serde(bound(deserialize = "M: Deserialize<'de>"))]
struct WireResult<M> {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    message: Option<M>,
    #[serde(default)]
    error: Option<WireErrorResponse>,
}

impl<M> WireIndividualResponse<M> {
    /// The line with its message made an `N` by `f`; `None` when `f` gives none.
    fn map_message<N>(self, f: impl FnOnce(M) -> Option<N>) -> Option<WireIndividualResponse<N>> {
        let WireResult { kind, message, error } = self.result;
        let message = match message {
            Some(message) => Some(f(message)?),
            None => None,
        };
        Some(WireIndividualResponse {
            custom_id: self.custom_id,
            result: WireResult { kind, message, error },
        })
    }
}

#[derive(Debug, Default, Deserialize)]
struct WireErrorResponse {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    error: Option<WireErrorObject>,
    #[serde(default)]
    request_id: Option<String>,
}

#[derive(Debug, Deserialize)]
struct WireErrorObject {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

/// `processing_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProcessingStatus {
    InProgress,
    Canceling,
    Ended,
}

fn processing_status<'de, D: Deserializer<'de>>(d: D) -> Result<ProcessingStatus, D::Error> {
    let text = String::deserialize(d)?;
    match text.as_str() {
        "in_progress" => Ok(ProcessingStatus::InProgress),
        "canceling" => Ok(ProcessingStatus::Canceling),
        "ended" => Ok(ProcessingStatus::Ended),
        other => Err(serde::de::Error::custom(format!("unknown processing_status `{other}`"))),
    }
}

#[derive(Debug, Deserialize)]
struct WireMessageBatch {
    id: String,
    #[serde(deserialize_with = "processing_status")]
    processing_status: ProcessingStatus,
    #[serde(default)]
    request_counts: Option<WireCounts>,
    #[serde(deserialize_with = "timestamp")]
    created_at: i64,
    #[serde(default, deserialize_with = "opt_timestamp")]
    expires_at: Option<i64>,
    #[serde(default, deserialize_with = "opt_timestamp")]
    cancel_initiated_at: Option<i64>,
    #[serde(default)]
    results_url: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct WireCounts {
    #[serde(default)]
    processing: Option<u64>,
    #[serde(default)]
    succeeded: Option<u64>,
    #[serde(default)]
    errored: Option<u64>,
    #[serde(default)]
    canceled: Option<u64>,
    #[serde(default)]
    expired: Option<u64>,
}

impl From<WireMessageBatch> for RemoteBatch {
    fn from(wire: WireMessageBatch) -> Self {
        let status = match wire.processing_status {
            ProcessingStatus::InProgress => BatchStatus::InProgress,
            ProcessingStatus::Canceling => BatchStatus::Cancelling,
            ProcessingStatus::Ended if wire.cancel_initiated_at.is_some() => BatchStatus::Cancelled,
            ProcessingStatus::Ended => BatchStatus::Completed,
        };
        let c = wire.request_counts.unwrap_or_default();
        let n = |v: Option<u64>| v.unwrap_or(0);
        let failed = n(c.errored) + n(c.canceled) + n(c.expired);
        Self {
            id: BatchId::new(wire.id),
            status,
            endpoint: Some(Endpoint::AnthropicMessages.as_str().to_owned()),
            input_file_id: None,
            output_file_id: None,
            error_file_id: None,
            request_counts: RequestCounts {
                total: n(c.processing) + n(c.succeeded) + failed,
                completed: n(c.succeeded),
                failed,
            },
            errors: Vec::new(),
            metadata: Default::default(),
            created_at: wire.created_at,
            expires_at: wire.expires_at,
            results_url: wire.results_url.filter(|url| !url.trim().is_empty()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use futures::StreamExt;

    use super::*;
    use crate::streams::InlineInput;
    use tranche_core::TokenUsage;

    const KEY: &str = "sk-ant-test-0123456789abcdef";

    fn provider() -> AnthropicProvider {
        AnthropicProvider::new(
            AnthropicConfig::new(SecretString::from(KEY)),
            reqwest::Client::new(),
        )
        .unwrap()
    }

    fn batch(json: &str) -> RemoteBatch {
        serde_json::from_str::<WireMessageBatch>(json).unwrap().into()
    }

    fn failed(line: &str) -> LineError {
        match provider().parse_result_line(line).unwrap().outcome {
            LineOutcome::Failed(err) => err,
            LineOutcome::Succeeded { .. } => panic!("expected a failure: {line}"),
        }
    }

    #[test]
    fn create_response_maps_to_in_progress() {
        // The guide's create response.
        let b = batch(
            r#"{"id":"msgbatch_013Zva2CMHLNnXjNJJKqJ2EF","type":"message_batch","processing_status":"in_progress",
                "request_counts":{"processing":2,"succeeded":0,"errored":0,"canceled":0,"expired":0},
                "ended_at":null,"created_at":"2024-09-24T18:37:24.100435Z","expires_at":"2024-09-25T18:37:24.100435Z",
                "cancel_initiated_at":null,"results_url":null}"#,
        );
        assert_eq!(b.id.as_str(), "msgbatch_013Zva2CMHLNnXjNJJKqJ2EF");
        assert_eq!(b.status, BatchStatus::InProgress);
        assert_eq!(b.request_counts, RequestCounts { total: 2, completed: 0, failed: 0 });
        assert_eq!(b.created_at, 1_727_203_044);
        assert_eq!(b.expires_at, Some(1_727_203_044 + 86_400));
        assert_eq!(b.results_url, None);
        assert_eq!(b.endpoint.as_deref(), Some("/v1/messages"));
        assert!(b.metadata.is_empty() && b.errors.is_empty());
        assert_eq!(b.tranche_id(), None);
        assert_eq!(b.input_file_id, None);
    }

    #[test]
    fn ended_and_cancelled_batches() {
        let ended = batch(
            r#"{"id":"msgbatch_1","type":"message_batch","processing_status":"ended",
                "request_counts":{"processing":0,"succeeded":95,"errored":2,"canceled":1,"expired":2},
                "ended_at":"2024-09-24T19:00:00Z","created_at":"2024-09-24T18:37:24.100435Z",
                "expires_at":"2024-09-25T18:37:24.100435Z","archived_at":null,"cancel_initiated_at":null,
                "results_url":"https://api.anthropic.com/v1/messages/batches/msgbatch_1/results"}"#,
        );
        assert_eq!(ended.status, BatchStatus::Completed);
        assert_eq!(ended.request_counts, RequestCounts { total: 100, completed: 95, failed: 5 });
        assert_eq!(
            ended.results_url.as_deref(),
            Some("https://api.anthropic.com/v1/messages/batches/msgbatch_1/results")
        );

        let canceling = batch(
            r#"{"id":"msgbatch_2","processing_status":"canceling","request_counts":{"processing":4,"succeeded":0,"errored":0,"canceled":0,"expired":0},
                "created_at":"2024-09-24T18:37:24Z","cancel_initiated_at":"2024-09-24T18:39:03.114875Z","results_url":null}"#,
        );
        assert_eq!(canceling.status, BatchStatus::Cancelling);
        assert_eq!(canceling.request_counts.total, 4);

        let cancelled = batch(
            r#"{"id":"msgbatch_2","processing_status":"ended","request_counts":{"processing":0,"succeeded":1,"errored":0,"canceled":3,"expired":0},
                "created_at":"2024-09-24T18:37:24Z","cancel_initiated_at":"2024-09-24T18:39:03.114875Z","results_url":"/v1/messages/batches/msgbatch_2/results"}"#,
        );
        assert_eq!(cancelled.status, BatchStatus::Cancelled);
        assert_eq!(cancelled.request_counts, RequestCounts { total: 4, completed: 1, failed: 3 });

        let err = serde_json::from_str::<WireMessageBatch>(
            r#"{"id":"m","processing_status":"paused","created_at":"2024-09-24T18:37:24Z"}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("paused"), "{err}");
    }

    #[test]
    fn succeeded_line_keeps_the_message_verbatim() {
        let message = r#"{"id":"msg_014VwiXbi91y3JMjcpyGBHX5","type":"message","role":"assistant","model":"claude-3-5-sonnet-20240620","content":[{"type":"text","text":"Hello again!"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":11,"output_tokens":36}}"#;
        let line = format!(
            r#"{{"custom_id":"my-second-request","result":{{"type":"succeeded","message":{message}}}}}"#
        );
        let parsed = provider().parse_result_line(&line).unwrap();
        assert_eq!(parsed.wire_id, "my-second-request");
        match parsed.outcome {
            LineOutcome::Succeeded { status_code, request_id, body, usage } => {
                assert_eq!(status_code, 200);
                assert_eq!(request_id, None);
                assert_eq!(&line[body], message);
                assert_eq!(usage.model.as_deref(), Some("claude-3-5-sonnet-20240620"));
                let tokens = usage.tokens.unwrap();
                assert_eq!((tokens.input, tokens.output, tokens.cached_input), (11, 36, 0));
            }
            LineOutcome::Failed(err) => panic!("{err}"),
        }
    }

    fn usage_of(usage: &str) -> TokenUsage {
        let message = format!(r#"{{"id":"m","model":"claude-sonnet-4-5","usage":{usage}}}"#);
        let line =
            format!(r#"{{"custom_id":"a","result":{{"type":"succeeded","message":{message}}}}}"#);
        match provider().parse_result_line(&line).unwrap().outcome {
            LineOutcome::Succeeded { usage, .. } => usage.tokens.unwrap(),
            LineOutcome::Failed(err) => panic!("{err}"),
        }
    }

    #[test]
    fn cache_reads_and_writes_count_as_input() {
        // input_tokens counts only what follows the last breakpoint.
        let t = usage_of(
            r#"{"input_tokens":20,"cache_creation_input_tokens":1500,"cache_read_input_tokens":3000,
                "cache_creation":{"ephemeral_5m_input_tokens":500,"ephemeral_1h_input_tokens":1000},
                "output_tokens":40}"#,
        );
        assert_eq!(t.input, 4_520);
        assert_eq!((t.cached_input, t.cache_write_5m, t.cache_write_1h), (3_000, 500, 1_000));
        assert_eq!((t.uncached_input(), t.output), (20, 40));
        // Without the split, writes are 5-minute writes (the default lifetime).
        let t =
            usage_of(r#"{"input_tokens":5,"cache_creation_input_tokens":1200,"output_tokens":1}"#);
        assert_eq!((t.input, t.cache_write_5m, t.cache_write_1h), (1_205, 1_200, 0));
    }

    #[test]
    fn errored_lines_classify_by_type() {
        let err = failed(
            r#"{"custom_id":"a","result":{"type":"errored","error":{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"},"request_id":"req_011CX"}}}"#,
        );
        assert_eq!(err.provider, ProviderKind::Anthropic);
        assert_eq!(err.status, None);
        assert_eq!(err.error_type.as_deref(), Some("invalid_request_error"));
        assert_eq!(err.code, None);
        assert!(err.message.starts_with("prompt is too long"));
        assert_eq!(err.request_id.as_deref(), Some("req_011CX"));
        assert!(!err.retryable);

        for (kind, retryable) in [
            ("api_error", true),
            ("overloaded_error", true),
            ("rate_limit_error", true),
            ("timeout_error", true),
            ("invalid_request_error", false),
            ("permission_error", false),
            ("billing_error", false),
        ] {
            let err = failed(&format!(
                r#"{{"custom_id":"a","result":{{"type":"errored","error":{{"type":"error","error":{{"type":"{kind}","message":"m"}}}}}}}}"#
            ));
            assert_eq!(err.error_type.as_deref(), Some(kind));
            assert_eq!(err.retryable, retryable, "{kind}");
            assert_eq!(err.request_id, None);
        }

        // The bare error object of older results.
        let err = failed(
            r#"{"custom_id":"a","result":{"type":"errored","error":{"type":"invalid_request_error","message":"bad"}}}"#,
        );
        assert_eq!(err.error_type.as_deref(), Some("invalid_request_error"));
        assert_eq!(err.message, "bad");
        assert!(!err.retryable);

        // No details at all: retryable, as the guide treats everything but invalid requests.
        let err = failed(r#"{"custom_id":"a","result":{"type":"errored"}}"#);
        assert_eq!(err.error_type, None);
        assert!(err.retryable);
    }

    #[test]
    fn canceled_and_expired_lines_are_retryable() {
        let err = failed(r#"{"custom_id":"c","result":{"type":"canceled"}}"#);
        assert_eq!(err.code.as_deref(), Some("batch_cancelled"));
        assert_eq!((err.status, err.error_type.as_deref()), (None, None));
        assert!(err.retryable);
        let err = failed(r#"{"custom_id":"e","result":{"type":"expired"}}"#);
        assert_eq!(err.code.as_deref(), Some("batch_expired"));
        assert!(err.retryable);
    }

    #[test]
    fn garbage_lines_say_why() {
        let p = provider();
        assert_eq!(p.parse_result_line(" ").unwrap_err(), LineParseError::Empty);
        assert!(matches!(p.parse_result_line("{").unwrap_err(), LineParseError::Invalid(_)));
        let err =
            p.parse_result_line(r#"{"custom_id":"a","result":{"type":"paused"}}"#).unwrap_err();
        assert!(err.to_string().contains("paused"), "{err}");
        assert_eq!(
            p.parse_result_line(r#"{"custom_id":"a","result":{"type":"succeeded"}}"#).unwrap_err(),
            LineParseError::MissingBody { status: 200 }
        );
        let err = p.parse_result_line(r#"{"result":{"type":"canceled"}}"#).unwrap_err();
        assert!(err.to_string().contains("custom_id"), "{err}");
    }

    #[test]
    fn batches_carry_their_requests_inline() {
        assert_eq!(provider().transport(), InputTransport::Inline);
        assert!(!provider().has_batch_metadata());
    }

    #[tokio::test]
    async fn create_body_is_the_lines_joined() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.jsonl");
        // Blank lines and CRLF endings are tolerated; a last line without '\n' too.
        let long =
            format!("{{\"custom_id\":\"big\",\"params\":{{\"x\":\"{}\"}}}}", "y".repeat(200_000));
        let text = format!(
            "{{\"custom_id\":\"a\",\"params\":{{}}}}\r\n\n  \n{long}\n{{\"custom_id\":\"c\",\"params\":{{\"k\":[1, 2]}}}}"
        );
        std::fs::write(&path, &text).unwrap();
        let input = InlineInput::from_file(&path).await.unwrap();
        let (lines, bytes) = (input.count, input.line_bytes);
        assert_eq!(lines, 3);
        let file = tokio::fs::File::open(&path).await.unwrap();
        let chunks: Vec<Vec<u8>> = create_body_stream(file).map(|c| c.unwrap()).collect().await;
        assert!(chunks.len() >= 2, "a long file goes in several chunks");
        let body: Vec<u8> = chunks.concat();
        assert_eq!(body.len() as u64, create_body_length(lines, bytes));
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let requests = v["requests"].as_array().unwrap();
        assert_eq!(requests.len(), 3);
        assert_eq!(requests[0]["custom_id"], "a");
        assert_eq!(requests[1]["custom_id"], "big");
        assert_eq!(requests[2]["params"]["k"][1], 2);
        // The lines' bytes are sent as they are.
        assert!(String::from_utf8(body).unwrap().contains(r#"{"k":[1, 2]}"#));

        let empty = dir.path().join("empty.jsonl");
        std::fs::write(&empty, "").unwrap();
        let file = tokio::fs::File::open(&empty).await.unwrap();
        let body: Vec<u8> =
            create_body_stream(file).map(|c| c.unwrap()).collect::<Vec<_>>().await.concat();
        assert_eq!(body, b"{\"requests\":[]}");
        assert_eq!(create_body_length(0, 0), body.len() as u64);
    }

    #[test]
    fn results_urls_resolve_under_the_base_url() {
        let p = provider();
        let same = "https://api.anthropic.com/v1/messages/batches/msgbatch_1/results";
        assert_eq!(p.resolve_results_url(same).unwrap().as_str(), same);
        assert_eq!(
            p.resolve_results_url("/v1/messages/batches/msgbatch_1/results?x=1").unwrap().as_str(),
            "https://api.anthropic.com/v1/messages/batches/msgbatch_1/results?x=1"
        );
        let mut config = AnthropicConfig::new(SecretString::from(KEY));
        config.base_url = "https://gateway.example/anthropic/".into();
        let gw = AnthropicProvider::new(config, reqwest::Client::new()).unwrap();
        assert_eq!(
            gw.resolve_results_url(same).unwrap().as_str(),
            "https://gateway.example/anthropic/v1/messages/batches/msgbatch_1/results"
        );
        assert_eq!(
            gw.resolve_results_url("/anthropic/v1/messages/batches/b/results").unwrap().as_str(),
            "https://gateway.example/anthropic/v1/messages/batches/b/results"
        );
        assert_eq!(
            gw.url(&["b", "cancel"]).as_str(),
            "https://gateway.example/anthropic/v1/messages/batches/b/cancel"
        );
        assert!(p.resolve_results_url("ftp://x/y").unwrap_err().contains("scheme"));
        assert!(p.resolve_results_url("not a url").is_err());
    }

    #[test]
    fn config_from_env_and_validation() {
        let env: HashMap<&str, &str> = HashMap::from([
            ("ANTHROPIC_API_KEY", KEY),
            ("ANTHROPIC_BASE_URL", "http://127.0.0.1:9"),
        ]);
        let lookup = |name: &str| env.get(name).map(|v| (*v).to_owned());
        let config = AnthropicConfig::from_lookup(None, lookup).unwrap();
        assert_eq!(config.base_url, "http://127.0.0.1:9");
        assert_eq!(config.beta, None);
        let over = AnthropicConfig::from_lookup(Some("https://x.test".into()), lookup).unwrap();
        assert_eq!(over.base_url, "https://x.test");
        let default = AnthropicConfig::from_lookup(None, |n| {
            (n == "ANTHROPIC_API_KEY").then(|| KEY.to_owned())
        })
        .unwrap();
        assert_eq!(default.base_url, "https://api.anthropic.com");
        let missing = AnthropicConfig::from_lookup(None, |_| None).unwrap_err();
        assert!(missing.to_string().contains("ANTHROPIC_API_KEY"));
        assert_eq!(
            AnthropicConfig::from_lookup(None, |_| Some(" ".into())).unwrap_err(),
            ConfigError::EmptyApiKey { provider: PROVIDER }
        );
        let mut bad = config.clone();
        bad.beta = Some("a\nb".into());
        assert_eq!(bad.validate(), Err(ConfigError::InvalidHeader { name: "anthropic-beta" }));
        let mut bad = config.clone();
        bad.api_key = SecretString::from("k\u{7f}\n");
        assert_eq!(bad.validate(), Err(ConfigError::InvalidApiKey { provider: PROVIDER }));
        let p = AnthropicProvider::new(config.clone(), reqwest::Client::new()).unwrap();
        assert!(!format!("{config:?}").contains(KEY));
        assert!(!format!("{p:?}").contains(KEY));
    }

    #[tokio::test]
    async fn file_operations_are_unsupported() {
        let p = provider();
        let body = UploadBody::from_bytes("{}\n");
        let err = p.upload_batch_file(TrancheId::new(), body).await.unwrap_err();
        assert_eq!((err.kind, err.provider), (ErrorKind::Unsupported, PROVIDER));
        assert!(!err.retryable());
        let err = p.download_file(&FileId::new("f")).await.unwrap_err();
        assert_eq!(err.kind, ErrorKind::Unsupported);
        let err = p.delete_file(&FileId::new("f")).await.unwrap_err();
        assert_eq!(err.kind, ErrorKind::Unsupported);
        let file = FileId::new("f");
        let err = p
            .create_batch(CreateBatch {
                tranche_id: TrancheId::new(),
                input: BatchInput::File(&file),
                endpoint: Endpoint::AnthropicMessages,
            })
            .await
            .unwrap_err();
        assert_eq!(err.kind, ErrorKind::Unsupported);
        let missing = InlineInput::from_file(std::path::Path::new("/nonexistent/in.jsonl")).await;
        assert_eq!(missing.unwrap_err().kind(), std::io::ErrorKind::NotFound);
    }
}
