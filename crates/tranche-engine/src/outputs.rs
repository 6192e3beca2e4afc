//! Reading answers back: a job's answers lie scattered through its batches' raw files (results
//! come back shuffled); read one by one they would cost a request each (on S3 a round trip,
//! locally a file opened), so all of one object's are asked for in one call.

use std::collections::BTreeMap;

use futures::{StreamExt, TryStreamExt};
use tranche_blob::{BlobKey, BlobStore};
use tranche_store::OutputRef;

use crate::error::EngineError;

/// Objects read at once.
const OBJECTS_IN_FLIGHT: usize = 4;

/// The answers `refs` point at (by position; `None` where there is none): kept in the database,
/// or read from the blob store, all of one object's in one call (the blob store reads them as
/// its backend reads ranges best).
pub async fn read_outputs<'a>(
    blobs: &BlobStore,
    refs: impl Iterator<Item = Option<&'a OutputRef>>,
) -> Result<Vec<Option<String>>, EngineError> {
    let mut outputs = Vec::new();
    let mut wanted: BTreeMap<&str, (Vec<std::ops::Range<u64>>, Vec<usize>)> = BTreeMap::new();
    for (i, output) in refs.enumerate() {
        outputs.push(None);
        match output {
            Some(OutputRef::Text(text)) => outputs[i] = Some(text.clone()),
            Some(OutputRef::InObject { object, offset, len }) => {
                let (ranges, rows) = wanted.entry(object).or_default();
                ranges.push(*offset..offset + len);
                rows.push(i);
            }
            None => {}
        }
    }
    let reads = wanted
        .into_iter()
        .map(|(object, wanted)| Ok((BlobKey::new(object)?, wanted)))
        .collect::<Result<Vec<_>, EngineError>>()?;
    let mut read = futures::stream::iter(reads)
        .map(|(key, (ranges, rows))| async move {
            let bytes = blobs.get_ranges(&key, &ranges).await?;
            let mut answers = Vec::with_capacity(rows.len());
            for ((row, range), bytes) in rows.into_iter().zip(ranges).zip(bytes) {
                let text = String::from_utf8(bytes.into()).map_err(|_| {
                    EngineError::Corrupt(format!(
                        "the answer at {}..{} of `{key}` is not UTF-8",
                        range.start, range.end
                    ))
                })?;
                answers.push((row, text));
            }
            Ok::<_, EngineError>(answers)
        })
        .buffer_unordered(OBJECTS_IN_FLIGHT);
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
    async fn answers_come_back_in_row_order_from_every_object() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = BlobStore::local(dir.path());
        // Two objects; in the first, answers close together, one far off and one farther.
        let mut first = vec![b' '; 3 << 20];
        let far = 200_000;
        let farthest = (2 << 20) + 200_000;
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
