//! `Engine::drive`, the loop that steps several tranches at once: which steps go first, and
//! that a job it drives ends with every request answered once.

#![expect(clippy::unwrap_used, reason = "test helpers fail loudly")]

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;

use tokio_util::sync::CancellationToken;
use tranche_core::{JobState, ProviderKind, TrancheId};
use tranche_engine::Until;
use tranche_providers::{
    BatchId, BatchPage, CreateBatch, Download, FileId, LineParseError, Provider, RemoteBatch,
    ResultLine, UploadBody, UploadedFile, UpstreamError,
};
use tranche_test_support::harness::{Harness, keyed_lines, submit};

/// What the engine asked of the provider, in order, by tranche.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    Upload,
    Create,
    Collect,
}

/// An adapter that passes every call on and writes down uploads, creates and downloads; each
/// batch it creates is ended at once (the simulator's clock jumps a day), so that the order of
/// steps is decided by the engine alone.
#[derive(Debug)]
struct Recording {
    inner: Arc<dyn Provider>,
    setup: Arc<Harness>,
    calls: Mutex<Vec<(Call, TrancheId)>>,
    /// Which tranche a batch or output file belongs to.
    owners: Mutex<HashMap<String, TrancheId>>,
    /// Files moving now (uploads under way, downloads not yet dropped), and the most at once.
    moving: Arc<Moving>,
}

#[derive(Debug, Default)]
struct Moving {
    now: AtomicUsize,
    most: AtomicUsize,
}

/// One file moving, for as long as it lives.
struct MovingFile(Arc<Moving>);

impl MovingFile {
    fn start(moving: &Arc<Moving>) -> Self {
        let now = moving.now.fetch_add(1, Ordering::SeqCst) + 1;
        moving.most.fetch_max(now, Ordering::SeqCst);
        Self(Arc::clone(moving))
    }
}

impl Drop for MovingFile {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Recording {
    fn record(&self, call: Call, tranche: TrancheId) {
        self.calls.lock().unwrap().push((call, tranche));
    }

    fn calls(&self) -> Vec<(Call, TrancheId)> {
        self.calls.lock().unwrap().clone()
    }
}

#[async_trait::async_trait]
impl Provider for Recording {
    fn kind(&self) -> ProviderKind {
        self.inner.kind()
    }

    fn account(&self) -> tranche_core::AccountId {
        self.inner.account()
    }

    async fn upload_batch_file(
        &self,
        tranche: TrancheId,
        body: UploadBody,
    ) -> Result<UploadedFile, UpstreamError> {
        self.record(Call::Upload, tranche);
        let _moving = MovingFile::start(&self.moving);
        // Long enough for the engine to start its other due steps meanwhile.
        tokio::time::sleep(Duration::from_millis(5)).await;
        self.inner.upload_batch_file(tranche, body).await
    }

    async fn create_batch(&self, req: CreateBatch<'_>) -> Result<RemoteBatch, UpstreamError> {
        let tranche = req.tranche_id;
        self.record(Call::Create, tranche);
        let batch = self.inner.create_batch(req).await?;
        self.owners.lock().unwrap().insert(batch.id.as_str().to_owned(), tranche);
        self.setup.sim.advance(86_400.0);
        Ok(batch)
    }

    async fn retrieve_batch(&self, id: &BatchId) -> Result<RemoteBatch, UpstreamError> {
        let batch = self.inner.retrieve_batch(id).await?;
        let mut owners = self.owners.lock().unwrap();
        if let (Some(file), Some(&tranche)) = (&batch.output_file_id, owners.get(id.as_str())) {
            owners.insert(file.as_str().to_owned(), tranche);
        }
        Ok(batch)
    }

    async fn list_batches(
        &self,
        after: Option<&BatchId>,
        limit: u32,
    ) -> Result<BatchPage, UpstreamError> {
        self.inner.list_batches(after, limit).await
    }

    async fn cancel_batch(&self, id: &BatchId) -> Result<RemoteBatch, UpstreamError> {
        self.inner.cancel_batch(id).await
    }

    async fn download_file(&self, id: &FileId) -> Result<Download, UpstreamError> {
        let owner = self.owners.lock().unwrap().get(id.as_str()).copied();
        if let Some(tranche) = owner {
            self.record(Call::Collect, tranche);
        }
        let moving = MovingFile::start(&self.moving);
        let mut download = self.inner.download_file(id).await?;
        // The stream holds the mark until the engine drops it, read or not.
        download.stream = download
            .stream
            .inspect(move |_| {
                let _held = &moving;
            })
            .boxed();
        Ok(download)
    }

