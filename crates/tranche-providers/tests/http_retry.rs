//! Retry behaviour of the OpenAI adapter against a scripted HTTP server: reads and deletes are
//! retried on transient failures (honouring Retry-After), creates are sent exactly once.

#![cfg(test)]

use std::time::Duration;

use secrecy::SecretString;
use tranche_core::{Endpoint, TrancheId};
use tranche_providers::{
    BatchId, BatchInput, CreateBatch, ErrorKind, FileId, OpenAiConfig, OpenAiProvider, Provider,
    RetryPolicy, http_client,
};
use tranche_test_support::scripted::{Reply, Scripted, Seen};

const KEY: &str = "sk-scripted-secret-0123456789";

/// A scripted server; every request it saw must carry the key.
async fn scripted(replies: Vec<Reply>) -> Scripted {
    Scripted::start(replies).await
}

/// The requests `server` saw, as `METHOD path`, each checked to carry the bearer key.
fn seen(server: &Scripted) -> Vec<String> {
    let seen = server.seen();
    for request in &seen {
        let auth = request.header("authorization").unwrap_or_default();
        assert_eq!(auth, format!("Bearer {KEY}"), "{}", request.line());
    }
    seen.iter().map(Seen::line).collect()
}

fn provider(root: &str) -> OpenAiProvider {
    let mut config = OpenAiConfig::new(SecretString::from(KEY));
    config.base_url = format!("{root}/v1");
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
    assert_eq!(seen(&server).len(), 3);
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
    assert_eq!(seen(&server).len(), 4);
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
    assert_eq!(seen(&server).len(), 1);
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
    assert_eq!(seen(&server), ["POST /v1/batches"]);
}

#[tokio::test]
async fn delete_retries_then_treats_404_as_gone() {
    let server = scripted(vec![
        (502, vec![], String::new()),
        (404, vec![], error_json("No such File object: file-9", "invalid_request_error", "")),
    ])
    .await;
    provider(&server.base_url).delete_file(&FileId::new("file-9")).await.unwrap();
    assert_eq!(seen(&server), ["DELETE /v1/files/file-9", "DELETE /v1/files/file-9"]);
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
    assert_eq!(seen(&server).len(), 1);
}

#[tokio::test]
async fn a_refused_connection_is_a_connect_error() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let provider = provider(&format!("http://{addr}")).with_retry_policy(RetryPolicy::none());
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
