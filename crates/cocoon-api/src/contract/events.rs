//! Kubernetes Event reasons, types, source components and message formats of `contract.md` §10,
//! plus the node agent's eviction reasons (§10.4). Message builders keep the exact wording.

use std::time::Duration;

use super::parse::truncate_utf8;
use super::timefmt::go_duration;

/// Event type `Normal`.
pub const TYPE_NORMAL: &str = "Normal";
/// Event type `Warning`.
pub const TYPE_WARNING: &str = "Warning";

/// Event source component of the operator.
pub const COMPONENT_OPERATOR: &str = "cocoon-operator";
/// Event source component of the node agent (host = node name).
pub const COMPONENT_NODE: &str = "vk-cocoon";

/// §10.1 and §10.2: operator reasons, on the CocoonSet and on the CocoonHibernation.
pub mod operator {
    /// Warning: the main pod reported `lifecycle-state=failed`.
    pub const POD_LIFECYCLE_FAILED: &str = "PodLifecycleFailed";
    /// Warning: the main agent failed (same message format as [`POD_LIFECYCLE_FAILED`]).
    pub const MAIN_AGENT_FAILED: &str = "MainAgentFailed";
    /// Warning: a suspend did not complete within the deadline.
    pub const SUSPEND_TIMED_OUT: &str = "SuspendTimedOut";
    /// Warning: the restored main of a migration is unschedulable.
    pub const MIGRATE_NO_CAPACITY: &str = "MigrateNoCapacity";
    /// Warning: the main of a release wake is unschedulable.
    pub const WAKE_NO_CAPACITY: &str = "WakeNoCapacity";
    /// Warning: a pod exhausted its rebuild budget (any role; historical name).
    pub const SUB_AGENT_DEAD_LETTER: &str = "SubAgentDeadLetter";
    /// Normal: a budgeted rebuild deleted a pod (any role; historical name).
    pub const SUB_AGENT_REBUILDING: &str = "SubAgentRebuilding";
    /// Normal: a failed main is Ready again.
    pub const RECOVERED_FROM_FAILURE: &str = "RecoveredFromFailure";

    /// Normal (CocoonHibernation): the hibernate snapshot is confirmed in the registry.
    pub const HIBERNATED: &str = "Hibernated";
    /// Normal (CocoonHibernation): the woken pod is running.
    pub const WOKEN_ACTIVE: &str = "WokenActive";
    /// Normal (CocoonHibernation): a Failed CR is retried.
    pub const RETRY_REQUESTED: &str = "RetryRequested";
    /// Warning (CocoonHibernation): the snapshot was not confirmed within the deadline.
    pub const HIBERNATE_TIMED_OUT: &str = "HibernateTimedOut";
    /// Warning (CocoonHibernation): the woken container was not running within the deadline.
    pub const WAKE_TIMED_OUT: &str = "WakeTimedOut";
    /// Warning (CocoonSet and CocoonHibernation; not in the spec's table, chosen here): a VM
    /// name read from a user-writable annotation or field (`delete-vm-names`, the
    /// `hibernate-reclaim` record, a pod's `vm.cocoonstack.io/name`, `status.vmName`) is not
    /// one the operator recomputes from the object's own pods, so no registry probe, delete
    /// or reclaim runs on it. Message: [`super::foreign_vm_name_message`]. Emitted once per
    /// object, source and name.
    pub const FOREIGN_VM_NAME_IGNORED: &str = "ForeignVMNameIgnored";
}

