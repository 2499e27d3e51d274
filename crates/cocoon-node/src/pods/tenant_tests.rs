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
    let long_ns = "n".repeat(40);
    let long_main = vm_name_for_pod(&long_ns, &format!("{}-0", "c".repeat(40)));
    let dotted = vm_name_for_pod("a", "my.set-0");
    let cases: Vec<(&str, &str, String, Vec<Holder>, bool)> = vec![
        // (row, pod namespace, source, holders of the source, allowed)
        (
            "own namespace, main tracked here",
            "a",
            a_main.clone(),
            vec![holder("a", "demo-0")],
            true,
        ),
        (
            "own namespace, verified by name",
            "a",
            a_main.clone(),
            vec![],
            true,
        ),
        (
            "another namespace's main, tracked here",
            "b",
            a_main.clone(),
            vec![holder("a", "demo-0")],
            false,
        ),
        (
            "another namespace's main, not tracked",
            "b",
            a_main.clone(),
            vec![],
            false,
        ),
        (
            "held by pods of two namespaces",
            "a",
            a_main.clone(),
            vec![holder("a", "demo-0"), holder("b", "x")],
            false,
        ),
        (
            "legacy main held in the same namespace",
            "a",
            "vk-a-demo-0".into(),
            vec![holder("a", "demo-0")],
            true,
        ),
        (
            "legacy name with no holder",
            "a",
            "vk-a-demo-0".into(),
            vec![],
            false,
        ),
        (
            "ambiguous legacy held by the other namespace",
            "a-b",
            "vk-a-b-x".into(),
            vec![holder("a", "b-x")],
            false,
        ),
        (
            "shortened name with no holder",
            &long_ns,
            long_main.clone(),
            vec![],
            false,
        ),
        (
            "shortened name held in the namespace",
            &long_ns,
            long_main.clone(),
            vec![holder(&long_ns, "m")],
            true,
        ),
        (
            "dotted pod name needs a holder",
            "a",
            dotted.clone(),
            vec![],
            false,
        ),
        (
            "namespace prefix trick",
            "a",
            vm_name_for_pod("a-b", "x"),
            vec![],
            false,
        ),
        (
            "wrong hash",
            "a",
            "vk-a-demo-0-000000".into(),
            vec![],
            false,
        ),
        ("not a VM name", "a", "vk-a-".into(), vec![], false),
    ];
    for (row, ns, src, holders, allowed) in cases {
        let got = check_fork_source(ns, &src, &holders);
        assert_eq!(got.is_ok(), allowed, "{row}: {got:?}");
        if let Err(e) = got {
            assert_eq!(
                e.to_string(),
                format!(
                    "annotation vm.cocoonstack.io/fork-from: VM {src:?} does not belong to namespace {ns:?}"
                ),
                "{row}"
            );
        }
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
        claimed_managed_id: Some("vm-123"),
        ..unmanaged
    };
    assert_eq!(
        check_create(&alias).map_err(|e| e.to_string()),
        Err("annotation vm.cocoonstack.io/id: \"vm-123\" is the id of a VM this node manages (or resolves to one by id, name or id prefix); an unmanaged pod cannot claim it".to_owned())
    );
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
    ] {
        let got = check_image_ref(image);
        assert_eq!(got.is_err(), refused, "{image}: {got:?}");
        if let Err(e) = got {
            assert!(e.to_string().starts_with(key), "{e}");
        }
    }
}

fn owner(ns: &str, uid: Option<&str>, pod: &str) -> crate::pods::owned::Owner {
    crate::pods::owned::Owner {
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
