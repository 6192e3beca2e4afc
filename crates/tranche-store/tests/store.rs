//! Store behaviour: all-or-nothing jobs, exactly-once claiming, result recording.

#![expect(clippy::unwrap_used, reason = "test helpers fail loudly")]

use std::time::Duration;

use tranche_core::{
    Endpoint, EngineId, JobId, JobState, LeaseToken, ProviderKind, RequestState, TrancheId,
    TrancheState,
};
use tranche_store::*;

/// Records a tranche and claims requests into it under a planning lease, as an engine does.
async fn create_tranche(store: &Store, tranche: &NewTranche, ids: &[i64]) -> Option<u64> {
    let token = LeaseToken::new();
    let engine = EngineId::new("test", 1);
    let duty = format!("plan:{token}");
    store.acquire_duty(&duty, &engine, token, Duration::from_secs(60)).await.unwrap().unwrap();
    let claimed = store.create_tranche(tranche, ids, (&duty, token)).await.unwrap();
    store.release_duty(&duty, token).await.unwrap();
    claimed
}

/// Takes a tranche's lease, as an engine does before it steps it.
async fn lease(store: &Store, tranche: TrancheId) -> Held {
    let token = LeaseToken::new();
    let engine = EngineId::new("test", 1);
    let (record, _) = store
        .lease_tranche(tranche, &engine, token, Duration::from_secs(60), i64::MAX)
        .await
        .unwrap()
        .unwrap();
    Held { token, state: record.state }
}

async fn store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("nested/t.db").to_string_lossy()).await.unwrap();
    (dir, store)
}

fn new_job() -> NewJob {
    NewJob {
        id: JobId::new(),
        provider: ProviderKind::Openai,
        source: Some("input.jsonl".into()),
        settings: serde_json::json!({"task": "t"}),
        created_at: 100,
    }
}

async fn add_job(store: &Store, n: u64, model: &str) -> JobId {
    let job = new_job();
    let id = job.id;
    let mut writer = store.begin_job(job).await.unwrap();
    for i in 0..n {
        let custom_id = format!("k{i}:t:v1");
        writer
            .add(&NewRequest {
                line: i + 1,
                custom_id: &custom_id,
                wire_id: &custom_id,
                endpoint: Endpoint::ChatCompletions,
                model,
                body: r#"{"model":"m"}"#,
                wire_bytes: 10,
                input_hash: "00",
                max_attempts: 3,
                est_tokens: 10,
                accepted_at: 100,
            })
            .await
            .unwrap();
    }
    assert_eq!(writer.commit().await.unwrap(), n);
    id
}

/// Every waiting request of model `model`, paged as the planner pages them.
async fn pending_ids(store: &Store, model: &str) -> Vec<i64> {
    let mut ids = Vec::new();
    loop {
        let after = ids.last().copied().unwrap_or(0);
        let page = store
            .pending_page(
                ProviderKind::Openai,
                (Endpoint::ChatCompletions, model),
                i64::MAX,
                after,
                7,
            )
            .await
            .unwrap();
        if page.is_empty() {
            return ids;
        }
        ids.extend(page.iter().map(|i| i.request_id));
    }
}

async fn claim_all(store: &Store, model: &str) -> (TrancheId, Vec<i64>) {
    let ids = pending_ids(store, model).await;
    let tranche = NewTranche {
        id: TrancheId::new(),
        est_tokens: 0,
        provider: ProviderKind::Openai,
        endpoint: Endpoint::ChatCompletions,
        model: model.into(),
        bytes: 0,
        created_at: 1,
    };
    create_tranche(store, &tranche, &ids).await;
    (tranche.id, ids)
}

fn success(wire_id: &str, output: &str) -> Success {
    Success {
        wire_id: wire_id.into(),
        status_code: 200,
        output: output.into(),
        input_tokens: Some(2),
        output_tokens: Some(3),
    }
}

