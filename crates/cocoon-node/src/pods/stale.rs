//! Stale-create reconciliation (`node.md` §14, "beyond"): a `creating` record left behind by
//! an agent killed in the middle of a clone or run holds the VM's name, so every later create
//! of that pod would fail with `VM name "<vm>" already exists`.
//!
//! At startup every `creating` VM goes through `reconcile_stale_create` (parallelism 8), and
//! [`stale::on_answer`], [`stale::on_reinspect`] and, for the watcher, [`stale::watch_turn`]
//! decide (this module gathers the facts and applies):
//!
//! * `collected` / `not-found`: the name is free. The VM is left out of the indexes, so the
//!   pod (untracked) reaches CreatePod, which creates the VM again.
//! * `not-creating`: the record moved on meanwhile; it is inspected again and reconciled like
//!   any other listed VM (adopted by a pod, or given the orphan policy).
//! * `busy`, or a verb error: a background watcher (1 s doubling to 30 s, 30 min budget)
//!   follows the VM. Running → indexed by name for adoption (the pod's CreatePod retry adopts
//!   it); dead → the orphan policy; gone → the name is free; still `creating` → the verb is
//!   asked again, since a verb error may have been transient.
//!
//! The agent never removes a `creating` record itself: only the runtime's verb collects one.
//! Every answer of the verb is counted in `cocoon_vk_stale_create_reconcile_total{outcome}`.

use std::sync::Arc;
use std::time::Instant;

use cocoon_runtime::VmRecord;
use futures::StreamExt;
use tracing::{debug, info, warn};

use super::artifacts::Artifacts;
use super::plan::stale::{self, End, Next, Record, Turn};
use super::rules::InspectOutcome;
use super::store::PodStore;
use super::{Handler, OrphanPolicy, Timing};
use crate::metrics::NodeMetrics;

/// How many `creating` VMs are reconciled at once at startup.
const STALE_CREATE_PARALLELISM: usize = 8;

/// The parts stale-create reconciliation uses: the runtime's verbs, the tables (adoption
/// index, names freed) and the orphan policy.
pub(crate) struct StaleCreates {
    artifacts: Arc<Artifacts>,
    store: Arc<PodStore>,
    metrics: Arc<NodeMetrics>,
    timing: Timing,
    orphan_policy: OrphanPolicy,
}

impl StaleCreates {
    /// The handler's parts for stale-create reconciliation.
    pub(crate) fn of(h: &Handler) -> Arc<Self> {
        Arc::new(StaleCreates {
            artifacts: h.artifacts.clone(),
            store: h.store.clone(),
            metrics: h.metrics.clone(),
            timing: h.cfg.timing.clone(),
            orphan_policy: h.cfg.orphan_policy,
        })
    }

    /// Reconciles the `creating` VMs of the startup listing. Returns the fresh records of the
    /// VMs that left `creating` meanwhile: the caller reconciles them like any listed VM.
    pub(crate) async fn reconcile_stale_creates(
        self: &Arc<Self>,
        creating: Vec<VmRecord>,
    ) -> Vec<VmRecord> {
        futures::stream::iter(creating)
            .map(|vm| {
                let me = self.clone();
                async move { me.reconcile_stale_create(vm).await }
            })
            .buffer_unordered(STALE_CREATE_PARALLELISM)
            .filter_map(|fresh| async move { fresh })
            .collect()
            .await
    }

