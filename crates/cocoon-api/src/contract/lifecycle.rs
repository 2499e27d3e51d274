//! The node agent's lifecycle annotations of `contract.md` §6: state, observed generation and
//! message, always written together in one patch, plus the operator's completion gates.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::annotations as ann;
use super::parse::{get_i64, get_str, non_empty, truncate_utf8};
use super::patch::{AnnotationCodec, AnnotationDelta, diff_annotations};

/// Byte bound of a lifecycle message written on failure (`node.md` §12.3).
pub const MESSAGE_MAX_BYTES: usize = 4096;

/// `vm.cocoonstack.io/lifecycle-state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LifecycleState {
    /// The VM is being brought up.
    Creating,
    /// The VM is up (terminal).
    Ready,
    /// A hibernate is in progress.
    Hibernating,
    /// The VM is hibernated (terminal).
    Hibernated,
    /// Bring-up or an operation failed (terminal).
    Failed,
}

impl LifecycleState {
    /// Every state.
    pub const ALL: &'static [LifecycleState] = &[
        LifecycleState::Creating,
        LifecycleState::Ready,
        LifecycleState::Hibernating,
        LifecycleState::Hibernated,
        LifecycleState::Failed,
    ];

    /// The lower-case wire spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            LifecycleState::Creating => "creating",
            LifecycleState::Ready => "ready",
            LifecycleState::Hibernating => "hibernating",
            LifecycleState::Hibernated => "hibernated",
            LifecycleState::Failed => "failed",
        }
    }

    /// Exact parse; unknown (including other casing) is `None`.
    pub fn from_wire(value: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|s| s.as_str() == value)
    }

    /// `ready`, `hibernated` and `failed` are terminal.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            LifecycleState::Ready | LifecycleState::Hibernated | LifecycleState::Failed
        )
    }
}

impl fmt::Display for LifecycleState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The three lifecycle annotations as one unit.
///
/// Atomicity contract: [`delta`](AnnotationCodec::delta) returns either nothing or **all three**
/// keys, so state, observed generation and message always land in the same patch. An empty
/// message removes the key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lifecycle {
    /// State; `None` when missing or unknown.
    pub state: Option<LifecycleState>,
    /// The CocoonSet generation the node observed; missing or unparsable reads as 0.
    pub observed_generation: i64,
    /// Free text; empty = absent.
    pub message: String,
}

impl Lifecycle {
    /// A lifecycle record as the node agent writes it.
    pub fn new(
        state: LifecycleState,
        observed_generation: i64,
        message: impl Into<String>,
    ) -> Self {
        Lifecycle {
            state: Some(state),
            observed_generation,
            message: message.into(),
        }
    }

    /// `failed` with the error text truncated to [`MESSAGE_MAX_BYTES`].
    pub fn failed(observed_generation: i64, error: &str) -> Self {
        Self::new(
            LifecycleState::Failed,
            observed_generation,
            truncate_utf8(error, MESSAGE_MAX_BYTES),
        )
    }

    /// Hibernate completion gate: `state == hibernated && observed >= stamp`.
    pub fn is_hibernated_at(&self, stamp: i64) -> bool {
        self.state == Some(LifecycleState::Hibernated) && self.observed_generation >= stamp
    }

    /// Reclaim / wake gate: `state == ready && observed >= generation`.
    pub fn is_ready_at(&self, generation: i64) -> bool {
        self.state == Some(LifecycleState::Ready) && self.observed_generation >= generation
    }

    /// True when the node reported `failed`.
    pub fn is_failed(&self) -> bool {
        self.state == Some(LifecycleState::Failed)
    }
}

impl AnnotationCodec for Lifecycle {
    fn from_annotations(a: &BTreeMap<String, String>) -> Self {
        Lifecycle {
            state: LifecycleState::from_wire(get_str(a, ann::LIFECYCLE_STATE)),
            observed_generation: get_i64(a, ann::LIFECYCLE_OBSERVED_GENERATION),
            message: get_str(a, ann::LIFECYCLE_STATE_MESSAGE).to_owned(),
        }
    }

