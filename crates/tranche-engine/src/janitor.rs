//! The provider-file janitor: what an account's file storage holds and whose it is (the
//! audit), and deleting what no batch needs (the cleanup), never a file a live batch names.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tracing::{info, warn};
use tranche_core::{AccountId, LeaseToken, ProviderKind, TrancheId, TrancheState};
use tranche_providers::{
    BatchId, FileId, InputTransport, Provider, RemoteFile, TRANCHE_ID_METADATA_KEY, UpstreamError,
    tranche_of_file_name,
};
use tranche_store::{FileAuditCounts, StoreError};

use crate::engine::Engine;
use crate::error::EngineError;

/// Seconds in a day.
const DAY: i64 = 86_400;

/// Files listed per page (OpenAI's most).
const FILE_PAGE: u32 = 10_000;

/// Batches listed per page (OpenAI's and Azure's most).
const BATCH_PAGE: u32 = 100;

/// What stops an audit or a cleanup.
#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    /// The provider refused a listing or a delete; its facts are kept whole.
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl From<StoreError> for FilesError {
    fn from(e: StoreError) -> Self {
        Self::Engine(e.into())
    }
}

/// Whose a file at the provider is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FileClass {
    /// A tranche's this store knows (recorded, named after it, or named by its batch).
    Owned,
    /// Named like tranche's files, or named by a batch carrying tranche's metadata, but of a
    /// tranche this store does not know (a lost store, or another installation's).
    Orphaned,
    /// Anything else: another application's.
    Foreign,
}

/// How much of the account's storage its provider allows; `None` where it sets no count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileLimits {
    #[serde(default)]
    pub with_expiry: Option<u64>,
    #[serde(default)]
    pub without_expiry: Option<u64>,
}

impl FileLimits {
    /// Azure OpenAI's documented per-resource limits on batch input files.
    pub const AZURE: Self = Self { with_expiry: Some(10_000), without_expiry: Some(500) };
}

/// Counts of an account's files.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct FileTally {
    pub total: u64,
    pub with_expiry: u64,
    pub without_expiry: u64,
    pub owned: u64,
    pub orphaned: u64,
    pub foreign: u64,
    pub by_purpose: BTreeMap<String, u64>,
}

/// Days until each limit is reached at the growth seen since the account's earliest audit of
/// the last 30 days; `None` with no earlier audit, no limit, or no growth.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct DaysToLimit {
    pub with_expiry: Option<f64>,
    pub without_expiry: Option<f64>,
}

/// One account's audit, as `tranche files audit --json` prints it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FileAudit {
    pub provider: ProviderKind,
    /// Where the account is reached (its base URL).
    pub endpoint: String,
    pub files: FileTally,
    pub limits: FileLimits,
    pub uploads_7d: u64,
    pub uploads_30d: u64,
    pub days_to_limit: DaysToLimit,
}

/// What a cleanup may delete beyond tranche's own files.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CleanupOptions {
    /// List what would be deleted, delete nothing.
    pub dry_run: bool,
    /// Delete other applications' batch input and output files too (never their batches'
    /// error files, kept for their investigation).
    pub include_foreign: bool,
}

/// A file a cleanup deleted (or, dry, would delete).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CleanedFile {
    pub id: String,
    pub filename: String,
    pub purpose: String,
    pub class: FileClass,
    pub created_at: i64,
}

/// A file a cleanup meant to delete and could not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FailedDelete {
    pub id: String,
    pub error: String,
}

/// What one cleanup of an account did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CleanupReport {
    pub provider: ProviderKind,
    pub endpoint: String,
    pub dry_run: bool,
    /// Batches still running at the provider, whoever made them.
    pub live_batches: u64,
    /// Files kept because a live batch names them.
    pub held_by_live_batches: u64,
    pub deleted: Vec<CleanedFile>,
    pub failed: Vec<FailedDelete>,
}

/// One file as the survey found it.
struct Seen {
    file: RemoteFile,
    class: FileClass,
    /// The tranche this store knows it by, and where that stands.
    tranche: Option<(TrancheId, TrancheState)>,
    /// Whether a batch that has not ended names it.
    live: bool,
    /// Whether it is some batch's error file.
    errors: bool,
}

/// An account's files and batches, read from the provider and matched with the store.
struct Survey {
    files: Vec<Seen>,
    live_batches: u64,
}

