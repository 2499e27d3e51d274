//! Seed step 4 — list pods labelled `cocoonset.cocoonstack.io/name=<cs.Name>`, drop any with stale
//! labels that are not actually controller-owned, and classify the rest by role label.
//!
//! No write: the step's outcome is the classification every later step reads.

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
pub fn by_role(owned: &[Pod]) -> Classified {
    Classified::from_owned(owned)
}

#[cfg(test)]
mod tests {
    use cocoon_api::contract::labels;
    use cocoon_api::crd::set::ToolboxSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use kube::ResourceExt;

    use super::*;
    use crate::cocoonset::fixtures::{NS, SetFixture, set};

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
        cs.spec.toolboxes = vec![ToolboxSpec {
            name: "tb".into(),
            ..Default::default()
        }];
        let main = pods::build_agent_pod(&cs, NS, 0, "", None);
        let sub = pods::build_agent_pod(&cs, NS, 2, "vm", Some("n"));
        let tb = pods::build_toolbox_pod(&cs, NS, &cs.spec.toolboxes[0]);
        let mut unlabelled = pods::build_agent_pod(&cs, NS, 3, "vm", Some("n"));
        unlabelled.labels_mut().remove(labels::ROLE);
        let mut leaving = pods::build_agent_pod(&cs, NS, 4, "vm", Some("n"));
        leaving.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        let c = by_role(&[tb, sub, main, unlabelled, leaving]);
        assert_eq!(c.main.map(|p| p.name_any()).as_deref(), Some("demo-0"));
        assert_eq!(c.sub.keys().copied().collect::<Vec<_>>(), [2]);
        assert_eq!(c.toolbox.keys().cloned().collect::<Vec<_>>(), ["tb"]);
        assert_eq!(
            c.all_by_name.keys().cloned().collect::<Vec<_>>(),
            ["demo-0", "demo-2", "demo-3", "demo-tb"],
            "a pod without a role is still listed; a terminating one is not"
        );
    }

    #[test]
    fn ownership_and_classification() {
        let cs = set().with_replicas(2);
        let main = pods::build_agent_pod(&cs, NS, 0, "", None);
        let sub = pods::build_agent_pod(&cs, NS, 1, "vm", Some("n"));
        let tb = pods::build_toolbox_pod(
            &cs,
            NS,
            &ToolboxSpec {
                name: "tb".into(),
                ..ToolboxSpec::default()
            },
        );
        let mut stranger = sub.clone();
        stranger.metadata.name = Some("demo-7".into());
        stranger.metadata.owner_references = None;
        let mut bad_slot = sub.clone();
        bad_slot.metadata.name = Some("demo-x".into());
        bad_slot
            .labels_mut()
            .insert(labels::SLOT.into(), "x".into());
        let mut terminating = sub.clone();
        terminating.metadata.name = Some("demo-2".into());
        terminating
            .labels_mut()
            .insert(labels::SLOT.into(), "2".into());
        terminating.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        let all = [main, sub, tb, stranger.clone(), bad_slot, terminating];
        assert!(!pods::is_owned(&cs, &stranger));
        let owned: Vec<&Pod> = all.iter().filter(|p| pods::is_owned(&cs, p)).collect();
        assert_eq!(owned.len(), 5);
        let c = Classified::from_owned(owned);
        assert_eq!(
            c.main.as_ref().map(|p| p.name_any()).as_deref(),
            Some("demo-0")
        );
        assert_eq!(c.sub.keys().copied().collect::<Vec<_>>(), vec![1]);
        assert_eq!(
            c.toolbox.keys().cloned().collect::<Vec<_>>(),
            vec!["tb".to_string()]
        );
        assert_eq!(
            c.all_by_name.keys().cloned().collect::<Vec<_>>(),
            vec!["demo-0", "demo-1", "demo-tb", "demo-x"]
        );
    }
}
