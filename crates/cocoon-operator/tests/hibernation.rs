//! The CocoonHibernation controller on the real control plane and the real registry, with a
//! scripted node-side actor standing in for the node agent (it writes exactly what the node
//! agent writes: the lifecycle triple, the VM id, the container state, and the `:hibernate`
//! artifact in the registry).

use std::time::Duration;

use cocoon_api::crd::hibernation::{
    CocoonHibernation, CocoonHibernationSpec, Desire, HibernationPhase, PodRef,
};
use cocoon_api::naming::vm_name_for_pod;
use cocoon_operator::hibernation::decide::Timing;
use cocoon_registry::{RegistryClient, RegistryConfig, RetryPolicy};
use cocoon_testsupport::BoxError;
use cocoon_testsupport::scripted;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

type TestResult = Result<(), BoxError>;

const WAIT: Duration = Duration::from_secs(60);

fn registry_client(addr: &str, request_timeout: Duration) -> RegistryClient {
    let mut cfg = RegistryConfig::for_registry(addr).expect("registry config");
    cfg.request_timeout = request_timeout;
    cfg.connect_timeout = request_timeout;
    cfg.retry = RetryPolicy {
        attempts: 1,
        ..RetryPolicy::default()
    };
    RegistryClient::new(cfg).expect("registry client")
}

fn fast_timing() -> Timing {
    Timing {
        requeue: Duration::from_millis(500),
        ..Timing::default()
    }
}

async fn create_pod(pods: &Api<Pod>, ns: &str, name: &str) -> Result<String, kube::Error> {
    let vm = vm_name_for_pod(ns, name);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {
            "vm.cocoonstack.io/name": vm,
            "cocoonset.cocoonstack.io/generation": "1",
            "vm.cocoonstack.io/id": "vm-original",
        }},
        "spec": {"containers": [{"name": "agent", "image": "cocoon/placeholder"}],
                 "restartPolicy": "Never"}
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod).await?;
    Ok(vm)
}

