//! The deterministic fake model: answers a request body for an OpenAI endpoint with a response
//! body of the right shape, the same answer for the same request every time.
//!
//! Content is a short sentence carrying a hash of the request; under structured output
//! (`response_format` / `text.format` / Anthropic `output_format` of type `json_schema`) it is a
//! JSON instance of the schema. Token counts are estimated as characters / 4 (at least 1). When a
//! request repeats a prompt prefix (every message but the last, plus any system prompt or
//! instructions) already seen by this simulator for the same provider and model, the prefix's
//! tokens are reported as cached. A line fault can corrupt the answer (invalid JSON, or JSON that
//! violates the schema) while the request still succeeds and is billed.

use std::collections::HashSet;

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use crate::schema;

/// A successful answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ModelOutput {
    pub body: Value,
    /// All input tokens, cached ones included.
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// The part of `input_tokens` read from the prompt cache.
    pub cached_tokens: u64,
}

/// How a line fault spoils an otherwise successful answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Corruption {
    /// The answer text is not parseable JSON.
    InvalidJson,
    /// The answer is JSON that does not fit the requested schema.
    SchemaViolation,
}

/// Prompt prefixes seen so far (hashes of provider, model and prefix).
#[derive(Debug, Default)]
pub(crate) struct PromptCache(HashSet<[u8; 32]>);

impl PromptCache {
    /// Whether the prefix was seen before; remembers it either way.
    fn hit(&mut self, scope: &str, model: &str, prefix: &str) -> bool {
        let mut key = [0u8; 32];
        let digest = Sha256::new()
            .chain_update(scope.as_bytes())
            .chain_update([0])
            .chain_update(model.as_bytes())
            .chain_update([0])
            .chain_update(prefix.as_bytes())
            .finalize();
        key.copy_from_slice(&digest);
        !self.0.insert(key)
    }
}

/// What one run may use besides the request: the virtual time, a nonce for ids, the answer
/// corruption to apply, and the prompt cache of the simulator.
#[derive(Debug)]
pub(crate) struct RunContext<'a> {
    pub created: i64,
    pub nonce: &'a str,
    pub corruption: Option<Corruption>,
    /// Provider name: caches are per provider.
    pub scope: &'a str,
    pub cache: &'a mut PromptCache,
}

impl RunContext<'_> {
    /// Tokens of `prefix` if it was seen before (then they are cached), else 0.
    fn cached(&mut self, model: &str, prefix: Option<(&str, u64)>, input_tokens: u64) -> u64 {
        match prefix {
            Some((text, tokens)) if !text.is_empty() && self.cache.hit(self.scope, model, text) => {
                // The last message is never cached, so at least one input token is not.
                tokens.min(input_tokens.saturating_sub(1))
            }
            _ => 0,
        }
    }
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

/// Runs one OpenAI-shaped request against `endpoint`.
pub(crate) fn run(
    endpoint: &str,
    body: &Value,
    ctx: &mut RunContext<'_>,
) -> Result<ModelOutput, ModelRejection> {
    let Some(obj) = body.as_object() else {
        return Err(ModelRejection::new("The request body must be a JSON object.", Some("body")));
    };
    match endpoint {
        "/v1/chat/completions" | "/chat/completions" => chat(obj, ctx),
        "/v1/embeddings" | "/embeddings" => embeddings(obj),
        "/v1/responses" | "/responses" => responses(obj, ctx),
        "/v1/completions" | "/completions" => completions(obj, ctx),
        "/v1/moderations" | "/moderations" => moderations(obj, ctx.nonce),
        other => {
            Err(ModelRejection::new(format!("The simulator does not implement {other}."), None))
        }
    }
}

