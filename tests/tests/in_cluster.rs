//! The shipped manifests run as pods: `kubectl apply -k` of manifests/ (through an overlay, see
//! below) onto a real kubelet node of the test env (`Shared::kubelet`: upstream kubelet,
//! Debian containerd + runc), with the operator image scripts/image.sh builds, imported into
//! containerd. Two replicas elect one leader through the shipped RBAC and the pod's own
//! service-account token; that leader suspends and resumes a CocoonSet whose VMs run on real
//! node agents (in this process, on the simulated runtime, like the other agent tests). Then
//! the leader pod is killed, the other replica takes the Lease over, and a further
//! suspend/resume works.
//!
//! The overlay changes only what a shared test host needs, each patch said why:
//! - `namespace` + `nameSuffix`: a namespace and cluster objects of this run's own, so runs
//!   and the RBAC tests (which audit `cocoon-system`) do not meet. The CRDs keep their names.
//! - `hostNetwork: true` and `KUBERNETES_SERVICE_HOST/PORT` = the API server on 127.0.0.1: the
//!   kubelet node has no pod network (nothing may leave loopback here) and no kube-proxy.
//! - metrics and probe listeners on `127.0.0.1:0`, no declared ports, no HTTP probes: two
//!   replicas sharing the host's network cannot both bind :8080/:8081.
//! - the service-account token volume spelled out: the test env runs the API server without
//!   the ServiceAccount admission plugin, which would otherwise add exactly this volume.
//! - node selector and toleration for the kubelet's node, `imagePullPolicy: Never` (nothing
//!   can be pulled here), the env's registry, `WATCH_NAMESPACE`, shorter leader timings.
//! - no bindings for the webhook-rule policies (admission/policies.yaml): bound for every
//!   namespace they would refuse what other tests on the same control plane create on purpose;
//!   tests/tests/admission_policies.rs proves them.

