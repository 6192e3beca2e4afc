//! Python tools some tests drive (an S3-compatible server, the official SDKs): a virtual
//! environment under the build's `target/` folder, made once with pinned packages and reused.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// `target/` (or `$CARGO_TARGET_DIR`): a test binary lives in `<target>/<profile>/deps/`.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.ancestors().nth(3).map(Path::to_path_buf).expect("target dir above deps/")
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

/// The `bin` folder of `target/<name>`, a venv with `packages` installed, made unless
/// `check` (Python code) already succeeds in it. Built in a temporary folder and renamed into
/// place, so that a concurrent build never sees half a venv.
pub fn venv(name: &str, packages: &[&str], check: &str) -> Result<PathBuf, String> {
    let venv = target_dir().join(name);
    let bin = |venv: &Path| venv.join("bin");
    let ready = |venv: &Path| {
        Command::new(bin(venv).join("python"))
            .args(["-c", check])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if ready(&venv) {
        return Ok(bin(&venv));
    }
    let python3 = std::env::var("PYTHON3").unwrap_or_else(|_| "python3".to_owned());
    let tmp = target_dir().join(format!("{name}.tmp-{}", std::process::id()));
    std::fs::remove_dir_all(&tmp).ok();
    run(Command::new(&python3).args(["-m", "venv"]).arg(&tmp))
        .map_err(|e| format!("cannot create a virtual environment (python3 with venv): {e}"))?;
    run(Command::new(bin(&tmp).join("python"))
        .args(["-m", "pip", "install", "--disable-pip-version-check", "--quiet"])
        .args(packages))
    .map_err(|e| format!("pip cannot install {}: {e}", packages.join(" ")))?;
    if std::fs::rename(&tmp, &venv).is_err() {
        // Another process finished first, or a stale venv is in the way.
        if ready(&venv) {
            std::fs::remove_dir_all(&tmp).ok();
        } else {
            std::fs::remove_dir_all(&venv).ok();
            std::fs::rename(&tmp, &venv)
                .map_err(|e| format!("cannot move {} into place: {e}", tmp.display()))?;
        }
    }
    if ready(&venv) { Ok(bin(&venv)) } else { Err(format!("{} is not usable", venv.display())) }
}
