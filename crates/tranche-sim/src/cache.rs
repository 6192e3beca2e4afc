//! The prompt cache, by each provider's documented rules: which input tokens of a request are read
//! from the cache and which are written to it, on the simulator's virtual clock.
//!
//! OpenAI and Azure cache automatically: "Cache hits require an exact, repeated prefix match and
//! works automatically for prompts containing 1024 tokens or more, with cache hits occurring in
//! increments of 128 tokens" (OpenAI cookbook, Prompt Caching 201). A request's `cached_tokens` is
//! the longest prefix of its prompt token sequence (see `tokens`) already seen for the same
//! provider and model, in steps of 128 from 1,024 and at most the whole prompt less one token,
//! rounded down to a step. Each step's prefix is remembered for an hour after its last use
//! (Azure: caches "are always removed within one hour of the cache's last use"; OpenAI: "up to a
//! maximum of one hour").
//!
//! Anthropic caches only at `cache_control` breakpoints (on `tools` entries, `system` text blocks
//! and `messages[].content` blocks; at most 4, else the request is invalid), in the order tools →
//! system → messages; a breakpoint's prefix is everything up to and including its block. The
//! longest breakpoint prefix still cached is read; every later breakpoint prefix at or above the
//! model's minimum cacheable length is written, its new tokens billed as 5-minute or 1-hour writes
//! by the TTL of the breakpoint that covers them. An entry lives 5 minutes (or 1 hour with
//! `"ttl": "1h"`) from its last write or read. Below the minimum nothing is cached, silently.
//!
//! The cache keeps one 128-bit hash per prefix (of provider, model and the prefix) with its
//! expiry, never tokens or text, and drops expired entries as it grows.

use std::collections::HashMap;

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::tokens::{Encoding, Marker, TokenSink, marked};

/// A cached prefix: a hash of provider, model and the prefix.
pub(crate) type Key = u128;

/// Shortest prompt OpenAI caches.
pub(crate) const OPENAI_MIN_TOKENS: u64 = 1_024;
/// OpenAI's cache hits grow in steps of this many tokens.
pub(crate) const OPENAI_STEP_TOKENS: u64 = 128;
/// How long an OpenAI or Azure prefix stays cached after its last use.
const OPENAI_RETENTION_SECONDS: f64 = 3_600.0;
/// Most `cache_control` breakpoints an Anthropic request may carry.
const ANTHROPIC_MAX_BREAKPOINTS: usize = 4;
/// The cache never sweeps expired entries below this many.
const SWEEP_FLOOR: usize = 4_096;

/// Anthropic's minimum cacheable prompt length by model (id prefix), from the prompt caching
/// guide's "Cache limitations" (platform.claude.com/docs/en/build-with-claude/prompt-caching, as
/// quoted in anthropics/anthropic-sdk-python#1194): 4,096 tokens for Claude Opus 4.6, Opus 4.5
/// and Haiku 4.5; 2,048 for Claude Sonnet 4.6 (the issue observed caching start there, and later
/// copies of the table say so, where the first said 1,024), Haiku 3.5 and Haiku 3; 1,024 for
/// Claude Sonnet 4.5, Opus 4.1, Opus 4, Sonnet 4 and Sonnet 3.7 (and, in the earlier guide,
/// Sonnet 3.5 and Opus 3), which is also the default for any other model.
const ANTHROPIC_MIN_CACHEABLE: [(&str, u64); 6] = [
    ("claude-opus-4-6", 4_096),
    ("claude-opus-4-5", 4_096),
    ("claude-haiku-4-5", 4_096),
    ("claude-sonnet-4-6", 2_048),
    ("claude-3-5-haiku", 2_048),
    ("claude-3-haiku", 2_048),
];
const ANTHROPIC_DEFAULT_MIN_CACHEABLE: u64 = 1_024;

