//! Seed step 12 — sub-agents: ensure slots `[1..Replicas]`, delete extras above the count.
//!
//! An existing sub-agent is triaged (§6: terminal or drifted pods take the rebuild budget);
//! a missing one whose budget is not spent at this generation is created, all at once (at
//! most `create_fanout` in flight), each through the create protocol (§7) and marked for
//! restore when step 10 owes it one. A sub-agent is pinned to the main's node with a hard
//! `spec.nodeName` bind and forks from the main's VM. Scale-down stashes the leaving slots'
//! VM names first (so teardown still GCs their tags), then deletes them.
//!
//! The step plans every pod in slot order on the set as the writes before it leave it
//! ([`Draft`]): each triage and budget check reads the rebuild history the last wrote. It
//! plans from the view it started from and its answers so far, and each round returns every
//! write up to the first answer it still lacks (the CocoonHibernation list, the manifests,
//! the posts' outcomes); the executor applies the ones it has not applied yet
//! (the walk replays it). A slot whose pod this controller created a moment ago and the cache
//! does not show yet is pending: no post.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use cocoon_api::naming::{self, Role};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::{Answers, Created, Draft, Next, Note, Observed, Read, StepPlan, Write};
use crate::cocoonset::pods;
use crate::cocoonset::shared::create::rules::{CreateFacts, cr_restorable};
use crate::cocoonset::shared::create::{self, Protocols};
use crate::cocoonset::shared::stash;
use crate::cocoonset::shared::triage::{self, rules::rebuild_reason};

/// The step's name in a registry error.
pub const STEP: &str = "sub-agents";

/// Step 12 on the view the step started from and its answers so far.
pub fn plan(o: &Observed<'_>, answers: &Answers, now: DateTime<Utc>) -> StepPlan {
    let Some(survey) = survey(o) else {
        return StepPlan::proceed();
    };
    let mut acc = Draft::new(o.cs);
    // 12.1: one pod at a time, in slot order.
    for (pod, reason) in &survey.existing {
        let triaged = triage::existing(&acc.observed(o), pod, reason.clone(), now);
        let writes = triaged.into_effects(&acc.observed(o), &pod.name_any());
        acc.extend(writes);
    }
    let mut slots = Vec::new();
    for slot in &survey.missing {
        let name = naming::pod_name_for_agent(&o.cs.name_any(), *slot);
        let Some(writes) = triage::may_recreate(&acc.observed(o), &name) else {
            continue;
        };
        acc.extend(writes);
        match o.classified.pending_creates.get(&name) {
            Some(left) => acc.push(Note::Backoff(*left)),
            None => slots.push(*slot),
        }
    }
    // 12.2: restore intent resolved once, then the creates all at once.
    if !slots.is_empty() {
        let Some(crs) = &answers.cached_hibernations else {
            return StepPlan::read_of(acc.effects, vec![Read::CachedHibernations]);
        };
        let jobs = creates(&acc.observed(o), &slots, &cr_restorable(crs));
        match create::protocols(answers, jobs, STEP) {
            Protocols::Read(reads) => return StepPlan::read_of(acc.effects, reads),
            Protocols::Decided { writes, pods } => {
                acc.extend(writes);
                acc.push(Write::PostPods {
                    pods,
                    at_once: o.timing.create_fanout.max(1),
                });
            }
        }
        if answers.created.is_empty() {
            return StepPlan::read_of(acc.effects, Vec::new());
        }
        // AlreadyExists is success, but no change.
        if answers.created.contains(&Created::Yes) {
            acc.push(Note::Changed);
        }
    }
    // 12.3.
    let removals = stash::remove(&acc.observed(o), &survey.extras);
    if !removals.is_empty() {
        acc.extend(removals);
        acc.push(Note::Changed);
    }
    StepPlan::of(acc.effects, Next::Continue)
}

/// What step 12 finds, slot by slot.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Survey {
    /// Existing sub-agents in slot order, with their triage reason (none: healthy).
    pub existing: Vec<(Pod, Option<String>)>,
    /// Slots in `[1..Replicas]` without a pod.
    pub missing: Vec<i32>,
    /// Sub-agents above the requested count, in slot order.
    pub extras: Vec<Pod>,
}

/// `None` without a main: sub-agents fork from it, so they wait for it.
pub fn survey(o: &Observed<'_>) -> Option<Survey> {
    o.classified.main.as_ref()?;
    let replicas = o.cs.spec.agent.replicas.max(0);
    let mut out = Survey::default();
    for slot in 1..=replicas {
        match o.classified.sub.get(&slot) {
            Some(p) => {
                let drifted = pods::agent_drift(o.cs, o.ns, slot, p).is_some();
                out.existing
                    .push((p.clone(), rebuild_reason(p, true, drifted)));
            }
            None => out.missing.push(slot),
        }
    }
    out.extras = o
        .classified
        .sub
        .iter()
        .filter(|(slot, _)| **slot > replicas)
        .map(|(_, p)| p.clone())
        .collect();
    Some(out)
}

