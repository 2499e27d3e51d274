//! Seed step 8 — the cross-node migration of the main (slot 0), `reconcileMigration`.
//!
//! When `spec.nodeName` pins the main to a node it is not on: mark Migrating, quiesce the old
//! pod (hibernate annotation), wait for its snapshot and for vk-cocoon to report it
//! hibernated, delete it (flagged keep-snapshot-on-delete, best effort), recreate it on the
//! target from the snapshot, and drop the snapshot once the new VM runs. An unscheduled main
//! under a pin the set no longer names is deleted and recreated under the current pin. It
//! waits while a CocoonHibernation owns or tracks the main (a [`Read::FreshHibernations`]).
//! The tag probe is a [`Read::Probe`]; before a tag drop the main is read past the cache
//! ([`Read::Pod`]) so the drop is decided on the VM that runs now. The recreate goes through
//! the create protocol ([`create::protocol`]): when the image rule drops the snapshot,
//! step 11 boots the main fresh. The pure rules are [`rules`].
//!
//! Crash safety: `Migrating` is written before the quiesce, the old pod dies only after its
//! snapshot is in the registry and the node agent reports it hibernated, and the snapshot is
//! dropped only once the restored VM runs, so every pass resumes from the API objects and
//! the tag.

use std::collections::BTreeSet;

use cocoon_api::contract::events::{self as ev, operator as reasons};
use cocoon_api::contract::{annotations as ann, bool_delta, tags};
use cocoon_api::crd::set::CocoonSetPhase;
use cocoon_api::naming::{self, Role};
use kube::ResourceExt;

use self::rules::{Advance, Engage};
use super::{
    Answers, Counter, Created, Effect, Next, Note, Observed, Read, StepPlan, Write, effects, log,
};
use crate::cocoonset::pods;
use crate::cocoonset::shared::create::{self, Protocol, rules::wake_boots_fresh};

pub mod rules;
#[cfg(test)]
mod rules_tests;

/// The step's name in a registry error.
pub const STEP: &str = "migrate";

