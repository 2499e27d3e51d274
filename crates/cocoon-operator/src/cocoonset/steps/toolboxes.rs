//! Step 13 — toolboxes: validate the whole list first (13.1), then per toolbox in spec
//! order triage the existing pod (§6) or create the missing one through the create protocol
//! (§7), and remove the toolboxes that left the spec (stash, then delete) (13.2–13.3). A pod
//! of the toolbox's name that is not that toolbox is a name collision and fails the pass.
//!
//! An invalid list is not retried: it becomes the `Ready=False` condition of step 14 (reason
//! [`INVALID_TOOLBOXES`], the message naming `spec.toolboxes`) and a Warning Event, and the
//! set waits for a spec change.

use std::collections::BTreeSet;

use cocoon_api::crd::set::ToolboxSpec;
use cocoon_api::naming::{self, Role};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::{Observed, Write, create_facts};
use crate::cocoonset::{plan, pods};

/// What 13.2 finds for one toolbox of the spec.
#[derive(Debug, Clone, PartialEq)]
pub enum Toolbox {
    /// Its pod exists: triage it for this reason (none: healthy).
    Existing(Box<Pod>, Option<String>),
    /// No pod: create it (budget permitting), named so.
    Missing(Box<ToolboxSpec>, String),
    /// Another owned pod has its name: the pass fails with this message.
    Collision(String),
}

/// 13.2 over the spec's toolboxes, in spec order, and the classified toolboxes that left
/// the spec, in name order (13.3).
pub fn survey(o: &Observed<'_>) -> (Vec<Toolbox>, Vec<Pod>) {
    let name = o.cs.name_any();
    let each = o
        .cs
        .spec
        .toolboxes
        .iter()
        .map(|t| {
            let pod_name = naming::pod_name_for_toolbox(&name, &t.name);
            let ours = o.classified.toolbox.get(&t.name);
            match o.classified.all_by_name.get(&pod_name) {
                Some(_) if ours.map(|q| q.name_any()) != Some(pod_name.clone()) => {
                    Toolbox::Collision(format!(
                        "create toolbox {}: name collision with existing pod {pod_name}",
                        t.name
                    ))
                }
                Some(p) => {
                    let drifted = pods::toolbox_drift(o.cs, o.ns, t, p).is_some();
                    Toolbox::Existing(Box::new(p.clone()), plan::rebuild_reason(p, true, drifted))
                }
                None => Toolbox::Missing(Box::new(t.clone()), pod_name),
            }
        })
        .collect();
    let wanted: BTreeSet<&str> =
        o.cs.spec
            .toolboxes
            .iter()
            .map(|t| t.name.as_str())
            .collect();
    let leaving = o
        .classified
        .toolbox
        .iter()
        .filter(|(n, _)| !wanted.contains(n.as_str()))
        .map(|(_, p)| p.clone())
        .collect();
    (each, leaving)
}

/// The create of a missing toolbox, restore-marked per the create protocol.
pub fn create(o: &Observed<'_>, t: &ToolboxSpec, restorable: &BTreeSet<String>) -> Write {
    let pod = pods::build_toolbox_pod(o.cs, o.ns, t);
    let facts = create_facts(o, &pod, Role::Toolbox, restorable, false);
    Write::CreatePod {
        pod: Box::new(pod),
        facts,
        step: "toolboxes",
    }
}

/// The condition reason and Event reason of an invalid `spec.toolboxes`.
pub const INVALID_TOOLBOXES: &str = "InvalidToolboxes";

/// A spec the controller cannot act on: which field, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct InvalidSpec {
    /// The field path, e.g. `spec.toolboxes`.
    pub field: &'static str,
    /// The condition and Event reason.
    pub reason: &'static str,
    pub message: String,
}

impl InvalidSpec {
    /// The condition and Event message: the field, then what is wrong with it.
    pub fn condition_message(&self) -> String {
        format!("{}: {}", self.field, self.message)
    }
}