/// The node agent's hibernate: push `<vm>:hibernate`, clear the VM id, report `hibernated`
/// at `generation` in one patch.
async fn node_reports_hibernated(
    pods: &Api<Pod>,
    reg: &RegistryClient,
    pod: &str,
    vm: &str,
    generation: i64,
) -> TestResult {
    push_snapshot_tag(reg, vm, "hibernate").await?;
    let patch = json!({"metadata": {"annotations": {
        "vm.cocoonstack.io/id": null,
        "vm.cocoonstack.io/lifecycle-state": "hibernated",
        "vm.cocoonstack.io/lifecycle-observed-generation": generation.to_string(),
        "vm.cocoonstack.io/lifecycle-state-message": null,
    }}});
    pods.patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// The node agent's wake: a fresh VM id, `ready`, and the container running.
async fn node_reports_running(pods: &Api<Pod>, pod: &str, vm_id: &str) -> TestResult {
    let patch = json!({"metadata": {"annotations": {
        "vm.cocoonstack.io/id": vm_id,
        "vm.cocoonstack.io/lifecycle-state": "ready",
        "vm.cocoonstack.io/lifecycle-observed-generation": "1",
    }}});
    pods.patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let status = json!({"status": {"phase": "Running", "containerStatuses": [{
        "name": "agent", "ready": true, "restartCount": 0, "image": "cocoon/placeholder",
        "imageID": "", "state": {"running": {"startedAt": "2026-11-29T10:00:00Z"}}
    }]}});
    pods.patch_status(pod, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

/// A minimal v1 snapshot artifact (config blob with a snapshot id, no layers).
async fn push_snapshot_tag(reg: &RegistryClient, vm: &str, tag: &str) -> TestResult {
    let created = [("org.opencontainers.image.created", "2026-11-29T10:00:00Z")];
    scripted::push_snapshot_tag(reg, vm, tag, "cocoon/placeholder", &created).await
}

fn hibernation(name: &str, pod: &str, desire: Desire) -> CocoonHibernation {
    CocoonHibernation::new(
        name,
        CocoonHibernationSpec {
            pod_ref: PodRef { name: pod.into() },
            desire,
        },
    )
}

async fn set_desire(crs: &Api<CocoonHibernation>, name: &str, desire: Desire) -> TestResult {
    let patch = json!({"spec": {"desire": desire.as_str()}});
    crs.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

async fn wait_phase(
    crs: &Api<CocoonHibernation>,
    name: &str,
    phase: HibernationPhase,
) -> Result<CocoonHibernation, cocoon_testenv::Error> {
    cocoon_testenv::wait_until(&format!("{name} reaches {phase}"), WAIT, || async {
        let cr = crs.get_opt(name).await.ok().flatten()?;
        (cr.status.as_ref().and_then(|s| s.phase) == Some(phase)).then_some(cr)
    })
    .await
}

/// Failed is left again at once (the status change itself brings the retry), so a poll could
/// miss it: watch for the phase from before the CR exists, seeing every status version.
fn watch_for_phase(
    crs: &Api<CocoonHibernation>,
    name: &str,
    phase: HibernationPhase,
) -> tokio::task::JoinHandle<Result<Option<CocoonHibernation>, kube::runtime::wait::Error>> {
    let (crs, name) = (crs.clone(), name.to_string());
    tokio::spawn(async move {
        kube::runtime::wait::await_condition(crs, &name, move |cr: Option<&CocoonHibernation>| {
            cr.and_then(|c| c.status.as_ref()).and_then(|s| s.phase) == Some(phase)
        })
        .await
    })
}

async fn wait_annotation(
    pods: &Api<Pod>,
    pod: &str,
    key: &str,
    want: Option<&str>,
) -> Result<(), cocoon_testenv::Error> {
    cocoon_testenv::wait_until(&format!("{pod} {key} = {want:?}"), WAIT, || async {
        let p = pods.get(pod).await.ok()?;
        (p.annotations().get(key).map(String::as_str) == want).then_some(())
    })
    .await
}

async fn event_reasons(client: &Client, ns: &str, regarding: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    events
        .list(&ListParams::default())
        .await
        .map(|l| {
            l.items
                .into_iter()
                .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(regarding))
                .filter_map(|e| e.reason)
                .collect()
        })
        .unwrap_or_default()
}

async fn wait_event(
    client: &Client,
    ns: &str,
    regarding: &str,
    reason: &str,
) -> Result<(), cocoon_testenv::Error> {
    cocoon_testenv::poll(&format!("event {reason} on {regarding}"), WAIT, || async {
        let seen = event_reasons(client, ns, regarding).await;
        if seen.iter().any(|r| r == reason) {
            cocoon_testenv::Probe::Ready(())
        } else {
            cocoon_testenv::Probe::NotYet(format!("events so far: {seen:?}"))
        }
    })
    .await
}

#[tokio::test]
async fn hibernate_then_wake_round_trip() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "ch-round").await?;
        let reg = registry_client(env.registry_addr(), Duration::from_secs(10));
        let running = scripted::controller(
            &client,
            &ns,
            registry_client(env.registry_addr(), Duration::from_secs(10)),
        )
        .hibernation(fast_timing());
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let crs: Api<CocoonHibernation> = Api::namespaced(client.clone(), &ns);
        let vm = create_pod(&pods, &ns, "demo-0").await?;

        crs.create(
            &PostParams::default(),
            &hibernation("demo-0", "demo-0", Desire::Hibernate),
        )
        .await?;
        wait_annotation(&pods, "demo-0", "vm.cocoonstack.io/hibernate", Some("true")).await?;
        let cr = wait_phase(&crs, "demo-0", HibernationPhase::Hibernating).await?;
        assert!(
            cr.finalizers()
                .iter()
                .any(|f| f == "cocoonhibernation.cocoonset.cocoonstack.io/finalizer")
        );
        assert_eq!(
            cr.status.as_ref().map(|s| s.vm_name.as_str()),
            Some(vm.as_str())
        );

        node_reports_hibernated(&pods, &reg, "demo-0", &vm, 1).await?;
        let cr = wait_phase(&crs, "demo-0", HibernationPhase::Hibernated).await?;
        let ready = &cr.status.as_ref().expect("status").conditions[0];
        assert_eq!(
            (
                ready.type_.as_str(),
                ready.status.as_str(),
                ready.reason.as_str()
            ),
            ("Ready", "True", "Done")
        );
        assert_eq!(ready.observed_generation, cr.metadata.generation);
        wait_event(&client, &ns, "demo-0", "Hibernated").await?;
        assert!(
            running.ctx.metrics.render().contains(
                "cocoon_operator_hibernate_phase_duration_seconds_count{result=\"ok\"} 1"
            ),
            "the hibernate phase duration was observed once"
        );

        set_desire(&crs, "demo-0", Desire::Wake).await?;
        wait_annotation(&pods, "demo-0", "vm.cocoonstack.io/hibernate", None).await?;
        wait_phase(&crs, "demo-0", HibernationPhase::Waking).await?;
        assert!(
            reg.has_manifest(&vm, "hibernate").await?,
            "the tag stays until the VM runs"
        );
        node_reports_running(&pods, "demo-0", "vm-woken").await?;
        wait_phase(&crs, "demo-0", HibernationPhase::Active).await?;
        wait_event(&client, &ns, "demo-0", "WokenActive").await?;
        cocoon_testenv::wait_until("the :hibernate tag is dropped", WAIT, || async {
            (!reg.has_manifest(&vm, "hibernate").await.ok()?).then_some(())
        })
        .await?;
        assert!(
            running
                .ctx
                .metrics
                .render()
                .contains("cocoon_operator_wake_phase_duration_seconds_count{result=\"ok\"} 1")
        );

        crs.delete("demo-0", &DeleteParams::default()).await?;
        cocoon_testenv::wait_until("the CR is gone (finalizer removed)", WAIT, || async {
            crs.get_opt("demo-0").await.ok()?.is_none().then_some(())
        })
        .await?;
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

#[tokio::test]
async fn reverse_desire_finishes_the_hibernate_first() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "ch-flip").await?;
        let reg = registry_client(env.registry_addr(), Duration::from_secs(10));
        let _running = scripted::controller(
            &client,
            &ns,
            registry_client(env.registry_addr(), Duration::from_secs(10)),
        )
        .hibernation(fast_timing());
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let crs: Api<CocoonHibernation> = Api::namespaced(client.clone(), &ns);
        let vm = create_pod(&pods, &ns, "demo-0").await?;

        crs.create(
            &PostParams::default(),
            &hibernation("demo-0", "demo-0", Desire::Hibernate),
        )
        .await?;
        wait_phase(&crs, "demo-0", HibernationPhase::Hibernating).await?;
        // Flip while the hibernate is in flight: the annotation must stay until Hibernated.
        set_desire(&crs, "demo-0", Desire::Wake).await?;
        cocoon_testenv::wait_until("the controller saw the new generation", WAIT, || async {
            let cr = crs.get("demo-0").await.ok()?;
            (cr.status?.observed_generation == cr.metadata.generation?).then_some(())
        })
        .await?;
        let pod = pods.get("demo-0").await?;
        assert_eq!(
            pod.annotations()
                .get("vm.cocoonstack.io/hibernate")
                .map(String::as_str),
            Some("true")
        );

        node_reports_hibernated(&pods, &reg, "demo-0", &vm, 1).await?;
        // It reaches Hibernated first, then the reversal clears the annotation.
        wait_event(&client, &ns, "demo-0", "Hibernated").await?;
        wait_annotation(&pods, "demo-0", "vm.cocoonstack.io/hibernate", None).await?;
        node_reports_running(&pods, "demo-0", "vm-back").await?;
        wait_phase(&crs, "demo-0", HibernationPhase::Active).await?;
        cocoon_testenv::wait_until("the :hibernate tag is dropped", WAIT, || async {
            (!reg.has_manifest(&vm, "hibernate").await.ok()?).then_some(())
        })
        .await?;
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

#[tokio::test]
async fn timeout_fails_then_recovers() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "ch-timeout").await?;
        let reg = registry_client(env.registry_addr(), Duration::from_secs(10));
        let timing = Timing {
            hibernate_timeout: Duration::from_secs(3),
            ..fast_timing()
        };
        let _running = scripted::controller(
            &client,
            &ns,
            registry_client(env.registry_addr(), Duration::from_secs(10)),
        )
        .hibernation(timing);
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let crs: Api<CocoonHibernation> = Api::namespaced(client.clone(), &ns);
        let vm = create_pod(&pods, &ns, "demo-0").await?;

        let failed = watch_for_phase(&crs, "demo-0", HibernationPhase::Failed);
        crs.create(
            &PostParams::default(),
            &hibernation("demo-0", "demo-0", Desire::Hibernate),
        )
        .await?;
        // No node agent answers: Failed with the timeout in the Ready condition.
        let cr = tokio::time::timeout(WAIT, failed)
            .await???
            .expect("the CR exists");
        let ready = &cr.status.as_ref().expect("status").conditions[0];
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "Failed")
        );
        assert_eq!(ready.message, "hibernate not confirmed within 3s");
        wait_event(&client, &ns, "demo-0", "HibernateTimedOut").await?;
        // Failed is recoverable: the next pass retries with a fresh deadline.
        wait_event(&client, &ns, "demo-0", "RetryRequested").await?;
        node_reports_hibernated(&pods, &reg, "demo-0", &vm, 1).await?;
        wait_phase(&crs, "demo-0", HibernationPhase::Hibernated).await?;
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

