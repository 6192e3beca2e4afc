//! A scripted HTTP server: answers each request with the next canned reply and records what it
//! was sent (method, target, headers, body), for tests of exact wire behaviour and retries.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};

/// One canned answer: status, extra headers, body (sent as `application/json`).
pub type Reply = (u16, Vec<(&'static str, String)>, String);

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    /// Path and query, as sent.
    pub target: String,
    /// Lower-cased header names with their values.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// `METHOD target`.
    pub fn line(&self) -> String {
        format!("{} {}", self.method, self.target)
    }
}

#[derive(Debug, Default)]
struct Script {
    replies: VecDeque<Reply>,
    seen: Vec<Seen>,
}

/// A running scripted server; it stops with the test's runtime.
#[derive(Debug, Clone)]
pub struct Scripted {
    /// `http://127.0.0.1:PORT`, no path.
    pub base_url: String,
    script: Arc<Mutex<Script>>,
}

impl Scripted {
    /// Serves `replies` in order on a free loopback port; a request beyond them gets a 500
    /// that names the script as exhausted.
    pub async fn start(replies: Vec<Reply>) -> Self {
        let script = Arc::new(Mutex::new(Script { replies: replies.into(), seen: Vec::new() }));
        let app = Router::new().fallback(answer).with_state(Arc::clone(&script));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { base_url: format!("http://{addr}"), script }
    }

    /// Every request so far, in arrival order.
    pub fn seen(&self) -> Vec<Seen> {
        self.script.lock().unwrap().seen.clone()
    }

    /// Every request so far as `METHOD target`.
    pub fn lines(&self) -> Vec<String> {
        self.seen().iter().map(Seen::line).collect()
    }
}

async fn answer(
    State(script): State<Arc<Mutex<Script>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let seen = Seen {
        method: method.to_string(),
        target: uri.path_and_query().map(ToString::to_string).unwrap_or_default(),
        headers: headers
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into()))
            .collect(),
        body: body.to_vec(),
    };
    let reply = {
        let mut script = script.lock().unwrap();
        script.seen.push(seen);
        script.replies.pop_front()
    };
    let Some((status, extra, body)) = reply else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "the script has no more replies")
            .into_response();
    };
    let mut response = (StatusCode::from_u16(status).unwrap(), body).into_response();
    let headers = response.headers_mut();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    for (name, value) in extra {
        headers.insert(HeaderName::from_static(name), HeaderValue::from_str(&value).unwrap());
    }
    response
}
