//! Unit tests of `pods/tenant.rs`.

use super::tenant::*;
use cocoon_api::naming::vm_name_for_pod;
use std::path::{Path, PathBuf};

fn holder(ns: &str, name: &str) -> Holder {
    Holder {
        namespace: ns.into(),
        name: name.into(),
        uid: format!("uid-{ns}-{name}"),
    }
}

/// A managed holder with its running VM `vm` (id `id-<vm>`).
fn managed(ns: &str, name: &str, vm: &str) -> SourceHolder {
    SourceHolder {
        holder: holder(ns, name),
        managed: true,
        vm: Some(runtime_vm(vm)),
    }
}

/// A managed holder with no VM tracked (hibernated, or still booting).
fn managed_no_vm(ns: &str, name: &str) -> SourceHolder {
    SourceHolder {
        holder: holder(ns, name),
        managed: true,
        vm: None,
    }
}

/// An unmanaged holder of VM name `vm` whose synthetic record carries the pre-assigned `id`.
fn unmanaged(ns: &str, name: &str, vm: &str, id: &str) -> SourceHolder {
    SourceHolder {
        holder: holder(ns, name),
        managed: false,
        vm: Some(SourceVm {
            id: id.into(),
            name: vm.into(),
            synthetic: true,
        }),
    }
}

/// The runtime's record of VM `vm` (id `id-<vm>`).
fn runtime_vm(vm: &str) -> SourceVm {
    SourceVm {
        id: format!("id-{vm}"),
        name: vm.into(),
        synthetic: false,
    }
}

#[test]
fn own_vm_rows() {
    let a_main = vm_name_for_pod("a", "demo-0");
    let b_x = vm_name_for_pod("a-b", "x");
    /// (row, ns, pod, vm, holders, refusal prefix or None = allowed)
    type Row<'a> = (
        &'a str,
        &'a str,
        &'a str,
        String,
        Vec<Holder>,
        Option<&'a str>,
    );
    let cases: Vec<Row> = vec![
        // (row, ns, pod, vm, holders, refusal prefix or None = allowed)
        (
            "own hashed name",
            "a",
            "demo-0",
            a_main.clone(),
            vec![],
            None,
        ),
        (
            "another namespace's VM",
            "b",
            "demo-0",
            a_main.clone(),
            vec![],
            Some("annotation vm.cocoonstack.io/name: VM \"vk-a-demo-0-"),
        ),
        (
            "a sibling's VM in the same namespace",
            "a",
            "demo-1",
            a_main.clone(),
            vec![],
            Some("annotation vm.cocoonstack.io/name:"),
        ),
        (
            "own hashed name held by another live pod",
            "a",
            "demo-0",
            a_main.clone(),
            vec![holder("a", "demo-0")],
            Some("annotation vm.cocoonstack.io/name: VM \"vk-a-demo-0-"),
        ),
        (
            "legacy form of the pod itself",
            "a",
            "b-x",
            "vk-a-b-x".into(),
            vec![],
            Some("annotation vm.cocoonstack.io/name: VM \"vk-a-b-x\" has the legacy"),
        ),
        (
            "legacy form read the other way round",
            "a-b",
            "x",
            "vk-a-b-x".into(),
            vec![],
            Some("annotation vm.cocoonstack.io/name: VM \"vk-a-b-x\" has the legacy"),
        ),
        (
            "hashed names never collide across the split",
            "a",
            "b-x",
            b_x.clone(),
            vec![],
            Some("annotation vm.cocoonstack.io/name:"),
        ),
        (
            "arbitrary name",
            "a",
            "p",
            "my-vm".into(),
            vec![],
            Some("annotation vm.cocoonstack.io/name: VM \"my-vm\" does not belong to pod a/p"),
        ),
    ];
    for (row, ns, pod, vm, holders, want) in cases {
        let got = check_own_vm(ns, pod, &vm, &holders, false);
        match want {
            None => assert_eq!(got, Ok(()), "{row}"),
            Some(prefix) => {
                let msg = got.expect_err(row).to_string();
                assert!(msg.starts_with(prefix), "{row}: {msg}");
            }
        }
    }
}

