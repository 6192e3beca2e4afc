//! Input files for tests: tranche lines whose user message starts with their key, which the
//! simulator echoes in its answer, so that a test can tell each result is its own request's.

/// `n` tranche lines over two models (every third `gpt-4.1-mini`).
pub fn tranche_lines(n: usize) -> String {
    (0..n)
        .map(|i| {
            let model = if i % 3 == 0 { "gpt-4.1-mini" } else { "gpt-4o-mini" };
            let line = serde_json::json!({
                "key": format!("doc:{i}"),
                "body": {"model": model, "messages": [{"role": "user", "content": format!("doc:{i} says hello {}", "x".repeat(i % 17))}]},
            });
            format!("{line}\n")
        })
        .collect()
}

/// `n` tranche lines over two models (alternating), each message naming `task` and its key.
pub fn task_lines(task: &str, n: usize) -> String {
    (0..n)
        .map(|i| {
            let model = if i % 2 == 0 { "gpt-4o-mini" } else { "gpt-4.1-mini" };
            let line = serde_json::json!({
                "key": format!("doc:{i}"),
                "body": {"model": model, "messages": [{"role": "user", "content": format!("{task} doc:{i}")}]},
            });
            format!("{line}\n")
        })
        .collect()
}

/// `n` Anthropic tranche lines (Messages API params, a top-level `system` included).
pub fn anthropic_lines(n: usize) -> String {
    (0..n)
        .map(|i| {
            let line = serde_json::json!({"key": format!("doc:{i}"), "body": {
                "model": "claude-sonnet-4-5", "max_tokens": 64, "system": "Be brief.",
                "messages": [{"role": "user", "content": format!("doc:{i} says hello")}]}});
            format!("{line}\n")
        })
        .collect()
}

/// What [`structured_lines`] ask every answer to be: a label and a score.
pub fn label_schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {"label": {"type": "string"}, "score": {"type": "integer"}},
        "required": ["label", "score"],
        "additionalProperties": false
    })
}

/// `n` tranche lines (`k0`, `k1`, ...) asking for structured output under [`label_schema`],
/// each with `extra` merged into its body.
pub fn structured_lines(n: usize, extra: &serde_json::Value) -> String {
    (0..n)
        .map(|i| {
            let mut body = serde_json::json!({
                "model": "gpt-4o-mini",
                "messages": [{"role": "user", "content": format!("k{i} question")}],
                "response_format": {"type": "json_schema", "json_schema":
                    {"name": "triage", "strict": true, "schema": label_schema()}}
            });
            if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
                body.extend(extra.clone());
            }
            format!("{}\n", serde_json::json!({"key": format!("k{i}"), "body": body}))
        })
        .collect()
}
