//! Table tests of the create plans (`node.md` §6.1 steps 4–16, §6.2): the route per pod, the
//! bring-up per mode, and what runs when a bring-up step fails.

use cocoon_api::contract::{Backend, Mode, Os, VmSpec};

use super::create::{
    BringUpPlan, Facts, RestoreDecision, Route, bring_up, restore, restore_decision, route,
};
use crate::pods::exec;
use crate::pods::plan::StepFailed;
use crate::pods::plan::testkit::{self, Script};
use crate::pods::plan::wake::Source;
use crate::pods::rules::Evidence;
use cocoon_runtime::SnapshotRecord;

fn spec(mode: Option<Mode>) -> VmSpec {
    VmSpec {
        vm_name: "vk-a".into(),
        image: "img:1".into(),
        mode,
        managed: true,
        ..VmSpec::default()
    }
}

fn facts(spec: &VmSpec) -> Facts<'_> {
    Facts {
        spec,
        mode: "",
        clone_dir: None,
        pre_id: "",
        pre_ip: "",
        adoptable: false,
    }
}

fn fresh(f: &Facts<'_>) -> Vec<String> {
    match bring_up(f, false) {
        Ok(BringUpPlan::Fresh(steps)) => testkit::steps(&steps),
        other => panic!("not a fresh bring-up: {other:?}"),
    }
}

const CLOCK: &str = "start the boot clock";
const DROP_FORK: &str = "remove snapshot fork-vk-a | warn";
const OK: &str = "count create ok \"\"";

#[test]
fn create_route_table() {
    let managed = spec(None);
    let unmanaged = VmSpec {
        managed: false,
        ..spec(None)
    };
    // `Ok(Some(steps))`: these steps; `Ok(None)`: the restore decision, then a bring-up.
    type Want = Result<Option<Vec<&'static str>>, StepFailed>;
    let rows: Vec<(&str, Facts<'_>, Want)> = vec![
        (
            "unmanaged with a pre-assigned id and IP: a synthetic record, never a runtime call",
            Facts {
                pre_id: "ext-1",
                pre_ip: "10.0.0.9",
                ..facts(&unmanaged)
            },
            Ok(Some(vec![
                "track synthetic VM ext-1 at 10.0.0.9",
                "start the probe",
                "publish ready (status first)",
                OK,
            ])),
        ),
        (
            "unmanaged without its pre-assigned IP: refused",
            Facts {
                pre_id: "ext-1",
                ..facts(&unmanaged)
            },
            Err(StepFailed::refused(
                "CreateBringUpFailed",
                "unmanaged vm vk-a missing pre-assigned IP/VMID",
            )),
        ),
        (
            "a VM of its name is indexed: adopted, no runtime call",
            Facts {
                adoptable: true,
                ..facts(&managed)
            },
            Ok(Some(vec![
                "adopt the indexed VM: runtime annotations, track",
                "start the probe",
                "publish ready (status first)",
                "count create ok \"adopted\"",
            ])),
        ),
        (
            "otherwise the restore decision, then a bring-up",
            facts(&managed),
            Ok(None),
        ),
    ];
    for (situation, f, want) in rows {
        let got = match route(&f) {
            Route::Steps(steps) => Ok(Some(testkit::steps(&steps))),
            Route::BringUp => Ok(None),
            Route::Refused(e) => Err(e),
        };
        let want = want.map(|o| o.map(|v| v.into_iter().map(String::from).collect()));
        assert_eq!(got, want, "{situation}");
    }
}

