//! Provider files and batches on every path: none left behind when a tranche fails, an input
//! file the provider lost uploaded again, credentials that stop working waited out, Anthropic
//! batches deleted once their results are stored; the audit and the janitor.

#![expect(clippy::unwrap_used, reason = "test helpers fail loudly")]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use secrecy::SecretString;
use serde_json::json;
use tranche_blob::{BlobKey, BlobStore};
use tranche_core::{JobSettings, JobState, ManualClock, ProviderKind, TrancheId, TrancheState};
use tranche_engine::{CleanupOptions, DaysToLimit, Engine, EngineConfig, FileClass, FileLimits};
use tranche_providers::{
    AnthropicConfig, AnthropicProvider, AzureConfig, AzureProvider, FileId, OpenAiProvider,
    Provider, UploadBody, http_client,
};
use tranche_sim::{HttpFault, SimConfig};
use tranche_store::TrancheRecord;
use tranche_test_support::foreign::Foreign;
use tranche_test_support::harness::{Harness, keyed_lines, submit};
use tranche_test_support::inputs::anthropic_lines;

fn with_faults(setup: &Harness, faults: serde_json::Value) {
    let faults: Vec<HttpFault> = serde_json::from_value(faults).unwrap();
    setup.sim.set_config(SimConfig { speed: 0.0, faults, ..SimConfig::default() });
}

/// The input file the provider holds for tranche `t`, whole.
async fn input_file_at_provider(adapter: &OpenAiProvider, t: &TrancheRecord) -> String {
    use futures::TryStreamExt;

    let file = FileId::new(t.input_file_id.clone().unwrap());
    let chunks: Vec<_> =
        adapter.download_file(&file).await.unwrap().stream.try_collect().await.unwrap();
    String::from_utf8(chunks.concat()).unwrap()
}

#[tokio::test]
async fn an_input_file_the_provider_lost_is_uploaded_again() {
    let setup = Harness::new().await;
    let engine = setup.engine(None).await;
    let job = submit(&engine, &keyed_lines(10)).await;
    // One round plans and uploads both tranches; then someone's cleanup deletes their inputs.
    engine.tick().await.unwrap();
    let tranches = engine.store().job_unfinished_tranches(job).await.unwrap();
    assert_eq!(tranches.len(), 2);
    let adapter = setup.openai_at(setup.sim.openai_base_url());
    for t in &tranches {
        assert_eq!(t.state, TrancheState::Uploaded);
        adapter.delete_file(&FileId::new(t.input_file_id.clone().unwrap())).await.unwrap();
    }
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
    assert_eq!(engine.store().job_counts(job).await.unwrap().succeeded, 10);
    for t in &tranches {
        assert_eq!(engine.store().tranche_uploads(t.id).await.unwrap(), 2);
    }
    let stats = setup.sim.stats();
    assert_eq!((stats.batches_created, stats.requests_billed, stats.files_live), (2, 10, 0));
}

/// A file upload carries the tranche's input as it is assembled: nothing of it is written into
/// the blob store, and the provider holds every line, byte for byte as planned.
#[tokio::test]
async fn an_input_file_goes_to_the_provider_as_it_is_assembled() {
    let setup = Harness::new().await;
    let engine = setup.engine(None).await;
    let job = submit(&engine, &keyed_lines(10)).await;
    engine.tick().await.unwrap();
    let blobs = BlobStore::local(&setup.dir.path().join("blobs"));
    let written = blobs.list(&BlobKey::new("tranches").unwrap()).await.unwrap();
    assert!(written.is_empty(), "no input file in the blob store: {written:?}");
    let adapter = setup.openai_at(setup.sim.openai_base_url());
    let tranches = engine.store().job_unfinished_tranches(job).await.unwrap();
    let mut keys = BTreeSet::new();
    for t in &tranches {
        assert_eq!(t.state, TrancheState::Uploaded);
        let text = input_file_at_provider(&adapter, t).await;
        assert_eq!(text.len() as u64, t.bytes, "the size planned");
        assert_eq!(text.lines().count() as u64, t.request_count);
        for line in text.lines() {
            let line: serde_json::Value = serde_json::from_str(line).unwrap();
            assert_eq!(
                (&line["method"], &line["url"]),
                (&json!("POST"), &json!("/v1/chat/completions"))
            );
            let content = line["body"]["messages"][0]["content"].as_str().unwrap().to_owned();
            keys.insert((line["custom_id"].as_str().unwrap().to_owned(), content));
        }
    }
    let want: BTreeSet<_> =
        (0..10).map(|i| (format!("k{i}:t:v1"), format!("k{i} question"))).collect();
    assert_eq!(keys, want);
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
}

