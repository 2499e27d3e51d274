//! A node agent's API identity reaches only its own node (issue 26 item 5). The real agent
//! binary runs as `system:node:<node>` (a client certificate from the test environment's CA;
//! the API server runs the Node authorizer and NodeRestriction, as kubeadm clusters do) with
//! the shipped admission policies (manifests/node/admission.yaml) applied, and goes through its
//! whole lifecycle: register, Lease, create a VM, annotate the pod, hibernate, wake, delete.
//! With the same credentials, every write outside its node is refused: another node's pod
//! (annotations, status, delete), another Node (label), another node's Lease, and on its own
//! pod any annotation key the contract does not let a node write, or a label. The same attacks
//! fail for a ServiceAccount-mode agent identity (`cocoon-nodes/<node>` bound to the shipped
//! `cocoon-node` role), which only the admission policies hold.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::idle;
use cocoon_api::crd::checkpoint::{
    CheckpointSource, CocoonCheckpoint, CocoonCheckpointSpec, NameRef,
};
use cocoon_testenv::{Shared, unique_name};
use cocoon_testsupport::binaries::sim_node_command;
use cocoon_testsupport::{BoxError, vm_pod};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(120);
const IMAGE: &str = "ubuntu:24.04";

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

fn manifest(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../manifests")
        .join(rel)
}

async fn client_for(kubeconfig: &Path) -> Result<Client, BoxError> {
    Ok(cocoon_testenv::client_for(kubeconfig).await?)
}

/// The real node agent binary for `name`, authenticating with `kubeconfig`.
fn spawn_agent(
    env: &Shared,
    kubeconfig: &Path,
    name: &str,
    pool: &str,
    root: &Path,
) -> Result<tokio::process::Child, BoxError> {
    std::fs::create_dir_all(root)?;
    Ok(sim_node_command(
        env!("CARGO_BIN_EXE_cocoon-operator"),
        kubeconfig,
        env.registry_addr(),
        name,
        pool,
        root,
    )
    .env("VK_SIM_IMAGES", IMAGE)
    // The CA of the API server's kubelet client certificate (`kubectl logs`).
    .env(
        "VK_CLIENT_CA_FILE",
        env.pki_dir().ok_or("PKI dir unknown")?.join("ca.crt"),
    )
    .stdout(Stdio::null())
    .stderr(Stdio::inherit())
    .spawn()?)
}

fn annotation(p: &Pod, key: &str) -> Option<String> {
    p.annotations().get(key).cloned()
}

async fn wait_state(pods: &Api<Pod>, name: &str, state: &str) -> Result<Pod, BoxError> {
    Ok(
        cocoon_testenv::wait_until(&format!("{name} {state}"), WAIT, || async {
            let p = pods.get_opt(name).await.ok().flatten()?;
            (annotation(&p, ann::LIFECYCLE_STATE).as_deref() == Some(state)).then_some(p)
        })
        .await?,
    )
}

/// The API server's refusal of `res`: 403 Forbidden (the Node authorizer, NodeRestriction and
/// the shipped policies, whose validations all carry `reason: Forbidden`), with its message;
/// panics (failing the test) on any other answer.
fn refused<T: std::fmt::Debug>(what: &str, res: Result<T, kube::Error>) -> String {
    match res {
        Err(kube::Error::Api(e)) if e.code == 403 => e.message,
        other => panic!("{what}: expected a refusal, got {other:?}"),
    }
}

fn merge(v: serde_json::Value) -> Patch<serde_json::Value> {
    Patch::Merge(v)
}

