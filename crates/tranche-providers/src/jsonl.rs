//! Writing JSONL input lines byte by byte: JSON string literals, and request bodies copied verbatim
//! onto one line.

use serde_json::value::RawValue;

/// Writes `s` as a JSON string literal.
pub(crate) fn write_json_string(out: &mut Vec<u8>, s: &str) {
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
pub(crate) fn write_raw_one_line(out: &mut Vec<u8>, value: &RawValue) {
    out.extend(value.get().bytes().map(|b| if b == b'\n' || b == b'\r' { b' ' } else { b }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_and_bodies() {
        let mut out = Vec::new();
        write_json_string(&mut out, "a\"b\\c\n\r\t\u{1}é");
        assert_eq!(out, "\"a\\\"b\\\\c\\n\\r\\t\\u0001é\"".as_bytes());
        let back: String = serde_json::from_slice(&out).unwrap();
        assert_eq!(back, "a\"b\\c\n\r\t\u{1}é");

        let body = RawValue::from_string("{\n \"a\": \"x\\ny\"\r\n}".into()).unwrap();
        let mut out = Vec::new();
        write_raw_one_line(&mut out, &body);
        assert!(!out.contains(&b'\n') && !out.contains(&b'\r'));
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["a"], "x\ny");
    }
}
