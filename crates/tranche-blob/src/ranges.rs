//! Reading many ranges of one object at once: ranges lying close together are read as one
//! span and only the asked bytes kept. A local object is opened once and its spans read in
//! one blocking call; an S3 object in a few long requests.

use std::ops::Range;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectStore, ObjectStoreExt};

use crate::{BlobError, BlobKey, BlobStore};

/// How ranges are gathered into spans, each read at once.
#[derive(Debug, Clone, Copy)]
struct Spans {
    /// Two ranges closer than this are read in one span: reading the gap costs less than
    /// another read.
    max_gap: u64,
    /// The longest span read at once.
    max_span: u64,
}

/// On S3 a read is a round trip: gaps up to 64 KiB are read through, and a request reads at
/// most 2 MiB.
const S3_SPANS: Spans = Spans { max_gap: 64 << 10, max_span: 2 << 20 };

/// S3 requests in flight at once.
const S3_READS_IN_FLIGHT: usize = 4;

/// A local read is a system call, which costs about as much as copying a few KiB. The answers
/// of a tranche lie about 250 bytes apart in its raw output (the rest of each line), and an
/// export asks for a page of them at once: read a range at a time, 100,000 answers were 98,497
/// reads of 662 bytes (an export of them: 0.25-0.43 s of system time, against 0.19-0.22 read
/// in spans, 4 alternating runs each). Gaps are read through only up to 1 KiB, because all of
/// a call's spans are held at once: at most 1 KiB more than the answers for each. A span stays
/// under 64 KiB, which the allocator serves from its heap.
const LOCAL_SPANS: Spans = Spans { max_gap: 1 << 10, max_span: 64 << 10 };

/// One read: the bytes it reads, and which of the asked ranges lie in it.
#[derive(Debug, PartialEq)]
struct Span {
    start: u64,
    end: u64,
    /// (position among the asked ranges, range)
    parts: Vec<(usize, Range<u64>)>,
}

impl Span {
    /// The asked ranges of the span, each copied out of `bytes` (what was read of it), so that
    /// the span's buffer goes when it is cut.
    fn cut(self, bytes: &Bytes) -> impl Iterator<Item = (usize, Bytes)> + '_ {
        self.parts.into_iter().map(move |(i, range)| {
            let from = usize::try_from(range.start - self.start).unwrap_or(usize::MAX);
            let to = from.saturating_add(range_len(&range)).min(bytes.len());
            (i, Bytes::copy_from_slice(bytes.get(from.min(to)..to).unwrap_or_default()))
        })
    }
}

/// `ranges` gathered into spans by `rules`, in the object's order. An empty range needs no
/// read (and S3 refuses one): it lies in no span.
fn spans(ranges: &[Range<u64>], rules: Spans) -> Vec<Span> {
    let mut order: Vec<(usize, Range<u64>)> =
        ranges.iter().cloned().enumerate().filter(|(_, range)| !range.is_empty()).collect();
    order.sort_unstable_by_key(|(_, range)| (range.start, range.end));
    let mut spans: Vec<Span> = Vec::new();
    for (i, range) in order {
        match spans.last_mut() {
            Some(span)
                if range.start <= span.end + rules.max_gap
                    && range.end.max(span.end) - span.start <= rules.max_span =>
            {
                span.end = span.end.max(range.end);
                span.parts.push((i, range));
            }
            _ => spans.push(Span { start: range.start, end: range.end, parts: vec![(i, range)] }),
        }
    }
    spans
}

