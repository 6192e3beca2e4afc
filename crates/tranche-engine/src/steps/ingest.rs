//! Ingesting raw results: each line matched to its request by wire id, successes recorded
//! in bulk, failures decided one by one by the retry policy, the rest accounted for.

use futures::TryStreamExt;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_util::io::StreamReader;
use tracing::{info, warn};
use tranche_core::TrancheState;
use tranche_providers::{BatchStatus, LineError, LineOutcome, Provider};
use tranche_store::{
    AttemptInfo, AttemptOutcome, OutputRef, ResultUpdate, Success, TrancheRecord, TrancheUpdate,
};

use crate::engine::{Engine, StepError};
use crate::error::EngineError;
use crate::layout::raw_key;
use crate::lease::Lease;
use crate::policy::{self, Budget, Failure};

fn line_error_json(e: &LineError) -> String {
    serde_json::to_string(e).unwrap_or_else(|_| e.message.clone())
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
        let mut writer = self.store.begin_ingest(tranche.id, lease.held()).await?;
        /// Successful lines recorded per call; failures are few and kept until the end.
        const SUCCESS_CHUNK: usize = 512;
        let (mut matched, mut unknown, mut unparsable) = (0u64, 0u64, 0u64);
        let mut successes = Vec::with_capacity(SUCCESS_CHUNK);
        let mut failures = Vec::new();
        for name in files {
            let key = raw_key(tranche.id, name).map_err(EngineError::from)?;
            let chunks = self.config.blobs.stream(&key).await.map_err(EngineError::from)?;
            let reader = StreamReader::new(chunks.map_err(std::io::Error::other));
            let mut reader = BufReader::new(reader);
            let path = std::path::PathBuf::from(key.as_str());
            // Where each line starts in the raw file: an answer is kept as its range there.
            let (mut raw, mut next_start) = (Vec::new(), 0u64);
            loop {
                raw.clear();
                let line_start = next_start;
                let n = reader
                    .read_until(b'\n', &mut raw)
                    .await
                    .map_err(EngineError::io("reading", &path))?;
                if n == 0 {
                    break;
                }
                next_start += n as u64;
                let Ok(line) = std::str::from_utf8(&raw) else {
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
                    LineOutcome::Succeeded { status_code, body, usage, .. } => {
                        // The body is kept as its byte range in the raw file, exactly as sent.
                        let output = OutputRef::InObject {
                            object: key.as_str().to_owned(),
                            offset: line_start + body.start as u64,
                            len: body.len() as u64,
                        };
                        successes.push(Success {
                            wire_id: parsed.wire_id,
                            status_code,
                            output,
                            input_tokens: usage.input_tokens,
                            output_tokens: usage.output_tokens,
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
        let status = tranche.batch_status.as_deref().and_then(|s| {
            serde_json::from_value::<BatchStatus>(serde_json::Value::String(s.to_owned())).ok()
        });
        let rest = policy::unanswered(
            tranche.provider,
            status,
            tranche.batch_errors.as_ref(),
            tranche.cancel_requested,
        );
        let error = rest.error.to_string();
        let mut missing = 0u64;
        for (wire_id, info) in writer.unanswered().await? {
            let update = self.failure_update(info, rest.failure, rest.outcome, None, &error, now);
            missing += u64::from(writer.record(&wire_id, &update).await?);
        }
        self.commit(lease, writer, TrancheState::Cleaning, now).await?;
        info!(tranche = %tranche.id, matched, missing, unknown, unparsable, "ingested results");
        Ok(())
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
            input_tokens: None,
            output_tokens: None,
            spends_attempt: verdict.spends_attempt,
            not_before: verdict.not_before,
            at: now,
        }
    }
}
