//! Step 10's unsuspend bookkeeping (10.1–10.5), shared by step 10 and step 7 (which runs it
//! before it reports a terminal main).
//!
//! [`bookkeeping`]: the first pass that finds the suspended list of step 6 (or a hibernate
//! annotation without one) sets the record's generation to the set's, records every listed
//! VM whose pod is missing as owed a restore, clears the hibernate annotations, and clears
//! the list last, each write durable before the next. Pods a CocoonHibernation owns are left
//! to that reconciler: the cached CocoonHibernations decide, and a fresh list
//! ([`Read::FreshHibernations`]) is read before clearing an annotation the set did not write
//! itself. No registry call; nothing at all when there is neither an annotation to clear nor
//! a suspended list. The pure rules are [`rules`].

use cocoon_api::contract::{AnnotationCodec, ReclaimRecord, annotations as ann, bool_delta};
use kube::ResourceExt;

use crate::cocoonset::pods;
use crate::cocoonset::steps::{Answers, Next, Observed, Read, StepPlan, Write, effects, log};

pub mod rules;
#[cfg(test)]
mod rules_tests;

/// 10.1–10.5.
pub fn bookkeeping(o: &Observed<'_>, answers: &Answers) -> StepPlan {
    let record = ReclaimRecord::from_meta(&o.cs.metadata);
    let any_annotated = o
        .classified
        .all_by_name
        .values()
        .any(pods::is_hibernate_annotated);
    if !any_annotated && record.suspended.is_empty() {
        return StepPlan::proceed();
    }
    let owned_by_cr = if any_annotated {
        match &answers.cached_hibernations {
            None => return StepPlan::read(Vec::new(), vec![Read::CachedHibernations]),
            Some(crs) => rules::hibernation_owned(crs),
        }
    } else {
        Default::default()
    };
    let mut hibernated = rules::unsuspend_targets(o.classified, &owned_by_cr);
    if rules::unsuspend_needs_fresh_crs(&record, &hibernated) {
        let Some(fresh) = &answers.fresh_hibernations else {
            return StepPlan::read(Vec::new(), vec![Read::FreshHibernations]);
        };
        hibernated = rules::unsuspend_targets(o.classified, &rules::hibernation_owned(fresh));
    }
    if hibernated.is_empty() && record.suspended.is_empty() {
        return StepPlan::proceed();
    }
    let present = rules::present_vms(o.classified);
    let first = rules::unsuspend_first_write(&record, &hibernated, &present, o.generation());
    let names: Vec<String> = hibernated.iter().map(|p| p.name_any()).collect();
    let woken = format!("unsuspended: woken {names:?}");
    let mut writes = effects![Write::Record(first)];
    if !names.is_empty() {
        writes.push(
            Write::MarkPods {
                names,
                delta: bool_delta(ann::HIBERNATE, false),
            }
            .into(),
        );
    }
    writes.push(Write::ClearSuspended.into());
    writes.push(log(woken).into());
    StepPlan::of(writes, Next::Continue)
}

#[cfg(test)]
mod tests {
    use cocoon_api::crd::hibernation::{CocoonHibernation, CocoonHibernationSpec, Desire, PodRef};
    use cocoon_api::crd::set::CocoonSet;
    use k8s_openapi::api::core::v1::Pod;

    use super::*;
    use crate::cocoonset::Timing;
    use crate::cocoonset::fixtures::{NS, SetFixture, classify, observe, set, with};

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

    fn run(cs: &CocoonSet, owned: &[Pod], answers: &Answers) -> StepPlan {
        let c = classify(owned);
        let t = Timing::default();
        bookkeeping(
            &Observed {
                owned,
                ..observe(cs, &c, &t)
            },
            answers,
        )
    }

    fn cached(crs: Vec<CocoonHibernation>) -> Answers {
        Answers {
            cached_hibernations: Some(crs),
            ..Answers::default()
        }
    }

    #[test]
    fn a_pass_with_neither_an_annotation_to_clear_nor_a_suspended_list_skips_it_without_an_api_call()
     {
        let cs = recording(&ReclaimRecord::default());
        let owned = [agent(&cs, 0, false)];
        assert_eq!(run(&cs, &owned, &Answers::default()), StepPlan::proceed());
    }

    #[test]
    fn sets_the_generation_records_missing_pods_as_owed_a_restore_clears_the_annotations_and_the_list_last()
     {
        let probe = recording(&ReclaimRecord::default());
        let (main_vm, sub_vm) = (
            pods::vm_name(&agent(&probe, 0, false)).to_string(),
            pods::vm_name(&agent(&probe, 1, false)).to_string(),
        );
        let mut record = ReclaimRecord::default();
        for vm in [&main_vm, &sub_vm] {
            record.add_vm(vm);
            record.add_suspended(vm);
        }
        let cs = recording(&record);
        // The sub-agent was deleted while suspended.
        let owned = [agent(&cs, 0, true)];
        let p = run(&cs, &owned, &Answers::default());
        assert_eq!(
            p,
            StepPlan::read(Vec::new(), vec![Read::CachedHibernations])
        );
        let p = run(&cs, &owned, &cached(Vec::new()));
        let Write::Record(first) = &p.writes[0] else {
            panic!("the record first: {p:?}");
        };
        assert_eq!(first.generation, 4);
        assert!(first.owes_restore(&sub_vm) && !first.owes_restore(&main_vm));
        assert!(matches!(
            &p.writes[1],
            Write::MarkPods { names, delta }
                if names == &vec![owned[0].name_any()] && *delta == bool_delta(ann::HIBERNATE, false)
        ));
        assert_eq!(p.writes[2], Write::ClearSuspended, "the list last");
        assert_eq!(p.next, Next::Continue);
    }

    #[test]
    fn pods_that_are_the_target_of_a_desire_hibernate_cocoon_hibernation_are_skipped() {
        let probe = recording(&ReclaimRecord::default());
        let vm = pods::vm_name(&agent(&probe, 0, false)).to_string();
        let mut record = ReclaimRecord::default();
        record.add_vm(&vm);
        record.add_suspended(&vm);
        let cs = recording(&record);
        let owned = [agent(&cs, 0, true)];
        let cr = CocoonHibernation::new(
            "h",
            CocoonHibernationSpec {
                pod_ref: PodRef {
                    name: owned[0].name_any(),
                },
                desire: Desire::Hibernate,
            },
        );
        let p = run(&cs, &owned, &cached(vec![cr]));
        assert!(!p.writes.iter().any(|w| matches!(w, Write::MarkPods { .. })));
        assert_eq!(
            p.effects().last(),
            Some(&log("unsuspended: woken []").into())
        );
        // An annotation the set did not write itself: a fresh list decides.
        let cs = recording(&ReclaimRecord::default());
        let owned = [agent(&cs, 0, true)];
        assert_eq!(
            run(&cs, &owned, &cached(Vec::new())),
            StepPlan::read(Vec::new(), vec![Read::FreshHibernations])
        );
    }
}
