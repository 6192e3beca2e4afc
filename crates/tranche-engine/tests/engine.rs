//! The engine against an in-process simulator on a virtual clock.

#![expect(clippy::unwrap_used, clippy::panic, reason = "test helpers fail loudly")]

use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use tranche_blob::{BlobKey, BlobStore};
use tranche_core::{JobId, JobSettings, JobState, ProviderKind, RequestState};
use tranche_engine::{Engine, SubmitError};
use tranche_sim::{SimConfig, Simulator};
use tranche_store::{OutputRef, ResultRow};
use tranche_test_support::harness::{Harness, keyed_lines, submit};

/// The simulator and data folder a test's engines share.
type Setup = Harness;

fn lines(n: usize) -> String {
    keyed_lines(n)
}

/// A result row's output text, read from the blob store when it rests there by reference.
async fn output(setup: &Setup, row: &ResultRow) -> String {
    match row.output.clone().unwrap() {
        OutputRef::Text(text) => text,
        OutputRef::InObject { object, offset, len } => {
            let blobs = BlobStore::local(&setup.dir.path().join("blobs"));
            let key = BlobKey::new(object).unwrap();
            let bytes = blobs.get_range(&key, offset..offset + len).await.unwrap();
            String::from_utf8(bytes.to_vec()).unwrap()
        }
    }
}

#[tokio::test]
async fn a_restart_after_every_step_still_matches_every_request_once() {
    let setup = Setup::new().await;
    let job = submit(&setup.engine(Some(30)).await, &lines(100)).await;
    let mut rounds = 0;
    loop {
        // Every round runs on a brand-new engine: all it knows comes from the store.
        let engine = setup.engine(Some(30)).await;
        engine.tick().await.unwrap();
        let state = engine.store().job(job).await.unwrap().unwrap().state;
        engine.store().close().await;
        if state.is_terminal() {
            assert_eq!(state, JobState::Done);
            break;
        }
        setup.sim.advance(1.0);
        rounds += 1;
        assert!(rounds < 200, "the job did not finish");
    }
    let engine = setup.engine(None).await;
    let counts = engine.store().job_counts(job).await.unwrap();
    assert_eq!((counts.accepted, counts.succeeded, counts.open()), (100, 100, 0));
    let rows: Vec<_> = engine.store().job_results(job).try_collect().await.unwrap();
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(row.custom_id, format!("k{i}:t:v1"));
        assert_eq!(row.state, RequestState::Succeeded);
        let output: serde_json::Value = serde_json::from_str(&output(&setup, row).await).unwrap();
        let answer = output["choices"][0]["message"]["content"].as_str().unwrap();
        assert!(answer.contains(&format!("\"k{i} question")), "{answer}");
    }
    // 50 + 50 requests at 30 per batch: 2 × (30, 20) = 4 batches, each created once.
    let stats = setup.sim.stats();
    assert_eq!(stats.batches_created, 4);
    assert_eq!(stats.files_live, 0);
    assert_eq!(stats.requests_billed, 100);
    let blobs = BlobStore::local(&setup.dir.path().join("blobs"));
    let raw = blobs.list(&BlobKey::new("raw").unwrap()).await.unwrap();
    assert_eq!(raw.len(), 4, "each tranche's raw results are kept: {raw:?}");
    assert!(raw.iter().all(|(key, size)| key.as_str().ends_with("/output.jsonl") && *size > 0));
}

#[tokio::test]
async fn a_fatal_upstream_error_fails_the_job_and_keeps_provider_status_and_code() {
    let setup = Setup::new().await;
    // The simulator only accepts another key, so every call answers 401.
    setup.sim.set_config(SimConfig {
        speed: 0.0,
        api_key: Some("sk-other".into()),
        ..SimConfig::default()
    });
    let engine = setup.engine(None).await;
    let job = submit(&engine, &lines(4)).await;
    for _ in 0..10 {
        engine.tick().await.unwrap();
        if engine.store().job(job).await.unwrap().unwrap().state.is_terminal() {
            break;
        }
    }
    let record = engine.store().job(job).await.unwrap().unwrap();
    assert_eq!(record.state, JobState::Failed);
    let error = record.last_error.unwrap();
    assert_eq!(error["provider"], "openai");
    assert_eq!(error["status"], 401);
    assert!(!error.to_string().contains("sk-test"), "the key leaked: {error}");
    let counts = engine.store().job_counts(job).await.unwrap();
    assert_eq!((counts.failed, counts.open()), (4, 0));
    let rows: Vec<_> = engine.store().job_results(job).try_collect().await.unwrap();
    let row_error: serde_json::Value =
        serde_json::from_str(rows[0].error.as_deref().unwrap()).unwrap();
    assert_eq!(row_error["status"], 401);
    assert_eq!(setup.sim.stats().batches_created, 0);
}