impl BlobStore {
    /// The bytes of each of `ranges` of the object `key`, in the order asked; a range that
    /// reaches past the object's end is an error, never a short answer. Ranges lying close
    /// together are read as one span and only the asked bytes kept. A local object is opened
    /// once and its spans ([`LOCAL_SPANS`]) read in one blocking call. On S3 a span
    /// ([`S3_SPANS`]) is a request, four at a time: memory holds the answers and the requests
    /// in flight, however far apart the ranges lie.
    pub async fn get_ranges(
        &self,
        key: &BlobKey,
        ranges: &[Range<u64>],
    ) -> Result<Vec<Bytes>, BlobError> {
        let read = if self.is_local() {
            read_local(self.inner.as_ref(), key, ranges).await
        } else {
            read_in_requests(self.inner.as_ref(), key, ranges).await
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

/// The local reading of [`BlobStore::get_ranges`]: `object_store` reads a local file's ranges
/// in one blocking call, each by itself; asked for spans, it reads far fewer. (Its `get_range`
/// would read a span 8 KiB at a time, each a blocking task of its own.)
async fn read_local(
    store: &dyn ObjectStore,
    key: &BlobKey,
    ranges: &[Range<u64>],
) -> object_store::Result<Vec<Bytes>> {
    let spans = spans(ranges, LOCAL_SPANS);
    let wanted: Vec<Range<u64>> = spans.iter().map(|span| span.start..span.end).collect();
    let bytes = store.get_ranges(&key.path(), &wanted).await?;
    let mut read = vec![Bytes::new(); ranges.len()];
    for (span, bytes) in spans.into_iter().zip(bytes) {
        for (i, part) in span.cut(&bytes) {
            read[i] = part;
        }
    }
    Ok(read)
}

/// The S3 reading of [`BlobStore::get_ranges`]. (`object_store`'s own joins ranges up to
/// 1 MiB apart with no bound on a request's length, so that ranges spread over a large
/// object would be read as the whole object, held in memory at once.)
async fn read_in_requests(
    store: &dyn ObjectStore,
    key: &BlobKey,
    ranges: &[Range<u64>],
) -> object_store::Result<Vec<Bytes>> {
    let location = key.path();
    let location = &location;
    let mut reads = futures::stream::iter(spans(ranges, S3_SPANS))
        .map(|span| async move {
            let bytes = store.get_range(location, span.start..span.end).await?;
            Ok::<_, object_store::Error>(span.cut(&bytes).collect::<Vec<_>>())
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

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: Spans = Spans { max_gap: 10, max_span: 100 };

    /// Ranges close together share a span, in the object's order whatever the order asked;
    /// a gap past the rule or a span past its longest starts another; empty ranges lie in
    /// none.
    #[test]
    fn ranges_close_together_share_a_span_up_to_its_longest() {
        let ranges = [50..60, 0..10, 15..20, 20..20, 31..40, 5..8, 70..190];
        let got = spans(&ranges, RULES);
        let want = [
            Span { start: 0, end: 20, parts: vec![(1, 0..10), (5, 5..8), (2, 15..20)] },
            Span { start: 31, end: 60, parts: vec![(4, 31..40), (0, 50..60)] },
            Span { start: 70, end: 190, parts: vec![(6, 70..190)] },
        ];
        assert_eq!(got, want);
        let long = [0..60, 65..101];
        assert_eq!(spans(&long, RULES).len(), 2, "a span is at most 100 bytes");
    }

    /// Each part is cut from its span's bytes; a span read short leaves its last parts short
    /// (which `get_ranges` refuses), never wrong.
    #[test]
    fn parts_are_cut_from_their_span() {
        let span = Span { start: 10, end: 20, parts: vec![(0, 10..12), (1, 15..20)] };
        let bytes = Bytes::from_static(b"abcdefghij");
        let cut: Vec<_> = span.cut(&bytes).collect();
        assert_eq!(cut, [(0, Bytes::from_static(b"ab")), (1, Bytes::from_static(b"fghij"))]);
        let span = Span { start: 10, end: 20, parts: vec![(0, 10..12), (1, 15..20)] };
        let short: Vec<_> = span.cut(&bytes.slice(..7)).collect();
        assert_eq!(short[1], (1, Bytes::from_static(b"fg")));
    }
}
