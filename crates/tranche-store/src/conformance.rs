//! The conformance suite every store backend passes: one check per capability, each on a
//! fresh, empty store. Jobs are all-or-nothing and keep input order; claims never overlap, even
//! when racing; results are recorded once, and ingest repeated changes nothing; dedup look-ups
//! match custom id and input hash; leases exclude, expire and pass on; every transition is a
//! compare-and-set.
//!
//! Its fixtures (`add_job`, `claim_all`) serve other crates' tests that need a store holding
//! a job or a tranche.
//!
//! A backend runs it with `tranche_store::store_conformance!(factory)` in a test file, where
//! `factory` is an `async fn() -> Fresh` giving a new store. Shaped like the provider adapters'
//! conformance suite: adding a backend is a factory and one macro line.

#![expect(
    clippy::unwrap_used,
    clippy::missing_panics_doc,
    clippy::panic,
    reason = "a test suite fails loudly"
)]

use std::time::Duration;

use futures::TryStreamExt;
use tranche_core::{
    AccountId, Endpoint, EngineId, InputHash, JobId, JobSettings, JobState, LeaseToken,
    ProviderKind, RequestState, TokenUsage, TrancheId, TrancheState, Usd,
};

use crate::*;

/// A tranche of `model` at `provider`, on the suite's account, to claim requests into.
fn new_tranche(provider: ProviderKind, model: &str) -> NewTranche {
    NewTranche {
        id: TrancheId::new(),
        account: account(),
        est_tokens: 0,
        provider,
        endpoint: Endpoint::ChatCompletions,
        model: model.into(),
        answer_check: None,
        tenant: None,
        bytes: 0,
        created_at: 1,
    }
}

/// The chat-completions group of `model` and `check` of jobs without a tenant.
fn pool<'a>(model: &'a str, check: Option<&'a str>) -> Pool<'a> {
    Pool { endpoint: Endpoint::ChatCompletions, model, answer_check: check, tenant: None }
}

/// The account the suite's tranches are on.
fn account() -> AccountId {
    AccountId::new(ProviderKind::Openai, "http://127.0.0.1:9/v1")
}

/// A fresh, empty store of the backend under test, with whatever keeps it alive (a temporary
/// folder, a scratch database) until the check ends.
pub struct Fresh {
    pub store: std::sync::Arc<dyn Store>,
    pub guard: Box<dyn std::any::Any + Send>,
}

impl std::fmt::Debug for Fresh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fresh").field("store", &self.store).finish_non_exhaustive()
    }
}

/// Records a tranche and claims requests into it under a planning lease, as an engine does.
async fn create_tranche(store: &dyn Store, tranche: &NewTranche, ids: &[i64]) -> Option<u64> {
    let token = LeaseToken::new();
    let engine = EngineId::new("test", 1);
    let duty = format!("plan:{token}");
    store.acquire_duty(&duty, &engine, token, Duration::from_secs(60)).await.unwrap().unwrap();
    let claimed = store.create_tranche(tranche, ids, (&duty, token)).await.unwrap();
    store.release_duty(&duty, token).await.unwrap();
    claimed
}

/// Takes a tranche's lease, as an engine does before it steps it.
async fn lease(store: &dyn Store, tranche: TrancheId) -> Held {
    let token = LeaseToken::new();
    let engine = EngineId::new("test", 1);
    let (record, _) = store
        .lease_tranche(tranche, &engine, token, Duration::from_secs(60), i64::MAX)
        .await
        .unwrap()
        .unwrap();
    Held { token, state: record.state }
}

fn new_job() -> NewJob {
    NewJob {
        id: JobId::new(),
        provider: ProviderKind::Openai,
        source: Some("input.jsonl".into()),
        settings: JobSettings { task: Some("t".into()), ..JobSettings::default() },
        body_object: None,
        answer_check: None,
        created_at: 100,
    }
}

/// Waiting requests are grouped by their jobs' tenant, a page reads one tenant's, and a
/// tranche's tenant is what each tenant's load is counted by.
pub async fn waiting_requests_are_grouped_by_tenant_and_tranches_hold_one(store: &dyn Store) {
    add_job(store, 2, "m").await;
    let acme = NewJob {
        settings: JobSettings { tenant: Some("acme".into()), ..new_job().settings },
        ..new_job()
    };
    add_job_as(store, 3, "m", acme, "01").await;
    let groups = store.pending_groups(ProviderKind::Openai, i64::MAX).await.unwrap();
    let seen: Vec<_> = groups.iter().map(|g| (g.tenant.as_deref(), g.count)).collect();
    assert_eq!(seen, [(None, 2), (Some("acme"), 3)]);
    let page = |tenant: Option<&'static str>| async move {
        let group = Pool { tenant, ..pool("m", None) };
        store.pending_page(ProviderKind::Openai, group, i64::MAX, 0, 10).await.unwrap()
    };
    assert_eq!(page(None).await.len(), 2);
    let ids: Vec<i64> = page(Some("acme")).await.iter().map(|p| p.request_id).collect();
    assert_eq!(ids.len(), 3);
    assert!(page(Some("other")).await.is_empty());
    let tranche = NewTranche {
        tenant: Some("acme".into()),
        est_tokens: 30,
        ..new_tranche(ProviderKind::Openai, "m")
    };
    assert_eq!(create_tranche(store, &tranche, &ids).await, Some(3));
    let loads = store.tenant_loads(ProviderKind::Openai).await.unwrap();
    let expected = TenantLoad {
        tenant: Some("acme".into()),
        account: Some(account()),
        model: "m".into(),
        enqueued_tokens: 30,
        live_tranches: 1,
    };
    assert_eq!(loads, [expected]);
    assert!(page(Some("acme")).await.is_empty(), "claimed requests no longer wait");
    assert!(store.tenant_loads(ProviderKind::Anthropic).await.unwrap().is_empty());
}

/// Records a job of `n` requests of `model` (`k0:t:v1`, `k1:t:v1`, ...), bodies in the store.
pub async fn add_job(store: &dyn Store, n: u64, model: &str) -> JobId {
    add_job_as(store, n, model, new_job(), "00").await
}

/// A request's input hash named by a short label: equal labels, equal hashes. (The bytes after
/// the label are 0xab, so that its hex digits hold letters as well as digits.)
fn hash_of(label: &str) -> InputHash {
    let mut bytes = [0xab_u8; 32];
    for (byte, from) in bytes.iter_mut().zip(label.bytes()) {
        *byte = from;
    }
    InputHash::from_bytes(bytes)
}

/// The request on input line `line`, its wire id its custom id, with no cost limit.
fn new_request<'a>(
    custom_id: &'a str,
    line: u64,
    model: &'a str,
    input_hash: &'a str,
) -> NewRequest<'a> {
    NewRequest {
        line,
        custom_id,
        wire_id: custom_id,
        endpoint: Endpoint::ChatCompletions,
        model,
        body: RequestBody::Stored(r#"{"model":"m"}"#),
        wire_bytes: 10,
        input_hash: hash_of(input_hash),
        max_attempts: 3,
        est_tokens: 10,
        max_cost: None,
        accepted_at: 100,
    }
}

/// Records `job` with `n` requests of `model` whose input hash is `input_hash`.
async fn add_job_as(
    store: &dyn Store,
    n: u64,
    model: &str,
    job: NewJob,
    input_hash: &str,
) -> JobId {
    let id = job.id;
    let mut writer = store.begin_job(job).await.unwrap();
    for i in 0..n {
        let custom_id = format!("k{i}:t:v1");
        writer.add(&new_request(&custom_id, i + 1, model, input_hash)).await.unwrap();
    }
    assert_eq!(writer.commit().await.unwrap(), n);
    id
}

/// Every waiting request of model `model`, paged as the planner pages them.
async fn pending_ids(store: &dyn Store, model: &str) -> Vec<i64> {
    let mut ids = Vec::new();
    loop {
        let after = ids.last().copied().unwrap_or(0);
        let page = store
            .pending_page(ProviderKind::Openai, pool(model, None), i64::MAX, after, 7)
            .await
            .unwrap();
        if page.is_empty() {
            return ids;
        }
        ids.extend(page.iter().map(|i| i.request_id));
    }
}

/// Claims every waiting request of `model` into one new tranche, as an engine's planning does.
pub async fn claim_all(store: &dyn Store, model: &str) -> (TrancheId, Vec<i64>) {
    let ids = pending_ids(store, model).await;
    let tranche =
        NewTranche { bytes: 0, created_at: 1, ..new_tranche(ProviderKind::Openai, model) };
    create_tranche(store, &tranche, &ids).await;
    (tranche.id, ids)
}

/// A result row's output, when it was kept as text.
fn text(row: &ResultRow) -> Option<&str> {
    match &row.output {
        Some(OutputRef::Text(text)) => Some(text),
        _ => None,
    }
}

/// A request's attempt that ended it failed (a 400) at `at`.
fn fatal(at: i64) -> ResultUpdate<'static> {
    ResultUpdate {
        state: RequestState::Failed,
        outcome: AttemptOutcome::Errored,
        status_code: Some(400),
        output: None,
        error: Some("{}"),
        billed: None,
        spends_attempt: true,
        not_before: 0,
        at,
    }
}

/// A usage of `input` tokens, a fifth of them read from the cache, and `output` tokens.
fn billed(model: &str, input: u64, output: u64) -> Billed {
    let tokens = TokenUsage { input, cached_input: input / 5, output, ..TokenUsage::default() };
    Billed { model: model.to_owned(), tokens }
}

fn success(wire_id: &str, output: &str) -> Success {
    Success {
        wire_id: wire_id.into(),
        status_code: 200,
        output: OutputRef::Text(output.into()),
        billed: Some(billed("m-2024-01-01", 2, 3)),
    }
}