/// Requests measured otherwise by an older submit (their recorded line sizes off by a byte,
/// either way) still go out whole: the file that came out at another length is never kept by
/// the provider, and is measured line by line and sent again.
#[tokio::test]
async fn an_input_measured_otherwise_at_submit_is_measured_again_and_sent_whole() {
    use sqlx::Connection;

    for (change, sql) in [
        ("a byte more", "UPDATE requests SET wire_bytes = wire_bytes + 1"),
        ("a byte less", "UPDATE requests SET wire_bytes = wire_bytes - 1"),
    ] {
        let setup = Harness::new().await;
        let engine = setup.engine(None).await;
        let job = submit(&engine, &keyed_lines(10)).await;
        let db = setup.dir.path().join("t.db");
        let mut conn =
            sqlx::SqliteConnection::connect(&format!("sqlite:{}", db.display())).await.unwrap();
        assert_eq!(sqlx::query(sql).execute(&mut conn).await.unwrap().rows_affected(), 10);
        conn.close().await.unwrap();
        engine.tick().await.unwrap();
        let stats = setup.sim.stats();
        assert_eq!((stats.files_uploaded, stats.files_deleted), (2, 0), "{change}: {stats:?}");
        let adapter = setup.openai_at(setup.sim.openai_base_url());
        let mut lines = 0;
        for t in engine.store().job_unfinished_tranches(job).await.unwrap() {
            assert_eq!(t.state, TrancheState::Uploaded, "{change}");
            let text = input_file_at_provider(&adapter, &t).await;
            assert!(text.ends_with('\n'), "{change}: whole lines");
            for line in text.lines() {
                serde_json::from_str::<serde_json::Value>(line).unwrap();
                lines += 1;
            }
        }
        assert_eq!(lines, 10, "{change}");
        assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
        assert_eq!(engine.store().job_counts(job).await.unwrap().succeeded, 10);
    }
}

/// An input that cannot be assembled (a body object cut short under it) fails its upload: the
/// provider keeps no file, short or whole. Once the bodies are back, the tranche is uploaded
/// again and every request succeeds.
#[tokio::test]
async fn an_input_that_cannot_be_assembled_leaves_no_file_at_the_provider() {
    let setup = Harness::new().await;
    let engine = setup.engine(None).await;
    let job = submit(&engine, &keyed_lines(4)).await;
    let blobs = BlobStore::local(&setup.dir.path().join("blobs"));
    let key = BlobKey::new(format!("bodies/{job}.jsonl")).unwrap();
    let bodies = blobs.get(&key).await.unwrap();
    blobs.put(&key, bodies.slice(..bodies.len() / 2)).await.unwrap();
    let _ = engine.tick().await;
    let stats = setup.sim.stats();
    assert_eq!((stats.files_uploaded, stats.files_live), (0, 0), "{stats:?}");
    for t in engine.store().job_unfinished_tranches(job).await.unwrap() {
        assert_ne!(t.state, TrancheState::Uploaded, "{t:?}");
        assert_eq!(t.input_file_id, None);
    }
    blobs.put(&key, bodies).await.unwrap();
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
    assert_eq!(engine.store().job_counts(job).await.unwrap().succeeded, 4);
    assert_eq!(setup.sim.stats().files_live, 0);
}

