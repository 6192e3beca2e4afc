//! Streaming an object into the blob store: buffered, uploaded in parts when large, visible
//! only once finished; its size and SHA-256 are counted on the way.

use std::sync::Arc;

use bytes::Bytes;
use object_store::ObjectStore;
use object_store::buffered::BufWriter;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::{BlobError, BlobKey, BlobRef};

/// Bytes buffered before an object goes out in parts, and the size of each part: S3's
/// smallest part is 5 MiB; a local folder takes parts of any size, so it gets 256 KiB and
/// memory stays under a MiB per writer whatever the object's size (an engine runs several).
pub(crate) const S3_PART_BYTES: usize = 5 << 20;
pub(crate) const LOCAL_PART_BYTES: usize = 256 << 10;

/// Small writes are gathered up to this many bytes before they go to the backend, which
/// writes each handed chunk separately (a local folder: one write(2) per chunk).
const GATHER_BYTES: usize = 256 << 10;

/// Streams one object. Dropped or aborted before [`BlobWriter::finish`], it leaves no object
/// under its key (a multipart upload is never completed; a local staging file is not the
/// object's name).
pub struct BlobWriter {
    inner: Option<BufWriter>,
    key: BlobKey,
    hasher: Sha256,
    size: u64,
    /// Writes gathered and not yet handed to `inner`.
    gathered: Vec<u8>,
}

impl std::fmt::Debug for BlobWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlobWriter").field("key", &self.key).field("size", &self.size).finish()
    }
}

impl BlobWriter {
    pub(crate) fn new(store: Arc<dyn ObjectStore>, key: BlobKey, part_bytes: usize) -> Self {
        // Two parts in flight: memory stays at a few parts, whatever the object's size.
        let inner = BufWriter::with_capacity(store, key.path(), part_bytes).with_max_concurrency(2);
        Self { inner: Some(inner), key, hasher: Sha256::new(), size: 0, gathered: Vec::new() }
    }

    /// Hands the gathered writes to the backend as one chunk.
    async fn hand_over(&mut self) -> Result<(), BlobError> {
        if self.gathered.is_empty() {
            return Ok(());
        }
        let error = self.failed("writing");
        let Some(inner) = self.inner.as_mut() else {
            return Err(error(std::io::Error::other("the writer was finished")));
        };
        let chunk = Bytes::from(std::mem::take(&mut self.gathered));
        inner.put(chunk).await.map_err(BlobError::backend("writing", self.key.as_str()))
    }

    fn failed(&self, op: &'static str) -> impl FnOnce(std::io::Error) -> BlobError + use<> {
        let key = self.key.to_string();
        move |e| BlobError::Backend {
            op,
            key,
            source: object_store::Error::Generic { store: "blob writer", source: Box::new(e) },
        }
    }

    /// Appends `bytes`.
    pub async fn write(&mut self, bytes: &[u8]) -> Result<(), BlobError> {
        if self.inner.is_none() {
            return Err(self.failed("writing")(std::io::Error::other("the writer was finished")));
        }
        self.hasher.update(bytes);
        self.size += bytes.len() as u64;
        // A large write is gathered in pieces: a chunk handed over stays in memory until
        // every part cut from it is written, so chunks larger than a local part would hold
        // several parts' worth each (an input file written a megabyte at a time kept about
        // 3 MiB per writer, not one).
        for piece in bytes.chunks(GATHER_BYTES) {
            if self.gathered.len() + piece.len() > GATHER_BYTES {
                self.hand_over().await?;
            }
            if self.gathered.capacity() == 0 {
                self.gathered.reserve_exact(GATHER_BYTES);
            }
            self.gathered.extend_from_slice(piece);
        }
        Ok(())
    }

    /// Completes the object: from now on it is whole under its key.
    pub async fn finish(mut self) -> Result<BlobRef, BlobError> {
        self.hand_over().await?;
        let error = self.failed("completing");
        let Some(mut inner) = self.inner.take() else {
            return Err(error(std::io::Error::other("the writer was finished")));
        };
        inner.shutdown().await.map_err(error)?;
        let sha256 = hex::encode(std::mem::take(&mut self.hasher).finalize());
        Ok(BlobRef { key: self.key.clone(), size: self.size, sha256 })
    }

    /// Gives the object up, cleaning up any part already uploaded.
    pub async fn abort(mut self) -> Result<(), BlobError> {
        let Some(mut inner) = self.inner.take() else { return Ok(()) };
        inner.abort().await.map_err(BlobError::backend("aborting", self.key.as_str()))
    }
}
