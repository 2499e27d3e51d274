//! Step 8 — the cross-node migration of the main (slot 0), `reconcileMigration`.
//!
//! When `spec.nodeName` pins the main to a node it is not on: mark Migrating, quiesce the old
//! pod (hibernate annotation), wait for its snapshot and for vk-cocoon to report it
//! hibernated, delete it (flagged keep-snapshot-on-delete, best effort), recreate it on the
//! target from the snapshot, and drop the snapshot once the new VM runs. An unscheduled main
//! under a pin the set no longer names is deleted and recreated under the current pin. It
//! waits while a CocoonHibernation owns or tracks the main (a [`Read::FreshHibernations`]).
//! The tag probe is a [`Read::Probe`]; before a tag drop the main is read past the cache
//! ([`Read::Pod`]) so the drop is decided on the VM that runs now. The recreate goes through
//! the create protocol ([`super::create_protocol`]): when the image rule drops the snapshot,
//! step 11 boots the main fresh. The pure rules are [`crate::cocoonset::migrate`].
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

use super::{
    Answers, Counter, Created, Next, Observed, Protocol, Read, StepPlan, Write, create_facts, log,
};
use crate::cocoonset::migrate::{self, Advance, Engage};
use crate::cocoonset::pods;
use crate::cocoonset::suspend;

/// The step's name in a registry error.
pub const STEP: &str = "migrate";

pub fn plan(o: &Observed<'_>, answers: &Answers) -> StepPlan {
    let desired = o.cs.spec.node_name.as_str();
    let migrating = o.cs.status.as_ref().and_then(|s| s.phase) == Some(CocoonSetPhase::Migrating);
    let main = o.classified.main.as_ref();
    let name = o.cs.name_any();
    let main_name = naming::pod_name_for_agent(&name, 0);
    match migrate::engage(desired, migrating, main) {
        Engage::HandOver => return StepPlan::proceed(),
        Engage::DeleteStalePin => {
            return StepPlan::requeue(
                vec![
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
    if migrate::hibernation_blocks(crs, &main_name) {
        return StepPlan::proceed();
    }
    let vm = naming::vm_name_for_agent(o.ns, &name, 0);
    let Some(probed) = &answers.probed else {
        return StepPlan::read(
            Vec::new(),
            vec![Read::Probe {
                vms: vec![vm],
                tag: tags::HIBERNATE,
                fail: Some(STEP),
            }],
        );
    };
    let tag = probed.exists.get(&vm).copied().unwrap_or(false);
    let mut decision = migrate::advance(desired, migrating, main, tag);
    if matches!(decision, Advance::DropLeftover | Advance::DropSnapshot) {
        // The cache was read before the probe. Once the tag exists the node agent has written
        // `hibernating`, so a pod read now shows whether the VM that runs is the one the
        // snapshot came from; dropping on the older view could lose the only copy of the
        // main's state.
        let Some(now) = answers.pods.get(&main_name) else {
            return StepPlan::read(Vec::new(), vec![Read::Pod(main_name)]);
        };
        if migrate::advance(desired, migrating, now.as_ref(), tag) != decision {
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
        Advance::Quiesce => StepPlan::requeue(
            vec![
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
        Advance::DropLeftover => StepPlan::requeue(
            vec![
                drop_tag(&vm),
                log(format!(
                    "dropped the leftover :hibernate tag of {vm} before migrating"
                )),
                Write::MarkMigrating,
            ],
            poll,
        ),
        Advance::AwaitQuiesce => StepPlan::requeue(vec![Write::MarkMigrating], poll),
        // Best effort, as in seat release: without the flag the target pulls the snapshot
        // from the registry instead of the source node.
        Advance::EvictOld => StepPlan::requeue(
            vec![
                Write::FlagPod {
                    name: main_name.clone(),
                    delta: bool_delta(ann::KEEP_SNAPSHOT_ON_DELETE, true),
                },
                Write::DeletePod(main_name.clone()),
                Write::Changed,
                log(format!(
                    "quiesced main {main_name} deleted for the migration to {desired}"
                )),
                Write::MarkMigrating,
            ],
            poll,
        ),
        Advance::Recreate => recreate(o, answers),
        Advance::WakeInPlace => StepPlan::requeue(
            vec![
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
            let mut writes = Vec::new();
            if let Some(msg) = unschedulable {
                let msg = migrate::redact_target(&msg, desired);
                writes.push(Write::Count(Counter::MigrateUnschedulable));
                writes.push(Write::Event {
                    warning: true,
                    reason: reasons::MIGRATE_NO_CAPACITY,
                    message: ev::main_unschedulable_message(&main_name, &msg),
                });
            }
            writes.push(Write::MarkMigrating);
            StepPlan::requeue(writes, poll)
        }
        Advance::DropSnapshot => StepPlan::requeue(
            vec![
                drop_tag(&vm),
                log(format!("migration to {desired} complete: snapshot dropped")),
                Write::MarkMigrating,
            ],
            poll,
        ),
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
            return StepPlan::requeue(
                vec![
                    Write::Changed,
                    log(format!("main recreated from its snapshot on {target}")),
                    Write::MarkMigrating,
                ],
                poll,
            );
        }
        None => {}
    }
    let pod = pods::build_agent_pod(o.cs, o.ns, 0, "", None);
    let facts = create_facts(o, &pod, Role::Main, &BTreeSet::new(), true);
    match super::create_protocol(answers, pod, facts, STEP) {
        Protocol::Read(read) => StepPlan::read(Vec::new(), vec![read]),
        Protocol::Decided {
            pod,
            mut writes,
            tag,
            decision,
        } => {
            if suspend::wake_boots_fresh(&tag, &decision) {
                writes.push(log(
                    "no snapshot to migrate onto (image changed); the main boots fresh",
                ));
                return StepPlan::then(writes, Next::Continue);
            }
            writes.push(Write::PostPod(pod));
            StepPlan::read(writes, Vec::new())
        }
    }
}
