//! The node agent's side of a checkpoint (docs/checkpoints.md): the shell around
//! [`super::plan::checkpoint`]. It reads the request on a pod it hosts, the CocoonCheckpoint the
//! request names (itself, never trusting the annotation), asks the planner, and only on
//! `Take` acts: `Saving` → a live snapshot of the source VM (the runtime's save pauses and
//! resumes it: the source keeps running under the same VM id) → `Pushing` → a push with the
//! node's configured format to the derived repository and tag, the owner annotations on the
//! manifest and the CR read again right before the manifest put → a verify of the tag →
//! `Ready` with the numbers and a Normal `SnapshotPushed` Event.
//!
//! One checkpoint in flight per pod: the in-flight set holds pod keys, so it is bounded by
//! the pods bound to this node, and a second request (or a repeated pod update) while one runs
//! is dropped: the pod's next update after it ends looks again. A refused request gets a
//! Warning `TenantIsolationRefused` on the pod and nothing else.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cocoon_api::contract::checkpoint::{
    CheckpointArtifact, REQUEST_ANNOTATION, checkpoint_owner_annotations,
};
use cocoon_api::contract::events::{node as ev, snapshot_transfer_message};
use cocoon_api::contract::timefmt;
use cocoon_api::contract::{AnnotationCodec as _, VmSpec};
use cocoon_api::crd::checkpoint::{CheckpointPhase, CocoonCheckpoint};
use cocoon_registry::{PushOptions, Reference};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use tracing::{info, warn};

use super::plan::checkpoint::{self as rule, CheckpointFacts, PodFacts, Verdict};
use super::{Handler, annotation, pod_key};

/// Pod keys with a checkpoint in flight (one per pod).
#[derive(Debug, Default, Clone)]
pub(crate) struct InFlight(Arc<Mutex<HashSet<String>>>);

impl InFlight {
    fn claim(&self, key: &str) -> Option<Claim> {
        let mut set = self.0.lock().unwrap_or_else(|p| p.into_inner());
        set.insert(key.to_owned()).then(|| Claim {
            set: self.clone(),
            key: key.to_owned(),
        })
    }
}

/// Releases the pod's slot when the checkpoint ends, however it ends.
struct Claim {
    set: InFlight,
    key: String,
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut set = self.set.0.lock().unwrap_or_else(|p| p.into_inner());
        set.remove(&self.key);
    }
}

/// The facts of a CR for the planner.
fn facts(c: &CocoonCheckpoint) -> Option<CheckpointFacts<'_>> {
    let s = c.status.as_ref();
    Some(CheckpointFacts {
        uid: c.metadata.uid.as_deref()?,
        deleting: c.metadata.deletion_timestamp.is_some(),
        phase: s.and_then(|s| s.phase),
        source: c.spec.source.one(),
        node: s.map_or("", |s| s.node.as_str()),
        pod_name: s.map_or("", |s| s.pod_name.as_str()),
        vm_name: s.map_or("", |s| s.vm_name.as_str()),
        repository: s.map_or("", |s| s.repository.as_str()),
        tag: s.map_or("", |s| s.tag.as_str()),
    })
}

/// The CocoonSet that controls `pod`, by its controller owner reference.
fn controller_set(pod: &Pod) -> Option<&str> {
    pod.metadata
        .owner_references
        .as_deref()?
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "CocoonSet")
        .map(|o| o.name.as_str())
}

/// What a taken checkpoint measured.
struct Taken {
    digest: String,
    bytes_on_wire: u64,
    data_bytes: u64,
    pause_millis: u128,
    format: String,
    took: std::time::Duration,
}

impl Handler {
    /// The pod-watch hook: a pod this agent hosts carries a checkpoint request. Checked and,
    /// when taken, run in the background (the pod's other operations are not held up).
    pub(crate) fn checkpoint_request(self: &Arc<Self>, pod: &Pod) {
        let Some(raw) = annotation(pod, REQUEST_ANNOTATION) else {
            return;
        };
        let key = pod_key(pod);
        let Some(claim) = self.checkpoints.claim(&key) else {
            return;
        };
        let (h, pod, raw) = (self.clone(), pod.clone(), raw.to_owned());
        self.spawn(async move {
            let _claim = claim;
            Taker { h: &h, pod: &pod }.run(&raw).await;
        });
    }
}

