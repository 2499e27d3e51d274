//! The plugin's outcomes and their exit codes (cli.md §6), documented in `--help` and the
//! README: 0 success, 1 error, 2 usage, 3 wait timed out, 4 wait reached Failed.

use std::time::Duration;

/// Exit code: success, including "already in the requested state".
pub const EXIT_OK: i32 = 0;
/// Exit code: API error, RBAC denial, not found, invalid state.
pub const EXIT_ERROR: i32 = 1;
/// Exit code: unknown flag, missing or malformed argument.
pub const EXIT_USAGE: i32 = 2;
/// Exit code: the wait ran out of time.
pub const EXIT_TIMEOUT: i32 = 3;
/// Exit code: the wait saw a terminal `Failed` (after the failure grace).
pub const EXIT_FAILED: i32 = 4;
/// Exit code: interrupted (Ctrl-C) during a wait, as shells report SIGINT (128 + 2).
pub const EXIT_INTERRUPTED: i32 = 130;

/// Why a command did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Usage(String),
    #[error("kubeconfig: {0}")]
    Config(String),
    #[error("{0}")]
    Api(String),
    #[error("{0}")]
    NotFound(String),
    #[error("forbidden: {0}")]
    Forbidden(String),
    #[error("timeout: {kind} {name} not {goal} after {}{}", crate::duration::human(*.after), details(&[("last failure", &seen.failure), ("last state", &seen.state), ("last warning", &seen.warning)]))]
    Timeout {
        kind: &'static str,
        name: String,
        goal: String,
        after: Duration,
        seen: Box<Seen>,
    },
    #[error("{kind} {name} failed: {reason}{}", details(&[("last warning", last_warning)]))]
    Failed {
        kind: &'static str,
        name: String,
        reason: String,
        last_warning: Option<String>,
    },
    /// Several targets, not all succeeded: the worst exit code and a summary.
    #[error("{message}")]
    Several { code: i32, message: String },
    /// Ctrl-C during a wait; the text says what was written and how to resume.
    #[error("interrupted: {0}")]
    Interrupted(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// What a wait saw last, for its timeout message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    /// The last Failed reason.
    pub failure: Option<String>,
    /// The last phase and Ready message.
    pub state: Option<String>,
    /// The newest Warning Event of the object (`Reason: message`).
    pub warning: Option<String>,
}

/// ` (last failure: X; last warning: Y)` of the parts that are known.
fn details(parts: &[(&str, &Option<String>)]) -> String {
    let known: Vec<String> = parts
        .iter()
        .filter_map(|(label, v)| v.as_ref().map(|v| format!("{label}: {v}")))
        .collect();
    if known.is_empty() {
        String::new()
    } else {
        format!(" ({})", known.join("; "))
    }
}

impl CliError {
    /// The process exit code for this outcome.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Usage(_) => EXIT_USAGE,
            CliError::Timeout { .. } => EXIT_TIMEOUT,
            CliError::Failed { .. } => EXIT_FAILED,
            CliError::Several { code, .. } => *code,
            CliError::Interrupted(_) => EXIT_INTERRUPTED,
            _ => EXIT_ERROR,
        }
    }

    /// Maps an API error: 401/403 and 404 are reported at once with what was denied.
    pub fn from_kube(what: &str, e: kube::Error) -> CliError {
        match &e {
            kube::Error::Api(s) if s.code == 404 => {
                CliError::NotFound(format!("{what}: not found"))
            }
            kube::Error::Api(s) if s.code == 401 || s.code == 403 => {
                CliError::Forbidden(format!("{what}: {}", s.message))
            }
            kube::Error::Api(s) if s.code == 422 || s.code == 400 => {
                CliError::Api(format!("{what}: invalid: {}", s.message))
            }
            _ => CliError::Api(format!("{what}: {e}")),
        }
    }

    /// Transient errors are retried inside a wait; everything else fails fast.
    pub fn is_transient_kube(e: &kube::Error) -> bool {
        match e {
            kube::Error::Api(s) => s.code >= 500 || s.code == 429 || s.code == 408,
            kube::Error::HyperError(_) | kube::Error::Service(_) => true,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_distinct() {
        let timeout = CliError::Timeout {
            kind: "cocoonset",
            name: "demo".into(),
            goal: "Suspended".into(),
            after: Duration::from_secs(600),
            seen: Box::new(Seen {
                failure: Some("SuspendTimedOut".into()),
                ..Seen::default()
            }),
        };
        assert_eq!(timeout.exit_code(), 3);
        assert_eq!(
            timeout.to_string(),
            "timeout: cocoonset demo not Suspended after 10m0s (last failure: SuspendTimedOut)"
        );
        let failed = CliError::Failed {
            kind: "cocoonhibernation",
            name: "demo-0".into(),
            reason: "Failed: hibernate not confirmed within 3m0s".into(),
            last_warning: Some("HibernateTimedOut: snapshot not confirmed".into()),
        };
        assert_eq!(failed.exit_code(), 4);
        assert_eq!(
            failed.to_string(),
            "cocoonhibernation demo-0 failed: Failed: hibernate not confirmed within 3m0s (last warning: HibernateTimedOut: snapshot not confirmed)"
        );
        let stuck = CliError::Timeout {
            kind: "cocoonset",
            name: "demo".into(),
            goal: "Running".into(),
            after: Duration::from_secs(60),
            seen: Box::new(Seen {
                failure: None,
                state: Some("Waking: main pod demo-0 is Pending".into()),
                warning: Some(
                    "WakeNoCapacity: main pod demo-0 unschedulable: 0/3 nodes are available".into(),
                ),
            }),
        };
        assert_eq!(
            stuck.to_string(),
            "timeout: cocoonset demo not Running after 1m0s (last state: Waking: main pod demo-0 is Pending; last warning: WakeNoCapacity: main pod demo-0 unschedulable: 0/3 nodes are available)"
        );
        assert_eq!(CliError::Interrupted("x".into()).exit_code(), 130);
        assert_eq!(
            CliError::Several {
                code: 3,
                message: "x".into()
            }
            .exit_code(),
            3
        );
        assert_eq!(CliError::Usage("x".into()).exit_code(), 2);
        assert_eq!(CliError::Api("x".into()).exit_code(), 1);
        assert_eq!(CliError::NotFound("x".into()).exit_code(), 1);
    }
}
