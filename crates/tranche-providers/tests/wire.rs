//! The Azure and Anthropic adapters against a scripted HTTP server that records every request:
//! exact paths, queries, auth and version headers, bodies, and which calls are retried (reads and
//! deletes) or sent exactly once (uploads, creates, cancels).

#![cfg(test)]

use std::time::Duration;

use secrecy::SecretString;
use serde_json::value::RawValue;
use tranche_core::{Endpoint, TrancheId};
use tranche_providers::{
    AnthropicConfig, AnthropicProvider, AzureAuth, AzureConfig, AzureProvider, BatchId, BatchInput,
    BatchStatus, CreateBatch, ErrorKind, FileId, InlineInput, Provider, ProviderFiles, RetryPolicy,
    http_client,
};
use tranche_test_support::scripted::{Reply, Scripted};

const KEY: &str = "wire-secret-key-0123456789";

async fn scripted(replies: Vec<Reply>) -> Scripted {
    Scripted::start(replies).await
}

fn fast() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 4,
        base_delay: Duration::from_millis(2),
        max_delay: Duration::from_secs(2),
    }
}

fn azure_batch(status: &str) -> String {
    format!(
        r#"{{"id":"batch_6caaf24d","object":"batch","endpoint":"/chat/completions","errors":null,"input_file_id":"file-1","completion_window":"24h","status":"{status}","output_file_id":"","error_file_id":"","created_at":"2024-07-19T17:13:57.2491382+00:00","expires_at":"2024-07-20T17:13:57.1918498+00:00","request_counts":{{"total":null,"completed":null,"failed":null}},"metadata":null}}"#
    )
}

