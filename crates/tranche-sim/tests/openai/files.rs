//! Files: upload forms and expiry, list pagination, retrieve, content, delete, auth.

use reqwest::StatusCode;
use serde_json::Value;
use tranche_sim::SimConfig;

use crate::helpers::{KEY, TestSim, assert_error_shape, chat_file, frozen};

#[tokio::test]
async fn upload_with_sdk_and_curl_expiry_forms() {
    let t = TestSim::new(frozen()).await;
    let content = chat_file(3);

    let (status, sdk) = t
        .upload_with(
            &content,
            "batch",
            &[("expires_after[anchor]", "created_at"), ("expires_after[seconds]", "3600")],
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{sdk}");
    assert!(sdk["id"].as_str().unwrap().starts_with("file-"));
    assert_eq!(sdk["object"], "file");
    assert_eq!(sdk["bytes"], content.len());
    assert_eq!(sdk["filename"], "input.jsonl");
    assert_eq!(sdk["purpose"], "batch");
    assert_eq!(sdk["status"], "processed");
    assert_eq!(sdk["status_details"], Value::Null);
    assert_eq!(sdk["created_at"], t.sim.now());
    assert_eq!(sdk["expires_at"].as_i64().unwrap(), sdk["created_at"].as_i64().unwrap() + 3600);

    let (status, curl) = t
        .upload_with(
            &content,
            "batch",
            &[("expires_after.anchor", "created_at"), ("expires_after.seconds", "1209600")],
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{curl}");
    assert_eq!(
        curl["expires_at"].as_i64().unwrap(),
        curl["created_at"].as_i64().unwrap() + 1_209_600
    );

    // Defaults: 30 days for purpose batch, none for anything else.
    let (_, default_batch) = t.upload_with(&content, "batch", &[]).await;
    assert_eq!(
        default_batch["expires_at"].as_i64().unwrap(),
        default_batch["created_at"].as_i64().unwrap() + 2_592_000
    );
    let (_, user_data) = t.upload_with("hello", "user_data", &[]).await;
    assert_eq!(user_data["expires_at"], Value::Null);
}

#[tokio::test]
async fn bad_upload_fields_are_400_in_openai_shape() {
    let t = TestSim::new(frozen()).await;
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case<'_>; 5] = [
        (
            "batch",
            &[("expires_after[anchor]", "created_at"), ("expires_after[seconds]", "60")],
            "expires_after.seconds",
        ),
        (
            "batch",
            &[("expires_after[anchor]", "created_at"), ("expires_after[seconds]", "2592001")],
            "expires_after.seconds",
        ),
        (
            "batch",
            &[("expires_after.anchor", "last_active_at"), ("expires_after.seconds", "3600")],
            "expires_after.anchor",
        ),
        ("batch", &[("expires_after[anchor]", "created_at")], "expires_after.seconds"),
        ("batch_output", &[], "purpose"),
    ];
    for (purpose, extra, param) in cases {
        let (status, body) = t.upload_with("x", purpose, extra).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        let err = assert_error_shape(&body);
        assert_eq!(err["type"], "invalid_request_error");
        assert_eq!(err["param"], param, "{body}");
    }
    let res = t
        .client
        .post(format!("{}/files", t.base))
        .bearer_auth(KEY)
        .multipart(
            reqwest::multipart::Form::new()
                .text("purpose", "batch")
                .part("file", reqwest::multipart::Part::bytes(b"{}".to_vec()).file_name("in.json")),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    let body: Value = res.json().await.unwrap();
    assert_eq!(
        assert_error_shape(&body)["message"],
        "Invalid file format for Batch API. Must be .jsonl"
    );
    let (status, body) = t.upload_with("x", "batch", &[("unexpected", "1")]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(assert_error_shape(&body)["message"].as_str().unwrap().contains("unexpected"));
    assert_eq!(t.sim.stats().files_uploaded, 0);
    // Raw bytes without a name's extension (the SDKs call them `upload`) are taken, as the real
    // API takes them.
    let res =
        t.client
            .post(format!("{}/files", t.base))
            .bearer_auth(KEY)
            .multipart(reqwest::multipart::Form::new().text("purpose", "batch").part(
                "file",
                reqwest::multipart::Part::bytes(b"{}\n".to_vec()).file_name("upload"),
            ))
            .send()
            .await
            .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.json::<Value>().await.unwrap()["filename"], "upload");
}

#[tokio::test]
async fn oversized_upload_is_rejected() {
    let t = TestSim::new(SimConfig { max_file_bytes: 100, ..frozen() }).await;
    let (status, body) = t.upload_with(&"x".repeat(101), "batch", &[]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let err = assert_error_shape(&body);
    assert_eq!(err["message"], "File is too large.");
    assert_eq!(err["code"], Value::Null);
    let (status, _) = t.upload_with(&"x".repeat(100), "batch", &[]).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn list_files_paginates_filters_and_orders() {
    let t = TestSim::new(frozen()).await;
    let mut uploaded = Vec::new();
    for i in 0..5 {
        uploaded.push(t.upload(&format!("{i}")).await);
    }
    let (_, other) = t.upload_with("v", "vision", &[]).await;

    let (status, page1) = t.get("/files?purpose=batch&limit=2").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page1["object"], "list");
    let ids = |page: &Value| -> Vec<String> {
        page["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(ids(&page1), [uploaded[4].clone(), uploaded[3].clone()]);
    assert_eq!(page1["first_id"], uploaded[4].as_str());
    assert_eq!(page1["last_id"], uploaded[3].as_str());
    assert_eq!(page1["has_more"], true);

    let (_, page2) = t.get(&format!("/files?purpose=batch&limit=2&after={}", uploaded[3])).await;
    assert_eq!(ids(&page2), [uploaded[2].clone(), uploaded[1].clone()]);
    let (_, page3) = t.get(&format!("/files?purpose=batch&limit=2&after={}", uploaded[1])).await;
    assert_eq!(ids(&page3), [uploaded[0].clone()]);
    assert_eq!(page3["has_more"], false);

    let (_, asc) = t.get("/files?order=asc").await;
    let all = ids(&asc);
    assert_eq!(all.len(), 6);
    assert_eq!(all[0], uploaded[0]);
    assert_eq!(all[5], other["id"].as_str().unwrap());

    let (_, empty) = t.get("/files?purpose=fine-tune").await;
    assert_eq!(empty["data"], Value::Array(vec![]));
    assert_eq!(empty["first_id"], Value::Null);
    assert_eq!(empty["has_more"], false);

    for bad in ["/files?limit=0", "/files?limit=10001", "/files?order=sideways"] {
        let (status, body) = t.get(bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
        assert_error_shape(&body);
    }
}

#[tokio::test]
async fn retrieve_content_and_delete() {
    let t = TestSim::new(frozen()).await;
    let content = chat_file(2);
    let id = t.upload(&content).await;

    let (status, meta) = t.get(&format!("/files/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(meta["id"], id.as_str());
    assert_eq!(t.content(&id).await, content);

    let (status, deleted) = t.delete(&format!("/files/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(deleted, serde_json::json!({"id": id, "object": "file", "deleted": true}));

    for path in [format!("/files/{id}"), format!("/files/{id}/content")] {
        let (status, body) = t.get(&path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
        assert_error_shape(&body);
    }
    let (status, _) = t.delete(&format!("/files/{id}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = t.get("/files/file-doesnotexist").await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let stats = t.sim.stats();
    assert_eq!((stats.files_uploaded, stats.files_deleted, stats.files_live), (1, 1, 0));
}

#[tokio::test]
async fn large_content_streams_back_intact() {
    let t = TestSim::new(frozen()).await;
    let content: String = (0..40_000).map(|i| format!("line {i}\n")).collect();
    assert!(content.len() > 200_000);
    let id = t.upload(&content).await;
    assert_eq!(t.content(&id).await, content);
}

#[tokio::test]
async fn expired_files_are_gone() {
    let t = TestSim::new(frozen()).await;
    let (_, short) = t
        .upload_with(
            "x",
            "batch",
            &[("expires_after[anchor]", "created_at"), ("expires_after[seconds]", "3600")],
        )
        .await;
    let id = short["id"].as_str().unwrap();
    t.sim.advance(3599.0);
    assert_eq!(t.get(&format!("/files/{id}")).await.0, StatusCode::OK);
    t.sim.advance(1.0);
    assert_eq!(t.get(&format!("/files/{id}")).await.0, StatusCode::NOT_FOUND);
    assert_eq!(t.get(&format!("/files/{id}/content")).await.0, StatusCode::NOT_FOUND);
    let (_, list) = t.get("/files").await;
    assert_eq!(list["data"], Value::Array(vec![]));
    assert_eq!(t.sim.stats().files_live, 0);
}

#[tokio::test]
async fn auth_is_required_and_checked() {
    let t = TestSim::new(frozen()).await;
    let url = format!("{}/files", t.base);

    let res = t.client.get(&url).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let body: Value = res.json().await.unwrap();
    assert_error_shape(&body);

    let res = t.client.get(&url).bearer_auth("sk-wrong").send().await.unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let body: Value = res.json().await.unwrap();
    let err = assert_error_shape(&body);
    assert_eq!(err["code"], "invalid_api_key");
    assert!(!body.to_string().contains("sk-wrong"), "the key must not be echoed");

    let res = t.client.get(&url).bearer_auth(KEY).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.headers().get("x-request-id").is_some());

    // Without a configured key any non-empty bearer token works, but none still does not.
    let open = tranche_sim::Simulator::spawn(frozen()).await.unwrap();
    let url = format!("{}/files", open.openai_base_url());
    let res = t.client.get(&url).bearer_auth("anything").send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let res = t.client.get(&url).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let res = t.client.get(&url).header("authorization", "Bearer ").send().await.unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn unknown_paths_answer_in_openai_shape() {
    let t = TestSim::new(frozen()).await;
    let (status, body) = t.get("/nothing/here").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let err = assert_error_shape(&body);
    assert_eq!(err["message"], "Invalid URL (GET /v1/nothing/here)");
    let (status, body) = t.delete("/batches").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_error_shape(&body);
}