#[tokio::test]
async fn a_tranche_refused_at_create_leaves_no_file_behind() {
    let setup = Harness::new().await;
    with_faults(&setup, json!([{"operation": "create", "status": 400, "code": "invalid_value"}]));
    let engine = setup.engine(None).await;
    let job = submit(&engine, &keyed_lines(6)).await;
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Failed);
    let stats = setup.sim.stats();
    assert_eq!(stats.files_uploaded, 2);
    assert_eq!(stats.files_live, 0, "both inputs deleted");
    assert_eq!(engine.store().job_file_counts(job).await.unwrap().live, 0);
}

#[tokio::test]
async fn credentials_refused_while_a_batch_runs_are_waited_out() {
    let setup = Harness::new().await;
    let engine = setup.engine(None).await;
    let job = submit(&engine, &keyed_lines(4)).await;
    engine.tick().await.unwrap();
    engine.tick().await.unwrap();
    let tranches = engine.store().job_unfinished_tranches(job).await.unwrap();
    assert!(tranches.iter().all(|t| t.state == TrancheState::Submitted), "{tranches:?}");
    // The key is rotated: every poll answers 401 for a while.
    with_faults(&setup, json!([{"operation": "retrieve", "status": 401}]));
    for _ in 0..5 {
        engine.tick().await.unwrap();
        setup.sim.advance(1.0);
    }
    let record = engine.store().job(job).await.unwrap().unwrap();
    assert!(!record.state.is_terminal(), "the job waits: {:?}", record.state);
    for t in engine.store().job_unfinished_tranches(job).await.unwrap() {
        assert_eq!(t.state, TrancheState::Submitted);
        assert_eq!(t.last_error.unwrap()["status"], 401, "status says why");
    }
    with_faults(&setup, json!([]));
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
    assert_eq!(engine.store().job_counts(job).await.unwrap().succeeded, 4);
}

#[tokio::test]
async fn anthropic_batches_are_deleted_once_their_results_are_stored() {
    let setup = Harness::new().await;
    let mut config = AnthropicConfig::new(SecretString::from("sk-ant-test"));
    config.base_url = setup.sim.anthropic_base_url();
    let adapter = Arc::new(AnthropicProvider::new(config, http_client().unwrap()).unwrap());
    let engine = setup.engine_over(Arc::clone(&adapter) as Arc<dyn Provider>, |_| {}).await;
    let settings = JobSettings {
        task: Some("t".into()),
        endpoint: tranche_core::Endpoint::AnthropicMessages,
        ..JobSettings::default()
    };
    let job = engine
        .submit(anthropic_lines(5).as_bytes(), ProviderKind::Anthropic, settings, None)
        .await
        .unwrap()
        .job_id;
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
    assert_eq!(engine.store().job_counts(job).await.unwrap().succeeded, 5);
    assert_eq!(setup.sim.stats().batches_created, 1);
    let page = adapter.list_batches(None, 100).await.unwrap();
    assert!(page.data.is_empty(), "the batch was deleted: {:?}", page.data);
}

#[tokio::test]
async fn a_job_larger_than_the_file_quota_completes_by_waiting_for_its_own_files() {
    let setup = quota_of_three().await;
    let engine = azure_engine(&setup, |c| c.max_batch_requests = Some(2)).await;
    let job = submit_azure(&engine, 20).await;
    // Ten tranches, three files allowed: the first round uploads three and the rest wait,
    // saying why.
    engine.tick().await.unwrap();
    let waiting: Vec<_> = engine
        .store()
        .job_unfinished_tranches(job)
        .await
        .unwrap()
        .into_iter()
        .filter(|t| t.last_error.as_ref().is_some_and(|e| e["code"] == "quotaExceeded"))
        .collect();
    let all = engine.store().job_unfinished_tranches(job).await.unwrap();
    let seen: Vec<_> = all.iter().map(|t| (t.state, t.last_error.clone())).collect();
    assert_eq!(waiting.len(), 7, "the others wait for room: {seen:?}");
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
    assert_eq!(engine.store().job_counts(job).await.unwrap().succeeded, 20);
    let stats = setup.sim.stats();
    assert_eq!((stats.batches_created, stats.requests_billed, stats.files_live), (10, 20, 0));
}

