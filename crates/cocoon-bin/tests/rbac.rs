//! The shipped RBAC is exactly what the operator needs. The install manifests are applied to
//! the real control plane with `kubectl apply -k` (without the Deployment), and the real
//! `cocoon-operator run` binary runs with a token of its ServiceAccount, leader election on,
//! through create, retain suspend and resume, release suspend and a wake that first finds no
//! capacity, a migration, a
//! CocoonHibernation hibernate/wake/delete, a CocoonCheckpoint's accept and delete, and set deletion, with real node agents on the
//! simulated runtime. The API server audits every request of that ServiceAccount; the test then
//! proves that nothing the operator called was forbidden and that every verb its roles grant was
//! called — the one exception being `cocoonsets/finalizers`, which is checked by admission (not
//! called) and is proven needed by a ServiceAccount without it being refused. (The secure
//! metrics' TokenReview and SubjectAccessReview are called by one scrape of `/metrics`.) The
//! node agents run the same way in ServiceAccount mode (one ServiceAccount per node in
//! `cocoon-nodes`, bound to the `cocoon-node` role, held to its node by the shipped admission
//! policies): none of their requests is refused and every verb of the role is called.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use cocoon_api::crd::checkpoint::{
    CheckpointPhase, CheckpointSource, CocoonCheckpoint, CocoonCheckpointSpec, NameRef,
};
use cocoon_api::crd::hibernation::{
    CocoonHibernation, CocoonHibernationSpec, Desire, HibernationPhase, PodRef,
};
use cocoon_api::crd::set::{
    AgentMode, CocoonSet, CocoonSetPhase, CocoonSetSpec, HibernatePolicy, SnapshotPolicy,
};
use cocoon_testenv::{Shared, unique_name};
use cocoon_testsupport::binaries::sim_node_command;
use cocoon_testsupport::{BoxError, node_of, wait_set};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Container, Node, Pod, PodSpec};
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(120);
const OPERATOR_SA: &str = "system:serviceaccount:cocoon-system:cocoon-operator";
/// Node agents in ServiceAccount mode: one ServiceAccount per node, named like the Node, in
/// this namespace (manifests/node/rbac.yaml; manifests/node/admission.yaml holds each to its
/// node).
const NODE_SA_NAMESPACE: &str = "cocoon-nodes";
const POOL_LABEL: &str = "cocoonstack.io/pool";
const GROUP: &str = "cocoonset.cocoonstack.io";

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn run_kubectl(env: &Shared, args: &[&str]) -> Result<String, BoxError> {
    let out = env.kubectl().args(args).output()?;
    if !out.status.success() {
        return Err(format!("kubectl {}: {}", args.join(" "), text(&out.stderr)).into());
    }
    Ok(text(&out.stdout))
}

/// `kubectl apply -k` of the shipped manifests through an overlay that leaves out the operator
/// Deployment (its pods would have no node to run on here, and its presence would tell other
/// tests sharing this cluster that an operator is installed, even when this test fails midway:
/// `kubectl cocoon version` reads its image) and the bindings of the webhook-rule policies
/// (manifests/admission/policies.yaml): bound for every namespace they would refuse what other tests on the same control plane create on purpose (a
/// toolbox named like a slot, decoy CocoonHibernations); tests/tests/admission_policies.rs
/// proves them.
fn apply_manifests(env: &Shared, dir: &Path) -> Result<(), BoxError> {
    let manifests = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../manifests");
    // kustomize takes only relative paths to a base: climb from the overlay to `/`.
    let overlay = dir.canonicalize()?;
    let up = "../".repeat(overlay.components().count() - 1);
    let manifests = format!(
        "{up}{}",
        manifests
            .canonicalize()?
            .display()
            .to_string()
            .trim_start_matches('/')
    );
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- {}\npatches:\n- patch: |\n    $patch: delete\n    apiVersion: apps/v1\n    kind: Deployment\n    metadata:\n      name: cocoon-operator\n      namespace: cocoon-system\n{}",
            manifests,
            ["cocoon-hibernation-name", "cocoon-pod-owner", "cocoon-set-spec"]
                .map(|b| format!(
                    "- patch: |\n    $patch: delete\n    apiVersion: admissionregistration.k8s.io/v1\n    kind: ValidatingAdmissionPolicyBinding\n    metadata:\n      name: {b}\n"
                ))
                .concat()
        ),
    )?;
    run_kubectl(env, &["apply", "-k", &dir.to_string_lossy()])?;
    Ok(())
}

