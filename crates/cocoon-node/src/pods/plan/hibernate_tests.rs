//! Table tests of the hibernate plan (`node.md` §8.2): each row names the situation and the
//! ordered steps, or the calls the executor makes (failures marked `✗`) and the outcome.

use cocoon_api::contract::{Backend, Os, VmSpec};

use super::hibernate::{Facts, plan};
use crate::pods::exec;
use crate::pods::plan::testkit::{self, Script};
use crate::pods::plan::{AfterFailedRemove, StepFailed};

fn spec(backend: Option<Backend>, os: Option<Os>) -> VmSpec {
    VmSpec {
        vm_name: "vk-a".into(),
        image: "img:1".into(),
        backend,
        os,
        managed: true,
        ..VmSpec::default()
    }
}

fn linux() -> VmSpec {
    spec(None, None)
}

fn ch_windows() -> VmSpec {
    spec(Some(Backend::CloudHypervisor), Some(Os::Windows))
}

fn facts(spec: &VmSpec) -> Facts<'_> {
    Facts {
        spec,
        vm_id: "id-1",
        synthetic: false,
        registry: true,
    }
}

#[test]
fn hibernate_plan_table() {
    let linux = linux();
    let windows = ch_windows();
    let fc_windows = spec(Some(Backend::Firecracker), Some(Os::Windows));
    let rows: [(&str, Facts<'_>, &[&str]); 4] = [
        (
            "a live VM, registry configured: save, push, clear the VM id, remove; the status \
             before `hibernated`",
            facts(&linux),
            &[
                "lifecycle hibernating",
                "save snapshot vk-a from id-1 | fail HibernateSnapshotFailed: snapshot save vk-a \
                 [count snapshot failed]",
                "push vk-a:hibernate | fail HibernatePushFailed: push hibernation snapshot vk-a \
                 [count push failed] | undo: delete vk-a:hibernate while the VM is alive",
                "clear id/ip | warn | undo: re-apply id/ip",
                "remove id-1 | fail HibernateRemoveFailed: remove vm id-1 [count remove failed] \
                 unless the VM is gone",
                "count remove ok",
                "clear id/ip again if that failed | warn",
                "untrack the VM",
                "publish status",
                "lifecycle hibernated",
                "event Hibernated: snapshot pushed to registry",
            ],
        ),
        (
            "a live CH+Windows VM: DHCP release and NIC drop before the save, rolled back by \
             any later failure",
            facts(&windows),
            &[
                "lifecycle hibernating",
                "release dhcp in id-1",
                "drop NIC of id-1 | fail HibernateNetResizeFailed: drop NIC pre-hibernate vk-a \
                 [count netresize failed] then renew dhcp in id-1 | undo: NIC rollback of id-1",
                "save snapshot vk-a from id-1 | fail HibernateSnapshotFailed: snapshot save vk-a \
                 [count snapshot failed]",
                "push vk-a:hibernate | fail HibernatePushFailed: push hibernation snapshot vk-a \
                 [count push failed] | undo: delete vk-a:hibernate while the VM is alive",
                "clear id/ip | warn | undo: re-apply id/ip",
                "remove id-1 | fail HibernateRemoveFailed: remove vm id-1 [count remove failed] \
                 unless the VM is gone",
                "count remove ok",
                "clear id/ip again if that failed | warn",
                "untrack the VM",
                "publish status",
                "lifecycle hibernated",
                "event Hibernated: snapshot pushed to registry",
            ],
        ),
        (
            "a Windows guest on Firecracker keeps its NIC (only cloud-hypervisor drops it)",
            facts(&fc_windows),
            &[
                "lifecycle hibernating",
                "save snapshot vk-a from id-1 | fail HibernateSnapshotFailed: snapshot save vk-a \
                 [count snapshot failed]",
                "push vk-a:hibernate | fail HibernatePushFailed: push hibernation snapshot vk-a \
                 [count push failed] | undo: delete vk-a:hibernate while the VM is alive",
                "clear id/ip | warn | undo: re-apply id/ip",
                "remove id-1 | fail HibernateRemoveFailed: remove vm id-1 [count remove failed] \
                 unless the VM is gone",
                "count remove ok",
                "clear id/ip again if that failed | warn",
                "untrack the VM",
                "publish status",
                "lifecycle hibernated",
                "event Hibernated: snapshot pushed to registry",
            ],
        ),
        (
            "no registry: saved locally, nothing pushed, so nothing to delete on a failed remove",
            Facts {
                registry: false,
                ..facts(&linux)
            },
            &[
                "lifecycle hibernating",
                "save snapshot vk-a from id-1 | fail HibernateSnapshotFailed: snapshot save vk-a \
                 [count snapshot failed]",
                "clear id/ip | warn | undo: re-apply id/ip",
                "remove id-1 | fail HibernateRemoveFailed: remove vm id-1 [count remove failed] \
                 unless the VM is gone",
                "count remove ok",
                "clear id/ip again if that failed | warn",
                "untrack the VM",
                "publish status",
                "lifecycle hibernated",
                "event Hibernated: snapshot saved locally (no registry pusher configured)",
            ],
        ),
    ];
    for (situation, f, want) in rows {
        let got = plan(&f).unwrap_or_else(|e| panic!("{situation}: refused: {e}"));
        assert_eq!(testkit::steps(&got), want, "{situation}");
    }
}

#[test]
fn hibernate_refusals_come_before_any_step() {
    let linux = linux();
    let macos = spec(None, Some(Os::Macos));
    let rows: [(&str, Facts<'_>, &str, &str); 2] = [
        (
            "an unmanaged pod's synthetic VM: no runtime verb ever runs against it",
            Facts {
                synthetic: true,
                ..facts(&linux)
            },
            "TenantIsolationRefused",
            "vm vk-a is unmanaged; it cannot be hibernated",
        ),
        (
            "a macOS guest cannot hibernate",
            facts(&macos),
            "HibernateUnsupported",
            "macOS guest vk-a does not support hibernate",
        ),
    ];
    for (situation, f, reason, message) in rows {
        assert_eq!(
            plan(&f),
            Err(StepFailed::refused(reason, message)),
            "{situation}"
        );
    }
}

/// What the executor does with the plan when `script` fails the row's steps.
async fn executed(spec: &VmSpec, registry: bool, script: Script) -> (Vec<String>, String) {
    let f = Facts {
        registry,
        ..facts(spec)
    };
    let steps = plan(&f).unwrap_or_else(|e| panic!("refused: {e}"));
    let outcome = match exec::run(&script, &steps).await {
        Ok(()) => "hibernated".to_owned(),
        Err(e) => format!("failed {}: {}", e.reason.unwrap_or("-"), e.message),
    };
    (script.calls(), outcome)
}

/// A row of the execution table: the situation, the VM spec, whether a registry is
/// configured, what fails, the calls made and the outcome.
type Row<'a> = (&'a str, &'a VmSpec, bool, Script, &'a [&'a str], &'a str);

#[tokio::test]
async fn hibernate_execution_table() {
    let linux = linux();
    let windows = ch_windows();
    let rows: Vec<Row<'_>> = vec![
        (
            "a live VM hibernates",
            &linux,
            true,
            Script::default(),
            &[
                "lifecycle hibernating",
                "save snapshot vk-a from id-1",
                "push vk-a:hibernate",
                "clear id/ip",
                "remove id-1",
                "count remove ok",
                "untrack the VM",
                "publish status",
                "lifecycle hibernated",
                "event Hibernated: snapshot pushed to registry",
            ],
            "hibernated",
        ),
        (
            "the NIC drop fails: renew in the guest, no snapshot taken",
            &windows,
            true,
            Script::default().fail("drop NIC", 1),
            &[
                "lifecycle hibernating",
                "release dhcp in id-1",
                "drop NIC of id-1 ✗",
                "count netresize failed",
                "undo: renew dhcp in id-1",
            ],
            "failed HibernateNetResizeFailed: drop NIC pre-hibernate vk-a: boom",
        ),
        (
            "the save fails: NIC rollback; the VM id and IP are untouched",
            &windows,
            true,
            Script::default().fail("save", 1),
            &[
                "lifecycle hibernating",
                "release dhcp in id-1",
                "drop NIC of id-1",
                "save snapshot vk-a from id-1 ✗",
                "count snapshot failed",
                "undo: NIC rollback of id-1",
            ],
            "failed HibernateSnapshotFailed: snapshot save vk-a: boom",
        ),
        (
            "the push fails: NIC rollback; no tag was published, none is deleted",
            &windows,
            true,
            Script::default().fail("push", 1),
            &[
                "lifecycle hibernating",
                "release dhcp in id-1",
                "drop NIC of id-1",
                "save snapshot vk-a from id-1",
                "push vk-a:hibernate ✗",
                "count push failed",
                "undo: NIC rollback of id-1",
            ],
            "failed HibernatePushFailed: push hibernation snapshot vk-a: boom",
        ),
        (
            "the push fails on Linux: nothing to undo",
            &linux,
            true,
            Script::default().fail("push", 1),
            &[
                "lifecycle hibernating",
                "save snapshot vk-a from id-1",
                "push vk-a:hibernate ✗",
                "count push failed",
            ],
            "failed HibernatePushFailed: push hibernation snapshot vk-a: boom",
        ),
        (
            "the annotation clear fails: the remove goes on, the clear is retried after it",
            &linux,
            true,
            Script::default().fail("clear id/ip", 1),
            &[
                "lifecycle hibernating",
                "save snapshot vk-a from id-1",
                "push vk-a:hibernate",
                "clear id/ip ✗",
                "remove id-1",
                "count remove ok",
                "clear id/ip",
                "untrack the VM",
                "publish status",
                "lifecycle hibernated",
                "event Hibernated: snapshot pushed to registry",
            ],
            "hibernated",
        ),
        (
            "the remove fails, the VM still runs: delete the tag, NIC rollback, re-apply the \
             VM id and IP (in that order)",
            &windows,
            true,
            Script::default().fail("remove", 1),
            &[
                "lifecycle hibernating",
                "release dhcp in id-1",
                "drop NIC of id-1",
                "save snapshot vk-a from id-1",
                "push vk-a:hibernate",
                "clear id/ip",
                "remove id-1 ✗",
                "inspect id-1: still there",
                "count remove failed",
                "undo: delete vk-a:hibernate while the VM is alive",
                "undo: NIC rollback of id-1",
                "undo: re-apply id/ip",
            ],
            "failed HibernateRemoveFailed: remove vm id-1: boom",
        ),
        (
            "the remove fails and the VM cannot be inspected: the tag may be the only copy, so \
             it stays",
            &linux,
            true,
            Script::default()
                .fail("remove", 1)
                .after_remove(AfterFailedRemove::Unknown),
            &[
                "lifecycle hibernating",
                "save snapshot vk-a from id-1",
                "push vk-a:hibernate",
                "clear id/ip",
                "remove id-1 ✗",
                "inspect id-1: unknown",
                "count remove failed",
                "undo: keep vk-a:hibernate",
                "undo: re-apply id/ip",
            ],
            "failed HibernateRemoveFailed: remove vm id-1: boom",
        ),
        (
            "the remove fails but the VM is gone (it took effect): the hibernate stands",
            &linux,
            true,
            Script::default()
                .fail("remove", 1)
                .after_remove(AfterFailedRemove::Gone),
            &[
                "lifecycle hibernating",
                "save snapshot vk-a from id-1",
                "push vk-a:hibernate",
                "clear id/ip",
                "remove id-1 ✗",
                "inspect id-1: gone",
                "count remove ok",
                "untrack the VM",
                "publish status",
                "lifecycle hibernated",
                "event Hibernated: snapshot pushed to registry",
            ],
            "hibernated",
        ),
        (
            "the remove fails without a registry: nothing to delete, the VM id comes back",
            &linux,
            false,
            Script::default().fail("remove", 1),
            &[
                "lifecycle hibernating",
                "save snapshot vk-a from id-1",
                "clear id/ip",
                "remove id-1 ✗",
                "inspect id-1: still there",
                "count remove failed",
                "undo: re-apply id/ip",
            ],
            "failed HibernateRemoveFailed: remove vm id-1: boom",
        ),
    ];
    for (situation, spec, registry, script, calls, outcome) in rows {
        let (got_calls, got_outcome) = executed(spec, registry, script).await;
        assert_eq!(got_calls, calls, "{situation}");
        assert_eq!(got_outcome, outcome, "{situation}");
    }
}
