//! The shell of idle suspend on the node (issue 39; the rules are `cocoon-node-activity`,
//! re-exported as [`crate::activity`]): samples each live VM twice per publish interval (the
//! shortest of its pods'), publishes its last activity on the pod when the
//! tracker says so, and holds an exec into a suspended pod until its VM runs again.

use std::sync::Arc;
use std::time::Instant;

use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::idle::{self, WAKE_REQUEST};
use cocoon_api::contract::timefmt::rfc3339_seconds;
use tracing::{debug, info, warn};

use super::state::TrackedVm;
use super::{Handler, annotation};
use crate::activity::rules::{ExecPlan, exec_plan, still_suspended};
use crate::activity::{Sample, Tracker, sample_every};
use crate::kubelet::ExecError;

/// How often a held exec looks at its pod's VM again.
const HOLD_POLL: std::time::Duration = std::time::Duration::from_millis(200);

impl Handler {
    /// Publishes each live VM's activity on its pod until shutdown: at most once per publish
    /// interval, and only after activity since the last write.
    pub(crate) async fn run_activity(self: Arc<Self>) {
        let cfg = self.cfg.timing.activity;
        let mut tracker = Tracker::new(cfg.cpu_threshold_millicores);
        loop {
            let keys = self.store.tracked_keys();
            let mut shortest = cfg.interval;
            for key in &keys {
                let (Some(pod), Some(vm)) =
                    (self.store.tracked_pod(key), self.store.tracked_vm(key))
                else {
                    continue;
                };
                if vm.synthetic {
                    continue;
                }
                let sample = self
                    .artifacts
                    .rt()
                    .vm_stats(&vm.record)
                    .await
                    .ok()
                    .map(|s| Sample {
                        cpu_ns: s.cpu_time_ns,
                        net_bytes: s.taps.iter().map(|t| t.rx_bytes + t.tx_bytes).sum(),
                    });
                let suspend_after = annotation(&pod, idle::SUSPEND_AFTER)
                    .and_then(|v| idle::parse_duration(v).ok());
                let interval = idle::publish_interval(cfg.interval, suspend_after);
                shortest = shortest.min(interval);
                let now = Instant::now();
                let sessions = self.sessions.count(key);
                let Some(activity) =
                    tracker.observe(key, sample, sessions, now, chrono::Utc::now(), interval)
                else {
                    continue;
                };
                let delta = activity
                    .to_annotations()
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), Some(v)))
                    .collect();
                match self.api.patch_annotations(&pod, delta).await {
                    Ok(()) => {
                        tracker.published(key, now);
                        debug!(pod = %key, kind = activity.kind.as_str(), "activity published");
                    }
                    Err(e) => debug!(pod = %key, error = %e, "activity not published"),
                }
            }
            tracker.retain(|k| keys.iter().any(|t| t == k));
            tokio::select! {
                () = self.shutdown.cancelled() => return,
                () = tokio::time::sleep(sample_every(shortest)) => {}
            }
        }
    }

    /// The VM an exec into `namespace/pod` runs in. A pod hibernated by a suspend gets a
    /// `wake-request` (at most one per pod per few seconds) and the exec waits, up to
    /// `VK_EXEC_WAKE_WAIT`, for its VM to run again; a pod with no VM otherwise is refused.
    pub async fn exec_vm(&self, namespace: &str, pod: &str) -> Result<TrackedVm, ExecError> {
        let key = format!("{namespace}/{pod}");
        let no_vm = || ExecError::NoLiveVm {
            namespace: namespace.to_owned(),
            pod: pod.to_owned(),
        };
        let vm = self.store.tracked_vm(&key).filter(|vm| !vm.synthetic);
        let hibernated = self
            .store
            .tracked_pod(&key)
            .is_some_and(|p| annotation(&p, ann::HIBERNATE) == Some("true"));
        match exec_plan(vm.is_some(), hibernated) {
            ExecPlan::Run => return vm.ok_or_else(no_vm),
            ExecPlan::NoVm => return Err(no_vm()),
            ExecPlan::WakeAndHold => {}
        }
        let wait = self.cfg.timing.activity.exec_wake_wait;
        let deadline = Instant::now() + wait;
        if self.wake_gate.admit(&key, Instant::now())
            && let Some(p) = self.store.tracked_pod(&key)
        {
            let now = rfc3339_seconds(chrono::Utc::now());
            let delta = [(WAKE_REQUEST.to_owned(), Some(now))].into_iter().collect();
            match self.api.patch_annotations(&p, delta).await {
                Ok(()) => info!(pod = %key, "exec into a suspended pod: wake requested"),
                Err(e) => {
                    warn!(pod = %key, error = %e, "exec into a suspended pod: wake request not written")
                }
            }
        }
        loop {
            let running = self.store.tracked_vm(&key);
            if let Some(vm) = running.filter(|vm| !vm.synthetic && vm.record.is_running()) {
                return Ok(vm);
            }
            if Instant::now() >= deadline {
                return Err(ExecError::Failed(still_suspended(namespace, pod, wait)));
            }
            tokio::select! {
                () = self.shutdown.cancelled() => return Err(no_vm()),
                () = tokio::time::sleep(HOLD_POLL) => {}
            }
        }
    }
}
