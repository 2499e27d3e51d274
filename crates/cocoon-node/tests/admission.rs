//! Kubelet-grade admission on the node (issue 35 items 3 and 4), on the real control plane
//! with an in-process agent on the simulator, as an attacker in namespace A against a victim
//! in namespace B:
//!
//! * item 3: an unmanaged pod of A may not pre-assign B's VM IP (nor an IP outside the node's
//!   `VK_UNMANAGED_IP_CIDRS`), never publishes it as its `status.podIP`, and an admitted
//!   unmanaged pod with a `probe-port` is never probed from the host;
//! * item 4: a pod bound straight to the node (`spec.nodeName`) whose requests exceed the
//!   allocatable the agent publishes is rejected as a kubelet rejects it (phase `Failed`,
//!   reason `OutOfcpu` / `OutOfmemory` / `OutOfephemeral-storage`, the kubelet's message, a
//!   Warning Event) before any runtime call, holding nothing.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use common::{
    AgentOptions, BoxError, TestResult, WAIT, ann_of, cleanup_node, is_ready, kill_and_delete,
    node_config, run_pod, start_agent_with, two_tenants, vm_pod, wait_refused,
};

use cocoon_api::contract::annotations as ann;
use cocoon_api::naming::vm_name_for_pod;
use cocoon_node::node::NodeRegistration;
use cocoon_node::pods::TenantConfig;
use cocoon_node::pods::unmanaged_ip::parse_ranges;
use cocoon_runtime::sim::Verb;
use cocoon_testenv::{TestNode, run_test, unique_name, wait_until};
use k8s_openapi::api::core::v1::{Node, Pod, ResourceRequirements};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::Client;
use kube::api::{Api, ListParams, PostParams};

