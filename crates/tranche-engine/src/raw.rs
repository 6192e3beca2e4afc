//! Reading a raw result file of the blob store line by line, with where each line starts (an
//! answer is kept as its byte range there).

use futures::TryStreamExt;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_util::io::StreamReader;
use tranche_blob::{BlobKey, BlobStore};

use crate::error::EngineError;

type Chunks =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<bytes::Bytes, std::io::Error>> + Send>>;

/// The lines of one raw result file, each with its offset in the file.
pub(crate) struct RawLines {
    reader: BufReader<StreamReader<Chunks, bytes::Bytes>>,
    line: Vec<u8>,
    next_start: u64,
    key: BlobKey,
}

impl RawLines {
    pub(crate) async fn open(blobs: &BlobStore, key: BlobKey) -> Result<Self, EngineError> {
        let chunks = blobs.stream(&key).await?;
        let chunks: Chunks = Box::pin(chunks.map_err(std::io::Error::other));
        Ok(Self {
            reader: BufReader::new(StreamReader::new(chunks)),
            line: Vec::new(),
            next_start: 0,
            key,
        })
    }

    /// The next line (its end of line included) and where it starts; `None` at the end.
    pub(crate) async fn next(&mut self) -> Result<Option<(u64, &[u8])>, EngineError> {
        self.line.clear();
        let start = self.next_start;
        let n = self
            .reader
            .read_until(b'\n', &mut self.line)
            .await
            .map_err(EngineError::io("reading", self.key.as_str()))?;
        if n == 0 {
            return Ok(None);
        }
        self.next_start += n as u64;
        Ok(Some((start, &self.line)))
    }
}
