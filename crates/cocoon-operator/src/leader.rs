//! Leader election through a `coordination.k8s.io/v1` Lease: every replica keeps its caches
//! warm and reconciles only while it holds the Lease, so exactly one replica writes.
//!
//! The rules (client-go's, on our own clock): a missing or released Lease is taken; our own
//! Lease is renewed every `retry`; another holder's Lease is taken over only after its record
//! has not changed for `lease_duration` as observed locally (no trust in remote clocks); a
//! holder that cannot renew for `renew_deadline` stops leading before anyone may take over.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::Stream;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use tracing::{debug, info, warn};

/// The Lease the operator elects on (contract.md §12.1).
pub const LEASE_NAME: &str = "cocoon-operator.cocoonset.cocoonstack.io";

/// The write gate's rule, on the local monotonic clock: a replica holds the lease while the
/// elector says it leads *and* its last successful renew is younger than the renew deadline.
/// A process that was paused (SIGSTOP, a long GC-like stall, a frozen VM) may still read the
/// elector's flag as set, but its renew is old: it no longer holds, whatever the flag says.
pub fn held(leading: bool, since_renew: Option<Duration>, renew_deadline: Duration) -> bool {
    leading && since_renew.is_some_and(|age| age < renew_deadline)
}

/// A write was refused because this replica no longer holds the lease: the pass ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("leadership lost: write skipped, pass ended")]
pub struct LostLeadership;

#[derive(Debug)]
struct Inner {
    /// False for [`Leadership::always`]: no election, always held.
    elected: bool,
    /// The elector's view: it acquired or renewed, and has not seen the lease lost.
    leading: AtomicBool,
    /// When the attempt of the last successful acquire or renew started (monotonic).
    renewed: Mutex<Option<Instant>>,
    renew_deadline: Mutex<Duration>,
    /// Bumped on every acquisition (not leading → leading).
    acquisitions: tokio::sync::watch::Sender<u64>,
}

/// Whether this replica may write. Cheap to clone and to read before every write.
#[derive(Clone, Debug)]
pub struct Leadership(Arc<Inner>);

impl Leadership {
    fn new(elected: bool) -> Self {
        Leadership(Arc::new(Inner {
            elected,
            leading: AtomicBool::new(!elected),
            renewed: Mutex::new(None),
            renew_deadline: Mutex::new(ElectionTiming::default().renew_deadline),
            acquisitions: tokio::sync::watch::Sender::new(0),
        }))
    }

    /// Leadership that is always held (leader election off, tests).
    pub fn always() -> Self {
        Self::new(false)
    }

    /// Leadership decided by an elector ([`run`]); starts as not leading.
    pub fn elected() -> Self {
        Self::new(true)
    }

    /// Whether the lease is held now ([`held`]): the elector's flag and a fresh renew.
    pub fn is_leader(&self) -> bool {
        if !self.0.elected {
            return true;
        }
        let leading = self.0.leading.load(Ordering::SeqCst);
        let since = self
            .0
            .renewed
            .lock()
            .ok()
            .and_then(|r| r.map(|at| at.elapsed()));
        let deadline = self.0.renew_deadline.lock().map(|d| *d).unwrap_or_default();
        held(leading, since, deadline)
    }

    /// The write gate: `Ok` while the lease is held, checked right before each write.
    pub fn may_write(&self, what: &str) -> Result<(), LostLeadership> {
        if self.is_leader() {
            return Ok(());
        }
        info!(
            write = what,
            "lease no longer held: write skipped, pass ends"
        );
        Err(LostLeadership)
    }

    /// The elector acquired or renewed the lease in an attempt that started at `attempt`.
    pub fn renewed(&self, attempt: Instant) {
        if let Ok(mut r) = self.0.renewed.lock() {
            *r = Some(attempt);
        }
        if !self.0.leading.swap(true, Ordering::SeqCst) {
            self.0.acquisitions.send_modify(|n| *n += 1);
        }
    }

    /// The elector saw the lease lost (another holder, or no renew within the deadline).
    pub fn lost(&self) {
        self.0.leading.store(false, Ordering::SeqCst);
    }

    /// Sets the renew deadline [`Leadership::is_leader`] judges renews by (the elector's).
    pub fn set_renew_deadline(&self, deadline: Duration) {
        if let Ok(mut d) = self.0.renew_deadline.lock() {
            *d = deadline;
        }
    }

    /// The elector's flag alone, without the renew deadline (for tests and logs).
    pub fn elector_flag(&self) -> bool {
        self.0.leading.load(Ordering::SeqCst)
    }

    /// One item per acquisition after this call: a controller reconciles every cached
    /// object then (standbys idle until they lead).
    pub fn acquisitions(&self) -> impl Stream<Item = ()> + Send + 'static {
        let rx = self.0.acquisitions.subscribe();
        futures::stream::unfold(rx, |mut rx| async move {
            rx.changed().await.ok()?;
            Some(((), rx))
        })
    }
}

