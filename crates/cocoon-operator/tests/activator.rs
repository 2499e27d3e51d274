//! Issue 39, wake on connect, on the real control plane: the set's Service and EndpointSlice
//! follow the set, a connection to the activator wakes an idle-suspended set once however
//! many connections arrive and is spliced to the VM when it is back, a user's suspend is not
//! woken, a foreign Service of the set's name is never touched, and a connection that waits
//! too long is closed with a Warning.
//!
//! Pods have no real node here, so the test plays the node and the CocoonSet controller: it
//! writes the main pod's VM IP and Ready, the set's phase, and runs a TCP echo listener as
//! "the VM". The API server refuses loopback endpoint addresses, so the activator listens on
//! [`ACTIVATOR_IP`] and the VM on [`VM_IP`], two /32s of the benchmarking range on `lo`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::idle::{self, IDLE_SUSPENDED, WOKEN_BY};
use cocoon_api::contract::labels;
use cocoon_api::crd::set::{CocoonSet, IdleSpec, WakeOn};
use cocoon_operator::activator::{self, POOL_CONFIGMAP, advertise, listen, plan, service};
use cocoon_operator::metrics::Metrics;
use cocoon_testsupport::AuditedIdentity;
use cocoon_testsupport::BoxError;
use cocoon_testsupport::scripted::{WAIT, nodes, recorder, spec};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

type TestResult = Result<(), BoxError>;

/// Where the activators of these tests listen.
const ACTIVATOR_IP: &str = "198.18.0.50";
/// Where "the VM" listens.
const VM_IP: &str = "198.18.0.51";
/// What the tenant writes into its main pod's `vm.cocoonstack.io/ip` (and `status.agents`):
/// nothing may route or dial there.
const DECOY_IP: &str = "198.18.0.52";
/// How many connections arrive at once.
const CLIENTS: usize = 20;

/// The service controller, one activator and its Lease, for one test: its own operator
/// namespace (pool ConfigMap, Lease) and its own activator port range.
struct Harness {
    opns: String,
    metrics: std::sync::Arc<Metrics>,
    stop: tokio::sync::broadcast::Sender<()>,
}

impl Harness {
    async fn start(
        admin: &Client,
        activator_client: &Client,
        ns: &str,
        first_port: u16,
        wake_wait: Duration,
        vm_networks: &[&str],
    ) -> Result<Self, BoxError> {
        Self::start_bounded(
            admin,
            activator_client,
            ns,
            first_port,
            wake_wait,
            vm_networks,
            100,
        )
        .await
    }

    /// [`Harness::start`] holding at most `max_connections`.
    async fn start_bounded(
        admin: &Client,
        activator_client: &Client,
        ns: &str,
        first_port: u16,
        wake_wait: Duration,
        vm_networks: &[&str],
        max_connections: usize,
    ) -> Result<Self, BoxError> {
        cocoon_testenv::ensure_loopback_address(ACTIVATOR_IP)?;
        cocoon_testenv::ensure_loopback_address(VM_IP)?;
        let opns = cocoon_testenv::create_namespace(admin, "act-op").await?;
        let config = activator::Config {
            addr: Some(ACTIVATOR_IP.parse()?),
            ports: plan::PortRange {
                first: first_port,
                last: first_port + 9,
            },
            wake_wait,
            max_connections,
            namespace: opns.clone(),
            identity: cocoon_testenv::unique_name("op"),
            vm_networks: vm_networks
                .iter()
                .map(|c| activator::wake::Cidr::parse(c).ok_or("cidr"))
                .collect::<Result<_, _>>()?,
        };
        let (stop, _) = tokio::sync::broadcast::channel::<()>(1);
        let on_stop = |s: &tokio::sync::broadcast::Sender<()>| {
            let mut rx = s.subscribe();
            async move {
                let _ = rx.recv().await;
            }
        };
        let metrics = std::sync::Arc::new(Metrics::new());
        let ctx = std::sync::Arc::new(service::Context::new(
            admin.clone(),
            recorder(admin),
            metrics.clone(),
            &config,
        ));
        let (ns_owned, stopped) = (ns.to_owned(), on_stop(&stop));
        tokio::spawn(async move { service::run(ctx, Some(&ns_owned), stopped).await });
        let act = listen::Activator::new(
            activator_client.clone(),
            recorder(activator_client),
            metrics.clone(),
            config.clone(),
            ACTIVATOR_IP.parse()?,
        );
        tokio::spawn(act.run(on_stop(&stop)));
        tokio::spawn(advertise::publish(
            admin.clone(),
            opns.clone(),
            config.identity.clone(),
            ACTIVATOR_IP.parse()?,
            on_stop(&stop),
        ));
        Ok(Harness {
            opns,
            metrics,
            stop,
        })
    }

