//! `InputHash`: the SHA-256 content fingerprint of a request (provider + endpoint + body).

use std::fmt;
use std::io::Write;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::{Endpoint, ProviderKind};

/// SHA-256 of the canonical JSON of `{"body", "endpoint", "provider"}`.
///
/// Canonical means object keys sorted by their UTF-8 bytes and no insignificant
/// whitespace, so key order and formatting in the input never change the hash,
/// while any change of a value does.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct InputHash([u8; 32]);

impl InputHash {
    pub fn compute(provider: ProviderKind, endpoint: Endpoint, body: &Value) -> Self {
        Self::digest(provider, endpoint, |hasher| write_canonical(hasher, body))
    }

    /// The same hash as [`InputHash::compute`], from a body already in canonical JSON (as
    /// [`canonical_json`] writes it), so that a body serialised once serves both.
    pub fn of_canonical(provider: ProviderKind, endpoint: Endpoint, canonical_body: &str) -> Self {
        Self::digest(provider, endpoint, |hasher| {
            let _ = hasher.write_all(canonical_body.as_bytes());
        })
    }

    fn digest(
        provider: ProviderKind,
        endpoint: Endpoint,
        write_body: impl FnOnce(&mut HashWriter),
    ) -> Self {
        let mut hasher = HashWriter(Sha256::new());
        // The wrapper object's keys are already in sorted order.
        let _ = write!(hasher, "{{\"body\":");
        write_body(&mut hasher);
        let _ = write!(hasher, ",\"endpoint\":");
        write_json_string(&mut hasher, endpoint.as_str());
        let _ = write!(hasher, ",\"provider\":");
        write_json_string(&mut hasher, provider.as_str());
        let _ = write!(hasher, "}}");
        Self(hasher.0.finalize().into())
    }

    /// The hash whose digest is `bytes`.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The digest's 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    pub fn to_hex(&self) -> String {
        // Into a buffer at once: `hex::encode` collects the digits one `char` at a time.
        let mut digits = [0u8; 64];
        let _ = hex::encode_to_slice(self.0, &mut digits);
        // Hex digits are ASCII: never lossy.
        String::from_utf8_lossy(&digits).into_owned()
    }
}

/// Canonical JSON text of a value: sorted keys, compact.
pub fn canonical_json(value: &Value) -> String {
    let mut out = Vec::new();
    write_canonical(&mut out, value);
    // JSON written from a `Value` is UTF-8; the lossy path is never taken.
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

struct HashWriter(Sha256);

impl Write for HashWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn write_json_string<W: Write>(out: &mut W, s: &str) {
    // Serialising a string into a writer that cannot fail cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

pub(crate) fn write_canonical<W: Write>(out: &mut W, value: &Value) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            let _ = out.write_all(b"{");
            for (i, (key, value)) in entries.into_iter().enumerate() {
                if i > 0 {
                    let _ = out.write_all(b",");
                }
                write_json_string(out, key);
                let _ = out.write_all(b":");
                write_canonical(out, value);
            }
            let _ = out.write_all(b"}");
        }
        Value::Array(items) => {
            let _ = out.write_all(b"[");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    let _ = out.write_all(b",");
                }
                write_canonical(out, item);
            }
            let _ = out.write_all(b"]");
        }
        scalar => {
            let _ = serde_json::to_writer(&mut *out, scalar);
        }
    }
}

impl fmt::Display for InputHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for InputHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "InputHash({})", self.to_hex())
    }
}

/// A string that is not 64 hex digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a SHA-256 hex digest")]
pub struct InputHashParseError(String);

impl FromStr for InputHash {
    type Err = InputHashParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(s, &mut bytes).map_err(|_| InputHashParseError(s.to_owned()))?;
        Ok(Self(bytes))
    }
}

impl TryFrom<String> for InputHash {
    type Error = InputHashParseError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<InputHash> for String {
    fn from(h: InputHash) -> String {
        h.to_hex()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashing_a_canonical_body_equals_hashing_the_value() {
        let body = serde_json::json!({"z": [1, {"b": "x\"y", "a": null}], "model": "m", "é": 1.5});
        let text = canonical_json(&body);
        for provider in [ProviderKind::Openai, ProviderKind::Anthropic] {
            assert_eq!(
                InputHash::of_canonical(provider, Endpoint::ChatCompletions, &text),
                InputHash::compute(provider, Endpoint::ChatCompletions, &body)
            );
        }
    }
    use serde_json::json;

    fn hash(body: &str) -> InputHash {
        let value: Value = serde_json::from_str(body).unwrap();
        InputHash::compute(ProviderKind::Openai, Endpoint::ChatCompletions, &value)
    }

    #[test]
    fn key_order_and_whitespace_do_not_change_it() {
        let a = hash(r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"n":1}"#);
        let b = hash(
            "{ \"n\" : 1,\n \"messages\": [ {\"content\": \"hi\", \"role\": \"user\"} ],\"model\":\"m\" }",
        );
        assert_eq!(a, b);
    }

    #[test]
    fn any_value_change_does() {
        let base = hash(r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#);
        assert_ne!(base, hash(r#"{"model":"m","messages":[{"role":"user","content":"hi!"}]}"#));
        assert_ne!(base, hash(r#"{"model":"m2","messages":[{"role":"user","content":"hi"}]}"#));
        assert_ne!(
            base,
            hash(r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"x":null}"#)
        );
        let body = json!({"model":"m"});
        assert_ne!(
            InputHash::compute(ProviderKind::Openai, Endpoint::ChatCompletions, &body),
            InputHash::compute(ProviderKind::Openai, Endpoint::Embeddings, &body)
        );
        assert_ne!(
            InputHash::compute(ProviderKind::Openai, Endpoint::ChatCompletions, &body),
            InputHash::compute(ProviderKind::Azure, Endpoint::ChatCompletions, &body)
        );
    }

    #[test]
    fn matches_sha256_of_canonical_text() {
        let body = json!({"b": 1, "a": [true, "x\"y"]});
        let text = format!(
            "{{\"body\":{},\"endpoint\":\"/v1/chat/completions\",\"provider\":\"openai\"}}",
            canonical_json(&body)
        );
        assert_eq!(canonical_json(&body), r#"{"a":[true,"x\"y"],"b":1}"#);
        let expected = hex::encode(Sha256::digest(text.as_bytes()));
        assert_eq!(
            InputHash::compute(ProviderKind::Openai, Endpoint::ChatCompletions, &body).to_hex(),
            expected
        );
    }

    #[test]
    fn round_trips_through_hex() {
        let h = hash(r#"{"model":"m"}"#);
        assert_eq!(h.to_hex().parse::<InputHash>().unwrap(), h);
        assert!("zz".parse::<InputHash>().is_err());
    }
}
