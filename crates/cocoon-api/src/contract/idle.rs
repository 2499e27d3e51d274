//! Idle suspend and wake on connect or exec (issue 39): the keys, reasons and values the node
//! agents, the operator, the activator and the plugin share. Additive to the Go contract.
//!
//! **Activity** is measured by the node agent, per VM: open exec/attach/port-forward/log-follow
//! sessions, bytes in and out of the VM's network, CPU use above a threshold. It publishes a
//! coarse last-activity time on the pod ([`LAST_ACTIVITY`], [`LAST_ACTIVITY_KIND`]), written at
//! most once per publish interval: the node's own interval, shortened to half the set's
//! `suspendAfter` that the operator copies onto the member pods ([`SUSPEND_AFTER`]), so a
//! published time is never older than half the idle limit while the VM is active.
//!
//! **Idle suspend.** When every member has been idle for `spec.idle.suspendAfter`, the operator
//! writes `spec.suspend: true` with its own field manager ([`IDLE_FIELD_MANAGER`]) and, in the
//! same patch, the set annotation [`IDLE_SUSPENDED`] (the time). The annotation is what makes a
//! suspend an idle one: the plugin's `suspend` and `resume` remove it, so a user's own suspend
//! is never woken by a connection, and a user's resume restarts the idle clock.
//!
//! **Wake.** The activator (a connection) or the operator (an exec, asked through the
//! node-owned pod annotation [`WAKE_REQUEST`]) writes `spec.suspend: false`, removes
//! [`IDLE_SUSPENDED`] and writes [`WOKEN_BY`] (`connection` | `exec`) in one patch, with the
//! field manager [`ACTIVATOR_FIELD_MANAGER`]; the operator turns [`WOKEN_BY`] into the `Idle`
//! condition and an Event, then removes it.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::timefmt::{parse_rfc3339, rfc3339_seconds};

/// Smallest `spec.idle.suspendAfter` the CRD accepts.
pub const MIN_SUSPEND_AFTER_SECS: u64 = 10;

// ---- pod annotations ----

/// Node-owned: RFC3339 (whole seconds) time of the VM's last activity the node agent saw.
pub const LAST_ACTIVITY: &str = "vm.cocoonstack.io/last-activity";
/// Node-owned: what that activity was ([`ActivityKind`]), same patch as [`LAST_ACTIVITY`].
pub const LAST_ACTIVITY_KIND: &str = "vm.cocoonstack.io/last-activity-kind";
/// Node-owned: RFC3339 time an exec or attach to this (suspended) pod asked for a wake.
pub const WAKE_REQUEST: &str = "vm.cocoonstack.io/wake-request";
/// Operator-owned, on member pods of a set with `spec.idle.suspendAfter`: the set's
/// `suspendAfter` (Go duration text), so the node agent publishes activity often enough.
pub const SUSPEND_AFTER: &str = "cocoonset.cocoonstack.io/idle-suspend-after";

// ---- CocoonSet annotations ----

/// RFC3339 time the operator suspended the set because it was idle. Present = the current
/// suspend is an idle one (a connection or exec may wake it).
pub const IDLE_SUSPENDED: &str = "cocoonset.cocoonstack.io/idle-suspended";
/// `connection` | `exec`: what woke an idle-suspended set; written with the resume, removed by
/// the operator once the `Idle` condition says it.
pub const WOKEN_BY: &str = "cocoonset.cocoonstack.io/woken-by";
/// Value of [`WOKEN_BY`] for a connection to the activator.
pub const WOKEN_BY_CONNECTION: &str = "connection";
/// Value of [`WOKEN_BY`] for an exec or attach.
pub const WOKEN_BY_EXEC: &str = "exec";
/// Operator-owned: the RFC3339 time of the newest [`WAKE_REQUEST`] the operator acted on —
/// woke the set for it (written with the wake), or refused it (a user's suspend, or `exec` not
/// in `wakeOn`: told by one Event, not one per pass). An older request is an old one.
pub const WAKE_HANDLED: &str = "cocoonset.cocoonstack.io/wake-request-handled";

// ---- field managers ----

/// Field manager of the operator's idle suspend.
pub const IDLE_FIELD_MANAGER: &str = "cocoon-idle";
/// Field manager of a wake by connection or exec.
pub const ACTIVATOR_FIELD_MANAGER: &str = "cocoon-activator";

