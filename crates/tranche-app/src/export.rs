//! Exporting a job's results: one JSON line per request, in input order, streamed from the
//! store and the blob store (memory does not grow with the job), into a file, a writer or an
//! object of the blob store.

use std::collections::BTreeMap;

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

/// Requests whose answers are read together. A job's answers lie scattered through its
/// batches' raw files (results come back shuffled): read one by one they cost a request each
/// (on S3 a round trip, locally a file opened), read a window at a time they become a few long
/// ranges, each read once.
const WINDOW_ROWS: usize = 4096;

/// Two answers of one object closer than this are read in one range: reading the gap costs
/// less than another request.
const MAX_GAP: u64 = 64 << 10;

/// The longest range read at once.
const MAX_SPAN: u64 = 2 << 20;

/// Ranges read at once.
const READS_IN_FLIGHT: usize = 4;

/// A job's results, one JSON line per request in input order, as chunks of whole lines, each
/// with how many lines it holds. Memory holds one window's answers and the ranges in flight,
/// whatever the job's size.
pub(crate) fn result_chunks<'a>(
    store: &'a dyn Store,
    blobs: &'a BlobStore,
    job: JobId,
) -> impl Stream<Item = Result<(Vec<u8>, u64), AppError>> + Send + 'a {
    store
        .job_results(job)
        .map_err(AppError::Store)
        .try_chunks(WINDOW_ROWS)
        .map_err(|e| e.1)
        .and_then(move |rows| async move {
            let outputs = read_outputs(blobs, &rows).await?;
            let mut chunk = Vec::new();
            let lines = rows.len() as u64;
            for (row, output) in rows.into_iter().zip(outputs) {
                render(&mut chunk, row, output)?;
            }
            Ok((chunk, lines))
        })
}

/// Answers of one object read in one range: where each lies, and for which row.
struct Span {
    object: String,
    start: u64,
    end: u64,
    parts: Vec<(u64, u64, usize)>,
}

/// The answers of `rows` (by position; `None` for a row without one): kept in the database, or
/// read from the blob store in ranges that each cover the answers lying close together.
async fn read_outputs(
    blobs: &BlobStore,
    rows: &[ResultRow],
) -> Result<Vec<Option<String>>, AppError> {
    let mut outputs = vec![None; rows.len()];
    let mut wanted: BTreeMap<&str, Vec<(u64, u64, usize)>> = BTreeMap::new();
    for (i, row) in rows.iter().enumerate() {
        match &row.output {
            Some(OutputRef::Text(text)) => outputs[i] = Some(text.clone()),
            Some(OutputRef::InObject { object, offset, len }) => {
                wanted.entry(object).or_default().push((*offset, *len, i));
            }
            None => {}
        }
    }
    let mut spans = Vec::new();
    for (object, mut parts) in wanted {
        parts.sort_unstable();
        let mut span: Option<Span> = None;
        for (offset, len, i) in parts {
            let end = offset + len;
            match span.as_mut() {
                Some(s) if offset <= s.end + MAX_GAP && end - s.start <= MAX_SPAN => {
                    s.end = s.end.max(end);
                    s.parts.push((offset, len, i));
                }
                _ => {
                    spans.extend(span.take());
                    let object = object.to_owned();
                    span = Some(Span { object, start: offset, end, parts: vec![(offset, len, i)] });
                }
            }
        }
        spans.extend(span);
    }
    let mut read = futures::stream::iter(spans)
        .map(|span| async move {
            let key = BlobKey::new(span.object.as_str())?;
            let bytes = blobs.get_range(&key, span.start..span.end).await?;
            let mut answers = Vec::with_capacity(span.parts.len());
            for (offset, len, i) in span.parts {
                let at = usize::try_from(offset - span.start).unwrap_or(usize::MAX);
                let text = bytes
                    .get(at..at.saturating_add(usize::try_from(len).unwrap_or(usize::MAX)))
                    .and_then(|b| std::str::from_utf8(b).ok())
                    .ok_or_else(|| {
                        AppError::Corrupt(format!(
                            "no answer at {offset}+{len} of `{}`",
                            span.object
                        ))
                    })?;
                answers.push((i, text.to_owned()));
            }
            Ok::<_, AppError>(answers)
        })
        .buffer_unordered(READS_IN_FLIGHT);
    while let Some(answers) = read.try_next().await? {
        for (i, text) in answers {
            outputs[i] = Some(text);
        }
    }
    Ok(outputs)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn row(output: Option<OutputRef>) -> ResultRow {
        ResultRow { custom_id: "k:t:v".into(), state: RequestState::Succeeded, output, error: None }
    }

    #[tokio::test]
    async fn answers_are_read_in_ranges_and_come_back_in_row_order() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = BlobStore::local(dir.path());
        // Two objects; in the first, answers close together and one past the gap and one past
        // the longest span.
        let mut first = vec![b' '; (MAX_SPAN + MAX_GAP * 4) as usize];
        let far = MAX_GAP * 3;
        let farthest = MAX_SPAN + MAX_GAP * 3;
        for (at, text) in [(10u64, "{\"a\":1}"), (40, "{\"b\":2}"), (far, "[3]"), (farthest, "4")] {
            first[at as usize..at as usize + text.len()].copy_from_slice(text.as_bytes());
        }
        blobs.put(&BlobKey::new("raw/one").unwrap(), first.into()).await.unwrap();
        blobs.put(&BlobKey::new("raw/two").unwrap(), "xx{\"c\":5}".into()).await.unwrap();
        let at = |object: &str, offset: u64, len: u64| {
            row(Some(OutputRef::InObject { object: object.into(), offset, len }))
        };
        let rows = vec![
            at("raw/one", farthest, 1),
            row(None),
            at("raw/two", 2, 7),
            at("raw/one", 40, 7),
            row(Some(OutputRef::Text("\"kept\"".into()))),
            at("raw/one", far, 3),
            at("raw/one", 10, 7),
        ];
        let outputs = read_outputs(&blobs, &rows).await.unwrap();
        let expected = [
            Some("4"),
            None,
            Some("{\"c\":5}"),
            Some("{\"b\":2}"),
            Some("\"kept\""),
            Some("[3]"),
            Some("{\"a\":1}"),
        ];
        assert_eq!(outputs.iter().map(Option::as_deref).collect::<Vec<_>>(), expected);
        // A range past the object's end is an error, not a short answer.
        let err = read_outputs(&blobs, &[at("raw/two", 5, 50)]).await.unwrap_err();
        assert!(!err.to_string().is_empty());
    }
}
