//! Memory and CPU figures of a process from Linux `/proc`: resident set (`VmRSS`), its peak
//! (`VmHWM`, which writing `5` to `clear_refs` resets) and user + system CPU time.

use std::path::PathBuf;

/// Which process to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proc {
    /// This process.
    This,
    /// Another process, by id.
    Pid(u32),
}

impl Proc {
    fn file(self, name: &str) -> PathBuf {
        match self {
            Self::This => PathBuf::from("/proc/self").join(name),
            Self::Pid(pid) => PathBuf::from(format!("/proc/{pid}")).join(name),
        }
    }

    /// Current and peak resident set, in bytes; `None` where `/proc` is not available.
    pub fn memory(self) -> Option<Memory> {
        let status = std::fs::read_to_string(self.file("status")).ok()?;
        Some(Memory { rss: kib_field(&status, "VmRSS:")?, peak: kib_field(&status, "VmHWM:")? })
    }

    /// Resets the peak resident set to the current one. Returns false when the kernel refused.
    pub fn reset_peak(self) -> bool {
        std::fs::write(self.file("clear_refs"), "5").is_ok()
    }

    /// User + system CPU seconds over all threads so far.
    pub fn cpu_seconds(self) -> Option<f64> {
        let stat = std::fs::read_to_string(self.file("stat")).ok()?;
        // Fields after the command name (which may hold spaces, so split after its `)`):
        // state is field 3, utime 14 and stime 15, in clock ticks of 1/100 s (USER_HZ).
        let rest = stat.rsplit_once(')')?.1;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let utime: u64 = fields.get(11)?.parse().ok()?;
        let stime: u64 = fields.get(12)?.parse().ok()?;
        Some((utime + stime) as f64 / 100.0)
    }
}

/// A process's resident set now and at its (resettable) peak.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memory {
    pub rss: u64,
    pub peak: u64,
}

fn kib_field(status: &str, name: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(name))?;
    let kib: u64 = line[name.len()..].trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib * 1024)
}

/// Tracks the lifetime peak of a process whose `VmHWM` is reset between phases.
#[derive(Debug, Clone, Copy)]
pub struct PeakTracker {
    proc: Proc,
    lifetime: u64,
    resets_work: bool,
}

impl PeakTracker {
    pub fn new(proc: Proc) -> Self {
        Self { proc, lifetime: proc.memory().map_or(0, |m| m.peak), resets_work: true }
    }

    /// Folds the current peak into the lifetime peak and starts a new phase's peak.
    /// Returns the peak since the last call.
    pub fn phase_peak(&mut self) -> u64 {
        let peak = self.proc.memory().map_or(0, |m| m.peak);
        self.lifetime = self.lifetime.max(peak);
        if self.resets_work {
            self.resets_work = self.proc.reset_peak();
        }
        peak
    }

    /// The highest resident set seen over the process's life (up to the last call).
    pub fn lifetime(&mut self) -> u64 {
        let peak = self.proc.memory().map_or(0, |m| m.peak);
        self.lifetime = self.lifetime.max(peak);
        self.lifetime
    }

    /// Whether phase peaks are per phase (false: each is the peak since the process started).
    pub fn per_phase(&self) -> bool {
        self.resets_work
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let memory = Proc::This.memory().unwrap();
        assert!(memory.rss > 0 && memory.peak >= memory.rss);
        assert!(Proc::This.cpu_seconds().unwrap() >= 0.0);
    }

    #[test]
    fn parses_kib_fields() {
        let status = "Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t1024 kB\n";
        assert_eq!(kib_field(status, "VmHWM:"), Some(2048 * 1024));
        assert_eq!(kib_field(status, "VmRSS:"), Some(1024 * 1024));
        assert_eq!(kib_field(status, "VmSwap:"), None);
    }
}