#[tokio::test]
async fn an_empty_input_is_rejected_and_stores_nothing() {
    let setup = Setup::new().await;
    let engine = setup.engine(None).await;
    let settings = JobSettings { task: Some("t".into()), ..JobSettings::default() };
    let err = engine.submit(&b"\n\n"[..], ProviderKind::Openai, settings, None).await.unwrap_err();
    assert!(err.to_string().contains("no requests"), "{err}");
    assert!(engine.store().recent_jobs(5).await.unwrap().is_empty());
}

#[tokio::test]
async fn repeated_custom_ids_are_found_across_stored_rows_and_reported_in_line_order() {
    let setup = Setup::new().await;
    let engine = setup.engine(None).await;
    let settings = JobSettings { task: Some("t".into()), ..JobSettings::default() };
    // Far more lines than the store writes per statement: line 700 repeats line 2 (stored
    // long before), line 702 repeats line 701 (in the same statement), and line 900 has
    // bad JSON, found before the repeats are.
    let mut input = String::new();
    for i in 1..=1_000 {
        let key = match i {
            700 => 2,
            702 => 701,
            n => n,
        };
        if i == 900 {
            input.push_str("{not json\n");
        } else {
            input.push_str(&format!(
                "{{\"key\":\"k{key}\",\"body\":{{\"model\":\"m\",\"messages\":[]}}}}\n"
            ));
        }
    }
    let err =
        engine.submit(input.as_bytes(), ProviderKind::Openai, settings, None).await.unwrap_err();
    let SubmitError::Rejected(rejected) = err else { panic!("not rejected: {err}") };
    let found: Vec<(u64, String)> =
        rejected.errors.iter().map(|e| (e.line, e.reason.clone())).collect();
    assert_eq!(found.len(), 3, "{found:?}");
    assert_eq!(found[0], (700, "duplicate custom_id `k2:t:v1`: already used on line 2".into()));
    assert_eq!(found[1], (702, "duplicate custom_id `k701:t:v1`: already used on line 701".into()));
    assert_eq!(found[2].0, 900);
    assert!(engine.store().recent_jobs(5).await.unwrap().is_empty(), "nothing stored");
    // The bodies written before the job was refused are given up with it.
    let blobs = BlobStore::local(&setup.dir.path().join("blobs"));
    let left = blobs.list(&BlobKey::new("bodies").unwrap()).await.unwrap();
    assert!(left.is_empty(), "a refused job's bodies stay behind: {left:?}");
}

/// Ticks (advancing the simulator's clock between rounds) until the job ends.
#[tokio::test]
async fn a_rerun_of_a_finished_jobs_input_bills_nothing() {
    let setup = Setup::new().await;
    let engine = setup.engine(None).await;
    let first = submit(&engine, &lines(40)).await;
    assert_eq!(setup.run_to_end(&engine, first).await, JobState::Done);
    let billed = setup.sim.stats();

    let second = submit(&engine, &lines(40)).await;
    assert_eq!(setup.run_to_end(&engine, second).await, JobState::Done);
    let counts = engine.store().job_counts(second).await.unwrap();
    assert_eq!((counts.succeeded, counts.cached), (40, 40));
    let after = setup.sim.stats();
    assert_eq!(after.requests_billed, billed.requests_billed, "nothing billed again");
    assert_eq!(after.batches_created, billed.batches_created, "no batch created");
    assert_eq!(
        engine.store().job_tokens(second).await.unwrap().input_tokens,
        0,
        "cached answers cost nothing"
    );
    let first_rows: Vec<_> = engine.store().job_results(first).try_collect().await.unwrap();
    let second_rows: Vec<_> = engine.store().job_results(second).try_collect().await.unwrap();
    for (a, b) in first_rows.iter().zip(&second_rows) {
        assert_eq!(a.custom_id, b.custom_id);
        assert_eq!(a.output, b.output, "the cached answer is the earlier one");
    }
}

