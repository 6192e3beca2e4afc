//! Answers checked against a job's JSON Schema, re-parsed without provider traffic, reviewed
//! before they are trusted, and twins billed once: the engine against an in-process simulator.

#![expect(clippy::unwrap_used, reason = "test helpers fail loudly")]

use futures::TryStreamExt;
use serde_json::{Value, json};
use tranche_core::{JobId, JobSettings, JobState, OnInvalid, ProviderKind, RequestState};
use tranche_engine::{Engine, INVALID_OUTPUT, UNDECODABLE_RESULT};
use tranche_sim::{LineFault, LineFaultKind, SimConfig};
use tranche_store::{ResultRow, Review, ReviewVerdict};
use tranche_test_support::harness::Harness;
use tranche_test_support::inputs::{label_schema, structured_lines};

fn with_faults(setup: &Harness, faults: &[(LineFaultKind, f64)]) {
    let line_faults = faults
        .iter()
        .map(|(kind, rate)| LineFault { provider: "any".into(), kind: *kind, rate: *rate })
        .collect();
    setup.sim.set_config(SimConfig { speed: 0.0, line_faults, ..SimConfig::default() });
}

fn checked(on_invalid: OnInvalid) -> JobSettings {
    JobSettings {
        task: Some("t".into()),
        schema: Some(label_schema()),
        on_invalid,
        max_attempts: Some(6),
        ..JobSettings::default()
    }
}

async fn submit_with(engine: &Engine, text: &str, settings: JobSettings) -> JobId {
    engine.submit(text.as_bytes(), ProviderKind::Openai, settings, None).await.unwrap().job_id
}

async fn results(engine: &Engine, job: JobId) -> Vec<ResultRow> {
    engine.store().job_results(job).try_collect().await.unwrap()
}

fn error_of(row: &ResultRow) -> Value {
    serde_json::from_str(row.error.as_deref().unwrap()).unwrap()
}

#[tokio::test]
async fn answers_that_break_the_schema_fail_naming_the_field_and_a_reparse_promotes_them() {
    let setup = Harness::new().await;
    with_faults(&setup, &[(LineFaultKind::SchemaViolation, 0.1)]);
    let engine = setup.engine(None).await;
    let job =
        submit_with(&engine, &structured_lines(300, &json!({})), checked(OnInvalid::Fail)).await;
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
    let rows = results(&engine, job).await;
    let failed: Vec<_> = rows.iter().filter(|r| r.state == RequestState::Failed).collect();
    assert!(failed.len() > 10 && failed.len() < 60, "about 10% of 300: {}", failed.len());
    for row in &failed {
        let error = error_of(row);
        assert_eq!(error["code"], INVALID_OUTPUT, "{error}");
        let message = error["message"].as_str().unwrap();
        assert!(
            message.contains("\"label\" is a required property")
                || message.contains("sim_unexpected_field"),
            "the message names the field: {message}"
        );
        assert!(row.output.is_some(), "the invalid answer is kept for a re-parse");
    }
    assert_eq!(
        rows.iter().filter(|r| r.state == RequestState::Succeeded).count() + failed.len(),
        300
    );
    let ledger = setup.ledger_by_custom_id();
    assert!(ledger.values().all(|runs| runs.len() == 1), "on_invalid=fail sends nothing again");
    let billed = setup.sim.stats().requests_billed;

    // The same schema again changes nothing; a relaxed one promotes every invalid answer.
    let record = engine.store().job(job).await.unwrap().unwrap();
    let report = engine.reparse(&record, None).await.unwrap();
    assert_eq!((report.promoted, report.demoted, report.resent), (0, 0, 0));
    let report = engine.reparse(&record, Some(json!({"type": "object"}))).await.unwrap();
    assert_eq!(report.promoted, failed.len() as u64);
    assert_eq!((report.demoted, report.resent), (0, 0));
    let counts = engine.store().job_counts(job).await.unwrap();
    assert_eq!((counts.succeeded, counts.failed), (300, 0));
    assert_eq!(setup.sim.stats().requests_billed, billed, "no provider traffic");
    assert_eq!(setup.sim.ledger().len(), 300);
    let record = engine.store().job(job).await.unwrap().unwrap();
    assert_eq!(record.state, JobState::Done);
    assert_eq!(record.settings.schema, Some(json!({"type": "object"})));

    // Back to the strict schema: the violations are demoted again, and (on_invalid=fail) stay.
    let report = engine.reparse(&record, Some(label_schema())).await.unwrap();
    assert_eq!((report.demoted, report.resent), (failed.len() as u64, 0));
    assert_eq!(engine.store().job_counts(job).await.unwrap().failed, failed.len() as u64);
}

