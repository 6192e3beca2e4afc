//! Errors: `UpstreamError` keeps every fact a provider gave (status, type, code, message, request id).
//!
//! Invariant 7: an upstream error is never flattened. Whatever the provider said travels to the user
//! verbatim, together with whether a retry can help, decided from the status and kind only.
//! Invariant 8: nothing here ever holds an API key; adapters redact the key from provider text.

use std::fmt;
use std::time::{Duration, SystemTime};

use reqwest::header::HeaderMap;
use serde::{Deserialize, Serialize};
use tranche_core::ProviderKind;

/// What went wrong on the way to (or back from) a provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The provider answered with a non-success HTTP status.
    Http,
    /// The request or a read of the response timed out.
    Timeout,
    /// No connection could be made (DNS, refused, TLS handshake).
    Connect,
    /// The connection broke while sending the request or reading the response.
    Transport,
    /// A 2xx response whose body tranche could not read.
    Decode,
    /// A local file (the upload's source or the download's destination) could not be read or written.
    Io,
    /// The provider has no such operation (for example a file upload to Anthropic).
    Unsupported,
}

impl ErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Timeout => "timeout",
            Self::Connect => "connect",
            Self::Transport => "transport",
            Self::Decode => "decode",
            Self::Io => "io",
            Self::Unsupported => "unsupported",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error from a provider call, with every fact the provider gave, verbatim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[non_exhaustive]
pub struct UpstreamError {
    pub provider: ProviderKind,
    pub kind: ErrorKind,
    /// The HTTP status, when the provider answered.
    pub status: Option<u16>,
    /// The provider's error type (`invalid_request_error`, `rate_limit_error`, ...).
    pub error_type: Option<String>,
    /// The provider's error code (`quotaExceeded`, `invalid_api_key`, ...).
    pub code: Option<String>,
    /// The provider's message, or a description of the transport failure.
    pub message: String,
    pub param: Option<String>,
    /// From the body, or the `x-request-id` / `request-id` response header.
    pub request_id: Option<String>,
    /// How long the provider asked us to wait (`Retry-After`, `retry-after-ms`); stored as milliseconds.
    #[serde(rename = "retry_after_ms", default, with = "opt_duration_ms")]
    pub retry_after: Option<Duration>,
}

impl UpstreamError {
    /// An error with only a provider, kind and message; set the other (public) fields as needed.
    pub fn new(provider: ProviderKind, kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            provider,
            kind,
            status: None,
            error_type: None,
            code: None,
            message: message.into(),
            param: None,
            request_id: None,
            retry_after: None,
        }
    }

    /// Whether repeating the same call can succeed. Decided from status, error type and kind, never
    /// from text: 408, 429, 5xx (including 529), timeouts, connection, transport and local IO
    /// trouble are retryable; other 4xx (409 included: a batch in the wrong state for the call
    /// stays so) and undecodable 2xx bodies are not. An HTTP error without a
    /// status (never built by the adapters) is judged by its error type.
    pub fn retryable(&self) -> bool {
        match self.kind {
            ErrorKind::Http => match self.status {
                Some(status) => status_is_retryable(status),
                None => self.error_type.as_deref().is_some_and(error_type_is_retryable),
            },
            ErrorKind::Timeout | ErrorKind::Connect | ErrorKind::Transport | ErrorKind::Io => true,
            ErrorKind::Decode | ErrorKind::Unsupported => false,
        }
    }

    /// Whether the provider rejected tranche's own credentials (401 or 403).
    pub fn is_auth(&self) -> bool {
        self.kind == ErrorKind::Http && matches!(self.status, Some(401 | 403))
    }

    /// Builds the error for a non-success response from its status, headers and (possibly partial) body.
    pub(crate) fn from_response(
        provider: ProviderKind,
        status: u16,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Self {
        let mut err = Self::new(provider, ErrorKind::Http, String::new());
        err.status = Some(status);
        err.request_id = request_id_from_headers(headers);
        err.retry_after = retry_after_from_headers(headers, SystemTime::now());
        let parsed = parse_error_body(body);
        err.error_type = parsed.error_type;
        err.code = parsed.code;
        err.param = parsed.param;
        if parsed.request_id.is_some() {
            err.request_id = parsed.request_id;
        }
        err.message = match parsed.message {
            Some(message) => message,
            None => {
                let text = body_snippet(body);
                if text.is_empty() {
                    reqwest::StatusCode::from_u16(status)
                        .ok()
                        .and_then(|s| s.canonical_reason())
                        .unwrap_or("no response body")
                        .to_owned()
                } else {
                    text
                }
            }
        };
        err
    }

    /// Removes every occurrence of `secret` from the provider-supplied text (invariant 8).
    pub(crate) fn redact(mut self, secret: &str) -> Self {
        if secret.len() < 4 {
            return self;
        }
        let scrub = |s: &mut String| {
            if s.contains(secret) {
                *s = s.replace(secret, "[REDACTED]");
            }
        };
        scrub(&mut self.message);
        for s in [&mut self.error_type, &mut self.code, &mut self.param, &mut self.request_id]
            .into_iter()
            .flatten()
        {
            scrub(s);
        }
        self
    }
}

