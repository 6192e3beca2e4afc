//! Input parsing: tranche lines and OpenAI batch lines into fingerprinted requests, with
//! line-numbered errors.
//!
//! Two line shapes are accepted, and may be mixed in one file:
//! - tranche lines `{"key": "ticket:84291", "body": {...}}`, whose task, version and
//!   endpoint come from [`InputOptions`];
//! - OpenAI batch lines `{"custom_id", "method", "url", "body"}`, taken as they are.
//!
//! The parser works line by line so that callers can stream a file through it; it does no
//! IO itself. A file is good only if no line has an error: callers reject it whole otherwise.

use std::collections::HashMap;
use std::fmt;

use crate::canon::{Members, Node};
use crate::{CustomId, Endpoint, InputHash, ProviderKind};

/// How to read tranche lines, and which provider the requests are for.
#[derive(Debug, Clone)]
pub struct InputOptions {
    pub provider: ProviderKind,
    /// The task for tranche lines (`--task`).
    pub task: Option<String>,
    /// The version for tranche lines (`--version`).
    pub version: Option<String>,
    /// The endpoint for tranche lines (`--endpoint`).
    pub endpoint: Endpoint,
    /// Fills `body.model` when a line has none (`--model`).
    pub model: Option<String>,
    /// Prefixes tranche-line custom ids with `tenant::`.
    pub tenant: Option<String>,
}

impl InputOptions {
    pub fn new(provider: ProviderKind) -> Self {
        Self {
            provider,
            task: None,
            version: None,
            endpoint: Endpoint::ChatCompletions,
            model: None,
            tenant: None,
        }
    }
}

/// One valid input line.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedRequest {
    /// 1-based line number in the input.
    pub line: u64,
    pub custom_id: CustomId,
    pub endpoint: Endpoint,
    pub model: String,
    /// The request body as canonical compact JSON (with `model` filled in).
    pub body: String,
    pub input_hash: InputHash,
    /// Estimated tokens it puts in a provider's queue (see [`crate::tokens::estimate`]).
    pub est_tokens: u64,
}

/// What is wrong with one input line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputError {
    /// 1-based line number.
    pub line: u64,
    /// The offending field (`body.model`, `custom_id`, ...), when one is to blame.
    pub field: Option<String>,
    pub reason: String,
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.field {
            Some(field) => write!(f, "line {}: `{}`: {}", self.line, field, self.reason),
            None => write!(f, "line {}: {}", self.line, self.reason),
        }
    }
}

impl std::error::Error for InputError {}

fn error(line: u64, field: Option<&str>, reason: impl Into<String>) -> InputError {
    InputError { line, field: field.map(str::to_owned), reason: reason.into() }
}

/// A line-at-a-time parser that remembers every custom id it has seen (unless the caller
/// checks for repeats itself).
#[derive(Debug)]
pub struct InputParser {
    options: InputOptions,
    seen: Option<HashMap<CustomId, u64>>,
    line: u64,
}

impl InputParser {
    pub fn new(options: InputOptions) -> Self {
        Self { options, seen: Some(HashMap::new()), line: 0 }
    }

    /// A parser that leaves repeated custom ids to its caller (a store with a unique key
    /// finds them without this parser's memory growing with every line).
    pub fn without_duplicate_check(options: InputOptions) -> Self {
        Self { options, seen: None, line: 0 }
    }

    /// The number of lines consumed so far.
    pub fn lines_read(&self) -> u64 {
        self.line
    }