/// The shortest prefix Anthropic caches for `model`.
pub(crate) fn anthropic_min_cacheable(model: &str) -> u64 {
    ANTHROPIC_MIN_CACHEABLE
        .iter()
        .find(|(prefix, _)| model.starts_with(prefix))
        .map_or(ANTHROPIC_DEFAULT_MIN_CACHEABLE, |(_, min)| *min)
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Virtual unix time the entry is gone at.
    expires_at: f64,
    /// Lifetime granted by each write or read.
    ttl: f64,
}

/// Prefixes seen so far, with their expiry.
#[derive(Debug, Default)]
pub(crate) struct PromptCache {
    entries: HashMap<Key, Entry>,
    /// Size at which expired entries are next swept out.
    sweep_at: usize,
}

/// A hasher of prefixes, seeded with the scope (provider) and model.
fn prefix_hasher(scope: &str, model: &str) -> Sha256 {
    Sha256::new()
        .chain_update(scope.as_bytes())
        .chain_update([0])
        .chain_update(model.as_bytes())
        .chain_update([0])
}

fn key_of(hasher: &Sha256) -> Key {
    let digest = hasher.clone().finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    u128::from_le_bytes(bytes)
}

impl PromptCache {
    fn live(&self, key: Key, now: f64) -> bool {
        self.entries.get(&key).is_some_and(|e| now < e.expires_at)
    }

    /// A read: the entry lives its TTL from now.
    fn refresh(&mut self, key: Key, now: f64) {
        if let Some(e) = self.entries.get_mut(&key) {
            e.expires_at = e.expires_at.max(now + e.ttl);
        }
    }

    /// A write: the entry (new, or renewed) lives at least `ttl` from now.
    fn write(&mut self, key: Key, ttl: f64, now: f64) {
        let e = self.entries.entry(key).or_insert(Entry { expires_at: now, ttl });
        e.ttl = e.ttl.max(ttl);
        e.expires_at = e.expires_at.max(now + e.ttl);
    }

    /// Drops expired entries once the cache has doubled since the last sweep.
    fn sweep(&mut self, now: f64) {
        if self.entries.len() < self.sweep_at.max(SWEEP_FLOOR) {
            return;
        }
        self.entries.retain(|_, e| now < e.expires_at);
        self.sweep_at = self.entries.len().saturating_mul(2);
    }

    /// OpenAI and Azure: the part of the prompt in `sink` read from the cache (0 or a step of
    /// 128 from 1,024, below the whole prompt); remembers every step of the prompt.
    pub(crate) fn openai(&mut self, sink: &PrefixSink, now: f64) -> u64 {
        let limit = sink.total.saturating_sub(1);
        let cached = sink
            .steps
            .iter()
            .rev()
            .find(|(tokens, key)| *tokens <= limit && self.live(*key, now))
            .map_or(0, |(tokens, _)| *tokens);
        for (_, key) in &sink.steps {
            self.write(*key, OPENAI_RETENTION_SECONDS, now);
        }
        self.sweep(now);
        cached
    }

    /// Anthropic: what `breakpoints` (in cache order) read and write for `model`.
    pub(crate) fn anthropic(
        &mut self,
        model: &str,
        breakpoints: &[Breakpoint],
        now: f64,
    ) -> AnthropicCacheUse {
        let min = anthropic_min_cacheable(model);
        let read_at = breakpoints.iter().rposition(|b| b.tokens >= min && self.live(b.key, now));
        let mut usage = AnthropicCacheUse::default();
        let mut covered = 0;
        if let Some(b) = read_at.and_then(|i| breakpoints.get(i)) {
            self.refresh(b.key, now);
            usage.read = b.tokens;
            covered = b.tokens;
        }
        let later = read_at.map_or(0, |i| i + 1);
        for b in breakpoints.iter().skip(later).filter(|b| b.tokens >= min) {
            let new = b.tokens.saturating_sub(covered);
            match b.ttl {
                Ttl::FiveMinutes => usage.write_5m += new,
                Ttl::OneHour => usage.write_1h += new,
            }
            covered = covered.max(b.tokens);
            self.write(b.key, b.ttl.seconds(), now);
        }
        self.sweep(now);
        usage
    }
}

