//! The simulated guests' network and CPU load (issue 39): each running VM serves a TCP echo on
//! the configured ports (`VK_SIM_ECHO_PORTS`), bound on its NICs' addresses while it runs, and
//! the echoed bytes are its TAP counters; a VM marked busy ([`SimHandle::set_busy`]) uses its
//! whole vCPUs, so its CPU time grows as a loaded guest's does.
//!
//! A supervisor task (one per simulator, ending with it) compares the running VMs with the
//! listeners after every VM-list change and each tick ([`plan`], pure) and starts or stops
//! listeners. An address that cannot be bound (not local to the host) is logged once per VM
//! run and left alone. Each listener serves at most [`MAX_CONNECTIONS`] connections at once.
//!
//! [`SimHandle::set_busy`]: super::SimHandle::set_busy

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use chrono::{DateTime, Utc};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinSet;

use super::{Inner, lock};
use crate::types::STATE_RUNNING;

/// Most connections one echo listener serves at once; more wait in the accept queue.
pub const MAX_CONNECTIONS: usize = 64;

/// Bytes a VM's echo received and sent back.
#[derive(Debug, Default)]
pub(super) struct Traffic {
    pub rx: AtomicU64,
    pub tx: AtomicU64,
}

/// A VM's busy time: running since `since`, plus `done_ns` from earlier busy spells.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Busy {
    pub since: Option<DateTime<Utc>>,
    pub done_ns: u64,
}

impl Busy {
    /// CPU nanoseconds of `cpus` vCPUs busy up to `now`.
    pub fn ns(&self, now: DateTime<Utc>, cpus: u64) -> u64 {
        let current = self
            .since
            .map(|s| (now - s).num_nanoseconds().unwrap_or(0).max(0) as u64)
            .unwrap_or(0);
        self.done_ns.saturating_add(current.saturating_mul(cpus))
    }

    /// Starts or ends a busy spell at `now`.
    pub fn set(&mut self, busy: bool, now: DateTime<Utc>, cpus: u64) {
        match (busy, self.since) {
            (true, None) => self.since = Some(now),
            (false, Some(_)) => {
                self.done_ns = self.ns(now, cpus);
                self.since = None;
            }
            _ => {}
        }
    }
}

/// One listener: a VM (id), an address, a port.
pub(super) type Key = (String, Ipv4Addr, u16);

/// Which listeners to start and which to stop, given the ones `running` now and the ones
/// `wanted` (every port on every address of every running VM).
pub(super) fn plan(running: &BTreeSet<Key>, wanted: &BTreeSet<Key>) -> (Vec<Key>, Vec<Key>) {
    let start = wanted.difference(running).cloned().collect();
    let stop = running.difference(wanted).cloned().collect();
    (start, stop)
}

/// The listeners the running VMs of `inner` want.
fn wanted(inner: &Inner, ports: &[u16]) -> BTreeSet<Key> {
    let st = inner.st();
    let mut out = BTreeSet::new();
    for vm in st.vms.values() {
        if !(vm.alive && vm.record.state == STATE_RUNNING) {
            continue;
        }
        for nic in &vm.nics {
            let Ok(ip) = nic.ip.parse::<Ipv4Addr>() else {
                continue;
            };
            for port in ports {
                out.insert((vm.record.id.clone(), ip, *port));
            }
        }
    }
    out
}

/// Starts the supervisor of `inner`'s echo listeners on `ports` (nothing without ports or
/// outside a Tokio runtime).
pub(super) fn start(inner: &Arc<Inner>, ports: Vec<u16>) {
    if ports.is_empty() {
        return;
    }
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let weak: Weak<Inner> = Arc::downgrade(inner);
    let mut changes = inner.change_tx.subscribe();
    let tick = inner.tick;
    rt.spawn(async move {
        let mut listeners: HashMap<Key, tokio::task::AbortHandle> = HashMap::new();
        let mut tasks = JoinSet::new();
        loop {
            let Some(inner) = weak.upgrade() else {
                return;
            };
            let want = wanted(&inner, &ports);
            let have: BTreeSet<Key> = listeners.keys().cloned().collect();
            let (start, stop) = plan(&have, &want);
            for key in stop {
                if let Some(h) = listeners.remove(&key) {
                    h.abort();
                }
            }
            // VMs gone for good lose their counters.
            lock(&inner.traffic).retain(|id, _| want.iter().any(|(v, _, _)| v == id));
            for key in start {
                let traffic = lock(&inner.traffic)
                    .entry(key.0.clone())
                    .or_default()
                    .clone();
                let h = tasks.spawn(listen(key.clone(), traffic));
                listeners.insert(key, h);
            }
            drop(inner);
            while tasks.try_join_next().is_some() {}
            tokio::select! {
                r = changes.changed() => if r.is_err() { return },
                () = tokio::time::sleep(tick) => {}
            }
        }
    });
}

