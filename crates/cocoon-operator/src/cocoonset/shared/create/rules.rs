//! Pure rules of the create protocol and the snapshot image rule (`cocoonset.md` §7) and of
//! restore intent (§8), which every step that creates a pod follows (steps 6, 8, 9, 11, 12
//! and 13); [`super::protocol`] turns them into the step's reads and writes.

use std::collections::BTreeSet;

use cocoon_api::crd::hibernation::{CocoonHibernation, HibernationPhase};
use cocoon_api::naming::Role;

/// The answer of the `:hibernate` manifest read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TagRead {
    /// Static toolboxes have no VM and skip the registry.
    Skipped,
    Absent,
    /// Present, with the recorded base image (empty when none was recorded).
    Present {
        base_image: String,
    },
}

/// Facts about the VM about to be created.
#[derive(Debug, Clone, PartialEq)]
pub struct CreateFacts<'a> {
    pub role: Role,
    pub image: &'a str,
    pub tag: TagRead,
    /// The VM is in the record's `vms`.
    pub recorded: bool,
    /// The VM is in the record's `restore`.
    pub owed_restore: bool,
    /// A Hibernated/Waking CocoonHibernation names the pod.
    pub cr_restorable: bool,
    /// Step 6A.1 (and the migration/wake recreates): restore whenever the tag exists.
    pub unconditional_intent: bool,
}

/// What to do before and at the create.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CreateDecision {
    /// Delete `<vm>:hibernate` first (an error fails the pass, nothing is created).
    pub drop_tag: bool,
    /// Remove the VM from the record (`vms`, `restore`, `suspended`).
    pub forget: bool,
    /// Set `restore-from-hibernate=true` on the new pod.
    pub restore: bool,
}

/// §7 steps 2–4: what the create does, decided on the facts of the VM.
pub fn decide(f: &CreateFacts<'_>) -> CreateDecision {
    let base_image = match &f.tag {
        TagRead::Skipped | TagRead::Absent => return CreateDecision::default(),
        TagRead::Present { base_image } => base_image,
    };
    let fresh_after_drop = CreateDecision {
        drop_tag: true,
        forget: true,
        restore: false,
    };
    // Snapshot image rule: the node agent refuses a pod over a tag from another image.
    if !base_image.is_empty() && base_image != f.image {
        return fresh_after_drop;
    }
    let intent = f.unconditional_intent || f.owed_restore || f.cr_restorable;
    if f.role == Role::SubAgent && !intent {
        if f.recorded {
            // Sub-agent pre-create drop: a fork-from pod is refused while the tag exists.
            return fresh_after_drop;
        }
        // Unspecified case (an unrecorded sub-agent VM with a tag): restore from it. The node
        // agent accepts a restore-marked pod, and the snapshot's state is not thrown away.
        return CreateDecision {
            restore: true,
            ..CreateDecision::default()
        };
    }
    CreateDecision {
        restore: intent,
        ..CreateDecision::default()
    }
}

/// 8.6.2 and 9.1.2–9.1.3: a recreate has no snapshot to restore (no tag, or the image rule
/// dropped it); the hint is cleared and the normal flow boots the main fresh.
pub fn wake_boots_fresh(tag: &TagRead, decision: &CreateDecision) -> bool {
    !matches!(tag, TagRead::Present { .. }) || decision.drop_tag
}

/// §8: the pods a Hibernated or Waking CocoonHibernation names.
pub fn cr_restorable(crs: &[CocoonHibernation]) -> BTreeSet<String> {
    crs.iter()
        .filter(|h| {
            matches!(
                h.status.as_ref().and_then(|s| s.phase),
                Some(HibernationPhase::Hibernated | HibernationPhase::Waking)
            )
        })
        .map(|h| h.spec.pod_ref.name.clone())
        .collect()
}
