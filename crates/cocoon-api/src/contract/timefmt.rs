//! Time and duration text exactly as the Go components print it: `time.Duration.String()`
//! (`3m0s`, `45s`), RFC3339Nano (`rebuild-history`) and RFC3339 seconds (`suspending-since`).

use std::fmt::Write as _;
use std::time::Duration;

use chrono::{DateTime, Timelike, Utc};

/// Go's `time.Duration.String()` for a non-negative duration: `0s`, `1.5µs`, `250ms`, `45s`,
/// `3m0s`, `1h0m0s`, `2h3m4.5s`. Used for durations inside Event messages.
pub fn go_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_owned();
    }
    if nanos < 1_000 {
        return format!("{nanos}ns");
    }
    if nanos < 1_000_000 {
        return with_fraction(nanos, 1_000, 3, "µs");
    }
    if nanos < 1_000_000_000 {
        return with_fraction(nanos, 1_000_000, 6, "ms");
    }
    let total_secs = d.as_secs();
    let hours = total_secs / 3600;
    let minutes = (total_secs % 3600) / 60;
    let secs = total_secs % 60;
    let mut out = String::new();
    if hours > 0 {
        // Infallible: writing into a String cannot fail.
        let _ = write!(out, "{hours}h");
    }
    if hours > 0 || minutes > 0 {
        let _ = write!(out, "{minutes}m");
    }
    let _ = write!(out, "{secs}");
    push_fraction(&mut out, u128::from(d.subsec_nanos()), 9);
    out.push('s');
    out
}

/// `value / unit` with the remainder as a trimmed decimal fraction of `digits` digits.
fn with_fraction(value: u128, unit: u128, digits: usize, suffix: &str) -> String {
    let mut out = (value / unit).to_string();
    push_fraction(&mut out, value % unit, digits);
    out.push_str(suffix);
    out
}

/// Appends `.ddd` (trailing zeros trimmed) for a non-zero fractional part.
fn push_fraction(out: &mut String, frac: u128, digits: usize) {
    if frac == 0 {
        return;
    }
    let text = format!("{frac:0digits$}");
    out.push('.');
    out.push_str(text.trim_end_matches('0'));
}

/// Go's `time.RFC3339Nano` for a UTC time: fractional seconds with trailing zeros trimmed and
/// omitted when zero, e.g. `2026-08-12T10:00:00.5Z`.
pub fn rfc3339_nano(t: DateTime<Utc>) -> String {
    let mut out = t.format("%Y-%m-%dT%H:%M:%S").to_string();
    // Leap-second nanos (>= 1e9) do not occur in values we produce; clamp for safety.
    push_fraction(&mut out, u128::from(t.nanosecond().min(999_999_999)), 9);
    out.push('Z');
    out
}

/// RFC3339 UTC with whole seconds, e.g. `2026-08-12T10:00:00Z` (`suspending-since`).
pub fn rfc3339_seconds(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Parses any RFC3339 timestamp (with or without fraction, any offset) into UTC;
/// `None` when unparsable.
pub fn parse_rfc3339(value: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(value)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// Why a Go-style duration text was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GoDurationError {
    /// Not Go-style duration text.
    Invalid,
    /// Parsed, but no [`Duration`] holds it (too large).
    OutOfRange,
}

/// Parses Go-style durations: a sequence of `<number><unit>` with units h, m, s, ms, us, ns
/// (`3m0s`, `1h30m`, `45s`, `250ms`, `1.5s`).
pub fn parse_go_duration(text: &str) -> Result<Duration, GoDurationError> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(GoDurationError::Invalid);
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_end == 0 {
            return Err(GoDurationError::Invalid);
        }
        let value: f64 = rest[..num_end]
            .parse()
            .map_err(|_| GoDurationError::Invalid)?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return Err(GoDurationError::Invalid),
        };
        total += value * scale;
        rest = &rest[unit_end..];
    }
    // Huge texts overflow to values no Duration holds (or to infinity): refused, not a panic.
    Duration::try_from_secs_f64(total).map_err(|_| GoDurationError::OutOfRange)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_duration_matches_go() {
        for (d, want) in [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(1), "1ns"),
            (Duration::from_nanos(1_500), "1.5µs"),
            (Duration::from_micros(250), "250µs"),
            (Duration::from_millis(250), "250ms"),
            (Duration::from_micros(1_500), "1.5ms"),
            (Duration::from_secs(1), "1s"),
            (Duration::from_millis(1_500), "1.5s"),
            (Duration::from_secs(45), "45s"),
            (Duration::from_secs(60), "1m0s"),
            (Duration::from_secs(180), "3m0s"),
            (Duration::from_secs(300), "5m0s"),
            (Duration::from_secs(3600), "1h0m0s"),
            (Duration::from_secs(3600 + 5), "1h0m5s"),
            (
                Duration::new(2 * 3600 + 3 * 60 + 4, 500_000_000),
                "2h3m4.5s",
            ),
            (Duration::new(1, 1), "1.000000001s"),
        ] {
            assert_eq!(go_duration(d), want, "{d:?}");
        }
    }

    #[test]
    fn rfc3339_formats() {
        let t = parse_rfc3339("2026-08-12T10:00:00Z").expect("valid timestamp");
        assert_eq!(rfc3339_nano(t), "2026-08-12T10:00:00Z");
        assert_eq!(rfc3339_seconds(t), "2026-08-12T10:00:00Z");

        let t = parse_rfc3339("2026-08-12T12:00:00.123400+02:00").expect("valid timestamp");
        assert_eq!(rfc3339_nano(t), "2026-08-12T10:00:00.1234Z");
        assert_eq!(rfc3339_seconds(t), "2026-08-12T10:00:00Z");

        for bad in ["", "yesterday", "2026-08-12", "2026-08-12 10:00:00"] {
            assert_eq!(parse_rfc3339(bad), None, "{bad:?}");
        }
    }
}
