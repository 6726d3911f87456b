//! Timestamps for people and for `--json`: UTC ISO 8601 (`2026-12-01T15:04:05Z`) next to
//! the raw Unix seconds the registry stores.

use serde_json::{Value, json};

/// `unix` (seconds) as `YYYY-MM-DDTHH:MM:SSZ` (UTC, proleptic Gregorian; chrono). A time
/// chrono cannot represent (beyond year 262,143) prints as the raw seconds.
pub fn utc(unix: u64) -> String {
    i64::try_from(unix)
        .ok()
        .and_then(|secs| chrono::DateTime::from_timestamp(secs, 0))
        .map_or_else(
            || unix.to_string(),
            |t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
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
