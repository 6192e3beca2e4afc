//! Blob keys: relative, `/`-separated names under the store's root, checked so that no key
//! can reach outside it.

use std::fmt;

use crate::BlobError;

/// The name of one object, relative to the blob store's root (`bodies/job_…`,
/// `raw/tr_…/output.jsonl`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlobKey(String);

impl BlobKey {
    pub fn new(key: impl Into<String>) -> Result<Self, BlobError> {
        let key = key.into();
        let bad = key.is_empty()
            || key.split('/').any(|part| part.is_empty() || part == "." || part == "..")
            || key.chars().any(|c| c.is_control() || c == '\\' || c == '#');
        if bad { Err(BlobError::BadKey(key)) } else { Ok(Self(key)) }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub(crate) fn path(&self) -> object_store::path::Path {
        object_store::path::Path::from(self.0.as_str())
    }
}

impl fmt::Display for BlobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_stay_inside_the_store() {
        assert!(BlobKey::new("raw/tr_1/output.jsonl").is_ok());
        for bad in ["", "/abs", "a//b", "../up", "a/./b", "a/..", "tab\there", "win\\path", "x#y"] {
            assert!(BlobKey::new(bad).is_err(), "{bad:?}");
        }
    }
}
