//! Tenant isolation on the node: which VMs, fork sources and `clone-from-dir` directories a
//! pod may use. Pure rules; the shells in `create`, `update`, `delete` and `reconcile` gather
//! the inputs (the agent's tracked pods, the configured clone roots) and act on the verdict.
//!
//! # The rule
//!
//! A pod `<ns>/<pod>` may only bring up, adopt, restore, hibernate (snapshot) or delete the
//! local snapshots of **its own VM**, fork from a VM of **its own namespace**, and clone from a
//! directory under a **configured clone root**:
//!
//! * **Own VM** (`vm.cocoonstack.io/name`). The name must be exactly
//!   `VMNameForPod(ns, pod)` (`contract.md` §2.2, the hashed scheme the operator writes). Within
//!   a namespace this also means a pod can never name a sibling's VM. The legacy unhashed form
//!   `vk-<ns>-<pod>` of an earlier operator is ambiguous between namespaces (`vk-a-b-x` is
//!   `a`/`b-x` and `a-b`/`x`), so it never proves ownership by itself: it is accepted only
//!   where this agent already holds evidence that ties the VM to this very pod — the startup
//!   reconcile adopting, **by its runtime id**, a VM the pod annotates and whose runtime name
//!   is the pod's VM name — and the pod then stays tracked, so its later hibernate and wake
//!   need no new proof. A CreatePod (fresh boot, adopt by name, explicit or derived restore)
//!   for a legacy name is refused: new pods always get hashed names from this project's
//!   operator. **Mixed fleets:** `VK_ACCEPT_LEGACY_VM_NAMES=true` (default off) accepts the
//!   legacy form for new pods too (create, adopt, restore, startup tracking by name), so the
//!   Go operator v0.3.3 can drive this agent during a migration. Risk: `vk-a-b-x` is then
//!   both `a`/`b-x` and `a-b`/`x`; only safe on single-tenant clusters or where no namespace
//!   name is a dash-extension of another (the holder rule below still protects VMs held here).
//! * **Never a VM another live pod holds.** Whatever the name proof, a VM name that another
//!   admitted pod holds (another namespace or name, or another UID; tracked with a VM,
//!   hibernated without one, or unmanaged) is refused. A pod is a holder only once it passed
//!   this check ([`Admitted`]): a pod being refused never blocks nor enables anything.
//! * **Fixed at admission** ([`Admitted`], [`check_update`]). The VM name, `managed` and an
//!   unmanaged pod's pre-assigned `vm.cocoonstack.io/id` are fixed when the agent first
//!   tracks the pod; an update that changes them is refused. No runtime verb runs against an
//!   unmanaged pod's synthetic record, and an unmanaged pod is deleted as unmanaged.
//! * **Images** ([`check_image_ref`]). `cocoonset.cocoonstack.io/image` must not name a VM's
//!   registry repository (last path component `vk-…`) nor a `:hibernate` tag. A clone base is
//!   looked up on the host only by its exact name `<repo>:<tag>`, which always contains a `:`
//!   (`cocoon_api::naming::clone_base_snapshot_name`); VM snapshots (`<vm>`, `fork-<vm>`,
//!   `<vm>-hibernate-import`) never do, so an image can never resolve to a VM's snapshot.
//! * **Exact names.** The runtime resolves a reference by exact id, name or id prefix of ≥ 3
//!   characters; every lookup by name this agent makes checks that the record it got back
//!   carries exactly the requested name (`Artifacts::snapshot_exact`, `Artifacts::vm_exact`).
//! * **Snapshot owners** ([`check_artifact_owner`]). Every snapshot artifact this agent
//!   pushes records `cocoonstack.snapshot.owner-namespace` / `owner-pod`; a restore, wake or
//!   clone-base pull uses an artifact that carries them only for that namespace (and, for the
//!   pod's own VM, that pod). Artifacts without them (pushed by the Go components) are
//!   accepted where the name checks already prove ownership: the pod's own `VMNameForPod`
//!   repository, or a clone base that names no VM repository.
//! * **Fork source** (`vm.cocoonstack.io/fork-from`, [`check_fork_source`],
//!   [`check_fork_save`]). A fork reads the source VM's memory and disk, so the source must be
//!   a **managed** VM of the pod's **own namespace**. When admitted pods hold the source, every
//!   one must be a managed pod of the same namespace whose tracked record (if it has one yet)
//!   is a real runtime record named exactly the source: a holder in another namespace refuses
//!   it, and so does an unmanaged holder — its record is synthetic, its id is whatever the
//!   tenant pre-assigned, and that id is never handed to the runtime (it could name, or be an
//!   id prefix of, another namespace's VM). With no holder, the source must verify as
//!   `VMNameForPod(ns, candidate)` for the candidate pod name recovered from the name (the
//!   text between `vk-<ns>-` and the `-<6 hex>` suffix, taken without dots). Names that cannot
//!   be verified that way (legacy, shortened, dotted pod names) need a same-namespace holder.
//!   The rule runs at admission and **again at the moment of the save** of `fork-<src>`, with
//!   the tables as they are then and the runtime record fetched by its exact name
//!   (`Artifacts::vm_exact`, never the by-name table): with a holder, that record's id and name
//!   must be those of the holder's tracked, non-synthetic VM; without one, the record found by
//!   exact name is the source. An existing `fork-<src>` baseline is reused only after the
//!   same rule passed. A managed holder whose VM is not tracked yet (still booting, waking or
//!   hibernated) cannot be saved from: the fork is refused, and its retry works once the
//!   holder runs.
//! * **Unmanaged pods** (static toolboxes) are checked on their VM name too. Their
//!   pre-assigned `vm.cocoonstack.io/id` is only a label of the synthetic record: no runtime
//!   verb ever receives it (no fork or snapshot source, no hibernate, delete, restart, exec,
//!   logs or stats). It must not be in the VM-name form (`vk-…`, `fork-vk-…`, any case): those
//!   are the names this agent gives VMs and fork baselines, and the runtime resolves a
//!   reference by name, so such an id would alias another pod's VM as soon as it exists. It
//!   must not be exactly the id of a VM this node tracks or the runtime knows either (runtime
//!   events are mapped to pods by exact id). An id that is merely a *prefix* of a VM's id is
//!   admitted: it reaches nothing, and refusing it would answer "some VM's id starts with
//!   this" to any tenant (the same holds for names: the VM-name form is refused by its
//!   spelling, whatever exists).
//! * **`clone-from-dir`.** The directory must lie under one of the roots of
//!   `VK_CLONE_FROM_DIR_ROOTS`, compared by whole path components (`/a` admits `/a` and `/a/x`,
//!   never `/ab`); with no root configured every `clone-from-dir` is refused. When the path
//!   exists, its symlink-resolved form must lie under a (resolved) root too, so a link inside
//!   a root cannot point out of it. Values the spec's own validation rejects (relative or not
//!   canonical, §6.2 step 3) are left to that validation and never reach the runtime.
//!
//! Each refusal names the annotation; the shells report it through failOp with the reason
//! `TenantIsolationRefused` (`create`/`update`) and leave every other VM untouched.
//!
//! # Known limit
//!
//! The contract's hash suffix has 24 bits. A tenant whose namespace shares the first 26
//! characters with another's could search for a pod name whose *shortened* (over 63
//! characters) VM name collides with a victim's; the holder rule still protects VMs held on
//! this node, and the owner annotations protect the registry artifacts this project pushed:
//! pulls check them here, a push never replaces a tag recording another owner, and a local
//! copy of such a tag is never dropped (`cocoon_api::contract::owner`, issue 35 item 2).