fn invalid(message: String) -> InvalidSpec {
    InvalidSpec {
        field: "spec.toolboxes",
        reason: INVALID_TOOLBOXES,
        message,
    }
}

/// 13.1: a duplicate name, or a name that parses as an integer (it would collide with an
/// agent slot's pod name).
pub fn validate(toolboxes: &[ToolboxSpec]) -> Result<(), InvalidSpec> {
    let mut seen = BTreeSet::new();
    for t in toolboxes {
        if !seen.insert(t.name.as_str()) {
            return Err(invalid(format!(
                "duplicate toolbox name {:?} in spec",
                t.name
            )));
        }
        if naming::parse_int_slot_name(&t.name) {
            return Err(invalid(format!(
                "toolbox name {:?} must not be an integer: collides with agent slot pod naming",
                t.name
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use cocoon_api::crd::set::{CocoonSet, CocoonSetSpec};

    use super::*;
    use crate::cocoonset::plan::Timing;
    use crate::cocoonset::pods::Classified;

    #[test]
    fn each_toolbox_is_triaged_or_created_a_foreign_pod_of_its_name_collides_and_leavers_go() {
        let mut cs = CocoonSet::new("demo", CocoonSetSpec::with_image("img:1"));
        cs.metadata.namespace = Some("ns".into());
        cs.metadata.uid = Some("uid".into());
        cs.spec.agent.replicas = 0;
        let old = tb("old");
        cs.spec.toolboxes = vec![old.clone()];
        let leaving = pods::build_toolbox_pod(&cs, "ns", &old);
        cs.spec.toolboxes = vec![tb("a"), tb("b"), tb("1")];
        let existing = pods::build_toolbox_pod(&cs, "ns", &cs.spec.toolboxes[0]);
        // An agent pod named like toolbox "1" would be: demo-1.
        let agent = pods::build_agent_pod(&cs, "ns", 1, "vm", Some("n"));
        let c = Classified::from_owned([&existing, &leaving, &agent]);
        let t = Timing::default();
        let o = Observed {
            cs: &cs,
            ns: "ns",
            owned: &[],
            classified: &c,
            timing: &t,
        };
        let (each, gone) = survey(&o);
        assert_eq!(
            each,
            [
                Toolbox::Existing(Box::new(existing.clone()), None),
                Toolbox::Missing(Box::new(tb("b")), "demo-b".into()),
                Toolbox::Collision(
                    "create toolbox 1: name collision with existing pod demo-1".into()
                ),
            ]
        );
        assert_eq!(gone, [leaving]);
        match create(&o, &tb("b"), &BTreeSet::new()) {
            Write::CreatePod { pod, facts, step } => {
                assert_eq!(
                    (pod.name_any().as_str(), facts.role, step),
                    ("demo-b", Role::Toolbox, "toolboxes")
                );
            }
            other => panic!("a create, got {other:?}"),
        }
    }

    fn tb(n: &str) -> ToolboxSpec {
        ToolboxSpec {
            name: n.into(),
            ..ToolboxSpec::default()
        }
    }

    #[test]
    fn validate_the_whole_toolbox_list_first() {
        let cases: &[(&[&str], Option<&str>)] = &[
            (&["a", "b"], None),
            (&[], None),
            (&["a", "a"], Some("duplicate toolbox name \"a\" in spec")),
            (
                &["a", "7"],
                Some(
                    "toolbox name \"7\" must not be an integer: collides with agent slot pod naming",
                ),
            ),
        ];
        for (names, want) in cases {
            let list: Vec<ToolboxSpec> = names.iter().map(|n| tb(n)).collect();
            let got = validate(&list).err();
            assert_eq!(got.as_ref().map(|e| e.message.as_str()), *want, "{names:?}");
            if let Some(e) = got {
                assert_eq!((e.field, e.reason), ("spec.toolboxes", INVALID_TOOLBOXES));
                assert!(e.condition_message().starts_with("spec.toolboxes: "));
            }
        }
    }
}
