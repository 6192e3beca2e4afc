//! Exporting a job's results: one JSON line (or CSV row) per request, in input order, streamed
//! from the store and the blob store (memory does not grow with the job), into a file, a writer
//! or an object of the blob store; answers extracted, unreviewed ones only when asked for.

use futures::TryStreamExt;
use serde::Serialize;
use serde_json::Value;
use serde_json::value::RawValue;
use tranche_blob::{BlobKey, BlobStore};
use tranche_core::extract::{Answer, extract};
use tranche_core::validate::AnswerSchema;
use tranche_core::{CustomId, RequestState};
use tranche_engine::read_outputs;
use tranche_store::{JobRecord, OutputRef, ResultRow, Store};

use crate::error::AppError;

/// One exported line. Its keys are an interface: add, never rename.
struct ResultLine<'a> {
    custom_id: &'a str,
    key: &'a str,
    status: &'a str,
    output: Output,
    error: Option<Box<RawValue>>,
    /// The answer inside `output`: text, tool-call arguments, vector; the parsed JSON when
    /// the job has a schema.
    answer: Option<Value>,
    usage: Option<Usage>,
    /// `staged` for an answer not yet reviewed (exported only when asked for).
    stage: Option<&'static str>,
    /// The provider's whole result line (with `--raw`).
    raw: Option<Box<RawValue>>,
}

/// A line's output: JSON text, or none.
enum Output {
    /// Read whole as JSON already (its answer was extracted from it).
    Read(String),
    /// Checked as JSON here.
    Checked(Option<Box<RawValue>>),
}

impl ResultLine<'_> {
    /// Writes the line as one JSON object, its keys in this order: `custom_id`, `key`,
    /// `status`, `output`, `error`, `answer`, `usage`, then `stage` and `raw` where they are
    /// set. The output is copied as it stands: an output already read whole is not read a
    /// second time (as a `RawValue` would, to check it), which was a tenth of an export's CPU.
    fn write(&self, out: &mut Vec<u8>) -> serde_json::Result<()> {
        out.extend_from_slice(b"{\"custom_id\":");
        serde_json::to_writer(&mut *out, self.custom_id)?;
        out.extend_from_slice(b",\"key\":");
        serde_json::to_writer(&mut *out, self.key)?;
        out.extend_from_slice(b",\"status\":");
        serde_json::to_writer(&mut *out, self.status)?;
        out.extend_from_slice(b",\"output\":");
        match &self.output {
            Output::Read(text) => out.extend_from_slice(text.as_bytes()),
            Output::Checked(checked) => serde_json::to_writer(&mut *out, checked)?,
        }
        out.extend_from_slice(b",\"error\":");
        serde_json::to_writer(&mut *out, &self.error)?;
        out.extend_from_slice(b",\"answer\":");
        serde_json::to_writer(&mut *out, &self.answer)?;
        out.extend_from_slice(b",\"usage\":");
        serde_json::to_writer(&mut *out, &self.usage)?;
        if let Some(stage) = self.stage {
            out.extend_from_slice(b",\"stage\":");
            serde_json::to_writer(&mut *out, stage)?;
        }
        if let Some(raw) = &self.raw {
            out.extend_from_slice(b",\"raw\":");
            serde_json::to_writer(&mut *out, raw)?;
        }
        out.push(b'}');
        Ok(())
    }
}

/// The tokens a request's answer used, as the provider reported them.
#[derive(Serialize)]
struct Usage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
}

/// The columns of a CSV export (exact).
const CSV_COLUMNS: [&str; 6] =
    ["custom_id", "key", "status", "answer", "error_code", "error_message"];

/// How results are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ExportFormat {
    /// One JSON object a line.
    #[default]
    Jsonl,
    /// A header row, then one row a request (`CSV_COLUMNS`).
    Csv,
}