impl Engine {
    /// The accounts of the configured providers whose batches start from files.
    pub fn file_accounts(&self) -> Vec<Arc<dyn Provider>> {
        self.providers
            .all()
            .filter(|p| p.transport() == InputTransport::UploadFile)
            .cloned()
            .collect()
    }

    /// Counts `kind`'s account's files by whose they are, and keeps the counts so later
    /// audits can tell how fast they grow.
    pub async fn audit_files(&self, kind: ProviderKind) -> Result<FileAudit, FilesError> {
        let provider = self.provider(kind)?;
        let account = provider.account();
        let survey = self.survey(provider.as_ref()).await?;
        let now = self.now();
        let mut files = FileTally::default();
        let (mut inputs_with_expiry, mut inputs_without_expiry) = (0, 0);
        for seen in &survey.files {
            files.total += 1;
            let expires = seen.file.expires_at.is_some();
            if expires {
                files.with_expiry += 1;
            } else {
                files.without_expiry += 1;
            }
            if seen.file.purpose == "batch" {
                if expires {
                    inputs_with_expiry += 1;
                } else {
                    inputs_without_expiry += 1;
                }
            }
            match seen.class {
                FileClass::Owned => files.owned += 1,
                FileClass::Orphaned => files.orphaned += 1,
                FileClass::Foreign => files.foreign += 1,
            }
            *files.by_purpose.entry(seen.file.purpose.clone()).or_default() += 1;
        }
        let limits = self.config.file_limits.get(&kind).copied().unwrap_or_default();
        let counts = FileAuditCounts {
            account: account.clone(),
            at: now,
            total: files.total,
            inputs_with_expiry,
            inputs_without_expiry,
        };
        let earlier = self.store.first_file_audit(&account, now - 30 * DAY).await?;
        self.store.record_file_audit(&counts).await?;
        let days_to_limit = earlier.map(|e| days_to_limit(&e, &counts, limits)).unwrap_or_default();
        Ok(FileAudit {
            provider: kind,
            endpoint: endpoint_of(&account),
            files,
            limits,
            uploads_7d: self.store.uploads_since(kind, Some(&account), now - 7 * DAY).await?,
            uploads_30d: self.store.uploads_since(kind, Some(&account), now - 30 * DAY).await?,
            days_to_limit,
        })
    }

    /// Deletes from `kind`'s account what no batch needs: files of tranches that have ended,
    /// orphans older than the grace period, and (asked for) other applications' batch files.
    /// The account's live batches are listed first, whoever made them, and no file one names
    /// is deleted.
    pub async fn clean_files(
        &self,
        kind: ProviderKind,
        options: CleanupOptions,
    ) -> Result<CleanupReport, FilesError> {
        let provider = self.provider(kind)?;
        let account = provider.account();
        let survey = self.survey(provider.as_ref()).await?;
        let now = self.now();
        let grace = i64::try_from(self.config.orphan_grace.as_secs()).unwrap_or(i64::MAX);
        let mut report = CleanupReport {
            provider: kind,
            endpoint: endpoint_of(&account),
            dry_run: options.dry_run,
            live_batches: survey.live_batches,
            held_by_live_batches: 0,
            deleted: Vec::new(),
            failed: Vec::new(),
        };
        for seen in survey.files {
            let wanted = match seen.class {
                FileClass::Owned => seen.tranche.is_some_and(|(_, state)| state.is_terminal()),
                // A zero grace takes every orphan, whatever the provider's clock says.
                FileClass::Orphaned => {
                    grace == 0 || now.saturating_sub(seen.file.created_at) >= grace
                }
                // Another application's error files are kept for its investigation (tranche's
                // own are copied before they are deleted).
                FileClass::Foreign => {
                    options.include_foreign
                        && !seen.errors
                        && matches!(seen.file.purpose.as_str(), "batch" | "batch_output")
                }
            };
            if !wanted {
                continue;
            }
            if seen.live {
                report.held_by_live_batches += 1;
                continue;
            }
            let cleaned = CleanedFile {
                id: seen.file.id.as_str().to_owned(),
                filename: seen.file.filename.clone(),
                purpose: seen.file.purpose.clone(),
                class: seen.class,
                created_at: seen.file.created_at,
            };
            if options.dry_run {
                report.deleted.push(cleaned);
                continue;
            }
            match provider.delete_file(&seen.file.id).await {
                Ok(()) => {
                    self.store.mark_file_deleted(kind, seen.file.id.as_str(), self.now()).await?;
                    report.deleted.push(cleaned);
                }
                Err(e) => {
                    warn!(provider = %kind, file = %seen.file.id, error = %e, "cannot delete a provider file");
                    report.failed.push(FailedDelete { id: cleaned.id, error: e.to_string() });
                }
            }
        }
        if !options.dry_run && !report.deleted.is_empty() {
            info!(provider = %kind, deleted = report.deleted.len(), "cleaned up provider files");
        }
        Ok(report)
    }

