//! Table tests of the CocoonCheckpoint rules, read as the issue's words.

use cocoon_api::contract::checkpoint::{CheckpointRequest, checkpoint_artifact};
use cocoon_api::crd::checkpoint::{
    CheckpointPhase, CheckpointSource, CocoonCheckpoint, CocoonCheckpointSpec,
    CocoonCheckpointStatus, NameRef,
};
use cocoon_api::naming::vm_name_for_pod;
use k8s_openapi::jiff::Timestamp;

use super::decide::*;

const NS: &str = "ns";
const UID: &str = "uid-1";

fn cr(source: CheckpointSource, phase: Option<CheckpointPhase>) -> CocoonCheckpoint {
    let mut c = CocoonCheckpoint::new("good", CocoonCheckpointSpec { source });
    c.metadata.namespace = Some(NS.into());
    c.metadata.uid = Some(UID.into());
    c.metadata.generation = Some(1);
    c.status = phase.map(|p| CocoonCheckpointStatus {
        phase: Some(p),
        pod_name: "demo-0".into(),
        vm_name: vm_name_for_pod(NS, "demo-0"),
        ..CocoonCheckpointStatus::default()
    });
    c
}

fn pod_ref(name: &str) -> CheckpointSource {
    CheckpointSource {
        pod_ref: Some(NameRef { name: name.into() }),
        cocoon_set_ref: None,
    }
}

fn set_ref(name: &str) -> CheckpointSource {
    CheckpointSource {
        pod_ref: None,
        cocoon_set_ref: Some(NameRef { name: name.into() }),
    }
}

/// A Running managed pod of `NS` whose VM is its own, on node-a.
fn good_pod(name: &str) -> PodFacts {
    PodFacts {
        name: name.into(),
        managed: true,
        running: true,
        vm_name: vm_name_for_pod(NS, name),
        node: "node-a".into(),
        request: None,
        owned_by_set: true,
    }
}

fn ours() -> CheckpointRequest {
    let a = checkpoint_artifact(NS, "good", UID).expect("derive");
    CheckpointRequest {
        name: "good".into(),
        uid: UID.into(),
        vm_name: vm_name_for_pod(NS, "demo-0"),
        repository: a.repository,
        tag: a.tag,
    }
}

fn plan(cr: &CocoonCheckpoint, source: SourceView, busy: bool) -> Plan {
    plan_pass(
        &Observed {
            cr,
            source,
            other_request_in_flight: busy,
            now: Timestamp::from_second(1_800_000_000).expect("time"),
        },
        true,
    )
}

fn failed_message(p: &Plan) -> String {
    let s = p.status.as_ref().expect("status");
    assert_eq!(s.phase, Some(CheckpointPhase::Failed));
    let ready = &s.conditions[0];
    assert_eq!(
        (ready.type_.as_str(), ready.status.as_str()),
        ("Ready", "False")
    );
    let ev = p.event.as_ref().expect("event");
    assert!(ev.warning);
    assert_eq!(ev.message, ready.message);
    assert!(p.request.is_none(), "a refused source gets no request");
    ready.message.clone()
}

#[test]
fn the_finalizer_comes_first() {
    let c = cr(pod_ref("demo-0"), None);
    let p = plan_pass(
        &Observed {
            cr: &c,
            source: SourceView::Pod(good_pod("demo-0")),
            other_request_in_flight: false,
            now: Timestamp::now(),
        },
        false,
    );
    assert_eq!(
        p,
        Plan {
            add_finalizer: true,
            ..Plan::default()
        }
    );
}

#[test]
fn a_source_that_is_not_a_running_managed_pod_of_the_namespace_fails_naming_the_field() {
    let unmanaged = PodFacts {
        managed: false,
        ..good_pod("demo-0")
    };
    let pending = PodFacts {
        running: false,
        ..good_pod("demo-0")
    };
    // A pod whose VM name is another namespace's pod's (a copied annotation).
    let foreign_vm = PodFacts {
        vm_name: vm_name_for_pod("victim", "demo-0"),
        ..good_pod("demo-0")
    };
    let not_the_sets = PodFacts {
        owned_by_set: false,
        ..good_pod("demo-0")
    };
    let pod_field =
        r#"spec.source.podRef.name: pod "demo-0" is not a Running managed pod of namespace "ns""#;
    let main_field = r#"spec.source.cocoonSetRef.name: the main agent pod "demo-0" of CocoonSet "demo" is not a Running managed pod of namespace "ns""#;
    let cases = [
        (
            pod_ref("demo-0"),
            SourceView::PodMissing,
            pod_field,
            "(not found)",
        ),
        (
            pod_ref("demo-0"),
            SourceView::Pod(unmanaged),
            pod_field,
            "(not managed by cocoon)",
        ),
        (
            pod_ref("demo-0"),
            SourceView::Pod(pending),
            pod_field,
            "(not Running)",
        ),
        (
            pod_ref("demo-0"),
            SourceView::Pod(foreign_vm),
            pod_field,
            "(its VM name is not its own)",
        ),
        (
            set_ref("demo"),
            SourceView::SetMissing,
            r#"spec.source.cocoonSetRef.name: CocoonSet "demo" not found in namespace "ns""#,
            "",
        ),
        (
            set_ref("demo"),
            SourceView::MainMissing,
            main_field,
            "(not found)",
        ),
        (
            set_ref("demo"),
            SourceView::Pod(not_the_sets),
            main_field,
            "(not controlled by the CocoonSet)",
        ),
    ];
    for (source, view, head, why) in cases {
        let c = cr(source, None);
        let m = failed_message(&plan(&c, view.clone(), false));
        assert!(m.starts_with(head), "{view:?}: {m}");
        assert!(m.ends_with(why), "{view:?}: {m}");
    }
    let neither = cr(CheckpointSource::default(), None);
    let m = failed_message(&plan(&neither, SourceView::Unnamed, false));
    assert!(m.starts_with("spec.source:"), "{m}");
}