/// Collects a prompt's token sequence (see `tokens`) as a running hash, keeping the hash of each
/// prefix OpenAI could cache (1,024 tokens, then every 128 more).
#[derive(Debug)]
pub(crate) struct PrefixSink {
    encoding: Encoding,
    hasher: Sha256,
    /// Tokens so far.
    pub total: u64,
    /// (prefix length, key) of each cacheable prefix so far.
    steps: Vec<(u64, Key)>,
}

impl PrefixSink {
    pub(crate) fn new(encoding: Encoding, scope: &str, model: &str) -> Self {
        Self { encoding, hasher: prefix_hasher(scope, model), total: 0, steps: Vec::new() }
    }

    fn push(&mut self, token: u32) {
        self.hasher.update(token.to_le_bytes());
        self.total += 1;
        if self.total >= OPENAI_MIN_TOKENS
            && (self.total - OPENAI_MIN_TOKENS).is_multiple_of(OPENAI_STEP_TOKENS)
        {
            self.steps.push((self.total, key_of(&self.hasher)));
        }
    }
}

impl TokenSink for PrefixSink {
    fn text(&mut self, text: &str) {
        for token in self.encoding.encode(text) {
            self.push(token);
        }
    }

    fn marker(&mut self, marker: Marker) {
        // Above every vocabulary: a marker never equals a text token.
        self.push(0xFFFF_FF00 | marker as u32);
    }
}

/// A breakpoint's cache lifetime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ttl {
    FiveMinutes,
    OneHour,
}

impl Ttl {
    fn seconds(self) -> f64 {
        match self {
            Self::FiveMinutes => 300.0,
            Self::OneHour => 3_600.0,
        }
    }
}

/// One Anthropic `cache_control` breakpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Breakpoint {
    /// Input tokens up to and including the marked block.
    pub tokens: u64,
    pub ttl: Ttl,
    key: Key,
}

/// The cache tokens of one Anthropic request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct AnthropicCacheUse {
    /// `cache_read_input_tokens`.
    pub read: u64,
    /// `cache_creation.ephemeral_5m_input_tokens`.
    pub write_5m: u64,
    /// `cache_creation.ephemeral_1h_input_tokens`.
    pub write_1h: u64,
}

/// A breakpoint's TTL, or the API's complaint about its `cache_control` (`path` names the block).
fn parse_cache_control(cc: &Value, path: &str) -> Result<Ttl, String> {
    let Some(cc) = cc.as_object() else {
        return Err(format!("{path}.cache_control: Input should be a valid dictionary"));
    };
    if cc.get("type").and_then(Value::as_str) != Some("ephemeral") {
        return Err(format!("{path}.cache_control.type: Input should be 'ephemeral'"));
    }
    match cc.get("ttl") {
        None | Some(Value::Null) => Ok(Ttl::FiveMinutes),
        Some(Value::String(t)) if t == "5m" => Ok(Ttl::FiveMinutes),
        Some(Value::String(t)) if t == "1h" => Ok(Ttl::OneHour),
        Some(_) => Err(format!("{path}.cache_control.ttl: Input should be '5m' or '1h'")),
    }
}

/// Hashes an Anthropic prompt block by block in cache order, keeping the key of each breakpoint.
struct BlockWalk {
    hasher: Sha256,
    marks: Vec<(Ttl, Key)>,
    found: usize,
}

impl BlockWalk {
    fn block(&mut self, tag: &[u8], block: &Value, path: &str) -> Result<(), String> {
        self.hasher.update(tag);
        if !marked(block) {
            self.hasher.update(block.to_string());
            return Ok(());
        }
        self.found += 1;
        let ttl = parse_cache_control(&block["cache_control"], path)?;
        // The cache keys on content: where the breakpoint sits and its TTL are not part of it.
        let mut bare = block.clone();
        if let Some(obj) = bare.as_object_mut() {
            obj.remove("cache_control");
        }
        self.hasher.update(bare.to_string());
        self.marks.push((ttl, key_of(&self.hasher)));
        Ok(())
    }
}

fn any_marked(value: Option<&Value>) -> bool {
    value.and_then(Value::as_array).is_some_and(|blocks| blocks.iter().any(marked))
}

