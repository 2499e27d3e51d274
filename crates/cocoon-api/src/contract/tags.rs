//! Registry tags of `contract.md` §2.5 and §9.
//! One repository per VM (`<base>/<vm>`); these are the only two tags cocoon pushes.

/// Hibernation snapshot of a VM; pushed on every hibernate regardless of `snapshotPolicy`.
pub const HIBERNATE: &str = "hibernate";
/// Routine snapshot pushed on pod delete, and the default tag of clone-mode image refs.
pub const LATEST: &str = "latest";
