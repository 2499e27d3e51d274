//! Table tests of the delete plan (`node.md` §7): each row names the situation and the
//! ordered steps; then what runs when the remove fails.

use cocoon_api::contract::SnapshotPolicy;
use cocoon_api::naming::Role;

use cocoon_api::contract::events::node as ev;

use super::delete::{Facts, Gate, StopReport, StopResult, Vm, gate, plan, stop_grace, stop_report};
use crate::pods::exec;
use crate::pods::plan::StepFailed;
use crate::pods::plan::testkit::{self, Script};

const LIVE: Vm<'static> = Vm {
    id: "id-1",
    name: "vk-a",
    synthetic: false,
};

fn live() -> Facts<'static> {
    Facts {
        managed: true,
        vm: Some(LIVE),
        keep: false,
        vm_name: "",
        may_drop: false,
        policy: SnapshotPolicy::Always,
        role: Role::Main,
        registry: true,
        image: "img:1",
        grace_secs: 30,
    }
}

fn hibernated() -> Facts<'static> {
    Facts {
        vm: None,
        vm_name: "vk-a",
        may_drop: true,
        ..live()
    }
}

const ROUTINE: &str = "routine snapshot: save vk-a from id-1, push vk-a:latest (base image img:1)";
const STOP: &str = "stop id-1 within 30s";
const REMOVE: &str = "remove id-1 | fail -: remove vm id-1";
const DROP: &str = "drop local snapshots vk-a and fork-vk-a (10 s each, awaited)";
const FINISH: &str = "forget the pod, status Succeeded";
const OK: &str = "count delete ok \"\"";

#[test]
fn delete_plan_table() {
    let rows: Vec<(&str, Facts<'static>, Vec<&str>)> = vec![
        (
            "a live VM, policy always: routine snapshot, remove, local snapshots, forget",
            live(),
            vec![ROUTINE, STOP, REMOVE, DROP, FINISH, OK],
        ),
        (
            "keep-snapshot-on-delete: the local snapshot stays as the warm-wake cache",
            Facts {
                keep: true,
                ..live()
            },
            vec![ROUTINE, STOP, REMOVE, FINISH, OK],
        ),
        (
            "main-only policy on a sub-agent: no routine snapshot",
            Facts {
                policy: SnapshotPolicy::MainOnly,
                role: Role::SubAgent,
                ..live()
            },
            vec![STOP, REMOVE, DROP, FINISH, OK],
        ),
        (
            "main-only policy on the main",
            Facts {
                policy: SnapshotPolicy::MainOnly,
                ..live()
            },
            vec![ROUTINE, STOP, REMOVE, DROP, FINISH, OK],
        ),
        (
            "policy never",
            Facts {
                policy: SnapshotPolicy::Never,
                ..live()
            },
            vec![STOP, REMOVE, DROP, FINISH, OK],
        ),
        (
            "no registry: nothing to push to, so no routine snapshot",
            Facts {
                registry: false,
                ..live()
            },
            vec![STOP, REMOVE, DROP, FINISH, OK],
        ),
        (
            "grace period 0: no graceful stop, the remove at once",
            Facts {
                grace_secs: 0,
                ..live()
            },
            vec![ROUTINE, REMOVE, DROP, FINISH, OK],
        ),
        (
            "the stop gets the pod's grace period, after the routine snapshot",
            Facts {
                grace_secs: 7,
                ..live()
            },
            vec![ROUTINE, "stop id-1 within 7s", REMOVE, DROP, FINISH, OK],
        ),
        (
            "an unmanaged pod: its VM is never removed, the pod only forgotten",
            Facts {
                managed: false,
                ..live()
            },
            vec![FINISH],
        ),
        (
            "an unmanaged pod's synthetic record is never acted on",
            Facts {
                vm: Some(Vm {
                    synthetic: true,
                    ..LIVE
                }),
                ..live()
            },
            vec![FINISH],
        ),
        (
            "a hibernated pod (no VM): only its local snapshots go",
            hibernated(),
            vec![
                "drop local snapshots vk-a and fork-vk-a",
                "forget the pod",
                "count delete skipped \"no_vm\"",
            ],
        ),
        (
            "a hibernated pod's seat release (keep): the local snapshot stays",
            Facts {
                keep: true,
                ..hibernated()
            },
            vec!["forget the pod", "count delete skipped \"seat_release\""],
        ),
        (
            "no VM, and the VM name is not provably this pod's: its snapshots stay",
            Facts {
                may_drop: false,
                ..hibernated()
            },
            vec![
                "warn: not dropping the local snapshots of VM vk-a, which is not this pod's",
                "forget the pod",
                "count delete skipped \"no_vm\"",
            ],
        ),
        (
            "a pod never created (no VM name): nothing to drop",
            Facts {
                vm_name: "",
                ..hibernated()
            },
            vec!["forget the pod", "count delete skipped \"no_vm\""],
        ),
    ];
    for (situation, facts, want) in rows {
        assert_eq!(testkit::steps(&plan(&facts)), want, "{situation}");
    }
}

