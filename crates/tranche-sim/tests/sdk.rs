//! SDK compatibility: the official Python `openai` and `anthropic` packages, installed in a virtual
//! environment under `target/sdk-venv` (created once, then reused), drive every batch and file
//! operation against an in-process simulator, changing nothing but the base URL and the key. The
//! scripts live in `crates/tranche-sim/sdk/`; each must exit 0, parsing every response with the
//! SDK's strict validation, and moves the virtual clock through `/sim/clock/advance`.
//!
//! Without `python3`, or when pip cannot install the packages, these tests fail with the reason;
//! set `TRANCHE_SKIP_SDK_TESTS=1` to skip them instead.

#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr,
    reason = "test helpers fail loudly; clippy.toml's test allowances cover only #[test] functions"
)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use tranche_sim::{SimConfig, Simulator};

/// The SDK versions the scripts are written against (both install from PyPI).
const PACKAGES: [&str; 2] = ["openai==3.57.0", "anthropic==2.14.0"];
const KEY: &str = "sk-sdk-test";
/// How long one script may take (it never waits on the clock; this only catches a hang).
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(180);

/// The venv's python, or why there is none. Built once per test process.
static VENV: OnceLock<Result<PathBuf, String>> = OnceLock::new();

fn skip_requested() -> bool {
    std::env::var("TRANCHE_SKIP_SDK_TESTS").is_ok_and(|v| v == "1")
}

/// `target/` (or `$CARGO_TARGET_DIR`): this test binary lives in `<target>/<profile>/deps/`.
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.ancestors().nth(3).map(Path::to_path_buf).expect("target dir above deps/")
}

fn python_in(venv: &Path) -> PathBuf {
    venv.join("bin").join("python")
}

fn run(cmd: &mut std::process::Command) -> Result<std::process::Output, String> {
    let out = cmd.output().map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(format!(
            "{cmd:?} failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Whether `python` imports both SDKs at the pinned versions.
fn has_sdks(python: &Path) -> bool {
    let check = "import openai, anthropic; assert openai.__version__ == '3.57.0', openai.__version__; assert anthropic.__version__ == '2.14.0', anthropic.__version__";
    python.exists()
        && std::process::Command::new(python)
            .args(["-c", check])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
}

/// Creates `target/sdk-venv` with the pinned SDKs unless it is there already. It is built in a
/// temporary folder and renamed into place, so a concurrent build elsewhere never sees half a venv.
fn build_venv() -> Result<PathBuf, String> {
    let venv = target_dir().join("sdk-venv");
    if has_sdks(&python_in(&venv)) {
        return Ok(python_in(&venv));
    }
    let python3 = std::env::var("PYTHON3").unwrap_or_else(|_| "python3".to_owned());
    run(std::process::Command::new(&python3).arg("--version")).map_err(|e| {
        format!("python3 is needed for the SDK compatibility tests (set TRANCHE_SKIP_SDK_TESTS=1 to skip them): {e}")
    })?;
    let tmp = target_dir().join(format!("sdk-venv.tmp-{}", std::process::id()));
    std::fs::remove_dir_all(&tmp).ok();
    run(std::process::Command::new(&python3).args(["-m", "venv"]).arg(&tmp))
        .map_err(|e| format!("cannot create a virtual environment: {e}"))?;
    run(std::process::Command::new(python_in(&tmp))
        .args(["-m", "pip", "install", "--disable-pip-version-check", "--quiet"])
        .args(PACKAGES))
    .map_err(|e| {
        format!(
            "pip cannot install {} (set TRANCHE_SKIP_SDK_TESTS=1 to skip the SDK tests): {e}",
            PACKAGES.join(" ")
        )
    })?;
    if std::fs::rename(&tmp, &venv).is_err() {
        // Another process finished first, or a stale venv is in the way.
        if has_sdks(&python_in(&venv)) {
            std::fs::remove_dir_all(&tmp).ok();
        } else {
            std::fs::remove_dir_all(&venv).ok();
            std::fs::rename(&tmp, &venv)
                .map_err(|e| format!("cannot move {} into place: {e}", tmp.display()))?;
        }
    }
    if has_sdks(&python_in(&venv)) {
        Ok(python_in(&venv))
    } else {
        Err(format!("{} does not import the pinned SDKs", venv.display()))
    }
}

/// The venv's python; `None` when the tests are to be skipped.
async fn venv_python() -> Option<PathBuf> {
    if skip_requested() {
        eprintln!("TRANCHE_SKIP_SDK_TESTS=1: skipping the Python SDK compatibility test");
        return None;
    }
    let result = tokio::task::spawn_blocking(|| VENV.get_or_init(build_venv).clone())
        .await
        .expect("venv task");
    match result {
        Ok(python) => Some(python),
        Err(reason) => panic!("{reason}"),
    }
}

/// Runs `sdk/<script>` against a fresh simulator and fails with its output unless it exits 0.
async fn run_script(script: &str) {
    let Some(python) = venv_python().await else {
        return;
    };
    let sim = Simulator::spawn(SimConfig {
        speed: 0.0,
        api_key: Some(KEY.to_owned()),
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("sdk");
    let mut cmd = tokio::process::Command::new(&python);
    cmd.arg(dir.join(script))
        .current_dir(&dir)
        // A clean environment: no proxies, no provider variables, no bytecode in the source tree.
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", std::env::var("HOME").unwrap_or_else(|_| "/tmp".to_owned()))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("NO_PROXY", "*")
        .env("TRANCHE_SIM_URL", sim.base_url())
        .env("TRANCHE_SIM_KEY", KEY)
        .kill_on_drop(true);
    let out = tokio::time::timeout(SCRIPT_TIMEOUT, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{script} did not finish within {SCRIPT_TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("cannot run {script}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{script} failed ({}):\n{stdout}\n{stderr}", out.status);
    assert!(stdout.contains(" ok"), "{script} did not report success:\n{stdout}\n{stderr}");
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_sdk_drives_the_openai_surface() {
    run_script("test_openai_sdk.py").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_sdk_drives_both_azure_surfaces() {
    run_script("test_azure_sdk.py").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_sdk_drives_the_message_batches_surface() {
    run_script("test_anthropic_sdk.py").await;
}
