//! The `Provider` trait: one method per step of a provider batch's life, provider-neutral.

use tranche_core::{AccountId, ProviderKind, TrancheId};

use crate::error::{ErrorKind, LineParseError, UpstreamError};
use crate::streams::{Download, UploadBody};
use crate::types::{
    BatchId, BatchPage, CreateBatch, FileId, FilePage, InputTransport, RemoteBatch, ResultLine,
    UploadedFile,
};

/// A provider's batch API. Adapters talk HTTP; they know nothing of the store or the engine.
///
/// Calls that only read or delete (`retrieve_batch`, `list_batches`, `list_files`, `download_file`,
/// `delete_file`, `download_results`, `delete_batch`) retry transient failures themselves; calls
/// with side effects (`upload_batch_file`, `create_batch`, `cancel_batch`) are tried once, so that
/// the engine can check what the provider already has before repeating them. Operations a
/// provider does not have answer `ErrorKind::Unsupported` (Anthropic has no files).
#[async_trait::async_trait]
pub trait Provider: Send + Sync + std::fmt::Debug {
    fn kind(&self) -> ProviderKind;

    /// The account this adapter reaches: provider and base URL, never the key. A tranche
    /// records it, and only engines reaching the same account step that tranche.
    fn account(&self) -> AccountId;

    /// Whether batches start from an uploaded file or carry their requests inline.
    fn transport(&self) -> InputTransport {
        InputTransport::UploadFile
    }

    /// Uploads `body` (JSONL input lines, streamed, never whole in memory) as
    /// `tranche-<tranche id>.jsonl`, purpose batch, with the configured expiry.
    async fn upload_batch_file(
        &self,
        tranche: TrancheId,
        body: UploadBody,
    ) -> Result<UploadedFile, UpstreamError>;

    /// Creates the batch; metadata carries {"tranche_id": "<id>"}; completion window 24h; output
    /// expiry from the configuration.
    async fn create_batch(&self, req: CreateBatch<'_>) -> Result<RemoteBatch, UpstreamError>;

    async fn retrieve_batch(&self, id: &BatchId) -> Result<RemoteBatch, UpstreamError>;

    /// One page of batches, newest first, starting after `after`; `limit` is clamped to what the
    /// provider allows (OpenAI and Azure: 1..=100; Anthropic: 1..=1000).
    async fn list_batches(
        &self,
        after: Option<&BatchId>,
        limit: u32,
    ) -> Result<BatchPage, UpstreamError>;

    async fn cancel_batch(&self, id: &BatchId) -> Result<RemoteBatch, UpstreamError>;

    /// A file's content as a stream, never whole in memory. The request is retried until an
    /// answer starts; a transfer broken after that is an error the caller retries whole.
    async fn download_file(&self, id: &FileId) -> Result<Download, UpstreamError>;

    /// Deletes a file; a file that is already gone (404) counts as deleted.
    async fn delete_file(&self, id: &FileId) -> Result<(), UpstreamError>;

    /// Finds the input file tranche uploaded for `tranche` (named `tranche-<id>.jsonl`), if the
    /// provider has it: how an upload that happened but was never recorded is adopted after a
    /// crash. Providers without files have none.
    async fn find_batch_file(
        &self,
        tranche: TrancheId,
    ) -> Result<Option<UploadedFile>, UpstreamError> {
        let _ = tranche;
        Ok(None)
    }

    /// One page of every file the account holds (any purpose, whoever uploaded it), newest
    /// first, starting after `after`; `limit` is clamped to what the provider allows (OpenAI:
    /// 1..=10,000). Providers without files have none.
    async fn list_files(
        &self,
        after: Option<&FileId>,
        limit: u32,
    ) -> Result<FilePage, UpstreamError> {
        let _ = (after, limit);
        Ok(FilePage::default())
    }

    /// Whether batches carry tranche's metadata (`tranche_id`), so that one can be found by
    /// it. Anthropic's have no metadata; the engine matches them by count and time instead.
    fn has_batch_metadata(&self) -> bool {
        true
    }

    /// A batch's results from its `results_url`, as a stream, for providers that serve results
    /// that way.
    async fn download_results(&self, results_url: &str) -> Result<Download, UpstreamError> {
        let _ = results_url;
        Err(UpstreamError::new(
            self.kind(),
            ErrorKind::Unsupported,
            "this provider serves results as files",
        ))
    }

    /// Deletes an ended batch, for providers that have such an operation; a no-op elsewhere.
    async fn delete_batch(&self, id: &BatchId) -> Result<(), UpstreamError> {
        let _ = id;
        Ok(())
    }

    /// Reads one line of an output or error file.
    fn parse_result_line(&self, line: &str) -> Result<ResultLine, LineParseError>;
}
