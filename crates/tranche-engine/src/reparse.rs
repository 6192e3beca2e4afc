//! Re-parsing a job: every answer judged again from the stored raw results, with no provider
//! call; a new schema replaces the job's. Answers now valid succeed, answers now invalid fail
//! (or go out again, as the job's `on_invalid` says), and lines that could not be read before
//! are read again.

use std::collections::{BTreeMap, HashMap};

use futures::TryStreamExt;
use serde::Serialize;
use tracing::info;
use tranche_core::{Endpoint, JobId, JobSettings, OnInvalid, ProviderKind, RequestState};
use tranche_providers::{LineError, LineOutcome};
use tranche_store::{JobRecord, OutputRef, ResultRow, Verdict};

use crate::engine::Engine;
use crate::error::EngineError;
use crate::judge::{self, Judge};
use crate::layout::raw_key;
use crate::policy::{Budget, Failure};
use crate::raw::RawLines;

/// What a re-parse changed. Its keys are printed by `tranche reparse --json`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ReparseReport {
    /// Answers judged again.
    pub judged: u64,
    /// Requests that now succeed and did not before.
    pub promoted: u64,
    /// Answers that succeeded before and now fail their check.
    pub demoted: u64,
    /// Requests that go out again (the job reopens for them).
    pub resent: u64,
    /// Requests whose result lines still cannot be read.
    pub undecodable: u64,
}

/// Why a re-parse was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReparseError {
    #[error("job {0} is still {1}: re-parse it once it has ended")]
    NotEnded(JobId, tranche_core::JobState),
    #[error("job {0} was cancelled: it is not re-parsed (submit its input again instead)")]
    Cancelled(JobId),
    #[error("the new schema: {0}")]
    Schema(#[from] tranche_core::validate::SchemaError),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl From<tranche_store::StoreError> for ReparseError {
    fn from(e: tranche_store::StoreError) -> Self {
        Self::Engine(e.into())
    }
}

/// Verdicts applied per store call.
const VERDICTS: usize = 512;

impl Engine {
    /// Judges every answer of an ended job again from its raw results (no provider call),
    /// under `schema` when one is given (it replaces the job's), and records the new verdicts.
    pub async fn reparse(
        &self,
        job: &JobRecord,
        schema: Option<serde_json::Value>,
    ) -> Result<ReparseReport, ReparseError> {
        if job.state == tranche_core::JobState::Cancelled {
            return Err(ReparseError::Cancelled(job.id));
        }
        if !job.state.is_terminal() {
            return Err(ReparseError::NotEnded(job.id, job.state));
        }
        let mut settings = job.settings.clone();
        if let Some(schema) = schema {
            settings.schema = Some(schema);
            let check = crate::submit::answer_check(&mut settings)?;
            self.store.set_job_check(job.id, &settings, check.as_ref(), self.now()).await?;
        }
        let mut run = Reparse::new(self, job, settings);
        let mut rows = self.store.job_results(job.id);
        let mut window = Vec::with_capacity(VERDICTS);
        while let Some(row) = rows.try_next().await? {
            window.push(row);
            if window.len() == VERDICTS {
                run.judge_window(std::mem::take(&mut window)).await?;
            }
        }
        drop(rows);
        run.judge_window(window).await?;
        run.read_undecodable().await?;
        run.flush().await?;
        let report = run.report;
        if report.resent > 0 && self.store.reopen_job(job.id, self.now()).await? {
            info!(job = %job.id, requests = report.resent, "job reopened for answers to send again");
        }
        info!(job = %job.id, ?report, "re-parsed");
        Ok(report)
    }
}

/// One re-parse in progress.
struct Reparse<'e> {
    engine: &'e Engine,
    job: JobId,
    provider: ProviderKind,
    settings: JobSettings,
    judges: HashMap<Endpoint, Judge>,
    /// Requests whose result line could not be read, by tranche.
    undecodable: BTreeMap<tranche_core::TrancheId, HashMap<String, ResultRow>>,
    verdicts: Vec<Verdict>,
    report: ReparseReport,
}

impl<'e> Reparse<'e> {
    fn new(engine: &'e Engine, job: &JobRecord, settings: JobSettings) -> Self {
        Self {
            engine,
            job: job.id,
            provider: job.provider,
            settings,
            judges: HashMap::new(),
            undecodable: BTreeMap::new(),
            verdicts: Vec::new(),
            report: ReparseReport::default(),
        }
    }

    async fn judge_of(&mut self, endpoint: Endpoint) -> Result<&Judge, EngineError> {
        if !self.judges.contains_key(&endpoint) {
            let check = self.settings.answer_check.as_deref();
            let judge = Judge::load(self.engine.store(), endpoint, check).await?;
            self.judges.insert(endpoint, judge);
        }
        Ok(&self.judges[&endpoint])
    }

    /// Judges a window of the job's requests: answers read in few ranges; requests left
    /// without a readable line are set aside for their raw files.
    async fn judge_window(&mut self, rows: Vec<ResultRow>) -> Result<(), EngineError> {
        let rows: Vec<ResultRow> = rows
            .into_iter()
            .filter_map(|row| match error_code(&row).as_deref() {
                Some(judge::UNDECODABLE_RESULT) => {
                    if let Some(tranche) = row.tranche_id {
                        let wire_id = row.wire_id.clone();
                        self.undecodable.entry(tranche).or_default().insert(wire_id, row);
                    }
                    None
                }
                _ if row.output.is_none() => None,
                _ if row.state == RequestState::Succeeded => Some(row),
                Some(judge::INVALID_OUTPUT) if row.state == RequestState::Failed => Some(row),
                _ => None,
            })
            .collect();
        let bodies = crate::read_outputs(
            &self.engine.config().blobs,
            rows.iter().map(|r| r.output.as_ref()),
        )
        .await?;
        for (row, body) in rows.into_iter().zip(bodies) {
            let Some(body) = body else { continue };
            let (status, request_id) = previous_status(&row);
            self.answer(row, &body, status, request_id).await?;
        }
        self.flush_if_full().await
    }

