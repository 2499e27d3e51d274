//! Pod, VM and host-snapshot naming of `contract.md` §2, plus slot and role derivation.
//! One shared implementation, so the operator and the node agent always agree on names.
//!
//! # Choices for the points the spec leaves open
//!
//! * **VM name shortening (§2.2).** `vm_name_for_pod` is `"vk-" + M + "-" + H` with
//!   `M = <ns>-<pod with dots → dashes>` and `H` = the first 6 lowercase hex of
//!   `sha256("<ns>/<pod>")` over the **original** inputs. When the result would exceed 63
//!   characters, `M` (longer than 53) is replaced by its first 26 characters, a `-`, and its
//!   last 26 characters, so the name is exactly 63 characters. Keeping the *tail* keeps the
//!   agent slot (`-<n>`, at most 11 characters) visible, which is what lets
//!   [`extract_agent_slot`] recover it from the name alone; the hash over the full input keeps
//!   shortened names distinct.
//! * **Character safety.** For every valid Kubernetes namespace and pod name, `M` consists of
//!   `[a-z0-9-]` only, and the formula above is applied verbatim (the spec's test vectors hold).
//!   Inputs that are not valid Kubernetes names (impossible for real pods) are sanitised inside
//!   `M` — ASCII letters lower-cased, any other character outside `[a-z0-9-]` turned into
//!   `-` — so that the result always matches `^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$` and is a
//!   valid OCI repository path component (`-` runs are a legal OCI separator, and `M` is always
//!   framed by the alphanumeric `vk` and the hex suffix). No trailing-separator stripping is
//!   needed after the cut for the same reason.
//! * **Derived snapshot names (§2.4).** VM names keep the full 63 characters. Derived names
//!   (`fork-<vm>`, `<vm>-hibernate-import`, clone bases) get their own deterministic bound via
//!   [`snapshot_name_bounded`], the clone-base rule: unchanged up to 63 characters, otherwise
//!   the first 50 characters + `-` + the first 12 hex of `sha256(full name)` (63 characters).
//!   VM names up to 46 characters therefore produce exactly the Go components' snapshot names.
//! * **Clone-base names (§2.4, deviation for tenant isolation).** A clone base is always
//!   `<repo>:<tag>` — the tag is kept even when it is `latest` or empty (read as `latest`) —
//!   and its over-long form is the first 50 characters + `:` + the first 12 hex of
//!   `sha256(full name)` (63 characters, deterministic). So every clone-base name contains a
//!   `:`, while VM names and every name derived from them (`<vm>`, `fork-<vm>`,
//!   `<vm>-hibernate-import`, bounded with `-`) never do: an image reference can never name a
//!   VM's snapshot on the host ([`is_clone_base_name`]). The spec's `<repo>` alone for
//!   `latest` is not used; a node upgraded from it pulls `<repo>:latest` once more.
//! * **Snapshot-name character rule (§2.4).** [`is_valid_snapshot_name`]: 1–63 characters,
//!   `^[a-zA-Z0-9][a-zA-Z0-9._:/@-]{0,62}$` (`:`/`/`/`@` so image references can name clone
//!   bases). The simulated runtime must enforce the same function.
//! * **Slot recovery (§2.3).** [`extract_agent_slot`] takes the candidate slot from the decimal
//!   digits just before the `-<6 hex>` suffix and accepts it only if recomputing
//!   `vm_name_for_pod(ns, "<cs>-<n>")` gives back exactly `vm`. For unshortened names this
//!   accepts exactly what the spec's prefix rule accepts; for shortened names it still works
//!   because the cut keeps the tail. No slot scan and no label hint are needed.
//! * **Legacy unhashed names** (`vk-<ns>-<cs>-<slot>`) are **not** recognised: they yield `-1`
//!   (role `toolbox`), as in the Go components of the baseline generation. Such pods keep their
//!   VM because every consumer reads `vm.cocoonstack.io/name` instead of recomputing it.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use sha2::{Digest, Sha256};

use crate::contract::parse::truncate_utf8;
use crate::contract::vmspec::SnapshotPolicy;

