//! `tranche serve` through HTTP only, against `tranche sim`, with a fresh store: a job submitted
//! as JSON and as streamed NDJSON, followed to its end and its results downloaded matched; every
//! endpoint refuses another tenant's job as if it did not exist; errors keep tranche's envelope;
//! limits answer 413 and 429; SIGTERM stops the server cleanly; `/metrics` counts a finished
//! job, its requests, tokens and cost.

#![expect(clippy::unwrap_used, clippy::panic, reason = "a test fails loudly")]

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::{Env, Sim, text};

/// A tenant's bearer token: the last line `tranche tenants add` prints.
fn tenant(env: &Env, name: &str, extra: &[&str]) -> String {
    let out = env.tranche().args(["tenants", "add", name]).args(extra).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8(out.stdout).unwrap().lines().last().unwrap().trim().to_owned()
}

/// `tranche serve` on a free port, and its base URL.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    fn start(env: &Env, sim_openai: &str, extra: &[&str]) -> Self {
        let child = env
            .tranche()
            .args(["serve", "--addr", "127.0.0.1:0", "--base-url", sim_openai])
            .args(["--poll-interval", "0.1"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Self::listening(child)
    }

    /// The server `child` runs, once it says where it listens (its first line of output).
    fn listening(mut child: Child) -> Self {
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
        let url = first.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("{first}"));
        Self { child, url: url.to_owned() }
    }

    /// Sends SIGTERM and waits for a clean exit.
    fn stop(mut self) {
        let pid = self.child.id().to_string();
        let status = std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "serve exited {status}");
                return;
            }
            assert!(Instant::now() < deadline, "serve did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A GET with a tenant's token, its body as JSON.
async fn get_json(client: &reqwest::Client, url: &str, token: &str) -> Value {
    client.get(url).bearer_auth(token).send().await.unwrap().json().await.unwrap()
}

fn requests(n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| {
            json!({"key": format!("doc:{i}"), "body": {"model": "gpt-4o-mini",
                   "messages": [{"role": "user", "content": format!("doc:{i} says hello")}]}})
        })
        .collect()
}