#[tokio::test]
async fn many_requests_are_written_in_order_across_statements() {
    let (_dir, store) = store().await;
    let first = add_job(&store, 1_000, "m").await;
    let second = add_job(&store, 3, "m").await;
    let ids = pending_ids(&store, "m").await;
    assert_eq!(ids.len(), 1_003);
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids ascend in input order");
    let groups = store.pending_groups(ProviderKind::Openai, i64::MAX).await.unwrap();
    assert_eq!(groups.len(), 1);
    assert_eq!((groups[0].count, groups[0].oldest_accepted_at), (1_003, 100));
    assert_eq!(store.job_counts(first).await.unwrap().pending, 1_000);
    assert_eq!(store.job_counts(second).await.unwrap().pending, 3);
    let (tranche, _) = claim_all(&store, "m").await;
    use futures::TryStreamExt;
    let lines: Vec<InputLine> = store.tranche_input(tranche).try_collect().await.unwrap();
    assert_eq!(lines.len(), 1_003);
    assert!(lines.windows(2).all(|w| w[0].wire_id <= w[1].wire_id), "in wire id order");
    assert_eq!(lines.iter().filter(|l| l.wire_id == "k0:t:v1").count(), 2, "one of each job");
    assert!(lines.iter().any(|l| l.wire_id == "k999:t:v1"));
    assert!(lines.iter().all(|l| l.body == r#"{"model":"m"}"#));
}

#[tokio::test]
async fn successes_are_recorded_in_bulk_once_each() {
    let (_dir, store) = store().await;
    let job = add_job(&store, 1_200, "m").await;
    let (tranche, _) = claim_all(&store, "m").await;
    let held = lease(&store, tranche).await;
    let mut writer = store.begin_ingest(tranche, held).await.unwrap();
    // More lines than one statement takes, an unknown id and a repeated one.
    let mut lines: Vec<Success> =
        (0..1_100).map(|i| success(&format!("k{i}:t:v1"), &format!(r#"{{"n": {i}}}"#))).collect();
    lines.push(success("nope", "{}"));
    lines.push(success("k5:t:v1", r#"{"again":true}"#));
    assert_eq!(writer.record_successes(&mut lines, 9).await.unwrap(), 1_100);
    assert!(lines.is_empty());
    let mut again = vec![success("k7:t:v1", "{}")];
    assert_eq!(writer.record_successes(&mut again, 9).await.unwrap(), 0, "recorded already");
    assert_eq!(writer.unanswered().await.unwrap().len(), 100);
    assert!(writer.commit(TrancheState::Cleaning, 9).await.unwrap());

    let counts = store.job_counts(job).await.unwrap();
    assert_eq!((counts.succeeded, counts.queued), (1_100, 100));
    assert_eq!(
        store.job_tokens(job).await.unwrap(),
        TokenTotals { input_tokens: 2_200, output_tokens: 3_300 }
    );
    use futures::TryStreamExt;
    let rows: Vec<ResultRow> = store.job_results(job).try_collect().await.unwrap();
    assert_eq!(rows[5].output.as_deref(), Some(r#"{"n": 5}"#), "the first line for an id wins");
    assert_eq!(rows[1_099].output.as_deref(), Some(r#"{"n": 1099}"#));
    assert_eq!(rows[1_100].output, None);
}

#[tokio::test]
async fn a_dropped_job_writer_stores_nothing() {
    let (_dir, store) = store().await;
    let job = new_job();
    let id = job.id;
    let mut writer = store.begin_job(job).await.unwrap();
    writer
        .add(&NewRequest {
            line: 1,
            custom_id: "a:t:v",
            wire_id: "a:t:v",
            endpoint: Endpoint::ChatCompletions,
            model: "m",
            body: "{}",
            wire_bytes: 2,
            input_hash: "00",
            max_attempts: 3,
            est_tokens: 10,
            accepted_at: 100,
        })
        .await
        .unwrap();
    drop(writer);
    assert!(store.job(id).await.unwrap().is_none());
    assert!(store.recent_jobs(10).await.unwrap().is_empty());
    assert!(pending_ids(&store, "m").await.is_empty());
}

#[tokio::test]
async fn a_committed_job_is_pending_with_its_counts() {
    let (_dir, store) = store().await;
    let id = add_job(&store, 3, "m").await;
    let job = store.job(id).await.unwrap().unwrap();
    assert_eq!(job.state, JobState::Pending);
    assert_eq!(job.accepted, 3);
    assert_eq!(job.settings["task"], "t");
    let counts = store.job_counts(id).await.unwrap();
    assert_eq!(counts, RequestCounts { accepted: 3, pending: 3, ..Default::default() });
}

#[tokio::test]
async fn requests_are_claimed_into_one_tranche_only() {
    let (_dir, store) = store().await;
    let id = add_job(&store, 4, "m").await;
    let ids = pending_ids(&store, "m").await;
    let first = NewTranche {
        id: TrancheId::new(),
        est_tokens: 0,
        provider: ProviderKind::Openai,
        endpoint: Endpoint::ChatCompletions,
        model: "m".into(),
        bytes: 40,
        created_at: 101,
    };
    assert_eq!(create_tranche(&store, &first, &ids).await, Some(4));
    let second = NewTranche { id: TrancheId::new(), ..first.clone() };
    assert_eq!(create_tranche(&store, &second, &ids).await, Some(0));
    assert!(store.tranche(second.id).await.unwrap().is_none(), "an empty tranche is not kept");
    assert_eq!(store.tranche(first.id).await.unwrap().unwrap().request_count, 4);
    assert_eq!(store.job(id).await.unwrap().unwrap().state, JobState::Running);
    assert!(pending_ids(&store, "m").await.is_empty());
}

#[tokio::test]
async fn results_are_recorded_once_and_the_rest_in_bulk() {
    let (_dir, store) = store().await;
    let job = add_job(&store, 3, "m").await;
    let ids = pending_ids(&store, "m").await;
    let tranche = NewTranche {
        id: TrancheId::new(),
        est_tokens: 0,
        provider: ProviderKind::Openai,
        endpoint: Endpoint::ChatCompletions,
        model: "m".into(),
        bytes: 30,
        created_at: 1,
    };
    create_tranche(&store, &tranche, &ids).await;
    let ok = ResultUpdate {
        state: RequestState::Succeeded,
        outcome: AttemptOutcome::Succeeded,
        status_code: Some(200),
        output: Some(r#"{"ok":true}"#),
        error: None,
        input_tokens: Some(5),
        output_tokens: Some(7),
        spends_attempt: true,
        not_before: 0,
        at: 2,
    };
    let held = lease(&store, tranche.id).await;
    let mut writer = store.begin_ingest(tranche.id, held).await.unwrap();
    assert!(writer.record("k0:t:v1", &ok).await.unwrap());
    assert!(
        !writer.record("k0:t:v1", &ok).await.unwrap(),
        "a second result for one request is refused"
    );
    assert!(!writer.record("nope", &ok).await.unwrap());
    let failed = ResultUpdate {
        state: RequestState::Failed,
        outcome: AttemptOutcome::Missing,
        status_code: None,
        output: None,
        error: Some(r#"{"code":"missing_result"}"#),
        input_tokens: None,
        output_tokens: None,
        spends_attempt: true,
        not_before: 0,
        at: 2,
    };
    let rest = writer.unanswered().await.unwrap();
    assert_eq!(rest.len(), 2);
    assert_eq!(rest[0].1, AttemptInfo { attempts: 0, max_attempts: 3, batch_returns: 0 });
    for (wire_id, _) in &rest {
        assert!(writer.record(wire_id, &failed).await.unwrap());
    }
    assert!(writer.commit(TrancheState::Cleaning, 2).await.unwrap());

    let counts = store.job_counts(job).await.unwrap();
    assert_eq!((counts.succeeded, counts.failed, counts.open()), (1, 2, 0));
    assert_eq!(
        store.job_tokens(job).await.unwrap(),
        TokenTotals { input_tokens: 5, output_tokens: 7 }
    );
    assert_eq!(store.tranche(tranche.id).await.unwrap().unwrap().state, TrancheState::Cleaning);
    use futures::TryStreamExt;
    let rows: Vec<ResultRow> = store.job_results(job).try_collect().await.unwrap();
    assert_eq!(
        rows.iter().map(|r| r.custom_id.as_str()).collect::<Vec<_>>(),
        ["k0:t:v1", "k1:t:v1", "k2:t:v1"]
    );
    assert_eq!(rows[0].output.as_deref(), Some(r#"{"ok":true}"#));
    assert_eq!(rows[1].state, RequestState::Failed);
}

#[tokio::test]
async fn provider_files_are_tracked_until_deleted() {
    let (_dir, store) = store().await;
    let job = add_job(&store, 1, "m").await;
    let ids = pending_ids(&store, "m").await;
    let tranche = NewTranche {
        id: TrancheId::new(),
        est_tokens: 0,
        provider: ProviderKind::Openai,
        endpoint: Endpoint::ChatCompletions,
        model: "m".into(),
        bytes: 10,
        created_at: 1,
    };
    create_tranche(&store, &tranche, &ids).await;
    for (file, purpose) in
        [("file-in", FilePurpose::BatchInput), ("file-out", FilePurpose::BatchOutput)]
    {
        let record = FileRecord {
            provider: ProviderKind::Openai,
            file_id: file.into(),
            purpose,
            tranche_id: tranche.id,
            filename: None,
            bytes: Some(10),
            expires_at: None,
            created_at: 1,
        };
        store.record_file(&record).await.unwrap();
        store.record_file(&record).await.unwrap();
    }
    assert_eq!(store.live_files(tranche.id).await.unwrap(), ["file-in", "file-out"]);
    store.mark_file_deleted(ProviderKind::Openai, "file-in", 5).await.unwrap();
    assert_eq!(store.live_files(tranche.id).await.unwrap(), ["file-out"]);
    assert_eq!(
        store.job_file_counts(job).await.unwrap(),
        FileCounts { uploaded: 1, created_by_provider: 1, deleted: 1, live: 1 }
    );
}

#[tokio::test]
async fn reopening_keeps_everything() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db").to_string_lossy().into_owned();
    let store = Store::open(&path).await.unwrap();
    let id = add_job(&store, 2, "m").await;
    store.close().await;
    let store = Store::open(&format!("sqlite://{path}")).await.unwrap();
    assert_eq!(store.job(id).await.unwrap().unwrap().accepted, 2);
}