#[tokio::test]
async fn a_changed_body_is_a_new_version_and_runs() {
    let setup = Setup::new().await;
    let engine = setup.engine(None).await;
    let first = submit(&engine, &lines(10)).await;
    setup.run_to_end(&engine, first).await;
    let billed = setup.sim.stats().requests_billed;

    let changed = lines(10).replacen("k3 question", "k3 question, rephrased", 1);
    let second = submit(&engine, &changed).await;
    setup.run_to_end(&engine, second).await;
    let counts = engine.store().job_counts(second).await.unwrap();
    assert_eq!((counts.succeeded, counts.cached), (10, 9));
    assert_eq!(setup.sim.stats().requests_billed, billed + 1, "only the changed request ran");
    let rows: Vec<_> = engine.store().job_results(second).try_collect().await.unwrap();
    assert!(output(&setup, &rows[3]).await.contains("rephrased"), "not a stale answer");
    let old: Vec<_> = engine.store().job_results(first).try_collect().await.unwrap();
    assert!(!output(&setup, &old[3]).await.contains("rephrased"), "history keeps the old version");
}

#[tokio::test]
async fn only_failed_lines_are_billed_again() {
    let setup = Setup::new().await;
    setup.sim.set_config(SimConfig {
        speed: 0.0,
        line_faults: vec![tranche_sim::LineFault {
            provider: "any".into(),
            kind: tranche_sim::LineFaultKind::Retryable,
            rate: 0.05,
        }],
        ..SimConfig::default()
    });
    let engine = setup.engine(None).await;
    let job = submit(&engine, &lines(400)).await;
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
    let counts = engine.store().job_counts(job).await.unwrap();
    assert_eq!(counts.succeeded, 400, "retryable failures were retried to success");
    let ledger = setup.ledger_by_custom_id();
    assert_eq!(ledger.len(), 400);
    let mut retried = 0;
    for (custom_id, outcomes) in &ledger {
        let billed = outcomes.iter().filter(|o| o.billed()).count();
        assert_eq!(billed, 1, "{custom_id} billed once: {outcomes:?}");
        if outcomes.len() > 1 {
            retried += 1;
            assert!(
                !outcomes[0].billed(),
                "{custom_id} ran again although its first run succeeded"
            );
        }
    }
    assert!(retried > 5 && retried < 60, "about 5% of 400 lines failed first: {retried}");
    assert_eq!(counts.retried, retried);
}

#[tokio::test]
async fn fatal_lines_fail_at_once_and_are_not_resent() {
    let setup = Setup::new().await;
    setup.sim.set_config(SimConfig {
        speed: 0.0,
        line_faults: vec![tranche_sim::LineFault {
            provider: "any".into(),
            kind: tranche_sim::LineFaultKind::Fatal,
            rate: 0.1,
        }],
        ..SimConfig::default()
    });
    let engine = setup.engine(None).await;
    let job = submit(&engine, &lines(200)).await;
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
    let counts = engine.store().job_counts(job).await.unwrap();
    assert!(counts.failed > 5, "{counts:?}");
    assert_eq!(counts.succeeded + counts.failed, 200);
    assert_eq!(counts.retried, 0);
    assert!(setup.ledger_by_custom_id().values().all(|o| o.len() == 1), "nothing was sent twice");
}

#[tokio::test]
async fn whole_batch_failures_return_requests_a_bounded_number_of_times() {
    let setup = Setup::new().await;
    let mut config = SimConfig { speed: 0.0, ..SimConfig::default() };
    config.openai.enqueued_token_limits.insert("*".into(), 1);
    setup.sim.set_config(config);
    let engine = setup.engine(None).await;
    let job = submit(&engine, &lines(6)).await;
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
    let counts = engine.store().job_counts(job).await.unwrap();
    assert_eq!(counts.failed, 6);
    // Two models, each batch created once and returned three times without spending an attempt.
    assert_eq!(setup.sim.stats().batches_created, 2 * 4);
    let rows: Vec<_> = engine.store().job_results(job).try_collect().await.unwrap();
    let error: serde_json::Value = serde_json::from_str(rows[0].error.as_deref().unwrap()).unwrap();
    assert_eq!(error["code"], "token_limit_exceeded");
}

