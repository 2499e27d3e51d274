//! Operator configuration (`contract.md` §12.1): environment variables supply the defaults,
//! flags override them, empty counts as unset, and the spec's lenient rules apply.

use std::time::Duration;

use crate::hibernation::decide::Timing;
use crate::leader::ElectionTiming;
use crate::ownership::LegacyNames;

/// A configuration value was present but unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("OCI_REGISTRY must be set")]
    RegistryMissing,
    #[error("cocoonset concurrency must be at least 1, got {0}")]
    CocoonSetConcurrency(i64),
    #[error("hibernation concurrency must be at least 1, got {0}")]
    HibernationConcurrency(i64),
    #[error("{name}: invalid duration {value:?} (use Go-style text such as 3m0s, 45s or 500ms)")]
    Duration { name: &'static str, value: String },
    #[error("{name} ({env}): duration {value:?} is out of range")]
    DurationOutOfRange {
        name: &'static str,
        env: &'static str,
        value: String,
    },
    #[error("--metrics-secure (METRICS_SECURE): invalid boolean {0:?} (use true or false)")]
    MetricsSecure(String),
    #[error(
        "leader election timings: need 0 < retry period ({retry:?}) < renew deadline ({renew_deadline:?}) < lease duration ({lease_duration:?})"
    )]
    ElectionTiming {
        lease_duration: Duration,
        renew_deadline: Duration,
        retry: Duration,
    },
}

/// Why a duration text was refused (Go-style duration text is parsed by the contract).
pub use cocoon_api::contract::timefmt::{GoDurationError as DurationError, parse_go_duration};

/// Raw inputs: a flag value when given, else the environment variable (both as text).
#[derive(Debug, Clone, Default)]
pub struct RawConfig {
    pub oci_registry: Option<String>,
    pub metrics_addr: Option<String>,
    /// `--metrics-secure` / `METRICS_SECURE`: `/metrics` needs a token whose user may `get`
    /// it (on unless explicitly false).
    pub metrics_secure: Option<String>,
    pub probe_addr: Option<String>,
    pub leader_elect: Option<String>,
    pub cocoonset_concurrency: Option<String>,
    pub hibernation_concurrency: Option<String>,
    pub hibernate_timeout: Option<String>,
    pub wake_timeout: Option<String>,
    pub requeue_interval: Option<String>,
    /// How long a CocoonSet may stay Suspending (`--suspend-timeout` / `COCOON_SUSPEND_TIMEOUT`).
    pub suspend_timeout: Option<String>,
    /// Leader election: `--leader-elect-lease-duration` / `LEADER_ELECT_LEASE_DURATION`.
    pub lease_duration: Option<String>,
    /// `--leader-elect-renew-deadline` / `LEADER_ELECT_RENEW_DEADLINE`.
    pub renew_deadline: Option<String>,
    /// `--leader-elect-retry-period` / `LEADER_ELECT_RETRY_PERIOD`.
    pub retry_period: Option<String>,
    /// `--accept-legacy-vm-names` / `OPERATOR_ACCEPT_LEGACY_VM_NAMES`: only `true` turns it on.
    pub legacy_vm_names: Option<String>,
}

/// The operator's effective configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct OperatorConfig {
    pub oci_registry: String,
    pub metrics_addr: String,
    /// Whether `/metrics` authenticates (TokenReview) and authorizes (SubjectAccessReview)
    /// each scrape ([`crate::metrics_auth`]); default true.
    pub metrics_secure: bool,
    pub probe_addr: String,
    pub leader_elect: bool,
    pub cocoonset_concurrency: u16,
    pub hibernation_concurrency: u16,
    pub hibernation_timing: Timing,
    /// The CocoonSet suspend deadline (`cocoonset.md` 6C), default 3m0s.
    pub suspend_timeout: Duration,
    /// Lease duration, renew deadline and retry period (15s, 10s, 2s by default).
    pub election: ElectionTiming,
    /// Whether the registry GC's ownership gate accepts legacy unhashed VM names of an
    /// object's own pods (off by default; [`crate::ownership`] states the risk).
    pub legacy_vm_names: LegacyNames,
}

/// The spec's suspend deadline: `Suspending` → `Failed` after this long.
pub const DEFAULT_SUSPEND_TIMEOUT: Duration = Duration::from_secs(180);

