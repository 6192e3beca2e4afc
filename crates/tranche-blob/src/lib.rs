//! tranche's blob store: bytes at rest (request bodies, tranche input files, raw result files,
//! exports) in a local folder or S3-compatible storage, through `object_store`. An object is
//! whole or absent: it is written in one put, or streamed and made visible only when complete,
//! and its size and SHA-256 are known only then. The database holds references; this holds
//! bytes, and never parses them.

mod error;
mod key;
mod ranges;
mod store;
mod writer;

pub use error::BlobError;
pub use key::BlobKey;
pub use store::{BlobRef, BlobStore};
pub use writer::BlobWriter;
