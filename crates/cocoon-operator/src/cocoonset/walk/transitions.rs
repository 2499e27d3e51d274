//! Steps 6 (suspend), 8 (migration), 9 (release-policy wake) and 10 (unsuspend bookkeeping
//! and reclaim) of `cocoonset.md`, and the 7.1 clear of a leftover hibernate intent, not yet
//! moved to `steps/`: here each step still decides, writes, re-reads and decides again in one
//! place. Their decisions come from the pure rules of [`crate::cocoonset::suspend`] and
//! [`crate::cocoonset::migrate`].
//!
//! Crash safety: every durable marker is written before the side effect it guards — the
//! reclaim record before any hibernate annotation (6A.2), `suspending-since` on entry into
//! Suspending (6C), `Migrating` before the migration's quiesce (8.5), the delete stash and the node hint before a seat-release delete (6B.3),
//! the `Waking` status before the wake's create (9.1.4), the first record write before an
//! unsuspend clears any annotation (10.3). A fresh controller with empty memory therefore
//! resumes from the API objects alone.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use chrono::Utc;
use cocoon_api::contract::events::{self as ev, operator as reasons};
use cocoon_api::contract::{
    AnnotationCodec, HibernateFlags, HibernatedOnNode, ReclaimRecord, SuspendingSince,
    annotations as ann, bool_delta, placement, tags,
};
use cocoon_api::crd::hibernation::CocoonHibernation;
use cocoon_api::crd::set::{CocoonSetPhase, HibernatePolicy};
use cocoon_api::naming::{self, Role};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use tracing::{debug, info, warn};

use super::{Created, Error, Step, Walk, create_through_protocol, post_pod, prepare_create};
use crate::cocoonset::migrate::{self, Advance, Engage};
use crate::cocoonset::pods;
use crate::cocoonset::steps::{self, release_wake::ReleaseWake};
use crate::cocoonset::suspend::{self, Deadline, GateItem};
use crate::registry::RegistryError;