fn set(v: &Option<String>) -> Option<&str> {
    v.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

/// `host:port` or `:port` as Go writes listen addresses; `:8080` listens on every interface.
pub fn listen_addr(addr: &str) -> String {
    if addr.starts_with(':') {
        format!("0.0.0.0{addr}")
    } else {
        addr.to_string()
    }
}

fn concurrency(raw: &Option<String>, err: fn(i64) -> ConfigError) -> Result<u16, ConfigError> {
    let Some(text) = set(raw) else {
        return Ok(4);
    };
    // An unparsable value means the default; a parsed value below 1 is refused.
    match text.parse::<i64>() {
        Err(_) => Ok(4),
        Ok(n) if n < 1 => Err(err(n)),
        Ok(n) => Ok(n.min(u16::MAX as i64) as u16),
    }
}

fn duration(
    (name, env): (&'static str, &'static str),
    raw: &Option<String>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    let Some(text) = set(raw) else {
        return Ok(default);
    };
    parse_go_duration(text).map_err(|e| match e {
        DurationError::Invalid => ConfigError::Duration {
            name,
            value: text.to_string(),
        },
        DurationError::OutOfRange => ConfigError::DurationOutOfRange {
            name,
            env,
            value: text.to_string(),
        },
    })
}

/// The flag and environment variable of each duration setting.
pub const HIBERNATE_TIMEOUT: (&str, &str) = ("--hibernate-timeout", "COCOON_HIBERNATE_TIMEOUT");
pub const WAKE_TIMEOUT: (&str, &str) = ("--wake-timeout", "COCOON_WAKE_TIMEOUT");
pub const REQUEUE_INTERVAL: (&str, &str) = ("--requeue-interval", "COCOON_REQUEUE_INTERVAL");
pub const SUSPEND_TIMEOUT: (&str, &str) = ("--suspend-timeout", "COCOON_SUSPEND_TIMEOUT");
pub const LEASE_DURATION: (&str, &str) = (
    "--leader-elect-lease-duration",
    "LEADER_ELECT_LEASE_DURATION",
);
pub const RENEW_DEADLINE: (&str, &str) = (
    "--leader-elect-renew-deadline",
    "LEADER_ELECT_RENEW_DEADLINE",
);
pub const RETRY_PERIOD: (&str, &str) = ("--leader-elect-retry-period", "LEADER_ELECT_RETRY_PERIOD");

/// The election timings must order as client-go's do: a holder gives up (renew deadline)
/// before anyone may take over (lease duration), and retries within the deadline.
pub fn election_timing(t: ElectionTiming) -> Result<ElectionTiming, ConfigError> {
    let ordered = Duration::ZERO < t.retry
        && t.retry < t.renew_deadline
        && t.renew_deadline < t.lease_duration;
    if ordered {
        Ok(t)
    } else {
        Err(ConfigError::ElectionTiming {
            lease_duration: t.lease_duration,
            renew_deadline: t.renew_deadline,
            retry: t.retry,
        })
    }
}

impl RawConfig {
    /// Applies defaults and validation.
    pub fn resolve(&self) -> Result<OperatorConfig, ConfigError> {
        let oci_registry = set(&self.oci_registry)
            .ok_or(ConfigError::RegistryMissing)?
            .to_string();
        let defaults = Timing::default();
        let hibernation_timing = Timing {
            hibernate_timeout: duration(
                HIBERNATE_TIMEOUT,
                &self.hibernate_timeout,
                defaults.hibernate_timeout,
            )?,
            wake_timeout: duration(WAKE_TIMEOUT, &self.wake_timeout, defaults.wake_timeout)?,
            requeue: duration(REQUEUE_INTERVAL, &self.requeue_interval, defaults.requeue)?,
            finalizer_requeue: defaults.finalizer_requeue,
        };
        Ok(OperatorConfig {
            oci_registry,
            metrics_addr: listen_addr(set(&self.metrics_addr).unwrap_or(":8080")),
            metrics_secure: match set(&self.metrics_secure).map(str::to_ascii_lowercase) {
                None => true,
                Some(v) => match v.as_str() {
                    "true" | "1" | "t" => true,
                    "false" | "0" | "f" => false,
                    _ => return Err(ConfigError::MetricsSecure(v)),
                },
            },
            probe_addr: listen_addr(set(&self.probe_addr).unwrap_or(":8081")),
            // Anything but an explicit false keeps leader election on.
            leader_elect: !matches!(
                set(&self.leader_elect)
                    .map(str::to_ascii_lowercase)
                    .as_deref(),
                Some("false" | "0" | "f")
            ),
            cocoonset_concurrency: concurrency(
                &self.cocoonset_concurrency,
                ConfigError::CocoonSetConcurrency,
            )?,
            hibernation_concurrency: concurrency(
                &self.hibernation_concurrency,
                ConfigError::HibernationConcurrency,
            )?,
            hibernation_timing,
            suspend_timeout: duration(
                SUSPEND_TIMEOUT,
                &self.suspend_timeout,
                DEFAULT_SUSPEND_TIMEOUT,
            )?,
            election: {
                let d = ElectionTiming::default();
                election_timing(ElectionTiming {
                    lease_duration: duration(
                        LEASE_DURATION,
                        &self.lease_duration,
                        d.lease_duration,
                    )?,
                    renew_deadline: duration(
                        RENEW_DEADLINE,
                        &self.renew_deadline,
                        d.renew_deadline,
                    )?,
                    retry: duration(RETRY_PERIOD, &self.retry_period, d.retry)?,
                })?
            },
            // A boolean of the contract: true only for the exact string `true`.
            legacy_vm_names: if set(&self.legacy_vm_names) == Some("true") {
                LegacyNames::Accept
            } else {
                LegacyNames::Refuse
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw() -> RawConfig {
        RawConfig {
            oci_registry: Some("127.0.0.1:5000/cocoon".into()),
            ..Default::default()
        }
    }

    #[test]
    fn defaults_follow_the_spec() {
        let c = raw().resolve().expect("valid");
        assert_eq!(c.metrics_addr, "0.0.0.0:8080");
        assert_eq!(c.probe_addr, "0.0.0.0:8081");
        assert!(c.metrics_secure, "metrics need a token by default");
        assert!(c.leader_elect);
        assert_eq!((c.cocoonset_concurrency, c.hibernation_concurrency), (4, 4));
        assert_eq!(c.hibernation_timing, Timing::default());
        assert_eq!(c.suspend_timeout, Duration::from_secs(180));
        assert_eq!(c.election, ElectionTiming::default());
        assert_eq!(c.legacy_vm_names, LegacyNames::Refuse);
        for (text, want) in [
            ("true", LegacyNames::Accept),
            ("TRUE", LegacyNames::Refuse),
            ("1", LegacyNames::Refuse),
        ] {
            let c = RawConfig {
                legacy_vm_names: Some(text.into()),
                ..raw()
            };
            assert_eq!(c.resolve().map(|c| c.legacy_vm_names), Ok(want), "{text}");
        }
    }

    #[test]
    fn huge_durations_are_a_config_error_naming_the_variable() {
        let huge = "9".repeat(400) + "h";
        for (text, want) in [
            ("100000000000000000000h", DurationError::OutOfRange),
            (huge.as_str(), DurationError::OutOfRange),
            ("1.8446744073709552e19s", DurationError::Invalid),
            ("-5s", DurationError::Invalid),
            ("NaNs", DurationError::Invalid),
            ("infh", DurationError::Invalid),
        ] {
            assert_eq!(parse_go_duration(text), Err(want), "{text}");
        }
        type Field = fn(&mut RawConfig) -> &mut Option<String>;
        let fields: [(Field, &str); 4] = [
            (
                |r| &mut r.hibernate_timeout,
                "--hibernate-timeout (COCOON_HIBERNATE_TIMEOUT)",
            ),
            (
                |r| &mut r.wake_timeout,
                "--wake-timeout (COCOON_WAKE_TIMEOUT)",
            ),
            (
                |r| &mut r.requeue_interval,
                "--requeue-interval (COCOON_REQUEUE_INTERVAL)",
            ),
            (
                |r| &mut r.suspend_timeout,
                "--suspend-timeout (COCOON_SUSPEND_TIMEOUT)",
            ),
        ];
        for (field, named) in fields {
            let mut r = raw();
            *field(&mut r) = Some("100000000000000000000h".into());
            let err = r.resolve().expect_err("refused");
            assert_eq!(
                err.to_string(),
                format!("{named}: duration \"100000000000000000000h\" is out of range")
            );
        }
    }

    #[test]
    fn election_timings_are_configurable_and_must_order() {
        let with = |l: &str, d: &str, r: &str| RawConfig {
            lease_duration: Some(l.into()),
            renew_deadline: Some(d.into()),
            retry_period: Some(r.into()),
            ..raw()
        };
        assert_eq!(
            with("3s", "2s", "300ms").resolve().map(|c| c.election),
            Ok(ElectionTiming {
                lease_duration: Duration::from_secs(3),
                renew_deadline: Duration::from_secs(2),
                retry: Duration::from_millis(300),
            })
        );
        for (l, d, r) in [
            ("3s", "3s", "1s"),
            ("3s", "4s", "1s"),
            ("3s", "2s", "2s"),
            ("3s", "2s", "0"),
        ] {
            assert!(
                matches!(
                    with(l, d, r).resolve(),
                    Err(ConfigError::ElectionTiming { .. })
                ),
                "{l} {d} {r}"
            );
        }
        let bad = RawConfig {
            renew_deadline: Some("soon".into()),
            ..raw()
        };
        assert_eq!(
            bad.resolve().expect_err("bad").to_string(),
            "--leader-elect-renew-deadline: invalid duration \"soon\" (use Go-style text such as 3m0s, 45s or 500ms)"
        );
    }

    #[test]
    fn suspend_timeout_takes_go_durations() {
        let r = RawConfig {
            suspend_timeout: Some("1m30s".into()),
            ..raw()
        };
        assert_eq!(
            r.resolve().map(|c| c.suspend_timeout),
            Ok(Duration::from_secs(90))
        );
        let bad = RawConfig {
            suspend_timeout: Some("soon".into()),
            ..raw()
        };
        assert!(matches!(
            bad.resolve(),
            Err(ConfigError::Duration {
                name: "--suspend-timeout",
                ..
            })
        ));
    }

    #[test]
    fn registry_is_required_and_empty_counts_as_unset() {
        for v in [None, Some(String::new()), Some("  ".into())] {
            let r = RawConfig {
                oci_registry: v,
                ..Default::default()
            };
            assert_eq!(r.resolve(), Err(ConfigError::RegistryMissing));
        }
        assert_eq!(
            ConfigError::RegistryMissing.to_string(),
            "OCI_REGISTRY must be set"
        );
    }

    #[test]
    fn concurrency_rules() {
        let with = |cs: &str, h: &str| RawConfig {
            cocoonset_concurrency: Some(cs.into()),
            hibernation_concurrency: Some(h.into()),
            ..raw()
        };
        assert_eq!(
            with("8", "2")
                .resolve()
                .map(|c| (c.cocoonset_concurrency, c.hibernation_concurrency)),
            Ok((8, 2))
        );
        assert_eq!(
            with("many", "x")
                .resolve()
                .map(|c| (c.cocoonset_concurrency, c.hibernation_concurrency)),
            Ok((4, 4))
        );
        let err = with("0", "1").resolve().expect_err("refused");
        assert_eq!(
            err.to_string(),
            "cocoonset concurrency must be at least 1, got 0"
        );
        let err = with("1", "-3").resolve().expect_err("refused");
        assert_eq!(
            err.to_string(),
            "hibernation concurrency must be at least 1, got -3"
        );
    }

    #[test]
    fn leader_elect_is_true_unless_explicitly_false() {
        for (v, want) in [
            ("false", false),
            ("FALSE", false),
            ("0", false),
            ("true", true),
            ("yes?", true),
            ("", true),
        ] {
            let r = RawConfig {
                leader_elect: Some(v.into()),
                ..raw()
            };
            assert_eq!(r.resolve().map(|c| c.leader_elect), Ok(want), "{v:?}");
        }
    }

    #[test]
    fn metrics_are_secure_unless_explicitly_not() {
        for (v, want) in [
            ("", Ok(true)),
            ("true", Ok(true)),
            ("1", Ok(true)),
            ("false", Ok(false)),
            ("FALSE", Ok(false)),
            ("0", Ok(false)),
            ("no", Err(ConfigError::MetricsSecure("no".into()))),
        ] {
            let r = RawConfig {
                metrics_secure: Some(v.into()),
                ..raw()
            };
            assert_eq!(r.resolve().map(|c| c.metrics_secure), want, "{v:?}");
        }
    }

    #[test]
    fn go_durations() {
        for (text, secs) in [
            ("3m0s", 180.0),
            ("5m", 300.0),
            ("45s", 45.0),
            ("250ms", 0.25),
            ("1h30m", 5400.0),
            ("1.5s", 1.5),
            ("0", 0.0),
        ] {
            assert_eq!(
                parse_go_duration(text),
                Ok(Duration::from_secs_f64(secs)),
                "{text}"
            );
        }
        for bad in ["", "3", "m", "3x", "-1s", "1s2"] {
            assert_eq!(parse_go_duration(bad), Err(DurationError::Invalid), "{bad}");
        }
        let r = RawConfig {
            wake_timeout: Some("soon".into()),
            ..raw()
        };
        assert_eq!(
            r.resolve().expect_err("bad").to_string(),
            "--wake-timeout: invalid duration \"soon\" (use Go-style text such as 3m0s, 45s or 500ms)"
        );
    }
}
