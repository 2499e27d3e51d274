//! Leader election through a `coordination.k8s.io/v1` Lease: every replica keeps its caches
//! warm and reconciles only while it holds the Lease, so exactly one replica writes.
//!
//! The rules (client-go's, on our own clock): a missing or released Lease is taken; our own
//! Lease is renewed every `retry`; another holder's Lease is taken over only after its record
//! has not changed for `lease_duration` as observed locally (no trust in remote clocks); a
//! holder that cannot renew for `renew_deadline` stops leading before anyone may take over.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use tracing::{info, warn};

/// The Lease the operator elects on (contract.md §12.1).
pub const LEASE_NAME: &str = "cocoon-operator.cocoonset.cocoonstack.io";

/// Whether this replica may write. Cheap to clone and to read on every pass.
#[derive(Clone, Debug)]
pub struct Leadership(Arc<AtomicBool>);

impl Leadership {
    /// Leadership that is always held (leader election off, tests).
    pub fn always() -> Self {
        Leadership(Arc::new(AtomicBool::new(true)))
    }

    /// Leadership decided by an elector; starts as not leading.
    pub fn elected() -> Self {
        Leadership(Arc::new(AtomicBool::new(false)))
    }

    pub fn is_leader(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    fn set(&self, v: bool) {
        self.0.store(v, Ordering::SeqCst);
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
    let lease_secs = timing.lease_duration.as_secs().max(1) as i32;
    tokio::pin!(shutdown);
    loop {
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
                last_renew = Some(Instant::now());
                if !leadership.is_leader() {
                    info!(identity = %identity, "acquired leadership");
                }
                leadership.set(true);
            }
            Ok(false) => {
                if leadership.is_leader() {
                    warn!(identity = %identity, "lost leadership");
                }
                leadership.set(false);
            }
            Err(e) => {
                // A conflict means someone else wrote first; anything else is transient. Either
                // way keep leading only within the renew deadline.
                let expired = last_renew.is_none_or(|t| t.elapsed() > timing.renew_deadline);
                if leadership.is_leader() && expired {
                    warn!(identity = %identity, error = %e, "could not renew leadership in time");
                    leadership.set(false);
                }
            }
        }
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tokio::time::sleep(timing.retry) => {}
        }
    }
    if leadership.is_leader() {
        leadership.set(false);
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
}