    /// The activator port of `ns/set/port`, once the leader assigned it.
    async fn activator_port(
        &self,
        admin: &Client,
        ns: &str,
        set: &str,
        port: u16,
    ) -> Result<u16, BoxError> {
        let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), &self.opns);
        Ok(
            cocoon_testenv::wait_until("the activator port assigned", WAIT, || async {
                let cm = cms.get_opt(POOL_CONFIGMAP).await.ok()??;
                let pool = plan::decode_pool(cm.data.as_ref()?);
                plan::ports_of(&pool, ns, set).get(&port).copied()
            })
            .await?,
        )
    }

    /// The operator's idle suspend of `web`, then its slice pointing at the activator: the
    /// activator port serving `port`.
    async fn idle_suspended(&self, client: &Client, ns: &str, port: u16) -> Result<u16, BoxError> {
        idle_suspend(client, ns).await?;
        let act_port = self.activator_port(client, ns, "web", port).await?;
        wait_slice(client, ns, ACTIVATOR_IP, port, act_port).await?;
        Ok(act_port)
    }
}

impl Harness {
    /// How many passes the service controller ran so far.
    fn passes(&self) -> u64 {
        let text = self.metrics.render();
        text.lines()
            .find(|l| {
                l.starts_with(
                    "cocoon_operator_reconcile_duration_seconds_count{controller=\"cocoonset-service\"}",
                )
            })
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        let _ = self.stop.send(());
    }
}

/// A free port of [`VM_IP`] for "the VM".
async fn free_vm_port() -> Result<u16, BoxError> {
    Ok(TcpListener::bind((VM_IP, 0)).await?.local_addr()?.port())
}

/// "The VM": echoes every byte back on every connection, until dropped.
async fn echo(port: u16) -> Result<tokio::task::JoinHandle<()>, BoxError> {
    let listener = TcpListener::bind((VM_IP, port)).await?;
    Ok(tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    }))
}

/// A set `web` with `spec.idle.ports = [port]`, its main pod (VM IP [`VM_IP`]) on a fake
/// node, both as the controller and the node would have them while Running.
async fn running_set(
    client: &Client,
    ns: &str,
    pool: &str,
    node: &str,
    port: u16,
    wake_on: Vec<WakeOn>,
) -> Result<CocoonSet, BoxError> {
    let sets: Api<CocoonSet> = Api::namespaced(client.clone(), ns);
    let mut s = spec(pool, 0);
    s.idle = Some(IdleSpec {
        ports: vec![i32::from(port)],
        wake_on,
        ..IdleSpec::default()
    });
    let cs = sets
        .create(&PostParams::default(), &CocoonSet::new("web", s))
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    // The tenant's annotation names a decoy: the VM address is the node-written status.podIP.
    let mut pod = cocoon_testsupport::vm_pod(ns, "web-0", node, &[(ann::VM_IP, DECOY_IP)]);
    pod.metadata.labels = Some([(labels::COCOONSET_NAME.to_owned(), "web".to_owned())].into());
    pod.metadata.owner_references = Some(vec![cs.controller_owner_ref(&()).unwrap()]);
    pods.create(&PostParams::default(), &pod).await?;
    set_up(client, ns, true).await?;
    Ok(cs)
}