    /// A safe cleanup (tranche's own files and old orphans) of the account `tranche` uses,
    /// for an upload the provider refused for a full storage. Returns how many files went.
    pub(crate) async fn free_storage(&self, kind: ProviderKind) -> u64 {
        match self.clean_files(kind, CleanupOptions::default()).await {
            Ok(report) => report.deleted.len() as u64,
            Err(e) => {
                warn!(provider = %kind, error = %e, "cannot clean up the account's files");
                0
            }
        }
    }

    /// Starts the periodic cleanup of each file account whose turn has come, across every
    /// engine of the store: the duty's lease is held for a whole interval and never handed
    /// back, so the next engine to take it does so an interval later. The cleanup runs among
    /// `chores`, not holding up the round.
    pub(crate) async fn janitor_if_due(
        &self,
        interval: std::time::Duration,
        chores: &mut tokio::task::JoinSet<()>,
    ) -> Result<(), EngineError> {
        for provider in self.file_accounts() {
            // An account no tranche went to is left to `tranche files cleanup`.
            if !self.store.account_used(&provider.account()).await? {
                continue;
            }
            let duty = format!("janitor:{}", provider.account());
            let token = LeaseToken::new();
            if self.store.acquire_duty(&duty, &self.id, token, interval).await?.is_none() {
                continue;
            }
            let engine = self.clone();
            let kind = provider.kind();
            chores.spawn(async move {
                if let Err(e) = engine.clean_files(kind, CleanupOptions::default()).await {
                    warn!(provider = %kind, error = %e, "the periodic cleanup of provider files failed");
                }
            });
        }
        Ok(())
    }

    /// Lists the account's files, then its batches (so that a batch made from a listed file
    /// is seen), and matches both with the store.
    async fn survey(&self, provider: &dyn Provider) -> Result<Survey, FilesError> {
        let kind = provider.kind();
        let files = list_all_files(provider).await?;
        // Which batches name which files, and the tranche their metadata names.
        let mut named: HashMap<FileId, Option<TrancheId>> = HashMap::new();
        let mut live_named: HashSet<FileId> = HashSet::new();
        let mut error_files: HashSet<FileId> = HashSet::new();
        let mut live_batches = 0;
        let mut after: Option<BatchId> = None;
        loop {
            let page = provider.list_batches(after.as_ref(), BATCH_PAGE).await?;
            for batch in &page.data {
                let live = !batch.status.is_terminal();
                live_batches += u64::from(live);
                let tranche = batch
                    .metadata
                    .get(TRANCHE_ID_METADATA_KEY)
                    .and_then(|id| id.parse::<TrancheId>().ok());
                error_files.extend(batch.error_file_id.clone());
                for file in [&batch.input_file_id, &batch.output_file_id, &batch.error_file_id]
                    .into_iter()
                    .flatten()
                {
                    named.insert(file.clone(), tranche);
                    if live {
                        live_named.insert(file.clone());
                    }
                }
            }
            match page.last_id {
                Some(next) if page.has_more && after.as_ref() != Some(&next) => after = Some(next),
                _ => break,
            }
        }
        let ids: Vec<String> = files.iter().map(|f| f.id.as_str().to_owned()).collect();
        let owners: HashMap<String, (TrancheId, TrancheState)> = self
            .store
            .file_owners(kind, &ids)
            .await?
            .into_iter()
            .map(|o| (o.file_id, (o.tranche_id, o.tranche_state)))
            .collect();
        // The tranche each unrecorded file points at: its batch's metadata, else its name.
        let pointed: Vec<Option<TrancheId>> = files
            .iter()
            .map(|f| {
                if owners.contains_key(f.id.as_str()) {
                    return None;
                }
                named.get(&f.id).copied().flatten().or_else(|| tranche_of_file_name(&f.filename))
            })
            .collect();
        let asked: Vec<TrancheId> = pointed.iter().flatten().copied().collect();
        let states: HashMap<TrancheId, TrancheState> =
            self.store.tranche_states(&asked).await?.into_iter().collect();
        let files = files
            .into_iter()
            .zip(pointed)
            .map(|(file, pointed)| {
                let live = live_named.contains(&file.id);
                let errors = error_files.contains(&file.id);
                let (class, tranche) = if let Some(owner) = owners.get(file.id.as_str()) {
                    (FileClass::Owned, Some(*owner))
                } else if let Some(tranche) = pointed {
                    match states.get(&tranche) {
                        Some(state) => (FileClass::Owned, Some((tranche, *state))),
                        None => (FileClass::Orphaned, None),
                    }
                } else {
                    (FileClass::Foreign, None)
                };
                Seen { file, class, tranche, live, errors }
            })
            .collect();
        Ok(Survey { files, live_batches })
    }
}

