//! The spool: file contents, batch results and the ledger live on disk in the simulator's own
//! folder (not in memory), are streamed in and out with their exact sizes, and leave the disk
//! when deleted or when the simulator goes.

use std::collections::BTreeMap;
use std::path::Path;

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{TestSim, chat_line, frozen, jsonl};

/// Spool files by kind (`upload`, `result`, `index`, `ledger`, ...) with their sizes on disk.
fn spool_files(dir: &Path) -> BTreeMap<String, Vec<u64>> {
    let mut files: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        let kind = name.rsplit_once('-').map_or(name.clone(), |(kind, _)| kind.to_owned());
        files.entry(kind).or_default().push(entry.metadata().unwrap().len());
    }
    files
}

/// A file of `n` chat lines of about 1 KB each.
fn big_file(n: usize) -> String {
    (0..n)
        .map(|i| chat_line(&format!("ticket-{i}"), "gpt-4o-mini", &"word ".repeat(180)) + "\n")
        .collect()
}

#[tokio::test]
async fn contents_live_on_disk_and_leave_it_when_deleted() {
    let t = TestSim::new(frozen()).await;
    let dir = t.sim.spool_dir().to_path_buf();
    assert!(dir.is_dir());
    let n = 3_000;
    let content = big_file(n);
    assert!(content.len() > 3_000_000);

    // The upload is on disk, byte for byte.
    let file_id = t.upload(&content).await;
    assert_eq!(spool_files(&dir)["upload"], vec![content.len() as u64]);

    let (status, batch) = t
        .post(
            "/batches",
            &json!({"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{batch}");
    let id = batch["id"].as_str().unwrap().to_owned();
    // The line index: 16 bytes a line.
    assert_eq!(spool_files(&dir)["index"], vec![16 * n as u64]);

    t.sim.advance(3_600.0);
    let b = t.batch(&id).await;
    assert_eq!(b["status"], "completed");
    assert_eq!(b["request_counts"]["completed"], n);
    let out_id = b["output_file_id"].as_str().unwrap().to_owned();
    assert!(!spool_files(&dir).contains_key("index"), "the index goes when the batch ends");

    // The download is streamed from disk with its exact length.
    let (_, meta) = t.get(&format!("/files/{out_id}")).await;
    let bytes = meta["bytes"].as_u64().unwrap();
    let res = t.content_response(&out_id).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.content_length(), Some(bytes));
    let text = res.text().await.unwrap();
    assert_eq!(text.len() as u64, bytes);
    assert_eq!(jsonl(&text).len(), n);
    let results = &spool_files(&dir)["result"];
    assert_eq!(results.len(), 1);
    // The file on disk also holds a hole the size of one line (see `ResultSink`).
    assert!((bytes..bytes + 2_000).contains(&results[0]), "{results:?} vs {bytes}");

    // The ledger is on disk too, and served from there.
    let res = t.client.get(format!("{}/sim/ledger", t.sim.base_url())).send().await.unwrap();
    let len = res.content_length().unwrap();
    assert_eq!(res.text().await.unwrap().lines().count(), n);
    assert_eq!(spool_files(&dir)["ledger"], vec![len]);

    // Deleting files removes their bytes.
    for id in [&file_id, &out_id] {
        let (status, _) = t.delete(&format!("/files/{id}")).await;
        assert_eq!(status, StatusCode::OK);
    }
    let left = spool_files(&dir);
    assert!(!left.contains_key("upload") && !left.contains_key("result"), "{left:?}");

    drop(t);
    // The server task lets go of its state once it has stopped.
    for _ in 0..100 {
        if !dir.exists() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(!dir.exists(), "the spool folder goes with the simulator");
}

#[tokio::test]
async fn an_input_deleted_while_its_batch_runs_stays_until_the_batch_ends() {
    let t = TestSim::new(crate::helpers::paced(10.0)).await;
    let dir = t.sim.spool_dir().to_path_buf();
    let content = big_file(40);
    let b = t.start(&content).await;
    let id = b["id"].as_str().unwrap().to_owned();
    let file_id = b["input_file_id"].as_str().unwrap().to_owned();
    t.sim.advance(3.0);
    assert_eq!(t.batch(&id).await["status"], "in_progress");
    let (status, _) = t.delete(&format!("/files/{file_id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(spool_files(&dir)["upload"], vec![content.len() as u64], "the batch still reads it");

    t.sim.advance(60.0);
    let b = t.batch(&id).await;
    assert_eq!(b["status"], "completed");
    assert_eq!(b["request_counts"]["completed"], 40);
    let (out, _) = t.results(&b).await;
    assert_eq!(out.len(), 40);
    assert!(!spool_files(&dir).contains_key("upload"));
}

#[tokio::test]
async fn the_spool_folder_can_be_chosen() {
    let parent = tempfile::tempdir().unwrap();
    let t = TestSim::new(tranche_sim::SimConfig {
        spool_dir: Some(parent.path().join("nested")),
        ..frozen()
    })
    .await;
    assert!(t.sim.spool_dir().starts_with(parent.path().join("nested")));
    t.upload(&big_file(2)).await;
    assert_eq!(spool_files(t.sim.spool_dir())["upload"].len(), 1);
    // The run-time config does not show the folder unless it was set.
    let config = |t: &TestSim| {
        let url = format!("{}/sim/config", t.sim.base_url());
        let client = t.client.clone();
        async move { client.get(url).send().await.unwrap().json::<serde_json::Value>().await.unwrap() }
    };
    assert!(config(&t).await.get("spool_dir").is_some());
    let t2 = TestSim::new(frozen()).await;
    let shown = config(&t2).await;
    assert!(shown.get("spool_dir").is_none(), "{shown}");
}
