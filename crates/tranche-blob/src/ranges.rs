//! Reading many ranges of one object at once, as each backend reads them best: a local file
//! opened once and each range read exactly, an S3 object in a few long requests.

use std::ops::Range;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectStore, ObjectStoreExt};

use crate::{BlobError, BlobKey, BlobStore};

/// Two ranges of an S3 object closer than this are read in one request: reading the gap
/// costs less than another round trip.
const S3_MAX_GAP: u64 = 64 << 10;

/// The longest request read from S3 at once.
const S3_MAX_SPAN: u64 = 2 << 20;

/// S3 requests in flight at once.
const S3_READS_IN_FLIGHT: usize = 4;

/// One S3 request: the bytes it reads, and which of the asked ranges lie in it.
struct Span {
    start: u64,
    end: u64,
    /// (position among the asked ranges, range)
    parts: Vec<(usize, Range<u64>)>,
}

impl BlobStore {
    /// The bytes of each of `ranges` of the object `key`, in the order asked; a range that
    /// reaches past the object's end is an error, never a short answer. A local object is
    /// opened once and each range read exactly, in one blocking call (no gap between ranges
    /// is read). On S3, ranges lying close together are read in one request of at most
    /// 2 MiB, four requests at a time, and only the asked bytes are kept: memory holds the
    /// answers and the requests in flight, however far apart the ranges lie.
    pub async fn get_ranges(
        &self,
        key: &BlobKey,
        ranges: &[Range<u64>],
    ) -> Result<Vec<Bytes>, BlobError> {
        let read = if self.is_local() {
            self.inner.get_ranges(&key.path(), ranges).await
        } else {
            read_in_spans(self.inner.as_ref(), key, ranges).await
        };
        let read = read.map_err(BlobError::backend("reading", key.as_str()))?;
        match ranges.iter().zip(&read).find(|(range, bytes)| range_len(range) != bytes.len()) {
            Some((range, bytes)) => Err(BlobError::ShortRange {
                key: key.to_string(),
                start: range.start,
                end: range.end,
                got: bytes.len(),
            }),
            None => Ok(read),
        }
    }
}

fn range_len(range: &Range<u64>) -> usize {
    usize::try_from(range.end.saturating_sub(range.start)).unwrap_or(usize::MAX)
}

/// The S3 reading of [`BlobStore::get_ranges`]. (`object_store`'s own joins ranges up to
/// 1 MiB apart with no bound on a request's length, so that ranges spread over a large
/// object would be read as the whole object, held in memory at once.)
async fn read_in_spans(
    store: &dyn ObjectStore,
    key: &BlobKey,
    ranges: &[Range<u64>],
) -> object_store::Result<Vec<Bytes>> {
    // An empty range needs no request (and S3 refuses one).
    let mut order: Vec<(usize, Range<u64>)> =
        ranges.iter().cloned().enumerate().filter(|(_, range)| !range.is_empty()).collect();
    order.sort_unstable_by_key(|(_, range)| (range.start, range.end));
    let mut spans: Vec<Span> = Vec::new();
    for (i, range) in order {
        match spans.last_mut() {
            Some(span)
                if range.start <= span.end + S3_MAX_GAP
                    && range.end.max(span.end) - span.start <= S3_MAX_SPAN =>
            {
                span.end = span.end.max(range.end);
                span.parts.push((i, range));
            }
            _ => spans.push(Span { start: range.start, end: range.end, parts: vec![(i, range)] }),
        }
    }
    let location = key.path();
    let location = &location;
    let mut reads = futures::stream::iter(spans)
        .map(|span| async move {
            let bytes = store.get_range(location, span.start..span.end).await?;
            // Each asked range is copied out, so that the span's buffer goes when it is read.
            let parts = span.parts.into_iter().map(|(i, range)| {
                let from = usize::try_from(range.start - span.start).unwrap_or(usize::MAX);
                let to = from.saturating_add(range_len(&range)).min(bytes.len());
                (i, Bytes::copy_from_slice(bytes.get(from.min(to)..to).unwrap_or_default()))
            });
            Ok::<_, object_store::Error>(parts.collect::<Vec<_>>())
        })
        .buffer_unordered(S3_READS_IN_FLIGHT);
    let mut read = vec![Bytes::new(); ranges.len()];
    while let Some(parts) = reads.try_next().await? {
        for (i, bytes) in parts {
            read[i] = bytes;
        }
    }
    Ok(read)
}