impl fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let provider = self.provider;
        match (self.kind, self.status) {
            (ErrorKind::Http, Some(status)) if matches!(status, 401 | 403) => {
                write!(f, "{provider} rejected tranche's credentials ({status}")?;
                if let Some(label) = self.label() {
                    write!(f, " {label}")?;
                }
                write!(f, "): {}", self.message)?;
            }
            (ErrorKind::Http, Some(status)) => {
                write!(f, "{provider} returned {status}")?;
                if let Some(label) = self.label() {
                    write!(f, " {label}")?;
                }
                write!(f, ": {}", self.message)?;
            }
            (ErrorKind::Http, None) => write!(f, "{provider} returned an error: {}", self.message)?,
            (ErrorKind::Timeout, _) => write!(f, "{provider} request timed out: {}", self.message)?,
            (ErrorKind::Unsupported, _) => {
                write!(f, "{provider} does not support this: {}", self.message)?;
            }
            (ErrorKind::Connect, _) => {
                write!(f, "could not connect to {provider}: {}", self.message)?;
            }
            (ErrorKind::Transport, _) => {
                write!(f, "connection to {provider} failed: {}", self.message)?;
            }
            (ErrorKind::Decode, Some(status)) => {
                write!(
                    f,
                    "{provider} returned {status} with a body tranche could not read: {}",
                    self.message
                )?;
            }
            (ErrorKind::Decode, None) => {
                write!(f, "{provider} returned a body tranche could not read: {}", self.message)?;
            }
            (ErrorKind::Io, _) => {
                write!(f, "local file error in a {provider} call: {}", self.message)?;
            }
        }
        if let Some(param) = &self.param {
            write!(f, " (param {param})")?;
        }
        if let Some(request_id) = &self.request_id {
            write!(f, " (request id {request_id})")?;
        }
        Ok(())
    }
}

impl UpstreamError {
    /// `type/code`, `type`, or `code`, whichever the provider gave.
    fn label(&self) -> Option<String> {
        match (&self.error_type, &self.code) {
            (Some(t), Some(c)) => Some(format!("{t}/{c}")),
            (Some(t), None) => Some(t.clone()),
            (None, Some(c)) => Some(c.clone()),
            (None, None) => None,
        }
    }
}

/// 408, 429 and every 5xx (including Anthropic's 529) may succeed when repeated; other 4xx will not.
pub(crate) fn status_is_retryable(status: u16) -> bool {
    matches!(status, 408 | 429) || (500..=599).contains(&status)
}

/// Whether a request that failed with this provider error type can succeed when sent again, for
/// errors that carry a type but no HTTP status (Anthropic's `errored` result lines).
///
/// Following Anthropic's guide ("an `invalid_request_error` must be fixed; other types can be
/// retried"): the request's own faults (`invalid_request_error`, `request_too_large`) and
/// account faults that a resend cannot cure (`authentication_error`, `permission_error`,
/// `not_found_error`, `billing_error`) are fatal; `api_error`, `overloaded_error`,
/// `rate_limit_error`, `timeout_error` and types tranche does not know yet are retryable.
pub(crate) fn error_type_is_retryable(error_type: &str) -> bool {
    !matches!(
        error_type,
        "invalid_request_error"
            | "request_too_large"
            | "authentication_error"
            | "permission_error"
            | "not_found_error"
            | "billing_error"
    )
}