// ---- Service and EndpointSlice ----

/// Label on the EndpointSlice the operator keeps for a set with `spec.idle.ports`
/// (`endpointslice.kubernetes.io/managed-by`).
pub const ENDPOINTSLICE_MANAGED_BY: &str = "cocoon-operator.cocoonstack.io";

// ---- status ----

/// Condition type on the CocoonSet.
pub const CONDITION_IDLE: &str = "Idle";

/// Event and condition reasons (Normal unless said).
pub mod reasons {
    /// The set suspended itself: every member idle for `suspendAfter`.
    pub const IDLE_SUSPENDED: &str = "IdleSuspended";
    /// A connection woke the set.
    pub const WOKEN_BY_CONNECTION: &str = "WokenByConnection";
    /// An exec or attach woke the set.
    pub const WOKEN_BY_EXEC: &str = "WokenByExec";
    /// Condition reason while the set is awake and counting (`Idle=False`).
    pub const ACTIVE: &str = "Active";
    /// Warning: a held connection waited longer than the bound and was closed.
    pub const WAKE_WAIT_EXCEEDED: &str = "WakeWaitExceeded";
    /// Warning: the activator held its most connections and closed a new one.
    pub const ACTIVATOR_FULL: &str = "ActivatorFull";
    /// Warning: a Service of the set's name exists and is not the operator's.
    pub const SERVICE_CONFLICT: &str = "ServiceConflict";
    /// Warning: an exec or a connection asked to wake a set that a user suspended, or whose
    /// `wakeOn` lacks that kind (or, for a connection, whose VM IP is outside the activator's
    /// `ACTIVATOR_VM_CIDRS`): the set stays suspended (the connection is closed).
    pub const WAKE_IGNORED: &str = "WakeIgnored";
}

/// What the last activity of a VM was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActivityKind {
    /// Bytes in or out of the VM's network.
    Traffic,
    /// An open exec/attach/port-forward/log-follow session.
    Session,
    /// CPU use above the node's threshold.
    Cpu,
}

impl ActivityKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Traffic => "traffic",
            Self::Session => "session",
            Self::Cpu => "cpu",
        }
    }

    /// The kind named by an annotation value; `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "traffic" => Some(Self::Traffic),
            "session" => Some(Self::Session),
            "cpu" => Some(Self::Cpu),
            _ => None,
        }
    }
}

/// A Go duration (`90s`, `1h30m`, `1.5m`) as the CRD's pattern admits it.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    super::timefmt::parse_go_duration(text).map_err(|_| DurationError(text.to_owned()))
}

/// A value that is not a Go duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a duration such as 90s, 15m or 1h30m")]
pub struct DurationError(pub String);

/// A VM's last activity as the node publishes it on the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastActivity {
    pub at: DateTime<Utc>,
    pub kind: ActivityKind,
}

impl LastActivity {
    /// The pair of annotation values ([`LAST_ACTIVITY`], [`LAST_ACTIVITY_KIND`]).
    pub fn to_annotations(self) -> [(&'static str, String); 2] {
        [
            (LAST_ACTIVITY, rfc3339_seconds(self.at)),
            (LAST_ACTIVITY_KIND, self.kind.as_str().to_owned()),
        ]
    }

    /// Read back from pod annotations; `None` when the time is missing or unparsable (an
    /// unknown kind reads as [`ActivityKind::Traffic`]: the time is what counts).
    pub fn from_annotations(
        annotations: &std::collections::BTreeMap<String, String>,
    ) -> Option<Self> {
        let at = parse_rfc3339(annotations.get(LAST_ACTIVITY)?)?;
        let kind = annotations
            .get(LAST_ACTIVITY_KIND)
            .and_then(|k| ActivityKind::parse(k))
            .unwrap_or(ActivityKind::Traffic);
        Some(Self { at, kind })
    }
}

/// How often the node agent may publish a VM's activity: its own `interval`, shortened to
/// half the set's `suspendAfter` (never below 1 s), so an active VM never looks idle.
pub fn publish_interval(interval: Duration, suspend_after: Option<Duration>) -> Duration {
    match suspend_after {
        Some(limit) => interval.min(limit / 2).max(Duration::from_secs(1)),
        None => interval,
    }
}

/// The merge patch of an idle suspend: `spec.suspend: true` and [`IDLE_SUSPENDED`] = `now`
/// (write it with [`IDLE_FIELD_MANAGER`] and the set's resourceVersion, so a user's edit in
/// between wins).
pub fn idle_suspend_patch(now: DateTime<Utc>, resource_version: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {
            "resourceVersion": resource_version,
            "annotations": { IDLE_SUSPENDED: rfc3339_seconds(now) },
        },
        "spec": { "suspend": true },
    })
}

