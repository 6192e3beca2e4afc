//! Input tokens of one request body, counted offline with OpenAI's tokenizers, by a fixed
//! convention that the simulator counts by too.
//!
//! The convention, `tokens(s)` being the tokenizer's count of `s` as ordinary text:
//! - chat completions: `3 + Σ messages (3 + tokens(role) + tokens(text) [+ tokens(name) + 1])`,
//!   plus `tokens` of the compact JSON of `tools` when present. A message's text is its `content`
//!   string, or the concatenation of the `text` of its `text` parts.
//! - responses: `instructions` as a `system` message; `input` as a string is one `user` message,
//!   as an array each item with a `role` or `content` is a message and any other item counts the
//!   tokens of its compact JSON; `tools` as in chat; plus 3. Content parts of type `input_text`
//!   and `output_text` count as `text` parts, since that is how this API types its text.
//! - completions: the `prompt` string, or each string of its array (a token array counts its
//!   length). Embeddings and moderations: the `input` likewise. No overhead.
//! - Anthropic messages: `system` (a string or text blocks) as a `system` message when present,
//!   `messages` and `tools` as in chat, plus 3.
//!
//! Compact JSON is `serde_json::to_string` (object keys in name order, serde_json's default map).
//!
//! The encoding: `o200k_base` for GPT-4o, GPT-4.1, GPT-4.5, GPT-5 and the o1/o3/o4 families and
//! for any model not recognised; `cl100k_base` for GPT-4 and GPT-3.5 and `text-embedding-*`.
//! Anthropic publishes no tokenizer, so `cl100k_base` stands in for Claude: an approximation,
//! real Claude counts differ (newer Claude tokenizers produce noticeably more tokens).

use std::sync::LazyLock;

use serde_json::Value;
use tiktoken_rs::CoreBPE;

use crate::{Endpoint, ProviderKind};

/// A tokenizer the counter uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoding {
    /// GPT-4o and later.
    O200kBase,
    /// GPT-4, GPT-3.5, `text-embedding-*`, and the stand-in for Claude.
    Cl100kBase,
}

// Built once each, the first time a count needs it. The vocabularies ship inside tiktoken-rs, so
// building cannot fail in practice; were it ever to, counts fall back to one token per 4 bytes.
static O200K: LazyLock<Option<CoreBPE>> = LazyLock::new(|| tiktoken_rs::o200k_base().ok());
static CL100K: LazyLock<Option<CoreBPE>> = LazyLock::new(|| tiktoken_rs::cl100k_base().ok());

impl Encoding {
    /// The encoding for `model` at `provider`.
    pub fn for_model(provider: ProviderKind, model: &str) -> Encoding {
        if provider == ProviderKind::Anthropic {
            return Encoding::Cl100kBase;
        }
        // A fine-tuned model (`ft:gpt-4o-mini-2024-07-18:org::id`) counts as its base.
        let model = model.strip_prefix("ft:").unwrap_or(model);
        const O200K_FAMILIES: [&str; 8] =
            ["gpt-4o", "chatgpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5", "o1", "o3", "o4"];
        const CL100K_FAMILIES: [&str; 4] = ["gpt-4", "gpt-3.5", "gpt-35", "text-embedding-"];
        if O200K_FAMILIES.iter().any(|f| model.starts_with(f)) {
            Encoding::O200kBase
        } else if CL100K_FAMILIES.iter().any(|f| model.starts_with(f)) {
            Encoding::Cl100kBase
        } else {
            Encoding::O200kBase
        }
    }

    /// The tokens of `text` as ordinary text (special-token markers count as plain text).
    pub fn count(self, text: &str) -> u64 {
        let bpe = match self {
            Encoding::O200kBase => O200K.as_ref(),
            Encoding::Cl100kBase => CL100K.as_ref(),
        };
        match bpe {
            Some(bpe) => bpe.encode_ordinary(text).len() as u64,
            None => (text.len() as u64).div_ceil(4),
        }
    }
}

/// Every request's fixed overhead, and every message's.
const OVERHEAD: u64 = 3;

