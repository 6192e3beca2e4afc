//! The demo's bundled sample: support tickets to triage and summarise, over two models.

use std::fmt::Write as _;

const SUBJECTS: &[&str] = &[
    "Refund for a double charge",
    "Cannot log in after password reset",
    "Invoice shows the wrong VAT number",
    "App crashes when exporting to PDF",
    "Request to close my account",
    "Delivery arrived damaged",
    "How do I add a second user?",
    "API returns 502 on large uploads",
    "Change of billing address",
    "Feature request: dark mode",
];

const PRODUCTS: &[&str] = &["Ledger", "Courier", "Atlas", "Beacon", "Quill"];

/// `n` tranche input lines (`{"key", "body"}`): three in five classify a ticket's intent
/// with a JSON schema on one model, the rest summarise it on another.
pub fn sample_lines(n: usize) -> String {
    let mut out = String::with_capacity(n * 600);
    for i in 0..n {
        let ticket = 10_000 + i;
        let subject = SUBJECTS[i % SUBJECTS.len()];
        let product = PRODUCTS[(i / SUBJECTS.len()) % PRODUCTS.len()];
        let text = format!(
            "Ticket {ticket} about {product}: {subject}. Customer wrote on day {} of the month and asked for an answer within {} days.",
            i % 28 + 1,
            i % 5 + 1
        );
        let body = if i % 5 < 3 {
            serde_json::json!({
                "model": "gpt-4o-mini",
                "messages": [
                    {"role": "system", "content": "Classify the support ticket. Answer with JSON only."},
                    {"role": "user", "content": text},
                ],
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "triage",
                        "strict": true,
                        "schema": {
                            "type": "object",
                            "properties": {
                                "intent": {"type": "string", "enum": ["billing", "access", "bug", "account", "shipping", "question", "feature"]},
                                "urgent": {"type": "boolean"},
                            },
                            "required": ["intent", "urgent"],
                            "additionalProperties": false,
                        },
                    },
                },
                "max_tokens": 50,
            })
        } else {
            serde_json::json!({
                "model": "gpt-4.1-mini",
                "messages": [
                    {"role": "system", "content": "Summarise the ticket in one sentence for the on-call engineer."},
                    {"role": "user", "content": text},
                ],
                "max_tokens": 80,
            })
        };
        let line = serde_json::json!({ "key": format!("ticket:{ticket}"), "body": body });
        let _ = writeln!(out, "{line}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tranche_core::ProviderKind;
    use tranche_core::input::{InputOptions, parse_str};

    #[test]
    fn sample_parses_into_two_models() {
        let options =
            InputOptions { task: Some("triage".into()), ..InputOptions::new(ProviderKind::Openai) };
        let requests = parse_str(&sample_lines(100), options).unwrap();
        assert_eq!(requests.len(), 100);
        let mini = requests.iter().filter(|r| r.model == "gpt-4o-mini").count();
        assert_eq!(mini, 60);
        assert_eq!(requests[0].custom_id.as_str(), "ticket:10000:triage:v1");
    }
}
