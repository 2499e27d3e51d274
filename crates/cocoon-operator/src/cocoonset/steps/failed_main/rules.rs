//! Pure rules of step 7 (the main's failed state) of `cocoonset.md`; the step's planner
//! ([`super::plan`]) decides on them.

use cocoon_api::contract::events::{self as ev, operator as reasons};
use cocoon_api::crd::set::{CocoonSet, CocoonSetPhase};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use crate::cocoonset::pods;

/// Step 7's verdict on the main.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// The main is absent, or healthy with nothing to announce.
    Continue,
    /// Terminal and drifted: the main takes the rebuild budget with this reason.
    Rebuild { reason: String },
    /// Terminal and matching the spec: report Failed.
    Fail(FailedReport),
    /// Ready again after Failed: announce and continue.
    Recovered { message: String },
}

/// How a failed main is reported.
#[derive(Debug, Clone, PartialEq)]
pub struct FailedReport {
    pub reason: &'static str,
    pub message: String,
    /// Count `lifecycle_state_failed_observed{phase}` with this phase.
    pub lifecycle_metric_phase: Option<String>,
    /// Emit the event and count the metric: only on entering Failed, so a repeated pass over
    /// the same failure (the status patch brings one) does not announce it again.
    pub announce: bool,
}

/// Step 7.2–7.4.
pub fn verdict(cs: &CocoonSet, ns: &str, main: Option<&Pod>, drifted: bool) -> Verdict {
    let Some(main) = main else {
        return Verdict::Continue;
    };
    let current = cs.status.as_ref().and_then(|s| s.phase);
    if pods::is_terminal(main) {
        if drifted {
            return Verdict::Rebuild {
                reason: ev::reason_terminal(pods::pod_phase(main), pods::lifecycle_state_str(main)),
            };
        }
        return Verdict::Fail(failed_report(cs, ns, main));
    }
    if current == Some(CocoonSetPhase::Failed) && pods::is_ready(main) {
        return Verdict::Recovered {
            message: ev::recovered_message(ns, &main.name_any()),
        };
    }
    Verdict::Continue
}

/// The report of a terminal main (7.3).
pub fn failed_report(cs: &CocoonSet, ns: &str, main: &Pod) -> FailedReport {
    let current = cs.status.as_ref().and_then(|s| s.phase);
    let lc = pods::lifecycle(main);
    let lifecycle_failed = lc.is_failed();
    let msg = if lc.message.is_empty() {
        pods::pod_phase(main).to_string()
    } else {
        lc.message.clone()
    };
    FailedReport {
        reason: if lifecycle_failed {
            reasons::POD_LIFECYCLE_FAILED
        } else {
            reasons::MAIN_AGENT_FAILED
        },
        message: ev::main_pod_failed_message(ns, &main.name_any(), &msg),
        lifecycle_metric_phase: lifecycle_failed.then(|| {
            current
                .map(|p| p.as_str().to_string())
                .unwrap_or_else(|| CocoonSetPhase::Pending.as_str().to_string())
        }),
        announce: current != Some(CocoonSetPhase::Failed),
    }
}
