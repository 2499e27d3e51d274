//! The activator of one replica: it follows the pool ConfigMap, listens on every assigned
//! port, and for each accepted connection joins its set's wake flight, dials the main VM
//! once it serves and splices the bytes both ways.
//!
//! A port's meaning is the pool's entry read at accept time, never anything the client
//! sends. One flight per set at a time ([`Activator::join`]): it looks at the set every
//! [`LOOK_EVERY`], writes the wake at most once per idle suspend it sees, and publishes what
//! it saw to every waiting connection; it ends when no connection waits.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cocoon_api::contract::idle::{
    ACTIVATOR_FIELD_MANAGER, WOKEN_BY_CONNECTION, reasons, wake_patch,
};
use cocoon_api::crd::set::CocoonSet;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use super::metrics::reason;
use super::plan::{self, Target};
use super::wake::{self, Refusal, Step};
use crate::metrics::Metrics;

/// How often a flight looks at its set, and a waiting connection dials the VM.
pub const LOOK_EVERY: Duration = Duration::from_millis(250);
/// How long one dial of the VM may take.
const DIAL_TIMEOUT: Duration = Duration::from_secs(2);
/// The most a clean close reads and drops of what a refused client sent.
const DRAIN_BYTES: usize = 64 * 1024;
/// How long a clean close waits for the client to close its side.
const DRAIN_FOR: Duration = Duration::from_secs(2);
/// Most connections beyond the bound closed cleanly at once.
const CLOSING: usize = 64;
/// One Event of a reason per set at most this often.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// What a flight last saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    Waiting,
    Serve(String),
    Refused(Refusal),
    Gone,
}

type SetKey = (String, String);

/// One replica's activator.
pub struct Activator {
    client: Client,
    recorder: Recorder,
    metrics: Arc<Metrics>,
    config: super::Config,
    addr: IpAddr,
    routes: Mutex<BTreeMap<u16, Target>>,
    listeners: Mutex<HashMap<u16, JoinHandle<()>>>,
    flights: Mutex<HashMap<SetKey, watch::Sender<Seen>>>,
    held: Arc<Semaphore>,
    /// Connections beyond the bound being closed cleanly ([`CLOSING`] at most).
    closing: Arc<Semaphore>,
    warned: Mutex<HashMap<(SetKey, &'static str), Instant>>,
}

impl Activator {
    /// An activator listening on `addr` (the config's), writing wakes and Events through
    /// `client` and `recorder`.
    pub fn new(
        client: Client,
        recorder: Recorder,
        metrics: Arc<Metrics>,
        config: super::Config,
        addr: IpAddr,
    ) -> Arc<Self> {
        Arc::new(Activator {
            client,
            recorder,
            metrics,
            held: Arc::new(Semaphore::new(config.max_connections)),
            closing: Arc::new(Semaphore::new(CLOSING)),
            config,
            addr,
            routes: Mutex::default(),
            listeners: Mutex::default(),
            flights: Mutex::default(),
            warned: Mutex::default(),
        })
    }