/// §10.3: node agent reasons, on the pod.
pub mod node {
    /// Warning: VM bring-up failed in CreatePod.
    pub const CREATE_BRING_UP_FAILED: &str = "CreateBringUpFailed";
    /// Warning: the registry could not be read while deciding on a derived restore.
    pub const HIBERNATE_EVIDENCE_UNAVAILABLE: &str = "HibernateEvidenceUnavailable";
    /// Warning: CreatePod failed because of the evidence step.
    pub const HIBERNATE_EVIDENCE_FAILED: &str = "HibernateEvidenceFailed";
    /// Warning: restoring from the hibernate snapshot instead of fresh-booting.
    pub const HIBERNATE_SNAPSHOT_EXISTS: &str = "HibernateSnapshotExists";
    /// Warning: CH+Windows NIC drop failed.
    pub const HIBERNATE_NET_RESIZE_FAILED: &str = "HibernateNetResizeFailed";
    /// Warning: snapshot save failed.
    pub const HIBERNATE_SNAPSHOT_FAILED: &str = "HibernateSnapshotFailed";
    /// Warning: push of `:hibernate` failed.
    pub const HIBERNATE_PUSH_FAILED: &str = "HibernatePushFailed";
    /// Warning: VM removal after the push failed (rollback ran).
    pub const HIBERNATE_REMOVE_FAILED: &str = "HibernateRemoveFailed";
    /// Warning: the wake source could not be resolved or pulled.
    pub const WAKE_PULL_FAILED: &str = "WakePullFailed";
    /// Normal (beyond, additive): a snapshot of the pod's VM was pushed; the message says how
    /// much moved ([`snapshot_transfer_message`](super::snapshot_transfer_message)).
    pub const SNAPSHOT_PUSHED: &str = "SnapshotPushed";
    /// Normal (beyond, additive): the pod's hibernation snapshot was pulled for a wake.
    pub const SNAPSHOT_PULLED: &str = "SnapshotPulled";
    /// Warning: the wake clone failed.
    pub const WAKE_CLONE_FAILED: &str = "WakeCloneFailed";
    /// Warning: no DHCP lease within the wait after a wake.
    pub const WAKE_IP_WAIT_TIMEOUT: &str = "WakeIPWaitTimeout";
    /// Warning: no DHCP lease within the wait after a clone.
    pub const POST_CLONE_IP_WAIT_TIMEOUT: &str = "PostCloneIPWaitTimeout";
    /// Normal: hibernate finished.
    pub const HIBERNATED: &str = "Hibernated";
    /// Normal: wake finished.
    pub const WOKEN: &str = "Woken";
    /// Normal: an interrupted operation was resumed after a node agent restart.
    pub const RESUMED_AFTER_RESTART: &str = "ResumedAfterRestart";
    /// Warning: a resumed operation could not start the VM.
    pub const RESUME_START_FAILED: &str = "ResumeStartFailed";
    /// Warning: the resume classification exhausted its budget.
    pub const RESUME_CLASSIFY_FAILED: &str = "ResumeClassifyFailed";
    /// Warning (beyond): one automatic post-clone fixup attempt failed.
    pub const POST_CLONE_EXEC_ATTEMPT_FAILED: &str = "PostCloneExecAttemptFailed";
    /// Warning (beyond): the automatic post-clone fixup gave up.
    pub const POST_CLONE_EXEC_EXHAUSTED: &str = "PostCloneExecExhausted";
    /// Normal (beyond): the automatic post-clone fixup succeeded.
    pub const POST_CLONE_SUCCEEDED: &str = "PostCloneSucceeded";
    /// Warning (beyond): Windows static IP over the serial console failed.
    pub const WINDOWS_STATIC_IP_FAILED: &str = "WindowsStaticIPFailed";
    /// Warning (beyond): dialing the Windows SAC console failed.
    pub const POST_CLONE_SAC_DIAL_FAILED: &str = "PostCloneSACDialFailed";
    /// Warning (beyond): enumerating NICs over SAC failed.
    pub const POST_CLONE_SAC_ENUM_FAILED: &str = "PostCloneSACEnumFailed";
    /// Warning (beyond): setting the IP over SAC failed.
    pub const POST_CLONE_SAC_SET_FAILED: &str = "PostCloneSACSetFailed";
    /// Warning (beyond): verifying the IP over SAC failed.
    pub const POST_CLONE_SAC_VERIFY_FAILED: &str = "PostCloneSACVerifyFailed";
    /// Warning: a hibernate was requested for a guest that cannot hibernate (macOS).
    pub const HIBERNATE_UNSUPPORTED: &str = "HibernateUnsupported";
    /// Warning (not in the spec's table; chosen here): the pod asked for a VM, a fork source
    /// or a `clone-from-dir` directory outside its tenant (node-agent tenant isolation). The
    /// message names the annotation; the pod's lifecycle is `failed` with the same text.
    pub const TENANT_ISOLATION_REFUSED: &str = "TenantIsolationRefused";
    /// Warning (not in the spec's table; chosen here, issue 40): a deleted pod's guest did not
    /// shut down within the pod's grace period (`vm stop --timeout`), so `vm rm --force`
    /// killed it. The delete goes on; the message names the VM and the grace period.
    pub const VM_STOP_TIMEOUT: &str = "VMStopTimeout";
    /// Warning (not in the spec's table; chosen here, issue 40): the graceful `vm stop` of a
    /// deleted pod's VM failed; `vm rm --force` removes it anyway.
    pub const VM_STOP_FAILED: &str = "VMStopFailed";

