//! Seed step 6 — suspend (`spec.suspend == true`), including the release policy's seat release.
//!
//! Every managed VM of the owned pods goes into the reclaim record (and its suspended list) before
//! any hibernate annotation is written; then every owned pod is asked to hibernate, and the set
//! stays Suspending (polling every `suspend_poll`) until each managed VM reports `hibernated` at
//! this generation and its `:hibernate` manifest is in the registry (the probes are a
//! [`Read::Probe`](crate::cocoonset::steps::Read::Probe) the executor answers). Phase-failed pods
//! are skipped; a `lifecycle-state=failed` alone is not. Then Suspended. Under `hibernatePolicy:
//! release` the gate is followed by the seat release: stash the VM names and the main's node, flag
//! each pod keep-snapshot-on-delete (best effort), delete it. The wait is bounded by the
//! `suspending-since` deadline: past it the set reports Failed with `SuspendTimedOut`, a failing
//! probe counting against it too. The planner is [`plan`](fn@plan), the pure rules are [`rules`].

mod plan;
#[cfg(test)]
mod plan_tests;
pub mod rules;
#[cfg(test)]
mod rules_tests;

pub use self::plan::{GATE, STEP, plan};