#[test]
fn fork_source_rows() {
    let a_main = vm_name_for_pod("a", "demo-0");
    let a_decoy = vm_name_for_pod("a", "decoy");
    let b_main = vm_name_for_pod("b", "main");
    let long_ns = "n".repeat(40);
    let long_main = vm_name_for_pod(&long_ns, &format!("{}-0", "c".repeat(40)));
    let dotted = vm_name_for_pod("a", "my.set-0");
    let foreign = "does not belong to namespace";
    let unmanaged_msg = "which is not a managed VM pod";
    /// (row, pod namespace, source, holders of the source, refusal or None = allowed)
    type Row<'a> = (&'a str, &'a str, String, Vec<SourceHolder>, Option<&'a str>);
    let cases: Vec<Row> = vec![
        // (row, pod namespace, source, holders of the source, refusal or None = allowed)
        (
            "own namespace, main running here",
            "a",
            a_main.clone(),
            vec![managed("a", "demo-0", &a_main)],
            None,
        ),
        (
            "own namespace, main hibernated (its baseline may be reused)",
            "a",
            a_main.clone(),
            vec![managed_no_vm("a", "demo-0")],
            None,
        ),
        (
            "own namespace, verified by name",
            "a",
            a_main.clone(),
            vec![],
            None,
        ),
        (
            "issue 35 item 1: an unmanaged decoy of the namespace whose id is another namespace's VM name",
            "a",
            a_decoy.clone(),
            vec![unmanaged("a", "decoy", &a_decoy, &b_main)],
            Some(unmanaged_msg),
        ),
        (
            "issue 35 item 1: an unmanaged decoy whose id is a 3-character id prefix",
            "a",
            a_decoy.clone(),
            vec![unmanaged("a", "decoy", &a_decoy, "3f2")],
            Some(unmanaged_msg),
        ),
        (
            "an unmanaged holder not tracked yet",
            "a",
            a_decoy.clone(),
            vec![SourceHolder {
                managed: false,
                vm: None,
                ..managed("a", "decoy", &a_decoy)
            }],
            Some(unmanaged_msg),
        ),
        (
            "a managed holder whose tracked record is synthetic",
            "a",
            a_main.clone(),
            vec![SourceHolder {
                managed: true,
                ..unmanaged("a", "demo-0", &a_main, "x")
            }],
            Some(unmanaged_msg),
        ),
        (
            "a managed holder and an unmanaged one",
            "a",
            a_main.clone(),
            vec![
                managed("a", "demo-0", &a_main),
                unmanaged("a", "decoy", &a_main, "x"),
            ],
            Some(unmanaged_msg),
        ),
        (
            "another namespace's main, tracked here",
            "b",
            a_main.clone(),
            vec![managed("a", "demo-0", &a_main)],
            Some(foreign),
        ),
        (
            "another namespace's unmanaged pod: foreign first, the holder is not named",
            "b",
            a_decoy.clone(),
            vec![unmanaged("a", "decoy", &a_decoy, "x")],
            Some(foreign),
        ),
        (
            "another namespace's main, not tracked",
            "b",
            a_main.clone(),
            vec![],
            Some(foreign),
        ),
        (
            "held by pods of two namespaces",
            "a",
            a_main.clone(),
            vec![managed("a", "demo-0", &a_main), managed("b", "x", &a_main)],
            Some(foreign),
        ),
        (
            "legacy main held in the same namespace",
            "a",
            "vk-a-demo-0".into(),
            vec![managed("a", "demo-0", "vk-a-demo-0")],
            None,
        ),
        (
            "legacy name with no holder",
            "a",
            "vk-a-demo-0".into(),
            vec![],
            Some(foreign),
        ),
        (
            "ambiguous legacy held by the other namespace",
            "a-b",
            "vk-a-b-x".into(),
            vec![managed("a", "b-x", "vk-a-b-x")],
            Some(foreign),
        ),
        (
            "shortened name with no holder",
            &long_ns,
            long_main.clone(),
            vec![],
            Some(foreign),
        ),
        (
            "shortened name held in the namespace",
            &long_ns,
            long_main.clone(),
            vec![managed(&long_ns, "m", &long_main)],
            None,
        ),
        (
            "dotted pod name needs a holder",
            "a",
            dotted.clone(),
            vec![],
            Some(foreign),
        ),
        (
            "namespace prefix trick",
            "a",
            vm_name_for_pod("a-b", "x"),
            vec![],
            Some(foreign),
        ),
        (
            "wrong hash",
            "a",
            "vk-a-demo-0-000000".into(),
            vec![],
            Some(foreign),
        ),
        ("not a VM name", "a", "vk-a-".into(), vec![], Some(foreign)),
    ];
    for (row, ns, src, holders, refusal) in cases {
        let got = check_fork_source(ns, &src, &holders);
        assert_eq!(got.is_ok(), refusal.is_none(), "{row}: {got:?}");
        if let (Err(e), Some(want)) = (got, refusal) {
            let msg = e.to_string();
            assert!(
                msg.starts_with(&format!(
                    "annotation vm.cocoonstack.io/fork-from: VM {src:?} "
                )),
                "{row}: {msg}"
            );
            assert!(msg.contains(want), "{row}: {msg}");
        }
    }
}

