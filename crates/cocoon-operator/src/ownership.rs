//! The operator's one ownership gate: whether a VM name belongs to a CocoonSet or a
//! CocoonHibernation, decided by recomputing it from the object's own pods. Every registry
//! probe, delete and reclaim of both controllers asks it first (`DESIGN.md`, "The trust
//! boundary"; issue 26 item 3).
//!
//! # The rule
//!
//! The user-writable places that carry VM names — a set's `delete-vm-names` stash and
//! `hibernate-reclaim` record, a pod's `vm.cocoonstack.io/name`, a CR's `status.vmName` — are
//! hints. A name is acted on only when it is `VMNameForPod(ns, pod)` (`contract.md` §2.2) for
//! a pod the object owns by name:
//!
//! * a **CocoonSet** `<ns>/<cs>` owns the pods `<cs>-<slot>` (any slot ≥ 0: scaled-down slots
//!   keep their stashed names) and `<cs>-<toolbox>` (any DNS-label toolbox name: removed
//!   toolboxes too) of its namespace. The candidate pod is recovered from the name itself
//!   (the text between `vk-<ns>-<cs>-` and the hash, or, for names shortened to 63
//!   characters, every dash-split of the kept tail) and from the set's own objects (spec and
//!   status toolboxes, its pods' names); a candidate counts only when recomputing the name
//!   from `(ns, <cs>-<candidate>)` gives back exactly the name. The namespace is inside the
//!   hash, so no name of another namespace ever passes.
//! * a **CocoonHibernation** `<ns>/<name>` owns exactly the VM of `(ns, spec.podRef.name)`.
//!
//! **Legacy unhashed names** (`vk-<ns>-<pod, dots → dashes>`, written by earlier operators and
//! kept by the spec for their pods) are accepted only with [`LegacyNames::Accept`], off by
//! default: the form is ambiguous between namespaces (`vk-a-b-x-0` is `a`/`b-x-0` and
//! `a-b`/`x-0`), so accepting it lets a tenant of namespace `a` name a legacy VM of namespace
//! `a-b`. Turn it on only while legacy VMs exist and no namespace name is a dash-extension of
//! another (or the cluster has one tenant). Without it the tags of legacy VMs are left in the
//! registry (reported like any other ignored name) and `kubectl cocoon registry gc` or an
//! administrator collects them.
//!
//! Within one namespace the gate cannot tell two sets apart whose pod names overlap (set
//! `demo`'s toolbox `x-0` and set `demo-x`'s slot 0 are the same pod name `demo-x-0`): the
//! naming contract itself gives them one VM. That is a single tenant's own business.
//!
//! The gate proves that a name is computed from the object's pods, not that the artifact under
//! it is theirs: a shortened VM name keeps a 24-bit hash, so another namespace's pod can share
//! it. Every tag delete therefore also asks the owner rule on the artifact's recorded owner
//! ([`crate::registry::TagRegistry::delete_owned_tag`], [`SetVms::pod_of`]; issue 35 item 2).
//!
//! Known limit: a toolbox name of more than 25 characters whose VM name was shortened, whose
//! toolbox has left the spec and whose pod is gone cannot be recovered from the name; its tags
//! are left behind (and reported), never another tenant's deleted.

use std::collections::BTreeSet;

use cocoon_api::crd::set::CocoonSet;
use cocoon_api::naming::{self, MAX_NAME_LEN, VM_HASH_HEX_LEN, VM_NAME_PREFIX};
use kube::ResourceExt;

/// Whether the legacy unhashed VM names of an object's own pods count as its own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LegacyNames {
    /// Only the hashed form (the default; see the module docs).
    #[default]
    Refuse,
    /// Also `vk-<ns>-<pod, dots → dashes>` of the object's own pods.
    Accept,
}

/// The legacy unhashed VM name of an earlier operator: `vk-<ns>-<pod, dots → dashes>`.
pub fn legacy_vm_name(ns: &str, pod: &str) -> String {
    format!("{VM_NAME_PREFIX}{ns}-{}", pod.replace('.', "-"))
}

/// Is `vm` the VM of pod `<ns>/<pod>` (hashed, or legacy where accepted)?
pub fn is_pod_vm(ns: &str, pod: &str, vm: &str, legacy: LegacyNames) -> bool {
    !vm.is_empty()
        && (vm == naming::vm_name_for_pod(ns, pod)
            || (legacy == LegacyNames::Accept && vm == legacy_vm_name(ns, pod)))
}

