//! Where things rest in the blob store: one place names every key, so that the steps that
//! write objects and the prune that removes them agree.
//!
//! - `bodies/<job>.jsonl`: a job's canonical request bodies, one a line (written at submit).
//! - `tranches/<tranche>/input.jsonl`: the input file of a tranche whose batch carries its requests
//!   inline, until the batch has ended (a file upload is streamed as it is assembled).
//! - `raw/<tranche>/output.jsonl`, `errors.jsonl`: a batch's result files as downloaded (kept;
//!   answers are ranges of them).
//! - `exports/<job>/results.jsonl`: a job's results, exported on request.

use tranche_blob::{BlobError, BlobKey};
use tranche_core::{JobId, TrancheId};

/// The folder of tranches' input files, one folder a tranche.
pub(crate) const INPUT_FOLDER: &str = "tranches";

/// The folder of every tranche's raw result files, one folder a tranche.
pub(crate) const RAW_FOLDER: &str = "raw";

/// A job's request bodies.
pub(crate) fn body_key(job: JobId) -> Result<BlobKey, BlobError> {
    BlobKey::new(format!("bodies/{job}.jsonl"))
}

/// A tranche's input file.
pub(crate) fn input_key(tranche: TrancheId) -> Result<BlobKey, BlobError> {
    BlobKey::new(format!("{INPUT_FOLDER}/{tranche}/input.jsonl"))
}

/// A tranche's raw result file `name` (`output.jsonl`, `errors.jsonl`).
pub(crate) fn raw_key(tranche: TrancheId, name: &str) -> Result<BlobKey, BlobError> {
    BlobKey::new(format!("{RAW_FOLDER}/{tranche}/{name}"))
}

/// The tranche whose file `key` (`raw/<tranche>/...`, `tranches/<tranche>/...`) is.
pub(crate) fn tranche_of(key: &str) -> Option<TrancheId> {
    key.split('/').nth(1)?.parse().ok()
}

/// The folder of a job's exports.
pub(crate) fn export_folder(job: JobId) -> Result<BlobKey, BlobError> {
    BlobKey::new(format!("exports/{job}"))
}

/// Where a job's results are exported.
pub fn export_key(job: JobId) -> Result<BlobKey, BlobError> {
    BlobKey::new(format!("exports/{job}/results.jsonl"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tranche_files_name_their_tranche() {
        let tranche = TrancheId::new();
        for key in [raw_key(tranche, "output.jsonl").unwrap(), input_key(tranche).unwrap()] {
            assert_eq!(tranche_of(key.as_str()), Some(tranche), "{key}");
        }
        assert_eq!(tranche_of("raw/not-an-id/output.jsonl"), None);
        assert_eq!(tranche_of(body_key(JobId::new()).unwrap().as_str()), None);
    }
}
