//! The blob store suite, run on every backend: a local folder and a real S3-compatible server
//! on loopback (moto). Objects are whole or absent, ranges are exact, a writer given up leaves
//! nothing, deletes are idempotent, listings see only whole objects under their prefix.

#![expect(clippy::unwrap_used, reason = "tests fail loudly")]

use bytes::Bytes;
use futures::TryStreamExt;
use sha2::{Digest, Sha256};
use tranche_blob::{BlobError, BlobKey, BlobStore};
use tranche_test_support::s3::S3Server;

/// A store under test and whatever keeps its backend alive.
struct Target {
    store: BlobStore,
    _keep: Box<dyn std::any::Any + Send>,
}

fn local() -> Target {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().join("blobs").display());
    Target { store: BlobStore::open(&url).unwrap(), _keep: Box::new(dir) }
}

fn s3() -> Target {
    let server = S3Server::start("tranche-test");
    let options = server.options();
    let url = format!("s3://{}/deployment-1", server.bucket);
    let store =
        BlobStore::open_with_options(&url, options.iter().map(|(k, v)| (*k, v.as_str()))).unwrap();
    Target { store, _keep: Box::new(server) }
}

fn key(text: &str) -> BlobKey {
    BlobKey::new(text).unwrap()
}

/// Deterministic bytes of `len`, not all alike.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| u8::try_from((i * 31 + i / 997) % 251).unwrap()).collect()
}

async fn put_then_read_back_whole_and_by_range(store: BlobStore) {
    let body = Bytes::from(pattern(100_000));
    let written = store.put(&key("bodies/job_1"), body.clone()).await.unwrap();
    assert_eq!(written.size, 100_000);
    assert_eq!(written.sha256, hex::encode(Sha256::digest(&body)));
    assert_eq!(store.get(&key("bodies/job_1")).await.unwrap(), body);
    let slice = store.get_range(&key("bodies/job_1"), 12_345..12_400).await.unwrap();
    assert_eq!(slice, body.slice(12_345..12_400));
    assert_eq!(store.size(&key("bodies/job_1")).await.unwrap(), Some(100_000));
    let streamed: Vec<Bytes> =
        store.stream(&key("bodies/job_1")).await.unwrap().try_collect().await.unwrap();
    assert_eq!(streamed.concat(), body.to_vec());
}

/// Many ranges of one object come back exact and in the order asked, however they lie: side
/// by side, overlapping, far apart (past a request's longest span), unsorted; one past the
/// end is refused.
async fn many_ranges_come_back_exact_in_the_order_asked(store: BlobStore) {
    let body = Bytes::from(pattern(5 << 20));
    store.put(&key("raw/tr_2/output.jsonl"), body.clone()).await.unwrap();
    let mut ranges = vec![4_000_000..4_000_700, 10..20, 20..35, 30..90, 0..1, 5_242_000..5_242_880];
    ranges.extend((0..2_000u64).map(|i| (i * 2_111 + 700_000)..(i * 2_111 + 700_600)));
    ranges.push(100_000..100_000);
    let read = store.get_ranges(&key("raw/tr_2/output.jsonl"), &ranges).await.unwrap();
    assert_eq!(read.len(), ranges.len());
    for (range, bytes) in ranges.iter().zip(&read) {
        let (start, end) =
            (usize::try_from(range.start).unwrap(), usize::try_from(range.end).unwrap());
        assert_eq!(bytes, &body.slice(start..end), "range {range:?}");
    }
    let past =
        store.get_ranges(&key("raw/tr_2/output.jsonl"), &[10..20, 5_242_000..5_243_000]).await;
    assert!(past.is_err(), "a range past the end came back: {past:?}");
    let absent = store.get_ranges(&key("raw/none"), &[0..1, 2..3]).await;
    assert!(absent.is_err());
}

/// Large enough that S3 takes it in parts (object_store buffers 10 MiB before going multipart);
/// written in pieces smaller and larger than a part, which come back whole and in order.
async fn a_streamed_object_appears_whole_only_when_finished(store: BlobStore) {
    let source = pattern(13 << 20);
    let mut writer = store.writer(&key("raw/tr_1/output.jsonl"));
    let mut at = 0;
    for len in [1 << 20, 300_001, 7, 256 << 10, 3 << 20].into_iter().cycle() {
        let end = (at + len).min(source.len());
        writer.write(&source[at..end]).await.unwrap();
        at = end;
        if at == source.len() {
            break;
        }
    }
    assert_eq!(store.size(&key("raw/tr_1/output.jsonl")).await.unwrap(), None, "not yet");
    assert!(store.list(&key("raw")).await.unwrap().is_empty(), "no partial object is listed");
    let written = writer.finish().await.unwrap();
    assert_eq!(written.size, 13 << 20);
    assert_eq!(written.sha256, hex::encode(Sha256::digest(&source)));
    let back = store.get(&key("raw/tr_1/output.jsonl")).await.unwrap();
    assert!(back[..] == source[..], "the object differs from what was written");
}

async fn a_writer_given_up_leaves_nothing(store: BlobStore) {
    let mut aborted = store.writer(&key("outbox/tr_2"));
    aborted.write(&pattern(11 << 20)).await.unwrap();
    aborted.abort().await.unwrap();
    let mut dropped = store.writer(&key("outbox/tr_3"));
    dropped.write(&pattern(1000)).await.unwrap();
    drop(dropped);
    assert_eq!(store.size(&key("outbox/tr_2")).await.unwrap(), None);
    assert_eq!(store.size(&key("outbox/tr_3")).await.unwrap(), None);
    assert!(store.list(&key("outbox")).await.unwrap().is_empty());
}