pub fn plan(o: &Observed<'_>, answers: &Answers) -> StepPlan {
    let desired = o.cs.spec.node_name.as_str();
    let migrating = o.cs.status.as_ref().and_then(|s| s.phase) == Some(CocoonSetPhase::Migrating);
    let main = o.classified.main.as_ref();
    let name = o.cs.name_any();
    let main_name = naming::pod_name_for_agent(&name, 0);
    match rules::engage(desired, migrating, main) {
        Engage::HandOver => return StepPlan::proceed(),
        Engage::DeleteStalePin => {
            return StepPlan::requeue_of(
                effects![
                    log(format!(
                        "deleting the unscheduled main {main_name}, pinned to a node the set no longer names (pin {desired:?})"
                    )),
                    Write::DeletePod(main_name),
                ],
                o.timing.requeue_after_write,
            );
        }
        Engage::Probe => {}
    }
    // 8.3: read past the cache: a CocoonHibernation created a moment ago must not be missed.
    let Some(crs) = &answers.fresh_hibernations else {
        return StepPlan::read(Vec::new(), vec![Read::FreshHibernations]);
    };
    if rules::hibernation_blocks(crs, &main_name) {
        return StepPlan::proceed();
    }
    let vm = naming::vm_name_for_agent(o.ns, &name, 0);
    let Some(probed) = &answers.probed else {
        return StepPlan::read(Vec::new(), vec![probe(&vm)]);
    };
    let tag = probed.exists.get(&vm).copied().unwrap_or(false);
    let mut decision = rules::advance(desired, migrating, main, tag);
    // A drop is a registry write no watch reports: the round that drops probes again and
    // plans on that answer in the same pass (8.6.5 hands over, 8.6.1 quiesces), instead of
    // waiting for the migrate poll. A tag still there after this step's own drop (pushed
    // again, or left by the ownership gate) waits for the poll as before.
    let dropped_here = answers
        .dropped
        .contains(&format!("{vm}:{}", tags::HIBERNATE));
    if dropped_here && matches!(decision, Advance::DropLeftover | Advance::DropSnapshot) {
        return StepPlan::requeue(vec![Write::MarkMigrating], o.timing.migrate_poll);
    }
    if matches!(decision, Advance::DropLeftover | Advance::DropSnapshot) {
        // The cache was read before the probe. Once the tag exists the node agent has written
        // `hibernating`, so a pod read now shows whether the VM that runs is the one the
        // snapshot came from; dropping on the older view could lose the only copy of the
        // main's state.
        let Some(now) = answers.pods.get(&main_name) else {
            return StepPlan::read(Vec::new(), vec![Read::Pod(main_name)]);
        };
        if rules::advance(desired, migrating, now.as_ref(), tag) != decision {
            decision = if migrating {
                Advance::AwaitLive {
                    unschedulable: None,
                }
            } else {
                Advance::HandOver
            };
        }
    }
    let poll = o.timing.migrate_poll;
    match decision {
        Advance::HandOver => StepPlan::proceed(),
        // The durable marker first: a restart mid-quiesce still knows the annotation is this
        // migration's, not a leftover.
        Advance::Quiesce => StepPlan::requeue_of(
            effects![
                Write::MarkMigrating,
                Write::MarkPods {
                    names: vec![main_name],
                    delta: bool_delta(ann::HIBERNATE, true),
                },
                log(format!(
                    "migration to {desired} started: quiescing the main"
                )),
            ],
            poll,
        ),
        Advance::DropLeftover => StepPlan::read_of(
            effects![
                drop_tag(&vm),
                log(format!(
                    "dropped the leftover :hibernate tag of {vm} before migrating"
                )),
                Write::MarkMigrating,
            ],
            vec![probe(&vm)],
        ),
        Advance::AwaitQuiesce => StepPlan::requeue(vec![Write::MarkMigrating], poll),
        // Best effort, as in seat release: without the flag the target pulls the snapshot
        // from the registry instead of the source node.
        Advance::EvictOld => StepPlan::requeue_of(
            effects![
                Write::FlagPod {
                    name: main_name.clone(),
                    delta: bool_delta(ann::KEEP_SNAPSHOT_ON_DELETE, true),
                },
                Write::DeletePod(main_name.clone()),
                Note::Changed,
                log(format!(
                    "quiesced main {main_name} deleted for the migration to {desired}"
                )),
                Write::MarkMigrating,
            ],
            poll,
        ),
        Advance::Recreate => recreate(o, answers),
        Advance::WakeInPlace => StepPlan::requeue_of(
            effects![
                Write::MarkPods {
                    names: vec![main_name.clone()],
                    delta: bool_delta(ann::HIBERNATE, false),
                },
                log(format!(
                    "migration re-targeted back: waking the main {main_name} in place"
                )),
                Write::MarkMigrating,
            ],
            poll,
        ),
        Advance::AwaitLive { unschedulable } => {
            let mut writes: Vec<Effect> = Vec::new();
            if let Some(msg) = unschedulable {
                let msg = rules::redact_target(&msg, desired);
                writes.push(Note::Count(Counter::MigrateUnschedulable).into());
                writes.push(
                    Note::Event {
                        warning: true,
                        reason: reasons::MIGRATE_NO_CAPACITY,
                        message: ev::main_unschedulable_message(&main_name, &msg),
                    }
                    .into(),
                );
            }
            writes.push(Write::MarkMigrating.into());
            StepPlan::of(writes, Next::RequeueAfter(poll))
        }
        Advance::DropSnapshot => StepPlan::read_of(
            effects![
                drop_tag(&vm),
                log(format!("migration to {desired} complete: snapshot dropped")),
                Write::MarkMigrating,
            ],
            vec![probe(&vm)],
        ),
    }
}

/// 8.4's probe of the main's `:hibernate` tag.
fn probe(vm: &str) -> Read {
    Read::Probe {
        vms: vec![vm.to_string()],
        tag: tags::HIBERNATE,
        fail: Some(STEP),
    }
}

fn drop_tag(vm: &str) -> Write {
    Write::DropTag {
        vm: vm.to_string(),
        tag: tags::HIBERNATE,
        step: STEP,
    }
}

/// 8.6.2: the old main is gone; recreate it under the current pin from the snapshot, unless
/// the image rule dropped the snapshot (step 11 then boots it fresh).
fn recreate(o: &Observed<'_>, answers: &Answers) -> StepPlan {
    let poll = o.timing.migrate_poll;
    match answers.created.last() {
        // The old pod is still terminating (the cache no longer lists it).
        Some(Created::AlreadyExists) => return StepPlan::requeue(Vec::new(), poll),
        Some(Created::Yes) => {
            let target = &o.cs.spec.node_name;
            return StepPlan::requeue_of(
                effects![
                    Note::Changed,
                    log(format!("main recreated from its snapshot on {target}")),
                    Write::MarkMigrating,
                ],
                poll,
            );
        }
        None => {}
    }
    let pod = pods::build_agent_pod(o.cs, o.ns, 0, "", None);
    let facts = create::facts(o, &pod, Role::Main, &BTreeSet::new(), true);
    match create::protocol(answers, pod, facts, STEP) {
        Protocol::Read(read) => StepPlan::read(Vec::new(), vec![read]),
        Protocol::Decided {
            pod,
            mut writes,
            tag,
            decision,
        } => {
            if wake_boots_fresh(&tag, &decision) {
                writes.push(
                    log("no snapshot to migrate onto (image changed); the main boots fresh").into(),
                );
                return StepPlan::of(writes, Next::Continue);
            }
            writes.push(Write::PostPod(pod).into());
            StepPlan::read_of(writes, Vec::new())
        }
    }
}