/// The input tokens of one request `body` sent to `endpoint`, its model read from `body`.
pub fn input_tokens(provider: ProviderKind, endpoint: Endpoint, body: &Value) -> u64 {
    let model = body.get("model").and_then(Value::as_str).unwrap_or("");
    let enc = Encoding::for_model(provider, model);
    match endpoint {
        Endpoint::ChatCompletions => {
            OVERHEAD + messages(enc, body.get("messages")) + tools(enc, body.get("tools"))
        }
        Endpoint::Responses => {
            let instructions = body
                .get("instructions")
                .and_then(Value::as_str)
                .map_or(0, |text| message(enc, "system", text, None));
            let input = match body.get("input") {
                Some(Value::String(text)) => message(enc, "user", text, None),
                Some(Value::Array(items)) => {
                    items.iter().map(|item| response_item(enc, item)).sum()
                }
                _ => 0,
            };
            OVERHEAD + instructions + input + tools(enc, body.get("tools"))
        }
        Endpoint::Completions => plain_inputs(enc, body.get("prompt")),
        Endpoint::Embeddings | Endpoint::Moderations => plain_inputs(enc, body.get("input")),
        Endpoint::AnthropicMessages => {
            OVERHEAD
                + anthropic_prefix_tokens(body.get("system"), body.get("tools"))
                + messages(enc, body.get("messages"))
        }
    }
}

/// The tokens of an Anthropic body's `tools` and `system`, counted as [`input_tokens`] counts
/// them: the prefix a cache breakpoint at the end of the system prompt covers.
pub fn anthropic_prefix_tokens(system: Option<&Value>, tools_value: Option<&Value>) -> u64 {
    let enc = Encoding::for_model(ProviderKind::Anthropic, "");
    let system = match system {
        Some(system) if !system.is_null() => message(enc, "system", &content_text(system), None),
        _ => 0,
    };
    system + tools(enc, tools_value)
}

/// The output a body allows: `max_completion_tokens`, `max_tokens` or `max_output_tokens`.
pub fn output_limit(body: &Value) -> Option<u64> {
    body.as_object().and_then(crate::tokens::output_limit)
}

/// `3 + tokens(role) + tokens(text)`, plus `tokens(name) + 1` when named.
fn message(enc: Encoding, role: &str, text: &str, name: Option<&str>) -> u64 {
    OVERHEAD + enc.count(role) + enc.count(text) + name.map_or(0, |n| enc.count(n) + 1)
}

fn chat_message(enc: Encoding, value: &Value) -> u64 {
    let role = value.get("role").and_then(Value::as_str).unwrap_or("");
    let text = value.get("content").map(content_text).unwrap_or_default();
    let name = value.get("name").and_then(Value::as_str);
    message(enc, role, &text, name)
}

fn messages(enc: Encoding, value: Option<&Value>) -> u64 {
    value.and_then(Value::as_array).map_or(0, |ms| ms.iter().map(|m| chat_message(enc, m)).sum())
}

fn response_item(enc: Encoding, item: &Value) -> u64 {
    if item.get("role").is_some() || item.get("content").is_some() {
        chat_message(enc, item)
    } else {
        enc.count(&compact(item))
    }
}

fn tools(enc: Encoding, value: Option<&Value>) -> u64 {
    match value {
        Some(tools) if !tools.is_null() => enc.count(&compact(tools)),
        _ => 0,
    }
}

/// A content string itself, or the `text` of an array's text parts run together.
fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts.iter().filter_map(part_text).collect(),
        _ => String::new(),
    }
}

/// The `text` of a part typed `text` (or, in the Responses API, `input_text` or `output_text`).
fn part_text(part: &Value) -> Option<&str> {
    let kind = part.get("type").and_then(Value::as_str)?;
    if matches!(kind, "text" | "input_text" | "output_text") {
        part.get("text").and_then(Value::as_str)
    } else {
        None
    }
}

/// A prompt or input: a string, or an array of strings, of token ids, of token-id arrays, or of
/// text parts.
fn plain_inputs(enc: Encoding, value: Option<&Value>) -> u64 {
    match value {
        Some(Value::String(s)) => enc.count(s),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| match item {
                Value::String(s) => enc.count(s),
                Value::Number(_) => 1,
                Value::Array(ids) => ids.len() as u64,
                Value::Object(_) => part_text(item).map_or(0, |text| enc.count(text)),
                _ => 0,
            })
            .sum(),
        _ => 0,
    }
}