/// A provider setting that cannot work; raised before any request is sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("{var} is not set; tranche needs it to call {provider}")]
    MissingEnv { var: &'static str, provider: ProviderKind },
    #[error("the {provider} API key is empty")]
    EmptyApiKey { provider: ProviderKind },
    #[error("the {provider} API key contains characters that cannot be sent in an HTTP header")]
    InvalidApiKey { provider: ProviderKind },
    #[error("`{url}` is not a usable base URL: {reason}")]
    InvalidBaseUrl { url: String, reason: String },
    #[error("{field} = {value} seconds is outside the allowed range {min}..={max}")]
    ExpiryOutOfRange { field: &'static str, value: u64, min: u64, max: u64 },
    #[error("`{value}` is not a usable {provider} API version")]
    InvalidApiVersion { value: String, provider: ProviderKind },
    #[error("the {name} header value cannot be sent in an HTTP header")]
    InvalidHeader { name: &'static str },
    #[error("could not build the HTTP client: {0}")]
    HttpClient(String),
}

/// Why one line of a provider's output or error file could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LineParseError {
    #[error("result line is empty")]
    Empty,
    #[error("result line is not a valid result object: {0}")]
    Invalid(String),
    #[error("result line has neither a `response` nor an `error`")]
    NoOutcome,
    #[error("result line has a {status} response without a `body`")]
    MissingBody { status: u16 },
}

/// The facts found in an error body of any of the providers' shapes:
/// OpenAI/Azure `{"error":{"message","type","param","code"}}` and
/// Anthropic `{"type":"error","error":{"type","message"},"request_id"}`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct ErrorBody {
    pub(crate) message: Option<String>,
    pub(crate) error_type: Option<String>,
    pub(crate) code: Option<String>,
    pub(crate) param: Option<String>,
    pub(crate) request_id: Option<String>,
}

/// Reads an error body; anything that is not one of the known shapes gives an empty `ErrorBody`.
pub(crate) fn parse_error_body(body: &[u8]) -> ErrorBody {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else {
        return ErrorBody::default();
    };
    let mut out =
        ErrorBody { request_id: string_field(&value, "request_id"), ..ErrorBody::default() };
    match value.get("error") {
        Some(error @ serde_json::Value::Object(_)) => {
            out.message = string_field(error, "message");
            out.error_type = string_field(error, "type");
            out.code = string_field(error, "code");
            out.param = string_field(error, "param");
        }
        Some(serde_json::Value::String(message)) => out.message = Some(message.clone()),
        _ => {
            out.message = string_field(&value, "message");
            out.code = string_field(&value, "code");
        }
    }
    out
}

/// A field as text: strings as they are, numbers and other values as JSON, null/absent as `None`.
pub(crate) fn string_field(value: &serde_json::Value, key: &str) -> Option<String> {
    match value.get(key)? {
        serde_json::Value::Null => None,
        serde_json::Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// The longest piece of a non-JSON error body kept as the message.
const MAX_SNIPPET: usize = 2000;

/// A non-JSON body as a trimmed message, cut at a character boundary.
pub(crate) fn body_snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.len() <= MAX_SNIPPET {
        return text.to_owned();
    }
    let mut end = MAX_SNIPPET;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// `x-request-id` (OpenAI, Azure) or `request-id` (Anthropic).
pub(crate) fn request_id_from_headers(headers: &HeaderMap) -> Option<String> {
    ["x-request-id", "request-id", "apim-request-id"]
        .into_iter()
        .filter_map(|name| headers.get(name))
        .filter_map(|value| value.to_str().ok())
        .map(str::trim)
        .find(|value| !value.is_empty())
        .map(str::to_owned)
}

/// `retry-after-ms` (milliseconds) first, then `Retry-After` (seconds or an HTTP-date).
pub(crate) fn retry_after_from_headers(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(Duration::from_secs_f64(ms / 1000.0));
    }
    parse_retry_after(header("retry-after")?, now)
}

/// Parses a `Retry-After` value: delta seconds (integer or decimal) or an HTTP-date.
pub(crate) fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

mod opt_duration_ms {
    //! Serializes `Option<Duration>` as whole milliseconds.

    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(
        value: &Option<Duration>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(d) => s.serialize_some(&u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_millis))
    }
}

#[cfg(test)]
mod tests {
    use reqwest::header::HeaderValue;

    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn parses_openai_error_body_with_all_four_keys() {
        let body = br#"{"error":{"message":"File is too large.","type":"invalid_request_error","param":"file","code":"file_too_large"}}"#;
        let err = UpstreamError::from_response(
            ProviderKind::Openai,
            400,
            &headers(&[("x-request-id", "req_123")]),
            body,
        );
        assert_eq!(err.kind, ErrorKind::Http);
        assert_eq!(err.status, Some(400));
        assert_eq!(err.message, "File is too large.");
        assert_eq!(err.error_type.as_deref(), Some("invalid_request_error"));
        assert_eq!(err.code.as_deref(), Some("file_too_large"));
        assert_eq!(err.param.as_deref(), Some("file"));
        assert_eq!(err.request_id.as_deref(), Some("req_123"));
        assert!(!err.retryable());
    }

