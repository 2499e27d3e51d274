//! Prometheus metric names, histogram buckets and label names/values of `contract.md` §11.
//! Full names (namespace `cocoon`, subsystem `operator` or `vk`) so dashboards keep working.

/// §11.1 operator metrics (`/metrics` on `METRICS_ADDR`).
pub mod operator {
    /// Counter {namespace, cocoonset}: each budgeted rebuild delete (any role).
    pub const SUBAGENT_REBUILD_TOTAL: &str = "cocoon_operator_subagent_rebuild_total";
    /// Counter {namespace, cocoonset}: each dead-lettering.
    pub const SUBAGENT_DEAD_LETTER_TOTAL: &str = "cocoon_operator_subagent_dead_letter_total";
    /// Histogram {result}: a CocoonHibernation leaves `Hibernating`.
    pub const HIBERNATE_PHASE_DURATION_SECONDS: &str =
        "cocoon_operator_hibernate_phase_duration_seconds";
    /// Histogram {result}: a CocoonHibernation leaves `Waking`.
    pub const WAKE_PHASE_DURATION_SECONDS: &str = "cocoon_operator_wake_phase_duration_seconds";
    /// Buckets of the two phase-duration histograms.
    pub const PHASE_DURATION_BUCKETS: [f64; 6] = [10.0, 30.0, 60.0, 180.0, 600.0, 1800.0];
    /// Counter {phase}: the main is found failed via `lifecycle-state=failed`.
    pub const LIFECYCLE_STATE_FAILED_OBSERVED_TOTAL: &str =
        "cocoon_operator_lifecycle_state_failed_observed_total";
    /// Counter {namespace, cocoonset}: each seat-release pod delete.
    pub const SLOT_RELEASE_PODS_DELETED_TOTAL: &str =
        "cocoon_operator_slot_release_pods_deleted_total";
    /// Counter {namespace, cocoonset, placement}: a release wake reaches a live VM (once).
    pub const SLOT_RELEASE_WAKE_TOTAL: &str = "cocoon_operator_slot_release_wake_total";
    /// Counter {namespace, cocoonset}: each pass seeing the wake pod Unschedulable.
    pub const SLOT_RELEASE_WAKE_UNSCHEDULABLE_TOTAL: &str =
        "cocoon_operator_slot_release_wake_unschedulable_total";
    /// Counter {namespace, cocoonset}: each `Migrating` pass seeing the restored main
    /// Unschedulable. Name chosen (unspecified by the spec) after the family's pattern.
    pub const MIGRATE_UNSCHEDULABLE_TOTAL: &str = "cocoon_operator_migrate_unschedulable_total";
    /// Counter: each idle suspend the operator announced (issue 39).
    pub const IDLE_SUSPENDS_TOTAL: &str = "cocoon_operator_idle_suspends_total";
    /// Counter {trigger = `connection` | `exec`}: each wake of an idle-suspended set the
    /// operator announced (issue 39).
    pub const IDLE_WAKES_TOTAL: &str = "cocoon_operator_idle_wakes_total";
    /// Histogram {controller}: reconcile duration (recommended; name chosen).
    pub const RECONCILE_DURATION_SECONDS: &str = "cocoon_operator_reconcile_duration_seconds";
    /// Counter {controller, kind}: reconcile failures by error kind (recommended; name chosen).
    pub const RECONCILE_ERRORS_TOTAL: &str = "cocoon_operator_reconcile_errors_total";
    /// Gauge {version, revision} = 1 (beyond): the running build.
    pub const BUILD_INFO: &str = "cocoon_operator_build_info";
    /// Gauge (beyond): 1 while this replica holds the leader Lease (or runs without
    /// election), else 0; evaluated at scrape time.
    pub const LEADER: &str = "cocoon_operator_leader";
    /// Gauge {kind, phase} (beyond): cached CocoonSets / CocoonHibernations by
    /// `status.phase` (`Unknown` before the first status), counted at scrape time. Every
    /// replica reports its own cache.
    pub const OBJECTS: &str = "cocoon_operator_objects";

    /// `kind` value of [`OBJECTS`].
    pub const KIND_COCOONSET: &str = "CocoonSet";
    /// `kind` value of [`OBJECTS`].
    pub const KIND_COCOONHIBERNATION: &str = "CocoonHibernation";
    /// `phase` value of [`OBJECTS`] for an object without a phase yet.
    pub const PHASE_UNKNOWN: &str = "Unknown";

