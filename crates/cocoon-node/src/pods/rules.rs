//! The pure decision rules of the pod lifecycle (`node.md` §6–§10): bring-up path selection,
//! hibernate evidence verdicts, clone-base naming, CPU policy, owed ops and event outcomes.
//!
//! Nothing here does I/O; the async shells in the sibling modules observe, call these, and act.

use std::path::{Component, Path, PathBuf};

use cocoon_api::contract::{Backend, Os, VmSpec};
use cocoon_api::naming::clone_base_snapshot_name;
use cocoon_runtime::types::{STATE_CREATING, STATE_RUNNING};
use cocoon_runtime::{CpuPolicy, StaleCreateOutcome};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// `ParseRef(ref)`: split at the first `:` when the part before it is non-empty, else the
/// whole ref with tag `latest`. Registry-relative refs only (ports and digests split wrongly
/// by design, as the spec states).
pub fn parse_ref(image: &str) -> (String, String) {
    match image.split_once(':') {
        Some((repo, tag)) if !repo.is_empty() => (repo.to_owned(), tag.to_owned()),
        _ => (image.to_owned(), "latest".to_owned()),
    }
}

/// The local snapshot a `mode=clone` pod clones from (`contract.md` §2.4): always
/// `<repo>:<tag>`, so it never equals a VM snapshot's name (see `tenant`).
pub fn local_snapshot_name(repo: &str, tag: &str) -> String {
    clone_base_snapshot_name(repo, tag)
}

/// Lexically cleans an absolute path the way Go's `filepath.Clean` does (no symlink lookup).
pub fn clean_path(p: &str) -> String {
    let mut out: Vec<String> = Vec::new();
    for c in Path::new(p).components() {
        match c {
            Component::RootDir | Component::Prefix(_) | Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(s) => out.push(s.to_string_lossy().into_owned()),
        }
    }
    if p.starts_with('/') {
        format!("/{}", out.join("/"))
    } else if out.is_empty() {
        ".".to_owned()
    } else {
        out.join("/")
    }
}

/// Validates the `clone-from-dir` override (§6.2 step 3). `Ok(None)` = no override.
pub fn clone_from_dir(raw: Option<&str>, spec: &VmSpec) -> Result<Option<PathBuf>, String> {
    let v = raw.map(str::trim).unwrap_or("");
    if v.is_empty() {
        return Ok(None);
    }
    const KEY: &str = cocoon_api::contract::annotations::CLONE_FROM_DIR;
    if !v.starts_with('/') {
        return Err(format!(
            "annotation {KEY} must be an absolute path, got {v:?}"
        ));
    }
    let clean = clean_path(v);
    if clean != v {
        return Err(format!(
            "annotation {KEY} must be a canonical path, got {v:?} (cleaned: {clean:?})"
        ));
    }
    if spec.is_run() {
        return Err(format!("annotation {KEY} is incompatible with mode=run"));
    }
    if !spec.fork_from.is_empty() {
        return Err(format!(
            "annotation {KEY} is incompatible with fork-from {:?}",
            spec.fork_from
        ));
    }
    Ok(Some(PathBuf::from(v)))
}

/// The bring-up path of §6.2, first match wins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BringUp {
    /// Restore from the hibernate snapshot (explicit or derived marker).
    Restore,
    /// `clone --from-dir`.
    CloneFromDir(PathBuf),
    /// Fork off `fork-<src>`.
    Fork(String),
    /// `vm run`.
    Run,
    /// Clone from the image's snapshot (the default).
    Clone,
}

/// Selects the bring-up path (§6.2). `restoring` is the explicit-or-derived marker.
pub fn bring_up_path(
    spec: &VmSpec,
    restoring: bool,
    clone_dir: Option<&str>,
) -> Result<BringUp, String> {
    if restoring {
        return Ok(BringUp::Restore);
    }
    if let Some(dir) = clone_from_dir(clone_dir, spec)? {
        return Ok(BringUp::CloneFromDir(dir));
    }
    if !spec.fork_from.is_empty() {
        return Ok(BringUp::Fork(spec.fork_from.clone()));
    }
    if spec.is_run() {
        return Ok(BringUp::Run);
    }
    Ok(BringUp::Clone)
}

/// `cloned` of §6.1 step 11.
pub fn is_cloned(spec: &VmSpec, clone_dir: Option<&str>) -> bool {
    clone_dir.is_some_and(|d| !d.trim().is_empty()) || !spec.fork_from.is_empty() || !spec.is_run()
}