    #[test]
    fn parses_null_keys_and_azure_and_anthropic_shapes() {
        let err = UpstreamError::from_response(
            ProviderKind::Openai,
            400,
            &HeaderMap::new(),
            br#"{"error":{"message":"File is too large.","type":"invalid_request_error","param":null,"code":null}}"#,
        );
        assert_eq!(err.code, None);
        assert_eq!(err.param, None);

        let azure = UpstreamError::from_response(
            ProviderKind::Azure,
            400,
            &HeaderMap::new(),
            br#"{"error": {"code": "quotaExceeded", "message": "The quota for files without expiry is reached. The maximum is 500."}}"#,
        );
        assert_eq!(azure.code.as_deref(), Some("quotaExceeded"));
        assert_eq!(azure.error_type, None);
        assert!(azure.message.starts_with("The quota"));

        let anthropic = UpstreamError::from_response(
            ProviderKind::Anthropic,
            529,
            &headers(&[("request-id", "req_header")]),
            br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_body"}"#,
        );
        assert_eq!(anthropic.error_type.as_deref(), Some("overloaded_error"));
        assert_eq!(anthropic.request_id.as_deref(), Some("req_body"));
        assert!(anthropic.retryable());
    }

    #[test]
    fn non_json_and_missing_bodies_keep_the_status() {
        let err = UpstreamError::from_response(
            ProviderKind::Openai,
            502,
            &headers(&[("request-id", "req_9")]),
            b"<html>Bad gateway</html>\n",
        );
        assert_eq!(err.message, "<html>Bad gateway</html>");
        assert_eq!(err.status, Some(502));
        assert_eq!(err.request_id.as_deref(), Some("req_9"));
        assert_eq!(err.code, None);
        assert!(err.retryable());

        let empty = UpstreamError::from_response(ProviderKind::Openai, 503, &HeaderMap::new(), b"");
        assert_eq!(empty.message, "Service Unavailable");

        let huge = vec![b'x'; 10_000];
        let err = UpstreamError::from_response(ProviderKind::Openai, 500, &HeaderMap::new(), &huge);
        assert!(err.message.len() < 2100);
    }

