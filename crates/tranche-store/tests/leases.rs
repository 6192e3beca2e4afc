//! Leases and compare-and-set: engines on one store take turns, a lapsed lease passes on, and a
//! transition whose lease or state changed under it changes nothing.

#![expect(clippy::unwrap_used, reason = "test helpers fail loudly")]

use std::time::Duration;

use tranche_core::{
    Endpoint, EngineId, JobId, LeaseToken, ProviderKind, RequestState, TrancheId, TrancheState,
};
use tranche_store::*;

const LONG: Duration = Duration::from_secs(60);
const SHORT: Duration = Duration::from_millis(150);

struct Fixture {
    _dir: tempfile::TempDir,
    store: Store,
    tranche: TrancheId,
    job: JobId,
}

/// A store with one job of three requests claimed into one planned tranche.
async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("t.db").to_string_lossy()).await.unwrap();
    let job = JobId::new();
    let mut writer = store
        .begin_job(NewJob {
            id: job,
            provider: ProviderKind::Openai,
            source: None,
            settings: serde_json::json!({}),
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
                body: "{}",
                wire_bytes: 10,
                input_hash: "00",
                max_attempts: 3,
                est_tokens: 1,
                accepted_at: 1,
            })
            .await
            .unwrap();
    }
    writer.commit().await.unwrap();
    let ids: Vec<i64> = store
        .pending_page(ProviderKind::Openai, (Endpoint::ChatCompletions, "m"), 10, 0, 10)
        .await
        .unwrap()
        .iter()
        .map(|p| p.request_id)
        .collect();
    let token = LeaseToken::new();
    store.acquire_duty("plan:openai", &engine("planner"), token, LONG).await.unwrap().unwrap();
    let tranche = NewTranche {
        id: TrancheId::new(),
        est_tokens: 3,
        provider: ProviderKind::Openai,
        endpoint: Endpoint::ChatCompletions,
        model: "m".into(),
        bytes: 30,
        created_at: 1,
    };
    let claimed = store.create_tranche(&tranche, &ids, ("plan:openai", token)).await.unwrap();
    assert_eq!(claimed, Some(3));
    Fixture { _dir: dir, store, tranche: tranche.id, job }
}

fn engine(name: &str) -> EngineId {
    EngineId::new(name, 1)
}

#[tokio::test]
async fn a_held_tranche_lease_excludes_other_engines_until_handed_back() {
    let f = fixture().await;
    let (a, b) = (engine("a"), engine("b"));
    let (ta, tb) = (LeaseToken::new(), LeaseToken::new());
    let (record, grant) =
        f.store.lease_tranche(f.tranche, &a, ta, LONG, 10).await.unwrap().unwrap();
    assert_eq!(record.state, TrancheState::Planned);
    assert_eq!(record.lease_owner.as_ref(), Some(&a), "status can tell who holds it");
    assert!(grant.remaining > Duration::from_secs(55) && grant.remaining <= LONG);
    assert!(f.store.lease_tranche(f.tranche, &b, tb, LONG, 10).await.unwrap().is_none());
    assert!(f.store.due_tranches(10).await.unwrap().is_empty(), "a leased tranche is not due");
    // Renewing needs the holder's token.
    assert!(f.store.renew_tranche_lease(f.tranche, tb, LONG).await.unwrap().is_none());
    assert!(f.store.renew_tranche_lease(f.tranche, ta, LONG).await.unwrap().is_some());
    // A release with the wrong token changes nothing; the holder's frees it at once.
    f.store.release_tranche_lease(f.tranche, tb).await.unwrap();
    assert!(f.store.lease_tranche(f.tranche, &b, tb, LONG, 10).await.unwrap().is_none());
    f.store.release_tranche_lease(f.tranche, ta).await.unwrap();
    assert_eq!(f.store.due_tranches(10).await.unwrap().len(), 1);
    let (record, _) = f.store.lease_tranche(f.tranche, &b, tb, LONG, 10).await.unwrap().unwrap();
    assert_eq!(record.lease_owner.as_ref(), Some(&b));
}

#[tokio::test]
async fn a_lapsed_lease_passes_to_another_engine_and_its_holder_can_no_longer_act() {
    let f = fixture().await;
    let (ta, tb) = (LeaseToken::new(), LeaseToken::new());
    let (record, _) =
        f.store.lease_tranche(f.tranche, &engine("a"), ta, SHORT, 10).await.unwrap().unwrap();
    let held_a = Held { token: ta, state: record.state };
    tokio::time::sleep(SHORT * 2).await;
    let (record, _) =
        f.store.lease_tranche(f.tranche, &engine("b"), tb, LONG, 10).await.unwrap().unwrap();
    let held_b = Held { token: tb, state: record.state };
    // The old holder's renewal, transition and ingest all fail; nothing it does lands.
    assert!(f.store.renew_tranche_lease(f.tranche, ta, LONG).await.unwrap().is_none());
    let uploading = TrancheUpdate::to(TrancheState::Uploading, 11);
    assert!(!f.store.update_tranche(f.tranche, held_a, uploading.clone()).await.unwrap());
    assert!(!f.store.defer_tranche(f.tranche, ta, &serde_json::json!({}), 99, 11).await.unwrap());
    let mut writer = f.store.begin_ingest(f.tranche, held_a).await.unwrap();
    let failed = ResultUpdate {
        state: RequestState::Failed,
        outcome: AttemptOutcome::Errored,
        status_code: Some(400),
        output: None,
        error: Some("{}"),
        input_tokens: None,
        output_tokens: None,
        spends_attempt: true,
        not_before: 0,
        at: 11,
    };
    assert!(writer.record("k0:t:v1", &failed).await.unwrap());
    assert!(!writer.commit(TrancheState::Failed, 11).await.unwrap(), "the commit is refused");
    assert_eq!(f.store.job_counts(f.job).await.unwrap().queued, 3, "and nothing was recorded");
    // The new holder moves on.
    assert!(f.store.update_tranche(f.tranche, held_b, uploading).await.unwrap());
    let record = f.store.tranche(f.tranche).await.unwrap().unwrap();
    assert_eq!(record.state, TrancheState::Uploading);
}

