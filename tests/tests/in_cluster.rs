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
use cocoon_e2e::{helm, run_ok, stdout, workspace_root};
use cocoon_testenv::{KUBELET_NODE_IP, KUBELET_TAINT_KEY, Kubelet, Shared, TestNode};
use cocoon_testsupport::{Agent, AgentOptions, BoxError};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt as _;

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
        let image = shared_image(kubelet).await.map_err(fail)?;
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

/// The operator image in the kubelet's containerd, built once for the tests of this binary.
async fn shared_image(kubelet: &'static Kubelet) -> Result<String, BoxError> {
    static IMAGE: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
    IMAGE
        .get_or_try_init(|| async move {
            tokio::task::spawn_blocking(move || load_image(kubelet))
                .await
                .map_err(|e| -> BoxError { e.into() })?
        })
        .await
        .cloned()
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

/// `helm test` for real: the chart installed with the operator running as one pod on the
/// kubelet's node (the image above), then the chart's test hook (`cocoon-operator
/// check-metrics` in the same image, under its own ServiceAccount and Role) run by
/// `helm test` against it. It passes: the hook reads the Service and the release's Ready
/// pod, fetches `/metrics` at the pod's address (the node's, [`KUBELET_NODE_IP`]) on the
/// Service's target port and finds this version's build info; `hook-succeeded` then removes
/// the hook pod. With the Service's target port moved to the probe listener it fails, naming
/// the pod's address and its `HTTP 404`; with the Deployment scaled to zero, saying no pod
/// matches.
///
/// What a shared test host needs, and nothing else, is changed for the operator and the hook
/// pod alike: host network and the API server on 127.0.0.1 (the kubelet's node has no pod
/// network and no kube-proxy) and the service-account token volume (the test API server runs
/// without the ServiceAccount admission plugin); for the operator also its listeners on the
/// node address only. The operator Deployment gets them from a post-renderer (kustomize, as
/// Helm documents), the hook pod from the `tests.*` values (Helm does not post-render hooks).
/// Placement (node selector, toleration), image, pull policy, the watched namespace and the
/// unbound webhook-rule policies are ordinary values.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn helm_test_passes_against_the_release_pod_and_fails_without_one() {
    cocoon_testenv::run_test(|env| async move {
        let kubelet = env.kubelet().await?;
        let image = shared_image(kubelet).await?;
        let run = HelmRun::new(env, kubelet, &image)?;
        let outcome = run.scenario().await;
        if outcome.is_err() {
            eprintln!("{}", kubelet.log_tails(&run.ns, 40));
        }
        let cleanup = run.uninstall().await;
        outcome.and(cleanup)
    })
    .await;
}

struct HelmRun {
    env: &'static Shared,
    kubelet: &'static Kubelet,
    ns: String,
    home: tempfile::TempDir,
    values: PathBuf,
    renderer: PathBuf,
    probe_port: u16,
}

impl HelmRun {
    fn new(env: &'static Shared, kubelet: &'static Kubelet, image: &str) -> Result<Self, BoxError> {
        let ns = cocoon_testenv::unique_name("helmt");
        let home = tempfile::tempdir()?;
        let (repo, tag) = image
            .rsplit_once(':')
            .ok_or_else(|| format!("image reference {image} has no tag"))?;
        let ports = cocoon_testenv::free_ports(2)?;
        let (metrics, probe) = (ports[0], ports[1]);
        let values = home.path().join("values.yaml");
        let (api_env, volumes, mounts) = api_access(env);
        std::fs::write(
            &values,
            format!(
                r#"namespace: {{name: {ns}}}
namePrefix: {ns}-
replicas: 1
crds: {{create: false}}
image: {{repository: "{repo}", tag: "{tag}", pullPolicy: Never}}
watchNamespace: {ns}
registry: {{base: "{registry}"}}
metrics: {{port: {metrics}}}
probes: {{port: {probe}}}
nodeSelector: {{kubernetes.io/hostname: {node}}}
tolerations: [{{key: {taint}, operator: Exists, effect: NoSchedule}}]
admissionPolicies: {{namespaceSelector: {{matchLabels: {{cocoon-helm-test: {ns}}}}}}}
tests:
  timeout: 20s
  hostNetwork: true
  extraEnv: {api_env}
  extraVolumes: {volumes}
  extraVolumeMounts: {mounts}
"#,
                registry = env.registry_addr(),
                node = kubelet.node_name(),
                taint = KUBELET_TAINT_KEY,
            ),
        )?;
        let renderer = write_post_renderer(home.path(), env, &ns, metrics, probe)?;
        Ok(HelmRun {
            env,
            kubelet,
            ns,
            home,
            values,
            renderer,
            probe_port: probe,
        })
    }