#[tokio::test]
async fn small_pools_wait_for_the_threshold_and_pool_across_jobs() {
    let setup = Setup::new().await;
    let engine = setup
        .engine_with(|c| {
            c.min_batch_size = 10;
            c.max_wait = Duration::from_secs(3600);
        })
        .await;
    let one_model = |from: usize, n: usize| -> String {
        (from..from + n)
            .map(|i| format!("{}\n", serde_json::json!({"key": format!("k{i}"), "body": {"model": "m", "messages": []}})))
            .collect()
    };
    let a = submit(&engine, &one_model(0, 6)).await;
    engine.tick().await.unwrap();
    assert_eq!(
        engine.store().job_counts(a).await.unwrap().queued,
        0,
        "six requests wait for four more"
    );
    let b = submit(&engine, &one_model(6, 4)).await;
    engine.tick().await.unwrap();
    assert_eq!(engine.store().job_counts(a).await.unwrap().queued, 6);
    assert_eq!(engine.store().job_counts(b).await.unwrap().queued, 4);
    assert_eq!(
        engine.store().job_tranche_counts(a).await.unwrap().iter().map(|(_, n)| n).sum::<u64>(),
        1,
        "one tranche for both jobs"
    );
    setup.run_to_end(&engine, b).await;
    assert_eq!(setup.sim.stats().batches_created, 1);
}

/// The `max_wait` trigger, by the engine's clock: a pool smaller than `min_batch_size` goes
/// out once its oldest request has waited `max_wait`, not a second before.
#[tokio::test]
async fn a_small_pool_goes_out_once_its_oldest_request_has_waited_max_wait() {
    let setup = Setup::new().await;
    let clock = tranche_core::ManualClock::at(1_800_000_000);
    let engine = setup
        .engine_with(|c| {
            c.min_batch_size = 100;
            c.max_wait = Duration::from_secs(60);
        })
        .await
        .with_clock(Arc::new(clock.clone()));
    let job = submit(&engine, &lines(6)).await;
    let queued =
        |engine: Engine| async move { engine.store().job_counts(job).await.unwrap().queued };
    engine.tick().await.unwrap();
    assert_eq!(queued(engine.clone()).await, 0, "six requests wait for more");
    clock.advance(59);
    engine.tick().await.unwrap();
    assert_eq!(queued(engine.clone()).await, 0, "a second short of max_wait");
    clock.advance(1);
    engine.tick().await.unwrap();
    assert_eq!(queued(engine.clone()).await, 6, "max_wait reached: both models go out");
    let tranches = engine.store().job_tranche_counts(job).await.unwrap();
    assert_eq!(tranches.iter().map(|(_, n)| n).sum::<u64>(), 2);
}

#[tokio::test]
async fn enqueued_token_admission_keeps_one_batch_in_flight() {
    let setup = Setup::new().await;
    let body_tokens = tranche_core::tokens::estimate(
        r#"{"messages":[{"content":"k0 question","role":"user"}],"model":"gpt-4o-mini"}"#,
    );
    let engine = setup
        .engine_with(|c| {
            c.max_batch_requests = Some(5);
            c.default_token_budget = Some(body_tokens * 6);
        })
        .await;
    let one_model: String = (0..20)
        .map(|i| format!("{}\n", serde_json::json!({"key": format!("k{i}"), "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": format!("k{i} question")}]}})))
        .collect();
    let job = submit(&engine, &one_model).await;
    let mut most_in_flight = 0;
    for _ in 0..300 {
        engine.tick().await.unwrap();
        let in_flight: u64 = engine
            .store()
            .job_tranche_counts(job)
            .await
            .unwrap()
            .iter()
            .filter(|(state, _)| {
                !matches!(
                    state,
                    tranche_core::TrancheState::Done
                        | tranche_core::TrancheState::Cleaning
                        | tranche_core::TrancheState::Ingesting
                        | tranche_core::TrancheState::Collecting
                )
            })
            .map(|(_, n)| n)
            .sum();
        most_in_flight = most_in_flight.max(in_flight);
        if engine.store().job(job).await.unwrap().unwrap().state.is_terminal() {
            break;
        }
        setup.sim.advance(1.0);
    }
    assert_eq!(engine.store().job(job).await.unwrap().unwrap().state, JobState::Done);
    assert_eq!(most_in_flight, 1, "the budget admits one five-request batch at a time");
    assert_eq!(setup.sim.stats().batches_created, 4);
}

