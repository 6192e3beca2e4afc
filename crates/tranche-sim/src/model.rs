//! The deterministic fake model: answers a request body for an OpenAI endpoint with a response
//! body of the right shape, the same answer for the same request every time.
//!
//! Content is a short sentence carrying a hash of the request; under structured output
//! (`response_format` / `text.format` of type `json_schema`) it is a JSON instance of the schema.
//! Token counts are estimated as characters / 4 (at least 1).

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use crate::schema;

/// A successful answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ModelOutput {
    pub body: Value,
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// The request cannot be served as sent (the real API would answer HTTP 400).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ModelRejection {
    pub message: String,
    pub param: Option<String>,
}

impl ModelRejection {
    fn new(message: impl Into<String>, param: Option<&str>) -> Self {
        Self { message: message.into(), param: param.map(str::to_owned) }
    }
}

/// Runs one request. `created` is the virtual time; `nonce` makes response ids unique per run.
pub(crate) fn run(
    endpoint: &str,
    body: &Value,
    created: i64,
    nonce: &str,
) -> Result<ModelOutput, ModelRejection> {
    let Some(obj) = body.as_object() else {
        return Err(ModelRejection::new("The request body must be a JSON object.", Some("body")));
    };
    match endpoint {
        "/v1/chat/completions" | "/chat/completions" => chat(obj, created, nonce),
        "/v1/embeddings" | "/embeddings" => embeddings(obj),
        "/v1/responses" | "/responses" => responses(obj, created, nonce),
        "/v1/completions" | "/completions" => completions(obj, created, nonce),
        "/v1/moderations" | "/moderations" => moderations(obj, nonce),
        other => {
            Err(ModelRejection::new(format!("The simulator does not implement {other}."), None))
        }
    }
}

/// Rough token estimate of a text length: chars / 4, at least 1.
pub(crate) fn tokens_for_chars(chars: usize) -> u64 {
    u64::try_from(chars / 4).unwrap_or(u64::MAX).max(1)
}

fn digest_hex(parts: &[&[u8]], len: usize) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
        h.update([0xff]);
    }
    let d = h.finalize();
    hex::encode(&d[..len.min(d.len())])
}

fn require_model(obj: &Map<String, Value>) -> Result<&str, ModelRejection> {
    obj.get("model")
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty())
        .ok_or_else(|| ModelRejection::new("You must provide a model parameter.", Some("model")))
}

/// Every string in a JSON value except structural keys, concatenated: the "request text".
fn collect_text(value: &Value, out: &mut String) {
    match value {
        Value::String(s) => {
            out.push_str(s);
            out.push('\n');
        }
        Value::Array(items) => items.iter().for_each(|v| collect_text(v, out)),
        Value::Object(map) => {
            for (k, v) in map {
                if !matches!(k.as_str(), "role" | "type" | "name" | "id" | "detail") {
                    collect_text(v, out);
                }
            }
        }
        _ => {}
    }
}

fn text_of(value: &Value) -> String {
    let mut s = String::new();
    collect_text(value, &mut s);
    s
}

/// The text of the last user message, shortened, for a readable answer.
fn snippet(text: &str) -> String {
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut short: String = flat.chars().take(48).collect();
    if flat.chars().count() > 48 {
        short.push('…');
    }
    short
}

/// The answer text: a sentence, a JSON object, or a schema instance.
fn answer(format: Option<&Value>, request_hash: &str, prompt: &str) -> String {
    let sentence = format!("Simulated answer {request_hash} to \"{}\".", snippet(prompt));
    let Some(format) = format else {
        return sentence;
    };
    match format.get("type").and_then(Value::as_str) {
        Some("json_schema") => {
            // Chat nests the schema (`json_schema.schema`); Responses puts it on the format itself.
            let schema = format
                .get("json_schema")
                .and_then(|j| j.get("schema"))
                .or_else(|| format.get("schema"))
                .cloned()
                .unwrap_or_else(|| json!({"type": "object"}));
            schema::instance(&schema, request_hash).to_string()
        }
        Some("json_object") => json!({"answer": sentence}).to_string(),
        _ => sentence,
    }
}

