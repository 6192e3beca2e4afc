//! Copying a SQLite store into PostgreSQL: every store trait answers the same on both (tenants
//! and their tokens too), request ids continue after the copied ones, and a second copy into
//! the now full database is refused.

#![expect(clippy::unwrap_used, reason = "a test fails loudly")]

use std::collections::BTreeSet;

use futures::TryStreamExt;
use tranche_core::{Endpoint, JobId, JobSettings, ProviderKind};
use tranche_store::{
    DeploymentStore, JobFilter, JobStore, NewAnswerCheck, NewJob, NewRequest, PlanStore,
    QueryStore, RequestBody, ResultRow, Store, TenantStore, conformance,
};
use tranche_store_postgres::{ImportError, PgStore};
use tranche_store_sqlite::SqliteStore;
use tranche_test_support::postgres::scratch;

/// What the store traits answer about every job and tranche of a store, as text.
async fn answers(store: &dyn Store) -> Vec<String> {
    let mut out = Vec::new();
    let mut tranches = BTreeSet::new();
    for job in store.recent_jobs(100).await.unwrap() {
        let id = job.id;
        out.push(format!("{:?}", store.job(id).await.unwrap()));
        out.push(format!("{:?}", store.job_counts(id).await.unwrap()));
        out.push(format!("{:?}", store.job_tokens(id).await.unwrap()));
        out.push(format!("{:?}", store.job_usage(id).await.unwrap()));
        out.push(format!("{:?}", store.job_tranche_counts(id).await.unwrap()));
        out.push(format!("{:?}", store.job_file_counts(id).await.unwrap()));
        out.push(format!("{:?}", store.job_unfinished_tranches(id).await.unwrap()));
        let rows: Vec<ResultRow> = store.job_results(id).try_collect().await.unwrap();
        tranches.extend(rows.iter().filter_map(|r| r.tranche_id));
        out.push(format!("{rows:?}"));
        if let Some(check) = &job.settings.answer_check {
            out.push(format!("{:?}", store.answer_check(check).await.unwrap()));
        }
    }
    assert!(!tranches.is_empty(), "the fixture has tranches");
    out.push(format!("{:?}", store.tenants().await.unwrap()));
    out.push(format!("{:?}", tranche_store::MetricsStore::metrics_snapshot(store).await.unwrap()));
    let all = JobFilter { tenant: None, state: None, before: None, limit: 100 };
    out.push(format!("{:?}", store.list_jobs(all).await.unwrap()));
    for tranche in tranches {
        out.push(format!("{:?}", store.tranche(tranche).await.unwrap()));
        out.push(format!("{:?}", store.live_files(tranche).await.unwrap()));
        out.push(format!("{:?}", store.tranche_uploads(tranche).await.unwrap()));
        out.push(format!("{:?}", store.jobs_of_tranche(tranche).await.unwrap()));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_store_moves_whole_and_request_ids_continue() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tranche.db");
    let sqlite = SqliteStore::open(file.to_str().unwrap()).await.unwrap();
    // Jobs with results (stored and failed), bodies, files and audits, and a job still waiting
    // under an answer check.
    conformance::results_are_recorded_once_and_the_rest_in_bulk(&sqlite).await;
    conformance::usage_is_counted_once_per_attempt(&sqlite).await;
    conformance::provider_files_are_tracked_until_deleted(&sqlite).await;
    checked_job(&sqlite, 5, "waiting").await;
    // Tenants, one of them revoked and added again.
    conformance::tenants_are_found_by_token_refused_twice_and_revoked(&sqlite).await;
    sqlite.deployment_fact("blob_store", "file:///blobs").await.unwrap();
    let before = answers(&sqlite).await;
    let jobs = sqlite.recent_jobs(100).await.unwrap().len();

    let mut db = scratch().await;
    let pg = std::sync::Arc::new(PgStore::open(&db.url).await.unwrap());
    db.stores.push(pg.clone());
    let report = pg.import_sqlite(&file).await.unwrap();
    let copied: std::collections::HashMap<_, _> = report.tables.iter().copied().collect();
    assert_eq!(copied["jobs"], u64::try_from(jobs).unwrap());
    for table in [
        "requests",
        "tranches",
        "attempts",
        "provider_files",
        "job_tranches",
        "request_bodies",
        "request_outputs",
        "answer_checks",
        "file_audits",
        "deployment",
        "tenants",
    ] {
        assert!(copied[table] > 0, "{table} copied: {report:?}");
    }
    assert_eq!(answers(&*pg).await, before);
    assert_eq!(pg.deployment_fact("blob_store", "elsewhere").await.unwrap(), "file:///blobs");
    // A copied token authenticates on PostgreSQL; a revoked one does not.
    assert_eq!(pg.tenant_by_token("h4").await.unwrap().unwrap().name, "acme");
    assert_eq!(pg.tenant_by_token("h1").await.unwrap(), None);

    // A new job takes ids after the copied ones, and its requests are claimed as usual.
    let max_before = max_request_id(&*pg).await;
    let new = conformance::add_job(&*pg, 3, "fresh").await;
    // (k0's twin takes the copied answer rather than going out: two go out.)
    let (_, ids) = conformance::claim_all(&*pg, "fresh").await;
    assert_eq!(ids.len(), 2);
    assert!(ids.iter().all(|&id| id > max_before), "{ids:?} after {max_before}");
    assert_eq!(pg.job_counts(new).await.unwrap().queued, 2);
    // The waiting job is claimed on PostgreSQL like any other.
    let groups = pg.pending_groups(ProviderKind::Openai, i64::MAX).await.unwrap();
    assert!(groups.iter().any(|g| g.answer_check.as_deref() == Some("c1")), "{groups:?}");

    // The target is no longer empty: a second copy is refused and changes nothing.
    let again = pg.import_sqlite(&file).await;
    assert!(matches!(again, Err(ImportError::NotEmpty { .. })), "{again:?}");
    assert_eq!(pg.recent_jobs(100).await.unwrap().len(), jobs + 1);
    sqlite.close().await;
}

/// Records a job of `n` requests of `model` under an answer check, left waiting.
async fn checked_job(store: &dyn Store, n: u64, model: &str) {
    let job = NewJob {
        id: JobId::new(),
        provider: ProviderKind::Openai,
        source: Some("checked.jsonl".into()),
        settings: JobSettings { answer_check: Some("c1".into()), ..JobSettings::default() },
        body_object: None,
        answer_check: Some(NewAnswerCheck {
            id: "c1".into(),
            schema: r#"{"type":"object"}"#.into(),
            lenient_json: true,
        }),
        created_at: 200,
    };
    let mut writer = store.begin_job(job).await.unwrap();
    for i in 0..n {
        let custom_id = format!("c{i}");
        writer
            .add(&NewRequest {
                line: i + 1,
                custom_id: &custom_id,
                wire_id: &custom_id,
                endpoint: Endpoint::ChatCompletions,
                model,
                body: RequestBody::Stored("{}"),
                wire_bytes: 2,
                input_hash: tranche_core::InputHash::from_bytes([1; 32]),
                max_attempts: 3,
                est_tokens: 1,
                max_cost: None,
                accepted_at: 200,
            })
            .await
            .unwrap();
    }
    writer.commit().await.unwrap();
}

/// The largest request id any job's results name.
async fn max_request_id(store: &dyn Store) -> i64 {
    let mut max = 0;
    for job in store.recent_jobs(100).await.unwrap() {
        let rows: Vec<ResultRow> = store.job_results(job.id).try_collect().await.unwrap();
        max = rows.iter().map(|r| r.request_id).fold(max, i64::max);
    }
    max
}