#[test]
fn create_bring_up_table() {
    let clone = spec(None);
    let run = VmSpec {
        force_pull: true,
        ..spec(Some(Mode::Run))
    };
    let fork = VmSpec {
        fork_from: "vk-main".into(),
        ..spec(None)
    };
    let rows: Vec<(&str, Facts<'_>, Vec<&str>)> = vec![
        (
            "clone (the default): clone base, backend, base image, clone; post-clone follows",
            facts(&clone),
            vec![
                CLOCK,
                DROP_FORK,
                "ensure clone base img:1 (pulled from img:1 if absent) | fail CreateBringUpFailed: ensure snapshot \
                 img:1",
                "assert the backend of img:1 | fail CreateBringUpFailed: clone vm vk-a from img:1",
                "ensure the snapshot's base image | fail CreateBringUpFailed",
                "clone from img:1 (--pull if the snapshot has an image) | fail \
                 CreateBringUpFailed: clone vm vk-a from img:1 then collect clone bases if one \
                 was imported",
                "collect clone bases if one was imported",
                "observe boot ",
                "finish bring-up, then Clone",
                OK,
            ],
        ),
        (
            "run: the run image (forced pull), then `vm run`; ready at once",
            Facts {
                mode: "run",
                ..facts(&run)
            },
            vec![
                CLOCK,
                DROP_FORK,
                "ensure run image img:1 (forced) | fail CreateBringUpFailed: ensure image img:1",
                "run the VM | fail CreateBringUpFailed: run vm vk-a",
                "observe boot run",
                "finish bring-up, then None",
                OK,
            ],
        ),
        (
            "fork-from: one fork baseline per lineage, cloned without --pull",
            facts(&fork),
            vec![
                CLOCK,
                DROP_FORK,
                "ensure fork-vk-main | fail CreateBringUpFailed",
                "clone from fork-vk-main | fail CreateBringUpFailed: clone vm vk-a from \
                 fork-vk-main",
                "observe boot ",
                "finish bring-up, then Clone",
                OK,
            ],
        ),
        (
            "clone-from-dir: cloned from the staged directory, always --pull",
            Facts {
                clone_dir: Some("/staging/vk-a"),
                ..facts(&clone)
            },
            vec![
                CLOCK,
                DROP_FORK,
                "clone from dir /staging/vk-a --pull | fail CreateBringUpFailed: clone vm vk-a \
                 from dir /staging/vk-a",
                "observe boot ",
                "finish bring-up, then Clone",
                OK,
            ],
        ),
    ];
    for (situation, f, want) in rows {
        assert_eq!(fresh(&f), want, "{situation}");
    }
    assert_eq!(
        bring_up(&facts(&clone), true),
        Ok(BringUpPlan::Restore),
        "restoring: the wake source is read before the steps, the fork baseline is kept"
    );
    assert_eq!(
        bring_up(
            &Facts {
                clone_dir: Some("staging"),
                ..facts(&clone)
            },
            false
        ),
        Err(StepFailed::refused(
            "CreateBringUpFailed",
            "annotation vm.cocoonstack.io/clone-from-dir must be an absolute path, got \"staging\""
        )),
        "an invalid clone-from-dir fails before any step"
    );
    assert_eq!(
        bring_up(
            &Facts {
                clone_dir: Some("/staging/vk-a"),
                ..facts(&fork)
            },
            false
        ),
        Err(StepFailed::refused(
            "CreateBringUpFailed",
            "annotation vm.cocoonstack.io/clone-from-dir is incompatible with fork-from \"vk-main\""
        )),
        "clone-from-dir with fork-from fails before any step"
    );
}

#[test]
fn create_restore_table() {
    let windows = VmSpec {
        backend: Some(Backend::CloudHypervisor),
        os: Some(Os::Windows),
        ..spec(Some(Mode::Run))
    };
    let warm = Source::Local(Box::new(SnapshotRecord {
        name: "vk-a".into(),
        ..SnapshotRecord::default()
    }));
    let cold = Source::Pull {
        reference: "sha256:d".into(),
        drop_stale: false,
    };
    let rows: [(&str, &Source, Vec<&str>); 2] = [
        (
            "a restore from the local copy, even with mode=run; one fresh NIC for CH+Windows",
            &warm,
            vec![
                "ensure the snapshot's base image | fail CreateBringUpFailed",
                "clone from vk-a (--pull if the snapshot has an image) --nics 1 | fail \
                 CreateBringUpFailed: clone vm vk-a from vk-a",
                "observe boot clone",
                "finish bring-up, then Restore",
                OK,
            ],
        ),
        (
            "a restore pulled from the registry",
            &cold,
            vec![
                "pull vk-a@sha256:d into vk-a-hibernate-import | fail CreateBringUpFailed: pull \
                 hibernation snapshot vk-a",
                "inspect snapshot vk-a-hibernate-import | fail CreateBringUpFailed: inspect \
                 imported snapshot vk-a-hibernate-import | undo: remove snapshot \
                 vk-a-hibernate-import in the background",
                "ensure the snapshot's base image | fail CreateBringUpFailed",
                "clone from vk-a-hibernate-import (--pull if the snapshot has an image) --nics 1 \
                 | fail CreateBringUpFailed: clone vm vk-a from vk-a-hibernate-import",
                "remove snapshot vk-a-hibernate-import in the background",
                "observe boot clone",
                "finish bring-up, then Restore",
                OK,
            ],
        ),
    ];
    for (situation, src, want) in rows {
        let f = Facts {
            mode: "run",
            ..facts(&windows)
        };
        assert_eq!(testkit::steps(&restore(&f, src)), want, "{situation}");
    }
}

