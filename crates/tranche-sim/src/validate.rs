//! Validation of a JSONL batch input file (the OpenAI / Azure OpenAI line shape), producing either
//! the runnable lines or the batch-level errors a `failed` batch reports in `errors.data[]`.
//!
//! Codes follow the documented set: `empty_file`, `too_many_tasks`, `invalid_json_line`,
//! `invalid_request`, `duplicate_custom_id`, `url_mismatch`, `model_mismatch`, `model_not_found`
//! (Azure deployments). Line numbers are the 1-based physical lines of the file; blank lines are
//! skipped but still counted.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hasher};
use std::io::{self, BufRead, BufReader, Read};

use serde::Deserialize;
use serde_json::Value;

use crate::spool::SpooledLines;
use crate::tokens;

/// Provider rules that validation enforces.
#[derive(Debug, Clone)]
pub(crate) struct Rules {
    /// Most lines per batch (OpenAI 50,000; Azure 100,000).
    pub max_tasks: usize,
    /// Most embedding inputs across all lines of an embeddings batch (OpenAI 50,000).
    pub max_embedding_inputs: usize,
    /// Largest input file in bytes (OpenAI 200 MiB: "larger than the 209715200 maximum").
    pub max_input_bytes: usize,
    /// Azure: a line's `url` matches the endpoint with or without a leading `/v1`; every line
    /// names a deployment (`body.model`); a UTF-8 byte-order mark is refused.
    pub azure: bool,
    /// Azure: the deployments that exist (`model_not_found` for others); empty accepts all.
    pub deployments: Vec<String>,
    /// Sum estimated prompt tokens (needed only when an enqueued-token limit applies).
    pub count_tokens: bool,
}

impl Rules {
    /// OpenAI-style rules with the given limits.
    pub(crate) fn new(
        max_tasks: usize,
        max_embedding_inputs: usize,
        max_input_bytes: usize,
    ) -> Self {
        Self {
            max_tasks,
            max_embedding_inputs,
            max_input_bytes,
            azure: false,
            deployments: Vec::new(),
            count_tokens: false,
        }
    }
}

/// An endpoint path without a leading `/v1` (Azure accepts both spellings).
pub(crate) fn strip_v1(endpoint: &str) -> &str {
    endpoint.strip_prefix("/v1").filter(|rest| rest.starts_with('/')).unwrap_or(endpoint)
}

/// What validation learns about a valid input file besides its lines.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Checked {
    /// The single `body.model` of the file, if lines name one.
    pub model: Option<String>,
    /// Estimated prompt tokens of all lines (0 unless [`Rules::count_tokens`]).
    pub estimated_tokens: u64,
}

/// A valid batch input: its runnable lines (on disk) and what validation learned.
#[derive(Debug)]
pub(crate) struct ValidInput {
    pub lines: SpooledLines,
    /// The single `body.model` of the file, if lines name one.
    pub model: Option<String>,
    /// Estimated prompt tokens of all lines (0 unless [`Rules::count_tokens`]).
    pub estimated_tokens: u64,
}

/// Size of the buffer an input file is read through.
const READ_BUFFER: usize = 64 * 1024;

/// Where a custom_id was first seen: the line number, and the line's bytes in the content.
#[derive(Debug, Clone, Copy)]
struct FirstSeen {
    line_no: u64,
    start: u64,
    len: u64,
}

/// Just the custom_id of a line (the rest is skipped, not built).
#[derive(Deserialize)]
pub(crate) struct CustomIdOnly {
    pub custom_id: String,
}

/// The custom_ids of one file, for the duplicate check, without keeping the ids: a 64-bit hash of
/// each id maps to where the id was first seen. A matching hash is confirmed by reading that line
/// back and comparing the ids, so the check is exact; the rare distinct ids that share a hash go
/// to a small overflow map. A B-tree rather than a hash table: its small nodes, unlike one large
/// table, leave no multi-megabyte hole in the allocator once validation is over.
#[derive(Debug, Default)]
struct SeenIds {
    by_hash: BTreeMap<u64, FirstSeen>,
    overflow: HashMap<String, u64>,
}

