//! Token counts of request bodies and answers, in the provider's kind of tokens, by one fixed
//! convention.
//!
//! Tokenizers (`tiktoken-rs`, whose data ships in the crate; each encoding is built once, lazily,
//! and shared read-only): OpenAI and Azure use `o200k_base` for the gpt-4o, gpt-4.1, gpt-5, o1,
//! o3 and o4 families and for any model not named below, and `cl100k_base` for gpt-4 (not 4o or
//! 4.1), gpt-3.5 and `text-embedding-*` (an `ft:` prefix is ignored). Anthropic publishes no
//! tokenizer: `cl100k_base` stands in for it, so Anthropic counts are of the right size, not
//! Claude's exact numbers.
//!
//! `tokens(s)` below is the number of tokens of the string `s` (ordinary encoding: special-token
//! text counts as plain text). The text of a `content` is the string itself, or the concatenation
//! (no separator) of the `text` of every part of type `text` of an array (Responses input also
//! `input_text` and `output_text`); anything else has no text.
//!
//! - Chat completions: `3 + Σ over messages (3 + tokens(role) + tokens(text of content) +
//!   (if "name": tokens(name) + 1))`, plus, if `tools` is present, `tokens` of its compact JSON
//!   (`serde_json::to_string`).
//! - Responses: `instructions` counts as a message with role `system`; a string `input` is one
//!   `user` message; an array `input` is counted item by item, an item with `role` and `content`
//!   as a message, any other item as `tokens` of its compact JSON; `tools` as in chat; plus 3.
//! - Completions: `tokens(prompt)`, or the sum over an array of strings (a token array counts its
//!   length). Embeddings and moderations: `tokens(input)`, or the sum over an array of strings
//!   (token arrays count their length; moderation parts of type `text` count their text), no
//!   overhead.
//! - Anthropic messages: `system` (a string or text blocks), when present, counts as a message
//!   with role `system`; `messages` as in chat; `tools` as in chat; plus 3.
//! - Output: `tokens` of the answer text the model produced (for JSON answers, of the JSON text);
//!   an answer cut at the request's token limit counts exactly that limit. Reasoning: always 0.
//!
//! The prompt token sequence (what the prompt cache keys on) is in cache order: `tools` first,
//! then the system prompt or instructions, then the messages or input items, then the 3 priming
//! tokens. A message is `<start> role <sep> text [<name> name] <end>`, where the bracketed
//! markers are the fixed per-message tokens of the convention.

use std::borrow::Cow;

use serde_json::{Map, Value};
use tiktoken_rs::CoreBPE;

/// The tokens that prime the answer (`<|start|>assistant<|message|>`), counted once a request.
const PRIMING: u64 = 3;

/// A tokenizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Encoding {
    O200kBase,
    Cl100kBase,
}

impl Encoding {
    /// The encoding of an OpenAI (or Azure deployment) model name.
    pub(crate) fn for_openai_model(model: &str) -> Self {
        let m = model.strip_prefix("ft:").unwrap_or(model);
        let newer = ["gpt-4o", "gpt-4.1"].iter().any(|p| m.starts_with(p));
        let older = ["gpt-4", "gpt-3.5", "text-embedding-"].iter().any(|p| m.starts_with(p));
        if older && !newer { Self::Cl100kBase } else { Self::O200kBase }
    }

    /// The stand-in for Anthropic's unpublished tokenizer.
    pub(crate) fn anthropic() -> Self {
        Self::Cl100kBase
    }