/// What the hibernate evidence step returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Evidence {
    /// No `:hibernate` tag (or no local snapshot in registry-less mode).
    None,
    /// A tag exists; the recorded base image (may be empty).
    Found { recorded_image: String },
}

/// Verdict of the derived/explicit restore guards (§6.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Boot fresh.
    FreshBoot,
    /// Restore from the hibernate snapshot.
    Restore,
    /// Refuse: the pod names an explicit clone source (derived path only).
    SourceConflict(String),
    /// Refuse: the tag was recorded from another image ref.
    ImageConflict(String),
}

impl Verdict {
    /// Label of `cocoon_vk_hibernate_evidence_total{verdict}`, when one is counted.
    pub fn label(&self) -> Option<&'static str> {
        match self {
            Verdict::FreshBoot => None,
            Verdict::Restore => Some("restored"),
            Verdict::SourceConflict(_) => Some("source_conflict"),
            Verdict::ImageConflict(_) => Some("image_conflict"),
        }
    }
}

/// The restore guards of §6.3 over an evidence result. `explicit` = the operator's marker.
pub fn restore_verdict(
    spec: &VmSpec,
    explicit: bool,
    clone_dir: Option<&str>,
    evidence: &Evidence,
) -> Verdict {
    let vm = &spec.vm_name;
    let recorded = match evidence {
        // An explicit marker restores even without evidence (the wake pulls and fails loudly
        // if the tag is really gone).
        Evidence::None if explicit => return Verdict::Restore,
        Evidence::None => return Verdict::FreshBoot,
        Evidence::Found { recorded_image } => recorded_image,
    };
    if !explicit && (clone_dir.is_some_and(|d| !d.trim().is_empty()) || !spec.fork_from.is_empty())
    {
        return Verdict::SourceConflict(format!(
            "vm {vm} has a hibernate snapshot but the pod requests an explicit clone source; delete the hibernate tag to discard the hibernated state"
        ));
    }
    if !recorded.is_empty() && *recorded != spec.image {
        return Verdict::ImageConflict(format!(
            "hibernate snapshot of vm {vm} came from image {recorded:?} but the pod requests {:?}; delete the hibernate tag to discard the hibernated state",
            spec.image
        ));
    }
    Verdict::Restore
}

/// `assertSnapshotBackend` (§6.7).
pub fn assert_snapshot_backend(
    snapshot_name: &str,
    hypervisor: &str,
    target: Option<Backend>,
) -> Result<(), String> {
    let Some(target) = target else { return Ok(()) };
    if hypervisor.is_empty() || hypervisor == target.as_str() {
        return Ok(());
    }
    Err(format!(
        "snapshot {snapshot_name} was taken with {hypervisor} but CocoonSet requests {}",
        target.as_str()
    ))
}

/// Milli-CPU of a quantity (`500m`, `2`, `1.5`); `None` when unparsable.
pub fn milli_cpu(q: &Quantity) -> Option<u64> {
    let s = q.0.trim();
    if let Some(m) = s.strip_suffix('m') {
        return m.parse::<u64>().ok();
    }
    let f: f64 = s.parse().ok()?;
    (f >= 0.0).then(|| (f * 1000.0).ceil() as u64)
}

/// CPU, memory and policy inputs read from a pod's first container (§6.8).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodResources {
    /// CPU request in milli-CPU.
    pub request_milli: Option<u64>,
    /// CPU limit in milli-CPU.
    pub limit_milli: Option<u64>,
    /// Memory request, else limit, as the Quantity string.
    pub memory: String,
}

impl PodResources {
    /// Reads the first container's resources; no containers = no overrides.
    pub fn of(pod: &Pod) -> Self {
        let Some(c) = pod.spec.as_ref().and_then(|s| s.containers.first()) else {
            return Self::default();
        };
        let Some(r) = c.resources.as_ref() else {
            return Self::default();
        };
        let get = |m: &Option<std::collections::BTreeMap<String, Quantity>>, k: &str| {
            m.as_ref().and_then(|m| m.get(k)).cloned()
        };
        PodResources {
            request_milli: get(&r.requests, "cpu").as_ref().and_then(milli_cpu),
            limit_milli: get(&r.limits, "cpu").as_ref().and_then(milli_cpu),
            memory: get(&r.requests, "memory")
                .or_else(|| get(&r.limits, "memory"))
                .map(|q| q.0)
                .unwrap_or_default(),
        }
    }

    /// vCPUs for `vm run`: ceil(limit, else request, / 1000); 0 = no override.
    pub fn vcpus(&self) -> u32 {
        self.limit_milli
            .or(self.request_milli)
            .map_or(0, |m| m.div_ceil(1000) as u32)
    }

