//! The rules more than one step of the walk uses, so none of them lives inside one step:
//!
//! * [`checkpoint`]: the `spec.agent.fromCheckpoint` gate of a fresh main (issue 38), for
//!   step 11 and the checkpoint watch;
//! * [`create`]: the create protocol (§7) and restore intent (§8), for steps 6, 8, 9 and
//!   11–13;
//! * [`triage`]: the rebuild budget (§6), for steps 7 and 11–13;
//! * [`stash`]: the delete stash (step 2.2) and the stash-then-delete of pods leaving the
//!   spec, for steps 2, 6B, 12 and 13;
//! * [`status`]: the status of §9 and its patch rule, for steps 7, 9, 11 and 14, the
//!   executor's status writes and the controller's memory;
//! * [`unsuspend`]: step 10's unsuspend bookkeeping (10.1–10.5), which step 7 runs too.
//!
//! Like the steps' own rules, they observe and decide; nothing here talks to the API server
//! or the registry.

pub mod checkpoint;
pub mod create;
pub mod stash;
pub mod status;
#[cfg(test)]
mod status_tests;
pub mod triage;
pub mod unsuspend;
