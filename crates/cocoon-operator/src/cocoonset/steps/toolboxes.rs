//! Seed step 13 — toolboxes: validate the whole list first (13.1), then per toolbox in spec
//! order triage the existing pod (§6) or create the missing one through the create protocol
//! (§7), and remove the toolboxes that left the spec (stash, then delete) (13.2–13.3). A pod
//! of the toolbox's name that is not that toolbox is a name collision and fails the pass.
//!
//! An invalid list is not retried: it becomes the `Ready=False` condition of step 14 (reason
//! [`INVALID_TOOLBOXES`], the message naming `spec.toolboxes`) and a Warning Event, and the
//! set waits for a spec change.
//!
//! Each toolbox is planned on the set as the writes before it leave it ([`Draft`]), and the
//! step plans from the view it started from and its answers so far: each round returns
//! every write up to the first answer it still lacks (the CocoonHibernation list, a
//! manifest, a post's outcome, the live pod behind an AlreadyExists), so the toolboxes go
//! one after another in spec order as before. A toolbox this controller created a moment
//! ago that the cache does not show yet is pending: no post, no collision read.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use cocoon_api::contract::labels;
use cocoon_api::crd::set::{CocoonSet, ToolboxSpec};
use cocoon_api::naming::{self, Role};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::{Answers, Created, Draft, Next, Note, Observed, Read, StepPlan, Write, effects};
use crate::cocoonset::pods;
use crate::cocoonset::shared::create::{self, Protocol, rules::cr_restorable};
use crate::cocoonset::shared::stash;
use crate::cocoonset::shared::triage::{self, rules::rebuild_reason};

/// The step's name in a registry error.
pub const STEP: &str = "toolboxes";

/// Step 13 on the view the step started from and its answers so far.
pub fn plan(o: &Observed<'_>, answers: &Answers, now: DateTime<Utc>) -> StepPlan {
    // 13.1.
    if let Err(invalid) = validate(&o.cs.spec.toolboxes) {
        return StepPlan::of(
            effects![
                Note::Log {
                    warn: true,
                    message: format!("invalid spec: waiting for a change: {invalid}"),
                },
                Note::InvalidSpec(invalid),
            ],
            Next::Continue,
        );
    }
    // 13.2, in spec order.
    let (each, leaving) = survey(o);
    let mut acc = Draft::new(o.cs);
    let mut posts = 0;
    for toolbox in each {
        let (t, pod_name) = match toolbox {
            Toolbox::Collision(message) => {
                acc.push(Write::Fail(message));
                return StepPlan::of(acc.effects, Next::Continue);
            }
            Toolbox::Existing(pod, reason) => {
                let triaged = triage::existing(&acc.observed(o), &pod, reason, now);
                let writes = triaged.into_effects(&acc.observed(o), &pod.name_any());
                acc.extend(writes);
                continue;
            }
            Toolbox::Missing(t, pod_name) => (t, pod_name),
        };
        let Some(writes) = triage::may_recreate(&acc.observed(o), &pod_name) else {
            continue;
        };
        acc.extend(writes);
        if let Some(left) = o.classified.pending_creates.get(&pod_name) {
            acc.push(Note::Backoff(*left));
            continue;
        }
        let Some(crs) = &answers.cached_hibernations else {
            return StepPlan::read_of(acc.effects, vec![Read::CachedHibernations]);
        };
        let pod = pods::build_toolbox_pod(o.cs, o.ns, &t);
        let facts = create::facts(
            &acc.observed(o),
            &pod,
            Role::Toolbox,
            &cr_restorable(crs),
            false,
        );
        match create::protocol(answers, pod, facts, STEP) {
            Protocol::Read(read) => return StepPlan::read_of(acc.effects, vec![read]),
            Protocol::Decided { pod, writes, .. } => {
                acc.extend(writes);
                acc.push(Write::PostPod(pod));
            }
        }
        let outcome = answers.created.get(posts).copied();
        posts += 1;
        match outcome {
            None => return StepPlan::read_of(acc.effects, Vec::new()),
            Some(Created::Yes) => acc.push(Note::Changed),
            // Fine (and no change) only for our own toolbox pod: read it past the cache.
            Some(Created::AlreadyExists) => match answers.pods.get(&pod_name) {
                None => return StepPlan::read_of(acc.effects, vec![Read::Pod(pod_name)]),
                Some(live) => {
                    if let Some(message) = collision(o.cs, o.ns, &t, &pod_name, live.as_ref()) {
                        acc.push(Write::Fail(message));
                        return StepPlan::of(acc.effects, Next::Continue);
                    }
                }
            },
        }
    }
    // 13.3.
    let removals = stash::remove(&acc.observed(o), &leaving);
    if !removals.is_empty() {
        acc.extend(removals);
        acc.push(Note::Changed);
    }
    StepPlan::of(acc.effects, Next::Continue)
}