#[tokio::test]
async fn registry_down_until_the_timeout_then_recovery() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "ch-regdown").await?;
        let registry = cocoon_testenv::Registry::start_temp(None).await?;
        let reg = registry_client(registry.addr(), Duration::from_secs(10));
        let timing = Timing {
            hibernate_timeout: Duration::from_secs(4),
            ..fast_timing()
        };
        let running = scripted::controller(&client, &ns, registry_client(registry.addr(), Duration::from_millis(700))).hibernation(timing);
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let crs: Api<CocoonHibernation> = Api::namespaced(client.clone(), &ns);
        let vm = create_pod(&pods, &ns, "demo-0").await?;
        node_reports_hibernated(&pods, &reg, "demo-0", &vm, 1).await?;

        registry.pause()?;
        let failed = watch_for_phase(&crs, "demo-0", HibernationPhase::Failed);
        crs.create(&PostParams::default(), &hibernation("demo-0", "demo-0", Desire::Hibernate)).await?;
        // Probes keep failing; they count against the deadline instead of starving it.
        let cr = tokio::time::timeout(WAIT, failed).await???.expect("the CR exists");
        assert_eq!(cr.status.as_ref().expect("status").conditions[0].message, "hibernate not confirmed within 4s");
        wait_event(&client, &ns, "demo-0", "HibernateTimedOut").await?;
        // Both series exist from the start at 0: each must have counted.
        let counted = |prefix: &str| {
            running.ctx.metrics.render().lines().any(|l| l.starts_with(prefix) && !l.ends_with(" 0"))
        };
        assert!(counted("cocoon_operator_hibernate_phase_duration_seconds_count{result=\"timeout\"}"));
        assert!(counted("cocoon_operator_reconcile_errors_total{controller=\"cocoonhibernation\",kind=\"registry\"}"));

        registry.resume()?;
        wait_phase(&crs, "demo-0", HibernationPhase::Hibernated).await?;
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        registry.shutdown();
        Ok::<_, BoxError>(())
    })
    .await;
}

