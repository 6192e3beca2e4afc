//! A spawned simulator with typed clients for each surface.

use reqwest::header::HeaderMap;
use reqwest::multipart::{Form, Part};
use reqwest::{RequestBuilder, StatusCode};
use serde_json::{Value, json};
use tranche_sim::{SimConfig, SimHandle, Simulator};

pub const KEY: &str = "sk-test";
pub const DEPLOYMENT: &str = "gpt-4o-mini-batch";
pub const LEGACY_VERSION: &str = "2024-10-21";

/// A frozen clock (speed 0), default pace, no faults.
pub fn frozen() -> SimConfig {
    SimConfig { speed: 0.0, ..SimConfig::default() }
}

/// A frozen clock running `rps` lines per virtual second.
pub fn paced(rps: f64) -> SimConfig {
    let mut config = frozen();
    config.processing.requests_per_second = rps;
    config
}

/// One HTTP answer.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Value,
    pub text: String,
}

pub struct TestSim {
    pub sim: SimHandle,
    pub client: reqwest::Client,
}

impl TestSim {
    pub async fn new(mut config: SimConfig) -> Self {
        if config.api_key.is_none() {
            config.api_key = Some(KEY.to_owned());
        }
        let sim = Simulator::spawn(config).await.unwrap();
        Self { sim, client: reqwest::Client::new() }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.sim.base_url())
    }

    pub async fn send(req: RequestBuilder) -> Reply {
        let res = req.send().await.unwrap();
        let status = res.status();
        let headers = res.headers().clone();
        let text = res.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        Reply { status, headers, body, text }
    }

    pub fn openai(&self) -> Oai<'_> {
        Oai { t: self, prefix: "/v1", version: None, auth: Auth::Bearer }
    }

    /// The dated Azure surface, authenticated with the `api-key` header.
    pub fn azure_legacy(&self) -> Oai<'_> {
        Oai { t: self, prefix: "/openai", version: Some(LEGACY_VERSION), auth: Auth::ApiKey }
    }

    /// The Azure v1 surface, authenticated with a bearer token.
    pub fn azure_v1(&self) -> Oai<'_> {
        Oai { t: self, prefix: "/openai/v1", version: None, auth: Auth::Bearer }
    }

    pub fn anthropic(&self) -> Ant<'_> {
        Ant { t: self }
    }
}

#[derive(Clone, Copy)]
pub enum Auth {
    Bearer,
    ApiKey,
}

/// A client of one OpenAI-shaped surface.
pub struct Oai<'a> {
    pub t: &'a TestSim,
    pub prefix: &'static str,
    pub version: Option<&'static str>,
    pub auth: Auth,
}