#[cfg(test)]
mod tests {
    use cocoon_api::crd::set::CocoonSet;
    use k8s_openapi::api::core::v1::Pod;

    use super::*;
    use crate::cocoonset::Timing;
    use crate::cocoonset::fixtures::{
        NS, SetFixture, classify, live, observe, on, phase, set, unschedulable, vm, with,
    };
    use crate::cocoonset::shared::create::rules::TagRead;
    use crate::cocoonset::steps::Probed;

    /// The set pinned to `pin`, Migrating already with `migrating`.
    fn pinned(pin: &str, migrating: bool) -> CocoonSet {
        let mut cs = set().in_phase(migrating.then_some(CocoonSetPhase::Migrating));
        cs.spec.node_name = pin.into();
        cs
    }

    fn main_on(cs: &CocoonSet, node: &str) -> Pod {
        on(pods::build_agent_pod(cs, NS, 0, "", None), node)
    }

    /// The answers of a pass past the CocoonHibernation guard and the tag probe.
    fn probed(tag: bool) -> Answers {
        Answers {
            fresh_hibernations: Some(Vec::new()),
            probed: Some(Probed {
                exists: [(vm(0), tag)].into(),
                error: None,
            }),
            ..Answers::default()
        }
    }

    fn run(cs: &CocoonSet, main: Option<&Pod>, answers: &Answers) -> StepPlan {
        let c = classify(main);
        let t = Timing::default();
        plan(&observe(cs, &c, &t), answers)
    }

    fn poll() -> Next {
        Next::RequeueAfter(Timing::default().migrate_poll)
    }

    #[test]
    fn it_short_circuits_on_a_cocoon_hibernation_read_past_the_cache_then_probes_the_tag() {
        let cs = pinned("node-b", false);
        let main = live(main_on(&cs, "node-a"), 3);
        let p = run(&cs, Some(&main), &Answers::default());
        assert_eq!(p, StepPlan::read(Vec::new(), vec![Read::FreshHibernations]));
        let a = Answers {
            fresh_hibernations: Some(Vec::new()),
            ..Answers::default()
        };
        assert_eq!(
            run(&cs, Some(&main), &a).reads,
            vec![Read::Probe {
                vms: vec![vm(0)],
                tag: tags::HIBERNATE,
                fail: Some(STEP)
            }],
            "a refused probe fails the pass"
        );
        // A settled main on its pin: no read at all.
        let home = live(main_on(&cs, "node-b"), 3);
        assert_eq!(
            run(&cs, Some(&home), &Answers::default()),
            StepPlan::proceed()
        );
    }

    #[test]
    fn quiesce_the_old_pod_with_migrating_written_first() {
        let cs = pinned("node-b", false);
        let main = live(main_on(&cs, "node-a"), 3);
        let p = run(&cs, Some(&main), &probed(false));
        assert_eq!(
            p.writes[0],
            Write::MarkMigrating,
            "the durable marker first"
        );
        assert!(matches!(
            &p.writes[1],
            Write::MarkPods { delta, .. } if delta.get(ann::HIBERNATE) == Some(&Some("true".into()))
        ));
        assert_eq!(p.next, poll());
    }

    #[test]
    fn snapshot_it_delete_it_flagged_keep_snapshot_on_delete_best_effort() {
        let cs = pinned("node-b", true);
        let main = with(
            with(main_on(&cs, "node-a"), ann::HIBERNATE, "true"),
            ann::LIFECYCLE_STATE,
            "hibernated",
        );
        let p = run(&cs, Some(&main), &probed(true));
        let name = main.name_any();
        assert!(matches!(&p.writes[0], Write::FlagPod { name: n, .. } if *n == name));
        assert_eq!(p.writes[1], Write::DeletePod(name));
        assert_eq!(p.writes.last(), Some(&Write::MarkMigrating));
        // Snapshotted but not reported hibernated yet: wait.
        let hibernating = with(main_on(&cs, "node-a"), ann::HIBERNATE, "true");
        let p = run(&cs, Some(&hibernating), &probed(true));
        assert_eq!(
            p,
            StepPlan::requeue(vec![Write::MarkMigrating], Timing::default().migrate_poll)
        );
    }

