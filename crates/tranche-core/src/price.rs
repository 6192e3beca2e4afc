//! Prices: the bundled price table (`prices.toml`), a user's price file laid over it, and the
//! arithmetic from billed tokens to USD under each provider's batch and prompt-cache rules.
//!
//! Prices are each model's synchronous (standard) prices in USD per 1M tokens; batch prices
//! follow from them by the provider's [`PriceRules`]. Every sum is an `f64` of USD computed from
//! integer token counts, a token costing its price per 1M divided by 1,000,000.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ProviderKind;
use crate::usage::TokenUsage;

/// The price table tranche ships with.
const BUNDLED: &str = include_str!("../prices.toml");

const MODEL_KEYS: &str = "input, output, cached_input, cache_read, max_output_tokens, date, source";
const RULE_KEYS: &str = "batch, cache_read, cache_write_5m, cache_write_1h, stacks, source";
const TOP_KEYS: &str = "rules, openai, azure, anthropic";

/// A price file that could not be read: which table and key, what is wrong, what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PriceError {
    /// Not TOML at all; the message names the line and column.
    #[error("price file is not valid TOML: {0}")]
    Syntax(String),
    /// A key the price file does not have.
    #[error("price file: unknown key `{key}` in {table}; expected one of: {expected}")]
    UnknownKey { table: String, key: String, expected: &'static str },
    /// A key every model needs.
    #[error(
        "price file: {table} lacks `{key}`; every model needs `input` and `output` in USD per 1M tokens"
    )]
    Missing { table: String, key: &'static str },
    /// A value of the wrong type or out of range.
    #[error("price file: `{key}` in {table} {problem}")]
    BadValue { table: String, key: String, problem: String },
}

/// One model's synchronous prices, in USD per 1M tokens, as a lookup found them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelPrice {
    /// The table key that matched (`gpt-4o-mini` for `gpt-4o-mini-2024-07-18`).
    pub model: String,
    /// Input neither read from nor written to the cache.
    pub input: f64,
    /// Output, reasoning included.
    pub output: f64,
    /// The model's own price for input read from the cache (OpenAI publishes one per model).
    pub cached_input: Option<f64>,
    /// This model's cache-read multiplier of `input`, overriding the provider's rule.
    pub cache_read: Option<f64>,
    /// The model's maximum output, the worst case of a request that sets no limit.
    pub max_output_tokens: Option<u64>,
    /// When the price was checked.
    pub date: Option<String>,
    /// Where the price was read.
    pub source: Option<String>,
}

impl ModelPrice {
    /// USD per 1M input tokens read from the cache: this model's `cache_read` multiplier, else its
    /// `cached_input` price, else the provider's `cache_read` multiplier, else the input price.
    pub fn read_price(&self, rules: &PriceRules) -> f64 {
        if let Some(multiplier) = self.cache_read {
            self.input * multiplier
        } else if let Some(price) = self.cached_input {
            price
        } else if let Some(multiplier) = rules.cache_read {
            self.input * multiplier
        } else {
            self.input
        }
    }
}

/// How a provider turns synchronous prices into what it bills.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PriceRules {
    /// Multiplier on every price in a batch.
    pub batch: f64,
    /// Multiplier of the input price for cache reads, for models without their own.
    pub cache_read: Option<f64>,
    /// Multiplier of the input price for tokens written to the cache for 5 minutes.
    pub cache_write_5m: f64,
    /// Multiplier of the input price for tokens written to the cache for 1 hour.
    pub cache_write_1h: f64,
    /// Whether cache prices stack with the batch discount. When not, every input token of a
    /// batch, read or written or neither, is billed at the batch input price.
    pub stacks: bool,
    /// Where the rules were read.
    pub source: Option<String>,
}

impl Default for PriceRules {
    /// Half price in a batch, no cache multipliers, stacking: what a provider without rules gets.
    fn default() -> Self {
        Self {
            batch: 0.5,
            cache_read: None,
            cache_write_5m: 1.0,
            cache_write_1h: 1.0,
            stacks: true,
            source: None,
        }
    }
}

/// One model's entry as a file gives it.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    input: f64,
    output: f64,
    cached_input: Option<f64>,
    cache_read: Option<f64>,
    max_output_tokens: Option<u64>,
    date: Option<String>,
    source: Option<String>,
}

impl Entry {
    /// Takes `input` and `output` from `user`, and every other key `user` gives.
    fn overlay(&mut self, user: Entry) {
        self.input = user.input;
        self.output = user.output;
        overlay_option(&mut self.cached_input, user.cached_input);
        overlay_option(&mut self.cache_read, user.cache_read);
        overlay_option(&mut self.max_output_tokens, user.max_output_tokens);
        overlay_option(&mut self.date, user.date);
        overlay_option(&mut self.source, user.source);
    }

    fn price(&self, model: &str) -> ModelPrice {
        ModelPrice {
            model: model.to_owned(),
            input: self.input,
            output: self.output,
            cached_input: self.cached_input,
            cache_read: self.cache_read,
            max_output_tokens: self.max_output_tokens,
            date: self.date.clone(),
            source: self.source.clone(),
        }
    }
}

