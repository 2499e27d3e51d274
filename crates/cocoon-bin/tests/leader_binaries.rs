//! Leader election with two real `cocoon-operator run` binaries, each with its own
//! ServiceAccount of `cocoon-system` (the API server audits those), its own identity and short
//! election timings, electing on a Lease in the test's namespace.
//!
//! 1. While one replica holds the Lease the standby makes no API write (its only writes would
//!    be Lease attempts, the election itself) and runs no reconcile pass at all: no per-object
//!    requeue churn, as its debug log of passes shows.
//! 2. The leader is paused (SIGSTOP) mid-pass, past the lease duration: its registry
//!    requests go through a proxy the test holds, so the pass is stopped between its
//!    `:hibernate` read and the pod create that follows. The standby takes over and
//!    reconciles the set. The old leader, resumed (SIGCONT) with its elector flag still set,
//!    gets its registry answer, skips the create and ends the pass: no write request of it
//!    after the resume but to its Lease.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cocoon_api::contract::finalizers;
use cocoon_api::crd::set::{CocoonSet, CocoonSetSpec};
use cocoon_testenv::{AuditRecord, Shared, unique_name};
use cocoon_testsupport::BoxError;
use cocoon_testsupport::binaries::LoggedChild;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(90);
/// Short election timings (flags of the binary): 3 s lease, 2 s renew deadline, 300 ms retry.
const LEASE_DURATION: &str = "3s";
const RENEW_DEADLINE: &str = "2s";
const RETRY_PERIOD: &str = "300ms";
/// The standby is watched for this many Lease renewals of the leader (about 6 s, three times
/// the 2 s a standby used to requeue every object at).
const RENEWALS_WATCHED: usize = 20;
const WRITE_VERBS: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn kubectl(env: &Shared, args: &[&str]) -> Result<String, BoxError> {
    let out = env.kubectl().args(args).output()?;
    if !out.status.success() {
        return Err(format!("kubectl {}: {}", args.join(" "), text(&out.stderr)).into());
    }
    Ok(text(&out.stdout))
}

/// A ServiceAccount `name` of cocoon-system bound to cluster-admin (this test is about who
/// writes, not about RBAC), and a kubeconfig that authenticates with its token.
fn replica_account(env: &Shared, name: &str, dir: &Path) -> Result<PathBuf, BoxError> {
    kubectl(
        env,
        &["-n", "cocoon-system", "create", "serviceaccount", name],
    )?;
    kubectl(
        env,
        &[
            "create",
            "clusterrolebinding",
            name,
            "--clusterrole",
            "cluster-admin",
            "--serviceaccount",
            &format!("cocoon-system:{name}"),
        ],
    )?;
    Ok(env.service_account_kubeconfig("cocoon-system", name, "1h", dir)?)
}

fn cleanup_account(env: &Shared, name: &str) {
    let _ = kubectl(
        env,
        &["delete", "clusterrolebinding", name, "--ignore-not-found"],
    );
    let _ = kubectl(
        env,
        &[
            "-n",
            "cocoon-system",
            "delete",
            "serviceaccount",
            name,
            "--ignore-not-found",
        ],
    );
}

/// A TCP proxy to the registry that, while closed, holds what clients send (a request
/// already on a pooled connection included) until it is opened again.
struct HoldingProxy {
    addr: String,
    open: tokio::sync::watch::Sender<bool>,
    /// Client reads that had to wait for the proxy to open.
    held: Arc<AtomicUsize>,
}

impl HoldingProxy {
    async fn start(upstream: &str) -> Result<Self, BoxError> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let open = tokio::sync::watch::Sender::new(true);
        let held = Arc::new(AtomicUsize::new(0));
        let (upstream, gate, count) = (upstream.to_string(), open.clone(), held.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                    continue;
                };
                let (mut from_client, mut to_client) = client.into_split();
                let (mut from_server, mut to_server) = server.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
                });
                let (mut rx, count) = (gate.subscribe(), count.clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 16 * 1024];
                    loop {
                        let n = match from_client.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        if !*rx.borrow_and_update() {
                            count.fetch_add(1, Ordering::SeqCst);
                            if rx.wait_for(|open| *open).await.is_err() {
                                break;
                            }
                        }
                        if to_server.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        Ok(HoldingProxy { addr, open, held })
    }

    fn set_open(&self, open: bool) {
        self.open.send_replace(open);
    }
}

