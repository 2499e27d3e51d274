//! Table tests of step 8 (cross-node migration of the main) of `cocoonset.md`.

use cocoon_api::contract::annotations as ann;
use cocoon_api::crd::hibernation::{CocoonHibernation, Desire, HibernationPhase};
use cocoon_api::crd::set::CocoonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::rules::{self, Advance, Engage};
use crate::cocoonset::fixtures::{self, NS, live, on, phase, set, unschedulable, with};
use crate::cocoonset::pods;

/// The set pinned to `pin` ("" = no pin).
fn pinned(pin: &str) -> CocoonSet {
    let mut cs = set();
    cs.spec.node_name = pin.into();
    cs
}

/// The main as the factory builds it under `pin`, bound to `node` ("" = unscheduled).
fn main_pod(pin: &str, node: &str) -> Pod {
    let p = pods::build_agent_pod(&pinned(pin), NS, 0, "", None);
    if node.is_empty() {
        return p;
    }
    on(p, node)
}

fn quiesced(p: Pod) -> Pod {
    with(p, ann::HIBERNATE, "true")
}

/// Quiesced, and the node agent reported `hibernated` (VM id cleared).
fn hibernated(p: Pod, generation: i64) -> Pod {
    let mut p = quiesced(p);
    p.annotations_mut().remove(ann::VM_ID);
    fixtures::hibernated(p, generation)
}

/// The node agent's first hibernate write (lifecycle `hibernating`); the VM still runs.
fn hibernating(p: Pod) -> Pod {
    with(p, ann::LIFECYCLE_STATE, "hibernating")
}

#[test]
fn stale_pin_reads_only_the_pod() {
    let cases: Vec<(&str, Pod, &str, bool)> = vec![
        (
            "unscheduled under the old pin",
            main_pod("n1", ""),
            "n2",
            true,
        ),
        ("unscheduled, pin removed", main_pod("n1", ""), "", true),
        (
            "unscheduled under the current pin",
            main_pod("n2", ""),
            "n2",
            false,
        ),
        (
            "bound under the old pin: a migration, not a stale pin",
            main_pod("n1", "n1"),
            "n2",
            false,
        ),
        (
            "unscheduled with no affinity",
            main_pod("", ""),
            "n2",
            false,
        ),
        ("no affinity, no pin", main_pod("", ""), "", false),
    ];
    for (what, pod, desired, want) in cases {
        assert_eq!(rules::stale_pin(desired, &pod), want, "{what}");
    }
}

#[test]
fn engage_table() {
    use Engage::*;
    let cases: Vec<(&str, &str, bool, Option<Pod>, Engage)> = vec![
        (
            "stale pin wins over everything",
            "n2",
            false,
            Some(main_pod("n1", "")),
            DeleteStalePin,
        ),
        (
            "removed pin on a pending main",
            "",
            true,
            Some(main_pod("n1", "")),
            DeleteStalePin,
        ),
        (
            "no pin, not migrating",
            "",
            false,
            Some(live(main_pod("", "n1"), 3)),
            HandOver,
        ),
        ("no pin, no main", "", false, None, HandOver),
        (
            "pin, main settled on target",
            "n1",
            false,
            Some(live(main_pod("n1", "n1"), 3)),
            HandOver,
        ),
        (
            "pin, main still booting unbound on target",
            "n1",
            false,
            Some(main_pod("n1", "")),
            HandOver,
        ),
        (
            "pin, main elsewhere",
            "n2",
            false,
            Some(live(main_pod("", "n1"), 3)),
            Probe,
        ),
        (
            "pin, main on target but hibernate-annotated",
            "n1",
            false,
            Some(quiesced(main_pod("n1", "n1"))),
            Probe,
        ),
        ("pin, no main", "n1", false, None, Probe),
        (
            "migrating, main on target",
            "n1",
            true,
            Some(live(main_pod("n1", "n1"), 3)),
            Probe,
        ),
        ("migrating, pin removed mid-flight", "", true, None, Probe),
    ];
    for (what, desired, migrating, main, want) in cases {
        assert_eq!(
            rules::engage(desired, migrating, main.as_ref()),
            want,
            "{what}"
        );
    }
}