/// The gate for a CocoonHibernation: `vm` is the VM of `(ns, podRef)`.
pub fn hibernation_owns(ns: &str, pod_ref: &str, vm: &str, legacy: LegacyNames) -> bool {
    !pod_ref.is_empty() && is_pod_vm(ns, pod_ref, vm, legacy)
}

/// The gate for one CocoonSet: its namespace, its name and the pod-name suffixes its own
/// objects name (toolboxes of the spec and the status, its pods).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetVms {
    ns: String,
    set: String,
    /// `<suffix>` of pod names `<set>-<suffix>` the set's objects name.
    known: BTreeSet<String>,
    legacy: LegacyNames,
}

impl SetVms {
    /// The gate of set `<ns>/<set>` with no extra pod names.
    pub fn new(ns: &str, set: &str, legacy: LegacyNames) -> Self {
        SetVms {
            ns: ns.to_string(),
            set: set.to_string(),
            known: BTreeSet::new(),
            legacy,
        }
    }

    /// The gate of `cs`: its toolboxes (spec and status) and the names of `pods` (its owned
    /// pods) as extra candidates.
    pub fn for_set<'a>(
        cs: &CocoonSet,
        pods: impl IntoIterator<Item = &'a str>,
        legacy: LegacyNames,
    ) -> Self {
        let ns = cs.namespace().unwrap_or_default();
        let mut gate = SetVms::new(&ns, &cs.name_any(), legacy);
        gate.known
            .extend(cs.spec.toolboxes.iter().map(|t| t.name.clone()));
        if let Some(st) = &cs.status {
            gate.known
                .extend(st.toolboxes.iter().map(|t| t.name.clone()));
        }
        gate.add_pods(pods);
        gate
    }

    /// Adds the names of pods `<set>-<suffix>` (others are not this set's and are skipped).
    pub fn add_pods<'a>(&mut self, pods: impl IntoIterator<Item = &'a str>) {
        let prefix = format!("{}-", self.set);
        for p in pods {
            if let Some(suffix) = p.strip_prefix(&prefix).filter(|s| !s.is_empty()) {
                self.known.insert(suffix.to_string());
            }
        }
    }

    /// The object's name for messages: `CocoonSet <ns>/<name>`.
    pub fn owner(&self) -> String {
        format!("CocoonSet {}/{}", self.ns, self.set)
    }

    /// Is `vm` the VM of one of this set's pods?
    pub fn owns(&self, vm: &str) -> bool {
        self.pod_of(vm).is_some()
    }

    /// The name of this set's pod whose VM `vm` is (the pod a registry artifact of `vm` must
    /// record as its owner), or `None` when `vm` is not one of this set's VMs.
    pub fn pod_of(&self, vm: &str) -> Option<String> {
        if vm.is_empty() {
            return None;
        }
        let slot = naming::extract_agent_slot(&self.ns, &self.set, vm);
        if slot >= 0 {
            return Some(format!("{}-{slot}", self.set));
        }
        self.known
            .iter()
            .map(String::as_str)
            .chain(self.recovered_suffixes(vm))
            .find(|suffix| self.is_member_vm(suffix, vm))
            .map(|suffix| format!("{}-{suffix}", self.set))
    }

    /// The set's namespace.
    pub fn namespace(&self) -> &str {
        &self.ns
    }

    /// `vm` is the VM of pod `<set>-<suffix>`, a member name: an agent slot (canonical
    /// decimal) or a toolbox name (a DNS label that is not an integer).
    fn is_member_vm(&self, suffix: &str, vm: &str) -> bool {
        let member = if naming::parse_int_slot_name(suffix) {
            suffix
                .parse::<i32>()
                .is_ok_and(|n| n >= 0 && n.to_string() == suffix)
        } else {
            is_dns_label(suffix)
        };
        member && is_pod_vm(&self.ns, &format!("{}-{suffix}", self.set), vm, self.legacy)
    }

    /// The suffixes `vm` itself suggests (each is verified by recomputation afterwards).
    fn recovered_suffixes<'v>(&self, vm: &'v str) -> Vec<&'v str> {
        let mut out = Vec::new();
        let prefix = format!(
            "{VM_NAME_PREFIX}{}-{}-",
            self.ns,
            self.set.replace('.', "-")
        );
        let hashed_body = strip_hash_suffix(vm);
        if let Some(body) = hashed_body
            && let Some(suffix) = body.strip_prefix(&prefix)
        {
            out.push(suffix);
        }
        // Legacy: everything after the prefix.
        if self.legacy == LegacyNames::Accept
            && let Some(suffix) = vm.strip_prefix(&prefix)
        {
            out.push(suffix);
        }
        // Shortened (63 characters): the suffix is a dash-split of the kept tail.
        if vm.len() == MAX_NAME_LEN
            && let Some(body) = hashed_body
        {
            let tail_start = body.len().saturating_sub(TAIL_KEPT);
            if let Some(tail) = body.get(tail_start..) {
                out.push(tail);
                out.extend(
                    tail.char_indices()
                        .filter(|(_, c)| *c == '-')
                        .filter_map(|(i, _)| tail.get(i + 1..)),
                );
            }
        }
        out.retain(|s| !s.is_empty());
        out
    }

    /// Splits `names` into this set's own VMs and the others, each in the given order.
    pub fn split<'a>(
        &self,
        names: impl IntoIterator<Item = &'a str>,
    ) -> (Vec<String>, Vec<String>) {
        let (own, foreign): (Vec<&str>, Vec<&str>) =
            names.into_iter().partition(|vm| self.owns(vm));
        (
            own.into_iter().map(str::to_string).collect(),
            foreign.into_iter().map(str::to_string).collect(),
        )
    }
}