/// The check at the moment of the save: the runtime's record fetched by exact name must be
/// the tracked VM of a managed holder of the namespace (or, with no holder, a VM whose name
/// verifies for the namespace).
#[test]
fn fork_save_rows() {
    let a_main = vm_name_for_pod("a", "demo-0");
    let a_decoy = vm_name_for_pod("a", "decoy");
    let b_main = vm_name_for_pod("b", "main");
    /// (row, source, holders now, runtime record by exact name, refusal or None = save)
    type Row<'a> = (
        &'a str,
        String,
        Vec<SourceHolder>,
        SourceVm,
        Option<&'a str>,
    );
    let cases: Vec<Row> = vec![
        // (row, source, holders now, runtime record by exact name, refusal or None = save)
        (
            "the main's tracked VM",
            a_main.clone(),
            vec![managed("a", "demo-0", &a_main)],
            runtime_vm(&a_main),
            None,
        ),
        (
            "no holder, the name verifies for the namespace",
            a_main.clone(),
            vec![],
            runtime_vm(&a_main),
            None,
        ),
        (
            "issue 35 item 1: the holder turned into an unmanaged decoy after admission",
            a_decoy.clone(),
            vec![unmanaged("a", "decoy", &a_decoy, &b_main)],
            runtime_vm(&a_decoy),
            Some("which is not a managed VM pod"),
        ),
        (
            "the holder now lives in another namespace",
            a_main.clone(),
            vec![managed("b", "demo-0", &a_main)],
            runtime_vm(&a_main),
            Some("does not belong to namespace"),
        ),
        (
            "the holder is not running yet (or hibernated)",
            a_main.clone(),
            vec![managed_no_vm("a", "demo-0")],
            runtime_vm(&a_main),
            Some("is not running as the tracked VM"),
        ),
        (
            "the runtime's VM of that name is not the tracked one (another id)",
            a_main.clone(),
            vec![managed("a", "demo-0", &a_main)],
            SourceVm {
                id: "other".into(),
                ..runtime_vm(&a_main)
            },
            Some("is not running as the tracked VM"),
        ),
        (
            "the runtime resolved the name to another VM",
            a_main.clone(),
            vec![],
            runtime_vm(&b_main),
            Some("is not running as the tracked VM"),
        ),
        (
            "a synthetic record is never saved from",
            a_main.clone(),
            vec![],
            SourceVm {
                synthetic: true,
                ..runtime_vm(&a_main)
            },
            Some("is not running as the tracked VM"),
        ),
    ];
    for (row, src, holders, found, refusal) in cases {
        let got = check_fork_save("a", &src, &holders, &found);
        assert_eq!(got.is_ok(), refusal.is_none(), "{row}: {got:?}");
        if let (Err(e), Some(want)) = (got, refusal) {
            let msg = e.to_string();
            assert!(
                msg.starts_with("annotation vm.cocoonstack.io/fork-from: ") && msg.contains(want),
                "{row}: {msg}"
            );
        }
    }
}

/// Pre-assigned ids of unmanaged pods: the VM-name form is refused by its spelling.
#[test]
fn pre_assigned_ids_in_the_vm_name_form() {
    let victim = vm_name_for_pod("b", "main");
    for (id, refused) in [
        ("ext-1", false),
        ("vm-123", false),
        ("3f2", false),
        ("0123456789abcdef0123456789abcdef", false),
        ("fork-base", false),
        (victim.as_str(), true),
        (&format!("fork-{victim}")[..], true),
        ("VK-B-MAIN-123ABC", true),
        (" vk-x", true),
        ("vk-", true),
    ] {
        assert_eq!(id_in_vm_name_form(id), refused, "{id}");
    }
}

