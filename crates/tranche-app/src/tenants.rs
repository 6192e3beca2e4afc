//! Tenants of the HTTP server and their bearer tokens: adding one (its token made here and
//! shown once, only its SHA-256 stored), listing, revoking, telling who a token belongs to; and
//! the list of jobs a tenant (or an admin) sees, a keyset page at a time.

use rand::RngCore;
use serde::Serialize;
use sha2::{Digest, Sha256};
use tranche_core::{Clock, SystemClock};
use tranche_store::{JobFilter, TenantRecord};

use crate::App;
use crate::error::AppError;
use crate::views::JobRow;

/// The longest tenant name, in characters.
const MAX_NAME_CHARS: usize = 64;

/// What every bearer token starts with (the rest: 64 lower-case hex digits).
const TOKEN_PREFIX: &str = "trn_";

/// Who a bearer token belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Tenant {
    pub name: String,
    /// May see and act on every tenant's jobs, and manage tenants.
    pub admin: bool,
}

/// Refuses a name a custom id's `tenant::` prefix could not carry (empty, `:` in it, a control
/// character), or one longer than 64 characters.
fn check_name(name: &str) -> Result<(), AppError> {
    let refuse = |reason| Err(AppError::BadTenantName { name: name.to_owned(), reason });
    if name.is_empty() {
        return refuse("it is empty");
    }
    if name.chars().count() > MAX_NAME_CHARS {
        return refuse("it is longer than 64 characters");
    }
    if name.contains(':') {
        return refuse("it contains `:` (a custom id's `tenant::` prefix cannot carry one)");
    }
    if name.chars().any(char::is_control) {
        return refuse("it contains a control character");
    }
    Ok(())
}

/// A new bearer token: `trn_` and 32 random bytes from the thread's generator (seeded by the
/// operating system), as 64 lower-case hex digits.
fn new_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("{TOKEN_PREFIX}{}", hex::encode(bytes))
}

/// What the store keeps of a token: its SHA-256, lower-case hex.
fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

fn now() -> i64 {
    SystemClock.now()
}

impl App {
    /// Adds a tenant and returns its new bearer token, the only time it is seen: the store keeps
    /// its SHA-256 alone. Refused when the name cannot be a tenant's, or a tenant of that name
    /// has a live token (revoke it first).
    pub async fn add_tenant(&self, name: &str, admin: bool) -> Result<String, AppError> {
        check_name(name)?;
        let token = new_token();
        if !self.store.add_tenant(name, &token_hash(&token), admin, now()).await? {
            return Err(AppError::TenantExists(name.to_owned()));
        }
        Ok(token)
    }

    /// Every tenant ever added, revoked ones included, by name.
    pub async fn tenants(&self) -> Result<Vec<TenantRecord>, AppError> {
        Ok(self.store.tenants().await?)
    }

    /// Revokes a tenant's token: it authenticates no more, and the name may be added again.
    pub async fn revoke_tenant(&self, name: &str) -> Result<(), AppError> {
        check_name(name)?;
        if !self.store.revoke_tenant(name, now()).await? {
            return Err(AppError::NoSuchTenant(name.to_owned()));
        }
        Ok(())
    }

    /// Who a bearer token belongs to: `None` for a token that is unknown or revoked.
    pub async fn authenticate(&self, token: &str) -> Result<Option<Tenant>, AppError> {
        let found = self.store.tenant_by_token(&token_hash(token)).await?;
        Ok(found.map(|t| Tenant { name: t.name, admin: t.admin }))
    }

    /// Jobs newest first by (created_at, id), with their counts, as `filter` picks them: a
    /// tenant's (`tenant`, the name jobs were recorded with) or every job, in one state or
    /// any, the page after the job `before` (an unknown one lists nothing), at most `limit`
    /// (taken as given: a caller bounds it).
    pub async fn list_jobs(&self, filter: JobFilter<'_>) -> Result<Vec<JobRow>, AppError> {
        let mut rows = Vec::new();
        for job in self.store.list_jobs(filter).await? {
            let counts = self.store.job_counts(job.id).await?.into();
            rows.push(JobRow { job, counts });
        }
        Ok(rows)
    }
}

#[cfg(test)]
mod tests {
    use tranche_core::{JobSettings, JobState, ProviderKind};

    use super::*;
    use crate::{EngineSettings, Providers};

    /// An app over a fresh SQLite store in `dir`.
    async fn app_in(dir: &std::path::Path) -> App {
        let config = EngineSettings::default().engine_config(dir).unwrap();
        App::open(&dir.join("t.db").to_string_lossy(), config.blobs).await.unwrap()
    }

