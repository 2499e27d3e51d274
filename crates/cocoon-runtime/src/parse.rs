//! Pure parsing of the `cocoon` CLI's JSON outputs (§3.2): VM and snapshot records and lists,
//! with the CLI's "nothing here" texts, and the `reconcile-stale-create` answer.
//!
//! Every function takes the raw stdout and a context label for error messages.

use serde::Deserialize;

use super::error::{Result, RuntimeError};
use super::types::{SnapshotRecord, StaleCreateOutcome, VmRecord};

fn decode_error(context: &str, err: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Other(format!("{context}: decode JSON: {err}"))
}

/// One VM record (`vm inspect`, `vm clone/run --output json`).
pub fn parse_vm(context: &str, out: &[u8]) -> Result<VmRecord> {
    serde_json::from_slice(out).map_err(|e| decode_error(context, e))
}

/// `vm list -o json`: a JSON array (v0.5.x prints `[]` when empty); `No VMs found.` (v0.3.8)
/// or empty output is an empty list; entries with an empty id are skipped.
///
/// One record that does not decode never fails the whole list: it is kept as a salvaged
/// record ([`salvage_vm`]: its id, name, hypervisor, state and PID where they have the right
/// type) with a warning, so the VM stays visible to the agent instead of vanishing.
pub fn parse_vm_list(context: &str, out: &[u8]) -> Result<Vec<VmRecord>> {
    let text = String::from_utf8_lossy(out);
    let text = text.trim();
    if text.is_empty() || text == "No VMs found." {
        return Ok(Vec::new());
    }
    let entries: Option<Vec<serde_json::Value>> =
        serde_json::from_str(text).map_err(|e| decode_error(context, e))?;
    Ok(entries
        .unwrap_or_default()
        .into_iter()
        .map(|entry| match VmRecord::deserialize(&entry) {
            Ok(vm) => vm,
            Err(e) => {
                let vm = salvage_vm(&entry);
                tracing::warn!(
                    context,
                    vm = %vm.id,
                    error = %e,
                    "VM record does not fully decode; keeping its id, name and state"
                );
                vm
            }
        })
        .filter(|vm| !vm.id.is_empty())
        .collect())
}

/// The fields the agent cannot do without, read one by one from a record that does not
/// decode as a whole: `id`, `hypervisor`, `state`, `pid` and `config.name`, each only when it
/// has the expected JSON type (anything else reads as empty / 0).
pub fn salvage_vm(entry: &serde_json::Value) -> VmRecord {
    let text = |v: Option<&serde_json::Value>| {
        v.and_then(serde_json::Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let mut vm = VmRecord {
        id: text(entry.get("id")),
        hypervisor: text(entry.get("hypervisor")),
        state: text(entry.get("state")),
        pid: entry
            .get("pid")
            .and_then(serde_json::Value::as_i64)
            .unwrap_or_default(),
        ..VmRecord::default()
    };
    vm.config.name = text(entry.get("config").and_then(|c| c.get("name")));
    vm
}

/// One snapshot record (`snapshot inspect`).
pub fn parse_snapshot(context: &str, out: &[u8]) -> Result<SnapshotRecord> {
    serde_json::from_slice(out).map_err(|e| decode_error(context, e))
}

/// `snapshot list -o json`: a JSON array, or the text `No snapshots found.` (or nothing).
pub fn parse_snapshot_list(context: &str, out: &[u8]) -> Result<Vec<SnapshotRecord>> {
    let text = String::from_utf8_lossy(out);
    let text = text.trim();
    if text.is_empty() || text == "No snapshots found." {
        return Ok(Vec::new());
    }
    let list: Option<Vec<SnapshotRecord>> =
        serde_json::from_str(text).map_err(|e| decode_error(context, e))?;
    Ok(list.unwrap_or_default())
}

/// `vm reconcile-stale-create <id> -o json` → `{"id": "...", "outcome": "..."}`; an empty or
/// unknown outcome is an error.
pub fn parse_stale_create(context: &str, out: &[u8]) -> Result<StaleCreateOutcome> {
    #[derive(Deserialize)]
    struct Answer {
        #[serde(default)]
        outcome: String,
    }
    let answer: Answer = serde_json::from_slice(out).map_err(|e| decode_error(context, e))?;
    StaleCreateOutcome::from_wire(&answer.outcome).ok_or_else(|| {
        RuntimeError::Other(format!(
            "{context}: unexpected outcome {:?}",
            answer.outcome
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_list_texts() {
        assert!(
            parse_vm_list("c", b"No VMs found.\n")
                .expect("ok")
                .is_empty()
        );
        assert!(parse_vm_list("c", b"").expect("ok").is_empty());
        assert!(parse_vm_list("c", b"null").expect("ok").is_empty());
        let vms = parse_vm_list(
            "c",
            br#"[{"id":"a","config":{"name":"va"}},{"id":"","config":{"name":"skipped"}},{"id":"b"}]"#,
        )
        .expect("ok");
        assert_eq!(
            vms.iter().map(|v| v.id.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        let err = parse_vm_list("cocoon vm list", b"garbage").expect_err("bad json");
        assert!(
            err.to_string().starts_with("cocoon vm list: decode JSON"),
            "{err}"
        );
    }

    #[test]
    fn snapshot_list_texts() {
        assert!(
            parse_snapshot_list("c", b"No snapshots found.")
                .expect("ok")
                .is_empty()
        );
        let list = parse_snapshot_list("c", br#"[{"id":"s","name":"vk-a"}]"#).expect("ok");
        assert_eq!(list[0].name, "vk-a");
    }

    #[test]
    fn stale_create_answers() {
        assert_eq!(
            parse_stale_create("c", br#"{"id":"x","outcome":"busy"}"#).expect("ok"),
            StaleCreateOutcome::Busy
        );
        assert!(parse_stale_create("c", br#"{"id":"x","outcome":""}"#).is_err());
        assert!(parse_stale_create("c", br#"{"id":"x"}"#).is_err());
    }

    #[test]
    fn indented_inspect_output() {
        let vm = parse_vm(
            "c",
            b"{\n  \"id\": \"a\",\n  \"state\": \"running\",\n  \"pid\": 7\n}\n",
        )
        .expect("ok");
        assert!(vm.is_running());
        assert_eq!(vm.pid, 7);
    }
}