/// Cuts `text` to a token budget; returns whether it was cut.
fn truncate_to(text: &mut String, max_tokens: Option<u64>) -> bool {
    let Some(max) = max_tokens else {
        return false;
    };
    if tokens_for_chars(text.chars().count()) <= max {
        return false;
    }
    let keep = usize::try_from(max.saturating_mul(4)).unwrap_or(usize::MAX);
    *text = text.chars().take(keep).collect();
    true
}

fn chat(
    obj: &Map<String, Value>,
    created: i64,
    nonce: &str,
) -> Result<ModelOutput, ModelRejection> {
    let model = require_model(obj)?;
    let messages =
        obj.get("messages").and_then(Value::as_array).filter(|m| !m.is_empty()).ok_or_else(
            || ModelRejection::new("Missing required parameter: 'messages'.", Some("messages")),
        )?;
    if messages.iter().any(|m| m.get("role").and_then(Value::as_str).is_none()) {
        return Err(ModelRejection::new(
            "Missing required parameter: 'messages[].role'.",
            Some("messages"),
        ));
    }
    // `Value`'s own Display is compiled (optimized) inside serde_json; generic serializers are not.
    let canonical: Vec<String> = messages.iter().map(Value::to_string).collect();
    let mut parts: Vec<&[u8]> = vec![model.as_bytes()];
    parts.extend(canonical.iter().map(String::as_bytes));
    let request_hash = digest_hex(&parts, 4);
    let last_user = messages
        .iter()
        .rev()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
        .and_then(|m| m.get("content"))
        .map(text_of)
        .unwrap_or_default();
    let mut content = answer(obj.get("response_format"), &request_hash, &last_user);
    let max =
        obj.get("max_completion_tokens").or_else(|| obj.get("max_tokens")).and_then(Value::as_u64);
    let cut = truncate_to(&mut content, max);
    let mut request_text = String::new();
    messages.iter().for_each(|m| collect_text(m, &mut request_text));
    let input_tokens = tokens_for_chars(request_text.chars().count());
    let output_tokens = tokens_for_chars(content.chars().count());
    let body = json!({
        "id": format!("chatcmpl-{}", digest_hex(&[nonce.as_bytes()], 12)),
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content, "refusal": null, "annotations": []},
            "logprobs": null,
            "finish_reason": if cut { "length" } else { "stop" },
        }],
        "usage": {
            "prompt_tokens": input_tokens,
            "completion_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0
            }
        },
        "service_tier": "default",
        "system_fingerprint": "fp_tranche_sim",
    });
    Ok(ModelOutput { body, input_tokens, output_tokens })
}

/// One embedding input: text, or token ids.
enum EmbeddingInput<'a> {
    Text(&'a str),
    Tokens(&'a [Value]),
}

fn embedding_inputs(input: &Value) -> Option<Vec<EmbeddingInput<'_>>> {
    match input {
        Value::String(s) => Some(vec![EmbeddingInput::Text(s)]),
        Value::Array(items) if items.is_empty() => None,
        Value::Array(items) if items.iter().all(Value::is_string) => {
            Some(items.iter().filter_map(Value::as_str).map(EmbeddingInput::Text).collect())
        }
        Value::Array(items) if items.iter().all(Value::is_number) => {
            Some(vec![EmbeddingInput::Tokens(items)])
        }
        Value::Array(items) if items.iter().all(Value::is_array) => items
            .iter()
            .map(|i| i.as_array().map(|a| EmbeddingInput::Tokens(a.as_slice())))
            .collect(),
        _ => None,
    }
}

