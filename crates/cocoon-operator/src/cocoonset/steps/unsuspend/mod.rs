//! Seed step 10 — unsuspend bookkeeping and reclaim (`spec.suspend == false`).
//!
//! The bookkeeping (10.1–10.5) is [`crate::cocoonset::shared::unsuspend::bookkeeping`],
//! which step 7 runs too, before it reports a terminal main.
//!
//! [`reclaim`] (10.6): drop the `:hibernate` tag of each recorded VM whose pod has woken;
//! the dropped ones leave the record, and a refused delete fails the pass.

use cocoon_api::contract::{AnnotationCodec, ReclaimRecord};
use k8s_openapi::jiff::Timestamp;

use self::rules::Reclaim;
use super::{Next, Note, Observed, StepPlan, Write, effects};

pub mod rules;
#[cfg(test)]
mod rules_tests;

/// The step's name in a registry error.
pub const STEP: &str = "reclaim";

/// 10.6: drop the tags of recorded VMs whose pods have woken, together once the set's other
/// recorded VMs have woken too or the hold has passed ([`rules::reclaim_decision`]). A
/// refused delete keeps the VM recorded and fails the pass, so scaling and the status wait
/// for the retry.
pub fn reclaim(o: &Observed<'_>, now: Timestamp) -> StepPlan {
    let record = ReclaimRecord::from_meta(&o.cs.metadata);
    match rules::reclaim_decision(&record, o.classified, now) {
        Reclaim::Nothing => StepPlan::proceed(),
        Reclaim::Hold(left) => StepPlan::of(effects![Note::Backoff(left)], Next::Continue),
        Reclaim::Now(vms) => {
            StepPlan::then(vec![Write::ReclaimTags { vms, step: STEP }], Next::Continue)
        }
    }
}

#[cfg(test)]
mod tests {
    use cocoon_api::contract::annotations as ann;
    use cocoon_api::crd::set::CocoonSet;
    use k8s_openapi::api::core::v1::Pod;
    use kube::ResourceExt;

    use super::*;
    use crate::cocoonset::Timing;
    use crate::cocoonset::fixtures::{NS, SetFixture, classify, live, observe, set, with};
    use crate::cocoonset::pods::{self, Classified};

    /// A set of one sub-agent at generation 4 carrying `record`.
    fn recording(record: &ReclaimRecord) -> CocoonSet {
        let mut cs = set().with_replicas(1).at_generation(4);
        record.apply_to(cs.annotations_mut());
        cs
    }

    fn agent(cs: &CocoonSet, slot: i32, annotated: bool) -> Pod {
        let main_vm = pods::vm_name(&pods::build_agent_pod(cs, NS, 0, "", None)).to_string();
        let p = pods::build_agent_pod(cs, NS, slot, &main_vm, Some("node-a"));
        if annotated {
            return with(p, ann::HIBERNATE, "true");
        }
        p
    }

    #[test]
    fn every_pass_drops_the_tag_of_a_recorded_vm_once_its_pod_has_woken() {
        let probe = recording(&ReclaimRecord::default());
        let vm = pods::vm_name(&agent(&probe, 0, false)).to_string();
        let mut record = ReclaimRecord::default();
        record.add_vm(&vm);
        record.generation = 4;
        let cs = recording(&record);
        let c = Classified::default();
        let t = Timing::default();
        let o = observe(&cs, &c, &t);
        assert_eq!(
            reclaim(&o, Timestamp::UNIX_EPOCH),
            StepPlan::proceed(),
            "its pod is missing"
        );
        let woken = live(agent(&cs, 0, false), 4);
        let still_asked = with(woken.clone(), ann::HIBERNATE, "true");
        for (pod, want) in [
            (
                woken,
                StepPlan::then(
                    vec![Write::ReclaimTags {
                        vms: vec![vm.clone()],
                        step: STEP,
                    }],
                    Next::Continue,
                ),
            ),
            (still_asked, StepPlan::proceed()),
        ] {
            let c = classify([&pod]);
            let o = Observed {
                classified: &c,
                ..o
            };
            assert_eq!(reclaim(&o, Timestamp::UNIX_EPOCH), want);
        }
    }
}
