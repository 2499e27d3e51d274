//! docs/checkpoints.md §"What the node agent must check", as tables: the request on a pod, the
//! CocoonCheckpoint the agent read → take it, settled, or refused (TenantIsolationRefused).

use cocoon_api::contract::checkpoint::{
    CHECKPOINT_TAG, CheckpointRequest, REQUEST_MAX_BYTES, checkpoint_artifact,
};
use cocoon_api::crd::checkpoint::{CheckpointPhase, Source};
use cocoon_api::naming::vm_name_for_pod;

use super::checkpoint::*;

const NS: &str = "team-a";
const UID: &str = "6f1c2a70-0b7e-4c9e-9d2a-2b1f0c3d4e5f";
const NODE: &str = "vk-node-1";

struct Case {
    pod_name: &'static str,
    pod_vm: Option<String>,
    controller: Option<&'static str>,
    req: CheckpointRequest,
    cr: Option<Cr>,
}

struct Cr {
    uid: String,
    deleting: bool,
    phase: Option<CheckpointPhase>,
    source: Option<Source<'static>>,
    node: String,
    pod_name: String,
    vm_name: String,
    repository: String,
    tag: String,
}

fn repo(name: &str, uid: &str) -> String {
    checkpoint_artifact(NS, name, uid)
        .expect("derives")
        .repository
}

/// The set `demo`'s main `demo-0` on this node, checkpoint `snap` Pending, request as the
/// operator writes it.
fn good() -> Case {
    let vm = vm_name_for_pod(NS, "demo-0");
    Case {
        pod_name: "demo-0",
        pod_vm: Some(vm.clone()),
        controller: Some("demo"),
        req: CheckpointRequest {
            name: "snap".into(),
            uid: UID.into(),
            vm_name: vm.clone(),
            repository: repo("snap", UID),
            tag: CHECKPOINT_TAG.into(),
        },
        cr: Some(Cr {
            uid: UID.into(),
            deleting: false,
            phase: Some(CheckpointPhase::Pending),
            source: Some(Source::CocoonSet("demo")),
            node: NODE.into(),
            pod_name: "demo-0".into(),
            vm_name: vm,
            repository: repo("snap", UID),
            tag: CHECKPOINT_TAG.into(),
        }),
    }
}

fn verdict(c: &Case) -> Verdict {
    let pod = PodFacts {
        namespace: NS,
        name: c.pod_name,
        vm_name: c.pod_vm.as_deref(),
        controller_set: c.controller,
        node: NODE,
    };
    let cr = c.cr.as_ref().map(facts);
    decide(&pod, &c.req, cr.as_ref())
}

fn with(f: impl FnOnce(&mut Case)) -> Case {
    let mut c = good();
    f(&mut c);
    c
}

fn cr(c: &mut Case) -> &mut Cr {
    c.cr.as_mut().expect("a CR")
}

#[test]
fn a_pending_checkpoint_of_this_pod_is_taken_into_the_derived_artifact() {
    let want = Verdict::Take {
        vm: vm_name_for_pod(NS, "demo-0"),
        artifact: checkpoint_artifact(NS, "snap", UID).expect("derives"),
        restart: false,
    };
    assert_eq!(verdict(&good()), want);
    // podRef names the pod itself: any pod of the namespace, no set needed.
    let by_pod = with(|c| {
        c.controller = None;
        cr(c).source = Some(Source::Pod("demo-0"));
    });
    assert_eq!(verdict(&by_pod), want);
}

#[test]
fn after_a_restart_saving_or_pushing_starts_over_and_final_phases_are_settled() {
    for (phase, want_restart) in [
        (CheckpointPhase::Saving, true),
        (CheckpointPhase::Pushing, true),
    ] {
        let c = with(|c| cr(c).phase = Some(phase));
        assert!(
            matches!(verdict(&c), Verdict::Take { restart, .. } if restart == want_restart),
            "{phase}"
        );
    }
    for phase in [CheckpointPhase::Ready, CheckpointPhase::Failed] {
        let c = with(|c| cr(c).phase = Some(phase));
        assert_eq!(verdict(&c), Verdict::Settled, "{phase}");
    }
}