/// Estimated prompt tokens of an OpenAI-shaped request body (what counts against an enqueued-token
/// limit).
pub(crate) fn request_tokens(endpoint: &str, body: &Value) -> u64 {
    let text = match endpoint.trim_start_matches("/v1") {
        "/chat/completions" => body.get("messages").map(text_of),
        "/responses" => {
            let mut t = body.get("instructions").map(text_of).unwrap_or_default();
            t.push_str(&body.get("input").map(text_of).unwrap_or_default());
            Some(t)
        }
        "/embeddings" | "/moderations" => body.get("input").map(text_of),
        "/completions" => body.get("prompt").map(text_of),
        _ => None,
    };
    tokens_for_chars(text.unwrap_or_else(|| text_of(body)).chars().count())
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

/// The answer text: a sentence, a JSON object, or a schema instance; spoiled if asked to.
fn answer(
    format: Option<&Value>,
    request_hash: &str,
    prompt: &str,
    corruption: Option<Corruption>,
) -> String {
    let sentence = format!("Simulated answer {request_hash} to \"{}\".", snippet(prompt));
    let kind = format.and_then(|f| f.get("type")).and_then(Value::as_str);
    // Chat nests the schema (`json_schema.schema`); Responses and Anthropic put it on the format.
    let schema = format
        .filter(|_| kind == Some("json_schema"))
        .map(|f| f.get("json_schema").and_then(|j| j.get("schema")).or_else(|| f.get("schema")))
        .map(|s| s.cloned().unwrap_or_else(|| json!({"type": "object"})));
    let valid = match (&schema, kind) {
        (Some(schema), _) => schema::instance(schema, request_hash).to_string(),
        (None, Some("json_object")) => json!({"answer": sentence}).to_string(),
        _ => sentence.clone(),
    };
    match corruption {
        None => valid,
        Some(Corruption::InvalidJson) => {
            // The first half of a JSON document: an unterminated object, never parseable.
            let json_text = if valid.starts_with('{') {
                valid
            } else {
                json!({"answer": sentence}).to_string()
            };
            let half: String = json_text.chars().take(json_text.chars().count() / 2).collect();
            if half.len() < 2 { "{\"answer\": ".to_owned() } else { half }
        }
        Some(Corruption::SchemaViolation) => match &schema {
            Some(schema) => schema::violation(schema, request_hash).to_string(),
            None => json!({"sim_unexpected_field": request_hash}).to_string(),
        },
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

fn chat(obj: &Map<String, Value>, ctx: &mut RunContext<'_>) -> Result<ModelOutput, ModelRejection> {
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
    let mut content = answer(obj.get("response_format"), &request_hash, &last_user, ctx.corruption);
    let max =
        obj.get("max_completion_tokens").or_else(|| obj.get("max_tokens")).and_then(Value::as_u64);
    let cut = truncate_to(&mut content, max);
    let mut request_text = String::new();
    messages.iter().for_each(|m| collect_text(m, &mut request_text));
    let input_tokens = tokens_for_chars(request_text.chars().count());
    let output_tokens = tokens_for_chars(content.chars().count());
    let prefix = messages.split_last().map(|(_, rest)| rest).filter(|rest| !rest.is_empty());
    let prefix = prefix.map(|rest| {
        let canonical = canonical.get(..rest.len()).unwrap_or_default().join("\n");
        let mut text = String::new();
        rest.iter().for_each(|m| collect_text(m, &mut text));
        (canonical, tokens_for_chars(text.chars().count()))
    });
    let cached_tokens =
        ctx.cached(model, prefix.as_ref().map(|(c, t)| (c.as_str(), *t)), input_tokens);
    let body = json!({
        "id": format!("chatcmpl-{}", digest_hex(&[ctx.nonce.as_bytes()], 12)),
        "object": "chat.completion",
        "created": ctx.created,
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
            "prompt_tokens_details": {"cached_tokens": cached_tokens, "audio_tokens": 0},
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
    Ok(ModelOutput { body, input_tokens, output_tokens, cached_tokens })
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
    Ok(ModelOutput { body, input_tokens: tokens, output_tokens: 0, cached_tokens: 0 })
}

fn responses(
    obj: &Map<String, Value>,
    ctx: &mut RunContext<'_>,
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
    let mut text = answer(format, &request_hash, &prompt, ctx.corruption);
    let cut = truncate_to(&mut text, obj.get("max_output_tokens").and_then(Value::as_u64));
    let input_tokens = tokens_for_chars(request_text.chars().count());
    let output_tokens = tokens_for_chars(text.chars().count());
    // The prefix: the instructions plus every input item but the last.
    let earlier = input.as_array().and_then(|items| items.split_last()).map(|(_, rest)| rest);
    let prefix_value = json!([obj.get("instructions"), earlier]);
    let has_prefix = obj.get("instructions").is_some() || earlier.is_some_and(|r| !r.is_empty());
    let prefix_tokens = tokens_for_chars(text_of(&prefix_value).chars().count());
    let prefix_text = prefix_value.to_string();
    let cached_tokens = ctx.cached(
        model,
        has_prefix.then_some((prefix_text.as_str(), prefix_tokens)),
        input_tokens,
    );
    let id = digest_hex(&[ctx.nonce.as_bytes()], 16);
    let body = json!({
        "id": format!("resp_{id}"),
        "object": "response",
        "created_at": ctx.created,
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
            "input_tokens_details": {"cached_tokens": cached_tokens},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens,
        },
    });
    Ok(ModelOutput { body, input_tokens, output_tokens, cached_tokens })
}

fn completions(
    obj: &Map<String, Value>,
    ctx: &mut RunContext<'_>,
) -> Result<ModelOutput, ModelRejection> {
    let model = require_model(obj)?;
    let prompt = obj.get("prompt").map(text_of).ok_or_else(|| {
        ModelRejection::new("Missing required parameter: 'prompt'.", Some("prompt"))
    })?;
    let request_hash = digest_hex(&[model.as_bytes(), prompt.as_bytes()], 4);
    let mut text = answer(None, &request_hash, &prompt, ctx.corruption);
    let cut = truncate_to(&mut text, obj.get("max_tokens").and_then(Value::as_u64));
    let input_tokens = tokens_for_chars(prompt.chars().count());
    let output_tokens = tokens_for_chars(text.chars().count());
    let body = json!({
        "id": format!("cmpl-{}", digest_hex(&[ctx.nonce.as_bytes()], 12)),
        "object": "text_completion",
        "created": ctx.created,
        "model": model,
        "choices": [{"text": text, "index": 0, "logprobs": null, "finish_reason": if cut { "length" } else { "stop" }}],
        "usage": {
            "prompt_tokens": input_tokens,
            "completion_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
        },
    });
    Ok(ModelOutput { body, input_tokens, output_tokens, cached_tokens: 0 })
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
    Ok(ModelOutput { body, input_tokens, output_tokens: 0, cached_tokens: 0 })
}

/// Base62 text of a hash, `len` characters (Anthropic-style ids).
pub(crate) fn base62(parts: &[&[u8]], len: usize) -> String {
    const ALPHABET: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut out = String::with_capacity(len);
    let mut block = 0u32;
    while out.len() < len {
        let mut h = Sha256::new();
        for p in parts {
            h.update(p);
            h.update([0xff]);
        }
        h.update(block.to_le_bytes());
        for b in h.finalize() {
            if out.len() == len {
                break;
            }
            out.push(char::from(ALPHABET[usize::from(b) % 62]));
        }
        block += 1;
    }
    out
}

/// Checks Anthropic Messages params the way the API would (a failure becomes an `errored`
/// result with `invalid_request_error`).
fn check_anthropic_params(obj: &Map<String, Value>) -> Result<(), ModelRejection> {
    let reject = |m: &str| Err(ModelRejection::new(m, None));
    match obj.get("model") {
        Some(Value::String(m)) if !m.is_empty() => {}
        Some(_) => return reject("model: Input should be a valid string"),
        None => return reject("model: Field required"),
    }
    match obj.get("max_tokens") {
        None => return reject("max_tokens: Field required"),
        Some(v) if v.as_u64().is_some_and(|n| n >= 1) => {}
        Some(v) if v.is_i64() || v.is_u64() => {
            return reject("max_tokens: Input should be greater than or equal to 1");
        }
        Some(_) => return reject("max_tokens: Input should be a valid integer"),
    }
    let Some(messages) = obj.get("messages") else {
        return reject("messages: Field required");
    };
    let Some(messages) = messages.as_array() else {
        return reject("messages: Input should be a valid list");
    };
    if messages.is_empty() {
        return reject("messages: at least one message is required");
    }
    for (i, m) in messages.iter().enumerate() {
        match m.get("role").and_then(Value::as_str) {
            Some("user" | "assistant") => {}
            _ => {
                return Err(ModelRejection::new(
                    format!("messages.{i}.role: Input should be 'user' or 'assistant'"),
                    None,
                ));
            }
        }
        match m.get("content") {
            Some(Value::String(_) | Value::Array(_)) => {}
            _ => {
                return Err(ModelRejection::new(
                    format!("messages.{i}.content: Field required"),
                    None,
                ));
            }
        }
    }
    if obj.get("stream").and_then(Value::as_bool) == Some(true) {
        return reject("stream: Streaming is not supported in the Message Batches API.");
    }
    if obj.contains_key("speed") {
        return reject("speed: Fast mode is not supported in the Message Batches API.");
    }
    Ok(())
}

/// Runs one Anthropic Messages request (the `params` of a batch request).
pub(crate) fn anthropic_message(
    params: &Value,
    ctx: &mut RunContext<'_>,
) -> Result<ModelOutput, ModelRejection> {
    let Some(obj) = params.as_object() else {
        return Err(ModelRejection::new("params: Input should be a valid dictionary", None));
    };
    check_anthropic_params(obj)?;
    let model = obj.get("model").and_then(Value::as_str).unwrap_or_default();
    let messages =
        obj.get("messages").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let system = obj.get("system");
    let canonical: Vec<String> = messages.iter().map(Value::to_string).collect();
    let system_text = system.map(Value::to_string).unwrap_or_default();
    let mut parts: Vec<&[u8]> = vec![model.as_bytes(), system_text.as_bytes()];
    parts.extend(canonical.iter().map(String::as_bytes));
    let request_hash = digest_hex(&parts, 4);
    let last_user = messages
        .iter()
        .rev()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
        .and_then(|m| m.get("content"))
        .map(text_of)
        .unwrap_or_default();
    // Structured outputs: `output_config.format` (GA) or `output_format` (beta).
    let format =
        obj.get("output_config").and_then(|c| c.get("format")).or_else(|| obj.get("output_format"));
    let mut text = answer(format, &request_hash, &last_user, ctx.corruption);
    let cut = truncate_to(&mut text, obj.get("max_tokens").and_then(Value::as_u64));
    let mut request_text = system.map(text_of).unwrap_or_default();
    messages.iter().for_each(|m| collect_text(m, &mut request_text));
    let total_input = tokens_for_chars(request_text.chars().count());
    let output_tokens = tokens_for_chars(text.chars().count());
    let earlier = messages.split_last().map(|(_, rest)| rest).unwrap_or_default();
    let prefix = (system.is_some() || !earlier.is_empty()).then(|| {
        let mut prefix_text = system.map(text_of).unwrap_or_default();
        earlier.iter().for_each(|m| collect_text(m, &mut prefix_text));
        let canonical = format!(
            "{system_text}\n{}",
            canonical.get(..earlier.len()).unwrap_or_default().join("\n")
        );
        (canonical, tokens_for_chars(prefix_text.chars().count()))
    });
    let cached_tokens =
        ctx.cached(model, prefix.as_ref().map(|(c, t)| (c.as_str(), *t)), total_input);
    let body = json!({
        "id": format!("msg_01{}", base62(&[ctx.nonce.as_bytes()], 22)),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": if cut { "max_tokens" } else { "end_turn" },
        "stop_sequence": null,
        "usage": {
            // Anthropic counts cache reads apart from `input_tokens`.
            "input_tokens": total_input - cached_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached_tokens,
            "output_tokens": output_tokens,
            "service_tier": "batch",
        },
    });
    Ok(ModelOutput { body, input_tokens: total_input, output_tokens, cached_tokens })
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

    fn ctx<'a>(cache: &'a mut PromptCache, corruption: Option<Corruption>) -> RunContext<'a> {
        RunContext { created: 100, nonce: "n1", corruption, scope: "openai", cache }
    }

    fn go(endpoint: &str, body: &Value) -> Result<ModelOutput, ModelRejection> {
        run(endpoint, body, &mut ctx(&mut PromptCache::default(), None))
    }

    fn chat_body(content: &str) -> Value {
        json!({"model": "gpt-4o-mini", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": content}]})
    }

    #[test]
    fn chat_is_deterministic_and_well_formed() {
        let a = go("/v1/chat/completions", &chat_body("Classify this ticket")).unwrap();
        let b = go("/v1/chat/completions", &chat_body("Classify this ticket")).unwrap();
        assert_eq!(a, b);
        let c = go("/v1/chat/completions", &chat_body("Another ticket")).unwrap();
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
        let out = go("/v1/chat/completions", &body).unwrap();
        let content = out.body["choices"][0]["message"]["content"].as_str().unwrap();
        let parsed: Value = serde_json::from_str(content).unwrap();
        assert!(["refund", "bug"].contains(&parsed["intent"].as_str().unwrap()));
    }

    #[test]
    fn chat_truncates_to_max_tokens() {
        let mut body = chat_body("a long question");
        body["max_completion_tokens"] = json!(2);
        let out = go("/v1/chat/completions", &body).unwrap();
        assert_eq!(out.body["choices"][0]["finish_reason"], "length");
        assert!(out.output_tokens <= 2);
    }

    #[test]
    fn chat_rejects_missing_messages() {
        let err = go("/v1/chat/completions", &json!({"model": "m"})).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("messages"));
        let err =
            go("/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "x"}]}))
                .unwrap_err();
        assert_eq!(err.param.as_deref(), Some("model"));
    }

    #[test]
    fn embeddings_one_per_input() {
        let out = go(
            "/v1/embeddings",
            &json!({"model": "text-embedding-3-small", "input": ["a", "b", "a"]}),
        )
        .unwrap();
        let data = out.body["data"].as_array().unwrap();
        assert_eq!(data.len(), 3);
        assert_eq!(data[1]["index"], 1);
        assert_eq!(data[0]["embedding"].as_array().unwrap().len(), 16);
        assert_eq!(data[0]["embedding"], data[2]["embedding"]);
        assert_ne!(data[0]["embedding"], data[1]["embedding"]);
        let b64 =
            go("/v1/embeddings", &json!({"model": "m", "input": "a", "encoding_format": "base64"}))
                .unwrap();
        assert_eq!(b64.body["data"][0]["embedding"].as_str().unwrap().len(), 88);
    }

    #[test]
    fn responses_shape_and_schema() {
        let out = go("/v1/responses", &json!({"model": "gpt-4.1", "input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}}))
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

    #[test]
    fn repeated_prefixes_are_cached() {
        let mut cache = PromptCache::default();
        let body = |q: &str| {
            json!({"model": "m", "messages": [
                {"role": "system", "content": "You label support tickets into categories. ".repeat(8)},
                {"role": "user", "content": q}]})
        };
        let first = run("/v1/chat/completions", &body("a"), &mut ctx(&mut cache, None)).unwrap();
        assert_eq!(first.cached_tokens, 0);
        let second = run("/v1/chat/completions", &body("b"), &mut ctx(&mut cache, None)).unwrap();
        assert!(second.cached_tokens > 50, "{second:?}");
        assert!(second.cached_tokens < second.input_tokens);
        assert_eq!(
            second.body["usage"]["prompt_tokens_details"]["cached_tokens"],
            second.cached_tokens
        );
        // Another model has its own cache; a single message has no prefix.
        let mut other = body("c");
        other["model"] = json!("m2");
        assert_eq!(
            run("/v1/chat/completions", &other, &mut ctx(&mut cache, None)).unwrap().cached_tokens,
            0
        );
        let lone = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
        for _ in 0..2 {
            assert_eq!(
                run("/v1/chat/completions", &lone, &mut ctx(&mut cache, None))
                    .unwrap()
                    .cached_tokens,
                0
            );
        }
    }

    #[test]
    fn corrupted_answers() {
        let mut body = chat_body("ticket");
        body["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"intent": {"type": "string"}}, "required": ["intent"]}}});
        let content = |c| {
            let out = run("/v1/chat/completions", &body, &mut ctx(&mut PromptCache::default(), c))
                .unwrap();
            out.body["choices"][0]["message"]["content"].as_str().unwrap().to_owned()
        };
        assert!(serde_json::from_str::<Value>(&content(None)).is_ok());
        assert!(serde_json::from_str::<Value>(&content(Some(Corruption::InvalidJson))).is_err());
        let v: Value = serde_json::from_str(&content(Some(Corruption::SchemaViolation))).unwrap();
        assert!(v.get("intent").is_none(), "{v}");
        let plain = run(
            "/v1/chat/completions",
            &chat_body("x"),
            &mut ctx(&mut PromptCache::default(), Some(Corruption::InvalidJson)),
        )
        .unwrap();
        let text = plain.body["choices"][0]["message"]["content"].as_str().unwrap();
        assert!(text.starts_with('{') && serde_json::from_str::<Value>(text).is_err());
    }

    #[test]
    fn anthropic_messages_shape_cache_and_errors() {
        let mut cache = PromptCache::default();
        let params = |q: &str| {
            json!({"model": "claude-sonnet-4-5", "max_tokens": 64, "system": "You are terse. ".repeat(20),
                   "messages": [{"role": "user", "content": q}]})
        };
        let mut c = RunContext {
            created: 1,
            nonce: "x",
            corruption: None,
            scope: "anthropic",
            cache: &mut cache,
        };
        let a = anthropic_message(&params("hello"), &mut c).unwrap();
        assert_eq!(a.body["type"], "message");
        assert_eq!(a.body["role"], "assistant");
        assert_eq!(a.body["content"][0]["type"], "text");
        assert_eq!(a.body["stop_reason"], "end_turn");
        assert!(a.body["id"].as_str().unwrap().starts_with("msg_01"));
        assert_eq!(a.body["usage"]["cache_read_input_tokens"], 0);
        let b = anthropic_message(&params("again"), &mut c).unwrap();
        let read = b.body["usage"]["cache_read_input_tokens"].as_u64().unwrap();
        assert!(read > 0);
        assert_eq!(b.body["usage"]["input_tokens"].as_u64().unwrap() + read, b.input_tokens);

        let mut schema = params("json please");
        schema["output_format"] = json!({"type": "json_schema", "schema": {"type": "object", "properties": {"k": {"type": "boolean"}}, "required": ["k"]}});
        let s = anthropic_message(&schema, &mut c).unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(s.body["content"][0]["text"].as_str().unwrap()).unwrap(),
            json!({"k": true})
        );

        for (bad, msg) in [
            (
                json!({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}),
                "model: Field required",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
                "max_tokens: Field required",
            ),
            (
                json!({"model": "m", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}),
                "max_tokens: Input should be greater than or equal to 1",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": []}),
                "messages: at least one message is required",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": [{"role": "bot", "content": "x"}]}),
                "messages.0.role: Input should be 'user' or 'assistant'",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "stream": true, "messages": [{"role": "user", "content": "x"}]}),
                "stream: Streaming is not supported in the Message Batches API.",
            ),
            (json!([1]), "params: Input should be a valid dictionary"),
        ] {
            assert_eq!(anthropic_message(&bad, &mut c).unwrap_err().message, msg);
        }
        assert_eq!(base62(&[b"a"], 22).len(), 22);
    }

    #[test]
    fn request_token_estimates() {
        let body =
            json!({"model": "m", "messages": [{"role": "user", "content": "x".repeat(400)}]});
        assert_eq!(request_tokens("/v1/chat/completions", &body), 100);
        assert_eq!(request_tokens("/chat/completions", &body), 100);
        assert_eq!(request_tokens("/v1/embeddings", &json!({"input": ["abcd", "efgh"]})), 2);
    }
}