    fn bpe(self) -> &'static CoreBPE {
        match self {
            Self::O200kBase => tiktoken_rs::o200k_base_singleton(),
            Self::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
        }
    }

    /// The tokens of `text`.
    pub(crate) fn encode(self, text: &str) -> Vec<u32> {
        if text.is_empty() {
            return Vec::new();
        }
        self.bpe().encode_ordinary(text)
    }

    /// How many tokens `text` has.
    pub(crate) fn count(self, text: &str) -> u64 {
        len_u64(self.encode(text).len())
    }

    /// How many tokens `text` has, and for each byte offset of `offsets` (ascending) how many of
    /// them start before it: the tokens it takes to reach that offset.
    pub(crate) fn count_up_to(self, text: &str, offsets: &[usize]) -> (u64, Vec<u64>) {
        let tokens = self.encode(text);
        let total = len_u64(tokens.len());
        if offsets.is_empty() {
            return (total, Vec::new());
        }
        let mut reached = Vec::with_capacity(offsets.len());
        let mut wanted = offsets.iter().peekable();
        let (mut start, mut before) = (0usize, 0u64);
        for piece in self.bpe()._decode_native_and_split(tokens) {
            while wanted.next_if(|o| **o <= start).is_some() {
                reached.push(before);
            }
            start += piece.len();
            before += 1;
        }
        reached.extend(wanted.map(|_| total));
        (total, reached)
    }

    /// The text of the first `n` tokens of `tokens` (an invalid UTF-8 tail becomes U+FFFD).
    pub(crate) fn decode_prefix(self, tokens: &[u32], n: usize) -> String {
        let head = tokens.get(..n).unwrap_or(tokens);
        match self.bpe().decode_bytes(head) {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(_) => String::new(),
        }
    }
}

fn len_u64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// The fixed tokens of the convention, told apart so that the token sequence is unambiguous.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Marker {
    Start = 1,
    Sep = 2,
    Name = 3,
    End = 4,
    Priming = 5,
}

/// Where the tokens of a prompt go, in sequence order: a counter, or the prompt cache's hasher.
pub(crate) trait TokenSink {
    /// The ordinary tokens of a string.
    fn text(&mut self, text: &str);
    /// The tokens of a value's compact JSON (`serde_json::to_string`).
    fn json(&mut self, value: &Value) {
        self.text(&value.to_string());
    }
    /// One fixed token of the convention.
    fn marker(&mut self, marker: Marker);
}

/// A sink that only counts.
#[derive(Debug)]
pub(crate) struct Counter {
    pub encoding: Encoding,
    pub total: u64,
}

impl Counter {
    pub(crate) fn new(encoding: Encoding) -> Self {
        Self { encoding, total: 0 }
    }
}

impl TokenSink for Counter {
    fn text(&mut self, text: &str) {
        self.total += self.encoding.count(text);
    }

    fn marker(&mut self, _marker: Marker) {
        self.total += 1;
    }
}

/// The text of a `content`: the string, or the `text` of its parts of the given types.
pub(crate) fn content_text<'a>(content: Option<&'a Value>, part_types: &[&str]) -> Cow<'a, str> {
    match content {
        Some(Value::String(s)) => Cow::Borrowed(s),
        Some(Value::Array(parts)) => {
            let mut texts = parts.iter().filter_map(|p| part_text(p, part_types));
            match (texts.next(), texts.next()) {
                (None, _) => Cow::Borrowed(""),
                (Some(only), None) => Cow::Borrowed(only),
                (Some(first), Some(second)) => {
                    let mut s = String::from(first);
                    s.push_str(second);
                    texts.for_each(|t| s.push_str(t));
                    Cow::Owned(s)
                }
            }
        }
        _ => Cow::Borrowed(""),
    }
}

/// The `text` of a part whose `type` is one of `part_types`.
pub(crate) fn part_text<'a>(part: &'a Value, part_types: &[&str]) -> Option<&'a str> {
    let kind = part.get("type").and_then(Value::as_str)?;
    part_types.contains(&kind).then(|| part.get("text").and_then(Value::as_str)).flatten()
}

/// One message: `<start> role <sep> text [<name> name] <end>`.
pub(crate) fn message(sink: &mut impl TokenSink, role: &str, text: &str, name: Option<&str>) {
    sink.marker(Marker::Start);
    sink.text(role);
    sink.marker(Marker::Sep);
    sink.text(text);
    if let Some(name) = name {
        sink.marker(Marker::Name);
        sink.text(name);
    }
    sink.marker(Marker::End);
}

/// The priming tokens that end every chat-shaped prompt.
pub(crate) fn priming(sink: &mut impl TokenSink) {
    for _ in 0..PRIMING {
        sink.marker(Marker::Priming);
    }
}

fn tools(sink: &mut impl TokenSink, obj: &Map<String, Value>) {
    if let Some(tools) = obj.get("tools") {
        sink.json(tools);
    }
}