#[tokio::test]
async fn openais_storage_quota_is_waited_out_as_azures_is() {
    let setup = Harness::new().await;
    setup.sim.update_config(|c| c.openai.max_storage_bytes = 1_000);
    let engine = setup.engine(Some(2)).await;
    let job = submit(&engine, &keyed_lines(12)).await;
    engine.tick().await.unwrap();
    let tranches = engine.store().job_unfinished_tranches(job).await.unwrap();
    let refused = |t: &&TrancheRecord| {
        t.last_error.as_ref().is_some_and(|e| {
            e["status"] == 400
                && e["message"]
                    .as_str()
                    .unwrap()
                    .starts_with("You have exceeded your file storage quota.")
        })
    };
    let waiting = tranches.iter().filter(refused).count();
    assert!(waiting > 0 && waiting < tranches.len(), "some wait for room: {tranches:?}");
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
    assert_eq!(engine.store().job_counts(job).await.unwrap().succeeded, 12);
    assert_eq!(setup.sim.stats().files_live, 0);
}

#[tokio::test]
async fn a_result_file_gone_before_it_was_copied_sends_its_requests_again() {
    let setup = Harness::new().await;
    let engine = setup.engine(None).await;
    let job = submit(&engine, &keyed_lines(6)).await;
    // Step until the batches have ended and their results wait to be collected.
    let collecting = 'ended: {
        for _ in 0..50 {
            engine.tick().await.unwrap();
            setup.sim.advance(1.0);
            let tranches = engine.store().job_unfinished_tranches(job).await.unwrap();
            if tranches.iter().all(|t| t.state == TrancheState::Collecting) {
                break 'ended tranches;
            }
        }
        panic!("the batches never ended");
    };
    let adapter = setup.openai_at(setup.sim.openai_base_url());
    let gone = &collecting[0];
    adapter.delete_file(&FileId::new(gone.output_file_id.clone().unwrap())).await.unwrap();
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
    assert_eq!(engine.store().job_counts(job).await.unwrap().succeeded, 6);
    // The lost file's requests ran twice (their first answers were lost), the others once.
    let runs: Vec<usize> = setup.ledger_by_custom_id().values().map(Vec::len).collect();
    assert_eq!(runs.iter().filter(|n| **n == 2).count() as u64, gone.request_count);
    assert_eq!(runs.iter().sum::<usize>() as u64, 6 + gone.request_count);
    assert_eq!(setup.sim.stats().files_live, 0);
}

/// An engine over the harness's store reaching the simulator's Azure surface.
async fn azure_engine(setup: &Harness, tune: impl FnOnce(&mut EngineConfig)) -> Engine {
    let azure = AzureConfig::new(setup.sim.azure_endpoint(), SecretString::from("azure-key"));
    let adapter = Arc::new(AzureProvider::new(azure, http_client().unwrap()).unwrap());
    setup.engine_over(adapter, tune).await
}

/// Submits `n` requests for one Azure deployment.
async fn submit_azure(engine: &Engine, n: usize) -> tranche_core::JobId {
    let lines = keyed_lines(n).replace("gpt-4.1-mini", "gpt-4o-mini");
    let settings = JobSettings { task: Some("t".into()), ..Default::default() };
    engine.submit(lines.as_bytes(), ProviderKind::Azure, settings, None).await.unwrap().job_id
}

/// A harness whose Azure account holds at most three batch input files with an expiry.
async fn quota_of_three() -> Harness {
    let setup = Harness::new().await;
    let mut config = SimConfig { speed: 0.0, ..SimConfig::default() };
    config.azure.max_input_files_with_expiry = 3;
    setup.sim.set_config(config);
    setup
}