#[tokio::test]
async fn deletion_collects_the_tag_after_the_last_holder() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "ch-delete").await?;
        let reg = registry_client(env.registry_addr(), Duration::from_secs(10));
        let _running = scripted::controller(
            &client,
            &ns,
            registry_client(env.registry_addr(), Duration::from_secs(10)),
        )
        .hibernation(fast_timing());
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let crs: Api<CocoonHibernation> = Api::namespaced(client.clone(), &ns);
        let vm = create_pod(&pods, &ns, "demo-0").await?;
        node_reports_hibernated(&pods, &reg, "demo-0", &vm, 1).await?;

        // Two CRs on one pod (no webhook installed): both settle Hibernated.
        crs.create(
            &PostParams::default(),
            &hibernation("demo-0", "demo-0", Desire::Hibernate),
        )
        .await?;
        crs.create(
            &PostParams::default(),
            &hibernation("demo-0-dup", "demo-0", Desire::Hibernate),
        )
        .await?;
        wait_phase(&crs, "demo-0", HibernationPhase::Hibernated).await?;
        wait_phase(&crs, "demo-0-dup", HibernationPhase::Hibernated).await?;

        crs.delete("demo-0", &DeleteParams::default()).await?;
        cocoon_testenv::wait_until("first CR gone", WAIT, || async {
            crs.get_opt("demo-0").await.ok()?.is_none().then_some(())
        })
        .await?;
        assert!(
            reg.has_manifest(&vm, "hibernate").await?,
            "another CR still holds the VM: tag kept"
        );

        crs.delete("demo-0-dup", &DeleteParams::default()).await?;
        cocoon_testenv::wait_until("second CR gone", WAIT, || async {
            crs.get_opt("demo-0-dup")
                .await
                .ok()?
                .is_none()
                .then_some(())
        })
        .await?;
        assert!(
            !reg.has_manifest(&vm, "hibernate").await?,
            "the last holder collects the tag"
        );
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