#[test]
fn clone_dir_rows() {
    let roots = vec![PathBuf::from("/srv/staged"), PathBuf::from("/data/snaps")];
    /// (row, annotation, roots, resolved dir, refusal prefix or None = allowed)
    type Row<'a> = (
        &'a str,
        Option<&'a str>,
        &'a [PathBuf],
        Option<&'a str>,
        Option<&'a str>,
    );
    let cases: Vec<Row> = vec![
        // (row, annotation, roots, resolved dir, refusal prefix or None = allowed)
        ("no annotation", None, &roots, None, None),
        ("blank annotation", Some("  "), &roots, None, None),
        (
            "under a root",
            Some("/srv/staged/snap-1"),
            &roots,
            None,
            None,
        ),
        (
            "deep under the second root",
            Some("/data/snaps/x/y"),
            &roots,
            None,
            None,
        ),
        ("the root itself", Some("/srv/staged"), &roots, None, None),
        (
            "a sibling sharing the root's prefix",
            Some("/srv/staged-evil/snap"),
            &roots,
            None,
            Some(
                "annotation vm.cocoonstack.io/clone-from-dir: \"/srv/staged-evil/snap\" is not under a configured clone root (VK_CLONE_FROM_DIR_ROOTS)",
            ),
        ),
        (
            "outside every root",
            Some("/home/a/snap"),
            &roots,
            None,
            Some("annotation vm.cocoonstack.io/clone-from-dir: \"/home/a/snap\" is not under"),
        ),
        (
            "no root configured",
            Some("/srv/staged/snap-1"),
            &[],
            None,
            Some(
                "annotation vm.cocoonstack.io/clone-from-dir: \"/srv/staged/snap-1\" is not under",
            ),
        ),
        (
            "a symlink out of the root",
            Some("/srv/staged/link"),
            &roots,
            Some("/home/a/snap"),
            Some(
                "annotation vm.cocoonstack.io/clone-from-dir: \"/srv/staged/link\" resolves to \"/home/a/snap\"",
            ),
        ),
        (
            "a symlink within the roots",
            Some("/srv/staged/link"),
            &roots,
            Some("/data/snaps/s"),
            None,
        ),
        (
            "relative: the spec's validation rejects it",
            Some("srv/staged"),
            &[],
            None,
            None,
        ),
        (
            "not canonical: the spec's validation rejects it",
            Some("/srv/staged/../x"),
            &[],
            None,
            None,
        ),
    ];
    for (row, raw, roots, resolved, want) in cases {
        let got = check_clone_dir(raw, roots, resolved.map(Path::new), roots);
        match want {
            None => assert_eq!(got, Ok(()), "{row}"),
            Some(prefix) => {
                let msg = got.expect_err(row).to_string();
                assert!(msg.starts_with(prefix), "{row}: {msg}");
            }
        }
    }
}

