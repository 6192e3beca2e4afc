//! Pure policy over records and the time: what a failure means for a request's retry budget,
//! what becomes of requests a batch did not answer, when a pool goes out, whether a tranche fits
//! the enqueued-token budget, how a job ends. No IO, no async runtime, no store: the steps ask,
//! and record what it answers.

use std::time::Duration;

use serde_json::{Value, json};
use tranche_core::{AttemptOutcome, JobState, ProviderKind, RequestState, TrancheState};
use tranche_providers::BatchStatus;

/// How a request's failure counts against its retry budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// Worth sending again (5xx, 429, overloaded, expired, cancelled by the provider).
    Retryable,
    /// Sending it again cannot help (a 4xx such as `context_length_exceeded`).
    Fatal,
    /// The whole batch failed (validation, token limit): back to the pool without spending an
    /// attempt, a bounded number of times.
    WholeBatch,
    /// The user cancelled the job.
    UserCancel,
}

/// Where a request stands in its retry budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Budget {
    /// Attempts spent before this one.
    pub attempts: u32,
    pub max_attempts: u32,
    /// Whole-batch failures that returned it without spending an attempt.
    pub batch_returns: u32,
}

/// What a failure does to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// Back to `pending` (to be retried) or a terminal state.
    pub state: RequestState,
    pub spends_attempt: bool,
    /// For a request returned to the pool: not before this time.
    pub not_before: i64,
}

/// The retry settings policy decides by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Retries {
    /// The wait before the first retry; it doubles with each one after.
    pub backoff: Duration,
    /// How many whole-batch failures may return a request without spending an attempt.
    pub max_batch_returns: u32,
}

impl Retries {
    /// The wait before a request's `attempt`-th retry (1-based): doubling from the backoff,
    /// at most an hour.
    pub(crate) fn delay(&self, attempt: u32) -> Duration {
        let factor = 2u32.saturating_pow(attempt.saturating_sub(1).min(10));
        self.backoff.saturating_mul(factor).min(Duration::from_secs(3600))
    }

    /// What `failure` at time `now` does to a request whose budget stands at `budget`.
    pub(crate) fn decide(&self, budget: Budget, failure: Failure, now: i64) -> Verdict {
        let retry = |n: u32| now.saturating_add(whole_secs(self.delay(n)));
        match failure {
            Failure::Retryable if budget.attempts + 1 < budget.max_attempts => Verdict {
                state: RequestState::Pending,
                spends_attempt: true,
                not_before: retry(budget.attempts + 1),
            },
            Failure::WholeBatch if budget.batch_returns < self.max_batch_returns => Verdict {
                state: RequestState::Pending,
                spends_attempt: false,
                not_before: retry(budget.batch_returns + 1),
            },
            Failure::UserCancel => {
                Verdict { state: RequestState::Cancelled, spends_attempt: false, not_before: 0 }
            }
            Failure::Retryable | Failure::Fatal | Failure::WholeBatch => {
                Verdict { state: RequestState::Failed, spends_attempt: true, not_before: 0 }
            }
        }
    }
}

