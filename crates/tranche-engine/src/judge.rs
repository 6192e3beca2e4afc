//! Judging an answer: extracted from its response body by endpoint and checked against the
//! job's answer check, the same way at ingest and at a re-parse.

use tranche_core::extract::extract;
use tranche_core::validate::{AnswerSchema, Invalid};
use tranche_core::{Endpoint, OnInvalid, ProviderKind};
use tranche_providers::LineError;
use tranche_store::Store;

use crate::error::EngineError;

/// The exact `error.code` of an answer that failed its job's check.
pub const INVALID_OUTPUT: &str = "invalid_output";
/// The exact `error.code` of a request whose result line could not be read.
pub const UNDECODABLE_RESULT: &str = "undecodable_result";
/// The exact `error.code` of an answer a reviewer rejected.
pub const REJECTED_IN_REVIEW: &str = "rejected_in_review";

/// How the answers of one endpoint under one check are judged.
#[derive(Debug)]
pub(crate) struct Judge {
    endpoint: Endpoint,
    /// The compiled schema and whether fenced JSON passes; `None`: every answer passes.
    check: Option<(AnswerSchema, bool)>,
}

impl Judge {
    /// The judge of `endpoint`'s answers under the check recorded as `check`.
    pub(crate) async fn load(
        store: &dyn Store,
        endpoint: Endpoint,
        check: Option<&str>,
    ) -> Result<Self, EngineError> {
        let Some(id) = check else { return Ok(Self { endpoint, check: None }) };
        let bad = |reason: String| EngineError::AnswerCheck { id: id.to_owned(), reason };
        let stored = store.answer_check(id).await?.ok_or_else(|| bad("not recorded".into()))?;
        let schema = serde_json::from_str(&stored.schema).map_err(|e| bad(e.to_string()))?;
        let schema = AnswerSchema::new(&schema).map_err(|e| bad(e.to_string()))?;
        Ok(Self { endpoint, check: Some((schema, stored.lenient_json)) })
    }

    /// Whether every answer passes (no check: nothing to extract).
    pub(crate) fn passes_all(&self) -> bool {
        self.check.is_none()
    }

    /// Why the answer in `body` fails the check, if it does.
    pub(crate) fn judge(&self, body: &str) -> Result<(), Invalid> {
        let Some((schema, lenient)) = &self.check else { return Ok(()) };
        let extracted = extract(self.endpoint, body).map_err(|e| Invalid {
            path: String::new(),
            reason: format!(
                "the answer could not be read as a {} response: {}",
                e.endpoint, e.problem
            ),
        })?;
        schema.check(&extracted, *lenient).map(drop)
    }
}

/// The stored error of an answer that failed its check: the provider answered (`status`), the
/// answer is not what the job asked for.
pub(crate) fn invalid_error(
    provider: ProviderKind,
    status: u16,
    request_id: Option<String>,
    invalid: &Invalid,
    on_invalid: OnInvalid,
) -> LineError {
    LineError {
        provider,
        status: Some(status),
        error_type: None,
        code: Some(INVALID_OUTPUT.to_owned()),
        message: format!("the answer does not match the job's schema: {invalid}"),
        param: (!invalid.path.is_empty()).then(|| invalid.path.clone()),
        request_id,
        retryable: on_invalid == OnInvalid::Retry,
    }
}

/// The stored error of a request left without a result in a batch whose result files hold
/// lines that could not be read (its answer may be one of them).
pub(crate) fn undecodable_error(provider: ProviderKind, lines: u64) -> LineError {
    LineError {
        provider,
        status: None,
        error_type: None,
        code: Some(UNDECODABLE_RESULT.to_owned()),
        message: format!(
            "the batch's result files hold {lines} line(s) tranche could not read, and none of \
             the others is this request's; the raw files are kept: `tranche reparse` reads them \
             again without sending anything"
        ),
        param: None,
        request_id: None,
        retryable: false,
    }
}