use std::path::{Component, Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use cocoon_api::crd::set::{AgentMode, CocoonSet, CocoonSetPhase, CocoonSetSpec};
use cocoon_e2e::{run_ok, stdout, workspace_root};
use cocoon_testenv::{KUBELET_TAINT_KEY, Kubelet, Shared, TestNode};
use cocoon_testsupport::{Agent, AgentOptions, BoxError};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(120);
const SET: &str = "demo";
/// The shipped Deployment's name and the Lease its replicas elect a leader with.
const DEPLOYMENT: &str = "cocoon-operator";
const LEASE: &str = "cocoon-operator.cocoonset.cocoonstack.io";
const POD_SELECTOR: &str = "app.kubernetes.io/name=cocoon-operator";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shipped_deployment_runs_as_pods_and_fails_over() {
    cocoon_testenv::run_test(|env| async move {
        let kubelet = env.kubelet().await?;
        let run = InCluster::deploy(env, kubelet).await;
        match run {
            Ok(run) => {
                let outcome = run.scenario().await;
                if outcome.is_err() {
                    eprintln!("{}", kubelet.log_tails(&run.ns, 40));
                }
                let cleanup = run.teardown().await;
                outcome.and(cleanup)
            }
            Err((e, ns)) => {
                eprintln!("{}", kubelet.log_tails(&ns, 40));
                let _ = delete_run_objects(env, &ns).await;
                Err(e)
            }
        }
    })
    .await;
}

struct InCluster {
    env: &'static Shared,
    ns: String,
    suffix: String,
    node: TestNode,
    agent: Agent,
    _root: tempfile::TempDir,
    _overlay: tempfile::TempDir,
    sets: Api<CocoonSet>,
    pods: Api<Pod>,
    leases: Api<Lease>,
    pool: String,
}

impl InCluster {
    /// Builds and loads the image, applies the overlay, waits for two running replicas and a
    /// leader among them, and starts one agent node for the set's VMs.
    async fn deploy(
        env: &'static Shared,
        kubelet: &'static Kubelet,
    ) -> Result<InCluster, (BoxError, String)> {
        let suffix = cocoon_testenv::unique_name("incl");
        // The manifests' namespace, renamed by the overlay (and so the suffix is the name).
        let ns = suffix.clone();
        let fail = |e: BoxError| (e, ns.clone());
        let image = tokio::task::spawn_blocking(move || load_image(kubelet))
            .await
            .map_err(|e| fail(e.into()))?
            .map_err(fail)?;
        let overlay = tempfile::tempdir().map_err(|e| fail(e.into()))?;
        let api = env.client_config().cluster_url.clone();
        let api_port = api.port_u16().unwrap_or(443);
        write_overlay(
            overlay.path(),
            &OverlayParams {
                namespace: &ns,
                suffix: &suffix,
                image: &image,
                node: kubelet.node_name(),
                api_port,
                registry: env.registry_addr(),
            },
        )
        .map_err(fail)?;
        let out = env
            .kubectl()
            .args(["apply", "-k"])
            .arg(overlay.path())
            .output()
            .map_err(|e| fail(e.into()))?;
        if !out.status.success() {
            return Err(fail(
                format!(
                    "kubectl apply -k: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                )
                .into(),
            ));
        }

        let client = env.client().map_err(|e| fail(e.into()))?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
        let name = format!("{DEPLOYMENT}-{suffix}");
        cocoon_testenv::wait_until("two operator replicas running", WAIT, || async {
            let d = deployments.get_opt(&name).await.ok().flatten()?;
            let st = d.status?;
            (st.ready_replicas == Some(2) && st.updated_replicas == Some(2)).then_some(())
        })
        .await
        .map_err(|e| fail(e.into()))?;
        let running = running_pods(&pods).await.map_err(fail)?;
        assert_eq!(running.len(), 2, "two replicas: {running:?}");
        for p in &pods
            .list(&ListParams::default())
            .await
            .map_err(|e| fail(e.into()))?
            .items
        {
            assert_eq!(
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()),
                Some(kubelet.node_name()),
                "{} runs on the kubelet's node",
                p.name_any()
            );
        }
        let leader = wait_leader(&leases, &pods, None).await.map_err(fail)?;
        assert!(running.contains(&leader), "{leader} is one of {running:?}");

        let pool = cocoon_testenv::unique_name("incl-pool");
        let node_name = cocoon_testenv::unique_name("incl-node");
        let node = TestNode::in_pool(&client, &node_name, &pool)
            .await
            .map_err(|e| fail(e.into()))?;
        node.wait_schedulable(WAIT)
            .await
            .map_err(|e| fail(e.into()))?;
        let root = tempfile::tempdir().map_err(|e| fail(e.into()))?;
        let agent = Agent::start(
            client.clone(),
            &node_name,
            root.path(),
            env.registry_addr(),
            AgentOptions::fast(),
        )
        .await
        .map_err(fail)?;
        Ok(InCluster {
            env,
            sets: Api::namespaced(client, &ns),
            ns,
            suffix,
            node,
            agent,
            _root: root,
            _overlay: overlay,
            pods,
            leases,
            pool,
        })
    }

    async fn scenario(&self) -> Result<(), BoxError> {
        let mut spec = CocoonSetSpec::with_image("ubuntu:24.04");
        spec.node_pool = self.pool.clone();
        spec.agent.mode = AgentMode::Run;
        spec.agent.replicas = 1;
        self.sets
            .create(&PostParams::default(), &CocoonSet::new(SET, spec))
            .await?;
        self.wait_phase(
            CocoonSetPhase::Running,
            "Running 2/2 under the first leader",
        )
        .await?;
        assert_eq!(self.agent.vms().await.len(), 2, "main and sub-agent live");
        self.suspend_resume("first leader").await?;

        let first = wait_leader(&self.leases, &self.pods, None).await?;
        let transitions = lease_transitions(&self.leases).await;
        self.pods
            .delete(&first, &DeleteParams::default().grace_period(0))
            .await?;
        let second = wait_leader(&self.leases, &self.pods, Some(&first)).await?;
        assert_ne!(second, first, "another replica leads");
        assert!(
            lease_transitions(&self.leases).await > transitions,
            "the Lease records the takeover"
        );
        self.suspend_resume("second leader").await?;
        assert_eq!(
            wait_leader(&self.leases, &self.pods, None).await?,
            second,
            "the second leader did that work and still holds the Lease"
        );
        Ok(())
    }

    /// Suspends the set (its VMs hibernate: none left live) and resumes it (both back).
    async fn suspend_resume(&self, who: &str) -> Result<(), BoxError> {
        self.patch_suspend(true).await?;
        self.wait_phase(
            CocoonSetPhase::Suspended,
            &format!("Suspended by the {who}"),
        )
        .await?;
        assert_eq!(
            self.agent.vms().await.len(),
            0,
            "every VM hibernated ({who})"
        );
        self.patch_suspend(false).await?;
        self.wait_phase(CocoonSetPhase::Running, &format!("Running again ({who})"))
            .await?;
        assert_eq!(self.agent.vms().await.len(), 2, "both VMs woke ({who})");
        Ok(())
    }

    async fn patch_suspend(&self, on: bool) -> Result<(), BoxError> {
        self.sets
            .patch(
                SET,
                &PatchParams::default(),
                &Patch::Merge(&json!({ "spec": { "suspend": on } })),
            )
            .await?;
        Ok(())
    }

    /// `phase` at the set's current generation (and, for Running, both agents ready).
    async fn wait_phase(&self, phase: CocoonSetPhase, what: &str) -> Result<(), BoxError> {
        cocoon_testsupport::wait_set(&self.sets, SET, what, WAIT, |cs| {
            cs.status.as_ref().is_some_and(|s| {
                s.phase == Some(phase)
                    && Some(s.observed_generation) == cs.metadata.generation
                    && (phase != CocoonSetPhase::Running || s.ready_agents == 2)
            })
        })
        .await?;
        Ok(())
    }

    /// Deletes the set while the operator still runs (it holds the finalizer), then the
    /// namespace and this run's cluster objects; never the shared CRDs.
    async fn teardown(mut self) -> Result<(), BoxError> {
        let _ = self.sets.delete(SET, &DeleteParams::default()).await;
        let gone = cocoon_testenv::wait_until("the set is gone", WAIT, || async {
            matches!(self.sets.get_opt(SET).await, Ok(None)).then_some(())
        })
        .await;
        self.agent.stop().await;
        delete_run_objects(self.env, &self.suffix).await?;
        drop(self.node);
        gone?;
        Ok(())
    }
}

/// Deletes what the overlay made for run `suffix` (its namespace has the same name), except the
/// CRDs, which other tests share.
async fn delete_run_objects(env: &Shared, suffix: &str) -> Result<(), BoxError> {
    run_ok(env.kubectl().args([
        "delete",
        "--ignore-not-found",
        "--wait=false",
        &format!("clusterrolebinding/cocoon-operator-{suffix}"),
        &format!("clusterrole/cocoon-operator-{suffix}"),
        &format!("clusterrole/cocoon-node-{suffix}"),
        &format!("validatingadmissionpolicybinding/cocoon-node-pods-{suffix}"),
        &format!("validatingadmissionpolicy/cocoon-node-pods-{suffix}"),
        &format!("validatingadmissionpolicybinding/cocoon-node-self-{suffix}"),
        &format!("validatingadmissionpolicy/cocoon-node-self-{suffix}"),
    ]));
    let client = env.client()?;
    cocoon_testenv::delete_namespace(&client, suffix).await?;
    Ok(())
}

/// Builds the image (scripts/image.sh, under a name of this run's own), saves it with podman
/// and imports it into the kubelet's containerd; returns its reference.
fn load_image(kubelet: &Kubelet) -> Result<String, BoxError> {
    let root = workspace_root();
    let name = format!(
        "localhost/{}/cocoon-operator-rs",
        cocoon_testenv::unique_name("incl")
    );
    let out = run_ok(
        Command::new(root.join("scripts/image.sh"))
            .args(["--name", &name])
            .current_dir(&root),
    );
    let refs: Vec<String> = stdout(&out).lines().map(str::to_string).collect();
    let image = refs.last().ok_or("image.sh printed no reference")?.clone();
    let dir = tempfile::tempdir()?;
    let archive = dir.path().join("operator.tar");
    run_ok(
        Command::new("podman")
            .args(["save", "--format", "docker-archive", "-o"])
            .arg(&archive)
            .arg(&image),
    );
    kubelet.import_image(&archive)?;
    let mut rmi = Command::new("podman");
    rmi.arg("rmi").args(&refs);
    run_ok(&mut rmi);
    Ok(image)
}

struct OverlayParams<'a> {
    namespace: &'a str,
    suffix: &'a str,
    image: &'a str,
    node: &'a str,
    api_port: u16,
    registry: &'a str,
}

