//! tranche's provider adapters (OpenAI, Azure OpenAI, Anthropic): the batch lifecycle (upload,
//! create, get, list, cancel, download, delete) behind the `Provider` trait, and `UpstreamError`,
//! which keeps every fact a provider gave.
//!
//! Architecture invariant: this crate knows nothing about the store or the engine. It turns calls
//! into HTTP and HTTP back into values; deciding what to do next is the engine's job.

pub mod anthropic;
pub mod azure;
mod body;
mod error;
mod http;
mod oai;
pub mod openai;
mod provider;
mod streams;
mod time;
mod types;

pub use anthropic::{AnthropicConfig, AnthropicProvider};
pub use azure::{AzureAuth, AzureConfig, AzureProvider, AzureSurface};
pub use error::{ConfigError, ErrorKind, LineParseError, UpstreamError};
pub use http::{RetryPolicy, USER_AGENT, http_client};
pub use openai::{OpenAiConfig, OpenAiProvider};
pub use provider::Provider;
pub use streams::{Download, InlineInput, ProviderFiles, UploadBody};
pub use types::{
    BatchErrorEntry, BatchId, BatchInput, BatchPage, BatchStatus, CreateBatch, FileId, FilePage,
    InputTransport, LineError, LineOutcome, RemoteBatch, RemoteFile, RequestCounts, ResultLine,
    UploadedFile, Usage,
};

/// The batch metadata key that names the tranche a batch was created for.
pub const TRANCHE_ID_METADATA_KEY: &str = "tranche_id";

/// The name tranche uploads a tranche's input file under.
pub fn batch_file_name(tranche: tranche_core::TrancheId) -> String {
    format!("tranche-{tranche}.jsonl")
}

/// The tranche a file named by [`batch_file_name`] was uploaded for; `None` for other names.
pub fn tranche_of_file_name(name: &str) -> Option<tranche_core::TrancheId> {
    name.strip_prefix("tranche-")?.strip_suffix(".jsonl")?.parse().ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn batch_file_names_name_their_tranche() {
        let tranche = tranche_core::TrancheId::new();
        assert_eq!(super::tranche_of_file_name(&super::batch_file_name(tranche)), Some(tranche));
        for other in ["tranche-x.jsonl", "batch_1_output.jsonl", "upload", "tranche-.jsonl"] {
            assert_eq!(super::tranche_of_file_name(other), None, "{other}");
        }
    }
}
