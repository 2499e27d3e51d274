//! Pure rules of step 9 (the release-policy wake) of `cocoonset.md`; the step's planner
//! ([`super::plan`]) decides on them.

use cocoon_api::crd::set::CocoonSetPhase;
use k8s_openapi::api::core::v1::Pod;

use crate::cocoonset::pods;

/// Step 9's verdict before any registry call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WakeStep {
    /// Not engaged, or the normal flow owns the main: no registry call.
    HandOver,
    /// 9.1: the released main is gone; read its tag and recreate it from the snapshot.
    Start,
    /// 9.2: the recreated main has no live VM yet; `Some(msg)` when it is Unschedulable.
    WaitLive { unschedulable: Option<String> },
    /// 9.3: the recreated main runs; drop the tag, score (when a hint is set), clear the hint.
    Complete { placement: Option<&'static str> },
    /// 9.4: the cache still shows the released main; confirm with an uncached GET.
    ConfirmGone,
}

/// Step 9 over the phase, the hint and the main.
pub fn wake_step(phase: Option<CocoonSetPhase>, hint: &str, main: Option<&Pod>) -> WakeStep {
    let cleanup_pending = main.is_some_and(|m| {
        pods::is_restore_marked(m) && !pods::is_hibernate_annotated(m) && !hint.is_empty()
    });
    let waking = phase == Some(CocoonSetPhase::Waking) || cleanup_pending;
    let suspended = phase == Some(CocoonSetPhase::Suspended);
    let suspending = phase == Some(CocoonSetPhase::Suspending) && !hint.is_empty();
    if !(waking || suspended || suspending) {
        return WakeStep::HandOver;
    }
    let Some(main) = main else {
        return WakeStep::Start;
    };
    if waking {
        if !pods::is_vm_live(main) {
            return WakeStep::WaitLive {
                unschedulable: pods::unschedulable_message(main),
            };
        }
        let placement = (!hint.is_empty()).then(|| {
            if hint == pods::bound_node(main) {
                cocoon_api::contract::metrics::operator::PLACEMENT_HINT_NODE
            } else {
                cocoon_api::contract::metrics::operator::PLACEMENT_POOL
            }
        });
        return WakeStep::Complete { placement };
    }
    if !hint.is_empty() && !pods::is_terminal(main) {
        return WakeStep::ConfirmGone;
    }
    WakeStep::HandOver
}