    #[tokio::test]
    async fn a_token_authenticates_its_tenant_until_revoked() {
        let dir = tempfile::tempdir().unwrap();
        let app = app_in(dir.path()).await;
        let token = app.add_tenant("acme", false).await.unwrap();
        let root = app.add_tenant("root", true).await.unwrap();
        let acme = Tenant { name: "acme".into(), admin: false };
        assert_eq!(app.authenticate(&token).await.unwrap(), Some(acme));
        assert!(app.authenticate(&root).await.unwrap().unwrap().admin);
        assert_eq!(app.authenticate("trn_0").await.unwrap(), None);
        assert_eq!(app.authenticate("").await.unwrap(), None);

        let twice = app.add_tenant("acme", true).await.unwrap_err();
        assert!(twice.is_usage() && twice.to_string().contains("exists already"), "{twice}");
        let bad = app.add_tenant("a::b", false).await.unwrap_err();
        assert!(bad.is_usage(), "{bad}");
        assert!(!bad.to_string().contains(&token));

        app.revoke_tenant("acme").await.unwrap();
        assert_eq!(app.authenticate(&token).await.unwrap(), None);
        let again = app.revoke_tenant("acme").await.unwrap_err();
        assert!(again.is_usage() && again.to_string().contains("no tenant `acme`"), "{again}");
        assert!(app.revoke_tenant("x:y").await.unwrap_err().is_usage());
        let new = app.add_tenant("acme", false).await.unwrap();
        assert_ne!(new, token);
        assert_eq!(app.authenticate(&new).await.unwrap().unwrap().name, "acme");

        let listed = app.tenants().await.unwrap();
        let names: Vec<_> =
            listed.iter().map(|t| (t.name.as_str(), t.revoked_at.is_some())).collect();
        assert_eq!(names, [("acme", true), ("acme", false), ("root", false)]);
        assert!(!format!("{listed:?}").contains("trn_"), "no token in what is listed");
        app.close().await;
    }

    #[tokio::test]
    async fn a_tenant_lists_its_own_jobs_with_their_counts() {
        let dir = tempfile::tempdir().unwrap();
        let app = app_in(dir.path()).await;
        let config = EngineSettings::default().engine_config(dir.path()).unwrap();
        let engine = app.engine(Providers::new(), config).await.unwrap();
        let input = dir.path().join("in.jsonl");
        let line = |id: &str| {
            format!(
                r#"{{"custom_id":"{id}","method":"POST","url":"/v1/chat/completions","body":{{"model":"gpt-4o-mini","messages":[{{"role":"user","content":"hi"}}]}}}}"#
            )
        };
        std::fs::write(&input, format!("{}\n{}\n", line("a"), line("b"))).unwrap();
        let mut jobs = Vec::new();
        for tenant in [Some("acme"), Some("other"), Some("acme"), None] {
            let settings =
                JobSettings { tenant: tenant.map(str::to_owned), ..JobSettings::default() };
            let submitted =
                app.submit_file(&engine, &input, ProviderKind::Openai, settings).await.unwrap();
            jobs.push(submitted.job_id);
        }
        let filter = JobFilter { tenant: Some("acme"), state: None, before: None, limit: 1 };
        let first = app.list_jobs(filter).await.unwrap();
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].job.id, jobs[2], "the newest first");
        assert_eq!(first[0].counts.accepted, 2);
        let next = JobFilter { before: Some(first[0].job.id), limit: 10, ..filter };
        let rest: Vec<_> = app.list_jobs(next).await.unwrap().iter().map(|r| r.job.id).collect();
        assert_eq!(rest, [jobs[0]]);
        let all =
            JobFilter { tenant: None, state: Some(JobState::Pending), before: None, limit: 10 };
        assert_eq!(app.list_jobs(all).await.unwrap().len(), 4);
        app.close().await;
    }

    #[test]
    fn names_a_tenant_prefix_can_carry_and_no_longer_than_64() {
        for good in ["acme", "Acme Corp", "a-b_c.d", "émile", &"x".repeat(64), &"é".repeat(64)] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", "a:b", "a::b", "tab\there", "new\nline", &"x".repeat(65)] {
            let refused = check_name(bad).unwrap_err();
            assert!(refused.is_usage(), "{bad}");
            assert!(refused.to_string().contains("is not a tenant name"), "{refused}");
        }
    }

    #[test]
    fn tokens_are_trn_and_64_hex_digits_each_new_stored_as_sha256() {
        let token = new_token();
        let hex = token.strip_prefix("trn_").unwrap();
        assert_eq!(hex.len(), 64);
        assert!(hex.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)), "{token}");
        assert_ne!(new_token(), token);
        let hash = token_hash(&token);
        assert_eq!(hash.len(), 64);
        assert!(!hash.contains(hex));
        assert_eq!(
            token_hash("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
