//! Caps glibc's malloc arenas: the process starts itself again once, with the tunable set.
//!
//! glibc gives a thread that finds the arenas in use a new one, up to eight per core, and each
//! keeps what it freed. tranche allocates a row's values on sqlx's SQLite worker threads and
//! frees them on tokio's, so every arena grows with the job: peak RSS of `tranche run` was
//! 121 MB at 100,000 requests against 44 MB at 10,000; with one arena, 54 MB. glibc reads the
//! cap only at start (`GLIBC_TUNABLES`), and setting it from inside (`mallopt`) takes `unsafe`,
//! which this workspace forbids; so the process is started again with it set, as the same
//! process (`exec` keeps the pid). A cap the user set (the tunable, or `MALLOC_ARENA_MAX`) is
//! kept as it is.

/// The tunable glibc reads, and the cap set.
const TUNABLE: &str = "glibc.malloc.arena_max";
const ARENAS: u32 = 1;

/// Starts this process again with the arena cap, unless it is set already. Returns when it
/// could not (no path to this executable, or the exec failed): glibc's default then stands.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(crate) fn cap() {
    use std::os::unix::process::CommandExt;

    let Some(tunables) = tunables_with_cap(
        std::env::var_os("GLIBC_TUNABLES").as_deref(),
        std::env::var_os("MALLOC_ARENA_MAX").is_some(),
    ) else {
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

/// Elsewhere there is no glibc to cap.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn cap() {}

/// The `GLIBC_TUNABLES` value to start again with, or `None` when the cap is set already (or
/// the user's value is not text, which is then left alone).
fn tunables_with_cap(current: Option<&std::ffi::OsStr>, arena_max_set: bool) -> Option<String> {
    if arena_max_set {
        return None;
    }
    let current = match current {
        None => "",
        Some(value) => value.to_str()?,
    };
    if current.split(':').any(|t| t.split('=').next() == Some(TUNABLE)) {
        return None;
    }
    let cap = format!("{TUNABLE}={ARENAS}");
    Some(if current.is_empty() { cap } else { format!("{current}:{cap}") })
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use super::*;

    #[test]
    fn the_cap_is_added_to_what_the_user_set_and_never_twice() {
        assert_eq!(tunables_with_cap(None, false).as_deref(), Some("glibc.malloc.arena_max=1"));
        assert_eq!(
            tunables_with_cap(Some(OsStr::new("glibc.malloc.tcache_count=0")), false).as_deref(),
            Some("glibc.malloc.tcache_count=0:glibc.malloc.arena_max=1")
        );
        assert_eq!(tunables_with_cap(Some(OsStr::new("glibc.malloc.arena_max=4")), false), None);
        assert_eq!(
            tunables_with_cap(Some(OsStr::new("a=1:glibc.malloc.arena_max=8")), false),
            None,
            "the user's cap stands"
        );
        assert_eq!(tunables_with_cap(None, true), None, "MALLOC_ARENA_MAX stands");
    }
}
