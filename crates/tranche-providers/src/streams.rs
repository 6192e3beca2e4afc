//! Bytes across the provider boundary: an upload is a stream of known length, a download is a
//! stream the caller writes where it wants (the blob store, a file). No local path crosses the
//! `Provider` trait; these helpers connect files to it where a caller has one.

use std::path::Path;

use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt, TryStreamExt};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio_util::io::{ReaderStream, StreamReader};
use tranche_core::{ProviderKind, TrancheId};

use crate::error::{ErrorKind, UpstreamError};
use crate::provider::Provider;
use crate::types::{FileId, UploadedFile};

/// Bytes to send, and how many: the length is sent first (`Content-Length`), so it must be
/// exact.
pub struct UploadBody {
    pub stream: BoxStream<'static, std::io::Result<Bytes>>,
    pub len: u64,
}

impl std::fmt::Debug for UploadBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UploadBody").field("len", &self.len).finish_non_exhaustive()
    }
}

impl UploadBody {
    /// The content of the file at `path`, streamed.
    pub async fn from_file(path: &Path) -> std::io::Result<Self> {
        let file = tokio::fs::File::open(path).await?;
        let len = file.metadata().await?.len();
        Ok(Self { stream: ReaderStream::new(file).boxed(), len })
    }

    /// Bytes held in memory.
    pub fn from_bytes(bytes: impl Into<Bytes>) -> Self {
        let bytes = bytes.into();
        let len = bytes.len() as u64;
        Self { stream: futures::stream::once(async move { Ok(bytes) }).boxed(), len }
    }

    /// The bytes as a reader.
    pub(crate) fn into_reader(self) -> impl tokio::io::AsyncRead + Send + Unpin {
        StreamReader::new(self.stream)
    }
}

/// The JSONL input lines of a batch that carries its requests inline (Anthropic): the lines,
/// how many there are, and their bytes without line ends (the create body's length follows).
#[derive(Debug)]
pub struct InlineInput {
    pub lines: UploadBody,
    pub count: u64,
    pub line_bytes: u64,
}

impl InlineInput {
    /// The non-blank lines of the JSONL file at `path`, measured, then streamed.
    pub async fn from_file(path: &Path) -> std::io::Result<Self> {
        let mut reader = BufReader::new(tokio::fs::File::open(path).await?);
        let mut line = Vec::new();
        let (mut count, mut line_bytes) = (0u64, 0u64);
        loop {
            line.clear();
            if reader.read_until(b'\n', &mut line).await? == 0 {
                break;
            }
            let content = trim_line_end(&line);
            if !content.iter().all(u8::is_ascii_whitespace) {
                count += 1;
                line_bytes += content.len() as u64;
            }
        }
        Ok(Self { lines: UploadBody::from_file(path).await?, count, line_bytes })
    }
}

/// A line without its line end (`\n`, `\r\n`).
pub(crate) fn trim_line_end(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// A download in progress: the provider's bytes as they arrive. An error mid-stream is an
/// upstream error; the caller keeps nothing of a download that did not finish.
pub struct Download {
    pub stream: BoxStream<'static, Result<Bytes, UpstreamError>>,
}

impl std::fmt::Debug for Download {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Download").finish_non_exhaustive()
    }
}

impl Download {
    /// Writes the download into the file at `dest` (created or truncated) and fsyncs it.
    /// Returns the bytes written. On error `dest` may hold a partial file, which the caller
    /// discards.
    pub async fn into_file(
        mut self,
        provider: ProviderKind,
        dest: &Path,
    ) -> Result<u64, UpstreamError> {
        let io_error = |action: &str, err: std::io::Error| {
            UpstreamError::new(
                provider,
                ErrorKind::Io,
                format!("{action} {}: {err}", dest.display()),
            )
        };
        let mut file =
            tokio::fs::File::create(dest).await.map_err(|e| io_error("cannot create", e))?;
        let mut written = 0u64;
        while let Some(chunk) = self.stream.try_next().await? {
            file.write_all(&chunk).await.map_err(|e| io_error("cannot write", e))?;
            written += chunk.len() as u64;
        }
        file.flush().await.map_err(|e| io_error("cannot write", e))?;
        file.sync_all().await.map_err(|e| io_error("cannot sync", e))?;
        Ok(written)
    }

    /// The whole download in memory (small answers only).
    pub async fn into_bytes(self) -> Result<Vec<u8>, UpstreamError> {
        self.stream
            .try_fold(Vec::new(), |mut all, chunk| async move {
                all.extend_from_slice(&chunk);
                Ok(all)
            })
            .await
    }
}

/// Files connected to a provider's streams, for callers that have files: every provider has
/// these.
#[async_trait::async_trait]
pub trait ProviderFiles {
    /// Uploads the JSONL file at `path` as the tranche's input file.
    async fn upload_path(
        &self,
        tranche: TrancheId,
        path: &Path,
    ) -> Result<UploadedFile, UpstreamError>;

    /// Downloads the file `id` into the file at `dest`. Returns the bytes written.
    async fn download_to(&self, id: &FileId, dest: &Path) -> Result<u64, UpstreamError>;

    /// Downloads a batch's results from `results_url` into the file at `dest`. Returns the
    /// bytes written.
    async fn results_to(&self, results_url: &str, dest: &Path) -> Result<u64, UpstreamError>;
}

#[async_trait::async_trait]
impl<P: Provider + ?Sized> ProviderFiles for P {
    async fn upload_path(
        &self,
        tranche: TrancheId,
        path: &Path,
    ) -> Result<UploadedFile, UpstreamError> {
        let body = UploadBody::from_file(path).await.map_err(|err| {
            UpstreamError::new(
                self.kind(),
                ErrorKind::Io,
                format!("cannot read {}: {err}", path.display()),
            )
        })?;
        self.upload_batch_file(tranche, body).await
    }

    async fn download_to(&self, id: &FileId, dest: &Path) -> Result<u64, UpstreamError> {
        self.download_file(id).await?.into_file(self.kind(), dest).await
    }

    async fn results_to(&self, results_url: &str, dest: &Path) -> Result<u64, UpstreamError> {
        self.download_results(results_url).await?.into_file(self.kind(), dest).await
    }
}
