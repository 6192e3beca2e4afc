//! Pure codecs of provider input lines: the wire id a provider sees for a request, and the
//! JSONL line that carries it. No IO and no credentials: submit measures lines with these,
//! and the engine writes tranche files with them.

use serde_json::value::RawValue;
use sha2::Digest as _;

use crate::{CustomId, Endpoint, ProviderKind};

/// The id a provider sees for a request.
///
/// OpenAI and Azure take tranche's custom id as it is. Anthropic allows only
/// `^[a-zA-Z0-9_-]{1,64}$`, so its wire id is derived: `t` and the first 40 hex digits of the
/// SHA-256 of the custom id (160 bits: deterministic, and collision-free in practice). The
/// mapping is stored with the request; users never see wire ids.
pub fn wire_id(provider: ProviderKind, custom_id: &CustomId) -> String {
    match provider {
        ProviderKind::Openai | ProviderKind::Azure => custom_id.as_str().to_owned(),
        ProviderKind::Anthropic => {
            let digest = sha2::Sha256::digest(custom_id.as_str().as_bytes());
            format!("t{}", &hex::encode(digest)[..40])
        }
    }
}

/// Appends one input line for a request, with its trailing `\n`, to `out`.
///
/// OpenAI and Azure: `{"custom_id","method":"POST","url","body"}`. Anthropic:
/// `{"custom_id","params"}` (a Message Batches request; the adapter streams these lines into
/// the create body). The body is copied verbatim, never re-serialised.
pub fn write_input_line(
    provider: ProviderKind,
    out: &mut Vec<u8>,
    wire_id: &str,
    endpoint: Endpoint,
    body: &RawValue,
) {
    write_input_line_json(provider, out, wire_id, endpoint, body.get());
}

/// [`write_input_line`] for a body given as JSON text known to be valid (a stored canonical
/// body, copied by byte range without parsing it again).
pub fn write_input_line_json(
    provider: ProviderKind,
    out: &mut Vec<u8>,
    wire_id: &str,
    endpoint: Endpoint,
    body: &str,
) {
    out.extend_from_slice(b"{\"custom_id\":");
    write_json_string(out, wire_id);
    match provider {
        ProviderKind::Openai | ProviderKind::Azure => {
            out.extend_from_slice(b",\"method\":\"POST\",\"url\":");
            write_json_string(out, endpoint.as_str());
            out.extend_from_slice(b",\"body\":");
        }
        ProviderKind::Anthropic => out.extend_from_slice(b",\"params\":"),
    }
    out.extend(body.bytes().map(|b| if b == b'\n' || b == b'\r' { b' ' } else { b }));
    out.extend_from_slice(b"}\n");
}

/// The size in bytes of a request's input line, as [`write_input_line_json`] writes it for a
/// body of `body_len` bytes: counted, not written (the body is copied with its length kept).
pub fn input_line_len(
    provider: ProviderKind,
    wire_id: &str,
    endpoint: Endpoint,
    body_len: u64,
) -> u64 {
    let frame = match provider {
        ProviderKind::Openai | ProviderKind::Azure => {
            r#"{"custom_id":,"method":"POST","url":,"body":}"#.len() as u64
                + json_string_len(endpoint.as_str())
        }
        ProviderKind::Anthropic => r#"{"custom_id":,"params":}"#.len() as u64,
    };
    frame + json_string_len(wire_id) + body_len + 1
}

/// The size in bytes of `s` as [`write_json_string`] writes it.
fn json_string_len(s: &str) -> u64 {
    let escaped: usize = s
        .chars()
        .map(|c| match c {
            '"' | '\\' | '\n' | '\r' | '\t' => 2,
            c if u32::from(c) < 0x20 => 6,
            c => c.len_utf8(),
        })
        .sum();
    escaped as u64 + 2
}

