//! Ingesting raw results: each line matched to its request by wire id, successes recorded
//! in bulk, failures decided one by one by the retry policy, the rest accounted for.

use tracing::{info, warn};
use tranche_core::{OnInvalid, TrancheState};
use tranche_providers::{BatchStatus, LineError, LineOutcome, Provider, Usage};
use tranche_store::{
    AttemptInfo, AttemptOutcome, Billed, OutputRef, ResultUpdate, Success, TrancheRecord,
    TrancheUpdate,
};

use crate::engine::{Engine, StepError};
use crate::error::EngineError;
use crate::judge::{self, Judge};
use crate::layout::raw_key;
use crate::lease::Lease;
use crate::policy::{self, Budget, Failure};
use crate::raw::RawLines;

fn line_error_json(e: &LineError) -> String {
    serde_json::to_string(e).unwrap_or_else(|_| e.message.clone())
}

/// A result line whose answer failed the tranche's check, decided after the successes.
struct InvalidLine {
    wire_id: String,
    status_code: u16,
    request_id: Option<String>,
    output: OutputRef,
    billed: Option<Billed>,
    invalid: tranche_core::validate::Invalid,
}

/// What a successful line was billed for: its usage under the model it names (the tranche's,
/// where it names none).
fn billed(tranche: &TrancheRecord, usage: Usage) -> Option<Billed> {
    let tokens = usage.tokens?;
    Some(Billed { model: usage.model.unwrap_or_else(|| tranche.model.clone()), tokens })
}

impl Engine {
    pub(crate) async fn ingest(
        &self,
        provider: &dyn Provider,
        tranche: &TrancheRecord,
        lease: &Lease,
    ) -> Result<(), StepError> {
        let now = self.now();
        // Which raw files there are, settled before the ingest's transaction begins (finding
        // one may move it into the blob store and record it).
        let mut files = Vec::new();
        for (name, expected) in [
            ("output.jsonl", tranche.output_file_id.is_some() || tranche.results_url.is_some()),
            ("errors.jsonl", tranche.error_file_id.is_some()),
        ] {
            if self.has_raw(tranche.id, name).await? {
                files.push(name);
            } else if expected {
                // A result file the batch has but the blob store lacks (or holds other than
                // it was stored) is collected again, never taken as empty.
                warn!(tranche = %tranche.id, file = name, "raw results missing; collecting them again");
                let update = TrancheUpdate::to(TrancheState::Collecting, now);
                return Ok(self.transition(lease, update).await?);
            }
        }
        let judge =
            Judge::load(&*self.store, tranche.endpoint, tranche.answer_check.as_deref()).await?;
        let mut writer = self.store.begin_ingest(tranche.id, lease.held()).await?;
        /// Successful lines recorded per call; failures are few and kept until the end. A
        /// store finds a call's requests together, and the more a call holds the closer
        /// together they lie (SQLite at a tranche of 50,000: 13 µs a line at 512, 5.6 at
        /// 4,096). Each call walks the whole tranche once, and SQLite reads again every page
        /// of it the small cache has dropped (its index and attempts; each attempt's foreign
        /// key looked its request's row up too, until the SQLite store wrote them unchecked):
        /// staging 100,000 results read 337 MB of the database at 4,096 a call, in
        /// 0.27 s, and 0.22 s at 8,192; `tranche run` at 100,000 requests 2.99 CPU-s against
        /// 3.07 (5 alternating pairs). 8,192 lines are about 2 MB; peak RSS at 1,000,000
        /// requests 33-36 MB over four runs (32-34 at 4,096; 30-32 at 10,000 requests). At
        /// 16,384 it reached 36-38, too near 1.2 times that of 10,000, for no CPU measurably
        /// saved at 1,000,000.
        const SUCCESS_CHUNK: usize = 8192;
        let (mut matched, mut unknown, mut unparsable) = (0u64, 0u64, 0u64);
        let mut successes = Vec::with_capacity(SUCCESS_CHUNK);
        let mut failures = Vec::new();
        let mut invalids = Vec::new();
        for name in files {
            let key = raw_key(tranche.id, name).map_err(EngineError::from)?;
            let object = key.as_str().to_owned();
            let mut lines = RawLines::open(&self.config.blobs, key).await?;
            while let Some((line_start, raw)) = lines.next().await? {
                let Ok(line) = std::str::from_utf8(raw) else {
                    unparsable += 1;
                    warn!(tranche = %tranche.id, file = name, "a result line is not UTF-8");
                    continue;
                };
                if line.trim().is_empty() {
                    continue;
                }
                let parsed = match provider.parse_result_line(line) {
                    Ok(parsed) => parsed,
                    Err(e) => {
                        unparsable += 1;
                        warn!(tranche = %tranche.id, file = name, error = %e, "unparsable result line");
                        continue;
                    }
                };
                match parsed.outcome {
                    LineOutcome::Succeeded { status_code, request_id, body, usage } => {
                        // The body is kept as its byte range in the raw file, exactly as sent.
                        let output = OutputRef::InObject {
                            object: object.clone(),
                            offset: line_start + body.start as u64,
                            len: body.len() as u64,
                        };
                        if !judge.passes_all()
                            && let Err(invalid) = judge.judge(&line[body])
                        {
                            invalids.push(InvalidLine {
                                wire_id: parsed.wire_id,
                                status_code,
                                request_id,
                                output,
                                billed: billed(tranche, usage),
                                invalid,
                            });
                            continue;
                        }
                        successes.push(Success {
                            wire_id: parsed.wire_id,
                            status_code,
                            output,
                            billed: billed(tranche, usage),
                        });
                        if successes.len() >= SUCCESS_CHUNK {
                            let sent = successes.len() as u64;
                            let recorded = writer.record_successes(&mut successes, now).await?;
                            matched += recorded;
                            unknown += sent - recorded;
                        }
                    }
                    // Failures are decided one by one (each by its own retry budget), after
                    // the successes: a provider that answered a request twice, once well,
                    // has answered it.
                    LineOutcome::Failed(e) => failures.push((parsed.wire_id, e)),
                }
            }
        }
        let sent = successes.len() as u64;
        let recorded = writer.record_successes(&mut successes, now).await?;
        matched += recorded;
        unknown += sent - recorded;
        for (wire_id, e) in failures {
            let Some(info) = writer.attempt_info(&wire_id).await? else {
                unknown += 1;
                warn!(tranche = %tranche.id, wire_id = %wire_id, "result line matches no waiting request");
                continue;
            };
            let (outcome, kind) =
                policy::classify_line(e.code.as_deref(), e.retryable, tranche.cancel_requested);
            let error = line_error_json(&e);
            let update = self.failure_update(info, kind, outcome, e.status, &error, now);
            if writer.record(&wire_id, &update).await? {
                matched += 1;
            } else {
                unknown += 1;
                warn!(tranche = %tranche.id, wire_id = %wire_id, "result line matches no waiting request");
            }
        }
        let (recorded, unknown_invalid) =
            self.record_invalid(tranche, &mut *writer, invalids, now).await?;
        matched += recorded;
        unknown += unknown_invalid;
        let status = tranche.batch_status.as_deref().and_then(|s| {
            serde_json::from_value::<BatchStatus>(serde_json::Value::String(s.to_owned())).ok()
        });
        let rest = policy::unanswered(
            tranche.provider,
            status,
            tranche.batch_errors.as_ref(),
            tranche.cancel_requested,
        );
        // A request without a result in a batch with unreadable lines may have its answer
        // among them: it waits for a re-parse instead of being sent (and billed) again.
        let (error, failure) = if unparsable > 0 {
            let e = judge::undecodable_error(tranche.provider, unparsable);
            (line_error_json(&e), Failure::Fatal)
        } else {
            (rest.error.to_string(), rest.failure)
        };
        let mut missing = 0u64;
        for (wire_id, info) in writer.unanswered().await? {
            let update = self.failure_update(info, failure, rest.outcome, None, &error, now);
            missing += u64::from(writer.record(&wire_id, &update).await?);
        }
        self.commit(lease, writer, TrancheState::Cleaning, now).await?;
        info!(tranche = %tranche.id, matched, missing, unknown, unparsable, "ingested results");
        Ok(())
    }