    /// `Hibernated` message when the snapshot reached the registry.
    pub const MSG_HIBERNATED_PUSHED: &str = "snapshot pushed to registry";
    /// `Hibernated` message when no registry pusher is configured (tests only).
    pub const MSG_HIBERNATED_LOCAL: &str = "snapshot saved locally (no registry pusher configured)";

    /// Operation names used in `<op>: <err>` failure messages and metrics.
    pub const OP_CREATE: &str = "create";
    /// See [`OP_CREATE`].
    pub const OP_UPDATE: &str = "update";
    /// See [`OP_CREATE`].
    pub const OP_DELETE: &str = "delete";
    /// See [`OP_CREATE`].
    pub const OP_RECONCILE: &str = "reconcile";
}

/// §10.4: container `terminated.reason` (and message) when the node agent deletes a pod.
pub mod eviction {
    /// The VM no longer exists.
    pub const VM_GONE: &str = "VMGone";
    /// Message of [`VM_GONE`].
    pub const VM_GONE_MESSAGE: &str = "vm no longer exists";
    /// A restart was refused because the cooldown has not elapsed.
    pub const RESTART_COOLDOWN: &str = "RestartCooldown";
    /// Message of [`RESTART_COOLDOWN`].
    pub const RESTART_COOLDOWN_MESSAGE: &str = "restart cooldown not elapsed";
    /// `cocoon vm start` failed; the message is the error text.
    pub const RESTART_FAILED: &str = "RestartFailed";
    /// `vm inspect` did not resolve in time.
    pub const VM_INSPECT_TIMEOUT: &str = "VMInspectTimeout";
    /// Message of [`VM_INSPECT_TIMEOUT`].
    pub const VM_INSPECT_TIMEOUT_MESSAGE: &str = "vm inspect did not resolve within budget";
}

/// Byte bound of node agent failure Event messages (`<op>: <err>`).
pub const NODE_FAILURE_MESSAGE_MAX_BYTES: usize = 512;

/// Rebuild reason text for drift.
pub const REASON_SPEC_DRIFTED: &str = "spec drifted";

/// Rebuild reason text for a terminal pod: `terminal (phase=<phase> lifecycle=<state>)`.
/// The message of [`node::SNAPSHOT_PUSHED`] / [`node::SNAPSHOT_PULLED`]:
/// `pushed 1.6 GiB of 6.0 GiB (v2 zstd) in 4.2 s` — the bytes on the wire, the snapshot's
/// data size, the wire format, the wall time.
pub fn snapshot_transfer_message(
    verb: &str,
    moved: u64,
    total: u64,
    format: &str,
    took: Duration,
) -> String {
    format!(
        "{verb} {} of {} ({format}) in {:.1} s",
        human_bytes(moved),
        human_bytes(total),
        took.as_secs_f64()
    )
}

/// Binary units with one decimal (`512 B`, `1.5 KiB`, `6.0 GiB`).
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = UNITS[0];
    for u in &UNITS[1..] {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    format!("{v:.1} {unit}")
}

pub fn reason_terminal(pod_phase: &str, lifecycle_state: &str) -> String {
    format!("terminal (phase={pod_phase} lifecycle={lifecycle_state})")
}

/// `PodLifecycleFailed` / `MainAgentFailed`: `main pod <ns>/<name>: <msg>`. The caller passes
/// the lifecycle message, or the pod phase when that is empty.
pub fn main_pod_failed_message(ns: &str, name: &str, msg: &str) -> String {
    format!("main pod {ns}/{name}: {msg}")
}

