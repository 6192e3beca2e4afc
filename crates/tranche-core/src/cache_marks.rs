//! Shared-prompt cache marks for Anthropic: which system prompt a Messages body carries, whether
//! it is long enough for the provider to cache, and the body with a `cache_control` breakpoint
//! at the end of it.
//!
//! Anthropic caches a prompt's prefix only up to a breakpoint the request marks. A breakpoint at
//! the end of `system` covers `tools` and `system` (the order the provider renders a request
//! in), so requests that share both, for one model, share the cache entry: the first writes it
//! (1.25x the input price), the others read it (0.1x). The engine marks a tranche's requests
//! whose prompt is shared; the request's input hash stays that of the body as the user gave it,
//! the mark lives only in the bytes sent.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::count;
use crate::hash::{canonical_json, write_canonical};

/// How many breakpoints Anthropic accepts in one request.
pub const MAX_BREAKPOINTS: usize = 4;

/// Minimum cacheable prompt lengths in tokens, by model family (the model id without its date
/// or `-latest`): a marked prefix shorter than this is processed without caching.
///
/// From Anthropic's prompt caching guide ("Cache limitations", docs.claude.com
/// `build-with-claude/prompt-caching`) as revised through Claude 4.6: 4,096 for Opus 4.6,
/// Opus 4.5 and Haiku 4.5; 1,024 for Sonnet 4.5, Opus 4.1, Opus 4, Sonnet 4, Sonnet 3.7 and
/// (in the earlier editions) Sonnet 3.5 and Opus 3; 2,048 for Haiku 3.5 and Haiku 3. Sonnet 4.6
/// was first listed at 1,024; caching was observed to start at 2,048 only
/// (anthropics/anthropic-sdk-python#1194) and later copies of the table give 2,048, which this
/// takes.
pub const MIN_CACHEABLE_TOKENS: &[(&str, u64)] = &[
    ("claude-opus-4-6", 4_096),
    ("claude-opus-4-5", 4_096),
    ("claude-haiku-4-5", 4_096),
    ("claude-sonnet-4-6", 2_048),
    ("claude-sonnet-4-5", 1_024),
    ("claude-opus-4-1", 1_024),
    ("claude-opus-4", 1_024),
    ("claude-opus-4-0", 1_024),
    ("claude-sonnet-4", 1_024),
    ("claude-sonnet-4-0", 1_024),
    ("claude-3-7-sonnet", 1_024),
    ("claude-3-5-sonnet", 1_024),
    ("claude-3-opus", 1_024),
    ("claude-3-5-haiku", 2_048),
    ("claude-3-haiku", 2_048),
];

/// The minimum for a model the table does not know: the smallest listed. A mark on a prefix
/// below the provider's real minimum costs nothing (the request runs uncached at the ordinary
/// price), so the smallest floor never withholds a mark that could pay.
pub const MIN_CACHEABLE_TOKENS_OTHERWISE: u64 = 1_024;

/// The minimum cacheable prompt length of `model`, in tokens.
pub fn min_cacheable_tokens(model: &str) -> u64 {
    let family = model.strip_suffix("-latest").unwrap_or(model);
    let family = match family.rsplit_once('-') {
        Some((head, date)) if date.len() == 8 && date.bytes().all(|b| b.is_ascii_digit()) => head,
        _ => family,
    };
    MIN_CACHEABLE_TOKENS
        .iter()
        .find(|(name, _)| *name == family)
        .map_or(MIN_CACHEABLE_TOKENS_OTHERWISE, |(_, min)| *min)
}

/// The identity of a body's cacheable prefix: SHA-256 of the canonical JSON of
/// `{"model", "system", "tools"}` (absent ones null), so that key order and formatting never
/// tell two prompts apart and any change of a value does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PromptId([u8; 32]);

impl PromptId {
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

/// The system prompt of an Anthropic Messages body that could carry a cache mark.
#[derive(Debug, Clone)]
pub struct SharedPrompt {
    id: PromptId,
    model: String,
    system: Value,
    tools: Option<Value>,
}

/// What [`SharedPrompt::of`] reads of a body; everything else is skipped, not kept.
#[derive(Deserialize)]
struct Head<'a> {
    #[serde(default, borrow)]
    model: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    system: Option<&'a RawValue>,
    #[serde(default, borrow)]
    tools: Option<&'a RawValue>,
}

