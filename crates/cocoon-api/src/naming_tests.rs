//! Unit tests of [`crate::naming`], property tests among them.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::naming::*;
use crate::contract::vmspec::SnapshotPolicy;

/// Deterministic xorshift generator, so the property tests need no extra crates.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// A string of `len` characters from `alphabet`.
    fn word(&mut self, alphabet: &[u8], len: usize) -> String {
        (0..len)
            .map(|_| char::from(alphabet[self.below(alphabet.len())]))
            .collect()
    }

    /// A valid DNS-1123 label of 1..=max characters.
    fn label(&mut self, max: usize) -> String {
        const ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
        const INNER: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789-";
        let len = 1 + self.below(max);
        let mut s = self.word(ALNUM, 1);
        if len > 1 {
            s.push_str(&self.word(INNER, len - 2));
            s.push_str(&self.word(ALNUM, 1));
        }
        s
    }
}

/// The spec's literal `ExtractAgentSlot` (prefix rule), for unshortened names.
fn spec_extract(ns: &str, cs: &str, vm: &str) -> i32 {
    let prefix = format!("vk-{ns}-{}-", cs.replace('.', "-"));
    let Some(rest) = vm.strip_prefix(&prefix) else {
        return -1;
    };
    let candidate = rest.split('-').next().unwrap_or_default();
    match candidate.parse::<i32>() {
        Ok(n) if n >= 0 && vm_name_for_pod(ns, &format!("{cs}-{n}")) == vm => n,
        _ => -1,
    }
}

#[test]
fn vm_name_vectors() {
    for (pod, want) in [
        ("demo-0", "vk-ns-demo-0-505043"),
        ("demo-1", "vk-ns-demo-1-d239dc"),
        ("demo-tb", "vk-ns-demo-tb-7f9787"),
        ("demo-db-0", "vk-ns-demo-db-0-5b329f"),
    ] {
        assert_eq!(vm_name_for_pod("ns", pod), want, "{pod}");
    }
    assert_eq!(vm_name_for_agent("ns", "demo", 1), "vk-ns-demo-1-d239dc");
    assert_eq!(
        vm_name_for_toolbox("ns", "demo", "tb"),
        "vk-ns-demo-tb-7f9787"
    );
}

#[test]
fn dots_become_dashes_but_the_hash_uses_the_original() {
    let vm = vm_name_for_pod("ns", "a.b-0");
    assert!(vm.starts_with("vk-ns-a-b-0-"));
    assert_ne!(vm, vm_name_for_pod("ns", "a-b-0"));
    assert!(is_valid_oci_component(&vm));
}

#[test]
fn pod_names() {
    assert_eq!(pod_name_for_agent("demo", 0), "demo-0");
    assert_eq!(pod_name_for_agent("demo", 12), "demo-12");
    assert_eq!(pod_name_for_toolbox("demo", "tb"), "demo-tb");
    let want: BTreeSet<String> = ["demo-0", "demo-1", "demo-2", "demo-tb"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(desired_pod_names("demo", 2, ["tb"]), want);
    assert_eq!(desired_pod_names("demo", -3, []).len(), 1);
}

#[test]
fn integer_toolbox_names_are_rejected() {
    for (name, is_int) in [
        ("1", true),
        ("007", true),
        ("-1", true),
        ("+2", true),
        ("1-x", false),
        ("db-0", false),
        ("tb", false),
        ("", false),
        ("99999999999999999999", false),
    ] {
        assert_eq!(parse_int_slot_name(name), is_int, "{name:?}");
    }
}

#[test]
fn shortening_is_exactly_63_and_keeps_prefix_and_suffix() {
    let ns = "n".repeat(63);
    let pod = format!("{}-7", "p".repeat(200));
    let vm = vm_name_for_pod(&ns, &pod);
    assert_eq!(vm.len(), 63);
    assert!(vm.starts_with("vk-nnnn"));
    let full_hash = sha256_hex(&format!("{ns}/{pod}"));
    assert!(vm.ends_with(&format!("-{}", &full_hash[..6])));
    assert!(vm.contains("ppp-7-"));
    // The first name that needs shortening: middle of 54 characters.
    let ns = "a".repeat(10);
    let pod = "b".repeat(43);
    assert_eq!(format!("{ns}-{pod}").len(), 54);
    assert_eq!(vm_name_for_pod(&ns, &pod).len(), 63);
    let pod = "b".repeat(42);
    assert_eq!(
        vm_name_for_pod(&ns, &pod),
        format!("vk-{ns}-{pod}-{}", &sha256_hex(&format!("{ns}/{pod}"))[..6])
    );
}

#[test]
fn shortened_names_are_valid_stable_and_distinct() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut seen = BTreeSet::new();
    for i in 0..2000 {
        let ns = rng.label(63);
        // Subdomain-ish pod names: labels joined by dots, up to ~250 characters.
        let parts = 1 + rng.below(5);
        let pod = (0..parts)
            .map(|_| rng.label(50))
            .collect::<Vec<_>>()
            .join(".");
        let vm = vm_name_for_pod(&ns, &pod);
        assert!(vm.len() <= MAX_NAME_LEN, "{vm}");
        assert!(is_valid_vm_name(&vm), "{vm}");
        assert!(is_valid_oci_component(&vm), "{vm}");
        assert_eq!(vm, vm_name_for_pod(&ns, &pod), "stable");
        assert!(vm.starts_with(VM_NAME_PREFIX));
        assert!(seen.insert(vm), "collision at {i}: {ns}/{pod}");
    }
}