/// Plays the node and the set controller: the set Running with its main Ready (`up`), or
/// Suspended with its main not Ready.
async fn set_up(client: &Client, ns: &str, up: bool) -> TestResult {
    let sets: Api<CocoonSet> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let phase = if up { "Running" } else { "Suspended" };
    sets.patch_status(
        "web",
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": {"phase": phase, "agents": [
            {"slot": 0, "role": "main", "podName": "web-0", "ip": DECOY_IP}
        ]}})),
    )
    .await?;
    pods.patch_status(
        "web-0",
        &PatchParams::default(),
        &Patch::Merge(
            &json!({"status": {"phase": "Running", "podIP": VM_IP, "conditions": [
                {"type": "Ready", "status": if up { "True" } else { "False" }}
            ]}}),
        ),
    )
    .await?;
    Ok(())
}

/// The operator's idle suspend (its patch) and the node's suspended VM.
async fn idle_suspend(client: &Client, ns: &str) -> TestResult {
    let sets: Api<CocoonSet> = Api::namespaced(client.clone(), ns);
    let cs = sets.get("web").await?;
    let patch = idle::idle_suspend_patch(chrono::Utc::now(), &cs.resource_version().unwrap());
    sets.patch("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    set_up(client, ns, false).await
}

/// Waits until the set's slice lists exactly `address` with port `port` (named `p<set port>`).
async fn wait_slice(
    client: &Client,
    ns: &str,
    address: &str,
    set_port: u16,
    port: u16,
) -> TestResult {
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
    cocoon_testenv::wait_until(
        &format!("slice web-cocoon -> {address}:{port}"),
        WAIT,
        || async {
            let s = slices.get_opt("web-cocoon").await.ok()??;
            let addrs: Vec<&str> = s
                .endpoints
                .iter()
                .flat_map(|e| e.addresses.iter().map(String::as_str))
                .collect();
            let ports: Vec<(String, i32)> = s
                .ports
                .iter()
                .flatten()
                .map(|p| {
                    (
                        p.name.clone().unwrap_or_default(),
                        p.port.unwrap_or_default(),
                    )
                })
                .collect();
            (addrs == [address] && ports == [(format!("p{set_port}"), i32::from(port))])
                .then_some(())
        },
    )
    .await?;
    Ok(())
}

/// The events with `reason` regarding the set `web`, as (type, note).
async fn events(client: &Client, ns: &str, reason: &str) -> Vec<(String, String)> {
    let api: Api<Event> = Api::namespaced(client.clone(), ns);
    api.list(&ListParams::default())
        .await
        .map(|l| {
            l.items
                .into_iter()
                .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("web"))
                .filter(|e| e.reason.as_deref() == Some(reason))
                .map(|e| (e.type_.unwrap_or_default(), e.note.unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default()
}

async fn wait_event(client: &Client, ns: &str, reason: &str) -> Result<(String, String), BoxError> {
    Ok(
        cocoon_testenv::wait_until(&format!("event {reason}"), WAIT, || async {
            events(client, ns, reason).await.into_iter().next()
        })
        .await?,
    )
}

/// Connects to the activator, sends `msg`, reads until the peer closes or `msg.len()` bytes
/// came back.
async fn talk(port: u16, msg: String) -> Result<String, BoxError> {
    let addr: SocketAddr = format!("{ACTIVATOR_IP}:{port}").parse()?;
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(msg.as_bytes()).await?;
    let mut buf = vec![0u8; msg.len()];
    let mut got = 0;
    while got < buf.len() {
        let n = tokio::time::timeout(WAIT, s.read(&mut buf[got..])).await??;
        if n == 0 {
            break;
        }
        got += n;
    }
    Ok(String::from_utf8_lossy(&buf[..got]).into_owned())
}

/// The managers of the set's fields (`metadata.managedFields`).
fn managers(cs: &CocoonSet) -> Vec<String> {
    cs.metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.clone())
        .collect()
}

#[tokio::test]
async fn a_connection_wakes_an_idle_suspended_set_once_and_is_spliced_to_the_vm() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let Some(audit) = env.audit_log() else {
            return Err::<(), BoxError>("the test environment's audit log is unknown".into());
        };
        let ns = cocoon_testenv::create_namespace(&client, "act-wake").await?;
        let pool = cocoon_testenv::unique_name("pool");
        let node = nodes(&client, &pool, 1).await?;
        let identity = AuditedIdentity::new(env, &client, "act-wake-activator").await?;
        let h = Harness::start(
            &client,
            &identity.client,
            &ns,
            41000,
            WAIT,
            &["198.18.0.0/24"],
        )
        .await?;
        let port = free_vm_port().await?;
        running_set(&client, &ns, &pool, node[0].name(), port, vec![]).await?;

        // Running, main Ready: the Service has the set's port, the slice the VM.
        let services: Api<Service> = Api::namespaced(client.clone(), &ns);
        wait_slice(&client, &ns, VM_IP, port, port).await?;
        let svc = services.get("web").await?;
        let svc_spec = svc.spec.clone().unwrap_or_default();
        assert!(svc_spec.selector.is_none(), "{svc_spec:?}");
        let ports: Vec<_> = svc_spec
            .ports
            .iter()
            .flatten()
            .map(|p| (p.name.clone(), p.port))
            .collect();
        assert_eq!(ports, vec![(Some(format!("p{port}")), i32::from(port))]);
        assert_eq!(svc.owner_references()[0].kind, "CocoonSet");
        assert_eq!(svc.labels()[labels::COCOONSET_NAME], "web");

        // Idle-suspended: the slice points at the activator's port for the set's port.
        let act_port = h.idle_suspended(&client, &ns, port).await?;

        // 20 callers at once, while the VM is down.
        let callers: Vec<_> = (0..CLIENTS)
            .map(|i| tokio::spawn(talk(act_port, format!("hello-{i:02}"))))
            .collect();
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        let woken = cocoon_testenv::wait_until("the set resumed by a connection", WAIT, || async {
            let cs = sets.get("web").await.ok()?;
            (!cs.spec.suspend).then_some(cs)
        })
        .await?;
        assert_eq!(
            woken.annotations().get(WOKEN_BY).map(String::as_str),
            Some("connection")
        );
        assert!(!woken.annotations().contains_key(IDLE_SUSPENDED));
        assert!(
            managers(&woken)
                .iter()
                .any(|m| m == idle::ACTIVATOR_FIELD_MANAGER),
            "{:?}",
            managers(&woken)
        );

        // The node brings the VM back; every caller gets its bytes echoed.
        let _vm = echo(port).await?;
        set_up(&client, &ns, true).await?;
        for (i, caller) in callers.into_iter().enumerate() {
            assert_eq!(caller.await??, format!("hello-{i:02}"), "caller {i}");
        }
        // One resume write for the 20 callers (the audit log counts every attempt).
        identity.writes_in(&audit, &ns).await?;
        let set_writes: Vec<_> = audit
            .writes_of(&identity.user, &ns)?
            .into_iter()
            .filter(|r| r.resource == "cocoonsets")
            .collect();
        assert_eq!(set_writes.len(), 1, "{set_writes:?}");
        // The slice is the VM's again; a later connection is spliced at once.
        wait_slice(&client, &ns, VM_IP, port, port).await?;
        assert_eq!(talk(act_port, "again".into()).await?, "again");

        // The set goes: its Service and slice go with it (owner references).
        sets.delete("web", &DeleteParams::background()).await?;
        let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &ns);
        cocoon_testenv::wait_until("the Service and slice collected", WAIT, || async {
            let gone = services.get_opt("web").await.ok()?.is_none()
                && slices.get_opt("web-cocoon").await.ok()?.is_none();
            gone.then_some(())
        })
        .await?;
        drop(h);
        identity.delete(&client).await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn a_user_suspended_set_is_not_woken_and_the_connection_closes() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "act-user").await?;
        let pool = cocoon_testenv::unique_name("pool");
        let node = nodes(&client, &pool, 1).await?;
        let h = Harness::start(&client, &client, &ns, 41010, WAIT, &[]).await?;
        let port = free_vm_port().await?;
        running_set(&client, &ns, &pool, node[0].name(), port, vec![]).await?;
        let _vm = echo(port).await?;
        wait_slice(&client, &ns, VM_IP, port, port).await?;
        // The user's suspend (the plugin's: spec.suspend with the idle annotation removed).
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        let mut patch = idle::user_owns_suspend_patch();
        patch["spec"] = json!({"suspend": true});
        sets.patch("web", &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        set_up(&client, &ns, false).await?;
        let act_port = h.activator_port(&client, &ns, "web", port).await?;
        wait_slice(&client, &ns, ACTIVATOR_IP, port, act_port).await?;

        // Closed without a byte, however long the VM would take; the Event says why.
        let got = tokio::time::timeout(WAIT, talk(act_port, "hello".into())).await??;
        assert_eq!(got, "");
        let (kind, note) = wait_event(&client, &ns, idle::reasons::WAKE_IGNORED).await?;
        assert_eq!(kind, "Warning");
        assert!(note.contains("user suspended"), "{note}");
        let cs = sets.get("web").await?;
        assert!(cs.spec.suspend);
        assert!(
            !managers(&cs)
                .iter()
                .any(|m| m == idle::ACTIVATOR_FIELD_MANAGER)
        );
        Ok::<(), BoxError>(())
    })
    .await
}