#[tokio::test]
async fn create_execution_table() {
    let clone = spec(None);
    let f = facts(&clone);
    let Ok(BringUpPlan::Fresh(steps)) = bring_up(&f, false) else {
        panic!("not a fresh bring-up");
    };
    /// The situation, what fails, the calls made and the outcome.
    type Row = (
        &'static str,
        Script,
        Vec<&'static str>,
        Result<(), StepFailed>,
    );
    let rows: Vec<Row> = vec![
        (
            "the clone fails: clone bases are collected anyway",
            Script::default().fail("clone", 1),
            vec![
                CLOCK,
                "remove snapshot fork-vk-a",
                "ensure clone base img:1 (pulled from img:1 if absent)",
                "assert the backend of img:1",
                "ensure the snapshot's base image",
                "clone from img:1 (--pull if the snapshot has an image) ✗",
                "undo: collect clone bases if one was imported",
            ],
            Err(StepFailed::refused(
                "CreateBringUpFailed",
                "clone vm vk-a from img:1: boom",
            )),
        ),
        (
            "the backend assertion fails: no clone, no collection",
            Script::default().fail("assert", 1),
            vec![
                CLOCK,
                "remove snapshot fork-vk-a",
                "ensure clone base img:1 (pulled from img:1 if absent)",
                "assert the backend of img:1 ✗",
            ],
            Err(StepFailed::refused(
                "CreateBringUpFailed",
                "clone vm vk-a from img:1: boom",
            )),
        ),
        (
            "the fork baseline cannot be dropped: logged, the bring-up goes on",
            Script::default().fail("remove snapshot fork", 1),
            vec![
                CLOCK,
                "remove snapshot fork-vk-a ✗",
                "ensure clone base img:1 (pulled from img:1 if absent)",
                "assert the backend of img:1",
                "ensure the snapshot's base image",
                "clone from img:1 (--pull if the snapshot has an image)",
                "collect clone bases if one was imported",
                "observe boot ",
                "finish bring-up, then Clone",
                OK,
            ],
            Ok(()),
        ),
    ];
    for (situation, script, calls, outcome) in rows {
        let res = exec::run(&script, &steps).await;
        assert_eq!(script.calls(), calls, "{situation}");
        assert_eq!(res, outcome, "{situation}");
    }
}

/// A restore decision as what it does, in order.
fn decided(d: RestoreDecision) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(v) = d.count {
        out.push(format!("count evidence {v}"));
    }
    if d.derive {
        out.push("keep the derived marker in memory".into());
    }
    if let Some((reason, message)) = d.warning {
        out.push(format!("warning {reason}: {message}"));
    }
    out.push(match d.restoring {
        Ok(true) => "restore".into(),
        Ok(false) => "fresh boot".into(),
        Err(f) => format!("fail {}: {}", f.reason.unwrap_or("-"), f.message),
    });
    out
}