impl Oai<'_> {
    pub fn url(&self, path: &str) -> String {
        let base = self.t.url(&format!("{}{path}", self.prefix));
        match self.version {
            Some(v) if base.contains('?') => format!("{base}&api-version={v}"),
            Some(v) => format!("{base}?api-version={v}"),
            None => base,
        }
    }

    fn authed(&self, req: RequestBuilder) -> RequestBuilder {
        match self.auth {
            Auth::Bearer => req.bearer_auth(KEY),
            Auth::ApiKey => req.header("api-key", KEY),
        }
    }

    pub async fn get(&self, path: &str) -> Reply {
        TestSim::send(self.authed(self.t.client.get(self.url(path)))).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Reply {
        TestSim::send(self.authed(self.t.client.post(self.url(path)).json(body))).await
    }

    pub async fn delete(&self, path: &str) -> Reply {
        TestSim::send(self.authed(self.t.client.delete(self.url(path)))).await
    }

    pub async fn upload_with(&self, content: &str, extra: &[(&str, &str)]) -> Reply {
        let mut form = Form::new()
            .text("purpose", "batch")
            .part("file", Part::bytes(content.as_bytes().to_vec()).file_name("input.jsonl"));
        for (k, v) in extra {
            form = form.text((*k).to_owned(), (*v).to_owned());
        }
        TestSim::send(self.authed(self.t.client.post(self.url("/files")).multipart(form))).await
    }

    /// Uploads with Azure's smallest allowed expiry (14 days) and returns the file id.
    pub async fn upload(&self, content: &str) -> String {
        let r = self
            .upload_with(
                content,
                &[("expires_after.anchor", "created_at"), ("expires_after.seconds", "1209600")],
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        r.body["id"].as_str().unwrap().to_owned()
    }

    pub async fn create(&self, file_id: &str, endpoint: &str) -> Value {
        let r = self
            .post(
                "/batches",
                &json!({"input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h"}),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        r.body
    }

    pub async fn batch(&self, id: &str) -> Value {
        let r = self.get(&format!("/batches/{id}")).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        r.body
    }

    pub async fn content(&self, file_id: &str) -> String {
        let r = self.get(&format!("/files/{file_id}/content")).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        r.text
    }
}

/// The Anthropic surface with `x-api-key` and `anthropic-version`.
pub struct Ant<'a> {
    pub t: &'a TestSim,
}

impl Ant<'_> {
    pub fn headers(req: RequestBuilder) -> RequestBuilder {
        req.header("x-api-key", KEY).header("anthropic-version", "2023-06-01")
    }

    pub async fn get(&self, path: &str) -> Reply {
        TestSim::send(Self::headers(self.t.client.get(self.t.url(path)))).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Reply {
        TestSim::send(Self::headers(self.t.client.post(self.t.url(path)).json(body))).await
    }

    pub async fn delete(&self, path: &str) -> Reply {
        TestSim::send(Self::headers(self.t.client.delete(self.t.url(path)))).await
    }

    pub async fn create(&self, requests: Vec<Value>) -> Value {
        let r = self.post("/v1/messages/batches", &json!({"requests": requests})).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        r.body
    }

    pub async fn batch(&self, id: &str) -> Value {
        let r = self.get(&format!("/v1/messages/batches/{id}")).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        r.body
    }

    pub async fn results(&self, id: &str) -> Vec<Value> {
        let r = self.get(&format!("/v1/messages/batches/{id}/results")).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        jsonl(&r.text)
    }
}

pub fn message_request(custom_id: &str, text: &str) -> Value {
    json!({"custom_id": custom_id, "params": {
        "model": "claude-sonnet-4-5", "max_tokens": 128,
        "messages": [{"role": "user", "content": text}]}})
}

pub fn chat_line(custom_id: &str, model: &str, url: &str, text: &str) -> String {
    json!({
        "custom_id": custom_id,
        "method": "POST",
        "url": url,
        "body": {"model": model, "messages": [{"role": "user", "content": text}]},
    })
    .to_string()
}

/// `n` chat lines for `model` with custom_ids `c0..`.
pub fn chat_file(n: usize, model: &str, url: &str) -> String {
    (0..n)
        .map(|i| chat_line(&format!("c{i}"), model, url, &format!("Question {i}")))
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

/// Asserts Anthropic's error shape and the `request-id` header, and returns `error`.
pub fn anthropic_error<'a>(r: &'a Reply, status: u16, kind: &str) -> &'a Value {
    assert_eq!(r.status.as_u16(), status, "{}", r.text);
    let body = r.body.as_object().unwrap_or_else(|| panic!("not an object: {}", r.text));
    assert_eq!(body.len(), 3, "{}", r.text);
    assert_eq!(r.body["type"], "error");
    assert_eq!(r.body["error"]["type"], kind, "{}", r.text);
    assert!(r.body["error"]["message"].is_string());
    assert_eq!(r.body["error"].as_object().unwrap().len(), 2, "{}", r.text);
    let id = r.headers.get("request-id").unwrap().to_str().unwrap();
    assert_eq!(r.body["request_id"], id);
    assert!(id.starts_with("req_"));
    &r.body["error"]
}

/// Asserts Azure's error shape `{"error": {"code", "message"[, "param"]}}` and returns `error`.
pub fn azure_error(r: &Reply, status: u16) -> &Value {
    assert_eq!(r.status.as_u16(), status, "{}", r.text);
    let err = r.body["error"].as_object().unwrap_or_else(|| panic!("no error: {}", r.text));
    assert!(err.contains_key("code") && err.contains_key("message"), "{}", r.text);
    assert!(err.keys().all(|k| ["code", "message", "param"].contains(&k.as_str())), "{}", r.text);
    assert_eq!(r.body.as_object().unwrap().len(), 1);
    &r.body["error"]
}

/// Asserts OpenAI's error shape (all four keys) and returns `error`.
pub fn openai_error(r: &Reply, status: u16) -> &Value {
    assert_eq!(r.status.as_u16(), status, "{}", r.text);
    let err = r.body["error"].as_object().unwrap_or_else(|| panic!("no error: {}", r.text));
    for key in ["message", "type", "param", "code"] {
        assert!(err.contains_key(key), "error lacks {key}: {}", r.text);
    }
    &r.body["error"]
}
