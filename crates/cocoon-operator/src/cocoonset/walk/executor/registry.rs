//! The registry's side of the executor: the ownership gate every registry call of the
//! CocoonSet controller asks first ([`Walk::own_vm`]), the reclaim of recorded `:hibernate`
//! tags and the teardown's tag GC.

use cocoon_api::contract::events as ev;
use cocoon_api::contract::owner::{self, Actor};
use cocoon_api::contract::{AnnotationCodec, ReclaimRecord, annotations as ann, oci, tags};
use kube::ResourceExt;
use tracing::{error, warn};

use crate::cocoonset::steps::teardown::rules::GcItem;
use crate::cocoonset::walk::Walk;
use crate::cocoonset::{Error, REGISTRY_CALLS_AT_ONCE};
use crate::ownership::SetVms;
use crate::registry::{RegistryError, TagDelete};

impl Walk<'_> {
    /// The ownership gate ([`crate::ownership`]) of this set: its namespace and name, its
    /// spec's and status's toolboxes, its pods.
    fn vm_gate(&self) -> SetVms {
        SetVms::for_set(
            &self.cs,
            self.classified.all_by_name.keys().map(String::as_str),
            self.ctx.legacy_vm_names,
        )
    }

    /// Whether `vm` (read from `source`) is one of this set's VMs. Every registry call of
    /// the CocoonSet controller asks first; a name that is not is reported with a Warning
    /// Event `ForeignVMNameIgnored` once per set, source and name, and no call is made.
    pub(super) async fn own_vm(&self, source: &'static str, vm: &str) -> bool {
        let gate = self.vm_gate();
        if gate.owns(vm) {
            return true;
        }
        let uid = self.cs.uid().unwrap_or_default();
        if self.ctx.memory.first_foreign_report(&uid, source, vm) {
            warn!(namespace = %self.ns, name = %self.name, vm, source, "a VM name that is not one of this set's VMs: no registry call");
            let message = ev::foreign_vm_name_message(source, vm, &gate.owner());
            self.event(true, ev::operator::FOREIGN_VM_NAME_IGNORED, message)
                .await;
        }
        false
    }

    /// Deletes `<vm>:<tag>` (a name [`Walk::own_vm`] accepted) only when the artifact records
    /// the set's pod whose VM it is, or no owner (Go components); one recording another owner
    /// (a VM name colliding with another namespace's pod) is kept and reported with a Warning
    /// Event `ForeignSnapshotIgnored` once per set and tag.
    pub(super) async fn delete_own_tag(
        &self,
        vm: &str,
        tag: &'static str,
    ) -> Result<TagDelete, RegistryError> {
        let pod = self.vm_gate().pod_of(vm).unwrap_or_default();
        let actor = Actor {
            namespace: &self.ns,
            namespace_uid: None,
            pod: &pod,
        };
        self.ctx.count(|s| &s.registry_calls);
        let done = self.ctx.registry.delete_owned_tag(vm, tag, actor).await?;
        if let TagDelete::Foreign(recorded) = &done {
            let artifact = format!("{vm}:{tag}");
            let uid = self.cs.uid().unwrap_or_default();
            if self.ctx.memory.first_foreign_report(
                &uid,
                oci::ANNOTATION_OWNER_NAMESPACE,
                &artifact,
            ) {
                let by = format!("{} (CocoonSet {}/{})", actor, self.ns, self.name);
                let message = owner::foreign_snapshot_message("delete", &artifact, recorded, &by);
                warn!(namespace = %self.ns, name = %self.name, vm, tag, owner = %recorded, "the tag records another owner: not deleted");
                self.event(true, owner::FOREIGN_SNAPSHOT_IGNORED, message)
                    .await;
            }
        }
        Ok(done)
    }

    /// Deletes the `:hibernate` tags of `vms` (at most [`REGISTRY_CALLS_AT_ONCE`] at once);
    /// the deleted ones leave the record, then the refusals fail the pass.
    /// A recorded name that is not this set's is reported, never deleted, and leaves the
    /// record (nothing is owed for it).
    pub(super) async fn reclaim_tags(
        &mut self,
        vms: &[String],
        step: &'static str,
    ) -> Result<(), Error> {
        self.ctx.registry_write()?;
        let mut own = Vec::new();
        let mut foreign = Vec::new();
        for vm in vms {
            if self.own_vm(ann::HIBERNATE_RECLAIM, vm).await {
                own.push(vm.clone());
            } else {
                foreign.push(vm.clone());
            }
        }
        let vms = own;
        let me = &*self;
        let deletes: Vec<_> = vms
            .iter()
            .map(|vm| me.delete_own_tag(vm, tags::HIBERNATE))
            .collect();
        let results = crate::watch_retry::at_most(REGISTRY_CALLS_AT_ONCE, deletes).await;
        let mut record = ReclaimRecord::from_meta(&self.cs.metadata);
        for vm in &foreign {
            record.remove_vm(vm);
        }
        let mut failures = Vec::new();
        for (vm, r) in vms.iter().zip(results) {
            match r {
                // A tag recording another owner is not this set's: nothing is owed for it.
                Ok(_) => record.remove_vm(vm),
                Err(e) => failures.push((format!("delete {vm}:{}", tags::HIBERNATE), e)),
            }
        }
        let delta = record.delta(self.cs.annotations());
        self.patch_set_annotations(delta).await?;
        Error::registry_all(step, failures)
    }

    /// Every VM is tried, and the failures are returned together: one unreachable repository
    /// does not hold back the others' cleanup on the retry.
    /// A stashed or recorded name that is not this set's is reported and skipped.
    pub(super) async fn gc_tags(&mut self, items: &[GcItem]) -> Result<(), Error> {
        let record = ReclaimRecord::from_meta(&self.cs.metadata);
        let mut failures = Vec::new();
        for item in items {
            let source = if record.contains_vm(&item.vm) {
                ann::HIBERNATE_RECLAIM
            } else {
                ann::DELETE_VM_NAMES
            };
            if !self.own_vm(source, &item.vm).await {
                continue;
            }
            self.ctx.registry_write()?;
            if let Err(e) = self.delete_own_tag(&item.vm, tags::HIBERNATE).await {
                failures.push((format!("delete {}:{}", item.vm, tags::HIBERNATE), e));
                continue;
            }
            if item.drop_latest
                && let Err(e) = self.delete_own_tag(&item.vm, tags::LATEST).await
            {
                error!(vm = %item.vm, error = %e, "could not delete the :latest tag of a deleted CocoonSet; left behind");
            }
        }
        Error::registry_all("teardown GC", failures)
    }
}