    /// `result` value of a phase that completed.
    pub const RESULT_OK: &str = "ok";
    /// `result` value of a phase that hit its deadline.
    pub const RESULT_TIMEOUT: &str = "timeout";
    /// `placement` value: the wake landed via the hibernated-on-node hint.
    pub const PLACEMENT_HINT_NODE: &str = "hint-node";
    /// `placement` value: the wake landed elsewhere in the pool.
    pub const PLACEMENT_POOL: &str = "pool";
}

/// §11.2 node agent metrics (`/metrics` on `VK_METRICS_ADDR`).
pub mod node {
    /// Counter {op, result, reason}.
    pub const POD_LIFECYCLE_TOTAL: &str = "cocoon_vk_pod_lifecycle_total";
    /// Counter {result}: snapshot pulls (a local hit counts as `ok`).
    pub const SNAPSHOT_PULL_TOTAL: &str = "cocoon_vk_snapshot_pull_total";
    /// Counter {result}: wake-time verification of the local copy (`ok`/`stale`/`error`).
    pub const SNAPSHOT_VERIFY_TOTAL: &str = "cocoon_vk_snapshot_verify_total";
    /// Counter {result}.
    pub const SNAPSHOT_SAVE_TOTAL: &str = "cocoon_vk_snapshot_save_total";
    /// Counter {result}.
    pub const SNAPSHOT_PUSH_TOTAL: &str = "cocoon_vk_snapshot_push_total";
    /// Counter {result}.
    pub const CLONE_FROM_DIR_TOTAL: &str = "cocoon_vk_clone_from_dir_total";
    /// Gauge: tracked VMs.
    pub const VM_TABLE_SIZE: &str = "cocoon_vk_vm_table_size";
    /// Counter: orphans seen under orphan policy `alert`.
    pub const ORPHAN_VM_TOTAL: &str = "cocoon_vk_orphan_vm_total";
    /// Counter.
    pub const VM_INSPECT_TRANSIENT_FAIL_TOTAL: &str = "cocoon_vk_vm_inspect_transient_fail_total";
    /// Counter.
    pub const POD_EVICT_FAILURE_TOTAL: &str = "cocoon_vk_pod_evict_failure_total";
    /// Counter.
    pub const RECONCILE_ADOPT_BY_NAME_TOTAL: &str = "cocoon_vk_reconcile_adopt_by_name_total";
    /// Counter {op}.
    pub const STARTUP_RESUME_TOTAL: &str = "cocoon_vk_startup_resume_total";
    /// Counter {verdict}.
    pub const HIBERNATE_EVIDENCE_TOTAL: &str = "cocoon_vk_hibernate_evidence_total";
    /// Histogram {mode, backend}.
    pub const VM_BOOT_DURATION_SECONDS: &str = "cocoon_vk_vm_boot_duration_seconds";
    /// Buckets of [`VM_BOOT_DURATION_SECONDS`].
    pub const VM_BOOT_DURATION_BUCKETS: [f64; 9] =
        [0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0];
    /// Histogram.
    pub const SNAPSHOT_SAVE_DURATION_SECONDS: &str = "cocoon_vk_snapshot_save_duration_seconds";
    /// Buckets of [`SNAPSHOT_SAVE_DURATION_SECONDS`].
    pub const SNAPSHOT_SAVE_DURATION_BUCKETS: [f64; 7] = [1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0];
    /// Histogram.
    pub const SNAPSHOT_PUSH_DURATION_SECONDS: &str = "cocoon_vk_snapshot_push_duration_seconds";
    /// Histogram.
    pub const SNAPSHOT_PULL_DURATION_SECONDS: &str = "cocoon_vk_snapshot_pull_duration_seconds";
    /// Buckets of the push and pull duration histograms.
    pub const SNAPSHOT_TRANSFER_DURATION_BUCKETS: [f64; 7] =
        [1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0];
    /// Counter {direction} (beyond): registry bytes a snapshot push sent (`push`) or a
    /// snapshot pull received (`pull`), on the wire (after compression).
    pub const SNAPSHOT_TRANSFER_BYTES_TOTAL: &str = "cocoon_vk_snapshot_transfer_bytes_total";
    /// `direction` value of [`SNAPSHOT_TRANSFER_BYTES_TOTAL`].
    pub const DIRECTION_PUSH: &str = "push";
    /// `direction` value of [`SNAPSHOT_TRANSFER_BYTES_TOTAL`].
    pub const DIRECTION_PULL: &str = "pull";
    /// Histogram.
    pub const PROBE_DURATION_SECONDS: &str = "cocoon_vk_probe_duration_seconds";
    /// Buckets of [`PROBE_DURATION_SECONDS`].
    pub const PROBE_DURATION_BUCKETS: [f64; 8] = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0];
    /// Counter {phase, result}.
    pub const HIBERNATE_TOTAL: &str = "cocoon_vk_hibernate_total";
    /// Counter {result}, counted at the outcome.
    pub const WAKE_TOTAL: &str = "cocoon_vk_wake_total";
    /// Counter {result}: clone and wake IP waits.
    pub const WAKE_IP_WAIT_TOTAL: &str = "cocoon_vk_wake_ip_wait_total";
    /// Counter {result}: Windows DHCP renew nudges.
    pub const WAKE_RENEW_NUDGE_TOTAL: &str = "cocoon_vk_wake_renew_nudge_total";
    /// Counter {outcome} (beyond).
    pub const STALE_CREATE_RECONCILE_TOTAL: &str = "cocoon_vk_stale_create_reconcile_total";
    /// Counter {kind, result} (beyond).
    pub const POSTCLONE_TOTAL: &str = "cocoon_vk_postclone_total";
    /// Histogram {result} (beyond).
    pub const POSTCLONE_RETRY_ATTEMPTS: &str = "cocoon_vk_postclone_retry_attempts";
    /// Buckets of [`POSTCLONE_RETRY_ATTEMPTS`].
    pub const POSTCLONE_RETRY_ATTEMPTS_BUCKETS: [f64; 7] = [1.0, 2.0, 5.0, 10.0, 20.0, 40.0, 60.0];
    /// Counter {result} (beyond).
    pub const SNAPSHOT_PEER_RESTORE_TOTAL: &str = "cocoon_vk_snapshot_peer_restore_total";
    /// Histogram {namespace} (beyond).
    pub const SNAPSHOT_PEER_RESTORE_DURATION_SECONDS: &str =
        "cocoon_vk_snapshot_peer_restore_duration_seconds";
    /// Buckets of [`SNAPSHOT_PEER_RESTORE_DURATION_SECONDS`].
    pub const SNAPSHOT_PEER_RESTORE_DURATION_BUCKETS: [f64; 9] =
        [1.0, 2.5, 5.0, 7.5, 10.0, 15.0, 30.0, 60.0, 120.0];
    /// Counter {result} (beyond).
    pub const LEASE_RELEASE_TOTAL: &str = "cocoon_vk_lease_release_total";

    // ---- scrape-time collector ----

    /// Counter {vm, pod, namespace, backend}.
    pub const VM_CPU_SECONDS_TOTAL: &str = "cocoon_vk_vm_cpu_seconds_total";
    /// Gauge {vm, pod, namespace, backend}.
    pub const VM_MEMORY_RSS_BYTES: &str = "cocoon_vk_vm_memory_rss_bytes";
    /// Gauge {vm, pod, namespace, backend}: actual size of the COW overlay.
    pub const VM_DISK_COW_BYTES: &str = "cocoon_vk_vm_disk_cow_bytes";
    /// Counter {vm, pod, namespace, backend}: TAP rx bytes.
    pub const VM_NETWORK_RX_BYTES_TOTAL: &str = "cocoon_vk_vm_network_rx_bytes_total";
    /// Counter {vm, pod, namespace, backend}: TAP tx bytes.
    pub const VM_NETWORK_TX_BYTES_TOTAL: &str = "cocoon_vk_vm_network_tx_bytes_total";
    /// Counter: node CPU seconds.
    pub const NODE_CPU_SECONDS_TOTAL: &str = "cocoon_vk_node_cpu_seconds_total";
    /// Gauge: MemTotal − MemAvailable.
    pub const NODE_MEMORY_USED_BYTES: &str = "cocoon_vk_node_memory_used_bytes";
    /// Gauge: free bytes of the cocoon root filesystem.
    pub const NODE_STORAGE_AVAILABLE_BYTES: &str = "cocoon_vk_node_storage_available_bytes";
    /// Gauge: size of the cocoon root filesystem.
    pub const NODE_STORAGE_TOTAL_BYTES: &str = "cocoon_vk_node_storage_total_bytes";
    /// Counter (beyond): cgroup throttled time.
    pub const VM_CPU_THROTTLED_SECONDS_TOTAL: &str = "cocoon_vk_vm_cpu_throttled_seconds_total";
    /// Counter (beyond): cgroup throttled periods.
    pub const VM_CPU_THROTTLED_PERIODS_TOTAL: &str = "cocoon_vk_vm_cpu_throttled_periods_total";

    // ---- label values of `cocoon_vk_pod_lifecycle_total` ----

    /// `result` value.
    pub const RESULT_OK: &str = "ok";
    /// `result` value.
    pub const RESULT_FAILED: &str = "failed";
    /// `result` value.
    pub const RESULT_SKIPPED: &str = "skipped";
    /// `reason` value: the pod's VM was adopted.
    pub const REASON_ADOPTED: &str = "adopted";
    /// `reason` value: nothing to do.
    pub const REASON_NOOP: &str = "noop";
    /// `reason` value: the pod has no `vm.cocoonstack.io/name`.
    pub const REASON_MISSING_VMNAME: &str = "missing_vmname";
    /// `reason` value: the pod has no VM.
    pub const REASON_NO_VM: &str = "no_vm";
    /// `reason` value: a release-policy seat release.
    pub const REASON_SEAT_RELEASE: &str = "seat_release";
    /// `reason` value (beyond): the pod's CPU class does not match the node.
    pub const REASON_SNAPSHOT_CPU_CLASS_MISMATCH: &str = "snapshot_cpu_class_mismatch";
}