/// The pod's `status.podIP` and every `status.podIPs` entry, each once.
fn pod_ips(p: &Pod) -> Vec<String> {
    let st = p.status.as_ref();
    st.and_then(|s| s.pod_ip.clone())
        .into_iter()
        .chain(
            st.and_then(|s| s.pod_ips.clone())
                .into_iter()
                .flatten()
                .map(|i| i.ip),
        )
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// The simulator calls that bring a VM up, remove or save one, or name any of `refs` (a VM
/// name or id) other than the read-only lookup of an unmanaged pod's pre-assigned id (which
/// must not name a runtime VM, issue 26).
fn calls_on(agent: &common::TestAgent, refs: &[String]) -> Vec<cocoon_runtime::sim::Call> {
    agent
        .sim
        .calls()
        .into_iter()
        .filter(|c| {
            matches!(
                c.verb,
                Verb::Run | Verb::Clone | Verb::Remove | Verb::SnapshotSave
            ) || (c.verb != Verb::Inspect && c.targets.iter().any(|t| refs.contains(t)))
        })
        .collect()
}

/// An unmanaged pod of `ns` on `node` with the pre-assigned id and IP, plus `extra`.
fn unmanaged(ns: &str, name: &str, node: &str, ip: &str, extra: &[(&str, &str)]) -> Pod {
    let id = format!("ext-{name}");
    let mut a = vec![
        (ann::MANAGED, "false"),
        (ann::VM_ID, id.as_str()),
        (ann::VM_IP, ip),
    ];
    a.extend_from_slice(extra);
    vm_pod(ns, name, node, &a)
}

/// Item 3, as numbered steps: B's managed VM has IP X; A's unmanaged pods pre-assigning X or
/// an IP outside the node's ranges are refused; A never gets X as its pod IP; B's pod keeps
/// X and stays Ready; an admitted unmanaged pod with a probe-port gets no connection from the
/// host.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unmanaged_pods_claim_only_free_ips_in_the_nodes_ranges_and_are_never_probed() {
    run_test(|env| async move {
        let client = env.client()?;
        let (ns_a, ns_b, api_a, api_b) = two_tenants(&client, "ip-a", "ip-b").await?;
        let tmp = tempfile::tempdir()?;
        let node = unique_name("node");
        let _node_obj = TestNode::in_pool(&client, &node, "default").await?;
        // The host's own address, where this test listens as a stand-in for whatever the
        // host could reach; the node's ranges cover it, the simulator's DHCP pool
        // (10.88.0.0/16, an administrator who let the ranges overlap it) and nothing else.
        let host_ip = cocoon_node::config::first_non_loopback_ipv4()
            .ok_or("the test host has no non-loopback IPv4 address")?;
        let ranges = format!("10.88.0.0/16, {host_ip}/32");
        let opts = AgentOptions {
            tenant: TenantConfig {
                unmanaged_ip_ranges: parse_ranges(&ranges)?,
                ..TenantConfig::default()
            },
            ..AgentOptions::new(tmp.path())
        };
        let agent = start_agent_with(
            env.client()?,
            env.registry_addr(),
            &node,
            tmp.path(),
            opts,
            |_| Ok(()),
        )
        .await?;

        // 1. B's managed pod runs with IP X (a DHCP lease of the node).
        let victim = run_pod(&client, &ns_b, "victim", &node, &[]).await?;
        let x = ann_of(&victim, ann::VM_IP).ok_or("the victim has an IP")?;
        assert!(x.starts_with("10.88."), "a lease of the simulator's pool: {x}");
        agent.sim.clear_calls();

        // 2. A's unmanaged pod pre-assigning X is refused: X is B's.
        api_a
            .create(
                &PostParams::default(),
                &unmanaged(&ns_a, "steal", &node, &x, &[]),
            )
            .await?;
        let msg = wait_refused(&client, &ns_a, "steal", "create").await?;
        assert_eq!(
            msg,
            format!("annotation vm.cocoonstack.io/ip: {x} is already used by another pod on this node")
        );

        // 3. One outside the node's ranges is refused, naming the variable and the ranges.
        api_a
            .create(
                &PostParams::default(),
                &unmanaged(&ns_a, "outside", &node, "198.51.100.7", &[]),
            )
            .await?;
        let msg = wait_refused(&client, &ns_a, "outside", "create").await?;
        assert_eq!(
            msg,
            format!(
                "annotation vm.cocoonstack.io/ip: 198.51.100.7 lies outside this node's VK_UNMANAGED_IP_CIDRS (10.88.0.0/16, {host_ip}/32)"
            )
        );

        // 4. Neither of A's pods publishes an IP, let alone X; nothing reached the runtime.
        for name in ["steal", "outside"] {
            let p = api_a.get(name).await?;
            assert!(pod_ips(&p).is_empty(), "{name}: {:?}", p.status);
            assert!(!is_ready(&p), "{name} not ready");
        }
        let refs: Vec<String> = ["steal", "outside", "static"]
            .iter()
            .flat_map(|n| [format!("ext-{n}"), vm_name_for_pod(&ns_a, n)])
            .collect();
        assert_eq!(calls_on(&agent, &refs), vec![]);

        // 5. B's pod still runs, Ready, with X as its annotation and its pod IP.
        let v = api_b.get("victim").await?;
        assert!(is_ready(&v), "the victim stays ready");
        assert_eq!(ann_of(&v, ann::VM_IP).as_deref(), Some(x.as_str()));
        assert_eq!(pod_ips(&v), vec![x.clone()]);
        assert!(
            agent
                .sim
                .vm_info(&vm_name_for_pod(&ns_b, "victim"))?
                .alive
        );

        // 6. An admitted unmanaged pod with a probe-port on an address the host can reach is
        //    Ready without the host ever connecting to it.
        let listener = tokio::net::TcpListener::bind((host_ip, 0)).await?;
        let port = listener.local_addr()?.port();
        let peers: Arc<Mutex<Vec<std::net::SocketAddr>>> = Arc::default();
        let seen = peers.clone();
        let accepting = tokio::spawn(async move {
            while let Ok((_, peer)) = listener.accept().await {
                seen.lock().expect("peers").push(peer);
            }
        });
        let port_s = port.to_string();
        api_a
            .create(
                &PostParams::default(),
                &unmanaged(
                    &ns_a,
                    "static",
                    &node,
                    &host_ip.to_string(),
                    &[(ann::PROBE_PORT, port_s.as_str())],
                ),
            )
            .await?;
        let p = wait_until("the static toolbox ready", WAIT, || {
            let api = api_a.clone();
            async move { api.get("static").await.ok().filter(is_ready) }
        })
        .await?;
        assert_eq!(pod_ips(&p), vec![host_ip.to_string()]);
        // The listen queue is FIFO: a probe made before Ready would be accepted before this
        // marker connection, so once the marker is accepted, it must be the only peer.
        let marker = tokio::net::TcpStream::connect((host_ip, port)).await?;
        let mine = marker.local_addr()?;
        let all = wait_until("the marker connection accepted", WAIT, || {
            let peers = peers.clone();
            async move {
                let p = peers.lock().expect("peers").clone();
                p.contains(&mine).then_some(p)
            }
        })
        .await?;
        assert_eq!(all, vec![mine], "the host probed the unmanaged pod's IP");
        accepting.abort();
        assert_eq!(calls_on(&agent, &refs), vec![]);

        kill_and_delete(&client, agent, &[&ns_a, &ns_b]).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

/// A pod's only container requesting `requests`.
fn with_requests(mut p: Pod, requests: &[(&str, &str)]) -> Pod {
    let r: BTreeMap<String, Quantity> = requests
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
        .collect();
    if let Some(c) = p.spec.as_mut().and_then(|s| s.containers.first_mut()) {
        c.resources = Some(ResourceRequirements {
            requests: Some(r),
            ..Default::default()
        });
    }
    p
}

/// Waits until the pod is `Failed` with `reason` and a Warning Event of that reason with
/// `message` names this incarnation; returns the pod.
async fn wait_rejected(
    client: &Client,
    ns: &str,
    name: &str,
    reason: &str,
    message: &str,
) -> TestResult<Pod> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let p = wait_until(&format!("{ns}/{name} rejected"), WAIT, || {
        let api = api.clone();
        async move {
            let p = api.get(name).await.ok()?;
            let st = p.status.as_ref()?;
            (st.phase.as_deref() == Some("Failed")).then_some(p)
        }
    })
    .await?;
    let st = p.status.clone().unwrap_or_default();
    assert_eq!(
        (st.reason.as_deref(), st.message.as_deref()),
        (
            Some(reason),
            Some(format!("Pod was rejected: {message}").as_str())
        ),
        "{name}"
    );
    let uid = p.metadata.uid.clone().unwrap_or_default();
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    wait_until(&format!("{ns}/{name}: {reason} event"), WAIT, || {
        let events = events.clone();
        let uid = uid.clone();
        async move {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.type_.as_deref() == Some("Warning")
                    && e.note.as_deref() == Some(message)
                    && e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == Some(uid.as_str())
            })
        }
    })
    .await?;
    Ok(p)
}

