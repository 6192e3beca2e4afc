//! Cost estimates before a job runs: the worst case of a set of requests, and a monthly
//! projection of a recurring job.

use serde::Serialize;
use serde_json::Value;

use crate::count;
use crate::price::{Costs, ModelPrice, PriceRules, PriceTable, costs};
use crate::usage::TokenUsage;
use crate::{Endpoint, ProviderKind};

/// The worst case of a set of requests, accumulated one request at a time.
///
/// Input is counted by [`count::input_tokens`] and priced as uncached batch input. Output is the
/// body's own limit, else the model's `max_output_tokens`; embeddings and moderations have none.
///
/// A worst case that leaves some requests out is no worst case: once a request's model is not
/// in the price table, or neither its body nor the table bounds its output, `cost_max` and
/// `sync_cost_max` are `None` for good and the model is listed in `unpriced_models`. The token
/// counts still cover every request (an unbounded output adds nothing to `max_output_tokens`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Estimate {
    /// Requests added.
    pub requests: u64,
    /// Their input tokens.
    pub input_tokens: u64,
    /// The most output they may produce.
    pub max_output_tokens: u64,
    /// The most they may cost in a batch, in USD.
    pub cost_max: Option<f64>,
    /// The most the same requests may cost synchronously, with no cache, in USD.
    pub sync_cost_max: Option<f64>,
    /// Models no worst case could be priced for, each once, in the order met.
    pub unpriced_models: Vec<String>,
    /// Requests whose cost nothing bounds (images, audio, files): no worst case holds them.
    pub unbounded_requests: u64,
}

impl Default for Estimate {
    fn default() -> Self {
        Self::new()
    }
}

impl Estimate {
    /// No requests, costing nothing.
    pub fn new() -> Self {
        Self {
            requests: 0,
            input_tokens: 0,
            max_output_tokens: 0,
            cost_max: Some(0.0),
            sync_cost_max: Some(0.0),
            unpriced_models: Vec::new(),
            unbounded_requests: 0,
        }
    }

    /// Adds one request for `model` at `provider`'s `endpoint`.
    pub fn add(
        &mut self,
        provider: ProviderKind,
        endpoint: Endpoint,
        model: &str,
        body: &Value,
        prices: &PriceTable,
    ) {
        let worst = worst_case(provider, endpoint, model, body, prices);
        self.requests += 1;
        self.input_tokens += worst.input_tokens;
        self.max_output_tokens += worst.output_tokens.unwrap_or(0);
        match worst.costs {
            Some(worst) => {
                self.cost_max = self.cost_max.map(|c| c + worst.cost);
                self.sync_cost_max = self.sync_cost_max.map(|c| c + worst.sync_cost);
            }
            None => {
                self.cost_max = None;
                self.sync_cost_max = None;
                if worst.unbounded.is_some() {
                    self.unbounded_requests += 1;
                } else if !self.unpriced_models.iter().any(|m| m == model) {
                    self.unpriced_models.push(model.to_owned());
                }
            }
        }
    }
}

/// Claude's tokenizer is not published: input counted with the stand-in encoding is taken
/// this much larger in a worst case, so that a budget holds even where Claude's count is the
/// larger (the stand-in's counts of English prose run lower than Claude's by up to about a
/// fifth in public comparisons).
pub const ANTHROPIC_TOKENIZER_MARGIN: f64 = 1.3;

/// The system prompt Anthropic adds to a request with tools, in tokens: its tool-use guide gives
/// 313 to 346 for current Claude models, so a worst case takes somewhat more.
pub const ANTHROPIC_TOOL_USE_TOKENS: u64 = 400;

/// Content the count cannot bound: it is billed by size or duration in ways a text tokenizer
/// does not see.
const MEDIA_PARTS: [&str; 8] =
    ["image_url", "input_image", "image", "input_audio", "audio", "file", "input_file", "document"];