/// The TTL and key of each `cache_control` breakpoint of an Anthropic request, in cache order
/// (the order `tokens::anthropic` reports their token counts in); the error message if one is
/// malformed or there are more than 4.
pub(crate) fn anthropic_marks(
    obj: &Map<String, Value>,
    scope: &str,
    model: &str,
) -> Result<Vec<(Ttl, Key)>, String> {
    let messages = obj.get("messages").and_then(Value::as_array).map(Vec::as_slice);
    let none = !any_marked(obj.get("tools"))
        && !any_marked(obj.get("system"))
        && !messages.unwrap_or_default().iter().any(|m| any_marked(m.get("content")));
    if none {
        return Ok(Vec::new());
    }
    let mut walk = BlockWalk { hasher: prefix_hasher(scope, model), marks: Vec::new(), found: 0 };
    for (i, tool) in obj.get("tools").and_then(Value::as_array).into_iter().flatten().enumerate() {
        walk.block(b"tool\0", tool, &format!("tools.{i}"))?;
    }
    match obj.get("system") {
        Some(Value::Array(blocks)) => {
            for (i, b) in blocks.iter().enumerate() {
                walk.block(b"system\0", b, &format!("system.{i}"))?;
            }
        }
        Some(other) => walk.block(b"system\0", other, "system")?,
        None => {}
    }
    for (i, m) in messages.unwrap_or_default().iter().enumerate() {
        walk.hasher.update(b"message\0");
        walk.hasher.update(m.get("role").and_then(Value::as_str).unwrap_or_default());
        match m.get("content") {
            Some(Value::Array(blocks)) => {
                for (j, b) in blocks.iter().enumerate() {
                    walk.block(b"block\0", b, &format!("messages.{i}.content.{j}"))?;
                }
            }
            Some(other) => walk.block(b"text\0", other, &format!("messages.{i}.content"))?,
            None => {}
        }
    }
    if walk.found > ANTHROPIC_MAX_BREAKPOINTS {
        return Err(format!(
            "A maximum of {ANTHROPIC_MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {}.",
            walk.found
        ));
    }
    Ok(walk.marks)
}