#[tokio::test]
async fn the_audit_tells_whose_files_are_there_and_cleanup_takes_foreign_ones_only_when_asked() {
    let setup = quota_of_three().await;
    // Another application's files, kept until deleted, fill part of the account.
    let foreign = Foreign::azure(&setup.sim.azure_endpoint());
    let theirs = [foreign.upload("nightly.jsonl", None).await, foreign.upload("eval", None).await];
    let engine = azure_engine(&setup, |c| {
        c.max_batch_requests = Some(2);
        c.file_limits
            .insert(ProviderKind::Azure, FileLimits { with_expiry: Some(3), ..FileLimits::AZURE });
    })
    .await;
    let job = submit_azure(&engine, 20).await;
    // Ten tranches, three files allowed: the first round uploads three.
    engine.tick().await.unwrap();
    let audit = engine.audit_files(ProviderKind::Azure).await.unwrap();
    assert_eq!(audit.files.total, setup.sim.stats().files_live);
    let files = &audit.files;
    assert_eq!((files.total, files.with_expiry, files.without_expiry), (5, 3, 2));
    assert_eq!((files.owned, files.orphaned, files.foreign), (3, 0, 2));
    assert_eq!(files.by_purpose, BTreeMap::from([("batch".to_owned(), 5)]));
    assert_eq!(audit.limits, FileLimits { with_expiry: Some(3), without_expiry: Some(500) });
    assert_eq!((audit.uploads_7d, audit.uploads_30d), (3, 3));
    assert_eq!(audit.days_to_limit, DaysToLimit::default(), "one audit tells no growth");
    assert_eq!(audit.endpoint, format!("{}/openai/v1", setup.sim.azure_endpoint()));

    // A dry run names the foreign files and deletes nothing.
    let everything = CleanupOptions { dry_run: true, include_foreign: true };
    let dry = engine.clean_files(ProviderKind::Azure, everything).await.unwrap();
    let named: BTreeSet<_> = dry.deleted.iter().map(|f| f.id.clone()).collect();
    assert_eq!(named, BTreeSet::from(theirs.clone()));
    assert!(dry.deleted.iter().all(|f| f.class == FileClass::Foreign));
    assert_eq!(setup.sim.stats().files_live, 5);
    // Without `--include-foreign` nothing goes: the rest are the running job's.
    let safe = engine.clean_files(ProviderKind::Azure, CleanupOptions::default()).await.unwrap();
    assert!(safe.deleted.is_empty(), "{safe:?}");
    assert_eq!(setup.sim.stats().files_live, 5);
    let asked = CleanupOptions { include_foreign: true, ..CleanupOptions::default() };
    let cleaned = engine.clean_files(ProviderKind::Azure, asked).await.unwrap();
    assert_eq!(cleaned.deleted.len(), 2);
    for id in &theirs {
        assert!(!foreign.has_file(id).await, "{id} deleted");
    }
    // The job still completes, by waiting for its own files, and leaves none.
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
    assert_eq!(engine.store().job_counts(job).await.unwrap().succeeded, 20);
    let audit = engine.audit_files(ProviderKind::Azure).await.unwrap();
    assert_eq!((audit.files.total, setup.sim.stats().files_live), (0, 0));
    assert_eq!(audit.uploads_7d, 10);
}

/// Uploads a file named like tranche's for a tranche no store knows.
async fn upload_orphan(adapter: &dyn Provider) -> FileId {
    let body = UploadBody::from_bytes(b"{}\n".to_vec());
    adapter.upload_batch_file(TrancheId::new(), body).await.unwrap().id
}

