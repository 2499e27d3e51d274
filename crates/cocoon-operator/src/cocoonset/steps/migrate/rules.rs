//! Pure rules of step 8 of `cocoonset.md`: the cross-node migration of the main (slot 0).
//! The step's planner ([`super::plan`]) decides on them.
//!
//! Unspecified choice (6.1): the old pod is deleted only when, besides the tag and this
//! controller's quiesce, the node agent reports lifecycle `hibernated` (at any observed
//! generation). The tag alone could be an older cycle's snapshot pushed before the quiesce
//! landed; `hibernated` says the VM is down and its last state is that snapshot. The
//! generation is not compared because a pin edit bumps it after the VM hibernated, and an
//! already-hibernated VM has nothing to re-echo.

use cocoon_api::contract::labels::HOSTNAME;
use cocoon_api::contract::lifecycle::LifecycleState;
use cocoon_api::crd::hibernation::{CocoonHibernation, Desire, HibernationPhase};
use k8s_openapi::api::core::v1::Pod;

use crate::cocoonset::pods::{self, is_hibernate_annotated, unschedulable_message};

/// 8.0: an unscheduled main whose required hostname affinity no longer matches the pin (a
/// re-pin away from a full node, or a removed pin). It has no VM yet, so deleting it loses
/// nothing. Reads the pod only.
pub fn stale_pin(desired: &str, main: &Pod) -> bool {
    if !pods::bound_node(main).is_empty() {
        return false;
    }
    match required_hostnames(main) {
        Some(values) => values.len() != 1 || values[0] != desired,
        None => false,
    }
}

/// The values of the main's required `kubernetes.io/hostname` node-affinity term, when it
/// carries one.
fn required_hostnames(pod: &Pod) -> Option<Vec<String>> {
    let terms = &pod
        .spec
        .as_ref()?
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    terms
        .iter()
        .flat_map(|t| t.match_expressions.iter().flatten())
        .find(|e| e.key == HOSTNAME)
        .map(|e| e.values.clone().unwrap_or_default())
}

/// Steps 8.0–8.2, before any API list or registry call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engage {
    /// 8.0: delete the unscheduled main and requeue after a write.
    DeleteStalePin,
    /// 8.1 / 8.2: not engaged; the next step runs.
    HandOver,
    /// Engaged: check the CocoonHibernation guards, then probe the tag.
    Probe,
}

/// Steps 8.0–8.2.
pub fn engage(desired: &str, migrating: bool, main: Option<&Pod>) -> Engage {
    if let Some(m) = main
        && stale_pin(desired, m)
    {
        return Engage::DeleteStalePin;
    }
    if desired.is_empty() && !migrating {
        return Engage::HandOver;
    }
    if !migrating
        && let Some(m) = main
        && !is_hibernate_annotated(m)
    {
        let bound = pods::bound_node(m);
        if bound.is_empty() || bound == desired {
            // Still booting on its target, or settled there: no registry call.
            return Engage::HandOver;
        }
    }
    Engage::Probe
}

/// 8.3: a CocoonHibernation owns the main (desire Hibernate, or Hibernating) or still tracks
/// it (anything but a settled Active); the migration must not race that reconciler.
pub fn hibernation_blocks(crs: &[CocoonHibernation], main_pod: &str) -> bool {
    crs.iter()
        .filter(|h| h.spec.pod_ref.name == main_pod)
        .any(|h| {
            let phase = h.status.as_ref().and_then(|s| s.phase);
            let observed = h.status.as_ref().map_or(0, |s| s.observed_generation);
            let owns =
                h.spec.desire == Desire::Hibernate || phase == Some(HibernationPhase::Hibernating);
            let settled_active =
                phase == Some(HibernationPhase::Active) && Some(observed) == h.metadata.generation;
            owns || !settled_active
        })
}