impl SharedPrompt {
    /// The system prompt of `body` (a Messages body as JSON text), or `None` when there is
    /// nothing tranche may mark: no system prompt or an empty one, a body that is not a JSON
    /// object, or one that already carries a `cache_control` anywhere (the user's own marks
    /// win).
    pub fn of(body: &str) -> Option<SharedPrompt> {
        let head: Head<'_> = serde_json::from_str(body).ok()?;
        let system: Value = serde_json::from_str(head.system?.get()).ok()?;
        if !markable(&system) {
            return None;
        }
        // `"cache_control"` in the text is a key, or a string that is exactly that word: only
        // then is the whole body read to tell which.
        if body.contains("\"cache_control\"")
            && !serde_json::from_str::<Value>(body).is_ok_and(|v| breakpoints(&v) == 0)
        {
            return None;
        }
        let tools = match head.tools {
            Some(raw) => Some(serde_json::from_str::<Value>(raw.get()).ok()?),
            None => None,
        };
        let model = head.model.map(Cow::into_owned).unwrap_or_default();
        let mut text = Vec::new();
        text.extend_from_slice(b"{\"model\":");
        write_canonical(&mut text, &Value::String(model.clone()));
        text.extend_from_slice(b",\"system\":");
        write_canonical(&mut text, &system);
        text.extend_from_slice(b",\"tools\":");
        write_canonical(&mut text, tools.as_ref().unwrap_or(&Value::Null));
        text.push(b'}');
        let id = PromptId(Sha256::digest(&text).into());
        Some(SharedPrompt { id, model, system, tools })
    }

    /// What tells this prompt from another.
    pub fn id(&self) -> PromptId {
        self.id
    }

    /// The body's model.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The tokens a breakpoint at the end of the system prompt covers (`tools` and `system`),
    /// counted by [`count::anthropic_prefix_tokens`] (`cl100k_base` standing in for Claude's
    /// tokenizer, which counts more, so a prompt long enough by this count is long enough).
    pub fn tokens(&self) -> u64 {
        count::anthropic_prefix_tokens(Some(&self.system), self.tools.as_ref())
    }

    /// Whether the prompt reaches its model's minimum cacheable length.
    pub fn long_enough(&self) -> bool {
        self.tokens() >= min_cacheable_tokens(&self.model)
    }
}

/// A system prompt a mark can go on: a non-empty string, or blocks whose last is an object.
fn markable(system: &Value) -> bool {
    match system {
        Value::String(text) => !text.is_empty(),
        Value::Array(blocks) => blocks.last().is_some_and(Value::is_object),
        _ => false,
    }
}

/// How many `cache_control` keys `value` holds, at any depth (a top-level one, Anthropic's
/// automatic caching, included).
pub fn breakpoints(value: &Value) -> usize {
    match value {
        Value::Object(map) => {
            usize::from(map.contains_key("cache_control"))
                + map.values().map(breakpoints).sum::<usize>()
        }
        Value::Array(items) => items.iter().map(breakpoints).sum(),
        _ => 0,
    }
}

/// `{"type": "ephemeral"}`: the default five-minute cache.
fn ephemeral() -> Value {
    let mut mark = Map::new();
    mark.insert("type".to_owned(), Value::String("ephemeral".to_owned()));
    Value::Object(mark)
}

/// Puts a breakpoint at the end of `body`'s system prompt: a string becomes one text block
/// carrying `"cache_control": {"type": "ephemeral"}`, and of blocks the last one carries it.
/// Returns whether it did. A body that already holds any `cache_control` is left as it is (the
/// user's own marks win), as is one with no system prompt to mark; so the one mark tranche adds
/// never takes a request past [`MAX_BREAKPOINTS`].
pub fn mark_system(body: &mut Value) -> bool {
    let existing = breakpoints(body);
    if existing > 0 || existing + 1 > MAX_BREAKPOINTS {
        return false;
    }
    let Some(system) = body.as_object_mut().and_then(|obj| obj.get_mut("system")) else {
        return false;
    };
    if !markable(system) {
        return false;
    }
    match system {
        Value::String(text) => {
            let mut block = Map::new();
            block.insert("type".to_owned(), Value::String("text".to_owned()));
            block.insert("text".to_owned(), Value::String(std::mem::take(text)));
            block.insert("cache_control".to_owned(), ephemeral());
            *system = Value::Array(vec![Value::Object(block)]);
            true
        }
        Value::Array(blocks) => match blocks.last_mut() {
            Some(Value::Object(block)) => {
                block.insert("cache_control".to_owned(), ephemeral());
                true
            }
            _ => false,
        },
        _ => false,
    }
}

