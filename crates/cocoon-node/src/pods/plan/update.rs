//! What an update of a pod means (`node.md` §8.1), as pure functions over what UpdatePod's
//! shell ([`crate::pods::update`]) observed: the gate (a resumed operation's claim, a tenant
//! isolation refusal) and the dispatch (hibernate, wake, lift a failed hibernate, or nothing,
//! with or without re-publishing the lifecycle at a risen generation). The hibernate and the
//! wake themselves are planned in [`super::hibernate`] and [`super::wake`].
//!
//! The rules, as §8.1 states them:
//! * a resumed operation holding the pod fails the update before any VM state is read;
//! * a pod whose VM name, `managed` or pre-assigned id changed since its admission is refused
//!   (reported once: a refusal already standing as the pod's failure is not reported again);
//! * unmanaged pods ignore the hibernate annotation;
//! * hibernate wanted with a live VM → hibernate; not wanted without a VM → wake;
//! * not wanted with a live VM whose `failed` came from a hibernate attempt → lift the
//!   failure (a new attempt: `creating`, then `ready` once the probe is);
//! * anything else is a no-op, re-publishing the current state and message only when the
//!   pod's generation rose above the intent's observed generation; no status, no notify.

use cocoon_api::contract::LifecycleState;
use cocoon_api::contract::events::node as ev;
use cocoon_api::contract::metrics::node as m;

use crate::pods::intent::Intent;

/// The gate before an update is dispatched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Gate {
    /// A resumed operation holds the pod: fail with `resumed operation still in flight for
    /// <key>`.
    InFlight,
    /// Tenant isolation refused the update: failOp `TenantIsolationRefused` when `report`,
    /// then succeed (nothing else happens).
    Refused { report: bool },
    /// Dispatch it.
    Pass,
}

/// §8.1 step 1 and the tenant check. `refusal` is [`crate::pods::tenant::check_update`]'s,
/// `intent` the pod's current intent.
pub(crate) fn gate(resumed: bool, refusal: Option<&str>, intent: Option<&Intent>) -> Gate {
    if resumed {
        return Gate::InFlight;
    }
    match refusal {
        Some(r) => Gate::Refused {
            report: report_refusal(r, intent),
        },
        None => Gate::Pass,
    }
}

/// Whether a refusal is reported (failOp): not when the pod's current intent already is
/// `failed` with exactly this message (the controller's next update must not repeat it).
pub(crate) fn report_refusal(refusal: &str, intent: Option<&Intent>) -> bool {
    !intent.is_some_and(|i| i.lifecycle.is_failed() && i.lifecycle.message == refusal)
}

/// What the dispatch is decided from, once the incoming pod is stored.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Facts<'a> {
    /// `cocoonset.cocoonstack.io/managed` is `true`.
    pub managed: bool,
    /// The hibernate annotation is `true` (`want`).
    pub hibernate: bool,
    /// A VM is tracked for the pod (`have`).
    pub has_vm: bool,
    /// This incarnation's intent (one of another UID is dropped while storing the pod).
    pub intent: Option<&'a Intent>,
    /// The incoming pod's `cocoonset.cocoonstack.io/generation`.
    pub generation: i64,
}

/// What the update means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Dispatch {
    /// An unmanaged pod: nothing.
    Unmanaged,
    /// §8.2.
    Hibernate,
    /// §8.3.
    Wake,
    /// The hibernate request was withdrawn after a failed hibernate: a new attempt.
    LiftHibernateFailure,
    /// Nothing, or re-publish the lifecycle at the new generation.
    Noop(Option<Republish>),
}

/// The current lifecycle, re-published at a risen generation (one patch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Republish {
    pub state: LifecycleState,
    pub message: String,
    /// The `failed` came from a hibernate attempt and must stay liftable.
    pub keep_hibernate_origin: bool,
}

impl Dispatch {
    /// `cocoon_vk_pod_lifecycle_total{op=update, result, reason}` once it is done.
    pub(crate) fn counted(&self) -> (&'static str, &'static str, &'static str) {
        match self {
            Dispatch::Unmanaged | Dispatch::Noop(_) => {
                (ev::OP_UPDATE, m::RESULT_SKIPPED, m::REASON_NOOP)
            }
            Dispatch::Hibernate | Dispatch::Wake | Dispatch::LiftHibernateFailure => {
                (ev::OP_UPDATE, m::RESULT_OK, "")
            }
        }
    }
}

/// §8.1 steps 3–4 and the lift of a failed hibernate.
pub(crate) fn dispatch(f: &Facts<'_>) -> Dispatch {
    if !f.managed {
        return Dispatch::Unmanaged;
    }
    match (f.hibernate, f.has_vm) {
        (true, true) => Dispatch::Hibernate,
        (false, false) => Dispatch::Wake,
        (false, true)
            if f.intent
                .is_some_and(|i| i.failed_by_hibernate && i.lifecycle.is_failed()) =>
        {
            Dispatch::LiftHibernateFailure
        }
        _ => Dispatch::Noop(f.intent.and_then(|i| {
            let state = i.lifecycle.state?;
            (f.generation > i.lifecycle.observed_generation).then(|| Republish {
                state,
                message: i.lifecycle.message.clone(),
                keep_hibernate_origin: i.failed_by_hibernate,
            })
        })),
    }
}