/// 16 (or `dimensions`) unit-length floats from a hash of the input.
fn embedding_vector(seed_text: &str, dims: usize) -> Vec<f32> {
    let mut raw = Vec::with_capacity(dims);
    let mut block = 0u32;
    while raw.len() < dims {
        let d = Sha256::new()
            .chain_update(seed_text.as_bytes())
            .chain_update(block.to_le_bytes())
            .finalize();
        for pair in d.chunks_exact(2) {
            if raw.len() == dims {
                break;
            }
            let x = f32::from(u16::from_le_bytes([pair[0], pair[1]])) / 32767.5 - 1.0;
            raw.push(x);
        }
        block += 1;
    }
    let norm = raw.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        raw.iter_mut().for_each(|x| *x /= norm);
    }
    raw
}

fn embeddings(obj: &Map<String, Value>) -> Result<ModelOutput, ModelRejection> {
    let model = require_model(obj)?;
    let inputs = obj.get("input").and_then(embedding_inputs).ok_or_else(|| {
        ModelRejection::new(
            "'input' must be a non-empty string, array of strings, or array of token arrays.",
            Some("input"),
        )
    })?;
    let dims = obj
        .get("dimensions")
        .and_then(Value::as_u64)
        .and_then(|d| usize::try_from(d).ok())
        .filter(|d| (1..=4096).contains(d))
        .unwrap_or(16);
    let base64 = obj.get("encoding_format").and_then(Value::as_str) == Some("base64");
    let mut data = Vec::with_capacity(inputs.len());
    let mut tokens = 0u64;
    for (index, input) in inputs.iter().enumerate() {
        let (key, n) = match input {
            EmbeddingInput::Text(s) => ((*s).to_owned(), tokens_for_chars(s.chars().count())),
            EmbeddingInput::Tokens(t) => (
                Value::Array(t.to_vec()).to_string(),
                u64::try_from(t.len()).unwrap_or(u64::MAX).max(1),
            ),
        };
        tokens += n;
        let vector = embedding_vector(&format!("{model}\u{0}{key}"), dims);
        let embedding = if base64 {
            let bytes: Vec<u8> = vector.iter().flat_map(|f| f.to_le_bytes()).collect();
            Value::String(base64_encode(&bytes))
        } else {
            json!(vector)
        };
        data.push(json!({"object": "embedding", "index": index, "embedding": embedding}));
    }
    let body = json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    });
    Ok(ModelOutput { body, input_tokens: tokens, output_tokens: 0 })
}

fn responses(
    obj: &Map<String, Value>,
    created: i64,
    nonce: &str,
) -> Result<ModelOutput, ModelRejection> {
    let model = require_model(obj)?;
    let input = obj
        .get("input")
        .filter(|i| i.is_string() || i.as_array().is_some_and(|a| !a.is_empty()))
        .ok_or_else(|| {
            ModelRejection::new("Missing required parameter: 'input'.", Some("input"))
        })?;
    let mut request_text = obj.get("instructions").map(text_of).unwrap_or_default();
    request_text.push_str(&text_of(input));
    let canonical = json!([obj.get("instructions"), input]).to_string();
    let request_hash = digest_hex(&[model.as_bytes(), canonical.as_bytes()], 4);
    let prompt = match input {
        Value::String(s) => s.clone(),
        other => other
            .as_array()
            .and_then(|items| {
                items.iter().rev().find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
            })
            .and_then(|m| m.get("content"))
            .map(text_of)
            .unwrap_or_default(),
    };
    let format = obj.get("text").and_then(|t| t.get("format"));
    let mut text = answer(format, &request_hash, &prompt);
    let cut = truncate_to(&mut text, obj.get("max_output_tokens").and_then(Value::as_u64));
    let input_tokens = tokens_for_chars(request_text.chars().count());
    let output_tokens = tokens_for_chars(text.chars().count());
    let id = digest_hex(&[nonce.as_bytes()], 16);
    let body = json!({
        "id": format!("resp_{id}"),
        "object": "response",
        "created_at": created,
        "status": if cut { "incomplete" } else { "completed" },
        "error": null,
        "incomplete_details": if cut { json!({"reason": "max_output_tokens"}) } else { Value::Null },
        "instructions": obj.get("instructions").cloned().unwrap_or(Value::Null),
        "model": model,
        "output": [{
            "type": "message",
            "id": format!("msg_{id}"),
            "status": if cut { "incomplete" } else { "completed" },
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }],
        "parallel_tool_calls": true,
        "tool_choice": "auto",
        "tools": [],
        "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
        "usage": {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens,
        },
    });
    Ok(ModelOutput { body, input_tokens, output_tokens })
}