use std::path::{Path, PathBuf};

use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::env::node as env;
use cocoon_api::contract::owner::Actor;
use cocoon_api::naming::{VM_HASH_HEX_LEN, VM_NAME_PREFIX, vm_name_for_pod};
use k8s_openapi::api::core::v1::Pod;

/// How a VM name relates to a pod under the naming contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameForm {
    /// Exactly `VMNameForPod(ns, pod)`.
    Hashed,
    /// Exactly the legacy unhashed `vk-<ns>-<pod, dots → dashes>`.
    Legacy,
}

/// The legacy unhashed VM name of an earlier operator: `vk-<ns>-<pod, dots → dashes>`.
pub fn legacy_vm_name(ns: &str, pod: &str) -> String {
    format!("{VM_NAME_PREFIX}{ns}-{}", pod.replace('.', "-"))
}

/// Is `vm` the VM name of pod `<ns>/<pod>`, and in which form?
pub fn own_name_form(ns: &str, pod: &str, vm: &str) -> Option<NameForm> {
    if vm == vm_name_for_pod(ns, pod) {
        Some(NameForm::Hashed)
    } else if vm == legacy_vm_name(ns, pod) {
        Some(NameForm::Legacy)
    } else {
        None
    }
}

/// Does `vm` verify as `VMNameForPod(ns, candidate)` for the candidate pod name recovered from
/// it? (Unshortened, dot-free pod names only; see the module docs.)
pub fn verifies_for_namespace(ns: &str, vm: &str) -> bool {
    let Some(rest) = vm.strip_prefix(&format!("{VM_NAME_PREFIX}{ns}-")) else {
        return false;
    };
    let Some(candidate) = rest
        .len()
        .checked_sub(VM_HASH_HEX_LEN + 1)
        .and_then(|cut| rest.get(..cut))
    else {
        return false;
    };
    !candidate.is_empty() && vm_name_for_pod(ns, candidate) == vm
}