    fn helm(&self) -> Command {
        let mut cmd = helm(self.home.path());
        cmd.arg("--kubeconfig").arg(self.env.kubeconfig_path());
        cmd
    }

    /// `helm test` of the release: its exit status and combined output.
    async fn helm_test(&self) -> Result<(bool, String), BoxError> {
        let mut cmd = self.helm();
        cmd.args([
            "test",
            &self.ns,
            "--namespace",
            "default",
            "--timeout",
            "2m",
        ]);
        let out = tokio::task::spawn_blocking(move || cmd.output()).await??;
        let text = format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
        Ok((out.status.success(), text))
    }

    async fn scenario(&self) -> Result<(), BoxError> {
        let mut install = self.helm();
        install
            .args(["install", &self.ns])
            .arg(workspace_root().join("charts/cocoon"))
            .args(["--namespace", "default", "--values"])
            .arg(&self.values)
            .arg("--post-renderer")
            .arg(&self.renderer)
            .args(["--wait", "--timeout", "3m"]);
        let out = tokio::task::spawn_blocking(move || install.output()).await??;
        ensure(out.status.success(), || {
            format!("helm install: {}", String::from_utf8_lossy(&out.stderr))
        })?;

        let client = self.env.client()?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), &self.ns);
        let running = running_pods(&pods).await?;
        ensure(running.len() == 1, || {
            format!("one operator pod: {running:?}")
        })?;
        let operator = &running[0];
        let hook = format!("{}-cocoon-operator-test-metrics", self.ns);
        let service = format!("Service {ns}/{ns}-cocoon-operator-metrics", ns = self.ns);

        // The hook runs under its own ServiceAccount, reads the Service and the pods it selects,
        // finds the release's operator pod Ready at its address (the kubelet node's) and fetches
        // `/metrics` from the Service's target port there; it exits 0 only when the build info
        // is its own version. (Its log cannot be read here: `hook-succeeded` deletes the pod
        // before Helm 3.22's `helm test --logs` asks for it.)
        let (ok, out) = self.helm_test().await?;
        ensure(ok && out.contains("Phase:          Succeeded"), || {
            format!("helm test fails with the operator running:\n{out}")
        })?;
        // hook-succeeded: the passed hook's pod is removed.
        cocoon_testenv::wait_until("the passed hook pod is deleted", WAIT, || async {
            pods.get_opt(&hook).await.ok()?.is_none().then_some(())
        })
        .await?;

        // The Service's target port moved to the probe listener, which has no `/metrics`: the
        // fetch is real, so the check fails there, naming the pod's address and the answer.
        let services: Api<Service> = Api::namespaced(client.clone(), &self.ns);
        let svc_name = format!("{}-cocoon-operator-metrics", self.ns);
        let mut svc = services.get(&svc_name).await?;
        let spec = svc.spec.as_mut().ok_or("the metrics Service has no spec")?;
        for port in spec.ports.iter_mut().flatten() {
            port.target_port = Some(IntOrString::Int(i32::from(self.probe_port)));
        }
        services
            .replace(&svc_name, &PostParams::default(), &svc)
            .await?;
        let (ok, out) = self.helm_test().await?;
        ensure(!ok, || {
            format!("helm test passes with the Service routed to the probe port:\n{out}")
        })?;
        self.expect_failed_hook(&pods, &hook).await?;
        let log = self.hook_log(&hook);
        let seen = format!(
            "{KUBELET_NODE_IP}:{} (pod {operator}): HTTP 404",
            self.probe_port
        );
        ensure(log.contains(&seen), || {
            format!("the check reports {seen:?}:\n{log}")
        })?;

        // No operator pod: the Service selects none, and the check says so.
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), &self.ns);
        deployments
            .patch(
                &format!("{}-cocoon-operator", self.ns),
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": 0}})),
            )
            .await?;
        cocoon_testenv::wait_until("the operator pod is gone", WAIT, || async {
            let left = pods
                .list(&ListParams::default().labels(POD_SELECTOR))
                .await
                .ok()?;
            left.items.is_empty().then_some(())
        })
        .await?;
        let (ok, out) = self.helm_test().await?;
        ensure(!ok, || {
            format!("helm test passes with no operator running:\n{out}")
        })?;
        self.expect_failed_hook(&pods, &hook).await?;
        let log = self.hook_log(&hook);
        let seen = format!(
            "{service}: no ready pod for port \"metrics\" (0 pods match \
             app.kubernetes.io/name=cocoon-operator)"
        );
        ensure(log.contains(&seen), || {
            format!("the check reports {seen:?}:\n{log}")
        })?;
        Ok(())
    }

    /// The container log of the hook pod (the kubelet's log sections of that pod only).
    fn hook_log(&self, hook: &str) -> String {
        let all = self.kubelet.log_tails(&self.ns, 40);
        let header = format!("==> pod log {}_{hook}_", self.ns);
        all.split("==> ")
            .filter(|section| format!("==> {section}").starts_with(&header))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The hook pod `helm test` left behind (hook-succeeded keeps a failed one) is Failed.
    async fn expect_failed_hook(&self, pods: &Api<Pod>, hook: &str) -> Result<(), BoxError> {
        let failed = pods.get(hook).await?;
        let phase = failed.status.as_ref().and_then(|s| s.phase.clone());
        ensure(phase.as_deref() == Some("Failed"), || {
            format!("{hook} is {phase:?}, not Failed")
        })
    }

    async fn uninstall(self) -> Result<(), BoxError> {
        let mut cmd = self.helm();
        cmd.args(["uninstall", &self.ns, "--namespace", "default", "--wait"]);
        let out = tokio::task::spawn_blocking(move || cmd.output()).await??;
        let client = self.env.client()?;
        cocoon_testenv::delete_namespace(&client, &self.ns).await?;
        if !out.status.success() {
            return Err(format!(
                "helm uninstall: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )
            .into());
        }
        Ok(())
    }
}

/// What a pod here needs to reach the API server with its service-account token: the API
/// server's address on 127.0.0.1 (no kube-proxy) and the token volume (no ServiceAccount
/// admission plugin). Returns (env, volumes, volume mounts).
fn api_access(env: &Shared) -> (Value, Value, Value) {
    let api_port = env.client_config().cluster_url.port_u16().unwrap_or(443);
    (
        json!([
            {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
            {"name": "KUBERNETES_SERVICE_PORT", "value": api_port.to_string()},
        ]),
        json!([{
            "name": "kube-api-access",
            "projected": {"sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
            ]},
        }]),
        json!([{
            "name": "kube-api-access",
            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
            "readOnly": true,
        }]),
    )
}

/// Writes the post-renderer (a script running `kubectl kustomize` over what Helm renders) and
/// its kustomization, which patches the operator Deployment; returns the script. (Helm 3.22
/// does not post-render hooks: the test pod gets the same through `tests.*` values.)
fn write_post_renderer(
    dir: &Path,
    env: &Shared,
    ns: &str,
    metrics: u16,
    probe: u16,
) -> Result<PathBuf, BoxError> {
    let kdir = dir.join("post-render");
    std::fs::create_dir_all(&kdir)?;
    let (api_env, volumes, mounts) = api_access(env);
    let deployment = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": format!("{ns}-cocoon-operator"), "namespace": ns},
        "spec": {"template": {"spec": {
            "hostNetwork": true,
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "manager",
                "args": [
                    "run",
                    format!("--metrics-bind-address={KUBELET_NODE_IP}:{metrics}"),
                    format!("--health-probe-bind-address={KUBELET_NODE_IP}:{probe}"),
                    "--leader-elect=true",
                ],
                "env": api_env,
                "volumeMounts": mounts,
            }],
            "volumes": volumes,
        }}},
    });
    // YAML is a superset of JSON.
    std::fs::write(kdir.join("deployment.yaml"), deployment.to_string())?;
    std::fs::write(
        kdir.join("kustomization.yaml"),
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [all.yaml]\n\
         patches:\n- path: deployment.yaml\n",
    )?;
    let script = dir.join("post-render.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nset -e\ncat > '{dir}/all.yaml'\nexec '{kubectl}' kustomize '{dir}'\n",
            dir = kdir.display(),
            kubectl = env.kubectl_bin().display(),
        ),
    )?;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
    Ok(script)
}

/// A failed check as an error (not a panic), so the caller still cleans up.
fn ensure(ok: bool, what: impl FnOnce() -> String) -> Result<(), BoxError> {
    if ok { Ok(()) } else { Err(what().into()) }
}