#[test]
fn garbage_inputs_still_give_valid_names() {
    let mut rng = Rng(42);
    const WILD: &[u8] = b"aZ09._-/:@ !~A";
    for _ in 0..1000 {
        let (ns_len, pod_len) = (rng.below(80), rng.below(300));
        let ns = rng.word(WILD, ns_len);
        let pod = rng.word(WILD, pod_len);
        let vm = vm_name_for_pod(&ns, &pod);
        assert!(is_valid_vm_name(&vm), "{vm:?}");
        assert!(is_valid_oci_component(&vm), "{vm:?}");
    }
    for (ns, pod) in [("", ""), ("ÜNICODE", "pöd-0"), ("ns", "..")] {
        let vm = vm_name_for_pod(ns, pod);
        assert!(
            is_valid_vm_name(&vm) && is_valid_oci_component(&vm),
            "{vm:?}"
        );
    }
}

#[test]
fn inputs_differing_only_past_the_cut_stay_distinct() {
    let ns = "team-".repeat(12); // 60 characters
    let a = format!("{}x{}-3", "p".repeat(40), "q".repeat(40));
    let b = format!("{}y{}-3", "p".repeat(40), "q".repeat(40));
    let (va, vb) = (vm_name_for_pod(&ns, &a), vm_name_for_pod(&ns, &b));
    assert_eq!(va.len(), 63);
    assert_eq!(va[..56], vb[..56], "the visible part is identical");
    assert_ne!(va, vb, "the hash keeps them apart");
}

#[test]
fn extract_agent_slot_cases() {
    let cases = [
        // (description, vm, want)
        ("main", vm_name_for_agent("ns", "demo", 0), 0),
        ("sub-agent", vm_name_for_agent("ns", "demo", 1), 1),
        ("sub-agent 12", vm_name_for_agent("ns", "demo", 12), 12),
        ("toolbox 1-x", vm_name_for_toolbox("ns", "demo", "1-x"), -1),
        (
            "toolbox db-0",
            vm_name_for_toolbox("ns", "demo", "db-0"),
            -1,
        ),
        ("toolbox tb", vm_name_for_toolbox("ns", "demo", "tb"), -1),
        ("other set", vm_name_for_agent("ns", "other", 0), -1),
        ("other namespace", vm_name_for_agent("ns2", "demo", 0), -1),
        ("legacy unhashed", "vk-ns-demo-1".to_owned(), -1),
        ("leading zero", "vk-ns-demo-01-d239dc".to_owned(), -1),
        ("wrong hash", "vk-ns-demo-1-000000".to_owned(), -1),
        ("empty", String::new(), -1),
        ("only suffix", "-d239dc".to_owned(), -1),
    ];
    for (what, vm, want) in cases {
        assert_eq!(extract_agent_slot("ns", "demo", &vm), want, "{what}: {vm}");
    }
    assert_eq!(extract_agent_slot("ns", "", "vk-ns--0-000000"), -1);
    // A dotted set name: the VM name has dashes, the hash the dots.
    let vm = vm_name_for_agent("ns", "my.set", 2);
    assert_eq!(extract_agent_slot("ns", "my.set", &vm), 2);
    assert_eq!(extract_agent_slot("ns", "my-set", &vm), -1);
}