/// A pod tracked by this agent that holds a VM name (by annotation or by its tracked VM).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its UID.
    pub uid: String,
}

/// Why a pod was refused. The text names the annotation and is the Event / lifecycle message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// `vm.cocoonstack.io/name` is not this pod's VM under the naming contract.
    #[error(
        "annotation {key}: VM {vm:?} does not belong to pod {ns}/{pod} (its VM name is {expected:?})",
        key = ann::VM_NAME
    )]
    NotOwnVm {
        vm: String,
        ns: String,
        pod: String,
        expected: String,
    },
    /// `vm.cocoonstack.io/name` is the legacy form, which a CreatePod cannot prove.
    #[error(
        "annotation {key}: VM {vm:?} has the legacy unhashed form, which does not prove it belongs to namespace {ns:?}; only a VM this node already runs for the pod is kept (new pods use {expected:?})",
        key = ann::VM_NAME
    )]
    LegacyUnproven {
        vm: String,
        ns: String,
        expected: String,
    },
    /// Another live pod holds the VM.
    #[error("annotation {key}: VM {vm:?} is held by another live pod", key = ann::VM_NAME)]
    HeldByOther { vm: String },
    /// The fork source is not a VM of this namespace.
    #[error(
        "annotation {key}: VM {vm:?} does not belong to namespace {ns:?}",
        key = ann::FORK_FROM
    )]
    ForeignForkSource { vm: String, ns: String },
    /// The fork source is held by an unmanaged pod (a synthetic record, never a runtime VM).
    #[error(
        "annotation {key}: VM {vm:?} is held by {holder}, which is not a managed VM pod; an unmanaged pod's record is never a fork source",
        key = ann::FORK_FROM
    )]
    UnmanagedForkSource { vm: String, holder: String },
    /// At the save, the VM the runtime has under the source's exact name is not the tracked VM
    /// of the managed pod holding it (not running yet, or not that VM).
    #[error(
        "annotation {key}: VM {vm:?} is not running as the tracked VM of the pod that holds it; the fork is retried once that pod runs",
        key = ann::FORK_FROM
    )]
    ForkSourceNotTracked { vm: String },
    /// The `clone-from-dir` directory is outside every configured root.
    #[error(
        "annotation {key}: {dir:?} is not under a configured clone root ({var})",
        key = ann::CLONE_FROM_DIR,
        var = env::CLONE_FROM_DIR_ROOTS
    )]
    CloneDirNotAllowed { dir: String },
    /// The directory is under a root lexically but resolves (symlinks) outside every root.
    #[error(
        "annotation {key}: {dir:?} resolves to {resolved:?}, which is not under a configured clone root ({var})",
        key = ann::CLONE_FROM_DIR,
        var = env::CLONE_FROM_DIR_ROOTS
    )]
    CloneDirEscapes { dir: String, resolved: String },
    /// An unmanaged pod pre-assigns exactly the runtime id of a VM this node knows.
    #[error(
        "annotation {key}: {id:?} is the id of a VM on this node; an unmanaged pod cannot claim it",
        key = ann::VM_ID
    )]
    ManagedIdClaimed { id: String },
    /// An unmanaged pod pre-assigns an id in the VM-name form (`vk-…`, `fork-vk-…`).
    #[error(
        "annotation {key}: {id:?} has the form of a VM name (vk-…, fork-vk-…), which the runtime would resolve to that VM; an unmanaged pod's id cannot take it",
        key = ann::VM_ID
    )]
    IdInVmNameForm { id: String },
    /// The image reference names a VM's registry repository.
    #[error(
        "annotation {key}: image {image:?} names a VM's or a checkpoint's snapshot repository (vk-…, ckpt-…); images cannot name snapshots (a set starts from a checkpoint with spec.agent.fromCheckpoint)",
        key = ann::IMAGE
    )]
    ImageNamesVm { image: String },
    /// The image reference names a `:hibernate` tag.
    #[error(
        "annotation {key}: image {image:?} names a hibernate tag; images cannot name hibernation snapshots",
        key = ann::IMAGE
    )]
    ImageHibernateTag { image: String },
    /// `vm.cocoonstack.io/managed` changed after the pod was tracked.
    #[error(
        "annotation {key}: changed from {tracked} to {managed} after the pod was tracked; managed is fixed at create",
        key = ann::MANAGED
    )]
    ManagedChanged { tracked: bool, managed: bool },
    /// An unmanaged pod's pre-assigned id changed after the pod was tracked.
    #[error(
        "annotation {key}: changed from {tracked:?} to {id:?}; an unmanaged pod's VM id is fixed at create",
        key = ann::VM_ID
    )]
    IdChanged { tracked: String, id: String },
    /// A snapshot artifact records another owner.
    #[error(
        "snapshot {reference} belongs to {owner} (manifest annotation {key}), not to pod {ns}/{pod}",
        key = cocoon_api::contract::oci::ANNOTATION_OWNER_NAMESPACE
    )]
    ForeignSnapshot {
        reference: String,
        owner: String,
        ns: String,
        pod: String,
    },
    /// A clone base whose artifact records an owner: it is some pod's VM snapshot, and a
    /// clone base on a host is shared by every namespace that names the same image.
    #[error(
        "image {reference}: the artifact is the VM snapshot of {owner} (manifest annotation {key}); a clone base must be a plain image, shared by every namespace on the node",
        key = cocoon_api::contract::oci::ANNOTATION_OWNER_NAMESPACE
    )]
    OwnedCloneBase { reference: String, owner: String },
    /// A snapshot artifact records its namespace's UID and this agent could not read the
    /// pod's namespace's UID to compare (its identity lacks `get namespaces`).
    #[error(
        "snapshot {reference} records namespace uid {uid} (manifest annotation {key}) and the uid of namespace {ns} could not be read to compare; grant the node agent get on namespaces (manifests/node/rbac.yaml)",
        key = cocoon_api::contract::oci::ANNOTATION_OWNER_NAMESPACE_UID
    )]
    NamespaceUidUnknown {
        reference: String,
        uid: String,
        ns: String,
    },
    /// The pod's VM name differs from the one this agent tracks it with.
    #[error(
        "annotation {key}: changed from {tracked:?} to {vm:?}; the VM name of a pod never changes",
        key = ann::VM_NAME
    )]
    NameChanged { tracked: String, vm: String },
    /// A URL image outside `VK_RUN_IMAGE_URL_ALLOW` ([`super::host_reach`]).
    #[error(
        "annotation {key}: URL {url:?} is not allowed on this node ({var}: {why})",
        key = ann::IMAGE,
        var = env::RUN_IMAGE_URL_ALLOW
    )]
    ImageUrlNotAllowed { url: String, why: String },
    /// A CNI network outside `VK_NETWORK_ALLOW` ([`super::host_reach`]).
    #[error(
        "annotation {key}: CNI network {network:?} is not allowed on this node ({var})",
        key = ann::NETWORK,
        var = env::NETWORK_ALLOW
    )]
    NetworkNotAllowed { network: String },
}