fn write_overlay(dir: &Path, p: &OverlayParams<'_>) -> Result<(), BoxError> {
    let (image_name, image_tag) = p
        .image
        .rsplit_once(':')
        .ok_or_else(|| format!("image reference {} has no tag", p.image))?;
    // kustomize takes bases by relative path only.
    let base = relative_to(dir, &workspace_root().join("manifests"))?;
    let yaml = format!(
        r#"apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: {ns}
nameSuffix: -{suffix}
resources:
- {base}
images:
- name: ghcr.io/cocoonstack/cocoon-operator-rs
  newName: {image_name}
  newTag: {image_tag}
patches:
- patch: |
    $patch: delete
    apiVersion: admissionregistration.k8s.io/v1
    kind: ValidatingAdmissionPolicyBinding
    metadata:
      name: cocoon-hibernation-name
- patch: |
    $patch: delete
    apiVersion: admissionregistration.k8s.io/v1
    kind: ValidatingAdmissionPolicyBinding
    metadata:
      name: cocoon-pod-owner
- patch: |
    $patch: delete
    apiVersion: admissionregistration.k8s.io/v1
    kind: ValidatingAdmissionPolicyBinding
    metadata:
      name: cocoon-set-spec
- target: {{kind: Deployment, name: cocoon-operator}}
  patch: |
    - op: add
      path: /spec/template/spec/hostNetwork
      value: true
    - op: add
      path: /spec/template/spec/nodeSelector
      value: {{kubernetes.io/hostname: {node}}}
    - op: add
      path: /spec/template/spec/tolerations
      value: [{{key: {taint}, operator: Exists, effect: NoSchedule}}]
    - op: remove
      path: /spec/template/spec/containers/0/ports
    - op: remove
      path: /spec/template/spec/containers/0/livenessProbe
    - op: remove
      path: /spec/template/spec/containers/0/readinessProbe
    - op: add
      path: /spec/template/spec/containers/0/imagePullPolicy
      value: Never
    - op: replace
      path: /spec/template/spec/containers/0/args
      value: [run, --metrics-bind-address=127.0.0.1:0, --health-probe-bind-address=127.0.0.1:0, --leader-elect=true]
    - op: replace
      path: /spec/template/spec/containers/0/env/0
      value: {{name: OCI_REGISTRY, value: "{registry}"}}
    - op: add
      path: /spec/template/spec/containers/0/env/-
      value: {{name: KUBERNETES_SERVICE_HOST, value: 127.0.0.1}}
    - op: add
      path: /spec/template/spec/containers/0/env/-
      value: {{name: KUBERNETES_SERVICE_PORT, value: "{api_port}"}}
    - op: add
      path: /spec/template/spec/containers/0/env/-
      value: {{name: WATCH_NAMESPACE, value: {ns}}}
    - op: add
      path: /spec/template/spec/containers/0/env/-
      value: {{name: COCOON_REQUEUE_INTERVAL, value: 1s}}
    - op: add
      path: /spec/template/spec/containers/0/env/-
      value: {{name: LEADER_ELECT_LEASE_DURATION, value: 10s}}
    - op: add
      path: /spec/template/spec/containers/0/env/-
      value: {{name: LEADER_ELECT_RENEW_DEADLINE, value: 6s}}
    - op: add
      path: /spec/template/spec/containers/0/env/-
      value: {{name: LEADER_ELECT_RETRY_PERIOD, value: 1s}}
    - op: add
      path: /spec/template/spec/automountServiceAccountToken
      value: false
    - op: add
      path: /spec/template/spec/volumes
      value:
      - name: kube-api-access
        projected:
          sources:
          - serviceAccountToken: {{path: token, expirationSeconds: 3607}}
          - configMap: {{name: kube-root-ca.crt, items: [{{key: ca.crt, path: ca.crt}}]}}
          - downwardAPI: {{items: [{{path: namespace, fieldRef: {{fieldPath: metadata.namespace}}}}]}}
    - op: add
      path: /spec/template/spec/containers/0/volumeMounts
      value: [{{name: kube-api-access, mountPath: /var/run/secrets/kubernetes.io/serviceaccount, readOnly: true}}]
"#,
        ns = p.namespace,
        suffix = p.suffix,
        base = base.display(),
        node = p.node,
        taint = KUBELET_TAINT_KEY,
        registry = p.registry,
        api_port = p.api_port,
    );
    std::fs::write(dir.join("kustomization.yaml"), yaml)?;
    Ok(())
}

