//! Table tests of the delete plan (`node.md` §7): each row names the situation and the
//! ordered steps; then what runs when the remove fails.

use cocoon_api::contract::SnapshotPolicy;
use cocoon_api::naming::Role;

use super::delete::{Facts, Gate, Vm, gate, plan};
use crate::pods::plan::testkit::{self, Script};
use crate::pods::plan::{StepFailed, exec};

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
            vec![ROUTINE, REMOVE, DROP, FINISH, OK],
        ),
        (
            "keep-snapshot-on-delete: the local snapshot stays as the warm-wake cache",
            Facts {
                keep: true,
                ..live()
            },
            vec![ROUTINE, REMOVE, FINISH, OK],
        ),
        (
            "main-only policy on a sub-agent: no routine snapshot",
            Facts {
                policy: SnapshotPolicy::MainOnly,
                role: Role::SubAgent,
                ..live()
            },
            vec![REMOVE, DROP, FINISH, OK],
        ),
        (
            "main-only policy on the main",
            Facts {
                policy: SnapshotPolicy::MainOnly,
                ..live()
            },
            vec![ROUTINE, REMOVE, DROP, FINISH, OK],
        ),
        (
            "policy never",
            Facts {
                policy: SnapshotPolicy::Never,
                ..live()
            },
            vec![REMOVE, DROP, FINISH, OK],
        ),
        (
            "no registry: nothing to push to, so no routine snapshot",
            Facts {
                registry: false,
                ..live()
            },
            vec![REMOVE, DROP, FINISH, OK],
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
            "remove id-1 ✗",
        ]
    );
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
