//! The OpenAI-shaped Files and Batches wire, shared by the OpenAI and Azure OpenAI adapters: the
//! client (URLs, auth, retries, redaction), the input and result line shapes, and the batch, file
//! and list objects, read leniently enough for Azure's documented quirks (ISO timestamps,
//! capitalised statuses, null request counts, empty-string file ids, result lines without `id`).

use std::collections::BTreeMap;
use std::fmt;

use reqwest::header::HeaderValue;
use reqwest::multipart::{Form, Part};
use reqwest::{Method, RequestBuilder, Url};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;
use tranche_core::{Endpoint, ProviderKind, TrancheId};

use crate::body::{Body, BodyParts, read_line};
use crate::error::{
    ConfigError, ErrorKind, LineParseError, UpstreamError, body_snippet, parse_error_body,
    status_is_retryable,
};
use crate::http::{self, RetryPolicy};
use crate::streams::{Download, UploadBody};
use crate::time::{opt_timestamp, timestamp};
use crate::types::{
    BatchErrorEntry, BatchId, BatchInput, BatchPage, BatchStatus, CreateBatch, FileId, FilePage,
    LineError, LineOutcome, RemoteBatch, RemoteFile, RequestCounts, ResultLine, UploadedFile,
};
use crate::types::{Usage, WirePage, range_within};

/// The `body` of a call that sends none.
const NO_BODY: Option<&()> = None;

/// How the key travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Auth {
    /// `Authorization: Bearer <key>` (OpenAI; Azure with an Entra ID token).
    Bearer,
    /// `api-key: <key>` (Azure).
    ApiKeyHeader,
}

impl Auth {
    /// The header value the secret becomes, or `None` when it cannot be sent in a header.
    fn header_value(self, secret: &str) -> Option<HeaderValue> {
        let text = match self {
            Self::Bearer => format!("Bearer {secret}"),
            Self::ApiKeyHeader => secret.to_owned(),
        };
        let mut value = HeaderValue::from_str(&text).ok()?;
        value.set_sensitive(true);
        Some(value)
    }

    fn header_name(self) -> &'static str {
        match self {
            Self::Bearer => "authorization",
            Self::ApiKeyHeader => "api-key",
        }
    }
}

/// Checks that a key is non-empty and can travel in its header.
pub(crate) fn check_secret(
    provider: ProviderKind,
    auth: Auth,
    secret: &SecretString,
) -> Result<(), ConfigError> {
    let key = secret.expose_secret();
    if key.trim().is_empty() {
        return Err(ConfigError::EmptyApiKey { provider });
    }
    if auth.header_value(key).is_none() {
        return Err(ConfigError::InvalidApiKey { provider });
    }
    Ok(())
}

/// Parses a base URL: http or https, no query or fragment, no trailing empty segment.
pub(crate) fn parse_base_url(text: &str) -> Result<Url, ConfigError> {
    let invalid = |reason: &str| ConfigError::InvalidBaseUrl {
        url: text.to_owned(),
        reason: reason.to_owned(),
    };
    let mut url = Url::parse(text.trim()).map_err(|err| invalid(&err.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid("the scheme must be http or https"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(invalid("it must not have a query or fragment"));
    }
    url.path_segments_mut().map_err(|()| invalid("it cannot have a path"))?.pop_if_empty();
    Ok(url)
}

/// Checks an optional expiry against a provider's allowed range.
pub(crate) fn check_expiry(
    field: &'static str,
    value: Option<u64>,
    range: &std::ops::RangeInclusive<u64>,
) -> Result<(), ConfigError> {
    match value {
        Some(value) if !range.contains(&value) => Err(ConfigError::ExpiryOutOfRange {
            field,
            value,
            min: *range.start(),
            max: *range.end(),
        }),
        _ => Ok(()),
    }
}

/// How the create call names the endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EndpointStyle {
    /// `/v1/chat/completions` (OpenAI).
    Full,
    /// `/chat/completions`, as Azure's examples send it.
    WithoutV1,
}

impl EndpointStyle {
    fn render(self, endpoint: Endpoint) -> &'static str {
        let full = endpoint.as_str();
        match self {
            Self::Full => full,
            Self::WithoutV1 => full.strip_prefix("/v1").unwrap_or(full),
        }
    }
}

/// What an OpenAI-shaped surface needs beyond the shared code.
#[derive(Clone)]
pub(crate) struct OaiSettings {
    pub(crate) provider: ProviderKind,
    /// Where `files` and `batches` live (`https://api.openai.com/v1`, `{endpoint}/openai/v1`,
    /// `{endpoint}/openai`).
    pub(crate) base_url: Url,
    /// `api-version` query parameter sent with every call (Azure's dated surface).
    pub(crate) api_version: Option<String>,
    pub(crate) auth: Auth,
    pub(crate) secret: SecretString,
    pub(crate) file_expires_after: Option<u64>,
    pub(crate) output_expires_after: Option<u64>,
    pub(crate) endpoint_style: EndpointStyle,
}

