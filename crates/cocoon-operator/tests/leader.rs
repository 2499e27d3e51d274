//! Leader election on the real API server: of two replicas exactly one leads and reconciles;
//! when the leader dies without releasing, the other takes over within the lease duration and
//! work continues. A replica that loses the lease mid-pass skips the write it was about to
//! make and ends the pass; when it leads again it reconciles every cached set once.

use std::sync::Arc;
use std::time::Duration;

use cocoon_api::crd::hibernation::{
    CocoonHibernation, CocoonHibernationSpec, Desire, HibernationPhase, PodRef,
};
use cocoon_operator::hibernation::{self, decide::Timing};
use cocoon_operator::leader::{self, ElectionTiming, Leadership};
use cocoon_operator::metrics::Metrics;
use cocoon_operator::registry::{BoxFuture, OciTagRegistry, RegistryError, TagRegistry};
use cocoon_registry::{RegistryClient, RegistryConfig};
use kube::Client;
use kube::api::{Api, PostParams};
use kube::runtime::events::{Recorder, Reporter};

const TIMING: ElectionTiming = ElectionTiming {
    lease_duration: Duration::from_secs(3),
    renew_deadline: Duration::from_secs(2),
    retry: Duration::from_millis(300),
};

/// One replica: an elector and a CocoonHibernation controller gated on its leadership.
fn replica(
    client: &Client,
    ns: &str,
    registry_addr: &str,
    identity: &str,
) -> (Leadership, Vec<tokio::task::JoinHandle<()>>) {
    let leadership = Leadership::elected();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "cocoon-operator".into(),
            instance: Some(identity.into()),
        },
    );
    let reg: Arc<dyn TagRegistry> = Arc::new(OciTagRegistry::new(
        RegistryClient::new(RegistryConfig::for_registry(registry_addr).expect("cfg"))
            .expect("client"),
    ));
    let ctx = Arc::new(
        hibernation::Context::new(
            client.clone(),
            recorder,
            Arc::new(Metrics::new()),
            reg,
            Timing {
                requeue: Duration::from_millis(500),
                ..Timing::default()
            },
        )
        .with_leadership(leadership.clone()),
    );
    let (c, n, id, l) = (
        client.clone(),
        ns.to_string(),
        identity.to_string(),
        leadership.clone(),
    );
    let elector =
        tokio::spawn(
            async move { leader::run(c, &n, id, TIMING, l, std::future::pending()).await },
        );
    let ns2 = ns.to_string();
    let controller = tokio::spawn(async move {
        hibernation::run(
            ctx,
            Some(&ns2),
            2,
            std::future::pending(),
            Arc::new(cocoon_operator::admin::Readiness::default()),
        )
        .await
    });
    (leadership, vec![elector, controller])
}

fn cr(name: &str) -> CocoonHibernation {
    CocoonHibernation::new(
        name,
        CocoonHibernationSpec {
            pod_ref: PodRef {
                name: format!("{name}-pod"),
            },
            desire: Desire::Hibernate,
        },
    )
}