#[tokio::test]
async fn a_connection_that_waits_past_the_bound_is_closed_with_a_warning() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "act-wait").await?;
        let pool = cocoon_testenv::unique_name("pool");
        let node = nodes(&client, &pool, 1).await?;
        let h = Harness::start(&client, &client, &ns, 41020, Duration::from_secs(3), &[]).await?;
        let port = free_vm_port().await?;
        running_set(
            &client,
            &ns,
            &pool,
            node[0].name(),
            port,
            vec![WakeOn::Connect],
        )
        .await?;
        wait_slice(&client, &ns, VM_IP, port, port).await?;
        let act_port = h.idle_suspended(&client, &ns, port).await?;

        // The set is resumed, but the VM never answers: closed after the bound, with a Warning.
        let started = std::time::Instant::now();
        let got = tokio::time::timeout(WAIT, talk(act_port, "hello".into())).await??;
        assert_eq!(got, "");
        assert!(
            started.elapsed() >= Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        let (kind, note) = wait_event(&client, &ns, idle::reasons::WAKE_WAIT_EXCEEDED).await?;
        assert_eq!(kind, "Warning");
        assert!(note.contains("waited"), "{note}");
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        assert!(!sets.get("web").await?.spec.suspend);
        Ok::<(), BoxError>(())
    })
    .await
}

