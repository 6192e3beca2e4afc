//! The OpenAI adapter against `tranche-sim`: the whole batch lifecycle on a virtual clock
//! (no wall-clock sleeps), plus the error paths (wrong key, unknown ids).

#![cfg(test)]

use std::collections::BTreeSet;
use std::io::Write;
use std::path::Path;

use secrecy::SecretString;
use serde_json::value::RawValue;
use tranche_core::{Endpoint, TrancheId};
use tranche_providers::{
    BatchId, BatchInput, BatchStatus, CreateBatch, ErrorKind, FileId, LineOutcome, OpenAiConfig,
    OpenAiProvider, Provider, ProviderFiles, RemoteBatch, http_client,
};
use tranche_sim::{SimConfig, SimHandle, Simulator};

const KEY: &str = "sk-sim-test-key-0123456789";

/// A simulator whose clock only moves when the test advances it, and an adapter pointed at it.
async fn setup(mut config: SimConfig) -> (SimHandle, OpenAiProvider) {
    config.api_key = Some(KEY.to_owned());
    config.speed = 0.0;
    let sim = Simulator::spawn(config).await.unwrap();
    let provider = adapter(&sim, KEY);
    (sim, provider)
}

fn adapter(sim: &SimHandle, key: &str) -> OpenAiProvider {
    let mut config = OpenAiConfig::new(SecretString::from(key.to_owned()));
    config.base_url = sim.openai_base_url();
    OpenAiProvider::new(config, http_client().unwrap()).unwrap()
}

/// Writes `n` chat requests through the adapter's own line writer; returns their wire ids.
fn write_input(provider: &OpenAiProvider, path: &Path, n: usize) -> BTreeSet<String> {
    let mut out = Vec::new();
    let mut ids = BTreeSet::new();
    for i in 0..n {
        let wire_id = format!("w{i:04}");
        let body = RawValue::from_string(format!(
            r#"{{"model":"gpt-4o-mini","messages":[{{"role":"user","content":"Classify ticket {i}"}}],"max_tokens":16}}"#
        ))
        .unwrap();
        tranche_core::codec::write_input_line(
            provider.kind(),
            &mut out,
            &wire_id,
            Endpoint::ChatCompletions,
            &body,
        );
        ids.insert(wire_id);
    }
    std::fs::File::create(path).unwrap().write_all(&out).unwrap();
    ids
}

/// Advances the virtual clock until the batch is terminal (bounded).
async fn run_to_end(sim: &SimHandle, provider: &OpenAiProvider, id: &BatchId) -> RemoteBatch {
    for _ in 0..200 {
        let batch = provider.retrieve_batch(id).await.unwrap();
        if batch.status.is_terminal() {
            return batch;
        }
        sim.advance(5.0);
    }
    panic!("batch {id} did not finish");
}

/// Uploads `n` requests and creates a batch for them.
async fn submit(
    provider: &OpenAiProvider,
    dir: &Path,
    n: usize,
) -> (TrancheId, FileId, RemoteBatch, BTreeSet<String>) {
    let tranche = TrancheId::new();
    let path = dir.join(format!("{tranche}.jsonl"));
    let ids = write_input(provider, &path, n);
    let file = provider.upload_path(tranche, &path).await.unwrap();
    let batch = provider
        .create_batch(CreateBatch {
            tranche_id: tranche,
            input: BatchInput::File(&file.id),
            endpoint: Endpoint::ChatCompletions,
        })
        .await
        .unwrap();
    (tranche, file.id, batch, ids)
}

