//! `tranche sim` as a child process on port 0, as a user runs it: its base URLs read from what
//! it prints, killed (and its spool folder removed) when dropped.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A running `tranche sim` child.
#[derive(Debug)]
pub struct SimProcess {
    pub child: Child,
    /// The child's temporary directory, where its spool folder goes: a killed simulator
    /// cannot remove its own, so this removes it after the kill.
    _tmp: tempfile::TempDir,
    pub openai: String,
    pub azure: String,
    pub anthropic: String,
}

impl SimProcess {
    /// Starts `bin sim --port 0` with `extra` flags (`--speed 200` unless they set a speed).
    pub fn start(bin: &Path, extra: &[&str]) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let mut child = Command::new(bin)
            .env("TMPDIR", tmp.path())
            .args(["sim", "--port", "0"])
            .args(if extra.contains(&"--speed") { &[][..] } else { &["--speed", "200"][..] })
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start tranche sim");
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let mut urls = HashMap::new();
        while urls.len() < 3 {
            let line = lines.next().expect("sim printed its URLs").unwrap();
            if let Some((name, url)) = line.split_once(": ")
                && ["openai", "azure", "anthropic"].contains(&name)
            {
                urls.insert(name.to_owned(), url.trim().to_owned());
            }
        }
        // Keep draining stdout so the child never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Self {
            child,
            _tmp: tmp,
            openai: urls["openai"].clone(),
            azure: urls["azure"].clone(),
            anthropic: urls["anthropic"].clone(),
        }
    }

    /// The simulator's root URL (its `/sim` control surface lives there).
    pub fn root(&self) -> &str {
        self.openai.trim_end_matches("/v1")
    }
}

impl Drop for SimProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