/// A kubeconfig for the same cluster that authenticates with a token of `sa` in cocoon-system.
fn service_account_kubeconfig(env: &Shared, sa: &str, dir: &Path) -> Result<PathBuf, BoxError> {
    Ok(env.service_account_kubeconfig("cocoon-system", sa, "2h", dir)?)
}

/// Every (group, resource, verb) a list of rules grants (no wildcards are expected).
fn granted(rules: &[PolicyRule]) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for r in rules {
        for g in r.api_groups.iter().flatten() {
            for res in r.resources.iter().flatten() {
                for v in &r.verbs {
                    assert!(
                        g != "*" && res != "*" && v != "*",
                        "wildcard in the operator's RBAC: {r:?}"
                    );
                    out.insert((g.clone(), res.clone(), v.clone()));
                }
            }
        }
    }
    out
}

type Call = (String, String, String);

/// The distinct (group, resource, verb) `user` called after its first `skip` records; panics
/// (failing the test) on any request that was refused.
fn calls_since(
    audit: &cocoon_testenv::AuditLog,
    user: &str,
    skip: usize,
) -> Result<BTreeSet<Call>, BoxError> {
    let records = audit.records_of(user)?.split_off(skip);
    let forbidden: Vec<_> = records.iter().filter(|r| r.code == 403).collect();
    assert!(
        forbidden.is_empty(),
        "{user}: requests the shipped RBAC refused: {forbidden:#?}"
    );
    Ok(records
        .into_iter()
        .map(|r| (r.api_group, r.resource, r.verb))
        .collect())
}

/// Every grant was called (but the listed exceptions) and every call was granted.
fn exactly_what_is_called(
    user: &str,
    called: &BTreeSet<Call>,
    grants: &BTreeSet<Call>,
    not_called: &[Call],
) {
    assert!(!called.is_empty(), "no audited request of {user}");
    let unused: Vec<_> = grants
        .iter()
        .filter(|g| !not_called.contains(g) && !called.contains(*g))
        .collect();
    assert!(
        unused.is_empty(),
        "{user}: granted but never called: {unused:#?}\ncalled: {called:#?}"
    );
    let ungranted: Vec<_> = called.iter().filter(|c| !grants.contains(*c)).collect();
    assert!(
        ungranted.is_empty(),
        "{user}: called without a grant (another role?): {ungranted:#?}"
    );
}

/// The real node agent binary for `name` on the simulated runtime rooted at `root`.
fn spawn_node_agent(
    env: &Shared,
    kubeconfig: &Path,
    name: &str,
    pool: &str,
    root: &Path,
) -> Result<tokio::process::Child, BoxError> {
    Ok(sim_node_command(
        env!("CARGO_BIN_EXE_cocoon-operator"),
        kubeconfig,
        env.registry_addr(),
        name,
        pool,
        root,
    )
    .env("VK_SIM_IMAGES", "ubuntu:24.04")
    // The CA of the API server's kubelet client certificate (`kubectl logs`).
    .env(
        "VK_CLIENT_CA_FILE",
        env.pki_dir().ok_or("PKI dir unknown")?.join("ca.crt"),
    )
    .stdout(Stdio::null())
    .stderr(Stdio::inherit())
    .spawn()?)
}