    #[test]
    fn recreate_on_the_target_node_with_restore_from_hibernate() {
        let cs = pinned("node-b", true);
        let p = run(&cs, None, &probed(true));
        assert_eq!(
            p.reads,
            vec![Read::Manifest {
                vm: vm(0),
                step: STEP
            }],
            "the create protocol reads the tag first"
        );
        let mut a = probed(true);
        a.manifests.insert(
            vm(0),
            TagRead::Present {
                base_image: String::new(),
            },
        );
        let p = run(&cs, None, &a);
        let pod = p
            .writes
            .iter()
            .find_map(|w| match w {
                Write::PostPod(pod) => Some(pod),
                _ => None,
            })
            .expect("posted");
        assert!(pods::is_restore_marked(pod));
        assert_eq!(p.next, Next::Replan, "the post's outcome decides");
        a.created.push(Created::Yes);
        let p = run(&cs, None, &a);
        assert_eq!(p.writes.last(), Some(&Write::MarkMigrating));
        assert_eq!(p.next, poll());
        a.created = vec![Created::AlreadyExists];
        assert_eq!(
            run(&cs, None, &a),
            StepPlan::requeue(Vec::new(), Timing::default().migrate_poll)
        );
    }

    #[test]
    fn when_the_snapshot_image_rule_drops_a_snapshot_the_recreate_is_left_to_step_11() {
        let cs = pinned("node-b", true);
        let mut a = probed(true);
        a.manifests.insert(
            vm(0),
            TagRead::Present {
                base_image: "img:0".into(),
            },
        );
        let p = run(&cs, None, &a);
        assert!(matches!(&p.writes[0], Write::DropTag { step: STEP, .. }));
        assert!(!p.writes.iter().any(|w| matches!(w, Write::PostPod(_))));
        assert_eq!(p.next, Next::Continue);
    }

    #[test]
    fn the_snapshot_drops_only_once_the_new_vm_runs_confirmed_past_the_cache() {
        let cs = pinned("node-b", true);
        let restored = live(main_on(&cs, "node-b"), 3);
        let name = restored.name_any();
        let p = run(&cs, Some(&restored), &probed(true));
        assert_eq!(p, StepPlan::read(Vec::new(), vec![Read::Pod(name.clone())]));
        let mut a = probed(true);
        a.pods.insert(name.clone(), Some(restored.clone()));
        let p = run(&cs, Some(&restored), &a);
        assert!(matches!(&p.writes[0], Write::DropTag { step: STEP, .. }));
        // No watch reports the drop (issue 36 item 7): the same pass probes again and, the tag
        // gone, hands over, instead of waiting for the migrate poll.
        assert_eq!(p.reads, vec![probe(&vm(0))]);
        assert_eq!(p.next, Next::Replan);
        let mut after = a.clone();
        after
            .dropped
            .insert(format!("{}:{}", vm(0), tags::HIBERNATE));
        after.probed = probed(false).probed;
        assert_eq!(run(&cs, Some(&restored), &after), StepPlan::proceed());
        // Still there after this step's own drop (pushed again, or kept by the ownership
        // gate): no second drop in the pass, the poll as before.
        after.probed = probed(true).probed;
        assert_eq!(
            run(&cs, Some(&restored), &after),
            StepPlan::requeue(vec![Write::MarkMigrating], Timing::default().migrate_poll)
        );
        // The pod read now is no longer live: the tag stays.
        a.pods.insert(name, Some(main_on(&cs, "node-b")));
        assert_eq!(
            run(&cs, Some(&restored), &a),
            StepPlan::requeue(vec![Write::MarkMigrating], Timing::default().migrate_poll)
        );
    }

    #[test]
    fn while_the_restored_main_is_unschedulable_the_set_emits_migrate_no_capacity_and_keeps_polling()
     {
        let cs = pinned("node-b", true);
        let pending = phase(
            unschedulable(main_on(&cs, ""), "0/3 nodes: node-b is full"),
            "Pending",
        );
        let pending = with(pending, ann::RESTORE_FROM_HIBERNATE, "true");
        let p = run(&cs, Some(&pending), &probed(true));
        assert!(
            p.notes()
                .any(|n| *n == Note::Count(Counter::MigrateUnschedulable))
        );
        assert!(p.notes().any(|w| matches!(
            w,
            Note::Event { reason: reasons::MIGRATE_NO_CAPACITY, message, .. }
                if !message.contains("node-b")
        )));
        assert_eq!(p.next, poll());
    }

    #[test]
    fn a_main_unscheduled_under_a_pin_the_set_no_longer_names_is_deleted_reading_the_pod_only() {
        let old = pinned("node-a", false);
        let stale = main_on(&old, "");
        let cs = pinned("node-b", false);
        let p = run(&cs, Some(&stale), &Answers::default());
        assert!(p.reads.is_empty(), "no read");
        assert!(p.writes.contains(&Write::DeletePod(stale.name_any())));
        assert_eq!(
            p.next,
            Next::RequeueAfter(Timing::default().requeue_after_write)
        );
    }
}