/// How many bytes [`marked_body`] adds to `body` (canonical JSON, as stored), 0 when it would
/// refuse it: what a tranche's byte limit must leave room for, measured before anyone knows
/// whether the prompt will be shared.
pub fn mark_growth(body: &str) -> u64 {
    /// `"cache_control":{"type":"ephemeral"}`, the key and value a block gains.
    const MARK: u64 = 36;
    let Ok(head) = serde_json::from_str::<Head<'_>>(body) else { return 0 };
    let Some(system) = head.system.map(RawValue::get) else { return 0 };
    if body.contains("\"cache_control\"")
        && !serde_json::from_str::<Value>(body).is_ok_and(|v| breakpoints(&v) == 0)
    {
        return 0;
    }
    match serde_json::from_str::<Value>(system) {
        // `"text"` becomes `[{"cache_control":…,"text":"text","type":"text"}]`.
        // `[{` and `}]`, `,"text":`, `,"type":"text"`.
        Ok(Value::String(text)) if !text.is_empty() => MARK + 4 + 8 + 14,
        // The last block gains the mark, and a comma when it has other keys.
        Ok(Value::Array(blocks)) => match blocks.last() {
            Some(Value::Object(block)) => MARK + u64::from(!block.is_empty()),
            _ => 0,
        },
        _ => 0,
    }
}

