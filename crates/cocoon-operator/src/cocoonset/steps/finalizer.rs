//! Seed step 3 — `cocoonset.cocoonstack.io/finalizer` is in place.
//!
//! A set without it gets it (a precondition-safe patch of the list) and the pass goes on in
//! the same pass, as the Go operator's does. Ending the pass here cost every create a full
//! `requeue_after_write`: a finalizer-only change of the set is no watch event (§1 admits
//! generation and status changes), so nothing woke the set sooner. The spec's
//! `RequeueAfter 1 s` is a maximum wait; going on at once is within it.

use cocoon_api::contract::finalizers;

use super::{Next, Observed, StepPlan, Write};
use crate::controller::{add_finalizer_patch, has_finalizer};

pub fn plan(o: &Observed<'_>) -> StepPlan {
    if has_finalizer(o.cs, finalizers::COCOONSET) {
        return StepPlan::proceed();
    }
    StepPlan::then(
        vec![Write::Finalizers {
            patch: add_finalizer_patch(o.cs, finalizers::COCOONSET),
            gone_ok: false,
        }],
        Next::Continue,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cocoonset::Timing;
    use crate::cocoonset::fixtures::{observe, set};
    use crate::cocoonset::pods::Classified;

    fn run(finalizers: &[&str]) -> StepPlan {
        let mut cs = set();
        cs.metadata.resource_version = Some("7".into());
        cs.metadata.finalizers = Some(finalizers.iter().map(|f| f.to_string()).collect());
        let (classified, timing) = (Classified::default(), Timing::default());
        plan(&observe(&cs, &classified, &timing))
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
                    patch: serde_json::json!({"metadata": {
                        "finalizers": ["x.io/a", finalizers::COCOONSET],
                        "resourceVersion": "7",
                    }}),
                    gone_ok: false,
                }],
                Next::Continue,
            )
        );
    }
}