async fn wait_pending(
    crs: &Api<CocoonHibernation>,
    name: &str,
) -> Result<(), cocoon_testenv::Error> {
    cocoon_testenv::wait_until(
        &format!("{name} reconciled to Pending"),
        Duration::from_secs(30),
        || async {
            let c = crs.get(name).await.ok()?;
            (c.status?.phase? == HibernationPhase::Pending).then_some(())
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_leader_reconciles_and_a_dead_leader_is_replaced() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "leader").await?;
        let (la, tasks_a) = replica(&client, &ns, env.registry_addr(), "replica-a");
        let (lb, tasks_b) = replica(&client, &ns, env.registry_addr(), "replica-b");
        cocoon_testenv::wait_until("a leader is elected", Duration::from_secs(30), || async {
            (la.is_leader() || lb.is_leader()).then_some(())
        })
        .await?;
        assert!(la.is_leader() ^ lb.is_leader(), "exactly one replica leads");

        let crs: Api<CocoonHibernation> = Api::namespaced(client.clone(), &ns);
        crs.create(&PostParams::default(), &cr("first")).await?;
        wait_pending(&crs, "first").await?;

        // The leader dies without releasing the Lease.
        let (dead, survivor, dead_tasks, _keep) = if la.is_leader() {
            (la, lb, tasks_a, tasks_b)
        } else {
            (lb, la, tasks_b, tasks_a)
        };
        for t in dead_tasks {
            t.abort();
        }
        let started = std::time::Instant::now();
        cocoon_testenv::wait_until(
            "the standby takes over",
            Duration::from_secs(30),
            || async { survivor.is_leader().then_some(()) },
        )
        .await?;
        let took = started.elapsed();
        assert!(
            dead.elector_flag(),
            "the aborted replica's elector never noticed (it is dead)"
        );
        assert!(
            !dead.is_leader(),
            "yet it holds no more: its last renew is older than the renew deadline"
        );
        eprintln!(
            "handover after {took:?} (lease duration {:?})",
            TIMING.lease_duration
        );

        crs.create(&PostParams::default(), &cr("second")).await?;
        wait_pending(&crs, "second").await?;
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await;
}

/// The real registry client, except that the first create-protocol read (the `:hibernate`
/// probe right before a pod create) revokes the replica's leadership: the lease is lost
/// between the decision to create and the create.
struct RevokeOnFirstRead {
    inner: OciTagRegistry,
    leadership: Leadership,
    revoked: std::sync::atomic::AtomicBool,
}

impl TagRegistry for RevokeOnFirstRead {
    fn has_manifest<'a>(
        &'a self,
        vm: &'a str,
        tag: &'a str,
    ) -> BoxFuture<'a, Result<bool, RegistryError>> {
        self.inner.has_manifest(vm, tag)
    }
    fn delete_tag<'a>(
        &'a self,
        vm: &'a str,
        tag: &'a str,
    ) -> BoxFuture<'a, Result<(), RegistryError>> {
        self.inner.delete_tag(vm, tag)
    }
    fn manifest_annotations<'a>(
        &'a self,
        vm: &'a str,
        tag: &'a str,
    ) -> BoxFuture<'a, Result<Option<std::collections::BTreeMap<String, String>>, RegistryError>>
    {
        if !self.revoked.swap(true, std::sync::atomic::Ordering::SeqCst) {
            self.leadership.lost();
        }
        self.inner.manifest_annotations(vm, tag)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_after_the_lease_is_lost_is_skipped_and_the_next_acquisition_reconciles_all() {
    use cocoon_api::crd::set::{CocoonSet, CocoonSetSpec};
    use cocoon_operator::cocoonset;
    use k8s_openapi::api::core::v1::Pod;
    use std::sync::atomic::Ordering;
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "leader-loss").await?;
        // Held by hand: acquired now, no renew deadline to speak of, revoked by the registry.
        let leadership = Leadership::elected();
        leadership.set_renew_deadline(Duration::from_secs(3600));
        leadership.renewed(std::time::Instant::now());
        let tags = Arc::new(RevokeOnFirstRead {
            inner: OciTagRegistry::new(
                RegistryClient::new(
                    RegistryConfig::for_registry(env.registry_addr()).expect("cfg"),
                )
                .expect("client"),
            ),
            leadership: leadership.clone(),
            revoked: Default::default(),
        });
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "cocoon-operator".into(),
                instance: None,
            },
        );
        let metrics = Arc::new(Metrics::new());
        let stats = Arc::new(cocoonset::Stats::default());
        let ctx = Arc::new(
            cocoonset::Context::new(
                client.clone(),
                recorder,
                metrics.clone(),
                tags.clone(),
                cocoonset::Timing {
                    requeue_after_write: Duration::from_millis(200),
                    wait_for_main: Duration::from_millis(500),
                    ..cocoonset::Timing::default()
                },
            )
            .with_stats(stats.clone())
            .with_leadership(leadership.clone()),
        );
        let (c, n) = (ctx.clone(), ns.clone());
        let controller = tokio::spawn(async move {
            cocoonset::run(
                c,
                Some(&n),
                2,
                std::future::pending(),
                Arc::new(cocoon_operator::admin::Readiness::default()),
            )
            .await
        });

        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let mut spec = CocoonSetSpec::with_image("ubuntu:24.04");
        spec.node_pool = cocoon_testenv::unique_name("nowhere");
        sets.create(&PostParams::default(), &CocoonSet::new("s", spec))
            .await?;
        cocoon_testenv::wait_until(
            "the pass that lost the lease before its pod create ended",
            Duration::from_secs(60),
            || async { (stats.lost_leadership.load(Ordering::SeqCst) == 1).then_some(()) },
        )
        .await?;
        assert!(tags.revoked.load(Ordering::SeqCst));
        let writes = stats.writes.load(Ordering::SeqCst);
        assert!(
            pods.list(&Default::default()).await?.items.is_empty(),
            "the create after the loss was skipped"
        );
        let text = metrics.render();
        assert!(
            // The error series exist from the start at 0; none may have counted.
            !text.lines().any(|l| {
                l.starts_with("cocoon_operator_reconcile_errors_total{") && !l.ends_with(" 0")
            }),
            "a lost lease is no reconcile error: {text}"
        );

        // Leading again: every cached set gets a pass, and the main is created.
        leadership.renewed(std::time::Instant::now());
        cocoon_testenv::wait_until(
            "the main created after the lease came back",
            Duration::from_secs(60),
            || async {
                let list = pods.list(&Default::default()).await.ok()?;
                (list.items.len() == 1).then_some(())
            },
        )
        .await?;
        assert!(stats.writes.load(Ordering::SeqCst) > writes);
        controller.abort();
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await;
}