fn completions(
    obj: &Map<String, Value>,
    created: i64,
    nonce: &str,
) -> Result<ModelOutput, ModelRejection> {
    let model = require_model(obj)?;
    let prompt = obj.get("prompt").map(text_of).ok_or_else(|| {
        ModelRejection::new("Missing required parameter: 'prompt'.", Some("prompt"))
    })?;
    let request_hash = digest_hex(&[model.as_bytes(), prompt.as_bytes()], 4);
    let mut text = answer(None, &request_hash, &prompt);
    let cut = truncate_to(&mut text, obj.get("max_tokens").and_then(Value::as_u64));
    let input_tokens = tokens_for_chars(prompt.chars().count());
    let output_tokens = tokens_for_chars(text.chars().count());
    let body = json!({
        "id": format!("cmpl-{}", digest_hex(&[nonce.as_bytes()], 12)),
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"text": text, "index": 0, "logprobs": null, "finish_reason": if cut { "length" } else { "stop" }}],
        "usage": {
            "prompt_tokens": input_tokens,
            "completion_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
        },
    });
    Ok(ModelOutput { body, input_tokens, output_tokens })
}

fn moderations(obj: &Map<String, Value>, nonce: &str) -> Result<ModelOutput, ModelRejection> {
    let input = obj.get("input").ok_or_else(|| {
        ModelRejection::new("Missing required parameter: 'input'.", Some("input"))
    })?;
    let count = input.as_array().map_or(1, Vec::len).max(1);
    let categories = [
        "harassment",
        "harassment/threatening",
        "hate",
        "hate/threatening",
        "illicit",
        "illicit/violent",
        "self-harm",
        "self-harm/instructions",
        "self-harm/intent",
        "sexual",
        "sexual/minors",
        "violence",
        "violence/graphic",
    ];
    let flags: Map<String, Value> =
        categories.iter().map(|c| ((*c).to_owned(), json!(false))).collect();
    let scores: Map<String, Value> =
        categories.iter().map(|c| ((*c).to_owned(), json!(0.0001))).collect();
    let result = json!({"flagged": false, "categories": flags, "category_scores": scores});
    let input_tokens = tokens_for_chars(text_of(input).chars().count());
    let body = json!({
        "id": format!("modr-{}", digest_hex(&[nonce.as_bytes()], 12)),
        "model": obj.get("model").and_then(Value::as_str).unwrap_or("omni-moderation-latest"),
        "results": vec![result; count],
    });
    Ok(ModelOutput { body, input_tokens, output_tokens: 0 })
}

