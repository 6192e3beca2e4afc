//! Accepting a job: parse and fingerprint every line, store all of it in one transaction,
//! or store nothing.

use tokio::io::{AsyncBufRead, AsyncBufReadExt};
use tranche_blob::BlobWriter;
use tranche_core::cache_marks;
use tranche_core::codec::{input_line_len, wire_id};
use tranche_core::estimate::worst_case;
use tranche_core::hash::canonical_json;
use tranche_core::input::{
    ErrorCollector, InputError, InputParser, ParsedRequest, Rejected, duplicate,
};
use tranche_core::plan::TrancheLimits;
use tranche_core::validate::AnswerSchema;
use tranche_core::{CacheSharedPrompt, JobId, JobSettings, ProviderKind, Usd};
use tranche_store::{JobWriter, NewAnswerCheck, NewJob, NewRequest, RequestBody, StoreError};

use crate::engine::Engine;
use crate::layout::body_key;

/// A job accepted durably.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Submitted {
    pub job_id: JobId,
    pub accepted: u64,
}

/// Why a job was not accepted. Nothing of it was stored.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SubmitError {
    #[error("{0}")]
    Rejected(#[from] Rejected),
    #[error("cannot read the input: {0}")]
    Read(#[source] std::io::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The request bodies could not be written to the blob store.
    #[error(transparent)]
    Blob(#[from] tranche_blob::BlobError),
    /// The job's schema is not a usable JSON Schema.
    #[error("the job's schema: {0}")]
    Schema(#[from] tranche_core::validate::SchemaError),
}

/// The answer check a job's settings ask for (`None` without a schema), its id set in them.
pub(crate) fn answer_check(
    settings: &mut JobSettings,
) -> Result<Option<NewAnswerCheck>, tranche_core::validate::SchemaError> {
    let Some(schema) = &settings.schema else {
        settings.answer_check = None;
        return Ok(None);
    };
    let compiled = AnswerSchema::new(schema)?;
    let id = compiled.check_id(settings.lenient_json);
    settings.answer_check = Some(id.clone());
    Ok(Some(NewAnswerCheck {
        id,
        schema: canonical_json(schema),
        lenient_json: settings.lenient_json,
    }))
}

impl Engine {
    /// Parses `input` line by line, as `settings` say, and records it as one job for
    /// `provider_kind`. A job with any bad line is rejected whole: every bad line is reported
    /// (up to a limit) and nothing is stored. `source` names the input, for display.
    pub async fn submit<R: AsyncBufRead + Unpin>(
        &self,
        mut input: R,
        provider_kind: ProviderKind,
        mut settings: JobSettings,
        source: Option<String>,
    ) -> Result<Submitted, SubmitError> {
        let answer_check = answer_check(&mut settings)?;
        let budgeted = settings.budget.is_some();
        let options = settings.input_options(provider_kind);
        let limits = self.config().limits(provider_kind);
        let accepted_at = self.now();
        let max_attempts =
            settings.max_attempts.filter(|&n| n > 0).unwrap_or(self.config().max_attempts);
        // A system prompt that may go out marked for caching is measured with its mark.
        let room_for_marks = provider_kind == ProviderKind::Anthropic
            && settings.cache_shared_prompt == CacheSharedPrompt::Auto;
        let job_id = JobId::new();
        // The job's canonical bodies, one a line, rest in one blob-store object; each request
        // row points at its range. The object is whole before the job that references it is
        // committed, and given up with the job when it is refused.
        let body_key = body_key(job_id)?;
        let mut bodies = self.config().blobs.writer(&body_key);
        let mut writer = self
            .store()
            .begin_job(NewJob {
                id: job_id,
                provider: provider_kind,
                source,
                settings,
                body_object: Some(body_key.as_str().to_owned()),
                answer_check,
                created_at: self.now(),
            })
            .await?;
        let accepted = self
            .accept_lines(
                &mut input,
                provider_kind,
                options,
                limits,
                (max_attempts, budgeted),
                room_for_marks,
                accepted_at,
                &mut *writer,
                &mut bodies,
            )
            .await;
        if let Err(e) = accepted {
            // Dropping the store's writer rolls the job back; the bodies go too.
            let _ = bodies.abort().await;
            return Err(e);
        }
        let stored = bodies.finish().await?;
        writer.body_object(self.record_of(&stored));
        let accepted = writer.commit().await?;
        Ok(Submitted { job_id, accepted })
    }

    /// Reads, checks and records every line of a job (bodies into `bodies`, rows into
    /// `writer`), or refuses the job with every bad line named.
    #[expect(clippy::too_many_arguments, reason = "one job's whole context, used once")]
    async fn accept_lines<R: AsyncBufRead + Unpin>(
        &self,
        input: &mut R,
        provider_kind: ProviderKind,
        options: tranche_core::input::InputOptions,
        limits: TrancheLimits,
        (max_attempts, budgeted): (u32, bool),
        room_for_marks: bool,
        accepted_at: i64,
        writer: &mut dyn JobWriter,
        bodies: &mut BlobWriter,
    ) -> Result<(), SubmitError> {
        let mut body_offset = 0u64;
        let mut parser = InputParser::without_duplicate_check(options);
        let mut errors = ErrorCollector::default();
        let mut raw = Vec::new();
        loop {
            raw.clear();
            let n = input.read_until(b'\n', &mut raw).await.map_err(SubmitError::Read)?;
            if n == 0 {
                break;
            }
            let text = match std::str::from_utf8(&raw) {
                Ok(text) => text.strip_suffix('\n').unwrap_or(text),
                Err(_) => {
                    // Count the line so that later line numbers stay right.
                    let _ = parser.next_line("");
                    errors.push(InputError {
                        line: parser.lines_read(),
                        field: None,
                        reason: "not valid UTF-8".to_owned(),
                    });
                    continue;
                }
            };
            let request = match parser.next_line(text) {
                Ok(Some(request)) => request,
                Ok(None) => continue,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            if !errors.is_empty() {
                // The job is rejected already; keep validating, stop storing.
                continue;
            }
            let wire = wire_id(provider_kind, &request.custom_id);
            // Measured, not sent: encoding is pure, so submitting needs no credentials. With
            // the cache mark it may carry, so that a tranche cut at the byte limit still fits
            // once marked.
            let wire_bytes =
                input_line_len(provider_kind, &wire, request.endpoint, request.body.len() as u64)
                    + if room_for_marks { cache_marks::mark_growth(&request.body) } else { 0 };
            if let Err(e) = fits(limits, wire_bytes, request.line) {
                errors.push(e);
                continue;
            }
            let max_cost = if budgeted {
                match self.worst_cost(provider_kind, &request) {
                    Ok(cost) => Some(cost),
                    Err(e) => {
                        errors.push(e);
                        continue;
                    }
                }
            } else {
                None
            };
            bodies.write(request.body.as_bytes()).await?;
            bodies.write(b"\n").await?;
            let body =
                RequestBody::InObject { offset: body_offset, len: request.body.len() as u64 };
            body_offset += request.body.len() as u64 + 1;
            let added = writer
                .add(&NewRequest {
                    line: request.line,
                    custom_id: request.custom_id.as_str(),
                    wire_id: &wire,
                    endpoint: request.endpoint,
                    model: &request.model,
                    body,
                    wire_bytes,
                    input_hash: request.input_hash,
                    max_attempts,
                    est_tokens: request.est_tokens,
                    max_cost,
                    accepted_at,
                })
                .await;
            repeats(added, &mut errors)?;
        }
        if errors.is_empty() {
            repeats(writer.flush().await, &mut errors)?;
        }
        // Dropping the writer rolls the whole job back.
        errors.finish()?;
        if writer.accepted() == 0 {
            return Err(SubmitError::Rejected(Rejected {
                errors: vec![InputError {
                    line: parser.lines_read().max(1),
                    field: None,
                    reason: "the input has no requests".to_owned(),
                }],
                total: 1,
            }));
        }
        Ok(())
    }
}

impl Engine {
    /// The most a request of a job with a budget may cost, or why no budget can be kept for
    /// it (its model has no price, or nothing bounds its output).
    fn worst_cost(
        &self,
        provider: ProviderKind,
        request: &ParsedRequest,
    ) -> Result<Usd, InputError> {
        let refuse = |field: &str, reason: String| InputError {
            line: request.line,
            field: Some(field.to_owned()),
            reason,
        };
        let body: serde_json::Value =
            serde_json::from_str(&request.body).map_err(|e| refuse("body", e.to_string()))?;
        let prices = &self.config().prices;
        let worst = worst_case(provider, request.endpoint, &request.model, &body, prices);
        if let Some(why) = worst.unbounded {
            return Err(refuse(
                "body.messages",
                format!(
                    "--budget cannot be kept for this request: {why}; submit it without a budget"
                ),
            ));
        }
        match worst.costs {
            Some(costs) => Ok(Usd::ceil(costs.cost)),
            None if prices.lookup(provider, &request.model).is_none() => Err(refuse(
                "body.model",
                format!(
                    "`{}` has no price, so --budget cannot be kept: add it to a price file (--prices FILE) or submit without a budget",
                    request.model
                ),
            )),
            None => Err(refuse(
                "body.max_tokens",
                format!(
                    "nothing bounds this request's output (no max_tokens, and no maximum output is known for `{}`): set max_tokens, or submit without a budget",
                    request.model
                ),
            )),
        }
    }
}

/// Turns repeated custom ids the store found into input errors; other failures stay errors.
fn repeats(result: Result<(), StoreError>, errors: &mut ErrorCollector) -> Result<(), SubmitError> {
    match result {
        Ok(()) => Ok(()),
        Err(StoreError::DuplicateCustomIds(found)) => {
            for d in found {
                errors.push(duplicate(d.line, &d.custom_id, d.first_line));
            }
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

fn fits(limits: TrancheLimits, wire_bytes: u64, line: u64) -> Result<(), InputError> {
    if wire_bytes > limits.max_bytes {
        return Err(InputError {
            line,
            field: Some("body".to_owned()),
            reason: format!(
                "the request is {wire_bytes} bytes once encoded, over the {} byte limit of one batch",
                limits.max_bytes
            ),
        });
    }
    Ok(())
}
