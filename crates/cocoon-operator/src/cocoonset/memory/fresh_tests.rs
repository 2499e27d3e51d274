//! [`super::fresh`] on the real API server: passes run by hand over caches this test holds
//! back, so that the cache that does not show the controller's own writes is not a matter of
//! watch timing. The writes are counted from the API server's audit log of the controller's
//! own identity.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use cocoon_api::contract::annotations as ann;
use cocoon_api::crd::set::{CocoonSet, CocoonSetSpec};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::cocoonset::{Caches, Context, Timing, pods, walk};
use crate::metrics::Metrics;
use crate::registry::OciTagRegistry;

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

fn context(client: &Client, registry_addr: &str) -> Context {
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "cocoon-operator".into(),
            instance: None,
        },
    );
    Context::new(
        client.clone(),
        recorder,
        Arc::new(Metrics::new()),
        Arc::new(OciTagRegistry::new(cocoon_testsupport::registry(
            registry_addr,
        ))),
        Timing::default(),
    )
}

/// A suspending set whose caches do not show what the first pass wrote (the record, the
/// status, the hibernate annotation on the pod): the next pass reads what those writes
/// returned and writes none of them again; once the set cache has caught up and the pod
/// cache not, the pod is still not patched again. Without the kept copies each later pass
/// would write the record (a fresh `suspending-since`), the status and the pod again.
#[tokio::test]
async fn a_pass_over_caches_that_do_not_show_its_own_writes_yet_does_not_write_them_again() {
    cocoon_testenv::run_test(|env| async move {
        let admin = env.client()?;
        let ns = cocoon_testenv::create_namespace(&admin, "cs-fresh").await?;
        let Some(audit) = env.audit_log() else {
            return Err("the test environment's run directory is unknown".into());
        };
        let identity =
            cocoon_testsupport::AuditedIdentity::new(env, &admin, "cs-fresh-operator").await?;
        let ctx = context(&identity.client, env.registry_addr());
        let sets: Api<CocoonSet> = Api::namespaced(admin.clone(), &ns);
        let pod_api: Api<Pod> = Api::namespaced(admin.clone(), &ns);
        let mut spec = CocoonSetSpec::with_image("img:1");
        spec.suspend = true;
        let mut cs = CocoonSet::new("demo", spec);
        cs.metadata.finalizers = Some(vec![cocoon_api::contract::finalizers::COCOONSET.into()]);
        let cs = sets.create(&PostParams::default(), &cs).await?;
        let main = pod_api
            .create(
                &PostParams::default(),
                &pods::build_agent_pod(&cs, &ns, 0, "", Some("nowhere")),
            )
            .await?;
        // The caches this test holds: the pod as created, and nothing more.
        let (pod_reader, mut pod_writer) = reflector::store::<Pod>();
        pod_writer.apply_watcher_event(&watcher::Event::Apply(main.clone()));
        let (hib_reader, _hib_writer) =
            reflector::store::<cocoon_api::crd::hibernation::CocoonHibernation>();
        let caches = Caches {
            pods: pod_reader,
            hibernations: hib_reader,
            checkpoints: reflector::store().0,
            pods_synced: AtomicBool::new(true),
            hibernations_synced: AtomicBool::new(true),
        };
        let writes = |what: &'static str| {
            let (audit, ns, user) = (&audit, ns.clone(), identity.user.clone());
            let identity = &identity;
            async move {
                identity.writes_in(audit, &ns).await?;
                let w = audit.writes_of(&user, &ns)?;
                let n = w
                    .iter()
                    .filter(|r| match what {
                        "pods" => r.resource == "pods",
                        _ => r.resource.starts_with("cocoonsets"),
                    })
                    .count();
                Ok::<usize, Box<dyn std::error::Error + Send + Sync>>(n)
            }
        };

        // Pass 1: the record, the hibernate annotation on the pod, Suspending. Tracked first,
        // as `reconcile` does: the memory keeps writes only of tracked sets.
        ctx.track(&cs);
        walk::walk(&cs, &ctx, &caches).await?;
        let on_server = pod_api.get(&main.name_any()).await?;
        assert_eq!(
            on_server
                .annotations()
                .get(ann::HIBERNATE)
                .map(String::as_str),
            Some("true"),
            "the first pass asked the pod to hibernate"
        );
        let after_first = (writes("pods").await?, writes("sets").await?);
        assert_eq!(after_first.0, 1, "one pod patch");
        assert!(after_first.1 >= 2, "the record and the status went out");

        // Pass 2: neither cache shows anything of pass 1 (the set as created, the pod too).
        walk::walk(&cs, &ctx, &caches).await?;
        assert_eq!(
            (writes("pods").await?, writes("sets").await?),
            after_first,
            "nothing is written again"
        );

        // Pass 3: the set cache caught up, the pod cache still behind.
        let now = sets.get("demo").await?;
        walk::walk(&now, &ctx, &caches).await?;
        assert_eq!(writes("pods").await?, 1, "the pod is not patched again");

        // Once the pod cache shows another version (here: an edit of someone else's), the
        // cache decides again and the kept copy goes.
        let touched = pod_api
            .patch(
                &main.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})),
            )
            .await?;
        pod_writer.apply_watcher_event(&watcher::Event::Apply(touched));
        walk::walk(&sets.get("demo").await?, &ctx, &caches).await?;
        assert!(
            !ctx.memory.keeps_pods_of(&cs.uid().unwrap_or_default()),
            "nothing kept once the cache moved"
        );

        sets.patch(
            "demo",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await?;
        sets.delete("demo", &DeleteParams::default()).await?;
        identity.delete(&admin).await?;
        cocoon_testenv::delete_namespace(&admin, &ns).await?;
        TestResult::Ok(())
    })
    .await;
}
