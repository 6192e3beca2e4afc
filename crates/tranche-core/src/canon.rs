//! A JSON value that borrows from the text it was read from, written back as canonical JSON
//! byte for byte as [`crate::hash::canonical_json`] writes a `serde_json::Value`.
//!
//! Accepting a job reads, checks and rewrites every body once. A `Value` copies every string
//! and key into its own allocation and keeps objects in `BTreeMap`s, and writing it escapes
//! every string again; here a string without escapes stays a slice of the input and is
//! copied out as it stands (a JSON string needs an escape for `"`, `\` and control characters,
//! the only characters serde_json escapes, so an unescaped one is already written as serde_json
//! would write it), and an object is a vector of its members sorted once by key.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Number;

/// A JSON value borrowing its unescaped strings from the text it was read from.
#[derive(Debug, Clone, PartialEq)]
pub enum Node<'a> {
    Null,
    Bool(bool),
    /// Kept as serde_json keeps it, so that it is written the same.
    Number(Number),
    String(Cow<'a, str>),
    Array(Vec<Node<'a>>),
    Object(Members<'a>),
}

/// An object's members, sorted by the UTF-8 bytes of their keys, each key once (a repeated
/// key keeps its last value, as `serde_json::Map` does).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Members<'a>(Vec<(Cow<'a, str>, Node<'a>)>);

impl<'a> Members<'a> {
    fn from_unsorted(mut members: Vec<(Cow<'a, str>, Node<'a>)>) -> Self {
        if !members.windows(2).all(|w| w[0].0.as_bytes() < w[1].0.as_bytes()) {
            // Stable, so that of a repeated key the last one read stays last.
            members.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            let mut kept: Vec<(Cow<'a, str>, Node<'a>)> = Vec::with_capacity(members.len());
            for member in members {
                match kept.last_mut() {
                    Some(last) if last.0 == member.0 => *last = member,
                    _ => kept.push(member),
                }
            }
            members = kept;
        }
        Self(members)
    }

    fn position(&self, key: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.as_bytes().cmp(key.as_bytes()))
    }

    /// The value of `key`, if the object has it.
    pub fn get(&self, key: &str) -> Option<&Node<'a>> {
        self.position(key).ok().map(|i| &self.0[i].1)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.position(key).is_ok()
    }

    /// Takes `key`'s value out of the object.
    pub fn remove(&mut self, key: &str) -> Option<Node<'a>> {
        self.position(key).ok().map(|i| self.0.remove(i).1)
    }

    /// Sets `key` to `value`, in its sorted place.
    pub fn insert(&mut self, key: &str, value: Node<'a>) {
        match self.position(key) {
            Ok(i) => self.0[i].1 = value,
            Err(i) => self.0.insert(i, (Cow::Owned(key.to_owned()), value)),
        }
    }
}

impl<'a> Node<'a> {
    /// Reads one JSON value from `text`, as `serde_json::from_str` would (the same errors).
    pub fn parse(text: &'a str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Node::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Node::Number(n) => n.as_u64(),
            _ => None,
        }
    }

    pub fn as_object(&self) -> Option<&Members<'a>> {
        match self {
            Node::Object(members) => Some(members),
            _ => None,
        }
    }

    /// `key`'s value, when this is an object that has it.
    pub fn get(&self, key: &str) -> Option<&Node<'a>> {
        self.as_object()?.get(key)
    }

    /// What kind of value this is, for an error message ("a string", "an array", ...).
    pub fn type_name(&self) -> &'static str {
        match self {
            Node::Null => "null",
            Node::Bool(_) => "a boolean",
            Node::Number(_) => "a number",
            Node::String(_) => "a string",
            Node::Array(_) => "an array",
            Node::Object(_) => "an object",
        }
    }

    /// Appends the canonical JSON of this value (keys sorted by their UTF-8 bytes, compact)
    /// to `out`.
    pub fn write_canonical(&self, out: &mut Vec<u8>) {
        match self {
            Node::Null => out.extend_from_slice(b"null"),
            Node::Bool(true) => out.extend_from_slice(b"true"),
            Node::Bool(false) => out.extend_from_slice(b"false"),
            Node::Number(n) => push_serialized(out, n),
            Node::String(s) => write_string(out, s),
            Node::Array(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    item.write_canonical(out);
                }
                out.push(b']');
            }
            Node::Object(members) => members.write_canonical(out),
        }
    }
}

impl Members<'_> {
    /// Appends the canonical JSON of this object to `out`.
    pub fn write_canonical(&self, out: &mut Vec<u8>) {
        out.push(b'{');
        for (i, (key, value)) in self.0.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_string(out, key);
            out.push(b':');
            value.write_canonical(out);
        }
        out.push(b'}');
    }

    /// The canonical JSON of this object.
    pub fn to_canonical(&self, capacity: usize) -> String {
        let mut out = Vec::with_capacity(capacity);
        self.write_canonical(&mut out);
        // Every piece written is UTF-8 (slices of the input, serde_json's output, ASCII
        // punctuation); the lossy path is never taken.
        String::from_utf8(out)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    }
}

#[expect(clippy::ptr_arg, reason = "whether the string was borrowed is what tells how to write it")]
fn write_string(out: &mut Vec<u8>, s: &Cow<'_, str>) {
    match s {
        // Read without escapes, so it needs none.
        Cow::Borrowed(s) => {
            out.push(b'"');
            out.extend_from_slice(s.as_bytes());
            out.push(b'"');
        }
        Cow::Owned(s) => push_serialized(out, s.as_str()),
    }
}

/// Appends serde_json's compact text of `value` (a string or a number, which cannot fail).
fn push_serialized<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    let _ = serde_json::to_writer(out, value);
}