/// A 64-bit hash of a custom_id (SipHash with fixed keys).
fn id_hash(id: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    hasher.write(id.as_bytes());
    hasher.finish()
}

impl SeenIds {
    /// The line `id` was first seen on, if any; if none, remembers it as seen `here`.
    /// `read_back(start, len)` returns the bytes of an earlier line.
    fn first_or_insert(
        &mut self,
        id: &str,
        here: FirstSeen,
        read_back: &mut impl FnMut(u64, u64) -> io::Result<Vec<u8>>,
    ) -> io::Result<Option<u64>> {
        let hash = id_hash(id);
        let Some(first) = self.by_hash.get(&hash).copied() else {
            self.by_hash.insert(hash, here);
            return Ok(None);
        };
        let earlier = read_back(first.start, first.len)?;
        let earlier = serde_json::from_slice::<CustomIdOnly>(&earlier).map_err(io::Error::other)?;
        if earlier.custom_id == id {
            return Ok(Some(first.line_no));
        }
        if let Some(line_no) = self.overflow.get(id) {
            return Ok(Some(*line_no));
        }
        self.overflow.insert(id.to_owned(), here.line_no);
        Ok(None)
    }
}

/// One entry of a failed batch's `errors.data`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BatchError {
    pub code: &'static str,
    pub message: String,
    pub param: Option<String>,
    pub line: Option<u64>,
}

/// At most this many errors are reported for one file.
const MAX_ERRORS: usize = 100;

struct Errors(Vec<BatchError>);

impl Errors {
    fn push(
        &mut self,
        code: &'static str,
        message: String,
        param: Option<&str>,
        line: Option<u64>,
    ) {
        if self.0.len() < MAX_ERRORS {
            self.0.push(BatchError { code, message, param: param.map(str::to_owned), line });
        }
    }
}

/// Parses one line as JSON. `str::parse` uses serde_json's own (optimized) code path.
pub(crate) fn parse_line(text: &[u8]) -> Option<Value> {
    std::str::from_utf8(text).ok()?.parse().ok()
}