#[test]
fn restore_decision_table() {
    let clone = spec(None);
    let run = spec(Some(Mode::Run));
    let fork = VmSpec {
        fork_from: "vk-main".into(),
        ..spec(None)
    };
    let found = |img: &str| {
        Ok(Evidence::Found {
            recorded_image: img.into(),
        })
    };
    const UNAVAILABLE: &str =
        "hibernate evidence for vk-a: get hibernate manifest: 503 (refusing fresh boot)";
    const EXISTS: &str = "warning HibernateSnapshotExists: restoring vm vk-a from its hibernate \
                          snapshot instead of fresh-booting";
    const IMAGE_CONFLICT: &str = "fail HibernateEvidenceFailed: hibernate snapshot of vm vk-a \
                                  came from image \"img:0\" but the pod requests \"img:1\"; \
                                  delete the hibernate tag to discard the hibernated state";
    type Row<'a> = (
        &'a str,
        &'a VmSpec,
        bool,
        Option<&'a str>,
        Result<Evidence, String>,
        Vec<&'a str>,
    );
    let rows: Vec<Row<'_>> = vec![
        (
            "the evidence read failed: fail closed, announced first",
            &clone,
            false,
            None,
            Err(UNAVAILABLE.into()),
            vec![
                "count evidence unavailable",
                "warning HibernateEvidenceUnavailable: hibernate evidence for vk-a: get \
                 hibernate manifest: 503 (refusing fresh boot)",
                "fail HibernateEvidenceFailed: hibernate evidence for vk-a: get hibernate \
                 manifest: 503 (refusing fresh boot)",
            ],
        ),
        (
            "an explicit marker fails closed on a failed read too",
            &clone,
            true,
            None,
            Err(UNAVAILABLE.into()),
            vec![
                "count evidence unavailable",
                "warning HibernateEvidenceUnavailable: hibernate evidence for vk-a: get \
                 hibernate manifest: 503 (refusing fresh boot)",
                "fail HibernateEvidenceFailed: hibernate evidence for vk-a: get hibernate \
                 manifest: 503 (refusing fresh boot)",
            ],
        ),
        (
            "no evidence: fresh boot, nothing counted",
            &clone,
            false,
            None,
            Ok(Evidence::None),
            vec!["fresh boot"],
        ),
        (
            "evidence: a derived restore, counted, kept in memory, announced",
            &clone,
            false,
            None,
            found("img:1"),
            vec![
                "count evidence restored",
                "keep the derived marker in memory",
                EXISTS,
                "restore",
            ],
        ),
        (
            "evidence of a run pod: restored even with mode=run",
            &run,
            false,
            None,
            found(""),
            vec![
                "count evidence restored",
                "keep the derived marker in memory",
                EXISTS,
                "restore",
            ],
        ),
        (
            "evidence, but fork-from: a source conflict",
            &fork,
            false,
            None,
            found("img:1"),
            vec![
                "count evidence source_conflict",
                "fail HibernateEvidenceFailed: vm vk-a has a hibernate snapshot but the pod \
                 requests an explicit clone source; delete the hibernate tag to discard the \
                 hibernated state",
            ],
        ),
        (
            "evidence, but clone-from-dir: a source conflict",
            &clone,
            false,
            Some("/srv/snap"),
            found(""),
            vec![
                "count evidence source_conflict",
                "fail HibernateEvidenceFailed: vm vk-a has a hibernate snapshot but the pod \
                 requests an explicit clone source; delete the hibernate tag to discard the \
                 hibernated state",
            ],
        ),
        (
            "evidence recorded from another image: an image conflict",
            &clone,
            false,
            None,
            found("img:0"),
            vec!["count evidence image_conflict", IMAGE_CONFLICT],
        ),
        (
            "explicit marker with evidence: a restore, neither counted nor announced",
            &clone,
            true,
            None,
            found("img:1"),
            vec!["restore"],
        ),
        (
            "explicit marker without evidence: still a restore (the wake fails loudly)",
            &clone,
            true,
            None,
            Ok(Evidence::None),
            vec!["restore"],
        ),
        (
            "explicit marker: the image identity check still applies",
            &clone,
            true,
            None,
            found("img:0"),
            vec!["count evidence image_conflict", IMAGE_CONFLICT],
        ),
        (
            "explicit marker: fork-from is no source conflict (restore wins)",
            &fork,
            true,
            None,
            found("img:1"),
            vec!["restore"],
        ),
    ];
    for (rule, spec, explicit, clone_dir, evidence, want) in rows {
        let got = decided(restore_decision(spec, explicit, clone_dir, evidence));
        assert_eq!(got, want, "{rule}");
    }
}
