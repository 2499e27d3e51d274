//! The activity settings of the node agent: `VK_ACTIVITY_INTERVAL`,
//! `VK_ACTIVITY_CPU_THRESHOLD`, `VK_EXEC_WAKE_WAIT` (`contract::env::node`).

use std::time::Duration;

use cocoon_api::contract::env::node as env;
use cocoon_api::contract::idle::parse_duration;

/// Default of [`ActivityConfig::interval`].
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);
/// Default of [`ActivityConfig::cpu_threshold_millicores`]: a fifth of a core, above what an
/// idle guest's hypervisor uses.
pub const DEFAULT_CPU_THRESHOLD_MILLICORES: u64 = 200;
/// Default of [`ActivityConfig::exec_wake_wait`].
pub const DEFAULT_EXEC_WAKE_WAIT: Duration = Duration::from_secs(60);

/// How the node agent measures and publishes activity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActivityConfig {
    /// `VK_ACTIVITY_INTERVAL`: the publish interval (a pod's `suspendAfter` may shorten it).
    pub interval: Duration,
    /// `VK_ACTIVITY_CPU_THRESHOLD`: CPU use above this many millicores is activity.
    pub cpu_threshold_millicores: u64,
    /// `VK_EXEC_WAKE_WAIT`: how long an exec to a suspended pod waits for its VM.
    pub exec_wake_wait: Duration,
}

impl Default for ActivityConfig {
    fn default() -> Self {
        ActivityConfig {
            interval: DEFAULT_INTERVAL,
            cpu_threshold_millicores: DEFAULT_CPU_THRESHOLD_MILLICORES,
            exec_wake_wait: DEFAULT_EXEC_WAKE_WAIT,
        }
    }
}

/// A bad activity setting, naming the variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("parse {var}={value:?}: {reason}")]
pub struct ActivityConfigError {
    pub var: &'static str,
    pub value: String,
    pub reason: String,
}

/// A CPU quantity in millicores: `200m`, `0.5` or `2` (cores).
pub fn parse_millicores(text: &str) -> Option<u64> {
    let text = text.trim();
    if let Some(m) = text.strip_suffix('m') {
        return m.parse().ok();
    }
    let cores: f64 = text
        .parse()
        .ok()
        .filter(|c: &f64| c.is_finite() && *c >= 0.0)?;
    let milli = (cores * 1000.0).round();
    // Below 2^53 the conversion is exact.
    (milli < 9e15).then_some(milli as u64)
}

impl ActivityConfig {
    /// The settings from `val` (an env lookup; blank is unset, unset keeps the default).
    /// Durations must be positive Go durations (`60s`, `1m30s`).
    pub fn from_lookup(val: &dyn Fn(&str) -> Option<String>) -> Result<Self, ActivityConfigError> {
        let d = ActivityConfig::default();
        let get = |var: &str| val(var).filter(|v| !v.trim().is_empty());
        let bad = |var: &'static str, value: String, reason: &str| ActivityConfigError {
            var,
            value,
            reason: reason.into(),
        };
        let duration = |var: &'static str, default: Duration| match get(var) {
            None => Ok(default),
            Some(raw) => match parse_duration(raw.trim()) {
                Ok(v) if !v.is_zero() => Ok(v),
                Ok(_) => Err(bad(var, raw, "must be positive")),
                Err(e) => Err(bad(var, raw, &e.to_string())),
            },
        };
        let cpu = match get(env::ACTIVITY_CPU_THRESHOLD) {
            None => d.cpu_threshold_millicores,
            Some(raw) => parse_millicores(&raw).ok_or_else(|| {
                bad(
                    env::ACTIVITY_CPU_THRESHOLD,
                    raw,
                    "want a CPU quantity such as 200m or 0.5",
                )
            })?,
        };
        Ok(ActivityConfig {
            interval: duration(env::ACTIVITY_INTERVAL, d.interval)?,
            cpu_threshold_millicores: cpu,
            exec_wake_wait: duration(env::EXEC_WAKE_WAIT, d.exec_wake_wait)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<ActivityConfig, ActivityConfigError> {
        ActivityConfig::from_lookup(&|k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    #[test]
    fn defaults_and_overrides() {
        assert_eq!(parse(&[]), Ok(ActivityConfig::default()));
        assert_eq!(
            parse(&[("VK_ACTIVITY_INTERVAL", " ")]),
            Ok(ActivityConfig::default())
        );
        let c = parse(&[
            ("VK_ACTIVITY_INTERVAL", "2s"),
            ("VK_ACTIVITY_CPU_THRESHOLD", "0.5"),
            ("VK_EXEC_WAKE_WAIT", "1m30s"),
        ])
        .expect("valid");
        assert_eq!(c.interval, Duration::from_secs(2));
        assert_eq!(c.cpu_threshold_millicores, 500);
        assert_eq!(c.exec_wake_wait, Duration::from_secs(90));
    }

    #[test]
    fn cpu_quantities_read_as_kubernetes_writes_them() {
        for (text, want) in [
            ("200m", Some(200)),
            ("0", Some(0)),
            ("2", Some(2000)),
            ("0.25", Some(250)),
        ] {
            assert_eq!(parse_millicores(text), want, "{text}");
        }
        for bad in ["", "m", "-1", "lots", "1.5m", "NaN", "inf"] {
            assert_eq!(parse_millicores(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_bad_value_names_its_variable() {
        for (var, value) in [
            ("VK_ACTIVITY_INTERVAL", "60"),
            ("VK_ACTIVITY_INTERVAL", "0s"),
            ("VK_ACTIVITY_CPU_THRESHOLD", "lots"),
            ("VK_EXEC_WAKE_WAIT", "forever"),
        ] {
            let err = parse(&[(var, value)]).expect_err(value).to_string();
            assert!(err.starts_with(&format!("parse {var}=")), "{err}");
        }
    }
}
