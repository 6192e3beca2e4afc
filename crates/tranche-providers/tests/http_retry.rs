//! Retry behaviour of the OpenAI adapter against a scripted HTTP server: reads and deletes are
//! retried on transient failures (honouring Retry-After), creates are sent exactly once.

#![cfg(test)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use secrecy::SecretString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tranche_core::{Endpoint, TrancheId};
use tranche_providers::{
    BatchId, BatchInput, CreateBatch, ErrorKind, FileId, OpenAiConfig, OpenAiProvider, Provider,
    RetryPolicy, http_client,
};

const KEY: &str = "sk-scripted-secret-0123456789";

/// One canned answer: status, extra headers, body.
type Reply = (u16, Vec<(&'static str, String)>, String);

/// A server that answers each connection with the next scripted reply and records `METHOD path`.
struct Scripted {
    base_url: String,
    seen: Arc<Mutex<Vec<String>>>,
}

async fn scripted(replies: Vec<Reply>) -> Scripted {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    tokio::spawn(async move {
        for (status, headers, body) in replies {
            let (mut socket, _) = listener.accept().await.unwrap();
            let head = read_request(&mut socket).await;
            let request_line = head.lines().next().unwrap_or_default().to_owned();
            let mut parts = request_line.split(' ');
            let method = parts.next().unwrap_or_default();
            let path = parts.next().unwrap_or_default();
            log.lock().unwrap().push(format!("{method} {path}"));
            assert!(
                head.to_ascii_lowercase()
                    .contains(&format!("authorization: bearer {KEY}").to_ascii_lowercase())
            );
            let mut response = format!(
                "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\ncontent-type: application/json\r\n",
                body.len()
            );
            for (name, value) in headers {
                response.push_str(&format!("{name}: {value}\r\n"));
            }
            response.push_str("\r\n");
            response.push_str(&body);
            socket.write_all(response.as_bytes()).await.unwrap();
            socket.shutdown().await.ok();
        }
    });
    Scripted { base_url: format!("http://{addr}/v1"), seen }
}

/// Reads a request head and its content-length body; returns the head.
async fn read_request(socket: &mut tokio::net::TcpStream) -> String {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = socket.read(&mut chunk).await.unwrap();
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = find(&buf, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            let length = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>().unwrap())
                })
                .unwrap_or(0);
            while buf.len() < end + 4 + length {
                let n = socket.read(&mut chunk).await.unwrap();
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return head;
        }
    }
    String::from_utf8_lossy(&buf).into_owned()
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn provider(base_url: &str) -> OpenAiProvider {
    let mut config = OpenAiConfig::new(SecretString::from(KEY));
    config.base_url = base_url.to_owned();
    OpenAiProvider::new(config, http_client().unwrap()).unwrap().with_retry_policy(RetryPolicy {
        max_attempts: 4,
        base_delay: Duration::from_millis(5),
        max_delay: Duration::from_secs(2),
    })
}

fn batch_json(id: &str, status: &str) -> String {
    format!(
        r#"{{"id":"{id}","object":"batch","endpoint":"/v1/chat/completions","errors":null,"input_file_id":"file-1","completion_window":"24h","status":"{status}","output_file_id":null,"error_file_id":null,"created_at":1711471533,"expires_at":null,"request_counts":{{"total":0,"completed":0,"failed":0}},"metadata":{{}}}}"#
    )
}

