//! The writes to the CocoonSet itself: its annotations (the reclaim record among them), its
//! finalizers and its status, each mirrored into the pass's copy of the set and kept in the
//! controller's memory.

use cocoon_api::contract::{
    AnnotationCodec, AnnotationDelta, ReclaimRecord, annotations_merge_patch, diff_annotations,
};
use cocoon_api::crd::set::{CocoonSet, CocoonSetPhase, CocoonSetStatus};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use tracing::{debug, info};

use crate::cocoonset::shared::status as status_rules;
use crate::cocoonset::walk::Walk;
use crate::cocoonset::{Context, Error};

impl Walk<'_> {
    /// Merge-patches the set's annotations with `delta` (when it changes anything) and
    /// mirrors it into the in-memory copy. The rest of the pass reads the mirror, so this
    /// write alone asks for no follow-up pass (an annotation-only change of the set wakes no
    /// watch, and waiting out `requeue_after_write` for it cost every wake a second).
    pub(super) async fn patch_set_annotations(
        &mut self,
        delta: AnnotationDelta,
    ) -> Result<(), Error> {
        let current = self.cs.annotations().clone();
        let delta = diff_annotations(&current, &delta);
        let Some(patch) = annotations_merge_patch(&delta) else {
            return Ok(());
        };
        self.ctx.write(line!())?;
        debug!(name = %self.name, %patch, "patching the set's annotations");
        let patched = self
            .sets
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        self.versions.extend(patched.resource_version());
        self.ctx.memory.wrote_set(self.set_base.as_deref(), patched);
        cocoon_api::contract::apply_delta(self.cs.annotations_mut(), &delta);
        Ok(())
    }

    pub(super) async fn write_status(&mut self, status: CocoonSetStatus) -> Result<(), Error> {
        let Some((body, status)) = self.status_body(status) else {
            return Ok(());
        };
        let written = send_status(self.ctx, &self.sets, &self.name, &body).await?;
        self.status_written(status, written);
        Ok(())
    }

    /// The merge-patch body of `status`, or `None` when the set already carries it, or when
    /// this controller already wrote exactly that status and the cache still shows a version
    /// of the set from before that write: it has not caught up yet, and writing it again
    /// would cost a round trip for nothing. (The write's own watch event brings the next
    /// pass.)
    pub(super) fn status_body(&self, status: CocoonSetStatus) -> Option<(Value, CocoonSetStatus)> {
        let status = status_rules::status_patch(&self.cs, status)?;
        let (_uid, cached) = (self.cs.uid()?, self.cs.resource_version()?);
        let already =
            status_rules::status_already_written(self.last_status.as_ref(), &cached, &status);
        if already {
            debug!(name = %self.name, "status already written; the cache has not caught up");
            return None;
        }
        let mut body = serde_json::to_value(&status).unwrap_or(Value::Null);
        // A merge patch keeps keys it does not name: emptied fields are cleared explicitly.
        if let Value::Object(m) = &mut body {
            for key in [
                "observedGeneration",
                "phase",
                "agents",
                "toolboxes",
                "conditions",
            ] {
                m.entry(key).or_insert(Value::Null);
            }
        }
        debug!(name = %self.name, status = %body, "patching the set's status");
        Some((json!({ "status": body }), status))
    }

    /// Records a status patch that succeeded (`written`: the set it returned), in this pass
    /// and for the next ones.
    pub(super) fn status_written(&mut self, status: CocoonSetStatus, written: CocoonSet) {
        self.versions.extend(written.resource_version());
        self.ctx.memory.wrote_set(self.set_base.as_deref(), written);
        if let Some(uid) = self.cs.uid() {
            let last = self
                .ctx
                .memory
                .wrote_status(&uid, &self.versions, status.clone());
            self.last_status = Some(last);
        }
        self.cs.status = Some(status);
    }

    pub(super) fn status_now(&self, phase: Option<CocoonSetPhase>) -> CocoonSetStatus {
        // Whole seconds: the API server stores condition times so, and a finer `now` would
        // make a freshly written status differ from its read-back.
        let now = Timestamp::from_second(Timestamp::now().as_second()).unwrap_or_default();
        status_rules::build_status(&self.cs, &self.classified, phase, now)
    }

    pub(super) async fn write_finalizers(
        &mut self,
        patch: serde_json::Value,
        gone_ok: bool,
    ) -> Result<(), Error> {
        self.ctx.write(line!())?;
        match self
            .sets
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(patched) => {
                if gone_ok {
                    info!(namespace = %self.ns, name = %self.name, "CocoonSet torn down");
                }
                // The pass goes on from the set as written (step 3 hands over).
                self.versions.extend(patched.resource_version());
                self.cs.metadata.finalizers = patched.metadata.finalizers.clone();
                self.ctx.memory.wrote_set(self.set_base.as_deref(), patched);
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 404 && gone_ok => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// [`crate::cocoonset::steps::Write::SpecPatch`]: a merge patch of the set as
    /// `field_manager`, its precondition the newest resourceVersion this pass knows (its own
    /// writes included). A conflict means someone else wrote the set since: logged, and the
    /// pass goes on (its plan ends it; the next pass decides on what was written).
    pub(super) async fn patch_spec(
        &mut self,
        mut patch: Value,
        field_manager: &'static str,
    ) -> Result<(), Error> {
        if let (Some(version), Some(meta)) = (
            self.versions.last(),
            patch.get_mut("metadata").and_then(Value::as_object_mut),
        ) {
            meta.insert("resourceVersion".into(), Value::String(version.clone()));
        }
        self.ctx.write(line!())?;
        info!(name = %self.name, field_manager, %patch, "patching the set");
        let params = PatchParams {
            field_manager: Some(field_manager.to_owned()),
            ..PatchParams::default()
        };
        match self
            .sets
            .patch(&self.name, &params, &Patch::Merge(&patch))
            .await
        {
            Ok(patched) => {
                self.versions.extend(patched.resource_version());
                self.ctx.memory.wrote_set(self.set_base.as_deref(), patched);
                self.changed = true;
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                info!(name = %self.name, field_manager, "the set changed in between; the next pass decides again");
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Removes VMs from the reclaim record (the image rule and the sub-agent pre-create drop).
    pub(super) async fn forget_vms(&mut self, vms: &[String]) -> Result<(), Error> {
        if vms.is_empty() {
            return Ok(());
        }
        let mut record = ReclaimRecord::from_meta(&self.cs.metadata);
        for vm in vms {
            record.remove_vm(vm);
        }
        let delta = record.delta(self.cs.annotations());
        self.patch_set_annotations(delta).await
    }
}

/// One status merge patch; returns the set it produced.
pub(super) async fn send_status(
    ctx: &Context,
    sets: &Api<CocoonSet>,
    name: &str,
    body: &Value,
) -> Result<CocoonSet, Error> {
    ctx.write(line!())?;
    Ok(sets
        .patch_status(name, &PatchParams::default(), &Patch::Merge(body))
        .await?)
}