/// One checkpoint of one pod.
struct Taker<'a> {
    h: &'a Handler,
    pod: &'a Pod,
}

impl Taker<'_> {
    fn ns(&self) -> &str {
        self.pod.metadata.namespace.as_deref().unwrap_or_default()
    }

    fn api(&self) -> Api<CocoonCheckpoint> {
        Api::namespaced(self.h.api.client().clone(), self.ns())
    }

    async fn refuse(&self, message: &str) {
        warn!(pod = %pod_key(self.pod), %message, "checkpoint request refused");
        self.h
            .api
            .event(self.pod, true, ev::TENANT_ISOLATION_REFUSED, message)
            .await;
    }

    async fn run(&self, raw: &str) {
        let req = match rule::read_request(raw) {
            Ok(r) => r,
            Err(message) => return self.refuse(&message).await,
        };
        let cr = match self.api().get_opt(&req.name).await {
            Ok(c) => c,
            Err(e) => {
                warn!(pod = %pod_key(self.pod), name = %req.name, error = %e, "reading the checkpoint failed");
                return;
            }
        };
        let pod_facts = PodFacts {
            namespace: self.ns(),
            name: self.pod.metadata.name.as_deref().unwrap_or_default(),
            vm_name: annotation(self.pod, cocoon_api::contract::annotations::VM_NAME),
            controller_set: controller_set(self.pod),
            node: &self.h.cfg.node_name,
        };
        let verdict = rule::decide(&pod_facts, &req, cr.as_ref().and_then(facts).as_ref());
        let (vm, artifact, restart) = match verdict {
            Verdict::Refuse(message) => return self.refuse(&message).await,
            Verdict::Settled => return,
            Verdict::Take {
                vm,
                artifact,
                restart,
            } => (vm, artifact, restart),
        };
        let uid = req.uid.as_str();
        info!(pod = %pod_key(self.pod), checkpoint = %req.name, %artifact, restart, "taking a checkpoint");
        match self.take(&req.name, uid, &vm, &artifact).await {
            Ok(t) => {
                let status = json!({
                    "phase": CheckpointPhase::Ready.as_str(),
                    "digest": t.digest,
                    "bytesOnWire": t.bytes_on_wire,
                    "dataBytes": t.data_bytes,
                    "sourcePauseMillis": u64::try_from(t.pause_millis).unwrap_or(u64::MAX),
                    "takenAt": timefmt::rfc3339_seconds(chrono::Utc::now()),
                });
                if self
                    .write(&req.name, uid, CheckpointPhase::Ready, "Pushed", "", status)
                    .await
                {
                    let message = snapshot_transfer_message(
                        "pushed",
                        t.bytes_on_wire,
                        t.data_bytes,
                        &t.format,
                        t.took,
                    );
                    self.h
                        .api
                        .event(self.pod, false, ev::SNAPSHOT_PUSHED, &message)
                        .await;
                }
            }
            Err(why) => {
                warn!(pod = %pod_key(self.pod), checkpoint = %req.name, %why, "checkpoint failed");
                let status = json!({ "phase": CheckpointPhase::Failed.as_str() });
                self.write(
                    &req.name,
                    uid,
                    CheckpointPhase::Failed,
                    "Failed",
                    &why,
                    status,
                )
                .await;
            }
        }
        // The local copy was only the push's source.
        let _ = self
            .h
            .artifacts
            .rt()
            .snapshot_remove_if_exists(&artifact.repository)
            .await;
    }

    /// Saving → save → Pushing → push (gated) → verify. `Err` is the reason for `Failed`.
    async fn take(
        &self,
        name: &str,
        uid: &str,
        vm: &str,
        artifact: &CheckpointArtifact,
    ) -> Result<Taken, String> {
        let Some(reg) = self.h.artifacts.registry().cloned() else {
            return Err("this node has no registry configured".into());
        };
        let key = pod_key(self.pod);
        let id = match self.h.store.tracked_vm(&key) {
            Some(t) if !t.synthetic && !t.record.id.is_empty() => t.record.id,
            _ => return Err(format!("VM {vm} is not running on this node")),
        };
        let saving = json!({ "phase": CheckpointPhase::Saving.as_str() });
        if !self
            .write(name, uid, CheckpointPhase::Saving, "Saving", "", saving)
            .await
        {
            return Err("writing phase Saving failed".into());
        }
        let rt = self.h.artifacts.rt();
        let local = artifact.repository.as_str();
        // A restart starts over from the save: an earlier attempt's copy is dropped first.
        rt.snapshot_remove_if_exists(local)
            .await
            .map_err(|e| format!("drop the earlier local copy {local}: {e}"))?;
        let paused = Instant::now();
        rt.snapshot_save(local, &id)
            .await
            .map_err(|e| format!("snapshot save of VM {vm}: {e}"))?;
        let pause_millis = paused.elapsed().as_millis();
        let pushing = json!({ "phase": CheckpointPhase::Pushing.as_str() });
        if !self
            .write(name, uid, CheckpointPhase::Pushing, "Pushing", "", pushing)
            .await
        {
            return Err("writing phase Pushing failed".into());
        }
        let started = Instant::now();
        let base_image = VmSpec::from_meta(&self.pod.metadata).image;
        let mut opts = PushOptions::new(artifact.tag.clone(), base_image);
        opts.annotations.extra = checkpoint_owner_annotations(self.ns(), name);
        let (api, owned_uid) = (self.api(), uid.to_owned());
        let cr_name = name.to_owned();
        opts.before_manifest = Some(Arc::new(move || {
            let (api, uid, name) = (api.clone(), owned_uid.clone(), cr_name.clone());
            Box::pin(async move {
                let cr = api
                    .get_opt(&name)
                    .await
                    .map_err(|e| format!("re-reading the checkpoint: {e}"))?;
                rule::may_put_manifest(&uid, cr.as_ref().and_then(facts).as_ref())
            })
        }));
        let export = rt
            .snapshot_export(local)
            .await
            .map_err(|e| format!("snapshot export {local}: {e}"))?;
        let pushed = reg
            .push_snapshot_tar(&artifact.repository, export.stream, &opts)
            .await;
        let exported = export.done.await;
        let report = pushed.map_err(|e| format!("push {artifact}: {e}"))?;
        exported.map_err(|e| format!("snapshot export {local}: {e}"))?;
        let tag = Reference::parse(&artifact.tag).map_err(|e| e.to_string())?;
        let stored = reg
            .get_manifest(&artifact.repository, &tag)
            .await
            .map_err(|e| format!("verify {artifact}: {e}"))?;
        if stored.digest != report.manifest_digest {
            return Err(format!(
                "verify {artifact}: the tag holds {}, not the pushed {}",
                stored.digest, report.manifest_digest
            ));
        }
        Ok(Taken {
            digest: report.manifest_digest.to_string(),
            bytes_on_wire: report.bytes_uploaded,
            data_bytes: report.data_bytes,
            pause_millis,
            format: report.format,
            took: started.elapsed(),
        })
    }

    /// Merge-patches the CR's status (pinned to `uid`) with `status` and the `Ready`
    /// condition; false when the write failed (logged).
    async fn write(
        &self,
        name: &str,
        uid: &str,
        phase: CheckpointPhase,
        reason: &str,
        message: &str,
        mut status: serde_json::Value,
    ) -> bool {
        let ready = if phase == CheckpointPhase::Ready {
            "True"
        } else {
            "False"
        };
        status["conditions"] = json!([{
            "type": "Ready",
            "status": ready,
            "reason": reason,
            "message": message,
            "lastTransitionTime": timefmt::rfc3339_seconds(chrono::Utc::now()),
        }]);
        let patch = json!({ "metadata": { "uid": uid }, "status": status });
        match self
            .api()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => true,
            Err(e) => {
                warn!(pod = %pod_key(self.pod), checkpoint = name, %phase, error = %e, "writing the checkpoint status failed");
                false
            }
        }
    }
}
