//! The benchmark's input: tranche lines (`{"key", "body"}`) with chat bodies of a chosen size
//! over two models, written to disk one line at a time.

use std::io::Write;
use std::path::Path;

/// The two models lines alternate between (so the planner cuts two groups of tranches).
pub const MODELS: [&str; 2] = ["gpt-4o-mini", "gpt-4.1-mini"];

/// The task given to every line (`custom_id = doc:N:TASK:v1`).
pub const TASK: &str = "extract";

const SYSTEM: &str = "Extract the parties, dates and amounts from the contract excerpt. \
                      Answer in one short paragraph.";

const WORDS: &[&str] = &[
    "agreement",
    "supplier",
    "invoice",
    "delivery",
    "clause",
    "payment",
    "termination",
    "notice",
    "liability",
    "warranty",
    "party",
    "effective",
    "date",
    "amount",
    "currency",
    "schedule",
    "renewal",
    "penalty",
    "confidential",
    "signature",
    "annex",
    "term",
    "price",
    "discount",
    "service",
    "level",
    "credit",
    "refund",
    "period",
    "month",
    "quarter",
    "year",
    "the",
    "of",
    "and",
    "to",
    "within",
    "shall",
    "may",
    "not",
    "each",
    "any",
    "such",
    "by",
    "on",
    "in",
];

/// The smallest body this generator makes for `model` (an empty user message).
pub fn min_body_bytes(model: &str) -> usize {
    let (head, tail) = body_frame(model);
    head.len() + tail.len()
}

/// The body JSON around the user text: everything before it and everything after it.
fn body_frame(model: &str) -> (String, &'static str) {
    (
        format!(
            r#"{{"model":"{model}","max_tokens":64,"messages":[{{"role":"system","content":"{SYSTEM}"}},{{"role":"user","content":""#
        ),
        r#""}]}"#,
    )
}

/// A small deterministic generator (splitmix64), so inputs are reproducible.
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Appends line `i` (newline included) to `out`. Its `body` is exactly `body_bytes` long as
/// written (or the smallest possible body, if `body_bytes` is below [`min_body_bytes`]); the
/// text is ASCII words, so no byte needs escaping.
pub fn write_line(out: &mut Vec<u8>, i: u64, body_bytes: usize) {
    let model = MODELS[usize::from(i % 2 == 1)];
    let (head, tail) = body_frame(model);
    let text_len = body_bytes.saturating_sub(head.len() + tail.len());
    out.extend_from_slice(format!(r#"{{"key":"doc:{i}","body":"#).as_bytes());
    out.extend_from_slice(head.as_bytes());
    let start = out.len();
    out.extend_from_slice(format!("Excerpt {i}:").as_bytes());
    let mut mix = Mix(i);
    while out.len() - start < text_len {
        let pick = usize::try_from(mix.next() % 64).unwrap_or(0) % WORDS.len();
        out.push(b' ');
        out.extend_from_slice(WORDS[pick].as_bytes());
    }
    out.truncate(start + text_len);
    out.extend_from_slice(tail.as_bytes());
    out.extend_from_slice(b"}\n");
}

/// Writes `n` lines to `path`; returns the file's size in bytes.
pub fn write_file(path: &Path, n: u64, body_bytes: usize) -> std::io::Result<u64> {
    let file = std::fs::File::create(path)?;
    let mut writer = std::io::BufWriter::with_capacity(1 << 20, file);
    let mut line = Vec::with_capacity(body_bytes + 64);
    let mut total = 0u64;
    for i in 0..n {
        line.clear();
        write_line(&mut line, i, body_bytes);
        writer.write_all(&line)?;
        total += line.len() as u64;
    }
    writer.flush()?;
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tranche_core::ProviderKind;
    use tranche_core::input::{InputOptions, parse_str};

    fn lines(n: u64, body_bytes: usize) -> String {
        let mut out = Vec::new();
        for i in 0..n {
            write_line(&mut out, i, body_bytes);
        }
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn bodies_have_the_requested_size_and_parse() {
        let text = lines(50, 1000);
        let options =
            InputOptions { task: Some(TASK.into()), ..InputOptions::new(ProviderKind::Openai) };
        let requests = parse_str(&text, options).unwrap();
        assert_eq!(requests.len(), 50);
        for (line, request) in text.lines().zip(&requests) {
            let value: serde_json::Value = serde_json::from_str(line).unwrap();
            assert_eq!(value["body"].to_string().len(), 1000, "{line}");
            // The stored canonical body sorts keys but keeps the size.
            assert_eq!(request.body.len(), 1000);
        }
        assert_eq!(requests[0].custom_id.as_str(), "doc:0:extract:v1");
        assert_eq!(requests[0].model, MODELS[0]);
        assert_eq!(requests[1].model, MODELS[1]);
    }

    #[test]
    fn tiny_bodies_fall_back_to_the_smallest_valid_body() {
        let text = lines(3, 10);
        let options =
            InputOptions { task: Some(TASK.into()), ..InputOptions::new(ProviderKind::Openai) };
        let requests = parse_str(&text, options).unwrap();
        assert_eq!(requests.len(), 3);
        for r in &requests {
            assert_eq!(r.body.len(), min_body_bytes(&r.model));
        }
    }

    #[test]
    fn files_are_the_sum_of_their_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.jsonl");
        let bytes = write_file(&path, 20, 700).unwrap();
        assert_eq!(bytes, std::fs::metadata(&path).unwrap().len());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), lines(20, 700));
    }
}