/// A chat completions body (`messages` already checked to be an array of objects with a role).
pub(crate) fn chat(sink: &mut impl TokenSink, obj: &Map<String, Value>) {
    tools(sink, obj);
    for m in obj.get("messages").and_then(Value::as_array).into_iter().flatten() {
        let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
        let text = content_text(m.get("content"), &["text"]);
        message(sink, role, &text, m.get("name").and_then(Value::as_str));
    }
    priming(sink);
}

/// A Responses API body.
pub(crate) fn responses(sink: &mut impl TokenSink, obj: &Map<String, Value>) {
    tools(sink, obj);
    if let Some(instructions) = obj.get("instructions").and_then(Value::as_str) {
        message(sink, "system", instructions, None);
    }
    match obj.get("input") {
        Some(Value::String(s)) => message(sink, "user", s, None),
        Some(Value::Array(items)) => {
            for item in items {
                match (item.get("role").and_then(Value::as_str), item.get("content")) {
                    (Some(role), Some(content)) => {
                        let text =
                            content_text(Some(content), &["text", "input_text", "output_text"]);
                        message(sink, role, &text, None);
                    }
                    _ => sink.json(item),
                }
            }
        }
        _ => {}
    }
    priming(sink);
}

/// Strings (and token arrays) of a `prompt` or `input`, no overhead; moderation parts of type
/// `text` count their text.
pub(crate) fn plain_inputs(sink: &mut Counter, value: Option<&Value>) {
    match value {
        Some(Value::String(s)) => sink.text(s),
        Some(Value::Array(items)) if items.iter().all(Value::is_number) => {
            sink.total += len_u64(items.len());
        }
        Some(Value::Array(items)) => {
            for item in items {
                match item {
                    Value::String(s) => sink.text(s),
                    Value::Array(ids) => sink.total += len_u64(ids.len()),
                    part => {
                        if let Some(text) = part_text(part, &["text"]) {
                            sink.text(text);
                        }
                    }
                }
            }
        }
        _ => {}
    }
}

/// Whether an Anthropic block (a tool, a system block, a content block) carries `cache_control`.
pub(crate) fn marked(block: &Value) -> bool {
    block.get("cache_control").is_some_and(|c| !c.is_null())
}

/// An Anthropic request's input tokens, and for each block that carries `cache_control` (in
/// cache order: tools, system, messages) the tokens up to and including it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AnthropicCount {
    pub total: u64,
    pub marks: Vec<u64>,
}

/// An Anthropic Messages request (`params`).
pub(crate) fn anthropic(obj: &Map<String, Value>) -> AnthropicCount {
    let mut counter = Counter::new(Encoding::anthropic());
    let mut marks = Vec::new();
    if let Some(tools) = obj.get("tools") {
        let json = tools.to_string();
        // Byte offsets of the end of each marked entry in `[e0,e1,...]`.
        let mut offsets = Vec::new();
        let entries = tools.as_array().map(Vec::as_slice).unwrap_or_default();
        if entries.iter().any(marked) {
            let mut end = 1;
            for (i, entry) in entries.iter().enumerate() {
                end += usize::from(i > 0) + entry.to_string().len();
                if marked(entry) {
                    offsets.push(end);
                }
            }
        }
        let (n, reached) = counter.encoding.count_up_to(&json, &offsets);
        marks.extend(reached.iter().map(|r| counter.total + r));
        counter.total += n;
    }
    match obj.get("system") {
        Some(Value::String(s)) => message(&mut counter, "system", s, None),
        Some(system) => blocks_message(&mut counter, &mut marks, "system", Some(system)),
        None => {}
    }
    for m in obj.get("messages").and_then(Value::as_array).into_iter().flatten() {
        let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
        blocks_message(&mut counter, &mut marks, role, m.get("content"));
    }
    priming(&mut counter);
    AnthropicCount { total: counter.total, marks }
}

