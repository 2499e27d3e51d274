//! The handler's [`Effects`]: what each planned action and compensation does against the
//! runtime, the registry and the API, with the counters the spec gives each. The only place
//! the plans reach the runtime.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use cocoon_api::contract::metrics::node as m;
use k8s_openapi::api::core::v1::Pod;
use tracing::warn;

use super::exec::Effects;
use super::{Action, AfterFailedRemove, Undo, after_failed_remove, removed};
use crate::pods::Handler;
use crate::pods::owned::Owner;
use crate::pods::state::TrackedVm;
use crate::runtime::{Runtime, exec_capture};

/// One pod operation's view of the handler: the pod, and the VM it acts on.
pub(crate) struct PodOp<'a> {
    pub h: &'a Arc<Handler>,
    pub key: &'a str,
    pub pod: &'a Pod,
    /// The tracked VM (its id and IP are what [`Undo::RestoreRuntime`] writes back).
    pub vm: Option<&'a TrackedVm>,
}

const RENEW: [&str; 4] = ["cmd", "/c", "ipconfig", "/renew"];

/// Runs `argv` in the guest of `id` within `limit`; true when it ran and succeeded.
async fn exec_bounded(rt: &dyn Runtime, id: &str, argv: &[&str], limit: Duration) -> bool {
    matches!(
        tokio::time::timeout(limit, exec_capture(rt, id, argv, None)).await,
        Ok(out) if out.result.is_ok()
    )
}

impl PodOp<'_> {
    /// `ipconfig /renew` (after `net_resize(id, 1)` when `re_add_nic`), detached with a 30 s
    /// budget; errors are logged.
    fn spawn_nic_restore(&self, id: &str, re_add_nic: bool) {
        let rt = self.h.rt.clone();
        let id = id.to_owned();
        self.h.spawn(async move {
            let work = async {
                if re_add_nic && let Err(e) = rt.net_resize(&id, 1).await {
                    warn!(vm = %id, error = %e, "NIC rollback failed");
                }
                let _ = exec_capture(rt.as_ref(), &id, &RENEW, None).await;
            };
            let _ = tokio::time::timeout(Duration::from_secs(30), work).await;
        });
    }

    async fn save(&self, name: &str, id: &str) -> Result<(), String> {
        let start = Instant::now();
        match self.h.rt.snapshot_save(name, id).await {
            Ok(()) => {
                self.h
                    .metrics
                    .snapshot_save_duration
                    .observe(start.elapsed().as_secs_f64());
                self.h.metrics.snapshot_save(m::RESULT_OK);
                Ok(())
            }
            Err(e) => {
                self.h.metrics.snapshot_save(m::RESULT_FAILED);
                Err(e.to_string())
            }
        }
    }

    async fn push(&self, name: &str, tag: &str, base_image: &str) -> Result<(), String> {
        let res = self
            .h
            .push_owned(name, name, tag, base_image, &Owner::of(self.pod))
            .await;
        self.h.metrics.snapshot_push(if res.is_ok() {
            m::RESULT_OK
        } else {
            m::RESULT_FAILED
        });
        res
    }
}

#[async_trait]
impl Effects for PodOp<'_> {
    fn pod(&self) -> &str {
        self.key
    }

    async fn apply(&self, action: &Action) -> Result<(), String> {
        let h = self.h;
        match action {
            Action::Lifecycle(state) => h.set_lifecycle(self.pod, *state, "").await,
            Action::ReleaseDhcp { id } => {
                let argv = ["cmd", "/c", "ipconfig", "/release"];
                let ok = exec_bounded(h.rt.as_ref(), id, &argv, Duration::from_secs(20)).await;
                let result = if ok { m::RESULT_OK } else { m::RESULT_FAILED };
                h.metrics.hibernate("dhcp_release", result);
            }
            Action::DropNic { id } => {
                return h.rt.net_resize(id, 0).await.map_err(|e| e.to_string());
            }
            Action::SaveSnapshot { name, id } => return self.save(name, id).await,
            Action::Push {
                name,
                tag,
                base_image,
            } => return self.push(name, tag, base_image).await,
            Action::ClearRuntime | Action::RetryFailedClear => {
                return h.clear_runtime(self.pod).await.map_err(|e| e.to_string());
            }
            Action::RemoveVm { id } => return removed(h.rt.remove(id).await),
            Action::CountPhaseOk(phase) => h.metrics.hibernate(phase, m::RESULT_OK),
            Action::UntrackVm => {
                h.probes.forget(self.key);
                let mut t = h.tables();
                t.untrack_vm(self.key);
                h.metrics.set_vm_table_size(t.vms_by_pod.len());
            }
            Action::PublishStatus => h.notify(self.key).await,
            Action::Event {
                warning,
                reason,
                message,
            } => h.event(self.pod, *warning, reason, message).await,
        }
        Ok(())
    }

    async fn inspect_after_failed_remove(&self, id: &str) -> AfterFailedRemove {
        after_failed_remove(&self.h.rt.inspect(id).await)
    }

    async fn undo(&self, undo: &Undo) {
        match undo {
            Undo::NicRollback { id } => self.spawn_nic_restore(id, true),
            Undo::RenewDhcp { id } => self.spawn_nic_restore(id, false),
            Undo::DeleteTagWhileVmAlive { repo, tag } => {
                if let Some(reg) = &self.h.registry
                    && let Err(e) = reg.delete_tag_if_present(repo, tag).await
                {
                    warn!(vm = %repo, error = %e, "compensating tag delete failed");
                }
            }
            Undo::KeepTag { repo, tag } => {
                warn!(vm = %repo, tag, "vm rm failed and the VM could not be inspected; keeping the tag, which may be its only copy");
            }
            Undo::RestoreRuntime => {
                if let Some(vm) = self.vm {
                    self.h.write_runtime(self.pod, vm, 0).await;
                }
            }
        }
    }

    fn count_phase_failed(&self, phase: &'static str) {
        self.h.metrics.hibernate(phase, m::RESULT_FAILED);
    }
}