/// Checks the pod's own VM name for a CreatePod (hashed form; the legacy form only with
/// `accept_legacy`, `VK_ACCEPT_LEGACY_VM_NAMES`) and the holder rule. `holders` are the
/// admitted pods holding `vm`, this incarnation excluded.
pub fn check_own_vm(
    ns: &str,
    pod: &str,
    vm: &str,
    holders: &[Holder],
    accept_legacy: bool,
) -> Result<(), Refusal> {
    let expected = vm_name_for_pod(ns, pod);
    match own_name_form(ns, pod, vm) {
        Some(NameForm::Hashed) => {}
        Some(NameForm::Legacy) if accept_legacy => {}
        Some(NameForm::Legacy) => {
            return Err(Refusal::LegacyUnproven {
                vm: vm.to_owned(),
                ns: ns.to_owned(),
                expected,
            });
        }
        None => {
            return Err(Refusal::NotOwnVm {
                vm: vm.to_owned(),
                ns: ns.to_owned(),
                pod: pod.to_owned(),
                expected,
            });
        }
    }
    if !holders.is_empty() {
        return Err(Refusal::HeldByOther { vm: vm.to_owned() });
    }
    Ok(())
}

/// A VM record as the fork rule sees it: a holder's tracked record, or the runtime's record
/// fetched by exact name at the save.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceVm {
    /// Runtime id (for a synthetic record: the unmanaged pod's pre-assigned id).
    pub id: String,
    /// VM name.
    pub name: String,
    /// An unmanaged pod's synthetic record, not a runtime VM.
    pub synthetic: bool,
}