#[tokio::test]
async fn retry_on_invalid_bills_only_the_invalid_lines_again() {
    let setup = Harness::new().await;
    with_faults(&setup, &[(LineFaultKind::SchemaViolation, 0.1)]);
    let engine = setup.engine(None).await;
    let job =
        submit_with(&engine, &structured_lines(300, &json!({})), checked(OnInvalid::Retry)).await;
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
    let counts = engine.store().job_counts(job).await.unwrap();
    assert_eq!(counts.succeeded, 300, "every invalid answer was asked again until valid");
    let mut resent = 0;
    for (custom_id, runs) in setup.ledger_by_custom_id() {
        // Every run was billed (an invalid answer is still an answer); only those that were
        // invalid went out again.
        assert!(runs.iter().all(|r| r.billed()), "{custom_id}: {runs:?}");
        resent += runs.len() - 1;
    }
    assert!(resent > 10 && resent < 70, "about 10% went out again: {resent}");
    assert_eq!(
        counts.retried as usize,
        setup.ledger_by_custom_id().values().filter(|r| r.len() > 1).count()
    );
}

#[tokio::test]
async fn non_json_and_truncated_answers_never_pass_a_schema() {
    let setup = Harness::new().await;
    with_faults(&setup, &[(LineFaultKind::InvalidJson, 0.2)]);
    let engine = setup.engine(None).await;
    let job =
        submit_with(&engine, &structured_lines(100, &json!({})), checked(OnInvalid::Fail)).await;
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
    let rows = results(&engine, job).await;
    let failed: Vec<_> = rows.iter().filter(|r| r.state == RequestState::Failed).collect();
    assert!(!failed.is_empty());
    for row in failed {
        let error = error_of(row);
        assert_eq!(error["code"], INVALID_OUTPUT);
        assert!(error["message"].as_str().unwrap().contains("not JSON"), "{error}");
    }

    // Answers cut at the token limit are flagged, whatever their text.
    let truncated = submit_with(
        &engine,
        &structured_lines(5, &json!({"max_tokens": 2})),
        checked(OnInvalid::Fail),
    )
    .await;
    assert_eq!(setup.run_to_end(&engine, truncated).await, JobState::Done);
    for row in results(&engine, truncated).await {
        assert_eq!(row.state, RequestState::Failed);
        let error = error_of(&row);
        assert!(error["message"].as_str().unwrap().contains("cut off (length)"), "{error}");
    }
}

#[tokio::test]
async fn a_job_under_review_waits_and_its_answers_are_not_reused_until_approved() {
    let setup = Harness::new().await;
    let engine = setup.engine(None).await;
    let settings = JobSettings { review_sample: Some(5), ..checked(OnInvalid::Fail) };
    let lines = structured_lines(20, &json!({}));
    let job = submit_with(&engine, &lines, settings).await;
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::NeedsReview);
    // Engines have nothing to do for it.
    assert!(engine.store().open_jobs().await.unwrap().is_empty());
    // An identical job meanwhile is not answered from unreviewed answers: it is sent.
    let twin = submit_with(&engine, &lines, checked(OnInvalid::Fail)).await;
    assert_eq!(setup.run_to_end(&engine, twin).await, JobState::Done);
    assert_eq!(engine.store().job_counts(twin).await.unwrap().cached, 0);
    assert_eq!(setup.sim.stats().requests_billed, 40);

    let review = Review { verdict: ReviewVerdict::Approved, by: "ana".into(), at: 7 };
    let rejected = tranche_store::Rejected::None;
    assert_eq!(engine.store().decide_review(job, &review, rejected, "{}").await.unwrap(), Some(0));
    let record = engine.store().job(job).await.unwrap().unwrap();
    assert_eq!((record.state, record.review), (JobState::Done, Some(review.clone())));
    assert_eq!(engine.store().decide_review(job, &review, rejected, "{}").await.unwrap(), None);
}

#[tokio::test]
async fn two_jobs_submitted_at_once_with_the_same_requests_bill_each_once() {
    let setup = Harness::new().await;
    let engine = setup.engine(None).await;
    let lines = structured_lines(30, &json!({}));
    let first = submit_with(&engine, &lines, checked(OnInvalid::Fail)).await;
    let second = submit_with(&engine, &lines, checked(OnInvalid::Fail)).await;
    assert_eq!(setup.run_to_end(&engine, first).await, JobState::Done);
    assert_eq!(setup.run_to_end(&engine, second).await, JobState::Done);
    assert_eq!(engine.store().job_counts(second).await.unwrap().cached, 30);
    assert_eq!(setup.sim.stats().requests_billed, 30, "each request billed once");
    // Under another schema an answer is not the same answer: that job is sent.
    let other = JobSettings { schema: Some(json!({"type": "object"})), ..checked(OnInvalid::Fail) };
    let third = submit_with(&engine, &lines, other).await;
    assert_eq!(setup.run_to_end(&engine, third).await, JobState::Done);
    assert_eq!(setup.sim.stats().requests_billed, 60);
}

