//! What one run measured, and how it is printed: a table per run, and a side-by-side summary
//! of several runs with the two targets.

use std::io::Write;

use serde::{Deserialize, Serialize};

use crate::floor::Floor;
use crate::sim::SimMode;

/// Peak RSS at the largest run may be at most this multiple of the smallest run's.
pub const RSS_TARGET: f64 = 1.2;
/// The pipeline may take at most this multiple of the I/O floor.
pub const FLOOR_TARGET: f64 = 3.0;

/// The phase a measured step belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Group {
    /// 1: parse + fingerprint + store.
    Submit,
    /// 2: plan + build files + upload + create.
    Send,
    /// 3: the simulator running the lines (reported apart, not part of the pipeline).
    Simulator,
    /// 4: collect (download raw results) + ingest.
    Receive,
    /// 5: delete provider files, settle the job.
    Cleanup,
}

impl Group {
    fn number(self) -> u8 {
        match self {
            Self::Submit => 1,
            Self::Send => 2,
            Self::Simulator => 3,
            Self::Receive => 4,
            Self::Cleanup => 5,
        }
    }
}

/// One measured step.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Phase {
    pub name: String,
    pub group: Group,
    /// Wall time of the step itself (engine ticks only; the benchmark's own store queries that
    /// watch for the end of a phase are left out and summed in `observer_seconds`).
    pub seconds: f64,
    /// This process's user + system CPU over the same span.
    pub cpu_seconds: Option<f64>,
    /// The simulator process's CPU, when it runs in a child.
    pub sim_cpu_seconds: Option<f64>,
    /// `Engine::tick` calls the step took (0 for submit and the simulator).
    pub ticks: u32,
    /// This process's peak resident set during the step (`VmHWM`, reset before it).
    pub peak_rss: u64,
    /// This process's resident set after the step.
    pub rss_after: u64,
    /// The simulator process's resident set after the step, when it runs in a child.
    pub sim_rss_after: Option<u64>,
}

/// How the requests ended, by the store and by the simulator.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Outcome {
    pub accepted: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub cancelled: u64,
    pub sim_requests_billed: u64,
    pub sim_files_live: u64,
}

/// Bytes on disk after the run.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Disk {
    pub db_bytes: u64,
    pub wal_bytes: u64,
    pub raw_bytes: u64,
}

/// Everything one run measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub requests: u64,
    pub body_bytes: usize,
    pub input_bytes: u64,
    pub max_batch_requests: usize,
    pub tranches: u64,
    pub sim: SimMode,
    pub generate_seconds: f64,
    pub floor: Floor,
    pub phases: Vec<Phase>,
    pub observer_seconds: f64,
    /// This process's highest resident set over the whole run (generation and floor included).
    pub peak_rss: u64,
    /// Whether phase peaks are per phase (the kernel allowed resetting `VmHWM`).
    pub peak_rss_per_phase: bool,
    /// The simulator process's highest resident set, when it runs in a child.
    pub sim_peak_rss: Option<u64>,
    pub outcome: Outcome,
    pub disk: Disk,
}

impl Report {
    /// Seconds of every step but the simulator's own processing.
    pub fn pipeline_seconds(&self) -> f64 {
        self.phases.iter().filter(|p| p.group != Group::Simulator).map(|p| p.seconds).sum()
    }

    /// Seconds of every step.
    pub fn total_seconds(&self) -> f64 {
        self.phases.iter().map(|p| p.seconds).sum()
    }

    /// The pipeline's time as a multiple of the I/O floor.
    pub fn floor_ratio(&self) -> f64 {
        ratio(self.pipeline_seconds(), self.floor.seconds())
    }