/// Item 4, as numbered steps: on a node publishing 4 CPUs, 8Gi and 100Gi (80 % allocatable),
/// pods of A bound straight to it with 100000 CPUs, 1Ti of memory or 1Pi of disk are
/// rejected as a kubelet rejects them, before any runtime call; B's pod keeps running, and a
/// normal pod of A still runs afterwards (the rejected ones hold nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pods_bound_to_the_node_are_admitted_against_its_allocatable() {
    run_test(|env| async move {
        let client = env.client()?;
        let (ns_a, ns_b, api_a, api_b) = two_tenants(&client, "res-a", "res-b").await?;
        let tmp = tempfile::tempdir()?;
        let node = unique_name("node");
        let config = node_config(
            env,
            &node,
            tmp.path(),
            10250,
            &[
                ("VK_NODE_CPU", "4".to_owned()),
                ("VK_NODE_MEM", "8Gi".to_owned()),
                ("VK_NODE_STORAGE", "100Gi".to_owned()),
            ],
        )?;
        let resources = cocoon_node::node::capacity::read_resources(&config)?;
        let opts = AgentOptions {
            registration: Some(NodeRegistration::from_config(&config, resources, 10250)),
            ..AgentOptions::new(tmp.path())
        };
        let agent = start_agent_with(
            env.client()?,
            env.registry_addr(),
            &node,
            tmp.path(),
            opts,
            |_| Ok(()),
        )
        .await?;
        // What the agent publishes is what it admits against.
        let published = Api::<Node>::all(client.clone()).get(&node).await?;
        let alloc = published
            .status
            .and_then(|s| s.allocatable)
            .ok_or("allocatable published")?;
        let q = |k: &str| alloc.get(k).map(|v| v.0.clone()).unwrap_or_default();
        assert_eq!(q("cpu"), "3200m");
        let memory: u128 = q("memory").parse()?;
        let storage: u128 = q("ephemeral-storage").parse()?;

        // 1. B's pod runs with 1 CPU and 1Gi.
        api_b
            .create(
                &PostParams::default(),
                &with_requests(
                    vm_pod(&ns_b, "victim", &node, &[]),
                    &[("cpu", "1"), ("memory", "1Gi")],
                ),
            )
            .await?;
        common::wait_running(&client, &ns_b, "victim").await?;
        let vm_b = vm_name_for_pod(&ns_b, "victim");
        let token_b = agent.sim.guest_token(&vm_b)?;
        agent.sim.clear_calls();

        // 2. A binds pods straight to the node, each beyond one allocatable resource.
        let hogs: [(&str, (&str, &str), String, String); 3] = [
            (
                "cpu-hog",
                ("cpu", "100000"),
                "OutOfcpu".into(),
                "Node didn't have enough resource: cpu, requested: 100000000, used: 1000, capacity: 3200".into(),
            ),
            (
                "mem-hog",
                ("memory", "1Ti"),
                "OutOfmemory".into(),
                format!(
                    "Node didn't have enough resource: memory, requested: {}, used: {}, capacity: {memory}",
                    1u128 << 40,
                    1u128 << 30
                ),
            ),
            (
                "disk-hog",
                ("ephemeral-storage", "1Pi"),
                "OutOfephemeral-storage".into(),
                format!(
                    "Node didn't have enough resource: ephemeral-storage, requested: {}, used: 0, capacity: {storage}",
                    1u128 << 50
                ),
            ),
        ];
        for (name, request, _, _) in &hogs {
            api_a
                .create(
                    &PostParams::default(),
                    &with_requests(vm_pod(&ns_a, name, &node, &[]), &[*request]),
                )
                .await?;
        }
        // 3. Each ends Failed with the kubelet's reason and message, and a Warning Event.
        for (name, _, reason, message) in &hogs {
            let p = wait_rejected(&client, &ns_a, name, reason, message).await?;
            assert!(pod_ips(&p).is_empty(), "{name}: no pod IP");
            assert_eq!(ann_of(&p, ann::VM_ID), None, "{name}: no VM");
        }
        // 4. No runtime call was made for them (nor any bring-up at all).
        let refs: Vec<String> = hogs
            .iter()
            .map(|(name, ..)| vm_name_for_pod(&ns_a, name))
            .collect();
        assert_eq!(calls_on(&agent, &refs), vec![]);
        for vm in &refs {
            assert!(agent.sim.vm_info(vm).is_err(), "{vm}: no VM");
        }

        // 5. B's VM is untouched; a normal pod of A that fits only if the rejected pods hold
        //    nothing (1 + 2 of 3.2 CPUs) still runs.
        let v = api_b.get("victim").await?;
        assert!(is_ready(&v), "B's pod stays ready");
        assert_eq!(agent.sim.guest_token(&vm_b)?, token_b);
        api_a
            .create(
                &PostParams::default(),
                &with_requests(vm_pod(&ns_a, "normal", &node, &[]), &[("cpu", "2")]),
            )
            .await?;
        common::wait_running(&client, &ns_a, "normal").await?;

        // 6. And the node is now full: one more CPU is refused, counting both running pods.
        api_a
            .create(
                &PostParams::default(),
                &with_requests(vm_pod(&ns_a, "one-more", &node, &[]), &[("cpu", "1")]),
            )
            .await?;
        wait_rejected(
            &client,
            &ns_a,
            "one-more",
            "OutOfcpu",
            "Node didn't have enough resource: cpu, requested: 1000, used: 3000, capacity: 3200",
        )
        .await?;

        kill_and_delete(&client, agent, &[&ns_a, &ns_b]).await?;
        cleanup_node(env, &node).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}