/// Every file the account holds, page by page.
async fn list_all_files(provider: &dyn Provider) -> Result<Vec<RemoteFile>, UpstreamError> {
    let mut files = Vec::new();
    let mut after: Option<FileId> = None;
    loop {
        let page = provider.list_files(after.as_ref(), FILE_PAGE).await?;
        files.extend(page.data);
        match page.last_id {
            Some(next) if page.has_more && after.as_ref() != Some(&next) => after = Some(next),
            _ => return Ok(files),
        }
    }
}

/// The base URL of an account (its id is `<provider> <base url>`).
fn endpoint_of(account: &AccountId) -> String {
    let id = account.as_str();
    id.split_once(' ').map_or(id, |(_, location)| location).to_owned()
}

/// Days to each limit at the growth of batch input files from `earlier` to `now`.
fn days_to_limit(
    earlier: &FileAuditCounts,
    now: &FileAuditCounts,
    limits: FileLimits,
) -> DaysToLimit {
    let days = (now.at - earlier.at) as f64 / DAY as f64;
    let project = |before: u64, current: u64, limit: Option<u64>| {
        let limit = limit?;
        let growth = (current as f64 - before as f64) / days;
        if days <= 0.0 || growth <= 0.0 {
            return None;
        }
        let left = limit.saturating_sub(current) as f64 / growth;
        Some((left * 10.0).round() / 10.0)
    };
    DaysToLimit {
        with_expiry: project(
            earlier.inputs_with_expiry,
            now.inputs_with_expiry,
            limits.with_expiry,
        ),
        without_expiry: project(
            earlier.inputs_without_expiry,
            now.inputs_without_expiry,
            limits.without_expiry,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(at: i64, with: u64, without: u64) -> FileAuditCounts {
        FileAuditCounts {
            account: AccountId::from_stored("azure http://x"),
            at,
            total: with + without,
            inputs_with_expiry: with,
            inputs_without_expiry: without,
        }
    }

    #[test]
    fn days_to_a_limit_follow_the_growth_between_audits() {
        // 2 more files with expiry a day, 450 of 500 without expiry growing by 25 a day.
        let days = days_to_limit(&counts(0, 4, 400), &counts(2 * DAY, 8, 450), FileLimits::AZURE);
        assert_eq!(days.with_expiry, Some(4996.0));
        assert_eq!(days.without_expiry, Some(2.0));
        // Falling, flat, the same instant, or no limit: no forecast.
        let flat = days_to_limit(&counts(0, 8, 500), &counts(DAY, 8, 450), FileLimits::AZURE);
        assert_eq!(flat, DaysToLimit::default());
        let instant = days_to_limit(&counts(5, 1, 1), &counts(5, 9, 9), FileLimits::AZURE);
        assert_eq!(instant, DaysToLimit::default());
        let none = days_to_limit(&counts(0, 1, 1), &counts(DAY, 9, 9), FileLimits::default());
        assert_eq!(none, DaysToLimit::default());
        // Past the limit already: zero days.
        let over = days_to_limit(&counts(0, 0, 499), &counts(DAY, 0, 510), FileLimits::AZURE);
        assert_eq!(over.without_expiry, Some(0.0));
    }

    #[test]
    fn an_endpoint_is_the_account_without_its_provider() {
        let account = AccountId::new(ProviderKind::Azure, "http://127.0.0.1:9/openai/v1/");
        assert_eq!(endpoint_of(&account), "http://127.0.0.1:9/openai/v1");
    }
}
