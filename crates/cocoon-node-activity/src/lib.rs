//! What the node agent counts as a VM's activity and when it tells the API (issue 39,
//! `cocoon_api::contract::idle`). Pure rules, table-tested here; the node agent's shell
//! (`cocoon_node::pods::activity`) gathers the facts (the runtime's VM stats, the kubelet
//! API's open sessions, the clocks) and applies the answers (pod annotation patches).
//!
//! * [`rules`]: a VM is active when it has an open exec / log-follow session, moved bytes
//!   through its network, or used more CPU than the threshold since the previous sample; the
//!   [`Tracker`] keeps one previous sample per pod and answers what to publish, at most once
//!   per publish interval and only after activity since the last write.
//! * [`gates`]: the open sessions per pod ([`Sessions`]) and the exec wake gate
//!   ([`WakeGate`]: one `wake-request` write per pod per [`WAKE_REQUEST_GAP`]).
//! * [`config`]: `VK_ACTIVITY_INTERVAL`, `VK_ACTIVITY_CPU_THRESHOLD`, `VK_EXEC_WAKE_WAIT`.

pub mod config;
pub mod gates;
pub mod rules;

pub use config::{ActivityConfig, ActivityConfigError};
pub use gates::{SessionGuard, Sessions, WAKE_REQUEST_GAP, WakeGate};
pub use rules::{Sample, Tracker, activity, sample_every};
