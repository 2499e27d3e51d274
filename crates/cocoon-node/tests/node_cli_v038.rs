//! A node agent on the released `cocoon` CLI v0.3.8, proven on its recorded output: its
//! `VK_COCOON_BIN` is the replay stand-in of `cocoon-runtime`'s `tests/cli_v038/` (which also
//! says where the recordings live), and it runs as a Node of the real control plane: it
//! registers, adopts the recorded VM (which `vm list` calls `running` and `inspect` calls
//! `stopped (stale)`), and `kubectl exec` / `kubectl logs` report the missing verbs; a Windows
//! hibernate fails with `HibernateNetResizeFailed`. The runtime's own half (detection, parsers,
//! classifier, tar reader, every replayed verb) is `cocoon-runtime`'s `runtime_cli_v038.rs`.

#[path = "../../cocoon-runtime/tests/cli_v038/mod.rs"]
mod cli_v038;
mod common;

use std::process::Stdio;
use std::sync::Arc;

use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::{AnnotationCodec, Lifecycle, LifecycleState};
use cocoon_node::agent::{AgentParts, AgentPodBackend, run_agent};
use cocoon_node::kubelet::{KubeletServer, TlsMaterial};
use cocoon_node::metrics::NodeMetrics;
use cocoon_node::node::{HostReader, LEASE_NAMESPACE, NodeRegistration, capacity};
use cocoon_node::pods::{OrphanPolicy, PodConfig};
use cocoon_runtime::BackendChoice;
use cocoon_testenv::{Shared, TEST_NAMESPACE_LABEL, run_test, unique_name, wait_until};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use tokio_util::sync::CancellationToken;

use cli_v038::{Replay, VM_ID, VM_NAME};

/// The namespace and pod whose legacy unhashed VM name the recorded VM carries.
const LEGACY_NS: &str = "ns";
const LEGACY_POD: &str = "demo-0";

/// Creates namespace `name` (labelled as a test namespace) unless it exists.
async fn ensure_namespace(client: &kube::Client, name: &str) -> common::TestResult {
    use k8s_openapi::api::core::v1::Namespace;
    let api: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some([(TEST_NAMESPACE_LABEL.to_string(), "true".to_string())].into()),
            ..Default::default()
        },
        ..Default::default()
    };
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// A pod that adopts the recorded VM `vm`, with lifecycle `ready` (nothing owed).
fn adopting_pod(ns: &str, name: &str, node: &str, vm: &str, extra: &[(&str, &str)]) -> Pod {
    let mut a = vec![
        (ann::VM_NAME, vm),
        (ann::IMAGE, "tinyimg"),
        (ann::LIFECYCLE_STATE, "ready"),
        (ann::LIFECYCLE_OBSERVED_GENERATION, "1"),
    ];
    a.extend_from_slice(extra);
    common::vm_pod(ns, name, node, &a)
}