/// An admitted pod holding a fork source (by the VM name it was admitted with or by its
/// tracked VM), as the fork rule sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceHolder {
    /// The pod.
    pub holder: Holder,
    /// `vm.cocoonstack.io/managed`, as admitted.
    pub managed: bool,
    /// The VM tracked for it, if any.
    pub vm: Option<SourceVm>,
}

/// Checks a fork source (`fork-from`) for a pod of namespace `ns`; `holders` are the admitted
/// pods holding `src` (the forking pod excluded). Every holder must be a managed pod of `ns`
/// whose tracked record, if any, is a runtime VM named exactly `src`; with no holder, `src`
/// must verify as a VM name of `ns` ([`verifies_for_namespace`]).
pub fn check_fork_source(ns: &str, src: &str, holders: &[SourceHolder]) -> Result<(), Refusal> {
    if holders.is_empty() {
        return if verifies_for_namespace(ns, src) {
            Ok(())
        } else {
            Err(foreign_fork_source(ns, src))
        };
    }
    if holders.iter().any(|h| h.holder.namespace != ns) {
        return Err(foreign_fork_source(ns, src));
    }
    let not_managed = holders
        .iter()
        .find(|h| !h.managed || h.vm.as_ref().is_some_and(|v| v.synthetic || v.name != src));
    match not_managed {
        Some(h) => Err(Refusal::UnmanagedForkSource {
            vm: src.to_owned(),
            holder: format!("{}/{}", h.holder.namespace, h.holder.name),
        }),
        None => Ok(()),
    }
}

fn foreign_fork_source(ns: &str, src: &str) -> Refusal {
    Refusal::ForeignForkSource {
        vm: src.to_owned(),
        ns: ns.to_owned(),
    }
}

/// The check at the moment `fork-<src>` is saved: [`check_fork_source`] over the holders as
/// they are now, and `found`, the runtime's record fetched by the exact name `src`, must be
/// the VM to save from: named exactly `src`, a runtime VM, and — when pods hold `src` — the
/// very VM (same id and name) tracked for a managed holder. `Ok` means: save from `found.id`.
pub fn check_fork_save(
    ns: &str,
    src: &str,
    holders: &[SourceHolder],
    found: &SourceVm,
) -> Result<(), Refusal> {
    check_fork_source(ns, src, holders)?;
    let not_tracked = || Refusal::ForkSourceNotTracked { vm: src.to_owned() };
    if found.synthetic || found.name != src {
        return Err(not_tracked());
    }
    if holders.is_empty() {
        return Ok(());
    }
    let tracked = holders
        .iter()
        .filter_map(|h| h.vm.as_ref())
        .any(|v| v == found);
    if tracked { Ok(()) } else { Err(not_tracked()) }
}

/// Is an unmanaged pod's pre-assigned id in the VM-name form (`vk-…` or `fork-vk-…`, any
/// case)? The runtime resolves a reference by name, so such an id would name a VM (or a fork
/// baseline) of this node once one of that name exists.
pub fn id_in_vm_name_form(id: &str) -> bool {
    let lower = id.trim().to_ascii_lowercase();
    let vm_form = lower
        .strip_prefix(cocoon_api::naming::FORK_PREFIX)
        .unwrap_or(&lower);
    vm_form.starts_with(VM_NAME_PREFIX)
}

/// Is `dir` equal to or below one of `roots`, by whole path components?
pub fn under_a_root(dir: &Path, roots: &[PathBuf]) -> bool {
    roots.iter().any(|r| dir.starts_with(r))
}

/// The `clone-from-dir` directory as the spec's validation sees it: `Some` only for a
/// non-blank, absolute, canonical value (others are that validation's to reject).
pub fn clone_dir_to_check(raw: Option<&str>) -> Option<&str> {
    let v = raw.map(str::trim).filter(|v| !v.is_empty())?;
    (v.starts_with('/') && super::rules::clean_path(v) == v).then_some(v)
}