/// The content parts of a body's messages (chat and Anthropic `messages`, Responses `input`).
fn parts(body: &Value) -> impl Iterator<Item = &Value> {
    ["messages", "input"]
        .into_iter()
        .filter_map(|key| body.get(key).and_then(Value::as_array))
        .flatten()
        .filter_map(|message| message.get("content").and_then(Value::as_array))
        .flatten()
}

/// Why a body's cost has no worst case, if it has none.
fn unbounded(body: &Value) -> Option<String> {
    let media = parts(body)
        .filter_map(|part| part.get("type").and_then(Value::as_str))
        .find(|kind| MEDIA_PARTS.contains(kind))?;
    Some(format!("a `{media}` part is billed in ways a token count cannot bound"))
}

/// Input the message count leaves out but the provider bills: structured parts that are not
/// text (tool calls and their results) as their compact JSON, an output format's schema, and
/// Anthropic's tool-use system prompt.
fn uncounted_input(provider: ProviderKind, model: &str, body: &Value) -> u64 {
    let encoding = count::Encoding::for_model(provider, model);
    let json = |v: &Value| encoding.count(&v.to_string());
    let structured: u64 = parts(body)
        .filter(|part| {
            let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
            !matches!(kind, "text" | "input_text" | "output_text")
        })
        .map(json)
        .sum();
    let calls: u64 = body
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|m| m.get("tool_calls"))
        .map(json)
        .sum();
    let format: u64 =
        ["response_format", "text"].iter().filter_map(|k| body.get(*k)).map(json).sum();
    let tool_use = match provider {
        ProviderKind::Anthropic if body.get("tools").is_some() => ANTHROPIC_TOOL_USE_TOKENS,
        _ => 0,
    };
    structured + calls + format + tool_use
}

/// The most one request may cost, and the tokens it was counted at.
#[derive(Debug, Clone, PartialEq)]
pub struct WorstCase {
    /// Its input tokens as counted ([`count::input_tokens`]), without margin.
    pub input_tokens: u64,
    /// The most output it may produce; `None` when neither the body nor the table bounds it.
    pub output_tokens: Option<u64>,
    /// `None` when the model is unpriced, the output unbounded or the input beyond counting.
    pub costs: Option<Costs>,
    /// Why nothing bounds the request's cost (media parts), when nothing does.
    pub unbounded: Option<String>,
}