/// `SuspendTimedOut`, with `: <probe error>` appended when the registry probe failed.
pub fn suspend_timed_out_message(deadline: Duration, probe_error: Option<&str>) -> String {
    let base = format!(
        "not every managed VM was hibernated with its snapshot in the registry within {}",
        go_duration(deadline)
    );
    match probe_error {
        Some(err) if !err.is_empty() => format!("{base}: {err}"),
        _ => base,
    }
}

/// `MigrateNoCapacity` / `WakeNoCapacity`: `main pod <name> unschedulable: <scheduler msg>`.
/// Deliberately takes no node name: the message must not name the target node.
pub fn main_unschedulable_message(pod_name: &str, scheduler_message: &str) -> String {
    format!("main pod {pod_name} unschedulable: {scheduler_message}")
}

/// `SubAgentDeadLetter`: `pod <name> exhausted <budget> rebuilds (<reason>); left in dead-letter`.
pub fn dead_letter_message(pod_name: &str, budget: u32, reason: &str) -> String {
    format!("pod {pod_name} exhausted {budget} rebuilds ({reason}); left in dead-letter")
}

/// `SubAgentRebuilding`: `pod <name> attempt <k>/<budget> (<reason>)`.
pub fn rebuilding_message(pod_name: &str, attempt: u32, budget: u32, reason: &str) -> String {
    format!("pod {pod_name} attempt {attempt}/{budget} ({reason})")
}

/// `RecoveredFromFailure`: `main pod <ns>/<name> is Ready again`.
pub fn recovered_message(ns: &str, name: &str) -> String {
    format!("main pod {ns}/{name} is Ready again")
}

/// `ForeignVMNameIgnored` message: `<source>: VM <vm> is not a VM of <owner>; ignored (no
/// registry call)`, where `<source>` is the annotation or field the name was read from and
/// `<owner>` names the object (`CocoonSet ns/name`, `CocoonHibernation ns/name`).
pub fn foreign_vm_name_message(source: &str, vm: &str, owner: &str) -> String {
    format!("{source}: VM {vm:?} is not a VM of {owner}; ignored (no registry call)")
}

/// CocoonHibernation `Hibernated`: `snapshot <vm> pushed to the registry`.
pub fn hibernation_hibernated_message(vm: &str) -> String {
    format!("snapshot {vm} pushed to the registry")
}

/// CocoonHibernation `WokenActive`: `pod <ns>/<name> is running`.
pub fn woken_active_message(ns: &str, name: &str) -> String {
    format!("pod {ns}/{name} is running")
}

/// CocoonHibernation `RetryRequested`: `retrying <desire> after prior failure`
/// (`<desire>` is `Hibernate` or `Wake`).
pub fn retry_requested_message(desire: &str) -> String {
    format!("retrying {desire} after prior failure")
}

/// CocoonHibernation `HibernateTimedOut`: `snapshot <vm> not confirmed in the registry within <d>`.
pub fn hibernate_timed_out_message(vm: &str, deadline: Duration) -> String {
    format!(
        "snapshot {vm} not confirmed in the registry within {}",
        go_duration(deadline)
    )
}

/// CocoonHibernation `WakeTimedOut`: `vk-cocoon did not report the container running within <d>`.
pub fn wake_timed_out_message(deadline: Duration) -> String {
    format!(
        "vk-cocoon did not report the container running within {}",
        go_duration(deadline)
    )
}

/// Node failure Events (`failOp`): `<op>: <err>`, truncated to 512 bytes on a char boundary.
pub fn node_failure_message(op: &str, err: &str) -> String {
    let full = format!("{op}: {err}");
    truncate_utf8(&full, NODE_FAILURE_MESSAGE_MAX_BYTES).to_owned()
}

/// Node `HibernateSnapshotExists`: `restoring vm <vm> from its hibernate snapshot instead of fresh-booting`.
pub fn hibernate_snapshot_exists_message(vm: &str) -> String {
    format!("restoring vm {vm} from its hibernate snapshot instead of fresh-booting")
}