#[test]
fn every_failed_check_refuses_before_acting() {
    let other_uid = "00000000-0000-0000-0000-000000000000";
    let rows: Vec<(&str, Case, &str)> = vec![
        (
            "a request naming another namespace's checkpoint: none of that name here",
            with(|c| c.cr = None),
            "no CocoonCheckpoint",
        ),
        (
            "a request naming another checkpoint's UID",
            with(|c| c.req.uid = other_uid.into()),
            "is not the checkpoint's",
        ),
        (
            "a UID mismatch with a consistent forged repository",
            with(|c| {
                c.req.uid = other_uid.into();
                c.req.repository = repo("snap", other_uid);
            }),
            "is not the checkpoint's",
        ),
        (
            "a repository that is not the derived one (another tenant's checkpoint)",
            with(|c| {
                c.req.repository = checkpoint_artifact("team-b", "snap", UID)
                    .expect("d")
                    .repository
            }),
            "is not the derived",
        ),
        (
            "a VM repository as the target",
            with(|c| c.req.repository = vm_name_for_pod("team-b", "victim-0")),
            "is not the derived",
        ),
        (
            "another tag",
            with(|c| c.req.tag = "hibernate".into()),
            "is not the derived",
        ),
        (
            "a status repository that is not the derived one",
            with(|c| cr(c).repository = "ckpt-elsewhere-000000000000".into()),
            "is not the derived",
        ),
        (
            "another pod of the same namespace carries the request (podRef names demo-0)",
            with(|c| {
                c.pod_name = "decoy";
                c.pod_vm = Some(vm_name_for_pod(NS, "decoy"));
                c.controller = None;
                cr(c).source = Some(Source::Pod("demo-0"));
            }),
            "not the checkpoint's source",
        ),
        (
            "a pod of the set that is not slot 0",
            with(|c| {
                c.pod_name = "demo-1";
                c.pod_vm = Some(vm_name_for_pod(NS, "demo-1"));
            }),
            "not the checkpoint's source",
        ),
        (
            "a pod named like slot 0 but controlled by another set",
            with(|c| c.controller = Some("other")),
            "not the checkpoint's source",
        ),
        (
            "a pod named like slot 0 without a controlling set",
            with(|c| c.controller = None),
            "not the checkpoint's source",
        ),
        (
            "the status names another pod",
            with(|c| cr(c).pod_name = "demo-1".into()),
            "not the checkpoint's source",
        ),
        (
            "the request names another VM",
            with(|c| c.req.vm_name = vm_name_for_pod("team-b", "victim-0")),
            "the VM named is not this pod's",
        ),
        (
            "the pod's VM annotation names another VM",
            with(|c| c.pod_vm = Some(vm_name_for_pod("team-b", "victim-0"))),
            "the VM named is not this pod's",
        ),
        (
            "the status names another node",
            with(|c| cr(c).node = "vk-node-2".into()),
            "not this node",
        ),
        (
            "a deleted checkpoint",
            with(|c| cr(c).deleting = true),
            "being deleted",
        ),
        (
            "a checkpoint the operator has not handed off",
            with(|c| cr(c).phase = None),
            "not handed off",
        ),
    ];
    for (what, case, needle) in rows {
        match verdict(&case) {
            Verdict::Refuse(msg) => assert!(msg.contains(needle), "{what}: {msg}"),
            other => panic!("{what}: {other:?}"),
        }
    }
}

#[test]
fn an_oversized_or_malformed_request_is_refused_unread() {
    let big = format!(
        r#"{{"name":"{}","uid":"u","vmName":"v","repository":"r","tag":"t"}}"#,
        "a".repeat(REQUEST_MAX_BYTES)
    );
    let err = read_request(&big).expect_err("oversized");
    assert!(err.contains("more than 1024"), "{err}");
    let err = read_request(r#"{"name":"snap","extra":1}"#).expect_err("malformed");
    assert!(err.contains("not a checkpoint request"), "{err}");
    let ok = good().req;
    assert_eq!(read_request(&ok.to_annotation()), Ok(ok));
}

fn facts(c: &Cr) -> CheckpointFacts<'_> {
    CheckpointFacts {
        uid: &c.uid,
        deleting: c.deleting,
        phase: c.phase,
        source: c.source,
        node: &c.node,
        pod_name: &c.pod_name,
        vm_name: &c.vm_name,
        repository: &c.repository,
        tag: &c.tag,
    }
}

#[test]
fn the_manifest_is_put_only_while_the_same_checkpoint_is_pushing() {
    let pushing = with(|c| cr(c).phase = Some(CheckpointPhase::Pushing));
    let at = |c: &Case| may_put_manifest(UID, c.cr.as_ref().map(facts).as_ref());
    assert_eq!(at(&pushing), Ok(()));
    let rows = [
        ("deleted meanwhile", with(|c| c.cr = None), "gone"),
        (
            "re-created under the same name",
            with(|c| {
                cr(c).phase = Some(CheckpointPhase::Pushing);
                cr(c).uid = "other".into();
            }),
            "re-created",
        ),
        (
            "deletion started",
            with(|c| {
                cr(c).phase = Some(CheckpointPhase::Pushing);
                cr(c).deleting = true;
            }),
            "being deleted",
        ),
        (
            "marked Failed meanwhile",
            with(|c| cr(c).phase = Some(CheckpointPhase::Failed)),
            "not Pushing",
        ),
    ];
    for (what, case, needle) in rows {
        let err = at(&case).expect_err(what);
        assert!(err.contains(needle), "{what}: {err}");
    }
}