/// A provider's rules as a file gives them: every key optional.
#[derive(Debug, Clone, Default, PartialEq)]
struct RulesEntry {
    batch: Option<f64>,
    cache_read: Option<f64>,
    cache_write_5m: Option<f64>,
    cache_write_1h: Option<f64>,
    stacks: Option<bool>,
    source: Option<String>,
}

impl RulesEntry {
    fn overlay(&mut self, user: RulesEntry) {
        overlay_option(&mut self.batch, user.batch);
        overlay_option(&mut self.cache_read, user.cache_read);
        overlay_option(&mut self.cache_write_5m, user.cache_write_5m);
        overlay_option(&mut self.cache_write_1h, user.cache_write_1h);
        overlay_option(&mut self.stacks, user.stacks);
        overlay_option(&mut self.source, user.source);
    }
}

fn overlay_option<T>(base: &mut Option<T>, user: Option<T>) {
    if user.is_some() {
        *base = user;
    }
}

/// Models' prices and providers' rules.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PriceTable {
    models: BTreeMap<ProviderKind, BTreeMap<String, Entry>>,
    rules: BTreeMap<ProviderKind, RulesEntry>,
}

impl PriceTable {
    /// The table tranche ships with (`prices.toml`): sourced and dated per model.
    pub fn bundled() -> PriceTable {
        // The bundled file is checked by the tests; were it ever unreadable, no model is priced.
        Self::from_toml(BUNDLED).unwrap_or_default()
    }

    /// Reads a price file of the bundled table's shape. Unknown keys and bad values are refused,
    /// naming the table and key.
    pub fn from_toml(text: &str) -> Result<PriceTable, PriceError> {
        let root: toml::Table =
            toml::from_str(text).map_err(|e| PriceError::Syntax(e.to_string()))?;
        let mut table = PriceTable::default();
        for (key, value) in root {
            let table_name = format!("[{key}]");
            let Some(inner) = value.as_table() else {
                return Err(PriceError::BadValue {
                    table: "the price file".into(),
                    key,
                    problem: "must be a table".into(),
                });
            };
            if key == "rules" {
                for (provider, rules) in inner {
                    let kind = provider_key(provider, &table_name)?;
                    let at = format!("[rules.{provider}]");
                    table.rules.insert(kind, parse_rules(rules, &at)?);
                }
            } else {
                let kind = match key.parse::<ProviderKind>() {
                    Ok(kind) => kind,
                    Err(_) => {
                        return Err(PriceError::UnknownKey {
                            table: "the price file's top level".into(),
                            key,
                            expected: TOP_KEYS,
                        });
                    }
                };
                let models = table.models.entry(kind).or_default();
                for (model, entry) in inner {
                    let at = format!("[{key}.\"{model}\"]");
                    models.insert(model.clone(), parse_entry(entry, &at)?);
                }
            }
        }
        Ok(table)
    }

    /// Lays a user's table over this one: its models replace `input` and `output` and every
    /// other key they give, or are added; its rules replace the keys they give.
    pub fn overlay(&mut self, user: PriceTable) {
        for (provider, models) in user.models {
            let base = self.models.entry(provider).or_default();
            for (model, entry) in models {
                match base.get_mut(&model) {
                    Some(existing) => existing.overlay(entry),
                    None => {
                        base.insert(model, entry);
                    }
                }
            }
        }
        for (provider, rules) in user.rules {
            self.rules.entry(provider).or_default().overlay(rules);
        }
    }

    /// The price of `model` at `provider`: its exact name, else the longest table key it extends
    /// by a snapshot stamp (`gpt-4o-mini-2024-07-18` → `gpt-4o-mini`,
    /// `claude-sonnet-4-5-20250929` → `claude-sonnet-4-5`). A stamp is dash-separated groups of
    /// digits whose first group has at least four, so `gpt-4o` never prices `gpt-4o-mini-…` and
    /// `claude-opus-4` never prices `claude-opus-4-1-…`. Azure looks in its own entries first,
    /// then in OpenAI's.
    pub fn lookup(&self, provider: ProviderKind, model: &str) -> Option<ModelPrice> {
        let order: &[ProviderKind] = match provider {
            ProviderKind::Azure => &[ProviderKind::Azure, ProviderKind::Openai],
            ProviderKind::Openai => &[ProviderKind::Openai],
            ProviderKind::Anthropic => &[ProviderKind::Anthropic],
        };
        order.iter().find_map(|p| self.lookup_in(*p, model))
    }

    fn lookup_in(&self, provider: ProviderKind, model: &str) -> Option<ModelPrice> {
        let models = self.models.get(&provider)?;
        if let Some(entry) = models.get(model) {
            return Some(entry.price(model));
        }
        models
            .iter()
            .filter(|(key, _)| {
                model
                    .strip_prefix(key.as_str())
                    .and_then(|rest| rest.strip_prefix('-'))
                    .is_some_and(is_snapshot_stamp)
            })
            .max_by_key(|(key, _)| key.len())
            .map(|(key, entry)| entry.price(key))
    }