    /// The CPU policy of §6.8 (integer arithmetic throughout).
    pub fn cpu_policy(&self) -> CpuPolicy {
        let (quota_us, period_us) = match self.limit_milli {
            Some(l) => ((l * 100_000 / 1000).max(1000), 100_000),
            None => (0, 0),
        };
        let milli = self.request_milli.or(self.limit_milli).unwrap_or(0);
        let shares = (milli * 1024 / 1000).clamp(2, 262_144);
        let weight = 1 + (shares - 2) * 9999 / 262_142;
        CpuPolicy {
            weight,
            quota_us,
            period_us,
        }
    }
}

/// `restore_mode` of a clone: `copy` for Windows, else the configured mode; none for FC.
pub fn restore_mode(spec: &VmSpec, configured: &str) -> String {
    if spec.backend == Some(Backend::Firecracker) {
        String::new()
    } else if spec.effective_os() == Os::Windows {
        "copy".to_owned()
    } else {
        configured.to_owned()
    }
}

/// Whether a cloned VM needs the post-clone network fixup (§6.9).
pub fn post_clone_needed(spec: &VmSpec, any_static_nic: bool) -> bool {
    spec.effective_os() == Os::Windows
        || spec.backend == Some(Backend::Firecracker)
        || any_static_nic
}

/// One NIC as the fixup script sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NicInfo {
    /// MAC address.
    pub mac: String,
    /// Static IP, empty for DHCP.
    pub ip: String,
    /// Prefix length of a static IP.
    pub prefix: i64,
    /// Gateway of a static IP.
    pub gateway: String,
}

/// The Linux fixup script of §6.9 (hint mode writes it as an annotation).
pub fn linux_fixup_script(
    vm: &str,
    firecracker: bool,
    cloud_image: bool,
    nics: &[NicInfo],
) -> String {
    let mut lines = vec![
        "echo 3 > /proc/sys/vm/drop_caches".to_owned(),
        format!("echo {vm} > /etc/hostname"),
    ];
    if firecracker {
        for (i, n) in nics.iter().enumerate() {
            lines.push(format!(
                "ip link set dev eth{i} down && ip link set dev eth{i} address {} && ip link set dev eth{i} up",
                n.mac
            ));
        }
    }
    lines.push("rm -f /etc/systemd/network/10-*.network".to_owned());
    if cloud_image {
        lines.push("cloud-init clean --logs --seed --configs network && cloud-init init --local && cloud-init init".to_owned());
        lines.push(
            "cloud-init modules --mode=config && systemctl restart systemd-networkd".to_owned(),
        );
    } else {
        for n in nics {
            let cfg = if n.ip.is_empty() {
                format!(
                    "[Match]\\nMACAddress={}\\n\\n[Network]\\nDHCP=ipv4\\n\\n[DHCPv4]\\nClientIdentifier=mac\\n",
                    n.mac
                )
            } else {
                format!(
                    "[Match]\\nMACAddress={}\\n\\n[Network]\\nAddress={}/{}\\nGateway={}\\n",
                    n.mac, n.ip, n.prefix, n.gateway
                )
            };
            lines.push(format!(
                "printf '{cfg}' > /etc/systemd/network/10-{}.network",
                n.mac.replace(':', "")
            ));
        }
        lines.push("systemctl restart systemd-networkd".to_owned());
    }
    lines.join("\n")
}

/// The Windows fixup command of §6.9, as the hint carries it.
pub const WINDOWS_FIXUP: &str = "powershell -nop -c \"$x=Get-PnpDevice -Class Net -PresentOnly;$x|Disable-PnpDevice -Confirm:$false;$x|Enable-PnpDevice -Confirm:$false\"";

/// Owed operation after a restart (§9.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwedOp {
    /// Nothing owed.
    None,
    /// Run the hibernate (start the VM first if it is not running).
    Hibernate,
    /// Run the post-clone step again.
    PostClone,
    /// Wait for the IP, then publish ready.
    ReadyWait,
}

impl OwedOp {
    /// The `op` label and event text.
    pub fn as_str(self) -> &'static str {
        match self {
            OwedOp::None => "none",
            OwedOp::Hibernate => "hibernate",
            OwedOp::PostClone => "post_clone",
            OwedOp::ReadyWait => "ready_wait",
        }
    }
}