impl Walk<'_> {
    fn phase(&self) -> Option<CocoonSetPhase> {
        self.cs.status.as_ref().and_then(|s| s.phase)
    }

    async fn write_phase(&mut self, phase: Option<CocoonSetPhase>) -> Result<(), Error> {
        let status = self.status_now(phase);
        self.write_status(status).await
    }

    async fn write_record(&mut self, record: &ReclaimRecord) -> Result<(), Error> {
        let delta = record.delta(self.cs.annotations());
        self.patch_set_annotations(delta).await
    }

    /// Patches a pod's annotations and mirrors the change into this pass's classification.
    async fn patch_classified(
        &mut self,
        name: &str,
        delta: &cocoon_api::contract::AnnotationDelta,
    ) -> Result<(), Error> {
        self.patch_pod_annotations(name, delta).await?;
        self.changed = true;
        self.mirror(name, delta);
        Ok(())
    }

    /// [`Walk::patch_classified`] of several pods with the same delta, all at once.
    async fn patch_classified_all(
        &mut self,
        names: &[String],
        delta: &cocoon_api::contract::AnnotationDelta,
    ) -> Result<(), Error> {
        if names.is_empty() {
            return Ok(());
        }
        let patches = names.iter().map(|n| (n.clone(), delta.clone())).collect();
        // Some may have landed even when one failed: the pass reports the error either way.
        self.changed = true;
        self.patch_pods(patches).await?;
        for name in names {
            self.mirror(name, delta);
        }
        Ok(())
    }

    fn mirror(&mut self, name: &str, delta: &cocoon_api::contract::AnnotationDelta) {
        let mirror = |p: &mut Pod| cocoon_api::contract::apply_delta(p.annotations_mut(), delta);
        if let Some(p) = self.classified.all_by_name.get_mut(name) {
            mirror(p);
        }
        for p in self
            .classified
            .main
            .iter_mut()
            .chain(self.classified.sub.values_mut())
            .chain(self.classified.toolbox.values_mut())
        {
            if p.name_any() == name {
                mirror(p);
            }
        }
    }

    async fn clear_suspending_since(&mut self) -> Result<(), Error> {
        let delta = SuspendingSince(None).delta(self.cs.annotations());
        self.patch_set_annotations(delta).await
    }

    /// The set's namespace's CocoonHibernations, read past the cache: before a migration
    /// starts, and before an unsuspend clears an annotation the set did not write itself, a
    /// CocoonHibernation created a moment ago must not be missed.
    async fn list_hibernations_fresh(&self) -> Result<Vec<CocoonHibernation>, Error> {
        let api: Api<CocoonHibernation> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        self.ctx.stats.reads.fetch_add(1, Ordering::Relaxed);
        Ok(api.list(&ListParams::default()).await?.items)
    }

    /// The set's namespace's CocoonHibernations, from the cache.
    pub(super) fn list_hibernations(&self) -> Vec<CocoonHibernation> {
        self.caches
            .hibernations
            .state()
            .iter()
            .filter(|h| h.metadata.namespace.as_deref() == Some(self.ns.as_str()))
            .map(|h| (**h).clone())
            .collect()
    }

    // ----- step 6 ----------------------------------------------------------------------

    /// Step 6: only when `spec.suspend`; always returns.
    pub(super) async fn suspend(&mut self) -> Result<Step, Error> {
        if !self.cs.spec.suspend {
            return Ok(Step::Continue);
        }
        let release = self.cs.spec.hibernate_policy == HibernatePolicy::Release;
        if release {
            // 6B.1: nothing live to snapshot (a set suspended before its first boot has no
            // snapshot, and needs none).
            if !suspend::release_has_live_pod(&self.classified) {
                self.clear_suspending_since().await?;
                self.write_phase(Some(CocoonSetPhase::Suspended)).await?;
                return Ok(Step::Return(Action::await_change()));
            }
        } else if self.classified.main.is_none() {
            return self.suspend_create_main().await;
        }
        // 6C.1–6C.2, decided once: on a pass that (re-)enters Suspending the stamp goes out
        // with the record.
        let deadline = suspend::suspend_deadline(
            self.phase(),
            SuspendingSince::from_meta(&self.cs.metadata),
            Utc::now(),
            self.ctx.timing.suspend_deadline,
        );
        if self.record_and_hibernate(deadline).await? {
            // The pods just asked cannot have passed the gate: 6C's Suspending went out with
            // their annotations.
            return Ok(Step::Return(Action::requeue(self.ctx.timing.suspend_poll)));
        }
        let (complete, probe_error) = self.suspend_gate().await;
        if !complete {
            return self.suspend_not_complete(deadline, probe_error).await;
        }
        self.clear_suspending_since().await?;
        if release {
            return self.release_seats().await;
        }
        self.write_phase(Some(CocoonSetPhase::Suspended)).await?;
        Ok(Step::Return(Action::await_change()))
    }

    /// 6A.1: a missing main is created with unconditional restore intent, so a main deleted
    /// while suspended comes back from its snapshot (and hibernates again on the next pass).
    async fn suspend_create_main(&mut self) -> Result<Step, Error> {
        let pod = pods::build_agent_pod(&self.cs, &self.ns, 0, "", None);
        let facts = self.facts_for(&pod, Role::Main, &BTreeSet::new(), true);
        let (outcome, forget) =
            create_through_protocol(self.ctx, &self.pod_api, pod, facts, "suspend").await;
        let forget: Vec<String> = forget.into_iter().collect();
        self.forget_vms(&forget).await?;
        Ok(Step::Return(Action::requeue(match outcome? {
            Created::Yes => self.ctx.timing.requeue_after_write,
            Created::AlreadyExists => self.ctx.timing.wait_for_main,
        })))
    }

    /// 6A.2: the record first (durable), then the hibernate annotations, all at once. A
    /// pass that asks for hibernates while (re-)entering Suspending (6C.1) writes
    /// `suspending-since` in the same patch as the record: one write fewer, and the deadline
    /// starts before any hibernate. (A pass with nothing to ask usually finds the gate
    /// complete, so it leaves the stamp to 6C.)
    ///
    /// A pod asked now cannot pass the gate on this pass, so within the deadline the
    /// `Suspending` status of 6C goes out together with the annotations, which nothing orders
    /// against it. Returns whether it did, which ends the pass.
    async fn record_and_hibernate(&mut self, deadline: Deadline) -> Result<bool, Error> {
        let record = ReclaimRecord::from_meta(&self.cs.metadata);
        let next = suspend::record_for_suspend(&record, &self.classified);
        let mut delta = next.delta(self.cs.annotations());
        let targets = suspend::hibernate_targets(&self.classified);
        if let Deadline::Restart(stamp) = deadline
            && !targets.is_empty()
        {
            delta.extend(stamp.desired());
        }
        self.patch_set_annotations(delta).await?;
        if targets.is_empty() {
            return Ok(false);
        }
        let asked = bool_delta(ann::HIBERNATE, true);
        if deadline == Deadline::Exceeded {
            self.patch_classified_all(&targets, &asked).await?;
            return Ok(false);
        }
        let patches = targets.iter().map(|n| (n.clone(), asked.clone())).collect();
        // The status is computed before the annotations are mirrored: it does not read them.
        let status = self.status_now(Some(CocoonSetPhase::Suspending));
        self.changed = true;
        let written = self.patch_pods_and_status(patches, status).await;
        for name in &targets {
            self.mirror(name, &asked);
        }
        written.map(|()| true)
    }

    /// 6A.3: whether every managed VM is hibernated at this generation with its tag in the
    /// registry, and a probe error, if any. No probe is made while a pod is still incomplete;
    /// then all go out together.
    async fn suspend_gate(&self) -> (bool, Option<RegistryError>) {
        let generation = self.generation();
        let mut probes = Vec::new();
        for pod in self.classified.all_by_name.values() {
            match suspend::gate_item(pod, generation) {
                GateItem::Skip => {}
                GateItem::Incomplete => return (false, None),
                GateItem::Probe(vm) => probes.push(vm),
            }
        }
        let stats = &self.ctx.stats;
        let registry = &self.ctx.registry;
        let calls: Vec<_> = probes
            .iter()
            .map(|vm| {
                stats.registry_calls.fetch_add(1, Ordering::Relaxed);
                registry.has_manifest(vm, tags::HIBERNATE)
            })
            .collect();
        let results =
            crate::watch_retry::at_most(crate::cocoonset::REGISTRY_CALLS_AT_ONCE, calls).await;
        let mut complete = true;
        for r in results {
            match r {
                Ok(true) => {}
                Ok(false) => complete = false,
                Err(e) => return (false, Some(e)),
            }
        }
        (complete, None)
    }

    /// 6C, with the deadline decided before the record write (a restart's stamp may have
    /// gone out with it; writing it again is then no call).
    async fn suspend_not_complete(
        &mut self,
        deadline: Deadline,
        probe_error: Option<RegistryError>,
    ) -> Result<Step, Error> {
        match deadline {
            Deadline::Restart(stamp) => {
                self.patch_set_annotations(stamp.desired()).await?;
            }
            Deadline::Running => {}
            Deadline::Exceeded => {
                let deadline = self.ctx.timing.suspend_deadline;
                let msg = ev::suspend_timed_out_message(
                    deadline,
                    probe_error.as_ref().map(|e| e.to_string()).as_deref(),
                );
                warn!(namespace = %self.ns, name = %self.name, %msg, "suspend timed out");
                self.event(true, reasons::SUSPEND_TIMED_OUT, msg).await;
                self.write_phase(Some(CocoonSetPhase::Failed)).await?;
                return Ok(Step::Return(Action::requeue(self.ctx.timing.suspend_poll)));
            }
        }
        self.write_phase(Some(CocoonSetPhase::Suspending)).await?;
        // A probe error goes to the runtime so the registry gets backoff; the deadline above
        // still counts it, so an unreachable registry ends in Failed rather than waiting.
        if let Some(e) = probe_error {
            let what = format!("probe the {} tags", tags::HIBERNATE);
            return Err(Error::registry("suspend gate", what, e));
        }
        Ok(Step::Return(Action::requeue(self.ctx.timing.suspend_poll)))
    }

    /// 6B.3: free the seats once every snapshot is in the registry.
    async fn release_seats(&mut self) -> Result<Step, Error> {
        let all: Vec<Pod> = self.classified.all_by_name.values().cloned().collect();
        self.stash(all.iter()).await?;
        if let Some(node) = self
            .classified
            .main
            .as_ref()
            .map(|m| pods::bound_node(m).to_string())
            .filter(|n| !n.is_empty())
        {
            let delta = HibernatedOnNode(node).delta(self.cs.annotations());
            self.patch_set_annotations(delta).await?;
        }
        for name in suspend::release_victims(&self.classified) {
            let keep = HibernateFlags {
                keep_snapshot_on_delete: true,
                ..HibernateFlags::default()
            };
            let delta = bool_delta(ann::KEEP_SNAPSHOT_ON_DELETE, keep.keep_snapshot_on_delete);
            // Best effort: a missing flag costs the wake a registry pull, while blocking the
            // delete would keep the seat the policy exists to free.
            if let Err(e) = self.patch_pod_annotations(&name, &delta).await {
                if let Error::LostLeadership(l) = e {
                    return Err(l.into());
                }
                warn!(pod = %name, error = %e, "could not flag keep-snapshot-on-delete; releasing anyway");
            }
            self.delete_pod(&name).await?;
            self.changed = true;
            self.ctx
                .metrics
                .slot_release_pods_deleted
                .get_or_create(&self.set_labels())
                .inc();
            info!(namespace = %self.ns, pod = %name, "released the seat of a hibernated pod");
        }
        self.write_phase(Some(CocoonSetPhase::Suspended)).await?;
        Ok(Step::Return(Action::requeue(self.ctx.timing.suspend_poll)))
    }

    // ----- step 7.1 ----------------------------------------------------------------------

    /// 7.1: a terminal main first loses a leftover hibernate intent (10.1–10.5), unless a
    /// migration is pending, whose quiesce that annotation is.
    pub(super) async fn clear_leftover_hibernate(&mut self, main: &Pod) -> Result<(), Error> {
        let desired = self.cs.spec.node_name.as_str();
        let bound = pods::bound_node(main);
        let migration_pending = !desired.is_empty() && !bound.is_empty() && bound != desired;
        if migration_pending {
            return Ok(());
        }
        self.unsuspend_bookkeeping().await
    }

    // ----- step 8 ----------------------------------------------------------------------

    /// Step 8 — cross-node migration of the main (slot 0). Crash safety: `Migrating` is
    /// written before the quiesce, the old pod dies only after its snapshot is in the
    /// registry and the node agent reports it hibernated, and the snapshot is dropped only
    /// once the restored VM runs, so every pass resumes from the API objects and the tag.
    pub(super) async fn migrate(&mut self) -> Result<Step, Error> {
        let desired = self.cs.spec.node_name.clone();
        let migrating = self.phase() == Some(CocoonSetPhase::Migrating);
        let main = self.classified.main.clone();
        match migrate::engage(&desired, migrating, main.as_ref()) {
            Engage::HandOver => return Ok(Step::Continue),
            Engage::DeleteStalePin => {
                let name = naming::pod_name_for_agent(&self.name, 0);
                info!(namespace = %self.ns, pod = %name, pin = %desired, "deleting an unscheduled main pinned to a node the set no longer names");
                self.delete_pod(&name).await?;
                self.changed = true;
                return Ok(Step::Return(Action::requeue(
                    self.ctx.timing.requeue_after_write,
                )));
            }
            Engage::Probe => {}
        }
        let main_name = naming::pod_name_for_agent(&self.name, 0);
        if migrate::hibernation_blocks(&self.list_hibernations_fresh().await?, &main_name) {
            debug!(namespace = %self.ns, pod = %main_name, "a CocoonHibernation owns the main; migration waits");
            return Ok(Step::Continue);
        }
        let vm = naming::vm_name_for_agent(&self.ns, &self.name, 0);
        self.ctx
            .stats
            .registry_calls
            .fetch_add(1, Ordering::Relaxed);
        let tag = self
            .ctx
            .registry
            .has_manifest(&vm, tags::HIBERNATE)
            .await
            .map_err(|e| {
                Error::registry("migrate", format!("probe {vm}:{}", tags::HIBERNATE), e)
            })?;
        let poll = Action::requeue(self.ctx.timing.migrate_poll);
        let mut decision = migrate::advance(&desired, migrating, main.as_ref(), tag);
        if matches!(decision, Advance::DropLeftover | Advance::DropSnapshot) {
            // The cache was read before the probe. Once the tag exists the node agent has
            // written `hibernating`, so a pod read now shows whether the VM that runs is the
            // one the snapshot came from; dropping on the older view could lose the only
            // copy of the main's state.
            self.ctx.stats.reads.fetch_add(1, Ordering::Relaxed);
            let now = self.pod_api.get_opt(&main_name).await?;
            let confirmed = migrate::advance(&desired, migrating, now.as_ref(), tag);
            if confirmed != decision {
                debug!(namespace = %self.ns, pod = %main_name, cached = ?decision, now = ?confirmed, "the main changed since the cache was read; tag kept");
                decision = if migrating {
                    Advance::AwaitLive {
                        unschedulable: None,
                    }
                } else {
                    Advance::HandOver
                };
            }
        }
        match decision {
            Advance::HandOver => Ok(Step::Continue),
            Advance::Quiesce => {
                // The durable marker first: a restart mid-quiesce still knows the annotation
                // is this migration's, not a leftover.
                self.mark_migrating().await?;
                self.patch_classified(&main_name, &bool_delta(ann::HIBERNATE, true))
                    .await?;
                info!(namespace = %self.ns, name = %self.name, target = %desired, "migration started: quiescing the main");
                Ok(Step::Return(poll))
            }
            Advance::DropLeftover => {
                self.drop_main_tag(&vm).await?;
                info!(namespace = %self.ns, vm = %vm, "dropped a leftover :hibernate tag before migrating");
                self.mark_migrating().await?;
                Ok(Step::Return(poll))
            }
            Advance::AwaitQuiesce => {
                self.mark_migrating().await?;
                Ok(Step::Return(poll))
            }
            Advance::EvictOld => {
                let delta = bool_delta(ann::KEEP_SNAPSHOT_ON_DELETE, true);
                // Best effort, as in seat release: without the flag the target pulls the
                // snapshot from the registry instead of the source node.
                if let Err(e) = self.patch_pod_annotations(&main_name, &delta).await {
                    if let Error::LostLeadership(l) = e {
                        return Err(l.into());
                    }
                    warn!(pod = %main_name, error = %e, "could not flag keep-snapshot-on-delete; migrating anyway");
                }
                self.delete_pod(&main_name).await?;
                self.changed = true;
                info!(namespace = %self.ns, pod = %main_name, target = %desired, "quiesced main deleted for migration");
                self.mark_migrating().await?;
                Ok(Step::Return(poll))
            }
            Advance::Recreate => self.migrate_recreate().await,
            Advance::WakeInPlace => {
                self.patch_classified(&main_name, &bool_delta(ann::HIBERNATE, false))
                    .await?;
                info!(namespace = %self.ns, pod = %main_name, "migration re-targeted back: waking the main in place");
                self.mark_migrating().await?;
                Ok(Step::Return(poll))
            }
            Advance::AwaitLive { unschedulable } => {
                if let Some(msg) = unschedulable {
                    self.ctx
                        .metrics
                        .migrate_unschedulable
                        .get_or_create(&self.set_labels())
                        .inc();
                    let msg = migrate::redact_target(&msg, &desired);
                    let text = ev::main_unschedulable_message(&main_name, &msg);
                    self.event(true, reasons::MIGRATE_NO_CAPACITY, text).await;
                }
                self.mark_migrating().await?;
                Ok(Step::Return(poll))
            }
            Advance::DropSnapshot => {
                self.drop_main_tag(&vm).await?;
                info!(namespace = %self.ns, name = %self.name, node = %desired, "migration complete: snapshot dropped");
                self.mark_migrating().await?;
                Ok(Step::Return(poll))
            }
        }
    }

    async fn mark_migrating(&mut self) -> Result<(), Error> {
        self.write_phase(Some(CocoonSetPhase::Migrating))
            .await
            .map_err(|e| match e {
                Error::Kube(k) => Error::MigratingStatus(k),
                other => other,
            })
    }

    async fn drop_main_tag(&self, vm: &str) -> Result<(), Error> {
        self.ctx.registry_write()?;
        self.ctx
            .stats
            .registry_calls
            .fetch_add(1, Ordering::Relaxed);
        self.ctx
            .registry
            .delete_tag(vm, tags::HIBERNATE)
            .await
            .map_err(|e| Error::registry("migrate", format!("delete {vm}:{}", tags::HIBERNATE), e))
    }

    /// 8.6.2: the old main is gone; recreate it under the current pin from the snapshot,
    /// unless the image rule dropped the snapshot (step 11 then boots it fresh).
    async fn migrate_recreate(&mut self) -> Result<Step, Error> {
        let mut pod = pods::build_agent_pod(&self.cs, &self.ns, 0, "", None);
        let facts = self.facts_for(&pod, Role::Main, &BTreeSet::new(), true);
        let (tag, decision) = prepare_create(self.ctx, &mut pod, facts, "migrate").await?;
        if decision.forget {
            self.forget_vms(&[pods::vm_name(&pod).to_string()]).await?;
        }
        if suspend::wake_boots_fresh(&tag, &decision) {
            info!(namespace = %self.ns, name = %self.name, "no snapshot to migrate onto (image changed); the main boots fresh");
            return Ok(Step::Continue);
        }
        match post_pod(self.ctx, &self.pod_api, &pod).await? {
            // The old pod is still terminating (the cache no longer lists it).
            Created::AlreadyExists => {
                Ok(Step::Return(Action::requeue(self.ctx.timing.migrate_poll)))
            }
            Created::Yes => {
                self.changed = true;
                info!(namespace = %self.ns, name = %self.name, target = %self.cs.spec.node_name, "main recreated from its snapshot");
                self.mark_migrating().await?;
                Ok(Step::Return(Action::requeue(self.ctx.timing.migrate_poll)))
            }
        }
    }

    // ----- step 9 ----------------------------------------------------------------------

    /// Step 9: the release-policy wake ([`steps::release_wake`]); 9.1 and 9.4 need reads
    /// first and stay here.
    pub(super) async fn release_wake(&mut self) -> Result<Step, Error> {
        match steps::release_wake::plan(&self.observed(&[]), super::status_time()) {
            ReleaseWake::Plan(plan) => {
                let completes = plan
                    .writes
                    .iter()
                    .any(|w| matches!(w, steps::Write::DropTag { .. }));
                let next = self.apply(plan).await?.next;
                if completes {
                    info!(namespace = %self.ns, name = %self.name, "released main woken");
                }
                Ok(Step::from(next))
            }
            ReleaseWake::Start { hint } => self.wake_start(&hint).await,
            ReleaseWake::ConfirmGone => {
                let name = naming::pod_name_for_agent(&self.name, 0);
                self.ctx.stats.reads.fetch_add(1, Ordering::Relaxed);
                match self.pod_api.get_opt(&name).await? {
                    None => Ok(Step::Return(Action::requeue(self.ctx.timing.migrate_poll))),
                    Some(p) if p.metadata.deletion_timestamp.is_some() => {
                        Ok(Step::Return(Action::requeue(self.ctx.timing.migrate_poll)))
                    }
                    Some(_) => Ok(Step::Continue),
                }
            }
        }
    }

    /// 9.1: recreate the released main from its snapshot, near its old node when it has room.
    async fn wake_start(&mut self, hint: &str) -> Result<Step, Error> {
        let mut pod = pods::build_agent_pod(&self.cs, &self.ns, 0, "", None);
        let facts = self.facts_for(&pod, Role::Main, &BTreeSet::new(), true);
        let (tag, decision) = prepare_create(self.ctx, &mut pod, facts, "wake").await?;
        if decision.forget {
            self.forget_vms(&[pods::vm_name(&pod).to_string()]).await?;
        }
        if suspend::wake_boots_fresh(&tag, &decision) {
            // No snapshot to restore (never booted, or dropped by the image rule): the
            // normal flow boots the main fresh.
            let delta = HibernatedOnNode::default().delta(self.cs.annotations());
            self.patch_set_annotations(delta).await?;
            return Ok(Step::Continue);
        }
        // Waking is the durable marker of a wake in flight: written before the create.
        self.write_phase(Some(CocoonSetPhase::Waking)).await?;
        if !hint.is_empty()
            && let Some(ps) = pod.spec.as_mut()
            && ps.affinity.is_none()
        {
            ps.affinity = Some(placement::preferred_hostname_affinity(hint));
        }
        post_pod(self.ctx, &self.pod_api, &pod).await?;
        self.changed = true;
        Ok(Step::Return(Action::requeue(self.ctx.timing.migrate_poll)))
    }

    // ----- step 10 ---------------------------------------------------------------------

    /// Step 10 (`spec.suspend` is false here).
    pub(super) async fn unsuspend_and_reclaim(&mut self) -> Result<Step, Error> {
        self.unsuspend_bookkeeping().await?;
        self.reclaim().await?;
        Ok(Step::Continue)
    }

    /// 10.1–10.5. No registry call; nothing at all when there is no annotation to clear and
    /// no suspended list.
    async fn unsuspend_bookkeeping(&mut self) -> Result<(), Error> {
        let record = ReclaimRecord::from_meta(&self.cs.metadata);
        let any_annotated = self
            .classified
            .all_by_name
            .values()
            .any(suspend::is_hibernate_annotated);
        if !any_annotated && record.suspended.is_empty() {
            return Ok(());
        }
        let owned_by_cr = if any_annotated {
            suspend::hibernation_owned(&self.list_hibernations())
        } else {
            BTreeSet::new()
        };
        let mut hibernated = suspend::unsuspend_targets(&self.classified, &owned_by_cr);
        if suspend::unsuspend_needs_fresh_crs(&record, &hibernated) {
            let fresh = suspend::hibernation_owned(&self.list_hibernations_fresh().await?);
            hibernated = suspend::unsuspend_targets(&self.classified, &fresh);
        }
        if hibernated.is_empty() && record.suspended.is_empty() {
            return Ok(());
        }
        let present = suspend::present_vms(&self.classified);
        let first =
            suspend::unsuspend_first_write(&record, &hibernated, &present, self.generation());
        self.write_record(&first).await?;
        let names: Vec<String> = hibernated.iter().map(|p| p.name_any()).collect();
        self.patch_classified_all(&names, &bool_delta(ann::HIBERNATE, false))
            .await?;
        let mut second = ReclaimRecord::from_meta(&self.cs.metadata);
        second.suspended.clear();
        self.write_record(&second).await?;
        info!(namespace = %self.ns, name = %self.name, woken = ?suspend::names(&hibernated), "unsuspended");
        Ok(())
    }

    /// 10.6: drop the tags of recorded VMs whose pods have woken. A refused delete keeps the
    /// VM recorded and fails the pass, so scaling and the status wait for the retry.
    async fn reclaim(&mut self) -> Result<(), Error> {
        let mut record = ReclaimRecord::from_meta(&self.cs.metadata);
        let woken = suspend::reclaimable(&record, &self.classified);
        if woken.is_empty() {
            return Ok(());
        }
        self.ctx.registry_write()?;
        let mut failures = Vec::new();
        let stats = &self.ctx.stats;
        let registry = &self.ctx.registry;
        let deletes: Vec<_> = woken
            .iter()
            .map(|vm| {
                stats.registry_calls.fetch_add(1, Ordering::Relaxed);
                registry.delete_tag(vm, tags::HIBERNATE)
            })
            .collect();
        let results =
            crate::watch_retry::at_most(crate::cocoonset::REGISTRY_CALLS_AT_ONCE, deletes).await;
        for (vm, r) in woken.iter().zip(results) {
            match r {
                Ok(()) => record.remove_vm(vm),
                Err(e) => failures.push((format!("delete {vm}:{}", tags::HIBERNATE), e)),
            }
        }
        self.write_record(&record).await?;
        Error::registry_all("reclaim", failures)
    }
}