impl<'de> Deserialize<'de> for Node<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Node::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Node::Null)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
        Ok(Node::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Node::Number(v.into()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Node::Number(v.into()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        // As `serde_json::Value` reads it: JSON text holds no NaN or infinity.
        Ok(Number::from_f64(v).map_or(Node::Null, Node::Number))
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Node::String(Cow::Borrowed(v)))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Node::String(Cow::Owned(v.to_owned())))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(Node::String(Cow::Owned(v)))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Node::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut members = Vec::with_capacity(map.size_hint().unwrap_or(0));
        while let Some(Key(key)) = map.next_key()? {
            members.push((key, map.next_value()?));
        }
        Ok(Node::Object(Members::from_unsorted(members)))
    }
}

/// An object's key, borrowed when it has no escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = Key<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Key(Cow::Borrowed(v)))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Key(Cow::Owned(v.to_owned())))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(Key(Cow::Owned(v)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::canonical_json;

    /// The canonical text `Value` gives, and the one `Node` gives, of the same input.
    fn both(text: &str) -> (String, String) {
        let value: serde_json::Value = serde_json::from_str(text).unwrap();
        let mut fast = Vec::new();
        Node::parse(text).unwrap().write_canonical(&mut fast);
        (canonical_json(&value), String::from_utf8(fast).unwrap())
    }

    #[test]
    fn writes_what_a_value_writes() {
        let cases = [
            r#"{"b":1,"a":[true,false,null],"c":{"z":"x","y":""}}"#,
            r#"{"model":"gpt-4o-mini","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}"#,
            // Escapes: written as serde_json writes them, whatever the input used.
            r#"{"s":"a\"b\\c\/d\n\t\r\b\f\u0001\u001f é \u00e9 \ud83d\ude00 \u2028"}"#,
            r#"{"k\u0041":"v","kA":"w"}"#,
            // Numbers as serde_json keeps them.
            r#"[0,-0,1.0,1e2,1E-2,-1.5e300,18446744073709551615,-9223372036854775808,123456789012345678901234567890,0.1,2.50]"#,
            // Repeated keys: the last value stays.
            r#"{"a":1,"b":2,"a":3}"#,
            r#"{"a":{"x":1},"a":[2],"a":"last"}"#,
            // Keys sorted by bytes, not by characters or case.
            r#"{"é":1,"z":2,"Z":3,"_":4,"aa":5,"a":6,"\u0000":7}"#,
            "  {\n \"spaced\" :  [ 1 , 2 ]\t}  ",
            r#""top-level string""#,
            "[]",
            "{}",
            "null",
        ];
        for case in cases {
            let (value, fast) = both(case);
            assert_eq!(fast, value, "{case}");
        }
    }

    #[test]
    fn refuses_what_serde_json_refuses() {
        for bad in ["{", r#"{"a":}"#, "[1,]", "\"\u{1}\"", "{\"a\":1}x", "", "NaN", "1e999"] {
            let value = serde_json::from_str::<serde_json::Value>(bad).map(|_| ());
            let node = Node::parse(bad).map(|_| ());
            assert_eq!(node.is_err(), value.is_err(), "{bad:?}");
            if let (Err(a), Err(b)) = (node, value) {
                assert_eq!(a.to_string(), b.to_string(), "{bad:?}");
            }
        }
    }

    #[test]
    fn generated_documents_write_as_values_do() {
        // A small deterministic generator of nested documents with every kind of value,
        // escapes, repeated and unsorted keys.
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        fn doc(next: &mut dyn FnMut() -> u64, depth: u32) -> String {
            const STRINGS: [&str; 8] = [
                "",
                "plain",
                "quo\\\"te",
                "line\\nbreak",
                "\\u00e9t\\u00e9",
                "é",
                "a\\/b",
                "\\ud83d\\ude00",
            ];
            const KEYS: [&str; 6] = ["model", "messages", "a", "Z", "\\u006dodel", "é"];
            match next() % if depth > 3 { 4 } else { 6 } {
                0 => ["null", "true", "false"][(next() % 3) as usize].to_owned(),
                1 => ["0", "-7", "3.25", "1e3", "18446744073709551616", "-0.0"]
                    [(next() % 6) as usize]
                    .to_owned(),
                2 | 3 => format!("\"{}\"", STRINGS[(next() % 8) as usize]),
                4 => {
                    let n = next() % 4;
                    let items: Vec<String> = (0..n).map(|_| doc(next, depth + 1)).collect();
                    format!("[{}]", items.join(","))
                }
                _ => {
                    let n = next() % 5;
                    let members: Vec<String> = (0..n)
                        .map(|_| {
                            format!("\"{}\":{}", KEYS[(next() % 6) as usize], doc(next, depth + 1))
                        })
                        .collect();
                    format!("{{{}}}", members.join(","))
                }
            }
        }
        for _ in 0..2_000 {
            let text = doc(&mut next, 0);
            let (value, fast) = both(&text);
            assert_eq!(fast, value, "{text}");
        }
    }

    #[test]
    fn members_find_insert_and_remove_by_key() {
        let Node::Object(mut members) = Node::parse(r#"{"m":1,"b":2}"#).unwrap() else {
            panic!("an object");
        };
        assert_eq!(members.get("b").and_then(Node::as_u64), Some(2));
        members.insert("model", Node::String(Cow::Borrowed("x")));
        members.insert("a", Node::Null);
        assert_eq!(members.remove("m"), Some(Node::Number(1u64.into())));
        assert!(!members.contains_key("m"));
        assert_eq!(members.to_canonical(0), r#"{"a":null,"b":2,"model":"x"}"#);
    }
}
