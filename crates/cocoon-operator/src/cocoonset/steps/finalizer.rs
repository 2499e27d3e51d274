//! Step 3 — `cocoonset.cocoonstack.io/finalizer` is in place.
//!
//! A set without it gets it (a precondition-safe patch of the list) and the pass goes on in
//! the same pass, as the Go operator's does. Ending the pass here cost every create a full
//! `requeue_after_write`: a finalizer-only change of the set is no watch event (§1 admits
//! generation and status changes), so nothing woke the set sooner. The spec's
//! `RequeueAfter 1 s` is a maximum wait; going on at once is within it.

use cocoon_api::contract::finalizers;
use kube::ResourceExt;

use super::{Next, Observed, StepPlan, Write};

pub fn plan(o: &Observed<'_>) -> StepPlan {
    if o.cs.finalizers().iter().any(|f| f == finalizers::COCOONSET) {
        return StepPlan::proceed();
    }
    let mut list = o.cs.finalizers().to_vec();
    list.push(finalizers::COCOONSET.to_string());
    StepPlan::then(
        vec![Write::Finalizers {
            list,
            resource_version: o.cs.resource_version(),
            gone_ok: false,
        }],
        Next::Continue,
    )
}

#[cfg(test)]
mod tests {
    use cocoon_api::crd::set::{CocoonSet, CocoonSetSpec};

    use super::*;
    use crate::cocoonset::plan::Timing;
    use crate::cocoonset::pods::Classified;

    fn run(finalizers: &[&str]) -> StepPlan {
        let mut cs = CocoonSet::new("demo", CocoonSetSpec::with_image("img:1"));
        cs.metadata.resource_version = Some("7".into());
        cs.metadata.finalizers = Some(finalizers.iter().map(|f| f.to_string()).collect());
        let (classified, timing) = (Classified::default(), Timing::default());
        plan(&Observed {
            cs: &cs,
            ns: "ns",
            owned: &[],
            classified: &classified,
            timing: &timing,
        })
    }

    #[test]
    fn the_finalizer_in_place_hands_over() {
        assert_eq!(run(&["x.io/a", finalizers::COCOONSET]), StepPlan::proceed());
    }

    #[test]
    fn a_missing_finalizer_is_added_beside_the_others_and_the_pass_goes_on() {
        assert_eq!(
            run(&["x.io/a"]),
            StepPlan::then(
                vec![Write::Finalizers {
                    list: vec!["x.io/a".into(), finalizers::COCOONSET.into()],
                    resource_version: Some("7".into()),
                    gone_ok: false,
                }],
                Next::Continue,
            )
        );
    }
}
