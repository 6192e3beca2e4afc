//! Three providers on one port, and two simulators side by side in one process.

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{DEPLOYMENT, TestSim, chat_file, frozen, message_request};

async fn one_batch_each(t: &TestSim) {
    let oai = t.openai();
    let file = oai.upload(&chat_file(2, "gpt-4o-mini", "/v1/chat/completions")).await;
    oai.create(&file, "/v1/chat/completions").await;
    let azure = t.azure_legacy();
    let file = azure.upload(&chat_file(3, DEPLOYMENT, "/v1/chat/completions")).await;
    azure.create(&file, "/chat/completions").await;
    t.anthropic()
        .create((0..4).map(|i| message_request(&format!("m{i}"), "hello")).collect())
        .await;
}

#[tokio::test]
async fn all_three_providers_share_one_port_with_separate_books() {
    let t = TestSim::new(frozen()).await;
    assert_eq!(t.sim.azure_endpoint(), t.sim.base_url());
    assert_eq!(t.sim.anthropic_base_url(), t.sim.base_url());
    assert_eq!(t.sim.openai_base_url(), format!("{}/v1", t.sim.base_url()));
    one_batch_each(&t).await;
    t.sim.advance(60.0);
    let stats = t.sim.stats();
    let by = stats.by_provider;
    assert_eq!(
        (by.openai.requests_billed, by.azure.requests_billed, by.anthropic.requests_billed),
        (2, 3, 4)
    );
    assert_eq!(
        (by.openai.batches_created, by.azure.batches_created, by.anthropic.batches_created),
        (1, 1, 1)
    );
    assert_eq!(
        (by.openai.files_uploaded, by.azure.files_uploaded, by.anthropic.files_uploaded),
        (1, 1, 0)
    );
    // OpenAI: input + output; Azure: input + output + zero-byte error file.
    assert_eq!((by.openai.files_live, by.azure.files_live), (2, 3));
    assert_eq!(stats.requests_billed, 9);
    assert_eq!(
        stats.tokens_billed,
        by.openai.tokens_billed + by.azure.tokens_billed + by.anthropic.tokens_billed
    );

    let r = TestSim::send(t.client.get(t.url("/sim/stats"))).await;
    for key in [
        "files_uploaded",
        "files_deleted",
        "files_live",
        "batches_created",
        "requests_billed",
        "tokens_billed",
    ] {
        assert!(r.body[key].is_u64(), "{key}");
        for p in ["openai", "azure", "anthropic"] {
            assert!(r.body["by_provider"][p][key].is_u64(), "{p}.{key}");
        }
    }
    let ledger = TestSim::send(t.client.get(t.url("/sim/ledger"))).await;
    let lines: Vec<serde_json::Value> =
        ledger.text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 9);
    for p in ["openai", "azure", "anthropic"] {
        assert!(lines.iter().any(|l| l["provider"] == p));
    }
    let tokens: u64 = lines
        .iter()
        .map(|l| l["input_tokens"].as_u64().unwrap() + l["output_tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(tokens, stats.tokens_billed);
}

#[tokio::test]
async fn two_simulators_side_by_side_share_nothing() {
    let a = TestSim::new(frozen()).await;
    let b = TestSim::new(frozen()).await;
    assert_ne!(a.sim.addr(), b.sim.addr());
    one_batch_each(&a).await;
    let b_now = b.sim.now();
    a.sim.advance(3600.0);
    assert_eq!(b.sim.now(), b_now);
    assert_eq!(b.sim.stats(), Default::default());
    assert_eq!(a.sim.stats().requests_billed, 9);
    let listed = b.anthropic().get("/v1/messages/batches").await;
    assert_eq!(listed.body["data"], json!([]));
    let id = a.anthropic().get("/v1/messages/batches").await.body["data"][0]["id"].clone();
    let r = b.anthropic().get(&format!("/v1/messages/batches/{}", id.as_str().unwrap())).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    // Faults in one do not touch the other.
    a.sim.set_faults(vec![tranche_sim::HttpFault::status("any", "any", 500)]);
    assert_eq!(a.azure_v1().get("/files").await.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(b.azure_v1().get("/files").await.status, StatusCode::OK);
}