/// `body` (JSON text) with a breakpoint at the end of its system prompt, as canonical JSON (the
/// form bodies are stored in), or `None` when [`mark_system`] refuses it.
pub fn marked_body(body: &str) -> Option<String> {
    let mut value: Value = serde_json::from_str(body).ok()?;
    mark_system(&mut value).then(|| canonical_json(&value))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn long_prompt() -> String {
        "You label support tickets by intent, urgency and product area. ".repeat(150)
    }

    fn body(system: Value) -> Value {
        json!({"model": "claude-sonnet-4-5", "max_tokens": 64, "system": system,
               "messages": [{"role": "user", "content": "hello"}]})
    }

    #[test]
    fn a_string_system_becomes_one_marked_text_block() {
        let prompt = long_prompt();
        let marked = marked_body(&body(json!(prompt)).to_string()).unwrap();
        let v: Value = serde_json::from_str(&marked).unwrap();
        assert_eq!(
            v["system"],
            json!([{"type": "text", "text": prompt, "cache_control": {"type": "ephemeral"}}])
        );
        assert_eq!(v["messages"], body(json!("x"))["messages"], "the rest is as it was");
        assert_eq!(breakpoints(&v), 1);
        assert_eq!(marked, canonical_json(&v), "written canonical");
    }

    #[test]
    fn the_growth_is_what_the_mark_adds() {
        let own = json!([{"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}]);
        let systems = [
            json!("Rules."),
            json!("with \"quotes\" and \n"),
            json!([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]),
            json!([{}]),
            json!(""),
            json!([]),
            own,
        ];
        for system in systems {
            let stored = canonical_json(&body(system.clone()));
            let added = marked_body(&stored).map_or(0, |m| m.len() - stored.len());
            assert_eq!(mark_growth(&stored), added as u64, "{system}");
        }
        assert_eq!(mark_growth("not json"), 0);
    }

    #[test]
    fn of_blocks_the_last_is_marked() {
        let blocks = json!([{"type": "text", "text": "Rules."}, {"type": "text", "text": "More."}]);
        let mut v = body(blocks);
        assert!(mark_system(&mut v));
        assert_eq!(v["system"][0], json!({"type": "text", "text": "Rules."}));
        assert_eq!(
            v["system"][1],
            json!({"type": "text", "text": "More.", "cache_control": {"type": "ephemeral"}})
        );
    }

    #[test]
    fn the_users_own_marks_win() {
        let mark = json!({"type": "ephemeral"});
        let on_system = body(json!([{"type": "text", "text": "x", "cache_control": mark}]));
        let mut on_message = body(json!("Rules."));
        on_message["messages"][0]["content"] =
            json!([{"type": "text", "text": "hi", "cache_control": mark}]);
        let mut automatic = body(json!("Rules."));
        automatic["cache_control"] = mark.clone();
        let mut four = body(json!("Rules."));
        four["messages"][0]["content"] =
            Value::from(vec![json!({"type": "text", "text": "a", "cache_control": mark}); 4]);
        assert_eq!(breakpoints(&four), MAX_BREAKPOINTS);
        for v in [on_system, on_message, automatic, four] {
            let mut changed = v.clone();
            assert!(!mark_system(&mut changed), "{v}");
            assert_eq!(changed, v, "left as it was");
            assert!(marked_body(&v.to_string()).is_none());
            assert!(SharedPrompt::of(&v.to_string()).is_none(), "not a candidate: {v}");
        }
        // The word as a value is not a mark.
        let mut v = body(json!("Rules."));
        v["messages"][0]["content"] = json!("cache_control");
        assert!(SharedPrompt::of(&v.to_string()).is_some());
        assert!(marked_body(&v.to_string()).is_some());
    }

    #[test]
    fn nothing_to_mark_is_refused() {
        for system in [json!(""), json!([]), json!(null), json!(["text"]), json!(7)] {
            let v = body(system);
            assert!(SharedPrompt::of(&v.to_string()).is_none(), "{v}");
            assert!(marked_body(&v.to_string()).is_none(), "{v}");
        }
        let mut none = body(json!("x"));
        none.as_object_mut().unwrap().remove("system");
        assert!(SharedPrompt::of(&none.to_string()).is_none());
        assert!(!mark_system(&mut none));
        assert!(SharedPrompt::of("[1, 2]").is_none());
        assert!(SharedPrompt::of("not json").is_none());
    }

    #[test]
    fn a_prompt_under_its_models_minimum_is_not_eligible() {
        let short = SharedPrompt::of(&body(json!("Be brief.")).to_string()).unwrap();
        assert!(short.tokens() < 10, "{}", short.tokens());
        assert!(!short.long_enough());
        let long = SharedPrompt::of(&body(json!(long_prompt())).to_string()).unwrap();
        assert!((1_024..2_048).contains(&long.tokens()), "{}", long.tokens());
        assert!(long.long_enough());
        // The same prompt for Haiku 3.5, whose minimum is 2,048, is too short.
        let mut haiku = body(json!(long_prompt()));
        haiku["model"] = json!("claude-3-5-haiku-latest");
        assert!(!SharedPrompt::of(&haiku.to_string()).unwrap().long_enough());
        // Tools count towards the prefix a system breakpoint covers.
        let mut tooled = body(json!("Be brief."));
        tooled["tools"] = json!([{"name": "lookup", "description": "word ".repeat(1_100),
                                  "input_schema": {"type": "object"}}]);
        assert!(SharedPrompt::of(&tooled.to_string()).unwrap().long_enough());
    }

    #[test]
    fn equal_prompts_have_one_identity_whatever_their_form() {
        let blocks = json!([{"type": "text", "text": "Rules."}]);
        let a = body(blocks.clone()).to_string();
        let b = r#"{ "system": [ { "text": "Rules.", "type": "text" } ], "max_tokens": 9,
                    "model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": "other"}] }"#;
        let id = |s: &str| SharedPrompt::of(s).unwrap().id();
        assert_eq!(id(&a), id(b), "key order, spacing and the messages do not matter");
        assert_ne!(id(&a), id(&body(json!("Rules.")).to_string()), "a string is another form");
        assert_ne!(id(&a), id(&body(json!([{"type": "text", "text": "Rules!"}])).to_string()));
        let mut other_model = body(blocks.clone());
        other_model["model"] = json!("claude-opus-4-1");
        assert_ne!(id(&a), id(&other_model.to_string()), "a cache is a model's");
        let mut tooled = body(blocks);
        tooled["tools"] = json!([{"name": "t", "input_schema": {"type": "object"}}]);
        assert_ne!(id(&a), id(&tooled.to_string()), "the prefix covers the tools");
        assert_eq!(id(&a).to_hex().len(), 64);
    }

    #[test]
    fn minimums_follow_the_model_family() {
        let cases = [
            ("claude-opus-4-6", 4_096),
            ("claude-opus-4-5-20251101", 4_096),
            ("claude-haiku-4-5-20251001", 4_096),
            ("claude-sonnet-4-6", 2_048),
            ("claude-sonnet-4-5", 1_024),
            ("claude-sonnet-4-5-20250929", 1_024),
            ("claude-opus-4-1-20250805", 1_024),
            ("claude-opus-4-20250514", 1_024),
            ("claude-sonnet-4-0", 1_024),
            ("claude-3-7-sonnet-latest", 1_024),
            ("claude-3-5-sonnet-20241022", 1_024),
            ("claude-3-opus-20240229", 1_024),
            ("claude-3-5-haiku-latest", 2_048),
            ("claude-3-haiku-20240307", 2_048),
            ("claude-next-9", MIN_CACHEABLE_TOKENS_OTHERWISE),
            ("", MIN_CACHEABLE_TOKENS_OTHERWISE),
        ];
        for (model, min) in cases {
            assert_eq!(min_cacheable_tokens(model), min, "{model}");
        }
    }
}
