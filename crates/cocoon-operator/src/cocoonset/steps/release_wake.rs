//! Step 9 — the release-policy wake (`reconcileWake`).
//!
//! It engages while the set is Waking or Suspended, while it is Suspending with a node hint
//! stashed, or whenever a restore-marked main that is not hibernating still carries a hint
//! ([`suspend::wake_step`]). Once the released main is gone it recreates the main from its
//! snapshot near the hinted node (9.1, applied by the walk: it needs the tag read first);
//! while the recreated main has no live VM it stays Waking, reporting `WakeNoCapacity` when it
//! is Unschedulable (9.2); once it runs, the snapshot tag is dropped, the placement scored
//! and the hint cleared (9.3). While the cache still shows the released main, the walk
//! confirms it with an uncached GET (9.4).

use cocoon_api::contract::events::{self as ev, operator as reasons};
use cocoon_api::contract::{AnnotationCodec, HibernatedOnNode, tags};
use cocoon_api::crd::set::CocoonSetPhase;
use cocoon_api::naming;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::{Counter, Next, Observed, StepPlan, Write};
use crate::cocoonset::plan;
use crate::cocoonset::suspend::{self, WakeStep};

/// The step's decision.
#[derive(Debug, Clone, PartialEq)]
pub enum ReleaseWake {
    /// These writes, then what comes next.
    Plan(StepPlan),
    /// 9.1: recreate the released main from its snapshot, near `hint`.
    Start { hint: String },
    /// 9.4: confirm the released main is gone before the normal flow takes over.
    ConfirmGone,
}