/// Which results are exported, and how.
#[derive(Debug, Clone, Default)]
pub struct ExportOptions {
    /// Only requests that ended so (`succeeded`, `failed`, `cancelled`).
    pub status: Option<RequestState>,
    /// Also the answers still awaiting review, marked `"stage": "staged"`.
    pub staged: bool,
    pub format: ExportFormat,
    /// Add each answer's whole result line as the provider returned it.
    pub raw: bool,
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

/// Requests whose answers are read together. A job's answers lie scattered through its
/// batches' raw files (results come back shuffled): read one by one they cost a request each
/// (on S3 a round trip, locally a file opened), read a window at a time they become a few long
/// ranges, each read once.
const WINDOW_ROWS: usize = 4096;

/// Bytes of rendered lines handed on at once: whole lines, gathered in one buffer that every
/// piece reuses. (Rendered a window at a time instead, each window's 6 MB of lines took a
/// buffer of their own, which the kernel mapped afresh, page by page, for every window: 46,000
/// page faults in an export of 100,000 results, and the peak of a run's memory.)
const PIECE_BYTES: usize = 256 << 10;

/// Where exported lines go: a piece of whole lines at a time.
pub(crate) trait LineSink {
    /// Takes `piece`, whole lines.
    async fn put(&mut self, piece: &[u8]) -> Result<(), AppError>;
}

/// What one export of one job needs to render its lines.
struct Render {
    options: ExportOptions,
    /// The job's answers await review: its succeeded ones are staged.
    staged: bool,
    /// The job's schema, compiled, and whether fenced JSON passes it.
    schema: Option<(AnswerSchema, bool)>,
}

/// Writes a job's results into `sink`, one line per request in input order (after a header
/// for CSV), in pieces of whole lines. Memory holds one window's answers, the ranges in
/// flight and one piece, whatever the job's size. Returns how many results were written.
pub(crate) async fn write_results(
    store: &dyn Store,
    blobs: &BlobStore,
    job: &JobRecord,
    options: ExportOptions,
    sink: &mut impl LineSink,
) -> Result<u64, AppError> {
    let settings = &job.settings;
    let schema = settings.schema.as_ref().and_then(|s| AnswerSchema::new(s).ok());
    let render = Render {
        staged: settings.review_sample.is_some() && job.review.is_none(),
        schema: schema.map(|s| (s, settings.lenient_json)),
        options,
    };
    let mut piece = Vec::with_capacity(PIECE_BYTES + (PIECE_BYTES >> 2));
    if render.options.format == ExportFormat::Csv {
        let mut out = csv::Writer::from_writer(&mut piece);
        out.write_record(CSV_COLUMNS).map_err(|e| AppError::Corrupt(e.to_string()))?;
        out.flush().map_err(|e| AppError::Corrupt(e.to_string()))?;
    }
    let windows = store
        .job_results(job.id)
        .map_err(AppError::Store)
        .try_filter(|row| std::future::ready(render.wanted(row)))
        .try_chunks(WINDOW_ROWS)
        .map_err(|e| e.1);
    let mut windows = std::pin::pin!(windows);
    let mut lines = 0;
    while let Some(rows) = windows.try_next().await? {
        let outputs = read_outputs(blobs, rows.iter().map(|r| r.output.as_ref())).await?;
        lines += rows.len() as u64;
        for (row, output) in rows.into_iter().zip(outputs) {
            let raw_line = match (render.options.raw, &row.output) {
                (true, Some(OutputRef::InObject { object, offset, len })) => {
                    Some(result_line(blobs, object, *offset, *len).await?)
                }
                _ => None,
            };
            render.line(&mut piece, row, output, raw_line)?;
            if piece.len() >= PIECE_BYTES {
                sink.put(&piece).await?;
                piece.clear();
            }
        }
    }
    if !piece.is_empty() {
        sink.put(&piece).await?;
    }
    Ok(lines)
}

/// A writer (a file, standard output) as a sink; a failed write names `path`.
pub(crate) struct WriteSink<'a> {
    pub(crate) out: &'a mut dyn std::io::Write,
    pub(crate) path: &'a std::path::Path,
}

impl LineSink for WriteSink<'_> {
    async fn put(&mut self, piece: &[u8]) -> Result<(), AppError> {
        self.out
            .write_all(piece)
            .map_err(|source| AppError::Write { path: self.path.to_owned(), source })
    }
}

/// An object being written to the blob store as a sink.
pub(crate) struct BlobSink<'a>(pub(crate) &'a mut tranche_blob::BlobWriter);

impl LineSink for BlobSink<'_> {
    async fn put(&mut self, piece: &[u8]) -> Result<(), AppError> {
        Ok(self.0.write(piece).await?)
    }
}

