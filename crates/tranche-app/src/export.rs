//! Exporting a job's results: one JSON line per request, in input order, streamed from the
//! store (memory does not grow with the job).

use std::io::Write;

use futures::TryStreamExt;
use serde::Serialize;
use serde_json::value::RawValue;
use tranche_blob::{BlobKey, BlobStore};
use tranche_core::{CustomId, JobId, RequestState};
use tranche_store::{OutputRef, Store};

use crate::error::AppError;

/// One exported line. Its keys are an interface: add, never rename.
#[derive(Serialize)]
struct ResultLine<'a> {
    custom_id: &'a str,
    key: &'a str,
    status: &'a str,
    output: Option<Box<RawValue>>,
    error: Option<Box<RawValue>>,
}

fn status_name(state: RequestState) -> &'static str {
    match state {
        RequestState::Pending | RequestState::Queued => "pending",
        other => other.as_str(),
    }
}

fn raw(text: Option<String>) -> Result<Option<Box<RawValue>>, AppError> {
    text.map(RawValue::from_string).transpose().map_err(|e| AppError::Corrupt(e.to_string()))
}

/// An output's text: kept in the database, or read from its range in the blob store.
async fn output_text(blobs: &BlobStore, output: OutputRef) -> Result<String, AppError> {
    match output {
        OutputRef::Text(text) => Ok(text),
        OutputRef::InObject { object, offset, len } => {
            let key = BlobKey::new(object)?;
            let bytes = blobs.get_range(&key, offset..offset + len).await?;
            String::from_utf8(bytes.to_vec()).map_err(|e| AppError::Corrupt(e.to_string()))
        }
    }
}

/// Writes a job's results to `out`, one line per request. Returns how many.
pub(crate) async fn write_results(
    store: &dyn Store,
    blobs: &BlobStore,
    job: JobId,
    out: &mut dyn Write,
) -> Result<u64, std::io::Error> {
    let mut rows = store.job_results(job);
    let mut n = 0;
    let failed = |e: AppError| std::io::Error::other(e.to_string());
    while let Some(row) = rows.try_next().await.map_err(|e| failed(AppError::Store(e)))? {
        let key = CustomId::parse(&row.custom_id)
            .map(|id| id.key().to_owned())
            .unwrap_or_else(|_| row.custom_id.clone());
        let line = ResultLine {
            custom_id: &row.custom_id,
            key: &key,
            status: status_name(row.state),
            output: match row.output {
                Some(output) => {
                    raw(Some(output_text(blobs, output).await.map_err(failed)?)).map_err(failed)?
                }
                None => None,
            },
            error: raw(row.error).map_err(failed)?,
        };
        serde_json::to_writer(&mut *out, &line)?;
        out.write_all(b"\n")?;
        n += 1;
    }
    out.flush()?;
    Ok(n)
}