fn compact(value: &Value) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn o200k(s: &str) -> u64 {
        Encoding::O200kBase.count(s)
    }

    fn cl100k(s: &str) -> u64 {
        Encoding::Cl100kBase.count(s)
    }

    #[test]
    fn the_tokenizers_count_known_strings() {
        // Counts as OpenAI's tiktoken gives them.
        assert_eq!(o200k("hello world"), 2);
        assert_eq!(cl100k("hello world"), 2);
        assert_eq!(o200k(""), 0);
        assert_eq!(cl100k("tiktoken is great!"), 6);
        // Special-token markers are ordinary text, never an error.
        assert!(o200k("<|endoftext|>") > 1);
    }

    #[test]
    fn a_chat_body_counts_by_the_convention() {
        let body = json!({
            "model": "gpt-4o-mini",
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "name": "ada", "content": [
                    {"type": "text", "text": "Hello, "},
                    {"type": "image_url", "image_url": {"url": "https://example.invalid/a.png"}},
                    {"type": "text", "text": "world!"}
                ]},
                {"role": "assistant", "content": null}
            ],
            "max_tokens": 50
        });
        let expected = 3
            + (3 + o200k("system") + o200k("You are terse."))
            + (3 + o200k("user") + o200k("Hello, world!") + o200k("ada") + 1)
            + (3 + o200k("assistant"));
        assert_eq!(input_tokens(ProviderKind::Openai, Endpoint::ChatCompletions, &body), expected);
        // By hand, from the counts of the strings:
        let strings = ["system", "You are terse.", "user", "Hello, world!", "ada", "assistant"];
        let counts: Vec<u64> = strings.iter().map(|s| o200k(s)).collect();
        assert_eq!(counts, [1, 4, 1, 4, 1, 1]);
        // 3 + (3 + 1 + 4) + (3 + 1 + 4 + 1 + 1) + (3 + 1) = 3 + 8 + 10 + 4 = 25.
        assert_eq!(expected, 25);
        assert_eq!(output_limit(&body), Some(50));
    }

    #[test]
    fn chat_tools_count_their_compact_json() {
        let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {}}}]);
        let body = json!({"model": "gpt-4.1", "messages": [], "tools": tools});
        let compact = r#"[{"function":{"name":"f","parameters":{}},"type":"function"}]"#;
        assert_eq!(serde_json::to_string(&tools).unwrap(), compact);
        assert_eq!(
            input_tokens(ProviderKind::Openai, Endpoint::ChatCompletions, &body),
            3 + o200k(compact)
        );
    }

    #[test]
    fn responses_count_instructions_input_and_items() {
        let body = json!({
            "model": "gpt-5",
            "instructions": "Be brief.",
            "input": "What is 2+2?",
            "max_output_tokens": 16
        });
        let expected = 3
            + (3 + o200k("system") + o200k("Be brief."))
            + (3 + o200k("user") + o200k("What is 2+2?"));
        assert_eq!(input_tokens(ProviderKind::Openai, Endpoint::Responses, &body), expected);
        assert_eq!(output_limit(&body), Some(16));

        let item = json!({"type": "function_call_output", "call_id": "c1", "output": "4"});
        let body = json!({
            "model": "gpt-5",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "Add them."}]},
                item
            ]
        });
        let expected = 3
            + (3 + o200k("user") + o200k("Add them."))
            + o200k(&serde_json::to_string(&item).unwrap());
        assert_eq!(input_tokens(ProviderKind::Azure, Endpoint::Responses, &body), expected);
    }

    #[test]
    fn embeddings_and_completions_count_their_inputs_without_overhead() {
        let body = json!({"model": "text-embedding-3-small", "input": ["alpha beta", "gamma"]});
        assert_eq!(
            input_tokens(ProviderKind::Openai, Endpoint::Embeddings, &body),
            cl100k("alpha beta") + cl100k("gamma")
        );
        let body = json!({"model": "text-embedding-3-large", "input": "one string"});
        assert_eq!(
            input_tokens(ProviderKind::Openai, Endpoint::Embeddings, &body),
            cl100k("one string")
        );
        let body = json!({"model": "text-embedding-3-small", "input": [[1, 2, 3], [4]]});
        assert_eq!(input_tokens(ProviderKind::Openai, Endpoint::Embeddings, &body), 4);
        let body = json!({"model": "omni-moderation-latest", "input": "hi there"});
        assert_eq!(
            input_tokens(ProviderKind::Openai, Endpoint::Moderations, &body),
            o200k("hi there")
        );
        let body = json!({"model": "omni-moderation-latest", "input": [
            {"type": "text", "text": "hi there"},
            {"type": "image_url", "image_url": {"url": "https://example.invalid/a.png"}}
        ]});
        assert_eq!(
            input_tokens(ProviderKind::Openai, Endpoint::Moderations, &body),
            o200k("hi there")
        );
        let body = json!({"model": "gpt-3.5-turbo-instruct", "prompt": ["a b", "c"]});
        assert_eq!(
            input_tokens(ProviderKind::Openai, Endpoint::Completions, &body),
            cl100k("a b") + cl100k("c")
        );
        assert_eq!(output_limit(&body), None);
    }

    #[test]
    fn anthropic_counts_system_blocks_messages_and_tools_with_cl100k() {
        let tools = json!([{"name": "get_weather", "input_schema": {"type": "object"}}]);
        let body = json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 1024,
            "system": [
                {"type": "text", "text": "You are a poet. "},
                {"type": "text", "text": "Rhyme.", "cache_control": {"type": "ephemeral"}}
            ],
            "messages": [
                {"role": "user", "content": "Write about rain."},
                {"role": "assistant", "content": [{"type": "text", "text": "Drops"}]}
            ],
            "tools": tools
        });
        let expected = 3
            + (3 + cl100k("system") + cl100k("You are a poet. Rhyme."))
            + (3 + cl100k("user") + cl100k("Write about rain."))
            + (3 + cl100k("assistant") + cl100k("Drops"))
            + cl100k(&serde_json::to_string(&tools).unwrap());
        assert_eq!(
            input_tokens(ProviderKind::Anthropic, Endpoint::AnthropicMessages, &body),
            expected
        );
        assert_eq!(output_limit(&body), Some(1024));
        // A string system prompt, and none.
        let body = json!({"model": "claude-haiku-4-5", "system": "Hi.", "messages": []});
        assert_eq!(
            input_tokens(ProviderKind::Anthropic, Endpoint::AnthropicMessages, &body),
            3 + (3 + cl100k("system") + cl100k("Hi."))
        );
        let body = json!({"model": "claude-haiku-4-5", "messages": []});
        assert_eq!(input_tokens(ProviderKind::Anthropic, Endpoint::AnthropicMessages, &body), 3);
    }

    #[test]
    fn the_encoding_follows_the_model() {
        use Encoding::{Cl100kBase, O200kBase};
        use ProviderKind::{Anthropic, Azure, Openai};
        for (provider, model, expected) in [
            (Openai, "gpt-4o", O200kBase),
            (Openai, "gpt-4o-mini-2024-07-18", O200kBase),
            (Openai, "gpt-4.1-nano", O200kBase),
            (Openai, "gpt-5-mini", O200kBase),
            (Openai, "o1", O200kBase),
            (Openai, "o3-mini", O200kBase),
            (Openai, "o4-mini", O200kBase),
            (Openai, "ft:gpt-4o-mini-2024-07-18:acme::abc", O200kBase),
            (Azure, "gpt-4o", O200kBase),
            (Azure, "my-deployment", O200kBase),
            (Openai, "some-future-model", O200kBase),
            (Openai, "gpt-4", Cl100kBase),
            (Openai, "gpt-4-turbo", Cl100kBase),
            (Openai, "gpt-3.5-turbo", Cl100kBase),
            (Azure, "gpt-35-turbo", Cl100kBase),
            (Openai, "text-embedding-3-small", Cl100kBase),
            (Openai, "text-embedding-ada-002", Cl100kBase),
            (Anthropic, "claude-sonnet-4-5", Cl100kBase),
            (Anthropic, "gpt-4o", Cl100kBase),
        ] {
            assert_eq!(Encoding::for_model(provider, model), expected, "{provider} {model}");
        }
        // The two encodings differ, and the body's model picks one.
        let text = "Ünïcödé text, with some 日本語 in it.";
        assert_ne!(o200k(text), cl100k(text));
        let body = |model: &str| json!({"model": model, "input": text});
        let count = |model: &str| input_tokens(Openai, Endpoint::Embeddings, &body(model));
        assert_eq!(count("text-embedding-3-small"), cl100k(text));
        assert_eq!(count("gpt-4o"), o200k(text));
    }

    #[test]
    fn odd_bodies_count_what_they_have() {
        assert_eq!(input_tokens(ProviderKind::Openai, Endpoint::ChatCompletions, &json!({})), 3);
        assert_eq!(input_tokens(ProviderKind::Openai, Endpoint::ChatCompletions, &json!(null)), 3);
        assert_eq!(input_tokens(ProviderKind::Openai, Endpoint::Embeddings, &json!({})), 0);
        assert_eq!(output_limit(&json!("not an object")), None);
    }
}