/// A channel to a response body as a sink: each piece goes as a chunk of its own.
pub(crate) struct ChannelSink(pub(crate) tokio::sync::mpsc::Sender<Result<Vec<u8>, AppError>>);

impl LineSink for ChannelSink {
    async fn put(&mut self, piece: &[u8]) -> Result<(), AppError> {
        // A reader that left ends the export.
        self.0.send(Ok(piece.to_vec())).await.map_err(|_| AppError::Write {
            path: "response body".into(),
            source: std::io::ErrorKind::BrokenPipe.into(),
        })
    }
}

impl Render {
    /// Whether `row` is exported at all.
    fn wanted(&self, row: &ResultRow) -> bool {
        let status_ok = self.options.status.is_none_or(|s| s == row.state);
        let review_ok = row.state != RequestState::Succeeded || !self.staged || self.options.staged;
        status_ok && review_ok
    }

    /// Appends one result line to `out`.
    fn line(
        &self,
        out: &mut Vec<u8>,
        row: ResultRow,
        output: Option<String>,
        raw_line: Option<String>,
    ) -> Result<(), AppError> {
        let key = key_of(&row.custom_id);
        // An output whose answer was extracted has been read whole as JSON already.
        let (answer, output_read) = match (&output, row.state) {
            (Some(output), RequestState::Succeeded) => match extract(row.endpoint, output) {
                Ok(extracted) => (self.answer(extracted), true),
                Err(_) => (None, false),
            },
            _ => (None, false),
        };
        let usage = (row.input_tokens.is_some() || row.output_tokens.is_some())
            .then_some(Usage { input_tokens: row.input_tokens, output_tokens: row.output_tokens });
        let stage = (self.staged && row.state == RequestState::Succeeded).then_some("staged");
        if self.options.format == ExportFormat::Csv {
            let error: Option<Value> =
                row.error.as_deref().and_then(|e| serde_json::from_str(e).ok());
            let field = |name: &str| {
                error.as_ref().and_then(|e| e.get(name)).and_then(Value::as_str).unwrap_or_default()
            };
            let answer = match answer {
                Some(Value::String(text)) => text,
                Some(other) => other.to_string(),
                None => String::new(),
            };
            let record = [
                row.custom_id.as_str(),
                key,
                status_name(row.state),
                answer.as_str(),
                field("code"),
                field("message"),
            ];
            let mut writer = csv::Writer::from_writer(&mut *out);
            writer.write_record(record).map_err(|e| AppError::Corrupt(e.to_string()))?;
            writer.flush().map_err(|e| AppError::Corrupt(e.to_string()))?;
            return Ok(());
        }
        let output = match output {
            Some(text) if output_read => Output::Read(text),
            other => Output::Checked(raw(other)?),
        };
        let line = ResultLine {
            custom_id: &row.custom_id,
            key,
            status: status_name(row.state),
            output,
            error: raw(row.error)?,
            answer,
            usage,
            stage,
            raw: raw(raw_line)?,
        };
        line.write(out).map_err(|e| AppError::Corrupt(e.to_string()))?;
        out.push(b'\n');
        Ok(())
    }

    /// The answer in a response body: under a schema, the JSON it holds; otherwise the text,
    /// the tool calls' arguments, the vector or the moderation results.
    fn answer(&self, extracted: tranche_core::extract::Extracted) -> Option<Value> {
        if let Some((schema, lenient)) = &self.schema
            && let Ok(value) = schema.check(&extracted, *lenient)
        {
            return Some(value);
        }
        match extracted.answer {
            Answer::Text(text) => Some(Value::String(text)),
            Answer::ToolCalls(calls) => {
                let calls = calls
                    .into_iter()
                    .map(|c| serde_json::json!({"name": c.name, "arguments": c.arguments}));
                Some(Value::Array(calls.collect()))
            }
            Answer::Embedding(value) | Answer::Moderation(value) => Some(value),
            Answer::Refusal(_) | Answer::Empty => None,
        }
    }
}

