//! A spawned simulator with a client and typed request helpers.

use reqwest::StatusCode;
use reqwest::multipart::{Form, Part};
use serde_json::{Value, json};
use tranche_sim::{ProcessingConfig, SimConfig, SimHandle, Simulator};

pub const KEY: &str = "sk-test";

pub struct TestSim {
    pub sim: SimHandle,
    pub client: reqwest::Client,
    pub base: String,
}

/// A frozen clock (speed 0), default pace, no faults.
pub fn frozen() -> SimConfig {
    SimConfig { speed: 0.0, ..SimConfig::default() }
}

/// A frozen clock running `rps` lines per virtual second, 2 s validating and finalizing.
pub fn paced(rps: f64) -> SimConfig {
    SimConfig {
        speed: 0.0,
        processing: ProcessingConfig {
            requests_per_second: rps,
            validating_seconds: 2.0,
            finalizing_seconds: 2.0,
        },
        ..SimConfig::default()
    }
}

pub fn chat_line(custom_id: &str, model: &str, text: &str) -> String {
    json!({
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "messages": [{"role": "user", "content": text}]},
    })
    .to_string()
}

pub fn ids(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("ticket:{i}:intent:v1")).collect()
}

/// A valid chat batch file of `n` lines with custom_ids from [`ids`].
pub fn chat_file(n: usize) -> String {
    ids(n)
        .iter()
        .map(|id| chat_line(id, "gpt-4o-mini", &format!("Classify {id}")))
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

pub fn jsonl(text: &str) -> Vec<Value> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Asserts the OpenAI error shape and returns the inner `error` object.
pub fn assert_error_shape(body: &Value) -> &Value {
    let err = &body["error"];
    let obj = err.as_object().unwrap_or_else(|| panic!("no error object in {body}"));
    for key in ["message", "type", "param", "code"] {
        assert!(obj.contains_key(key), "error lacks {key}: {body}");
    }
    assert!(err["message"].is_string());
    err
}

impl TestSim {
    pub async fn new(mut config: SimConfig) -> Self {
        if config.api_key.is_none() {
            config.api_key = Some(KEY.to_owned());
        }
        let sim = Simulator::spawn(config).await.unwrap();
        let base = sim.openai_base_url();
        Self { sim, client: reqwest::Client::new(), base }
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> (StatusCode, Value) {
        let res = req.bearer_auth(KEY).send().await.unwrap();
        let status = res.status();
        let text = res.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, body)
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.send(self.client.get(format!("{}{path}", self.base))).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        self.send(self.client.post(format!("{}{path}", self.base)).json(body)).await
    }

    pub async fn delete(&self, path: &str) -> (StatusCode, Value) {
        self.send(self.client.delete(format!("{}{path}", self.base))).await
    }

    /// Uploads `content` with extra form fields.
    pub async fn upload_with(
        &self,
        content: &str,
        purpose: &str,
        extra: &[(&str, &str)],
    ) -> (StatusCode, Value) {
        let mut form = Form::new()
            .text("purpose", purpose.to_owned())
            .part("file", Part::bytes(content.as_bytes().to_vec()).file_name("input.jsonl"));
        for (k, v) in extra {
            form = form.text((*k).to_owned(), (*v).to_owned());
        }
        self.send(self.client.post(format!("{}/files", self.base)).multipart(form)).await
    }

    /// Uploads a batch input file and returns its id.
    pub async fn upload(&self, content: &str) -> String {
        let (status, body) = self.upload_with(content, "batch", &[]).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body["id"].as_str().unwrap().to_owned()
    }

    pub async fn content(&self, file_id: &str) -> String {
        let res = self.content_response(file_id).await;
        assert_eq!(res.status(), StatusCode::OK);
        res.text().await.unwrap()
    }

    /// The answer to a file download, unread (to check headers or stream the body).
    pub async fn content_response(&self, file_id: &str) -> reqwest::Response {
        self.client
            .get(format!("{}/files/{file_id}/content", self.base))
            .bearer_auth(KEY)
            .send()
            .await
            .unwrap()
    }

    /// Uploads `content` and creates a chat-completions batch from it.
    pub async fn start(&self, content: &str) -> Value {
        let file_id = self.upload(content).await;
        let (status, batch) = self
            .post(
                "/batches",
                &json!({"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{batch}");
        batch
    }

    pub async fn batch(&self, id: &str) -> Value {
        let (status, body) = self.get(&format!("/batches/{id}")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body
    }

    /// Output and error lines of a finished batch (empty when the file id is null).
    pub async fn results(&self, batch: &Value) -> (Vec<Value>, Vec<Value>) {
        let mut out = Vec::new();
        let mut err = Vec::new();
        if let Some(id) = batch["output_file_id"].as_str() {
            out = jsonl(&self.content(id).await);
        }
        if let Some(id) = batch["error_file_id"].as_str() {
            err = jsonl(&self.content(id).await);
        }
        (out, err)
    }
}