    /// Parses the next line. Blank lines yield `Ok(None)` but still count.
    pub fn next_line(&mut self, text: &str) -> Result<Option<ParsedRequest>, InputError> {
        self.line += 1;
        let line = self.line;
        let text = text.strip_suffix('\r').unwrap_or(text);
        let text = if line == 1 { text.strip_prefix('\u{feff}').unwrap_or(text) } else { text };
        if text.trim().is_empty() {
            return Ok(None);
        }
        // Read borrowing from the line: the body is rewritten canonical from it directly.
        let value =
            Node::parse(text).map_err(|e| error(line, None, format!("invalid JSON: {e}")))?;
        let Node::Object(mut object) = value else {
            return Err(error(line, None, "expected a JSON object"));
        };
        let (custom_id, endpoint) = if object.contains_key("custom_id") {
            self.openai_line(line, &object)?
        } else if object.contains_key("key") {
            self.tranche_line(line, &object)?
        } else {
            return Err(error(
                line,
                Some("key"),
                "missing field (tranche lines need `key` and `body`; OpenAI batch lines need `custom_id`, `method`, `url` and `body`)",
            ));
        };
        let mut body = match object.remove("body") {
            Some(Node::Object(body)) => body,
            Some(other) => {
                return Err(error(
                    line,
                    Some("body"),
                    format!("expected an object, found {}", other.type_name()),
                ));
            }
            None => return Err(error(line, Some("body"), "missing field")),
        };
        let model = self.model(line, &mut body)?;
        if self.options.provider == ProviderKind::Anthropic {
            anthropic_params(line, &body)?;
        }
        if let Some(seen) = &mut self.seen {
            if let Some(&first) = seen.get(&custom_id) {
                return Err(duplicate(line, custom_id.as_str(), first));
            }
            seen.insert(custom_id.clone(), line);
        }
        let output_limit = crate::tokens::OUTPUT_LIMIT_KEYS
            .iter()
            .find_map(|key| body.get(key).and_then(Node::as_u64));
        let body = body.to_canonical(text.len());
        let input_hash = InputHash::of_canonical(self.options.provider, endpoint, &body);
        Ok(Some(ParsedRequest {
            line,
            custom_id,
            endpoint,
            model,
            est_tokens: crate::tokens::estimate_from(body.len(), output_limit),
            body,
            input_hash,
        }))
    }

    fn openai_line(
        &self,
        line: u64,
        object: &Members<'_>,
    ) -> Result<(CustomId, Endpoint), InputError> {
        let custom_id = required_str(line, object, "custom_id")?;
        let custom_id = CustomId::parse(custom_id)
            .map_err(|e| error(line, Some("custom_id"), e.to_string()))?;
        let method = required_str(line, object, "method")?;
        if method != "POST" {
            return Err(error(
                line,
                Some("method"),
                format!("`{method}` is not supported: batch requests must use POST"),
            ));
        }
        let url = required_str(line, object, "url")?;
        let endpoint = self.endpoint(line, "url", url)?;
        Ok((custom_id, endpoint))
    }

    fn tranche_line(
        &self,
        line: u64,
        object: &Members<'_>,
    ) -> Result<(CustomId, Endpoint), InputError> {
        let key = required_str(line, object, "key")?;
        let task = self.options.task.as_deref().ok_or_else(|| {
            error(line, Some("key"), "tranche lines need a task: pass --task (e.g. --task intent)")
        })?;
        let version = self.options.version.as_deref().unwrap_or("v1");
        let custom_id = CustomId::compose(self.options.tenant.as_deref(), key, task, version)
            .map_err(|e| error(line, Some("key"), e.to_string()))?;
        if let Some(url) = object.get("url") {
            let Node::String(url) = url else {
                return Err(error(line, Some("url"), "expected a string"));
            };
            return Ok((custom_id, self.endpoint(line, "url", url)?));
        }
        Ok((custom_id, self.options.endpoint))
    }

    fn endpoint(&self, line: u64, field: &str, url: &str) -> Result<Endpoint, InputError> {
        let provider = self.options.provider;
        let endpoint: Endpoint = url.parse().map_err(|_| {
            error(
                line,
                Some(field),
                format!("unknown endpoint `{url}` (expected one of {})", endpoint_list(provider)),
            )
        })?;
        if !provider.endpoints().contains(&endpoint) {
            return Err(error(
                line,
                Some(field),
                format!(
                    "endpoint `{url}` is not served by {provider} batches (expected one of {})",
                    endpoint_list(provider)
                ),
            ));
        }
        Ok(endpoint)
    }

    fn model(&self, line: u64, body: &mut Members<'_>) -> Result<String, InputError> {
        match body.get("model") {
            Some(Node::String(model)) if !model.is_empty() => Ok(model.clone().into_owned()),
            Some(Node::String(_)) => Err(error(line, Some("body.model"), "empty model name")),
            Some(other) => Err(error(
                line,
                Some("body.model"),
                format!("expected a string, found {}", other.type_name()),
            )),
            None => match &self.options.model {
                Some(model) => {
                    body.insert("model", Node::String(model.clone().into()));
                    Ok(model.clone())
                }
                None => Err(error(
                    line,
                    Some("body.model"),
                    "missing model: set `model` in the body or pass --model",
                )),
            },
        }
    }
}