    /// A provider's rules: its own keys, then (for Azure) OpenAI's, then [`PriceRules::default`].
    pub fn rules(&self, provider: ProviderKind) -> PriceRules {
        let mut merged = RulesEntry::default();
        if provider == ProviderKind::Azure
            && let Some(openai) = self.rules.get(&ProviderKind::Openai)
        {
            merged.overlay(openai.clone());
        }
        if let Some(own) = self.rules.get(&provider) {
            merged.overlay(own.clone());
        }
        let default = PriceRules::default();
        PriceRules {
            batch: merged.batch.unwrap_or(default.batch),
            cache_read: merged.cache_read,
            cache_write_5m: merged.cache_write_5m.unwrap_or(default.cache_write_5m),
            cache_write_1h: merged.cache_write_1h.unwrap_or(default.cache_write_1h),
            stacks: merged.stacks.unwrap_or(default.stacks),
            source: merged.source,
        }
    }

    /// Every model the table prices, by provider, in name order.
    pub fn models(&self) -> impl Iterator<Item = (ProviderKind, &str)> {
        self.models
            .iter()
            .flat_map(|(provider, models)| models.keys().map(move |m| (*provider, m.as_str())))
    }
}

/// `2024-07-18`, `20250929`, `0613`: digit groups joined by dashes, the first of four or more.
fn is_snapshot_stamp(rest: &str) -> bool {
    let mut groups = rest.split('-');
    let first_ok = groups.next().is_some_and(|g| g.len() >= 4 && all_digits(g));
    first_ok && groups.all(|g| !g.is_empty() && all_digits(g))
}

fn all_digits(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_digit())
}

fn provider_key(key: &str, table: &str) -> Result<ProviderKind, PriceError> {
    key.parse().map_err(|_| PriceError::UnknownKey {
        table: table.to_owned(),
        key: key.to_owned(),
        expected: "openai, azure, anthropic",
    })
}

fn parse_entry(value: &toml::Value, at: &str) -> Result<Entry, PriceError> {
    let Some(fields) = value.as_table() else {
        return Err(PriceError::BadValue {
            table: at.to_owned(),
            key: "(the model)".into(),
            problem: "must be a table of prices".into(),
        });
    };
    let mut input = None;
    let mut output = None;
    let mut entry = Entry {
        input: 0.0,
        output: 0.0,
        cached_input: None,
        cache_read: None,
        max_output_tokens: None,
        date: None,
        source: None,
    };
    for (key, value) in fields {
        match key.as_str() {
            "input" => input = Some(price(value, at, key)?),
            "output" => output = Some(price(value, at, key)?),
            "cached_input" => entry.cached_input = Some(price(value, at, key)?),
            "cache_read" => entry.cache_read = Some(multiplier(value, at, key)?),
            "max_output_tokens" => entry.max_output_tokens = Some(count(value, at, key)?),
            "date" => entry.date = Some(date(value, at, key)?),
            "source" => entry.source = Some(text(value, at, key)?),
            _ => {
                return Err(PriceError::UnknownKey {
                    table: at.to_owned(),
                    key: key.clone(),
                    expected: MODEL_KEYS,
                });
            }
        }
    }
    entry.input = input.ok_or(PriceError::Missing { table: at.to_owned(), key: "input" })?;
    entry.output = output.ok_or(PriceError::Missing { table: at.to_owned(), key: "output" })?;
    Ok(entry)
}

fn parse_rules(value: &toml::Value, at: &str) -> Result<RulesEntry, PriceError> {
    let Some(fields) = value.as_table() else {
        return Err(PriceError::BadValue {
            table: at.to_owned(),
            key: "(the rules)".into(),
            problem: "must be a table of rules".into(),
        });
    };
    let mut rules = RulesEntry::default();
    for (key, value) in fields {
        match key.as_str() {
            "batch" => {
                let batch = multiplier(value, at, key)?;
                if batch <= 0.0 {
                    return Err(bad(at, key, "must be above 0 (0.5 is half price)"));
                }
                rules.batch = Some(batch);
            }
            "cache_read" => rules.cache_read = Some(multiplier(value, at, key)?),
            "cache_write_5m" => rules.cache_write_5m = Some(multiplier(value, at, key)?),
            "cache_write_1h" => rules.cache_write_1h = Some(multiplier(value, at, key)?),
            "stacks" => match value {
                toml::Value::Boolean(b) => rules.stacks = Some(*b),
                other => {
                    return Err(bad(
                        at,
                        key,
                        &format!("must be true or false, not {}", shown(other)),
                    ));
                }
            },
            "source" => rules.source = Some(text(value, at, key)?),
            _ => {
                return Err(PriceError::UnknownKey {
                    table: at.to_owned(),
                    key: key.clone(),
                    expected: RULE_KEYS,
                });
            }
        }
    }
    Ok(rules)
}

