//! Azure OpenAI: both surfaces, api-version, auth, expiry range, the file quota, deployments,
//! the zero-byte error file, no 24 h expiry by default, token limits, legacy quirks.

use reqwest::StatusCode;
use serde_json::{Value, json};
use tranche_sim::SimConfig;

use crate::helpers::{
    DEPLOYMENT, KEY, TestSim, azure_error, chat_file, chat_line, frozen, jsonl, paced,
};

#[tokio::test]
async fn both_surfaces_run_a_batch_with_a_zero_byte_error_file() {
    let t = TestSim::new(frozen()).await;
    for (surface, endpoint) in [
        (t.azure_legacy(), "/chat/completions"),
        (t.azure_v1(), "/v1/chat/completions"),
        (t.azure_v1(), "/chat/completions"),
    ] {
        let file = surface.upload(&chat_file(3, DEPLOYMENT, "/v1/chat/completions")).await;
        let b = surface.create(&file, endpoint).await;
        let id = b["id"].as_str().unwrap().to_owned();
        // UUID-style ids, as in Azure's examples.
        assert_eq!(id.len(), "batch_".len() + 36, "{id}");
        assert_eq!(b["status"], "validating");
        assert_eq!(b["endpoint"], endpoint);
        t.sim.advance(60.0);
        let b = surface.batch(&id).await;
        assert_eq!(b["status"], "completed", "{b}");
        assert_eq!(b["model"], DEPLOYMENT);
        assert_eq!(b["request_counts"], json!({"total": 3, "completed": 3, "failed": 0}));
        let err_id =
            b["error_file_id"].as_str().expect("a successful Azure batch has an error file");
        let meta = surface.get(&format!("/files/{err_id}")).await.body;
        assert_eq!(meta["bytes"], 0);
        assert_eq!(surface.content(err_id).await, "");
        let lines = jsonl(&surface.content(b["output_file_id"].as_str().unwrap()).await);
        assert_eq!(lines.len(), 3);
        for line in &lines {
            assert!(line["id"].as_str().unwrap().starts_with("batch_req_"));
            let body = &line["response"]["body"];
            assert_eq!(body["model"], DEPLOYMENT);
            assert_eq!(body["prompt_filter_results"][0]["prompt_index"], 0);
            assert_eq!(body["choices"][0]["content_filter_results"]["hate"]["filtered"], false);
        }
    }
    let stats = t.sim.stats();
    assert_eq!(stats.by_provider.azure.batches_created, 3);
    assert_eq!(stats.by_provider.azure.requests_billed, 9);
    assert_eq!(stats.by_provider.openai, Default::default());
    // Azure objects are not visible on the OpenAI surface and vice versa.
    let listed = t.openai().get("/batches").await;
    assert_eq!(listed.body["data"], json!([]));
}