/// Characters of the `<ns>-<pod>` part that a shortened VM name keeps at its end
/// (`naming`'s cut: 26 + `-` + 26).
const TAIL_KEPT: usize = 26;

/// `vm` without its `-<6 lowercase hex>` suffix, if it has one.
fn strip_hash_suffix(vm: &str) -> Option<&str> {
    let split = vm.len().checked_sub(VM_HASH_HEX_LEN + 1)?;
    let (body, suffix) = (vm.get(..split)?, vm.get(split..)?);
    let hex = suffix.strip_prefix('-')?;
    hex.bytes()
        .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
        .then_some(body)
}

/// A DNS label (the toolbox name pattern): `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, 1–63 characters.
fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && b.len() <= MAX_NAME_LEN
        && b.first().is_some_and(alnum)
        && b.last().is_some_and(alnum)
        && b.iter().all(|c| alnum(c) || *c == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;
    use cocoon_api::naming::vm_name_for_pod;

    const REFUSE: LegacyNames = LegacyNames::Refuse;
    const ACCEPT: LegacyNames = LegacyNames::Accept;

    #[test]
    fn a_set_owns_exactly_the_vms_of_its_own_pods() {
        let gate = SetVms::new("ns", "demo", REFUSE);
        let long_tb = "a-very-long-toolbox-name-that-is-cut";
        let long_ns = "team-with-a-rather-long-namespace-name";
        let cases: Vec<(&str, String, bool)> = vec![
            ("main (spec vector)", "vk-ns-demo-0-505043".into(), true),
            (
                "sub-agent (spec vector)",
                "vk-ns-demo-1-d239dc".into(),
                true,
            ),
            ("toolbox (spec vector)", "vk-ns-demo-tb-7f9787".into(), true),
            (
                "toolbox db-0 (spec vector)",
                "vk-ns-demo-db-0-5b329f".into(),
                true,
            ),
            ("a scaled-down slot", vm_name_for_pod("ns", "demo-17"), true),
            (
                "a removed toolbox",
                vm_name_for_pod("ns", "demo-gone"),
                true,
            ),
            (
                "same pod, other namespace",
                vm_name_for_pod("victim", "demo-0"),
                false,
            ),
            (
                "other set, same namespace",
                vm_name_for_pod("ns", "other-0"),
                false,
            ),
            (
                "a namespace that extends this one",
                vm_name_for_pod("ns-demo", "x-0"),
                false,
            ),
            ("wrong hash", "vk-ns-demo-0-000000".into(), false),
            (
                "legacy form, refused by default",
                legacy_vm_name("ns", "demo-0"),
                false,
            ),
            ("leading-zero slot", vm_name_for_pod("ns", "demo-01"), false),
            ("not a DNS label", vm_name_for_pod("ns", "demo-Tb"), false),
            ("the set's own name", vm_name_for_pod("ns", "demo"), false),
            ("empty", String::new(), false),
            ("a base image", "ubuntu".into(), false),
            (
                "a shortened long toolbox name",
                vm_name_for_pod("ns", &format!("demo-{long_tb}")),
                true,
            ),
        ];
        for (what, vm, want) in cases {
            assert_eq!(gate.owns(&vm), want, "{what}: {vm}");
        }
        // Shortened names recover the slot and short toolbox names from the kept tail.
        let long = SetVms::new(long_ns, "a-set-with-a-long-name-too", REFUSE);
        for pod in [
            "a-set-with-a-long-name-too-3",
            "a-set-with-a-long-name-too-tb",
        ] {
            let vm = vm_name_for_pod(long_ns, pod);
            assert_eq!(vm.len(), MAX_NAME_LEN, "{vm} is shortened");
            assert!(long.owns(&vm), "{pod}: {vm}");
        }
        assert!(!long.owns(&vm_name_for_pod("other", "a-set-with-a-long-name-too-3")));
    }

    #[test]
    fn long_toolbox_names_come_from_the_sets_own_objects() {
        let ns = "team-with-a-rather-long-namespace-name";
        let pod = "demo-toolbox-with-a-name-longer-than-the-kept-tail";
        let vm = vm_name_for_pod(ns, pod);
        assert_eq!(vm.len(), MAX_NAME_LEN);
        let mut gate = SetVms::new(ns, "demo", REFUSE);
        assert!(!gate.owns(&vm), "not recoverable from the name alone");
        gate.add_pods([pod, "other-0"]);
        assert!(gate.owns(&vm), "its pod names it");
    }

    #[test]
    fn legacy_names_only_on_request_and_only_of_the_sets_pods() {
        let refuse = SetVms::new("ns", "demo.v2", REFUSE);
        let accept = SetVms::new("ns", "demo.v2", ACCEPT);
        let own = legacy_vm_name("ns", "demo.v2-0");
        assert_eq!(own, "vk-ns-demo-v2-0");
        assert!(!refuse.owns(&own));
        assert!(accept.owns(&own));
        assert!(accept.owns(&legacy_vm_name("ns", "demo.v2-tb")));
        assert!(
            accept.owns(&vm_name_for_pod("ns", "demo.v2-tb")),
            "hashed still"
        );
        assert!(!accept.owns(&legacy_vm_name("other", "demo.v2-0")));
        assert!(!accept.owns(&legacy_vm_name("ns", "demo-0")));
    }

    #[test]
    fn a_hibernation_owns_only_the_vm_of_its_pod_ref() {
        let cases = [
            ("ns", "p", vm_name_for_pod("ns", "p"), REFUSE, true),
            ("ns", "p", vm_name_for_pod("victim", "p"), REFUSE, false),
            ("ns", "p", vm_name_for_pod("ns", "q"), REFUSE, false),
            ("ns", "", vm_name_for_pod("ns", ""), REFUSE, false),
            ("ns", "p.x", legacy_vm_name("ns", "p.x"), REFUSE, false),
            ("ns", "p.x", legacy_vm_name("ns", "p.x"), ACCEPT, true),
            ("a", "b-x-0", legacy_vm_name("a-b", "x-0"), ACCEPT, true),
        ];
        for (ns, pod, vm, legacy, want) in cases {
            assert_eq!(
                hibernation_owns(ns, pod, &vm, legacy),
                want,
                "{ns}/{pod} {vm} {legacy:?}"
            );
        }
    }

    #[test]
    fn pod_of_names_the_pod_an_artifact_must_record() {
        let mut gate = SetVms::new("ns", "demo", REFUSE);
        let long = "a-toolbox-name-long-enough-to-be-cut-from-the-vm-name";
        gate.add_pods([format!("demo-{long}").as_str()]);
        for (vm, want) in [
            (vm_name_for_pod("ns", "demo-0"), Some("demo-0".to_string())),
            (vm_name_for_pod("ns", "demo-7"), Some("demo-7".to_string())),
            (
                vm_name_for_pod("ns", "demo-tb"),
                Some("demo-tb".to_string()),
            ),
            (
                vm_name_for_pod("ns", &format!("demo-{long}")),
                Some(format!("demo-{long}")),
            ),
            (vm_name_for_pod("victim", "demo-0"), None),
            (String::new(), None),
        ] {
            assert_eq!(gate.pod_of(&vm), want, "{vm}");
            assert_eq!(gate.owns(&vm), want.is_some(), "{vm}");
        }
    }

    #[test]
    fn split_keeps_the_order_of_each_part() {
        let gate = SetVms::new("ns", "demo", REFUSE);
        let (own, foreign) = gate.split([
            "vk-ns-demo-1-d239dc",
            "vk-victim-demo-0-abcdef",
            "vk-ns-demo-0-505043",
        ]);
        assert_eq!(own, ["vk-ns-demo-1-d239dc", "vk-ns-demo-0-505043"]);
        assert_eq!(foreign, ["vk-victim-demo-0-abcdef"]);
    }
}