fn bad(at: &str, key: &str, problem: &str) -> PriceError {
    PriceError::BadValue { table: at.to_owned(), key: key.to_owned(), problem: problem.to_owned() }
}

fn number(value: &toml::Value) -> Option<f64> {
    match value {
        toml::Value::Float(f) => Some(*f),
        toml::Value::Integer(i) => Some(*i as f64),
        _ => None,
    }
}

/// A price in USD per 1M tokens: a finite number, 0 or more.
fn price(value: &toml::Value, at: &str, key: &str) -> Result<f64, PriceError> {
    match number(value) {
        Some(n) if n.is_finite() && n >= 0.0 => Ok(n),
        Some(n) => {
            Err(bad(at, key, &format!("must be a price of 0 or more USD per 1M tokens, not {n}")))
        }
        None => Err(bad(
            at,
            key,
            &format!("must be a number of USD per 1M tokens (like 2.50), not {}", shown(value)),
        )),
    }
}

/// A multiplier of a price: a finite number, 0 or more.
fn multiplier(value: &toml::Value, at: &str, key: &str) -> Result<f64, PriceError> {
    match number(value) {
        Some(n) if n.is_finite() && n >= 0.0 => Ok(n),
        Some(n) => Err(bad(at, key, &format!("must be a multiplier of 0 or more, not {n}"))),
        None => Err(bad(
            at,
            key,
            &format!("must be a number multiplying a price (like 0.5), not {}", shown(value)),
        )),
    }
}

fn count(value: &toml::Value, at: &str, key: &str) -> Result<u64, PriceError> {
    match value {
        toml::Value::Integer(i) if *i >= 0 => Ok(*i as u64),
        other => {
            Err(bad(at, key, &format!("must be a whole number of tokens, not {}", shown(other))))
        }
    }
}

fn text(value: &toml::Value, at: &str, key: &str) -> Result<String, PriceError> {
    match value {
        toml::Value::String(s) => Ok(s.clone()),
        other => Err(bad(at, key, &format!("must be a quoted string, not {}", shown(other)))),
    }
}

/// A date: `"2026-12-01"` or a bare TOML date `2026-12-01`.
fn date(value: &toml::Value, at: &str, key: &str) -> Result<String, PriceError> {
    let s = match value {
        toml::Value::String(s) => s.clone(),
        toml::Value::Datetime(d) => d.to_string(),
        other => {
            return Err(bad(
                at,
                key,
                &format!("must be a date like \"2026-12-01\", not {}", shown(other)),
            ));
        }
    };
    let b = s.as_bytes();
    let shaped = b.len() == 10
        && b[4] == b'-'
        && b[7] == b'-'
        && b.iter().enumerate().all(|(i, c)| i == 4 || i == 7 || c.is_ascii_digit());
    if shaped {
        Ok(s)
    } else {
        Err(bad(at, key, &format!("must be a date like \"2026-12-01\", not \"{s}\"")))
    }
}

/// A value as the error message shows it: its type and, when short, itself.
fn shown(value: &toml::Value) -> String {
    match value {
        toml::Value::String(s) => format!("the string \"{s}\""),
        toml::Value::Integer(i) => format!("the integer {i}"),
        toml::Value::Float(f) => format!("the number {f}"),
        toml::Value::Boolean(b) => format!("the boolean {b}"),
        toml::Value::Datetime(d) => format!("the date {d}"),
        toml::Value::Array(_) => "an array".into(),
        toml::Value::Table(_) => "a table".into(),
    }
}

/// What some billed tokens cost, in USD.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Costs {
    /// What the provider bills for them in a batch, caching as it happened.
    pub cost: f64,
    /// The same tokens sent synchronously with no cache: every input token at the input price.
    pub sync_cost: f64,
    /// The same tokens sent synchronously, caching as it happened.
    pub sync_cached_cost: f64,
}

impl Costs {
    /// What the prompt cache saved (negative when cache writes cost more than reads saved).
    pub fn cache_savings(&self) -> f64 {
        self.sync_cost - self.sync_cached_cost
    }

    /// What batching saved on top of the cache: `sync_cost - cache_savings - cost`.
    pub fn batch_savings(&self) -> f64 {
        self.sync_cost - self.cache_savings() - self.cost
    }
}

impl std::ops::AddAssign for Costs {
    fn add_assign(&mut self, other: Self) {
        self.cost += other.cost;
        self.sync_cost += other.sync_cost;
        self.sync_cached_cost += other.sync_cached_cost;
    }
}

impl std::ops::Add for Costs {
    type Output = Self;

    fn add(mut self, other: Self) -> Self {
        self += other;
        self
    }
}

impl std::iter::Sum for Costs {
    fn sum<I: Iterator<Item = Self>>(iter: I) -> Self {
        iter.fold(Self::default(), |a, b| a + b)
    }
}