/// Reads into `buf` until it is full or the input ends; returns how many bytes were read.
fn read_up_to(input: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match input.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Checks a whole input file of `size` bytes, read once from `content`, against `endpoint` and
/// `limits`. Each runnable line is handed to `on_line` as `(start, len, custom_id)`: its bytes
/// (without the line break) at `start` of the content. `read_back(start, len)` returns such bytes
/// again (the duplicate check rereads a line when a custom_id's hash was seen before). Memory:
/// one line, plus about 32 bytes per runnable line (at most [`Rules::max_tasks`] of them) for the
/// duplicate check.
pub(crate) fn validate(
    mut content: impl Read,
    size: u64,
    endpoint: &str,
    limits: &Rules,
    mut read_back: impl FnMut(u64, u64) -> io::Result<Vec<u8>>,
    mut on_line: impl FnMut(u64, u64, &str) -> io::Result<()>,
) -> io::Result<Result<Checked, Vec<BatchError>>> {
    let mut head = [0u8; 3];
    let head_len = read_up_to(&mut content, &mut head)?;
    let head = &head[..head_len];
    if limits.azure && head == b"\xEF\xBB\xBF" {
        // Azure's documented answer to a file with a UTF-8 byte-order mark.
        return Ok(Err(vec![BatchError {
            code: "invalid_request",
            message: "Validation failed: A valid model deployment name couldn't be extracted from the input file. Please ensure that each row in the input file has a valid deployment name specified in the 'model' field, and that the deployment name is consistent across all rows.".to_owned(),
            param: None,
            line: None,
        }]));
    }
    if size > u64::try_from(limits.max_input_bytes).unwrap_or(u64::MAX) {
        // The message is the one observed from OpenAI; its code is not documented.
        return Ok(Err(vec![BatchError {
            code: "invalid_request",
            message: format!(
                "The batch input file is larger than the {} maximum.",
                limits.max_input_bytes
            ),
            param: None,
            line: None,
        }]));
    }
    let mut errors = Errors(Vec::new());
    let mut seen = SeenIds::default();
    let mut model: Option<(String, u64)> = None;
    let mut model_mismatch_reported = false;
    let mut embedding_inputs = 0usize;
    let mut task_count = 0usize;
    let mut estimated_tokens = 0u64;
    let wanted_url = if limits.azure { strip_v1(endpoint) } else { endpoint };

    let mut reader = BufReader::with_capacity(READ_BUFFER, head.chain(content));
    let mut buf = Vec::new();
    let mut pos = 0u64;
    let mut line_no = 0u64;
    loop {
        buf.clear();
        let n = reader.read_until(b'\n', &mut buf)?;
        if n == 0 {
            break;
        }
        let start = pos;
        pos += u64::try_from(n).unwrap_or(u64::MAX);
        line_no += 1;
        let raw = buf.strip_suffix(b"\n").unwrap_or(&buf);
        let text = raw.strip_suffix(b"\r").unwrap_or(raw);
        if text.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        task_count += 1;
        if task_count > limits.max_tasks {
            // Keep counting for the message, but stop checking lines.
            continue;
        }
        let Some(value) = parse_line(text) else {
            errors.push(
                "invalid_json_line",
                "This line is not parseable as valid JSON.".to_owned(),
                None,
                Some(line_no),
            );
            continue;
        };
        let Some(obj) = value.as_object() else {
            errors.push(
                "invalid_json_line",
                "This line is not a JSON object.".to_owned(),
                None,
                Some(line_no),
            );
            continue;
        };
        let custom_id = match obj.get("custom_id") {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            Some(_) => {
                errors.push(
                    "invalid_request",
                    "'custom_id' must be a non-empty string.".to_owned(),
                    Some("custom_id"),
                    Some(line_no),
                );
                continue;
            }
            None => {
                errors.push(
                    "invalid_request",
                    "Missing required field 'custom_id'.".to_owned(),
                    Some("custom_id"),
                    Some(line_no),
                );
                continue;
            }
        };
        match obj.get("method").and_then(Value::as_str) {
            Some("POST") => {}
            Some(other) => errors.push(
                "invalid_request",
                format!("Invalid 'method': '{other}'. Only 'POST' is supported."),
                Some("method"),
                Some(line_no),
            ),
            None => errors.push(
                "invalid_request",
                "Missing required field 'method'.".to_owned(),
                Some("method"),
                Some(line_no),
            ),
        }
        match obj.get("url").and_then(Value::as_str) {
            Some(url) if url == endpoint || (limits.azure && strip_v1(url) == wanted_url) => {}
            Some(url) => errors.push(
                "url_mismatch",
                format!(
                    "The url '{url}' of this request does not match the batch endpoint '{endpoint}'."
                ),
                Some("url"),
                Some(line_no),
            ),
            None => errors.push(
                "invalid_request",
                "Missing required field 'url'.".to_owned(),
                Some("url"),
                Some(line_no),
            ),
        }
        let Some(body) = obj.get("body").and_then(Value::as_object) else {
            errors.push(
                "invalid_request",
                "Missing required field 'body' (a JSON object).".to_owned(),
                Some("body"),
                Some(line_no),
            );
            continue;
        };
        let line_model = body.get("model").and_then(Value::as_str);
        if limits.azure && line_model.is_none_or(str::is_empty) {
            errors.push(
                "invalid_request",
                "Missing required field 'body.model': each line must name the Global Batch deployment.".to_owned(),
                Some("body.model"),
                Some(line_no),
            );
        }
        if let Some(m) = line_model.filter(|_| limits.azure)
            && !limits.deployments.is_empty()
            && !limits.deployments.iter().any(|d| d == m)
        {
            errors.push(
                "model_not_found",
                format!("The provided model deployment '{m}' does not exist or is not a Global Batch deployment."),
                Some("body.model"),
                Some(line_no),
            );
        }
        if limits.count_tokens {
            estimated_tokens +=
                tokens::request_tokens(endpoint, obj.get("body").unwrap_or(&Value::Null));
        }
        if let Some(m) = line_model {
            match &model {
                None => model = Some((m.to_owned(), line_no)),
                Some((first, first_line)) if first != m && !model_mismatch_reported => {
                    model_mismatch_reported = true;
                    errors.push(
                        "model_mismatch",
                        format!(
                            "The model '{m}' of this request differs from '{first}' on line {first_line}. Each input file can only include requests to a single model."
                        ),
                        Some("body.model"),
                        Some(line_no),
                    );
                }
                Some(_) => {}
            }
        }
        if endpoint.ends_with("/embeddings") {
            embedding_inputs += body.get("input").and_then(Value::as_array).map_or(1, Vec::len);
        }
        let len = u64::try_from(text.len()).unwrap_or(u64::MAX);
        let here = FirstSeen { line_no, start, len };
        if let Some(first) = seen.first_or_insert(&custom_id, here, &mut read_back)? {
            errors.push(
                "duplicate_custom_id",
                format!(
                    "The custom_id '{custom_id}' is already used on line {first}. custom_id must be unique within a batch."
                ),
                Some("custom_id"),
                Some(line_no),
            );
            continue;
        }
        on_line(start, len, &custom_id)?;
    }

    if task_count == 0 {
        return Ok(Err(vec![BatchError {
            code: "empty_file",
            message: "The input file is empty. Please ensure that the batch contains at least one request."
                .to_owned(),
            param: None,
            line: None,
        }]));
    }
    if task_count > limits.max_tasks {
        return Ok(Err(vec![BatchError {
            code: "too_many_tasks",
            message: format!(
                "The input file contains {task_count} requests; a batch can contain at most {}.",
                limits.max_tasks
            ),
            param: None,
            line: None,
        }]));
    }
    if embedding_inputs > limits.max_embedding_inputs {
        errors.push(
            "too_many_tasks",
            format!(
                "The batch contains {embedding_inputs} embedding inputs; an embeddings batch can contain at most {}.",
                limits.max_embedding_inputs
            ),
            None,
            None,
        );
    }
    if errors.0.is_empty() {
        Ok(Ok(Checked { model: model.map(|(m, _)| m), estimated_tokens }))
    } else {
        Ok(Err(errors.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Rules {
        Rules::new(3, 4, 2000)
    }

    fn line(id: &str, model: &str) -> String {
        format!(
            r#"{{"custom_id":"{id}","method":"POST","url":"/v1/chat/completions","body":{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}}}"#
        )
    }

    /// A valid file's runnable lines: custom_id and the line's text.
    #[derive(Debug)]
    struct Valid {
        checked: Checked,
        lines: Vec<(String, String)>,
    }

    fn run(text: &str, endpoint: &str, rules: &Rules) -> Result<Valid, Vec<BatchError>> {
        let mut spans = Vec::new();
        let read_back = |s: u64, l: u64| Ok(text.as_bytes()[s as usize..(s + l) as usize].to_vec());
        let verdict =
            validate(text.as_bytes(), text.len() as u64, endpoint, rules, read_back, |s, l, id| {
                spans.push((s as usize, l as usize, id.to_owned()));
                Ok(())
            })
            .unwrap();
        verdict.map(|checked| Valid {
            checked,
            lines: spans.into_iter().map(|(s, l, id)| (id, text[s..s + l].to_owned())).collect(),
        })
    }

    fn check(text: &str) -> Result<Valid, Vec<BatchError>> {
        run(text, "/v1/chat/completions", &limits())
    }

    #[test]
    fn valid_file_with_crlf_and_trailing_newline() {
        let text = format!("{}\r\n\n{}\n", line("a", "m"), line("b", "m"));
        let ok = check(&text).unwrap();
        assert_eq!(ok.lines.len(), 2);
        assert_eq!(ok.lines[1].0, "b");
        assert_eq!(ok.checked.model.as_deref(), Some("m"));
        assert_eq!(ok.lines[0].1, line("a", "m"), "no line break in a line's span");
        let parsed: Value = serde_json::from_str(&ok.lines[1].1).unwrap();
        assert_eq!(parsed["custom_id"], "b");
    }

    #[test]
    fn error_codes_and_line_numbers() {
        let text = format!("{}\nnot json\n{}\n", line("a", "m"), line("a", "m"));
        let errs = check(&text).unwrap_err();
        assert_eq!(errs[0].code, "invalid_json_line");
        assert_eq!(errs[0].line, Some(2));
        assert_eq!(errs[1].code, "duplicate_custom_id");
        assert_eq!(errs[1].line, Some(3));

        let errs = check(&format!("{}\n{}", line("a", "m"), line("b", "other"))).unwrap_err();
        assert_eq!(errs[0].code, "model_mismatch");
        assert_eq!(errs[0].line, Some(2));

        let errs =
            check(&line("a", "m").replace("/v1/chat/completions", "/v1/embeddings")).unwrap_err();
        assert_eq!(errs[0].code, "url_mismatch");

        let errs =
            check(r#"{"method":"POST","url":"/v1/chat/completions","body":{}}"#).unwrap_err();
        assert_eq!(errs[0].code, "invalid_request");
        assert_eq!(errs[0].param.as_deref(), Some("custom_id"));
    }

    #[test]
    fn ids_sharing_a_hash_are_told_apart() {
        let text = format!("{}\n{}\n", line("a", "m"), line("b", "m"));
        let mut read_back =
            |s: u64, l: u64| Ok(text.as_bytes()[s as usize..(s + l) as usize].to_vec());
        let a = FirstSeen { line_no: 1, start: 0, len: line("a", "m").len() as u64 };
        let mut seen = SeenIds::default();
        assert_eq!(seen.first_or_insert("a", a, &mut read_back).unwrap(), None);
        // Pretend "b" hashes like "a": the reread line tells them apart.
        seen.by_hash.insert(id_hash("b"), a);
        let b = FirstSeen { line_no: 2, start: a.len + 1, len: a.len };
        assert_eq!(seen.first_or_insert("b", b, &mut read_back).unwrap(), None);
        assert_eq!(seen.first_or_insert("b", b, &mut read_back).unwrap(), Some(2));
        assert_eq!(seen.first_or_insert("a", b, &mut read_back).unwrap(), Some(1));
    }

    #[test]
    fn empty_and_too_many() {
        assert_eq!(check("").unwrap_err()[0].code, "empty_file");
        assert_eq!(check("\n \n").unwrap_err()[0].code, "empty_file");
        let text: Vec<String> = (0..4).map(|i| line(&format!("c{i}"), "m")).collect();
        let errs = check(&text.join("\n")).unwrap_err();
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].code, "too_many_tasks");
    }

    #[test]
    fn oversized_input_fails_whole() {
        let errs = check(&" ".repeat(2001)).unwrap_err();
        assert_eq!(errs.len(), 1);
        assert!(errs[0].message.contains("larger than the 2000 maximum"));
    }

    #[test]
    fn azure_rules() {
        let rules = Rules {
            azure: true,
            deployments: vec!["gpt-4o-batch".into()],
            count_tokens: true,
            ..limits()
        };
        let ok = format!("{}\n{}", line("a", "gpt-4o-batch"), line("b", "gpt-4o-batch"));
        let valid = run(&ok, "/chat/completions", &rules).unwrap();
        assert_eq!(valid.lines.len(), 2);
        assert!(valid.checked.estimated_tokens >= 2);
        let errs = run(&ok, "/responses", &rules).unwrap_err();
        assert_eq!(errs[0].code, "url_mismatch");
        let errs = run(&line("a", "gpt-4o"), "/chat/completions", &rules).unwrap_err();
        assert_eq!(errs[0].code, "model_not_found");
        let bom = format!("\u{feff}{ok}");
        let errs = run(&bom, "/chat/completions", &rules).unwrap_err();
        assert!(errs[0].message.starts_with("Validation failed: A valid model deployment name"));
        assert_eq!(strip_v1("/v1/chat/completions"), "/chat/completions");
        assert_eq!(strip_v1("/v1x"), "/v1x");
    }

    #[test]
    fn embedding_inputs_are_counted() {
        let l = |id: &str| {
            format!(
                r#"{{"custom_id":"{id}","method":"POST","url":"/v1/embeddings","body":{{"model":"e","input":["a","b","c"]}}}}"#
            )
        };
        let text = format!("{}\n{}", l("x"), l("y"));
        let errs = run(&text, "/v1/embeddings", &limits()).unwrap_err();
        assert_eq!(errs[0].code, "too_many_tasks");
    }
}
