//! The OpenAI adapter: Files and Batches over HTTP, and OpenAI's input and result line shapes.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use reqwest::multipart::{Form, Part};
use reqwest::{Method, RequestBuilder, Url};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tranche_core::{Endpoint, ProviderKind, TrancheId};

use crate::error::{
    ConfigError, ErrorKind, LineParseError, UpstreamError, body_snippet, parse_error_body,
    status_is_retryable,
};
use crate::http::{self, RetryPolicy};
use crate::provider::Provider;
use crate::types::{
    BatchErrorEntry, BatchId, BatchInput, BatchPage, BatchStatus, CreateBatch, FileId, LineError,
    LineOutcome, RemoteBatch, RequestCounts, ResultLine, UploadedFile,
};

const PROVIDER: ProviderKind = ProviderKind::Openai;

/// The `body` of a call that sends none.
const NO_BODY: Option<&()> = None;

/// The shortest and longest file expiry OpenAI accepts, in seconds (1 hour to 30 days).
pub const EXPIRY_RANGE: std::ops::RangeInclusive<u64> = 3_600..=2_592_000;

/// How to reach OpenAI. `Debug` never shows the key.
#[derive(Debug, Clone)]
pub struct OpenAiConfig {
    /// Default `https://api.openai.com/v1`.
    pub base_url: String,
    pub api_key: SecretString,
    /// `expires_after` seconds for uploaded input files; default 7 days; 3600..=2592000.
    /// `None` uploads without an expiry (OpenAI then keeps batch files 30 days).
    pub file_expires_after: Option<u64>,
    /// `output_expires_after` seconds for output and error files; default 30 days; 3600..=2592000.
    pub output_expires_after: Option<u64>,
}

impl OpenAiConfig {
    pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";
    pub const DEFAULT_FILE_EXPIRES_AFTER: u64 = 604_800;
    pub const DEFAULT_OUTPUT_EXPIRES_AFTER: u64 = 2_592_000;

    /// The defaults, with this key.
    pub fn new(api_key: SecretString) -> Self {
        Self {
            base_url: Self::DEFAULT_BASE_URL.to_owned(),
            api_key,
            file_expires_after: Some(Self::DEFAULT_FILE_EXPIRES_AFTER),
            output_expires_after: Some(Self::DEFAULT_OUTPUT_EXPIRES_AFTER),
        }
    }

    /// Reads `OPENAI_API_KEY` (required) and `OPENAI_BASE_URL`; `base_url_override` wins over both.
    pub fn from_env(base_url_override: Option<String>) -> Result<Self, ConfigError> {
        Self::from_lookup(base_url_override, |name| std::env::var(name).ok())
    }

    fn from_lookup(
        base_url_override: Option<String>,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let key = lookup("OPENAI_API_KEY")
            .ok_or(ConfigError::MissingEnv { var: "OPENAI_API_KEY", provider: PROVIDER })?;
        if key.trim().is_empty() {
            return Err(ConfigError::EmptyApiKey { provider: PROVIDER });
        }
        let mut config = Self::new(SecretString::from(key));
        if let Some(url) = base_url_override
            .or_else(|| lookup("OPENAI_BASE_URL"))
            .filter(|url| !url.trim().is_empty())
        {
            config.base_url = url.trim().to_owned();
        }
        config.validate()?;
        Ok(config)
    }

    /// Checks the key, the base URL and both expiries.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.parsed_base_url().map(|_| ())?;
        check_expiry("file_expires_after", self.file_expires_after)?;
        check_expiry("output_expires_after", self.output_expires_after)?;
        let key = self.api_key.expose_secret();
        if key.trim().is_empty() {
            return Err(ConfigError::EmptyApiKey { provider: PROVIDER });
        }
        if reqwest::header::HeaderValue::from_str(&format!("Bearer {key}")).is_err() {
            return Err(ConfigError::InvalidApiKey { provider: PROVIDER });
        }
        Ok(())
    }

    fn parsed_base_url(&self) -> Result<Url, ConfigError> {
        let invalid = |reason: &str| ConfigError::InvalidBaseUrl {
            url: self.base_url.clone(),
            reason: reason.to_owned(),
        };
        let mut url = Url::parse(self.base_url.trim()).map_err(|err| invalid(&err.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(invalid("the scheme must be http or https"));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(invalid("it must not have a query or fragment"));
        }
        url.path_segments_mut().map_err(|()| invalid("it cannot have a path"))?.pop_if_empty();
        Ok(url)
    }
}