impl fmt::Display for Costs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "${:.4} (synchronously ${:.4}, ${:.4} with the cache)",
            self.cost, self.sync_cost, self.sync_cached_cost
        )
    }
}

const PER_MILLION: f64 = 1_000_000.0;

/// USD for `tokens` at `price_per_million`.
fn usd(tokens: u64, price_per_million: f64) -> f64 {
    tokens as f64 * price_per_million / PER_MILLION
}

/// What `usage` costs at `price` under `rules`.
///
/// In a batch (`cost`), every price is multiplied by `rules.batch`: uncached input at the input
/// price, cache reads at [`ModelPrice::read_price`], cache writes at the input price times the
/// write multiplier of their lifetime, output at the output price. When the cache does not stack
/// with the batch discount, all input is billed at the batch input price instead.
pub fn costs(usage: &TokenUsage, price: &ModelPrice, rules: &PriceRules) -> Costs {
    let read = price.read_price(rules);
    let write_5m = price.input * rules.cache_write_5m;
    let write_1h = price.input * rules.cache_write_1h;
    let cached_input = usd(usage.uncached_input(), price.input)
        + usd(usage.cached_input, read)
        + usd(usage.cache_write_5m, write_5m)
        + usd(usage.cache_write_1h, write_1h);
    let output = usd(usage.output, price.output);
    let batch_input = if rules.stacks {
        cached_input
    } else {
        let tokens = usage.uncached_input() + usage.cached_input + usage.cache_write();
        usd(tokens, price.input)
    };
    Costs {
        cost: (batch_input + output) * rules.batch,
        sync_cost: usd(usage.input, price.input) + output,
        sync_cached_cost: cached_input + output,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Equal to a part in 10^12 (the sums are of a few products of decimals).
    #[track_caller]
    fn close(actual: f64, expected: f64) {
        let tolerance = 1e-12 * expected.abs().max(1.0);
        assert!((actual - expected).abs() <= tolerance, "{actual} != {expected}");
    }

    fn bundled(provider: ProviderKind, model: &str) -> (ModelPrice, PriceRules) {
        let table = PriceTable::bundled();
        (table.lookup(provider, model).unwrap(), table.rules(provider))
    }

    #[test]
    fn the_bundled_table_reads_and_prices_what_it_promises() {
        let table = PriceTable::from_toml(BUNDLED).unwrap();
        assert_eq!(table, PriceTable::bundled());
        for (provider, models) in [
            (
                ProviderKind::Openai,
                &[
                    "gpt-4o",
                    "gpt-4o-mini",
                    "gpt-4.1",
                    "gpt-4.1-mini",
                    "gpt-4.1-nano",
                    "gpt-5",
                    "gpt-5-mini",
                    "gpt-5-nano",
                    "o3",
                    "o4-mini",
                    "text-embedding-3-small",
                    "text-embedding-3-large",
                ][..],
            ),
            (
                ProviderKind::Anthropic,
                &[
                    "claude-opus-4-1",
                    "claude-sonnet-4-5",
                    "claude-sonnet-4",
                    "claude-haiku-4-5",
                    "claude-3-5-haiku",
                ][..],
            ),
        ] {
            for model in models {
                let price = table.lookup(provider, model).unwrap();
                assert!(price.max_output_tokens.is_some(), "{model} has no max_output_tokens");
                assert!(price.source.as_deref().is_some_and(|s| s.starts_with("https://")));
                assert!(price.date.is_some(), "{model} has no date");
            }
        }
        for provider in ProviderKind::ALL {
            let rules = table.rules(provider);
            close(rules.batch, 0.5);
            assert!(rules.stacks);
            assert!(rules.source.is_some());
        }
        let anthropic = table.rules(ProviderKind::Anthropic);
        assert_eq!(anthropic.cache_read, Some(0.1));
        close(anthropic.cache_write_5m, 1.25);
        close(anthropic.cache_write_1h, 2.0);
        assert_eq!(table.rules(ProviderKind::Openai).cache_read, None);
        assert!(table.models().count() >= 17);
    }

    #[test]
    fn batch_only_openai_gpt_4o_mini() {
        // gpt-4o-mini: $0.15 in, $0.60 out per 1M; batch 0.5.
        let (price, rules) = bundled(ProviderKind::Openai, "gpt-4o-mini");
        let usage = TokenUsage { input: 1_000_000, output: 200_000, ..Default::default() };
        let c = costs(&usage, &price, &rules);
        // sync: 1M × 0.15/1M = 0.15; 200k × 0.60/1M = 0.12; total 0.27.
        close(c.sync_cost, 0.27);
        close(c.sync_cached_cost, 0.27);
        // batch: 0.27 × 0.5 = 0.135.
        close(c.cost, 0.135);
        close(c.cache_savings(), 0.0);
        close(c.batch_savings(), 0.135);
    }

    #[test]
    fn batch_with_an_openai_cache_read() {
        // gpt-4o: $2.50 in, $1.25 cached in, $10 out per 1M; batch 0.5.
        let (price, rules) = bundled(ProviderKind::Openai, "gpt-4o");
        let usage = TokenUsage {
            input: 10_000,
            cached_input: 6_000,
            output: 1_000,
            reasoning: 200,
            ..Default::default()
        };
        let c = costs(&usage, &price, &rules);
        // uncached 4,000 × 2.50/1M = 0.010; cached 6,000 × 1.25/1M = 0.0075;
        // output 1,000 × 10/1M = 0.010.
        // sync: 10,000 × 2.50/1M + 0.010 = 0.025 + 0.010 = 0.035.
        close(c.sync_cost, 0.035);
        // sync cached: 0.010 + 0.0075 + 0.010 = 0.0275.
        close(c.sync_cached_cost, 0.0275);
        // batch: 0.0275 × 0.5 = 0.01375.
        close(c.cost, 0.01375);
        // cache saved 0.035 − 0.0275 = 0.0075; batch saved 0.035 − 0.0075 − 0.01375 = 0.01375.
        close(c.cache_savings(), 0.0075);
        close(c.batch_savings(), 0.01375);
    }

    #[test]
    fn batch_with_an_anthropic_cache_read() {
        // claude-sonnet-4-5: $3 in, $15 out per 1M; reads 0.1 × input; batch 0.5.
        let (price, rules) = bundled(ProviderKind::Anthropic, "claude-sonnet-4-5");
        let usage = TokenUsage {
            input: 100_000,
            cached_input: 80_000,
            output: 2_000,
            ..Default::default()
        };
        let c = costs(&usage, &price, &rules);
        // uncached 20,000 × 3/1M = 0.06; reads 80,000 × 0.3/1M = 0.024; output 2,000 × 15/1M = 0.03.
        // sync: 100,000 × 3/1M + 0.03 = 0.33.
        close(c.sync_cost, 0.33);
        // sync cached: 0.06 + 0.024 + 0.03 = 0.114.
        close(c.sync_cached_cost, 0.114);
        // batch: 0.114 × 0.5 = 0.057.
        close(c.cost, 0.057);
        close(c.cache_savings(), 0.216);
        close(c.batch_savings(), 0.057);
    }

    #[test]
    fn batch_with_anthropic_cache_writes() {
        // claude-haiku-4-5: $1 in, $5 out per 1M; 5m writes 1.25×, 1h writes 2×; batch 0.5.
        let (price, rules) = bundled(ProviderKind::Anthropic, "claude-haiku-4-5");
        let usage = TokenUsage {
            input: 50_000,
            cache_write_5m: 20_000,
            cache_write_1h: 10_000,
            output: 4_000,
            ..Default::default()
        };
        let c = costs(&usage, &price, &rules);
        // uncached 20,000 × 1/1M = 0.02; 5m writes 20,000 × 1.25/1M = 0.025;
        // 1h writes 10,000 × 2/1M = 0.02; output 4,000 × 5/1M = 0.02.
        // sync: 50,000 × 1/1M + 0.02 = 0.07.
        close(c.sync_cost, 0.07);
        // sync cached: 0.02 + 0.025 + 0.02 + 0.02 = 0.085.
        close(c.sync_cached_cost, 0.085);
        // batch: 0.085 × 0.5 = 0.0425.
        close(c.cost, 0.0425);
        // The cache cost 0.015 more than it saved here.
        close(c.cache_savings(), -0.015);
        close(c.batch_savings(), 0.0425);
    }

    #[test]
    fn a_provider_whose_cache_does_not_stack_with_the_batch() {
        let table = PriceTable::from_toml(
            r#"
            [rules.openai]
            batch = 0.5
            stacks = false
            [openai."m"]
            input = 2
            cached_input = 0.5
            output = 8
            "#,
        )
        .unwrap();
        let (price, rules) =
            (table.lookup(ProviderKind::Openai, "m").unwrap(), table.rules(ProviderKind::Openai));
        assert!(!rules.stacks);
        let usage =
            TokenUsage { input: 10_000, cached_input: 8_000, output: 1_000, ..Default::default() };
        let c = costs(&usage, &price, &rules);
        // batch: all 10,000 input × 2/1M × 0.5 = 0.01; output 1,000 × 8/1M × 0.5 = 0.004; 0.014.
        close(c.cost, 0.014);
        // sync: 10,000 × 2/1M + 1,000 × 8/1M = 0.02 + 0.008 = 0.028.
        close(c.sync_cost, 0.028);
        // sync cached: 2,000 × 2/1M + 8,000 × 0.5/1M + 0.008 = 0.004 + 0.004 + 0.008 = 0.016.
        close(c.sync_cached_cost, 0.016);
    }

    #[test]
    fn a_model_may_override_the_cache_read_multiplier() {
        let mut table = PriceTable::bundled();
        table.overlay(
            PriceTable::from_toml(
                r#"
                [anthropic."claude-new"]
                input = 10
                output = 50
                cache_read = 0.025
                "#,
            )
            .unwrap(),
        );
        let price = table.lookup(ProviderKind::Anthropic, "claude-new").unwrap();
        let rules = table.rules(ProviderKind::Anthropic);
        // 10 × 0.025 = 0.25 per 1M, not the rule's 10 × 0.1 = 1.
        close(price.read_price(&rules), 0.25);
        let usage = TokenUsage { input: 1_000_000, cached_input: 1_000_000, ..Default::default() };
        // batch: 1M × 0.25/1M × 0.5 = 0.125.
        close(costs(&usage, &price, &rules).cost, 0.125);
    }

    #[test]
    fn costs_add_up() {
        let a = Costs { cost: 1.0, sync_cost: 3.0, sync_cached_cost: 2.0 };
        let mut sum = a;
        sum += Costs { cost: 0.5, sync_cost: 1.0, sync_cached_cost: 1.0 };
        assert_eq!(sum, Costs { cost: 1.5, sync_cost: 4.0, sync_cached_cost: 3.0 });
        assert_eq!([a, a].into_iter().sum::<Costs>(), a + a);
        close(sum.cache_savings(), 1.0);
        close(sum.batch_savings(), 1.5);
    }

    #[test]
    fn unknown_models_have_no_price() {
        let table = PriceTable::bundled();
        assert_eq!(table.lookup(ProviderKind::Openai, "gpt-9-turbo"), None);
        assert_eq!(table.lookup(ProviderKind::Openai, ""), None);
        // An Anthropic model is not an OpenAI one.
        assert_eq!(table.lookup(ProviderKind::Openai, "claude-sonnet-4-5"), None);
        // A stamp must follow a dash and be digits.
        assert_eq!(table.lookup(ProviderKind::Openai, "gpt-4o2024-08-06"), None);
        assert_eq!(table.lookup(ProviderKind::Openai, "gpt-4o-"), None);
        assert_eq!(table.lookup(ProviderKind::Openai, "gpt-4o-2024-08-06-x"), None);
    }

    #[test]
    fn snapshots_resolve_to_their_base_and_never_to_another_family() {
        let table = PriceTable::bundled();
        let base = |provider, model| table.lookup(provider, model).map(|p| p.model);
        use ProviderKind::{Anthropic, Azure, Openai};
        assert_eq!(base(Openai, "gpt-4o-mini-2024-07-18").as_deref(), Some("gpt-4o-mini"));
        assert_eq!(base(Openai, "gpt-4o-2024-08-06").as_deref(), Some("gpt-4o"));
        assert_eq!(base(Openai, "gpt-4.1-2025-04-14").as_deref(), Some("gpt-4.1"));
        assert_eq!(base(Openai, "gpt-4.1-mini-2025-04-14").as_deref(), Some("gpt-4.1-mini"));
        assert_eq!(base(Openai, "o3-2025-04-16").as_deref(), Some("o3"));
        assert_eq!(
            base(Anthropic, "claude-sonnet-4-5-20250929").as_deref(),
            Some("claude-sonnet-4-5")
        );
        assert_eq!(base(Anthropic, "claude-sonnet-4-20250514").as_deref(), Some("claude-sonnet-4"));
        assert_eq!(
            base(Anthropic, "claude-3-5-haiku-20241022").as_deref(),
            Some("claude-3-5-haiku")
        );
        assert_eq!(base(Anthropic, "claude-opus-4-1-20250805").as_deref(), Some("claude-opus-4-1"));
        // Another family never matches: gpt-4o is not gpt-4o-mini's base, o3 not o3-mini's.
        assert_eq!(base(Openai, "gpt-4o-mini-search-2025-03-11"), None);
        assert_eq!(base(Openai, "o3-mini-2025-01-31"), None);
        assert_eq!(base(Openai, "gpt-5-chat-latest"), None);
        // `claude-opus-4-2-…` is not Opus 4 (were there a `claude-opus-4` key).
        let opus4 = PriceTable::from_toml("[anthropic.\"claude-opus-4\"]\ninput = 15\noutput = 75")
            .unwrap();
        assert_eq!(opus4.lookup(Anthropic, "claude-opus-4-2-20260101"), None);
        assert!(opus4.lookup(Anthropic, "claude-opus-4-20250514").is_some());
        // Azure prices from the OpenAI table, snapshots too.
        assert_eq!(base(Azure, "gpt-4o-mini-2024-07-18").as_deref(), Some("gpt-4o-mini"));
    }

    #[test]
    fn azure_prefers_its_own_entries_and_inherits_openai_rules() {
        let mut table = PriceTable::bundled();
        table.overlay(
            PriceTable::from_toml(
                r#"
                [azure."gpt-4o-mini"]
                input = 0.165
                output = 0.66
                "#,
            )
            .unwrap(),
        );
        let azure = table.lookup(ProviderKind::Azure, "gpt-4o-mini").unwrap();
        close(azure.input, 0.165);
        assert_eq!(azure.cached_input, None, "an Azure entry does not borrow OpenAI's fields");
        close(table.lookup(ProviderKind::Openai, "gpt-4o-mini").unwrap().input, 0.15);
        // Azure's rules: its own keys, the rest from OpenAI's.
        let mut only_openai_rules =
            PriceTable::from_toml("[rules.openai]\nstacks = false").unwrap();
        assert!(!only_openai_rules.rules(ProviderKind::Azure).stacks);
        only_openai_rules.overlay(PriceTable::from_toml("[rules.azure]\nbatch = 0.6").unwrap());
        let rules = only_openai_rules.rules(ProviderKind::Azure);
        close(rules.batch, 0.6);
        assert!(!rules.stacks);
        // A table without rules uses the defaults.
        assert_eq!(PriceTable::default().rules(ProviderKind::Anthropic), PriceRules::default());
    }

    #[test]
    fn a_user_file_overrides_one_field_and_adds_a_model() {
        let mut table = PriceTable::bundled();
        let before = table.lookup(ProviderKind::Openai, "gpt-4o-mini").unwrap();
        let user = PriceTable::from_toml(
            r#"
            [rules.anthropic]
            cache_read = 0.2

            [openai."gpt-4o-mini"]
            input = 0.15
            output = 0.60
            cached_input = 0.05

            [openai."my-finetune"]
            input = 0.30
            output = 1.20
            max_output_tokens = 4096
            date = 2026-11-30
            "#,
        )
        .unwrap();
        table.overlay(user);
        let after = table.lookup(ProviderKind::Openai, "gpt-4o-mini").unwrap();
        assert_eq!(after.cached_input, Some(0.05));
        // Keys the user did not give are kept.
        assert_eq!(after.max_output_tokens, before.max_output_tokens);
        assert_eq!(after.source, before.source);
        let added = table.lookup(ProviderKind::Openai, "my-finetune").unwrap();
        close(added.input, 0.30);
        assert_eq!(added.max_output_tokens, Some(4096));
        assert_eq!(added.date.as_deref(), Some("2026-11-30"));
        let rules = table.rules(ProviderKind::Anthropic);
        assert_eq!(rules.cache_read, Some(0.2));
        close(rules.cache_write_5m, 1.25);
        assert!(rules.source.is_some());
    }

    #[test]
    fn malformed_user_files_say_where_and_what() {
        let err = |text: &str| PriceTable::from_toml(text).unwrap_err().to_string();
        assert_eq!(
            err("[openai.\"gpt-4o\"]\ninput = 2.5\noutput = 10\ninptu = 3"),
            "price file: unknown key `inptu` in [openai.\"gpt-4o\"]; expected one of: input, \
             output, cached_input, cache_read, max_output_tokens, date, source"
        );
        assert_eq!(
            err("[openai.\"gpt-4o\"]\ninput = \"2.50\"\noutput = 10"),
            "price file: `input` in [openai.\"gpt-4o\"] must be a number of USD per 1M tokens \
             (like 2.50), not the string \"2.50\""
        );
        assert_eq!(
            err("[anthropic.\"claude-x\"]\ninput = 3"),
            "price file: [anthropic.\"claude-x\"] lacks `output`; every model needs `input` and \
             `output` in USD per 1M tokens"
        );
        assert_eq!(
            err("[openai.\"m\"]\ninput = -1\noutput = 1"),
            "price file: `input` in [openai.\"m\"] must be a price of 0 or more USD per 1M \
             tokens, not -1"
        );
        assert_eq!(
            err("[gemini.\"m\"]\ninput = 1\noutput = 1"),
            "price file: unknown key `gemini` in the price file's top level; expected one of: \
             rules, openai, azure, anthropic"
        );
        assert_eq!(
            err("[rules.anthropic]\nstacks = \"yes\""),
            "price file: `stacks` in [rules.anthropic] must be true or false, not the string \"yes\""
        );
        assert_eq!(
            err("[rules.openai]\nbatch = 0"),
            "price file: `batch` in [rules.openai] must be above 0 (0.5 is half price)"
        );
        assert_eq!(
            err("[rules.openai]\ndiscount = 0.5"),
            "price file: unknown key `discount` in [rules.openai]; expected one of: batch, \
             cache_read, cache_write_5m, cache_write_1h, stacks, source"
        );
        assert_eq!(
            err("[openai.\"m\"]\ninput = 1\noutput = 1\nmax_output_tokens = 1.5"),
            "price file: `max_output_tokens` in [openai.\"m\"] must be a whole number of tokens, \
             not the number 1.5"
        );
        assert_eq!(
            err("[openai.\"m\"]\ninput = 1\noutput = 1\ndate = \"Dec 1\""),
            "price file: `date` in [openai.\"m\"] must be a date like \"2026-12-01\", not \"Dec 1\""
        );
        let syntax = err("[openai.\"m\"\ninput = 1");
        assert!(syntax.starts_with("price file is not valid TOML: "), "{syntax}");
        assert!(syntax.contains("line 1"), "{syntax}");
    }
}