/// Pairs the breakpoints' TTLs and keys with their token counts (both in cache order).
pub(crate) fn breakpoints(marks: &[(Ttl, Key)], tokens: &[u64]) -> Vec<Breakpoint> {
    marks.iter().zip(tokens).map(|(&(ttl, key), &tokens)| Breakpoint { tokens, ttl, key }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sink_of(n: u64, scope: &str, model: &str, first: u32) -> PrefixSink {
        let mut sink = PrefixSink::new(Encoding::O200kBase, scope, model);
        for i in 0..n {
            sink.push(if i == 0 { first } else { u32::try_from(i).unwrap() });
        }
        sink
    }

    #[test]
    fn openai_steps_start_at_1024_and_stop_short_of_the_prompt() {
        let mut cache = PromptCache::default();
        let s = sink_of(1_023, "openai", "m", 0);
        assert!(s.steps.is_empty());
        assert_eq!(cache.openai(&s, 0.0), 0);
        assert_eq!(cache.openai(&s, 1.0), 0, "under 1,024 tokens nothing is cached");
        // Exactly 1,024: one step, but never the whole prompt.
        let s = sink_of(1_024, "openai", "m", 0);
        assert_eq!(s.steps.len(), 1);
        assert_eq!(cache.openai(&s, 2.0), 0);
        assert_eq!(cache.openai(&s, 3.0), 0);
        // A longer prompt with the same start reads the longest step below its length.
        let s = sink_of(1_400, "openai", "m", 0);
        assert_eq!(cache.openai(&s, 4.0), 1_024);
        assert_eq!(cache.openai(&s, 5.0), 1_280);
        // Another scope, another model or another first token: nothing.
        assert_eq!(cache.openai(&sink_of(1_400, "azure", "m", 0), 6.0), 0);
        assert_eq!(cache.openai(&sink_of(1_400, "openai", "m2", 0), 6.0), 0);
        assert_eq!(cache.openai(&sink_of(1_400, "openai", "m", 7), 6.0), 0);
        // An hour without use forgets it.
        assert_eq!(cache.openai(&s, 5.0 + 3_599.0), 1_280);
        assert_eq!(cache.openai(&s, 5.0 + 3_599.0 + 3_601.0), 0);
    }

    #[test]
    fn anthropic_reads_the_longest_live_breakpoint_and_writes_the_rest() {
        let mut cache = PromptCache::default();
        let bp = |tokens, ttl, key| Breakpoint { tokens, ttl, key };
        let model = "claude-sonnet-4-5";
        let a =
            [bp(500, Ttl::OneHour, 1), bp(1_500, Ttl::OneHour, 2), bp(3_000, Ttl::FiveMinutes, 3)];
        // 500 is under the minimum: not written; its tokens go with the next written breakpoint.
        let first = cache.anthropic(model, &a, 0.0);
        assert_eq!(first, AnthropicCacheUse { read: 0, write_5m: 1_500, write_1h: 1_500 });
        let second = cache.anthropic(model, &a, 10.0);
        assert_eq!(second, AnthropicCacheUse { read: 3_000, write_5m: 0, write_1h: 0 });
        // After 5 minutes without use the 5-minute entry is gone; the 1-hour one is read.
        let third = cache.anthropic(model, &a, 10.0 + 301.0);
        assert_eq!(third, AnthropicCacheUse { read: 1_500, write_5m: 1_500, write_1h: 0 });
        // Haiku 4.5 needs 4,096 tokens.
        assert_eq!(cache.anthropic("claude-haiku-4-5", &a, 0.0), AnthropicCacheUse::default());
        assert_eq!(anthropic_min_cacheable("claude-3-5-haiku-20241022"), 2_048);
        assert_eq!(anthropic_min_cacheable("claude-opus-4-5-20251101"), 4_096);
        assert_eq!(anthropic_min_cacheable("claude-opus-4-1"), 1_024);
    }

    #[test]
    fn cache_control_is_checked_like_the_api() {
        let obj = |v: Value| v.as_object().unwrap().clone();
        let cc = serde_json::json!({"type": "ephemeral"});
        let block =
            |cc: &Value| serde_json::json!({"type": "text", "text": "x", "cache_control": cc});
        let five = obj(
            serde_json::json!({"messages": [{"role": "user", "content": vec![block(&cc); 5]}]}),
        );
        assert_eq!(
            anthropic_marks(&five, "anthropic", "m").unwrap_err(),
            "A maximum of 4 blocks with cache_control may be provided. Found 5."
        );
        let bad_ttl = obj(
            serde_json::json!({"system": [block(&serde_json::json!({"type": "ephemeral", "ttl": "2h"}))]}),
        );
        assert_eq!(
            anthropic_marks(&bad_ttl, "anthropic", "m").unwrap_err(),
            "system.0.cache_control.ttl: Input should be '5m' or '1h'"
        );
        // The same content marked with another TTL or elsewhere keys the same.
        let one_h = serde_json::json!({"type": "ephemeral", "ttl": "1h"});
        let a = obj(
            serde_json::json!({"system": [block(&cc)], "messages": [{"role": "user", "content": "q"}]}),
        );
        let b = obj(
            serde_json::json!({"system": [block(&one_h)], "messages": [{"role": "user", "content": [block(&cc)]}]}),
        );
        let (ka, kb) = (
            anthropic_marks(&a, "anthropic", "m").unwrap(),
            anthropic_marks(&b, "anthropic", "m").unwrap(),
        );
        assert_eq!(ka.len(), 1);
        assert_eq!(kb.len(), 2);
        assert_eq!(ka[0].1, kb[0].1);
        assert_eq!(kb[0].0, Ttl::OneHour);
        assert_ne!(kb[0].1, kb[1].1);
        assert!(
            anthropic_marks(&obj(serde_json::json!({"system": "s"})), "anthropic", "m")
                .unwrap()
                .is_empty()
        );
    }
}