/// Anthropic bodies are Messages API params. OpenAI-shaped chat bodies are refused rather
/// than translated, naming the shape Anthropic expects.
fn anthropic_params(line: u64, body: &Members<'_>) -> Result<(), InputError> {
    const SHAPE: &str = "Anthropic batch bodies are Messages API params: `model`, `max_tokens` (at least 1), `messages` with roles user/assistant, and an optional top-level `system`";
    for openai_only in ["response_format", "max_completion_tokens", "n", "logprobs", "functions"] {
        if body.contains_key(openai_only) {
            return Err(error(
                line,
                Some(&format!("body.{openai_only}")),
                format!(
                    "`{openai_only}` is an OpenAI chat parameter, not an Anthropic one. {SHAPE}"
                ),
            ));
        }
    }
    match body.get("max_tokens") {
        Some(Node::Number(n)) if n.as_u64().is_some_and(|n| n >= 1) => {}
        Some(_) => {
            return Err(error(
                line,
                Some("body.max_tokens"),
                format!("must be a whole number of at least 1. {SHAPE}"),
            ));
        }
        None => {
            return Err(error(line, Some("body.max_tokens"), format!("missing field. {SHAPE}")));
        }
    }
    let Some(Node::Array(messages)) = body.get("messages") else {
        return Err(error(
            line,
            Some("body.messages"),
            format!("missing or not an array. {SHAPE}"),
        ));
    };
    for (i, message) in messages.iter().enumerate() {
        if message.get("role").and_then(Node::as_str) == Some("system") {
            return Err(error(
                line,
                Some(&format!("body.messages[{i}].role")),
                format!(
                    "Anthropic has no `system` role in messages; put the system prompt in the top-level `system` param (this looks like an OpenAI chat body). {SHAPE}"
                ),
            ));
        }
    }
    if body.get("stream") == Some(&Node::Bool(true)) {
        return Err(error(line, Some("body.stream"), "batch requests cannot stream"));
    }
    Ok(())
}

fn endpoint_list(provider: ProviderKind) -> String {
    provider.endpoints().iter().map(|e| e.as_str()).collect::<Vec<_>>().join(", ")
}

fn required_str<'a>(
    line: u64,
    object: &'a Members<'_>,
    field: &str,
) -> Result<&'a str, InputError> {
    match object.get(field) {
        Some(Node::String(s)) => Ok(s),
        Some(other) => {
            Err(error(line, Some(field), format!("expected a string, found {}", other.type_name())))
        }
        None => Err(error(line, Some(field), "missing field")),
    }
}

/// The most line errors [`parse_str`] keeps; the rest are only counted.
pub const MAX_REPORTED_ERRORS: usize = 100;

/// Every error of a rejected input (the first [`MAX_REPORTED_ERRORS`]) and how many there were.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    pub errors: Vec<InputError>,
    pub total: u64,
}

impl fmt::Display for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "input rejected: {} bad line(s); nothing was stored", self.total)?;
        for e in &self.errors {
            writeln!(f, "  {e}")?;
        }
        if self.total > self.errors.len() as u64 {
            writeln!(f, "  … and {} more", self.total - self.errors.len() as u64)?;
        }
        Ok(())
    }
}

impl std::error::Error for Rejected {}

/// Collects line errors while a file streams through an [`InputParser`].
#[derive(Debug, Default)]
pub struct ErrorCollector {
    errors: Vec<InputError>,
    total: u64,
}