#[tokio::test]
async fn a_foreign_service_of_the_sets_name_is_never_touched() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "act-svc").await?;
        let pool = cocoon_testenv::unique_name("pool");
        let node = nodes(&client, &pool, 1).await?;
        // The tenant's Service, named like the set before the set exists.
        let services: Api<Service> = Api::namespaced(client.clone(), &ns);
        let theirs = Service {
            metadata: kube::api::ObjectMeta {
                name: Some("web".into()),
                labels: Some(BTreeMap::from([("app".to_owned(), "theirs".to_owned())])),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                selector: Some(BTreeMap::from([("app".to_owned(), "theirs".to_owned())])),
                ports: Some(vec![ServicePort {
                    port: 9999,
                    ..ServicePort::default()
                }]),
                ..ServiceSpec::default()
            }),
            ..Default::default()
        };
        let before = services.create(&PostParams::default(), &theirs).await?;
        let h = Harness::start(&client, &client, &ns, 41030, WAIT, &[]).await?;
        let port = free_vm_port().await?;
        running_set(&client, &ns, &pool, node[0].name(), port, vec![]).await?;

        // Passes of the set after every fact is in (each touch of the set is one more): the
        // tenant's Service is still theirs, byte for byte, and no slice feeds it.
        let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &ns);
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        for touch in 0..2 {
            let seen = h.passes();
            sets.patch(
                "web",
                &PatchParams::default(),
                &Patch::Merge(
                    &json!({"metadata": {"annotations": {"test/touch": touch.to_string()}}}),
                ),
            )
            .await?;
            cocoon_testenv::wait_until("one more service pass", WAIT, || async {
                (h.passes() > seen).then_some(())
            })
            .await?;
        }
        let after = services.get("web").await?;
        assert_eq!(after.resource_version(), before.resource_version());
        assert!(after.owner_references().is_empty());
        assert_eq!(after.spec, before.spec);
        assert!(slices.get_opt("web-cocoon").await?.is_none());
        let (kind, note) = wait_event(&client, &ns, idle::reasons::SERVICE_CONFLICT).await?;
        assert_eq!(kind, "Warning");
        assert!(note.contains("not owned"), "{note}");
        Ok::<(), BoxError>(())
    })
    .await
}