async fn deletes_are_idempotent_and_reads_of_absent_objects_say_so(store: BlobStore) {
    store.put(&key("exports/job_1.jsonl"), Bytes::from_static(b"{}\n")).await.unwrap();
    store.delete(&key("exports/job_1.jsonl")).await.unwrap();
    store.delete(&key("exports/job_1.jsonl")).await.unwrap();
    assert_eq!(store.size(&key("exports/job_1.jsonl")).await.unwrap(), None);
    let err = store.get(&key("exports/job_1.jsonl")).await.unwrap_err();
    assert!(matches!(err, BlobError::NotFound(_)), "{err}");
}

async fn listings_see_whole_objects_under_their_prefix(store: BlobStore) {
    for name in ["raw/tr_a/output.jsonl", "raw/tr_a/errors.jsonl", "raw/tr_b/output.jsonl"] {
        store.put(&key(name), Bytes::from(name.as_bytes().to_vec())).await.unwrap();
    }
    store.put(&key("bodies/job_9"), Bytes::from_static(b"x")).await.unwrap();
    let listed = store.list(&key("raw/tr_a")).await.unwrap();
    let names: Vec<&str> = listed.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, ["raw/tr_a/errors.jsonl", "raw/tr_a/output.jsonl"]);
    assert_eq!(listed[1].1, "raw/tr_a/output.jsonl".len() as u64);
    assert_eq!(store.list(&key("raw")).await.unwrap().len(), 3);
}

async fn a_local_file_streams_in(store: BlobStore) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tranche.jsonl");
    let content = pattern(3_000_000);
    std::fs::write(&path, &content).unwrap();
    let written = store.put_file(&key("outbox/tr_4.jsonl"), &path).await.unwrap();
    assert_eq!(written.size, 3_000_000);
    assert_eq!(store.get(&key("outbox/tr_4.jsonl")).await.unwrap(), content);
}

macro_rules! blob_suite {
    ($name:ident, $target:expr) => {
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn put_then_read_back_whole_and_by_range() {
                let target = tokio::task::spawn_blocking(|| $target).await.unwrap();
                super::put_then_read_back_whole_and_by_range(target.store.clone()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn many_ranges_come_back_exact_in_the_order_asked() {
                let target = tokio::task::spawn_blocking(|| $target).await.unwrap();
                super::many_ranges_come_back_exact_in_the_order_asked(target.store.clone()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_streamed_object_appears_whole_only_when_finished() {
                let target = tokio::task::spawn_blocking(|| $target).await.unwrap();
                super::a_streamed_object_appears_whole_only_when_finished(target.store.clone())
                    .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_writer_given_up_leaves_nothing() {
                let target = tokio::task::spawn_blocking(|| $target).await.unwrap();
                super::a_writer_given_up_leaves_nothing(target.store.clone()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn deletes_are_idempotent_and_reads_of_absent_objects_say_so() {
                let target = tokio::task::spawn_blocking(|| $target).await.unwrap();
                super::deletes_are_idempotent_and_reads_of_absent_objects_say_so(
                    target.store.clone(),
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn listings_see_whole_objects_under_their_prefix() {
                let target = tokio::task::spawn_blocking(|| $target).await.unwrap();
                super::listings_see_whole_objects_under_their_prefix(target.store.clone()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_local_file_streams_in() {
                let target = tokio::task::spawn_blocking(|| $target).await.unwrap();
                super::a_local_file_streams_in(target.store.clone()).await;
            }
        }
    };
}

blob_suite!(local_folder, local());
blob_suite!(s3_compatible, s3());

#[test]
fn unknown_schemes_and_bucketless_urls_are_refused_by_name() {
    let err = BlobStore::open("ftp://host/x").unwrap_err();
    assert!(err.to_string().contains("unknown scheme `ftp`"), "{err}");
    let err = BlobStore::open("s3:///prefix").unwrap_err();
    assert!(err.to_string().contains("no bucket"), "{err}");
}

#[tokio::test]
async fn deleting_a_local_object_removes_what_a_killed_writer_staged_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    // A folder whose name object_store percent-encodes on disk: its files are found all the same.
    let store = BlobStore::local(&dir.path().join("blobs ~é"));
    let object = key("tranches/t1/input.jsonl");
    store.put(&object, Bytes::from_static(b"{}\n")).await.unwrap();
    let streamed: Vec<Bytes> = store.stream(&object).await.unwrap().try_collect().await.unwrap();
    assert_eq!(streamed.concat(), b"{}\n");
    let folder = std::fs::read_dir(dir.path()).unwrap().next().unwrap().unwrap().path();
    let folder = folder.join("tranches/t1");
    // What writers SIGKILLed mid-object leave: staging files, which listings never show.
    std::fs::write(folder.join("input.jsonl#1"), b"{").unwrap();
    std::fs::write(folder.join("input.jsonl#2"), b"{").unwrap();
    std::fs::write(folder.join("input.jsonl.keep"), b"").unwrap();
    assert_eq!(store.list(&key("tranches/t1")).await.unwrap().len(), 2);
    store.delete(&object).await.unwrap();
    let mut left: Vec<_> =
        std::fs::read_dir(&folder).unwrap().map(|e| e.unwrap().file_name()).collect();
    left.sort();
    assert_eq!(left, ["input.jsonl.keep"], "the staging files went with their object");
    store.delete(&object).await.unwrap();
    assert!(matches!(store.stream(&object).await, Err(BlobError::NotFound(_))));
    assert!(matches!(store.stream(&key("tranches")).await, Err(BlobError::NotFound(_))));
}