/// One Anthropic message (or the system prompt) whose content may have marked blocks: a marked
/// block reaches the end of its text, and the message's `<end>` if it is the last block.
fn blocks_message(
    counter: &mut Counter,
    marks: &mut Vec<u64>,
    role: &str,
    content: Option<&Value>,
) {
    let blocks = match content {
        Some(Value::Array(blocks)) if blocks.iter().any(marked) => blocks,
        _ => {
            let text = content_text(content, &["text"]);
            return message(counter, role, &text, None);
        }
    };
    let mut text = String::new();
    let mut offsets = Vec::new();
    let mut closes = Vec::new();
    for (i, block) in blocks.iter().enumerate() {
        if let Some(t) = part_text(block, &["text"]) {
            text.push_str(t);
        }
        if marked(block) {
            offsets.push(text.len());
            closes.push(u64::from(i + 1 == blocks.len()));
        }
    }
    // `<start> role <sep>`, the text, `<end>`.
    let head = 2 + counter.encoding.count(role);
    let (n, reached) = counter.encoding.count_up_to(&text, &offsets);
    marks.extend(reached.iter().zip(&closes).map(|(r, close)| counter.total + head + r + close));
    counter.total += head + n + 1;
}

/// Prompt tokens of an OpenAI-shaped request body for `endpoint` (with or without `/v1`); 0 for
/// an endpoint the simulator does not serve or a body that is not an object.
pub(crate) fn request_tokens(endpoint: &str, body: &Value) -> u64 {
    let Some(obj) = body.as_object() else {
        return 0;
    };
    let model = obj.get("model").and_then(Value::as_str).unwrap_or_default();
    let mut counter = Counter::new(Encoding::for_openai_model(model));
    match endpoint.trim_start_matches("/v1") {
        "/chat/completions" => chat(&mut counter, obj),
        "/responses" => responses(&mut counter, obj),
        "/completions" => plain_inputs(&mut counter, obj.get("prompt")),
        "/embeddings" | "/moderations" => plain_inputs(&mut counter, obj.get("input")),
        _ => {}
    }
    counter.total
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn o200k(s: &str) -> u64 {
        Encoding::O200kBase.count(s)
    }

    #[test]
    fn encodings_follow_the_model_family() {
        for m in ["gpt-4o-mini", "gpt-4.1-nano", "gpt-5", "o1-mini", "o3", "o4-mini", "x", ""] {
            assert_eq!(Encoding::for_openai_model(m), Encoding::O200kBase, "{m}");
        }
        for m in ["gpt-4", "gpt-4-turbo", "gpt-3.5-turbo", "text-embedding-3-small", "ft:gpt-4-x"] {
            assert_eq!(Encoding::for_openai_model(m), Encoding::Cl100kBase, "{m}");
        }
        // The two encodings differ: the check is not vacuous.
        let text = "Tokenizers differ: こんにちは世界, naïve café.";
        assert_ne!(Encoding::O200kBase.encode(text), Encoding::Cl100kBase.encode(text));
    }

    #[test]
    fn chat_follows_the_convention() {
        let body = json!({"model": "gpt-4o", "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "name": "ann", "content": [
                {"type": "text", "text": "Hello "}, {"type": "image_url", "image_url": {"url": "x"}},
                {"type": "text", "text": "there"}]},
            {"role": "assistant", "content": null}],
            "tools": [{"type": "function", "function": {"name": "f"}}]});
        let expected = 3
            + (3 + o200k("system") + o200k("Be brief."))
            + (3 + o200k("user") + o200k("Hello there") + o200k("ann") + 1)
            + (3 + o200k("assistant"))
            + o200k(&serde_json::to_string(&body["tools"]).unwrap());
        assert_eq!(request_tokens("/v1/chat/completions", &body), expected);
        assert_eq!(request_tokens("/chat/completions", &body), expected);
    }

    #[test]
    fn responses_completions_and_embeddings_follow_the_convention() {
        let body = json!({"model": "gpt-4.1", "instructions": "Sys", "input": "Hi there"});
        assert_eq!(
            request_tokens("/v1/responses", &body),
            3 + (3 + o200k("system") + o200k("Sys")) + (3 + o200k("user") + o200k("Hi there"))
        );
        let item = json!({"type": "function_call_output", "call_id": "c1", "output": "42"});
        let body = json!({"model": "gpt-5", "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Q"}]}, item]});
        assert_eq!(
            request_tokens("/v1/responses", &body),
            3 + (3 + o200k("user") + o200k("Q")) + o200k(&item.to_string())
        );
        let cl = |s| Encoding::Cl100kBase.count(s);
        assert_eq!(
            request_tokens(
                "/v1/embeddings",
                &json!({"model": "text-embedding-3-small", "input": ["abcd", "efgh"]})
            ),
            cl("abcd") + cl("efgh")
        );
        assert_eq!(request_tokens("/v1/embeddings", &json!({"input": [[1, 2, 3], [4]]})), 4);
        assert_eq!(
            request_tokens("/v1/completions", &json!({"model": "m", "prompt": "Say this"})),
            o200k("Say this")
        );
        assert_eq!(request_tokens("/v1/moderations", &json!({"input": "bad"})), o200k("bad"));
        assert_eq!(request_tokens("/v1/unknown", &json!({"input": "x"})), 0);
        assert_eq!(request_tokens("/v1/chat/completions", &json!([1])), 0);
    }

    #[test]
    fn anthropic_follows_the_convention_and_places_breakpoints() {
        let cl = |s: &str| Encoding::Cl100kBase.count(s);
        let cc = json!({"type": "ephemeral"});
        let tools = json!([{"name": "a", "input_schema": {}}, {"name": "b", "cache_control": cc, "input_schema": {}}]);
        let body = json!({"model": "claude-sonnet-4-5", "tools": tools,
            "system": [{"type": "text", "text": "You are terse."}, {"type": "text", "text": " Rules.", "cache_control": cc}],
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "Doc", "cache_control": cc}, {"type": "text", "text": " Question?"}]}]});
        let count = anthropic(body.as_object().unwrap());
        let tools_n = cl(&serde_json::to_string(&tools).unwrap());
        let system = 3 + cl("system") + cl("You are terse. Rules.");
        let user = 3 + cl("user") + cl("Doc Question?");
        assert_eq!(count.total, tools_n + system + user + 3);
        assert_eq!(count.marks.len(), 3);
        // The last tool ends just before the closing bracket.
        assert!((tools_n - 1..=tools_n).contains(&count.marks[0]), "{count:?}");
        // The last system block closes the system message.
        assert_eq!(count.marks[1], tools_n + system);
        assert_eq!(count.marks[2], tools_n + system + 2 + cl("user") + cl("Doc"));
        // A string system prompt and unmarked content count the same way, without marks.
        let plain =
            json!({"system": "You are terse.", "messages": [{"role": "user", "content": "Hi"}]});
        let count = anthropic(plain.as_object().unwrap());
        assert_eq!(
            count.total,
            3 + (3 + cl("system") + cl("You are terse.")) + (3 + cl("user") + cl("Hi"))
        );
        assert!(count.marks.is_empty());
    }

    #[test]
    fn offsets_map_to_the_tokens_that_reach_them() {
        let enc = Encoding::Cl100kBase;
        let text = "alpha beta gamma delta";
        let tokens = enc.encode(text);
        let (total, reached) = enc.count_up_to(text, &[0, 5, 10, text.len(), text.len() + 9]);
        assert_eq!(total, tokens.len() as u64);
        assert_eq!(reached[0], 0);
        assert_eq!(reached[1], enc.count("alpha"));
        assert_eq!(reached[2], enc.count("alpha beta"));
        assert_eq!(reached[3], total);
        assert_eq!(reached[4], total);
        assert_eq!(enc.decode_prefix(&tokens, 2), "alpha beta");
        assert_eq!(enc.decode_prefix(&tokens, 99), text);
    }

    #[test]
    fn long_and_odd_inputs_tokenize_quickly() {
        let start = std::time::Instant::now();
        for text in ["x".repeat(200_000), " ".repeat(200_000), "\u{1F600}".repeat(20_000)] {
            assert!(Encoding::O200kBase.count(&text) > 0);
            assert!(Encoding::Cl100kBase.count(&text) > 0);
        }
        let body = "Summarize the ticket and classify it by urgency. ".repeat(20);
        for _ in 0..2_000 {
            assert!(o200k(&body) > 100);
        }
        assert!(start.elapsed().as_secs() < 20, "{:?}", start.elapsed());
    }
}
