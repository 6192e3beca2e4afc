//! Validation of a JSONL batch input file (the OpenAI / Azure OpenAI line shape), producing either
//! the runnable lines or the batch-level errors a `failed` batch reports in `errors.data[]`.
//!
//! Codes follow the documented set: `empty_file`, `too_many_tasks`, `invalid_json_line`,
//! `invalid_request`, `duplicate_custom_id`, `url_mismatch`, `model_mismatch`, `model_not_found`
//! (Azure deployments). Line numbers are the 1-based physical lines of the file; blank lines are
//! skipped but still counted.

use std::collections::HashMap;

use bytes::Bytes;
use serde_json::Value;

use crate::model;

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

/// One runnable line: its custom_id and the raw line (a zero-copy slice of the input file).
#[derive(Debug, Clone)]
pub(crate) struct PlannedLine {
    pub custom_id: String,
    pub raw: Bytes,
}

/// A valid input file.
#[derive(Debug, Clone, Default)]
pub(crate) struct ValidInput {
    pub lines: Vec<PlannedLine>,
    /// The single `body.model` of the file, if lines name one.
    pub model: Option<String>,
    /// Estimated prompt tokens of all lines (0 unless [`Rules::count_tokens`]).
    pub estimated_tokens: u64,
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

/// Checks a whole input file against `endpoint` and `limits`.
pub(crate) fn validate(
    content: &Bytes,
    endpoint: &str,
    limits: &Rules,
) -> Result<ValidInput, Vec<BatchError>> {
    if limits.azure && content.starts_with(b"\xEF\xBB\xBF") {
        // Azure's documented answer to a file with a UTF-8 byte-order mark.
        return Err(vec![BatchError {
            code: "invalid_request",
            message: "Validation failed: A valid model deployment name couldn't be extracted from the input file. Please ensure that each row in the input file has a valid deployment name specified in the 'model' field, and that the deployment name is consistent across all rows.".to_owned(),
            param: None,
            line: None,
        }]);
    }
    if content.len() > limits.max_input_bytes {
        // The message is the one observed from OpenAI; its code is not documented.
        return Err(vec![BatchError {
            code: "invalid_request",
            message: format!(
                "The batch input file is larger than the {} maximum.",
                limits.max_input_bytes
            ),
            param: None,
            line: None,
        }]);
    }
    let mut errors = Errors(Vec::new());
    let mut lines = Vec::new();
    let mut seen: HashMap<String, u64> = HashMap::new();
    let mut model: Option<(String, u64)> = None;
    let mut model_mismatch_reported = false;
    let mut embedding_inputs = 0usize;
    let mut task_count = 0usize;
    let mut estimated_tokens = 0u64;
    let wanted_url = if limits.azure { strip_v1(endpoint) } else { endpoint };

    let mut start = 0usize;
    let mut line_no = 0u64;
    while start < content.len() {
        let end =
            content[start..].iter().position(|b| *b == b'\n').map_or(content.len(), |p| start + p);
        line_no += 1;
        let raw = content.slice(start..end);
        start = end + 1;
        let text = raw.strip_suffix(b"\r").unwrap_or(&raw);
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
                model::request_tokens(endpoint, obj.get("body").unwrap_or(&Value::Null));
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
        if let Some(first) = seen.get(&custom_id) {
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
        seen.insert(custom_id.clone(), line_no);
        lines.push(PlannedLine { custom_id, raw });
    }

    if task_count == 0 {
        return Err(vec![BatchError {
            code: "empty_file",
            message: "The input file is empty. Please ensure that the batch contains at least one request."
                .to_owned(),
            param: None,
            line: None,
        }]);
    }
    if task_count > limits.max_tasks {
        return Err(vec![BatchError {
            code: "too_many_tasks",
            message: format!(
                "The input file contains {task_count} requests; a batch can contain at most {}.",
                limits.max_tasks
            ),
            param: None,
            line: None,
        }]);
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
        Ok(ValidInput { lines, model: model.map(|(m, _)| m), estimated_tokens })
    } else {
        Err(errors.0)
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

    fn check(text: &str) -> Result<ValidInput, Vec<BatchError>> {
        validate(&Bytes::from(text.to_owned()), "/v1/chat/completions", &limits())
    }

    #[test]
    fn valid_file_with_crlf_and_trailing_newline() {
        let text = format!("{}\r\n\n{}\n", line("a", "m"), line("b", "m"));
        let ok = check(&text).unwrap();
        assert_eq!(ok.lines.len(), 2);
        assert_eq!(ok.lines[1].custom_id, "b");
        assert_eq!(ok.model.as_deref(), Some("m"));
        let parsed: Value = serde_json::from_slice(&ok.lines[1].raw).unwrap();
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
        let valid = validate(&Bytes::from(ok.clone()), "/chat/completions", &rules).unwrap();
        assert_eq!(valid.lines.len(), 2);
        assert!(valid.estimated_tokens >= 2);
        let errs = validate(&Bytes::from(ok.clone()), "/responses", &rules).unwrap_err();
        assert_eq!(errs[0].code, "url_mismatch");
        let errs =
            validate(&Bytes::from(line("a", "gpt-4o")), "/chat/completions", &rules).unwrap_err();
        assert_eq!(errs[0].code, "model_not_found");
        let bom = format!("\u{feff}{ok}");
        let errs = validate(&Bytes::from(bom), "/chat/completions", &rules).unwrap_err();
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
        let errs = validate(&Bytes::from(text), "/v1/embeddings", &limits()).unwrap_err();
        assert_eq!(errs[0].code, "too_many_tasks");
    }
}
