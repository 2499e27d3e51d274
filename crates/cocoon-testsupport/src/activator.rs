//! The operator's wake-on-connect parts as `cocoon-operator run` wires them (README "Idle
//! suspend and wake on connect"): the Service/EndpointSlice controller and one activator
//! replica with its Lease, for one namespace.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use cocoon_operator::activator::{self, POOL_CONFIGMAP, advertise, listen, plan, service};
use cocoon_operator::metrics::Metrics;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::Api;

use crate::BoxError;
use crate::scripted::recorder;

/// A running activator replica (and the service controller), stopped when dropped.
pub struct ActivatorReplica {
    /// The operator's namespace of this replica (pool ConfigMap, Lease).
    pub opns: String,
    /// The metrics the activator and the service controller write.
    pub metrics: Arc<Metrics>,
    stop: tokio::sync::broadcast::Sender<()>,
}

/// Where and how an [`ActivatorReplica`] runs.
#[derive(Clone, Debug)]
pub struct ActivatorOptions {
    /// Its listen (and advertised) address: a non-loopback address local to the host (the API
    /// server refuses loopback endpoint addresses), e.g. from 198.18.0.0/24.
    pub addr: IpAddr,
    /// The first of its 10 ports.
    pub first_port: u16,
    /// `ACTIVATOR_WAKE_WAIT`.
    pub wake_wait: Duration,
    /// `ACTIVATOR_VM_CIDRS`.
    pub vm_networks: Vec<String>,
}

impl ActivatorReplica {
    /// Starts the service controller (with `admin`) watching `ns` and the activator (its API
    /// writes with `activator_client`, an audited identity, say), in an operator namespace of
    /// its own.
    pub async fn start(
        admin: &Client,
        activator_client: &Client,
        ns: &str,
        opts: ActivatorOptions,
    ) -> Result<Self, BoxError> {
        cocoon_testenv::ensure_loopback_address(&opts.addr.to_string())?;
        let opns = cocoon_testenv::create_namespace(admin, "act-op").await?;
        let config = activator::Config {
            addr: Some(opts.addr),
            ports: plan::PortRange {
                first: opts.first_port,
                last: opts.first_port + 9,
            },
            wake_wait: opts.wake_wait,
            max_connections: 1000,
            namespace: opns.clone(),
            identity: cocoon_testenv::unique_name("op"),
            vm_networks: opts
                .vm_networks
                .iter()
                .map(|c| activator::wake::Cidr::parse(c).ok_or(format!("bad CIDR {c}")))
                .collect::<Result<_, _>>()?,
        };
        let (stop, _) = tokio::sync::broadcast::channel::<()>(1);
        let on_stop = |s: &tokio::sync::broadcast::Sender<()>| {
            let mut rx = s.subscribe();
            async move {
                let _ = rx.recv().await;
            }
        };
        let metrics = Arc::new(Metrics::new());
        let ctx = Arc::new(service::Context::new(
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
            opts.addr,
        );
        tokio::spawn(act.run(on_stop(&stop)));
        tokio::spawn(advertise::publish(
            admin.clone(),
            opns.clone(),
            config.identity.clone(),
            opts.addr,
            on_stop(&stop),
        ));
        Ok(ActivatorReplica {
            opns,
            metrics,
            stop,
        })
    }

    /// The activator port of `ns/set` `port`, once the leader assigned it (within `wait`).
    pub async fn port(
        &self,
        admin: &Client,
        ns: &str,
        set: &str,
        port: u16,
        wait: Duration,
    ) -> Result<u16, BoxError> {
        let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), &self.opns);
        Ok(
            cocoon_testenv::wait_until("the activator port assigned", wait, || async {
                let cm = cms.get_opt(POOL_CONFIGMAP).await.ok()??;
                let pool = plan::decode_pool(cm.data.as_ref()?);
                plan::ports_of(&pool, ns, set).get(&port).copied()
            })
            .await?,
        )
    }
}

impl Drop for ActivatorReplica {
    fn drop(&mut self) {
        let _ = self.stop.send(());
    }
}
