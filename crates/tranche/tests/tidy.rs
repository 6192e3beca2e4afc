//! Tidy checks over the whole workspace, run as ordinary tests.

#![expect(clippy::unwrap_used, reason = "test helpers fail loudly")]

use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn all_rust_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for krate in std::fs::read_dir(workspace().join("crates")).unwrap().flatten() {
        for sub in ["src", "tests", "benches"] {
            rust_files(&krate.path().join(sub), &mut files);
        }
    }
    assert!(files.len() > 10, "found too few files: {files:?}");
    files
}

#[test]
fn every_module_opens_with_a_doc_line() {
    let missing: Vec<_> = all_rust_files()
        .into_iter()
        .filter(|path| !std::fs::read_to_string(path).unwrap().starts_with("//!"))
        .collect();
    assert!(missing.is_empty(), "these files do not open with a `//!` line: {missing:#?}");
}

#[test]
fn no_sql_is_built_with_format() {
    let offenders: Vec<_> = all_rust_files()
        .into_iter()
        .filter(|path| {
            let text = std::fs::read_to_string(path).unwrap().to_uppercase();
            ["SELECT ", "INSERT ", "UPDATE ", "DELETE "]
                .iter()
                .any(|verb| text.contains(&format!("FORMAT!(\"{verb}")))
        })
        .collect();
    assert!(offenders.is_empty(), "SQL built with format!: {offenders:#?}");
}

#[test]
fn every_crate_is_in_the_architecture_map() {
    let map = std::fs::read_to_string(workspace().join("ARCHITECTURE.md")).unwrap();
    for krate in std::fs::read_dir(workspace().join("crates")).unwrap().flatten() {
        let name = krate.file_name().to_string_lossy().into_owned();
        assert!(
            map.contains(&format!("### `crates/{name}`")),
            "ARCHITECTURE.md has no section for {name}"
        );
    }
}

/// ARCHITECTURE.md: policy imports neither tokio nor the store; it decides, the steps act.
#[test]
fn engine_policy_is_pure() {
    let policy =
        std::fs::read_to_string(workspace().join("crates/tranche-engine/src/policy.rs")).unwrap();
    for forbidden in ["tokio", "tranche_store", "sqlx", "reqwest", "std::fs", "SystemTime"] {
        assert!(!policy.contains(forbidden), "policy.rs uses `{forbidden}`");
    }
}

/// ARCHITECTURE.md: the engine reads the time from its `Clock`, never from the system.
#[test]
fn the_engine_reads_time_from_its_clock() {
    let mut files = Vec::new();
    rust_files(&workspace().join("crates/tranche-engine/src"), &mut files);
    let offenders: Vec<_> = files
        .into_iter()
        .filter(|path| std::fs::read_to_string(path).unwrap().contains("SystemTime"))
        .collect();
    assert!(offenders.is_empty(), "reads the system clock: {offenders:#?}");
}

/// ARCHITECTURE.md: the engine depends on the store traits, never on a backend.
#[test]
fn the_engine_depends_on_no_store_backend() {
    let manifest =
        std::fs::read_to_string(workspace().join("crates/tranche-engine/Cargo.toml")).unwrap();
    let dependencies =
        manifest.split("[dependencies]").nth(1).and_then(|rest| rest.split("\n[").next()).unwrap();
    assert!(dependencies.contains("tranche-store."), "the engine uses the store traits");
    for backend in ["tranche-store-sqlite", "tranche-store-postgres", "sqlx"] {
        assert!(!dependencies.contains(backend), "the engine depends on `{backend}`");
    }
}

/// ARCHITECTURE.md: the CLI goes through the application layer, never the store.
#[test]
fn the_cli_goes_through_the_application_layer() {
    let manifest = std::fs::read_to_string(workspace().join("crates/tranche/Cargo.toml")).unwrap();
    for store in ["tranche-store", "tranche-store-sqlite", "tranche-store-postgres", "sqlx"] {
        assert!(!manifest.contains(&format!("\n{store}.")), "the CLI depends on `{store}`");
    }
    let mut files = Vec::new();
    rust_files(&workspace().join("crates/tranche/src"), &mut files);
    let offenders: Vec<_> = files
        .into_iter()
        .filter(|path| std::fs::read_to_string(path).unwrap().contains("tranche_store"))
        .collect();
    assert!(offenders.is_empty(), "the CLI uses the store: {offenders:#?}");
}

/// ARCHITECTURE.md: the HTTP server goes through the application layer too, and holds no
/// engine logic: it depends on neither the store nor the engine nor a provider adapter.
#[test]
fn the_server_goes_through_the_application_layer() {
    let manifest =
        std::fs::read_to_string(workspace().join("crates/tranche-server/Cargo.toml")).unwrap();
    let forbidden = [
        "tranche-store",
        "tranche-store-sqlite",
        "tranche-store-postgres",
        "tranche-engine",
        "tranche-providers",
        "sqlx",
        "reqwest",
    ];
    for dependency in forbidden {
        assert!(
            !manifest.contains(&format!("\n{dependency}.")),
            "the server depends on `{dependency}`"
        );
    }
    let mut files = Vec::new();
    rust_files(&workspace().join("crates/tranche-server/src"), &mut files);
    assert!(!files.is_empty());
    let offenders: Vec<_> = files
        .into_iter()
        .filter(|path| {
            let text = std::fs::read_to_string(path).unwrap();
            text.contains("tranche_store") || text.contains("tranche_engine")
        })
        .collect();
    assert!(offenders.is_empty(), "the server reaches past the app: {offenders:#?}");
}