#[tokio::test]
async fn a_failed_remove_fails_the_delete_with_the_vm_still_tracked() {
    let script = Script::default().fail("remove", 1);
    let res = exec::run(&script, &plan(&live())).await;
    assert_eq!(
        res,
        Err(StepFailed {
            reason: None,
            message: "remove vm id-1: boom".into(),
        })
    );
    // Nothing after the remove: no snapshot cleanup, the pod is not forgotten.
    assert_eq!(
        script.calls(),
        [
            "routine snapshot: save vk-a from id-1, push vk-a:latest (base image img:1)",
            "stop id-1 within 30s",
            "remove id-1 ✗",
        ]
    );
}

#[tokio::test]
async fn a_failed_stop_never_blocks_the_remove() {
    let script = Script::default().fail("stop", 1);
    let res = exec::run(&script, &plan(&live())).await;
    assert_eq!(res, Ok(()));
    let calls = script.calls();
    assert_eq!(calls[1], "stop id-1 within 30s ✗");
    assert_eq!(calls[2], "remove id-1");
}

#[test]
fn stop_grace_table() {
    // (situation, metadata.deletionGracePeriodSeconds, spec.terminationGracePeriodSeconds, secs)
    let rows: &[(&str, Option<i64>, Option<i64>, u64)] = &[
        ("neither: the kubelet default", None, None, 30),
        ("the pod spec's", None, Some(7), 7),
        ("the delete request's wins", Some(3), Some(60), 3),
        ("a delete with grace 0: no stop", Some(0), Some(60), 0),
        ("negative reads as 0", Some(-5), None, 0),
        ("capped", None, Some(86_400), 600),
    ];
    for (situation, deletion, termination, want) in rows {
        assert_eq!(stop_grace(*deletion, *termination), *want, "{situation}");
    }
}

#[test]
fn stop_report_table() {
    let warn = |reason: &'static str, text: &str| StopReport {
        warn: true,
        log: text.to_owned(),
        event: Some((reason, text.to_owned())),
    };
    let rows: Vec<(StopResult, StopReport)> = vec![
        (
            StopResult::Stopped,
            StopReport {
                warn: false,
                log: "vm id-1 stopped within its grace period of 7s".into(),
                event: None,
            },
        ),
        (
            StopResult::Gone,
            StopReport {
                warn: false,
                log: "vm id-1 already gone before its stop".into(),
                event: None,
            },
        ),
        (
            StopResult::TimedOut,
            warn(
                ev::VM_STOP_TIMEOUT,
                "vm id-1 did not stop within 7s; removing it by force",
            ),
        ),
        (
            StopResult::Failed("exit status 1 (output: Error: stop: boom)".into()),
            warn(
                ev::VM_STOP_FAILED,
                "stop vm id-1: exit status 1 (output: Error: stop: boom); removing it by force",
            ),
        ),
        (
            StopResult::Unsupported("cocoon vm stop id-1: no vm stop".into()),
            StopReport {
                warn: true,
                log: "cocoon vm stop id-1: no vm stop; removing vm id-1 by force".into(),
                event: None,
            },
        ),
    ];
    for (result, want) in rows {
        assert_eq!(stop_report("id-1", 7, &result), want, "{result:?}");
    }
}

#[test]
fn delete_gate_table() {
    let rows = [
        (
            "nothing in the way → plan the delete",
            false,
            false,
            Gate::Pass,
        ),
        (
            "an eviction is deleting the pod → done, it owns the status",
            true,
            false,
            Gate::Evicting,
        ),
        (
            "an eviction wins over a resumed claim",
            true,
            true,
            Gate::Evicting,
        ),
        (
            "a resumed operation holds the pod → in flight",
            false,
            true,
            Gate::InFlight,
        ),
    ];
    for (rule, evicting, resumed, want) in rows {
        assert_eq!(gate(evicting, resumed), want, "{rule}");
    }
}