#[tokio::test]
async fn api_version_is_required_on_the_legacy_surface_only() {
    let t = TestSim::new(frozen()).await;
    let missing = TestSim::send(t.client.get(t.url("/openai/files")).header("api-key", KEY)).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.body, json!({"error": {"code": "404", "message": "Resource not found"}}));
    for version in ["2023-05-15", "v1", "banana"] {
        let r = TestSim::send(
            t.client
                .get(t.url(&format!("/openai/files?api-version={version}")))
                .header("api-key", KEY),
        )
        .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{version}");
        assert_eq!(
            r.body,
            json!({"error": {"code": "BadRequest", "message": "API version not supported"}})
        );
    }
    for version in tranche_sim::AZURE_API_VERSIONS {
        let r = TestSim::send(
            t.client
                .get(t.url(&format!("/openai/batches?api-version={version}&limit=1")))
                .header("api-key", KEY),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{version}: {}", r.text);
    }
    // v1: no api-version needed; `preview` is accepted.
    for path in ["/openai/v1/files", "/openai/v1/files?api-version=preview"] {
        let r = TestSim::send(t.client.get(t.url(path)).header("api-key", KEY)).await;
        assert_eq!(r.status, StatusCode::OK, "{path}");
    }
    // The accepted list is configurable.
    let mut config = t.sim.config();
    config.azure.api_versions = vec!["2030-01-01".to_owned()];
    t.sim.set_config(config);
    let r = t.azure_legacy().get("/files").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = TestSim::send(
        t.client.get(t.url("/openai/files?api-version=2030-01-01")).header("api-key", KEY),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
}

#[tokio::test]
async fn auth_takes_the_api_key_header_or_a_bearer_token() {
    let t = TestSim::new(frozen()).await;
    let url = t.url("/openai/v1/batches");
    let denied = json!({"error": {"code": "401", "message": "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid key for an active subscription and use a correct regional API endpoint for your resource."}});
    for req in [
        t.client.get(&url),
        t.client.get(&url).header("api-key", "bogus-key-1"),
        t.client.get(&url).bearer_auth("bogus-key-1"),
    ] {
        let r = TestSim::send(req).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
        assert_eq!(r.body, denied);
        assert!(!r.text.contains("bogus-key-1"));
        assert!(r.headers.contains_key("apim-request-id"));
    }
    for req in [t.client.get(&url).header("api-key", KEY), t.client.get(&url).bearer_auth(KEY)] {
        assert_eq!(TestSim::send(req).await.status, StatusCode::OK);
    }
    // A provider-specific key overrides the shared one.
    let mut config = t.sim.config();
    config.azure.api_key = Some("az-only".to_owned());
    t.sim.set_config(config);
    assert_eq!(
        TestSim::send(t.client.get(&url).header("api-key", KEY)).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        TestSim::send(t.client.get(&url).header("api-key", "az-only")).await.status,
        StatusCode::OK
    );
    assert_eq!(t.openai().get("/batches").await.status, StatusCode::OK);
}

#[tokio::test]
async fn quota_of_three_files_without_expiry_gives_the_exact_400() {
    let mut config = frozen();
    config.azure.max_input_files_without_expiry = 3;
    config.azure.max_input_files_with_expiry = 2;
    let t = TestSim::new(config).await;
    let azure = t.azure_legacy();
    let mut ids = Vec::new();
    for _ in 0..3 {
        let r = azure.upload_with("{}\n", &[]).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        assert_eq!(r.body["expires_at"], Value::Null, "Azure sets no expiry by default");
        ids.push(r.body["id"].as_str().unwrap().to_owned());
    }
    let r = azure.upload_with("{}\n", &[]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        r.text,
        r#"{"error":{"code":"quotaExceeded","message":"The quota for files without expiry is reached. The maximum is 3."}}"#
    );
    // The v1 surface shares the resource's quota; OpenAI does not.
    assert_eq!(t.azure_v1().upload_with("{}\n", &[]).await.status, StatusCode::BAD_REQUEST);
    assert_eq!(t.openai().upload_with("{}\n", &[]).await.status, StatusCode::OK);

    // Files with an expiry count separately.
    azure.upload("{}\n").await;
    azure.upload("{}\n").await;
    let r = azure
        .upload_with(
            "{}\n",
            &[("expires_after[anchor]", "created_at"), ("expires_after[seconds]", "1209600")],
        )
        .await;
    assert_eq!(
        r.body,
        json!({"error": {"code": "quotaExceeded", "message": "The quota for files with expiry is reached. The maximum is 2."}})
    );

    // Deleting a file frees a slot; output files do not count.
    assert_eq!(azure.delete(&format!("/files/{}", ids[0])).await.status, StatusCode::OK);
    assert_eq!(
        azure.upload_with(&chat_file(1, DEPLOYMENT, "/v1/chat/completions"), &[]).await.status,
        StatusCode::OK
    );
    let stats = t.sim.stats();
    assert_eq!(stats.by_provider.azure.files_uploaded, 6);
    assert_eq!(stats.by_provider.azure.files_deleted, 1);
    assert_eq!(stats.by_provider.azure.files_live, 5);
}

#[tokio::test]
async fn expiry_is_accepted_only_between_14_and_30_days() {
    let t = TestSim::new(frozen()).await;
    let azure = t.azure_v1();
    for (form, seconds, ok) in [
        ("dotted", "1209600", true),
        ("bracket", "2592000", true),
        ("dotted", "1209599", false),
        ("bracket", "3600", false),
        ("dotted", "2592001", false),
    ] {
        let (anchor, secs) = if form == "dotted" {
            ("expires_after.anchor", "expires_after.seconds")
        } else {
            ("expires_after[anchor]", "expires_after[seconds]")
        };
        let r = azure.upload_with("{}\n", &[(anchor, "created_at"), (secs, seconds)]).await;
        if ok {
            assert_eq!(r.status, StatusCode::OK, "{}", r.text);
            let n: i64 = seconds.parse().unwrap();
            assert_eq!(
                r.body["expires_at"].as_i64().unwrap(),
                r.body["created_at"].as_i64().unwrap() + n
            );
        } else {
            let err = azure_error(&r, 400);
            assert_eq!(err["param"], "expires_after.seconds");
        }
    }
    // Batch output expiry has the same range.
    let file = azure.upload(&chat_file(1, DEPLOYMENT, "/v1/chat/completions")).await;
    let r = azure
        .post("/batches", &json!({"input_file_id": file, "endpoint": "/chat/completions", "completion_window": "24h",
            "output_expires_after": {"anchor": "created_at", "seconds": 3600}}))
        .await;
    assert_eq!(azure_error(&r, 400)["param"], "output_expires_after.seconds");
    let r = azure
        .post("/batches", &json!({"input_file_id": file, "endpoint": "/chat/completions", "completion_window": "24h",
            "output_expires_after": {"anchor": "created_at", "seconds": 1209600}}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    t.sim.advance(60.0);
    let b = azure.batch(r.body["id"].as_str().unwrap()).await;
    let out = azure.get(&format!("/files/{}", b["output_file_id"].as_str().unwrap())).await.body;
    assert_eq!(
        out["expires_at"].as_i64().unwrap(),
        out["created_at"].as_i64().unwrap() + 1_209_600
    );
    // The input file expires and disappears.
    t.sim.advance(1_209_600.0);
    assert_eq!(azure.get(&format!("/files/{file}")).await.status, StatusCode::NOT_FOUND);
}

async fn failed_errors(t: &TestSim, content: &str, endpoint: &str) -> Vec<Value> {
    let azure = t.azure_legacy();
    let file = azure.upload(content).await;
    let b = azure.create(&file, endpoint).await;
    t.sim.advance(10.0);
    let b = azure.batch(b["id"].as_str().unwrap()).await;
    assert_eq!(b["status"], "failed", "{b}");
    b["errors"]["data"].as_array().unwrap().clone()
}

#[tokio::test]
async fn validation_errors_follow_azure_codes() {
    let mut config = frozen();
    config.azure.deployments = vec![DEPLOYMENT.to_owned(), "other".to_owned()];
    config.azure.max_requests_per_batch = 3;
    let t = TestSim::new(config).await;
    let url = "/v1/chat/completions";
    let mismatch =
        [chat_line("a", DEPLOYMENT, url, "x"), chat_line("b", "other", url, "y")].join("\n");
    let e = failed_errors(&t, &mismatch, "/chat/completions").await;
    assert_eq!(e[0]["code"], "model_mismatch");
    assert_eq!(e[0]["line"], 2);
    let e = failed_errors(&t, &chat_line("a", "gpt-4o", url, "x"), "/chat/completions").await;
    assert_eq!(e[0]["code"], "model_not_found");
    let e =
        failed_errors(&t, &chat_line("a", DEPLOYMENT, "/v1/responses", "x"), "/chat/completions")
            .await;
    assert_eq!(e[0]["code"], "url_mismatch");
    let dup =
        [chat_line("a", DEPLOYMENT, url, "x"), chat_line("a", DEPLOYMENT, url, "y")].join("\n");
    assert_eq!(
        failed_errors(&t, &dup, "/chat/completions").await[0]["code"],
        "duplicate_custom_id"
    );
    assert_eq!(
        failed_errors(&t, "{oops\n", "/chat/completions").await[0]["code"],
        "invalid_json_line"
    );
    assert_eq!(failed_errors(&t, "\n", "/chat/completions").await[0]["code"], "empty_file");
    let e = failed_errors(&t, &chat_file(4, DEPLOYMENT, url), "/chat/completions").await;
    assert_eq!(e[0]["code"], "too_many_tasks");
    let e = failed_errors(
        &t,
        &format!("\u{feff}{}", chat_line("a", DEPLOYMENT, url, "x")),
        "/chat/completions",
    )
    .await;
    assert!(
        e[0]["message"]
            .as_str()
            .unwrap()
            .starts_with("Validation failed: A valid model deployment name")
    );
    for entry in &e {
        let keys: Vec<&String> = entry.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["code", "line", "message", "param"]);
    }
    // Not 24h: the job fails (the call does not).
    let azure = t.azure_legacy();
    let file = azure.upload(&chat_file(1, DEPLOYMENT, url)).await;
    let r = azure.post("/batches", &json!({"input_file_id": file, "endpoint": "/chat/completions", "completion_window": "48h"})).await;
    assert_eq!(r.status, StatusCode::OK);
    t.sim.advance(10.0);
    let b = azure.batch(r.body["id"].as_str().unwrap()).await;
    assert_eq!(b["status"], "failed");
    assert_eq!(b["errors"]["data"][0]["param"], "completion_window");
    // Embeddings are not supported in Azure batch.
    let r = azure.post("/batches", &json!({"input_file_id": file, "endpoint": "/v1/embeddings", "completion_window": "24h"})).await;
    assert_eq!(azure_error(&r, 400)["param"], "endpoint");
    let r = azure.post("/batches", &json!({"input_file_id": "file-nope", "endpoint": "/chat/completions", "completion_window": "24h"})).await;
    assert_eq!(azure_error(&r, 400)["param"], "input_file_id");
    let r = azure.get("/batches/batch_nope").await;
    assert_eq!(azure_error(&r, 404)["code"], "NotFound");
    let r = TestSim::send(
        t.client.get(t.url("/openai/deployments/x/chat/completions")).header("api-key", KEY),
    )
    .await;
    assert_eq!(r.body, json!({"error": {"code": "404", "message": "Resource not found"}}));
}

#[tokio::test]
async fn a_hundred_thousand_lines_is_the_default_limit() {
    assert_eq!(SimConfig::default().azure.max_requests_per_batch, 100_000);
    assert_eq!(SimConfig::default().openai.max_requests_per_batch, 50_000);
    let mut config = frozen();
    config.azure.max_requests_per_batch = 5;
    let t = TestSim::new(config).await;
    let e =
        failed_errors(&t, &chat_file(6, DEPLOYMENT, "/v1/chat/completions"), "/chat/completions")
            .await;
    assert_eq!(e[0]["code"], "too_many_tasks");
}

#[tokio::test]
async fn batches_do_not_expire_unless_configured() {
    for expire in [false, true] {
        let mut config = paced(0.001);
        config.azure.expire_batches = expire;
        let t = TestSim::new(config).await;
        let azure = t.azure_v1();
        let file = azure.upload(&chat_file(200, DEPLOYMENT, "/v1/chat/completions")).await;
        let b = azure.create(&file, "/chat/completions").await;
        t.sim.advance(86_400.0 + 10.0);
        let b = azure.batch(b["id"].as_str().unwrap()).await;
        if expire {
            assert_eq!(b["status"], "expired");
            let err = jsonl(&azure.content(b["error_file_id"].as_str().unwrap()).await);
            assert!(err.iter().all(|l| l["error"]["code"] == "batch_expired"));
        } else {
            assert_eq!(b["status"], "in_progress", "Azure keeps running past 24 h");
            assert_eq!(b["expired_at"], Value::Null);
        }
    }
}

#[tokio::test]
async fn enqueued_token_limits_fail_the_batch_or_the_call() {
    for fail_fast in [false, true] {
        // Exactly one file's prompt tokens by the counting convention (o200k for gpt-4o).
        let tokens = |s: &str| tiktoken_rs::o200k_base_singleton().encode_ordinary(s).len() as u64;
        let limit: u64 =
            (0..5).map(|i| 3 + 3 + tokens("user") + tokens(&format!("Question {i}"))).sum();
        let mut config = paced(0.001);
        config.azure.enqueued_token_limits.insert(DEPLOYMENT.to_owned(), limit);
        config.azure.token_limit_fail_fast = fail_fast;
        let t = TestSim::new(config).await;
        let azure = t.azure_legacy();
        let file = azure.upload(&chat_file(5, DEPLOYMENT, "/v1/chat/completions")).await;
        // The first fits; a second one would pass the limit while the first runs.
        let first = azure.create(&file, "/chat/completions").await;
        let r = azure
            .post("/batches", &json!({"input_file_id": file, "endpoint": "/chat/completions", "completion_window": "24h"}))
            .await;
        let message_start = format!(
            "The number of enqueued tokens has surpassed the configured limit of {limit} for the deployment 'gpt-4o-mini-batch'."
        );
        if fail_fast {
            let err = azure_error(&r, 400);
            assert_eq!(err["code"], "token_limit_exceeded");
            assert!(err["message"].as_str().unwrap().starts_with(&message_start));
        } else {
            assert_eq!(r.status, StatusCode::OK);
            t.sim.advance(5.0);
            let b = azure.batch(r.body["id"].as_str().unwrap()).await;
            assert_eq!(b["status"], "failed");
            assert_eq!(b["errors"]["data"][0]["code"], "token_limit_exceeded");
            assert!(
                b["errors"]["data"][0]["message"].as_str().unwrap().starts_with(&message_start)
            );
        }
        // Once the first batch is cancelled its tokens are released.
        azure
            .post(&format!("/batches/{}/cancel", first["id"].as_str().unwrap()), &Value::Null)
            .await;
        t.sim.advance(60.0);
        let again = azure.create(&file, "/chat/completions").await;
        t.sim.advance(5.0);
        assert_eq!(azure.batch(again["id"].as_str().unwrap()).await["status"], "in_progress");
    }
}

#[tokio::test]
async fn legacy_quirks_reproduce_the_rest_examples() {
    let mut config = frozen();
    config.azure.legacy_quirks = true;
    let t = TestSim::new(config).await;
    let legacy = t.azure_legacy();
    let file = legacy.upload(&chat_file(2, DEPLOYMENT, "/v1/chat/completions")).await;
    let b = legacy.create(&file, "/chat/completions").await;
    assert_eq!(b["status"], "Validating");
    assert_eq!(b["request_counts"], json!({"total": null, "completed": null, "failed": null}));
    let created = b["created_at"].as_str().unwrap();
    assert!(
        created.ends_with("+00:00") && created.len() == "2024-07-19T17:13:57.2491382+00:00".len(),
        "{created}"
    );
    assert!(b["expires_at"].is_string());
    let id = b["id"].as_str().unwrap().to_owned();
    t.sim.advance(60.0);
    let done = legacy.batch(&id).await;
    assert_eq!(done["status"], "Completed");
    assert!(done["completed_at"].is_string());
    for line in jsonl(&legacy.content(done["output_file_id"].as_str().unwrap()).await) {
        assert!(line.get("id").is_none(), "{line}");
        assert_eq!(line["response"]["status_code"], 200);
    }
    // The v1 surface keeps the modern shapes for the same batch.
    let v1 = t.azure_v1().batch(&id).await;
    assert_eq!(v1["status"], "completed");
    assert!(v1["created_at"].is_i64());
}

#[tokio::test]
async fn list_and_cancel_on_azure() {
    let t = TestSim::new(paced(1.0)).await;
    let azure = t.azure_legacy();
    let file = azure.upload(&chat_file(5, DEPLOYMENT, "/v1/chat/completions")).await;
    let ids: Vec<String> = futures_ids(&azure, &file, 3).await;
    let r = azure.get("/batches?limit=2").await;
    assert_eq!(r.body["has_more"], true);
    assert_eq!(r.body["data"][0]["id"], ids[2].as_str());
    let r = azure.get(&format!("/batches?limit=2&after={}", ids[1])).await;
    assert_eq!(r.body["data"].as_array().unwrap().len(), 1);
    assert_eq!(r.body["has_more"], false);
    t.sim.advance(4.0);
    let c = azure.post(&format!("/batches/{}/cancel", ids[0]), &Value::Null).await;
    assert_eq!(c.body["status"], "cancelling");
    t.sim.advance(10.0);
    let b = azure.batch(&ids[0]).await;
    assert_eq!(b["status"], "cancelled");
    let err = jsonl(&azure.content(b["error_file_id"].as_str().unwrap()).await);
    let out = jsonl(&azure.content(b["output_file_id"].as_str().unwrap()).await);
    assert_eq!(out.len() + err.len(), 5);
    assert!(!out.is_empty() && !err.is_empty());
    let r = azure.post(&format!("/batches/{}/cancel", ids[0]), &Value::Null).await;
    assert_eq!(azure_error(&r, 409)["code"], "Conflict");
}

async fn futures_ids(azure: &crate::helpers::Oai<'_>, file: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..n {
        ids.push(azure.create(file, "/chat/completions").await["id"].as_str().unwrap().to_owned());
    }
    ids
}
