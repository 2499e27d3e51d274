//! Step 10 — unsuspend bookkeeping and reclaim (`spec.suspend == false`).
//!
//! [`bookkeeping`] (10.1–10.5): the first pass that finds the suspended list of step 6 (or a
//! hibernate annotation without one) sets the record's generation to the set's, records every
//! listed VM whose pod is missing as owed a restore, clears the hibernate annotations, and
//! clears the list last, each write durable before the next. Pods a CocoonHibernation owns
//! are left to that reconciler: the cached CocoonHibernations decide, and a fresh list
//! ([`Read::FreshHibernations`]) is read before clearing an annotation the set did not write
//! itself. No registry call; nothing at all when there is neither an annotation to clear nor
//! a suspended list. Step 7 runs it too, before it reports a terminal main.
//!
//! [`reclaim`] (10.6): drop the `:hibernate` tag of each recorded VM whose pod has woken;
//! the dropped ones leave the record, and a refused delete fails the pass.

use cocoon_api::contract::{AnnotationCodec, ReclaimRecord, annotations as ann, bool_delta};
use kube::ResourceExt;

use super::{Answers, Next, Observed, Read, StepPlan, Write, log};
use crate::cocoonset::suspend;

/// The step's name in a registry error.
pub const STEP: &str = "reclaim";

/// 10.1–10.5.
pub fn bookkeeping(o: &Observed<'_>, answers: &Answers) -> StepPlan {
    let record = ReclaimRecord::from_meta(&o.cs.metadata);
    let any_annotated = o
        .classified
        .all_by_name
        .values()
        .any(suspend::is_hibernate_annotated);
    if !any_annotated && record.suspended.is_empty() {
        return StepPlan::proceed();
    }
    let owned_by_cr = if any_annotated {
        match &answers.cached_hibernations {
            None => return StepPlan::read(Vec::new(), vec![Read::CachedHibernations]),
            Some(crs) => suspend::hibernation_owned(crs),
        }
    } else {
        Default::default()
    };
    let mut hibernated = suspend::unsuspend_targets(o.classified, &owned_by_cr);
    if suspend::unsuspend_needs_fresh_crs(&record, &hibernated) {
        let Some(fresh) = &answers.fresh_hibernations else {
            return StepPlan::read(Vec::new(), vec![Read::FreshHibernations]);
        };
        hibernated = suspend::unsuspend_targets(o.classified, &suspend::hibernation_owned(fresh));
    }
    if hibernated.is_empty() && record.suspended.is_empty() {
        return StepPlan::proceed();
    }
    let present = suspend::present_vms(o.classified);
    let first = suspend::unsuspend_first_write(&record, &hibernated, &present, o.generation());
    let names: Vec<String> = hibernated.iter().map(|p| p.name_any()).collect();
    let woken = format!("unsuspended: woken {names:?}");
    let mut writes = vec![Write::Record(first)];
    if !names.is_empty() {
        writes.push(Write::MarkPods {
            names,
            delta: bool_delta(ann::HIBERNATE, false),
        });
    }
    writes.push(Write::ClearSuspended);
    writes.push(log(woken));
    StepPlan::then(writes, Next::Continue)
}

/// 10.6: drop the tags of recorded VMs whose pods have woken. A refused delete keeps the VM
/// recorded and fails the pass, so scaling and the status wait for the retry.
pub fn reclaim(o: &Observed<'_>) -> StepPlan {
    let record = ReclaimRecord::from_meta(&o.cs.metadata);
    let woken = suspend::reclaimable(&record, o.classified);
    if woken.is_empty() {
        return StepPlan::proceed();
    }
    StepPlan::then(
        vec![Write::ReclaimTags {
            vms: woken,
            step: STEP,
        }],
        Next::Continue,
    )
}