    fn desired(&self) -> AnnotationDelta {
        AnnotationDelta::from([
            (
                ann::LIFECYCLE_STATE.to_owned(),
                self.state.map(|s| s.as_str().to_owned()),
            ),
            (
                ann::LIFECYCLE_OBSERVED_GENERATION.to_owned(),
                Some(self.observed_generation.to_string()),
            ),
            (
                ann::LIFECYCLE_STATE_MESSAGE.to_owned(),
                non_empty(&self.message),
            ),
        ])
    }

    /// All three keys when any of them differs, otherwise nothing.
    fn delta(&self, current: &BTreeMap<String, String>) -> AnnotationDelta {
        let desired = self.desired();
        if diff_annotations(current, &desired).is_empty() {
            AnnotationDelta::new()
        } else {
            desired
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn states_round_trip() {
        for s in LifecycleState::ALL {
            assert_eq!(LifecycleState::from_wire(s.as_str()), Some(*s));
            assert_eq!(
                serde_json::to_value(s).ok(),
                Some(serde_json::Value::String(s.as_str().to_owned()))
            );
        }
        for bad in ["Ready", "READY", "", "running"] {
            assert_eq!(LifecycleState::from_wire(bad), None, "{bad:?}");
        }
        let terminal: Vec<_> = LifecycleState::ALL
            .iter()
            .filter(|s| s.is_terminal())
            .map(|s| s.as_str())
            .collect();
        assert_eq!(terminal, ["ready", "hibernated", "failed"]);
    }

    #[test]
    fn round_trip() {
        let l = Lifecycle::new(LifecycleState::Failed, 4, "boom");
        let a = l.to_annotations();
        assert_eq!(
            a,
            map(&[
                (ann::LIFECYCLE_STATE, "failed"),
                (ann::LIFECYCLE_OBSERVED_GENERATION, "4"),
                (ann::LIFECYCLE_STATE_MESSAGE, "boom"),
            ])
        );
        assert_eq!(Lifecycle::from_annotations(&a), l);
        assert!(l.delta(&a).is_empty());
        assert_eq!(l.merge_patch(&a), None);
    }

    #[test]
    fn writer_always_emits_all_three() {
        let current = map(&[
            (ann::LIFECYCLE_STATE, "creating"),
            (ann::LIFECYCLE_OBSERVED_GENERATION, "4"),
            (ann::LIFECYCLE_STATE_MESSAGE, "pulling"),
        ]);
        // Only the state and message change, yet all three keys are in the patch, and the
        // empty message is removed.
        let d = Lifecycle::new(LifecycleState::Ready, 4, "").delta(&current);
        assert_eq!(
            d,
            AnnotationDelta::from([
                (ann::LIFECYCLE_STATE.to_owned(), Some("ready".to_owned())),
                (
                    ann::LIFECYCLE_OBSERVED_GENERATION.to_owned(),
                    Some("4".to_owned())
                ),
                (ann::LIFECYCLE_STATE_MESSAGE.to_owned(), None),
            ])
        );
    }

    #[test]
    fn malformed_values_read_as_defaults() {
        let l = Lifecycle::from_annotations(&map(&[
            (ann::LIFECYCLE_STATE, "Hibernated"),
            (ann::LIFECYCLE_OBSERVED_GENERATION, "seven"),
        ]));
        assert_eq!(l, Lifecycle::default());
        assert!(!l.is_hibernated_at(0));
    }

    #[test]
    fn gates() {
        let cases = [
            // (state, observed, stamp, hibernated_at, ready_at)
            (LifecycleState::Hibernated, 5, 5, true, false),
            (LifecycleState::Hibernated, 6, 5, true, false),
            (LifecycleState::Hibernated, 4, 5, false, false),
            (LifecycleState::Ready, 5, 5, false, true),
            (LifecycleState::Ready, 4, 5, false, false),
            (LifecycleState::Hibernating, 9, 5, false, false),
        ];
        for (state, observed, stamp, hib, ready) in cases {
            let l = Lifecycle::new(state, observed, "");
            assert_eq!(l.is_hibernated_at(stamp), hib, "{l:?} @ {stamp}");
            assert_eq!(l.is_ready_at(stamp), ready, "{l:?} @ {stamp}");
        }
    }

    #[test]
    fn failed_truncates_the_message() {
        let l = Lifecycle::failed(2, &"x".repeat(5000));
        assert_eq!(l.message.len(), MESSAGE_MAX_BYTES);
        assert!(l.is_failed());
    }
}
