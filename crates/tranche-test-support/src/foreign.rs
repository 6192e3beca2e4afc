//! What another application sharing a provider account does there: files and batches that
//! tranche did not make, sent as plain HTTP.

use reqwest::multipart::{Form, Part};
use serde_json::{Value, json};

/// Another application's client of one of the simulator's OpenAI-shaped surfaces.
#[derive(Debug, Clone)]
pub struct Foreign {
    base: String,
    endpoint: &'static str,
    client: reqwest::Client,
}

impl Foreign {
    /// On the OpenAI surface at `base_url` (`http://127.0.0.1:PORT/v1`).
    pub fn openai(base_url: &str) -> Self {
        Self { base: base_url.to_owned(), endpoint: "/v1/chat/completions", client: client() }
    }

    /// On Azure's v1 surface of the resource at `endpoint`.
    pub fn azure(endpoint: &str) -> Self {
        let base = format!("{}/openai/v1", endpoint.trim_end_matches('/'));
        Self { base, endpoint: "/chat/completions", client: client() }
    }

    /// Uploads a one-request batch file named `name`; returns its id.
    pub async fn upload(&self, name: &str, expires_after: Option<u64>) -> String {
        let line = json!({
            "custom_id": "foreign-1",
            "method": "POST",
            "url": self.endpoint,
            "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]},
        });
        let part = Part::bytes(format!("{line}\n").into_bytes()).file_name(name.to_owned());
        let mut form = Form::new().text("purpose", "batch");
        if let Some(seconds) = expires_after {
            form = form
                .text("expires_after[anchor]", "created_at")
                .text("expires_after[seconds]", seconds.to_string());
        }
        let response = self
            .client
            .post(format!("{}/files", self.base))
            .bearer_auth("sk-foreign")
            .multipart(form.part("file", part))
            .send()
            .await
            .unwrap();
        let status = response.status();
        let body: Value = response.json().await.unwrap();
        assert!(status.is_success(), "upload {name}: {status} {body}");
        body["id"].as_str().unwrap().to_owned()
    }

    /// Creates a batch from `file_id` without tranche's metadata; its id, or the status the
    /// provider refused it with.
    pub async fn create_batch(&self, file_id: &str) -> Result<String, u16> {
        let body = json!({"input_file_id": file_id, "endpoint": self.endpoint, "completion_window": "24h"});
        let response = self
            .client
            .post(format!("{}/batches", self.base))
            .bearer_auth("sk-foreign")
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status();
        let body: Value = response.json().await.unwrap();
        if status.is_success() {
            Ok(body["id"].as_str().unwrap().to_owned())
        } else {
            Err(status.as_u16())
        }
    }

    /// Whether the provider still has the file.
    pub async fn has_file(&self, file_id: &str) -> bool {
        let response = self
            .client
            .get(format!("{}/files/{file_id}", self.base))
            .bearer_auth("sk-foreign")
            .send()
            .await
            .unwrap();
        response.status().is_success()
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::new()
}
