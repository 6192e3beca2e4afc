//! The blob store's error type.

/// What went wrong with the blob store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BlobError {
    /// The blob store URL cannot be used.
    #[error("blob store `{url}`: {reason}")]
    Url { url: String, reason: String },
    /// A key that could escape its store or is empty.
    #[error("`{0}` is not a blob key (relative, `/`-separated, no empty, `.` or `..` parts)")]
    BadKey(String),
    #[error("no blob `{0}`")]
    NotFound(String),
    /// The backend refused or failed (a full disk, a network error, denied credentials).
    #[error("blob store: {op} `{key}`: {source}")]
    Backend {
        op: &'static str,
        key: String,
        #[source]
        source: object_store::Error,
    },
    /// A local folder's file could not be handled.
    #[error("blob store: {op} `{key}`: {source}")]
    Local {
        op: &'static str,
        key: String,
        #[source]
        source: std::io::Error,
    },
    /// A range read came back shorter than asked: the object ends before it.
    #[error(
        "blob store: `{key}` holds {got} bytes of {start}..{end}; it ends before that range does"
    )]
    ShortRange { key: String, start: u64, end: u64, got: usize },
    #[error("reading `{path}` into the blob store: {source}")]
    Read {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl BlobError {
    pub(crate) fn backend(
        op: &'static str,
        key: &str,
    ) -> impl FnOnce(object_store::Error) -> Self + use<> {
        let key = key.to_owned();
        move |source| match source {
            object_store::Error::NotFound { .. } => Self::NotFound(key),
            source => Self::Backend { op, key, source },
        }
    }
}