    /// The verdict on one answer (a response body the provider returned with `status`).
    async fn answer(
        &mut self,
        row: ResultRow,
        body: &str,
        status: u16,
        request_id: Option<String>,
    ) -> Result<(), EngineError> {
        self.report.judged += 1;
        let on_invalid = self.settings.on_invalid;
        let judged = self.judge_of(row.endpoint).await?.judge(body);
        let verdict = match judged {
            Ok(()) if row.state == RequestState::Succeeded => return Ok(()),
            Ok(()) => {
                self.report.promoted += 1;
                Verdict {
                    request_id: row.request_id,
                    state: RequestState::Succeeded,
                    error: None,
                    output: row.output,
                    not_before: 0,
                }
            }
            Err(invalid) => {
                let e =
                    judge::invalid_error(self.provider, status, request_id, &invalid, on_invalid);
                if row.state == RequestState::Succeeded {
                    self.report.demoted += 1;
                }
                let kind = if on_invalid == OnInvalid::Retry {
                    Failure::Retryable
                } else {
                    Failure::Fatal
                };
                self.failed(row, kind, &e)
            }
        };
        self.push(verdict);
        Ok(())
    }

    /// A request whose answer (or line) failed: ended, or sent again while attempts last (the
    /// attempt that brought the answer is spent already).
    fn failed(&mut self, row: ResultRow, kind: Failure, e: &LineError) -> Verdict {
        let budget = Budget {
            attempts: row.attempts.saturating_sub(1),
            max_attempts: row.max_attempts,
            batch_returns: 0,
        };
        let decided = self.engine.config().retries().decide(budget, kind, self.engine.now());
        let error = serde_json::to_string(e).unwrap_or_else(|_| e.message.clone());
        if decided.state == RequestState::Pending {
            self.report.resent += 1;
        }
        Verdict {
            request_id: row.request_id,
            state: decided.state,
            error: Some(error),
            output: (decided.state != RequestState::Pending).then_some(row.output).flatten(),
            not_before: decided.not_before,
        }
    }

    /// Reads the raw files of the tranches with requests whose line could not be read, and
    /// judges the lines that can be read now.
    async fn read_undecodable(&mut self) -> Result<(), EngineError> {
        let waiting = std::mem::take(&mut self.undecodable);
        for (tranche, mut rows) in waiting {
            let Some(record) = self.engine.store().tranche(tranche).await? else { continue };
            let provider = self.engine.provider(record.provider)?.clone();
            for name in ["output.jsonl", "errors.jsonl"] {
                let key = raw_key(tranche, name)?;
                if self.engine.config().blobs.size(&key).await?.is_none() {
                    continue;
                }
                let object = key.as_str().to_owned();
                let mut lines = RawLines::open(&self.engine.config().blobs, key).await?;
                while let Some((start, raw)) = lines.next().await? {
                    let Some(parsed) = std::str::from_utf8(raw)
                        .ok()
                        .and_then(|line| provider.parse_result_line(line).ok())
                    else {
                        continue;
                    };
                    let Some(row) = rows.remove(&parsed.wire_id) else { continue };
                    match parsed.outcome {
                        LineOutcome::Succeeded { status_code, request_id, body, .. } => {
                            let text = std::str::from_utf8(&raw[body.clone()]).unwrap_or_default();
                            let text = text.to_owned();
                            let output = OutputRef::InObject {
                                object: object.clone(),
                                offset: start + body.start as u64,
                                len: body.len() as u64,
                            };
                            let row = ResultRow { output: Some(output), ..row };
                            self.answer(row, &text, status_code, request_id).await?;
                        }
                        LineOutcome::Failed(e) => {
                            self.report.judged += 1;
                            let kind =
                                if e.retryable { Failure::Retryable } else { Failure::Fatal };
                            let verdict = self.failed(ResultRow { output: None, ..row }, kind, &e);
                            self.push(verdict);
                        }
                    }
                }
            }
            self.report.undecodable += rows.len() as u64;
            self.flush_if_full().await?;
        }
        Ok(())
    }

    fn push(&mut self, verdict: Verdict) {
        self.verdicts.push(verdict);
    }

    async fn flush_if_full(&mut self) -> Result<(), EngineError> {
        if self.verdicts.len() >= VERDICTS { self.flush().await } else { Ok(()) }
    }

    async fn flush(&mut self) -> Result<(), EngineError> {
        if !self.verdicts.is_empty() {
            let now = self.engine.now();
            self.engine.store().apply_verdicts(self.job, &self.verdicts, now).await?;
            self.verdicts.clear();
        }
        Ok(())
    }
}

/// The `error.code` a request's stored error carries.
fn error_code(row: &ResultRow) -> Option<String> {
    let error: serde_json::Value = serde_json::from_str(row.error.as_deref()?).ok()?;
    error.get("code")?.as_str().map(str::to_owned)
}

/// The HTTP status and request id the provider answered an ended request with (200 for an
/// answer recorded as a success).
fn previous_status(row: &ResultRow) -> (u16, Option<String>) {
    let error: Option<serde_json::Value> =
        row.error.as_deref().and_then(|e| serde_json::from_str(e).ok());
    let field = |name: &str| error.as_ref().and_then(|e| e.get(name));
    let status = field("status").and_then(serde_json::Value::as_u64);
    let request_id = field("request_id").and_then(serde_json::Value::as_str).map(str::to_owned);
    (status.and_then(|s| u16::try_from(s).ok()).unwrap_or(200), request_id)
}
