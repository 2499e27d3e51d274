//! Leader election on the real API server: of two replicas exactly one leads and reconciles;
//! when the leader dies without releasing, the other takes over within the lease duration and
//! work continues.

use std::sync::Arc;
use std::time::Duration;

use cocoon_api::crd::hibernation::{
    CocoonHibernation, CocoonHibernationSpec, Desire, HibernationPhase, PodRef,
};
use cocoon_operator::hibernation::{self, decide::Timing};
use cocoon_operator::leader::{self, ElectionTiming, Leadership};
use cocoon_operator::metrics::Metrics;
use cocoon_operator::registry::{OciTagRegistry, TagRegistry};
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
            dead.is_leader(),
            "the aborted replica never noticed (it is dead)"
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