pub fn plan(o: &Observed<'_>, status_time: Timestamp) -> ReleaseWake {
    let hint = HibernatedOnNode::from_meta(&o.cs.metadata).0;
    let main = o.classified.main.as_ref();
    let phase = o.cs.status.as_ref().and_then(|s| s.phase);
    let status = |phase| Write::Status(plan::build_status(o.cs, o.classified, phase, status_time));
    let poll = Next::RequeueAfter(o.timing.migrate_poll);
    match suspend::wake_step(phase, &hint, main) {
        WakeStep::HandOver => ReleaseWake::Plan(StepPlan::proceed()),
        WakeStep::Start => ReleaseWake::Start { hint },
        WakeStep::ConfirmGone => ReleaseWake::ConfirmGone,
        WakeStep::WaitLive { unschedulable } => {
            let mut writes = Vec::new();
            if let (Some(msg), Some(m)) = (unschedulable, main) {
                writes.push(Write::Count(Counter::SlotReleaseWakeUnschedulable));
                writes.push(Write::Event {
                    warning: true,
                    reason: reasons::WAKE_NO_CAPACITY,
                    message: ev::main_unschedulable_message(&m.name_any(), &msg),
                });
            }
            writes.push(status(Some(CocoonSetPhase::Waking)));
            ReleaseWake::Plan(StepPlan::then(writes, poll))
        }
        WakeStep::Complete { placement } => {
            let vm = naming::vm_name_for_agent(o.ns, &o.cs.name_any(), 0);
            let mut writes = vec![Write::DropTag {
                vm,
                tag: tags::HIBERNATE,
                step: "wake",
            }];
            if let Some(p) = placement {
                writes.push(Write::Count(Counter::SlotReleaseWake {
                    placement: p.to_string(),
                }));
            }
            writes.push(Write::SetAnnotations(
                HibernatedOnNode::default().delta(o.cs.annotations()),
            ));
            writes.push(status(None));
            ReleaseWake::Plan(StepPlan::then(
                writes,
                Next::RequeueAfter(o.timing.requeue_after_write),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use cocoon_api::contract::annotations as ann;
    use cocoon_api::crd::set::{CocoonSet, CocoonSetSpec, CocoonSetStatus, HibernatePolicy};
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStatus, Pod, PodCondition, PodStatus,
    };

    use super::*;
    use crate::cocoonset::plan::Timing;
    use crate::cocoonset::pods::{self, Classified};

    const NS: &str = "ns";

    fn set(phase: Option<CocoonSetPhase>, hint: &str) -> CocoonSet {
        let mut spec = CocoonSetSpec::with_image("img:1");
        spec.hibernate_policy = HibernatePolicy::Release;
        spec.agent.replicas = 0;
        let mut cs = CocoonSet::new("demo", spec);
        cs.metadata.namespace = Some(NS.into());
        cs.metadata.uid = Some("uid".into());
        cs.metadata.generation = Some(2);
        cs.status = phase.map(|p| CocoonSetStatus {
            phase: Some(p),
            ..CocoonSetStatus::default()
        });
        if !hint.is_empty() {
            cs.annotations_mut()
                .insert(ann::HIBERNATED_ON_NODE.into(), hint.into());
        }
        cs
    }

    fn decide(cs: &CocoonSet, main: Option<&Pod>) -> ReleaseWake {
        let c = Classified::from_owned(main);
        let t = Timing::default();
        plan(
            &Observed {
                cs,
                ns: NS,
                owned: &[],
                classified: &c,
                timing: &t,
            },
            Timestamp::UNIX_EPOCH,
        )
    }

    fn restored_main(cs: &CocoonSet, node: &str, live: bool) -> Pod {
        let mut p = pods::build_agent_pod(cs, NS, 0, "", None);
        pods::mark_restore(&mut p);
        if let Some(s) = p.spec.as_mut() {
            s.node_name = Some(node.into());
        }
        if live {
            p.annotations_mut()
                .insert(ann::VM_ID.into(), "vm-id-1".into());
            p.annotations_mut()
                .insert(ann::LIFECYCLE_STATE.into(), "ready".into());
            p.status = Some(PodStatus {
                phase: Some("Running".into()),
                container_statuses: Some(vec![ContainerStatus {
                    state: Some(ContainerState {
                        running: Some(ContainerStateRunning::default()),
                        ..ContainerState::default()
                    }),
                    ..ContainerStatus::default()
                }]),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    ..PodCondition::default()
                }]),
                ..PodStatus::default()
            });
        }
        p
    }

    #[test]
    fn once_the_released_main_is_gone_the_wake_takes_over_and_recreates_it() {
        let cs = set(Some(CocoonSetPhase::Suspended), "node-a");
        assert_eq!(
            decide(&cs, None),
            ReleaseWake::Start {
                hint: "node-a".into()
            }
        );
        assert_eq!(
            decide(&set(Some(CocoonSetPhase::Running), ""), None),
            ReleaseWake::Plan(StepPlan::proceed()),
            "not engaged: the normal flow"
        );
    }

    #[test]
    fn keeps_the_reconcile_while_the_recreated_main_comes_up() {
        let cs = set(Some(CocoonSetPhase::Waking), "node-a");
        let main = restored_main(&cs, "node-b", false);
        match decide(&cs, Some(&main)) {
            ReleaseWake::Plan(p) => {
                assert!(matches!(
                    p.writes.last(),
                    Some(Write::Status(s)) if s.phase == Some(CocoonSetPhase::Waking)
                ));
                assert_eq!(p.next, Next::RequeueAfter(Timing::default().migrate_poll));
            }
            other => panic!("waiting, got {other:?}"),
        }
    }

    #[test]
    fn clears_the_hint_on_completion_after_dropping_the_snapshot() {
        let cs = set(Some(CocoonSetPhase::Waking), "node-a");
        let main = restored_main(&cs, "node-a", true);
        let ReleaseWake::Plan(p) = decide(&cs, Some(&main)) else {
            panic!("a completion plan");
        };
        let vm = naming::vm_name_for_agent(NS, "demo", 0);
        assert_eq!(
            p.writes[0],
            Write::DropTag {
                vm,
                tag: tags::HIBERNATE,
                step: "wake"
            },
            "the snapshot goes first"
        );
        assert!(p.writes.contains(&Write::Count(Counter::SlotReleaseWake {
            placement: cocoon_api::contract::metrics::operator::PLACEMENT_HINT_NODE.into()
        })));
        assert!(p.writes.iter().any(|w| matches!(
            w,
            Write::SetAnnotations(d) if d.get(ann::HIBERNATED_ON_NODE) == Some(&None)
        )));
        assert!(matches!(p.writes.last(), Some(Write::Status(_))));
        assert_eq!(
            p.next,
            Next::RequeueAfter(Timing::default().requeue_after_write)
        );
    }
}
