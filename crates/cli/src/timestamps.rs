//! Timestamps for people and for `--json`: UTC ISO 8601 (`2026-12-01T15:04:05Z`) next to
//! the raw Unix seconds the registry stores.

use serde_json::{Value, json};

/// `unix` (seconds) as `YYYY-MM-DDTHH:MM:SSZ` (UTC; proleptic Gregorian calendar, the
/// civil-from-days algorithm of H. Hinnant's "chrono-Compatible Low-Level Date
/// Algorithms").
pub fn utc(unix: u64) -> String {
    let days = (unix / 86_400) as i64;
    let secs = unix % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3_600,
        secs % 3_600 / 60,
        secs % 60
    )
}

/// The `--json` form of a timestamp: `{"unix": N, "utc": "..."}`.
pub fn stamp(unix: u64) -> Value {
    json!({"unix": unix, "utc": utc(unix)})
}

/// [`stamp`], or `null`.
pub fn stamp_opt(unix: Option<u64>) -> Value {
    unix.map_or(Value::Null, stamp)
}

#[cfg(test)]
mod tests {
    use super::utc;

    #[test]
    fn known_instants_format_as_utc_iso_8601() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_764_400_000), "2025-11-29T07:06:40Z");
        assert_eq!(utc(4_102_444_799), "2099-12-31T23:59:59Z");
    }
}