#[test]
fn extract_agent_slot_recovers_shortened_names() {
    let mut rng = Rng(7);
    for _ in 0..500 {
        let ns = rng.label(63);
        let cs = rng.label(60);
        let slot = match rng.below(3) {
            0 => 0,
            1 => rng.below(20) as i32,
            _ => (rng.next() % i32::MAX as u64) as i32,
        };
        let vm = vm_name_for_agent(&ns, &cs, slot);
        assert_eq!(extract_agent_slot(&ns, &cs, &vm), slot, "{vm}");
        let tb = vm_name_for_toolbox(&ns, &cs, &format!("{slot}-x"));
        assert_eq!(extract_agent_slot(&ns, &cs, &tb), -1, "{tb}");
        let tb = vm_name_for_toolbox(&ns, &cs, &format!("db-{slot}"));
        assert_eq!(extract_agent_slot(&ns, &cs, &tb), -1, "{tb}");
        // Agrees with the spec's literal prefix rule whenever the name is not shortened.
        if vm.len() < MAX_NAME_LEN {
            assert_eq!(spec_extract(&ns, &cs, &vm), slot, "{vm}");
        }
    }
    let vm = vm_name_for_agent(&"n".repeat(63), &"c".repeat(63), 3);
    assert_eq!(vm.len(), 63);
    assert!(!vm.starts_with(&format!("vk-{}-{}-", "n".repeat(63), "c".repeat(63))));
    assert_eq!(extract_agent_slot(&"n".repeat(63), &"c".repeat(63), &vm), 3);
}

#[test]
fn roles() {
    for (slot, role, wire) in [
        (-1, Role::Toolbox, "toolbox"),
        (0, Role::Main, "main"),
        (1, Role::SubAgent, "sub-agent"),
        (7, Role::SubAgent, "sub-agent"),
    ] {
        assert_eq!(role_for_slot(slot), role);
        assert_eq!(role.as_str(), wire);
        assert_eq!(Role::from_wire(wire), Some(role));
    }
    assert_eq!(Role::from_wire("Main"), None);

    let main = vm_name_for_agent("ns", "demo", 0);
    assert_eq!(role_for_pod("ns", Some("demo"), &main), Role::Main);
    assert_eq!(role_for_pod("ns", None, &main), Role::Toolbox);
    let sub = vm_name_for_agent("ns", "demo", 3);
    assert_eq!(role_for_pod("ns", Some("demo"), &sub), Role::SubAgent);

    let owner = |kind: &str, name: &str| OwnerReference {
        kind: kind.to_owned(),
        name: name.to_owned(),
        ..OwnerReference::default()
    };
    let owners = [
        owner("ReplicaSet", "rs"),
        owner("CocoonSet", "demo"),
        owner("CocoonSet", "x"),
    ];
    assert_eq!(owner_cocoonset_name(&owners), Some("demo"));
    assert_eq!(owner_cocoonset_name(&owners[..1]), None);
}

#[test]
fn snapshot_policy_decisions() {
    use SnapshotPolicy::{Always, MainOnly, Never};
    for (policy, role, want) in [
        (Never, Role::Main, false),
        (MainOnly, Role::Main, true),
        (MainOnly, Role::SubAgent, false),
        (MainOnly, Role::Toolbox, false),
        (Always, Role::Toolbox, true),
        (Always, Role::SubAgent, true),
    ] {
        assert_eq!(should_snapshot_vm(policy, role), want, "{policy} {role}");
    }
    let main = vm_name_for_agent("ns", "demo", 0);
    let sub = vm_name_for_agent("ns", "demo", 1);
    let tb = vm_name_for_toolbox("ns", "demo", "tb");
    for (policy, vm, keep) in [
        (Never, &main, false),
        (MainOnly, &main, true),
        (MainOnly, &sub, false),
        (MainOnly, &tb, false),
        (Always, &sub, true),
        (Always, &tb, true),
    ] {
        assert_eq!(
            should_keep_latest_tag(policy, "ns", "demo", vm),
            keep,
            "{policy} {vm}"
        );
    }
}