#[tokio::test]
async fn azure_v1_upload_and_create_are_sent_as_the_docs_show() {
    let server = scripted(vec![
        (
            200,
            vec![("apim-request-id", "apim-1".into())],
            r#"{"status":"processed","bytes":42,"purpose":"batch","filename":"x.jsonl","id":"file-655111ec","created_at":1721406525,"expires_at":1722616125,"object":"file","status_details":null}"#.into(),
        ),
        (200, vec![], azure_batch("validating")),
    ])
    .await;
    let config = AzureConfig::new(server.base_url.clone(), SecretString::from(KEY));
    let provider = AzureProvider::new(config, http_client().unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.jsonl");
    let body = RawValue::from_string(r#"{"model":"gpt-4o-batch","messages":[]}"#.into()).unwrap();
    let mut line = Vec::new();
    tranche_core::codec::write_input_line(
        provider.kind(),
        &mut line,
        "task-0",
        Endpoint::ChatCompletions,
        &body,
    );
    std::fs::write(&path, &line).unwrap();

    let tranche = TrancheId::new();
    let file = provider.upload_path(tranche, &path).await.unwrap();
    assert_eq!(file.id.as_str(), "file-655111ec");
    assert_eq!(file.expires_at, Some(1_722_616_125));
    let batch = provider
        .create_batch(CreateBatch {
            tranche_id: tranche,
            input: BatchInput::File(&file.id),
            endpoint: Endpoint::ChatCompletions,
        })
        .await
        .unwrap();
    assert_eq!(batch.status, BatchStatus::Validating);
    assert_eq!(batch.created_at, 1_721_409_237);
    assert_eq!(batch.output_file_id, None);

    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    let upload = &seen[0];
    assert_eq!((upload.method.as_str(), upload.target.as_str()), ("POST", "/openai/v1/files"));
    assert_eq!(upload.header("api-key"), Some(KEY));
    assert_eq!(upload.header("authorization"), None);
    let form = upload.body_text();
    for part in [
        "name=\"purpose\"\r\n\r\nbatch\r\n",
        "name=\"expires_after[anchor]\"\r\n\r\ncreated_at\r\n",
        "name=\"expires_after[seconds]\"\r\n\r\n1209600\r\n",
        &format!("filename=\"tranche-{tranche}.jsonl\""),
    ] {
        assert!(form.contains(part), "{part} missing from {form}");
    }
    assert!(form.contains(std::str::from_utf8(&line).unwrap()));

    let create = &seen[1];
    assert_eq!((create.method.as_str(), create.target.as_str()), ("POST", "/openai/v1/batches"));
    assert_eq!(create.header("api-key"), Some(KEY));
    let json: serde_json::Value = serde_json::from_slice(&create.body).unwrap();
    assert_eq!(
        json,
        serde_json::json!({
            "input_file_id": "file-655111ec",
            "endpoint": "/chat/completions",
            "completion_window": "24h",
            "metadata": {"tranche_id": tranche.to_string()},
            "output_expires_after": {"anchor": "created_at", "seconds": 1_209_600},
        })
    );
}

#[tokio::test]
async fn azure_legacy_sends_the_api_version_on_every_call() {
    let list =
        format!(r#"{{"object":"list","data":[{}],"has_more":true}}"#, azure_batch("InProgress"));
    let server = scripted(vec![
        (503, vec![], String::new()),
        (200, vec![], azure_batch("InProgress")),
        (200, vec![], list),
        (200, vec![], azure_batch("Cancelling")),
        (200, vec![], String::new()),
        (404, vec![], r#"{"error":{"code":"NotFound","message":"File not found"}}"#.into()),
    ])
    .await;
    let mut config =
        AzureConfig::new(format!("{}/openai/", server.base_url), SecretString::from(KEY))
            .with_legacy_api_version(Some("2025-04-01-preview".into()));
    config.auth = AzureAuth::BearerToken;
    let provider =
        AzureProvider::new(config, http_client().unwrap()).unwrap().with_retry_policy(fast());
    let id = BatchId::new("batch_6caaf24d");

    // A read is retried after a 503; ISO timestamps and capitalised statuses read fine.
    let batch = provider.retrieve_batch(&id).await.unwrap();
    assert_eq!(batch.status, BatchStatus::InProgress);
    let page = provider.list_batches(Some(&id), 500).await.unwrap();
    assert!(page.has_more);
    assert_eq!(page.last_id, Some(id.clone()));
    assert_eq!(provider.cancel_batch(&id).await.unwrap().status, BatchStatus::Cancelling);
    // A zero-byte error file downloads as zero bytes.
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("errors.jsonl");
    assert_eq!(provider.download_to(&FileId::new("file-e"), &dest).await.unwrap(), 0);
    assert_eq!(std::fs::read(&dest).unwrap(), b"");
    provider.delete_file(&FileId::new("file-e")).await.unwrap();

    let seen = server.seen();
    let targets: Vec<String> = seen.iter().map(|s| format!("{} {}", s.method, s.target)).collect();
    assert_eq!(
        targets,
        [
            "GET /openai/batches/batch_6caaf24d?api-version=2025-04-01-preview",
            "GET /openai/batches/batch_6caaf24d?api-version=2025-04-01-preview",
            "GET /openai/batches?api-version=2025-04-01-preview&limit=100&after=batch_6caaf24d",
            "POST /openai/batches/batch_6caaf24d/cancel?api-version=2025-04-01-preview",
            "GET /openai/files/file-e/content?api-version=2025-04-01-preview",
            "DELETE /openai/files/file-e?api-version=2025-04-01-preview",
        ]
    );
    for s in &seen {
        assert_eq!(s.header("authorization"), Some(format!("Bearer {KEY}").as_str()));
        assert_eq!(s.header("api-key"), None);
    }
}

#[tokio::test]
async fn azure_cancel_is_never_retried() {
    let server = scripted(vec![(
        500,
        vec![("apim-request-id", "apim-9".into())],
        r#"{"error":{"code":"InternalServerError","message":"boom"}}"#.into(),
    )])
    .await;
    let config = AzureConfig::new(server.base_url.clone(), SecretString::from(KEY));
    let provider =
        AzureProvider::new(config, http_client().unwrap()).unwrap().with_retry_policy(fast());
    let err = provider.cancel_batch(&BatchId::new("b")).await.unwrap_err();
    assert_eq!(err.status, Some(500));
    assert_eq!(err.code.as_deref(), Some("InternalServerError"));
    assert_eq!(err.request_id.as_deref(), Some("apim-9"));
    assert!(err.retryable());
    assert_eq!(server.seen().len(), 1);
}

fn anthropic(base_url: &str, beta: Option<&str>) -> AnthropicProvider {
    let mut config = AnthropicConfig::new(SecretString::from(KEY));
    config.base_url = base_url.to_owned();
    config.beta = beta.map(str::to_owned);
    AnthropicProvider::new(config, http_client().unwrap()).unwrap().with_retry_policy(fast())
}

fn message_batch(status: &str, results_url: Option<&str>) -> String {
    let url = results_url.map_or("null".to_owned(), |u| format!("\"{u}\""));
    format!(
        r#"{{"id":"msgbatch_01","type":"message_batch","processing_status":"{status}","request_counts":{{"processing":2,"succeeded":0,"errored":0,"canceled":0,"expired":0}},"ended_at":null,"created_at":"2024-09-24T18:37:24.100435Z","expires_at":"2024-09-25T18:37:24.100435Z","cancel_initiated_at":null,"archived_at":null,"results_url":{url}}}"#
    )
}

#[tokio::test]
async fn anthropic_create_streams_the_lines_with_an_exact_length() {
    let server = scripted(vec![(200, vec![], message_batch("in_progress", None))]).await;
    let provider = anthropic(&server.base_url, Some("message-batches-2024-09-24"));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.jsonl");
    let mut lines = Vec::new();
    for (id, text) in [("w0", "a"), ("w1", "b\nc")] {
        let body = RawValue::from_string(format!(
            r#"{{"model":"claude-3-5-haiku-latest","max_tokens":8,"messages":[{{"role":"user","content":{}}}]}}"#,
            serde_json::to_string(text).unwrap()
        ))
        .unwrap();
        tranche_core::codec::write_input_line(
            provider.kind(),
            &mut lines,
            id,
            Endpoint::AnthropicMessages,
            &body,
        );
    }
    std::fs::write(&path, &lines).unwrap();
    let batch = provider
        .create_batch(CreateBatch {
            tranche_id: TrancheId::new(),
            input: BatchInput::Inline(InlineInput::from_file(&path).await.unwrap()),
            endpoint: Endpoint::AnthropicMessages,
        })
        .await
        .unwrap();
    assert_eq!(batch.status, BatchStatus::InProgress);
    assert_eq!(batch.request_counts.total, 2);

    let seen = server.seen();
    let create = &seen[0];
    assert_eq!((create.method.as_str(), create.target.as_str()), ("POST", "/v1/messages/batches"));
    assert_eq!(create.header("x-api-key"), Some(KEY));
    assert_eq!(create.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(create.header("anthropic-beta"), Some("message-batches-2024-09-24"));
    assert_eq!(create.header("content-type"), Some("application/json"));
    assert_eq!(create.header("transfer-encoding"), None);
    assert_eq!(create.header("content-length"), Some(create.body.len().to_string().as_str()));
    let text = String::from_utf8(lines).unwrap();
    let expected = format!("{{\"requests\":[{}]}}", text.trim_end().replace('\n', ","));
    assert_eq!(create.body_text(), expected);
    let json: serde_json::Value = serde_json::from_slice(&create.body).unwrap();
    assert_eq!(json["requests"][1]["params"]["messages"][0]["content"], "b\nc");
}

#[tokio::test]
async fn anthropic_create_and_cancel_are_never_retried() {
    let overloaded = r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_1"}"#;
    let server = scripted(vec![
        (529, vec![("request-id", "req_1".into())], overloaded.into()),
        (529, vec![("request-id", "req_2".into())], overloaded.into()),
    ])
    .await;
    let provider = anthropic(&server.base_url, None);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.jsonl");
    std::fs::write(&path, "{\"custom_id\":\"a\",\"params\":{}}\n").unwrap();
    let err = provider
        .create_batch(CreateBatch {
            tranche_id: TrancheId::new(),
            input: BatchInput::Inline(InlineInput::from_file(&path).await.unwrap()),
            endpoint: Endpoint::AnthropicMessages,
        })
        .await
        .unwrap_err();
    assert_eq!((err.status, err.error_type.as_deref()), (Some(529), Some("overloaded_error")));
    assert_eq!(err.request_id.as_deref(), Some("req_1"));
    assert!(err.retryable());
    let err = provider.cancel_batch(&BatchId::new("msgbatch_01")).await.unwrap_err();
    assert_eq!(err.status, Some(529));
    let targets: Vec<String> =
        server.seen().iter().map(|s| format!("{} {}", s.method, s.target)).collect();
    assert_eq!(
        targets,
        ["POST /v1/messages/batches", "POST /v1/messages/batches/msgbatch_01/cancel"]
    );
}

#[tokio::test]
async fn anthropic_reads_and_deletes_retry_and_results_stream() {
    let jsonl = "{\"custom_id\":\"w1\",\"result\":{\"type\":\"expired\"}}\n{\"custom_id\":\"w0\",\"result\":{\"type\":\"canceled\"}}\n";
    let server = scripted(vec![
        (529, vec![], r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#.into()),
        (200, vec![], message_batch("ended", Some("/v1/messages/batches/msgbatch_01/results"))),
        (200, vec![], format!(r#"{{"data":[{}],"has_more":false,"first_id":"msgbatch_01","last_id":"msgbatch_01"}}"#, message_batch("in_progress", None))),
        (500, vec![], r#"{"type":"error","error":{"type":"api_error","message":"Internal server error"}}"#.into()),
        (200, vec![], jsonl.into()),
        (502, vec![], String::new()),
        (404, vec![], r#"{"type":"error","error":{"type":"not_found_error","message":"gone"}}"#.into()),
    ])
    .await;
    let provider = anthropic(&server.base_url, None);
    let id = BatchId::new("msgbatch_01");
    let batch = provider.retrieve_batch(&id).await.unwrap();
    assert_eq!(batch.status, BatchStatus::Completed);
    let page = provider.list_batches(Some(&id), 5000).await.unwrap();
    assert_eq!(page.last_id, Some(id.clone()));
    assert!(!page.has_more);

    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("results.jsonl");
    let url = batch.results_url.unwrap();
    let written = provider.results_to(&url, &dest).await.unwrap();
    assert_eq!(written, jsonl.len() as u64);
    assert_eq!(std::fs::read_to_string(&dest).unwrap(), jsonl);
    provider.delete_batch(&id).await.unwrap();

    let seen = server.seen();
    let targets: Vec<String> = seen.iter().map(|s| format!("{} {}", s.method, s.target)).collect();
    assert_eq!(
        targets,
        [
            "GET /v1/messages/batches/msgbatch_01",
            "GET /v1/messages/batches/msgbatch_01",
            "GET /v1/messages/batches?limit=1000&after_id=msgbatch_01",
            "GET /v1/messages/batches/msgbatch_01/results",
            "GET /v1/messages/batches/msgbatch_01/results",
            "DELETE /v1/messages/batches/msgbatch_01",
            "DELETE /v1/messages/batches/msgbatch_01",
        ]
    );
    assert_eq!(seen[4].header("accept"), Some("application/binary"));
    for s in &seen {
        assert_eq!(s.header("x-api-key"), Some(KEY));
        assert_eq!(s.header("anthropic-version"), Some("2023-06-01"));
        assert_eq!(s.header("anthropic-beta"), None);
    }
}

#[tokio::test]
async fn anthropic_errors_keep_their_facts_and_never_the_key() {
    let server = scripted(vec![(
        401,
        vec![("request-id", "req_hdr".into())],
        format!(r#"{{"type":"error","error":{{"type":"authentication_error","message":"invalid x-api-key {KEY}"}},"request_id":"req_body"}}"#),
    )])
    .await;
    let err =
        anthropic(&server.base_url, None).retrieve_batch(&BatchId::new("m")).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Http);
    assert_eq!(err.error_type.as_deref(), Some("authentication_error"));
    assert_eq!(err.request_id.as_deref(), Some("req_body"));
    assert!(err.is_auth() && !err.retryable());
    let text = err.to_string();
    assert_eq!(
        text,
        "anthropic rejected tranche's credentials (401 authentication_error): invalid x-api-key [REDACTED] (request id req_body)"
    );
}
