//! Formatting virtual unix times as the wire shows them: RFC 3339 for Anthropic
//! (`2024-09-24T18:37:24.100435Z`) and the ISO 8601 form of Azure's legacy REST examples
//! (`2024-07-19T17:13:57.2491382+00:00`).

/// Days since 1970-01-01 to a civil (year, month, day), proleptic Gregorian (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    // Both are small positive numbers by construction.
    (if m <= 2 { y + 1 } else { y }, u32::try_from(m).unwrap_or(1), u32::try_from(d).unwrap_or(1))
}

/// Splits a fractional unix time into whole seconds and a fraction with `digits` decimals.
fn split(t: f64, digits: u32) -> (i64, u64) {
    let scale = 10u64.pow(digits);
    let t = if t.is_finite() { t } else { 0.0 };
    // Virtual times fit an i64 of ticks by a wide margin; `as` saturates otherwise.
    let ticks = (t * scale as f64).floor() as i64;
    let scale_i = i64::try_from(scale).unwrap_or(1);
    (ticks.div_euclid(scale_i), u64::try_from(ticks.rem_euclid(scale_i)).unwrap_or(0))
}

fn date_time(secs: i64) -> String {
    let (y, mo, d) = civil_from_days(secs.div_euclid(86_400));
    let rem = secs.rem_euclid(86_400);
    format!("{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// `2024-09-24T18:37:24.100435Z` (microseconds, UTC).
pub(crate) fn rfc3339(t: f64) -> String {
    let (secs, micros) = split(t, 6);
    format!("{}.{micros:06}Z", date_time(secs))
}

/// `2024-07-19T17:13:57.2491382+00:00` (seven decimals, as .NET prints them).
pub(crate) fn azure_iso(t: f64) -> String {
    let (secs, ticks) = split(t, 7);
    format!("{}.{ticks:07}+00:00", date_time(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants() {
        assert_eq!(rfc3339(0.0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(rfc3339(1_727_203_044.5), "2024-09-24T18:37:24.500000Z");
        assert_eq!(rfc3339(951_782_400.0), "2000-02-29T00:00:00.000000Z");
        assert_eq!(azure_iso(1_721_409_237.25), "2024-07-19T17:13:57.2500000+00:00");
        assert_eq!(rfc3339(4_102_444_799.0), "2099-12-31T23:59:59.000000Z");
    }
}