async fn wait_done(client: &reqwest::Client, url: &str, token: &str, job: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status: Value = get_json(client, &format!("{url}/v1/jobs/{job}"), token).await;
        if status["state"] == "done" {
            return status;
        }
        assert!(Instant::now() < deadline, "the job did not finish: {status}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_submits_follows_and_downloads_only_its_own_jobs() {
    let sim = Sim::start(&[]);
    let env = Env::new();
    let acme = tenant(&env, "acme", &[]);
    let other = tenant(&env, "other", &[]);
    let admin = tenant(&env, "ops", &["--admin"]);
    let server = Server::start(&env, &sim.openai, &["--max-body-bytes", "200000"]);
    let url = server.url.clone();
    let client = reqwest::Client::new();

    // The served OpenAPI document is the one the code generates.
    let served: Value =
        client.get(format!("{url}/openapi.json")).send().await.unwrap().json().await.unwrap();
    assert_eq!(served, serde_json::to_value(tranche_server::openapi()).unwrap());
    assert!(served["paths"]["/v1/jobs"]["post"].is_object(), "{served}");
    // Liveness needs no token; /v1 does.
    assert_eq!(client.get(format!("{url}/healthz")).send().await.unwrap().status(), 200);
    assert_eq!(client.get(format!("{url}/readyz")).send().await.unwrap().status(), 200);
    let anonymous = client.get(format!("{url}/v1/jobs")).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);
    let body: Value = anonymous.json().await.unwrap();
    assert_eq!(body["error"]["type"], "authentication");
    let forged = client.get(format!("{url}/v1/jobs")).bearer_auth("trn_forged").send().await;
    assert_eq!(forged.unwrap().status(), 401);

    // A JSON submission: 202 once committed, then followed to its end.
    let job = json!({"settings": {"task": "greet"}, "requests": requests(20)});
    let response =
        client.post(format!("{url}/v1/jobs")).bearer_auth(&acme).json(&job).send().await.unwrap();
    assert_eq!(response.status(), 202);
    let accepted: Value = response.json().await.unwrap();
    assert_eq!(accepted["accepted"], 20);
    let id = accepted["job_id"].as_str().unwrap().to_owned();
    let status = wait_done(&client, &url, &acme, &id).await;
    assert_eq!(status["counts"]["succeeded"], 20, "{status}");
    assert_eq!(status["tenant"], "acme");

    // Results: one line per request, each its own answer, as NDJSON.
    let response =
        client.get(format!("{url}/v1/jobs/{id}/results")).bearer_auth(&acme).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/x-ndjson");
    let body = response.text().await.unwrap();
    let lines: Vec<Value> = body.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 20);
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["custom_id"], format!("acme::doc:{i}:greet:v1"));
        let answer = line["output"]["choices"][0]["message"]["content"].as_str().unwrap();
        assert!(answer.contains(&format!("doc:{i} says hello")), "{line}");
    }
    let failed = client
        .get(format!("{url}/v1/jobs/{id}/results?status=failed"))
        .bearer_auth(&acme)
        .send()
        .await
        .unwrap();
    assert_eq!(failed.text().await.unwrap(), "", "no failed request");
    let cost: Value = get_json(&client, &format!("{url}/v1/jobs/{id}/cost"), &acme).await;
    assert_eq!(cost["job_id"], id.as_str());
    assert!(cost["cost"].as_f64().unwrap() > 0.0, "{cost}");

    // Another tenant sees nothing of it, anywhere; an admin sees it.
    for (method, path) in [
        ("GET", format!("/v1/jobs/{id}")),
        ("GET", format!("/v1/jobs/{id}/results")),
        ("GET", format!("/v1/jobs/{id}/cost")),
        ("POST", format!("/v1/jobs/{id}/cancel")),
    ] {
        let request = match method {
            "GET" => client.get(format!("{url}{path}")),
            _ => client.post(format!("{url}{path}")),
        };
        let response = request.bearer_auth(&other).send().await.unwrap();
        assert_eq!(response.status(), 404, "{method} {path}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], "not_found", "{method} {path}");
    }
    let listed: Value = get_json(&client, &format!("{url}/v1/jobs"), &other).await;
    assert_eq!(listed["jobs"], json!([]), "{listed}");
    let shown = client.get(format!("{url}/v1/jobs/{id}")).bearer_auth(&admin).send().await;
    assert_eq!(shown.unwrap().status(), 200, "an admin sees every tenant's jobs");
    // The provider files audit is an admin's: its accounts as `files audit --json` shows them.
    let audit = client.get(format!("{url}/v1/files/audit")).bearer_auth(&acme).send().await;
    assert_eq!(audit.unwrap().status(), 403);
    let audit: Value = get_json(&client, &format!("{url}/v1/files/audit"), &admin).await;
    let openai = &audit["accounts"][0];
    assert_eq!(openai["provider"], "openai", "{audit}");
    assert_eq!(openai["files"]["total"], 0, "the finished job left no file: {audit}");

    // NDJSON streamed, settings in the query string.
    let ndjson: String = requests(5)
        .iter()
        .map(|r| format!("{}\n", json!({"key": r["key"], "body": r["body"]})))
        .collect();
    let response = client
        .post(format!("{url}/v1/jobs?task=stream&max_attempts=2"))
        .bearer_auth(&acme)
        .header("content-type", "application/x-ndjson")
        .body(ndjson)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    let second: Value = response.json().await.unwrap();
    assert_eq!(second["accepted"], 5);
    let second = second["job_id"].as_str().unwrap().to_owned();
    wait_done(&client, &url, &acme, &second).await;

    // The caller's jobs, newest first, a page at a time.
    let page: Value = get_json(&client, &format!("{url}/v1/jobs?limit=1"), &acme).await;
    assert_eq!(page["jobs"][0]["job_id"], second.as_str(), "{page}");
    let cursor = page["next_cursor"].as_str().unwrap();
    let next: Value =
        get_json(&client, &format!("{url}/v1/jobs?limit=1&cursor={cursor}"), &acme).await;
    assert_eq!(next["jobs"][0]["job_id"], id.as_str(), "{next}");

    // Bad input: 400, every bad line located; nothing stored.
    let good = requests(1).remove(0);
    let bad = json!({"settings": {"task": "greet"}, "requests": [
        good, {"key": "x"}, {"body": {"model": "m", "messages": []}}]});
    let response =
        client.post(format!("{url}/v1/jobs")).bearer_auth(&acme).json(&bad).send().await.unwrap();
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.unwrap();
    let lines: Vec<u64> = body["error"]["details"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["line"].as_u64().unwrap())
        .collect();
    assert_eq!(lines, [2, 3], "{body}");
    let unknown = json!({"settings": {"tenant": "other"}, "requests": requests(1)});
    let response = client
        .post(format!("{url}/v1/jobs"))
        .bearer_auth(&acme)
        .json(&unknown)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400, "a tenant cannot be chosen");
    // Too large: 413 in the envelope, for JSON and for NDJSON alike.
    let huge = json!({"settings": {"task": "greet"}, "requests": requests(2_000)});
    let response =
        client.post(format!("{url}/v1/jobs")).bearer_auth(&acme).json(&huge).send().await.unwrap();
    assert_eq!(response.status(), 413);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["type"], "too_large");
    let huge: String = requests(2_000).iter().map(|r| format!("{r}\n")).collect();
    let response = client
        .post(format!("{url}/v1/jobs?task=big"))
        .bearer_auth(&acme)
        .header("content-type", "application/x-ndjson")
        .body(huge)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 413);
    // Cancelling an ended job is a conflict; an unknown path is 404 in the envelope.
    let response =
        client.post(format!("{url}/v1/jobs/{id}/cancel")).bearer_auth(&acme).send().await.unwrap();
    assert_eq!(response.status(), 409);
    let response = client.get(format!("{url}/v2/nothing")).send().await.unwrap();
    assert_eq!(response.status(), 404);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["type"], "not_found");
    let listed: Value = get_json(&client, &format!("{url}/v1/jobs"), &acme).await;
    assert_eq!(listed["jobs"].as_array().unwrap().len(), 2, "refused jobs left nothing");

    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_failure_shows_on_the_job_with_the_providers_own_status_and_code() {
    let env = Env::new();
    let config = env.write(
        "sim.json",
        r#"{"faults": [{"provider": "azure", "operation": "upload", "status": 400, "code": "quotaExceeded",
            "message": "The quota for files without expiry is reached. The maximum is 500."}]}"#,
    );
    let sim = Sim::start(&["--config", config.to_str().unwrap()]);
    let acme = tenant(&env, "acme", &[]);
    let server = Server::start(&env, &sim.openai, &["--azure-endpoint", &sim.azure]);
    let url = server.url.clone();
    let client = reqwest::Client::new();
    let job = json!({"settings": {"task": "t", "provider": "azure"}, "requests": requests(3)});
    let response =
        client.post(format!("{url}/v1/jobs")).bearer_auth(&acme).json(&job).send().await.unwrap();
    assert_eq!(response.status(), 202);
    let id = response.json::<Value>().await.unwrap()["job_id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        let response =
            client.get(format!("{url}/v1/jobs/{id}")).bearer_auth(&acme).send().await.unwrap();
        assert_eq!(response.status(), 200, "the job's call succeeds: the failure is the job's");
        let status: Value = response.json().await.unwrap();
        if !status["upstream"].is_null() {
            break status;
        }
        assert!(Instant::now() < deadline, "no upstream error shown: {status}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let upstream = &status["upstream"];
    assert_eq!(upstream["provider"], "azure");
    assert_eq!(upstream["status"], 400, "{status}");
    assert_eq!(upstream["code"], "quotaExceeded", "{status}");
    assert!(upstream["message"].as_str().unwrap().contains("maximum is 500"), "{status}");
    assert_eq!(status["paused"], true, "nothing failed: the job waits for room");
    // The paused job carries the error (its tranche does too between tries, but each try
    // records its intent first, which clears it: not asserted here).
    let (text, samples) = scrape(&client, &url).await;
    let series = r#"tranche_upstream_errors{carrier="job",provider="azure",code="quotaExceeded"}"#;
    assert!(samples.contains(&(series.to_owned(), 1.0)), "{text}");
    server.stop();
}

/// `/metrics` as (series, value) pairs: `name{labels}` as written, and the sample's value.
async fn scrape(client: &reqwest::Client, url: &str) -> (String, Vec<(String, f64)>) {
    let response = client.get(format!("{url}/metrics")).send().await.unwrap();
    assert_eq!(response.status(), 200, "no token needed");
    let content_type = response.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(content_type.starts_with("text/plain; version=0.0.4"), "{content_type}");
    let text = response.text().await.unwrap();
    let samples = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            (series.to_owned(), value.parse().unwrap())
        })
        .collect();
    (text, samples)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_a_finished_jobs_requests_tokens_and_cost() {
    let sim = Sim::start(&[]);
    let env = Env::new();
    let acme = tenant(&env, "acme", &[]);
    let server = Server::start(&env, &sim.openai, &[]);
    let url = server.url.clone();
    let client = reqwest::Client::new();
    let (text, before) = scrape(&client, &url).await;
    assert!(before.contains(&("tranche_jobs{state=\"done\"}".to_owned(), 0.0)), "{text}");

    let job = json!({"settings": {"task": "count"}, "requests": requests(7)});
    let response =
        client.post(format!("{url}/v1/jobs")).bearer_auth(&acme).json(&job).send().await.unwrap();
    assert_eq!(response.status(), 202);
    let id = response.json::<Value>().await.unwrap()["job_id"].as_str().unwrap().to_owned();
    wait_done(&client, &url, &acme, &id).await;
    let cost: Value = get_json(&client, &format!("{url}/v1/jobs/{id}/cost"), &acme).await;

    let (text, samples) = scrape(&client, &url).await;
    let value = |series: &str| samples.iter().find(|(s, _)| s == series).map(|(_, v)| *v);
    assert_eq!(value("tranche_jobs{state=\"done\"}"), Some(1.0), "{text}");
    assert_eq!(value("tranche_jobs{state=\"running\"}"), Some(0.0), "{text}");
    assert_eq!(value("tranche_requests{state=\"succeeded\"}"), Some(7.0), "{text}");
    assert_eq!(value("tranche_requests{state=\"pending\"}"), Some(0.0), "{text}");
    assert_eq!(value("tranche_tranches{state=\"done\"}"), Some(1.0), "{text}");
    for family in
        ["tranche_jobs gauge", "tranche_tokens_total counter", "tranche_cost_usd_total counter"]
    {
        assert!(text.contains(&format!("# TYPE {family}\n")), "{family}: {text}");
    }
    // The model's billed input tokens (the answers name it, perhaps as a dated snapshot), as
    // the job's cost reports them; and what they cost.
    let model_series = |family: &str, kind: &str| -> Vec<f64> {
        samples
            .iter()
            .filter(|(s, _)| {
                s.starts_with(&format!("{family}{{provider=\"openai\",model=\"gpt-4o-mini"))
                    && s.ends_with(kind)
            })
            .map(|(_, v)| *v)
            .collect()
    };
    let input = model_series("tranche_tokens_total", ",kind=\"input\"}");
    assert_eq!(input.len(), 1, "{text}");
    let reported = cost["tokens"]["input"].as_f64().unwrap();
    assert!(reported > 0.0, "{cost}");
    assert_eq!(input[0], reported, "{text}\n{cost}");
    let usd = model_series("tranche_cost_usd_total", "}");
    assert_eq!(usd.len(), 1, "{text}");
    assert!(usd[0] > 0.0, "{text}");
    assert!((usd[0] - cost["cost"].as_f64().unwrap()).abs() < 1e-12, "{text}\n{cost}");
    server.stop();
}

