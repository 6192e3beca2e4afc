//! The deterministic fake model: answers a request body for an OpenAI endpoint with a response
//! body of the right shape, the same answer for the same request every time.
//!
//! Content is a short sentence carrying a hash of the request; under structured output
//! (`response_format` / `text.format` / Anthropic `output_format` of type `json_schema`) it is a
//! JSON instance of the schema. Input and output tokens are counted with the provider's kind of
//! tokenizer by the convention of `tokens`; cached tokens follow the provider's caching rules
//! (`cache`): automatic for OpenAI and Azure chat and Responses prompts of 1,024 tokens or more,
//! only at `cache_control` breakpoints for Anthropic. Reasoning tokens are always 0 (the model
//! does not reason). A line fault can corrupt the answer (invalid JSON, or JSON that violates the
//! schema) while the request still succeeds and is billed.

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use crate::cache::{self, PrefixSink, PromptCache};
use crate::schema;
use crate::tokens::{self, Counter, Encoding};

/// The tokens one request was billed for, by kind (or their sum over a batch).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TokenUsage {
    /// Every billed input token: uncached, read from the cache, and written to it.
    pub input_tokens: u64,
    /// The part of `input_tokens` read from the prompt cache.
    pub cached_tokens: u64,
    /// The part of `input_tokens` written to a 5-minute cache entry (Anthropic).
    pub cache_write_5m_tokens: u64,
    /// The part of `input_tokens` written to a 1-hour cache entry (Anthropic).
    pub cache_write_1h_tokens: u64,
    pub output_tokens: u64,
    /// The part of `output_tokens` spent reasoning.
    pub reasoning_tokens: u64,
}

impl TokenUsage {
    pub(crate) fn add(&mut self, other: &Self) {
        self.input_tokens += other.input_tokens;
        self.cached_tokens += other.cached_tokens;
        self.cache_write_5m_tokens += other.cache_write_5m_tokens;
        self.cache_write_1h_tokens += other.cache_write_1h_tokens;
        self.output_tokens += other.output_tokens;
        self.reasoning_tokens += other.reasoning_tokens;
    }
}

/// A successful answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ModelOutput {
    pub body: Value,
    /// The model the response names.
    pub model: String,
    pub usage: TokenUsage,
}

/// How a line fault spoils an otherwise successful answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Corruption {
    /// The answer text is not parseable JSON.
    InvalidJson,
    /// The answer is JSON that does not fit the requested schema.
    SchemaViolation,
}

/// What one run may use besides the request: the virtual time, a nonce for ids, the answer
/// corruption to apply, and the prompt cache of the simulator.
#[derive(Debug)]
pub(crate) struct RunContext<'a> {
    /// Virtual unix seconds the request runs at (what the wire shows).
    pub created: i64,
    /// The same instant, fractional (the cache's clock).
    pub now: f64,
    pub nonce: &'a str,
    pub corruption: Option<Corruption>,
    /// Provider name: caches are per provider.
    pub scope: &'a str,
    pub cache: &'a mut PromptCache,
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

/// Cuts `text` to a token budget; returns its output tokens and whether it was cut.
fn limit_output(encoding: Encoding, text: &mut String, max_tokens: Option<u64>) -> (u64, bool) {
    let tokens = encoding.encode(text);
    let n = u64::try_from(tokens.len()).unwrap_or(u64::MAX);
    match max_tokens.and_then(|max| usize::try_from(max).ok()) {
        Some(max) if tokens.len() > max => {
            *text = encoding.decode_prefix(&tokens, max);
            (n.min(u64::try_from(max).unwrap_or(u64::MAX)), true)
        }
        _ => (n, false),
    }
}

/// The usage of an OpenAI-shaped answer: all input (cached included), the cached part, output.
fn openai_usage(input_tokens: u64, cached_tokens: u64, output_tokens: u64) -> TokenUsage {
    TokenUsage { input_tokens, cached_tokens, output_tokens, ..TokenUsage::default() }
}