/// The merge patch of a wake by `woken_by` ([`WOKEN_BY_CONNECTION`] or [`WOKEN_BY_EXEC`]):
/// `spec.suspend: false`, [`IDLE_SUSPENDED`] removed, [`WOKEN_BY`] written (write it with
/// [`ACTIVATOR_FIELD_MANAGER`] and the resourceVersion the caller saw the idle suspend in, so
/// a user's suspend in between is never undone).
pub fn wake_patch(woken_by: &str, resource_version: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {
            "resourceVersion": resource_version,
            "annotations": { IDLE_SUSPENDED: null, WOKEN_BY: woken_by },
        },
        "spec": { "suspend": false },
    })
}

/// The annotation removal the plugin's `suspend` and `resume` add to their patch, so the
/// suspend (or resume) is the user's and no connection undoes it.
pub fn user_owns_suspend_patch() -> serde_json::Value {
    serde_json::json!({ "metadata": { "annotations": { IDLE_SUSPENDED: null } } })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patches_carry_the_precondition_and_the_annotations() {
        let now = parse_rfc3339("2026-12-07T22:00:05Z").unwrap();
        let p = idle_suspend_patch(now, "41");
        assert_eq!(p["spec"]["suspend"], true);
        assert_eq!(p["metadata"]["resourceVersion"], "41");
        assert_eq!(
            p["metadata"]["annotations"][IDLE_SUSPENDED],
            "2026-12-07T22:00:05Z"
        );
        let w = wake_patch(WOKEN_BY_EXEC, "42");
        assert_eq!(w["spec"]["suspend"], false);
        assert_eq!(w["metadata"]["annotations"][WOKEN_BY], "exec");
        assert!(w["metadata"]["annotations"][IDLE_SUSPENDED].is_null());
        assert!(
            user_owns_suspend_patch()["metadata"]["annotations"]
                .as_object()
                .unwrap()
                .contains_key(IDLE_SUSPENDED)
        );
    }

    #[test]
    fn durations_read_as_go_writes_them() {
        for (text, secs) in [
            ("10s", 10.0),
            ("90s", 90.0),
            ("15m", 900.0),
            ("1h30m", 5400.0),
            ("1.5m", 90.0),
            ("500ms", 0.5),
        ] {
            assert_eq!(
                parse_duration(text),
                Ok(Duration::from_secs_f64(secs)),
                "{text}"
            );
        }
        for bad in ["", "10", "s", "10x", "1h-3m", "ten seconds"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn activity_round_trips_through_the_pod_annotations() {
        let at = parse_rfc3339("2026-12-07T22:00:05Z").unwrap();
        let activity = LastActivity {
            at,
            kind: ActivityKind::Session,
        };
        let map = activity
            .to_annotations()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        assert_eq!(LastActivity::from_annotations(&map), Some(activity));
        assert_eq!(
            map.get(LAST_ACTIVITY).map(String::as_str),
            Some("2026-12-07T22:00:05Z")
        );
        let mut broken = map.clone();
        broken.insert(LAST_ACTIVITY.into(), "yesterday".into());
        assert_eq!(LastActivity::from_annotations(&broken), None);
    }

    #[test]
    fn an_active_vm_is_published_at_least_twice_per_idle_limit() {
        let minute = Duration::from_secs(60);
        assert_eq!(publish_interval(minute, None), minute);
        assert_eq!(
            publish_interval(minute, Some(Duration::from_secs(20))),
            Duration::from_secs(10)
        );
        assert_eq!(
            publish_interval(minute, Some(Duration::from_secs(3600))),
            minute
        );
        assert_eq!(
            publish_interval(minute, Some(Duration::from_millis(10))),
            Duration::from_secs(1)
        );
    }
}