/// Checks a `clone-from-dir` value against the configured roots. `resolved` is the
/// symlink-resolved directory and `resolved_roots` the resolved roots, when they exist.
pub fn check_clone_dir(
    raw: Option<&str>,
    roots: &[PathBuf],
    resolved: Option<&Path>,
    resolved_roots: &[PathBuf],
) -> Result<(), Refusal> {
    let Some(dir) = clone_dir_to_check(raw) else {
        return Ok(());
    };
    if !under_a_root(Path::new(dir), roots) {
        return Err(Refusal::CloneDirNotAllowed {
            dir: dir.to_owned(),
        });
    }
    if let Some(real) = resolved
        && !under_a_root(real, resolved_roots)
    {
        return Err(Refusal::CloneDirEscapes {
            dir: dir.to_owned(),
            resolved: real.display().to_string(),
        });
    }
    Ok(())
}

/// Everything a CreatePod is checked on.
#[derive(Debug, Clone, Copy)]
pub struct CreateCheck<'a> {
    /// The pod's namespace.
    pub namespace: &'a str,
    /// The pod's name.
    pub pod: &'a str,
    /// `vm.cocoonstack.io/name`.
    pub vm: &'a str,
    /// Tracked pods holding `vm`, this incarnation excluded.
    pub vm_holders: &'a [Holder],
    /// `vm.cocoonstack.io/fork-from` (empty: none).
    pub fork_from: &'a str,
    /// Admitted pods holding `fork_from`, this incarnation excluded.
    pub fork_holders: &'a [SourceHolder],
    /// The raw `clone-from-dir` annotation.
    pub clone_dir: Option<&'a str>,
    /// `VK_CLONE_FROM_DIR_ROOTS`.
    pub roots: &'a [PathBuf],
    /// The symlink-resolved directory, when it exists.
    pub resolved_dir: Option<&'a Path>,
    /// The symlink-resolved roots.
    pub resolved_roots: &'a [PathBuf],
    /// Managed pod (fork and clone sources apply only to managed pods).
    pub managed: bool,
    /// For an unmanaged pod: its pre-assigned `vm.cocoonstack.io/id` (empty: none).
    pub pre_id: &'a str,
    /// For an unmanaged pod: its pre-assigned id when that is exactly the id of a VM this
    /// node tracks (a runtime record, not a synthetic one) or the runtime knows by that exact
    /// id, else `None`. A prefix or name match does not count (see the module docs).
    pub claimed_managed_id: Option<&'a str>,
    /// `cocoonset.cocoonstack.io/image`.
    pub image: &'a str,
    /// `VK_ACCEPT_LEGACY_VM_NAMES`.
    pub accept_legacy: bool,
}

/// The CreatePod decision: own VM first, then the fork source and the clone directory.
pub fn check_create(c: &CreateCheck<'_>) -> Result<(), Refusal> {
    check_own_vm(c.namespace, c.pod, c.vm, c.vm_holders, c.accept_legacy)?;
    if !c.managed {
        // An unmanaged pod's VM is external; its id must not alias a VM of this node, now
        // (the event watcher maps runtime events to pods by id) or later (by name).
        if id_in_vm_name_form(c.pre_id) {
            return Err(Refusal::IdInVmNameForm {
                id: c.pre_id.to_owned(),
            });
        }
        return match c.claimed_managed_id {
            Some(id) => Err(Refusal::ManagedIdClaimed { id: id.to_owned() }),
            None => Ok(()),
        };
    }
    check_image_ref(c.image)?;
    if !c.fork_from.is_empty() {
        check_fork_source(c.namespace, c.fork_from, c.fork_holders)?;
    }
    check_clone_dir(c.clone_dir, c.roots, c.resolved_dir, c.resolved_roots)
}

/// The repository and tag an image reference names, read both ways a consumer may read it:
/// split at the first `:` (the contract's `parse_ref`, which the registry pull uses) and
/// Docker-style (the tag after the last `/`, a digest dropped). Yields (last path component
/// of the repository, tag) pairs.
fn image_readings(image: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let (repo, tag) = match image.split_once(':') {
        Some((r, t)) if !r.is_empty() => (r, t),
        _ => (image, ""),
    };
    out.push((last_component(repo).to_owned(), tag.to_owned()));
    let no_digest = image.split_once('@').map_or(image, |(r, _)| r);
    let last = last_component(no_digest);
    let (name, tag) = last.split_once(':').unwrap_or((last, ""));
    out.push((name.to_owned(), tag.to_owned()));
    out
}

fn last_component(repo: &str) -> &str {
    repo.rsplit('/').next().unwrap_or(repo)
}