/// The owed-op table of §9.3 for a tracked pod with a VM. `lifecycle` is the raw state string,
/// `post_clone_state` the raw marker (empty when absent).
pub fn owed_op(
    hibernate: bool,
    lifecycle: &str,
    post_clone_state: &str,
    post_clone_needed: bool,
) -> OwedOp {
    use cocoon_api::contract::annotations as ann;
    if hibernate {
        return OwedOp::Hibernate;
    }
    let creating =
        lifecycle == "creating" || (lifecycle.is_empty() && !post_clone_state.is_empty());
    if !creating {
        return OwedOp::None;
    }
    match post_clone_state {
        ann::POST_CLONE_STATE_FAILED => OwedOp::None,
        ann::POST_CLONE_STATE_RUNNING => OwedOp::PostClone,
        ann::POST_CLONE_STATE_DONE => OwedOp::ReadyWait,
        // CH+Windows classification (`classify_drop_nic`) is folded into the generic rows:
        // this agent never auto-runs fixups, so both of its outcomes end in a ready wait.
        _ if post_clone_needed => OwedOp::PostClone,
        _ => OwedOp::ReadyWait,
    }
}

/// What handleVMGone does with an inspect outcome (§10).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GoneAction {
    /// Evict with this reason and message.
    Evict(&'static str, &'static str),
    /// A false alarm.
    Ignore,
    /// Inspect stayed transient: count and recheck later.
    Recheck,
    /// Restart in place (the cooldown rule decides further).
    Restart,
}

/// The inspect outcome an event handler sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InspectOutcome {
    /// The VM does not exist.
    NotFound,
    /// Transient error.
    Transient,
    /// The VM's state.
    State(String),
}

/// The §10 table.
pub fn gone_action(outcome: &InspectOutcome) -> GoneAction {
    match outcome {
        InspectOutcome::NotFound => GoneAction::Evict("VMGone", "vm no longer exists"),
        InspectOutcome::Transient => GoneAction::Recheck,
        InspectOutcome::State(s) if s == "running" => GoneAction::Ignore,
        InspectOutcome::State(_) => GoneAction::Restart,
    }
}

/// The restart cooldown rule: restart when no restart happened within `cooldown`.
pub fn cooldown_allows_restart(
    last: Option<std::time::Instant>,
    now: std::time::Instant,
    cooldown: std::time::Duration,
) -> bool {
    last.is_none_or(|t| now.saturating_duration_since(t) >= cooldown)
}

/// What the startup reconcile does with a `creating` VM once `reconcile_stale_create`
/// answered (`node.md` §14, "Stale-create reconciliation").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StaleCreateAction {
    /// `collected` or `not-found`: the name is free; the pod's CreatePod creates the VM again.
    NameFreed,
    /// `busy`, or the verb failed: watch the VM in the background.
    Watch,
    /// `not-creating`: inspect the VM again and reconcile it like any other listed VM.
    InspectAgain,
}

/// The stale-create rule: `answer` is the verb's outcome, `None` when the verb failed.
pub fn stale_create_action(answer: Option<StaleCreateOutcome>) -> StaleCreateAction {
    match answer {
        Some(StaleCreateOutcome::Collected | StaleCreateOutcome::NotFound) => {
            StaleCreateAction::NameFreed
        }
        Some(StaleCreateOutcome::NotCreating) => StaleCreateAction::InspectAgain,
        Some(StaleCreateOutcome::Busy) | None => StaleCreateAction::Watch,
    }
}

/// The `outcome` label of `cocoon_vk_stale_create_reconcile_total` (`contract.md` §11):
/// the wire outcome, or `error` when the verb failed.
pub fn stale_create_label(answer: Option<StaleCreateOutcome>) -> &'static str {
    answer.map_or("error", StaleCreateOutcome::as_wire)
}

/// One step of the stale-create watcher, decided from a fresh inspect of the watched VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StaleWatchStep {
    /// The VM is gone: its name is free; stop watching.
    Freed,
    /// The create finished and the VM runs: index it by name for adoption; stop watching.
    Adopt,
    /// The VM is neither `running` nor `creating` (dead): apply the orphan policy; stop.
    Orphan,
    /// Still `creating`: ask `reconcile_stale_create` again, then back off.
    StillCreating,
    /// The inspect failed transiently: back off and look again.
    Retry,
}

/// The watcher rule.
pub fn stale_watch_step(outcome: &InspectOutcome) -> StaleWatchStep {
    match outcome {
        InspectOutcome::NotFound => StaleWatchStep::Freed,
        InspectOutcome::Transient => StaleWatchStep::Retry,
        InspectOutcome::State(s) if s == STATE_RUNNING => StaleWatchStep::Adopt,
        InspectOutcome::State(s) if s == STATE_CREATING => StaleWatchStep::StillCreating,
        InspectOutcome::State(_) => StaleWatchStep::Orphan,
    }
}