#[test]
fn create_check_order_and_unmanaged_pods() {
    let roots = vec![PathBuf::from("/srv/staged")];
    let own = vm_name_for_pod("b", "p");
    let a_main = vm_name_for_pod("a", "demo-0");
    let base = CreateCheck {
        namespace: "b",
        pod: "p",
        vm: &own,
        vm_holders: &[],
        fork_from: "",
        fork_holders: &[],
        clone_dir: None,
        roots: &roots,
        resolved_dir: None,
        resolved_roots: &roots,
        managed: true,
        pre_id: "",
        claimed_managed_id: None,
        image: "ubuntu:24.04",
        accept_legacy: false,
    };
    assert_eq!(check_create(&base), Ok(()));
    let thief = CreateCheck {
        image: &a_main,
        ..base
    };
    assert!(matches!(
        check_create(&thief),
        Err(Refusal::ImageNamesVm { .. })
    ));
    let fork = CreateCheck {
        fork_from: &a_main,
        ..base
    };
    assert!(matches!(
        check_create(&fork),
        Err(Refusal::ForeignForkSource { .. })
    ));
    let dir = CreateCheck {
        clone_dir: Some("/tmp/x"),
        ..base
    };
    assert!(matches!(
        check_create(&dir),
        Err(Refusal::CloneDirNotAllowed { .. })
    ));
    // Unmanaged pods never fork or clone, but their VM name is still checked.
    let unmanaged = CreateCheck {
        managed: false,
        ..fork
    };
    assert_eq!(check_create(&unmanaged), Ok(()));
    let foreign = CreateCheck {
        vm: &a_main,
        managed: false,
        ..base
    };
    assert!(matches!(
        check_create(&foreign),
        Err(Refusal::NotOwnVm { .. })
    ));
    let alias = CreateCheck {
        pre_id: "vm-123",
        claimed_managed_id: Some("vm-123"),
        ..unmanaged
    };
    assert_eq!(
        check_create(&alias).map_err(|e| e.to_string()),
        Err("annotation vm.cocoonstack.io/id: \"vm-123\" is the id of a VM on this node; an unmanaged pod cannot claim it".to_owned())
    );
    // Issue 35 item 1: another namespace's future VM name as the id, refused whatever exists
    // (the runtime lookup found nothing yet).
    let future = vm_name_for_pod("c", "next-0");
    let decoy = CreateCheck {
        pre_id: &future,
        claimed_managed_id: None,
        ..unmanaged
    };
    assert_eq!(
        check_create(&decoy).map_err(|e| e.to_string()),
        Err(format!(
            "annotation vm.cocoonstack.io/id: {future:?} has the form of a VM name (vk-…, fork-vk-…), which the runtime would resolve to that VM; an unmanaged pod's id cannot take it"
        ))
    );
    // A managed pod's id is written by this agent: the form rule is for unmanaged pods.
    let managed_pod = CreateCheck {
        pre_id: &future,
        ..base
    };
    assert_eq!(check_create(&managed_pod), Ok(()));
}

#[test]
fn legacy_names_need_the_opt_in() {
    for (ns, pod) in [("a", "b-x"), ("a-b", "x")] {
        assert!(matches!(
            check_own_vm(ns, pod, "vk-a-b-x", &[], false),
            Err(Refusal::LegacyUnproven { .. })
        ));
        assert_eq!(check_own_vm(ns, pod, "vk-a-b-x", &[], true), Ok(()));
        // The holder rule still applies with the opt-in.
        assert!(matches!(
            check_own_vm(ns, pod, "vk-a-b-x", &[holder("a", "b-x")], true),
            Err(Refusal::HeldByOther { .. })
        ));
        // A name that is neither form stays refused.
        assert!(matches!(
            check_own_vm(ns, pod, "vk-zz", &[], true),
            Err(Refusal::NotOwnVm { .. })
        ));
    }
}

#[test]
fn image_ref_rows() {
    let victim = vm_name_for_pod("a", "main");
    let ckpt_repo = cocoon_api::contract::checkpoint::checkpoint_artifact("a", "golden", "u1")
        .expect("derivable")
        .repository;
    let key = "annotation cocoonset.cocoonstack.io/image:";
    for (image, refused) in [
        ("ubuntu:24.04", false),
        ("ubuntu", false),
        ("ghcr.io/org/agent-base:v3", false),
        ("host:5000/team/base:1", false),
        ("https://cloud.example/vk-img.qcow2", false),
        ("", false),
        (victim.as_str(), true),
        (&format!("{victim}:latest")[..], true),
        (&format!("{victim}:hibernate")[..], true),
        (&format!("team/{victim}:latest")[..], true),
        (&format!("host:5000/{victim}")[..], true),
        (&format!("fork-{victim}")[..], true),
        ("fork-base", false),
        ("vk-legacy-name", true),
        ("VK-A-MAIN:latest", true),
        ("base:hibernate", true),
        ("host:5000/base:hibernate", true),
        ("base@sha256:0000", false),
        // A checkpoint's repository (another namespace's, or its own) by any ref: only the
        // from-checkpoint annotation, resolved by the agent, starts a pod from a checkpoint.
        (&ckpt_repo[..], true),
        (&format!("{ckpt_repo}:checkpoint")[..], true),
        (&format!("{ckpt_repo}:sha256:0000")[..], true),
        (&format!("{ckpt_repo}@sha256:0000")[..], true),
        (&format!("host:5000/team/{ckpt_repo}:checkpoint")[..], true),
        ("CKPT-A-GOLDEN-0123456789AB", true),
        ("checkpoint-base:v1", false),
    ] {
        let got = check_image_ref(image);
        assert_eq!(got.is_err(), refused, "{image}: {got:?}");
        if let Err(e) = got {
            assert!(e.to_string().starts_with(key), "{e}");
        }
    }
}

