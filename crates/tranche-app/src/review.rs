//! Reviewing a job's answers before they are trusted: a reproducible random sample shown
//! beside its inputs, then a person's approval or rejection, recorded with who and when.

use std::collections::{BTreeMap, BinaryHeap};

use futures::TryStreamExt;
use serde::Serialize;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use tranche_blob::BlobKey;
use tranche_core::extract::{Answer, extract};
use tranche_core::{JobId, JobState, RequestState};
use tranche_engine::REJECTED_IN_REVIEW;
use tranche_store::{InputBody, JobRecord, Rejected, Review, ReviewVerdict};

use crate::App;
use crate::error::AppError;
use crate::export::key_of;

/// How many answers `review` shows when neither the job nor the caller says.
pub const DEFAULT_SAMPLE: u32 = 20;

/// One answer drawn for review. Its keys are printed by `tranche review --json`: add, never
/// rename.
#[derive(Debug, Clone, Serialize)]
pub struct ReviewItem {
    pub custom_id: String,
    pub key: String,
    /// The request body as sent.
    pub input: Box<RawValue>,
    /// The provider's response body.
    pub output: Box<RawValue>,
    /// The answer extracted from it (text, tool-call arguments, ...), for reading.
    pub answer: Option<String>,
}

/// The seed a job's sample is drawn with when none is given: fixed by the job id.
pub fn default_seed(job: JobId) -> u64 {
    let digest = Sha256::digest(job.to_string().as_bytes());
    u64::from_le_bytes(digest[..8].try_into().unwrap_or_default())
}

/// Where a custom id falls in the draw of `seed`: the sample is the `n` lowest.
fn rank(seed: u64, custom_id: &str) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(seed.to_le_bytes());
    hasher.update(custom_id.as_bytes());
    hasher.finalize().into()
}

impl App {
    /// `n` of a job's succeeded answers drawn at random with `seed` (the same seed, the same
    /// draw), in input order, each beside its input. Memory holds the sample, not the job.
    pub async fn review_sample(
        &self,
        job: &JobRecord,
        n: u32,
        seed: u64,
    ) -> Result<Vec<ReviewItem>, AppError> {
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        // The `n` lowest ranks seen so far (the highest on top), and their rows by line.
        let mut ranks = BinaryHeap::new();
        let mut drawn = BTreeMap::new();
        let mut rows = self.store.job_results(job.id);
        let mut line = 0u64;
        while let Some(row) = rows.try_next().await? {
            line += 1;
            if row.state != RequestState::Succeeded || n == 0 {
                continue;
            }
            ranks.push((rank(seed, &row.custom_id), line));
            drawn.insert(line, row);
            if ranks.len() > n
                && let Some((_, out)) = ranks.pop()
            {
                drawn.remove(&out);
            }
        }
        drop(rows);
        let rows: Vec<_> = drawn.into_values().collect();
        let outputs =
            tranche_engine::read_outputs(&self.blobs, rows.iter().map(|r| r.output.as_ref()))
                .await?;
        let mut items = Vec::with_capacity(rows.len());
        for (row, output) in rows.into_iter().zip(outputs) {
            let output = output.ok_or_else(|| {
                AppError::Corrupt(format!("the answer of {} is missing", row.custom_id))
            })?;
            let answer = extract(row.endpoint, &output).ok().and_then(|e| match e.answer {
                Answer::Text(text) => Some(text),
                Answer::ToolCalls(calls) => calls.first().map(|c| c.arguments.clone()),
                Answer::Refusal(text) => Some(format!("(refused) {text}")),
                _ => None,
            });
            let input = self.request_input(job.id, &row.custom_id).await?;
            items.push(ReviewItem {
                key: key_of(&row.custom_id).to_owned(),
                custom_id: row.custom_id,
                input: raw(input)?,
                output: raw(output)?,
                answer,
            });
        }
        Ok(items)
    }

    /// The body of one of a job's requests, as sent.
    async fn request_input(&self, job: JobId, custom_id: &str) -> Result<String, AppError> {
        let body = self.store.request_body(job, custom_id).await?;
        match body {
            Some(InputBody::Text(text)) => Ok(text),
            Some(InputBody::InObject { object, offset, len }) => {
                let key = BlobKey::new(object.as_str())?;
                let bytes = self.blobs.get_range(&key, offset..offset + len).await?;
                String::from_utf8(bytes.to_vec()).map_err(|e| AppError::Corrupt(e.to_string()))
            }
            None => Err(AppError::Corrupt(format!("the body of {custom_id} is missing"))),
        }
    }

    /// Records a person's decision on a job awaiting review: `rejected` names the answers
    /// that end failed (`rejected_in_review`); the others stand, and the job ends `done`.
    /// Returns how many answers were rejected.
    pub async fn decide_review(
        &self,
        job: &JobRecord,
        by: &str,
        rejected: Rejected<'_>,
    ) -> Result<u64, AppError> {
        if job.state != JobState::NeedsReview {
            return Err(AppError::NotAwaitingReview { id: job.id, state: job.state });
        }
        if let Rejected::Only(ids) = rejected {
            self.check_succeeded(job.id, ids).await?;
        }
        let verdict = match rejected {
            Rejected::None => ReviewVerdict::Approved,
            Rejected::All | Rejected::Only(_) => ReviewVerdict::Rejected,
        };
        let at = tranche_core::Clock::now(&tranche_core::SystemClock);
        let review = Review { verdict, by: by.to_owned(), at };
        let error = serde_json::json!({
            "code": REJECTED_IN_REVIEW,
            "message": format!("the answer was rejected in review by {by}"),
        })
        .to_string();
        let decided = self.store.decide_review(job.id, &review, rejected, &error).await?;
        decided.ok_or(AppError::NotAwaitingReview { id: job.id, state: job.state })
    }

    /// Refuses custom ids that are not succeeded answers of the job, naming them.
    async fn check_succeeded(&self, job: JobId, ids: &[String]) -> Result<(), AppError> {
        let mut unknown: std::collections::BTreeSet<&str> =
            ids.iter().map(String::as_str).collect();
        let mut rows = self.store.job_results(job);
        while let Some(row) = rows.try_next().await? {
            if row.state == RequestState::Succeeded {
                unknown.remove(row.custom_id.as_str());
            }
        }
        if unknown.is_empty() {
            return Ok(());
        }
        let names: Vec<&str> = unknown.into_iter().collect();
        Err(AppError::Config(format!(
            "not a succeeded answer of job {job}: {}; `tranche results {job}` lists them",
            names.join(", ")
        )))
    }
}

fn raw(text: String) -> Result<Box<RawValue>, AppError> {
    RawValue::from_string(text).map_err(|e| AppError::Corrupt(e.to_string()))
}
