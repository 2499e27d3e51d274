//! The reads a step asks for ([`Read`]): the registry's `:hibernate` manifests (all of one
//! round at once) and probes, each behind the ownership gate, the CocoonHibernations from the
//! cache or the API server, and single pods.

use cocoon_api::contract::{annotations as ann, oci, tags};
use cocoon_api::crd::hibernation::CocoonHibernation;
use kube::api::{Api, ListParams};
use kube::runtime::reflector;

use crate::cocoonset::shared::create::rules::TagRead;
use crate::cocoonset::steps::{Answers, Probed, Read};
use crate::cocoonset::walk::Walk;
use crate::cocoonset::{Context, Error, REGISTRY_CALLS_AT_ONCE};

impl Walk<'_> {
    /// Fetches a step's reads into its answers: the manifest reads at once (at most
    /// [`REGISTRY_CALLS_AT_ONCE`] in flight, the first refusal failing the pass once all have
    /// finished), then the others in order.
    pub(super) async fn fetch_all(
        &mut self,
        reads: Vec<Read>,
        answers: &mut Answers,
    ) -> Result<(), Error> {
        let (manifests, others): (Vec<Read>, Vec<Read>) = reads
            .into_iter()
            .partition(|r| matches!(r, Read::Manifest { .. }));
        let mut own = Vec::new();
        for read in manifests {
            if let Read::Manifest { vm, step } = read {
                if self.own_vm(ann::VM_NAME, &vm).await {
                    own.push((vm, step));
                } else {
                    // Not this set's: read as absent, with no registry call.
                    answers.manifests.insert(vm, TagRead::Absent);
                }
            }
        }
        let ctx = self.ctx;
        let calls: Vec<_> = own
            .into_iter()
            .map(|(vm, step)| async move {
                let tag = read_manifest(ctx, &vm, step).await;
                (vm, tag)
            })
            .collect();
        let results = crate::watch_retry::at_most(REGISTRY_CALLS_AT_ONCE, calls).await;
        let mut first_err = None;
        for (vm, tag) in results {
            match tag {
                Ok(tag) => {
                    answers.manifests.insert(vm, tag);
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        for read in others {
            self.fetch(read, answers).await?;
        }
        Ok(())
    }

    /// Fetches one of a step's reads into its answers.
    async fn fetch(&mut self, read: Read, answers: &mut Answers) -> Result<(), Error> {
        match read {
            Read::Probe { vms, tag, fail } => {
                // A pod's VM name that is not this set's is never probed: it reads as
                // missing (its pod never completes a suspend).
                let mut probed = Probed::default();
                let mut own = Vec::new();
                for vm in vms {
                    if self.own_vm(ann::VM_NAME, &vm).await {
                        own.push(vm);
                    } else {
                        probed.exists.insert(vm, false);
                    }
                }
                let vms = own;
                let ctx = self.ctx;
                let registry = &self.ctx.registry;
                let calls: Vec<_> = vms
                    .iter()
                    .map(|vm| {
                        ctx.count(|s| &s.registry_calls);
                        registry.has_manifest(vm, tag)
                    })
                    .collect();
                let results = crate::watch_retry::at_most(REGISTRY_CALLS_AT_ONCE, calls).await;
                self.probe_error = None;
                for (vm, r) in vms.into_iter().zip(results) {
                    match r {
                        Ok(exists) => {
                            probed.exists.insert(vm, exists);
                        }
                        Err(e) => {
                            if let Some(step) = fail {
                                return Err(Error::registry(step, format!("probe {vm}:{tag}"), e));
                            }
                            let what = format!("probe {vm}:{tag}");
                            probed.exists.insert(vm, false);
                            if probed.error.is_none() {
                                probed.error = Some(format!("{what}: {e}"));
                                self.probe_error = Some((what, e));
                            }
                        }
                    }
                }
                answers.probed = Some(probed);
            }
            Read::Manifest { vm, step } => {
                let tag = if self.own_vm(ann::VM_NAME, &vm).await {
                    read_manifest(self.ctx, &vm, step).await?
                } else {
                    TagRead::Absent
                };
                answers.manifests.insert(vm, tag);
            }
            Read::CachedHibernations => {
                answers.cached_hibernations = Some(self.list_hibernations());
            }
            Read::FreshHibernations => {
                let api: Api<CocoonHibernation> =
                    Api::namespaced(self.ctx.client.clone(), &self.ns);
                self.ctx.count(|s| &s.reads);
                answers.fresh_hibernations = Some(api.list(&ListParams::default()).await?.items);
            }
            Read::CachedCheckpoint(name) => {
                let found = self
                    .caches
                    .checkpoints
                    .get(&reflector::ObjectRef::new(&name).within(&self.ns));
                answers.checkpoint = Some(found.map(|c| (*c).clone()));
            }
            Read::Pod(name) => {
                self.ctx.count(|s| &s.reads);
                let pod = self.pod_api.get_opt(&name).await?;
                answers.pods.insert(name, pod);
            }
        }
        Ok(())
    }

    /// The set's namespace's CocoonHibernations, from the cache.
    fn list_hibernations(&self) -> Vec<CocoonHibernation> {
        self.caches
            .hibernations
            .state()
            .iter()
            .filter(|h| h.metadata.namespace.as_deref() == Some(self.ns.as_str()))
            .map(|h| (**h).clone())
            .collect()
    }
}

/// §7.1: the `:hibernate` manifest of `vm` (absent, or present with its recorded image); a
/// refusal fails the pass with `step` as its context.
async fn read_manifest(ctx: &Context, vm: &str, step: &'static str) -> Result<TagRead, Error> {
    ctx.count(|s| &s.registry_calls);
    match ctx.registry.manifest_annotations(vm, tags::HIBERNATE).await {
        Ok(None) => Ok(TagRead::Absent),
        Ok(Some(a)) => Ok(TagRead::Present {
            base_image: a
                .get(oci::ANNOTATION_BASE_IMAGE)
                .cloned()
                .unwrap_or_default(),
        }),
        Err(e) => {
            let what = format!("get {vm}:{} manifest", tags::HIBERNATE);
            Err(Error::registry(step, what, e))
        }
    }
}
