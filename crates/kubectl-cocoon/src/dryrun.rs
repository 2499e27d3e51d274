//! What a dry run reports, in kubectl's words: `cocoonset.cocoonset.cocoonstack.io/demo patched
//! (server dry run)`, or the object (as the server returned it, or as the client computed it by
//! applying the merge patch) with `-o`. Sets and hibernations print the same shape.

use serde::Serialize;
use serde_json::Value;

use crate::cli::{DryRun, OutputFormat, WaitFlags};
use crate::error::CliError;
use crate::output::{format_value, resource_name};

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

/// One dry-run write's outcome: the object as the server returned it (or as the client
/// computed it) and what the write did. The writes of several targets run concurrently; their
/// outcomes are printed together afterwards, in the targets' order ([`render`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Shown {
    pub object: Value,
    pub action: Action,
}

impl Shown {
    /// The outcome `action` on `obj`.
    pub fn of<T: Serialize>(obj: &T, action: Action) -> Result<Shown, CliError> {
        let object = serde_json::to_value(obj).map_err(|e| CliError::Api(e.to_string()))?;
        Ok(Shown { object, action })
    }

    /// `--dry-run=client` of a merge patch: the current object with the patch applied locally.
    pub fn client_patch<T: Serialize>(
        current: &T,
        patch: &Value,
        unchanged: bool,
    ) -> Result<Shown, CliError> {
        let mut object = serde_json::to_value(current).map_err(|e| CliError::Api(e.to_string()))?;
        merge_patch(&mut object, patch);
        let action = if unchanged {
            Action::Unchanged
        } else {
            Action::Patched
        };
        Ok(Shown { object, action })
    }
}

/// What a dry run prints for its outcomes, in order: with `-o`, the object, or a kubectl
/// `List` of them when there are several (as `kubectl get a b -o json` does); without, one
/// kubectl line each. Nothing for a real write.
pub fn render(
    shown: &[Shown],
    output: Option<&OutputFormat>,
    dry_run: DryRun,
) -> Result<String, CliError> {
    if dry_run == DryRun::None || shown.is_empty() {
        return Ok(String::new());
    }
    match output {
        Some(fmt) if shown.len() == 1 => format_value(&shown[0].object, fmt),
        Some(fmt) => {
            let items: Vec<Value> = shown.iter().map(|s| s.object.clone()).collect();
            format_value(&list(items), fmt)
        }
        None => Ok(shown
            .iter()
            .filter_map(|s| action_line(&s.object, s.action, dry_run))
            .map(|l| format!("{l}\n"))
            .collect()),
    }
}

/// A kubectl `List` of `items`.
pub fn list(items: Vec<Value>) -> Value {
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items, "metadata": {"resourceVersion": ""}})
}

/// Prints the outcomes of a dry run ([`render`]) on stdout.
pub fn print_all(shown: &[Shown], flags: &WaitFlags) -> Result<(), CliError> {
    let text = render(shown, flags.output.as_ref(), flags.dry_run)?;
    print!("{text}");
    Ok(())
}

/// Reports a single dry-run write: the object with `-o`, else kubectl's line. Real writes
/// print nothing here.
pub fn report<T: Serialize>(obj: &T, action: Action, flags: &WaitFlags) -> Result<(), CliError> {
    print_all(&[Shown::of(obj, action)?], flags)
}

/// `--dry-run=client` of a merge patch on a single target, reported as [`report`] does.
pub fn report_client_patch<T: Serialize>(
    current: &T,
    patch: &Value,
    unchanged: bool,
    flags: &WaitFlags,
) -> Result<(), CliError> {
    print_all(&[Shown::client_patch(current, patch, unchanged)?], flags)
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

    #[test]
    fn several_outcomes_print_in_order_as_lines_or_one_list() {
        let set = |name: &str| json!({"apiVersion": "cocoonset.cocoonstack.io/v1", "kind": "CocoonSet", "metadata": {"name": name}});
        let shown = [
            Shown {
                object: set("demo"),
                action: Action::Patched,
            },
            Shown {
                object: set("demo-two"),
                action: Action::Unchanged,
            },
        ];
        assert_eq!(
            render(&shown, None, DryRun::Server).expect("lines"),
            "cocoonset.cocoonset.cocoonstack.io/demo patched (server dry run)\n\
             cocoonset.cocoonset.cocoonstack.io/demo-two unchanged (server dry run)\n"
        );
        assert_eq!(
            render(&shown, Some(&OutputFormat::Name), DryRun::Client).expect("names"),
            "cocoonset.cocoonset.cocoonstack.io/demo\ncocoonset.cocoonset.cocoonstack.io/demo-two\n"
        );
        let listed: Value = serde_json::from_str(
            &render(&shown, Some(&OutputFormat::Json), DryRun::Server).expect("json"),
        )
        .expect("one JSON document");
        assert_eq!(listed["kind"], "List");
        assert_eq!(listed["items"][0]["metadata"]["name"], "demo");
        assert_eq!(listed["items"][1]["metadata"]["name"], "demo-two");
        let one: Value = serde_json::from_str(
            &render(&shown[..1], Some(&OutputFormat::Json), DryRun::Server).expect("json"),
        )
        .expect("one object");
        assert_eq!(one["kind"], "CocoonSet");
        assert_eq!(render(&shown, None, DryRun::None).expect("none"), "");
    }
}
