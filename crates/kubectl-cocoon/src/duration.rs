//! Duration flags (`--timeout 10m`, `--failure-grace 30s`) in kubectl's Go syntax, and the
//! same text back for messages.

use std::time::Duration;

/// Parses `1h2m3s`, `90s`, `500ms`, or a bare number of seconds (kubectl accepts `0`).
pub fn parse(text: &str) -> Option<Duration> {
    let t = text.trim();
    if t.is_empty() {
        return None;
    }
    if let Ok(secs) = t.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let mut rest = t;
    let mut total = 0f64;
    while !rest.is_empty() {
        let n = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        if n == 0 {
            return None;
        }
        let value: f64 = rest[..n].parse().ok()?;
        rest = &rest[n..];
        let u = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..u] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            _ => return None,
        };
        total += value * scale;
        rest = &rest[u..];
    }
    Some(Duration::from_secs_f64(total))
}

/// clap value parser with an error that names the expected form.
pub fn parse_flag(text: &str) -> Result<Duration, String> {
    parse(text).ok_or_else(|| format!("invalid duration {text:?} (use e.g. 30s, 5m, 1h)"))
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
            assert_eq!(parse(t), Some(Duration::from_secs_f64(s)), "{t}");
        }
        for bad in ["", "ten", "5x", "m"] {
            assert_eq!(parse(bad), None, "{bad}");
        }
        assert_eq!(human(Duration::from_secs(600)), "10m0s");
    }
}