/// A client for one OpenAI-shaped Files and Batches surface.
#[derive(Clone)]
pub(crate) struct OaiClient {
    http: reqwest::Client,
    settings: OaiSettings,
    pub(crate) retry: RetryPolicy,
}

impl fmt::Debug for OaiClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.settings;
        f.debug_struct("OaiClient")
            .field("provider", &s.provider)
            .field("base_url", &s.base_url.as_str())
            .field("api_version", &s.api_version)
            .field("auth", &s.auth)
            .field("secret", &"[REDACTED]")
            .field("file_expires_after", &s.file_expires_after)
            .field("output_expires_after", &s.output_expires_after)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

impl OaiClient {
    pub(crate) fn new(settings: OaiSettings, http: reqwest::Client) -> Self {
        Self { http, settings, retry: RetryPolicy::default() }
    }

    pub(crate) fn provider(&self) -> ProviderKind {
        self.settings.provider
    }

    pub(crate) fn base_url(&self) -> &Url {
        &self.settings.base_url
    }

    /// `base/segments...`, with `?api-version=` when the surface has one.
    pub(crate) fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.settings.base_url.clone();
        // The base URL was checked to take path segments.
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        if let Some(version) = &self.settings.api_version {
            url.query_pairs_mut().append_pair("api-version", version);
        }
        url
    }

    fn request(&self, method: Method, url: Url) -> RequestBuilder {
        let auth = self.settings.auth;
        let request = self.http.request(method, url);
        match auth.header_value(self.settings.secret.expose_secret()) {
            Some(value) => request.header(auth.header_name(), value),
            // The key was checked at construction; an unsendable key goes without one (and 401s).
            None => request,
        }
    }

    /// Removes the key from any text the provider echoed back (invariant 8).
    fn redact(&self, err: UpstreamError) -> UpstreamError {
        err.redact(self.settings.secret.expose_secret())
    }

    /// A JSON call: sent once, or retried per the policy when `retry` (reads and deletes only).
    async fn call_json<T: serde::de::DeserializeOwned, B: Serialize + Sync>(
        &self,
        method: Method,
        url: Url,
        body: Option<&B>,
        retry: bool,
    ) -> Result<T, UpstreamError> {
        let path = url.path().to_owned();
        let result = http::call_json(self.provider(), &self.retry, retry, &method, &path, || {
            let request = self.request(method.clone(), url.clone());
            match body {
                Some(body) => request.json(body),
                None => request,
            }
        })
        .await;
        result.map_err(|err| self.redact(err))
    }

    /// Uploads JSONL input lines (streamed) as `tranche-<id>.jsonl`, purpose batch. Never
    /// retried.
    pub(crate) async fn upload(
        &self,
        tranche: TrancheId,
        body: UploadBody,
    ) -> Result<UploadedFile, UpstreamError> {
        let provider = self.provider();
        let filename = crate::batch_file_name(tranche);
        let len = body.len;
        let part = Part::stream_with_length(reqwest::Body::wrap_stream(body.stream), len)
            .file_name(filename.clone())
            .mime_str("application/jsonl")
            .map_err(|err| UpstreamError::new(provider, ErrorKind::Transport, err.to_string()))?;
        let mut form = Form::new().text("purpose", "batch");
        if let Some(seconds) = self.settings.file_expires_after {
            // The SDKs' bracket form (`extra_body={"expires_after": ...}` on Azure).
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
                provider,
                self.request(method.clone(), url).multipart(form),
                &method,
                &url_path,
            )
            .await?;
            http::read_json(provider, response, &method, &url_path).await
        }
        .await;
        let file = result.map_err(|err| self.redact(err))?;
        if self.settings.file_expires_after.is_some() && file.expires_at.is_none() {
            tracing::warn!(%provider, file_id = %file.id, %filename, "upload accepted but the provider reports no expiry");
        }
        Ok(UploadedFile {
            id: FileId::new(file.id),
            bytes: file.bytes.unwrap_or(len),
            filename: file.filename.filter(|f| !f.is_empty()).unwrap_or(filename),
            created_at: file.created_at,
            expires_at: file.expires_at,
        })
    }

    /// One page of the account's files, newest first, of one purpose or of all.
    pub(crate) async fn list_files(
        &self,
        purpose: Option<&str>,
        after: Option<&FileId>,
        limit: u32,
    ) -> Result<FilePage, UpstreamError> {
        let mut url = self.url(&["files"]);
        {
            let mut query = url.query_pairs_mut();
            if let Some(purpose) = purpose {
                query.append_pair("purpose", purpose);
            }
            query.append_pair("order", "desc");
            query.append_pair("limit", &limit.clamp(1, 10_000).to_string());
            if let Some(after) = after {
                query.append_pair("after", after.as_str());
            }
        }
        let list: WireFileList = self.call_json(Method::GET, url, NO_BODY, true).await?;
        let next = list
            .last_id
            .filter(|id| !id.is_empty())
            .or_else(|| list.data.last().map(|f| f.id.clone()))
            .map(FileId::new);
        // A cursor that does not move would list the same page forever.
        let has_more = list.has_more.unwrap_or(false) && next.as_ref() != after;
        Ok(FilePage {
            data: list.data.into_iter().map(WireFile::into_remote).collect(),
            has_more,
            last_id: next,
        })
    }

    /// Finds a live batch input file by its name, newest first, walking every page.
    pub(crate) async fn find_file(
        &self,
        filename: &str,
    ) -> Result<Option<UploadedFile>, UpstreamError> {
        let mut after: Option<FileId> = None;
        loop {
            let page = self.list_files(Some("batch"), after.as_ref(), 1000).await?;
            if let Some(file) = page.data.into_iter().find(|f| f.filename == filename) {
                return Ok(Some(UploadedFile {
                    id: file.id,
                    bytes: file.bytes,
                    filename: file.filename,
                    created_at: file.created_at,
                    expires_at: file.expires_at,
                }));
            }
            match page.last_id {
                Some(next) if page.has_more => after = Some(next),
                _ => return Ok(None),
            }
        }
    }

    /// Creates a batch from an uploaded file. Never retried.
    pub(crate) async fn create(&self, req: CreateBatch<'_>) -> Result<RemoteBatch, UpstreamError> {
        let BatchInput::File(input_file_id) = req.input else {
            return Err(UpstreamError::new(
                self.provider(),
                ErrorKind::Unsupported,
                "batches start from an uploaded file, not inline requests",
            ));
        };
        let body = WireCreateBatch {
            input_file_id: input_file_id.as_str(),
            endpoint: self.settings.endpoint_style.render(req.endpoint),
            completion_window: "24h",
            metadata: BTreeMap::from([(
                crate::TRANCHE_ID_METADATA_KEY,
                req.tranche_id.to_string(),
            )]),
            output_expires_after: self
                .settings
                .output_expires_after
                .map(|seconds| WireExpiresAfter { anchor: "created_at", seconds }),
        };
        // Not retried: a second create would be a second batch (the engine adopts by metadata).
        let batch: WireBatch =
            self.call_json(Method::POST, self.url(&["batches"]), Some(&body), false).await?;
        Ok(batch.into())
    }

    pub(crate) async fn retrieve(&self, id: &BatchId) -> Result<RemoteBatch, UpstreamError> {
        let url = self.url(&["batches", id.as_str()]);
        let batch: WireBatch = self.call_json(Method::GET, url, NO_BODY, true).await?;
        Ok(batch.into())
    }

    /// One page, `limit` clamped to 1..=100, after the `after` cursor.
    pub(crate) async fn list(
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
        let list: WirePage<WireBatch> = self.call_json(Method::GET, url, NO_BODY, true).await?;
        Ok(list.into_page())
    }

    /// Asks for cancellation. Never retried.
    pub(crate) async fn cancel(&self, id: &BatchId) -> Result<RemoteBatch, UpstreamError> {
        let url = self.url(&["batches", id.as_str(), "cancel"]);
        let batch: WireBatch = self.call_json(Method::POST, url, NO_BODY, false).await?;
        Ok(batch.into())
    }

    /// A file's content as a stream; the request is retried on transient failures until an
    /// answer starts.
    pub(crate) async fn download(&self, id: &FileId) -> Result<Download, UpstreamError> {
        let provider = self.provider();
        let method = Method::GET;
        let url = self.url(&["files", id.as_str(), "content"]);
        let path = url.path().to_owned();
        let result = http::with_retries(&self.retry, true, || async {
            http::send(provider, self.request(method.clone(), url.clone()), &method, &path).await
        })
        .await;
        let response = result.map_err(|err| self.redact(err))?;
        Ok(http::into_download(provider, response, &method, &path))
    }

    /// Deletes a file; 404 counts as already deleted. Retried on transient failures.
    pub(crate) async fn delete_file(&self, id: &FileId) -> Result<(), UpstreamError> {
        let provider = self.provider();
        let url = self.url(&["files", id.as_str()]);
        match self.call_json::<WireDeleted, _>(Method::DELETE, url, NO_BODY, true).await {
            Ok(WireDeleted { deleted: Some(false) }) => {
                let mut err = UpstreamError::new(
                    provider,
                    ErrorKind::Decode,
                    format!("{provider} did not delete file {id}"),
                );
                err.status = Some(200);
                Err(err)
            }
            Ok(_) => Ok(()),
            Err(err) if err.kind == ErrorKind::Http && err.status == Some(404) => {
                tracing::debug!(%provider, file_id = %id, "file already gone");
                Ok(())
            }
            Err(err) => Err(err),
        }
    }
}