#[tokio::test]
async fn a_vm_ip_outside_the_vm_networks_is_never_dialled() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "act-cidr").await?;
        let pool = cocoon_testenv::unique_name("pool");
        let node = nodes(&client, &pool, 1).await?;
        // The VMs live in 10.88.0.0/16; the main pod reports 198.18.0.51 (a listener there).
        let h = Harness::start(&client, &client, &ns, 41040, WAIT, &["10.88.0.0/16"]).await?;
        let port = free_vm_port().await?;
        running_set(&client, &ns, &pool, node[0].name(), port, vec![]).await?;
        let listener = TcpListener::bind((VM_IP, port)).await?;
        let act_port = h.idle_suspended(&client, &ns, port).await?;
        let caller = tokio::spawn(talk(act_port, "hello".into()));
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        cocoon_testenv::wait_until("the set resumed", WAIT, || async {
            (!sets.get("web").await.ok()?.spec.suspend).then_some(())
        })
        .await?;
        set_up(&client, &ns, true).await?;
        // Closed without a byte; nothing ever reached the address the pod named.
        assert_eq!(tokio::time::timeout(WAIT, caller).await???, "");
        let (kind, note) = wait_event(&client, &ns, idle::reasons::WAKE_IGNORED).await?;
        assert_eq!(kind, "Warning");
        assert!(note.contains("ACTIVATOR_VM_CIDRS"), "{note}");
        let reached = tokio::time::timeout(Duration::from_millis(500), listener.accept()).await;
        assert!(reached.is_err(), "the activator dialled {VM_IP}:{port}");
        Ok::<(), BoxError>(())
    })
    .await
}

#[tokio::test]
async fn beyond_the_most_held_connections_a_new_one_is_closed_with_a_warning() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "act-full").await?;
        let pool = cocoon_testenv::unique_name("pool");
        let node = nodes(&client, &pool, 1).await?;
        let h = Harness::start_bounded(&client, &client, &ns, 41050, WAIT, &[], 1).await?;
        let port = free_vm_port().await?;
        running_set(&client, &ns, &pool, node[0].name(), port, vec![]).await?;
        let act_port = h.idle_suspended(&client, &ns, port).await?;
        // One caller is held (its VM never comes back), the next is one too many.
        let held = tokio::spawn(talk(act_port, "first".into()));
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        cocoon_testenv::wait_until("the set resumed by the first caller", WAIT, || async {
            (!sets.get("web").await.ok()?.spec.suspend).then_some(())
        })
        .await?;
        let started = std::time::Instant::now();
        assert_eq!(talk(act_port, "second".into()).await?, "");
        assert!(started.elapsed() < WAIT, "{:?}", started.elapsed());
        let (kind, note) = wait_event(&client, &ns, idle::reasons::ACTIVATOR_FULL).await?;
        assert_eq!(kind, "Warning");
        assert!(note.contains("most connections (1)"), "{note}");
        assert!(!held.is_finished(), "the held caller was closed");
        held.abort();
        Ok::<(), BoxError>(())
    })
    .await
}