/// Standard base64 with padding (what the embeddings API returns for `encoding_format: base64`).
fn base64_encode(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], chunk.get(1).copied().unwrap_or(0), chunk.get(2).copied().unwrap_or(0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat_body(content: &str) -> Value {
        json!({"model": "gpt-4o-mini", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": content}]})
    }

    #[test]
    fn chat_is_deterministic_and_well_formed() {
        let a = run("/v1/chat/completions", &chat_body("Classify this ticket"), 100, "n1").unwrap();
        let b = run("/v1/chat/completions", &chat_body("Classify this ticket"), 100, "n1").unwrap();
        assert_eq!(a, b);
        let c = run("/v1/chat/completions", &chat_body("Another ticket"), 100, "n1").unwrap();
        let content = |o: &ModelOutput| o.body["choices"][0]["message"]["content"].clone();
        assert_ne!(content(&a), content(&c));
        assert_eq!(a.body["object"], "chat.completion");
        assert_eq!(a.body["choices"][0]["finish_reason"], "stop");
        assert_eq!(a.body["choices"][0]["message"]["refusal"], Value::Null);
        assert!(a.body["id"].as_str().unwrap().starts_with("chatcmpl-"));
        assert_eq!(
            a.body["usage"]["total_tokens"].as_u64().unwrap(),
            a.input_tokens + a.output_tokens
        );
        assert!(a.input_tokens >= 1 && a.output_tokens >= 1);
    }

    #[test]
    fn chat_json_schema_answers_parse() {
        let mut body = chat_body("ticket 1");
        body["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "x", "strict": true, "schema": {
            "type": "object", "properties": {"intent": {"type": "string", "enum": ["refund", "bug"]}, "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
            "required": ["intent", "confidence"], "additionalProperties": false}}});
        let out = run("/v1/chat/completions", &body, 1, "n").unwrap();
        let content = out.body["choices"][0]["message"]["content"].as_str().unwrap();
        let parsed: Value = serde_json::from_str(content).unwrap();
        assert!(["refund", "bug"].contains(&parsed["intent"].as_str().unwrap()));
    }

    #[test]
    fn chat_truncates_to_max_tokens() {
        let mut body = chat_body("a long question");
        body["max_completion_tokens"] = json!(2);
        let out = run("/v1/chat/completions", &body, 1, "n").unwrap();
        assert_eq!(out.body["choices"][0]["finish_reason"], "length");
        assert!(out.output_tokens <= 2);
    }

    #[test]
    fn chat_rejects_missing_messages() {
        let err = run("/v1/chat/completions", &json!({"model": "m"}), 1, "n").unwrap_err();
        assert_eq!(err.param.as_deref(), Some("messages"));
        let err = run(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "x"}]}),
            1,
            "n",
        )
        .unwrap_err();
        assert_eq!(err.param.as_deref(), Some("model"));
    }

    #[test]
    fn embeddings_one_per_input() {
        let out = run(
            "/v1/embeddings",
            &json!({"model": "text-embedding-3-small", "input": ["a", "b", "a"]}),
            1,
            "n",
        )
        .unwrap();
        let data = out.body["data"].as_array().unwrap();
        assert_eq!(data.len(), 3);
        assert_eq!(data[1]["index"], 1);
        assert_eq!(data[0]["embedding"].as_array().unwrap().len(), 16);
        assert_eq!(data[0]["embedding"], data[2]["embedding"]);
        assert_ne!(data[0]["embedding"], data[1]["embedding"]);
        let b64 = run(
            "/v1/embeddings",
            &json!({"model": "m", "input": "a", "encoding_format": "base64"}),
            1,
            "n",
        )
        .unwrap();
        assert_eq!(b64.body["data"][0]["embedding"].as_str().unwrap().len(), 88);
    }

    #[test]
    fn responses_shape_and_schema() {
        let out = run(
            "/v1/responses",
            &json!({"model": "gpt-4.1", "input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}}),
            5,
            "n",
        )
        .unwrap();
        assert_eq!(out.body["object"], "response");
        assert_eq!(out.body["output"][0]["type"], "message");
        let text = out.body["output"][0]["content"][0]["text"].as_str().unwrap();
        assert_eq!(serde_json::from_str::<Value>(text).unwrap(), json!({"n": 1}));
    }

    #[test]
    fn base64_matches_known_vectors() {
        assert_eq!(base64_encode(b""), "");
        assert_eq!(base64_encode(b"f"), "Zg==");
        assert_eq!(base64_encode(b"fo"), "Zm8=");
        assert_eq!(base64_encode(b"foo"), "Zm9v");
        assert_eq!(base64_encode(b"foobar"), "Zm9vYmFy");
    }

    #[test]
    fn token_estimate_floor() {
        assert_eq!(tokens_for_chars(0), 1);
        assert_eq!(tokens_for_chars(7), 1);
        assert_eq!(tokens_for_chars(400), 100);
    }
}