/// Steps 8.5–8.6 after the tag probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Advance {
    /// Hand over to step 9 without touching anything.
    HandOver,
    /// 8.5: mark Migrating first, then set the hibernate annotation on the main (quiesce).
    Quiesce,
    /// 8.6.1: a tag this controller did not cause, on a live main: drop it, mark Migrating.
    DropLeftover,
    /// 8.6.1 (chosen gate): the quiesce is set and the tag exists but the node agent has not
    /// reported `hibernated` yet; mark Migrating and poll.
    AwaitQuiesce,
    /// 8.6.1: quiesced and snapshotted: flag keep-snapshot-on-delete, delete the old pod.
    EvictOld,
    /// 8.6.2: the main is gone: recreate it on the target from the snapshot.
    Recreate,
    /// 8.6.3: a re-target back mid-migration: clear the hibernate annotation in place.
    WakeInPlace,
    /// 8.6.4: the restored main has no live VM yet; `Some(msg)` when it is Unschedulable.
    AwaitLive { unschedulable: Option<String> },
    /// 8.6.5: the restored main runs: drop the tag, mark Migrating.
    DropSnapshot,
}

/// Steps 8.5–8.6.
pub fn advance(desired: &str, migrating: bool, main: Option<&Pod>, tag: bool) -> Advance {
    if !tag {
        let Some(m) = main else {
            return Advance::HandOver;
        };
        let bound = pods::bound_node(m);
        if desired.is_empty() || bound.is_empty() || bound == desired {
            return Advance::HandOver;
        }
        return Advance::Quiesce;
    }
    let Some(m) = main else {
        return Advance::Recreate;
    };
    let bound = pods::bound_node(m);
    let annotated = is_hibernate_annotated(m);
    if !desired.is_empty() && !bound.is_empty() && bound != desired {
        if !annotated {
            if migrating {
                // Migrating is written before the quiesce, so this is our own quiesce not
                // yet visible in the pod cache (or cleared by a re-target that moved on
                // again): re-assert it instead of dropping a tag that may be the snapshot
                // the node agent just pushed. The lifecycle gate below waits for the fresh
                // hibernate before the old pod is deleted.
                return Advance::Quiesce;
            }
            // A wake or restore may still read a leftover tag until the main runs.
            return if runs_after_snapshot(m) {
                Advance::DropLeftover
            } else {
                Advance::HandOver
            };
        }
        return if pods::lifecycle(m).state == Some(LifecycleState::Hibernated) {
            Advance::EvictOld
        } else {
            Advance::AwaitQuiesce
        };
    }
    if annotated && (desired.is_empty() || bound == desired) {
        return if migrating {
            Advance::WakeInPlace
        } else {
            // A plain unsuspend of a pinned set belongs to step 10.
            Advance::HandOver
        };
    }
    if !runs_after_snapshot(m) {
        if !migrating {
            // A CocoonHibernation wake may be in flight.
            return Advance::HandOver;
        }
        return Advance::AwaitLive {
            unschedulable: unschedulable_message(m),
        };
    }
    Advance::DropSnapshot
}

/// Whether the main runs a VM that no longer needs the `:hibernate` tag (8.6.1's "runs a live
/// VM", 8.6.5's "restored and live"): `VMLive` **and** lifecycle `ready`, as a woken pod in
/// 10.6. `VMLive` alone is not enough. The node agent writes lifecycle `hibernating` before it
/// saves, pushes the tag, and clears the VM id one patch later, so a main whose quiesce a
/// re-target back cleared mid-save shows the tag beside the VM id of the VM that is about to
/// be removed. Its snapshot is the only copy of its state until the node wakes it.
pub fn runs_after_snapshot(main: &Pod) -> bool {
    pods::is_vm_live(main) && pods::lifecycle(main).state == Some(LifecycleState::Ready)
}

/// The scheduler's message for `MigrateNoCapacity`, which must not name the target node: any
/// mention of it is replaced. The scheduler normally counts nodes rather than naming them, so
/// this is a guard for messages from plugins that do.
pub fn redact_target(message: &str, target: &str) -> String {
    if target.is_empty() {
        return message.to_string();
    }
    message.replace(target, "<target node>")
}
