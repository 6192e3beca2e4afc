//! Checking an answer against a job's JSON Schema: the extracted text parsed as JSON (strictly,
//! or with a Markdown code fence stripped when the job is lenient) and validated; a truncated
//! answer is never valid. An invalid answer says where (a JSON pointer) and why (for a missing
//! required field, its name).

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::extract::{Answer, Extracted};
use crate::hash::canonical_json;

/// A job's JSON Schema, compiled, with the hash that tells one schema from another (answers
/// are reused only under the same schema).
pub struct AnswerSchema {
    validator: jsonschema::Validator,
    hash: String,
}

impl std::fmt::Debug for AnswerSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnswerSchema").field("hash", &self.hash).finish_non_exhaustive()
    }
}

/// A schema that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a usable JSON Schema: {0}")]
pub struct SchemaError(String);

/// Why an answer is not valid: where in it (a JSON pointer; empty for the whole answer) and
/// what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{reason}", if path.is_empty() { String::new() } else { format!("at {path}: ") })]
pub struct Invalid {
    pub path: String,
    pub reason: String,
}

impl Invalid {
    fn whole(reason: impl Into<String>) -> Self {
        Self { path: String::new(), reason: reason.into() }
    }
}

impl AnswerSchema {
    /// Compiles `schema` (no remote references are fetched).
    pub fn new(schema: &Value) -> Result<Self, SchemaError> {
        let validator =
            jsonschema::validator_for(schema).map_err(|e| SchemaError(e.to_string()))?;
        let hash = hex::encode(Sha256::digest(canonical_json(schema).as_bytes()));
        Ok(Self { validator, hash })
    }

    /// SHA-256 of the schema's canonical JSON, lower-case hex.
    pub fn hash(&self) -> &str {
        &self.hash
    }

    /// The id of checking answers against this schema, strictly or leniently: the schema's
    /// hash, marked `+lenient` when fenced JSON passes. Answers are reused only under the
    /// same check, and one tranche holds requests of one check.
    pub fn check_id(&self, lenient: bool) -> String {
        if lenient { format!("{}+lenient", self.hash) } else { self.hash.clone() }
    }

    /// The answer as JSON when it is valid against the schema; why not otherwise. `lenient`
    /// accepts JSON inside a Markdown code fence.
    pub fn check(&self, extracted: &Extracted, lenient: bool) -> Result<Value, Invalid> {
        if extracted.is_truncated() {
            let reason = extracted.finish_reason.as_deref().unwrap_or("the token limit");
            return Err(Invalid::whole(format!("the answer was cut off ({reason})")));
        }
        let text = extracted.json_text().ok_or_else(|| {
            Invalid::whole(match &extracted.answer {
                Answer::Refusal(_) => "the model refused to answer",
                Answer::ToolCalls(_) => "the answer holds several tool calls, not one",
                Answer::Empty => "the answer is empty",
                _ => "the answer is not text to check against a schema",
            })
        })?;
        let value = parse_json(text, lenient)?;
        let invalid = self.validator.iter_errors(&value).next().map(|error| Invalid {
            path: error.instance_path().to_string(),
            reason: error.masked().to_string(),
        });
        invalid.map_or(Ok(value), Err)
    }
}

/// `text` as JSON: strictly, or (lenient) from inside a Markdown code fence.
fn parse_json(text: &str, lenient: bool) -> Result<Value, Invalid> {
    match serde_json::from_str(text) {
        Ok(value) => Ok(value),
        Err(strict) => {
            let fenced = lenient.then(|| unfence(text)).flatten();
            match fenced.map(serde_json::from_str::<Value>) {
                Some(Ok(value)) => Ok(value),
                _ => Err(Invalid::whole(format!("the answer is not JSON: {strict}"))),
            }
        }
    }
}