async fn kubectl(env: &Shared, args: &[&str]) -> (Option<i32>, String, String) {
    let mut cmd = tokio::process::Command::from(env.kubectl());
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let out = tokio::time::timeout(common::WAIT, cmd.output())
        .await
        .expect("kubectl finishes")
        .expect("kubectl runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn node_agent_on_cocoon_v038_registers_adopts_and_reports_missing_verbs() {
    run_test(|env| async move {
        let client = env.client()?;
        // The recorded VM carries the legacy unhashed name `vk-ns-demo-0`, which tenant
        // isolation keeps only for pod `demo-0` of namespace `ns` adopting it by its id.
        let ns = LEGACY_NS.to_string();
        ensure_namespace(&client, &ns).await?;
        let node = unique_name("cli-v038");
        let tmp = tempfile::tempdir()?;
        let root = tmp.path().join("root");
        std::fs::create_dir_all(&root)?;
        let replay = Replay::new();
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        // Bound before the agent starts, so the startup reconcile adopts it by its id.
        let _ = api
            .delete(LEGACY_POD, &DeleteParams::default().grace_period(0))
            .await;
        wait_until("no stale demo-0", common::WAIT, || async {
            matches!(api.get_opt(LEGACY_POD).await, Ok(None)).then_some(())
        })
        .await?;
        api.create(
            &PostParams::default(),
            &adopting_pod(
                &ns,
                LEGACY_POD,
                &node,
                VM_NAME,
                &[
                    (ann::VM_ID, VM_ID),
                    (ann::OS, "windows"),
                    (ann::BACKEND, "cloud-hypervisor"),
                ],
            ),
        )
        .await?;

        // The agent as the binary composes it: the runtime from `VK_COCOON_BIN`.
        let token = CancellationToken::new();
        let backend = Arc::new(AgentPodBackend::default());
        let metrics = Arc::new(NodeMetrics::new(root.clone()));
        let tls = TlsMaterial::self_signed(&node, "127.0.0.1".parse()?)?;
        let kubelet = KubeletServer::start(
            "127.0.0.1:0".parse()?,
            &tls,
            common::kubelet_security(env, &node, &[], false)?,
            backend.clone(),
            HostReader::new(root.clone()),
            metrics.clone(),
            &node,
            &token,
        )
        .await?;
        let config = common::node_config(
            env,
            &node,
            &root,
            kubelet.port(),
            &[
                ("VK_COCOON_BIN", replay.bin().display().to_string()),
                ("VK_ORPHAN_POLICY", "keep".to_owned()),
            ],
        )?;
        assert_eq!(config.runtime, BackendChoice::Cocoon { bin: replay.bin() });
        let (runtime, sim) = config.runtime.open(|_| None).await?;
        assert!(sim.is_none());
        let resources = capacity::read_resources(&config)?;
        let parts = AgentParts {
            pods: PodConfig {
                node_name: node.clone(),
                orphan_policy: OrphanPolicy::parse("keep"),
                leases_path: root.join("leases.json"),
                restore_mode: "ondemand".into(),
                cocoon_root_dir: root.clone(),
                timing: common::fast_timing(),
                clone_from_dir_roots: Vec::new(),
                host_reach: Default::default(),
                tenant: Default::default(),
            },
            client: client.clone(),
            runtime,
            registry: Some(common::registry(env.registry_addr())),
            metrics,
            registration: Some(NodeRegistration::from_config(
                &config,
                resources,
                kubelet.port(),
            )),
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        let t = token.clone();
        let task = tokio::spawn(async move {
            if let Err(e) = run_agent(parts, t, Some(tx)).await {
                eprintln!("agent failed: {e}");
            }
        });
        let handler = tokio::time::timeout(common::WAIT, rx).await??;
        backend.set(handler.clone());

        // Registers.
        let nodes: Api<Node> = Api::all(client.clone());
        wait_until(&format!("node {node} registered"), common::WAIT, || async {
            nodes.get_opt(&node).await.ok().flatten()
        })
        .await?;

        // Adopts the recorded VM by its id, and believes `inspect`, not the listing.
        let key = format!("{ns}/{LEGACY_POD}");
        let tracked = handler.tracked_vm(&key).ok_or("demo-0 adopted")?;
        assert_eq!(tracked.id(), VM_ID);
        assert_eq!(tracked.record.state, "stopped (stale)");
        assert!(
            replay.calls().contains(&format!("vm inspect -- {VM_ID}")),
            "{:?}",
            replay.calls()
        );
        wait_until(
            "demo-0 annotated with the adopted VM id",
            common::WAIT,
            || async {
                let p = api.get(LEGACY_POD).await.ok()?;
                (common::ann_of(&p, ann::VM_ID).as_deref() == Some(VM_ID)).then_some(())
            },
        )
        .await?;

        // kubectl exec: a failure naming the missing verb, not the CLI's help and exit 0.
        let (code, stdout, stderr) = kubectl(
            env,
            &["exec", "-n", &ns, LEGACY_POD, "--", "sh", "-c", "exit 3"],
        )
        .await;
        assert!(code.is_some_and(|c| c != 0 && c != 3), "{code:?} {stderr}");
        assert!(
            stderr.contains("the installed cocoon CLI has no vm exec"),
            "{stderr}"
        );
        assert!(!stdout.contains("Manage virtual machines"), "{stdout}");

        // kubectl logs: a readable error naming the missing verb.
        let (code, _stdout, stderr) = kubectl(env, &["logs", "-n", &ns, LEGACY_POD]).await;
        assert_ne!(code, Some(0), "{stderr}");
        assert!(
            stderr.contains("the installed cocoon CLI has no vm logs"),
            "{stderr}"
        );

        // A Windows hibernate on cloud-hypervisor needs `vm net --nics`: the spec's failure.
        common::patch_ann(
            &client,
            &ns,
            LEGACY_POD,
            serde_json::json!({ann::HIBERNATE: "true", ann::GENERATION: "2"}),
        )
        .await?;
        let p = common::wait_lifecycle(&client, &ns, LEGACY_POD, LifecycleState::Failed, 2).await?;
        let msg = Lifecycle::from_meta(&p.metadata).message;
        assert!(
            msg.contains(&format!("drop NIC pre-hibernate {VM_NAME}:"))
                && msg.contains("the installed cocoon CLI has no vm net"),
            "{msg}"
        );
        let events: Api<Event> = Api::namespaced(client.clone(), &ns);
        wait_until("HibernateNetResizeFailed event", common::WAIT, || async {
            let list = events
                .list(&ListParams::default().fields(&format!("involvedObject.name={LEGACY_POD}")))
                .await
                .ok()?;
            list.items
                .iter()
                .any(|e| e.reason.as_deref() == Some("HibernateNetResizeFailed"))
                .then_some(())
        })
        .await?;

        // Nothing reached the CLI as exec, logs or net.
        let calls = replay.calls();
        assert!(
            calls.iter().all(|c| !c.starts_with("vm exec")
                && !c.starts_with("vm logs")
                && !c.starts_with("vm net")),
            "{calls:?}"
        );

        token.cancel();
        let _ = task.await;
        kubelet.shutdown().await;
        let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
        let _ = leases.delete(&node, &DeleteParams::default()).await;
        let _ = nodes.delete(&node, &DeleteParams::default()).await;
        let _ = api
            .delete(LEGACY_POD, &DeleteParams::default().grace_period(0))
            .await;
        Ok::<(), common::BoxError>(())
    })
    .await;
}
