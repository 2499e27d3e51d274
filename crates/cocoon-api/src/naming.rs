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
//!   `^[a-zA-Z0-9][a-zA-Z0-9._:/-]{0,62}$` (`:`/`/` so image references can name clone
//!   bases). This is the stricter rule of the supported `cocoon` releases: v0.5.x refuses any
//!   other name (`types/vm.go`'s snapshot-name check), so `@` (a digest reference) is refused
//!   here too, before anything runs. The simulated runtime enforces the same function.
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

pub(crate) fn sha256_hex(input: &str) -> String {
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

/// The chosen host snapshot-name rule: `^[a-zA-Z0-9][a-zA-Z0-9._:/-]{0,62}$` (the rule of
/// `cocoon` v0.5.x, stricter than v0.3.8's).
pub fn is_valid_snapshot_name(name: &str) -> bool {
    name_matches(name, |c| matches!(c, b'.' | b'_' | b'-' | b':' | b'/'))
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