    /// Follows the pool until `shutdown`; the listeners end with it.
    pub async fn run(self: Arc<Self>, shutdown: impl std::future::Future<Output = ()>) {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.config.namespace);
        let cfg =
            watcher::Config::default().fields(&format!("metadata.name={}", super::POOL_CONFIGMAP));
        let mut events = std::pin::pin!(watcher::watcher(api, cfg).default_backoff());
        let mut shutdown = std::pin::pin!(shutdown);
        let mut last = BTreeMap::new();
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                // A port that failed to bind is tried again.
                _ = tokio::time::sleep(Duration::from_secs(10)) => self.follow(last.clone()).await,
                ev = events.next() => match ev {
                    Some(Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm))) => {
                        last = cm.data.as_ref().map(plan::decode_pool).unwrap_or_default();
                        self.follow(last.clone()).await;
                    }
                    Some(Ok(watcher::Event::Delete(_))) => {
                        last = BTreeMap::new();
                        self.follow(last.clone()).await;
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => warn!(error = %e, "activator pool watch failed"),
                    None => break,
                },
            }
        }
        for (_, task) in lock(&self.listeners).drain() {
            task.abort();
        }
    }

    /// The ports this replica listens on now.
    pub fn listening(&self) -> Vec<u16> {
        let mut out: Vec<u16> = lock(&self.listeners).keys().copied().collect();
        out.sort();
        out
    }

    /// Listens on the pool's ports (of the configured range) and on no other.
    async fn follow(self: &Arc<Self>, pool: BTreeMap<u16, Target>) {
        let pool: BTreeMap<u16, Target> = pool
            .into_iter()
            .filter(|(p, _)| self.config.ports.contains(*p))
            .collect();
        *lock(&self.routes) = pool.clone();
        let stale: Vec<u16> = lock(&self.listeners)
            .keys()
            .filter(|p| !pool.contains_key(p))
            .copied()
            .collect();
        for port in stale {
            if let Some(task) = lock(&self.listeners).remove(&port) {
                task.abort();
                info!(port, "activator port released");
            }
        }
        for port in pool.keys().copied() {
            if lock(&self.listeners).contains_key(&port) {
                continue;
            }
            match TcpListener::bind(SocketAddr::new(self.addr, port)).await {
                Ok(listener) => {
                    let this = self.clone();
                    let task = tokio::spawn(async move { this.accept_loop(port, listener).await });
                    lock(&self.listeners).insert(port, task);
                    info!(addr = %self.addr, port, "activator listening");
                }
                Err(e) => warn!(addr = %self.addr, port, error = %e, "activator port not bound"),
            }
        }
    }

    async fn accept_loop(self: Arc<Self>, port: u16, listener: TcpListener) {
        loop {
            match listener.accept().await {
                Ok((socket, peer)) => {
                    let this = self.clone();
                    tokio::spawn(async move { this.handle(port, socket, peer).await });
                }
                Err(e) => {
                    warn!(port, error = %e, "activator accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    async fn handle(self: Arc<Self>, port: u16, mut client: TcpStream, peer: SocketAddr) {
        let accepted = Instant::now();
        let target = lock(&self.routes).get(&port).cloned();
        let Ok(_permit) = self.held.clone().try_acquire_owned() else {
            self.metrics.activator.refuse(reason::FULL);
            // A clean close while few are closing; beyond that, a bare one (nothing more is
            // held for connections beyond the bound).
            match self.closing.clone().try_acquire_owned() {
                Ok(permit) => {
                    tokio::spawn(async move {
                        close_cleanly(client).await;
                        drop(permit);
                    });
                }
                Err(_) => {
                    let _ = tokio::io::AsyncWriteExt::shutdown(&mut client).await;
                    drop(client);
                }
            }
            if let Some(t) = &target {
                self.event_once(t, EventType::Warning, reasons::ACTIVATOR_FULL, format!(
                    "the activator holds its most connections ({}): a connection to port {} was closed",
                    self.config.max_connections, t.port
                )).await;
            }
            return;
        };
        let gauge = self.metrics.activator.connections.clone();
        gauge.inc();
        let _held = scopeguard(move || {
            gauge.dec();
        });
        let Some(target) = target else {
            self.metrics.activator.refuse(reason::UNMAPPED);
            close_cleanly(client).await;
            return;
        };
        debug!(%peer, port, set = %target.set, namespace = %target.namespace, "activator connection");
        let deadline = tokio::time::Instant::now() + self.config.wake_wait;
        match self.wait_for_vm(&target, deadline).await {
            Ok(mut upstream) => {
                self.metrics
                    .activator
                    .wake_seconds
                    .observe(accepted.elapsed().as_secs_f64());
                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
            }
            Err(label) => {
                close_cleanly(client).await;
                self.metrics.activator.refuse(label);
                if label == reason::WAIT_EXCEEDED {
                    self.event_once(
                        &target,
                        EventType::Warning,
                        reasons::WAKE_WAIT_EXCEEDED,
                        format!(
                            "a connection to port {} waited {:?} for the main VM and was closed",
                            target.port, self.config.wake_wait
                        ),
                    )
                    .await;
                }
            }
        }
    }

    /// Joins the set's flight and dials the VM until it answers or `deadline`.
    async fn wait_for_vm(
        self: &Arc<Self>,
        target: &Target,
        deadline: tokio::time::Instant,
    ) -> Result<TcpStream, &'static str> {
        let mut seen = self.join(target);
        loop {
            let now = seen.borrow_and_update().clone();
            match now {
                Seen::Gone => return Err(reason::UNMAPPED),
                Seen::Refused(r) => return Err(r.label()),
                Seen::Serve(ip) => {
                    if let Ok(addr) = format!("{ip}:{}", target.port)
                        .parse::<SocketAddr>()
                        .or_else(|_| format!("[{ip}]:{}", target.port).parse())
                        && let Ok(Ok(stream)) =
                            tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect(addr)).await
                    {
                        return Ok(stream);
                    }
                }
                Seen::Waiting => {}
            }
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return Err(reason::WAIT_EXCEEDED),
                changed = seen.changed() => if changed.is_err() {
                    seen = self.join(target);
                },
                _ = tokio::time::sleep(LOOK_EVERY) => {}
            }
        }
    }

    /// The set's flight, started if none runs.
    fn join(self: &Arc<Self>, target: &Target) -> watch::Receiver<Seen> {
        let key = (target.namespace.clone(), target.set.clone());
        let mut flights = lock(&self.flights);
        if let Some(tx) = flights.get(&key) {
            return tx.subscribe();
        }
        let (tx, rx) = watch::channel(Seen::Waiting);
        flights.insert(key.clone(), tx.clone());
        let this = self.clone();
        tokio::spawn(async move { this.fly(key, tx).await });
        rx
    }

    /// One flight: looks at the set while anyone waits.
    async fn fly(self: Arc<Self>, key: SetKey, tx: watch::Sender<Seen>) {
        let sets: Api<CocoonSet> = Api::namespaced(self.client.clone(), &key.0);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &key.0);
        let mut resumed: Option<String> = None;
        let mut refused = false;
        loop {
            if tx.receiver_count() == 0 {
                let mut flights = lock(&self.flights);
                if tx.receiver_count() == 0 {
                    if flights.get(&key).is_some_and(|t| t.same_channel(&tx)) {
                        flights.remove(&key);
                    }
                    return;
                }
            }
            let set = match sets.get_opt(&key.1).await {
                Ok(s) => s,
                Err(e) => {
                    warn!(namespace = %key.0, set = %key.1, error = %e, "activator: set not read");
                    tokio::time::sleep(LOOK_EVERY).await;
                    continue;
                }
            };
            let main = match &set {
                Some(s) if !s.spec.suspend => pods
                    .get_opt(&cocoon_api::naming::pod_name_for_agent(&key.1, 0))
                    .await
                    .ok()
                    .flatten(),
                _ => None,
            };
            let seen = match wake::step(set.as_ref(), main.as_ref(), &self.config.vm_networks) {
                Step::Gone => Seen::Gone,
                Step::Wait => Seen::Waiting,
                Step::Serve(ip) => Seen::Serve(ip),
                Step::Refuse(r) => {
                    if !refused {
                        refused = true;
                        let target = Target {
                            namespace: key.0.clone(),
                            set: key.1.clone(),
                            port: 0,
                        };
                        self.event_once(
                            &target,
                            EventType::Warning,
                            reasons::WAKE_IGNORED,
                            r.message().into(),
                        )
                        .await;
                    }
                    Seen::Refused(r)
                }
                Step::Resume { resource_version } => {
                    if resumed.as_deref() != Some(resource_version.as_str()) {
                        resumed = Some(resource_version.clone());
                        self.resume(&sets, &key, &resource_version).await;
                    }
                    Seen::Waiting
                }
            };
            tx.send_if_modified(|old| {
                let changed = *old != seen;
                *old = seen;
                changed
            });
            tokio::time::sleep(LOOK_EVERY).await;
        }
    }

    async fn resume(&self, sets: &Api<CocoonSet>, key: &SetKey, rv: &str) {
        let params = PatchParams {
            field_manager: Some(ACTIVATOR_FIELD_MANAGER.into()),
            ..PatchParams::default()
        };
        let patch = wake_patch(WOKEN_BY_CONNECTION, rv);
        match sets.patch(&key.1, &params, &Patch::Merge(&patch)).await {
            Ok(_) => {
                info!(namespace = %key.0, set = %key.1, "activator: idle-suspended set resumed by a connection")
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                debug!(namespace = %key.0, set = %key.1, "activator: the set changed before the wake; looking again")
            }
            Err(e) => {
                warn!(namespace = %key.0, set = %key.1, error = %e, "activator: wake not written")
            }
        }
    }

    /// An Event of `reason` for the target's set, at most once per [`WARN_EVERY`] per set and
    /// reason (the record of what was sent is pruned as it ages, so it stays bounded).
    async fn event_once(
        &self,
        target: &Target,
        type_: EventType,
        reason: &'static str,
        message: String,
    ) {
        let key = ((target.namespace.clone(), target.set.clone()), reason);
        {
            let mut warned = lock(&self.warned);
            let now = Instant::now();
            warned.retain(|_, at| now.duration_since(*at) < WARN_EVERY);
            if warned.contains_key(&key) {
                return;
            }
            warned.insert(key, now);
        }
        match type_ {
            EventType::Warning => {
                warn!(namespace = %target.namespace, set = %target.set, reason, %message, "activator")
            }
            EventType::Normal => {
                info!(namespace = %target.namespace, set = %target.set, reason, %message, "activator")
            }
        }
        let sets: Api<CocoonSet> = Api::namespaced(self.client.clone(), &target.namespace);
        if let Ok(Some(set)) = sets.get_opt(&target.set).await {
            self.event(&set, type_, reason, message).await;
        }
    }

    async fn event(&self, set: &CocoonSet, type_: EventType, reason: &str, message: String) {
        let event = KubeEvent {
            type_,
            reason: reason.into(),
            action: cocoon_api::contract::events::event_action(reason, &message),
            note: Some(message),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &set.object_ref(&())).await {
            warn!(error = %e, reason, "failed to publish event");
        }
    }
}

/// Closes a connection with a FIN, not a reset: the write side first, then what the client
/// sent is read and dropped (at most [`DRAIN_BYTES`], for at most [`DRAIN_FOR`]) until it
/// closes too.
async fn close_cleanly(mut stream: TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = stream.shutdown().await;
    let drain = async {
        let mut buf = [0u8; 4096];
        let mut total = 0usize;
        while total < DRAIN_BYTES {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_FOR, drain).await;
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `f` when dropped.
fn scopeguard(f: impl FnOnce()) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}
