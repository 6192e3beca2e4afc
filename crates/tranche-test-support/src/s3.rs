//! A real S3-compatible server on loopback for the blob store's tests: moto's server (from the
//! Python package index, in `target/moto-venv`), one per test, with a fresh bucket, killed when
//! dropped.

use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::python;

/// The moto version the tests are written against.
const MOTO: &str = "moto[server]==5.2.5";

/// The venv's `bin` folder, or why there is none; built once per test process.
static VENV: OnceLock<Result<std::path::PathBuf, String>> = OnceLock::new();
static BUILDING: Mutex<()> = Mutex::new(());

/// A running S3-compatible server with one empty bucket.
#[derive(Debug)]
pub struct S3Server {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    pub bucket: String,
}

impl S3Server {
    /// Starts a server on a free loopback port and creates `bucket` in it.
    pub fn start(bucket: &str) -> Self {
        let bin = {
            let _one_at_a_time = BUILDING.lock().unwrap();
            VENV.get_or_init(|| {
                python::venv("moto-venv", &[MOTO], "import moto.server; import flask")
            })
            .clone()
            .unwrap_or_else(|reason| panic!("no S3-compatible server for the tests: {reason}"))
        };
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        // `python -m`, not the console script: the venv was built elsewhere and renamed, and
        // scripts keep the interpreter path of where they were installed.
        let child = Command::new(bin.join("python"))
            .args(["-m", "moto.server", "-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moto_server");
        let server =
            Self { child, endpoint: format!("http://127.0.0.1:{port}"), bucket: bucket.to_owned() };
        server.create_bucket();
        server
    }

    fn create_bucket(&self) {
        let url = format!("{}/{}", self.endpoint, self.bucket);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let started = Instant::now();
        runtime.block_on(async {
            let client = reqwest::Client::new();
            loop {
                match client.put(&url).send().await {
                    Ok(response) if response.status().is_success() => return,
                    _ if started.elapsed() < Duration::from_secs(30) => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    other => panic!("the S3 server did not create the bucket: {other:?}"),
                }
            }
        });
    }

    /// The `AWS_*` settings that reach this server (path-style, plain HTTP, test keys).
    pub fn options(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
            ("AWS_ALLOW_HTTP", "true".to_owned()),
            ("AWS_ACCESS_KEY_ID", "testing".to_owned()),
            ("AWS_SECRET_ACCESS_KEY", "testing".to_owned()),
            ("AWS_REGION", "us-east-1".to_owned()),
        ]
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