impl ErrorCollector {
    pub fn push(&mut self, e: InputError) {
        self.total += 1;
        if self.errors.len() < MAX_REPORTED_ERRORS {
            self.errors.push(e);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// `Ok(())` when no line was bad.
    pub fn finish(mut self) -> Result<(), Rejected> {
        if self.total == 0 {
            Ok(())
        } else {
            // Errors found after the fact (a repeat found when rows were stored) come later
            // than the lines after them; report in line order.
            self.errors.sort_by_key(|e| e.line);
            Err(Rejected { errors: self.errors, total: self.total })
        }
    }
}

/// The error for a custom id used on an earlier line of the same input.
pub fn duplicate(line: u64, custom_id: &str, first: u64) -> InputError {
    error(
        line,
        Some("custom_id"),
        format!("duplicate custom_id `{custom_id}`: already used on line {first}"),
    )
}

/// Parses a whole text, all or nothing.
pub fn parse_str(text: &str, options: InputOptions) -> Result<Vec<ParsedRequest>, Rejected> {
    let mut parser = InputParser::new(options);
    let mut errors = ErrorCollector::default();
    let mut requests = Vec::new();
    for line in text.split('\n') {
        match parser.next_line(line) {
            Ok(Some(request)) => requests.push(request),
            Ok(None) => {}
            Err(e) => errors.push(e),
        }
    }
    errors.finish()?;
    if requests.is_empty() {
        return Err(Rejected {
            errors: vec![error(1, None, "the input has no requests")],
            total: 1,
        });
    }
    Ok(requests)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> InputOptions {
        InputOptions {
            task: Some("intent".into()),
            version: Some("v3".into()),
            model: Some("gpt-4o-mini".into()),
            ..InputOptions::new(ProviderKind::Openai)
        }
    }

    fn only_error(text: &str, options: InputOptions) -> InputError {
        let rejected = parse_str(text, options).unwrap_err();
        assert_eq!(rejected.total, 1, "{rejected}");
        rejected.errors.into_iter().next().unwrap()
    }

    #[test]
    fn tranche_lines_get_ids_endpoint_and_model() {
        let reqs = parse_str(
            "{\"key\":\"ticket:84291\",\"body\":{\"messages\":[]}}\n\n{\"key\":\"t2\",\"body\":{\"model\":\"gpt-4o\"}}\n",
            options(),
        )
        .unwrap();
        assert_eq!(reqs.len(), 2);
        assert_eq!(reqs[0].custom_id.as_str(), "ticket:84291:intent:v3");
        assert_eq!(reqs[0].endpoint, Endpoint::ChatCompletions);
        assert_eq!(reqs[0].model, "gpt-4o-mini");
        assert_eq!(reqs[0].body, r#"{"messages":[],"model":"gpt-4o-mini"}"#);
        assert_eq!(reqs[1].line, 3);
        assert_eq!(reqs[1].model, "gpt-4o");
    }

    #[test]
    fn openai_lines_are_taken_as_they_are() {
        let reqs = parse_str(
            r#"{"custom_id":"request-1","method":"POST","url":"/v1/embeddings","body":{"model":"text-embedding-3-small","input":"x"}}"#,
            InputOptions::new(ProviderKind::Openai),
        )
        .unwrap();
        assert_eq!(reqs[0].custom_id.as_str(), "request-1");
        assert_eq!(reqs[0].endpoint, Endpoint::Embeddings);
        assert_eq!(reqs[0].model, "text-embedding-3-small");
    }

    #[test]
    fn hash_ignores_key_order_in_the_file() {
        let a = parse_str(r#"{"key":"k","body":{"model":"m","a":1,"b":2}}"#, options()).unwrap();
        let b = parse_str(r#"{"body":{"b":2,"a":1,"model":"m"},"key":"k"}"#, options()).unwrap();
        assert_eq!(a[0].input_hash, b[0].input_hash);
    }

    #[test]
    fn invalid_json() {
        let e = only_error("{\"key\":\"a\",\"body\":{}}\n{nope", options());
        assert_eq!(e.line, 2);
        assert!(e.reason.starts_with("invalid JSON"), "{e}");
    }

    #[test]
    fn missing_fields() {
        let e = only_error(r#"{"body":{"model":"m"}}"#, options());
        assert_eq!(e.field.as_deref(), Some("key"));
        let e = only_error(r#"{"key":"a"}"#, options());
        assert_eq!(e.field.as_deref(), Some("body"));
        assert_eq!(e.reason, "missing field");
        let e = only_error(r#"{"custom_id":"a","url":"/v1/embeddings","body":{}}"#, options());
        assert_eq!(e.field.as_deref(), Some("method"));
    }

    #[test]
    fn wrong_types() {
        let e = only_error(r#"{"key":7,"body":{}}"#, options());
        assert_eq!(
            (e.field.as_deref(), e.reason.as_str()),
            (Some("key"), "expected a string, found a number")
        );
        let e = only_error(r#"{"key":"a","body":[1]}"#, options());
        assert_eq!(
            (e.field.as_deref(), e.reason.as_str()),
            (Some("body"), "expected an object, found an array")
        );
        let e = only_error(r#"{"key":"a","body":{"model":5}}"#, options());
        assert_eq!(e.field.as_deref(), Some("body.model"));
        let e = only_error("[1,2]", options());
        assert_eq!(e.reason, "expected a JSON object");
    }

    #[test]
    fn unknown_endpoint_and_bad_method() {
        let e = only_error(
            r#"{"custom_id":"a","method":"POST","url":"/v1/chat","body":{"model":"m"}}"#,
            options(),
        );
        assert_eq!(e.field.as_deref(), Some("url"));
        assert!(e.reason.starts_with("unknown endpoint `/v1/chat`"), "{e}");
        let e = only_error(
            r#"{"custom_id":"a","method":"GET","url":"/v1/embeddings","body":{"model":"m"}}"#,
            options(),
        );
        assert_eq!(e.field.as_deref(), Some("method"));
        assert!(e.reason.contains("must use POST"));
    }

    #[test]
    fn duplicate_custom_id_names_both_lines() {
        let text =
            "{\"key\":\"a\",\"body\":{}}\n{\"key\":\"b\",\"body\":{}}\n{\"key\":\"a\",\"body\":{}}";
        let e = only_error(text, options());
        assert_eq!(e.line, 3);
        assert_eq!(e.field.as_deref(), Some("custom_id"));
        assert!(e.reason.contains("already used on line 1"), "{e}");
        assert_eq!(
            e.to_string(),
            "line 3: `custom_id`: duplicate custom_id `a:intent:v3`: already used on line 1"
        );
    }

    #[test]
    fn missing_model() {
        let opts = InputOptions { model: None, ..options() };
        let e = only_error(r#"{"key":"a","body":{}}"#, opts);
        assert_eq!(e.field.as_deref(), Some("body.model"));
        assert!(e.reason.contains("--model"));
    }

    #[test]
    fn missing_task_for_tranche_lines() {
        let opts = InputOptions { task: None, ..options() };
        let e = only_error(r#"{"key":"a","body":{}}"#, opts);
        assert!(e.reason.contains("--task"));
    }

    #[test]
    fn every_bad_line_is_reported() {
        let text = "nope\n{\"key\":\"a\",\"body\":{}}\n{\"key\":1}\n";
        let rejected = parse_str(text, options()).unwrap_err();
        assert_eq!(rejected.total, 2);
        assert_eq!(rejected.errors.iter().map(|e| e.line).collect::<Vec<_>>(), vec![1, 3]);
    }

    #[test]
    fn empty_input_is_rejected() {
        assert!(parse_str("\n\n", options()).is_err());
    }

    #[test]
    fn anthropic_takes_messages_params_and_refuses_openai_chat_bodies() {
        let opts = || InputOptions {
            task: Some("t".into()),
            endpoint: Endpoint::AnthropicMessages,
            ..InputOptions::new(ProviderKind::Anthropic)
        };
        let ok = parse_str(
            r#"{"key":"a","body":{"model":"claude-x","max_tokens":100,"system":"Be brief.","messages":[{"role":"user","content":"hi"}]}}"#,
            opts(),
        )
        .unwrap();
        assert_eq!(ok[0].endpoint, Endpoint::AnthropicMessages);
        let e = only_error(
            r#"{"key":"a","body":{"model":"gpt-4o","max_tokens":10,"messages":[{"role":"system","content":"x"},{"role":"user","content":"hi"}]}}"#,
            opts(),
        );
        assert_eq!(e.field.as_deref(), Some("body.messages[0].role"));
        assert!(e.reason.contains("top-level `system`"), "{e}");
        let e = only_error(r#"{"key":"a","body":{"model":"m","messages":[]}}"#, opts());
        assert_eq!(e.field.as_deref(), Some("body.max_tokens"));
        let e = only_error(
            r#"{"key":"a","body":{"model":"m","max_tokens":5,"messages":[],"response_format":{"type":"json_object"}}}"#,
            opts(),
        );
        assert!(e.reason.contains("OpenAI chat parameter"), "{e}");
    }

    #[test]
    fn endpoint_must_belong_to_provider() {
        let opts = InputOptions::new(ProviderKind::Azure);
        let e = only_error(
            r#"{"custom_id":"a","method":"POST","url":"/v1/embeddings","body":{"model":"m"}}"#,
            opts,
        );
        assert!(e.reason.contains("not served by azure"), "{e}");
    }
}