/// Upper bound of VM names and host snapshot names.
pub const MAX_NAME_LEN: usize = 63;
/// Prefix of every VM name.
pub const VM_NAME_PREFIX: &str = "vk-";
/// Hex characters of the VM name hash suffix.
pub const VM_HASH_HEX_LEN: usize = 6;
/// Longest middle part (`<ns>-<pod>`) that fits unshortened: 63 − `vk-` − `-<6 hex>`.
const MIDDLE_MAX: usize = MAX_NAME_LEN - VM_NAME_PREFIX.len() - 1 - VM_HASH_HEX_LEN;
/// Characters kept from each end of an over-long middle part (26 + `-` + 26 = 53).
const MIDDLE_KEEP: usize = (MIDDLE_MAX - 1) / 2;
/// Characters kept verbatim by [`snapshot_name_bounded`] before the hash.
pub const SNAPSHOT_KEEP_LEN: usize = 50;
/// Hex characters of the [`snapshot_name_bounded`] hash.
pub const SNAPSHOT_HASH_HEX_LEN: usize = 12;
/// Suffix of the one-shot wake import snapshot.
pub const HIBERNATE_IMPORT_SUFFIX: &str = "-hibernate-import";
/// Prefix of the fork baseline snapshot.
pub const FORK_PREFIX: &str = "fork-";
/// Kind of the owner reference that makes a pod a CocoonSet member.
pub const COCOONSET_KIND: &str = "CocoonSet";

fn sha256_hex(input: &str) -> String {
    hex::encode(Sha256::digest(input.as_bytes()))
}

/// Pod name of agent slot `n` (main is slot 0): `<cs>-<n>`.
pub fn pod_name_for_agent(cs: &str, slot: i32) -> String {
    format!("{cs}-{slot}")
}

/// Pod name of toolbox `t`: `<cs>-<t>`.
pub fn pod_name_for_toolbox(cs: &str, toolbox: &str) -> String {
    format!("{cs}-{toolbox}")
}

/// True when a toolbox name parses as an integer (Go `strconv.Atoi` semantics: optional sign,
/// decimal, 64-bit); such names are rejected because `<cs>-<n>` is an agent pod name.
pub fn parse_int_slot_name(toolbox: &str) -> bool {
    toolbox.parse::<i64>().is_ok()
}

/// Every pod name a CocoonSet wants: `<cs>-0 … <cs>-<replicas>` and `<cs>-<toolbox>`
/// (the rebuild-history GC set).
pub fn desired_pod_names<'a, I>(cs: &str, replicas: i32, toolboxes: I) -> BTreeSet<String>
where
    I: IntoIterator<Item = &'a str>,
{
    (0..=replicas.max(0))
        .map(|slot| pod_name_for_agent(cs, slot))
        .chain(toolboxes.into_iter().map(|t| pod_name_for_toolbox(cs, t)))
        .collect()
}

/// `M` of the module docs: `<ns>-<pod>` with dots turned into dashes (and, for inputs that are
/// not valid Kubernetes names, every other unsafe character too).
fn middle_part(ns: &str, pod: &str) -> String {
    format!("{ns}-{pod}")
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '-',
        })
        .collect()
}

/// `VMNameForPod(ns, pod)`: `vk-<ns>-<pod, dots → dashes>-<6 hex of sha256("<ns>/<pod>")>`,
/// shortened deterministically to 63 characters (module docs).
pub fn vm_name_for_pod(ns: &str, pod: &str) -> String {
    let hash = sha256_hex(&format!("{ns}/{pod}"));
    let hash = &hash[..VM_HASH_HEX_LEN];
    let middle = middle_part(ns, pod);
    // `middle` is pure ASCII, so byte offsets are character offsets.
    if middle.len() <= MIDDLE_MAX {
        format!("{VM_NAME_PREFIX}{middle}-{hash}")
    } else {
        let head = &middle[..MIDDLE_KEEP];
        let tail = &middle[middle.len() - MIDDLE_KEEP..];
        format!("{VM_NAME_PREFIX}{head}-{tail}-{hash}")
    }
}

/// Agent VM name: `vm_name_for_pod(ns, "<cs>-<slot>")`.
pub fn vm_name_for_agent(ns: &str, cs: &str, slot: i32) -> String {
    vm_name_for_pod(ns, &pod_name_for_agent(cs, slot))
}