    /// Records the answers that failed the tranche's check, each as its job says (sent again
    /// while attempts last, or ended failed), keeping the answer of a request that ends.
    /// Returns how many were recorded and how many matched no waiting request.
    async fn record_invalid(
        &self,
        tranche: &TrancheRecord,
        writer: &mut dyn tranche_store::IngestWriter,
        invalids: Vec<InvalidLine>,
        now: i64,
    ) -> Result<(u64, u64), EngineError> {
        let (mut recorded, mut unknown) = (0, 0);
        let mut on_invalid = std::collections::HashMap::new();
        for line in invalids {
            let Some(info) = writer.attempt_info(&line.wire_id).await? else {
                unknown += 1;
                continue;
            };
            let rule = match on_invalid.get(&info.job_id) {
                Some(rule) => *rule,
                None => {
                    let job = self.store.job(info.job_id).await?;
                    let rule = job.map(|j| j.settings.on_invalid).unwrap_or_default();
                    *on_invalid.entry(info.job_id).or_insert(rule)
                }
            };
            let e = judge::invalid_error(
                tranche.provider,
                line.status_code,
                line.request_id,
                &line.invalid,
                rule,
            );
            let kind = match rule {
                OnInvalid::Retry => Failure::Retryable,
                OnInvalid::Fail => Failure::Fatal,
            };
            let error = line_error_json(&e);
            let mut update = self.failure_update(
                info,
                kind,
                AttemptOutcome::Errored,
                Some(line.status_code),
                &error,
                now,
            );
            update.output = Some(&line.output);
            update.billed = line.billed.as_ref();
            if writer.record(&line.wire_id, &update).await? {
                recorded += 1;
            } else {
                unknown += 1;
            }
        }
        if recorded > 0 {
            info!(tranche = %tranche.id, answers = recorded, "answers failed the job's schema");
        }
        Ok((recorded, unknown))
    }

    /// What a failure means for one request, as policy decides it: retried later, or ended.
    pub(crate) fn failure_update<'a>(
        &self,
        info: AttemptInfo,
        kind: Failure,
        outcome: AttemptOutcome,
        status_code: Option<u16>,
        error: &'a str,
        now: i64,
    ) -> ResultUpdate<'a> {
        let budget = Budget {
            attempts: info.attempts,
            max_attempts: info.max_attempts,
            batch_returns: info.batch_returns,
        };
        let verdict = self.config.retries().decide(budget, kind, now);
        ResultUpdate {
            state: verdict.state,
            outcome,
            status_code,
            output: None,
            error: Some(error),
            billed: None,
            spends_attempt: verdict.spends_attempt,
            not_before: verdict.not_before,
            at: now,
        }
    }
}