/// The pods of `slots` (their budgets checked) and their create facts: bound to the main's
/// node, forking from its VM (none without a main).
pub fn creates(
    o: &Observed<'_>,
    slots: &[i32],
    restorable: &BTreeSet<String>,
) -> Vec<(Pod, CreateFacts<'static>)> {
    let Some(main) = o.classified.main.as_ref() else {
        return Vec::new();
    };
    let (main_vm, main_node) = (pods::vm_name(main), pods::bound_node(main));
    slots
        .iter()
        .map(|slot| {
            let pod = pods::build_agent_pod(o.cs, o.ns, *slot, main_vm, Some(main_node));
            let facts = create::facts(o, &pod, Role::SubAgent, restorable, false);
            (pod, facts)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use cocoon_api::contract::annotations as ann;
    use cocoon_api::crd::set::CocoonSet;

    use super::*;
    use crate::cocoonset::Timing;
    use crate::cocoonset::fixtures::{NS, SetFixture, observe, on, set, write_kinds as kinds};
    use crate::cocoonset::pods::Classified;
    use crate::cocoonset::shared::create::rules::TagRead;

    fn bound_main(cs: &CocoonSet) -> Pod {
        on(pods::build_agent_pod(cs, NS, 0, "", None), "node-a")
    }

    #[test]
    fn ensure_slots_1_to_replicas_and_delete_extras_above_the_count() {
        let t = Timing::default();
        let cs = set().with_replicas(3).at_generation(1);
        let main = bound_main(&cs);
        let main_vm = pods::vm_name(&main).to_string();
        let sub = |slot| pods::build_agent_pod(&cs, NS, slot, &main_vm, Some("node-a"));
        let c = Classified::from_owned([&main, &sub(2), &sub(4), &sub(5)]);
        let s = survey(&observe(&cs, &c, &t)).expect("a main");
        assert_eq!(
            s.existing
                .iter()
                .map(|(p, r)| (p.name_any(), r.clone()))
                .collect::<Vec<_>>(),
            [("demo-2".to_string(), None)]
        );
        assert_eq!(s.missing, [1, 3]);
        assert_eq!(
            s.extras.iter().map(|p| p.name_any()).collect::<Vec<_>>(),
            ["demo-4", "demo-5"]
        );
        let none = Classified::from_owned([&sub(1)]);
        assert_eq!(
            survey(&observe(&cs, &none, &t)),
            None,
            "no main, no sub-agents"
        );
    }

    #[test]
    fn a_sub_agent_is_pinned_to_the_mains_node_and_creates_fan_out_capped() {
        let t = Timing {
            create_fanout: 8,
            ..Timing::default()
        };
        let cs = set().with_replicas(2).at_generation(1);
        let main = bound_main(&cs);
        let c = Classified::from_owned([&main]);
        let jobs = creates(&observe(&cs, &c, &t), &[1, 2], &BTreeSet::new());
        assert_eq!(jobs.len(), 2);
        for (pod, facts) in &jobs {
            let spec = pod.spec.clone().unwrap_or_default();
            assert_eq!(spec.node_name.as_deref(), Some("node-a"), "hard bind");
            assert!(spec.affinity.is_none(), "no affinity");
            assert_eq!(
                pod.annotations().get(ann::FORK_FROM).map(String::as_str),
                Some(pods::vm_name(&main))
            );
            assert_eq!(facts.role, Role::SubAgent);
        }
        // The posts go out together, capped at the fan-out.
        let p = plan(&observe(&cs, &c, &t), &all_read(&cs, &[1, 2]), Utc::now());
        let Some(Write::PostPods { pods, at_once }) = p.writes.last() else {
            panic!("the posts, got {p:?}");
        };
        assert_eq!((pods.len(), *at_once), (2, 8));
        assert!(creates(&observe(&cs, &c, &t), &[], &BTreeSet::new()).is_empty());
    }

    /// Every answer the step can ask for: an empty CocoonHibernation list and no tag for
    /// each slot's VM.
    fn all_read(cs: &CocoonSet, slots: &[i32]) -> Answers {
        let mut a = Answers {
            cached_hibernations: Some(Vec::new()),
            ..Answers::default()
        };
        for slot in slots {
            let vm = naming::vm_name_for_agent(NS, &cs.name_any(), *slot);
            a.manifests.insert(vm, TagRead::Absent);
        }
        a
    }

    #[test]
    fn each_slot_in_ascending_order_is_triaged_or_created_unless_its_budget_is_spent_then_extras_go()
     {
        let t = Timing::default();
        let mut cs = set().with_replicas(4).at_generation(1);
        let main = bound_main(&cs);
        let main_vm = pods::vm_name(&main).to_string();
        // Slot 1 runs an older image (drifted); slot 2 was dead-lettered at an older
        // generation, slot 3 at this one; slot 4 is missing; slot 5 is above the count.
        let mut old = cs.clone();
        old.spec.agent.image = "img:0".into();
        let drifted = pods::build_agent_pod(&old, NS, 1, &main_vm, Some("node-a"));
        let extra = pods::build_agent_pod(&cs, NS, 5, &main_vm, Some("node-a"));
        cs.annotations_mut().insert(
            ann::REBUILD_HISTORY.into(),
            r#"{"demo-2":{"count":4,"exhaustedAt":0},"demo-3":{"count":4,"exhaustedAt":1}}"#.into(),
        );
        let c = Classified::from_owned([&main, &drifted, &extra]);
        let o = observe(&cs, &c, &t);
        let now = Utc::now();
        let before_reads = [
            "log",
            "history",
            "delete demo-1",
            "count",
            "SubAgentRebuilding",
            "changed",
            "history",
        ];
        let mut full = all_read(&cs, &[2, 4]);
        full.created = vec![Created::Yes, Created::AlreadyExists];
        // (what, answers, writes so far, reads, next)
        type Case<'a> = (&'a str, Answers, Vec<&'a str>, Vec<Read>, Next);
        let cases: Vec<Case<'_>> = vec![
            (
                "the triage writes and the budget checks, then restore intent resolved once",
                Answers::default(),
                before_reads.to_vec(),
                vec![Read::CachedHibernations],
                Next::Replan,
            ),
            (
                "the manifest reads of the slots to create, all at once",
                Answers {
                    cached_hibernations: Some(Vec::new()),
                    ..Answers::default()
                },
                before_reads.to_vec(),
                vec![
                    Read::Manifest {
                        vm: naming::vm_name_for_agent(NS, "demo", 2),
                        step: STEP,
                    },
                    Read::Manifest {
                        vm: naming::vm_name_for_agent(NS, "demo", 4),
                        step: STEP,
                    },
                ],
                Next::Replan,
            ),
            (
                "the missing slots posted together; slot 3 is skipped",
                all_read(&cs, &[2, 4]),
                [&before_reads[..], &["post demo-2,demo-4"]].concat(),
                vec![],
                Next::Replan,
            ),
            (
                "then the extras: stash first, then delete",
                full,
                [
                    &before_reads[..],
                    &[
                        "post demo-2,demo-4",
                        "changed",
                        "stash",
                        "delete demo-5",
                        "changed",
                    ],
                ]
                .concat(),
                vec![],
                Next::Continue,
            ),
        ];
        let mut last: Vec<Write> = Vec::new();
        for (what, answers, want, reads, next) in cases {
            let p = plan(&o, &answers, now);
            assert_eq!(kinds(&p.effects()), want, "{what}");
            assert_eq!((p.reads, p.next), (reads, next), "{what}");
            assert!(
                p.writes.starts_with(&last),
                "{what}: a round repeats the writes of the one before"
            );
            last = p.writes;
        }
        // Slot 2's reset is planned on the history slot 1's rebuild wrote.
        let histories: Vec<String> = last
            .iter()
            .filter_map(|w| match w {
                Write::SetAnnotations(d) => d.get(ann::REBUILD_HISTORY).cloned().flatten(),
                _ => None,
            })
            .collect();
        assert_eq!(histories.len(), 2);
        assert!(histories[1].contains("demo-1"), "{}", histories[1]);
        assert!(!histories[1].contains("demo-2"), "{}", histories[1]);
    }

    #[test]
    fn already_exists_is_success_but_no_change_and_a_pod_created_a_moment_ago_is_not_posted() {
        let t = Timing::default();
        let cs = set().with_replicas(2).at_generation(1);
        let main = bound_main(&cs);
        let mut c = Classified::from_owned([&main]);
        let mut a = all_read(&cs, &[1, 2]);
        a.created = vec![Created::AlreadyExists, Created::AlreadyExists];
        let p = plan(&observe(&cs, &c, &t), &a, Utc::now());
        assert_eq!(kinds(&p.effects()), ["post demo-1,demo-2"]);
        assert_eq!(p.next, Next::Continue);
        // demo-2 was created a moment ago and the cache does not show it yet: only demo-1
        // is posted, and the pass looks again once the expectation lapses.
        c.pending_creates
            .insert("demo-2".into(), std::time::Duration::from_secs(25));
        let p = plan(&observe(&cs, &c, &t), &all_read(&cs, &[1]), Utc::now());
        assert_eq!(kinds(&p.effects()), ["backoff 25s", "post demo-1"]);
        c.pending_creates
            .insert("demo-1".into(), std::time::Duration::from_secs(25));
        let p = plan(&observe(&cs, &c, &t), &Answers::default(), Utc::now());
        assert_eq!(kinds(&p.effects()), ["backoff 25s", "backoff 25s"]);
        assert_eq!(p.next, Next::Continue, "nothing to post, nothing to read");
    }
}
