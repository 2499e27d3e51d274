//! Step 13 — toolboxes. This module holds 13.1, the validation of the toolbox list as a
//! whole before anything changes; the creates, triage and removals of 13.2–13.3 are still
//! applied by the walk in `super::super`.
//!
//! An invalid list is not retried: it becomes the `Ready=False` condition of step 14 (reason
//! [`INVALID_TOOLBOXES`], the message naming `spec.toolboxes`) and a Warning Event, and the
//! set waits for a spec change.

use std::collections::BTreeSet;

use cocoon_api::crd::set::ToolboxSpec;
use cocoon_api::naming;

/// The condition reason and Event reason of an invalid `spec.toolboxes`.
pub const INVALID_TOOLBOXES: &str = "InvalidToolboxes";

/// A spec the controller cannot act on: which field, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct InvalidSpec {
    /// The field path, e.g. `spec.toolboxes`.
    pub field: &'static str,
    /// The condition and Event reason.
    pub reason: &'static str,
    pub message: String,
}

impl InvalidSpec {
    /// The condition and Event message: the field, then what is wrong with it.
    pub fn condition_message(&self) -> String {
        format!("{}: {}", self.field, self.message)
    }
}

fn invalid(message: String) -> InvalidSpec {
    InvalidSpec {
        field: "spec.toolboxes",
        reason: INVALID_TOOLBOXES,
        message,
    }
}

/// 13.1: a duplicate name, or a name that parses as an integer (it would collide with an
/// agent slot's pod name).
pub fn validate(toolboxes: &[ToolboxSpec]) -> Result<(), InvalidSpec> {
    let mut seen = BTreeSet::new();
    for t in toolboxes {
        if !seen.insert(t.name.as_str()) {
            return Err(invalid(format!(
                "duplicate toolbox name {:?} in spec",
                t.name
            )));
        }
        if naming::parse_int_slot_name(&t.name) {
            return Err(invalid(format!(
                "toolbox name {:?} must not be an integer: collides with agent slot pod naming",
                t.name
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tb(n: &str) -> ToolboxSpec {
        ToolboxSpec {
            name: n.into(),
            ..ToolboxSpec::default()
        }
    }

    #[test]
    fn validate_the_whole_toolbox_list_first() {
        let cases: &[(&[&str], Option<&str>)] = &[
            (&["a", "b"], None),
            (&[], None),
            (&["a", "a"], Some("duplicate toolbox name \"a\" in spec")),
            (
                &["a", "7"],
                Some(
                    "toolbox name \"7\" must not be an integer: collides with agent slot pod naming",
                ),
            ),
        ];
        for (names, want) in cases {
            let list: Vec<ToolboxSpec> = names.iter().map(|n| tb(n)).collect();
            let got = validate(&list).err();
            assert_eq!(got.as_ref().map(|e| e.message.as_str()), *want, "{names:?}");
            if let Some(e) = got {
                assert_eq!((e.field, e.reason), ("spec.toolboxes", INVALID_TOOLBOXES));
                assert!(e.condition_message().starts_with("spec.toolboxes: "));
            }
        }
    }
}
