//! Wire timestamps as unix seconds: integers (OpenAI), RFC 3339 strings (Anthropic) and the ISO 8601
//! strings of Azure's legacy REST examples (`2024-07-19T17:13:57.2491382+00:00`).

use serde::{Deserialize, Deserializer};

/// Days from 1970-01-01 to a civil date, proleptic Gregorian (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Reads exactly `len` ASCII digits at `at`.
fn digits(s: &[u8], at: usize, len: usize) -> Option<i64> {
    let part = s.get(at..at + len)?;
    if !part.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(part.iter().fold(0, |n, d| n * 10 + i64::from(d - b'0')))
}

/// Parses `YYYY-MM-DDTHH:MM:SS[.fraction][Z|±HH:MM|±HHMM]` (a space may stand for `T`; no offset
/// means UTC) into whole unix seconds, rounded down.
pub(crate) fn parse_iso8601(text: &str) -> Option<i64> {
    let s = text.trim().as_bytes();
    let year = digits(s, 0, 4)?;
    let month = digits(s, 5, 2)?;
    let day = digits(s, 8, 2)?;
    let hour = digits(s, 11, 2)?;
    let minute = digits(s, 14, 2)?;
    let second = digits(s, 17, 2)?;
    if s.get(4) != Some(&b'-')
        || s.get(7) != Some(&b'-')
        || !matches!(s.get(10), Some(b'T' | b't' | b' '))
        || s.get(13) != Some(&b':')
        || s.get(16) != Some(&b':')
    {
        return None;
    }
    if !(1..=12).contains(&month)
        || !(1..=days_in_month(year, month)).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix(b".") {
        let n = frac.iter().take_while(|b| b.is_ascii_digit()).count();
        if n == 0 {
            return None;
        }
        rest = &frac[n..];
    }
    let offset = match rest {
        [] | [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), tail @ ..] => {
            let (h, m) = match tail {
                [_, _, b':', _, _] => (digits(tail, 0, 2)?, digits(tail, 3, 2)?),
                [_, _, _, _] => (digits(tail, 0, 2)?, digits(tail, 2, 2)?),
                [_, _] => (digits(tail, 0, 2)?, 0),
                _ => return None,
            };
            if h > 23 || m > 59 {
                return None;
            }
            let secs = h * 3600 + m * 60;
            if *sign == b'-' { -secs } else { secs }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    Some(days * 86_400 + hour * 3600 + minute * 60 + second - offset)
}

/// Any of the timestamp forms the providers send.
#[derive(Deserialize)]
#[serde(untagged)]
enum WireTime {
    Int(i64),
    Float(f64),
    Text(String),
}

impl WireTime {
    /// `Ok(None)` for an empty string; `Err` for text that is no timestamp.
    fn seconds(self) -> Result<Option<i64>, String> {
        match self {
            Self::Int(n) => Ok(Some(n)),
            Self::Float(f) if f.is_finite() => Ok(Some(float_seconds(f))),
            Self::Float(f) => Err(format!("invalid timestamp {f}")),
            Self::Text(text) => {
                let trimmed = text.trim();
                if trimmed.is_empty() {
                    return Ok(None);
                }
                if let Ok(n) = trimmed.parse::<i64>() {
                    return Ok(Some(n));
                }
                if let Ok(f) = trimmed.parse::<f64>()
                    && f.is_finite()
                {
                    return Ok(Some(float_seconds(f)));
                }
                parse_iso8601(trimmed)
                    .map(Some)
                    .ok_or_else(|| format!("invalid timestamp `{trimmed}`"))
            }
        }
    }
}

/// Whole seconds of a finite float, rounded down (saturating far outside any real date).
fn float_seconds(f: f64) -> i64 {
    // `as` saturates; timestamps are far inside i64.
    f.floor() as i64
}

/// A required timestamp in any wire form.
pub(crate) fn timestamp<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    WireTime::deserialize(d)?
        .seconds()
        .map_err(serde::de::Error::custom)?
        .ok_or_else(|| serde::de::Error::custom("empty timestamp"))
}

/// An optional timestamp in any wire form; null and `""` read as `None`.
pub(crate) fn opt_timestamp<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    match Option::<WireTime>::deserialize(d)? {
        None => Ok(None),
        Some(t) => t.seconds().map_err(serde::de::Error::custom),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documented_forms() {
        // Anthropic's RFC 3339 with microseconds.
        assert_eq!(parse_iso8601("2024-09-24T18:37:24.100435Z"), Some(1_727_203_044));
        // Azure's legacy REST example, seven decimals and an explicit offset.
        assert_eq!(parse_iso8601("2024-07-19T17:13:57.2491382+00:00"), Some(1_721_409_237));
        assert_eq!(parse_iso8601("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_iso8601("1970-01-01T00:00:00"), Some(0));
        assert_eq!(parse_iso8601("2000-02-29 00:00:00+0000"), Some(951_782_400));
        assert_eq!(parse_iso8601("2024-07-19T19:13:57+02:00"), Some(1_721_409_237));
        assert_eq!(parse_iso8601("2024-07-19T12:13:57-05"), Some(1_721_409_237));
        assert_eq!(parse_iso8601("2099-12-31T23:59:59.999999Z"), Some(4_102_444_799));
        assert_eq!(parse_iso8601("1969-12-31T23:59:59Z"), Some(-1));
    }

    #[test]
    fn malformed_forms() {
        for bad in [
            "",
            "2024-07-19",
            "2024-13-01T00:00:00Z",
            "2023-02-29T00:00:00Z",
            "2024-07-19T24:00:00Z",
            "2024-07-19T17:13:57.Z",
            "2024-07-19T17:13:57+5",
            "2024-07-19T17:13:57 UTC",
            "2024/07/19T17:13:57Z",
            "yesterday",
        ] {
            assert_eq!(parse_iso8601(bad), None, "{bad}");
        }
    }

    #[derive(Debug, Deserialize)]
    struct Times {
        #[serde(deserialize_with = "timestamp")]
        at: i64,
        #[serde(default, deserialize_with = "opt_timestamp")]
        until: Option<i64>,
    }

    #[test]
    fn serde_accepts_every_wire_form() {
        let parse = |json: &str| serde_json::from_str::<Times>(json);
        let t = parse(r#"{"at":1711471533,"until":null}"#).unwrap();
        assert_eq!((t.at, t.until), (1_711_471_533, None));
        let t = parse(r#"{"at":"2024-07-19T17:13:57.2491382+00:00","until":""}"#).unwrap();
        assert_eq!((t.at, t.until), (1_721_409_237, None));
        let t = parse(r#"{"at":1711471533.9,"until":"1711471600"}"#).unwrap();
        assert_eq!((t.at, t.until), (1_711_471_533, Some(1_711_471_600)));
        let t = parse(r#"{"at":"2024-09-24T18:37:24.100435Z"}"#).unwrap();
        assert_eq!((t.at, t.until), (1_727_203_044, None));
        assert!(parse(r#"{"at":"soon"}"#).unwrap_err().to_string().contains("soon"));
        assert!(parse(r#"{"at":""}"#).is_err());
        assert!(parse(r#"{"at":1,"until":true}"#).is_err());
    }
}