#[tokio::test]
async fn full_lifecycle() {
    let (sim, provider) = setup(SimConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let tranche = TrancheId::new();
    let input = dir.path().join("input.jsonl");
    let ids = write_input(&provider, &input, 25);

    // Upload: named after the tranche, with the default 7-day expiry.
    let file = provider.upload_path(tranche, &input).await.unwrap();
    assert_eq!(file.filename, format!("tranche-{tranche}.jsonl"));
    assert_eq!(file.bytes, std::fs::metadata(&input).unwrap().len());
    assert_eq!(file.expires_at, Some(file.created_at + 604_800));

    // Create: metadata carries the tranche id.
    let created = provider
        .create_batch(CreateBatch {
            tranche_id: tranche,
            input: BatchInput::File(&file.id),
            endpoint: Endpoint::ChatCompletions,
        })
        .await
        .unwrap();
    assert_eq!(created.status, BatchStatus::Validating);
    assert_eq!(created.tranche_id(), Some(tranche));
    assert_eq!(created.input_file_id.as_ref(), Some(&file.id));
    assert_eq!(created.endpoint.as_deref(), Some("/v1/chat/completions"));
    assert_eq!(created.output_file_id, None);

    // Retrieve until completed, moving only the virtual clock.
    let done = run_to_end(&sim, &provider, &created.id).await;
    assert_eq!(done.status, BatchStatus::Completed);
    assert_eq!(done.tranche_id(), Some(tranche));
    assert_eq!(done.request_counts.total, 25);
    assert_eq!(done.request_counts.completed, 25);
    assert_eq!(done.request_counts.failed, 0);
    assert_eq!(done.error_file_id, None);
    let output = done.output_file_id.clone().unwrap();

    // Download to disk and parse every line.
    let dest = dir.path().join("output.jsonl");
    let written = provider.download_to(&output, &dest).await.unwrap();
    let text = std::fs::read_to_string(&dest).unwrap();
    assert_eq!(written, text.len() as u64);
    let mut seen = BTreeSet::new();
    for line in text.lines() {
        let parsed = provider.parse_result_line(line).unwrap();
        match parsed.outcome {
            LineOutcome::Succeeded { status_code, body, .. } => {
                assert_eq!(status_code, 200);
                let body: serde_json::Value = serde_json::from_str(&line[body]).unwrap();
                assert_eq!(body["object"], "chat.completion");
            }
            LineOutcome::Failed(err) => panic!("unexpected failure: {err}"),
        }
        assert!(seen.insert(parsed.wire_id));
    }
    assert_eq!(seen, ids);

    // Delete both files; deleting again is fine (404 means already gone).
    provider.delete_file(&file.id).await.unwrap();
    provider.delete_file(&output).await.unwrap();
    provider.delete_file(&output).await.unwrap();
    let err = provider.download_to(&output, &dest).await.unwrap_err();
    assert_eq!(err.status, Some(404));

    let stats = sim.stats();
    assert_eq!(stats.by_provider.openai.files_uploaded, 1);
    assert_eq!(stats.by_provider.openai.batches_created, 1);
    assert_eq!(stats.by_provider.openai.files_deleted, 2);
    assert_eq!(stats.by_provider.openai.files_live, 0);
}

#[tokio::test]
async fn failed_lines_come_back_as_line_errors() {
    let config: SimConfig = serde_json::from_value(serde_json::json!({
        "line_faults": [{"kind": "fatal", "rate": 1.0}]
    }))
    .unwrap();
    let (sim, provider) = setup(config).await;
    let dir = tempfile::tempdir().unwrap();
    let (_, _, batch, ids) = submit(&provider, dir.path(), 6).await;
    let done = run_to_end(&sim, &provider, &batch.id).await;
    assert_eq!(done.status, BatchStatus::Completed);
    assert_eq!(done.request_counts.failed, 6);
    let errors = done.error_file_id.clone().unwrap();
    let dest = dir.path().join("errors.jsonl");
    provider.download_to(&errors, &dest).await.unwrap();
    let mut seen = BTreeSet::new();
    for line in std::fs::read_to_string(&dest).unwrap().lines() {
        let parsed = provider.parse_result_line(line).unwrap();
        let LineOutcome::Failed(err) = parsed.outcome else { panic!("expected a failure: {line}") };
        assert_eq!(err.status, Some(400));
        assert!(err.code.is_some());
        assert!(!err.message.is_empty());
        assert!(!err.retryable, "{err}");
        seen.insert(parsed.wire_id);
    }
    assert_eq!(seen, ids);
}

#[tokio::test]
async fn retryable_line_faults_are_retryable() {
    let config: SimConfig = serde_json::from_value(serde_json::json!({
        "line_faults": [{"kind": "retryable", "rate": 1.0}]
    }))
    .unwrap();
    let (sim, provider) = setup(config).await;
    let dir = tempfile::tempdir().unwrap();
    let (_, _, batch, _) = submit(&provider, dir.path(), 3).await;
    let done = run_to_end(&sim, &provider, &batch.id).await;
    let dest = dir.path().join("errors.jsonl");
    provider.download_to(&done.error_file_id.clone().unwrap(), &dest).await.unwrap();
    let text = std::fs::read_to_string(&dest).unwrap();
    assert_eq!(text.lines().count(), 3);
    for line in text.lines() {
        let LineOutcome::Failed(err) = provider.parse_result_line(line).unwrap().outcome else {
            panic!("expected a failure: {line}")
        };
        assert!(err.status.is_some_and(|s| s >= 500), "{err}");
        assert!(err.retryable, "{err}");
    }
}

#[tokio::test]
async fn list_batches_across_pages() {
    let (_sim, provider) = setup(SimConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let mut created = BTreeSet::new();
    for _ in 0..5 {
        let (_, _, batch, _) = submit(&provider, dir.path(), 1).await;
        created.insert(batch.id.clone());
    }
    let mut listed = Vec::new();
    let mut after: Option<BatchId> = None;
    let mut pages = 0;
    loop {
        let page = provider.list_batches(after.as_ref(), 2).await.unwrap();
        pages += 1;
        assert!(page.data.len() <= 2);
        listed.extend(page.data.iter().map(|b| b.id.clone()));
        if !page.has_more {
            break;
        }
        after = page.last_id.clone();
        assert!(after.is_some());
        assert!(pages < 10, "pagination does not end");
    }
    assert_eq!(pages, 3);
    assert_eq!(listed.len(), 5);
    assert_eq!(listed.iter().cloned().collect::<BTreeSet<_>>(), created);
}

#[tokio::test]
async fn cancel_a_running_batch() {
    let (sim, provider) = setup(SimConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let (tranche, _, batch, _) = submit(&provider, dir.path(), 4).await;
    let cancelling = provider.cancel_batch(&batch.id).await.unwrap();
    assert!(
        matches!(cancelling.status, BatchStatus::Cancelling | BatchStatus::Cancelled),
        "{:?}",
        cancelling.status
    );
    assert_eq!(cancelling.tranche_id(), Some(tranche));
    let done = run_to_end(&sim, &provider, &batch.id).await;
    assert_eq!(done.status, BatchStatus::Cancelled);
}

#[tokio::test]
async fn a_wrong_key_is_a_non_retryable_401() {
    let (sim, _) = setup(SimConfig::default()).await;
    let wrong_key = "sk-wrong-key-abcdefghijkl";
    let provider = adapter(&sim, wrong_key);
    let err = provider.retrieve_batch(&BatchId::new("batch_x")).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Http);
    assert_eq!(err.status, Some(401));
    assert!(!err.retryable());
    assert!(err.is_auth());
    let text = err.to_string();
    assert!(text.starts_with("openai rejected tranche's credentials (401"), "{text}");
    assert!(!text.contains(wrong_key) && !text.contains(KEY), "{text}");
    assert!(!serde_json::to_string(&err).unwrap().contains(wrong_key));

    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    write_input(&provider, &input, 1);
    let err = provider.upload_path(TrancheId::new(), &input).await.unwrap_err();
    assert_eq!(err.status, Some(401));
}

#[tokio::test]
async fn unknown_ids_are_404s() {
    let (_sim, provider) = setup(SimConfig::default()).await;
    let err = provider.retrieve_batch(&BatchId::new("batch_does_not_exist")).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Http);
    assert_eq!(err.status, Some(404));
    assert!(!err.retryable());
    assert!(err.to_string().starts_with("openai returned 404"), "{err}");

    let err = provider.cancel_batch(&BatchId::new("batch_does_not_exist")).await.unwrap_err();
    assert_eq!(err.status, Some(404));
    // Deleting a file that never existed is "already gone".
    provider.delete_file(&FileId::new("file-does-not-exist")).await.unwrap();
}

#[tokio::test]
async fn a_missing_upload_source_is_a_local_io_error() {
    let (_sim, provider) = setup(SimConfig::default()).await;
    let err = provider
        .upload_path(TrancheId::new(), Path::new("/nonexistent/in.jsonl"))
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::Io);
    assert_eq!(err.status, None);
}
