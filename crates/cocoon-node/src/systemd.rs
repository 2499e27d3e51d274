//! systemd `Type=notify` for the node agent: `READY=1` once the Node is registered and the
//! servers listen, `WATCHDOG=1` while the agent's main loops turn, `STOPPING=1` on shutdown.
//!
//! The protocol is a unix datagram of `KEY=VALUE` lines to `$NOTIFY_SOCKET` (a path, or
//! `@name` for the abstract namespace); no library needed. Without `NOTIFY_SOCKET` (not under
//! systemd, or `Type=simple`) nothing is sent.
//!
//! The watchdog: each main loop owns a [`Heartbeat`] it bumps at least every `period` while it
//! turns (the pod watch and the kubelet API accept loop on an idle tick of [`BEAT_EVERY`],
//! the Lease renew and node status loops and the pod lifecycle reconciler on each pass). Every
//! half of `WATCHDOG_USEC` the watchdog task asks [`decide`] whether every registered loop
//! beat within its `period` plus the watchdog timeout; only then does it send `WATCHDOG=1`. A
//! loop that is stuck (a call that never returns, a wedged runtime) or that ended stops the
//! pings, and systemd restarts the agent `WatchdogSec=` later; the VMs survive that
//! (`KillMode=process`).

use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::settings::Settings;

/// The loops' heartbeat lives with the kubelet API (its accept loop beats one); the watchdog
/// here decides on all of them.
pub use cocoon_kubelet::heartbeat::{BEAT_EVERY, Heartbeat, LoopAge};

/// Where systemd listens for notifications.
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";
/// The watchdog timeout in microseconds (`WatchdogSec=`).
pub const WATCHDOG_USEC: &str = "WATCHDOG_USEC";
/// The process the watchdog timeout is meant for.
pub const WATCHDOG_PID: &str = "WATCHDOG_PID";

/// A notification socket address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotifyAddr {
    /// A filesystem socket.
    Path(PathBuf),
    /// An abstract-namespace socket (`@name` in `NOTIFY_SOCKET`; the name without the `@`).
    Abstract(Vec<u8>),
}

/// Parses `NOTIFY_SOCKET`: an absolute path or `@abstract`. Other forms (`vsock:`, relative
/// paths) are refused with the reason.
pub fn parse_notify_socket(raw: &str) -> Result<NotifyAddr, String> {
    if let Some(name) = raw.strip_prefix('@') {
        if name.is_empty() {
            return Err("an abstract socket needs a name after @".into());
        }
        return Ok(NotifyAddr::Abstract(name.as_bytes().to_vec()));
    }
    if raw.starts_with('/') {
        return Ok(NotifyAddr::Path(PathBuf::from(raw)));
    }
    Err(format!("{raw:?} is neither an absolute path nor @abstract"))
}

/// The watchdog timeout for process `own_pid` from `WATCHDOG_USEC` and `WATCHDOG_PID`: `None`
/// when unset, 0, or meant for another process (as `sd_watchdog_enabled`). A value that does
/// not parse is an error naming the variable.
pub fn watchdog_timeout(
    usec: Option<&str>,
    pid: Option<&str>,
    own_pid: u32,
) -> Result<Option<Duration>, String> {
    let Some(usec) = usec.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let usec: u64 = usec
        .parse()
        .map_err(|_| format!("{WATCHDOG_USEC}={usec:?}: not a number of microseconds"))?;
    if let Some(pid) = pid.map(str::trim).filter(|v| !v.is_empty()) {
        let pid: u32 = pid
            .parse()
            .map_err(|_| format!("{WATCHDOG_PID}={pid:?}: not a process id"))?;
        if pid != own_pid {
            return Ok(None);
        }
    }
    Ok((usec > 0).then(|| Duration::from_micros(usec)))
}

/// Sends notifications to systemd.
#[derive(Debug)]
pub struct Notifier {
    addr: NotifyAddr,
    sock: UnixDatagram,
}

impl Notifier {
    /// A notifier for `NOTIFY_SOCKET` in `settings`; `None` when it is unset or unusable
    /// (logged: the agent runs on without notifications, and systemd reports the unit).
    pub fn from_settings(settings: &Settings) -> Option<Notifier> {
        let raw = settings.get(NOTIFY_SOCKET).filter(|v| !v.is_empty())?;
        let addr = parse_notify_socket(&raw)
            .map_err(|reason| tracing::warn!(var = NOTIFY_SOCKET, %reason, "not notifying systemd"))
            .ok()?;
        let sock = UnixDatagram::unbound()
            .map_err(|e| tracing::warn!(error = %e, "not notifying systemd: no socket"))
            .ok()?;
        Some(Notifier { addr, sock })
    }

    /// Sends `state` (`KEY=VALUE` lines) in one datagram.
    pub fn notify(&self, state: &str) -> std::io::Result<()> {
        match &self.addr {
            NotifyAddr::Path(p) => self.sock.send_to(state.as_bytes(), p).map(drop),
            NotifyAddr::Abstract(name) => {
                use std::os::linux::net::SocketAddrExt as _;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
                self.sock.send_to_addr(state.as_bytes(), &addr).map(drop)
            }
        }
    }

    /// [`Notifier::notify`], logging a failure instead of returning it.
    pub fn send(&self, state: &str) {
        if let Err(e) = self.notify(state) {
            tracing::warn!(error = %e, state, "systemd notification failed");
        }
    }
}

/// The heartbeats of the main loops of one agent (shared; loops register as they start).
#[derive(Debug, Clone, Default)]
pub struct Liveness(Arc<Mutex<Vec<Heartbeat>>>);

impl Liveness {
    /// Adds a loop's heartbeat.
    pub fn register(&self, hb: Heartbeat) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(hb);
    }

    /// Every registered loop's age at `now`.
    pub fn observe(&self, now: Instant) -> Vec<LoopAge> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|hb| hb.observe(now))
            .collect()
    }
}

/// What the watchdog does this turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every loop is alive: send `WATCHDOG=1`.
    Ping,
    /// These loops are late: send nothing, so that systemd restarts the agent.
    Withhold { stale: Vec<&'static str> },
}

/// Pings only if every loop beat within its period plus `slack` (the watchdog timeout): a loop
/// may be slow for a while (an API call, a large reconcile pass) but not for a whole timeout
/// beyond its own period. No registered loop: nothing to vouch for, no ping.
pub fn decide(loops: &[LoopAge], slack: Duration) -> Verdict {
    if loops.is_empty() {
        return Verdict::Withhold { stale: Vec::new() };
    }
    let stale: Vec<&'static str> = loops
        .iter()
        .filter(|l| l.age > l.period.saturating_add(slack))
        .map(|l| l.name)
        .collect();
    if stale.is_empty() {
        Verdict::Ping
    } else {
        Verdict::Withhold { stale }
    }
}

/// Sends `WATCHDOG=1` every half of `timeout` while [`decide`] says so, until `stop`.
pub async fn run_watchdog(
    notifier: Arc<Notifier>,
    liveness: Liveness,
    timeout: Duration,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(timeout / 2);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        match decide(&liveness.observe(Instant::now()), timeout) {
            Verdict::Ping => notifier.send("WATCHDOG=1"),
            Verdict::Withhold { stale } => tracing::warn!(
                loops = ?stale,
                "main loops late: withholding the systemd watchdog ping (systemd restarts the agent)"
            ),
        }
    }
}