#[tokio::test]
async fn a_twin_whose_original_fails_goes_out_itself() {
    let setup = Harness::new().await;
    with_faults(&setup, &[(LineFaultKind::Fatal, 1.0)]);
    let engine = setup.engine(None).await;
    let lines = structured_lines(4, &json!({}));
    let first = submit_with(&engine, &lines, checked(OnInvalid::Fail)).await;
    let second = submit_with(&engine, &lines, checked(OnInvalid::Fail)).await;
    // The first tick plans only the first job's requests; the twins wait for them.
    engine.tick().await.unwrap();
    assert_eq!(engine.store().job_counts(second).await.unwrap().pending, 4);
    assert_eq!(setup.run_to_end(&engine, first).await, JobState::Done);
    with_faults(&setup, &[]);
    assert_eq!(setup.run_to_end(&engine, second).await, JobState::Done);
    assert_eq!(engine.store().job_counts(first).await.unwrap().failed, 4);
    assert_eq!(engine.store().job_counts(second).await.unwrap().succeeded, 4);
    assert!(setup.ledger_by_custom_id().values().all(|runs| runs.len() == 2));
}

#[tokio::test]
async fn an_undecodable_result_line_is_reparsed_not_resent() {
    let setup = Harness::new().await;
    let engine = setup.engine(None).await;
    let job =
        submit_with(&engine, &structured_lines(10, &json!({})), checked(OnInvalid::Fail)).await;
    // Step until the raw results rest in the blob store, ingest still to come.
    let tranche = 'collected: {
        for _ in 0..50 {
            engine.tick().await.unwrap();
            setup.sim.advance(1.0);
            for t in engine.store().job_unfinished_tranches(job).await.unwrap() {
                if t.state == tranche_core::TrancheState::Ingesting {
                    break 'collected t.id;
                }
            }
        }
        panic!("the results were never collected");
    };
    // One line becomes unreadable (its size kept, so the file is still the one recorded).
    let path = setup.dir.path().join(format!("blobs/raw/{tranche}/output.jsonl"));
    let original = std::fs::read_to_string(&path).unwrap();
    let broken: String =
        original
            .lines()
            .map(|line| {
                if line.contains("\"k3:t:v1\"") { "#".repeat(line.len()) } else { line.to_owned() }
            })
            .map(|line| line + "\n")
            .collect();
    assert_eq!(broken.len(), original.len());
    std::fs::write(&path, &broken).unwrap();
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
    let rows = results(&engine, job).await;
    assert_eq!(rows[3].state, RequestState::Failed);
    assert_eq!(error_of(&rows[3])["code"], UNDECODABLE_RESULT);
    assert!(rows.iter().enumerate().all(|(i, r)| i == 3 || r.state == RequestState::Succeeded));
    assert_eq!(setup.sim.ledger().len(), 10, "the request was not sent again");

    // Still unreadable: a re-parse leaves it; readable again (the parser fixed): promoted.
    let record = engine.store().job(job).await.unwrap().unwrap();
    assert_eq!(engine.reparse(&record, None).await.unwrap().undecodable, 1);
    std::fs::write(&path, &original).unwrap();
    let report = engine.reparse(&record, None).await.unwrap();
    assert_eq!((report.promoted, report.undecodable, report.resent), (1, 0, 0));
    assert_eq!(engine.store().job_counts(job).await.unwrap().succeeded, 10);
    assert_eq!(setup.sim.ledger().len(), 10);
}

#[tokio::test]
async fn a_reparse_under_a_stricter_schema_sends_back_only_what_retry_allows() {
    let setup = Harness::new().await;
    let engine = setup.engine(None).await;
    let settings = JobSettings { max_attempts: Some(2), ..checked(OnInvalid::Retry) };
    let job = submit_with(&engine, &structured_lines(10, &json!({})), settings).await;
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
    // A field no answer has: every answer is now invalid, and each has one attempt left.
    let stricter = json!({"type": "object", "required": ["reason"]});
    let record = engine.store().job(job).await.unwrap().unwrap();
    let report = engine.reparse(&record, Some(stricter)).await.unwrap();
    assert_eq!((report.demoted, report.resent), (10, 10));
    let reopened = engine.store().job(job).await.unwrap().unwrap();
    assert_eq!(reopened.state, JobState::Running);
    let refused = engine.reparse(&reopened, None).await.unwrap_err();
    assert!(matches!(refused, tranche_engine::ReparseError::NotEnded(..)), "{refused}");
    assert_eq!(setup.run_to_end(&engine, job).await, JobState::Done);
    // Sent once more each, then out of attempts: failed, naming the field.
    assert!(setup.ledger_by_custom_id().values().all(|runs| runs.len() == 2));
    for row in results(&engine, job).await {
        assert_eq!(row.state, RequestState::Failed);
        let error = error_of(&row);
        assert_eq!(error["code"], INVALID_OUTPUT);
        assert!(error["message"].as_str().unwrap().contains("\"reason\" is a required property"));
    }
}