/// A CocoonHibernation `h` of `pod` at generation 2 whose status has observed generation
/// `observed`.
fn observed_cr(
    pod: &str,
    desire: Desire,
    phase: Option<HibernationPhase>,
    observed: i64,
) -> CocoonHibernation {
    let mut h = fixtures::cr(pod, desire, phase);
    h.metadata.name = Some("h".into());
    h.metadata.generation = Some(2);
    if let Some(s) = h.status.as_mut() {
        s.observed_generation = observed;
    }
    h
}

#[test]
fn hibernation_guards() {
    use HibernationPhase::*;
    let cases: Vec<(&str, Vec<CocoonHibernation>, bool)> = vec![
        ("none", vec![], false),
        (
            "another pod's CR",
            vec![observed_cr("other", Desire::Hibernate, Some(Hibernated), 2)],
            false,
        ),
        (
            "desire Hibernate",
            vec![observed_cr(
                "demo-0",
                Desire::Hibernate,
                Some(Hibernated),
                2,
            )],
            true,
        ),
        (
            "desire Hibernate, no status yet",
            vec![observed_cr("demo-0", Desire::Hibernate, None, 0)],
            true,
        ),
        (
            "Hibernating",
            vec![observed_cr("demo-0", Desire::Wake, Some(Hibernating), 2)],
            true,
        ),
        (
            "wake in flight",
            vec![observed_cr("demo-0", Desire::Wake, Some(Waking), 2)],
            true,
        ),
        (
            "failed wake still retrying",
            vec![observed_cr("demo-0", Desire::Wake, Some(Hibernated), 2)],
            true,
        ),
        (
            "Active but spec change unobserved",
            vec![observed_cr("demo-0", Desire::Wake, Some(Active), 1)],
            true,
        ),
        (
            "settled Active",
            vec![observed_cr("demo-0", Desire::Wake, Some(Active), 2)],
            false,
        ),
    ];
    for (what, crs, want) in cases {
        assert_eq!(rules::hibernation_blocks(&crs, "demo-0"), want, "{what}");
    }
}

/// (what, spec.nodeName, migrating, main, tag present, expected).
type AdvanceCase = (&'static str, &'static str, bool, Option<Pod>, bool, Advance);