/// One replica: the binary, its identity and the lines of its JSON log.
struct Replica {
    identity: String,
    user: String,
    child: tokio::process::Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl Replica {
    fn spawn(
        kubeconfig: &Path,
        registry: &str,
        account: &str,
        identity: &str,
        ns: &str,
    ) -> Result<Self, BoxError> {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_cocoon-operator"));
        cmd.arg("run")
            .args([
                format!("--leader-elect-lease-duration={LEASE_DURATION}"),
                format!("--leader-elect-renew-deadline={RENEW_DEADLINE}"),
                format!("--leader-elect-retry-period={RETRY_PERIOD}"),
            ])
            .env("KUBECONFIG", kubeconfig)
            .env("OCI_REGISTRY", registry)
            .env("POD_NAME", identity)
            .env("POD_NAMESPACE", ns)
            .env("WATCH_NAMESPACE", ns)
            .env("METRICS_ADDR", "127.0.0.1:0")
            .env("PROBE_ADDR", "127.0.0.1:0")
            .env("OPERATOR_LOG_FORMAT", "json")
            // Every pass logs `reconciled` at debug.
            .env("OPERATOR_LOG_LEVEL", "info,cocoon_operator=debug");
        // The log goes to stdout.
        let LoggedChild { child, lines: log } = LoggedChild::spawn(cmd)?;
        Ok(Replica {
            identity: identity.to_string(),
            user: format!("system:serviceaccount:cocoon-system:{account}"),
            child,
            log,
        })
    }

    /// Lines logged so far.
    fn log_lines(&self) -> usize {
        self.log.lock().map_or(0, |l| l.len())
    }

    /// Reconcile passes this replica ran so far (each logs `reconciled`, ok or failed).
    fn passes(&self) -> usize {
        self.log.lock().map_or(0, |l| {
            l.iter()
                .filter(|line| {
                    line.contains(r#""message":"reconciled""#)
                        || line.contains(r#""message":"reconcile failed""#)
                })
                .count()
        })
    }

    fn log_has(&self, needle: &str) -> bool {
        self.log
            .lock()
            .is_ok_and(|l| l.iter().any(|line| line.contains(needle)))
    }

    fn log_tail(&self) -> String {
        self.log.lock().map_or(String::new(), |l| {
            l.iter()
                .rev()
                .take(40)
                .rev()
                .cloned()
                .collect::<Vec<_>>()
                .join("\n")
        })
    }

    async fn signal(&self, sig: &str) -> Result<(), BoxError> {
        let pid = self.child.id().ok_or("exited")?;
        let status = tokio::process::Command::new("kill")
            .args([format!("-{sig}"), pid.to_string()])
            .status()
            .await?;
        if !status.success() {
            return Err(format!("kill -{sig} {pid}").into());
        }
        Ok(())
    }

    async fn stop(mut self) -> Result<(), BoxError> {
        self.signal("CONT").await?;
        self.signal("TERM").await?;
        tokio::time::timeout(WAIT, self.child.wait()).await??;
        Ok(())
    }
}

fn is_write(r: &AuditRecord) -> bool {
    WRITE_VERBS.contains(&r.verb.as_str())
}

fn is_lease(r: &AuditRecord) -> bool {
    r.api_group == "coordination.k8s.io" && r.resource == "leases"
}

async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases
        .get_opt(cocoon_operator::leader::LEASE_NAME)
        .await
        .ok()
        .flatten()?
        .spec?
        .holder_identity
}

async fn wait_holder(leases: &Api<Lease>, who: &str) -> Result<(), BoxError> {
    cocoon_testenv::wait_until(&format!("the Lease held by {who}"), WAIT, || async {
        (holder(leases).await.as_deref() == Some(who)).then_some(())
    })
    .await?;
    Ok(())
}

fn set(name: &str) -> CocoonSet {
    let mut spec = CocoonSetSpec::with_image("ubuntu:24.04");
    // No node serves this pool: the main stays Pending, which is all this test needs.
    spec.node_pool = unique_name("nowhere");
    CocoonSet::new(name, spec)
}

/// The set carries the operator's finalizer and a status: some replica reconciled it.
async fn wait_reconciled(sets: &Api<CocoonSet>, name: &str) -> Result<(), BoxError> {
    cocoon_testenv::wait_until(&format!("set {name} reconciled"), WAIT, || async {
        let cs = sets.get_opt(name).await.ok().flatten()?;
        let finalized = cs.finalizers().iter().any(|f| f == finalizers::COCOONSET);
        (finalized && cs.status.is_some()).then_some(())
    })
    .await?;
    Ok(())
}

async fn ensure_namespace(client: &Client, name: &str) -> Result<(), BoxError> {
    let api: Api<Namespace> = Api::all(client.clone());
    let mut ns = Namespace::default();
    ns.metadata.name = Some(name.into());
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_standby_idles_and_a_paused_leader_writes_nothing_after_resuming() {
    cocoon_testenv::run_test(|env| async move {
        let Some(audit) = env.audit_log() else {
            return Err::<(), BoxError>(
                "the test environment's run directory is unknown (set TESTENV_RUN_DIR)".into(),
            );
        };
        let admin = env.client()?;
        ensure_namespace(&admin, "cocoon-system").await?;
        let ns = cocoon_testenv::create_namespace(&admin, "leader-bin").await?;
        let tmp = tempfile::tempdir()?;
        let (account_a, account_b) = (unique_name("leader-a"), unique_name("leader-b"));
        let result = scenario(env, &audit, &admin, &ns, tmp.path(), &account_a, &account_b).await;
        cleanup_account(env, &account_a);
        cleanup_account(env, &account_b);
        cocoon_testenv::delete_namespace(&admin, &ns).await?;
        result
    })
    .await;
}

async fn scenario(
    env: &Shared,
    audit: &cocoon_testenv::AuditLog,
    admin: &Client,
    ns: &str,
    dir: &Path,
    account_a: &str,
    account_b: &str,
) -> Result<(), BoxError> {
    let kubeconfig_a = replica_account(env, account_a, dir)?;
    let kubeconfig_b = replica_account(env, account_b, dir)?;
    let leases: Api<Lease> = Api::namespaced(admin.clone(), ns);
    let sets: Api<CocoonSet> = Api::namespaced(admin.clone(), ns);

    // A first, so that it is the leader; then the standby B.
    // A reaches the registry through a proxy the test can hold.
    let proxy = HoldingProxy::start(env.registry_addr()).await?;
    let a = Replica::spawn(&kubeconfig_a, &proxy.addr, account_a, "replica-a", ns)?;
    wait_holder(&leases, &a.identity).await?;
    sets.create(&PostParams::default(), &set("first")).await?;
    wait_reconciled(&sets, "first").await?;
    let b = Replica::spawn(
        &kubeconfig_b,
        env.registry_addr(),
        account_b,
        "replica-b",
        ns,
    )?;

    // (1) B runs its election (reads the Lease) while A renews RENEWALS_WATCHED times.
    cocoon_testenv::wait_until("the standby reading the Lease", WAIT, || async {
        let records = audit.records_of(&b.user).ok()?;
        records
            .iter()
            .any(|r| is_lease(r) && r.verb == "get")
            .then_some(())
    })
    .await?;
    let renewals_before = audit
        .records_of(&a.user)?
        .iter()
        .filter(|r| is_lease(r) && r.verb == "update")
        .count();
    // A change of the set while B stands by: its watch sees it, its controller must not.
    sets.patch(
        "first",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!({"spec": {"agent": {"replicas": 1}}})),
    )
    .await?;
    cocoon_testenv::wait_until(
        "the leader renewing while the standby waits",
        WAIT,
        || async {
            let renewals = audit
                .records_of(&a.user)
                .ok()?
                .iter()
                .filter(|r| is_lease(r) && r.verb == "update")
                .count();
            (renewals >= renewals_before + RENEWALS_WATCHED).then_some(())
        },
    )
    .await?;
    let b_records = audit.records_of(&b.user)?;
    let b_writes: Vec<&AuditRecord> = b_records
        .iter()
        .filter(|r| is_write(r) && !is_lease(r))
        .collect();
    assert!(
        b_writes.is_empty(),
        "the standby wrote: {b_writes:#?}\n{}",
        b.log_tail()
    );
    let b_lease_writes: Vec<&AuditRecord> = b_records
        .iter()
        .filter(|r| is_write(r) && is_lease(r))
        .collect();
    assert!(
        b_lease_writes.is_empty(),
        "the standby wrote the Lease while it was held: {b_lease_writes:#?}"
    );
    // The count is of something: the leader's passes show in its log, the standby logs.
    assert!(
        a.passes() > 0,
        "no pass in the leader's log:\n{}",
        a.log_tail()
    );
    assert!(b.log_lines() > 0, "the standby's log is empty");
    assert_eq!(
        b.passes(),
        0,
        "the standby ran reconcile passes (requeue churn):\n{}",
        b.log_tail()
    );
    assert_eq!(holder(&leases).await.as_deref(), Some(a.identity.as_str()));

    // (2) A mid-pass: a new set's main is about to be created, its `:hibernate` read held.
    proxy.set_open(false);
    sets.create(&PostParams::default(), &set("second")).await?;
    cocoon_testenv::wait_until("the leader's registry read held", WAIT, || async {
        (proxy.held.load(Ordering::SeqCst) > 0).then_some(())
    })
    .await?;
    // Paused past the lease duration: B takes over and reconciles the set.
    a.signal("STOP").await?;
    wait_holder(&leases, &b.identity).await?;
    wait_reconciled(&sets, "second").await?;
    // The API server audits a request once its response is sent, so the record may trail
    // the write the client already saw.
    cocoon_testenv::wait_until(
        "the new leader's writes of the set created meanwhile in the audit log",
        WAIT,
        || async {
            let records = audit.records_of(&b.user).ok()?;
            records
                .iter()
                .any(|r| is_write(r) && !is_lease(r) && r.name == "second")
                .then_some(())
        },
    )
    .await?;
    // Nothing A sends while stopped; what it sends after SIGCONT is logged after this.
    let a_before = audit.records_of(&a.user)?.len();
    a.signal("CONT").await?;
    // The held read gets its answer at once: the pass goes on to its create, which the gate
    // refuses, whether or not the elector has run yet.
    proxy.set_open(true);
    // Either the gate refuses the write (the log says so) or the write shows in the audit.
    let a_wrote_since = |from: usize| -> Vec<AuditRecord> {
        let mut records = audit.records_of(&a.user).unwrap_or_default();
        records
            .split_off(from.min(records.len()))
            .into_iter()
            .filter(|r| is_write(r) && !is_lease(r))
            .collect()
    };
    let outcome = cocoon_testenv::wait_until(
        "the resumed replica skipping (or making) the write of its pass",
        WAIT,
        || async {
            (a.log_has("write skipped, pass ends") || !a_wrote_since(a_before).is_empty())
                .then_some(())
        },
    )
    .await;
    if let Err(e) = outcome {
        return Err(format!("{e}\n{}", a.log_tail()).into());
    }
    // A resumes: its elector reads the Lease, finds B, and gives up leading.
    let seen = cocoon_testenv::wait_until(
        "the resumed replica seeing it lost the Lease",
        WAIT,
        || async {
            (a.log_has("lost leadership") || a.log_has("could not renew leadership in time"))
                .then_some(())
        },
    )
    .await;
    if let Err(e) = seen {
        return Err(format!("{e}\n{}", a.log_tail()).into());
    }
    // Whatever else A's controllers had queued (watch events, requeues) has been through them
    // once the elector has read the Lease a few more times.
    cocoon_testenv::wait_until("the resumed replica's elector running on", WAIT, || async {
        let records = audit.records_of(&a.user).ok()?;
        let reads = records[a_before.min(records.len())..]
            .iter()
            .filter(|r| is_lease(r) && r.verb == "get")
            .count();
        (reads >= 10).then_some(())
    })
    .await?;
    let after: Vec<AuditRecord> = audit.records_of(&a.user)?.split_off(a_before);
    let writes: Vec<&AuditRecord> = after
        .iter()
        .filter(|r| is_write(r) && !is_lease(r))
        .collect();
    assert!(
        writes.is_empty(),
        "the resumed old leader wrote: {writes:#?}\n{}",
        a.log_tail()
    );
    let lease_writes: Vec<&AuditRecord> = after
        .iter()
        .filter(|r| is_write(r) && is_lease(r) && r.code < 300)
        .collect();
    assert!(
        lease_writes.is_empty(),
        "the resumed old leader took the Lease back: {lease_writes:#?}"
    );
    assert_eq!(holder(&leases).await.as_deref(), Some(b.identity.as_str()));

    b.stop().await?;
    a.stop().await?;
    Ok(())
}