fn error_json(message: &str, kind: &str, code: &str) -> String {
    format!(r#"{{"error":{{"message":"{message}","type":"{kind}","param":null,"code":"{code}"}}}}"#)
}

#[tokio::test]
async fn get_retries_429_and_503_then_succeeds() {
    let server = scripted(vec![
        (
            429,
            vec![("retry-after-ms", "20".into()), ("x-request-id", "req_1".into())],
            error_json("slow down", "rate_limit_error", "rate_limit_exceeded"),
        ),
        (503, vec![], "<html>unavailable</html>".into()),
        (200, vec![("x-request-id", "req_3".into())], batch_json("batch_1", "in_progress")),
    ])
    .await;
    let batch = provider(&server.base_url).retrieve_batch(&BatchId::new("batch_1")).await.unwrap();
    assert_eq!(batch.id.as_str(), "batch_1");
    assert_eq!(server.seen.lock().unwrap().len(), 3);
}

#[tokio::test]
async fn get_gives_up_after_max_attempts_with_the_last_error() {
    let replies = (0..4)
        .map(|i| {
            (
                500,
                vec![("x-request-id", format!("req_{i}"))],
                error_json("boom", "server_error", "server_error"),
            )
        })
        .collect();
    let server = scripted(replies).await;
    let err =
        provider(&server.base_url).retrieve_batch(&BatchId::new("batch_1")).await.unwrap_err();
    assert_eq!(err.status, Some(500));
    assert_eq!(err.request_id.as_deref(), Some("req_3"));
    assert!(err.retryable());
    assert_eq!(server.seen.lock().unwrap().len(), 4);
}

#[tokio::test]
async fn a_long_retry_after_is_handed_to_the_caller() {
    let server = scripted(vec![(
        429,
        vec![("retry-after", "120".into())],
        error_json("wait", "rate_limit_error", "rate_limit_exceeded"),
    )])
    .await;
    let err =
        provider(&server.base_url).retrieve_batch(&BatchId::new("batch_1")).await.unwrap_err();
    assert_eq!(err.status, Some(429));
    assert_eq!(err.retry_after, Some(Duration::from_secs(120)));
    assert_eq!(server.seen.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn create_is_never_retried() {
    let server = scripted(vec![(
        503,
        vec![("x-request-id", "req_c".into())],
        error_json("down", "server_error", "server_error"),
    )])
    .await;
    let file = FileId::new("file-1");
    let err = provider(&server.base_url)
        .create_batch(CreateBatch {
            tranche_id: TrancheId::new(),
            input: BatchInput::File(&file),
            endpoint: Endpoint::ChatCompletions,
        })
        .await
        .unwrap_err();
    assert_eq!(err.status, Some(503));
    assert!(err.retryable());
    assert_eq!(*server.seen.lock().unwrap(), ["POST /v1/batches"]);
}

#[tokio::test]
async fn delete_retries_then_treats_404_as_gone() {
    let server = scripted(vec![
        (502, vec![], String::new()),
        (404, vec![], error_json("No such File object: file-9", "invalid_request_error", "")),
    ])
    .await;
    provider(&server.base_url).delete_file(&FileId::new("file-9")).await.unwrap();
    assert_eq!(
        *server.seen.lock().unwrap(),
        ["DELETE /v1/files/file-9", "DELETE /v1/files/file-9"]
    );
}

#[tokio::test]
async fn delete_reports_other_errors() {
    let server =
        scripted(vec![(403, vec![], error_json("no", "invalid_request_error", "forbidden"))]).await;
    let err = provider(&server.base_url).delete_file(&FileId::new("file-9")).await.unwrap_err();
    assert_eq!(err.status, Some(403));
    assert!(err.is_auth());
}

#[tokio::test]
async fn a_2xx_body_that_does_not_parse_is_a_decode_error() {
    let server =
        scripted(vec![(200, vec![("x-request-id", "req_d".into())], "{\"id\":".into())]).await;
    let err =
        provider(&server.base_url).retrieve_batch(&BatchId::new("batch_1")).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Decode);
    assert_eq!(err.status, Some(200));
    assert_eq!(err.request_id.as_deref(), Some("req_d"));
    assert!(!err.retryable());
    assert_eq!(server.seen.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_refused_connection_is_a_connect_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let provider = provider(&format!("http://{addr}/v1")).with_retry_policy(RetryPolicy::none());
    let err = provider.retrieve_batch(&BatchId::new("batch_1")).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Connect);
    assert!(err.retryable());
    assert!(!err.to_string().contains(KEY));
}

#[tokio::test]
async fn provider_text_echoing_the_key_is_redacted() {
    let server = scripted(vec![(
        401,
        vec![],
        error_json(
            &format!("Incorrect API key provided: {KEY}."),
            "invalid_request_error",
            "invalid_api_key",
        ),
    )])
    .await;
    let err =
        provider(&server.base_url).retrieve_batch(&BatchId::new("batch_1")).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with(
            "openai rejected tranche's credentials (401 invalid_request_error/invalid_api_key)"
        ),
        "{text}"
    );
    assert!(!text.contains(KEY), "{text}");
    assert!(!serde_json::to_string(&err).unwrap().contains(KEY));
}
