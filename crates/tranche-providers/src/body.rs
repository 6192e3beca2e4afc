//! A response body read in the same pass as its result line: where it stands in the line, and
//! the two members billing reads (`model`, `usage`), kept raw. The body's bulk (the answer) is
//! skipped once, rather than once to find where the body ends and again to find its usage.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::error::LineParseError;

/// A response body as a result line holds it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Body<'a> {
    /// The body's JSON text, a slice of the line.
    pub text: &'a str,
    /// Its `model` and `usage` members, raw, when they were read with the line; `None` when
    /// they are to be read from `text` (a line read the slow way, or a body naming one of them
    /// twice).
    pub members: Option<Members<'a>>,
}

impl<'a> Body<'a> {
    /// A body read whole, as a raw value: its members are read from its text.
    pub fn whole(raw: &'a RawValue) -> Self {
        Self { text: raw.get(), members: None }
    }
}

/// The members of a body that billing reads, raw; `None` where the body has no such member.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Members<'a> {
    pub model: Option<&'a RawValue>,
    pub usage: Option<&'a RawValue>,
}

/// Reads a result line in one pass where it can: as `F`, its body read as [`BodyParts`], which
/// `fast` places in the line; where that fails (an escaped key in the body, say, or a line that
/// is not JSON), as `S`, its body raw, which `slow` makes a [`Body`] read from its text. The
/// errors are the second read's.
pub(crate) fn read_line<'a, F, S, W>(
    line: &'a str,
    fast: impl FnOnce(F) -> Option<W>,
    slow: impl FnOnce(S) -> Option<W>,
) -> Result<W, LineParseError>
where
    F: Deserialize<'a>,
    S: Deserialize<'a>,
{
    if let Some(wire) = serde_json::from_str::<F>(line).ok().and_then(fast) {
        return Ok(wire);
    }
    let wire =
        serde_json::from_str::<S>(line).map_err(|err| LineParseError::Invalid(err.to_string()))?;
    slow(wire).ok_or(LineParseError::NoOutcome)
}

/// A JSON object read member by member, every key and value borrowed from the text it was read
/// from: its first key and last value (which place it in that text), and its members.
///
/// Reading it fails where a borrowed read cannot be had (a key holding an escape), where the
/// value is not an object, and for an empty object; the caller then reads the line the slow way.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyParts<'a> {
    first_key: &'a str,
    last_value: &'a RawValue,
    members: Option<Members<'a>>,
}

impl<'a> BodyParts<'a> {
    /// The body, its text found in `line` (the text these parts were read from): from the brace
    /// before the first key to the brace after the last value, with nothing but whitespace
    /// between either brace and the part beside it. `None` when the parts do not lie in `line`
    /// so.
    pub fn in_line(self, line: &'a str) -> Option<Body<'a>> {
        let bytes = line.as_bytes();
        let base = line.as_ptr() as usize;
        let key_at = (self.first_key.as_ptr() as usize).checked_sub(base)?;
        let value = self.last_value.get();
        let value_end = (value.as_ptr() as usize).checked_sub(base)? + value.len();
        // The key's opening quote, then whitespace back to the opening brace.
        let quote = key_at.checked_sub(1)?;
        let open = bytes.get(..quote)?.iter().rposition(|b| !is_whitespace(*b))?;
        let close = value_end + bytes.get(value_end..)?.iter().position(|b| !is_whitespace(*b))?;
        let framed = bytes.get(quote) == Some(&b'"') && bytes[open] == b'{' && bytes[close] == b'}';
        framed.then(|| Body { text: &line[open..=close], members: self.members })
    }
}

/// JSON's whitespace (RFC 8259, section 2).
fn is_whitespace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

impl<'de: 'a, 'a> Deserialize<'de> for BodyParts<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(PartsVisitor)
    }
}

struct PartsVisitor;

impl<'de> Visitor<'de> for PartsVisitor {
    type Value = BodyParts<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object with unescaped keys")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut first_key = None;
        let mut last_value = None;
        let mut members = Members::default();
        let mut named_twice = false;
        while let Some(key) = map.next_key::<&'de str>()? {
            let value: &'de RawValue = map.next_value()?;
            first_key.get_or_insert(key);
            last_value = Some(value);
            let member = match key {
                "model" => &mut members.model,
                "usage" => &mut members.usage,
                _ => continue,
            };
            named_twice |= member.replace(value).is_some();
        }
        match (first_key, last_value) {
            (Some(first_key), Some(last_value)) => {
                Ok(BodyParts { first_key, last_value, members: (!named_twice).then_some(members) })
            }
            _ => Err(de::Error::custom("an empty object")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line holding a body, read the one-pass way.
    #[derive(serde::Deserialize)]
    struct Line<'a> {
        #[serde(borrow)]
        body: BodyParts<'a>,
    }

    fn read(line: &str) -> Option<Body<'_>> {
        serde_json::from_str::<Line<'_>>(line).ok()?.body.in_line(line)
    }

    #[test]
    fn a_body_is_placed_in_its_line_with_its_members() {
        let line = r#"{"body": { "id":"x", "model" : "m-1","usage":{"a":1} ,"z":[1,{"b":"}"}] } }"#;
        let body = read(line).unwrap();
        assert_eq!(
            body.text,
            r#"{ "id":"x", "model" : "m-1","usage":{"a":1} ,"z":[1,{"b":"}"}] }"#
        );
        let members = body.members.unwrap();
        assert_eq!(members.model.unwrap().get(), r#""m-1""#);
        assert_eq!(members.usage.unwrap().get(), r#"{"a":1}"#);

        let body = read("{\"body\":{\n\t\"only\":null\r\n}}").unwrap();
        assert_eq!(body.text, "{\n\t\"only\":null\r\n}");
        assert!(body.members.unwrap().model.is_none());
    }

    #[test]
    fn a_member_named_twice_leaves_the_members_to_the_text() {
        let body = read(r#"{"body":{"usage":{"a":1},"usage":{"a":2}}}"#).unwrap();
        assert_eq!(body.text, r#"{"usage":{"a":1},"usage":{"a":2}}"#);
        assert!(body.members.is_none());
    }

    #[test]
    fn what_cannot_be_read_borrowed_is_refused() {
        // An escaped key, an empty object, values that are not objects.
        assert!(read(r#"{"body":{"mod\u0065l":"m"}}"#).is_none());
        assert!(read(r#"{"body":{}}"#).is_none());
        assert!(read(r#"{"body":[1]}"#).is_none());
        assert!(read(r#"{"body":"text"}"#).is_none());
    }

    #[test]
    fn parts_are_placed_only_in_the_text_they_were_read_from() {
        let line = r#"{"body":{"a":1}}"#;
        let parts = serde_json::from_str::<Line<'_>>(line).unwrap().body;
        // The same bytes elsewhere: the parts lie outside them.
        let copy = line.to_owned();
        assert!(parts.in_line(&copy).is_none());
        assert_eq!(parts.in_line(line).unwrap().text, r#"{"a":1}"#);
    }
}