/// `target` relative to `from` (both absolute): `../..` up to the root, then down.
fn relative_to(from: &Path, target: &Path) -> Result<PathBuf, BoxError> {
    let from = from.canonicalize()?;
    let target = target.canonicalize()?;
    let mut out = PathBuf::new();
    for c in from.components() {
        if matches!(c, Component::Normal(_)) {
            out.push("..");
        }
    }
    for c in target.components() {
        if let Component::Normal(part) = c {
            out.push(part);
        }
    }
    Ok(out)
}

/// Names of the operator pods that are Running and not being deleted.
async fn running_pods(pods: &Api<Pod>) -> Result<Vec<String>, BoxError> {
    Ok(pods
        .list(&ListParams::default().labels(POD_SELECTOR))
        .await?
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .map(|p| p.name_any())
        .collect())
}

/// Waits until the Lease is held by a running operator pod other than `not` and returns it.
async fn wait_leader(
    leases: &Api<Lease>,
    pods: &Api<Pod>,
    not: Option<&str>,
) -> Result<String, BoxError> {
    let what = match not {
        Some(old) => format!("a leader other than {old}"),
        None => "a leader".to_string(),
    };
    Ok(cocoon_testenv::wait_until(&what, WAIT, || async {
        let lease = leases.get_opt(LEASE).await.ok().flatten()?;
        let holder = lease.spec?.holder_identity?;
        if Some(holder.as_str()) == not {
            return None;
        }
        let running = running_pods(pods).await.ok()?;
        running.contains(&holder).then_some(holder)
    })
    .await?)
}

async fn lease_transitions(leases: &Api<Lease>) -> i32 {
    leases
        .get_opt(LEASE)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec?.lease_transitions)
        .unwrap_or(0)
}
