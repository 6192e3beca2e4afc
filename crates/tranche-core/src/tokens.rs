//! Token estimates for admission control: rough, cheap, and never zero.

use serde::Deserialize;

#[derive(Deserialize)]
struct OutputLimits {
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    max_output_tokens: Option<u64>,
}

/// Estimated tokens a request puts in a provider's batch queue: about one token per four
/// bytes of its body, plus the output it may produce (`max_tokens`, `max_completion_tokens`
/// or `max_output_tokens`).
pub fn estimate(body: &str) -> u64 {
    let output = serde_json::from_str::<OutputLimits>(body)
        .ok()
        .and_then(|l| l.max_completion_tokens.or(l.max_tokens).or(l.max_output_tokens));
    estimate_from(body.len(), output)
}

/// The body fields that cap a response's tokens, the first one that holds a whole number
/// counting.
pub const OUTPUT_LIMIT_KEYS: [&str; 3] =
    ["max_completion_tokens", "max_tokens", "max_output_tokens"];

/// The output a body allows, read from a parsed body (as [`estimate`] reads it from text).
pub fn output_limit(body: &serde_json::Map<String, serde_json::Value>) -> Option<u64> {
    OUTPUT_LIMIT_KEYS.iter().find_map(|key| body.get(*key).and_then(serde_json::Value::as_u64))
}

/// [`estimate`] from a body's length in bytes and the output it allows.
pub fn estimate_from(body_len: usize, output_limit: Option<u64>) -> u64 {
    let input = (body_len as u64).div_ceil(4).max(1);
    input.saturating_add(output_limit.unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_input_and_allowed_output() {
        let body = r#"{"model":"m","messages":[],"max_tokens":100}"#;
        assert_eq!(estimate(body), (body.len() as u64).div_ceil(4) + 100);
        let body = r#"{"model":"m","max_completion_tokens":7,"max_tokens":100}"#;
        assert_eq!(estimate(body), (body.len() as u64).div_ceil(4) + 7);
        assert_eq!(estimate("{}"), 1);
        let parsed: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(body).unwrap();
        assert_eq!(estimate_from(body.len(), output_limit(&parsed)), estimate(body));
    }
}