#[tokio::test]
async fn cancel_stops_an_own_batch_at_the_provider_and_detaches_from_shared_ones() {
    let setup = Setup::new().await;
    let engine = setup.engine(None).await;
    let one_model = |from: usize, n: usize| -> String {
        (from..from + n)
            .map(|i| format!("{}\n", serde_json::json!({"key": format!("k{i}"), "body": {"model": "m", "messages": [{"role": "user", "content": "x"}]}})))
            .collect()
    };
    // Two jobs in one shared batch, a third alone in another model's batch.
    let shared_a = submit(&engine, &one_model(0, 5)).await;
    let shared_b = submit(&engine, &one_model(5, 5)).await;
    let alone = submit(&engine, &lines(1).replace("gpt-4o-mini", "solo-model")).await;
    for _ in 0..4 {
        engine.tick().await.unwrap();
    }
    assert_eq!(
        setup.sim.stats().batches_created,
        2,
        "both batches are at the provider, not yet run"
    );

    engine.cancel_job(alone).await.unwrap();
    engine.cancel_job(shared_a).await.unwrap();
    assert_eq!(engine.store().job_counts(shared_a).await.unwrap().cancelled, 5, "detached at once");
    assert_eq!(setup.run_to_end(&engine, alone).await, JobState::Cancelled);
    assert_eq!(engine.store().job_counts(alone).await.unwrap().cancelled, 1);
    assert_eq!(setup.run_to_end(&engine, shared_b).await, JobState::Done);
    assert_eq!(engine.store().job_counts(shared_b).await.unwrap().succeeded, 5);
    assert_eq!(setup.run_to_end(&engine, shared_a).await, JobState::Cancelled);
    assert_eq!(setup.sim.stats().requests_billed, 10, "the cancelled batch ran nothing");
}

/// Four engines, each with its own connection pool on one store (as four processes would
/// be), tick at once round after round over the same due tranches: leases and compare-and-set
/// keep every side effect single. Each tranche's file is uploaded once and its batch created
/// once; each request is billed once and ends in one terminal state.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn engines_sharing_a_store_never_repeat_a_side_effect() {
    let setup = Setup::new().await;
    let mut engines = Vec::new();
    for _ in 0..4 {
        engines.push(setup.engine(Some(15)).await);
    }
    let ids: std::collections::BTreeSet<_> = engines.iter().map(|e| e.id().clone()).collect();
    assert_eq!(ids.len(), 4, "every engine has an id of its own");
    let job = submit(&engines[0], &lines(240)).await;
    let mut finished = false;
    for _ in 0..400 {
        let ticks: Vec<_> = engines
            .iter()
            .map(|engine| {
                let engine = engine.clone();
                tokio::spawn(async move { engine.tick().await })
            })
            .collect();
        for tick in ticks {
            tick.await.unwrap().unwrap();
        }
        if engines[1].store().job(job).await.unwrap().unwrap().state.is_terminal() {
            finished = true;
            break;
        }
        setup.sim.advance(1.0);
    }
    assert!(finished, "the job did not end");
    let store = engines[2].store();
    assert_eq!(store.job(job).await.unwrap().unwrap().state, JobState::Done);
    let counts = store.job_counts(job).await.unwrap();
    assert_eq!((counts.accepted, counts.succeeded, counts.open()), (240, 240, 0));
    // Two models of 120 requests, 15 per batch: 16 tranches.
    let tranches = store.job_tranche_counts(job).await.unwrap();
    assert_eq!(tranches, vec![(tranche_core::TrancheState::Done, 16)]);
    let stats = setup.sim.stats();
    assert_eq!(stats.files_uploaded, 16, "an input file was uploaded twice");
    assert_eq!(stats.batches_created, 16, "a batch was created twice");
    assert_eq!(stats.requests_billed, 240);
    assert_eq!(stats.files_live, 0);
    let billed = setup.ledger_by_custom_id();
    assert_eq!(billed.len(), 240);
    assert!(billed.values().all(|outcomes| outcomes.len() == 1), "a request was billed twice");
}