/// The most one request for `model` at `provider`'s `endpoint` may cost. Input is priced as if
/// all of it were written to the prompt cache where the provider charges more for that
/// (Anthropic: 1.25 times, twice where the body asks for one-hour entries), and, for Anthropic,
/// with [`ANTHROPIC_TOKENIZER_MARGIN`]; output at the body's own limit, else the model's
/// maximum; embeddings and moderations have none.
pub fn worst_case(
    provider: ProviderKind,
    endpoint: Endpoint,
    model: &str,
    body: &Value,
    prices: &PriceTable,
) -> WorstCase {
    let input_tokens = count::input_tokens(provider, endpoint, body);
    let price = prices.lookup(provider, model);
    // `n` (and `best_of`) answers each cost their own output.
    let choices = ["n", "best_of"]
        .iter()
        .filter_map(|k| body.get(*k).and_then(Value::as_u64))
        .max()
        .unwrap_or(1)
        .max(1);
    let output_tokens = match endpoint {
        Endpoint::Embeddings | Endpoint::Moderations => Some(0),
        _ => count::output_limit(body)
            .or_else(|| price.as_ref().and_then(|p| p.max_output_tokens))
            .map(|limit| limit.saturating_mul(choices)),
    };
    let unbounded = unbounded(body);
    let billed_input = input_tokens + uncounted_input(provider, model, body);
    let costs = price.zip(output_tokens).filter(|_| unbounded.is_none()).map(|(price, output)| {
        let rules = prices.rules(provider);
        let usage = if provider == ProviderKind::Anthropic {
            let input = (billed_input as f64 * ANTHROPIC_TOKENIZER_MARGIN).ceil() as u64;
            let one_hour = body.to_string().contains(r#""ttl":"1h""#);
            let (cache_write_5m, cache_write_1h) = if one_hour { (0, input) } else { (input, 0) };
            TokenUsage { input, cache_write_5m, cache_write_1h, output, ..TokenUsage::default() }
        } else {
            TokenUsage { input: billed_input, output, ..TokenUsage::default() }
        };
        let mut worst = costs(&usage, &price, &rules);
        // The synchronous figure is the same tokens without caching, whatever the batch paid.
        worst.cost = worst.cost.max(
            costs(&TokenUsage { cache_write_5m: 0, cache_write_1h: 0, ..usage }, &price, &rules)
                .cost,
        );
        worst
    });
    WorstCase { input_tokens, output_tokens, costs, unbounded }
}

/// What a job run `runs_per_month` times costs a month in batches, in USD:
/// `runs × (input × input_price × (1 − hit_rate × (1 − read_ratio)) × batch + output ×
/// output_price × batch)`, prices per token.
///
/// `read_ratio` is the cache-read price over the input price ([`ModelPrice::read_price`]: for
/// OpenAI `cached_input / input`, for Anthropic the 0.1 multiplier); 1 when the provider's cache
/// does not stack with its batch discount. `cache_hit_rate` is clamped to 0..=1. Cache writes
/// are not counted.
pub fn monthly(
    input_tokens_per_run: u64,
    output_tokens_per_run: u64,
    runs_per_month: f64,
    cache_hit_rate: f64,
    price: &ModelPrice,
    rules: &PriceRules,
) -> f64 {
    let hit_rate = if cache_hit_rate.is_nan() { 0.0 } else { cache_hit_rate.clamp(0.0, 1.0) };
    let read_ratio =
        if rules.stacks && price.input > 0.0 { price.read_price(rules) / price.input } else { 1.0 };
    let per_token = |price_per_million: f64| price_per_million / 1_000_000.0;
    let input = input_tokens_per_run as f64
        * per_token(price.input)
        * (1.0 - hit_rate * (1.0 - read_ratio))
        * rules.batch;
    let output = output_tokens_per_run as f64 * per_token(price.output) * rules.batch;
    runs_per_month * (input + output)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::count::Encoding;

    #[test]
    fn the_worst_case_covers_choices_tool_calls_and_formats_and_refuses_media() {
        let prices = PriceTable::bundled();
        let text = json!({"model": "gpt-4o-mini", "max_tokens": 10,
                          "messages": [{"role": "user", "content": "Hi"}]});
        let chat = Endpoint::ChatCompletions;
        let base = worst_case(ProviderKind::Openai, chat, "gpt-4o-mini", &text, &prices);
        assert_eq!((base.output_tokens, base.unbounded), (Some(10), None));
        let mut three = text.clone();
        three["n"] = json!(3);
        let worst = worst_case(ProviderKind::Openai, chat, "gpt-4o-mini", &three, &prices);
        assert_eq!(worst.output_tokens, Some(30), "each answer has its own output");
        let mut formatted = text;
        formatted["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "x",
            "schema": {"type": "object", "properties": {"label": {"type": "string"}}}}});
        let worst = worst_case(ProviderKind::Openai, chat, "gpt-4o-mini", &formatted, &prices);
        assert!(worst.costs.unwrap().cost > base.costs.unwrap().cost, "the schema is input too");
        let image = json!({"model": "gpt-4o-mini", "max_tokens": 10, "messages": [{"role": "user",
            "content": [{"type": "text", "text": "What is it?"},
                        {"type": "image_url", "image_url": {"url": "https://example.invalid/a.png"}}]}]});
        let worst = worst_case(ProviderKind::Openai, chat, "gpt-4o-mini", &image, &prices);
        assert!(worst.costs.is_none() && worst.unbounded.unwrap().contains("image_url"));
        let mut estimate = Estimate::new();
        estimate.add(ProviderKind::Openai, chat, "gpt-4o-mini", &image, &prices);
        assert_eq!((estimate.cost_max, estimate.unbounded_requests), (None, 1));
        assert!(estimate.unpriced_models.is_empty(), "the model has a price");
        // Anthropic: a tool result is input, and tools bring their system prompt.
        let plain = json!({"model": "claude-sonnet-4-5", "max_tokens": 10,
                           "messages": [{"role": "user", "content": "Hi"}]});
        let tools = json!({"model": "claude-sonnet-4-5", "max_tokens": 10,
            "tools": [{"name": "t", "input_schema": {"type": "object"}}],
            "messages": [{"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "x", "content": "42"}]}]});
        let msgs = Endpoint::AnthropicMessages;
        let a = worst_case(ProviderKind::Anthropic, msgs, "claude-sonnet-4-5", &plain, &prices);
        let b = worst_case(ProviderKind::Anthropic, msgs, "claude-sonnet-4-5", &tools, &prices);
        let (a, b) = (a.costs.unwrap().cost, b.costs.unwrap().cost);
        // 400 tool-use tokens alone, with the margin, at the 5-minute write price, halved.
        assert!(b - a > 400.0 * 1.3 * 3.75 / 1e6 * 0.5, "{a} {b}");
    }

    #[track_caller]
    fn close(actual: f64, expected: f64) {
        let tolerance = 1e-12 * expected.abs().max(1.0);
        assert!((actual - expected).abs() <= tolerance, "{actual} != {expected}");
    }

    #[test]
    fn the_worst_case_uses_the_body_limit_else_the_model_maximum() {
        let prices = PriceTable::bundled();
        let mut estimate = Estimate::new();
        let limited = json!({
            "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": "Hi"}],
            "max_completion_tokens": 1000
        });
        let unlimited = json!({"model": "gpt-4o-mini", "messages": []});
        let (p, o) = (ProviderKind::Openai, Endpoint::ChatCompletions);
        estimate.add(p, o, "gpt-4o-mini", &limited, &prices);
        estimate.add(p, o, "gpt-4o-mini", &unlimited, &prices);
        // Inputs: 3 + (3 + "user" 1 + "Hi" 1) = 8, and 3.
        let o200k = |s| Encoding::O200kBase.count(s);
        assert_eq!((o200k("user"), o200k("Hi")), (1, 1));
        assert_eq!(estimate.requests, 2);
        assert_eq!(estimate.input_tokens, 11);
        // Outputs: the body's 1,000, and gpt-4o-mini's 16,384.
        assert_eq!(estimate.max_output_tokens, 17_384);
        // batch: 11 × 0.15/1M × 0.5 + 17,384 × 0.60/1M × 0.5
        //      = 0.000000825 + 0.0052152 = 0.005216025.
        close(estimate.cost_max.unwrap(), 0.005_216_025);
        // sync: 11 × 0.15/1M + 17,384 × 0.60/1M = 0.00000165 + 0.0104304 = 0.01043205.
        close(estimate.sync_cost_max.unwrap(), 0.010_432_05);
        assert!(estimate.unpriced_models.is_empty());
    }

    #[test]
    fn embeddings_have_no_output() {
        let prices = PriceTable::bundled();
        let mut estimate = Estimate::default();
        let body = json!({"model": "text-embedding-3-small", "input": "hello world"});
        estimate.add(
            ProviderKind::Openai,
            Endpoint::Embeddings,
            "text-embedding-3-small",
            &body,
            &prices,
        );
        // "hello world" is 2 tokens: 2 × 0.02/1M × 0.5 = 0.00000002.
        assert_eq!((estimate.input_tokens, estimate.max_output_tokens), (2, 0));
        close(estimate.cost_max.unwrap(), 0.000_000_02);
    }

    #[test]
    fn an_unpriced_model_leaves_no_total_and_is_listed_once() {
        let prices = PriceTable::bundled();
        let mut estimate = Estimate::new();
        let (p, o) = (ProviderKind::Anthropic, Endpoint::AnthropicMessages);
        let known = json!({"model": "claude-haiku-4-5", "max_tokens": 10, "messages": []});
        let unknown = json!({"model": "claude-mystery", "max_tokens": 10, "messages": []});
        estimate.add(p, o, "claude-haiku-4-5", &known, &prices);
        assert!(estimate.cost_max.is_some());
        estimate.add(p, o, "claude-mystery", &unknown, &prices);
        estimate.add(p, o, "claude-mystery", &unknown, &prices);
        estimate.add(p, o, "claude-haiku-4-5", &known, &prices);
        assert_eq!(estimate.cost_max, None);
        assert_eq!(estimate.sync_cost_max, None);
        assert_eq!(estimate.unpriced_models, ["claude-mystery"]);
        assert_eq!(estimate.requests, 4);
        assert_eq!(estimate.input_tokens, 4 * 3);
        assert_eq!(estimate.max_output_tokens, 40);
    }

    #[test]
    fn a_model_without_an_output_bound_is_unpriced_when_the_body_sets_none() {
        let mut prices = PriceTable::bundled();
        prices.overlay(PriceTable::from_toml("[openai.\"mine\"]\ninput = 1\noutput = 2").unwrap());
        let mut estimate = Estimate::new();
        let (p, o) = (ProviderKind::Openai, Endpoint::ChatCompletions);
        estimate.add(p, o, "mine", &json!({"max_tokens": 5}), &prices);
        assert!(estimate.cost_max.is_some());
        estimate.add(p, o, "mine", &json!({}), &prices);
        assert_eq!(estimate.cost_max, None);
        assert_eq!(estimate.unpriced_models, ["mine"]);
    }

    #[test]
    fn monthly_follows_the_formula() {
        let prices = PriceTable::bundled();
        // gpt-4.1: $2 in, $0.50 cached (ratio 0.25), $8 out per 1M; batch 0.5.
        let price = prices.lookup(ProviderKind::Openai, "gpt-4.1").unwrap();
        let rules = prices.rules(ProviderKind::Openai);
        let m = monthly(10_000_000, 1_000_000, 30.0, 0.5, &price, &rules);
        // input: 10M × 2/1M × (1 − 0.5 × (1 − 0.25)) × 0.5 = 20 × 0.625 × 0.5 = 6.25;
        // output: 1M × 8/1M × 0.5 = 4; a run 10.25, 30 runs 307.5.
        close(m, 307.5);

        // claude-sonnet-4-5: $3 in, reads 0.1×, $15 out; 90% hits, 4 runs.
        let price = prices.lookup(ProviderKind::Anthropic, "claude-sonnet-4-5").unwrap();
        let rules = prices.rules(ProviderKind::Anthropic);
        let m = monthly(2_000_000, 100_000, 4.0, 0.9, &price, &rules);
        // input: 2M × 3/1M × (1 − 0.9 × 0.9) × 0.5 = 6 × 0.19 × 0.5 = 0.57;
        // output: 100k × 15/1M × 0.5 = 0.75; a run 1.32, 4 runs 5.28.
        close(m, 5.28);

        // No hits: plain batch prices. Hit rates outside 0..=1 are clamped.
        close(monthly(1_000_000, 0, 1.0, 0.0, &price, &rules), 1.5);
        close(monthly(1_000_000, 0, 1.0, 7.0, &price, &rules), 0.15);

        // A cache that does not stack: hits change nothing.
        let flat = PriceRules { stacks: false, ..rules };
        close(monthly(1_000_000, 0, 1.0, 0.9, &price, &flat), 1.5);
    }
}