fn check_expiry(field: &'static str, value: Option<u64>) -> Result<(), ConfigError> {
    match value {
        Some(value) if !EXPIRY_RANGE.contains(&value) => Err(ConfigError::ExpiryOutOfRange {
            field,
            value,
            min: *EXPIRY_RANGE.start(),
            max: *EXPIRY_RANGE.end(),
        }),
        _ => Ok(()),
    }
}

/// The OpenAI Batch API adapter.
#[derive(Clone)]
pub struct OpenAiProvider {
    http: reqwest::Client,
    base_url: Url,
    api_key: SecretString,
    file_expires_after: Option<u64>,
    output_expires_after: Option<u64>,
    retry: RetryPolicy,
}

impl fmt::Debug for OpenAiProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiProvider")
            .field("base_url", &self.base_url.as_str())
            .field("api_key", &"[REDACTED]")
            .field("file_expires_after", &self.file_expires_after)
            .field("output_expires_after", &self.output_expires_after)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

impl OpenAiProvider {
    /// An adapter using the shared `http` client (see `http_client`).
    pub fn new(config: OpenAiConfig, http: reqwest::Client) -> Result<Self, ConfigError> {
        config.validate()?;
        let base_url = config.parsed_base_url()?;
        Ok(Self {
            http,
            base_url,
            api_key: config.api_key,
            file_expires_after: config.file_expires_after,
            output_expires_after: config.output_expires_after,
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

    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base_url.clone();
        // `new` checked that the base URL can take path segments.
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }

    fn request(&self, method: Method, url: Url) -> RequestBuilder {
        self.http.request(method, url).bearer_auth(self.api_key.expose_secret())
    }

    /// Removes the key from any text the provider echoed back (invariant 8).
    fn redact(&self, err: UpstreamError) -> UpstreamError {
        err.redact(self.api_key.expose_secret())
    }

    /// A JSON call: sent once, or retried per the policy when `retry` (reads only).
    async fn call_json<T: serde::de::DeserializeOwned, B: Serialize + Sync>(
        &self,
        method: Method,
        url: Url,
        body: Option<&B>,
        retry: bool,
    ) -> Result<T, UpstreamError> {
        let path = url.path().to_owned();
        let result = http::with_retries(&self.retry, retry, || async {
            let mut request = self.request(method.clone(), url.clone());
            if let Some(body) = body {
                request = request.json(body);
            }
            let response = http::send(PROVIDER, request, &method, &path).await?;
            http::read_json(PROVIDER, response, &method, &path).await
        })
        .await;
        result.map_err(|err| self.redact(err))
    }
}

#[async_trait::async_trait]
impl Provider for OpenAiProvider {
    fn kind(&self) -> ProviderKind {
        PROVIDER
    }

    fn write_input_line(
        &self,
        out: &mut Vec<u8>,
        wire_id: &str,
        endpoint: Endpoint,
        body: &RawValue,
    ) {
        write_openai_input_line(out, wire_id, endpoint, body);
    }

    async fn upload_batch_file(
        &self,
        tranche: TrancheId,
        path: &Path,
    ) -> Result<UploadedFile, UpstreamError> {
        let filename = format!("tranche-{tranche}.jsonl");
        let io_error = |err: std::io::Error| {
            UpstreamError::new(
                PROVIDER,
                ErrorKind::Io,
                format!("cannot read {}: {err}", path.display()),
            )
        };
        let file = tokio::fs::File::open(path).await.map_err(io_error)?;
        let len = file.metadata().await.map_err(io_error)?.len();
        let part = Part::stream_with_length(file, len)
            .file_name(filename.clone())
            .mime_str("application/jsonl")
            .map_err(|err| UpstreamError::new(PROVIDER, ErrorKind::Transport, err.to_string()))?;
        let mut form = Form::new().text("purpose", "batch");
        if let Some(seconds) = self.file_expires_after {
            form = form
                .text("expires_after[anchor]", "created_at")
                .text("expires_after[seconds]", seconds.to_string());
        }
        let form = form.part("file", part);

        let method = Method::POST;
        let url = self.url(&["files"]);
        let url_path = url.path().to_owned();
        // Not retried: a second upload would be a second file (the engine adopts by name instead).
        let result: Result<WireFile, UpstreamError> = async {
            let response = http::send(
                PROVIDER,
                self.request(method.clone(), url).multipart(form),
                &method,
                &url_path,
            )
            .await?;
            http::read_json(PROVIDER, response, &method, &url_path).await
        }
        .await;
        let file = result.map_err(|err| self.redact(err))?;
        if self.file_expires_after.is_some() && file.expires_at.is_none() {
            tracing::warn!(file_id = %file.id, %filename, "openai accepted the upload but reports no expiry");
        }
        Ok(UploadedFile {
            id: FileId::new(file.id),
            bytes: file.bytes.unwrap_or(len),
            filename: file.filename.unwrap_or(filename),
            created_at: file.created_at,
            expires_at: file.expires_at,
        })
    }

    async fn create_batch(&self, req: CreateBatch<'_>) -> Result<RemoteBatch, UpstreamError> {
        let BatchInput::File(input_file_id) = req.input else {
            return Err(UpstreamError::new(
                ProviderKind::Openai,
                ErrorKind::Unsupported,
                "OpenAI batches start from an uploaded file, not inline requests",
            ));
        };
        let body = WireCreateBatch {
            input_file_id: input_file_id.as_str(),
            endpoint: req.endpoint.as_str(),
            completion_window: "24h",
            metadata: BTreeMap::from([(
                crate::TRANCHE_ID_METADATA_KEY,
                req.tranche_id.to_string(),
            )]),
            output_expires_after: self
                .output_expires_after
                .map(|seconds| WireExpiresAfter { anchor: "created_at", seconds }),
        };
        // Not retried: a second create would be a second batch (the engine adopts by metadata instead).
        let batch: WireBatch =
            self.call_json(Method::POST, self.url(&["batches"]), Some(&body), false).await?;
        Ok(batch.into())
    }

    async fn retrieve_batch(&self, id: &BatchId) -> Result<RemoteBatch, UpstreamError> {
        let batch: WireBatch =
            self.call_json(Method::GET, self.url(&["batches", id.as_str()]), NO_BODY, true).await?;
        Ok(batch.into())
    }

    async fn list_batches(
        &self,
        after: Option<&BatchId>,
        limit: u32,
    ) -> Result<BatchPage, UpstreamError> {
        let mut url = self.url(&["batches"]);
        {
            let mut query = url.query_pairs_mut();
            query.append_pair("limit", &limit.clamp(1, 100).to_string());
            if let Some(after) = after {
                query.append_pair("after", after.as_str());
            }
        }
        let list: WireList = self.call_json(Method::GET, url, NO_BODY, true).await?;
        let data: Vec<RemoteBatch> = list.data.into_iter().map(RemoteBatch::from).collect();
        let last_id = list
            .last_id
            .filter(|id| !id.is_empty())
            .map(BatchId::new)
            .or_else(|| data.last().map(|batch| batch.id.clone()));
        Ok(BatchPage { data, has_more: list.has_more, last_id })
    }

    async fn cancel_batch(&self, id: &BatchId) -> Result<RemoteBatch, UpstreamError> {
        let url = self.url(&["batches", id.as_str(), "cancel"]);
        let batch: WireBatch = self.call_json(Method::POST, url, NO_BODY, false).await?;
        Ok(batch.into())
    }

    async fn download_file(&self, id: &FileId, dest: &Path) -> Result<u64, UpstreamError> {
        let method = Method::GET;
        let url = self.url(&["files", id.as_str(), "content"]);
        let path = url.path().to_owned();
        let result = http::with_retries(&self.retry, true, || async {
            let response =
                http::send(PROVIDER, self.request(method.clone(), url.clone()), &method, &path)
                    .await?;
            http::stream_to_file(PROVIDER, response, dest, &method, &path).await
        })
        .await;
        result.map_err(|err| self.redact(err))
    }

    async fn delete_file(&self, id: &FileId) -> Result<(), UpstreamError> {
        let url = self.url(&["files", id.as_str()]);
        match self.call_json::<WireDeleted, _>(Method::DELETE, url, NO_BODY, true).await {
            Ok(WireDeleted { deleted: Some(false) }) => {
                let mut err = UpstreamError::new(
                    PROVIDER,
                    ErrorKind::Decode,
                    format!("openai did not delete file {id}"),
                );
                err.status = Some(200);
                Err(err)
            }
            Ok(_) => Ok(()),
            Err(err) if err.kind == ErrorKind::Http && err.status == Some(404) => {
                tracing::debug!(file_id = %id, "file already gone");
                Ok(())
            }
            Err(err) => Err(err),
        }
    }

    fn parse_result_line(&self, line: &str) -> Result<ResultLine, LineParseError> {
        parse_openai_result_line(PROVIDER, line)
    }
}

/// Appends `{"custom_id","method":"POST","url","body"}` and a newline (OpenAI and Azure input files).
pub(crate) fn write_openai_input_line(
    out: &mut Vec<u8>,
    wire_id: &str,
    endpoint: Endpoint,
    body: &RawValue,
) {
    out.extend_from_slice(b"{\"custom_id\":");
    write_json_string(out, wire_id);
    out.extend_from_slice(b",\"method\":\"POST\",\"url\":");
    write_json_string(out, endpoint.as_str());
    out.extend_from_slice(b",\"body\":");
    // Raw CR/LF in valid JSON can only be whitespace between tokens, so blanking them keeps the
    // value identical and the line a single line.
    out.extend(body.get().bytes().map(|b| if b == b'\n' || b == b'\r' { b' ' } else { b }));
    out.extend_from_slice(b"}\n");
}

/// Writes `s` as a JSON string literal.
fn write_json_string(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    for c in s.chars() {
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\r' => out.extend_from_slice(b"\\r"),
            '\t' => out.extend_from_slice(b"\\t"),
            c if u32::from(c) < 0x20 => {
                out.extend_from_slice(format!("\\u{:04x}", u32::from(c)).as_bytes());
            }
            c => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out.push(b'"');
}

/// Reads one line of an OpenAI (or Azure) output or error file.
pub(crate) fn parse_openai_result_line(
    provider: ProviderKind,
    line: &str,
) -> Result<ResultLine, LineParseError> {
    let line = line.trim();
    if line.is_empty() {
        return Err(LineParseError::Empty);
    }
    let wire: WireResultLine =
        serde_json::from_str(line).map_err(|err| LineParseError::Invalid(err.to_string()))?;
    if let Some(error) = wire.error {
        // The request never ran (batch expired or cancelled first).
        let code = error.code.as_ref().and_then(json_text);
        let retryable = matches!(code.as_deref(), Some("batch_expired" | "batch_cancelled"));
        return Ok(ResultLine {
            wire_id: wire.custom_id,
            outcome: LineOutcome::Failed(LineError {
                provider,
                status: None,
                error_type: None,
                message: error.message.unwrap_or_else(|| code.clone().unwrap_or_default()),
                code,
                param: None,
                request_id: None,
                retryable,
            }),
        });
    }
    let Some(response) = wire.response else {
        return Err(LineParseError::NoOutcome);
    };
    let status = response.status_code;
    if (200..300).contains(&status) {
        let body = response.body.ok_or(LineParseError::MissingBody { status })?;
        return Ok(ResultLine {
            wire_id: wire.custom_id,
            outcome: LineOutcome::Succeeded {
                status_code: status,
                request_id: response.request_id,
                body,
            },
        });
    }
    let raw = response.body.as_deref().map(RawValue::get).unwrap_or_default();
    let facts = parse_error_body(raw.as_bytes());
    let message = facts.message.unwrap_or_else(|| {
        let text = body_snippet(raw.as_bytes());
        if text.is_empty() || text == "null" {
            format!("request failed with status {status}")
        } else {
            text
        }
    });
    Ok(ResultLine {
        wire_id: wire.custom_id,
        outcome: LineOutcome::Failed(LineError {
            provider,
            status: Some(status),
            error_type: facts.error_type,
            code: facts.code,
            message,
            param: facts.param,
            request_id: response.request_id.or(facts.request_id),
            retryable: status_is_retryable(status),
        }),
    })
}

fn json_text(value: &serde_json::Value) -> Option<String> {
    match value {
        serde_json::Value::Null => None,
        serde_json::Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

#[derive(Debug, Deserialize)]
struct WireResultLine {
    custom_id: String,
    #[serde(default)]
    response: Option<WireLineResponse>,
    #[serde(default)]
    error: Option<WireLineError>,
}

#[derive(Debug, Deserialize)]
struct WireLineResponse {
    status_code: u16,
    #[serde(default)]
    request_id: Option<String>,
    #[serde(default)]
    body: Option<Box<RawValue>>,
}

#[derive(Debug, Deserialize)]
struct WireLineError {
    #[serde(default)]
    code: Option<serde_json::Value>,
    #[serde(default)]
    message: Option<String>,
}

#[derive(Debug, Deserialize)]
struct WireFile {
    id: String,
    #[serde(default)]
    bytes: Option<u64>,
    #[serde(default)]
    filename: Option<String>,
    created_at: i64,
    #[serde(default)]
    expires_at: Option<i64>,
}

#[derive(Debug, Deserialize)]
struct WireDeleted {
    #[serde(default)]
    deleted: Option<bool>,
}

#[derive(Debug, Serialize)]
struct WireCreateBatch<'a> {
    input_file_id: &'a str,
    endpoint: &'a str,
    completion_window: &'a str,
    metadata: BTreeMap<&'a str, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    output_expires_after: Option<WireExpiresAfter>,
}

#[derive(Debug, Serialize)]
struct WireExpiresAfter {
    anchor: &'static str,
    seconds: u64,
}

#[derive(Debug, Deserialize)]
struct WireList {
    #[serde(default)]
    data: Vec<WireBatch>,
    #[serde(default)]
    has_more: bool,
    #[serde(default)]
    last_id: Option<String>,
}

#[derive(Debug, Deserialize)]
struct WireBatch {
    id: String,
    status: BatchStatus,
    #[serde(default)]
    endpoint: Option<String>,
    #[serde(default)]
    input_file_id: Option<String>,
    #[serde(default)]
    output_file_id: Option<String>,
    #[serde(default)]
    error_file_id: Option<String>,
    #[serde(default)]
    request_counts: Option<RequestCounts>,
    #[serde(default)]
    errors: Option<WireBatchErrors>,
    #[serde(default)]
    metadata: Option<BTreeMap<String, serde_json::Value>>,
    created_at: i64,
    #[serde(default)]
    expires_at: Option<i64>,
}

#[derive(Debug, Deserialize)]
struct WireBatchErrors {
    #[serde(default)]
    data: Vec<WireBatchError>,
}

#[derive(Debug, Deserialize)]
struct WireBatchError {
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    line: Option<u64>,
    #[serde(default)]
    param: Option<String>,
}

fn file_id(id: Option<String>) -> Option<FileId> {
    id.filter(|id| !id.is_empty()).map(FileId::new)
}

impl From<WireBatch> for RemoteBatch {
    fn from(wire: WireBatch) -> Self {
        Self {
            id: BatchId::new(wire.id),
            status: wire.status,
            endpoint: wire.endpoint.filter(|e| !e.is_empty()),
            input_file_id: file_id(wire.input_file_id),
            output_file_id: file_id(wire.output_file_id),
            error_file_id: file_id(wire.error_file_id),
            results_url: None,
            request_counts: wire.request_counts.unwrap_or_default(),
            errors: wire
                .errors
                .map(|errors| errors.data)
                .unwrap_or_default()
                .into_iter()
                .map(|e| BatchErrorEntry {
                    message: e.message.or_else(|| e.code.clone()).unwrap_or_default(),
                    code: e.code,
                    line: e.line,
                    param: e.param,
                })
                .collect(),
            metadata: wire
                .metadata
                .unwrap_or_default()
                .into_iter()
                .filter_map(|(key, value)| json_text(&value).map(|value| (key, value)))
                .collect(),
            created_at: wire.created_at,
            expires_at: wire.expires_at,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn provider() -> OpenAiProvider {
        let config = OpenAiConfig::new(SecretString::from("sk-test-secret-key-1234"));
        OpenAiProvider::new(config, reqwest::Client::new()).unwrap()
    }

    fn failed(line: &str) -> LineError {
        match provider().parse_result_line(line).unwrap().outcome {
            LineOutcome::Failed(err) => err,
            LineOutcome::Succeeded { .. } => panic!("expected a failure: {line}"),
        }
    }

    #[test]
    fn success_line() {
        let line = r#"{"id":"batch_req_1","custom_id":"w-1","response":{"status_code":200,"request_id":"req_a","body":{"id":"chatcmpl-1","choices":[]}},"error":null}"#;
        let parsed = provider().parse_result_line(line).unwrap();
        assert_eq!(parsed.wire_id, "w-1");
        match parsed.outcome {
            LineOutcome::Succeeded { status_code, request_id, body } => {
                assert_eq!(status_code, 200);
                assert_eq!(request_id.as_deref(), Some("req_a"));
                assert_eq!(body.get(), r#"{"id":"chatcmpl-1","choices":[]}"#);
            }
            LineOutcome::Failed(err) => panic!("{err}"),
        }
    }

    #[test]
    fn http_level_failure_line() {
        let err = failed(
            r#"{"id":"batch_req_2","custom_id":"request-5","response":{"status_code":400,"request_id":"0538","body":{"error":{"message":"This model's maximum context length is 8192","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}},"error":null}"#,
        );
        assert_eq!(err.status, Some(400));
        assert_eq!(err.error_type.as_deref(), Some("invalid_request_error"));
        assert_eq!(err.code.as_deref(), Some("context_length_exceeded"));
        assert_eq!(err.param.as_deref(), Some("messages"));
        assert_eq!(err.request_id.as_deref(), Some("0538"));
        assert!(err.message.starts_with("This model's maximum"));
        assert!(!err.retryable);

        let rate = failed(
            r#"{"custom_id":"r","response":{"status_code":429,"request_id":"x","body":{"error":{"message":"slow down","type":"rate_limit_error","param":null,"code":null}}},"error":null}"#,
        );
        assert!(rate.retryable);
        let server = failed(
            r#"{"custom_id":"r","response":{"status_code":500,"body":"oops"},"error":null}"#,
        );
        assert!(server.retryable);
        assert_eq!(server.message, "\"oops\"");
    }

    #[test]
    fn batch_expired_and_cancelled_lines_are_retryable() {
        let err = failed(
            r#"{"id": "batch_req_123", "custom_id": "request-3", "response": null, "error": {"code": "batch_expired", "message": "This request could not be executed before the completion window expired."}}"#,
        );
        assert_eq!(err.status, None);
        assert_eq!(err.code.as_deref(), Some("batch_expired"));
        assert!(err.message.starts_with("This request could not"));
        assert!(err.retryable);
        let cancelled = failed(
            r#"{"custom_id":"c","response":null,"error":{"code":"batch_cancelled","message":"cancelled"}}"#,
        );
        assert!(cancelled.retryable);
        let other = failed(
            r#"{"custom_id":"c","response":null,"error":{"code":"invalid_request","message":"no"}}"#,
        );
        assert!(!other.retryable);
    }

    #[test]
    fn line_without_id_is_fine() {
        let line = r#"{"custom_id":"w-2","response":{"status_code":200,"request_id":"r","body":{}},"error":null}"#;
        assert_eq!(provider().parse_result_line(line).unwrap().wire_id, "w-2");
    }

    #[test]
    fn garbage_lines_say_why() {
        let p = provider();
        assert_eq!(p.parse_result_line("  ").unwrap_err(), LineParseError::Empty);
        let err = p.parse_result_line("not json").unwrap_err();
        assert!(matches!(err, LineParseError::Invalid(_)));
        assert!(err.to_string().contains("expected"), "{err}");
        let err = p.parse_result_line(r#"{"response":null,"error":null}"#).unwrap_err();
        assert!(err.to_string().contains("custom_id"), "{err}");
        assert_eq!(
            p.parse_result_line(r#"{"custom_id":"x","response":null,"error":null}"#).unwrap_err(),
            LineParseError::NoOutcome
        );
        assert_eq!(
            p.parse_result_line(r#"{"custom_id":"x","response":{"status_code":200},"error":null}"#)
                .unwrap_err(),
            LineParseError::MissingBody { status: 200 }
        );
    }

    #[test]
    fn empty_file_ids_read_as_none() {
        let wire: WireBatch = serde_json::from_str(
            r#"{"id":"batch_1","object":"batch","endpoint":"/v1/chat/completions","errors":null,"input_file_id":"file-in",
                "completion_window":"24h","status":"in_progress","output_file_id":"","error_file_id":null,
                "created_at":1711471533,"expires_at":1711557933,"request_counts":{"total":3,"completed":1,"failed":0},
                "metadata":{"tranche_id":"tr_0192f0c0a1b27c3d8e9f001122334455","n":3}}"#,
        )
        .unwrap();
        let batch = RemoteBatch::from(wire);
        assert_eq!(batch.output_file_id, None);
        assert_eq!(batch.error_file_id, None);
        assert_eq!(batch.input_file_id, Some(FileId::new("file-in")));
        assert_eq!(batch.status, BatchStatus::InProgress);
        assert_eq!(batch.request_counts, RequestCounts { total: 3, completed: 1, failed: 0 });
        assert_eq!(batch.metadata.get("n").map(String::as_str), Some("3"));
        assert!(batch.tranche_id().is_some());
    }

    #[test]
    fn batch_errors_are_kept() {
        let wire: WireBatch = serde_json::from_str(
            r#"{"id":"batch_2","status":"failed","created_at":1,"errors":{"object":"list","data":[{"code":"invalid_json_line","line":1,"message":"This line is not parseable as valid JSON.","param":null}]}}"#,
        )
        .unwrap();
        let batch = RemoteBatch::from(wire);
        assert_eq!(
            batch.errors,
            [BatchErrorEntry {
                code: Some("invalid_json_line".into()),
                message: "This line is not parseable as valid JSON.".into(),
                line: Some(1),
                param: None,
            }]
        );
    }

    #[test]
    fn input_line_is_one_json_line() {
        let body = RawValue::from_string("{\n  \"model\": \"gpt-4o-mini\",\n  \"messages\": [{\"role\":\"user\",\"content\":\"a\\nb\"}]\r\n}".into()).unwrap();
        let mut out = Vec::new();
        provider().write_input_line(&mut out, "w\"1\\\u{1}é", Endpoint::ChatCompletions, &body);
        provider().write_input_line(&mut out, "w2", Endpoint::Embeddings, &body);
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.split_terminator('\n').collect();
        assert_eq!(lines.len(), 2);
        assert!(text.ends_with('\n'));
        let first: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(first["custom_id"], "w\"1\\\u{1}é");
        assert_eq!(first["method"], "POST");
        assert_eq!(first["url"], "/v1/chat/completions");
        assert_eq!(first["body"]["messages"][0]["content"], "a\nb");
        assert_eq!(first.as_object().unwrap().len(), 4);
        let second: serde_json::Value = serde_json::from_str(lines[1]).unwrap();
        assert_eq!(second["url"], "/v1/embeddings");
    }

    #[test]
    fn config_from_env_and_validation() {
        let env: HashMap<&str, &str> = HashMap::from([
            ("OPENAI_API_KEY", "sk-abc-123456"),
            ("OPENAI_BASE_URL", "http://127.0.0.1:9/v1/"),
        ]);
        let lookup = |name: &str| env.get(name).map(|v| (*v).to_owned());
        let config = OpenAiConfig::from_lookup(None, lookup).unwrap();
        assert_eq!(config.base_url, "http://127.0.0.1:9/v1/");
        assert_eq!(config.file_expires_after, Some(604_800));
        assert_eq!(config.output_expires_after, Some(2_592_000));
        let provider = OpenAiProvider::new(config.clone(), reqwest::Client::new()).unwrap();
        assert_eq!(
            provider.url(&["batches", "b/1"]).as_str(),
            "http://127.0.0.1:9/v1/batches/b%2F1"
        );
        assert!(!format!("{config:?}").contains("sk-abc-123456"));
        assert!(!format!("{provider:?}").contains("sk-abc-123456"));

        let overridden =
            OpenAiConfig::from_lookup(Some("https://example.test/v1".into()), lookup).unwrap();
        assert_eq!(overridden.base_url, "https://example.test/v1");

        let missing = OpenAiConfig::from_lookup(None, |_| None).unwrap_err();
        assert!(missing.to_string().contains("OPENAI_API_KEY"));
        let empty = OpenAiConfig::from_lookup(None, |_| Some(String::new())).unwrap_err();
        assert_eq!(empty, ConfigError::EmptyApiKey { provider: ProviderKind::Openai });

        let mut bad = config.clone();
        bad.file_expires_after = Some(60);
        assert!(matches!(
            bad.validate(),
            Err(ConfigError::ExpiryOutOfRange { field: "file_expires_after", .. })
        ));
        let mut bad = config.clone();
        bad.output_expires_after = Some(2_592_001);
        assert!(matches!(
            bad.validate(),
            Err(ConfigError::ExpiryOutOfRange { field: "output_expires_after", .. })
        ));
        let mut none = config.clone();
        none.file_expires_after = None;
        assert!(none.validate().is_ok());
        let mut bad = config;
        bad.base_url = "ftp://x".into();
        assert!(matches!(bad.validate(), Err(ConfigError::InvalidBaseUrl { .. })));
        let mut bad = OpenAiConfig::new(SecretString::from("sk-with\nnewline"));
        bad.base_url = "http://localhost".into();
        let err = OpenAiProvider::new(bad, reqwest::Client::new()).unwrap_err();
        assert_eq!(err, ConfigError::InvalidApiKey { provider: ProviderKind::Openai });
        assert!(!err.to_string().contains("newline"));
    }

    #[test]
    fn create_body_shape() {
        let file = FileId::new("file-1");
        let tranche = TrancheId::new();
        let body = WireCreateBatch {
            input_file_id: file.as_str(),
            endpoint: Endpoint::ChatCompletions.as_str(),
            completion_window: "24h",
            metadata: BTreeMap::from([(crate::TRANCHE_ID_METADATA_KEY, tranche.to_string())]),
            output_expires_after: Some(WireExpiresAfter { anchor: "created_at", seconds: 3600 }),
        };
        let json = serde_json::to_value(&body).unwrap();
        assert_eq!(json["metadata"]["tranche_id"], tranche.to_string());
        assert_eq!(json["output_expires_after"]["anchor"], "created_at");
        assert_eq!(json["completion_window"], "24h");
    }
}