/// A tranche records the account its batch lives on; an engine reaching another account of
/// the same provider never steps it, and the account's own engine carries it to the end.
#[tokio::test]
async fn an_engine_steps_only_tranches_of_its_own_account() {
    let setup = Setup::new().await;
    let ours = setup.engine(None).await;
    let job = submit(&ours, &lines(4)).await;
    ours.tick().await.unwrap();
    let elsewhere =
        Simulator::spawn(SimConfig { speed: 0.0, ..SimConfig::default() }).await.unwrap();
    let theirs = setup.engine_at(elsewhere.openai_base_url(), |_| {}).await;
    let before = ours.store().job_tranche_counts(job).await.unwrap();
    for _ in 0..5 {
        theirs.tick().await.unwrap();
        setup.sim.advance(1.0);
    }
    assert_eq!(ours.store().job_tranche_counts(job).await.unwrap(), before, "not its tranches");
    assert_eq!(elsewhere.stats().files_uploaded + elsewhere.stats().batches_created, 0);
    assert_eq!(setup.run_to_end(&ours, job).await, JobState::Done);
    assert_eq!(setup.sim.stats().requests_billed, 4);
}

/// A retry that returns a request to the pool after its job was cancelled (its ingest began
/// before the cancel) does not send it again: planning cancels it.
#[tokio::test]
async fn a_request_retried_after_its_job_was_cancelled_is_not_sent_again() {
    use tranche_core::{AttemptOutcome, EngineId, LeaseToken};
    use tranche_store::{Held, ResultUpdate};

    let setup = Setup::new().await;
    let engine = setup.engine(None).await;
    let job = submit(&engine, &lines(2)).await;
    engine.tick().await.unwrap();
    let store = setup.store().await;
    let tranche = store.job_unfinished_tranches(job).await.unwrap()[0].clone();
    // The ingest that is about to record a retryable failure holds the tranche...
    let token = LeaseToken::new();
    let (record, _) = store
        .lease_tranche(
            tranche.id,
            &EngineId::new("old", 1),
            token,
            Duration::from_secs(60),
            i64::MAX,
        )
        .await
        .unwrap()
        .unwrap();
    // ...when the user cancels the job; then it records.
    engine.cancel_job(job).await.unwrap();
    let held = Held { token, state: record.state };
    let mut writer = store.begin_ingest(tranche.id, held).await.unwrap();
    let retry = ResultUpdate {
        state: RequestState::Pending,
        outcome: AttemptOutcome::Errored,
        status_code: Some(500),
        output: None,
        error: Some("{}"),
        billed: None,
        spends_attempt: true,
        not_before: 0,
        at: 1,
    };
    for (wire_id, _) in writer.unanswered().await.unwrap() {
        assert!(writer.record(&wire_id, &retry).await.unwrap());
    }
    assert!(writer.commit(tranche_core::TrancheState::Cleaning, 1).await.unwrap());
    store.release_tranche_lease(tranche.id, token).await.unwrap();
    assert_eq!(store.job_counts(job).await.unwrap().pending, 1, "back in the pool");
    let state = setup.run_to_end(&engine, job).await;
    assert_eq!(state, JobState::Cancelled);
    let counts = store.job_counts(job).await.unwrap();
    assert_eq!((counts.cancelled, counts.open()), (2, 0));
    assert_eq!(setup.sim.stats().batches_created, 0, "nothing was sent");
}

/// A create whose answer was lost left a batch running at the provider; cancelling the job
/// then finds that batch and cancels it there, instead of ending the requests here and leaving
/// the batch to run and bill.
#[tokio::test]
async fn cancelling_while_a_create_is_unanswered_cancels_the_batch_it_made() {
    let setup = Setup::new().await;
    let lost_create: tranche_sim::HttpFault =
        serde_json::from_value(serde_json::json!({"operation": "create", "kind": "drop_after"}))
            .unwrap();
    setup.sim.set_config(SimConfig {
        speed: 0.0,
        faults: vec![lost_create],
        ..SimConfig::default()
    });
    let engine = setup.engine(None).await;
    let job = submit(&engine, &lines(1)).await;
    // Plan and upload, then a create that the provider carries out but whose answer is lost.
    engine.tick().await.unwrap();
    engine.tick().await.unwrap();
    assert_eq!(setup.sim.stats().batches_created, 1);
    let store = setup.store().await;
    let tranche = store.job_unfinished_tranches(job).await.unwrap()[0].clone();
    assert_eq!(tranche.state, tranche_core::TrancheState::Creating);
    setup.sim.set_config(SimConfig { speed: 0.0, ..SimConfig::default() });
    engine.cancel_job(job).await.unwrap();
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Cancelled);
    // A day later the batch, had it been left, would have run and billed.
    setup.sim.advance(86_400.0);
    let batches = setup.sim.ledger();
    assert!(batches.is_empty(), "the cancelled batch ran: {batches:?}");
    let stats = setup.sim.stats();
    assert_eq!((stats.batches_created, stats.files_live), (1, 0), "{stats:?}");
}