/// Whole seconds, rounded down: a sub-second interval makes the work due at once, and the
/// engine's own sleep paces it.
pub(crate) fn whole_secs(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

/// What a failed result line means: its code (`batch_expired`, `batch_cancelled`) and the
/// provider's own classification decide; a cancel the user asked for ends the request.
pub(crate) fn classify_line(
    code: Option<&str>,
    retryable: bool,
    cancel_requested: bool,
) -> (AttemptOutcome, Failure) {
    match code {
        Some("batch_expired") => (AttemptOutcome::Expired, Failure::Retryable),
        Some("batch_cancelled") if cancel_requested => {
            (AttemptOutcome::Cancelled, Failure::UserCancel)
        }
        Some("batch_cancelled") => (AttemptOutcome::Cancelled, Failure::Retryable),
        _ if retryable => (AttemptOutcome::Errored, Failure::Retryable),
        _ => (AttemptOutcome::Errored, Failure::Fatal),
    }
}

/// What an upstream error that stopped a tranche means for its requests: a token-limit refusal
/// makes them wait for room; anything else fails them.
pub(crate) fn stopped_by(code: Option<&str>) -> Failure {
    if code == Some("token_limit_exceeded") { Failure::WholeBatch } else { Failure::Fatal }
}

/// Whether an upstream failure is about tranche's credentials rather than the batch (a key
/// rotated, a token expired: 401, 403) at a step where the batch exists already and runs on
/// regardless: the tranche waits for credentials that work instead of failing its requests.
pub(crate) fn waits_for_credentials(status: Option<u16>, state: TrancheState) -> bool {
    matches!(status, Some(401 | 403))
        && matches!(
            state,
            TrancheState::Submitted
                | TrancheState::Collecting
                | TrancheState::Ingesting
                | TrancheState::Cleaning
        )
}

/// Whether an upload was refused because the account's file storage is full: Azure's
/// `quotaExceeded` (500 input files without expiry, 10,000 with, per resource), or OpenAI's
/// storage quota, which comes without a code ("You have exceeded your file storage quota.",
/// bespokelabsai/curator#189).
pub(crate) fn is_storage_limit(code: Option<&str>, message: &str) -> bool {
    match code {
        Some(code) => code == "quotaExceeded",
        None => message.contains("exceeded your file storage quota"),
    }
}

/// How long to wait after a retryable upstream failure: the provider's `Retry-After`, never
/// less than the configured backoff.
pub(crate) fn upstream_wait(retry_after: Option<Duration>, backoff: Duration) -> Duration {
    retry_after.unwrap_or(backoff).max(backoff)
}

/// The longest wait for room in a full file storage.
const STORAGE_WAIT_MAX: Duration = Duration::from_secs(15 * 60);

/// How long a tranche waits for room in a full file storage: the upstream wait at first, then
/// twice the wait before it (`previous`, when the last refusal was also for storage), up to 15
/// minutes, so that a paused account is not sent the same file every few seconds all day.
pub(crate) fn storage_wait(
    retry_after: Option<Duration>,
    backoff: Duration,
    previous: Option<Duration>,
) -> Duration {
    let first = upstream_wait(retry_after, backoff);
    previous.map_or(first, |p| (p * 2).clamp(first, STORAGE_WAIT_MAX.max(first)))
}

/// What becomes of the requests an ended batch's files did not mention.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Unanswered {
    pub failure: Failure,
    pub outcome: AttemptOutcome,
    /// The error recorded on each, in the shape of an upstream error.
    pub error: Value,
}

/// Decides [`Unanswered`] from the batch's final status and errors.
pub(crate) fn unanswered(
    provider: ProviderKind,
    status: Option<BatchStatus>,
    batch_errors: Option<&Value>,
    cancel_requested: bool,
) -> Unanswered {
    let provider = provider.as_str();
    let ran_before = |code: &str, message: &str| {
        json!({
            "provider": provider, "status": null, "error_type": null, "code": code,
            "message": message, "param": null, "request_id": null, "retryable": true,
        })
    };
    match status {
        Some(BatchStatus::Failed) => {
            let first = batch_errors
                .and_then(Value::as_array)
                .and_then(|a| a.first())
                .cloned()
                .unwrap_or_default();
            let message = first
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("the provider failed the batch")
                .to_owned();
            Unanswered {
                failure: Failure::WholeBatch,
                outcome: AttemptOutcome::Errored,
                error: json!({
                    "provider": provider, "status": null, "error_type": "batch_failed",
                    "code": first.get("code").cloned().unwrap_or(Value::Null),
                    "message": message, "param": first.get("param"),
                    "line": first.get("line"), "request_id": null, "retryable": false,
                    "batch_errors": batch_errors,
                }),
            }
        }
        Some(BatchStatus::Cancelled | BatchStatus::Cancelling) => Unanswered {
            failure: if cancel_requested { Failure::UserCancel } else { Failure::Retryable },
            outcome: AttemptOutcome::Cancelled,
            error: ran_before("batch_cancelled", "the batch was cancelled before this request ran"),
        },
        Some(BatchStatus::Expired) => Unanswered {
            failure: Failure::Retryable,
            outcome: AttemptOutcome::Expired,
            error: ran_before("batch_expired", "the batch expired before this request ran"),
        },
        _ => Unanswered {
            failure: Failure::Retryable,
            outcome: AttemptOutcome::Missing,
            error: ran_before(
                "missing_result",
                "the batch ended without a result line for this request",
            ),
        },
    }
}

/// The pooling thresholds: a group of waiting requests goes out once it holds `min_batch_size`
/// of them or its oldest has waited `max_wait`.
pub(crate) fn pool_is_due(
    count: u64,
    oldest_accepted_at: i64,
    now: i64,
    min_batch_size: usize,
    max_wait: Duration,
) -> bool {
    let count = usize::try_from(count).unwrap_or(usize::MAX);
    count >= min_batch_size || now.saturating_sub(oldest_accepted_at) >= whole_secs(max_wait)
}