/// Drops a controller's triggers while this replica does not lead, and asks for a pass over
/// every cached object when that may have hidden one: on each acquisition, and at the end of
/// an initial list during which a trigger was dropped (a reflector publishes a list's objects
/// to its store only once the list is complete, so an acquisition mid-list finds them absent).
#[derive(Clone, Debug)]
pub struct StandbyFilter {
    leadership: Leadership,
    dropped: Arc<AtomicBool>,
    list_done: tokio::sync::watch::Sender<u64>,
}

impl StandbyFilter {
    pub fn new(leadership: Leadership) -> Self {
        StandbyFilter {
            leadership,
            dropped: Arc::new(AtomicBool::new(false)),
            list_done: tokio::sync::watch::Sender::new(0),
        }
    }

    /// Whether a trigger may pass now (this replica leads); remembers a dropped one.
    pub fn pass(&self) -> bool {
        let leading = self.leadership.is_leader();
        if !leading {
            self.dropped.store(true, Ordering::SeqCst);
        }
        leading
    }

    /// The primary watch delivered a complete list.
    pub fn list_complete(&self) {
        if self.dropped.swap(false, Ordering::SeqCst) {
            self.list_done.send_modify(|n| *n += 1);
        }
    }

    /// The controller's `reconcile_all_on` trigger: acquisitions, and complete lists after a
    /// dropped trigger, while leading.
    pub fn reconcile_all(&self) -> impl Stream<Item = ()> + Send + 'static {
        use futures::StreamExt;
        let lists = futures::stream::unfold(self.list_done.subscribe(), |mut rx| async move {
            rx.changed().await.ok()?;
            Some(((), rx))
        });
        let leadership = self.leadership.clone();
        futures::stream::select(self.leadership.acquisitions(), lists).filter(move |()| {
            let leading = leadership.is_leader();
            if leading {
                debug!("reconciling every cached object");
            }
            futures::future::ready(leading)
        })
    }
}

/// Timings: 15 s lease, 10 s renew deadline, 2 s retry (the customary defaults).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ElectionTiming {
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry: Duration,
}

impl Default for ElectionTiming {
    fn default() -> Self {
        ElectionTiming {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry: Duration::from_secs(2),
        }
    }
}

/// What the elector decides to do with the Lease it read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Create,
    Renew,
    TakeOver,
    Wait,
}

/// The pure decision: `holder` as read, whether the record has been unchanged for longer than
/// the lease duration (locally observed).
pub fn decide(me: &str, lease: Option<&Lease>, stale: bool) -> Step {
    let Some(lease) = lease else {
        return Step::Create;
    };
    let holder = lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .unwrap_or("");
    if holder == me {
        Step::Renew
    } else if holder.is_empty() || stale {
        Step::TakeOver
    } else {
        Step::Wait
    }
}