/// Ticks until one of the job's tranches is about to ingest, then takes its raw output out of
/// the blob store: its id, the store, the object's key and the bytes it held.
async fn take_raw_results(
    setup: &Setup,
    engine: &Engine,
    job: JobId,
) -> (tranche_core::TrancheId, BlobStore, BlobKey, Vec<u8>) {
    let store = setup.store().await;
    for _ in 0..50 {
        engine.tick().await.unwrap();
        setup.sim.advance(1.0);
        let tranches = store.job_unfinished_tranches(job).await.unwrap();
        let Some(t) = tranches.iter().find(|t| t.state == tranche_core::TrancheState::Ingesting)
        else {
            continue;
        };
        let blobs = BlobStore::local(&setup.dir.path().join("blobs"));
        let key = BlobKey::new(format!("raw/{}/output.jsonl", t.id)).unwrap();
        let collected = blobs.get(&key).await.unwrap().to_vec();
        blobs.delete(&key).await.unwrap();
        return (t.id, blobs, key, collected);
    }
    panic!("no tranche of job {job} reached ingesting")
}

/// An engine that finds a tranche's raw results missing (it does not share the raw folder of
/// the engine that collected them) collects them again instead of taking the batch as empty.
#[tokio::test]
async fn raw_results_missing_at_ingest_are_collected_again() {
    let setup = Setup::new().await;
    let engine = setup.engine(None).await;
    let job = submit(&engine, &lines(3)).await;
    let store = setup.store().await;
    let (_, blobs, key, collected) = take_raw_results(&setup, &engine, job).await;
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
    let counts = store.job_counts(job).await.unwrap();
    assert_eq!((counts.succeeded, counts.retried), (3, 0), "nothing was sent again");
    assert_eq!(setup.sim.stats().requests_billed, 3);
    assert_eq!(blobs.get(&key).await.unwrap(), collected, "collected again, byte for byte");
}

/// Every object is recorded with its size and SHA-256 once whole; a raw file that no longer
/// has the size it was recorded with (cut short after it was stored) is collected again, never
/// ingested as it is; a tranche's input file and its record go once the batch has ended.
#[tokio::test]
async fn objects_are_recorded_whole_and_a_raw_file_cut_short_is_collected_again() {
    use sha2::{Digest, Sha256};
    let setup = Setup::new().await;
    let engine = setup.engine(None).await;
    let job = submit(&engine, &lines(3)).await;
    let store = setup.store().await;
    let (tranche, blobs, key, collected) = take_raw_results(&setup, &engine, job).await;
    let recorded = store.blob(key.as_str()).await.unwrap().unwrap();
    assert_eq!(recorded.size, collected.len() as u64);
    assert_eq!(recorded.sha256, hex::encode(Sha256::digest(&collected)));
    blobs.put(&key, collected[..collected.len() / 2].to_vec().into()).await.unwrap();
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
    assert_eq!(blobs.get(&key).await.unwrap(), collected, "collected again, byte for byte");
    assert_eq!(store.job_counts(job).await.unwrap().succeeded, 3);
    let body = store.blob(&format!("bodies/{job}.jsonl")).await.unwrap().unwrap();
    let bytes = blobs.get(&BlobKey::new(body.key.as_str()).unwrap()).await.unwrap();
    assert_eq!((body.size, body.sha256), (bytes.len() as u64, hex::encode(Sha256::digest(&bytes))));
    let input = format!("tranches/{tranche}/input.jsonl");
    assert_eq!(store.blob(&input).await.unwrap(), None, "the input file is gone, and its record");
}