    /// Whether every request succeeded and every provider file is gone.
    pub fn complete(&self) -> bool {
        self.outcome.succeeded == self.requests
            && self.outcome.sim_requests_billed == self.requests
            && self.outcome.sim_files_live == 0
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { f64::INFINITY }
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

fn rate(n: f64, seconds: f64) -> f64 {
    if seconds > 0.0 { n / seconds } else { 0.0 }
}

/// `1234567` as `1,234,567`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn opt_secs(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"))
}

/// Writes one run as a table.
pub fn write_table(out: &mut impl Write, r: &Report) -> std::io::Result<()> {
    let child = r.sim == SimMode::Child;
    writeln!(
        out,
        "tranche-bench: {} requests, {}-byte bodies, {:.1} MB input, {} tranches of at most {}, simulator {}",
        thousands(r.requests),
        thousands(r.body_bytes as u64),
        mb(r.input_bytes),
        r.tranches,
        thousands(r.max_batch_requests as u64),
        r.sim.as_str(),
    )?;
    writeln!(out)?;
    write!(
        out,
        "{:>2}  {:<34} {:>9} {:>11} {:>8} {:>7} {:>6} {:>9}",
        "#", "phase", "seconds", "requests/s", "MB/s", "cpu s", "ticks", "peak MB"
    )?;
    if child {
        write!(out, " {:>7} {:>8}", "sim cpu", "sim MB")?;
    }
    writeln!(out)?;
    let n = r.requests as f64;
    let bytes = mb(r.input_bytes);
    for p in &r.phases {
        write!(
            out,
            "{:>2}  {:<34} {:>9.2} {:>11} {:>8.1} {:>7} {:>6} {:>9.0}",
            p.group.number(),
            p.name,
            p.seconds,
            thousands(rate(n, p.seconds).round() as u64),
            rate(bytes, p.seconds),
            opt_secs(p.cpu_seconds),
            p.ticks,
            mb(p.peak_rss),
        )?;
        if child {
            write!(
                out,
                " {:>7} {:>8.0}",
                opt_secs(p.sim_cpu_seconds),
                p.sim_rss_after.map_or(0.0, mb)
            )?;
        }
        writeln!(out)?;
    }
    let rows = [
        ("pipeline (all but 3)", r.pipeline_seconds()),
        ("total (all)", r.total_seconds()),
        ("I/O floor (read + write + SHA-256)", r.floor.seconds()),
    ];
    for (name, seconds) in rows {
        writeln!(
            out,
            "    {:<34} {:>9.2} {:>11} {:>8.1}",
            name,
            seconds,
            thousands(rate(n, seconds).round() as u64),
            rate(bytes, seconds),
        )?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "I/O floor over {:.1} MB: read {:.2} s, write + fsync {:.2} s, SHA-256 {:.2} s (input generated in {:.2} s)",
        mb(r.floor.bytes),
        r.floor.read_seconds,
        r.floor.write_seconds,
        r.floor.sha256_seconds,
        r.generate_seconds,
    )?;
    writeln!(
        out,
        "pipeline / floor: {:.1}x (target <= {FLOOR_TARGET}x: {})",
        r.floor_ratio(),
        if r.floor_ratio() <= FLOOR_TARGET { "met" } else { "NOT met" }
    )?;
    write!(out, "peak RSS (VmHWM): {:.0} MB", mb(r.peak_rss))?;
    match r.sim_peak_rss {
        Some(sim) => writeln!(out, " (engine alone); simulator process: {:.0} MB", mb(sim))?,
        None => writeln!(out, " (simulator in this process)")?,
    }
    if !r.peak_rss_per_phase {
        writeln!(out, "(the kernel refused to reset VmHWM: phase peaks are peaks since start)")?;
    }
    writeln!(out, "watching the store between ticks (not counted): {:.2} s", r.observer_seconds)?;
    writeln!(
        out,
        "on disk after the run: database {:.0} MB (+ WAL {:.0} MB), raw results {:.0} MB",
        mb(r.disk.db_bytes),
        mb(r.disk.wal_bytes),
        mb(r.disk.raw_bytes),
    )?;
    let o = &r.outcome;
    writeln!(
        out,
        "outcome: {} accepted, {} succeeded, {} failed, {} cancelled; simulator billed {}, {} files left{}",
        thousands(o.accepted),
        thousands(o.succeeded),
        thousands(o.failed),
        thousands(o.cancelled),
        thousands(o.sim_requests_billed),
        o.sim_files_live,
        if r.complete() { "" } else { "  <-- INCOMPLETE" },
    )
}

/// Writes several runs side by side, smallest first, with the targets.
pub fn write_comparison(out: &mut impl Write, runs: &[Report]) -> std::io::Result<()> {
    let (Some(small), Some(large)) = (runs.first(), runs.last()) else {
        return Ok(());
    };
    writeln!(out, "comparison (simulator {})", small.sim.as_str())?;
    write!(out, "{:<28}", "")?;
    for r in runs {
        write!(out, " {:>14}", thousands(r.requests))?;
    }
    writeln!(out)?;
    let row = |out: &mut dyn Write, name: &str, f: &dyn Fn(&Report) -> String| {
        write!(out, "{name:<28}")?;
        for r in runs {
            write!(out, " {:>14}", f(r))?;
        }
        writeln!(out)
    };
    row(out, "peak RSS MB", &|r| format!("{:.0}", mb(r.peak_rss)))?;
    if small.sim_peak_rss.is_some() {
        row(out, "simulator peak RSS MB", &|r| format!("{:.0}", r.sim_peak_rss.map_or(0.0, mb)))?;
    }
    row(out, "pipeline s", &|r| format!("{:.2}", r.pipeline_seconds()))?;
    row(out, "pipeline requests/s", &|r| {
        thousands(rate(r.requests as f64, r.pipeline_seconds()).round() as u64)
    })?;
    row(out, "simulator s", &|r| format!("{:.2}", r.total_seconds() - r.pipeline_seconds()))?;
    row(out, "I/O floor s", &|r| format!("{:.2}", r.floor.seconds()))?;
    row(out, "pipeline / floor", &|r| format!("{:.1}x", r.floor_ratio()))?;
    let rss_ratio = ratio(large.peak_rss as f64, small.peak_rss as f64);
    writeln!(
        out,
        "peak RSS ratio {} / {}: {rss_ratio:.2}x (target <= {RSS_TARGET}x: {})",
        thousands(large.requests),
        thousands(small.requests),
        if rss_ratio <= RSS_TARGET { "met" } else { "NOT met" },
    )?;
    for r in runs {
        writeln!(
            out,
            "pipeline / floor at {}: {:.1}x (target <= {FLOOR_TARGET}x: {})",
            thousands(r.requests),
            r.floor_ratio(),
            if r.floor_ratio() <= FLOOR_TARGET { "met" } else { "NOT met" },
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1_000_000), "1,000,000");
    }
}
