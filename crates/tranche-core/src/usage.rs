//! The tokens one answered request was billed for, by kind, as every provider reports them
//! normalised to one shape.
//!
//! `input` counts every input token: read from the prompt cache, written to it, or neither
//! (OpenAI's `prompt_tokens` already includes `cached_tokens`; Anthropic's `input_tokens`
//! counts only what follows the last cache breakpoint, so its reads and writes are added).
//! `output` counts every output token, reasoning included.

use serde::{Deserialize, Serialize};

/// Billed tokens of one attempt, or a sum of many.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TokenUsage {
    /// Every input token, cached and cache-written included.
    pub input: u64,
    /// The part of `input` read from the prompt cache.
    pub cached_input: u64,
    /// The part of `input` written to the cache for 5 minutes (Anthropic's default).
    pub cache_write_5m: u64,
    /// The part of `input` written to the cache for 1 hour.
    pub cache_write_1h: u64,
    /// Every output token, reasoning included.
    pub output: u64,
    /// The part of `output` spent reasoning.
    pub reasoning: u64,
}

impl TokenUsage {
    /// Input tokens written to the cache, for either lifetime.
    pub fn cache_write(&self) -> u64 {
        self.cache_write_5m + self.cache_write_1h
    }

    /// Input tokens neither read from nor written to the cache.
    pub fn uncached_input(&self) -> u64 {
        self.input.saturating_sub(self.cached_input + self.cache_write())
    }

    /// Whether no token of any kind was counted.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

impl std::ops::AddAssign for TokenUsage {
    fn add_assign(&mut self, other: Self) {
        self.input += other.input;
        self.cached_input += other.cached_input;
        self.cache_write_5m += other.cache_write_5m;
        self.cache_write_1h += other.cache_write_1h;
        self.output += other.output;
        self.reasoning += other.reasoning;
    }
}

impl std::ops::Add for TokenUsage {
    type Output = Self;

    fn add(mut self, other: Self) -> Self {
        self += other;
        self
    }
}

impl std::iter::Sum for TokenUsage {
    fn sum<I: Iterator<Item = Self>>(iter: I) -> Self {
        iter.fold(Self::default(), |a, b| a + b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_add_up_and_split_input() {
        let a =
            TokenUsage { input: 100, cached_input: 60, cache_write_5m: 10, ..Default::default() };
        let b = TokenUsage { input: 50, cache_write_1h: 20, output: 7, reasoning: 3, ..a };
        let sum: TokenUsage = [a, b].into_iter().sum();
        assert_eq!(sum.input, 150);
        assert_eq!(sum.cached_input, 120);
        assert_eq!(sum.cache_write(), 40);
        assert_eq!(sum.uncached_input(), 0, "never below zero");
        assert_eq!(a.uncached_input(), 30);
        assert_eq!((sum.output, sum.reasoning), (7, 3));
        assert!(TokenUsage::default().is_empty());
    }
}