fn owner(ns: &str, uid: Option<&str>, pod: &str) -> Owner {
    Owner {
        namespace: ns.to_owned(),
        namespace_uid: uid.map(str::to_owned),
        pod: pod.to_owned(),
    }
}

#[test]
fn artifact_owner_rows() {
    use cocoon_api::contract::owner::owner_annotations;
    let with = |ns: &str, pod: &str| owner_annotations(ns, None, pod);
    let with_uid = |ns: &str, uid: &str, pod: &str| owner_annotations(ns, Some(uid), pod);
    let none = std::collections::BTreeMap::new();
    let ns_only: std::collections::BTreeMap<String, String> = [(
        cocoon_api::contract::oci::ANNOTATION_OWNER_NAMESPACE.to_owned(),
        "a".to_owned(),
    )]
    .into();
    let own = ArtifactUse::OwnVm;
    let base = ArtifactUse::CloneBase;
    #[rustfmt::skip]
    let rows = [
        ("own VM, own annotations", own, with("a", "p"), None, true),
        ("own VM, no annotations (Go)", own, none.clone(), None, true),
        ("own VM, another namespace", own, with("b", "p"), None, false),
        ("own VM, another pod", own, with("a", "q"), None, false),
        ("own VM, namespace only", own, ns_only.clone(), None, true),
        ("own VM, same namespace uid", own, with_uid("a", "u1", "p"), Some("u1"), true),
        ("own VM, namespace re-created (uid differs)", own, with_uid("a", "u0", "p"), Some("u1"), false),
        ("own VM, uid recorded, pod's namespace uid unreadable", own, with_uid("a", "u1", "p"), None, false),
        ("own VM, no uid recorded (older push), uid known", own, with("a", "p"), Some("u1"), true),
        ("clone base recorded for the namespace: shared on the host, so refused", base, with("a", "q"), None, false),
        ("clone base of another namespace", base, with("b", "q"), None, false),
        ("plain base image", base, none.clone(), None, true),
    ];
    for (row, what, annotations, uid, ok) in rows {
        let got = check_artifact_owner(what, "r:t", &annotations, &owner("a", uid, "p"));
        assert_eq!(got.is_ok(), ok, "{row}: {got:?}");
    }
    // A checkpoint base: the artifact must record the checkpoint of the pod's namespace.
    use cocoon_api::contract::checkpoint::checkpoint_owner_annotations as ckpt_owner;
    let ckpt = ArtifactUse::Checkpoint;
    let golden = owner("a", None, "cocooncheckpoint/golden");
    #[rustfmt::skip]
    let rows = [
        ("its checkpoint", ckpt_owner("a", "golden"), true),
        ("another namespace's checkpoint of that name", ckpt_owner("b", "golden"), false),
        ("another checkpoint of the namespace", ckpt_owner("a", "other"), false),
        ("a pod's VM snapshot", with("a", "golden"), false),
        ("namespace only", ns_only.clone(), false),
        ("no owner recorded", none.clone(), false),
    ];
    for (row, annotations, ok) in rows {
        let got = check_artifact_owner(ckpt, "ckpt-x:sha256:0", &annotations, &golden);
        assert_eq!(got.is_ok(), ok, "{row}: {got:?}");
    }
    let p = owner("a", None, "p");
    assert_eq!(
        check_artifact_owner(own, "vk-x:hibernate", &with("b", "q"), &p).map_err(|e| e.to_string()),
        Err("snapshot vk-x:hibernate belongs to b/q (manifest annotation cocoonstack.snapshot.owner-namespace), not to pod a/p".to_owned())
    );
    assert_eq!(
        check_artifact_owner(own, "vk-x:hibernate", &with_uid("a", "u0", "p"), &owner("a", Some("u1"), "p"))
            .map_err(|e| e.to_string()),
        Err("snapshot vk-x:hibernate belongs to a/p of namespace uid u0 (the namespace now has uid u1) (manifest annotation cocoonstack.snapshot.owner-namespace), not to pod a/p".to_owned())
    );
    assert_eq!(
        check_artifact_owner(base, "base:v1", &with("a", "q"), &p).map_err(|e| e.to_string()),
        Err("image base:v1: the artifact is the VM snapshot of a/q (manifest annotation cocoonstack.snapshot.owner-namespace); a clone base must be a plain image, shared by every namespace on the node".to_owned())
    );
}