/// The events of an SSE stream, as (id, event, data), each sent on `tx` as it arrives, until
/// the `end` event.
async fn read_events(
    response: reqwest::Response,
    tx: tokio::sync::mpsc::UnboundedSender<(u64, String, Value)>,
) {
    use futures::StreamExt;
    let mut stream = response.bytes_stream();
    let mut buffer = String::new();
    while let Some(chunk) = stream.next().await {
        buffer.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            let (mut id, mut name, mut data) = (None, String::new(), String::new());
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id:") {
                    id = v.trim().parse().ok();
                } else if let Some(v) = line.strip_prefix("event:") {
                    name = v.trim().to_owned();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim());
                }
            }
            let Some(id) = id else { continue }; // a keep-alive comment
            let done = name == "end";
            tx.send((id, name, serde_json::from_str(&data).unwrap())).unwrap();
            if done {
                return;
            }
        }
    }
    panic!("the stream closed before its end event")
}

async fn next_event(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<(u64, String, Value)>,
) -> (u64, String, Value) {
    tokio::time::timeout(Duration::from_secs(60), rx.recv()).await.unwrap().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_arrive_in_order_and_a_review_decided_over_http_ends_the_job() {
    let sim = Sim::start(&[]);
    let env = Env::new();
    let acme = tenant(&env, "acme", &[]);
    let server = Server::start(&env, &sim.openai, &[]);
    let url = server.url.clone();
    let client = reqwest::Client::new();
    let job = json!({"settings": {"task": "greet", "review_sample": 3}, "requests": requests(6)});
    let response =
        client.post(format!("{url}/v1/jobs")).bearer_auth(&acme).json(&job).send().await.unwrap();
    let id = response.json::<Value>().await.unwrap()["job_id"].as_str().unwrap().to_owned();
    let stream =
        client.get(format!("{url}/v1/jobs/{id}/events")).bearer_auth(&acme).send().await.unwrap();
    assert_eq!(stream.status(), 200);
    assert!(stream.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(read_events(stream, tx));
    let mut events = Vec::new();
    // The stream follows the job until it waits for review...
    loop {
        let event = next_event(&mut rx).await;
        let waiting = event.2["state"] == "needs_review";
        events.push(event);
        if waiting {
            break;
        }
    }
    // ...where the review shows 3 answers beside their inputs, and one is rejected.
    let review: Value = get_json(&client, &format!("{url}/v1/jobs/{id}/review"), &acme).await;
    let items = review["items"].as_array().unwrap();
    assert_eq!(items.len(), 3, "{review}");
    assert!(items[0]["input"]["messages"].is_array(), "{review}");
    let rejected = items[0]["custom_id"].as_str().unwrap().to_owned();
    let response = client
        .post(format!("{url}/v1/jobs/{id}/reject"))
        .bearer_auth(&acme)
        .json(&json!({"custom_ids": [rejected]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.json::<Value>().await.unwrap()["rejected"], 1);
    // Decided once: approving now is a conflict.
    let again =
        client.post(format!("{url}/v1/jobs/{id}/approve")).bearer_auth(&acme).send().await.unwrap();
    assert_eq!(again.status(), 409);
    // The stream ends with the job.
    loop {
        let event = next_event(&mut rx).await;
        let end = event.1 == "end";
        events.push(event);
        if end {
            break;
        }
    }

    let ids: Vec<u64> = events.iter().map(|(id, _, _)| *id).collect();
    assert!(ids.windows(2).all(|w| w[1] == w[0] + 1), "numbered in order: {ids:?}");
    let states: Vec<&str> = events.iter().map(|(_, _, d)| d["state"].as_str().unwrap()).collect();
    let (_, name, last) = events.last().unwrap();
    assert_eq!((name.as_str(), last["state"].as_str()), ("end", Some("done")), "{states:?}");
    assert_eq!(last["counts"]["failed"], 1, "the rejected answer");
    let order = ["pending", "running", "needs_review", "done"];
    let ranks: Vec<usize> =
        states.iter().map(|s| order.iter().position(|o| o == s).unwrap()).collect();
    assert!(ranks.windows(2).all(|w| w[0] <= w[1]), "states never go back: {states:?}");
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_gives_the_same_job_for_the_same_body_and_409_for_another() {
    let sim = Sim::start(&[]);
    let env = Env::new();
    let acme = tenant(&env, "acme", &[]);
    let other = tenant(&env, "other", &[]);
    let server = Server::start(&env, &sim.openai, &["--no-worker"]);
    let url = server.url.clone();
    let client = reqwest::Client::new();
    let job = json!({"settings": {"task": "greet"}, "requests": requests(4)});
    let post = |token: &str, key: &str, body: &Value| {
        client
            .post(format!("{url}/v1/jobs"))
            .bearer_auth(token)
            .header("Idempotency-Key", key)
            .json(body)
            .send()
    };
    let first = post(&acme, "order-7", &job).await.unwrap();
    assert_eq!(first.status(), 202);
    let first: Value = first.json().await.unwrap();
    // The same key and body: the same job, nothing submitted again.
    let again = post(&acme, "order-7", &job).await.unwrap();
    assert_eq!(again.status(), 202);
    assert_eq!(again.json::<Value>().await.unwrap(), first);
    // Another body under the same key: a conflict naming the key.
    let changed = json!({"settings": {"task": "greet"}, "requests": requests(5)});
    let conflict = post(&acme, "order-7", &changed).await.unwrap();
    assert_eq!(conflict.status(), 409);
    let body: Value = conflict.json().await.unwrap();
    assert_eq!(body["error"]["code"], "idempotency_key_reused", "{body}");
    // Keys are per tenant; a refused submission leaves its key free.
    let theirs = post(&other, "order-7", &job).await.unwrap();
    assert_eq!(theirs.status(), 202);
    assert_ne!(theirs.json::<Value>().await.unwrap()["job_id"], first["job_id"]);
    let bad = json!({"settings": {"task": "greet"}, "requests": [{"key": "x"}]});
    assert_eq!(post(&acme, "order-8", &bad).await.unwrap().status(), 400);
    assert_eq!(post(&acme, "order-8", &job).await.unwrap().status(), 202, "the key was released");
    assert_eq!(post(&acme, "bad key", &job).await.unwrap().status(), 400);
    let listed: Value = get_json(&client, &format!("{url}/v1/jobs"), &acme).await;
    assert_eq!(listed["jobs"].as_array().unwrap().len(), 2, "order-7 once, order-8 once: {listed}");
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_only_node_needs_no_provider_credentials() {
    let env = Env::new();
    let acme = tenant(&env, "acme", &[]);
    let child = env
        .tranche()
        .env_remove("OPENAI_API_KEY")
        .env_remove("AZURE_OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY")
        .args(["serve", "--addr", "127.0.0.1:0", "--no-worker"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let server = Server::listening(child);
    let client = reqwest::Client::new();
    let job = json!({"settings": {"task": "greet"}, "requests": requests(3)});
    let response = client
        .post(format!("{}/v1/jobs", server.url))
        .bearer_auth(&acme)
        .json(&job)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202, "jobs are taken in; a worker elsewhere carries them out");
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenants_open_upload_leaves_room_for_another_tenant() {
    let env = Env::new();
    let (acme, other) = (tenant(&env, "acme", &[]), tenant(&env, "other", &[]));
    let sim = Sim::start(&[]);
    let limits = ["--no-worker", "--max-concurrent-intake", "3", "--max-tenant-intake", "1"];
    let server = Server::start(&env, &sim.openai, &limits);
    let url = server.url.clone();
    let client = reqwest::Client::new();
    // acme's upload stays open: its one place is taken while it streams.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(4);
    let stream =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) });
    let open = tokio::spawn(
        client
            .post(format!("{url}/v1/jobs?task=slow"))
            .bearer_auth(&acme)
            .header("content-type", "application/x-ndjson")
            .body(reqwest::Body::wrap_stream(stream))
            .send(),
    );
    let line = format!("{}\n", requests(1)[0]);
    tx.send(Ok(line.clone().into())).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let job = json!({"settings": {"task": "greet"}, "requests": requests(2)});
    let post =
        |token: &str| client.post(format!("{url}/v1/jobs")).bearer_auth(token).json(&job).send();
    let second = post(&acme).await.unwrap();
    assert_eq!(second.status(), 429, "acme's share is taken");
    let body: Value = second.json().await.unwrap();
    assert_eq!(body["error"]["code"], "intake_busy");
    assert_eq!(post(&other).await.unwrap().status(), 202, "another tenant is not starved");
    // The open upload ends and is committed; acme's place is free again.
    drop(tx);
    assert_eq!(open.await.unwrap().unwrap().status(), 202);
    assert_eq!(post(&acme).await.unwrap().status(), 202);
    server.stop();
}