/// Counts a chat or Responses prompt and looks its prefixes up in the cache: (input, cached).
fn cached_prompt(
    ctx: &mut RunContext<'_>,
    model: &str,
    fill: impl FnOnce(&mut PrefixSink),
) -> (u64, u64) {
    let mut sink = PrefixSink::new(Encoding::for_openai_model(model), ctx.scope, model);
    fill(&mut sink);
    let cached = ctx.cache.openai(&sink, ctx.now);
    (sink.total, cached)
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
    let encoding = Encoding::for_openai_model(model);
    let (output_tokens, cut) = limit_output(encoding, &mut content, max);
    let (input_tokens, cached_tokens) = cached_prompt(ctx, model, |sink| tokens::chat(sink, obj));
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
    let usage = openai_usage(input_tokens, cached_tokens, output_tokens);
    Ok(ModelOutput { body, model: model.to_owned(), usage })
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
    for (index, input) in inputs.iter().enumerate() {
        let key = match input {
            EmbeddingInput::Text(s) => (*s).to_owned(),
            EmbeddingInput::Tokens(t) => Value::Array(t.to_vec()).to_string(),
        };
        let vector = embedding_vector(&format!("{model}\u{0}{key}"), dims);
        let embedding = if base64 {
            let bytes: Vec<u8> = vector.iter().flat_map(|f| f.to_le_bytes()).collect();
            Value::String(base64_encode(&bytes))
        } else {
            json!(vector)
        };
        data.push(json!({"object": "embedding", "index": index, "embedding": embedding}));
    }
    let mut counter = Counter::new(Encoding::for_openai_model(model));
    tokens::plain_inputs(&mut counter, obj.get("input"));
    let tokens = counter.total;
    let body = json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    });
    Ok(ModelOutput { body, model: model.to_owned(), usage: openai_usage(tokens, 0, 0) })
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
    let max = obj.get("max_output_tokens").and_then(Value::as_u64);
    let (output_tokens, cut) = limit_output(Encoding::for_openai_model(model), &mut text, max);
    let (input_tokens, cached_tokens) =
        cached_prompt(ctx, model, |sink| tokens::responses(sink, obj));
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
    let usage = openai_usage(input_tokens, cached_tokens, output_tokens);
    Ok(ModelOutput { body, model: model.to_owned(), usage })
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
    let encoding = Encoding::for_openai_model(model);
    let max = obj.get("max_tokens").and_then(Value::as_u64);
    let (output_tokens, cut) = limit_output(encoding, &mut text, max);
    let mut counter = Counter::new(encoding);
    tokens::plain_inputs(&mut counter, obj.get("prompt"));
    let input_tokens = counter.total;
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
    let usage = openai_usage(input_tokens, 0, output_tokens);
    Ok(ModelOutput { body, model: model.to_owned(), usage })
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
    let model = obj.get("model").and_then(Value::as_str).unwrap_or("omni-moderation-latest");
    let mut counter = Counter::new(Encoding::for_openai_model(model));
    tokens::plain_inputs(&mut counter, Some(input));
    let body = json!({
        "id": format!("modr-{}", digest_hex(&[nonce.as_bytes()], 12)),
        "model": model,
        "results": vec![result; count],
    });
    Ok(ModelOutput { body, model: model.to_owned(), usage: openai_usage(counter.total, 0, 0) })
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
    let marks = cache::anthropic_marks(obj, ctx.scope, model)
        .map_err(|message| ModelRejection::new(message, None))?;
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
    let max = obj.get("max_tokens").and_then(Value::as_u64);
    let (output_tokens, cut) = limit_output(Encoding::anthropic(), &mut text, max);
    let count = tokens::anthropic(obj);
    let breakpoints = cache::breakpoints(&marks, &count.marks);
    let cached = ctx.cache.anthropic(model, &breakpoints, ctx.now);
    let written = cached.write_5m + cached.write_1h;
    let uncached = count.total.saturating_sub(cached.read + written);
    let body = json!({
        "id": format!("msg_01{}", base62(&[ctx.nonce.as_bytes()], 22)),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": if cut { "max_tokens" } else { "end_turn" },
        "stop_sequence": null,
        "usage": {
            // Anthropic counts cache reads and writes apart from `input_tokens`.
            "input_tokens": uncached,
            "cache_creation_input_tokens": written,
            "cache_read_input_tokens": cached.read,
            "cache_creation": {
                "ephemeral_5m_input_tokens": cached.write_5m,
                "ephemeral_1h_input_tokens": cached.write_1h,
            },
            "output_tokens": output_tokens,
            "service_tier": "batch",
        },
    });
    let usage = TokenUsage {
        input_tokens: uncached + written + cached.read,
        cached_tokens: cached.read,
        cache_write_5m_tokens: cached.write_5m,
        cache_write_1h_tokens: cached.write_1h,
        output_tokens,
        reasoning_tokens: 0,
    };
    Ok(ModelOutput { body, model: model.to_owned(), usage })
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
        RunContext { created: 100, now: 100.0, nonce: "n1", corruption, scope: "openai", cache }
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
        let usage = a.usage;
        assert_eq!(
            a.body["usage"]["total_tokens"].as_u64().unwrap(),
            usage.input_tokens + usage.output_tokens
        );
        assert_eq!(
            usage.input_tokens,
            tokens::request_tokens("/v1/chat/completions", &chat_body("Classify this ticket"))
        );
        let text = a.body["choices"][0]["message"]["content"].as_str().unwrap();
        assert_eq!(usage.output_tokens, Encoding::O200kBase.count(text));
        assert_eq!(a.model, "gpt-4o-mini");
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
        assert_eq!(out.usage.output_tokens, 2);
        let text = out.body["choices"][0]["message"]["content"].as_str().unwrap();
        assert_eq!(Encoding::O200kBase.count(text), 2, "{text}");
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
    fn long_repeated_prompts_are_cached_in_steps() {
        let mut cache = PromptCache::default();
        let system = "You label support tickets into shipping, billing or other categories. ";
        let body = |q: &str, repeat: usize| {
            json!({"model": "gpt-4o-mini", "messages": [
                {"role": "system", "content": system.repeat(repeat)},
                {"role": "user", "content": q}]})
        };
        let run_at = |cache: &mut PromptCache, body: &Value, now: f64| {
            let mut c = ctx(cache, None);
            c.now = now;
            run("/v1/chat/completions", body, &mut c).unwrap().usage
        };
        // Under 1,024 tokens: never cached, however often it repeats.
        assert!(tokens::request_tokens("/v1/chat/completions", &body("a", 60)) < 1_024);
        for _ in 0..3 {
            assert_eq!(run_at(&mut cache, &body("a", 60), 1.0).cached_tokens, 0);
        }
        let first = run_at(&mut cache, &body("a", 120), 2.0);
        assert!(first.input_tokens > 1_300, "{first:?}");
        assert_eq!(first.cached_tokens, 0);
        let second = run_at(&mut cache, &body("b", 120), 3.0);
        assert!(second.cached_tokens >= 1_024, "{second:?}");
        assert_eq!(second.cached_tokens % 128, 0);
        assert!(second.cached_tokens < second.input_tokens);
        // Another model has its own cache; an hour later the prefix is gone.
        let mut other = body("c", 120);
        other["model"] = json!("gpt-4.1");
        assert_eq!(run_at(&mut cache, &other, 4.0).cached_tokens, 0);
        assert_eq!(run_at(&mut cache, &body("d", 120), 3.0 + 3_601.0).cached_tokens, 0);
        // Responses prompts are cached too, reported as `input_tokens_details`.
        let responses =
            |q: &str| json!({"model": "gpt-5", "instructions": system.repeat(120), "input": q});
        let mut c = ctx(&mut cache, None);
        run("/v1/responses", &responses("x"), &mut c).unwrap();
        let out = run("/v1/responses", &responses("y"), &mut c).unwrap();
        assert!(out.usage.cached_tokens >= 1_024);
        assert_eq!(
            out.body["usage"]["input_tokens_details"]["cached_tokens"],
            out.usage.cached_tokens
        );
        assert_eq!(out.body["usage"]["output_tokens_details"]["reasoning_tokens"], 0);
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
            now: 1.0,
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
        // No `cache_control`: never cached, even repeated.
        let b = anthropic_message(&params("hello"), &mut c).unwrap();
        for out in [&a, &b] {
            assert_eq!(out.body["usage"]["cache_read_input_tokens"], 0);
            assert_eq!(out.body["usage"]["cache_creation_input_tokens"], 0);
            assert_eq!(out.body["usage"]["input_tokens"].as_u64().unwrap(), out.usage.input_tokens);
        }
        assert_eq!(
            a.usage.input_tokens,
            tokens::anthropic(params("hello").as_object().unwrap()).total
        );

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
    fn anthropic_caches_only_at_breakpoints() {
        let mut cache = PromptCache::default();
        let doc = "Shipping policy: parcels leave within two days of the order. ".repeat(120);
        let params = |ttl: Option<&str>, q: &str| {
            let mut cc = json!({"type": "ephemeral"});
            if let Some(ttl) = ttl {
                cc["ttl"] = json!(ttl);
            }
            json!({"model": "claude-sonnet-4-5", "max_tokens": 64,
                   "system": [{"type": "text", "text": doc, "cache_control": cc}],
                   "messages": [{"role": "user", "content": q}]})
        };
        let mut c = RunContext {
            created: 1,
            now: 1.0,
            nonce: "x",
            corruption: None,
            scope: "anthropic",
            cache: &mut cache,
        };
        let first = anthropic_message(&params(None, "q1"), &mut c).unwrap();
        let u = &first.body["usage"];
        let written = u["cache_creation_input_tokens"].as_u64().unwrap();
        assert!(written > 1_024, "{u}");
        assert_eq!(u["cache_read_input_tokens"], 0);
        assert_eq!(u["cache_creation"]["ephemeral_5m_input_tokens"], written);
        assert_eq!(u["cache_creation"]["ephemeral_1h_input_tokens"], 0);
        let total = tokens::anthropic(params(None, "q1").as_object().unwrap()).total;
        assert_eq!(u["input_tokens"].as_u64().unwrap() + written, total);
        assert_eq!(first.usage.input_tokens, total);
        assert_eq!(first.usage.cache_write_5m_tokens, written);

        let second = anthropic_message(&params(Some("1h"), "q2"), &mut c).unwrap();
        let u = &second.body["usage"];
        assert_eq!(u["cache_read_input_tokens"], written, "the TTL is not part of the key");
        assert_eq!(u["cache_creation_input_tokens"], 0);
        assert_eq!(second.usage.cached_tokens, written);

        // Haiku 4.5 needs 4,096 tokens: nothing cached, no error.
        let mut haiku = params(None, "q3");
        haiku["model"] = json!("claude-haiku-4-5");
        for _ in 0..2 {
            let out = anthropic_message(&haiku, &mut c).unwrap();
            assert_eq!(out.usage.cached_tokens + out.usage.cache_write_5m_tokens, 0);
        }
        let mut five = params(None, "q4");
        five["messages"][0]["content"] = json!(vec![
            json!({"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}});
            4
        ]);
        assert_eq!(
            anthropic_message(&five, &mut c).unwrap_err().message,
            "A maximum of 4 blocks with cache_control may be provided. Found 5."
        );
    }
}