/// Enqueued-token admission: whether a tranche of `est_tokens` fits beside `queued` tokens
/// already at the provider for its model. A tranche larger than the whole budget still goes
/// out alone, or it never would.
pub(crate) fn admits(queued: u64, est_tokens: u64, budget: Option<u64>) -> bool {
    match budget {
        Some(budget) => queued == 0 || queued.saturating_add(est_tokens) <= budget,
        None => true,
    }
}

/// How a job whose requests are all terminal and whose tranches are cleaned up ends: a job
/// with answers awaiting review waits for a person.
pub(crate) fn job_outcome(
    cancel_requested: bool,
    stopped_by_error: bool,
    awaits_review: bool,
) -> JobState {
    if cancel_requested {
        JobState::Cancelled
    } else if stopped_by_error {
        JobState::Failed
    } else if awaits_review {
        JobState::NeedsReview
    } else {
        JobState::Done
    }
}

#[cfg(test)]
mod tests {
    use tranche_core::{Clock as _, ManualClock};

    use super::*;

    const RETRIES: Retries = Retries { backoff: Duration::from_secs(5), max_batch_returns: 3 };

    fn budget(attempts: u32, batch_returns: u32) -> Budget {
        Budget { attempts, max_attempts: 3, batch_returns }
    }

    #[test]
    fn retry_delays_double_and_stop_at_an_hour() {
        let delays: Vec<u64> = (1..=4).map(|n| RETRIES.delay(n).as_secs()).collect();
        assert_eq!(delays, [5, 10, 20, 40]);
        assert_eq!(RETRIES.delay(40), Duration::from_secs(3600));
    }

    #[test]
    fn retryable_line_failures_run_out_at_max_attempts() {
        let clock = ManualClock::at(1_000);
        // First and second attempts failed retryably: back to the pool, later each time.
        let first = RETRIES.decide(budget(0, 0), Failure::Retryable, clock.now());
        assert_eq!(
            first,
            Verdict { state: RequestState::Pending, spends_attempt: true, not_before: 1_005 }
        );
        clock.advance(5);
        let second = RETRIES.decide(budget(1, 0), Failure::Retryable, clock.now());
        assert_eq!(second.not_before, 1_015);
        // The third of three attempts failing ends the request.
        let third = RETRIES.decide(budget(2, 0), Failure::Retryable, clock.now());
        assert_eq!(
            third,
            Verdict { state: RequestState::Failed, spends_attempt: true, not_before: 0 }
        );
    }

    #[test]
    fn fatal_failures_end_at_once_and_cancels_spend_nothing() {
        let fatal = RETRIES.decide(budget(0, 0), Failure::Fatal, 1);
        assert_eq!(fatal.state, RequestState::Failed);
        let cancel = RETRIES.decide(budget(0, 0), Failure::UserCancel, 1);
        assert_eq!(
            cancel,
            Verdict { state: RequestState::Cancelled, spends_attempt: false, not_before: 0 }
        );
    }

    #[test]
    fn whole_batch_failures_return_without_spending_an_attempt_a_bounded_number_of_times() {
        let back = RETRIES.decide(budget(2, 0), Failure::WholeBatch, 100);
        assert_eq!(
            back,
            Verdict { state: RequestState::Pending, spends_attempt: false, not_before: 105 }
        );
        assert_eq!(RETRIES.decide(budget(2, 2), Failure::WholeBatch, 100).not_before, 120);
        let spent = RETRIES.decide(budget(0, 3), Failure::WholeBatch, 100);
        assert_eq!(spent.state, RequestState::Failed);
    }

    #[test]
    fn result_lines_are_classified_by_code_then_by_the_providers_word() {
        use AttemptOutcome::*;
        assert_eq!(
            classify_line(Some("batch_expired"), true, false),
            (Expired, Failure::Retryable)
        );
        assert_eq!(
            classify_line(Some("batch_cancelled"), true, true),
            (Cancelled, Failure::UserCancel)
        );
        assert_eq!(
            classify_line(Some("batch_cancelled"), true, false),
            (Cancelled, Failure::Retryable)
        );
        assert_eq!(classify_line(Some("server_error"), true, false), (Errored, Failure::Retryable));
        assert_eq!(
            classify_line(Some("context_length_exceeded"), false, false),
            (Errored, Failure::Fatal)
        );
    }

    #[test]
    fn an_upstream_stop_fails_requests_unless_it_is_the_token_limit() {
        assert_eq!(stopped_by(Some("token_limit_exceeded")), Failure::WholeBatch);
        assert_eq!(stopped_by(Some("quotaExceeded")), Failure::Fatal);
        assert_eq!(stopped_by(None), Failure::Fatal);
        let backoff = Duration::from_secs(5);
        assert_eq!(upstream_wait(Some(Duration::from_secs(30)), backoff).as_secs(), 30);
        assert_eq!(upstream_wait(Some(Duration::from_secs(1)), backoff).as_secs(), 5);
        assert_eq!(upstream_wait(None, backoff).as_secs(), 5);
    }