/// The HTTP status of a HEAD of `<repo>:<tag>` on the test registry (plain HTTP).
fn manifest_status(env: &Shared, repo: &str, tag: &str) -> Result<String, BoxError> {
    let addr = env.registry_addr();
    let (host, prefix) = addr.split_once('/').unwrap_or((addr, ""));
    let path = if prefix.is_empty() {
        repo.to_owned()
    } else {
        format!("{prefix}/{repo}")
    };
    let out = std::process::Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-I", "-H"])
        .arg("Accept: application/vnd.oci.image.manifest.v1+json")
        .arg(format!("http://{host}/v2/{path}/manifests/{tag}"))
        .output()?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// SIGTERM, then wait for the exit (a graceful stop).
async fn terminate(child: &mut tokio::process::Child) -> Result<(), BoxError> {
    if let Some(pid) = child.id() {
        let status = tokio::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await?;
        assert!(status.success(), "kill -TERM {pid}");
    }
    tokio::time::timeout(WAIT, child.wait()).await??;
    Ok(())
}

/// The status of `GET /metrics` on 127.0.0.1:`port` with the bearer `token`.
async fn scrape_status(port: u16, token: &str) -> Result<u16, BoxError> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let req = format!("GET /metrics HTTP/1.0\r\nAuthorization: Bearer {token}\r\n\r\n");
    conn.write_all(req.as_bytes()).await?;
    let mut raw = Vec::new();
    conn.read_to_end(&mut raw).await?;
    let head = String::from_utf8_lossy(&raw);
    head.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no HTTP status in {head:?}").into())
}

fn phase_of(cs: &CocoonSet) -> Option<CocoonSetPhase> {
    cs.status.as_ref().and_then(|s| s.phase)
}

fn settled(cs: &CocoonSet, phase: CocoonSetPhase) -> bool {
    phase_of(cs) == Some(phase)
        && cs.status.as_ref().map(|s| s.observed_generation) == cs.metadata.generation
}