/// A wake that meets a hibernate in flight that someone else started (the node agent wrote
/// `hibernating` and pushed the snapshot, but has not cleared the VM id yet): the VM that
/// still runs is the one the snapshot came from, so the CR waits in `Waking` and keeps the
/// tag until a VM woken from it runs.
#[tokio::test]
async fn wake_keeps_the_tag_while_the_snapshotted_vm_still_runs() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "ch-inflight").await?;
        let reg = registry_client(env.registry_addr(), Duration::from_secs(10));
        let _running = scripted::controller(
            &client,
            &ns,
            registry_client(env.registry_addr(), Duration::from_secs(10)),
        )
        .hibernation(fast_timing());
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let crs: Api<CocoonHibernation> = Api::namespaced(client.clone(), &ns);
        let vm = create_pod(&pods, &ns, "demo-0").await?;
        node_reports_running(&pods, "demo-0", "vm-original").await?;
        let patch = json!({"metadata": {"annotations": {
            "vm.cocoonstack.io/lifecycle-state": "hibernating"}}});
        pods.patch("demo-0", &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        push_snapshot_tag(&reg, &vm, "hibernate").await?;

        crs.create(
            &PostParams::default(),
            &hibernation("demo-0", "demo-0", Desire::Wake),
        )
        .await?;
        wait_phase(&crs, "demo-0", HibernationPhase::Waking).await?;
        assert!(
            reg.has_manifest(&vm, "hibernate").await?,
            "the tag stays while the VM it came from is being removed"
        );

        node_reports_hibernated(&pods, &reg, "demo-0", &vm, 1).await?;
        node_reports_running(&pods, "demo-0", "vm-woken").await?;
        wait_phase(&crs, "demo-0", HibernationPhase::Active).await?;
        cocoon_testenv::wait_until("the :hibernate tag is dropped", WAIT, || async {
            (!reg.has_manifest(&vm, "hibernate").await.ok()?).then_some(())
        })
        .await?;
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}