/// Runs the election until `shutdown` resolves; releases the Lease on the way out.
pub async fn run(
    client: Client,
    namespace: &str,
    identity: String,
    timing: ElectionTiming,
    leadership: Leadership,
    shutdown: impl Future<Output = ()>,
) {
    let api: Api<Lease> = Api::namespaced(client, namespace);
    let mut observed: Option<(String, Instant)> = None;
    let mut last_renew: Option<Instant> = None;
    let lease_secs = i32::try_from(timing.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX);
    leadership.set_renew_deadline(timing.renew_deadline);
    tokio::pin!(shutdown);
    loop {
        // A renew counts from when its attempt began: the record it wrote is no older.
        let attempt = Instant::now();
        let current = api.get_opt(LEASE_NAME).await;
        let outcome: Result<bool, kube::Error> = match current {
            Err(e) => Err(e),
            Ok(lease) => {
                // Staleness on our own clock: how long the record has stayed the same.
                let rv = lease
                    .as_ref()
                    .and_then(|l| l.metadata.resource_version.clone())
                    .unwrap_or_default();
                let since = match &observed {
                    Some((seen, at)) if *seen == rv => *at,
                    _ => {
                        let now = Instant::now();
                        observed = Some((rv, now));
                        now
                    }
                };
                let stale = since.elapsed() > timing.lease_duration;
                let now = MicroTime(Timestamp::now());
                match decide(&identity, lease.as_ref(), stale) {
                    Step::Create => {
                        let lease = Lease {
                            metadata: ObjectMeta {
                                name: Some(LEASE_NAME.into()),
                                namespace: Some(namespace.into()),
                                ..Default::default()
                            },
                            spec: Some(LeaseSpec {
                                holder_identity: Some(identity.clone()),
                                lease_duration_seconds: Some(lease_secs),
                                acquire_time: Some(now.clone()),
                                renew_time: Some(now),
                                lease_transitions: Some(0),
                                ..Default::default()
                            }),
                        };
                        api.create(&PostParams::default(), &lease)
                            .await
                            .map(|_| true)
                    }
                    step @ (Step::Renew | Step::TakeOver) => match lease {
                        None => Ok(false),
                        Some(mut lease) => {
                            let taking = step == Step::TakeOver;
                            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
                            if taking {
                                spec.holder_identity = Some(identity.clone());
                                spec.acquire_time = Some(now.clone());
                                spec.lease_transitions =
                                    Some(spec.lease_transitions.unwrap_or(0) + 1);
                            }
                            spec.lease_duration_seconds = Some(lease_secs);
                            spec.renew_time = Some(now);
                            // The resourceVersion in `lease` makes this a compare-and-swap.
                            api.replace(LEASE_NAME, &PostParams::default(), &lease)
                                .await
                                .map(|_| true)
                        }
                    },
                    Step::Wait => Ok(false),
                }
            }
        };
        match outcome {
            Ok(true) => {
                last_renew = Some(attempt);
                if !leadership.elector_flag() {
                    info!(identity = %identity, "acquired leadership");
                }
                leadership.renewed(attempt);
            }
            Ok(false) => {
                if leadership.elector_flag() {
                    warn!(identity = %identity, "lost leadership");
                }
                leadership.lost();
            }
            Err(e) => {
                // A conflict means someone else wrote first; anything else is transient. Either
                // way keep leading only within the renew deadline.
                let expired = last_renew.is_none_or(|t| t.elapsed() >= timing.renew_deadline);
                if leadership.elector_flag() && expired {
                    warn!(identity = %identity, error = %e, "could not renew leadership in time");
                    leadership.lost();
                }
            }
        }
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tokio::time::sleep(timing.retry) => {}
        }
    }
    if leadership.elector_flag() {
        leadership.lost();
        // The holder check and the resourceVersion keep a successor's record untouched.
        if let Ok(Some(mut lease)) = api.get_opt(LEASE_NAME).await
            && lease
                .spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_deref())
                == Some(identity.as_str())
        {
            if let Some(spec) = lease.spec.as_mut() {
                spec.holder_identity = None;
            }
            let _ = api
                .replace(LEASE_NAME, &PostParams::default(), &lease)
                .await;
            info!(identity = %identity, "released leadership");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: Option<&str>) -> Lease {
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: holder.map(String::from),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn election_rules() {
        assert_eq!(decide("a", None, false), Step::Create);
        assert_eq!(decide("a", Some(&lease(Some("a"))), false), Step::Renew);
        assert_eq!(decide("a", Some(&lease(Some("a"))), true), Step::Renew);
        assert_eq!(decide("a", Some(&lease(Some("b"))), false), Step::Wait);
        assert_eq!(decide("a", Some(&lease(Some("b"))), true), Step::TakeOver);
        assert_eq!(
            decide("a", Some(&lease(None)), false),
            Step::TakeOver,
            "released"
        );
        assert_eq!(decide("a", Some(&lease(Some(""))), false), Step::TakeOver);
    }

    #[test]
    fn the_write_gate_wants_the_flag_and_a_fresh_renew() {
        let deadline = Duration::from_secs(10);
        let s = Duration::from_secs;
        for (leading, since, want, why) in [
            (true, Some(s(0)), true, "just renewed"),
            (true, Some(s(9)), true, "within the deadline"),
            (true, Some(s(10)), false, "at the deadline"),
            (
                true,
                Some(s(60)),
                false,
                "paused past the deadline, flag still set",
            ),
            (true, None, false, "never renewed"),
            (false, Some(s(0)), false, "the elector saw it lost"),
            (false, None, false, "a standby"),
        ] {
            assert_eq!(held(leading, since, deadline), want, "{why}");
        }
    }

    #[test]
    fn leadership_follows_the_elector_and_expires_on_its_own() {
        let l = Leadership::elected();
        assert!(!l.is_leader(), "a standby until it acquires");
        assert_eq!(l.may_write("test"), Err(LostLeadership));
        l.set_renew_deadline(Duration::from_secs(3600));
        l.renewed(Instant::now());
        assert!(l.is_leader());
        assert_eq!(l.may_write("test"), Ok(()));
        // A renew older than the deadline: the flag still reads true, the lease is not held.
        l.set_renew_deadline(Duration::from_millis(1));
        let old = Instant::now()
            .checked_sub(Duration::from_secs(1))
            .expect("clock");
        l.renewed(old);
        assert!(l.elector_flag());
        assert!(!l.is_leader());
        assert_eq!(l.may_write("test"), Err(LostLeadership));
        l.set_renew_deadline(Duration::from_secs(3600));
        l.lost();
        assert!(!l.is_leader());
        assert!(Leadership::always().is_leader());
    }

    #[tokio::test]
    async fn acquisitions_are_announced_once_each() {
        use futures::StreamExt;
        let l = Leadership::elected();
        l.set_renew_deadline(Duration::from_secs(3600));
        let mut events = Box::pin(l.acquisitions());
        l.renewed(Instant::now());
        l.renewed(Instant::now());
        events.next().await.expect("acquired");
        l.lost();
        l.renewed(Instant::now());
        events.next().await.expect("acquired again");
        let pending = futures::poll!(events.next());
        assert!(pending.is_pending(), "renews are not acquisitions");
    }
}