/// Checks a pod's image reference (`cocoonset.cocoonstack.io/image`): it must not name a VM's
/// registry repository or a VM-derived snapshot (last path component of the VM-name form
/// `vk-…` or `fork-vk-…`) nor a `:hibernate` tag, whatever the mode. `http(s)://` cloud-image URLs are not registry references.
pub fn check_image_ref(image: &str) -> Result<(), Refusal> {
    let image = image.trim();
    let lower = image.to_ascii_lowercase();
    if image.is_empty() || lower.starts_with("http://") || lower.starts_with("https://") {
        return Ok(());
    }
    for (name, tag) in image_readings(&lower) {
        let vm_form = name
            .strip_prefix(cocoon_api::naming::FORK_PREFIX)
            .unwrap_or(&name);
        if vm_form.starts_with(VM_NAME_PREFIX) || name.starts_with(CKPT_PREFIX) {
            return Err(Refusal::ImageNamesVm {
                image: image.to_owned(),
            });
        }
        if tag == cocoon_api::contract::tags::HIBERNATE
            || tag.ends_with(&format!(":{}", cocoon_api::contract::tags::HIBERNATE))
        {
            return Err(Refusal::ImageHibernateTag {
                image: image.to_owned(),
            });
        }
    }
    Ok(())
}

use cocoon_api::contract::checkpoint::REPOSITORY_PREFIX as CKPT_PREFIX;

/// What a pulled snapshot artifact is used for (the owner rule differs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArtifactUse {
    /// The pod's own `:hibernate` (restore, wake) or evidence of it: namespace and pod.
    OwnVm,
    /// A clone base: only an artifact that records no owner (a clone base on the host is
    /// shared by every namespace naming the same image, so it can never be a VM's state).
    CloneBase,
    /// A checkpoint's artifact (a `ckpt-…` repository): it must record the checkpoint.
    Checkpoint,
}

/// The pod a snapshot belongs to: `<namespace>/<pod>`, and its namespace's UID when read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// Its namespace.
    pub namespace: String,
    /// Its namespace's UID (read from the API by `Artifacts::owner_of`; `None` when the
    /// agent's identity may not read namespaces, or for a clone base, which needs none).
    pub namespace_uid: Option<String>,
    /// Its name.
    pub pod: String,
}

impl Owner {
    /// The owner a pod's own snapshots record, without its namespace's UID (clone bases:
    /// they must record no owner at all).
    pub fn of(pod: &Pod) -> Self {
        Owner {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            namespace_uid: None,
            pod: pod.metadata.name.clone().unwrap_or_default(),
        }
    }

    /// The rule's view of this owner ([`cocoon_api::contract::owner::Actor`]).
    pub fn actor(&self) -> Actor<'_> {
        Actor {
            namespace: &self.namespace,
            namespace_uid: self.namespace_uid.as_deref(),
            pod: &self.pod,
        }
    }
}

/// May the pod `owner` use a snapshot artifact with these manifest annotations? For its own
/// VM ([`ArtifactUse::OwnVm`]) the shared owner rule decides
/// ([`cocoon_api::contract::owner::owner_verdict`]): an artifact recording
/// [`ANNOTATION_OWNER_NAMESPACE`](cocoon_api::contract::oci::ANNOTATION_OWNER_NAMESPACE) must
/// name the pod's namespace and, where it records one, the pod; one without it (pushed by the
/// Go components) is accepted, as the name checks already proved ownership (the repository is
/// the pod's own `VMNameForPod`). An artifact recording its namespace's UID
/// ([`ANNOTATION_OWNER_NAMESPACE_UID`](cocoon_api::contract::oci::ANNOTATION_OWNER_NAMESPACE_UID))
/// is accepted only when the pod's namespace has that UID now: a namespace deleted and
/// re-created under the same name never inherits the old one's snapshots, and an agent that
/// cannot read the UID refuses it. A clone base ([`ArtifactUse::CloneBase`]) must record no
/// owner at all: the host keeps one copy per image for every namespace (the local copy is
/// reused without asking the registry again), and a clone base never names a VM repository
/// ([`check_image_ref`]).
pub fn check_artifact_owner(
    what: ArtifactUse,
    reference: &str,
    annotations: &std::collections::BTreeMap<String, String>,
    owner: &Owner,
) -> Result<(), Refusal> {
    use cocoon_api::contract::owner::{OwnerVerdict, RecordedOwner, owner_verdict};
    let foreign = |named: String| Refusal::ForeignSnapshot {
        reference: reference.to_owned(),
        owner: named,
        ns: owner.namespace.clone(),
        pod: owner.pod.clone(),
    };
    let Some(recorded) = RecordedOwner::from_annotations(annotations) else {
        let checkpoint = what == ArtifactUse::Checkpoint;
        return if checkpoint {
            Err(foreign("no owner".into()))
        } else {
            Ok(())
        };
    };
    let named = format!(
        "{}/{}",
        recorded.namespace,
        recorded.pod.as_deref().unwrap_or_default()
    );
    if what == ArtifactUse::CloneBase {
        return Err(Refusal::OwnedCloneBase {
            reference: reference.to_owned(),
            owner: named,
        });
    }
    // A checkpoint's artifact names its checkpoint exactly (never a namespace alone).
    if what == ArtifactUse::Checkpoint && recorded.pod.as_deref() != Some(owner.pod.as_str()) {
        return Err(foreign(named));
    }
    if let OwnerVerdict::Foreign { .. } = owner_verdict(annotations, &owner.actor()) {
        let owner_named = match (&recorded.namespace_uid, &owner.namespace_uid) {
            (Some(r), Some(c)) if r != c => {
                format!("{named} of namespace uid {r} (the namespace now has uid {c})")
            }
            _ => named,
        };
        return Err(foreign(owner_named));
    }
    if let Some(uid) = recorded.namespace_uid
        && owner.namespace_uid.is_none()
    {
        return Err(Refusal::NamespaceUidUnknown {
            reference: reference.to_owned(),
            uid,
            ns: owner.namespace.clone(),
        });
    }
    Ok(())
}