/// Every write of `who` outside its own node is refused; `own_pod` is a pod bound to its node,
/// `foreign_pod` one bound to `other` (both in `ns`).
async fn attacks(
    who: &str,
    client: &Client,
    ns: &str,
    own_pod: &str,
    foreign_pod: &str,
    other: &str,
) -> Result<(), BoxError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let nodes: Api<Node> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let pp = PatchParams::default();
    let steal = json!({"metadata": {"annotations": {ann::VM_ID: "stolen"}}});

    // Another node's pod: annotations (pod and status), status, delete.
    refused(
        &format!("{who}: annotate another node's pod"),
        pods.patch(foreign_pod, &pp, &merge(steal.clone())).await,
    );
    let msg = refused(
        &format!("{who}: annotate another node's pod through pods/status"),
        pods.patch_status(foreign_pod, &pp, &merge(steal.clone()))
            .await,
    );
    assert!(msg.contains(foreign_pod) || msg.contains("node"), "{msg}");
    refused(
        &format!("{who}: write another node's pod status"),
        pods.patch_status(
            foreign_pod,
            &pp,
            &merge(json!({"status": {"message": "stolen"}})),
        )
        .await,
    );
    refused(
        &format!("{who}: delete another node's pod"),
        pods.delete(foreign_pod, &DeleteParams::default()).await,
    );
    // Forged activity or a forged wake on another node's pod (issue 39): another tenant's
    // VM would be kept awake or woken.
    for key in [idle::LAST_ACTIVITY, idle::WAKE_REQUEST] {
        refused(
            &format!("{who}: write {key} on another node's pod"),
            pods.patch_status(
                foreign_pod,
                &pp,
                &merge(json!({"metadata": {"annotations": {key: "2030-01-01T00:00:00Z"}}})),
            )
            .await,
        );
    }
    // Another Node: a label; and its Lease.
    refused(
        &format!("{who}: label another Node"),
        nodes
            .patch(
                other,
                &pp,
                &merge(json!({"metadata": {"labels": {"cocoonstack.io/pool": "stolen"}}})),
            )
            .await,
    );
    refused(
        &format!("{who}: write another Node's status"),
        nodes
            .patch_status(
                other,
                &pp,
                &merge(json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}})),
            )
            .await,
    );
    refused(
        &format!("{who}: renew another node's Lease"),
        leases
            .patch(
                other,
                &pp,
                &merge(json!({"spec": {"holderIdentity": "stolen"}})),
            )
            .await,
    );

    // Its own pod: a key the contract does not let a node write (the hibernate request and the
    // VM name are the operator's), a label, a finalizer, or the pod itself (not its status).
    for key in [
        ann::HIBERNATE,
        ann::VM_NAME,
        idle::SUSPEND_AFTER,
        "example.com/anything",
    ] {
        let msg = refused(
            &format!("{who}: write {key} on its own pod"),
            pods.patch_status(
                own_pod,
                &pp,
                &merge(json!({"metadata": {"annotations": {key: "x"}}})),
            )
            .await,
        );
        assert!(msg.contains(key), "the refusal names {key}: {msg}");
    }
    refused(
        &format!("{who}: remove the VM name from its own pod"),
        pods.patch_status(
            own_pod,
            &pp,
            &merge(json!({"metadata": {"annotations": {ann::VM_NAME: null}}})),
        )
        .await,
    );
    refused(
        &format!("{who}: label its own pod"),
        pods.patch_status(
            own_pod,
            &pp,
            &merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await,
    );
    refused(
        &format!("{who}: add a finalizer to its own pod"),
        pods.patch_status(
            own_pod,
            &pp,
            &merge(json!({"metadata": {"finalizers": ["example.com/x"]}})),
        )
        .await,
    );
    refused(
        &format!("{who}: patch its own pod (not its status)"),
        pods.patch(
            own_pod,
            &pp,
            &merge(json!({"metadata": {"annotations": {ann::VM_IP: "10.9.9.9"}}})),
        )
        .await,
    );
    // What a node writes goes through (the refusals above are about the key, not the pod).
    pods.patch_status(
        own_pod,
        &pp,
        &merge(json!({"metadata": {"annotations": {ann::POST_CLONE_ERRORS: "probe"}}})),
    )
    .await
    .map_err(|e| format!("{who}: a node-written key on its own pod: {e}"))?;
    // The idle keys a node writes (issue 39) go through on its own pod.
    pods.patch_status(
        own_pod,
        &pp,
        &merge(json!({"metadata": {"annotations": {
            idle::LAST_ACTIVITY: "2030-01-01T00:00:00Z",
            idle::LAST_ACTIVITY_KIND: "session",
            idle::WAKE_REQUEST: "2030-01-01T00:00:00Z",
        }}})),
    )
    .await
    .map_err(|e| format!("{who}: the idle keys on its own pod: {e}"))?;
    pods.patch_status(
        own_pod,
        &pp,
        &merge(json!({"metadata": {"annotations": {ann::POST_CLONE_ERRORS: null}}})),
    )
    .await?;
    Ok(())
}