pub async fn many_requests_are_written_in_order_across_statements(store: &dyn Store) {
    let first = add_job(store, 1_000, "m").await;
    // The same custom ids with other bodies (identical ones would wait for the first job's).
    let second = add_job_as(store, 3, "m", new_job(), "01").await;
    let ids = pending_ids(store, "m").await;
    assert_eq!(ids.len(), 1_003);
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids ascend in input order");
    let groups = store.pending_groups(ProviderKind::Openai, i64::MAX).await.unwrap();
    assert_eq!(groups.len(), 1);
    assert_eq!((groups[0].count, groups[0].oldest_accepted_at), (1_003, 100));
    assert_eq!(store.job_counts(first).await.unwrap().pending, 1_000);
    assert_eq!(store.job_counts(second).await.unwrap().pending, 3);
    let (tranche, _) = claim_all(store, "m").await;
    let lines: Vec<InputLine> = store.tranche_input(tranche).try_collect().await.unwrap();
    assert_eq!(lines.len(), 1_003);
    let order = [&lines[0].wire_id, &lines[999].wire_id, &lines[1_000].wire_id];
    assert_eq!(order, ["k0:t:v1", "k999:t:v1", "k0:t:v1"], "in request order");
    assert_eq!(lines.iter().filter(|l| l.wire_id == "k0:t:v1").count(), 2, "one of each job");
    let jobs: Vec<JobId> = lines.iter().map(|l| l.job_id).collect();
    assert!(jobs[..1_000].iter().all(|j| *j == first), "each line names its job");
    assert!(jobs[1_000..].iter().all(|j| *j == second));
    assert!(lines.iter().any(|l| l.wire_id == "k999:t:v1"));
    let body = InputBody::Text(r#"{"model":"m"}"#.to_owned());
    assert!(lines.iter().all(|l| l.body == body));
}

/// A tranche's input comes in request order and holds its own requests only, whether its ids
/// form a run with others' between them or lie far apart (as requests sent again do).
pub async fn a_tranches_input_is_its_requests_in_order_however_spread(store: &dyn Store) {
    add_job(store, 40, "m").await;
    let ids = pending_ids(store, "m").await;
    let wire_ids =
        |picked: &[usize]| -> Vec<String> { picked.iter().map(|i| format!("k{i}:t:v1")).collect() };
    // A run with one request left out (it stays waiting), and four far apart.
    let run: Vec<usize> = (1..=12).filter(|&i| i != 6).collect();
    let spread = [0, 13, 26, 39];
    for picked in [&run[..], &spread[..]] {
        let tranche = new_tranche(ProviderKind::Openai, "m");
        let chosen: Vec<i64> = picked.iter().map(|&i| ids[i]).collect();
        assert_eq!(create_tranche(store, &tranche, &chosen).await, Some(picked.len() as u64));
        let lines: Vec<InputLine> = store.tranche_input(tranche.id).try_collect().await.unwrap();
        let got: Vec<String> = lines.into_iter().map(|l| l.wire_id).collect();
        assert_eq!(got, wire_ids(picked));
    }
    let none: Vec<InputLine> = store.tranche_input(TrancheId::new()).try_collect().await.unwrap();
    assert!(none.is_empty(), "a tranche with no requests has no input");
}

/// A tranche's input bytes are what submit measured of its requests still queued in it:
/// others' requests, and its own once ended, count for nothing.
pub async fn a_tranches_input_bytes_are_what_its_queued_requests_measured(store: &dyn Store) {
    let mut writer = store.begin_job(new_job()).await.unwrap();
    for i in 0..6u64 {
        let custom_id = format!("k{i}:t:v1");
        let request =
            NewRequest { wire_bytes: 100 + i, ..new_request(&custom_id, i + 1, "m", "00") };
        writer.add(&request).await.unwrap();
    }
    assert_eq!(writer.commit().await.unwrap(), 6);
    let ids = pending_ids(store, "m").await;
    let tranche = new_tranche(ProviderKind::Openai, "m");
    assert_eq!(create_tranche(store, &tranche, &ids[1..4]).await, Some(3));
    assert_eq!(store.tranche_input_bytes(tranche.id).await.unwrap(), 101 + 102 + 103);
    let held = lease(store, tranche.id).await;
    let mut ingest = store.begin_ingest(tranche.id, held).await.unwrap();
    assert!(ingest.record("k2:t:v1", &fatal(2)).await.unwrap());
    assert!(ingest.commit(TrancheState::Ingesting, 2).await.unwrap());
    assert_eq!(store.tranche_input_bytes(tranche.id).await.unwrap(), 101 + 103, "k2 ended");
    assert_eq!(store.tranche_input_bytes(TrancheId::new()).await.unwrap(), 0);
}

/// A tranche's input and a job's results larger than a backend reads at once (SQLite reads
/// them in pages of 1,024 rows) come back whole and in order, at a page's boundary and past it.
pub async fn inputs_and_results_larger_than_a_page_come_back_whole_in_order(store: &dyn Store) {
    // Other bodies (input hashes) in each job, so that no request waits for another's answer.
    for (n, model, hash) in [(2_048u64, "m1", "00"), (2_049, "m2", "01")] {
        let job = add_job_as(store, n, model, new_job(), hash).await;
        let (tranche, _) = claim_all(store, model).await;
        let lines: Vec<InputLine> = store.tranche_input(tranche).try_collect().await.unwrap();
        let wire_ids: Vec<String> = (0..n).map(|i| format!("k{i}:t:v1")).collect();
        assert_eq!(lines.iter().map(|l| l.wire_id.clone()).collect::<Vec<_>>(), wire_ids);
        assert!(lines.iter().all(|l| l.job_id == job));
        let held = lease(store, tranche).await;
        let mut writer = store.begin_ingest(tranche, held).await.unwrap();
        // Every request answered but the last, each with its own text.
        let mut answers: Vec<Success> = (0..n - 1)
            .map(|i| {
                success(&format!("k{i}:t:v1"), &format!("{{\"n\": {i}, \"s\": \"é\\n\\\"\"}}"))
            })
            .collect();
        writer.record_successes(&mut answers, 9).await.unwrap();
        assert!(writer.commit(TrancheState::Cleaning, 9).await.unwrap());
        let rows: Vec<ResultRow> = store.job_results(job).try_collect().await.unwrap();
        assert_eq!(rows.len() as u64, n);
        assert!(rows.windows(2).all(|w| w[0].request_id < w[1].request_id), "in input order");
        for (i, row) in rows.iter().enumerate() {
            assert_eq!(row.custom_id, wire_ids[i]);
            assert_eq!(row.tranche_id, Some(tranche));
        }
        assert_eq!(text(&rows[1_023]), Some("{\"n\": 1023, \"s\": \"é\\n\\\"\"}"));
        assert_eq!(text(&rows[1_024]), Some("{\"n\": 1024, \"s\": \"é\\n\\\"\"}"));
        let last = &rows[rows.len() - 1];
        assert_eq!((last.state, last.output.as_ref()), (RequestState::Queued, None));
        let before_last = &rows[rows.len() - 2];
        assert_eq!(before_last.state, RequestState::Succeeded);
        assert_eq!(before_last.input_tokens, Some(2));
    }
}

pub async fn successes_are_recorded_in_bulk_once_each(store: &dyn Store) {
    let job = add_job(store, 1_200, "m").await;
    let (tranche, _) = claim_all(store, "m").await;
    let held = lease(store, tranche).await;
    let mut writer = store.begin_ingest(tranche, held).await.unwrap();
    // More lines than one statement takes, an unknown id and a repeated one.
    let mut lines: Vec<Success> =
        (0..1_100).map(|i| success(&format!("k{i}:t:v1"), &format!(r#"{{"n": {i}}}"#))).collect();
    lines.push(success("nope", "{}"));
    lines.push(success("k5:t:v1", r#"{"again":true}"#));
    // Repeated within the statement that holds its first line, too.
    lines.push(success("k1050:t:v1", r#"{"again":true}"#));
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
    let rows: Vec<ResultRow> = store.job_results(job).try_collect().await.unwrap();
    assert_eq!(text(&rows[5]), Some(r#"{"n": 5}"#), "the first line for an id wins");
    assert_eq!(text(&rows[1_050]), Some(r#"{"n": 1050}"#));
    assert_eq!(text(&rows[1_099]), Some(r#"{"n": 1099}"#));
    assert_eq!(rows[1_100].output, None);
}

pub async fn a_dropped_job_writer_stores_nothing(store: &dyn Store) {
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
            body: RequestBody::Stored("{}"),
            wire_bytes: 2,
            input_hash: hash_of("00"),
            max_attempts: 3,
            est_tokens: 10,
            max_cost: None,
            accepted_at: 100,
        })
        .await
        .unwrap();
    drop(writer);
    assert!(store.job(id).await.unwrap().is_none());
    assert!(store.recent_jobs(10).await.unwrap().is_empty());
    assert!(pending_ids(store, "m").await.is_empty());
}

pub async fn a_committed_job_is_pending_with_its_counts(store: &dyn Store) {
    let id = add_job(store, 3, "m").await;
    let job = store.job(id).await.unwrap().unwrap();
    assert_eq!(job.state, JobState::Pending);
    assert_eq!(job.accepted, 3);
    assert_eq!(job.settings.task.as_deref(), Some("t"));
    let counts = store.job_counts(id).await.unwrap();
    assert_eq!(counts, RequestCounts { accepted: 3, pending: 3, ..Default::default() });
}

pub async fn requests_are_claimed_into_one_tranche_only(store: &dyn Store) {
    let id = add_job(store, 4, "m").await;
    let ids = pending_ids(store, "m").await;
    let first = NewTranche { bytes: 40, created_at: 101, ..new_tranche(ProviderKind::Openai, "m") };
    assert_eq!(create_tranche(store, &first, &ids).await, Some(4));
    let second = NewTranche { id: TrancheId::new(), ..first.clone() };
    assert_eq!(create_tranche(store, &second, &ids).await, Some(0));
    assert!(store.tranche(second.id).await.unwrap().is_none(), "an empty tranche is not kept");
    assert_eq!(store.tranche(first.id).await.unwrap().unwrap().request_count, 4);
    // Moving the job on is the engine's decision, made through the store.
    assert_eq!(store.job(id).await.unwrap().unwrap().state, JobState::Pending);
    let moved = store
        .move_jobs_of_tranche(first.id, JobState::Pending, JobState::Running, 102)
        .await
        .unwrap();
    assert_eq!(moved, 1);
    assert_eq!(store.job(id).await.unwrap().unwrap().state, JobState::Running);
    assert!(pending_ids(store, "m").await.is_empty());
}

/// A claim takes exactly the waiting requests it names, however they lie: a run of
/// consecutive ids, a few runs with gaps, or ids too scattered to take run by run.
pub async fn a_claim_takes_exactly_the_ids_it_names(store: &dyn Store) {
    add_job(store, 200, "m").await;
    let ids = pending_ids(store, "m").await;
    assert_eq!(ids.len(), 200);
    let tranche =
        |at| NewTranche { bytes: 10, created_at: at, ..new_tranche(ProviderKind::Openai, "m") };
    // Every other id of the first 120: 60 runs of one.
    let scattered: Vec<i64> = ids[..120].iter().copied().step_by(2).collect();
    assert_eq!(create_tranche(store, &tranche(1), &scattered).await, Some(60));
    // Three runs with gaps between them, named out of order and one id twice.
    let mut runs: Vec<i64> = ids[150..160].iter().chain(&ids[170..175]).copied().collect();
    runs.extend_from_slice(&ids[121..122]);
    runs.push(ids[150]);
    runs.reverse();
    assert_eq!(create_tranche(store, &tranche(2), &runs).await, Some(16));
    let claimed: std::collections::HashSet<i64> = scattered.iter().chain(&runs).copied().collect();
    let left = pending_ids(store, "m").await;
    let expected: Vec<i64> = ids.iter().copied().filter(|id| !claimed.contains(id)).collect();
    assert_eq!(left, expected);
    // A run that holds claimed ids takes only the waiting ones among them.
    assert_eq!(create_tranche(store, &tranche(3), &ids[..130]).await, Some(130 - 60 - 1));
}

pub async fn results_are_recorded_once_and_the_rest_in_bulk(store: &dyn Store) {
    let job = add_job(store, 3, "m").await;
    let ids = pending_ids(store, "m").await;
    let tranche = NewTranche { bytes: 30, created_at: 1, ..new_tranche(ProviderKind::Openai, "m") };
    create_tranche(store, &tranche, &ids).await;
    let answer = OutputRef::Text(r#"{"ok":true}"#.into());
    let five_and_seven = billed("m", 5, 7);
    let ok = ResultUpdate {
        state: RequestState::Succeeded,
        outcome: AttemptOutcome::Succeeded,
        status_code: Some(200),
        output: Some(&answer),
        error: None,
        billed: Some(&five_and_seven),
        spends_attempt: true,
        not_before: 0,
        at: 2,
    };
    let held = lease(store, tranche.id).await;
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
        billed: None,
        spends_attempt: true,
        not_before: 0,
        at: 2,
    };
    let rest = writer.unanswered().await.unwrap();
    assert_eq!(rest.len(), 2);
    assert_eq!(
        rest[0].1,
        AttemptInfo { job_id: job, attempts: 0, max_attempts: 3, batch_returns: 0 }
    );
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
    let rows: Vec<ResultRow> = store.job_results(job).try_collect().await.unwrap();
    assert_eq!(
        rows.iter().map(|r| r.custom_id.as_str()).collect::<Vec<_>>(),
        ["k0:t:v1", "k1:t:v1", "k2:t:v1"]
    );
    assert_eq!(text(&rows[0]), Some(r#"{"ok":true}"#));
    assert_eq!(rows[1].state, RequestState::Failed);
}

/// Records a job of `n` requests of model `m` keyed `{key}{i}`, each of which may cost at
/// most `max_cost`.
async fn add_costed_job(store: &dyn Store, key: &str, n: u64, max_cost: Usd) -> JobId {
    let job = new_job();
    let id = job.id;
    let mut writer = store.begin_job(job).await.unwrap();
    for i in 0..n {
        let custom_id = format!("{key}{i}:t:v1");
        let request =
            NewRequest { max_cost: Some(max_cost), ..new_request(&custom_id, i + 1, "m", "00") };
        writer.add(&request).await.unwrap();
    }
    assert_eq!(writer.commit().await.unwrap(), n);
    id
}

/// Whether a job has open requests and what its queued requests may still cost follow its
/// requests through their claims and results, and count no other job's requests sharing a
/// tranche.
pub async fn open_requests_and_queued_cost_follow_a_jobs_requests(store: &dyn Store) {
    let cents = |n: u64| Usd::from_nanos(n * 10_000_000);
    let job = add_costed_job(store, "k", 3, cents(2)).await;
    let other = add_costed_job(store, "o", 2, cents(5)).await;
    assert!(store.job_has_open_requests(job).await.unwrap());
    assert_eq!(store.job_queued_cost(job).await.unwrap(), Usd::ZERO, "waiting is not queued");

    // Two of the job's requests and one of the other's share a tranche.
    let ids = pending_ids(store, "m").await;
    let first = NewTranche { bytes: 30, created_at: 1, ..new_tranche(ProviderKind::Openai, "m") };
    create_tranche(store, &first, &[ids[0], ids[1], ids[3]]).await;
    assert_eq!(store.job_queued_cost(job).await.unwrap(), cents(4));
    assert_eq!(store.job_queued_cost(other).await.unwrap(), cents(5));

    let held = lease(store, first.id).await;
    let mut writer = store.begin_ingest(first.id, held).await.unwrap();
    let mut lines = vec![success("k0:t:v1", "{}")];
    assert_eq!(writer.record_successes(&mut lines, 2).await.unwrap(), 1);
    assert!(writer.record("k1:t:v1", &fatal(2)).await.unwrap());
    assert!(writer.commit(TrancheState::Cleaning, 2).await.unwrap());
    assert_eq!(store.job_queued_cost(job).await.unwrap(), Usd::ZERO);
    assert_eq!(store.job_queued_cost(other).await.unwrap(), cents(5), "still queued");
    assert!(store.job_has_open_requests(job).await.unwrap(), "one still waits");

    let second = NewTranche { bytes: 10, created_at: 2, ..new_tranche(ProviderKind::Openai, "m") };
    create_tranche(store, &second, &[ids[2]]).await;
    assert_eq!(store.job_queued_cost(job).await.unwrap(), cents(2));
    let held = lease(store, second.id).await;
    let mut writer = store.begin_ingest(second.id, held).await.unwrap();
    assert!(writer.record("k2:t:v1", &fatal(3)).await.unwrap());
    assert!(writer.commit(TrancheState::Cleaning, 3).await.unwrap());
    assert!(!store.job_has_open_requests(job).await.unwrap());
    assert_eq!(store.job_queued_cost(job).await.unwrap(), Usd::ZERO);
    assert!(store.job_has_open_requests(other).await.unwrap());

    // Cancelling ends what waits, and nothing when nothing does.
    assert_eq!(store.cancel_job(job, 4).await.unwrap(), 0);
    assert_eq!(store.cancel_job(other, 4).await.unwrap(), 1);
    assert_eq!(store.cancel_job(other, 5).await.unwrap(), 0);
    let counts = store.job_counts(other).await.unwrap();
    assert_eq!((counts.pending, counts.queued, counts.cancelled), (0, 1, 1));
    assert!(store.job_has_open_requests(other).await.unwrap(), "one still queued");
    assert!(store.job(other).await.unwrap().unwrap().cancel_requested);
}

pub async fn provider_files_are_tracked_until_deleted(store: &dyn Store) {
    let job = add_job(store, 1, "m").await;
    let ids = pending_ids(store, "m").await;
    let tranche = NewTranche { bytes: 10, created_at: 1, ..new_tranche(ProviderKind::Openai, "m") };
    create_tranche(store, &tranche, &ids).await;
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
    assert_eq!(store.tranche_uploads(tranche.id).await.unwrap(), 1, "deleted uploads count");
    assert_eq!(
        store.job_file_counts(job).await.unwrap(),
        FileCounts { uploaded: 1, created_by_provider: 1, deleted: 1, live: 1 }
    );
    // While the tranche runs, its live file will be freed; once it has ended, it will not.
    let (openai, ours) = (ProviderKind::Openai, Some(account()));
    let other = TrancheId::new();
    assert_eq!(store.tranches_holding_files(openai, ours.as_ref(), other).await.unwrap(), 1);
    assert_eq!(store.tranches_holding_files(openai, ours.as_ref(), tranche.id).await.unwrap(), 0);
    assert_eq!(store.tranches_holding_files(openai, None, other).await.unwrap(), 0);
    let held = lease(store, tranche.id).await;
    let done = TrancheUpdate::to(TrancheState::Done, 6);
    assert!(store.update_tranche(tranche.id, held, done).await.unwrap());
    assert_eq!(store.tranches_holding_files(openai, ours.as_ref(), other).await.unwrap(), 0);
    // What a janitor asks: whose are these files, where do these tranches stand.
    let asked = ["file-in".to_owned(), "file-x".to_owned(), "file-out".to_owned()];
    let mut owners = store.file_owners(openai, &asked).await.unwrap();
    owners.sort_by(|a, b| a.file_id.cmp(&b.file_id));
    assert_eq!(
        owners.iter().map(|o| o.file_id.as_str()).collect::<Vec<_>>(),
        ["file-in", "file-out"]
    );
    assert!(
        owners.iter().all(|o| o.tranche_id == tranche.id && o.tranche_state == TrancheState::Done)
    );
    assert!(store.file_owners(ProviderKind::Azure, &asked).await.unwrap().is_empty());
    let states = store.tranche_states(&[tranche.id, other]).await.unwrap();
    assert_eq!(states, [(tranche.id, TrancheState::Done)]);
    assert!(store.account_used(&account()).await.unwrap());
    let unused = AccountId::new(ProviderKind::Azure, "http://127.0.0.1:9/openai/v1");
    assert!(!store.account_used(&unused).await.unwrap());
    // Uploads by time, and audits kept in order.
    assert_eq!(store.uploads_since(openai, ours.as_ref(), 1).await.unwrap(), 1);
    assert_eq!(store.uploads_since(openai, ours.as_ref(), 2).await.unwrap(), 0);
    assert_eq!(store.uploads_since(openai, None, 0).await.unwrap(), 0);
    let audit = |at, inputs| FileAuditCounts {
        account: account(),
        at,
        total: inputs + 1,
        inputs_with_expiry: inputs,
        inputs_without_expiry: 0,
    };
    assert_eq!(store.first_file_audit(&account(), 0).await.unwrap(), None);
    store.record_file_audit(&audit(200, 7)).await.unwrap();
    store.record_file_audit(&audit(100, 4)).await.unwrap();
    assert_eq!(store.first_file_audit(&account(), 0).await.unwrap(), Some(audit(100, 4)));
    assert_eq!(store.first_file_audit(&account(), 150).await.unwrap(), Some(audit(200, 7)));
    assert_eq!(store.first_file_audit(&account(), 201).await.unwrap(), None);
}

const LONG: Duration = Duration::from_secs(60);
const SHORT: Duration = Duration::from_millis(150);

struct Fixture {
    tranche: TrancheId,
    job: JobId,
}

/// A store with one job of three requests claimed into one planned tranche.
async fn fixture(store: &dyn Store) -> Fixture {
    let job = JobId::new();
    let mut writer = store
        .begin_job(NewJob {
            id: job,
            provider: ProviderKind::Openai,
            source: None,
            settings: JobSettings::default(),
            body_object: None,
            answer_check: None,
            created_at: 1,
        })
        .await
        .unwrap();
    for i in 0..3 {
        let id = format!("k{i}:t:v1");
        writer
            .add(&NewRequest {
                line: i + 1,
                custom_id: &id,
                wire_id: &id,
                endpoint: Endpoint::ChatCompletions,
                model: "m",
                body: RequestBody::Stored("{}"),
                wire_bytes: 10,
                input_hash: hash_of("00"),
                max_attempts: 3,
                est_tokens: 1,
                max_cost: None,
                accepted_at: 1,
            })
            .await
            .unwrap();
    }
    writer.commit().await.unwrap();
    let ids: Vec<i64> = store
        .pending_page(ProviderKind::Openai, pool("m", None), 10, 0, 10)
        .await
        .unwrap()
        .iter()
        .map(|p| p.request_id)
        .collect();
    let token = LeaseToken::new();
    store.acquire_duty("plan:openai", &engine("planner"), token, LONG).await.unwrap().unwrap();
    let tranche = NewTranche { est_tokens: 3, bytes: 30, ..new_tranche(ProviderKind::Openai, "m") };
    let claimed = store.create_tranche(&tranche, &ids, ("plan:openai", token)).await.unwrap();
    assert_eq!(claimed, Some(3));
    Fixture { tranche: tranche.id, job }
}

fn engine(name: &str) -> EngineId {
    EngineId::new(name, 1)
}

pub async fn a_held_tranche_lease_excludes_other_engines_until_handed_back(store: &dyn Store) {
    let f = fixture(store).await;
    let (a, b) = (engine("a"), engine("b"));
    let (ta, tb) = (LeaseToken::new(), LeaseToken::new());
    let (record, grant) = store.lease_tranche(f.tranche, &a, ta, LONG, 10).await.unwrap().unwrap();
    assert_eq!(record.state, TrancheState::Planned);
    assert_eq!(record.lease_owner.as_ref(), Some(&a), "status can tell who holds it");
    let unfinished = store.job_unfinished_tranches(f.job).await.unwrap();
    assert_eq!(unfinished.len(), 1);
    assert_eq!((unfinished[0].id, unfinished[0].lease_owner.as_ref()), (f.tranche, Some(&a)));
    assert!(grant.remaining > Duration::from_secs(55) && grant.remaining <= LONG);
    assert!(store.lease_tranche(f.tranche, &b, tb, LONG, 10).await.unwrap().is_none());
    assert!(store.due_tranches(10).await.unwrap().is_empty(), "a leased tranche is not due");
    // Renewing needs the holder's token.
    assert!(store.renew_tranche_lease(f.tranche, tb, LONG).await.unwrap().is_none());
    assert!(store.renew_tranche_lease(f.tranche, ta, LONG).await.unwrap().is_some());
    // A release with the wrong token changes nothing; the holder's frees it at once.
    store.release_tranche_lease(f.tranche, tb).await.unwrap();
    assert!(store.lease_tranche(f.tranche, &b, tb, LONG, 10).await.unwrap().is_none());
    store.release_tranche_lease(f.tranche, ta).await.unwrap();
    assert_eq!(store.due_tranches(10).await.unwrap().len(), 1);
    let (record, _) = store.lease_tranche(f.tranche, &b, tb, LONG, 10).await.unwrap().unwrap();
    assert_eq!(record.lease_owner.as_ref(), Some(&b));
}

pub async fn a_lapsed_lease_passes_to_another_engine_and_its_holder_can_no_longer_act(
    store: &dyn Store,
) {
    let f = fixture(store).await;
    let (ta, tb) = (LeaseToken::new(), LeaseToken::new());
    let (record, _) =
        store.lease_tranche(f.tranche, &engine("a"), ta, SHORT, 10).await.unwrap().unwrap();
    let held_a = Held { token: ta, state: record.state };
    tokio::time::sleep(SHORT * 2).await;
    let (record, _) =
        store.lease_tranche(f.tranche, &engine("b"), tb, LONG, 10).await.unwrap().unwrap();
    let held_b = Held { token: tb, state: record.state };
    // The old holder's renewal, transition and ingest all fail; nothing it does lands.
    assert!(store.renew_tranche_lease(f.tranche, ta, LONG).await.unwrap().is_none());
    let uploading = TrancheUpdate::to(TrancheState::Uploading, 11);
    assert!(!store.update_tranche(f.tranche, held_a, uploading.clone()).await.unwrap());
    assert!(!store.defer_tranche(f.tranche, ta, &serde_json::json!({}), 99, 11).await.unwrap());
    let mut writer = store.begin_ingest(f.tranche, held_a).await.unwrap();
    assert!(writer.record("k0:t:v1", &fatal(11)).await.unwrap());
    assert!(!writer.commit(TrancheState::Failed, 11).await.unwrap(), "the commit is refused");
    assert_eq!(store.job_counts(f.job).await.unwrap().queued, 3, "and nothing was recorded");
    // The new holder moves on.
    assert!(store.update_tranche(f.tranche, held_b, uploading).await.unwrap());
    let record = store.tranche(f.tranche).await.unwrap().unwrap();
    assert_eq!(record.state, TrancheState::Uploading);
}

pub async fn a_transition_expecting_another_state_changes_nothing(store: &dyn Store) {
    let f = fixture(store).await;
    let token = LeaseToken::new();
    store.lease_tranche(f.tranche, &engine("a"), token, LONG, 10).await.unwrap().unwrap();
    let stale = Held { token, state: TrancheState::Uploaded };
    let mut update = TrancheUpdate::to(TrancheState::Creating, 11);
    update.input_file_id = Some("file-1".into());
    assert!(!store.update_tranche(f.tranche, stale, update.clone()).await.unwrap());
    let record = store.tranche(f.tranche).await.unwrap().unwrap();
    assert_eq!((record.state, record.input_file_id), (TrancheState::Planned, None));
    let mut writer = store.begin_ingest(f.tranche, stale).await.unwrap();
    assert_eq!(writer.unanswered().await.unwrap().len(), 3);
    assert!(!writer.commit(TrancheState::Cleaning, 11).await.unwrap());
    let fresh = Held { token, state: TrancheState::Planned };
    assert!(
        store
            .update_tranche(f.tranche, fresh, TrancheUpdate::to(TrancheState::Uploading, 11))
            .await
            .unwrap()
    );
}

pub async fn a_tranche_not_due_or_finished_cannot_be_leased(store: &dyn Store) {
    let f = fixture(store).await;
    let token = LeaseToken::new();
    let a = engine("a");
    assert!(store.lease_tranche(f.tranche, &a, token, LONG, -1).await.unwrap().is_none());
    let (record, _) = store.lease_tranche(f.tranche, &a, token, LONG, 10).await.unwrap().unwrap();
    let done = TrancheUpdate::to(TrancheState::Done, 11);
    assert!(
        store.update_tranche(f.tranche, Held { token, state: record.state }, done).await.unwrap()
    );
    store.release_tranche_lease(f.tranche, token).await.unwrap();
    let again = LeaseToken::new();
    assert!(store.lease_tranche(f.tranche, &a, again, LONG, 99).await.unwrap().is_none());
}

pub async fn one_engine_at_a_time_plans_and_a_lapsed_planner_claims_nothing(store: &dyn Store) {
    fixture(store).await;
    // The fixture's planner still holds the duty.
    let b = LeaseToken::new();
    assert!(store.acquire_duty("plan:openai", &engine("b"), b, LONG).await.unwrap().is_none());
    assert!(store.renew_duty("plan:openai", b, LONG).await.unwrap().is_none());
    // Another duty is free.
    let c = LeaseToken::new();
    assert!(store.acquire_duty("plan:azure", &engine("c"), c, SHORT).await.unwrap().is_some());
    tokio::time::sleep(SHORT * 2).await;
    let d = LeaseToken::new();
    assert!(store.acquire_duty("plan:azure", &engine("d"), d, LONG).await.unwrap().is_some());
    // The lapsed holder's claims are refused and record nothing.
    let tranche = NewTranche { bytes: 0, created_at: 2, ..new_tranche(ProviderKind::Azure, "m") };
    assert_eq!(store.create_tranche(&tranche, &[1], ("plan:azure", c)).await.unwrap(), None);
    assert!(store.tranche(tranche.id).await.unwrap().is_none());
    // Handing a duty back frees it at once.
    store.release_duty("plan:azure", d).await.unwrap();
    let e = LeaseToken::new();
    assert!(store.acquire_duty("plan:azure", &engine("e"), e, LONG).await.unwrap().is_some());
}

pub async fn a_job_that_ended_stays_as_it_ended(store: &dyn Store) {
    let f = fixture(store).await;
    assert!(store.set_job_state(f.job, JobState::Done, None, 5).await.unwrap());
    let error = serde_json::json!({"code": "late"});
    let moved = store.set_job_state(f.job, JobState::Running, Some(&error), 6).await.unwrap();
    assert!(!moved);
    let job = store.job(f.job).await.unwrap().unwrap();
    assert_eq!((job.state, job.last_error), (JobState::Done, None));
}

/// Recounts a job's requests by state from its results and checks the store's counts agree.
async fn assert_counts_match_results(store: &dyn Store, job: JobId) {
    let rows: Vec<ResultRow> = store.job_results(job).try_collect().await.unwrap();
    let mut recount = RequestCounts::default();
    for row in &rows {
        recount.add(row.state, 1);
    }
    let counts = store.job_counts(job).await.unwrap();
    let by_state =
        |c: &RequestCounts| (c.accepted, c.pending, c.queued, c.succeeded, c.failed, c.cancelled);
    assert_eq!(by_state(&counts), by_state(&recount), "counts disagree with the requests");
}

/// A job's counts follow every change of its requests: claims, results of every kind, a
/// retry's second attempt, a cancel, an answer reused from an earlier job, a job detached from
/// a tranche and one whose budget is spent; tokens add up.
pub async fn counts_follow_every_change(store: &dyn Store) {
    let job = add_job(store, 6, "m").await;
    assert_eq!(store.job_counts(job).await.unwrap().pending, 6);
    assert_counts_match_results(store, job).await;
    let ids = pending_ids(store, "m").await;
    let tranche = new_tranche(ProviderKind::Openai, "m");
    assert_eq!(create_tranche(store, &tranche, &ids[..4]).await, Some(4));
    assert_counts_match_results(store, job).await;
    let held = lease(store, tranche.id).await;
    let mut writer = store.begin_ingest(tranche.id, held).await.unwrap();
    let mut ok = vec![success("k0:t:v1", "{}")];
    writer.record_successes(&mut ok, 2).await.unwrap();
    let update = |state, spends_attempt| ResultUpdate {
        state,
        outcome: AttemptOutcome::Errored,
        status_code: Some(500),
        output: None,
        error: Some("{}"),
        billed: None,
        spends_attempt,
        not_before: 0,
        at: 2,
    };
    assert!(writer.record("k1:t:v1", &update(RequestState::Pending, true)).await.unwrap());
    assert!(writer.record("k2:t:v1", &update(RequestState::Failed, true)).await.unwrap());
    assert!(writer.record("k3:t:v1", &update(RequestState::Cancelled, false)).await.unwrap());
    assert!(writer.commit(TrancheState::Cleaning, 2).await.unwrap());
    let counts = store.job_counts(job).await.unwrap();
    assert_eq!(
        (counts.pending, counts.queued, counts.succeeded, counts.failed, counts.cancelled),
        (3, 0, 1, 1, 1)
    );
    assert_eq!(
        store.job_tokens(job).await.unwrap(),
        TokenTotals { input_tokens: 2, output_tokens: 3 }
    );
    assert_counts_match_results(store, job).await;
    // The retried request's second attempt succeeds: one retried request.
    let second = NewTranche { id: TrancheId::new(), ..tranche.clone() };
    assert_eq!(create_tranche(store, &second, &[ids[1]]).await, Some(1));
    let held = lease(store, second.id).await;
    let mut writer = store.begin_ingest(second.id, held).await.unwrap();
    writer.record_successes(&mut vec![success("k1:t:v1", "{}")], 3).await.unwrap();
    assert!(writer.commit(TrancheState::Cleaning, 3).await.unwrap());
    let counts = store.job_counts(job).await.unwrap();
    assert_eq!((counts.succeeded, counts.retried), (2, 1));
    // Each result names the tranche its request was answered in, or none for one never sent.
    let results: Vec<ResultRow> = store.job_results(job).try_collect().await.unwrap();
    let tranches: Vec<Option<TrancheId>> = results.iter().map(|r| r.tranche_id).collect();
    assert_eq!(tranches[..2], [Some(tranche.id), Some(second.id)]);
    assert_eq!(tranches[4..], [None, None]);
    assert_eq!(store.job_tokens(job).await.unwrap().input_tokens, 4);
    // Cancelling ends the two still waiting.
    assert_eq!(store.cancel_job(job, 4).await.unwrap(), 2);
    let counts = store.job_counts(job).await.unwrap();
    assert_eq!((counts.pending, counts.cancelled, counts.open()), (0, 3, 0));
    assert_counts_match_results(store, job).await;
    // Another job reusing k0's answer counts it succeeded and cached.
    let other = add_job(store, 1, "m").await;
    let answers = store.earlier_answers(ProviderKind::Openai, 0, 10).await.unwrap();
    assert_eq!(store.answer_from(&answers, 5).await.unwrap(), 1);
    let counts = store.job_counts(other).await.unwrap();
    assert_eq!((counts.succeeded, counts.cached, counts.pending), (1, 1, 0));
    assert_counts_match_results(store, other).await;
    // A job detached from a tranche ends its requests queued there, and one whose budget is
    // spent ends those still waiting.
    let spent = add_job_as(store, 3, "d", new_job(), "01").await;
    let ids = pending_ids(store, "d").await;
    let shared = new_tranche(ProviderKind::Openai, "d");
    assert_eq!(create_tranche(store, &shared, &ids[..2]).await, Some(2));
    assert_eq!(store.detach_job(spent, shared.id, 6).await.unwrap(), 2);
    let counts = store.job_counts(spent).await.unwrap();
    assert_eq!((counts.pending, counts.queued, counts.cancelled), (1, 0, 2));
    assert_eq!(store.end_waiting(spent, "{}", 7).await.unwrap(), 1);
    let counts = store.job_counts(spent).await.unwrap();
    assert_eq!((counts.pending, counts.queued, counts.cancelled, counts.open()), (0, 0, 3, 0));
    assert_counts_match_results(store, spent).await;
}

/// Identical requests (custom id, input hash, answer check) of two jobs go out once: the later
/// waits while the earlier waits or is in flight, and goes out itself if that one fails. An
/// answer is reused only under the same check, and not while its job awaits review; a review
/// rejects the answers it names and ends the job.
pub async fn twins_wait_and_answers_are_reused_only_when_checked_and_approved(store: &dyn Store) {
    let first = add_job(store, 2, "m").await;
    let twin = add_job(store, 2, "m").await;
    let checked = NewJob {
        settings: JobSettings { answer_check: Some("c1".into()), ..new_job().settings },
        answer_check: Some(NewAnswerCheck {
            id: "c1".into(),
            schema: r#"{"type":"object"}"#.into(),
            lenient_json: false,
        }),
        ..new_job()
    };
    let other_check = add_job_as(store, 2, "m", checked, "00").await;
    let stored = store.answer_check("c1").await.unwrap().unwrap();
    assert_eq!((stored.schema.as_str(), stored.lenient_json), (r#"{"type":"object"}"#, false));
    let waiting = pending_ids(store, "m").await;
    assert_eq!(waiting.len(), 2, "the twins wait: {waiting:?}");
    let page = |check: Option<&'static str>| async move {
        store.pending_page(ProviderKind::Openai, pool("m", check), i64::MAX, 0, 10).await.unwrap()
    };
    assert_eq!(page(Some("c1")).await.len(), 2, "another check is another request");
    let groups = store.pending_groups(ProviderKind::Openai, i64::MAX).await.unwrap();
    let checks: Vec<_> = groups.iter().map(|g| g.answer_check.as_deref()).collect();
    assert_eq!(checks, [None, Some("c1")]);
    let (tranche, _) = claim_all(store, "m").await;
    assert!(pending_ids(store, "m").await.is_empty(), "still waiting while in flight");
    // k0 succeeds, k1 fails: k1's twin goes out itself, k0's takes the answer.
    let held = lease(store, tranche).await;
    let mut writer = store.begin_ingest(tranche, held).await.unwrap();
    writer.record_successes(&mut vec![success("k0:t:v1", "{}")], 2).await.unwrap();
    assert!(writer.record("k1:t:v1", &fatal(2)).await.unwrap());
    assert!(writer.commit(TrancheState::Cleaning, 2).await.unwrap());
    // Neither twin waits any more: k0's is answered before planning, k1's goes out.
    assert_eq!(pending_ids(store, "m").await.len(), 2);
    let answers = store.earlier_answers(ProviderKind::Openai, 0, 10).await.unwrap();
    assert_eq!(answers.len(), 1, "only the twin under the same check: {answers:?}");
    assert_eq!(store.answer_from(&answers, 3).await.unwrap(), 1);
    assert_eq!(store.job_counts(twin).await.unwrap().cached, 1);
    assert_eq!(store.job_counts(other_check).await.unwrap().pending, 2);
    assert_eq!(store.job_counts(first).await.unwrap().succeeded, 1);

    // A job awaiting review lends no answer until a person decides.
    let reviewed = NewJob {
        settings: JobSettings { review_sample: Some(1), ..new_job().settings },
        ..new_job()
    };
    let reviewed = add_job_as(store, 2, "x", reviewed, "07").await;
    let (tranche, _) = claim_all(store, "x").await;
    let held = lease(store, tranche).await;
    let mut writer = store.begin_ingest(tranche, held).await.unwrap();
    let mut both = vec![success("k0:t:v1", "{}"), success("k1:t:v1", "{}")];
    writer.record_successes(&mut both, 4).await.unwrap();
    assert!(writer.commit(TrancheState::Cleaning, 4).await.unwrap());
    let later = add_job_as(store, 2, "x", new_job(), "07").await;
    assert_eq!(pending_ids(store, "x").await.len(), 2, "nothing in flight to wait for");
    let reuse = store.earlier_answers(ProviderKind::Openai, 0, 10).await.unwrap();
    assert!(reuse.is_empty(), "unreviewed answers are not reused: {reuse:?}");
    let review = Review { verdict: ReviewVerdict::Rejected, by: "ana".into(), at: 5 };
    let named = ["k1:t:v1".to_owned()];
    let decided = store.decide_review(reviewed, &review, Rejected::Only(&named), "{}").await;
    assert_eq!(decided.unwrap(), None, "a job not awaiting review is left alone");
    assert!(store.set_job_state(reviewed, JobState::NeedsReview, None, 5).await.unwrap());
    let decided = store.decide_review(reviewed, &review, Rejected::Only(&named), "{}").await;
    assert_eq!(decided.unwrap(), Some(1));
    let record = store.job(reviewed).await.unwrap().unwrap();
    assert_eq!((record.state, record.review), (JobState::Done, Some(review)));
    let counts = store.job_counts(reviewed).await.unwrap();
    assert_eq!((counts.succeeded, counts.failed), (1, 1));
    let answers = store.earlier_answers(ProviderKind::Openai, 0, 10).await.unwrap();
    assert_eq!(answers.len(), 1, "the approved answer is reused, the rejected one is not");
    assert_eq!(store.answer_from(&answers, 6).await.unwrap(), 1);
    assert_eq!(store.job_counts(later).await.unwrap().cached, 1);

    // Rejected whole: every answer of the job fails, and no other job's.
    let whole = NewJob {
        settings: JobSettings { review_sample: Some(1), ..new_job().settings },
        ..new_job()
    };
    let whole = add_job_as(store, 2, "y", whole, "08").await;
    let (tranche, _) = claim_all(store, "y").await;
    let held = lease(store, tranche).await;
    let mut writer = store.begin_ingest(tranche, held).await.unwrap();
    let mut both = vec![success("k0:t:v1", "{}"), success("k1:t:v1", "{}")];
    writer.record_successes(&mut both, 7).await.unwrap();
    assert!(writer.commit(TrancheState::Cleaning, 7).await.unwrap());
    assert!(store.set_job_state(whole, JobState::NeedsReview, None, 7).await.unwrap());
    let review = Review { verdict: ReviewVerdict::Rejected, by: "ana".into(), at: 8 };
    let decided = store.decide_review(whole, &review, Rejected::All, "{}").await;
    assert_eq!(decided.unwrap(), Some(2));
    let counts = store.job_counts(whole).await.unwrap();
    assert_eq!((counts.succeeded, counts.failed), (0, 2));
    assert_eq!(store.job_counts(reviewed).await.unwrap().succeeded, 1, "another job's stay");
}

/// A re-parse's verdicts move ended requests (and only those); an ended job reopens for the
/// ones sent again; a new check replaces the job's on every request.
pub async fn verdicts_apply_to_ended_requests_and_reopen_the_job(store: &dyn Store) {
    let job = add_job(store, 3, "m").await;
    let (tranche, ids) = claim_all(store, "m").await;
    let held = lease(store, tranche).await;
    let mut writer = store.begin_ingest(tranche, held).await.unwrap();
    let mut lines = vec![success("k0:t:v1", "{\"a\":1}"), success("k1:t:v1", "{}")];
    writer.record_successes(&mut lines, 2).await.unwrap();
    assert!(writer.commit(TrancheState::Cleaning, 2).await.unwrap());
    let verdicts = [
        Verdict {
            request_id: ids[0],
            state: RequestState::Failed,
            error: Some(r#"{"code":"invalid_output"}"#.into()),
            output: Some(OutputRef::Text("{\"a\":1}".into())),
            not_before: 0,
        },
        Verdict {
            request_id: ids[1],
            state: RequestState::Pending,
            error: None,
            output: None,
            not_before: 9,
        },
        // Still in its tranche: left alone.
        Verdict {
            request_id: ids[2],
            state: RequestState::Failed,
            error: None,
            output: None,
            not_before: 0,
        },
    ];
    assert_eq!(store.apply_verdicts(job, &verdicts, 3).await.unwrap(), 2);
    let rows: Vec<ResultRow> = store.job_results(job).try_collect().await.unwrap();
    assert_eq!(rows[0].state, RequestState::Failed);
    assert_eq!(text(&rows[0]), Some("{\"a\":1}"), "a failed answer is kept");
    assert_eq!((rows[1].state, rows[1].output.as_ref()), (RequestState::Pending, None));
    assert_eq!(rows[2].state, RequestState::Queued);
    assert_counts_match_results(store, job).await;
    assert!(!store.reopen_job(job, 3).await.unwrap(), "an open job is not reopened");
    assert!(store.set_job_state(job, JobState::Done, None, 3).await.unwrap());
    assert!(store.reopen_job(job, 4).await.unwrap());
    assert_eq!(store.job(job).await.unwrap().unwrap().state, JobState::Running);
    let check = NewAnswerCheck { id: "c2".into(), schema: "{}".into(), lenient_json: true };
    let settings = JobSettings { answer_check: Some("c2".into()), ..JobSettings::default() };
    store.set_job_check(job, &settings, Some(&check), 5).await.unwrap();
    assert_eq!(store.job(job).await.unwrap().unwrap().settings, settings);
    assert_eq!(store.answer_check("c2").await.unwrap(), Some(check));
    let group = pool("m", Some("c2"));
    let page = store.pending_page(ProviderKind::Openai, group, i64::MAX, 0, 10).await.unwrap();
    assert_eq!(page.len(), 1, "the request sent again carries the new check");
    let body = store.request_body(job, "k2:t:v1").await.unwrap();
    assert_eq!(body, Some(InputBody::Text(r#"{"model":"m"}"#.into())));
    assert_eq!(store.request_body(job, "nope").await.unwrap(), None);
}

/// The first engine records a deployment fact; later ones read it back, whatever they propose.
pub async fn the_first_engine_records_a_deployment_fact(store: &dyn Store) {
    let first = store.deployment_fact("blob_store", "file:///a").await.unwrap();
    assert_eq!(first, "file:///a");
    let later = store.deployment_fact("blob_store", "s3://b/c").await.unwrap();
    assert_eq!(later, "file:///a");
    assert_eq!(store.deployment_fact("other", "x").await.unwrap(), "x");
}

/// A job whose bodies rest in a blob-store object gives its tranches' input lines as ranges of
/// that object, in request order (so that they are read in long runs); another job's lines in
/// the same tranche are ranges of its own object.
pub async fn bodies_by_reference_come_back_as_ranges_in_request_order(store: &dyn Store) {
    let job = NewJob { body_object: Some("bodies/job_x.jsonl".into()), ..new_job() };
    let id = job.id;
    let mut writer = store.begin_job(job).await.unwrap();
    let mut offset = 0;
    for i in 0..5u64 {
        // Wire ids in the opposite order to the requests': the lines still come in request order.
        let custom_id = format!("k{}:t:v1", 9 - i);
        let len = 20 + i;
        writer
            .add(&NewRequest {
                line: i + 1,
                custom_id: &custom_id,
                wire_id: &custom_id,
                endpoint: Endpoint::ChatCompletions,
                model: "m",
                body: RequestBody::InObject { offset, len },
                wire_bytes: 10,
                input_hash: hash_of("00"),
                max_attempts: 3,
                est_tokens: 1,
                max_cost: None,
                accepted_at: 100,
            })
            .await
            .unwrap();
        offset += len + 1;
    }
    writer.commit().await.unwrap();
    // A second job's requests in the same tranche: their bodies lie in their own job's object.
    let other = NewJob { body_object: Some("bodies/job_y.jsonl".into()), ..new_job() };
    let other_id = other.id;
    let mut writer = store.begin_job(other).await.unwrap();
    for i in 0..2u64 {
        let custom_id = format!("k{i}:t:v1");
        let request = NewRequest {
            body: RequestBody::InObject { offset: 7 * i, len: 6 },
            ..new_request(&custom_id, i + 1, "m", "01")
        };
        writer.add(&request).await.unwrap();
    }
    writer.commit().await.unwrap();
    let (tranche, _) = claim_all(store, "m").await;
    let lines: Vec<InputLine> = store.tranche_input(tranche).try_collect().await.unwrap();
    let ranges: Vec<(String, u64, u64)> = lines
        .iter()
        .map(|line| match &line.body {
            InputBody::InObject { object, offset, len } => (object.clone(), *offset, *len),
            InputBody::Text(text) => panic!("a body by reference came back as text: {text}"),
        })
        .collect();
    assert_eq!(ranges.len(), 7);
    assert!(ranges[..5].iter().all(|(object, _, _)| object == "bodies/job_x.jsonl"));
    let offsets: Vec<u64> = ranges[..5].iter().map(|(_, offset, _)| *offset).collect();
    assert_eq!(offsets, [0, 21, 43, 66, 90]);
    assert_eq!(
        ranges[5..],
        [("bodies/job_y.jsonl".to_owned(), 0, 6), ("bodies/job_y.jsonl".to_owned(), 7, 6)]
    );
    let jobs: Vec<JobId> = lines.iter().map(|line| line.job_id).collect();
    assert_eq!(jobs, [id, id, id, id, id, other_id, other_id], "each line names its own job");
    assert_eq!(lines[0].wire_id, "k9:t:v1");
    assert_eq!(store.job_counts(id).await.unwrap().queued, 5);
    assert_eq!(store.job_counts(other_id).await.unwrap().queued, 2);
}

/// A job of two requests (`a`, `b`, input hash `h1`) answered by reference at bytes 100 and
/// 300 (40 long) of its tranche's raw output, the tranche left `cleaning` under the answered
/// lease: the job, the tranche, the lease and the raw object's key.
async fn answered_by_reference(store: &dyn Store) -> (JobId, TrancheId, Held, String) {
    let job = add_hashed_job(store, &[("a", "h1"), ("b", "h1")]).await;
    let (tranche, _) = claim_all(store, "m").await;
    let held = lease(store, tranche).await;
    let mut writer = store.begin_ingest(tranche, held).await.unwrap();
    let object = format!("raw/{tranche}/output.jsonl");
    let by_ref = |wire_id: &str, offset: u64| Success {
        output: OutputRef::InObject { object: object.clone(), offset, len: 40 },
        ..success(wire_id, "")
    };
    let mut lines = vec![by_ref("a:t:v1", 100), by_ref("b:t:v1", 300)];
    assert_eq!(writer.record_successes(&mut lines, 5).await.unwrap(), 2);
    assert!(writer.commit(TrancheState::Cleaning, 5).await.unwrap());
    (job, tranche, Held { token: held.token, state: TrancheState::Cleaning }, object)
}

/// Outputs recorded by reference come back as the same ranges, and an answer reused from an
/// earlier request points at the earlier request's range.
pub async fn outputs_by_reference_are_kept_and_shared_by_reused_answers(store: &dyn Store) {
    let (first, _, _, object) = answered_by_reference(store).await;
    let rows: Vec<ResultRow> = store.job_results(first).try_collect().await.unwrap();
    let expected = |offset| Some(OutputRef::InObject { object: object.clone(), offset, len: 40 });
    assert_eq!((rows[0].output.clone(), rows[1].output.clone()), (expected(100), expected(300)));
    let second = add_hashed_job(store, &[("b", "h1")]).await;
    let answers = store.earlier_answers(ProviderKind::Openai, 0, 10).await.unwrap();
    assert_eq!(store.answer_from(&answers, 6).await.unwrap(), 1);
    let rows: Vec<ResultRow> = store.job_results(second).try_collect().await.unwrap();
    assert_eq!(rows[0].state, RequestState::Succeeded);
    assert_eq!(rows[0].output, expected(300));
}

/// Pruning: an ended job's rows go and its summary stays; a job that has not ended is left
/// whole; a tranche's raw results are in use while a job not pruned held it or reads answers
/// reused from it, unless that job is being pruned too.
pub async fn pruning_removes_rows_keeps_summaries_and_sees_who_still_reads_raw_files(
    store: &dyn Store,
) {
    let (first, tranche, cleaning, object) = answered_by_reference(store).await;
    // While the tranche runs, its raw files are in use whoever is pruned.
    assert!(store.tranche_in_use(tranche, &object, &[first]).await.unwrap());
    let done = TrancheUpdate::to(TrancheState::Done, 6);
    assert!(store.update_tranche(tranche, cleaning, done).await.unwrap());
    let second = add_hashed_job(store, &[("b", "h1")]).await;
    let answers = store.earlier_answers(ProviderKind::Openai, 0, 10).await.unwrap();
    assert_eq!(store.answer_from(&answers, 7).await.unwrap(), 1);
    let open = add_job(store, 2, "other").await;
    assert!(store.set_job_state(first, JobState::Done, None, 10).await.unwrap());
    assert!(store.set_job_state(second, JobState::Done, None, 20).await.unwrap());

    let listed = |jobs: Vec<(JobRecord, bool)>| -> Vec<(JobId, bool)> {
        jobs.into_iter().map(|(job, kept)| (job.id, kept)).collect()
    };
    assert_eq!(listed(store.prunable_jobs(15).await.unwrap()), [(first, true)]);
    assert_eq!(listed(store.prunable_jobs(25).await.unwrap()), [(first, true), (second, true)]);
    let unknown = TrancheId::new();
    assert!(store.tranche_in_use(unknown, "raw/x/output.jsonl", &[]).await.unwrap(), "not ours");
    assert!(store.tranche_in_use(tranche, &object, &[]).await.unwrap());
    assert!(store.tranche_in_use(tranche, &object, &[first]).await.unwrap(), "second reads it");
    assert!(store.tranche_in_use(tranche, &object, &[second]).await.unwrap(), "first held it");
    assert!(!store.tranche_in_use(tranche, &object, &[first, second]).await.unwrap());

    assert_eq!(store.prune_job_rows(first, 30).await.unwrap(), 2);
    assert_eq!(store.prune_job_rows(first, 31).await.unwrap(), 0, "once");
    let rows: Vec<ResultRow> = store.job_results(first).try_collect().await.unwrap();
    assert!(rows.is_empty());
    let job = store.job(first).await.unwrap().unwrap();
    assert_eq!((job.state, job.accepted), (JobState::Done, 2));
    let counts = store.job_counts(first).await.unwrap();
    assert_eq!((counts.accepted, counts.succeeded), (2, 2), "the summary stays");
    assert_eq!(store.job_tranche_counts(first).await.unwrap(), [(TrancheState::Done, 1)]);
    assert_eq!(
        listed(store.prunable_jobs(25).await.unwrap()),
        [(first, false), (second, true)],
        "rows gone, bytes not yet"
    );
    assert!(store.tranche_in_use(tranche, &object, &[]).await.unwrap(), "second still reads it");
    store.job_pruned(first, 32).await.unwrap();
    assert_eq!(listed(store.prunable_jobs(25).await.unwrap()), [(second, true)]);

    // A job that has not ended keeps everything.
    assert_eq!(store.prune_job_rows(open, 33).await.unwrap(), 0);
    let rows: Vec<ResultRow> = store.job_results(open).try_collect().await.unwrap();
    assert_eq!(rows.len(), 2);
    store.job_pruned(open, 33).await.unwrap();
    assert_eq!(store.prunable_jobs(i64::MAX).await.unwrap().len(), 1, "only second");

    assert_eq!(store.prune_job_rows(second, 34).await.unwrap(), 1);
    assert!(!store.tranche_in_use(tranche, &object, &[]).await.unwrap());
}

/// Objects are recorded whole: a job's body object with the job (and not when the job is
/// dropped), others when written; a rewrite replaces the record; removed objects are forgotten.
pub async fn blob_objects_are_recorded_with_size_and_hash(store: &dyn Store) {
    let record = |key: &str, size: u64| BlobRecord {
        key: key.to_owned(),
        size,
        sha256: format!("{size:064x}"),
        created_at: 7,
    };
    let mut dropped = store.begin_job(new_job()).await.unwrap();
    dropped.body_object(record("bodies/dropped.jsonl", 10));
    drop(dropped);
    assert_eq!(store.blob("bodies/dropped.jsonl").await.unwrap(), None);
    let mut writer = store.begin_job(new_job()).await.unwrap();
    writer.body_object(record("bodies/kept.jsonl", 11));
    writer.commit().await.unwrap();
    assert_eq!(
        store.blob("bodies/kept.jsonl").await.unwrap(),
        Some(record("bodies/kept.jsonl", 11))
    );
    store.record_blob(&record("raw/t/output.jsonl", 12)).await.unwrap();
    store.record_blob(&record("raw/t/output.jsonl", 13)).await.unwrap();
    assert_eq!(
        store.blob("raw/t/output.jsonl").await.unwrap(),
        Some(record("raw/t/output.jsonl", 13)),
        "written again, recorded again"
    );
    store.forget_blobs(&["raw/t/output.jsonl".to_owned(), "nothing".to_owned()]).await.unwrap();
    assert_eq!(store.blob("raw/t/output.jsonl").await.unwrap(), None);
    assert!(store.blob("bodies/kept.jsonl").await.unwrap().is_some());
}

/// Eight claims racing for the same requests: each request lands in exactly one tranche.
pub async fn racing_claims_never_overlap(store: &dyn Store) {
    let job = add_job(store, 200, "m").await;
    let ids = pending_ids(store, "m").await;
    let claims = (0..8).map(|i| {
        let tranche =
            NewTranche { bytes: 0, created_at: i, ..new_tranche(ProviderKind::Openai, "m") };
        let ids = &ids;
        async move { (create_tranche(store, &tranche, ids).await, tranche.id) }
    });
    let results = futures::future::join_all(claims).await;
    let claimed: u64 = results.iter().map(|(n, _)| n.unwrap()).sum();
    assert_eq!(claimed, 200, "every request claimed once: {results:?}");
    let mut in_tranches = 0;
    for (n, id) in &results {
        let kept = store.tranche(*id).await.unwrap();
        assert_eq!(kept.as_ref().map(|t| t.request_count), (*n != Some(0)).then_some(n.unwrap()));
        in_tranches += kept.map_or(0, |t| t.request_count);
    }
    assert_eq!(in_tranches, 200);
    assert_eq!(store.job_counts(job).await.unwrap().queued, 200);
}

/// A claim counts and links its requests' jobs whether its ids lie close together or far
/// apart (requests sent again sit among others), and claims nothing twice.
pub async fn claims_count_their_jobs_whether_ids_are_close_or_far_apart(store: &dyn Store) {
    let first = add_job(store, 40, "m").await;
    // The same custom ids with other input: not twins, so none waits for the other's.
    let second = add_job_as(store, 40, "m", new_job(), "01").await;
    let ids = pending_ids(store, "m").await;
    assert_eq!(ids.len(), 80);
    // Far apart: the first and last of each job, spanning all 80.
    let far = [ids[0], ids[39], ids[40], ids[79]];
    let tranche = NewTranche { created_at: 1, ..new_tranche(ProviderKind::Openai, "m") };
    assert_eq!(create_tranche(store, &tranche, &far).await, Some(4));
    // Close together: ten of the first job, one of them claimed already.
    let close: Vec<i64> = ids[..10].to_vec();
    let again = NewTranche { created_at: 2, ..new_tranche(ProviderKind::Openai, "m") };
    assert_eq!(create_tranche(store, &again, &close).await, Some(9));
    let (a, b) = (store.job_counts(first).await.unwrap(), store.job_counts(second).await.unwrap());
    assert_eq!((a.queued, a.pending, b.queued, b.pending), (11, 29, 2, 38));
    let planned = |job| async move { store.job_tranche_counts(job).await.unwrap() };
    assert_eq!(planned(first).await, [(TrancheState::Planned, 2)]);
    assert_eq!(planned(second).await, [(TrancheState::Planned, 1)]);
}

/// Successes of a tranche whose requests lie far apart among others (requests sent again are
/// claimed so) end only those requests: each with the output of its first line, whether that
/// was kept as text or by reference, billed once; a failure recorded after them still finds
/// its request, and the requests between, in no tranche, stay as they were.
pub async fn successes_in_a_tranche_spread_thin_end_only_its_requests(store: &dyn Store) {
    let job = add_job(store, 60, "m").await;
    let ids = pending_ids(store, "m").await;
    // Every tenth request: four over an id range fifteen times their number.
    let spread: Vec<i64> = ids.iter().copied().step_by(10).take(5).collect();
    let tranche = NewTranche { created_at: 1, ..new_tranche(ProviderKind::Openai, "m") };
    assert_eq!(create_tranche(store, &tranche, &spread).await, Some(5));
    let held = lease(store, tranche.id).await;
    let mut writer = store.begin_ingest(tranche.id, held).await.unwrap();
    let by_reference = |wire_id: &str, offset| Success {
        output: OutputRef::InObject { object: "raw/t/output.jsonl".into(), offset, len: 7 },
        ..success(wire_id, "")
    };
    let mut lines = vec![
        success("k0:t:v1", r#"{"n":0}"#),
        by_reference("k0:t:v1", 1),
        by_reference("k10:t:v1", 20),
        success("k10:t:v1", r#"{"n":10}"#),
        success("k20:t:v1", r#"{"n":20}"#),
        // Between the tranche's requests, but in none.
        success("k15:t:v1", r#"{"n":15}"#),
    ];
    assert_eq!(writer.record_successes(&mut lines, 7).await.unwrap(), 3);
    assert!(writer.record("k30:t:v1", &fatal(7)).await.unwrap());
    assert!(!writer.record("k20:t:v1", &fatal(7)).await.unwrap(), "answered already");
    let unanswered = writer.unanswered().await.unwrap();
    assert_eq!(unanswered.iter().map(|(w, _)| w.as_str()).collect::<Vec<_>>(), ["k40:t:v1"]);
    assert!(writer.commit(TrancheState::Cleaning, 7).await.unwrap());

    let counts = store.job_counts(job).await.unwrap();
    assert_eq!((counts.succeeded, counts.failed, counts.queued, counts.pending), (3, 1, 1, 55));
    assert_eq!(
        store.job_tokens(job).await.unwrap(),
        TokenTotals { input_tokens: 6, output_tokens: 9 }
    );
    let billed: u64 = store.job_usage(job).await.unwrap().iter().map(|u| u.requests).sum();
    assert_eq!(billed, 3, "each answer billed once");
    let rows: Vec<ResultRow> = store.job_results(job).try_collect().await.unwrap();
    assert_eq!(text(&rows[0]), Some(r#"{"n":0}"#), "the first line for an id wins");
    assert_eq!(
        rows[10].output,
        Some(OutputRef::InObject { object: "raw/t/output.jsonl".into(), offset: 20, len: 7 })
    );
    assert_eq!(text(&rows[20]), Some(r#"{"n":20}"#));
    assert_eq!((rows[20].state, rows[30].state), (RequestState::Succeeded, RequestState::Failed));
    assert_eq!((rows[15].state, rows[15].output.clone()), (RequestState::Pending, None));
    assert_eq!(rows[40].state, RequestState::Queued);
}

/// A tranche's results ingested a second time (a restarted engine reading the same raw file)
/// change nothing: every request already has its result.
pub async fn ingest_repeated_changes_nothing(store: &dyn Store) {
    let job = add_job(store, 20, "m").await;
    let (tranche, _) = claim_all(store, "m").await;
    let lines = || -> Vec<Success> {
        (0..20).map(|i| success(&format!("k{i}:t:v1"), &format!(r#"{{"n": {i}}}"#))).collect()
    };
    let held = lease(store, tranche).await;
    let mut writer = store.begin_ingest(tranche, held).await.unwrap();
    assert_eq!(writer.record_successes(&mut lines(), 5).await.unwrap(), 20);
    assert!(writer.commit(TrancheState::Ingesting, 5).await.unwrap());
    let again = Held { token: held.token, state: TrancheState::Ingesting };
    let mut writer = store.begin_ingest(tranche, again).await.unwrap();
    assert_eq!(writer.record_successes(&mut lines(), 6).await.unwrap(), 0);
    assert!(writer.unanswered().await.unwrap().is_empty());
    assert!(writer.commit(TrancheState::Cleaning, 6).await.unwrap());
    let counts = store.job_counts(job).await.unwrap();
    assert_eq!((counts.succeeded, counts.retried), (20, 0), "no attempt counted twice");
    let rows: Vec<ResultRow> = store.job_results(job).try_collect().await.unwrap();
    assert_eq!(text(&rows[3]), Some(r#"{"n": 3}"#));
}

/// The usage ledger counts each attempt once: successes in bulk and one by one (an answer
/// that failed its check was billed too), never a request that was not waiting, never what a
/// rolled-back ingest recorded, never again when a tranche is ingested again; by model, as the
/// results name them; by day; for one tenant; and what a reused answer saved its new job.
pub async fn usage_is_counted_once_per_attempt(store: &dyn Store) {
    const DAY: i64 = 86_400;
    let at = 3 * DAY + 10;
    let job = add_job(store, 4, "m").await;
    let (tranche, _) = claim_all(store, "m").await;
    let held = lease(store, tranche).await;
    // A crash mid-ingest: the writer is dropped without committing.
    let mut writer = store.begin_ingest(tranche, held).await.unwrap();
    let mut lines =
        vec![Success { billed: Some(billed("m", 100, 10)), ..success("k0:t:v1", "{}") }];
    assert_eq!(writer.record_successes(&mut lines, at).await.unwrap(), 1);
    drop(writer);
    assert!(store.job_usage(job).await.unwrap().is_empty(), "a rolled-back ingest counts nothing");

    let mut writer = store.begin_ingest(tranche, held).await.unwrap();
    let mut lines = vec![
        Success { billed: Some(billed("m-2024-07-18", 100, 10)), ..success("k0:t:v1", "{}") },
        Success { billed: Some(billed("m", 200, 20)), ..success("k1:t:v1", "{}") },
        // A second line for a request already answered, and one for no request: not counted.
        Success { billed: Some(billed("m", 999, 99)), ..success("k1:t:v1", "{}") },
        Success { billed: Some(billed("m", 999, 99)), ..success("nope", "{}") },
    ];
    assert_eq!(writer.record_successes(&mut lines, at).await.unwrap(), 2);
    // An answer that failed its check goes out again: billed all the same.
    let invalid = billed("m", 50, 5);
    let retry = ResultUpdate {
        state: RequestState::Pending,
        outcome: AttemptOutcome::Errored,
        status_code: Some(200),
        output: None,
        error: Some("{}"),
        billed: Some(&invalid),
        spends_attempt: true,
        not_before: 0,
        at,
    };
    assert!(writer.record("k2:t:v1", &retry).await.unwrap());
    assert!(!writer.record("k2:t:v1", &retry).await.unwrap(), "answered already");
    assert!(writer.record("k3:t:v1", &fatal(at)).await.unwrap());
    assert!(writer.commit(TrancheState::Ingesting, at).await.unwrap());
    // Ingesting the tranche again finds nothing waiting.
    let again = Held { token: held.token, state: TrancheState::Ingesting };
    let mut writer = store.begin_ingest(tranche, again).await.unwrap();
    let mut lines =
        vec![Success { billed: Some(billed("m", 100, 10)), ..success("k0:t:v1", "{}") }];
    assert_eq!(writer.record_successes(&mut lines, at + DAY).await.unwrap(), 0);
    assert!(!writer.record("k2:t:v1", &retry).await.unwrap());
    assert!(writer.commit(TrancheState::Cleaning, at + DAY).await.unwrap());

    let row = |model: &str, requests, input, output| UsageRow {
        kind: UsageKind::Billed,
        provider: ProviderKind::Openai,
        model: model.to_owned(),
        requests,
        tokens: billed(model, input, output).tokens,
    };
    let mut m = row("m", 2, 250, 25);
    m.tokens.cached_input = 40 + 10;
    let expected = vec![m, row("m-2024-07-18", 1, 100, 10)];
    assert_eq!(store.job_usage(job).await.unwrap(), expected);
    // By day: the day of `at` onwards holds it all, the next day nothing.
    assert_eq!(store.usage_since(3 * DAY, None).await.unwrap(), expected);
    assert_eq!(store.usage_since(at, None).await.unwrap(), expected, "the whole day counts");
    assert!(store.usage_since(4 * DAY, None).await.unwrap().is_empty());
    assert!(store.usage_since(0, Some("acme")).await.unwrap().is_empty(), "no job of acme's");

    // A later job whose first request is answered from k0's result: what that answer cost,
    // saved; nothing billed to it.
    let later = add_job(store, 1, "m").await;
    let answers = store.earlier_answers(ProviderKind::Openai, 0, 10).await.unwrap();
    assert_eq!(store.answer_from(&answers, at).await.unwrap(), 1);
    let reused = store.job_usage(later).await.unwrap();
    let saved = UsageRow { kind: UsageKind::Reused, ..row("m-2024-07-18", 1, 100, 10) };
    assert_eq!(reused, vec![saved]);
    assert_eq!(store.job_usage(job).await.unwrap(), expected, "the first job's stays");
    // Pruning the first job keeps its ledger.
    assert_eq!(store.cancel_job(job, at).await.unwrap(), 1);
    assert!(store.set_job_state(job, JobState::Cancelled, None, at).await.unwrap());
    assert!(store.prune_job_rows(job, at + 2 * DAY).await.unwrap() > 0);
    assert_eq!(store.job_usage(job).await.unwrap(), expected, "kept when pruned");
}

/// An idempotency key is claimed by one submission at a time: a second claim sees it under
/// way, then completed with its job and hash; a released claim is free again; a stale claim
/// never completed is taken over; keys are per tenant.
pub async fn idempotency_keys_are_claimed_once_then_completed_or_released(store: &dyn Store) {
    let job = add_job(store, 1, "m").await;
    assert_eq!(store.claim_key("acme", "k1", 100, 0).await.unwrap(), KeyClaim::Claimed);
    let under_way = KeyClaim::Held { job: None, body_sha256: None };
    assert_eq!(store.claim_key("acme", "k1", 101, 0).await.unwrap(), under_way);
    assert_eq!(store.claim_key("other", "k1", 101, 0).await.unwrap(), KeyClaim::Claimed);
    store.complete_key("acme", "k1", "abc", job).await.unwrap();
    let done = KeyClaim::Held { job: Some(job), body_sha256: Some("abc".into()) };
    assert_eq!(store.claim_key("acme", "k1", 102, 0).await.unwrap(), done);
    assert_eq!(
        store.claim_key("acme", "k1", 10_000, 9_000).await.unwrap(),
        done,
        "a completed key is never taken over"
    );
    store.release_key("acme", "k1").await.unwrap();
    assert_eq!(store.claim_key("acme", "k1", 103, 0).await.unwrap(), done, "nor released");
    // A released claim is free; a stale one is taken over, a fresh one is not.
    store.release_key("other", "k1").await.unwrap();
    assert_eq!(store.claim_key("other", "k1", 200, 0).await.unwrap(), KeyClaim::Claimed);
    assert_eq!(store.claim_key("other", "k1", 250, 150).await.unwrap(), under_way);
    assert_eq!(store.claim_key("other", "k1", 5_000, 4_000).await.unwrap(), KeyClaim::Claimed);
}

/// Metrics: jobs, requests and tranches by state (requests summed from the job counters),
/// billed tokens by provider and model over every job and day (reused answers are not
/// billed), and the upstream errors jobs and tranches carry now by provider and code: a
/// paused job by its pause, else its last error; a code missing falls back to the error type;
/// an error naming no provider is not upstream's; a tranche's error goes with its next
/// transition, a job's pause when it resumes.
pub async fn metrics_are_aggregates_of_jobs_tranches_and_the_ledger(store: &dyn Store) {
    const DAY: i64 = 86_400;
    assert_eq!(store.metrics_snapshot().await.unwrap(), MetricsSnapshot::default());
    let json = |text: &str| -> serde_json::Value { serde_json::from_str(text).unwrap() };

    // A: four requests; two answered on two days, one failed, one still queued.
    let a = add_job(store, 4, "m").await;
    let (t1, _) = claim_all(store, "m").await;
    let held = lease(store, t1).await;
    let mut writer = store.begin_ingest(t1, held).await.unwrap();
    let mut lines =
        vec![Success { billed: Some(billed("m", 100, 10)), ..success("k0:t:v1", "{}") }];
    assert_eq!(writer.record_successes(&mut lines, 3 * DAY).await.unwrap(), 1);
    let answer = OutputRef::Text("{}".into());
    let tokens = billed("m", 200, 20);
    let ok = ResultUpdate {
        state: RequestState::Succeeded,
        outcome: AttemptOutcome::Succeeded,
        status_code: Some(200),
        output: Some(&answer),
        error: None,
        billed: Some(&tokens),
        spends_attempt: true,
        not_before: 0,
        at: 5 * DAY,
    };
    assert!(writer.record("k1:t:v1", &ok).await.unwrap());
    assert!(writer.record("k2:t:v1", &fatal(5 * DAY)).await.unwrap());
    assert!(writer.commit(TrancheState::Cleaning, 5 * DAY).await.unwrap());
    // B: two requests of another model (another body: not waiting for A's), in a tranche.
    let b = add_job_as(store, 2, "n", new_job(), "01").await;
    let (t2, _) = claim_all(store, "n").await;
    // C: answered from A's first answer (reused, not billed).
    let c = add_job(store, 1, "m").await;
    let answers = store.earlier_answers(ProviderKind::Openai, 0, 10).await.unwrap();
    assert_eq!(store.answer_from(&answers, 6 * DAY).await.unwrap(), 1);
    // E: cancelled before it ran, with an error of tranche's own (no provider).
    let e = add_job_as(store, 1, "m", new_job(), "02").await;
    assert_eq!(store.cancel_job(e, 6 * DAY).await.unwrap(), 1);

    let old = json(r#"{"provider":"openai","status":401,"code":"invalid_api_key","message":"no"}"#);
    let storage = json(
        r#"{"provider":"openai","status":400,"code":null,"error_type":"invalid_request_error",
            "message":"You have exceeded your file storage quota"}"#,
    );
    let typed = json(r#"{"provider":"openai","status":500,"type":"server_error","message":"x"}"#);
    let server = json(r#"{"provider":"openai","status":500,"error_type":"server_error"}"#);
    let own = json(r#"{"code":"budget_exceeded","message":"the budget is spent"}"#);
    let unavailable = json(r#"{"provider":"openai","status":503,"message":"unavailable"}"#);
    let limited = json(r#"{"provider":"openai","status":429,"code":"rate_limit_exceeded"}"#);
    assert!(store.set_job_state(a, JobState::Running, Some(&old), 7 * DAY).await.unwrap());
    assert_eq!(store.set_jobs_paused(t1, Some(&storage), 7 * DAY).await.unwrap(), 1);
    assert!(store.set_job_state(b, JobState::Running, Some(&typed), 7 * DAY).await.unwrap());
    assert!(store.set_job_state(c, JobState::Failed, Some(&server), 7 * DAY).await.unwrap());
    assert!(store.set_job_state(e, JobState::Cancelled, Some(&own), 7 * DAY).await.unwrap());
    assert!(store.defer_tranche(t1, held.token, &unavailable, 8 * DAY, 7 * DAY).await.unwrap());
    let held_t2 = lease(store, t2).await;
    assert!(store.defer_tranche(t2, held_t2.token, &limited, 8 * DAY, 7 * DAY).await.unwrap());

    let errors = |list: &[(ErrorCarrier, &str, u64)]| -> Vec<UpstreamErrorCount> {
        list.iter()
            .map(|(carrier, code, count)| UpstreamErrorCount {
                carrier: *carrier,
                provider: "openai".to_owned(),
                code: (*code).to_owned(),
                count: *count,
            })
            .collect()
    };
    let billed_m = UsageRow {
        kind: UsageKind::Billed,
        provider: ProviderKind::Openai,
        model: "m".to_owned(),
        requests: 2,
        tokens: TokenUsage { input: 300, cached_input: 60, output: 30, ..TokenUsage::default() },
    };
    let expected = MetricsSnapshot {
        jobs: vec![(JobState::Cancelled, 1), (JobState::Failed, 1), (JobState::Running, 2)],
        requests: RequestCounts {
            accepted: 8,
            pending: 0,
            queued: 3,
            succeeded: 3,
            failed: 1,
            cancelled: 1,
            cached: 1,
            retried: 0,
        },
        tranches: vec![(TrancheState::Cleaning, 1), (TrancheState::Planned, 1)],
        billed: vec![billed_m.clone()],
        upstream_errors: errors(&[
            (ErrorCarrier::Job, "invalid_request_error", 1),
            (ErrorCarrier::Job, "server_error", 2),
            (ErrorCarrier::Tranche, "none", 1),
            (ErrorCarrier::Tranche, "rate_limit_exceeded", 1),
        ]),
    };
    assert_eq!(store.metrics_snapshot().await.unwrap(), expected);

    // A resumes (its last error shows again); T2 moves on (its error is gone).
    assert_eq!(store.set_jobs_paused(t1, None, 8 * DAY).await.unwrap(), 1);
    let moved = TrancheUpdate::to(TrancheState::Uploading, 8 * DAY);
    assert!(store.update_tranche(t2, held_t2, moved).await.unwrap());
    let snapshot = store.metrics_snapshot().await.unwrap();
    assert_eq!(snapshot.tranches, [(TrancheState::Cleaning, 1), (TrancheState::Uploading, 1)]);
    assert_eq!(
        snapshot.upstream_errors,
        errors(&[
            (ErrorCarrier::Job, "invalid_api_key", 1),
            (ErrorCarrier::Job, "server_error", 2),
            (ErrorCarrier::Tranche, "none", 1),
        ])
    );
    assert_eq!(snapshot.billed, [billed_m], "the ledger only grows");
}

/// A job of `(key, input hash)` pairs, all of model `m`.
async fn add_hashed_job(store: &dyn Store, requests: &[(&str, &str)]) -> JobId {
    let job = new_job();
    let id = job.id;
    let mut writer = store.begin_job(job).await.unwrap();
    for (i, (key, hash)) in requests.iter().enumerate() {
        let custom_id = format!("{key}:t:v1");
        writer
            .add(&NewRequest {
                line: i as u64 + 1,
                custom_id: &custom_id,
                wire_id: &custom_id,
                endpoint: Endpoint::ChatCompletions,
                model: "m",
                body: RequestBody::Stored("{}"),
                wire_bytes: 10,
                input_hash: hash_of(hash),
                max_attempts: 3,
                est_tokens: 1,
                max_cost: None,
                accepted_at: 100,
            })
            .await
            .unwrap();
    }
    writer.commit().await.unwrap();
    id
}

/// Dedup look-ups: a waiting request is matched to an earlier success with the same custom id
/// and input hash (never a changed body, never an answer that was itself reused), and answering
/// it copies that output at no cost.
pub async fn earlier_answers_match_custom_id_and_input_hash(store: &dyn Store) {
    let first = add_hashed_job(store, &[("a", "h1"), ("b", "h1"), ("c", "h1")]).await;
    let (tranche, _) = claim_all(store, "m").await;
    let held = lease(store, tranche).await;
    let mut writer = store.begin_ingest(tranche, held).await.unwrap();
    let mut lines =
        vec![success("a:t:v1", r#"{"answer":"a"}"#), success("b:t:v1", r#"{"answer":"b"}"#)];
    writer.record_successes(&mut lines, 5).await.unwrap();
    assert!(writer.record("c:t:v1", &fatal(5)).await.unwrap());
    assert!(writer.commit(TrancheState::Cleaning, 5).await.unwrap());
    // Same id and hash: answered. Changed body: a new version. Failed before: runs. New: runs.
    let second = add_hashed_job(store, &[("a", "h1"), ("b", "h2"), ("c", "h1"), ("d", "h1")]).await;
    let answers = store.earlier_answers(ProviderKind::Openai, 0, 100).await.unwrap();
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert!(store.earlier_answers(ProviderKind::Azure, 0, 100).await.unwrap().is_empty());
    assert_eq!(store.answer_from(&answers, 9).await.unwrap(), 1);
    assert_eq!(store.answer_from(&answers, 9).await.unwrap(), 0, "answered already");
    let counts = store.job_counts(second).await.unwrap();
    assert_eq!((counts.succeeded, counts.cached, counts.pending), (1, 1, 3));
    let rows: Vec<ResultRow> = store.job_results(second).try_collect().await.unwrap();
    assert_eq!(text(&rows[0]), Some(r#"{"answer":"a"}"#));
    // A third copy is answered by the original, not by the reused answer.
    let _third = add_hashed_job(store, &[("a", "h1")]).await;
    let answers = store.earlier_answers(ProviderKind::Openai, 0, 100).await.unwrap();
    assert_eq!(answers.len(), 1);
    let original = store.job_results(first).try_collect::<Vec<_>>().await.unwrap();
    assert_eq!(original[0].custom_id, "a:t:v1");
    let again = store.earlier_answers(ProviderKind::Openai, answers[0].request_id, 100).await;
    assert!(again.unwrap().is_empty(), "pages by request id");
}

/// Tenants: added with the hash of their token, found by it, refused while a tenant of the
/// name is unrevoked; revoked (then found no more, and the name free again); listed by name
/// with revoked ones; a token hash is never reused.
pub async fn tenants_are_found_by_token_refused_twice_and_revoked(store: &dyn Store) {
    let record = |name: &str, admin, created_at, revoked_at| TenantRecord {
        name: name.to_owned(),
        admin,
        created_at,
        revoked_at,
    };
    assert!(store.tenants().await.unwrap().is_empty());
    assert!(store.add_tenant("acme", "h1", false, 10).await.unwrap());
    assert!(store.add_tenant("root", "h2", true, 11).await.unwrap());
    assert!(!store.add_tenant("acme", "h3", true, 12).await.unwrap(), "acme is taken");
    assert_eq!(store.tenant_by_token("h1").await.unwrap(), Some(record("acme", false, 10, None)));
    assert_eq!(store.tenant_by_token("h2").await.unwrap(), Some(record("root", true, 11, None)));
    assert_eq!(store.tenant_by_token("h3").await.unwrap(), None, "the refused one was not kept");
    assert_eq!(store.tenant_by_token("nope").await.unwrap(), None);
    assert!(store.add_tenant("other", "h2", false, 13).await.is_err(), "token hashes are unique");

    assert!(store.revoke_tenant("acme", 20).await.unwrap());
    assert!(!store.revoke_tenant("acme", 21).await.unwrap(), "revoked already");
    assert!(!store.revoke_tenant("ghost", 21).await.unwrap());
    assert_eq!(store.tenant_by_token("h1").await.unwrap(), None, "a revoked token is refused");
    assert!(store.add_tenant("acme", "h4", false, 30).await.unwrap(), "the name is free again");
    assert_eq!(store.tenant_by_token("h4").await.unwrap(), Some(record("acme", false, 30, None)));
    assert_eq!(store.tenant_by_token("h1").await.unwrap(), None, "the old token stays revoked");
    assert_eq!(
        store.tenants().await.unwrap(),
        vec![
            record("acme", false, 10, Some(20)),
            record("acme", false, 30, None),
            record("root", true, 11, None),
        ]
    );
}

/// Jobs listed newest first by (created_at, id), a page after the cursor at a time: a
/// tenant's (never another's), every job, in one state; an unknown cursor lists nothing.
pub async fn jobs_are_listed_newest_first_in_keyset_pages(store: &dyn Store) {
    // Several jobs of one second each, so that the id breaks ties across pages.
    let mut made: Vec<(Option<&str>, i64, JobId)> = Vec::new();
    for (tenant, created_at) in [
        (Some("acme"), 10),
        (Some("acme"), 20),
        (Some("other"), 20),
        (None, 20),
        (Some("acme"), 20),
        (Some("acme"), 30),
        (Some("other"), 15),
        (None, 5),
        (Some("acme"), 20),
        (Some("other"), 25),
    ] {
        let mut job = new_job();
        job.settings.tenant = tenant.map(str::to_owned);
        job.created_at = created_at;
        made.push((tenant, created_at, add_job_as(store, 1, "m", job, "00").await));
    }
    let (acme_done, other_done) = (made[4].2, made[2].2);
    for id in [acme_done, other_done] {
        assert!(store.set_job_state(id, JobState::Done, None, 40).await.unwrap());
    }
    let expected = |tenant: Option<&str>, state: Option<JobState>| {
        let mut jobs: Vec<(i64, String)> = made
            .iter()
            .filter(|(t, _, _)| tenant.is_none() || *t == tenant)
            .filter(|(_, _, id)| match state {
                Some(JobState::Done) => [acme_done, other_done].contains(id),
                Some(_) => ![acme_done, other_done].contains(id),
                None => true,
            })
            .map(|(_, at, id)| (*at, id.to_string()))
            .collect();
        jobs.sort_by(|a, b| b.cmp(a));
        jobs.into_iter().map(|(_, id)| id).collect::<Vec<_>>()
    };
    let pages = |tenant, state, limit| async move {
        let mut listed = Vec::new();
        let mut sizes = Vec::new();
        let mut before = None;
        loop {
            let filter = JobFilter { tenant, state, before, limit };
            let page = store.list_jobs(filter).await.unwrap();
            sizes.push(page.len());
            let Some(last) = page.last() else { return (listed, sizes) };
            before = Some(last.id);
            for job in page {
                if tenant.is_some() {
                    assert_eq!(job.settings.tenant.as_deref(), tenant, "only the tenant's jobs");
                }
                listed.push(job.id.to_string());
            }
        }
    };

    let (acme, sizes) = pages(Some("acme"), None, 2).await;
    assert_eq!(acme, expected(Some("acme"), None));
    assert_eq!(sizes, [2, 2, 1, 0]);
    let (all, sizes) = pages(None, None, 3).await;
    assert_eq!(all, expected(None, None));
    assert_eq!(sizes, [3, 3, 3, 1, 0]);
    let (other, _) = pages(Some("other"), None, 10).await;
    assert_eq!(other, expected(Some("other"), None));
    assert!(other.iter().all(|id| !acme.contains(id)), "never another tenant's jobs");

    // A state: pending ones in pages, the done ones alone.
    let (pending, sizes) = pages(Some("acme"), Some(JobState::Pending), 2).await;
    assert_eq!(pending, expected(Some("acme"), Some(JobState::Pending)));
    assert_eq!(sizes, [2, 2, 0]);
    let (done, _) = pages(Some("acme"), Some(JobState::Done), 2).await;
    assert_eq!(done, vec![acme_done.to_string()]);
    let (done, _) = pages(None, Some(JobState::Done), 1).await;
    assert_eq!(done, expected(None, Some(JobState::Done)));
    assert_eq!(done.len(), 2);

    // No such tenant, no such cursor, no room.
    assert!(pages(Some("nobody"), None, 5).await.0.is_empty());
    let unknown = JobFilter { tenant: None, state: None, before: Some(JobId::new()), limit: 5 };
    assert!(store.list_jobs(unknown).await.unwrap().is_empty());
    let none = JobFilter { tenant: Some("acme"), state: None, before: None, limit: 0 };
    assert!(store.list_jobs(none).await.unwrap().is_empty());
    // A page of one tenant's jobs after another tenant's job: positioned by it, still acme's.
    let after_other =
        JobFilter { tenant: Some("acme"), state: None, before: Some(made[9].2), limit: 10 };
    let listed: Vec<String> =
        store.list_jobs(after_other).await.unwrap().iter().map(|j| j.id.to_string()).collect();
    assert_eq!(listed, expected(Some("acme"), None)[1..]);
}

/// Runs the whole suite against a backend: `factory` is an `async fn() -> Fresh`.
#[macro_export]
macro_rules! store_conformance {
    ($factory:path) => {
        $crate::store_conformance!(@checks $factory;
            outputs_by_reference_are_kept_and_shared_by_reused_answers,
            bodies_by_reference_come_back_as_ranges_in_request_order,
            the_first_engine_records_a_deployment_fact,
            counts_follow_every_change,
            metrics_are_aggregates_of_jobs_tranches_and_the_ledger,
            many_requests_are_written_in_order_across_statements,
            successes_are_recorded_in_bulk_once_each,
            successes_in_a_tranche_spread_thin_end_only_its_requests,
            inputs_and_results_larger_than_a_page_come_back_whole_in_order,
            a_tranches_input_is_its_requests_in_order_however_spread,
            a_tranches_input_bytes_are_what_its_queued_requests_measured,
            a_dropped_job_writer_stores_nothing,
            a_committed_job_is_pending_with_its_counts,
            requests_are_claimed_into_one_tranche_only,
            a_claim_takes_exactly_the_ids_it_names,
            results_are_recorded_once_and_the_rest_in_bulk,
            open_requests_and_queued_cost_follow_a_jobs_requests,
            provider_files_are_tracked_until_deleted,
            a_held_tranche_lease_excludes_other_engines_until_handed_back,
            a_lapsed_lease_passes_to_another_engine_and_its_holder_can_no_longer_act,
            a_transition_expecting_another_state_changes_nothing,
            a_tranche_not_due_or_finished_cannot_be_leased,
            one_engine_at_a_time_plans_and_a_lapsed_planner_claims_nothing,
            a_job_that_ended_stays_as_it_ended,
            racing_claims_never_overlap,
            claims_count_their_jobs_whether_ids_are_close_or_far_apart,
            ingest_repeated_changes_nothing,
            earlier_answers_match_custom_id_and_input_hash,
            pruning_removes_rows_keeps_summaries_and_sees_who_still_reads_raw_files,
            blob_objects_are_recorded_with_size_and_hash,
            twins_wait_and_answers_are_reused_only_when_checked_and_approved,
            verdicts_apply_to_ended_requests_and_reopen_the_job,
            usage_is_counted_once_per_attempt,
            idempotency_keys_are_claimed_once_then_completed_or_released,
            tenants_are_found_by_token_refused_twice_and_revoked,
            jobs_are_listed_newest_first_in_keyset_pages,
            waiting_requests_are_grouped_by_tenant_and_tranches_hold_one,
        );
    };
    (@checks $factory:path; $($check:ident,)+) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let fresh = $factory().await;
                $crate::conformance::$check(&*fresh.store).await;
                drop(fresh);
            }
        )+
    };
}