#[test]
fn a_valid_source_goes_pending_with_the_derived_artifact_and_the_request() {
    for source in [pod_ref("demo-0"), set_ref("demo")] {
        let c = cr(source.clone(), None);
        let p = plan(&c, SourceView::Pod(good_pod("demo-0")), false);
        let s = p.status.as_ref().expect("status");
        let derived = checkpoint_artifact(NS, "good", UID).expect("derive");
        assert_eq!(s.phase, Some(CheckpointPhase::Pending));
        assert_eq!(s.repository, derived.repository);
        assert_eq!(s.tag, derived.tag);
        assert_eq!(s.node, "node-a");
        assert_eq!(s.pod_name, "demo-0");
        assert_eq!(s.vm_name, vm_name_for_pod(NS, "demo-0"));
        assert_eq!(s.source, source.one().expect("one").display());
        assert_eq!(s.observed_generation, 1);
        assert_eq!(
            p.request,
            Some(RequestChange::Write {
                pod: "demo-0".into(),
                request: ours()
            })
        );
        assert!(!p.event.as_ref().expect("event").warning);
    }
}

#[test]
fn a_pod_busy_with_another_checkpoint_keeps_this_one_waiting() {
    let other = CheckpointRequest {
        name: "other".into(),
        uid: "uid-2".into(),
        ..ours()
    };
    let busy_pod = PodFacts {
        request: Some(other),
        ..good_pod("demo-0")
    };
    // Validation: Pending, no request yet, look again.
    let c = cr(pod_ref("demo-0"), None);
    let p = plan(&c, SourceView::Pod(busy_pod.clone()), true);
    assert_eq!(
        p.status.expect("status").phase,
        Some(CheckpointPhase::Pending)
    );
    assert!(p.request.is_none() && p.requeue);
    // Pending, still busy: nothing but another look.
    let c = cr(pod_ref("demo-0"), Some(CheckpointPhase::Pending));
    let p = plan(&c, SourceView::Pod(busy_pod.clone()), true);
    assert!(p.request.is_none() && p.requeue && p.status.is_none());
    // Pending, the other one ended: ours is written over it.
    let p = plan(&c, SourceView::Pod(busy_pod), false);
    assert_eq!(
        p.request,
        Some(RequestChange::Write {
            pod: "demo-0".into(),
            request: ours()
        })
    );
    // Pending with our request on the pod: nothing to do.
    let with_ours = PodFacts {
        request: Some(ours()),
        ..good_pod("demo-0")
    };
    assert_eq!(plan(&c, SourceView::Pod(with_ours), false), Plan::default());
}

#[test]
fn in_flight_checkpoints_whose_pod_is_gone_fail_and_final_ones_clear_their_request() {
    for phase in [
        CheckpointPhase::Pending,
        CheckpointPhase::Saving,
        CheckpointPhase::Pushing,
    ] {
        let c = cr(pod_ref("demo-0"), Some(phase));
        let p = plan(&c, SourceView::PodMissing, false);
        let s = p.status.expect("status");
        assert_eq!(s.phase, Some(CheckpointPhase::Failed), "{phase}");
        assert_eq!(s.conditions[0].reason, REASON_SOURCE_GONE);
    }
    let with_ours = PodFacts {
        request: Some(ours()),
        ..good_pod("demo-0")
    };
    for phase in [CheckpointPhase::Ready, CheckpointPhase::Failed] {
        let c = cr(pod_ref("demo-0"), Some(phase));
        let p = plan(&c, SourceView::Pod(with_ours.clone()), false);
        assert_eq!(
            p.request,
            Some(RequestChange::Clear {
                pod: "demo-0".into()
            })
        );
        assert!(p.status.is_none());
        // Another CR's request is not ours to clear.
        let other = PodFacts {
            request: Some(CheckpointRequest {
                uid: "uid-2".into(),
                ..ours()
            }),
            ..good_pod("demo-0")
        };
        assert_eq!(plan(&c, SourceView::Pod(other), false), Plan::default());
    }
}

#[test]
fn deletion_derives_the_artifact_from_the_cr_never_from_its_status() {
    let mut c = cr(pod_ref("demo-0"), Some(CheckpointPhase::Ready));
    if let Some(s) = c.status.as_mut() {
        s.repository = vm_name_for_pod("victim", "demo-0");
    }
    let a = artifact_to_delete(&c).expect("artifact");
    assert_eq!(a, checkpoint_artifact(NS, "good", UID).expect("derive"));
    c.metadata.uid = None;
    assert_eq!(artifact_to_delete(&c), None);
}