#[tokio::test]
async fn orphans_are_deleted_after_their_grace_and_growth_forecasts_the_limit() {
    let setup = Harness::new().await;
    let clock = Arc::new(ManualClock::at(setup.sim.now()));
    let engine = setup
        .engine_with(|c| {
            c.file_limits.insert(
                ProviderKind::Openai,
                FileLimits { with_expiry: Some(10), without_expiry: None },
            );
        })
        .await
        .with_clock(clock.clone());
    // Files named like tranche's, of tranches this store never knew (a lost data folder).
    let adapter = setup.openai_at(setup.sim.openai_base_url());
    let mut orphans = Vec::new();
    orphans.push(upload_orphan(&adapter).await);
    let first = engine.audit_files(ProviderKind::Openai).await.unwrap();
    assert_eq!((first.files.orphaned, first.files.owned, first.files.foreign), (1, 0, 0));
    assert_eq!(first.days_to_limit, DaysToLimit::default());
    orphans.push(upload_orphan(&adapter).await);
    orphans.push(upload_orphan(&adapter).await);
    clock.advance(86_400);
    let second = engine.audit_files(ProviderKind::Openai).await.unwrap();
    // Two more a day, three of ten used: three and a half days left; no limit without expiry.
    assert_eq!(second.days_to_limit, DaysToLimit { with_expiry: Some(3.5), without_expiry: None });
    assert_eq!(second.uploads_7d, 0, "the store uploaded none of them");
    // Younger than the grace period (24 h from their upload on the provider's clock), orphans stay.
    clock.set(setup.sim.now() + 3600);
    let early = engine.clean_files(ProviderKind::Openai, CleanupOptions::default()).await.unwrap();
    assert!(early.deleted.is_empty(), "{early:?}");
    clock.set(setup.sim.now() + 86_400);
    let late = engine.clean_files(ProviderKind::Openai, CleanupOptions::default()).await.unwrap();
    let deleted: BTreeSet<_> = late.deleted.iter().map(|f| FileId::new(f.id.clone())).collect();
    assert_eq!(deleted, orphans.into_iter().collect());
    assert!(late.deleted.iter().all(|f| f.class == FileClass::Orphaned));
    assert_eq!(setup.sim.stats().files_live, 0);
}