/// A data folder made before the blob store keeps raw results in `raw/<tranche>/`: a tranche
/// that needs them finds them there and moves them into the blob store.
#[tokio::test]
async fn raw_results_of_an_older_data_folder_move_into_the_blob_store() {
    let setup = Setup::new().await;
    let engine = setup.engine(None).await;
    let job = submit(&engine, &lines(1)).await;
    let store = setup.store().await;
    let (tranche, blobs, key, collected) = take_raw_results(&setup, &engine, job).await;
    let legacy = setup.dir.path().join("raw").join(tranche.to_string());
    std::fs::create_dir_all(&legacy).unwrap();
    std::fs::write(legacy.join("output.jsonl"), &collected).unwrap();
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
    assert_eq!(blobs.get(&key).await.unwrap(), collected);
    assert!(!legacy.join("output.jsonl").exists(), "moved, not copied");
    assert_eq!(store.job_counts(job).await.unwrap().succeeded, 1);
}

/// A job's bodies rest in one blob-store object, one a line in input order, and its batches are
/// assembled from ranges of it; a job recorded before (bodies in the database) still runs.
#[tokio::test]
async fn bodies_rest_in_the_blob_store_and_older_jobs_still_run() {
    use tranche_core::{Endpoint, JobId, JobSettings, ProviderKind};
    use tranche_store::{NewJob, NewRequest, RequestBody};

    let setup = Setup::new().await;
    let engine = setup.engine(None).await;
    let job = submit(&engine, &lines(6)).await;
    let blobs = BlobStore::local(&setup.dir.path().join("blobs"));
    let bodies = blobs.get(&BlobKey::new(format!("bodies/{job}.jsonl")).unwrap()).await.unwrap();
    let text = String::from_utf8(bodies.to_vec()).unwrap();
    assert_eq!(text.lines().count(), 6);
    assert!(text.lines().next().unwrap().contains("k0 question"));
    // A job as the store held them before: its body in the database.
    let store = setup.store().await;
    let old = JobId::new();
    let mut writer = store
        .begin_job(NewJob {
            id: old,
            provider: ProviderKind::Openai,
            source: None,
            settings: JobSettings::default(),
            body_object: None,
            answer_check: None,
            created_at: 1,
        })
        .await
        .unwrap();
    let body = r#"{"messages":[{"content":"old question","role":"user"}],"model":"gpt-4o-mini"}"#;
    writer
        .add(&NewRequest {
            line: 1,
            custom_id: "old:t:v1",
            wire_id: "old:t:v1",
            endpoint: Endpoint::ChatCompletions,
            model: "gpt-4o-mini",
            body: RequestBody::Stored(body),
            wire_bytes: 200,
            input_hash: tranche_core::InputHash::from_bytes([0; 32]),
            max_attempts: 3,
            est_tokens: 10,
            max_cost: None,
            accepted_at: 1,
        })
        .await
        .unwrap();
    writer.commit().await.unwrap();
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
    assert_eq!(setup.run_to_end(&engine, old).await, JobState::Done);
    let rows: Vec<_> = store.job_results(old).try_collect().await.unwrap();
    assert!(output(&setup, &rows[0]).await.contains("old question"), "{rows:?}");
    let rows: Vec<_> = store.job_results(job).try_collect().await.unwrap();
    for (i, row) in rows.iter().enumerate() {
        assert!(output(&setup, row).await.contains(&format!("k{i} question")));
    }
}

/// A refused job whose bodies already went out in parts (more than the blob writer buffers)
/// leaves nothing in the blob store, not even the parts.
#[tokio::test]
async fn a_refused_large_job_leaves_no_bodies_behind() {
    let setup = Setup::new().await;
    let engine = setup.engine(None).await;
    let settings = JobSettings { task: Some("t".into()), ..JobSettings::default() };
    let filler = "x".repeat(1_000);
    let mut input: String = (0..8_000)
        .map(|i| format!("{{\"key\":\"k{i}\",\"body\":{{\"model\":\"m\",\"messages\":[{{\"role\":\"user\",\"content\":\"{filler}\"}}]}}}}\n"))
        .collect();
    input.push_str("{not json\n");
    let err =
        engine.submit(input.as_bytes(), ProviderKind::Openai, settings, None).await.unwrap_err();
    assert!(matches!(err, SubmitError::Rejected(_)), "{err}");
    let files: Vec<_> = walk(&setup.dir.path().join("blobs"));
    assert!(files.is_empty(), "left behind: {files:?}");
}

/// Every file below `dir` (none when it does not exist).
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries
        .flatten()
        .flat_map(|e| if e.path().is_dir() { walk(&e.path()) } else { vec![e.path()] })
        .collect()
}