async fn set_suspend(sets: &Api<CocoonSet>, name: &str, on: bool) -> Result<(), BoxError> {
    sets.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"suspend": on}})),
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shipped_rbac_grants_exactly_what_the_operator_binary_calls() {
    cocoon_testenv::run_test(|env| async move {
        let Some(audit) = env.audit_log() else {
            return Err::<(), BoxError>(
                "the test environment's run directory is unknown (set TESTENV_RUN_DIR)".into(),
            );
        };
        // Only this run's requests count (an environment can outlive one test run).
        let before_operator = audit.records_of(OPERATOR_SA)?.len();
        let admin = env.client()?;
        let tmp = tempfile::tempdir()?;
        apply_manifests(env, tmp.path())?;
        let kubeconfig = service_account_kubeconfig(env, "cocoon-operator", tmp.path())?;
        // A Lease left by an earlier run in the same environment would spare the binary its
        // create: start from none, as a fresh install does.
        let leases: Api<Lease> = Api::namespaced(admin.clone(), "cocoon-system");
        match leases
            .delete(
                cocoon_operator::leader::LEASE_NAME,
                &DeleteParams::default(),
            )
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }

        // The node agent's ClusterRole, bound per node to a ServiceAccount named like the Node in
        // cocoon-nodes (the shipped manifests leave the bindings to the installer; a host may
        // use its kubelet identity instead, see node_identity.rs).
        run_kubectl(env, &["create", "namespace", NODE_SA_NAMESPACE]).or_else(|e| {
            if e.to_string().contains("already exists") {
                Ok(String::new())
            } else {
                Err(e)
            }
        })?;

        // Two real node agents (the binary, simulated runtime) register their own Nodes.
        let ns = cocoon_testenv::create_namespace(&admin, "rbac").await?;
        let pool = unique_name("pool");
        let mut node_names = Vec::new();
        let mut node_users = Vec::new();
        let mut node_kubeconfigs = Vec::new();
        let mut agents = Vec::new();
        for _ in 0..2 {
            let name = unique_name("rbac-node");
            run_kubectl(
                env,
                &["-n", NODE_SA_NAMESPACE, "create", "serviceaccount", &name],
            )?;
            run_kubectl(
                env,
                &[
                    "create",
                    "clusterrolebinding",
                    &format!("cocoon-node-{name}"),
                    "--clusterrole",
                    "cocoon-node",
                    "--serviceaccount",
                    &format!("{NODE_SA_NAMESPACE}:{name}"),
                ],
            )?;
            let kubeconfig =
                env.service_account_kubeconfig(NODE_SA_NAMESPACE, &name, "2h", tmp.path())?;
            let root = tmp.path().join(&name);
            std::fs::create_dir_all(&root)?;
            agents.push(spawn_node_agent(env, &kubeconfig, &name, &pool, &root)?);
            node_users.push(format!("system:serviceaccount:{NODE_SA_NAMESPACE}:{name}"));
            node_kubeconfigs.push(kubeconfig);
            node_names.push(name);
        }
        // Every call of every node agent (each has its own identity, new in this run).
        let node_calls = || -> Result<BTreeSet<Call>, BoxError> {
            let mut all = BTreeSet::new();
            for user in &node_users {
                all.extend(calls_since(&audit, user, 0)?);
            }
            Ok(all)
        };
        let nodes: Api<Node> = Api::all(admin.clone());
        for name in &node_names {
            cocoon_testenv::wait_until(&format!("node {name} Ready"), WAIT, || async {
                let n = nodes.get_opt(name).await.ok().flatten()?;
                cocoon_testenv::node::is_ready(&n).then_some(())
            })
            .await?;
        }

        // The real binary, as the ServiceAccount, leader election on (Lease in cocoon-system),
        // its metrics secured (the default).
        let metrics_port = cocoon_testenv::free_ports(1)?[0];
        // The activator listens on an address the API server accepts in an EndpointSlice.
        cocoon_testenv::ensure_loopback_address(cocoon_testenv::KUBELET_NODE_IP)?;
        let mut operator = tokio::process::Command::new(env!("CARGO_BIN_EXE_cocoon-operator"))
            .arg("run")
            .env("KUBECONFIG", &kubeconfig)
            .env("OCI_REGISTRY", env.registry_addr())
            .env("POD_NAMESPACE", "cocoon-system")
            .env("WATCH_NAMESPACE", &ns)
            .env("METRICS_ADDR", format!("127.0.0.1:{metrics_port}"))
            .env("PROBE_ADDR", "127.0.0.1:0")
            .env("COCOON_REQUEUE_INTERVAL", "1s")
            .env("ACTIVATOR_ADDR", cocoon_testenv::KUBELET_NODE_IP)
            .env("ACTIVATOR_PORTS", "42100-42109")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;

        let sets: Api<CocoonSet> = Api::namespaced(admin.clone(), &ns);
        let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns);

        // Set "a": main + one forked sub-agent; retain suspend and resume keep both VMs.
        let mut spec = CocoonSetSpec::with_image("ubuntu:24.04");
        spec.node_pool = pool.clone();
        spec.agent.mode = AgentMode::Run;
        spec.agent.replicas = 1;
        sets.create(&PostParams::default(), &CocoonSet::new("a", spec))
            .await?;
        wait_set(&sets, "a", "Running", WAIT, |cs| {
            settled(cs, CocoonSetPhase::Running)
                && cs.status.as_ref().is_some_and(|s| s.ready_agents == 2)
        })
        .await?;
        // A scrape: the operator reviews the token (TokenReview) and asks whether its user may
        // get /metrics (SubjectAccessReview); its own ServiceAccount is no metrics reader.
        let scraper = run_kubectl(
            env,
            &["-n", "cocoon-system", "create", "token", "cocoon-operator"],
        )?;
        let status = scrape_status(metrics_port, scraper.trim()).await?;
        assert_eq!(status, 403, "a token without cocoon-metrics-reader");
        set_suspend(&sets, "a", true).await?;
        wait_set(&sets, "a", "Suspended", WAIT, |cs| {
            settled(cs, CocoonSetPhase::Suspended)
        })
        .await?;
        set_suspend(&sets, "a", false).await?;
        wait_set(&sets, "a", "Running again", WAIT, |cs| {
            settled(cs, CocoonSetPhase::Running)
                && cs.status.as_ref().is_some_and(|s| s.ready_agents == 2)
        })
        .await?;

        // Wake on connect: ports on the set give it a Service and an EndpointSlice (and the
        // activator pool its ports), a port more patches them, no ports deletes them.
        let services: Api<k8s_openapi::api::core::v1::Service> =
            Api::namespaced(admin.clone(), &ns);
        for ports in [vec![7000], vec![7000, 7001], vec![]] {
            sets.patch(
                "a",
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"idle": {"ports": ports.clone()}}})),
            )
            .await?;
            cocoon_testenv::wait_until(
                &format!("Service a with ports {ports:?}"),
                WAIT,
                || async {
                    let svc = services.get_opt("a").await.ok()?;
                    let have: Vec<i32> = svc
                        .iter()
                        .flat_map(|s| s.spec.iter().flat_map(|s| s.ports.iter().flatten()))
                        .map(|p| p.port)
                        .collect();
                    (have == ports && (ports.is_empty() == svc.is_none())).then_some(())
                },
            )
            .await?;
        }

        // The agents' kubelet API under the node role: `kubectl logs` through the API server
        // (its client certificate, authorized with a SubjectAccessReview) works, and a bearer
        // token is reviewed (TokenReview) and, lacking nodes/proxy, refused.
        run_kubectl(env, &["-n", &ns, "logs", "a-0"])?;
        let a0_node = pods
            .get("a-0")
            .await?
            .spec
            .and_then(|s| s.node_name)
            .ok_or("a-0 is not bound")?;
        let port = nodes
            .get(&a0_node)
            .await?
            .status
            .and_then(|s| s.daemon_endpoints)
            .and_then(|d| d.kubelet_endpoint)
            .map(|e| e.port)
            .ok_or("no kubelet port")?;
        let token = run_kubectl(
            env,
            &[
                "-n",
                NODE_SA_NAMESPACE,
                "create",
                "token",
                &node_names[0],
                "--duration",
                "10m",
            ],
        )?;
        let out = std::process::Command::new("curl")
            .args(["-sk", "-o", "/dev/null", "-w", "%{http_code}", "-H"])
            .arg(format!("Authorization: Bearer {}", token.trim()))
            .arg(format!(
                "https://127.0.0.1:{port}/containerLogs/{ns}/a-0/agent"
            ))
            .output()?;
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "403",
            "a token without nodes/proxy"
        );

        // Set "b": main only, release suspend frees the seat and wake recreates the pod; then a
        // pin to the other node migrates it.
        let mut spec = CocoonSetSpec::with_image("ubuntu:24.04");
        spec.node_pool = pool.clone();
        spec.agent.mode = AgentMode::Run;
        spec.hibernate_policy = HibernatePolicy::Release;
        spec.snapshot_policy = SnapshotPolicy::MainOnly;
        sets.create(&PostParams::default(), &CocoonSet::new("b", spec))
            .await?;
        wait_set(&sets, "b", "Running", WAIT, |cs| {
            settled(cs, CocoonSetPhase::Running)
        })
        .await?;
        set_suspend(&sets, "b", true).await?;
        wait_set(&sets, "b", "Suspended, seat freed", WAIT, |cs| {
            settled(cs, CocoonSetPhase::Suspended)
        })
        .await?;
        cocoon_testenv::wait_until("b-0 deleted", WAIT, || async {
            matches!(pods.get_opt("b-0").await, Ok(None)).then_some(())
        })
        .await?;
        // Waking with every node cordoned: WakeNoCapacity on every pass, so the event
        // recorder updates its series (events patch); uncordoned, the wake completes.
        for n in &node_names {
            run_kubectl(env, &["cordon", n])?;
        }
        set_suspend(&sets, "b", false).await?;
        let event_patch = (
            "events.k8s.io".to_string(),
            "events".to_string(),
            "patch".to_string(),
        );
        cocoon_testenv::wait_until("a repeated WakeNoCapacity event", WAIT, || async {
            let calls = calls_since(&audit, OPERATOR_SA, before_operator).ok()?;
            calls.contains(&event_patch).then_some(())
        })
        .await?;
        for n in &node_names {
            run_kubectl(env, &["uncordon", n])?;
        }
        wait_set(&sets, "b", "Running after wake", WAIT, |cs| {
            settled(cs, CocoonSetPhase::Running)
        })
        .await?;
        let woken_on = node_of(&pods.get("b-0").await?);
        let target = node_names
            .iter()
            .find(|n| **n != woken_on)
            .ok_or("another node")?
            .clone();
        sets.patch(
            "b",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"nodeName": target}})),
        )
        .await?;
        wait_set(&sets, "b", "Running on the pinned node", WAIT, |cs| {
            settled(cs, CocoonSetPhase::Running)
        })
        .await?;
        cocoon_testenv::wait_until("b-0 on the pinned node", WAIT, || async {
            let p = pods.get_opt("b-0").await.ok().flatten()?;
            (node_of(&p) == target).then_some(())
        })
        .await?;

        // A CocoonHibernation on a's sub-agent: hibernate, wake, delete.
        let chs: Api<CocoonHibernation> = Api::namespaced(admin.clone(), &ns);
        let ch = CocoonHibernation::new(
            "h",
            CocoonHibernationSpec {
                pod_ref: PodRef { name: "a-1".into() },
                desire: Desire::Hibernate,
            },
        );
        chs.create(&PostParams::default(), &ch).await?;
        let ch_phase = |want: HibernationPhase| {
            let chs = chs.clone();
            async move {
                cocoon_testenv::wait_until(&format!("h {want:?}"), WAIT, || async {
                    let c = chs.get_opt("h").await.ok().flatten()?;
                    (c.status.as_ref().and_then(|s| s.phase) == Some(want)).then_some(())
                })
                .await
            }
        };
        ch_phase(HibernationPhase::Hibernated).await?;
        chs.patch(
            "h",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"desire": "Wake"}})),
        )
        .await?;
        ch_phase(HibernationPhase::Active).await?;
        chs.delete("h", &DeleteParams::default()).await?;
        cocoon_testenv::wait_until("h gone", WAIT, || async {
            matches!(chs.get_opt("h").await, Ok(None)).then_some(())
        })
        .await?;

        // A CocoonCheckpoint of set a's main (issue 38): validated (the set read by name),
        // accepted (finalizer, status, the request on a-0), taken by a-0's node agent (the
        // checkpoint read, its status written), then deleted (artifact delete, request
        // cleared, finalizer removed).
        let ckpts: Api<CocoonCheckpoint> = Api::namespaced(admin.clone(), &ns);
        let ckpt = CocoonCheckpoint::new(
            "k",
            CocoonCheckpointSpec {
                source: CheckpointSource {
                    pod_ref: None,
                    cocoon_set_ref: Some(NameRef { name: "a".into() }),
                },
            },
        );
        ckpts.create(&PostParams::default(), &ckpt).await?;
        let ready = cocoon_testenv::wait_until("k Ready", WAIT, || async {
            let c = ckpts.get_opt("k").await.ok().flatten()?;
            (c.phase() == Some(CheckpointPhase::Ready)).then_some(c)
        })
        .await?;
        let repo = ready.status.map(|s| s.repository).unwrap_or_default();
        assert_eq!(
            manifest_status(env, &repo, "checkpoint")?,
            "200",
            "the artifact"
        );
        ckpts.delete("k", &DeleteParams::default()).await?;
        cocoon_testenv::wait_until("k gone", WAIT, || async {
            matches!(ckpts.get_opt("k").await, Ok(None)).then_some(())
        })
        .await?;
        assert_eq!(
            manifest_status(env, &repo, "checkpoint")?,
            "404",
            "the artifact goes with its checkpoint"
        );

        // The node agents' periodic calls: the status heartbeat (every 10 s) and the drift
        // check that reads back each tracked pod (10 s after start, then every 30 s).
        let periodic = [
            (
                "".to_string(),
                "nodes/status".to_string(),
                "patch".to_string(),
            ),
            ("".to_string(), "pods".to_string(), "get".to_string()),
        ];
        cocoon_testenv::wait_until("the node agents' periodic calls", WAIT, || async {
            let calls = node_calls().ok()?;
            periodic.iter().all(|c| calls.contains(c)).then_some(())
        })
        .await?;

        // Deleting the sets runs their finalizers (tag collection) under the same RBAC.
        for name in ["a", "b"] {
            sets.delete(name, &DeleteParams::default()).await?;
        }
        cocoon_testenv::wait_until("both sets gone", WAIT, || async {
            let left = sets.list(&Default::default()).await.ok()?;
            left.items.is_empty().then_some(())
        })
        .await?;
        // Pods gone, then a graceful stop of every binary (shutdown calls count too).
        cocoon_testenv::wait_until("every pod gone", WAIT, || async {
            let left = pods.list(&Default::default()).await.ok()?;
            left.items.is_empty().then_some(())
        })
        .await?;
        // A node agent restarted on a Node whose labels drifted puts them back (the one call
        // of the node role the scenario above does not make: `nodes update`).
        terminate(&mut agents[0]).await?;
        run_kubectl(
            env,
            &["label", "node", &node_names[0], &format!("{POOL_LABEL}-")],
        )?;
        agents[0] = spawn_node_agent(
            env,
            &node_kubeconfigs[0],
            &node_names[0],
            &pool,
            &tmp.path().join(&node_names[0]),
        )?;
        cocoon_testenv::wait_until("pool label restored", WAIT, || async {
            let n = nodes.get_opt(&node_names[0]).await.ok().flatten()?;
            (n.labels().get(POOL_LABEL) == Some(&pool)).then_some(())
        })
        .await?;
        for child in std::iter::once(&mut operator).chain(agents.iter_mut()) {
            terminate(child).await?;
        }

        // What each called against what it was granted.
        let called = calls_since(&audit, OPERATOR_SA, before_operator)?;
        let cluster_roles: Api<ClusterRole> = Api::all(admin.clone());
        let roles: Api<Role> = Api::namespaced(admin.clone(), "cocoon-system");
        let mut grants = granted(
            &cluster_roles
                .get("cocoon-operator")
                .await?
                .rules
                .unwrap_or_default(),
        );
        grants.extend(granted(
            &roles
                .get("cocoon-operator-leader-election")
                .await?
                .rules
                .unwrap_or_default(),
        ));
        let admission_only = (
            GROUP.to_string(),
            "cocoonsets/finalizers".to_string(),
            "update".to_string(),
        );
        exactly_what_is_called(OPERATOR_SA, &called, &grants, &[admission_only]);
        let called = node_calls()?;
        let grants = granted(
            &cluster_roles
                .get("cocoon-node")
                .await?
                .rules
                .unwrap_or_default(),
        );
        exactly_what_is_called("the node agents", &called, &grants, &[]);

        // cocoonsets/finalizers: the operator's pods carry blockOwnerDeletion, which the
        // OwnerReferencesPermissionEnforcement admission plugin allows only to a user who may
        // update the owner's finalizers.
        finalizers_rule_is_needed(env, &admin, &ns, tmp.path()).await?;

        cocoon_testenv::delete_namespace(&admin, &ns).await?;
        for name in &node_names {
            let _ = nodes.delete(name, &DeleteParams::default()).await;
            let _ = run_kubectl(
                env,
                &[
                    "delete",
                    "clusterrolebinding",
                    &format!("cocoon-node-{name}"),
                ],
            );
            let _ = run_kubectl(
                env,
                &["-n", NODE_SA_NAMESPACE, "delete", "serviceaccount", name],
            );
        }
        Ok(())
    })
    .await;
}