/// The whole result line holding the answer at `offset..offset + len` of `object`: the answer
/// is the `body` inside it, so the line is found from there, outwards to its line ends.
async fn result_line(
    blobs: &BlobStore,
    object: &str,
    offset: u64,
    len: u64,
) -> Result<String, AppError> {
    let key = BlobKey::new(object)?;
    let missing = || AppError::Corrupt(format!("no result line around {offset} in `{object}`"));
    let size = blobs.size(&key).await?.ok_or_else(missing)?;
    let mut reach = 4096u64;
    loop {
        let (start, end) = (offset.saturating_sub(reach), (offset + len + reach).min(size));
        let bytes = blobs.get_range(&key, start..end).await?;
        let at = usize::try_from(offset - start).map_err(|_| missing())?;
        let body_end = at + usize::try_from(len).map_err(|_| missing())?;
        let head = bytes.get(..at).ok_or_else(missing)?;
        let tail = bytes.get(body_end..).ok_or_else(missing)?;
        let begin = head.iter().rposition(|b| *b == b'\n').map(|i| i + 1);
        let finish = tail.iter().position(|b| *b == b'\n').map(|i| body_end + i);
        let begin = begin.or((start == 0).then_some(0));
        let finish = finish.or((end == size).then_some(bytes.len()));
        if let (Some(begin), Some(finish)) = (begin, finish) {
            let line = bytes.get(begin..finish).ok_or_else(missing)?;
            return String::from_utf8(line.to_vec()).map_err(|e| AppError::Corrupt(e.to_string()));
        }
        if start == 0 && end == size {
            return Err(missing());
        }
        reach *= 4;
    }
}

/// The key a custom id carries (`key:task:version`), or the whole id when it is not one of
/// tranche's.
pub(crate) fn key_of(custom_id: &str) -> &str {
    CustomId::key_in(custom_id).unwrap_or(custom_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The line as serde writes it from a struct with `ResultLine`'s fields (how lines were
    /// written before [`ResultLine::write`]).
    #[derive(Serialize)]
    struct Derived<'a> {
        custom_id: &'a str,
        key: &'a str,
        status: &'a str,
        output: Option<Box<RawValue>>,
        error: Option<Box<RawValue>>,
        answer: Option<Value>,
        usage: Option<Usage>,
        #[serde(skip_serializing_if = "Option::is_none")]
        stage: Option<&'static str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        raw: Option<Box<RawValue>>,
    }

    fn raw_value(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_owned()).unwrap()
    }

    #[test]
    fn lines_are_written_as_serde_writes_their_fields() {
        let output =
            r#"{"choices":[{"message":{"content":"Hi \"there\"\n"}}],"usage":{"prompt_tokens":3}}"#;
        let error = r#"{"code":"rate_limited","message":"slow \u00e9"}"#;
        for (output, read, error, answer, usage, stage, raw) in [
            (
                Some(output),
                true,
                None,
                Some(Value::String("Hi \"there\"\n".into())),
                true,
                None,
                None,
            ),
            (Some(output), false, None, None, true, Some("staged"), Some(output)),
            (None, false, Some(error), None, false, None, None),
            (None, false, None, None, false, Some("staged"), None),
            (
                Some("[1, 2]"),
                true,
                Some(error),
                Some(serde_json::json!([1, 2])),
                true,
                None,
                Some("{}"),
            ),
        ] {
            let usage = || usage.then_some(Usage { input_tokens: Some(3), output_tokens: None });
            let (custom_id, key, status) = ("k\u{e9}y:\"q\":t:v1", "k\u{e9}y:\"q\"", "succeeded");
            let line = ResultLine {
                custom_id,
                key,
                status,
                output: match output {
                    Some(text) if read => Output::Read(text.to_owned()),
                    other => Output::Checked(other.map(raw_value)),
                },
                error: error.map(raw_value),
                answer: answer.clone(),
                usage: usage(),
                stage,
                raw: raw.map(raw_value),
            };
            let derived = Derived {
                custom_id,
                key,
                status,
                output: output.map(raw_value),
                error: error.map(raw_value),
                answer,
                usage: usage(),
                stage,
                raw: raw.map(raw_value),
            };
            let mut written = Vec::new();
            line.write(&mut written).unwrap();
            assert_eq!(
                String::from_utf8(written).unwrap(),
                serde_json::to_string(&derived).unwrap()
            );
        }
    }
}
