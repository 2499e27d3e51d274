//! What a dry run reports, in kubectl's words: `cocoonset.cocoonset.cocoonstack.io/demo patched
//! (server dry run)`, or the object (as the server returned it, or as the client computed it by
//! applying the merge patch) with `-o`. Sets and hibernations print the same shape.

use serde::Serialize;
use serde_json::Value;

use crate::cli::{DryRun, WaitFlags};
use crate::error::CliError;
use crate::output::{print_object, resource_name};

/// What the write did, or would have done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Created,
    Patched,
    /// Already in the requested state: nothing to send.
    Unchanged,
}

impl Action {
    fn word(self) -> &'static str {
        match self {
            Action::Created => "created",
            Action::Patched => "patched",
            Action::Unchanged => "unchanged",
        }
    }
}

/// kubectl's line for a dry-run write; `None` when the write was real.
pub fn action_line(obj: &Value, action: Action, dry_run: DryRun) -> Option<String> {
    let mode = match dry_run {
        DryRun::None => return None,
        DryRun::Client => "dry run",
        DryRun::Server => "server dry run",
    };
    Some(format!("{} {} ({mode})", resource_name(obj), action.word()))
}

/// RFC 7386 JSON merge patch, as the API server applies `Patch::Merge`.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    let t = target.as_object_mut().expect("made an object");
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// Reports a dry-run write: the object with `-o`, else kubectl's line. Real writes print
/// nothing here.
pub fn report<T: Serialize>(obj: &T, action: Action, flags: &WaitFlags) -> Result<(), CliError> {
    let v = serde_json::to_value(obj).map_err(|e| CliError::Api(e.to_string()))?;
    if flags.dry_run == DryRun::None {
        return Ok(());
    }
    match &flags.output {
        Some(fmt) => print_object(&v, fmt),
        None => {
            if let Some(line) = action_line(&v, action, flags.dry_run) {
                println!("{line}");
            }
            Ok(())
        }
    }
}

/// `--dry-run=client` of a merge patch: the current object with the patch applied locally.
pub fn report_client_patch<T: Serialize>(
    current: &T,
    patch: &Value,
    unchanged: bool,
    flags: &WaitFlags,
) -> Result<(), CliError> {
    let mut v = serde_json::to_value(current).map_err(|e| CliError::Api(e.to_string()))?;
    merge_patch(&mut v, patch);
    let action = if unchanged {
        Action::Unchanged
    } else {
        Action::Patched
    };
    report(&v, action, flags)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_follows_rfc_7386() {
        let mut v = json!({"a": 1, "b": {"c": 2, "d": 3}, "e": [1]});
        merge_patch(
            &mut v,
            &json!({"a": null, "b": {"c": 4}, "e": [2], "f": "x"}),
        );
        assert_eq!(v, json!({"b": {"c": 4, "d": 3}, "e": [2], "f": "x"}));
    }

    #[test]
    fn lines_read_like_kubectl() {
        let set = json!({"apiVersion": "cocoonset.cocoonstack.io/v1", "kind": "CocoonSet", "metadata": {"name": "demo"}});
        assert_eq!(
            action_line(&set, Action::Patched, DryRun::Server).as_deref(),
            Some("cocoonset.cocoonset.cocoonstack.io/demo patched (server dry run)")
        );
        let ch = json!({"apiVersion": "cocoonset.cocoonstack.io/v1", "kind": "CocoonHibernation", "metadata": {"name": "demo-0"}});
        assert_eq!(
            action_line(&ch, Action::Created, DryRun::Client).as_deref(),
            Some("cocoonhibernation.cocoonset.cocoonstack.io/demo-0 created (dry run)")
        );
        assert_eq!(action_line(&ch, Action::Created, DryRun::None), None);
    }
}
