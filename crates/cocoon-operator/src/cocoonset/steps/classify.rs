//! Step 4 — list pods labelled `cocoonset.cocoonstack.io/name=<cs.Name>`, drop any with stale
//! labels that are not actually controller-owned, and classify the rest by role label.
//!
//! No write: the plan is the classification every later step reads.

use cocoon_api::crd::set::CocoonSet;
use k8s_openapi::api::core::v1::Pod;

use crate::cocoonset::pods::{self, Classified};

/// The owned pods of `cached` (terminating ones included: teardown waits for them).
pub fn owned<'a>(cs: &CocoonSet, cached: impl IntoIterator<Item = &'a Pod>) -> Vec<Pod> {
    cached
        .into_iter()
        .filter(|p| pods::is_owned(cs, p))
        .cloned()
        .collect()
}

/// The live owned pods by role.
pub fn plan(owned: &[Pod]) -> Classified {
    Classified::from_owned(owned)
}

#[cfg(test)]
mod tests {
    use cocoon_api::contract::labels;
    use cocoon_api::crd::set::CocoonSetSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kube::ResourceExt;

    use super::*;

    const NS: &str = "ns";

    fn set() -> CocoonSet {
        let mut cs = CocoonSet::new("demo", CocoonSetSpec::with_image("img:1"));
        cs.metadata.namespace = Some(NS.into());
        cs.metadata.uid = Some("uid-1".into());
        cs
    }

    #[test]
    fn pods_with_stale_labels_that_are_not_controller_owned_are_dropped() {
        let cs = set();
        let ours = pods::build_agent_pod(&cs, NS, 0, "", None);
        let mut stray = pods::build_agent_pod(&cs, NS, 1, "", None);
        stray.metadata.owner_references = None;
        let mut other = set();
        other.metadata.uid = Some("uid-2".into());
        let foreign = pods::build_agent_pod(&other, NS, 2, "", None);
        let kept = owned(&cs, [&ours, &stray, &foreign]);
        assert_eq!(
            kept.iter().map(|p| p.name_any()).collect::<Vec<_>>(),
            ["demo-0"]
        );
    }

    #[test]
    fn the_rest_are_classified_by_role_label() {
        let mut cs = set();
        cs.spec.toolboxes = vec![cocoon_api::crd::set::ToolboxSpec {
            name: "tb".into(),
            ..Default::default()
        }];
        let main = pods::build_agent_pod(&cs, NS, 0, "", None);
        let sub = pods::build_agent_pod(&cs, NS, 2, "vm", Some("n"));
        let tb = pods::build_toolbox_pod(&cs, NS, &cs.spec.toolboxes[0]);
        let mut unlabelled = pods::build_agent_pod(&cs, NS, 3, "vm", Some("n"));
        unlabelled.labels_mut().remove(labels::ROLE);
        let mut leaving = pods::build_agent_pod(&cs, NS, 4, "vm", Some("n"));
        leaving.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        let c = plan(&[tb, sub, main, unlabelled, leaving]);
        assert_eq!(c.main.map(|p| p.name_any()).as_deref(), Some("demo-0"));
        assert_eq!(c.sub.keys().copied().collect::<Vec<_>>(), [2]);
        assert_eq!(c.toolbox.keys().cloned().collect::<Vec<_>>(), ["tb"]);
        assert_eq!(
            c.all_by_name.keys().cloned().collect::<Vec<_>>(),
            ["demo-0", "demo-2", "demo-3", "demo-tb"],
            "a pod without a role is still listed; a terminating one is not"
        );
    }
}