    #[test]
    fn retry_after_forms() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(parse_retry_after("7", now), Some(Duration::from_secs(7)));
        assert_eq!(parse_retry_after(" 1.5 ", now), Some(Duration::from_millis(1500)));
        let date = httpdate::fmt_http_date(now + Duration::from_secs(30));
        assert_eq!(parse_retry_after(&date, now), Some(Duration::from_secs(30)));
        let past = httpdate::fmt_http_date(now - Duration::from_secs(30));
        assert_eq!(parse_retry_after(&past, now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-3", now), None);

        let both = headers(&[("retry-after-ms", "250"), ("retry-after", "9")]);
        assert_eq!(retry_after_from_headers(&both, now), Some(Duration::from_millis(250)));
        let secs = headers(&[("retry-after", "9")]);
        assert_eq!(retry_after_from_headers(&secs, now), Some(Duration::from_secs(9)));
        assert_eq!(retry_after_from_headers(&HeaderMap::new(), now), None);
    }

    #[test]
    fn retryable_classification_table() {
        let cases: &[(ErrorKind, Option<u16>, bool)] = &[
            (ErrorKind::Http, Some(400), false),
            (ErrorKind::Http, Some(401), false),
            (ErrorKind::Http, Some(403), false),
            (ErrorKind::Http, Some(404), false),
            (ErrorKind::Http, Some(408), true),
            (ErrorKind::Http, Some(409), false),
            (ErrorKind::Http, Some(413), false),
            (ErrorKind::Http, Some(422), false),
            (ErrorKind::Http, Some(429), true),
            (ErrorKind::Http, Some(500), true),
            (ErrorKind::Http, Some(502), true),
            (ErrorKind::Http, Some(503), true),
            (ErrorKind::Http, Some(504), true),
            (ErrorKind::Http, Some(529), true),
            (ErrorKind::Http, None, false),
            (ErrorKind::Timeout, None, true),
            (ErrorKind::Connect, None, true),
            (ErrorKind::Transport, Some(200), true),
            (ErrorKind::Decode, Some(200), false),
            (ErrorKind::Io, None, true),
        ];
        for &(kind, status, expected) in cases {
            let mut err = UpstreamError::new(ProviderKind::Openai, kind, "x");
            err.status = status;
            assert_eq!(err.retryable(), expected, "{kind:?} {status:?}");
        }
    }

    #[test]
    fn statusless_errors_are_judged_by_type() {
        for (error_type, retryable) in [
            ("invalid_request_error", false),
            ("request_too_large", false),
            ("authentication_error", false),
            ("permission_error", false),
            ("not_found_error", false),
            ("billing_error", false),
            ("api_error", true),
            ("overloaded_error", true),
            ("rate_limit_error", true),
            ("timeout_error", true),
            ("some_new_error", true),
        ] {
            assert_eq!(error_type_is_retryable(error_type), retryable, "{error_type}");
            let mut err = UpstreamError::new(ProviderKind::Anthropic, ErrorKind::Http, "x");
            err.error_type = Some(error_type.to_owned());
            assert_eq!(err.retryable(), retryable, "{error_type}");
            // With a status, the status decides.
            err.status = Some(400);
            assert!(!err.retryable());
        }
    }

    #[test]
    fn retryable_ignores_message_text() {
        let mut err =
            UpstreamError::new(ProviderKind::Openai, ErrorKind::Http, "please retry, rate limit");
        err.status = Some(400);
        err.code = Some("rate_limit_exceeded".into());
        assert!(!err.retryable());
    }

    #[test]
    fn display_names_provider_status_code_message_and_request_id() {
        let key = "sk-test-abcdefghijklmnop";
        let body = format!(
            r#"{{"error":{{"message":"The quota is reached; key {key} was used.","type":"invalid_request_error","param":null,"code":"quotaExceeded"}}}}"#
        );
        let err = UpstreamError::from_response(
            ProviderKind::Openai,
            400,
            &headers(&[("x-request-id", "req_123")]),
            body.as_bytes(),
        )
        .redact(key);
        let text = err.to_string();
        assert_eq!(
            text,
            "openai returned 400 invalid_request_error/quotaExceeded: The quota is reached; key [REDACTED] was used. (request id req_123)"
        );
        assert!(!text.contains(key));
        let json = serde_json::to_string(&err).unwrap();
        assert!(!json.contains(key));
        assert!(!format!("{err:?}").contains(key));
    }

    #[test]
    fn auth_errors_say_whose_credentials_were_rejected() {
        let err = UpstreamError::from_response(
            ProviderKind::Openai,
            401,
            &headers(&[("x-request-id", "req_a")]),
            br#"{"error":{"message":"Incorrect API key provided.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#,
        );
        assert!(err.is_auth());
        assert!(!err.retryable());
        assert_eq!(
            err.to_string(),
            "openai rejected tranche's credentials (401 invalid_request_error/invalid_api_key): Incorrect API key provided. (request id req_a)"
        );
    }

    #[test]
    fn transport_kinds_display() {
        let err =
            UpstreamError::new(ProviderKind::Anthropic, ErrorKind::Timeout, "GET /v1/x: timed out");
        assert_eq!(err.to_string(), "anthropic request timed out: GET /v1/x: timed out");
        let mut err = UpstreamError::new(ProviderKind::Openai, ErrorKind::Decode, "expected value");
        err.status = Some(200);
        assert_eq!(
            err.to_string(),
            "openai returned 200 with a body tranche could not read: expected value"
        );
    }

    #[test]
    fn serde_round_trip() {
        let mut err = UpstreamError::new(ProviderKind::Openai, ErrorKind::Http, "slow down");
        err.status = Some(429);
        err.code = Some("rate_limit_exceeded".into());
        err.retry_after = Some(Duration::from_millis(1500));
        let json = serde_json::to_value(&err).unwrap();
        assert_eq!(json["provider"], "openai");
        assert_eq!(json["kind"], "http");
        assert_eq!(json["retry_after_ms"], 1500);
        let back: UpstreamError = serde_json::from_value(json).unwrap();
        assert_eq!(back, err);
    }

    #[test]
    fn short_secrets_are_not_redacted_and_long_ones_are() {
        let err = UpstreamError::new(ProviderKind::Openai, ErrorKind::Http, "key sk-abcd used");
        assert_eq!(err.clone().redact("sk").message, "key sk-abcd used");
        assert_eq!(err.redact("sk-abcd").message, "key [REDACTED] used");
    }
}