#[test]
fn advance_table() {
    use Advance::*;
    let on_old = || main_pod("", "n1");
    let on_target = || main_pod("n2", "n2");
    let cases: Vec<AdvanceCase> = vec![
        // 8.5 no tag
        (
            "no tag, no pin (aborted)",
            "",
            true,
            Some(live(on_old(), 3)),
            false,
            HandOver,
        ),
        ("no tag, no main", "n2", true, None, false, HandOver),
        (
            "no tag, main unbound",
            "n2",
            true,
            Some(main_pod("n2", "")),
            false,
            HandOver,
        ),
        (
            "no tag, main on target",
            "n2",
            true,
            Some(live(on_target(), 3)),
            false,
            HandOver,
        ),
        (
            "no tag, main elsewhere: start",
            "n2",
            false,
            Some(live(on_old(), 3)),
            false,
            Quiesce,
        ),
        (
            "no tag, quiesce set, snapshot not landed",
            "n2",
            true,
            Some(quiesced(live(on_old(), 3))),
            false,
            Quiesce,
        ),
        // 8.6.1 off target
        (
            "leftover tag, live main",
            "n2",
            false,
            Some(live(on_old(), 3)),
            true,
            DropLeftover,
        ),
        (
            "migrating, quiesce not yet in the cache: re-assert, never drop",
            "n2",
            true,
            Some(live(on_old(), 3)),
            true,
            Quiesce,
        ),
        (
            "leftover tag, main not live yet",
            "n2",
            false,
            Some(on_old()),
            true,
            HandOver,
        ),
        (
            "leftover tag, main live but hibernating: its snapshot may be that tag",
            "n2",
            false,
            Some(hibernating(live(on_old(), 3))),
            true,
            HandOver,
        ),
        (
            "quiesced, tag landed, not yet hibernated",
            "n2",
            true,
            Some(quiesced(live(on_old(), 3))),
            true,
            AwaitQuiesce,
        ),
        (
            "quiesced and hibernated",
            "n2",
            true,
            Some(hibernated(on_old(), 3)),
            true,
            EvictOld,
        ),
        (
            "unsuspend + pin edit: hibernated at an older generation",
            "n2",
            false,
            Some(hibernated(on_old(), 2)),
            true,
            EvictOld,
        ),
        // 8.6.2 main gone
        ("main gone, tag present", "n2", true, None, true, Recreate),
        (
            "main gone, pin removed mid-flight",
            "",
            true,
            None,
            true,
            Recreate,
        ),
        // 8.6.3 annotated on target / no pin
        (
            "re-target back mid-migration",
            "n1",
            true,
            Some(hibernated(main_pod("n1", "n1"), 3)),
            true,
            WakeInPlace,
        ),
        (
            "pin removed mid-quiesce",
            "",
            true,
            Some(quiesced(live(on_old(), 3))),
            true,
            WakeInPlace,
        ),
        (
            "plain unsuspend of a pinned set",
            "n1",
            false,
            Some(hibernated(main_pod("n1", "n1"), 3)),
            true,
            HandOver,
        ),
        // 8.6.4 not live
        (
            "restored main pending",
            "n2",
            true,
            Some(main_pod("n2", "")),
            true,
            AwaitLive {
                unschedulable: None,
            },
        ),
        (
            "restored main unschedulable",
            "n2",
            true,
            Some(phase(
                unschedulable(main_pod("n2", ""), "0/3 nodes are available"),
                "Pending",
            )),
            true,
            AwaitLive {
                unschedulable: Some("0/3 nodes are available".into()),
            },
        ),
        (
            "not migrating, main booting: CR wake may be in flight",
            "n2",
            false,
            Some(on_target()),
            true,
            HandOver,
        ),
        (
            "restored VM up, lifecycle still creating",
            "n2",
            true,
            Some(with(live(on_target(), 3), ann::LIFECYCLE_STATE, "creating")),
            true,
            AwaitLive {
                unschedulable: None,
            },
        ),
        (
            "re-target back cleared the quiesce mid-save: tag pushed, VM id not yet cleared",
            "n1",
            true,
            Some(hibernating(live(main_pod("n1", "n1"), 3))),
            true,
            AwaitLive {
                unschedulable: None,
            },
        ),
        (
            "the same once the set no longer reads Migrating",
            "n1",
            false,
            Some(hibernating(live(main_pod("n1", "n1"), 3))),
            true,
            HandOver,
        ),
        // 8.6.5
        (
            "woken in place after the re-target back",
            "n1",
            true,
            Some(live(main_pod("n1", "n1"), 3)),
            true,
            DropSnapshot,
        ),
        (
            "restored and live",
            "n2",
            true,
            Some(live(on_target(), 3)),
            true,
            DropSnapshot,
        ),
        (
            "restored and live, no pin",
            "",
            true,
            Some(live(main_pod("", "n3"), 3)),
            true,
            DropSnapshot,
        ),
    ];
    for (what, desired, migrating, main, tag, want) in cases {
        assert_eq!(
            rules::advance(desired, migrating, main.as_ref(), tag),
            want,
            "{what}"
        );
    }
}

#[test]
fn no_capacity_message_does_not_name_the_target() {
    assert_eq!(
        rules::redact_target("0/2 nodes are available: node n2 is full", "n2"),
        "0/2 nodes are available: node <target node> is full"
    );
    assert_eq!(rules::redact_target("0/2 nodes", ""), "0/2 nodes");
}