#[test]
fn admitted_fields_never_change() {
    let own = vm_name_for_pod("a", "p");
    let managed = Admitted {
        uid: "u".into(),
        vm_name: own.clone(),
        managed: true,
        pre_id: String::new(),
    };
    let unmanaged = Admitted {
        managed: false,
        pre_id: "ext-1".into(),
        ..managed.clone()
    };
    assert_eq!(
        check_update(&managed, &own, true, "any-id-we-wrote"),
        Ok(())
    );
    assert_eq!(check_update(&unmanaged, &own, false, "ext-1"), Ok(()));
    assert!(matches!(
        check_update(&unmanaged, &own, true, "ext-1"),
        Err(Refusal::ManagedChanged {
            tracked: false,
            managed: true
        })
    ));
    assert!(matches!(
        check_update(&managed, &own, false, ""),
        Err(Refusal::ManagedChanged {
            tracked: true,
            managed: false
        })
    ));
    assert_eq!(
        check_update(&unmanaged, &own, false, "VICTIMID").map_err(|e| e.to_string()),
        Err("annotation vm.cocoonstack.io/id: changed from \"ext-1\" to \"VICTIMID\"; an unmanaged pod's VM id is fixed at create".to_owned())
    );
    assert!(matches!(
        check_update(&managed, "vk-b-q-123456", true, ""),
        Err(Refusal::NameChanged { .. })
    ));
    assert_eq!(
        check_update(&unmanaged, &own, true, "ext-1").map_err(|e| e.to_string()),
        Err("annotation cocoonset.cocoonstack.io/managed: changed from false to true after the pod was tracked; managed is fixed at create".to_owned())
    );
}

#[test]
fn reconcile_rows() {
    let own = vm_name_for_pod("a", "demo-0");
    for (row, ns, pod, vm, found, want) in [
        (
            "own hashed, by id",
            "a",
            "demo-0",
            own.as_str(),
            Found::ById(own.as_str()),
            true,
        ),
        (
            "own hashed, by name",
            "a",
            "demo-0",
            own.as_str(),
            Found::ByName,
            true,
        ),
        (
            "own hashed, hibernated",
            "a",
            "demo-0",
            own.as_str(),
            Found::HibernatedWithoutVm,
            true,
        ),
        (
            "by id, but the VM has another name",
            "a",
            "demo-0",
            own.as_str(),
            Found::ById("vk-b-p-123456"),
            false,
        ),
        (
            "another namespace's VM by name",
            "b",
            "demo-0",
            own.as_str(),
            Found::ByName,
            false,
        ),
        (
            "legacy, by id with matching name",
            "a",
            "b-x",
            "vk-a-b-x",
            Found::ById("vk-a-b-x"),
            true,
        ),
        (
            "legacy, by name",
            "a-b",
            "x",
            "vk-a-b-x",
            Found::ByName,
            false,
        ),
        (
            "legacy, hibernated",
            "a-b",
            "x",
            "vk-a-b-x",
            Found::HibernatedWithoutVm,
            false,
        ),
    ] {
        assert_eq!(
            reconcile_may_track(ns, pod, vm, found, false),
            want,
            "{row}"
        );
        if own_name_form(ns, pod, vm) == Some(NameForm::Legacy) {
            // The mixed-fleet opt-in accepts the legacy form by name too.
            assert!(
                reconcile_may_track(ns, pod, vm, found, true) || matches!(found, Found::ById(_)),
                "{row}"
            );
        }
    }
}

#[test]
fn delete_snapshot_cleanup_rows() {
    let own = vm_name_for_pod("a", "p");
    let foreign = vm_name_for_pod("b", "q");
    for (row, tracked, vm, holders, want) in [
        ("tracked pod", true, own.as_str(), vec![], true),
        ("untracked, own name", false, own.as_str(), vec![], true),
        (
            "untracked, another namespace's VM",
            false,
            foreign.as_str(),
            vec![],
            false,
        ),
        (
            "untracked, own name held by another",
            false,
            own.as_str(),
            vec![holder("a", "p")],
            false,
        ),
    ] {
        assert_eq!(
            delete_may_drop_snapshots(tracked, "a", "p", vm, &holders, false),
            want,
            "{row}"
        );
    }
}