/// Reads one line of an OpenAI-shaped output or error file (with or without an `id`).
pub(crate) fn parse_result_line(
    provider: ProviderKind,
    line: &str,
) -> Result<ResultLine, LineParseError> {
    let whole = line;
    let line = line.trim();
    if line.is_empty() {
        return Err(LineParseError::Empty);
    }
    // One pass over the line, its body placed and its billed members kept raw, where it can be.
    let wire = read_line(
        line,
        |wire: WireResultLine<BodyParts<'_>>| wire.map_body(|parts| parts.in_line(line)),
        |wire: WireResultLine<&RawValue>| wire.map_body(|raw| Some(Body::whole(raw))),
    )?;
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
                body: range_within(whole, body.text),
                usage: Usage::openai(body),
            },
        });
    }
    let raw = response.body.map(|body| body.text).unwrap_or_default();
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

/// A line of an output or error file, its response body read as `B`.
#[derive(Debug, Deserialize)]
#[serde(bound(deserialize = "B: Deserialize<'de>"))]
struct WireResultLine<B> {
    custom_id: String,
    #[serde(default)]
    response: Option<WireLineResponse<B>>,
    #[serde(default)]
    error: Option<WireLineError>,
}

#[derive(Debug, Deserialize)]
#[serde(bound(deserialize = "B: Deserialize<'de>"))]
struct WireLineResponse<B> {
    status_code: u16,
    #[serde(default)]
    request_id: Option<String>,
    #[serde(default)]
    body: Option<B>,
}