/// Toolbox VM name: `vm_name_for_pod(ns, "<cs>-<toolbox>")`.
pub fn vm_name_for_toolbox(ns: &str, cs: &str, toolbox: &str) -> String {
    vm_name_for_pod(ns, &pod_name_for_toolbox(cs, toolbox))
}

/// The runtime's VM name rule: `^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$`.
pub fn is_valid_vm_name(name: &str) -> bool {
    name_matches(name, |c| matches!(c, b'.' | b'_' | b'-'))
}

/// The chosen host snapshot-name rule: `^[a-zA-Z0-9][a-zA-Z0-9._:/@-]{0,62}$`.
pub fn is_valid_snapshot_name(name: &str) -> bool {
    name_matches(name, |c| {
        matches!(c, b'.' | b'_' | b'-' | b':' | b'/' | b'@')
    })
}

/// 1–63 bytes, first alphanumeric, the rest alphanumeric or accepted by `extra`.
fn name_matches(name: &str, extra: fn(u8) -> bool) -> bool {
    let bytes = name.as_bytes();
    match bytes.split_first() {
        Some((first, rest)) => {
            bytes.len() <= MAX_NAME_LEN
                && first.is_ascii_alphanumeric()
                && rest.iter().all(|&c| c.is_ascii_alphanumeric() || extra(c))
        }
        None => false,
    }
}

/// An OCI repository path component: `[a-z0-9]+` groups separated by `.`, `_`, `__` or a run
/// of `-`, with no leading or trailing separator.
pub fn is_valid_oci_component(name: &str) -> bool {
    let bytes = name.as_bytes();
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let mut i = 0;
    loop {
        // One alphanumeric group.
        let start = i;
        while i < bytes.len() && alnum(bytes[i]) {
            i += 1;
        }
        if i == start {
            return false;
        }
        if i == bytes.len() {
            return true;
        }
        // One separator, which must be followed by another group.
        match bytes[i] {
            b'.' => i += 1,
            b'_' => {
                i += if bytes.get(i + 1) == Some(&b'_') {
                    2
                } else {
                    1
                }
            }
            b'-' => {
                while i < bytes.len() && bytes[i] == b'-' {
                    i += 1;
                }
            }
            _ => return false,
        }
    }
}

/// Bounds a derived host snapshot name: unchanged up to 63 characters, otherwise the first 50
/// characters + `-` + the first 12 hex of sha256(full name).
pub fn snapshot_name_bounded(full: &str) -> String {
    if full.len() <= MAX_NAME_LEN {
        return full.to_owned();
    }
    let hash = sha256_hex(full);
    format!(
        "{}-{}",
        truncate_utf8(full, SNAPSHOT_KEEP_LEN),
        &hash[..SNAPSHOT_HASH_HEX_LEN]
    )
}

/// Fork baseline snapshot of VM `vm`: `fork-<vm>`, bounded.
pub fn fork_snapshot_name(vm: &str) -> String {
    snapshot_name_bounded(&format!("{FORK_PREFIX}{vm}"))
}

/// One-shot wake import snapshot of VM `vm`: `<vm>-hibernate-import`, bounded.
pub fn hibernate_import_snapshot_name(vm: &str) -> String {
    snapshot_name_bounded(&format!("{vm}{HIBERNATE_IMPORT_SUFFIX}"))
}

/// Separator of a clone-base name: every clone-base name contains it, no VM-derived name can.
pub const CLONE_BASE_TAG_SEPARATOR: char = ':';

/// Clone base snapshot of an image: always `<repo>:<tag>` (an empty tag reads `latest`), so
/// that it lies in a name space no VM snapshot can occupy (module docs); over 63 characters
/// the first 50 characters + `:` + the first 12 hex of sha256(full name).
pub fn clone_base_snapshot_name(repo: &str, tag: &str) -> String {
    let tag = if tag.is_empty() {
        crate::contract::tags::LATEST
    } else {
        tag
    };
    let full = format!("{repo}{CLONE_BASE_TAG_SEPARATOR}{tag}");
    if full.len() <= MAX_NAME_LEN {
        return full;
    }
    let hash = sha256_hex(&full);
    format!(
        "{}{CLONE_BASE_TAG_SEPARATOR}{}",
        truncate_utf8(&full, SNAPSHOT_KEEP_LEN),
        &hash[..SNAPSHOT_HASH_HEX_LEN]
    )
}

