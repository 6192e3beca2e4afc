//! `tranche tenants add|list|revoke` through the real binary: a token printed once on the last
//! line, never listed and never stored (only its SHA-256 is); a taken, bad or unknown name is
//! bad usage (exit 2); a revoked tenant shows revoked and its name may be added again.

#![expect(clippy::unwrap_used, reason = "test helpers fail loudly")]

mod support;

use std::process::Output;

use serde_json::Value;
use sha2::{Digest, Sha256};
use support::{Env, text};

/// `tranche tenants ARGS...`.
fn tenants(env: &Env, args: &[&str]) -> Output {
    env.tranche().arg("tenants").args(args).output().unwrap()
}

/// The token `tranche tenants add` printed: its last line of output, alone.
fn add(env: &Env, args: &[&str]) -> String {
    let out = tenants(env, &[&["add"], args].concat());
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "a line saying what was made, then the token: {stdout}");
    assert!(lines[0].contains(args[0]), "{stdout}");
    let token = lines[1];
    assert!(token.starts_with("trn_"), "not a token: {token}");
    let hex = &token[4..];
    assert_eq!(hex.len(), 64, "{token}");
    assert!(hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)), "{token}");
    token.to_owned()
}

fn list(env: &Env) -> Vec<Value> {
    let out = tenants(env, &["list", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Every byte of the SQLite store (its database file and any log beside it).
fn database_bytes(env: &Env) -> Vec<u8> {
    let mut bytes = Vec::new();
    for entry in std::fs::read_dir(env.path("state")).unwrap().flatten() {
        if entry.file_name().to_string_lossy().starts_with("tranche.db") {
            bytes.extend(std::fs::read(entry.path()).unwrap());
        }
    }
    assert!(!bytes.is_empty(), "the store is at state/tranche.db");
    bytes
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[test]
fn a_token_is_printed_once_and_never_listed_or_stored() {
    let env = Env::new();
    let token = add(&env, &["acme"]);
    let admin = add(&env, &["root", "--admin"]);
    assert_ne!(token, admin);

    let listed = list(&env);
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert_eq!(
        (listed[0]["name"].as_str(), listed[0]["admin"].as_bool()),
        (Some("acme"), Some(false))
    );
    assert_eq!(
        (listed[1]["name"].as_str(), listed[1]["admin"].as_bool()),
        (Some("root"), Some(true))
    );
    assert!(
        listed.iter().all(|t| t["created_at"].as_i64().unwrap() > 0 && t["revoked_at"].is_null())
    );
    let table = tenants(&env, &["list"]);
    assert!(table.status.success(), "{}", text(&table));
    let table_text = text(&table);
    for column in ["name", "admin", "created", "revoked", "acme", "root"] {
        assert!(table_text.contains(column), "{table_text}");
    }
    for token in [&token, &admin] {
        assert!(!table_text.contains(token.as_str()), "a token in `tenants list`: {table_text}");
        let json = text(&tenants(&env, &["list", "--json"]));
        assert!(!json.contains(token.as_str()), "a token in `tenants list --json`: {json}");
        assert!(!json.contains(&token[4..]), "{json}");
    }

    // Nor is it logged, however verbose.
    let loud = env.tranche().args(["-vv", "tenants", "add", "loud"]).output().unwrap();
    assert!(loud.status.success(), "{}", text(&loud));
    let stdout = String::from_utf8(loud.stdout).unwrap();
    let loud_token = stdout.lines().last().unwrap();
    assert!(!String::from_utf8_lossy(&loud.stderr).contains(&loud_token[4..]), "a token logged");

    let db = database_bytes(&env);
    assert!(contains(&db, "acme"), "the tenant is in the store");
    for token in [&token, &admin] {
        assert!(!contains(&db, token), "the token itself is in the database file");
        assert!(!contains(&db, &token[4..]), "the token's digits are in the database file");
        let hash = hex::encode(Sha256::digest(token.as_bytes()));
        assert!(contains(&db, &hash), "the store keeps the token's SHA-256");
    }
}

#[test]
fn a_taken_or_bad_name_is_bad_usage() {
    let env = Env::new();
    add(&env, &["acme"]);
    let twice = tenants(&env, &["add", "acme", "--admin"]);
    assert_eq!(twice.status.code(), Some(2), "{}", text(&twice));
    assert!(text(&twice).contains("exists already"), "{}", text(&twice));
    assert!(!String::from_utf8_lossy(&twice.stdout).contains("trn_"), "no token for a refusal");
    let long = "x".repeat(65);
    for bad in ["", "a:b", "acme::x", "tab\there", long.as_str()] {
        let out = tenants(&env, &["add", bad]);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", text(&out));
        assert!(text(&out).contains("is not a tenant name"), "{}", text(&out));
        assert!(out.stdout.is_empty(), "{}", text(&out));
    }
    add(&env, &[&"x".repeat(64)]);
    assert_eq!(list(&env).len(), 2, "only acme and the 64-character name");
}

#[test]
fn a_revoked_tenant_is_listed_revoked_and_its_name_may_be_added_again() {
    let env = Env::new();
    let first = add(&env, &["acme"]);
    let out = tenants(&env, &["revoke", "acme"]);
    assert!(out.status.success(), "{}", text(&out));
    let listed = list(&env);
    assert_eq!(listed.len(), 1);
    assert!(listed[0]["revoked_at"].as_i64().unwrap() >= listed[0]["created_at"].as_i64().unwrap());
    let table = text(&tenants(&env, &["list"]));
    let row = table.lines().find(|l| l.contains("acme")).unwrap();
    assert_eq!(row.matches('Z').count(), 2, "created and revoked, in UTC: {table}");

    for unknown in ["acme", "ghost"] {
        let out = tenants(&env, &["revoke", unknown]);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(text(&out).contains("no tenant"), "{}", text(&out));
    }
    let bad = tenants(&env, &["revoke", "a:b"]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));

    let second = add(&env, &["acme"]);
    assert_ne!(first, second);
    let listed = list(&env);
    let revoked: Vec<bool> = listed.iter().map(|t| !t["revoked_at"].is_null()).collect();
    assert_eq!(revoked, [true, false], "the old token revoked, the new one live: {listed:?}");
}