    async fn delete_file(&self, id: &FileId) -> Result<(), UpstreamError> {
        self.inner.delete_file(id).await
    }

    async fn find_batch_file(
        &self,
        tranche: TrancheId,
    ) -> Result<Option<UploadedFile>, UpstreamError> {
        self.inner.find_batch_file(tranche).await
    }

    fn parse_result_line(&self, line: &str) -> Result<ResultLine, LineParseError> {
        self.inner.parse_result_line(line)
    }
}

/// Drives a job of `requests` lines to its end, in batches of at most `per_batch` requests
/// with `parallel_steps` steps at once (of them, `transfer_steps` moving files), through a
/// recording adapter: the calls it saw, the most files it saw moving at once, and the harness
/// (whose simulator billed them).
async fn drive_recorded(
    requests: usize,
    per_batch: usize,
    parallel_steps: usize,
    transfer_steps: usize,
) -> (Vec<(Call, TrancheId)>, usize, Arc<Harness>) {
    let setup = Arc::new(Harness::new().await);
    let recording = Arc::new(Recording {
        inner: Arc::new(setup.openai_at(setup.sim.openai_base_url())),
        setup: Arc::clone(&setup),
        calls: Mutex::new(Vec::new()),
        owners: Mutex::new(HashMap::new()),
        moving: Arc::default(),
    });
    let engine = setup
        .engine_over(recording.clone(), |c| {
            c.max_batch_requests = Some(per_batch);
            c.parallel_steps = parallel_steps;
            c.transfer_steps = transfer_steps;
        })
        .await;
    let job = submit(&engine, &keyed_lines(requests)).await;
    engine.drive(Until::JobEnds(job), &CancellationToken::new(), || {}).await.unwrap();
    assert_eq!(engine.store().job(job).await.unwrap().unwrap().state, JobState::Done);
    (recording.calls(), recording.moving.most.load(Ordering::SeqCst), setup)
}

#[tokio::test]
async fn a_batch_is_created_and_collected_before_the_next_tranches_file_is_written() {
    // One step at a time, so that the order shows which step the engine takes first.
    let (calls, _, _) = drive_recorded(40, 5, 1, 1).await;
    let tranches: Vec<TrancheId> =
        calls.iter().filter(|(c, _)| *c == Call::Upload).map(|&(_, t)| t).collect();
    assert_eq!(tranches.len(), 8, "{calls:?}");
    // Each tranche's whole life runs before the next tranche's file is written: a later
    // step of a tranche under way goes before the first step of a new one.
    let expected: Vec<(Call, TrancheId)> = tranches
        .iter()
        .flat_map(|&t| [(Call::Upload, t), (Call::Create, t), (Call::Collect, t)])
        .collect();
    assert_eq!(calls, expected);
}

#[tokio::test]
async fn steps_of_several_tranches_run_at_once_and_every_request_is_answered_once() {
    let (calls, _, setup) = drive_recorded(200, 10, 4, 4).await;
    for call in [Call::Upload, Call::Create, Call::Collect] {
        let mut seen: Vec<TrancheId> =
            calls.iter().filter(|(c, _)| *c == call).map(|&(_, t)| t).collect();
        seen.sort();
        let count = seen.len();
        seen.dedup();
        assert_eq!((count, seen.len()), (20, 20), "{call:?} once per tranche: {calls:?}");
    }
    let ledger = setup.sim.ledger();
    assert_eq!(ledger.len(), 200, "every request billed once");
}

#[tokio::test]
async fn files_move_one_at_a_time_while_other_steps_run_beside_them() {
    // The bound is what keeps an engine's memory the same for a job of any size.
    let (calls, most, setup) = drive_recorded(200, 10, 4, 1).await;
    assert_eq!(most, 1, "one file moving at a time: {calls:?}");
    assert_eq!(setup.sim.ledger().len(), 200, "every request billed once");
    // Without the bound, files of several tranches move at once (so the check above can see it).
    let (_, most, _) = drive_recorded(200, 10, 4, 4).await;
    assert!(most > 1, "{most} file(s) at once with room for 4");
}