/// Writes `s` as a JSON string literal.
pub fn write_json_string(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    for c in s.chars() {
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\r' => out.extend_from_slice(b"\\r"),
            '\t' => out.extend_from_slice(b"\\t"),
            c if u32::from(c) < 0x20 => {
                out.extend_from_slice(format!("\\u{:04x}", u32::from(c)).as_bytes());
            }
            c => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out.push(b'"');
}

/// Appends a JSON value verbatim, on one line.
///
/// Raw CR/LF in valid JSON can only be whitespace between tokens (inside strings they must be
/// escaped), so blanking them keeps the value identical and the line a single line.
pub fn write_raw_one_line(out: &mut Vec<u8>, value: &RawValue) {
    out.extend(value.get().bytes().map(|b| if b == b'\n' || b == b'\r' { b' ' } else { b }));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_owned()).unwrap()
    }

    #[test]
    fn anthropic_wire_ids_fit_the_pattern_and_are_deterministic() {
        let a = CustomId::parse("acme::ticket:84291:intent:v3").unwrap();
        let b = CustomId::parse("acme::ticket:84291:intent:v4").unwrap();
        let wire = wire_id(ProviderKind::Anthropic, &a);
        assert_eq!(wire.len(), 41);
        assert!(wire.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'));
        assert_eq!(wire, wire_id(ProviderKind::Anthropic, &a));
        assert_ne!(wire, wire_id(ProviderKind::Anthropic, &b));
        assert_eq!(wire_id(ProviderKind::Openai, &a), a.as_str());
        assert_eq!(wire_id(ProviderKind::Azure, &a), a.as_str());
    }

    #[test]
    fn strings_and_bodies() {
        let mut out = Vec::new();
        write_json_string(&mut out, "a\"b\\c\n\r\t\u{1}é");
        assert_eq!(out, "\"a\\\"b\\\\c\\n\\r\\t\\u0001é\"".as_bytes());
        let back: String = serde_json::from_slice(&out).unwrap();
        assert_eq!(back, "a\"b\\c\n\r\t\u{1}é");

        let body = raw("{\n \"a\": \"x\\ny\"\r\n}");
        let mut out = Vec::new();
        write_raw_one_line(&mut out, &body);
        assert!(!out.contains(&b'\n') && !out.contains(&b'\r'));
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["a"], "x\ny");
    }

    #[test]
    fn openai_and_azure_lines_are_one_json_line_each() {
        let body = raw(
            "{\n  \"model\": \"gpt-4o-mini\",\n  \"messages\": [{\"role\":\"user\",\"content\":\"a\\nb\"}]\r\n}",
        );
        for provider in [ProviderKind::Openai, ProviderKind::Azure] {
            let mut out = Vec::new();
            write_input_line(provider, &mut out, "w\"1\\\u{1}é", Endpoint::ChatCompletions, &body);
            write_input_line(provider, &mut out, "w2", Endpoint::Embeddings, &body);
            let text = String::from_utf8(out).unwrap();
            let lines: Vec<&str> = text.split_terminator('\n').collect();
            assert_eq!(lines.len(), 2);
            assert!(text.ends_with('\n'));
            let first: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
            assert_eq!(first["custom_id"], "w\"1\\\u{1}é");
            assert_eq!(first["method"], "POST");
            assert_eq!(first["url"], "/v1/chat/completions");
            assert_eq!(first["body"]["messages"][0]["content"], "a\nb");
            assert_eq!(first.as_object().unwrap().len(), 4);
            let second: serde_json::Value = serde_json::from_str(lines[1]).unwrap();
            assert_eq!(second["url"], "/v1/embeddings");
        }
    }

    #[test]
    fn anthropic_lines_carry_params() {
        let body = raw(
            "{\"model\":\"claude-3-5-haiku-latest\",\n\"max_tokens\":16,\"messages\":[{\"role\":\"user\",\"content\":\"a\\nb\"}]}",
        );
        let mut out = Vec::new();
        write_input_line(
            ProviderKind::Anthropic,
            &mut out,
            "w_1-A",
            Endpoint::AnthropicMessages,
            &body,
        );
        assert_eq!(out.iter().filter(|b| **b == b'\n').count(), 1);
        assert!(out.ends_with(b"}\n"));
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["custom_id"], "w_1-A");
        assert_eq!(v["params"]["messages"][0]["content"], "a\nb");
        assert_eq!(v.as_object().unwrap().len(), 2);
    }

    #[test]
    fn line_length_is_the_written_length() {
        let bodies =
            [r#"{"model":"m","messages":[]}"#, "{\n \"a\": \"x\\ny\"\r\n}", r#"{"é":"ü"}"#];
        let ids = ["id-1", "a\"b\\c\n\r\t\u{1}é:ü", "acme::k:t:v1"];
        for provider in ProviderKind::ALL {
            for endpoint in Endpoint::ALL {
                for (body, id) in bodies.iter().zip(ids) {
                    let mut out = Vec::new();
                    write_input_line(provider, &mut out, id, endpoint, &raw(body));
                    let len = input_line_len(provider, id, endpoint, body.len() as u64);
                    assert_eq!(len, out.len() as u64, "{provider} {endpoint:?} {id:?} {body:?}");
                }
            }
        }
    }
}
