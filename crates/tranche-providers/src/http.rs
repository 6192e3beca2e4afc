//! Resilient HTTP shared by the adapters: the one client, bounded retries, error and body handling.
//!
//! Only reads and deletes are retried here (they are safe to repeat); uploads and creates are sent
//! once, because repeating them could create a second file or batch (invariant 2).

use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use rand::Rng;
use reqwest::{Method, RequestBuilder, Response};
use serde::de::DeserializeOwned;
use tranche_core::{AccountId, ProviderKind};

use crate::error::{ConfigError, ErrorKind, UpstreamError, request_id_from_headers};
use crate::streams::Download;

/// `tranche/<version>`, sent with every request.
pub const USER_AGENT: &str = concat!("tranche/", env!("CARGO_PKG_VERSION"));

/// The most of an error body kept for the error (the rest is not read).
const MAX_ERROR_BODY: usize = 64 * 1024;

/// The one shared HTTP client: rustls, connect timeout 10 s, read timeout 120 s, pooled keep-alive
/// connections, user agent `tranche/<version>`.
pub fn http_client() -> Result<reqwest::Client, ConfigError> {
    reqwest::Client::builder()
        .tls_backend_rustls()
        .user_agent(USER_AGENT)
        .connect_timeout(Duration::from_secs(10))
        .read_timeout(Duration::from_secs(120))
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(16)
        .tcp_keepalive(Duration::from_secs(60))
        .build()
        .map_err(|err| ConfigError::HttpClient(error_chain(&err.without_url())))
}

/// How often and how long to retry reads and deletes that failed transiently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in total, including the first (1 = never retry).
    pub max_attempts: u32,
    /// The first backoff; it doubles with each attempt (with jitter).
    pub base_delay: Duration,
    /// The longest single sleep. A `Retry-After` longer than this ends the retries, and the error
    /// (with its `retry_after`) goes to the caller, who can wait without holding a connection.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// Never retry.
    pub fn none() -> Self {
        Self { max_attempts: 1, ..Self::default() }
    }

    /// The sleep before attempt `failed + 1`, or `None` when the provider asks for a longer wait
    /// than `max_delay`.
    fn delay(&self, failed: u32, retry_after: Option<Duration>) -> Option<Duration> {
        let exp = self.base_delay.saturating_mul(2u32.saturating_pow(failed.saturating_sub(1)));
        let capped = exp.min(self.max_delay);
        // Equal jitter: half fixed, half random, so that workers do not retry in lockstep.
        let half = capped / 2;
        let jitter_ms = u64::try_from(half.as_millis()).unwrap_or(u64::MAX);
        let backoff = half + Duration::from_millis(rand::rng().random_range(0..=jitter_ms));
        match retry_after {
            Some(wait) if wait > self.max_delay => None,
            Some(wait) => Some(wait.max(backoff).min(self.max_delay)),
            None => Some(backoff),
        }
    }
}

/// Runs `attempt` until it succeeds, fails for good, or the policy runs out of attempts.
pub(crate) async fn with_retries<T, F, Fut>(
    policy: &RetryPolicy,
    retry: bool,
    mut attempt: F,
) -> Result<T, UpstreamError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, UpstreamError>>,
{
    let max_attempts = if retry { policy.max_attempts.max(1) } else { 1 };
    let mut failed = 0;
    loop {
        let err = match attempt().await {
            Ok(value) => return Ok(value),
            Err(err) => err,
        };
        failed += 1;
        if failed >= max_attempts || !err.retryable() {
            return Err(err);
        }
        let Some(delay) = policy.delay(failed, err.retry_after) else {
            return Err(err);
        };
        tracing::debug!(
            provider = %err.provider,
            kind = %err.kind,
            status = err.status,
            request_id = err.request_id.as_deref(),
            attempt = failed,
            delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            "retrying provider call",
        );
        tokio::time::sleep(delay).await;
    }
}

/// A JSON call: the request `build` makes is sent once, or retried per `policy` when `retry`
/// (reads and deletes only), and a 2xx body is read as JSON.
pub(crate) async fn call_json<T: DeserializeOwned>(
    provider: ProviderKind,
    policy: &RetryPolicy,
    retry: bool,
    method: &Method,
    path: &str,
    build: impl Fn() -> RequestBuilder,
) -> Result<T, UpstreamError> {
    with_retries(policy, retry, || async {
        let response = send(provider, build(), method, path).await?;
        read_json(provider, response, method, path).await
    })
    .await
}