/// Serves one echo listener until aborted (its connections end with it).
async fn listen((vm, ip, port): Key, traffic: Arc<Traffic>) {
    let addr = SocketAddr::from((ip, port));
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(%vm, %addr, error = %e, "simulated echo: cannot bind");
            // Parked until the VM stops: no retry loop.
            std::future::pending::<()>().await;
            return;
        }
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut conns = JoinSet::new();
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        let traffic = traffic.clone();
        conns.spawn(async move {
            let _permit = permit;
            let mut buf = vec![0u8; 16 << 10];
            loop {
                let n = match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                traffic.rx.fetch_add(n as u64, Ordering::Relaxed);
                if stream.write_all(&buf[..n]).await.is_err() {
                    return;
                }
                traffic.tx.fetch_add(n as u64, Ordering::Relaxed);
            }
        });
        while conns.try_join_next().is_some() {}
    }
}

/// `(rx, tx)` echoed by VM `id`.
pub(super) fn traffic_of(inner: &Inner, id: &str) -> (u64, u64) {
    lock(&inner.traffic).get(id).map_or((0, 0), |t| {
        (t.rx.load(Ordering::Relaxed), t.tx.load(Ordering::Relaxed))
    })
}

/// Parses `VK_SIM_ECHO_PORTS`: comma-separated ports 1–65535.
pub(super) fn parse_ports(text: &str) -> Option<Vec<u16>> {
    let ports: BTreeSet<u16> = text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<u16>().ok().filter(|p| *p > 0))
        .collect::<Option<_>>()?;
    Some(ports.into_iter().collect())
}

/// The busy clocks, keyed by VM id (only VMs that exist).
pub(super) type BusyClocks = BTreeMap<String, Busy>;

#[cfg(test)]
mod tests {
    use super::*;

    fn key(vm: &str, last: u8, port: u16) -> Key {
        (vm.into(), Ipv4Addr::new(198, 19, 0, last), port)
    }

    #[test]
    fn listeners_follow_the_running_vms() {
        let running: BTreeSet<Key> = [key("a", 2, 7000), key("b", 3, 7000)].into();
        let wanted: BTreeSet<Key> = [key("a", 2, 7000), key("c", 4, 7000)].into();
        let (start, stop) = plan(&running, &wanted);
        assert_eq!(start, [key("c", 4, 7000)]);
        assert_eq!(stop, [key("b", 3, 7000)]);
        assert_eq!(plan(&wanted, &wanted), (vec![], vec![]));
    }

    #[test]
    fn busy_time_grows_with_the_vcpus_while_busy_and_stays_after() {
        let t = |s: i64| DateTime::from_timestamp(1_800_000_000 + s, 0).expect("time");
        let mut b = Busy::default();
        assert_eq!(b.ns(t(10), 2), 0);
        b.set(true, t(0), 2);
        assert_eq!(b.ns(t(3), 2), 6_000_000_000);
        b.set(false, t(3), 2);
        assert_eq!(b.ns(t(100), 2), 6_000_000_000, "kept, not growing");
    }

    #[test]
    fn echo_ports_are_a_comma_separated_list() {
        assert_eq!(parse_ports("7000, 7001,7000"), Some(vec![7000, 7001]));
        assert_eq!(parse_ports(""), Some(vec![]));
        for bad in ["0", "70000", "http", "7000;7001"] {
            assert_eq!(parse_ports(bad), None, "{bad}");
        }
    }
}