/// Creates checkpoint `name` of pod `pod` whose status (as the operator writes it at the
/// hand-off) names `node`.
async fn handed_off(
    admin: &Client,
    ns: &str,
    name: &str,
    pod: &str,
    node: &str,
) -> Result<(), BoxError> {
    let api: Api<CocoonCheckpoint> = Api::namespaced(admin.clone(), ns);
    let spec = CocoonCheckpointSpec {
        source: CheckpointSource {
            pod_ref: Some(NameRef { name: pod.into() }),
            cocoon_set_ref: None,
        },
    };
    api.create(&PostParams::default(), &CocoonCheckpoint::new(name, spec))
        .await?;
    let status = json!({"status": {
        "phase": "Pending", "node": node, "podName": pod, "source": format!("pod/{pod}"),
        "repository": format!("ckpt-{name}"), "tag": "checkpoint",
    }});
    api.patch_status(name, &PatchParams::default(), &merge(status))
        .await?;
    Ok(())
}

/// A node writes the status of a checkpoint whose `status.node` is itself, through the status
/// subresource, and never the operator-written fields (manifests/node/admission.yaml);
/// `own`/`foreign` are checkpoints handed off to its node and to another.
async fn checkpoint_attacks(
    who: &str,
    client: &Client,
    ns: &str,
    own: &str,
    foreign: &str,
) -> Result<(), BoxError> {
    let api: Api<CocoonCheckpoint> = Api::namespaced(client.clone(), ns);
    let pp = PatchParams::default();
    // The policy takes effect asynchronously: wait until a write only it refuses is refused.
    cocoon_testenv::wait_until("the node checkpoint policy in force", WAIT, || async {
        let res = api
            .patch_status(foreign, &pp, &merge(json!({"status": {"digest": "probe"}})))
            .await;
        matches!(res, Err(kube::Error::Api(e)) if e.code == 403).then_some(())
    })
    .await?;
    let msg = refused(
        &format!("{who}: mark another node's checkpoint Ready"),
        api.patch_status(
            foreign,
            &pp,
            &merge(json!({"status": {"phase": "Ready", "digest": "sha256:00"}})),
        )
        .await,
    );
    assert!(msg.contains("status.node"), "{msg}");
    for (what, status) in [
        ("repository", json!({"repository": "ckpt-elsewhere"})),
        ("node", json!({"node": "elsewhere"})),
        ("podName", json!({"podName": "victim"})),
    ] {
        refused(
            &format!("{who}: rewrite the {what} of its own checkpoint"),
            api.patch_status(own, &pp, &merge(json!({ "status": status })))
                .await,
        );
    }
    api.patch_status(own, &pp, &merge(json!({"status": {"phase": "Saving"}})))
        .await
        .map_err(|e| format!("{who}: phase Saving on its own checkpoint: {e}"))?;
    refused(
        &format!("{who}: set its own checkpoint back to Pending (the operator's phase)"),
        api.patch_status(own, &pp, &merge(json!({"status": {"phase": "Pending"}})))
            .await,
    );
    refused(
        &format!("{who}: patch its own checkpoint (not its status)"),
        api.patch(
            own,
            &pp,
            &merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await,
    );
    refused(
        &format!("{who}: delete its own checkpoint"),
        api.delete(own, &DeleteParams::default()).await,
    );
    // What a node writes goes through: its phases and the numbers.
    api.patch_status(
        own,
        &pp,
        &merge(json!({"status": {"phase": "Pushing", "bytesOnWire": 1}})),
    )
    .await
    .map_err(|e| format!("{who}: a node-written checkpoint status: {e}"))?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_agent_identity_writes_only_its_own_node() {
    cocoon_testenv::run_test(|env| async move {
        let admin = env.client()?;
        run_kubectl(
            env,
            &[
                "apply",
                "-f",
                &manifest("node/admission.yaml").to_string_lossy(),
            ],
        )?;
        run_kubectl(
            env,
            &["apply", "-f", &manifest("node/rbac.yaml").to_string_lossy()],
        )?;
        let tmp = tempfile::tempdir()?;
        let ns = cocoon_testenv::create_namespace(&admin, "nodeid").await?;
        let pool = unique_name("pool");
        let a = unique_name("nid-a");
        let b = unique_name("nid-b");

        // Two real agents, each with the kubelet identity of its own node.
        let mut agents = Vec::new();
        for n in [&a, &b] {
            let kubeconfig = env.node_kubeconfig(n, tmp.path())?;
            agents.push(spawn_agent(
                env,
                &kubeconfig,
                n,
                &pool,
                &tmp.path().join(n),
            )?);
        }
        let nodes: Api<Node> = Api::all(admin.clone());
        for n in [&a, &b] {
            cocoon_testenv::wait_until(&format!("node {n} Ready"), WAIT, || async {
                let node = nodes.get_opt(n).await.ok().flatten()?;
                cocoon_testenv::node::is_ready(&node).then_some(())
            })
            .await?;
        }
        // Registered as a node may: the labels NodeRestriction refuses from a node are left to
        // the administrator; the Lease is its own.
        let node_a = nodes.get(&a).await?;
        assert_eq!(
            node_a.labels().get("cocoonstack.io/pool"),
            Some(&pool),
            "pool label"
        );
        assert!(!node_a.labels().contains_key("kubernetes.io/role"));
        let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-node-lease");
        cocoon_testenv::wait_until(&format!("lease {a}"), WAIT, || async {
            leases.get_opt(&a).await.ok().flatten().map(|_| ())
        })
        .await?;

        // The lifecycle on node a: create, annotate (ready), hibernate, wake, delete.
        let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns);
        let on = |name: &str, node: &str| vm_pod(&ns, name, node, &[(ann::IMAGE, IMAGE)]);
        pods.create(&PostParams::default(), &on("pa", &a)).await?;
        pods.create(&PostParams::default(), &on("pb", &b)).await?;
        let pa = wait_state(&pods, "pa", "ready").await?;
        assert!(annotation(&pa, ann::VM_ID).is_some(), "VM id written");
        wait_state(&pods, "pb", "ready").await?;
        pods.patch(
            "pa",
            &PatchParams::default(),
            &merge(json!({"metadata": {"annotations": {ann::HIBERNATE: "true"}}})),
        )
        .await?;
        let pa = wait_state(&pods, "pa", "hibernated").await?;
        assert!(annotation(&pa, ann::VM_ID).is_none(), "VM id cleared");
        pods.patch(
            "pa",
            &PatchParams::default(),
            &merge(json!({"metadata": {"annotations": {ann::HIBERNATE: null}}})),
        )
        .await?;
        let pa = wait_state(&pods, "pa", "ready").await?;
        assert!(annotation(&pa, ann::VM_ID).is_some(), "VM id after wake");

        // The attacks, with node a's credentials. The policies take effect asynchronously:
        // wait until the one write only they refuse is refused.
        let as_a = client_for(&tmp.path().join(format!("{a}.kubeconfig"))).await?;
        let a_pods: Api<Pod> = Api::namespaced(as_a.clone(), &ns);
        cocoon_testenv::wait_until("the node admission policies in force", WAIT, || async {
            let res = a_pods
                .patch_status(
                    "pa",
                    &PatchParams::default(),
                    &merge(json!({"metadata": {"annotations": {"example.com/probe": "x"}}})),
                )
                .await;
            matches!(res, Err(kube::Error::Api(e)) if e.code == 403).then_some(())
        })
        .await?;
        attacks(&format!("system:node:{a}"), &as_a, &ns, "pa", "pb", &b).await?;
        handed_off(&admin, &ns, "ck-a", "pa", &a).await?;
        handed_off(&admin, &ns, "ck-b", "pb", &b).await?;
        checkpoint_attacks(&format!("system:node:{a}"), &as_a, &ns, "ck-a", "ck-b").await?;

        // The same attacks as a ServiceAccount-mode identity of node a.
        run_kubectl(env, &["create", "namespace", "cocoon-nodes"]).or_else(|e| {
            if e.to_string().contains("already exists") {
                Ok(String::new())
            } else {
                Err(e)
            }
        })?;
        run_kubectl(env, &["-n", "cocoon-nodes", "create", "serviceaccount", &a])?;
        run_kubectl(
            env,
            &[
                "create",
                "clusterrolebinding",
                &a,
                "--clusterrole",
                "cocoon-node",
                "--serviceaccount",
                &format!("cocoon-nodes:{a}"),
            ],
        )?;
        let sa_dir = tmp.path().join("sa");
        std::fs::create_dir_all(&sa_dir)?;
        let sa_kubeconfig = env.service_account_kubeconfig("cocoon-nodes", &a, "1h", &sa_dir)?;
        let as_sa = client_for(&sa_kubeconfig).await?;
        let sa_pods: Api<Pod> = Api::namespaced(as_sa.clone(), &ns);
        // The binding reaches the authorizer's cache asynchronously: reading works once it has.
        cocoon_testenv::wait_until("the ServiceAccount's binding in force", WAIT, || async {
            sa_pods.get("pa").await.ok().map(|_| ())
        })
        .await?;
        attacks(
            &format!("system:serviceaccount:cocoon-nodes:{a}"),
            &as_sa,
            &ns,
            "pa",
            "pb",
            &b,
        )
        .await?;
        handed_off(&admin, &ns, "ck-a2", "pa", &a).await?;
        checkpoint_attacks(
            &format!("system:serviceaccount:cocoon-nodes:{a}"),
            &as_sa,
            &ns,
            "ck-a2",
            "ck-b",
        )
        .await?;

        // The rest of node a's lifecycle: delete (the agent removes the VM and the pod).
        pods.delete("pa", &DeleteParams::default()).await?;
        cocoon_testenv::wait_until("pa gone", WAIT, || async {
            matches!(pods.get_opt("pa").await, Ok(None)).then_some(())
        })
        .await?;
        // And nothing the agents asked for themselves was refused.
        if let Some(audit) = env.audit_log() {
            for n in [&a, &b] {
                let user = format!("system:node:{n}");
                // The agent's own requests (this test's attacks use the same identity).
                let records: Vec<_> = audit
                    .records_of(&user)?
                    .into_iter()
                    .filter(|r| r.user_agent.starts_with("cocoon-node/"))
                    .collect();
                assert!(!records.is_empty(), "no audited request of {user}'s agent");
                let refused: Vec<_> = records.iter().filter(|r| r.code == 403).collect();
                assert!(refused.is_empty(), "{user}: refused requests: {refused:#?}");
            }
        }

        for child in &mut agents {
            let _ = child.kill().await;
        }
        let _ = run_kubectl(env, &["delete", "clusterrolebinding", &a]);
        let _ = run_kubectl(env, &["-n", "cocoon-nodes", "delete", "serviceaccount", &a]);
        cocoon_testenv::delete_namespace(&admin, &ns).await?;
        for n in [&a, &b] {
            let _ = nodes.delete(n, &DeleteParams::default()).await;
        }
        Ok::<(), BoxError>(())
    })
    .await;
}

/// The node agent's registry credential needs no delete (issue 26 item 5): the only delete a
/// node makes is the best-effort compensation of a hibernate whose `vm rm` failed
/// (node.md §8.2 step 6). Against a registry that refuses every DELETE (a pull+push
/// credential), that hibernate still compensates: the VM keeps running, its id is back on the
/// pod, the pod reports `failed`; a retried hibernate succeeds, and so does the wake.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hibernate_compensates_with_a_credential_that_cannot_delete() {
    use cocoon_runtime::sim::Verb;
    use cocoon_testsupport::{Agent, AgentOptions};
    cocoon_testenv::run_test(|env| async move {
        let registry = cocoon_testenv::Registry::start_temp_without_delete(None).await?;
        let reg = cocoon_testsupport::registry(registry.addr());
        let admin = env.client()?;
        let ns = cocoon_testenv::create_namespace(&admin, "nodel").await?;
        let node = unique_name("nodel");
        let _node = cocoon_testenv::TestNode::in_pool(&admin, &node, "default").await?;
        let tmp = tempfile::tempdir()?;
        let mut agent = Agent::start(
            admin.clone(),
            &node,
            &tmp.path().join(&node),
            registry.addr(),
            AgentOptions::default(),
        )
        .await?;
        let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns);
        pods.create(&PostParams::default(), &vm_pod(&ns, "p", &node, &[]))
            .await?;
        let vm = cocoon_api::naming::vm_name_for_pod(&ns, "p");
        wait_state(&pods, "p", "ready").await?;

        // The registry refuses deletes outright.
        assert!(
            reg.delete_tag_if_present(&vm, "hibernate").await.is_ok(),
            "nothing to delete yet: only a probe"
        );

        agent
            .sim
            .fail_next(Verb::Remove, 1, "injected: vm rm failed");
        let hibernate = |generation: &str| {
            merge(json!({"metadata": {"annotations": {
                ann::HIBERNATE: "true", ann::GENERATION: generation}}}))
        };
        pods.patch("p", &PatchParams::default(), &hibernate("2"))
            .await?;
        let p = wait_state(&pods, "p", "failed").await?;
        let msg = annotation(&p, ann::LIFECYCLE_STATE_MESSAGE).unwrap_or_default();
        assert!(
            msg.contains("remove vm"),
            "the Remove failure reported: {msg}"
        );
        assert!(agent.sim.vm_info(&vm).is_ok(), "the VM keeps running");
        assert!(
            annotation(&p, ann::VM_ID).is_some(),
            "the VM id is back on the pod (recoverable)"
        );
        // The compensating delete was refused, so the tag is still there.
        assert!(reg.has_manifest(&vm, "hibernate").await?, "tag left");
        assert!(
            reg.delete_tag_if_present(&vm, "hibernate").await.is_err(),
            "the registry refuses deletes"
        );

        // A retried hibernate (the operator's next generation) and the wake work.
        pods.patch("p", &PatchParams::default(), &hibernate("3"))
            .await?;
        let p = wait_state(&pods, "p", "hibernated").await?;
        assert!(annotation(&p, ann::VM_ID).is_none(), "VM id cleared");
        assert!(agent.sim.vm_info(&vm).is_err(), "VM removed");
        pods.patch(
            "p",
            &PatchParams::default(),
            &merge(json!({"metadata": {"annotations": {ann::HIBERNATE: null}}})),
        )
        .await?;
        wait_state(&pods, "p", "ready").await?;
        assert!(agent.sim.vm_info(&vm).is_ok(), "woken from the registry");

        agent.stop().await;
        cocoon_testenv::delete_namespace(&admin, &ns).await?;
        registry.shutdown();
        Ok::<(), BoxError>(())
    })
    .await;
}