/// After an AlreadyExists create: the error when the live pod is not this set's toolbox
/// (none when it is).
pub fn collision(
    cs: &CocoonSet,
    ns: &str,
    t: &ToolboxSpec,
    pod_name: &str,
    live: Option<&Pod>,
) -> Option<String> {
    let Some(live) = live else {
        return Some(format!(
            "create toolbox {}: pod {ns}/{pod_name} already existed and is gone now",
            t.name
        ));
    };
    let role = live.labels().get(labels::ROLE).cloned().unwrap_or_default();
    if role == Role::Toolbox.as_str() && pods::is_owned(cs, live) {
        return None;
    }
    Some(format!(
        "create toolbox {}: name collision with existing pod {ns}/{pod_name} (role={role})",
        t.name
    ))
}

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
    let each =
        o.cs.spec
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
                        Toolbox::Existing(Box::new(p.clone()), rebuild_reason(p, true, drifted))
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
    use super::*;
    use crate::cocoonset::Timing;
    use crate::cocoonset::fixtures::{NS, SetFixture, observe, set, write_kinds as kinds};
    use crate::cocoonset::pods::Classified;
    use crate::cocoonset::shared::create::rules::TagRead;
    use crate::cocoonset::steps::Effect;

    #[test]
    fn each_toolbox_is_triaged_or_created_a_foreign_pod_of_its_name_collides_and_leavers_go() {
        let mut cs = set();
        let old = tb("old");
        cs.spec.toolboxes = vec![old.clone()];
        let leaving = pods::build_toolbox_pod(&cs, NS, &old);
        cs.spec.toolboxes = vec![tb("a"), tb("b"), tb("1")];
        let existing = pods::build_toolbox_pod(&cs, NS, &cs.spec.toolboxes[0]);
        // An agent pod named like toolbox "1" would be: demo-1.
        let agent = pods::build_agent_pod(&cs, NS, 1, "vm", Some("n"));
        let c = Classified::from_owned([&existing, &leaving, &agent]);
        let t = Timing::default();
        let o = observe(&cs, &c, &t);
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
    }

    /// A set of these toolboxes (image `tb:1`) at generation 2.
    fn toolbox_set(names: &[&str]) -> CocoonSet {
        let mut cs = set().at_generation(2);
        cs.spec.toolboxes = names.iter().map(|n| tb(n)).collect();
        for t in &mut cs.spec.toolboxes {
            t.image = "tb:1".into();
        }
        cs
    }

    fn vm_of(cs: &CocoonSet, t: &ToolboxSpec) -> String {
        pods::vm_name(&pods::build_toolbox_pod(cs, NS, t)).to_string()
    }

    #[test]
    fn for_each_toolbox_in_spec_order_triage_the_existing_pod_or_create_the_missing_one() {
        let cs = toolbox_set(&["a", "b", "c"]);
        let mut old = cs.clone();
        old.spec.toolboxes[0].image = "tb:0".into();
        let drifted = pods::build_toolbox_pod(&old, NS, &old.spec.toolboxes[0]);
        let c = Classified::from_owned([&drifted]);
        let t = Timing::default();
        let o = observe(&cs, &c, &t);
        let (vm_b, vm_c) = (
            vm_of(&cs, &cs.spec.toolboxes[1]),
            vm_of(&cs, &cs.spec.toolboxes[2]),
        );
        let ours_c = pods::build_toolbox_pod(&cs, NS, &cs.spec.toolboxes[2]);
        let rebuild = [
            "log",
            "history",
            "delete demo-a",
            "count",
            "SubAgentRebuilding",
            "changed",
        ];
        let mut a = Answers::default();
        // (what, answer added, writes so far, reads, next)
        type Case<'a> = (
            &'a str,
            fn(&mut Answers, &str, &str, &Pod),
            Vec<&'a str>,
            Vec<Read>,
            Next,
        );
        let cases: Vec<Case<'_>> = vec![
            (
                "a drifted toolbox takes the rebuild budget; restore intent for b",
                |_, _, _, _| {},
                rebuild.to_vec(),
                vec![Read::CachedHibernations],
                Next::Replan,
            ),
            (
                "b's manifest",
                |a, _, _, _| a.cached_hibernations = Some(Vec::new()),
                rebuild.to_vec(),
                vec![Read::Manifest {
                    vm: vm_b.clone(),
                    step: STEP,
                }],
                Next::Replan,
            ),
            (
                "b posted",
                |a, b, _, _| {
                    a.manifests.insert(b.into(), TagRead::Absent);
                },
                [&rebuild[..], &["post demo-b"]].concat(),
                vec![],
                Next::Replan,
            ),
            (
                "b created: a change; then c's manifest",
                |a, _, _, _| a.created.push(Created::Yes),
                [&rebuild[..], &["post demo-b", "changed"]].concat(),
                vec![Read::Manifest {
                    vm: vm_c.clone(),
                    step: STEP,
                }],
                Next::Replan,
            ),
            (
                "c posted",
                |a, _, c, _| {
                    a.manifests.insert(c.into(), TagRead::Absent);
                },
                [&rebuild[..], &["post demo-b", "changed", "post demo-c"]].concat(),
                vec![],
                Next::Replan,
            ),
            (
                "on AlreadyExists, GET the live pod",
                |a, _, _, _| a.created.push(Created::AlreadyExists),
                [&rebuild[..], &["post demo-b", "changed", "post demo-c"]].concat(),
                vec![Read::Pod("demo-c".into())],
                Next::Replan,
            ),
            (
                "our own toolbox: acceptable, and not a change",
                |a, _, _, ours| {
                    a.pods.insert("demo-c".into(), Some(ours.clone()));
                },
                [&rebuild[..], &["post demo-b", "changed", "post demo-c"]].concat(),
                vec![],
                Next::Continue,
            ),
        ];
        // The step plans every round with the same `now`.
        let now = Utc::now();
        let mut last: Vec<Write> = Vec::new();
        for (what, answer, want, reads, next) in cases {
            answer(&mut a, &vm_b, &vm_c, &ours_c);
            let p = plan(&o, &a, now);
            assert_eq!(kinds(&p.effects()), want, "{what}");
            assert_eq!((p.reads, p.next), (reads, next), "{what}");
            assert!(
                p.writes.starts_with(&last),
                "{what}: the writes before repeat"
            );
            last = p.writes;
        }
        // Anything else of that name: the collision error.
        let mut foreign = ours_c.clone();
        foreign
            .labels_mut()
            .insert(labels::ROLE.into(), "main".into());
        a.pods.insert("demo-c".into(), Some(foreign));
        let p = plan(&o, &a, now);
        assert_eq!(
            kinds(&p.effects()).last().map(String::as_str),
            Some("fail: create toolbox c: name collision with existing pod ns/demo-c (role=main)")
        );
    }

    #[test]
    fn a_toolbox_created_a_moment_ago_and_not_cached_yet_is_neither_posted_nor_read() {
        let cs = toolbox_set(&["tb"]);
        let mut c = Classified::default();
        c.pending_creates
            .insert("demo-tb".into(), std::time::Duration::from_secs(12));
        let t = Timing::default();
        let o = observe(&cs, &c, &t);
        let p = plan(&o, &Answers::default(), Utc::now());
        assert_eq!(kinds(&p.effects()), ["backoff 12s"]);
        assert_eq!((p.reads, p.next), (vec![], Next::Continue));
    }

    #[test]
    fn an_invalid_list_changes_nothing_and_is_reported_not_retried() {
        let cs = toolbox_set(&["a", "a"]);
        let (c, t) = (Classified::default(), Timing::default());
        let o = observe(&cs, &c, &t);
        let p = plan(&o, &Answers::default(), Utc::now());
        assert!(matches!(
            &p.effects()[..],
            [Effect::Note(Note::Log { warn: true, .. }), Effect::Note(Note::InvalidSpec(e))] if e.field == "spec.toolboxes"
        ));
        assert_eq!(p.next, Next::Continue);
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

    #[test]
    fn toolbox_validation() {
        let tb = |n: &str| ToolboxSpec {
            name: n.into(),
            ..ToolboxSpec::default()
        };
        assert!(validate(&[tb("a"), tb("b")]).is_ok());
        assert_eq!(
            validate(&[tb("a"), tb("a")]).map_err(|e| e.to_string()),
            Err("duplicate toolbox name \"a\" in spec".to_string())
        );
        assert_eq!(
            validate(&[tb("7")]).map_err(|e| e.to_string()),
            Err(
                "toolbox name \"7\" must not be an integer: collides with agent slot pod naming"
                    .to_string()
            )
        );
    }
}