/// Process metrics of both binaries (beyond; Prometheus' process-collector names, read from
/// `/proc/self` at scrape time).
pub mod process {
    /// Counter: user + system CPU time.
    pub const CPU_SECONDS_TOTAL: &str = "process_cpu_seconds_total";
    /// Gauge: resident set size.
    pub const RESIDENT_MEMORY_BYTES: &str = "process_resident_memory_bytes";
    /// Gauge: virtual memory size.
    pub const VIRTUAL_MEMORY_BYTES: &str = "process_virtual_memory_bytes";
    /// Gauge: start time since the Unix epoch.
    pub const START_TIME_SECONDS: &str = "process_start_time_seconds";
    /// Gauge: open file descriptors.
    pub const OPEN_FDS: &str = "process_open_fds";
    /// Gauge: soft limit on open file descriptors (absent when unlimited).
    pub const MAX_FDS: &str = "process_max_fds";
}

/// Label names used across the families.
pub mod label {
    /// Namespace of the object.
    pub const NAMESPACE: &str = "namespace";
    /// CocoonSet name.
    pub const COCOONSET: &str = "cocoonset";
    /// Outcome of the observed operation.
    pub const RESULT: &str = "result";
    /// CocoonSet phase.
    pub const PHASE: &str = "phase";
    /// Release-wake placement.
    pub const PLACEMENT: &str = "placement";
    /// Node agent operation.
    pub const OP: &str = "op";
    /// Reason of a pod lifecycle outcome.
    pub const REASON: &str = "reason";
    /// Hibernate evidence verdict.
    pub const VERDICT: &str = "verdict";
    /// VM mode.
    pub const MODE: &str = "mode";
    /// VM backend.
    pub const BACKEND: &str = "backend";
    /// Stale-create reconcile outcome.
    pub const OUTCOME: &str = "outcome";
    /// Post-clone fixup kind.
    pub const KIND: &str = "kind";
    /// VM name.
    pub const VM: &str = "vm";
    /// Pod name.
    pub const POD: &str = "pod";
    /// Reconciling controller.
    pub const CONTROLLER: &str = "controller";
    /// Snapshot transfer direction (`push` / `pull`).
    pub const DIRECTION: &str = "direction";
    /// Build version (`cocoon_operator_build_info`).
    pub const VERSION: &str = "version";
    /// Build git revision (`cocoon_operator_build_info`).
    pub const REVISION: &str = "revision";
}
