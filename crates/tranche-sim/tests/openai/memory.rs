//! Peak memory of one in-process simulator pushing many ~1 KB lines through upload, batches,
//! download and delete. Ignored by default (it runs for minutes). Run it once per size, each in
//! its own process, and compare the peaks:
//!
//! ```text
//! TRANCHE_SIM_MEMORY_LINES=10000  cargo test -p tranche-sim --test openai memory -- --ignored --nocapture
//! TRANCHE_SIM_MEMORY_LINES=200000 cargo test -p tranche-sim --test openai memory -- --ignored --nocapture
//! ```
//!
//! The client side streams too (files are written to and uploaded from disk, downloads are counted
//! as they arrive), so the process's peak is the simulator's plus a constant.

use std::io::Write;

use reqwest::StatusCode;
use reqwest::multipart::{Form, Part};
use serde_json::{Value, json};
use tranche_sim::{ProcessingConfig, SimConfig};

use crate::helpers::{KEY, TestSim, chat_line, frozen};

/// A `kB` field of `/proc/self/status` (Linux), e.g. `VmHWM` (peak RSS) or `VmRSS`.
fn status_kb(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(&format!("{field}:")))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "slow: pushes 200,000 lines of about 1 KB through one simulator"]
async fn peak_memory_does_not_grow_with_lines() {
    let total: usize = std::env::var("TRANCHE_SIM_MEMORY_LINES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let per_file = 50_000;
    let t = TestSim::new(SimConfig {
        processing: ProcessingConfig { requests_per_second: 1.0e9, ..ProcessingConfig::default() },
        ..frozen()
    })
    .await;
    let rss_at_start = status_kb("VmRSS").unwrap_or(0);
    let scratch = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();

    let mut batches = Vec::new();
    let mut input_bytes = 0u64;
    let mut written = 0;
    while written < total {
        let n = per_file.min(total - written);
        let path = scratch.path().join("input.jsonl");
        {
            let mut w = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
            for i in written..written + n {
                let text = format!("Classify ticket {i}: {}", "lorem ipsum ".repeat(75));
                writeln!(w, "{}", chat_line(&format!("t-{i}"), "gpt-4o-mini", &text)).unwrap();
            }
            w.flush().unwrap();
        }
        written += n;
        let len = std::fs::metadata(&path).unwrap().len();
        input_bytes += len;
        let file = tokio::fs::File::open(&path).await.unwrap();
        let part = Part::stream_with_length(reqwest::Body::from(file), len).file_name("in.jsonl");
        let form = Form::new().text("purpose", "batch").part("file", part);
        let res = t
            .client
            .post(format!("{}/files", t.base))
            .bearer_auth(KEY)
            .multipart(form)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        let file: Value = res.json().await.unwrap();
        assert_eq!(file["bytes"].as_u64(), Some(len));
        std::fs::remove_file(&path).unwrap();
        let (status, batch) = t
            .post(
                "/batches",
                &json!({"input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{batch}");
        batches.push(batch);
    }

    t.sim.advance(10.0);
    let mut output_bytes = 0u64;
    let mut output_lines = 0usize;
    for batch in &batches {
        let b = t.batch(batch["id"].as_str().unwrap()).await;
        assert_eq!(b["status"], "completed", "{b}");
        let out_id = b["output_file_id"].as_str().unwrap();
        let mut res = t.content_response(out_id).await;
        while let Some(chunk) = res.chunk().await.unwrap() {
            output_bytes += chunk.len() as u64;
            output_lines += chunk.iter().filter(|b| **b == b'\n').count();
        }
        for id in [&b["input_file_id"], &b["output_file_id"]] {
            let (status, _) = t.delete(&format!("/files/{}", id.as_str().unwrap())).await;
            assert_eq!(status, StatusCode::OK);
        }
    }
    assert_eq!(output_lines, total);

    let peak = status_kb("VmHWM").unwrap_or(0);
    println!(
        "lines {total}: input {} MB, output {} MB, {:.0?}; RSS at start {} MB, peak RSS {} MB",
        input_bytes >> 20,
        output_bytes >> 20,
        started.elapsed(),
        rss_at_start >> 10,
        peak >> 10,
    );
    if peak > 0 {
        // Far below the data pushed through (an in-memory design holds more than all of it). What
        // growth there is comes from the allocator's per-thread arenas keeping freed memory
        // (flat with MALLOC_ARENA_MAX=1), not from anything the simulator keeps per line.
        assert!(peak.saturating_sub(rss_at_start) < 64 * 1024, "peak grew to {} MB", peak >> 10);
    }
}