#[tokio::test]
async fn the_janitor_never_deletes_a_file_a_live_batch_or_a_running_tranche_needs() {
    let setup = Harness::new().await;
    // Another application's batches run; one of its files is loose.
    let foreign = Foreign::openai(&setup.sim.openai_base_url());
    let mut held = Vec::new();
    for name in ["a.jsonl", "b.jsonl"] {
        let file = foreign.upload(name, None).await;
        foreign.create_batch(&file).await.unwrap();
        held.push(file);
    }
    let loose = foreign.upload("c.jsonl", None).await;
    let eager = |c: &mut EngineConfig| {
        c.orphan_grace = std::time::Duration::ZERO;
        c.max_batch_requests = Some(3);
    };
    let janitor = setup.engine_with(eager).await;
    let everything = CleanupOptions { include_foreign: true, ..CleanupOptions::default() };
    let report = janitor.clean_files(ProviderKind::Openai, everything).await.unwrap();
    assert_eq!((report.live_batches, report.held_by_live_batches), (2, 2));
    assert_eq!(report.deleted.iter().map(|f| f.id.as_str()).collect::<Vec<_>>(), [loose.as_str()]);
    for file in &held {
        assert!(foreign.has_file(file).await);
    }
    // A job runs while the janitor cleans as fast as it can, foreign files included: nothing
    // the job needs goes (no upload repeated, no result lost, nothing billed twice).
    let engine = setup.engine_with(eager).await;
    let job = submit(&engine, &keyed_lines(30)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let sweeps = tokio::spawn({
        let stop = Arc::clone(&stop);
        async move {
            let mut sweeps = 0u32;
            while !stop.load(Ordering::Relaxed) {
                janitor.clean_files(ProviderKind::Openai, everything).await.unwrap();
                sweeps += 1;
                tokio::task::yield_now().await;
            }
            sweeps
        }
    });
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
    stop.store(true, Ordering::Relaxed);
    assert!(sweeps.await.unwrap() > 0);
    assert_eq!(engine.store().job_counts(job).await.unwrap().succeeded, 30);
    let unfinished = engine.store().job_unfinished_tranches(job).await.unwrap();
    assert!(unfinished.is_empty(), "{unfinished:?}");
    let ledger = setup.ledger_by_custom_id();
    let ours: Vec<_> = ledger.iter().filter(|(id, _)| id.starts_with("k")).collect();
    assert_eq!(ours.len(), 30);
    assert!(ours.iter().all(|(_, runs)| runs.len() == 1), "{ours:?}");
    let mut uploads = BTreeMap::<String, usize>::new();
    for upload in setup.sim.uploads().into_iter().filter(|u| u.filename.starts_with("tranche-")) {
        *uploads.entry(upload.filename).or_default() += 1;
    }
    assert_eq!(uploads.len(), 10);
    assert!(uploads.values().all(|n| *n == 1), "each input uploaded once: {uploads:?}");
}

#[tokio::test]
async fn another_applications_error_files_are_kept_for_its_investigation() {
    let setup = Harness::new().await;
    let fault = tranche_sim::LineFault {
        provider: "openai".into(),
        kind: tranche_sim::LineFaultKind::Fatal,
        rate: 1.0,
    };
    setup.sim.set_line_faults(vec![fault]);
    let foreign = Foreign::openai(&setup.sim.openai_base_url());
    let input = foreign.upload("theirs.jsonl", None).await;
    foreign.create_batch(&input).await.unwrap();
    setup.sim.advance(86_400.0);
    let engine = setup.engine(None).await;
    let adapter = setup.openai_at(setup.sim.openai_base_url());
    let batch = adapter.list_batches(None, 10).await.unwrap().data.remove(0);
    let errors = batch.error_file_id.expect("every line failed");
    let everything = CleanupOptions { include_foreign: true, ..CleanupOptions::default() };
    let report = engine.clean_files(ProviderKind::Openai, everything).await.unwrap();
    let deleted: Vec<_> = report.deleted.iter().map(|f| f.id.as_str()).collect();
    assert_eq!(deleted, [input.as_str()], "the input goes, the error file stays");
    assert!(foreign.has_file(errors.as_str()).await);
}

/// Ticks `engine`, moving the simulator's clock `step` seconds between ticks, until `job` ends
/// (or 200 ticks have passed); the state it reached.
async fn run_with_steps(
    setup: &Harness,
    engine: &Engine,
    job: tranche_core::JobId,
    step: f64,
) -> JobState {
    let mut state = JobState::Running;
    for _ in 0..200 {
        engine.tick().await.unwrap();
        state = engine.store().job(job).await.unwrap().unwrap().state;
        if state.is_terminal() {
            break;
        }
        setup.sim.advance(step);
    }
    state
}

#[tokio::test]
async fn every_path_leaves_no_file_behind() {
    // Batches that expire every time (a day passes between ticks, a line takes longer).
    let setup = Harness::new().await;
    setup.sim.update_config(|c| c.processing.requests_per_second = 1e-9);
    let engine = setup.engine(None).await;
    let job = submit(&engine, &keyed_lines(4)).await;
    assert_eq!(run_with_steps(&setup, &engine, job, 90_000.0).await, JobState::Done);
    assert_eq!(engine.store().job_counts(job).await.unwrap().failed, 4, "every attempt expired");
    let stats = setup.sim.stats();
    assert_eq!((stats.batches_created, stats.requests_billed), (2 * 3, 0));
    assert_eq!((stats.files_uploaded > 0, stats.files_live), (true, 0), "expired");

    // A job cancelled while its batches run.
    let setup = Harness::new().await;
    let engine = setup.engine(None).await;
    let job = submit(&engine, &keyed_lines(4)).await;
    for _ in 0..3 {
        engine.tick().await.unwrap();
    }
    assert!(setup.sim.stats().batches_created > 0);
    engine.cancel_job(job).await.unwrap();
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Cancelled);
    assert_eq!(setup.sim.stats().files_live, 0, "cancelled");

    // Batches that fail validation (the enqueued-token limit) until their returns run out.
    let setup = Harness::new().await;
    setup.sim.update_config(|c| {
        c.openai.enqueued_token_limits.insert("*".into(), 1);
    });
    let engine = setup.engine(None).await;
    let job = submit(&engine, &keyed_lines(4)).await;
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
    assert_eq!(engine.store().job_counts(job).await.unwrap().failed, 4);
    let stats = setup.sim.stats();
    assert!(stats.batches_created > 0);
    assert_eq!(stats.files_live, 0, "failed validation");

    // An upload refused outright.
    let setup = Harness::new().await;
    with_faults(&setup, json!([{"operation": "upload", "status": 400, "code": "invalid_file"}]));
    let engine = setup.engine(None).await;
    let job = submit(&engine, &keyed_lines(4)).await;
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Failed);
    assert_eq!(setup.sim.stats().files_live, 0, "upload refused");
}
