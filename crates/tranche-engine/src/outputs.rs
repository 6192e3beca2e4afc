//! Reading answers back: a job's answers lie scattered through its batches' raw files (results
//! come back shuffled); read one by one they cost a request each (on S3 a round trip, locally a
//! file opened), read many at a time they become a few long ranges, each read once.

use std::collections::BTreeMap;

use futures::{StreamExt, TryStreamExt};
use tranche_blob::{BlobKey, BlobStore};
use tranche_store::OutputRef;

use crate::error::EngineError;

/// Two answers of one object closer than this are read in one range: reading the gap costs
/// less than another request.
const MAX_GAP: u64 = 64 << 10;

/// The longest range read at once.
const MAX_SPAN: u64 = 2 << 20;

/// Ranges read at once.
const READS_IN_FLIGHT: usize = 4;

/// Answers of one object read in one range: where each lies, and for which row.
struct Span {
    object: String,
    start: u64,
    end: u64,
    parts: Vec<(u64, u64, usize)>,
}

/// The answers `refs` point at (by position; `None` where there is none): kept in the database, or
/// read from the blob store in ranges that each cover the answers lying close together.
pub async fn read_outputs<'a>(
    blobs: &BlobStore,
    refs: impl Iterator<Item = Option<&'a OutputRef>>,
) -> Result<Vec<Option<String>>, EngineError> {
    let mut outputs = Vec::new();
    let mut wanted: BTreeMap<&str, Vec<(u64, u64, usize)>> = BTreeMap::new();
    for (i, output) in refs.enumerate() {
        outputs.push(None);
        match output {
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
                        EngineError::Corrupt(format!(
                            "no answer at {offset}+{len} of `{}`",
                            span.object
                        ))
                    })?;
                answers.push((i, text.to_owned()));
            }
            Ok::<_, EngineError>(answers)
        })
        .buffer_unordered(READS_IN_FLIGHT);
    while let Some(answers) = read.try_next().await? {
        for (i, text) in answers {
            outputs[i] = Some(text);
        }
    }
    Ok(outputs)
}

#[cfg(test)]
mod tests {
    use super::*;

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
            Some(OutputRef::InObject { object: object.into(), offset, len })
        };
        let rows = [
            at("raw/one", farthest, 1),
            None,
            at("raw/two", 2, 7),
            at("raw/one", 40, 7),
            Some(OutputRef::Text("\"kept\"".into())),
            at("raw/one", far, 3),
            at("raw/one", 10, 7),
        ];
        let outputs = read_outputs(&blobs, rows.iter().map(Option::as_ref)).await.unwrap();
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
        let err = read_outputs(&blobs, [at("raw/two", 5, 50)].iter().map(Option::as_ref))
            .await
            .unwrap_err();
        assert!(!err.to_string().is_empty());
    }
}