    #[test]
    fn unanswered_requests_follow_the_batchs_end() {
        let errors = json!([{"code": "invalid_json", "message": "bad line", "line": 7}]);
        let failed =
            unanswered(ProviderKind::Openai, Some(BatchStatus::Failed), Some(&errors), false);
        assert_eq!(
            (failed.failure, failed.outcome),
            (Failure::WholeBatch, AttemptOutcome::Errored)
        );
        assert_eq!(failed.error["code"], "invalid_json");
        assert_eq!(failed.error["line"], 7);
        assert_eq!(failed.error["provider"], "openai");
        let cancelled = unanswered(ProviderKind::Azure, Some(BatchStatus::Cancelled), None, true);
        assert_eq!(cancelled.failure, Failure::UserCancel);
        let cancelled = unanswered(ProviderKind::Azure, Some(BatchStatus::Cancelled), None, false);
        assert_eq!(
            (cancelled.failure, cancelled.error["code"].as_str()),
            (Failure::Retryable, Some("batch_cancelled"))
        );
        let expired = unanswered(ProviderKind::Anthropic, Some(BatchStatus::Expired), None, false);
        assert_eq!(expired.outcome, AttemptOutcome::Expired);
        let missing = unanswered(ProviderKind::Openai, Some(BatchStatus::Completed), None, false);
        assert_eq!(
            (missing.failure, missing.outcome),
            (Failure::Retryable, AttemptOutcome::Missing)
        );
        assert_eq!(missing.error["code"], "missing_result");
    }

    #[test]
    fn a_small_pool_waits_until_it_is_large_enough_or_old_enough() {
        let clock = ManualClock::at(10_000);
        let accepted = clock.now();
        let max_wait = Duration::from_secs(60);
        assert!(!pool_is_due(5, accepted, clock.now(), 100, max_wait));
        clock.advance(59);
        assert!(!pool_is_due(5, accepted, clock.now(), 100, max_wait), "not yet old enough");
        clock.advance(1);
        assert!(pool_is_due(5, accepted, clock.now(), 100, max_wait), "max_wait reached");
        assert!(pool_is_due(100, clock.now(), clock.now(), 100, max_wait), "large enough");
        assert!(pool_is_due(1, clock.now(), clock.now(), 1, Duration::ZERO), "the defaults");
    }

    #[test]
    fn admission_keeps_the_enqueued_tokens_within_the_budget() {
        assert!(admits(0, 500, None));
        assert!(admits(0, 5_000, Some(1_000)), "alone, even over the budget");
        assert!(admits(400, 600, Some(1_000)));
        assert!(!admits(400, 601, Some(1_000)));
    }

    #[test]
    fn a_settled_job_ends_cancelled_failed_or_done() {
        assert_eq!(job_outcome(true, true, true), JobState::Cancelled);
        assert!(waits_for_credentials(Some(401), TrancheState::Submitted));
        assert!(waits_for_credentials(Some(403), TrancheState::Cleaning));
        assert!(!waits_for_credentials(Some(401), TrancheState::Creating), "no batch yet");
        assert!(!waits_for_credentials(Some(404), TrancheState::Submitted));
        assert!(is_storage_limit(Some("quotaExceeded"), "The quota for files ..."));
        assert!(is_storage_limit(None, "You have exceeded your file storage quota. ..."));
        assert!(!is_storage_limit(Some("invalid_request_error"), "Invalid file."));
        assert!(!is_storage_limit(None, "File is too large."));
        let (five, ten) = (Duration::from_secs(5), Duration::from_secs(10));
        assert_eq!(storage_wait(None, five, None), five);
        assert_eq!(storage_wait(None, five, Some(five)), ten, "doubling");
        assert_eq!(storage_wait(None, five, Some(Duration::ZERO)), five, "never below the backoff");
        assert_eq!(storage_wait(None, five, Some(STORAGE_WAIT_MAX)), STORAGE_WAIT_MAX, "capped");
        let hour = Duration::from_secs(3600);
        assert_eq!(storage_wait(Some(hour), five, Some(five)), hour, "Retry-After wins");
        assert_eq!(job_outcome(false, true, true), JobState::Failed);
        assert_eq!(job_outcome(false, false, true), JobState::NeedsReview);
        assert_eq!(job_outcome(false, false, false), JobState::Done);
    }
}