/// Is `name` in the clone-base name space (it contains [`CLONE_BASE_TAG_SEPARATOR`])? VM
/// snapshots (`<vm>`, `fork-<vm>`, `<vm>-hibernate-import`, bounded or not) never are.
pub fn is_clone_base_name(name: &str) -> bool {
    name.contains(CLONE_BASE_TAG_SEPARATOR)
}

/// `ExtractAgentSlot(ns, cs, vm)`: the agent slot `n >= 0` whose VM name is exactly `vm`, or
/// `-1` (toolbox, foreign or legacy name). Works for shortened names (module docs).
pub fn extract_agent_slot(ns: &str, cs: &str, vm: &str) -> i32 {
    if cs.is_empty() {
        return -1;
    }
    let Some(body) = strip_hash_suffix(vm) else {
        return -1;
    };
    let digits_start = body
        .bytes()
        .rposition(|c| !c.is_ascii_digit())
        .map_or(0, |i| i + 1);
    let Ok(slot) = body[digits_start..].parse::<i32>() else {
        return -1;
    };
    // Verification by recomputation rejects toolboxes like `1-x`, leading zeros and foreign sets.
    if vm_name_for_agent(ns, cs, slot) == vm {
        slot
    } else {
        -1
    }
}

/// `vm` without its `-<6 lowercase hex>` suffix, if it has one.
fn strip_hash_suffix(vm: &str) -> Option<&str> {
    let split = vm.len().checked_sub(VM_HASH_HEX_LEN + 1)?;
    let (body, suffix) = (vm.get(..split)?, vm.get(split..)?);
    let hex = suffix.strip_prefix('-')?;
    hex.bytes()
        .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
        .then_some(body)
}

/// Role of a managed VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Slot 0.
    Main,
    /// Slot > 0.
    SubAgent,
    /// Not an agent slot.
    Toolbox,
}

impl Role {
    /// The label value (`cocoonset.cocoonstack.io/role`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Role::Main => "main",
            Role::SubAgent => "sub-agent",
            Role::Toolbox => "toolbox",
        }
    }

    /// Exact parse of the label value.
    pub fn from_wire(value: &str) -> Option<Self> {
        [Role::Main, Role::SubAgent, Role::Toolbox]
            .into_iter()
            .find(|r| r.as_str() == value)
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `-1` (or any negative) → toolbox, `0` → main, `> 0` → sub-agent.
pub fn role_for_slot(slot: i32) -> Role {
    match slot {
        0 => Role::Main,
        s if s > 0 => Role::SubAgent,
        _ => Role::Toolbox,
    }
}

/// The name of the first owner reference of kind `CocoonSet`.
pub fn owner_cocoonset_name(owners: &[OwnerReference]) -> Option<&str> {
    owners
        .iter()
        .find(|o| o.kind == COCOONSET_KIND)
        .map(|o| o.name.as_str())
}

/// `RoleForPod(pod, vm)` (node agent): the slot of `vm` within the owning CocoonSet; a pod with
/// no CocoonSet owner is a toolbox. Never a name-suffix heuristic.
pub fn role_for_pod(ns: &str, owner_cocoonset: Option<&str>, vm: &str) -> Role {
    match owner_cocoonset {
        Some(cs) => role_for_slot(extract_agent_slot(ns, cs, vm)),
        None => Role::Toolbox,
    }
}

/// `ShouldSnapshotVM(policy, role)`: push a routine `:latest` on pod delete? Unknown or empty
/// policies arrive here as `Always` (see `VmSpec::effective_snapshot_policy`).
pub fn should_snapshot_vm(policy: SnapshotPolicy, role: Role) -> bool {
    match policy {
        SnapshotPolicy::Never => false,
        SnapshotPolicy::MainOnly => role == Role::Main,
        SnapshotPolicy::Always => true,
    }
}

/// `shouldKeepLatestTag(cs, vm)` (teardown GC): keep the VM's `:latest`?
pub fn should_keep_latest_tag(policy: SnapshotPolicy, ns: &str, cs: &str, vm: &str) -> bool {
    match policy {
        SnapshotPolicy::Never => false,
        SnapshotPolicy::MainOnly => extract_agent_slot(ns, cs, vm) == 0,
        SnapshotPolicy::Always => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(is_valid_snapshot_name("repo@sha256:abc"));
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
}
