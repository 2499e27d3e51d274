//! The pod writes: deletes, posts (one or several at once), annotation patches carrying each
//! pod's pending generation stamp (one or several at once, alone or beside a status write),
//! and the mirror of a patch into the pass's classification.

use cocoon_api::contract::{AnnotationDelta, annotations_merge_patch};
use cocoon_api::crd::set::CocoonSetStatus;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};

use super::set::send_status;
use crate::cocoonset::steps::Created;
use crate::cocoonset::walk::Walk;
use crate::cocoonset::{Context, Error, POD_WRITES_AT_ONCE};

impl Walk<'_> {
    /// Posts `pods` at once (at most `at_once` in flight); the outcomes in the pods' order,
    /// or the first error once all have finished.
    pub(super) async fn post_pods(
        &mut self,
        pods: &[Pod],
        at_once: usize,
    ) -> Result<Vec<Created>, Error> {
        let (ctx, api, uid) = (self.ctx, self.pod_api.clone(), self.cs.uid());
        let posts: Vec<_> = pods
            .iter()
            .map(|pod| post_pod(ctx, &api, uid.clone(), pod))
            .collect();
        crate::watch_retry::at_most(at_once, posts)
            .await
            .into_iter()
            .collect()
    }

    /// Deletes a pod (NotFound is success) and remembers the delete until the cache shows the
    /// pod going ([`crate::cocoonset::memory::deleted`]).
    pub(super) async fn delete_pod(&mut self, name: &str) -> Result<(), Error> {
        self.pending_stamps.remove(name);
        self.ctx.write(line!())?;
        match self.pod_api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
        if let (Some(set), Some(pod)) = (self.cs.uid(), self.pod_uids.get(name)) {
            self.ctx.memory.deleted(&set, pod);
        }
        Ok(())
    }

    /// Patches a pod's annotations, carrying its pending generation stamp along.
    pub(super) async fn patch_pod_annotations(
        &mut self,
        pod: &str,
        delta: &AnnotationDelta,
    ) -> Result<(), Error> {
        let delta = self.with_stamp(pod, delta);
        let written = patch_pod(self.ctx, &self.pod_api, pod, &delta).await?;
        self.pod_written(pod, written);
        Ok(())
    }

    /// Keeps what a pod patch returned for the next passes
    /// ([`crate::cocoonset::memory::fresh`]).
    fn pod_written(&self, pod: &str, written: Option<Pod>) {
        if self.cs.metadata.deletion_timestamp.is_some() {
            return;
        }
        if let Some(w) = written {
            let base = self.pod_bases.get(pod).map(String::as_str);
            self.ctx.memory.wrote_pod(self.cs.uid().as_deref(), base, w);
        }
    }

    /// Patches several pods at once (at most [`POD_WRITES_AT_ONCE`] in flight), each with
    /// its pending generation stamp; the first error is returned once all have finished.
    async fn patch_pods(&mut self, patches: Vec<(String, AnnotationDelta)>) -> Result<(), Error> {
        let patches: Vec<(String, AnnotationDelta)> = patches
            .into_iter()
            .map(|(pod, delta)| {
                let delta = self.with_stamp(&pod, &delta);
                (pod, delta)
            })
            .collect();
        let (ctx, api) = (self.ctx, &self.pod_api);
        // Futures collected first: a `map` closure inside the stream type trips the
        // higher-ranked `Send` check of the controller's future.
        let writes: Vec<_> = patches
            .iter()
            .map(|(pod, delta)| patch_pod(ctx, api, pod, delta))
            .collect();
        let results: Vec<Result<Option<Pod>, Error>> = futures::stream::iter(writes)
            .buffer_unordered(POD_WRITES_AT_ONCE)
            .collect()
            .await;
        let mut first_error = None;
        for r in results {
            match r {
                Ok(Some(written)) => {
                    let name = written.name_any();
                    self.pod_written(&name, Some(written));
                }
                Ok(None) => {}
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// [`Walk::patch_pods`] and a status write at once, for steps where nothing orders the
    /// two: one round trip of the pass instead of two. The status is taken as written only
    /// if its patch succeeded; the first error is returned once both have finished.
    pub(super) async fn patch_pods_and_status(
        &mut self,
        patches: Vec<(String, AnnotationDelta)>,
        status: CocoonSetStatus,
    ) -> Result<(), Error> {
        let Some((body, status)) = self.status_body(status) else {
            return self.patch_pods(patches).await;
        };
        let (ctx, sets, name) = (self.ctx, self.sets.clone(), self.name.clone());
        let (pods, written) = futures::join!(
            self.patch_pods(patches),
            send_status(ctx, &sets, &name, &body)
        );
        let written = written.map(|version| self.status_written(status, version));
        pods.and(written)
    }

    /// `delta` plus the pod's pending generation stamp, which is then no longer pending.
    fn with_stamp(&mut self, pod: &str, delta: &AnnotationDelta) -> AnnotationDelta {
        let mut out = self.pending_stamps.remove(pod).unwrap_or_default();
        out.extend(delta.iter().map(|(k, v)| (k.clone(), v.clone())));
        out
    }

    /// Writes the generation stamps no earlier patch of this pass carried.
    pub(in crate::cocoonset::walk) async fn flush_stamps(&mut self) -> Result<(), Error> {
        let pending: Vec<(String, AnnotationDelta)> = std::mem::take(&mut self.pending_stamps)
            .into_iter()
            .collect();
        if pending.is_empty() {
            return Ok(());
        }
        self.patch_pods(pending).await
    }

    /// Patches several pods' annotations with the same delta (all at once) and mirrors it
    /// into the classification.
    pub(super) async fn mark_pods(
        &mut self,
        names: &[String],
        delta: &AnnotationDelta,
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

    /// Mirrors a pod annotation patch into this pass's classification.
    pub(super) fn mirror(&mut self, name: &str, delta: &AnnotationDelta) {
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
}

/// Posts a pod; AlreadyExists (the old pod still terminating, or a racing pass) is reported,
/// not failed. A pod created is expected until the cache shows it (`set_uid`: the set's).
pub(super) async fn post_pod(
    ctx: &Context,
    api: &Api<Pod>,
    set_uid: Option<String>,
    pod: &Pod,
) -> Result<Created, Error> {
    ctx.write(line!())?;
    match api.create(&PostParams::default(), pod).await {
        Ok(created) => {
            if let (Some(set), Some(uid)) = (set_uid, created.uid()) {
                ctx.memory.created(&set, &created.name_any(), &uid);
            }
            Ok(Created::Yes)
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Created::AlreadyExists),
        Err(e) => Err(Error::Kube(e)),
    }
}

/// One pod annotation merge patch (nothing when the delta is empty).
async fn patch_pod(
    ctx: &Context,
    api: &Api<Pod>,
    pod: &str,
    delta: &AnnotationDelta,
) -> Result<Option<Pod>, Error> {
    let Some(patch) = annotations_merge_patch(delta) else {
        return Ok(None);
    };
    ctx.write(line!())?;
    Ok(Some(
        api.patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
            .await?,
    ))
}