/// Sends one request; a non-success status becomes an `UpstreamError` with the body's facts.
pub(crate) async fn send(
    provider: ProviderKind,
    request: RequestBuilder,
    method: &Method,
    path: &str,
) -> Result<Response, UpstreamError> {
    let started = Instant::now();
    let mut response = match request.send().await {
        Ok(response) => response,
        Err(err) => {
            let err = transport_error(provider, err, method, path);
            tracing::debug!(provider = %provider, %method, path, kind = %err.kind, "provider request failed");
            return Err(err);
        }
    };
    let status = response.status();
    tracing::debug!(
        provider = %provider,
        %method,
        path,
        status = status.as_u16(),
        request_id = request_id_from_headers(response.headers()).as_deref(),
        elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        "provider response",
    );
    if status.is_success() {
        return Ok(response);
    }
    let headers = response.headers().clone();
    let mut body = Vec::new();
    // A body that breaks off halfway still tells the status; keep what arrived.
    while body.len() < MAX_ERROR_BODY {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    body.truncate(MAX_ERROR_BODY);
    Err(UpstreamError::from_response(provider, status.as_u16(), &headers, &body))
}

/// Reads a 2xx body as JSON; a body that does not parse is a `Decode` error.
pub(crate) async fn read_json<T: DeserializeOwned>(
    provider: ProviderKind,
    response: Response,
    method: &Method,
    path: &str,
) -> Result<T, UpstreamError> {
    let status = response.status().as_u16();
    let request_id = request_id_from_headers(response.headers());
    let bytes =
        response.bytes().await.map_err(|err| transport_error(provider, err, method, path))?;
    serde_json::from_slice(&bytes).map_err(|err| {
        let mut e =
            UpstreamError::new(provider, ErrorKind::Decode, format!("{method} {path}: {err}"));
        e.status = Some(status);
        e.request_id = request_id;
        e
    })
}

/// A 2xx body as a download: its bytes as they arrive, a broken transfer an upstream error.
pub(crate) fn into_download(
    provider: ProviderKind,
    response: Response,
    method: &Method,
    path: &str,
) -> Download {
    let (method, path) = (method.clone(), path.to_owned());
    let status = response.status().as_u16();
    let request_id = request_id_from_headers(response.headers());
    let stream = response.bytes_stream().map_err(move |err| {
        let mut e = transport_error(provider, err, &method, &path);
        e.status = Some(status);
        e.request_id.clone_from(&request_id);
        e
    });
    Download { stream: stream.boxed() }
}

/// A failure below HTTP: timeout, no connection, or a broken one.
pub(crate) fn transport_error(
    provider: ProviderKind,
    err: reqwest::Error,
    method: &Method,
    path: &str,
) -> UpstreamError {
    let kind = if err.is_timeout() {
        ErrorKind::Timeout
    } else if err.is_connect() {
        ErrorKind::Connect
    } else {
        ErrorKind::Transport
    };
    // The URL is left out: a base URL may carry credentials of its own.
    let chain = error_chain(&err.without_url());
    UpstreamError::new(provider, kind, format!("{method} {path}: {chain}"))
}

/// An error and its sources, joined by ": ".
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// The account a base URL reaches, without anything secret in it (user info, query, fragment).
pub(crate) fn account_of(provider: ProviderKind, base_url: &reqwest::Url) -> AccountId {
    let mut location = base_url.clone();
    let _ = location.set_username("");
    let _ = location.set_password(None);
    location.set_query(None);
    location.set_fragment(None);
    AccountId::new(provider, location.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_account_never_carries_credentials() {
        let url =
            reqwest::Url::parse("https://user:secret@api.example.com/v1/?key=sk-1#x").unwrap();
        let account = account_of(ProviderKind::Openai, &url);
        assert_eq!(account.as_str(), "openai https://api.example.com/v1");
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let policy = RetryPolicy::default();
        for failed in 1..=10 {
            let delay = policy.delay(failed, None).unwrap();
            let full = policy.base_delay.saturating_mul(2u32.pow(failed - 1)).min(policy.max_delay);
            assert!(delay >= full / 2 && delay <= full, "{failed}: {delay:?}");
        }
    }

    #[test]
    fn retry_after_is_honoured_and_bounded() {
        let policy = RetryPolicy::default();
        assert_eq!(policy.delay(1, Some(Duration::from_secs(3))), Some(Duration::from_secs(3)));
        assert_eq!(policy.delay(1, Some(Duration::from_secs(30))), Some(Duration::from_secs(30)));
        assert_eq!(policy.delay(1, Some(Duration::from_secs(31))), None);
        // A tiny Retry-After does not undercut the backoff.
        assert!(policy.delay(3, Some(Duration::ZERO)).unwrap() >= Duration::from_secs(1));
    }

    #[tokio::test]
    async fn retries_only_retryable_errors_and_stops_at_max_attempts() {
        let policy = RetryPolicy {
            max_attempts: 3,
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(5),
        };
        let calls = std::cell::Cell::new(0);
        let result: Result<(), _> = with_retries(&policy, true, || {
            calls.set(calls.get() + 1);
            async {
                let mut err = UpstreamError::new(ProviderKind::Openai, ErrorKind::Http, "busy");
                err.status = Some(503);
                Err(err)
            }
        })
        .await;
        assert_eq!(result.unwrap_err().status, Some(503));
        assert_eq!(calls.get(), 3);

        calls.set(0);
        let result: Result<(), _> = with_retries(&policy, true, || {
            calls.set(calls.get() + 1);
            async {
                let mut err = UpstreamError::new(ProviderKind::Openai, ErrorKind::Http, "bad");
                err.status = Some(400);
                Err(err)
            }
        })
        .await;
        assert!(result.is_err());
        assert_eq!(calls.get(), 1);

        calls.set(0);
        let result: Result<(), _> = with_retries(&policy, false, || {
            calls.set(calls.get() + 1);
            async { Err(UpstreamError::new(ProviderKind::Openai, ErrorKind::Timeout, "slow")) }
        })
        .await;
        assert!(result.is_err());
        assert_eq!(calls.get(), 1);

        calls.set(0);
        let result = with_retries(&policy, true, || {
            calls.set(calls.get() + 1);
            let n = calls.get();
            async move {
                if n < 2 {
                    Err(UpstreamError::new(ProviderKind::Openai, ErrorKind::Connect, "refused"))
                } else {
                    Ok(n)
                }
            }
        })
        .await;
        assert_eq!(result.unwrap(), 2);
    }

    #[test]
    fn client_builds() {
        assert!(http_client().is_ok());
        assert!(USER_AGENT.starts_with("tranche/"));
    }
}