/// The body of a Markdown code fence around the whole of `text` (```` ``` ```` or
/// ```` ```json ````), if there is one.
fn unfence(text: &str) -> Option<&str> {
    let inner = text.trim().strip_prefix("```")?.strip_suffix("```")?;
    let (info, body) = inner.split_once('\n')?;
    let info = info.trim();
    (info.is_empty() || info.eq_ignore_ascii_case("json")).then_some(body)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::Endpoint;
    use crate::extract::extract;

    fn schema() -> AnswerSchema {
        AnswerSchema::new(&json!({
            "type": "object",
            "properties": {
                "label": {"type": "string", "enum": ["spam", "ham"]},
                "score": {"type": "number"}
            },
            "required": ["label", "score"]
        }))
        .unwrap()
    }

    fn chat(content: &str, finish: &str) -> Extracted {
        let body = json!({"choices": [{"message": {"content": content}, "finish_reason": finish}]});
        extract(Endpoint::ChatCompletions, &body.to_string()).unwrap()
    }

    #[test]
    fn a_valid_answer_comes_back_as_json() {
        let got = schema().check(&chat(r#"{"label":"ham","score":0.5}"#, "stop"), false);
        assert_eq!(got.unwrap(), json!({"label": "ham", "score": 0.5}));
    }

    #[test]
    fn a_missing_required_field_is_named() {
        let err = schema().check(&chat(r#"{"label":"ham"}"#, "stop"), false).unwrap_err();
        assert_eq!(err.path, "");
        assert!(err.reason.contains("\"score\" is a required property"), "{err}");
    }

    #[test]
    fn a_wrong_value_names_its_path() {
        let err =
            schema().check(&chat(r#"{"label":"eggs","score":1}"#, "stop"), false).unwrap_err();
        assert_eq!(err.path, "/label");
        assert!(err.to_string().starts_with("at /label: "), "{err}");
    }

    #[test]
    fn truncated_answers_are_never_valid_even_when_they_parse() {
        let err =
            schema().check(&chat(r#"{"label":"ham","score":1}"#, "length"), false).unwrap_err();
        assert_eq!(err.reason, "the answer was cut off (length)");
    }

    #[test]
    fn fenced_json_passes_only_when_lenient() {
        let fenced = chat("```json\n{\"label\":\"spam\",\"score\":2}\n```", "stop");
        let err = schema().check(&fenced, false).unwrap_err();
        assert!(err.reason.starts_with("the answer is not JSON"), "{err}");
        assert_eq!(schema().check(&fenced, true).unwrap()["label"], "spam");
        let bare = chat("```\n{\"label\":\"spam\",\"score\":2}\n```", "stop");
        assert!(schema().check(&bare, true).is_ok());
        let prose = chat("Sure! {\"label\":\"spam\"}", "stop");
        assert!(schema().check(&prose, true).is_err(), "only a fence around the whole answer");
    }

    #[test]
    fn refusals_and_empty_answers_are_invalid() {
        let body = json!({"choices": [{"message": {"content": null, "refusal": "No."}, "finish_reason": "stop"}]});
        let refused = extract(Endpoint::ChatCompletions, &body.to_string()).unwrap();
        assert_eq!(
            schema().check(&refused, true).unwrap_err().reason,
            "the model refused to answer"
        );
    }

    #[test]
    fn tool_call_arguments_are_checked() {
        let body = json!({"content": [{"type": "tool_use", "name": "classify", "input": {"label": "spam"}}], "stop_reason": "tool_use"});
        let call = extract(Endpoint::AnthropicMessages, &body.to_string()).unwrap();
        let err = schema().check(&call, false).unwrap_err();
        assert!(err.reason.contains("\"score\""), "{err}");
    }

    #[test]
    fn schemas_hash_by_content_and_bad_schemas_are_refused() {
        let a = AnswerSchema::new(&json!({"type": "object", "required": ["a"]})).unwrap();
        let b = AnswerSchema::new(&json!({"required": ["a"], "type": "object"})).unwrap();
        let c = AnswerSchema::new(&json!({"type": "object", "required": ["b"]})).unwrap();
        assert_eq!(a.hash(), b.hash());
        assert_ne!(a.hash(), c.hash());
        assert!(AnswerSchema::new(&json!({"type": 12})).is_err());
        // Leniency is part of the check: a fenced answer passes one and not the other.
        assert_eq!(a.check_id(false), a.hash());
        assert_eq!(a.check_id(true), format!("{}+lenient", a.hash()));
    }
}
