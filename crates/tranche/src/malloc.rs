//! Sets glibc's malloc tunables: the process starts itself again once, with them set.
//!
//! Two keep memory flat as a job grows:
//! - **One arena.** glibc gives a thread that finds the arenas in use a new one, up to eight per
//!   core, and each keeps what it freed. tranche allocates a row's values on sqlx's SQLite
//!   worker threads and frees them on tokio's, so every arena grew with the job: peak RSS of
//!   `tranche run` was 121 MB at 100,000 requests against 44 MB at 10,000; with one arena, 54.
//! - **A fixed mmap threshold of 1 MiB.** glibc raises the threshold to the size of each large
//!   block it frees (up to 32 MiB), so that later large buffers (a tranche's lines, a file's
//!   pieces) come from the heap and leave it fragmented: peak RSS at 1,000,000 requests was
//!   40.5 MB against 38.2 with the threshold fixed (34.8 and 33.5 at 10,000). At 128 KiB,
//!   glibc's starting value, the same run spent 5 s more in the kernel mapping and unmapping.
//!
//! A third spares the kernel work without raising the peak:
//! - **A trim threshold of 8 MiB.** Fixing the mmap threshold also fixes glibc's trim threshold
//!   at 128 KiB, so the heap's top was handed back to the kernel whenever that much lay free
//!   there, and faulted in again, a zeroed page at a time, by the next buffers: a
//!   100,000-request `tranche run` took 40,000-42,000 minor page faults, against 10,800-11,400
//!   with a trim threshold of 4, 8 or 32 MiB, its peak RSS the same (30-31 MB). What stays
//!   mapped was in use a moment before, so the peak does not move.
//!
//! glibc reads tunables only at start (`GLIBC_TUNABLES`), and setting them from inside
//! (`mallopt`) takes `unsafe`, which this workspace forbids; so the process is started again
//! with them set, as the same process (`exec` keeps the pid). A tunable the user set (in
//! `GLIBC_TUNABLES` or by its own variable) is kept as it is.

/// The tunables set: glibc's name, the value, and the variable that sets it alone.
const TUNABLES: [(&str, &str, &str); 3] = [
    ("glibc.malloc.arena_max", "1", "MALLOC_ARENA_MAX"),
    ("glibc.malloc.mmap_threshold", "1048576", "MALLOC_MMAP_THRESHOLD_"),
    ("glibc.malloc.trim_threshold", "8388608", "MALLOC_TRIM_THRESHOLD_"),
];

/// Starts this process again with the tunables, unless they are set already. Returns when it
/// could not (no path to this executable, or the exec failed): glibc's defaults then stand.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(crate) fn tune() {
    use std::os::unix::process::CommandExt;

    let Some(tunables) = tunables_to_set(std::env::var_os("GLIBC_TUNABLES").as_deref(), |name| {
        std::env::var_os(name).is_some()
    }) else {
        return;
    };
    let Ok(exe) = std::env::current_exe() else { return };
    let mut args = std::env::args_os();
    let mut command = std::process::Command::new(exe);
    if let Some(arg0) = args.next() {
        command.arg0(arg0);
    }
    // `exec` returns only when it failed; the process goes on as it is.
    let _failed = command.args(args).env("GLIBC_TUNABLES", tunables).exec();
}

/// Elsewhere there is no glibc to tune.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn tune() {}

/// The `GLIBC_TUNABLES` value to start again with, or `None` when every tunable is set already
/// (or the user's value is not text, which is then left alone). `var_set` tells whether an
/// environment variable is set.
fn tunables_to_set(
    current: Option<&std::ffi::OsStr>,
    var_set: impl Fn(&str) -> bool,
) -> Option<String> {
    let current = match current {
        None => "",
        Some(value) => value.to_str()?,
    };
    let named = |tunable: &str| current.split(':').any(|t| t.split('=').next() == Some(tunable));
    let missing: Vec<String> = TUNABLES
        .iter()
        .filter(|(tunable, _, var)| !named(tunable) && !var_set(var))
        .map(|(tunable, value, _)| format!("{tunable}={value}"))
        .collect();
    if missing.is_empty() {
        return None;
    }
    let missing = missing.join(":");
    Some(if current.is_empty() { missing } else { format!("{current}:{missing}") })
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use super::*;

    const ALL: &str = "glibc.malloc.arena_max=1:glibc.malloc.mmap_threshold=1048576:\
                       glibc.malloc.trim_threshold=8388608";

    #[test]
    fn the_tunables_are_added_to_what_the_user_set_and_never_twice() {
        let unset = |_: &str| false;
        assert_eq!(tunables_to_set(None, unset).as_deref(), Some(ALL));
        assert_eq!(
            tunables_to_set(Some(OsStr::new("glibc.malloc.tcache_count=0")), unset).as_deref(),
            Some(format!("glibc.malloc.tcache_count=0:{ALL}").as_str())
        );
        assert_eq!(
            tunables_to_set(Some(OsStr::new("glibc.malloc.arena_max=4")), unset).as_deref(),
            Some(
                "glibc.malloc.arena_max=4:glibc.malloc.mmap_threshold=1048576:\
                 glibc.malloc.trim_threshold=8388608"
            ),
            "the user's cap stands"
        );
        assert_eq!(tunables_to_set(Some(OsStr::new(ALL)), unset), None, "started again once");
        assert_eq!(
            tunables_to_set(None, |var| var == "MALLOC_ARENA_MAX").as_deref(),
            Some("glibc.malloc.mmap_threshold=1048576:glibc.malloc.trim_threshold=8388608"),
            "MALLOC_ARENA_MAX stands"
        );
        assert_eq!(
            tunables_to_set(None, |var| var.starts_with("MALLOC_")),
            None,
            "all set by their own variables"
        );
    }
}