    async fn reconcile_stale_create(self: &Arc<Self>, vm: VmRecord) -> Option<VmRecord> {
        let answer = self.artifacts.ask_stale_create(&vm, false).await;
        match stale::on_answer(answer) {
            Next::InspectAgain => {}
            Next::NameFreed => {
                info!(vm = %vm.name(), id = %vm.id, "stale create reconciled; the VM name is free");
                return None;
            }
            Next::Watch(_) | Next::ReconcileAsListed => {
                self.watch_stale_create(vm);
                return None;
            }
        }
        let inspected = self.artifacts.rt().inspect(&vm.id).await;
        match (stale::on_reinspect(&stale::outcome(&inspected)), inspected) {
            (Next::Watch(Record::Fresh), Ok(fresh)) => {
                self.watch_stale_create(fresh);
                None
            }
            (Next::ReconcileAsListed, Ok(fresh)) => {
                info!(vm = %fresh.name(), id = %fresh.id, state = %fresh.state, "VM left creating; reconciling it as listed");
                Some(fresh)
            }
            (Next::NameFreed, _) => {
                info!(vm = %vm.name(), id = %vm.id, "VM gone after leaving creating; the VM name is free");
                None
            }
            (_, inspected) => {
                if let Err(e) = inspected {
                    warn!(vm = %vm.name(), id = %vm.id, error = %e, "inspect after reconcile-stale-create failed; watching the VM");
                }
                self.watch_stale_create(vm);
                None
            }
        }
    }

    fn watch_stale_create(self: &Arc<Self>, vm: VmRecord) {
        info!(vm = %vm.name(), id = %vm.id, "watching a VM whose create may still be in flight");
        let me = self.clone();
        self.artifacts
            .spawn(async move { me.stale_create_watcher(vm).await });
    }

    /// The background watcher of a `busy` (or unanswered) `creating` VM.
    async fn stale_create_watcher(self: &Arc<Self>, vm: VmRecord) {
        let t = self.timing.clone();
        let started = Instant::now();
        let mut delay = t.stale_create_start;
        loop {
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(t.stale_create_max);
            if self.stale_watch_tick(&vm).await {
                return;
            }
            if stale::give_up(started.elapsed(), t.stale_create_budget) {
                warn!(
                    vm = %vm.name(),
                    id = %vm.id,
                    budget = ?t.stale_create_budget,
                    "stale create unresolved within budget; leaving the creating record to the runtime"
                );
                return;
            }
        }
    }

    /// One look at a watched VM; `true` when the watch is over. Then the name is free, or the
    /// VM indexed for adoption, or given the orphan policy: pod creates waiting out a backoff
    /// are told to try again now.
    async fn stale_watch_tick(self: &Arc<Self>, vm: &VmRecord) -> bool {
        let over = self.stale_watch_step(vm).await;
        if over {
            self.store.name_freed();
        }
        over
    }

    async fn stale_watch_step(self: &Arc<Self>, vm: &VmRecord) -> bool {
        let inspected = self.artifacts.rt().inspect(&vm.id).await;
        let outcome = stale::outcome(&inspected);
        let fresh = match inspected {
            Ok(r) => Some(r),
            Err(e) => {
                if !e.is_vm_not_found() {
                    debug!(vm = %vm.name(), id = %vm.id, error = %e, "stale-create watcher: inspect failed");
                }
                None
            }
        };
        // A pod that already tracks the VM owns it: no orphan then.
        let owned = fresh
            .as_ref()
            .is_some_and(|f| self.store.tables().key_for_vm(&f.id, "").is_some());
        let turn = match stale::watch_turn(&outcome, owned) {
            Turn::AskAgain => {
                stale::after_ask_again(self.artifacts.ask_stale_create(vm, true).await)
            }
            turn => turn,
        };
        match (turn, fresh) {
            (Turn::Over(End::NameFreed), _) if matches!(outcome, InspectOutcome::NotFound) => {
                info!(vm = %vm.name(), id = %vm.id, "stale create gone; the VM name is free");
                true
            }
            (Turn::Over(End::NameFreed), _) => {
                info!(vm = %vm.name(), id = %vm.id, "stale create reconciled; the VM name is free");
                true
            }
            (Turn::Over(End::IndexForAdoption), Some(fresh)) => {
                self.store.index_for_adoption(fresh);
                true
            }
            (Turn::Over(End::OrphanPolicy), Some(fresh)) => {
                super::reconcile::apply_orphan_policy(
                    self.orphan_policy,
                    &self.artifacts,
                    &self.store,
                    &self.metrics,
                    &fresh,
                )
                .await;
                true
            }
            (Turn::Over(End::Owned), _) => true,
            _ => false,
        }
    }
}