#[test]
fn name_validators() {
    for (name, vm_ok, oci_ok) in [
        ("vk-ns-demo-0-505043", true, true),
        ("a", true, true),
        ("A", true, false),
        ("a..b", true, false),
        ("a._b", true, false),
        ("a__b", true, true),
        ("a___b", true, false),
        ("a---b", true, true),
        ("a.b_c-d", true, true),
        ("-a", false, false),
        ("a-", true, false),
        ("", false, false),
        ("a:b", false, false),
    ] {
        assert_eq!(is_valid_vm_name(name), vm_ok, "vm {name:?}");
        assert_eq!(is_valid_oci_component(name), oci_ok, "oci {name:?}");
    }
    assert!(is_valid_vm_name(&"a".repeat(63)));
    assert!(!is_valid_vm_name(&"a".repeat(64)));
    assert!(is_valid_snapshot_name("ghcr.io/cocoonstack/ubuntu:24.04"));
    // `@` is refused: cocoon v0.5.x's snapshot-name rule has no `@` (issue 40).
    assert!(!is_valid_snapshot_name("repo@sha256:abc"));
    assert!(!is_valid_snapshot_name("vk-a@x"));
    assert!(is_valid_snapshot_name("a._:/-Z9"));
    assert!(!is_valid_snapshot_name("/abs"));
    assert!(!is_valid_snapshot_name(&"a".repeat(64)));
}

#[test]
fn derived_snapshot_names() {
    let vm = "vk-ns-demo-0-505043";
    assert_eq!(fork_snapshot_name(vm), "fork-vk-ns-demo-0-505043");
    assert_eq!(
        hibernate_import_snapshot_name(vm),
        "vk-ns-demo-0-505043-hibernate-import"
    );
    assert_eq!(
        clone_base_snapshot_name("ghcr.io/x/ubuntu", ""),
        "ghcr.io/x/ubuntu:latest"
    );
    assert_eq!(
        clone_base_snapshot_name("ghcr.io/x/ubuntu", "latest"),
        "ghcr.io/x/ubuntu:latest"
    );
    assert_eq!(
        clone_base_snapshot_name("ghcr.io/x/ubuntu", "24.04"),
        "ghcr.io/x/ubuntu:24.04"
    );

    // Over-long names: first 50 + '-' + 12 hex of the full name = 63.
    let long_vm = vm_name_for_agent(&"n".repeat(63), "demo", 1);
    for full in [
        format!("fork-{long_vm}"),
        format!("{long_vm}-hibernate-import"),
    ] {
        let bounded = snapshot_name_bounded(&full);
        assert_eq!(bounded.len(), 63);
        assert_eq!(bounded[..50], full[..50]);
        assert_eq!(&bounded[51..], &sha256_hex(&full)[..12]);
        assert!(is_valid_snapshot_name(&bounded), "{bounded}");
    }
    assert_eq!(
        fork_snapshot_name(&long_vm),
        snapshot_name_bounded(&format!("fork-{long_vm}"))
    );
    assert_ne!(
        hibernate_import_snapshot_name(&long_vm),
        hibernate_import_snapshot_name(&vm_name_for_agent(&"n".repeat(63), "demo", 2))
    );
    let repo = format!("registry.example.com/{}", "r".repeat(60));
    let base = clone_base_snapshot_name(&repo, "v1");
    assert_eq!(base.len(), 63);
    assert!(is_valid_snapshot_name(&base));
    assert_eq!(base, clone_base_snapshot_name(&repo, "v1"), "deterministic");
    assert_eq!(&base[50..51], ":");
    // A repository named like a VM's snapshot (even over-long) stays a clone-base name.
    let fork_long = fork_snapshot_name(&long_vm);
    for (repo, tag) in [
        (vm, ""),
        (vm, "latest"),
        (fork_long.as_str(), "latest"),
        (&format!("fork-{vm}")[..], "x"),
        (&format!("{long_vm}-hibernate-import")[..], "latest"),
    ] {
        let name = clone_base_snapshot_name(repo, tag);
        assert!(is_clone_base_name(&name), "{name}");
        assert_ne!(name, repo);
    }

    // Every derived name of every VM name is a valid, bounded snapshot name.
    let mut rng = Rng(99);
    for _ in 0..500 {
        let vm = vm_name_for_pod(&rng.label(63), &rng.label(200));
        for name in [
            fork_snapshot_name(&vm),
            hibernate_import_snapshot_name(&vm),
            vm.clone(),
        ] {
            assert!(is_valid_snapshot_name(&name), "{name}");
        }
    }
}