#[tokio::test]
async fn a_transition_expecting_another_state_changes_nothing() {
    let f = fixture().await;
    let token = LeaseToken::new();
    f.store.lease_tranche(f.tranche, &engine("a"), token, LONG, 10).await.unwrap().unwrap();
    let stale = Held { token, state: TrancheState::Uploaded };
    let mut update = TrancheUpdate::to(TrancheState::Creating, 11);
    update.input_file_id = Some("file-1".into());
    assert!(!f.store.update_tranche(f.tranche, stale, update.clone()).await.unwrap());
    let record = f.store.tranche(f.tranche).await.unwrap().unwrap();
    assert_eq!((record.state, record.input_file_id), (TrancheState::Planned, None));
    let mut writer = f.store.begin_ingest(f.tranche, stale).await.unwrap();
    assert_eq!(writer.unanswered().await.unwrap().len(), 3);
    assert!(!writer.commit(TrancheState::Cleaning, 11).await.unwrap());
    let fresh = Held { token, state: TrancheState::Planned };
    assert!(
        f.store
            .update_tranche(f.tranche, fresh, TrancheUpdate::to(TrancheState::Uploading, 11))
            .await
            .unwrap()
    );
}

#[tokio::test]
async fn a_tranche_not_due_or_finished_cannot_be_leased() {
    let f = fixture().await;
    let token = LeaseToken::new();
    let a = engine("a");
    assert!(f.store.lease_tranche(f.tranche, &a, token, LONG, -1).await.unwrap().is_none());
    let (record, _) = f.store.lease_tranche(f.tranche, &a, token, LONG, 10).await.unwrap().unwrap();
    let done = TrancheUpdate::to(TrancheState::Done, 11);
    assert!(
        f.store.update_tranche(f.tranche, Held { token, state: record.state }, done).await.unwrap()
    );
    f.store.release_tranche_lease(f.tranche, token).await.unwrap();
    let again = LeaseToken::new();
    assert!(f.store.lease_tranche(f.tranche, &a, again, LONG, 99).await.unwrap().is_none());
}

#[tokio::test]
async fn one_engine_at_a_time_plans_and_a_lapsed_planner_claims_nothing() {
    let f = fixture().await;
    // The fixture's planner still holds the duty.
    let b = LeaseToken::new();
    assert!(f.store.acquire_duty("plan:openai", &engine("b"), b, LONG).await.unwrap().is_none());
    assert!(f.store.renew_duty("plan:openai", b, LONG).await.unwrap().is_none());
    // Another duty is free.
    let c = LeaseToken::new();
    assert!(f.store.acquire_duty("plan:azure", &engine("c"), c, SHORT).await.unwrap().is_some());
    tokio::time::sleep(SHORT * 2).await;
    let d = LeaseToken::new();
    assert!(f.store.acquire_duty("plan:azure", &engine("d"), d, LONG).await.unwrap().is_some());
    // The lapsed holder's claims are refused and record nothing.
    let tranche = NewTranche {
        id: TrancheId::new(),
        est_tokens: 0,
        provider: ProviderKind::Azure,
        endpoint: Endpoint::ChatCompletions,
        model: "m".into(),
        bytes: 0,
        created_at: 2,
    };
    assert_eq!(f.store.create_tranche(&tranche, &[1], ("plan:azure", c)).await.unwrap(), None);
    assert!(f.store.tranche(tranche.id).await.unwrap().is_none());
    // Handing a duty back frees it at once.
    f.store.release_duty("plan:azure", d).await.unwrap();
    let e = LeaseToken::new();
    assert!(f.store.acquire_duty("plan:azure", &engine("e"), e, LONG).await.unwrap().is_some());
}

#[tokio::test]
async fn a_job_that_ended_stays_as_it_ended() {
    let f = fixture().await;
    assert!(f.store.set_job_state(f.job, tranche_core::JobState::Done, None, 5).await.unwrap());
    let error = serde_json::json!({"code": "late"});
    let moved = f
        .store
        .set_job_state(f.job, tranche_core::JobState::Running, Some(&error), 6)
        .await
        .unwrap();
    assert!(!moved);
    let job = f.store.job(f.job).await.unwrap().unwrap();
    assert_eq!((job.state, job.last_error), (tranche_core::JobState::Done, None));
}