impl<B> WireResultLine<B> {
    /// The line with its body made a `C` by `f`; `None` when `f` gives none.
    fn map_body<C>(self, f: impl FnOnce(B) -> Option<C>) -> Option<WireResultLine<C>> {
        let response = match self.response {
            Some(r) => {
                let body = match r.body {
                    Some(body) => Some(f(body)?),
                    None => None,
                };
                Some(WireLineResponse {
                    status_code: r.status_code,
                    request_id: r.request_id,
                    body,
                })
            }
            None => None,
        };
        Some(WireResultLine { custom_id: self.custom_id, response, error: self.error })
    }
}

#[derive(Debug, Deserialize)]
struct WireLineError {
    #[serde(default)]
    code: Option<serde_json::Value>,
    #[serde(default)]
    message: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct WireFile {
    id: String,
    #[serde(default)]
    bytes: Option<u64>,
    #[serde(default)]
    filename: Option<String>,
    #[serde(default)]
    purpose: Option<String>,
    #[serde(deserialize_with = "timestamp")]
    created_at: i64,
    #[serde(default, deserialize_with = "opt_timestamp")]
    expires_at: Option<i64>,
}

impl WireFile {
    fn into_remote(self) -> RemoteFile {
        RemoteFile {
            id: FileId::new(self.id),
            filename: self.filename.unwrap_or_default(),
            purpose: self.purpose.unwrap_or_default(),
            bytes: self.bytes.unwrap_or(0),
            created_at: self.created_at,
            expires_at: self.expires_at,
        }
    }
}

#[derive(Debug, Deserialize)]
struct WireFileList {
    #[serde(default)]
    data: Vec<WireFile>,
    #[serde(default)]
    has_more: Option<bool>,
    #[serde(default)]
    last_id: Option<String>,
}

#[derive(Debug, Deserialize)]
struct WireDeleted {
    #[serde(default)]
    deleted: Option<bool>,
}

#[derive(Debug, Serialize)]
pub(crate) struct WireCreateBatch<'a> {
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

/// A batch object, read leniently (Azure's quirks included).
#[derive(Debug, Deserialize)]
pub(crate) struct WireBatch {
    id: String,
    #[serde(deserialize_with = "batch_status")]
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
    request_counts: Option<WireCounts>,
    #[serde(default)]
    errors: Option<WireBatchErrors>,
    #[serde(default)]
    metadata: Option<BTreeMap<String, serde_json::Value>>,
    #[serde(deserialize_with = "timestamp")]
    created_at: i64,
    #[serde(default, deserialize_with = "opt_timestamp")]
    expires_at: Option<i64>,
}

/// `request_counts`, where Azure may send each count as null while validating.
#[derive(Debug, Default, Deserialize)]
struct WireCounts {
    #[serde(default)]
    total: Option<u64>,
    #[serde(default)]
    completed: Option<u64>,
    #[serde(default)]
    failed: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct WireBatchErrors {
    #[serde(default)]
    data: Option<Vec<WireBatchError>>,
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

/// A batch status in any case and spelling the providers use (`in_progress`, `InProgress`,
/// `Validating`, `canceled`).
pub(crate) fn parse_status(text: &str) -> Option<BatchStatus> {
    let key: String = text
        .chars()
        .filter(|c| !matches!(c, '_' | '-' | ' '))
        .map(|c| c.to_ascii_lowercase())
        .collect();
    Some(match key.as_str() {
        "validating" => BatchStatus::Validating,
        "inprogress" => BatchStatus::InProgress,
        "finalizing" => BatchStatus::Finalizing,
        "completed" => BatchStatus::Completed,
        "failed" => BatchStatus::Failed,
        "expired" => BatchStatus::Expired,
        "cancelling" | "canceling" => BatchStatus::Cancelling,
        "cancelled" | "canceled" => BatchStatus::Cancelled,
        _ => return None,
    })
}

fn batch_status<'de, D: Deserializer<'de>>(d: D) -> Result<BatchStatus, D::Error> {
    let text = String::deserialize(d)?;
    parse_status(&text)
        .ok_or_else(|| serde::de::Error::custom(format!("unknown batch status `{text}`")))
}

/// An id; an empty string (Azure's fail-fast example) reads as none.
fn non_empty(id: Option<String>) -> Option<String> {
    id.filter(|id| !id.trim().is_empty())
}

impl From<WireBatch> for RemoteBatch {
    fn from(wire: WireBatch) -> Self {
        let counts = wire.request_counts.unwrap_or_default();
        Self {
            id: BatchId::new(wire.id),
            status: wire.status,
            endpoint: non_empty(wire.endpoint),
            input_file_id: non_empty(wire.input_file_id).map(FileId::new),
            output_file_id: non_empty(wire.output_file_id).map(FileId::new),
            error_file_id: non_empty(wire.error_file_id).map(FileId::new),
            results_url: None,
            request_counts: RequestCounts {
                total: counts.total.unwrap_or(0),
                completed: counts.completed.unwrap_or(0),
                failed: counts.failed.unwrap_or(0),
            },
            errors: wire
                .errors
                .and_then(|errors| errors.data)
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

/// The API key (required, not blank) and the base URL (override, else the variable; blank means
/// unset) that an adapter's `from_env` reads, the same way for every provider.
pub(crate) fn key_and_base_url(
    provider: ProviderKind,
    key_var: &'static str,
    base_var: &str,
    base_url_override: Option<String>,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<(SecretString, Option<String>), ConfigError> {
    let key = lookup(key_var).ok_or(ConfigError::MissingEnv { var: key_var, provider })?;
    if key.trim().is_empty() {
        return Err(ConfigError::EmptyApiKey { provider });
    }
    let base_url = base_url_override
        .or_else(|| lookup(base_var))
        .filter(|url| !url.trim().is_empty())
        .map(|url| url.trim().to_owned());
    Ok((SecretString::from(key), base_url))
}

/// Implements `Provider` for an adapter whose `client` field is an [`OaiClient`]: OpenAI and
/// Azure differ in configuration and URLs, not in what each batch step does.
macro_rules! forward_provider {
    ($adapter:ty) => {
        #[async_trait::async_trait]
        impl $crate::provider::Provider for $adapter {
            fn kind(&self) -> tranche_core::ProviderKind {
                self.client.provider()
            }

            fn account(&self) -> tranche_core::AccountId {
                $crate::http::account_of(self.client.provider(), self.client.base_url())
            }

            async fn find_batch_file(
                &self,
                tranche: tranche_core::TrancheId,
            ) -> Result<Option<$crate::types::UploadedFile>, $crate::error::UpstreamError> {
                self.client.find_file(&$crate::batch_file_name(tranche)).await
            }

            async fn list_files(
                &self,
                after: Option<&$crate::types::FileId>,
                limit: u32,
            ) -> Result<$crate::types::FilePage, $crate::error::UpstreamError> {
                self.client.list_files(None, after, limit).await
            }

            async fn upload_batch_file(
                &self,
                tranche: tranche_core::TrancheId,
                body: $crate::streams::UploadBody,
            ) -> Result<$crate::types::UploadedFile, $crate::error::UpstreamError> {
                self.client.upload(tranche, body).await
            }

            async fn create_batch(
                &self,
                req: $crate::types::CreateBatch<'_>,
            ) -> Result<$crate::types::RemoteBatch, $crate::error::UpstreamError> {
                self.client.create(req).await
            }

            async fn retrieve_batch(
                &self,
                id: &$crate::types::BatchId,
            ) -> Result<$crate::types::RemoteBatch, $crate::error::UpstreamError> {
                self.client.retrieve(id).await
            }

            async fn list_batches(
                &self,
                after: Option<&$crate::types::BatchId>,
                limit: u32,
            ) -> Result<$crate::types::BatchPage, $crate::error::UpstreamError> {
                self.client.list(after, limit).await
            }

            async fn cancel_batch(
                &self,
                id: &$crate::types::BatchId,
            ) -> Result<$crate::types::RemoteBatch, $crate::error::UpstreamError> {
                self.client.cancel(id).await
            }

            async fn download_file(
                &self,
                id: &$crate::types::FileId,
            ) -> Result<$crate::streams::Download, $crate::error::UpstreamError> {
                self.client.download(id).await
            }

            async fn delete_file(
                &self,
                id: &$crate::types::FileId,
            ) -> Result<(), $crate::error::UpstreamError> {
                self.client.delete_file(id).await
            }

            fn parse_result_line(
                &self,
                line: &str,
            ) -> Result<$crate::types::ResultLine, $crate::error::LineParseError> {
                $crate::oai::parse_result_line(self.client.provider(), line)
            }
        }
    };
}
pub(crate) use forward_provider;

#[cfg(test)]
mod tests {
    use super::*;
    use tranche_core::TokenUsage;

    fn failed(line: &str) -> LineError {
        match parse_result_line(ProviderKind::Openai, line).unwrap().outcome {
            LineOutcome::Failed(err) => err,
            LineOutcome::Succeeded { .. } => panic!("expected a failure: {line}"),
        }
    }

    #[test]
    fn success_line() {
        // Leading blanks and a line end, as read from a file: the body's range is in the line
        // as given.
        let line = "  {\"id\":\"batch_req_1\",\"custom_id\":\"w-1\",\"response\":{\"status_code\":200,\"request_id\":\"req_a\",\"body\":{\"id\":\"chatcmpl-1\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3,\"total_tokens\":10}}},\"error\":null}\n";
        let parsed = parse_result_line(ProviderKind::Openai, line).unwrap();
        assert_eq!(parsed.wire_id, "w-1");
        match parsed.outcome {
            LineOutcome::Succeeded { status_code, request_id, body, usage } => {
                assert_eq!(status_code, 200);
                assert_eq!(request_id.as_deref(), Some("req_a"));
                assert_eq!(
                    &line[body],
                    r#"{"id":"chatcmpl-1","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}"#
                );
                let tokens = TokenUsage { input: 7, output: 3, ..TokenUsage::default() };
                assert_eq!(usage, Usage { model: None, tokens: Some(tokens) });
            }
            LineOutcome::Failed(err) => panic!("{err}"),
        }
    }

    fn usage_of(body: &str) -> Usage {
        let line = format!(
            r#"{{"id":"b","custom_id":"w","response":{{"status_code":200,"body":{body}}},"error":null}}"#
        );
        match parse_result_line(ProviderKind::Openai, &line).unwrap().outcome {
            LineOutcome::Succeeded { usage, .. } => usage,
            LineOutcome::Failed(err) => panic!("{err}"),
        }
    }

    #[test]
    fn usage_details_of_chat_and_responses() {
        // Chat: prompt_tokens already counts the cached part.
        let chat = usage_of(
            r#"{"model":"gpt-4o-mini-2024-07-18","usage":{"prompt_tokens":2048,"completion_tokens":300,
                "prompt_tokens_details":{"cached_tokens":1920},
                "completion_tokens_details":{"reasoning_tokens":128}}}"#,
        );
        assert_eq!(chat.model.as_deref(), Some("gpt-4o-mini-2024-07-18"));
        let t = chat.tokens.unwrap();
        assert_eq!((t.input, t.cached_input, t.uncached_input()), (2048, 1920, 128));
        assert_eq!((t.output, t.reasoning, t.cache_write()), (300, 128, 0));
        // Responses: input_tokens and its details.
        let t = usage_of(
            r#"{"model":"o4-mini","usage":{"input_tokens":1500,"input_tokens_details":{"cached_tokens":1024},
                "output_tokens":50,"output_tokens_details":{"reasoning_tokens":20}}}"#,
        )
        .tokens
        .unwrap();
        assert_eq!((t.input, t.cached_input, t.output, t.reasoning), (1500, 1024, 50, 20));
        // Embeddings: input only. No usage at all: none.
        let t = usage_of(r#"{"usage":{"prompt_tokens":8,"total_tokens":8}}"#).tokens.unwrap();
        assert_eq!((t.input, t.output), (8, 0));
        assert_eq!(usage_of(r#"{"choices":[]}"#).tokens, None);
        // Odd but numeric usage is still read, never lost: decimals, both spellings at once.
        let t = usage_of(
            r#"{"model":"m","usage":{"prompt_tokens":12.0,"input_tokens":12,"completion_tokens":3}}"#,
        )
        .tokens
        .unwrap();
        assert_eq!((t.input, t.output), (12, 3));
    }

    #[test]
    fn bodies_read_in_one_pass_or_again_give_the_same() {
        // The line is read once where its body's keys can be borrowed; an escaped key sends it
        // through the second read, with the same range and usage.
        let body = |line: &str| match parse_result_line(ProviderKind::Openai, line).unwrap().outcome
        {
            LineOutcome::Succeeded { body, usage, .. } => (line[body].to_owned(), usage),
            LineOutcome::Failed(err) => panic!("{err}"),
        };
        let usage = |model: &str, input, output| Usage {
            model: Some(model.to_owned()),
            tokens: Some(TokenUsage { input, output, ..TokenUsage::default() }),
        };
        let plain = r#"{"custom_id":"w","response":{"status_code":200,"body" : { "model":"m", "usage":{"prompt_tokens":4,"completion_tokens":2} } }}"#;
        let escaped = r#"{"custom_id":"w","response":{"status_code":200,"body" : { "mod\u0065l":"m", "usage":{"prompt_tokens":4,"completion_tokens":2} } }}"#;
        assert_eq!(
            body(plain),
            (
                r#"{ "model":"m", "usage":{"prompt_tokens":4,"completion_tokens":2} }"#.to_owned(),
                usage("m", 4, 2)
            )
        );
        assert_eq!(
            body(escaped),
            (
                r#"{ "mod\u0065l":"m", "usage":{"prompt_tokens":4,"completion_tokens":2} }"#
                    .to_owned(),
                usage("m", 4, 2)
            )
        );
        // A usage named twice: the strict read refuses it, the lenient one takes the last.
        let twice = r#"{"custom_id":"w","response":{"status_code":200,"body":{"model":"m","usage":{"prompt_tokens":1},"usage":{"prompt_tokens":9,"completion_tokens":1}}}}"#;
        assert_eq!(body(twice).1, usage("m", 9, 1));
        // A model that is not text: the lenient read keeps the usage and names no model.
        let odd = r#"{"custom_id":"w","response":{"status_code":200,"body":{"model":7,"usage":{"prompt_tokens":5}}}}"#;
        assert_eq!(body(odd).1, Usage { model: None, ..usage("m", 5, 0) });
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
        // Azure's example output line: no `id`, content-filter annotations in the body.
        let line = r#"{"custom_id":"task-0","response":{"body":{"choices":[{"content_filter_results":{"hate":{"filtered":false,"severity":"safe"}},"finish_reason":"stop","index":0,"message":{"content":"Hi","role":"assistant"}}],"prompt_filter_results":[]},"request_id":"660b7424-b648-4b67-addc-862ba067d442","status_code":200},"error":null}"#;
        let parsed = parse_result_line(ProviderKind::Azure, line).unwrap();
        assert_eq!(parsed.wire_id, "task-0");
        let LineOutcome::Succeeded { request_id, body, .. } = parsed.outcome else {
            panic!("expected success")
        };
        assert_eq!(request_id.as_deref(), Some("660b7424-b648-4b67-addc-862ba067d442"));
        assert!(line[body].contains("content_filter_results"));
    }

    #[test]
    fn garbage_lines_say_why() {
        let parse = |line: &str| parse_result_line(ProviderKind::Openai, line);
        assert_eq!(parse("  ").unwrap_err(), LineParseError::Empty);
        let err = parse("not json").unwrap_err();
        assert!(matches!(err, LineParseError::Invalid(_)));
        assert!(err.to_string().contains("expected"), "{err}");
        let err = parse(r#"{"response":null,"error":null}"#).unwrap_err();
        assert!(err.to_string().contains("custom_id"), "{err}");
        assert_eq!(
            parse(r#"{"custom_id":"x","response":null,"error":null}"#).unwrap_err(),
            LineParseError::NoOutcome
        );
        assert_eq!(
            parse(r#"{"custom_id":"x","response":{"status_code":200},"error":null}"#).unwrap_err(),
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
        assert_eq!(batch.expires_at, Some(1_711_557_933));
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
    fn azure_legacy_rest_example_reads() {
        // batch-rest.md's create response: ISO timestamps, capitalised status, null counts.
        let wire: WireBatch = serde_json::from_str(
            r#"{"cancelled_at":null,"cancelling_at":null,"completed_at":null,"completion_window":"24h",
                "created_at":"2024-07-19T17:13:57.2491382+00:00","error_file_id":null,"expired_at":null,
                "expires_at":"2024-07-20T17:13:57.1918498+00:00","failed_at":null,"finalizing_at":null,
                "id":"batch_fe3f047a-de39-4068-9008-346795bfc1db","in_progress_at":null,
                "input_file_id":"file-21006e70789246658b86a1fc205899a4","errors":null,"metadata":null,
                "object":"batch","output_file_id":null,"request_counts":{"total":null,"completed":null,"failed":null},
                "status":"Validating","endpoint":null}"#,
        )
        .unwrap();
        let batch = RemoteBatch::from(wire);
        assert_eq!(batch.status, BatchStatus::Validating);
        assert_eq!(batch.created_at, 1_721_409_237);
        assert_eq!(batch.expires_at, Some(1_721_409_237 + 86_400));
        assert_eq!(batch.request_counts, RequestCounts::default());
        assert_eq!(batch.endpoint, None);
        assert!(batch.metadata.is_empty());
        assert_eq!(
            batch.input_file_id.as_ref().map(FileId::as_str),
            Some("file-21006e70789246658b86a1fc205899a4")
        );

        // The failed fail-fast example: empty-string file ids, partly null counts.
        let wire: WireBatch = serde_json::from_str(
            r#"{"id":"batch_6caaf24d-54a5-46be-b1b7-518884fcbdde","status":"Failed","created_at":1729207423,
                "output_file_id":"","error_file_id":"","endpoint":"/chat/completions",
                "request_counts":{"total":0,"completed":null,"failed":null},
                "errors":{"object":"list","data":[{"code":"token_limit_exceeded","message":"Enqueued token limit reached.","param":null,"line":null}]}}"#,
        )
        .unwrap();
        let batch = RemoteBatch::from(wire);
        assert_eq!(batch.status, BatchStatus::Failed);
        assert_eq!(batch.output_file_id, None);
        assert_eq!(batch.error_file_id, None);
        assert_eq!(batch.errors[0].code.as_deref(), Some("token_limit_exceeded"));
        assert_eq!(batch.request_counts, RequestCounts::default());

        // A whole `request_counts: null` and a null `errors.data`.
        let wire: WireBatch = serde_json::from_str(
            r#"{"id":"b","status":"InProgress","created_at":"2024-07-19T17:13:57Z","request_counts":null,"errors":{"data":null}}"#,
        )
        .unwrap();
        let batch = RemoteBatch::from(wire);
        assert_eq!(batch.status, BatchStatus::InProgress);
        assert!(batch.errors.is_empty());
    }

    #[test]
    fn statuses_in_every_spelling() {
        let cases = [
            ("validating", BatchStatus::Validating),
            ("Validating", BatchStatus::Validating),
            ("in_progress", BatchStatus::InProgress),
            ("InProgress", BatchStatus::InProgress),
            ("IN_PROGRESS", BatchStatus::InProgress),
            ("Finalizing", BatchStatus::Finalizing),
            ("Completed", BatchStatus::Completed),
            ("Failed", BatchStatus::Failed),
            ("Expired", BatchStatus::Expired),
            ("Cancelling", BatchStatus::Cancelling),
            ("canceling", BatchStatus::Cancelling),
            ("Cancelled", BatchStatus::Cancelled),
            ("canceled", BatchStatus::Cancelled),
        ];
        for (text, status) in cases {
            assert_eq!(parse_status(text), Some(status), "{text}");
        }
        assert_eq!(parse_status("paused"), None);
        let err =
            serde_json::from_str::<WireBatch>(r#"{"id":"b","status":"paused","created_at":1}"#)
                .unwrap_err();
        assert!(err.to_string().contains("paused"), "{err}");
    }

    #[test]
    fn file_objects_in_both_forms() {
        let file: WireFile = serde_json::from_str(
            r#"{"status":"processed","bytes":817,"purpose":"batch","filename":"test.jsonl","id":"file-655111ec9cfc44489d9af078f08116ef","created_at":1721406525,"object":"file","status_details":null}"#,
        )
        .unwrap();
        assert_eq!(file.created_at, 1_721_406_525);
        assert_eq!(file.expires_at, None);
        let file: WireFile = serde_json::from_str(
            r#"{"id":"file-1","created_at":"2024-07-19T16:28:45Z","expires_at":"2024-08-02T16:28:45Z"}"#,
        )
        .unwrap();
        assert_eq!(file.expires_at.unwrap() - file.created_at, 1_209_600);
    }

    #[test]
    fn create_body_shape() {
        let file = FileId::new("file-1");
        let tranche = TrancheId::new();
        let body = WireCreateBatch {
            input_file_id: file.as_str(),
            endpoint: EndpointStyle::WithoutV1.render(Endpoint::ChatCompletions),
            completion_window: "24h",
            metadata: BTreeMap::from([(crate::TRANCHE_ID_METADATA_KEY, tranche.to_string())]),
            output_expires_after: Some(WireExpiresAfter { anchor: "created_at", seconds: 3600 }),
        };
        let json = serde_json::to_value(&body).unwrap();
        assert_eq!(json["metadata"]["tranche_id"], tranche.to_string());
        assert_eq!(json["output_expires_after"]["anchor"], "created_at");
        assert_eq!(json["output_expires_after"]["seconds"], 3600);
        assert_eq!(json["completion_window"], "24h");
        assert_eq!(json["endpoint"], "/chat/completions");
        assert_eq!(EndpointStyle::Full.render(Endpoint::Responses), "/v1/responses");
        assert_eq!(EndpointStyle::WithoutV1.render(Endpoint::Responses), "/responses");
    }

    #[test]
    fn keys_that_cannot_travel_are_refused() {
        let ok = SecretString::from("sk-abc");
        assert!(check_secret(ProviderKind::Azure, Auth::ApiKeyHeader, &ok).is_ok());
        let bad = SecretString::from("sk-a\nb");
        assert_eq!(
            check_secret(ProviderKind::Azure, Auth::ApiKeyHeader, &bad),
            Err(ConfigError::InvalidApiKey { provider: ProviderKind::Azure })
        );
        let empty = SecretString::from(" ");
        assert_eq!(
            check_secret(ProviderKind::Openai, Auth::Bearer, &empty),
            Err(ConfigError::EmptyApiKey { provider: ProviderKind::Openai })
        );
        let value = Auth::ApiKeyHeader.header_value("k").unwrap();
        assert!(value.is_sensitive());
    }
}
