//! Exporting a job's results: one JSON line per request, in input order, streamed from the
//! store and the blob store (memory does not grow with the job), into a file, a writer or an
//! object of the blob store.

use futures::{Stream, StreamExt, TryStreamExt};
use serde::Serialize;
use serde_json::value::RawValue;
use tranche_blob::{BlobKey, BlobStore};
use tranche_core::{CustomId, JobId, RequestState};
use tranche_store::{OutputRef, ResultRow, Store};

use crate::error::AppError;

/// One exported line. Its keys are an interface: add, never rename.
#[derive(Serialize)]
struct ResultLine<'a> {
    custom_id: &'a str,
    key: &'a str,
    status: &'a str,
    output: Option<Box<RawValue>>,
    error: Option<Box<RawValue>>,
}

fn status_name(state: RequestState) -> &'static str {
    match state {
        RequestState::Pending | RequestState::Queued => "pending",
        other => other.as_str(),
    }
}

fn raw(text: Option<String>) -> Result<Option<Box<RawValue>>, AppError> {
    text.map(RawValue::from_string).transpose().map_err(|e| AppError::Corrupt(e.to_string()))
}

/// An output's text: kept in the database, or read from its range in the blob store.
async fn output_text(blobs: &BlobStore, output: OutputRef) -> Result<String, AppError> {
    match output {
        OutputRef::Text(text) => Ok(text),
        OutputRef::InObject { object, offset, len } => {
            let key = BlobKey::new(object)?;
            let bytes = blobs.get_range(&key, offset..offset + len).await?;
            String::from_utf8(bytes.to_vec()).map_err(|e| AppError::Corrupt(e.to_string()))
        }
    }
}

/// Answers read from the blob store at once, in order: on S3 each is a request of its own,
/// and a job's answers lie scattered through its batches' raw files (results come back
/// shuffled), so they are fetched side by side rather than one after another.
const READS_IN_FLIGHT: usize = 32;

/// Lines handed on at most at a time (fewer when no more are ready).
const CHUNK_LINES: usize = 512;

/// A job's results, one JSON line per request in input order, as chunks of whole lines, each
/// with how many lines it holds. Memory holds a chunk and the answers in flight, whatever the
/// job's size.
pub(crate) fn result_chunks<'a>(
    store: &'a dyn Store,
    blobs: &'a BlobStore,
    job: JobId,
) -> impl Stream<Item = Result<(Vec<u8>, u64), AppError>> + Send + 'a {
    store
        .job_results(job)
        .map_err(AppError::Store)
        .map_ok(move |row| async move {
            let output = match row.output.clone() {
                Some(output) => Some(output_text(blobs, output).await?),
                None => None,
            };
            let mut line = Vec::new();
            render(&mut line, row, output)?;
            Ok(line)
        })
        .try_buffered(READS_IN_FLIGHT)
        .try_ready_chunks(CHUNK_LINES)
        .map(|chunk| match chunk {
            Ok(lines) => Ok((lines.concat(), lines.len() as u64)),
            Err(e) => Err(e.1),
        })
}

/// Appends one result line to `out`.
fn render(out: &mut Vec<u8>, row: ResultRow, output: Option<String>) -> Result<(), AppError> {
    let key = CustomId::parse(&row.custom_id)
        .map(|id| id.key().to_owned())
        .unwrap_or_else(|_| row.custom_id.clone());
    let line = ResultLine {
        custom_id: &row.custom_id,
        key: &key,
        status: status_name(row.state),
        output: raw(output)?,
        error: raw(row.error)?,
    };
    serde_json::to_writer(&mut *out, &line).map_err(|e| AppError::Corrupt(e.to_string()))?;
    out.push(b'\n');
    Ok(())
}