/// What a pod was admitted as, fixed when this agent first tracks it (after the CreatePod
/// check, or by the startup reconcile): later updates never change it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    /// The pod UID.
    pub uid: String,
    /// `vm.cocoonstack.io/name`.
    pub vm_name: String,
    /// `vm.cocoonstack.io/managed`.
    pub managed: bool,
    /// An unmanaged pod's pre-assigned `vm.cocoonstack.io/id` (empty for a managed pod, whose
    /// id this agent writes).
    pub pre_id: String,
}

/// Checks an update of an admitted pod: the VM name, `managed` and an unmanaged pod's
/// pre-assigned id never change.
pub fn check_update(
    admitted: &Admitted,
    vm_name: &str,
    managed: bool,
    id: &str,
) -> Result<(), Refusal> {
    if admitted.vm_name != vm_name {
        return Err(Refusal::NameChanged {
            tracked: admitted.vm_name.clone(),
            vm: vm_name.to_owned(),
        });
    }
    if admitted.managed != managed {
        return Err(Refusal::ManagedChanged {
            tracked: admitted.managed,
            managed,
        });
    }
    if !admitted.managed && admitted.pre_id != id {
        return Err(Refusal::IdChanged {
            tracked: admitted.pre_id.clone(),
            id: id.to_owned(),
        });
    }
    Ok(())
}

/// How the startup reconcile found a pod's VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found<'a> {
    /// By the pod's `vm.cocoonstack.io/id`; the record's runtime name.
    ById(&'a str),
    /// By the pod's VM name (the pod annotates no id).
    ByName,
    /// No VM; the pod is hibernated and would be tracked without one.
    HibernatedWithoutVm,
}

/// May the startup reconcile track pod `<ns>/<pod>` with VM name `vm`? Adopting by id needs
/// the record to carry the pod's VM name, which may then be the legacy form (the id this
/// agent wrote ties it to the pod); by name or without a VM the hashed form is required.
pub fn reconcile_may_track(
    ns: &str,
    pod: &str,
    vm: &str,
    found: Found<'_>,
    accept_legacy: bool,
) -> bool {
    match (own_name_form(ns, pod, vm), found) {
        (None, _) => false,
        (Some(_), Found::ById(record_name)) => record_name == vm,
        (Some(form), Found::ByName | Found::HibernatedWithoutVm) => {
            form == NameForm::Hashed || accept_legacy
        }
    }
}

/// May DeletePod of an untracked pod (no VM) drop the local snapshots `<vm>` and `fork-<vm>`?
/// Only for its own hashed VM name that no other tracked pod holds; a pod this agent tracks
/// passed the rules when it was tracked.
pub fn delete_may_drop_snapshots(
    tracked: bool,
    ns: &str,
    pod: &str,
    vm: &str,
    holders: &[Holder],
    accept_legacy: bool,
) -> bool {
    tracked || check_own_vm(ns, pod, vm, holders, accept_legacy).is_ok()
}
