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
    let input = (body.len() as u64).div_ceil(4).max(1);
    let output = serde_json::from_str::<OutputLimits>(body)
        .ok()
        .and_then(|l| l.max_completion_tokens.or(l.max_tokens).or(l.max_output_tokens))
        .unwrap_or(0);
    input.saturating_add(output)
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
    }
}