/// A ServiceAccount bound to the operator's ClusterRole minus the finalizers rule cannot create
/// a pod owned (blockOwnerDeletion) by a CocoonSet; with the shipped role it can.
async fn finalizers_rule_is_needed(
    env: &Shared,
    admin: &Client,
    ns: &str,
    dir: &Path,
) -> Result<(), BoxError> {
    let sets: Api<CocoonSet> = Api::namespaced(admin.clone(), ns);
    let mut spec = CocoonSetSpec::with_image("ubuntu:24.04");
    spec.node_pool = unique_name("nowhere");
    // No operator watches this set (the binary is gone); it only serves as an owner.
    let owner = sets
        .create(&PostParams::default(), &CocoonSet::new("owner", spec))
        .await?;
    let pod = |name: &str| Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            owner_references: Some(vec![OwnerReference {
                api_version: format!("{GROUP}/v1"),
                kind: "CocoonSet".into(),
                name: owner.name_any(),
                uid: owner.uid().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "agent".into(),
                image: Some("ubuntu:24.04".into()),
                ..Container::default()
            }],
            node_selector: Some([("cocoonstack.io/pool".to_string(), unique_name("none"))].into()),
            ..PodSpec::default()
        }),
        ..Pod::default()
    };

    // The shipped role allows it.
    let operator = Client::try_from(
        kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(dir.join("cocoon-operator.kubeconfig"))?,
            &Default::default(),
        )
        .await?,
    )?;
    Api::<Pod>::namespaced(operator, ns)
        .create(&PostParams::default(), &pod("owned-by-operator"))
        .await?;

    // The same role without the finalizers rule does not.
    let mut trimmed = Api::<ClusterRole>::all(admin.clone())
        .get("cocoon-operator")
        .await?;
    trimmed.rules = Some(
        trimmed
            .rules
            .unwrap_or_default()
            .into_iter()
            .filter(|r| {
                !r.resources
                    .iter()
                    .flatten()
                    .any(|res| res.ends_with("/finalizers"))
            })
            .collect(),
    );
    let probe_role = unique_name("cocoon-operator-no-finalizers");
    trimmed.metadata = ObjectMeta {
        name: Some(probe_role.clone()),
        ..ObjectMeta::default()
    };
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &trimmed)
        .await?;
    let probe_sa = unique_name("rbac-probe");
    run_kubectl(
        env,
        &["-n", "cocoon-system", "create", "serviceaccount", &probe_sa],
    )?;
    run_kubectl(
        env,
        &[
            "create",
            "clusterrolebinding",
            &probe_role,
            "--clusterrole",
            &probe_role,
            "--serviceaccount",
            &format!("cocoon-system:{probe_sa}"),
        ],
    )?;
    let mut cfg = env.client_config().clone();
    cfg.auth_info.impersonate = Some(format!("system:serviceaccount:cocoon-system:{probe_sa}"));
    let probe = Api::<Pod>::namespaced(Client::try_from(cfg)?, ns);
    // The binding reaches the authorizer's cache asynchronously: a plain pod (no owner) is
    // allowed once it has; then the owned one must be refused.
    let plain = |name: String| {
        let mut p = pod(&name);
        p.metadata.owner_references = None;
        p
    };
    cocoon_testenv::wait_until("probe binding effective", WAIT, || async {
        probe
            .create(&PostParams::default(), &plain(unique_name("plain")))
            .await
            .ok()
            .map(|_| ())
    })
    .await?;
    match probe
        .create(&PostParams::default(), &pod("owned-by-probe"))
        .await
    {
        Err(kube::Error::Api(e)) if e.code == 403 => {
            assert!(
                e.message.contains("blockOwnerDeletion"),
                "refused for another reason: {}",
                e.message
            );
        }
        other => panic!("expected 403 without the finalizers rule, got {other:?}"),
    }
    Api::<ClusterRole>::all(admin.clone())
        .delete(&probe_role, &DeleteParams::default())
        .await?;
    run_kubectl(env, &["delete", "clusterrolebinding", &probe_role])?;
    run_kubectl(
        env,
        &["-n", "cocoon-system", "delete", "serviceaccount", &probe_sa],
    )?;
    Ok(())
}