/// Node `Woken`: `cloned from <source label>`.
pub fn woken_message(source_label: &str) -> String {
    format!("cloned from {source_label}")
}

/// Node `ResumedAfterRestart`: `op=<op>`.
pub fn resumed_after_restart_message(op: &str) -> String {
    format!("op={op}")
}

/// The Event `action`: the reason plus a hash of the message. kube's recorder folds events with
/// the same type, reason, action and object into one series and keeps the first message, so the
/// message must take part in the key or later texts (`attempt 2/4 …`) would never be seen.
pub fn event_action(reason: &str, message: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    message.hash(&mut h);
    format!("{reason}-{:016x}", h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfer_messages_say_how_much_moved() {
        assert_eq!(
            snapshot_transfer_message(
                "pushed",
                1_717_986_918,
                6 << 30,
                "v2 zstd",
                Duration::from_millis(4_200)
            ),
            "pushed 1.6 GiB of 6.0 GiB (v2 zstd) in 4.2 s"
        );
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 << 20), "3.0 MiB");
    }

    #[test]
    fn operator_messages_match_the_spec() {
        let cases = [
            (
                main_pod_failed_message("ns", "demo-0", "boom"),
                "main pod ns/demo-0: boom",
            ),
            (
                suspend_timed_out_message(Duration::from_secs(180), None),
                "not every managed VM was hibernated with its snapshot in the registry within 3m0s",
            ),
            (
                suspend_timed_out_message(Duration::from_secs(180), Some("503")),
                "not every managed VM was hibernated with its snapshot in the registry within 3m0s: 503",
            ),
            (
                main_unschedulable_message("demo-0", "0/3 nodes are available"),
                "main pod demo-0 unschedulable: 0/3 nodes are available",
            ),
            (
                dead_letter_message("demo-1", 4, REASON_SPEC_DRIFTED),
                "pod demo-1 exhausted 4 rebuilds (spec drifted); left in dead-letter",
            ),
            (
                rebuilding_message("demo-1", 2, 4, &reason_terminal("Failed", "failed")),
                "pod demo-1 attempt 2/4 (terminal (phase=Failed lifecycle=failed))",
            ),
            (
                recovered_message("ns", "demo-0"),
                "main pod ns/demo-0 is Ready again",
            ),
            (
                hibernation_hibernated_message("vk-ns-demo-0-505043"),
                "snapshot vk-ns-demo-0-505043 pushed to the registry",
            ),
            (
                woken_active_message("ns", "demo-0"),
                "pod ns/demo-0 is running",
            ),
            (
                retry_requested_message("Wake"),
                "retrying Wake after prior failure",
            ),
            (
                hibernate_timed_out_message("vm", Duration::from_secs(180)),
                "snapshot vm not confirmed in the registry within 3m0s",
            ),
            (
                wake_timed_out_message(Duration::from_secs(300)),
                "vk-cocoon did not report the container running within 5m0s",
            ),
            (resumed_after_restart_message("post_clone"), "op=post_clone"),
            (woken_message("registry"), "cloned from registry"),
        ];
        for (got, want) in cases {
            assert_eq!(got, want);
        }
    }

    #[test]
    fn node_failure_message_is_bounded() {
        assert_eq!(node_failure_message("create", "x"), "create: x");
        let long = "é".repeat(600);
        let msg = node_failure_message("create", &long);
        assert!(msg.len() <= NODE_FAILURE_MESSAGE_MAX_BYTES);
        assert!(msg.starts_with("create: é"));
    }

    #[test]
    fn event_actions_differ_by_message_and_stay_short() {
        let a = event_action(
            "SubAgentRebuilding",
            "pod demo-1 attempt 1/4 (spec drifted)",
        );
        let b = event_action(
            "SubAgentRebuilding",
            "pod demo-1 attempt 2/4 (spec drifted)",
        );
        assert_ne!(a, b);
        assert_eq!(
            a,
            event_action(
                "SubAgentRebuilding",
                "pod demo-1 attempt 1/4 (spec drifted)"
            )
        );
        assert!(a.starts_with("SubAgentRebuilding-") && a.len() <= 128);
    }
}
