//! Duration flags (`--timeout 10m`, `--failure-grace 30s`) in kubectl's Go syntax, and the
//! same text back for messages.

use std::time::Duration;

/// The longest duration Go (and so kubectl) can represent: `i64::MAX` nanoseconds, about
/// 292 years.
pub const MAX: Duration = Duration::from_nanos(i64::MAX as u64);

/// Why a duration flag was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("invalid duration {0:?} (use e.g. 30s, 5m, 1h)")]
    Syntax(String),
    #[error("duration {0:?} out of range (at most {max})", max = human(MAX))]
    OutOfRange(String),
}

/// Parses `1h2m3s`, `90s`, `500ms`, or a bare number of seconds (kubectl accepts `0`), up to
/// [`MAX`].
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let t = text.trim();
    let syntax = || DurationError::Syntax(text.to_owned());
    let range = || DurationError::OutOfRange(text.to_owned());
    if t.is_empty() {
        return Err(syntax());
    }
    if t.bytes().all(|b| b.is_ascii_digit()) {
        let secs = t.parse::<u64>().map_err(|_| range())?;
        let d = Duration::from_secs(secs);
        return if d > MAX { Err(range()) } else { Ok(d) };
    }
    let mut rest = t;
    let mut total = 0f64;
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(syntax)?;
        if n == 0 {
            return Err(syntax());
        }
        let value: f64 = rest[..n].parse().map_err(|_| syntax())?;
        rest = &rest[n..];
        let u = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..u] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            _ => return Err(syntax()),
        };
        total += value * scale;
        rest = &rest[u..];
    }
    // Digits alone can overflow f64 to infinity; NaN and negatives cannot be written, but a
    // non-finite or negative total must never reach a panicking conversion.
    if !total.is_finite() || total < 0.0 {
        return Err(range());
    }
    match Duration::try_from_secs_f64(total) {
        Ok(d) if d <= MAX => Ok(d),
        _ => Err(range()),
    }
}

/// clap value parser with an error that names the expected form (clap adds the flag).
pub fn parse_flag(text: &str) -> Result<Duration, String> {
    parse(text).map_err(|e| e.to_string())
}

/// Go's rendering: `10m0s`, `45s`, `1h0m0s`.
pub fn human(d: Duration) -> String {
    cocoon_api::contract::go_duration(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kubectl_durations() {
        for (t, s) in [
            ("10m", 600.0),
            ("1h2m3s", 3723.0),
            ("45s", 45.0),
            ("500ms", 0.5),
            ("30", 30.0),
            ("0", 0.0),
        ] {
            assert_eq!(parse(t), Ok(Duration::from_secs_f64(s)), "{t}");
        }
        for bad in [
            "", "ten", "5x", "m", ".", "1..5s", "-5s", "inf", "NaN", "5s-",
        ] {
            assert!(
                matches!(parse(bad), Err(DurationError::Syntax(_))),
                "{bad}: {:?}",
                parse(bad)
            );
        }
        assert_eq!(human(Duration::from_secs(600)), "10m0s");
    }

    #[test]
    fn out_of_range_durations_are_errors_not_panics() {
        let huge_digits = "9".repeat(400); // parses to an infinite f64
        for bad in [
            "99999999999999999999h",
            "99999999999999999999",
            "2562048h",
            "18446744073709551616",
            &format!("{huge_digits}s"),
            &format!("{huge_digits}.5ms"),
        ] {
            assert!(
                matches!(parse(bad), Err(DurationError::OutOfRange(_))),
                "{bad}: {:?}",
                parse(bad)
            );
        }
        assert_eq!(parse("2562047h"), Ok(Duration::from_secs(2_562_047 * 3600)));
        assert!(
            parse_flag("99999999999999999999h")
                .is_err_and(|e| e.contains("out of range") && e.contains("99999999999999999999h"))
        );
        // Adds up to exactly Go's maximum, and one nanosecond more is refused.
        assert_eq!(parse("9223372036"), Ok(Duration::from_secs(9_223_372_036)));
        assert!(parse("9223372037").is_err());
    }
}
