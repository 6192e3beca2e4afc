//! `Engine::prune`: old jobs' requests and bytes go, their summaries stay, and no job still
//! kept loses a byte it reads.

#![expect(clippy::unwrap_used, clippy::panic, reason = "test helpers fail loudly")]

use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use tranche_blob::{BlobKey, BlobStore};
use tranche_core::{JobId, JobState, ManualClock};
use tranche_engine::{Engine, PruneReport};
use tranche_store::{OutputRef, ResultRow};
use tranche_test_support::harness::{Harness, keyed_lines, submit};

async fn run_to_end(setup: &Harness, engine: &Engine, job: JobId) {
    for _ in 0..300 {
        engine.tick().await.unwrap();
        if engine.store().job(job).await.unwrap().unwrap().state.is_terminal() {
            return;
        }
        setup.sim.advance(1.0);
    }
    panic!("job {job} did not end");
}

fn folder(name: &str) -> BlobKey {
    BlobKey::new(name).unwrap()
}

async fn results(engine: &Engine, job: JobId) -> Vec<ResultRow> {
    engine.store().job_results(job).try_collect().await.unwrap()
}

#[tokio::test]
async fn old_jobs_lose_rows_and_bytes_no_kept_job_reads_and_keep_their_summaries() {
    let setup = Harness::new().await;
    let clock = ManualClock::at(1_000_000);
    let engine = setup.engine(None).await.with_clock(Arc::new(clock.clone()));
    let blobs = BlobStore::local(&setup.dir.path().join("blobs"));

    // The first job runs; the second, a day later, is answered from the first's raw file; the
    // third is still waiting.
    let first = submit(&engine, &keyed_lines(4)).await;
    run_to_end(&setup, &engine, first).await;
    clock.advance(86_400);
    let second = submit(&engine, &keyed_lines(4)).await;
    run_to_end(&setup, &engine, second).await;
    let counts = engine.store().job_counts(second).await.unwrap();
    assert_eq!(counts.cached, 4, "answered from the first job");
    clock.advance(86_400);
    let waiting = submit(&engine, &keyed_lines(3).replace("question", "other question")).await;
    let raw = blobs.list(&folder("raw")).await.unwrap();
    assert_eq!(raw.len(), 2, "one raw output file per model: {raw:?}");
    assert_eq!(blobs.list(&folder("bodies")).await.unwrap().len(), 3);

    // Older than a day and a half: the first job only. Its raw files stay: the second reads them.
    let older = Duration::from_secs(129_600);
    let dry = engine.prune(older, true).await.unwrap();
    let body = blobs.size(&folder(&format!("bodies/{first}.jsonl"))).await.unwrap().unwrap();
    let expected = PruneReport { dry_run: true, jobs: 1, requests: 4, objects: 1, bytes: body };
    assert_eq!(dry, expected);
    assert_eq!(results(&engine, first).await.len(), 4, "a dry run removes nothing");
    let pruned = engine.prune(older, false).await.unwrap();
    assert_eq!(pruned, PruneReport { dry_run: false, ..dry });
    assert!(results(&engine, first).await.is_empty());
    let job = engine.store().job(first).await.unwrap().unwrap();
    assert_eq!(job.state, JobState::Done);
    let counts = engine.store().job_counts(first).await.unwrap();
    assert_eq!((counts.accepted, counts.succeeded), (4, 4), "its summary stays");
    assert_eq!(blobs.list(&folder("raw")).await.unwrap(), raw, "the second job reads them");
    assert_eq!(blobs.list(&folder("bodies")).await.unwrap().len(), 2);
    // The second job's answers still read back whole from the first's raw files.
    for row in results(&engine, second).await {
        let Some(OutputRef::InObject { object, offset, len }) = row.output else {
            panic!("an answer by reference: {row:?}")
        };
        let bytes = blobs.get_range(&folder(&object), offset..offset + len).await.unwrap();
        let answer: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(answer["object"], "chat.completion");
    }
    assert_eq!(engine.prune(older, false).await.unwrap().jobs, 0, "nothing left to prune");

    // Everything that ended: the second job, and with it the raw files; the waiting job keeps
    // its requests and body.
    let all = engine.prune(Duration::ZERO, false).await.unwrap();
    assert_eq!((all.jobs, all.requests, all.objects), (1, 4, 3));
    assert!(blobs.list(&folder("raw")).await.unwrap().is_empty());
    let bodies = blobs.list(&folder("bodies")).await.unwrap();
    assert_eq!(bodies.len(), 1);
    assert!(bodies[0].0.as_str().contains(&waiting.to_string()));
    assert_eq!(results(&engine, waiting).await.len(), 3);
    assert_eq!(engine.store().job(waiting).await.unwrap().unwrap().state, JobState::Pending);
}
