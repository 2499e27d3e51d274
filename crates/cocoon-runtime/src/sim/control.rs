//! Test and demo controls of the simulator (§7.9, §7.10): verbs, failure and block rules,
//! latencies, the call log, and the knobs the [`SimHandle`](super::SimHandle) changes at run
//! time.
//!
//! Rules match a verb and, optionally, one target (a VM id or name, or a snapshot name or
//! image ref, as the call names it).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::guest::DiskSpec;
use crate::types::StaleCreateOutcome;

/// One verb per runtime operation (the granularity of injection, latency and call counts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verb {
    /// `clone_vm`.
    Clone,
    /// `run`.
    Run,
    /// `inspect`.
    Inspect,
    /// `list`.
    List,
    /// `remove`.
    Remove,
    /// `stop` (the graceful shutdown before a pod's `remove`, issue 40).
    Stop,
    /// `start`.
    Start,
    /// `exec`.
    Exec,
    /// `logs`.
    Logs,
    /// `net_resize`.
    NetResize,
    /// `snapshot_save`.
    SnapshotSave,
    /// `snapshot_remove_if_exists`.
    SnapshotRemove,
    /// `snapshot_inspect`.
    SnapshotInspect,
    /// `snapshot_list`.
    SnapshotList,
    /// `snapshot_import`.
    SnapshotImport,
    /// `snapshot_export`.
    SnapshotExport,
    /// `ensure_image`.
    EnsureImage,
    /// `image_present`.
    ImagePresent,
    /// `image_import`.
    ImageImport,
    /// `watch_events` (a failure is a stream start failure).
    WatchEvents,
    /// `reconcile_stale_create`.
    ReconcileStaleCreate,
    /// `vm_stats`.
    Stats,
}

impl Verb {
    /// Every verb, in declaration order.
    pub const ALL: [Verb; 22] = [
        Verb::Clone,
        Verb::Run,
        Verb::Inspect,
        Verb::List,
        Verb::Remove,
        Verb::Stop,
        Verb::Start,
        Verb::Exec,
        Verb::Logs,
        Verb::NetResize,
        Verb::SnapshotSave,
        Verb::SnapshotRemove,
        Verb::SnapshotInspect,
        Verb::SnapshotList,
        Verb::SnapshotImport,
        Verb::SnapshotExport,
        Verb::EnsureImage,
        Verb::ImagePresent,
        Verb::ImageImport,
        Verb::WatchEvents,
        Verb::ReconcileStaleCreate,
        Verb::Stats,
    ];

    /// The wire name (`snake_case`, as serialized).
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Clone => "clone",
            Verb::Run => "run",
            Verb::Inspect => "inspect",
            Verb::List => "list",
            Verb::Remove => "remove",
            Verb::Stop => "stop",
            Verb::Start => "start",
            Verb::Exec => "exec",
            Verb::Logs => "logs",
            Verb::NetResize => "net_resize",
            Verb::SnapshotSave => "snapshot_save",
            Verb::SnapshotRemove => "snapshot_remove",
            Verb::SnapshotInspect => "snapshot_inspect",
            Verb::SnapshotList => "snapshot_list",
            Verb::SnapshotImport => "snapshot_import",
            Verb::SnapshotExport => "snapshot_export",
            Verb::EnsureImage => "ensure_image",
            Verb::ImagePresent => "image_present",
            Verb::ImageImport => "image_import",
            Verb::WatchEvents => "watch_events",
            Verb::ReconcileStaleCreate => "reconcile_stale_create",
            Verb::Stats => "stats",
        }
    }
}

impl std::fmt::Display for Verb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown verb name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown verb {0:?} (one of: {list})", list = Verb::ALL.map(Verb::as_str).join(", "))]
pub struct UnknownVerb(pub String);

impl std::str::FromStr for Verb {
    type Err = UnknownVerb;

    /// The wire name, with `-` accepted for `_` (`net-resize`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let want = s.trim().replace('-', "_");
        Verb::ALL
            .into_iter()
            .find(|v| v.as_str() == want)
            .ok_or_else(|| UnknownVerb(s.to_owned()))
    }
}

/// Which snapshot-name collision wording `snapshot save` uses (§7.2), so that both parser
/// branches of §3.3 get exercised.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum CollisionWording {
    /// `snapshot name "<N>" already exists` (older releases).
    #[default]
    AlreadyExists,
    /// `snapshot name "<N>" already in use by <ID>`.
    InUseBy,
    /// `snapshot name "<N>" already exists (held by <ID>)`.
    HeldBy,
}

impl CollisionWording {
    /// The error text for a taken `name` held by snapshot `id`.
    pub fn message(self, name: &str, id: &str) -> String {
        match self {
            CollisionWording::AlreadyExists => format!("snapshot name {name:?} already exists"),
            CollisionWording::InUseBy => format!("snapshot name {name:?} already in use by {id}"),
            CollisionWording::HeldBy => {
                format!("snapshot name {name:?} already exists (held by {id})")
            }
        }
    }
}

/// Per-verb latencies. Small non-zero defaults keep tests fast but still interleave.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Latencies {
    /// `run` (between the `creating` record and `running`).
    pub run: Duration,
    /// `clone_vm` (also how long the clone holds its snapshot).
    pub clone: Duration,
    /// `start`.
    pub start: Duration,
    /// `remove`.
    pub remove: Duration,
    /// `snapshot_save`, fixed part.
    pub save: Duration,
    /// `snapshot_save`, added per GiB of VM memory.
    pub save_per_gib: Duration,
    /// `net_resize`.
    pub net_resize: Duration,
    /// `exec`.
    pub exec: Duration,
    /// `inspect`, `list`, `logs`, `snapshot_inspect`, `snapshot_list`, `image_present`.
    pub query: Duration,
    /// `snapshot rm`.
    pub snapshot_rm: Duration,
    /// Simulated `image pull`.
    pub image_pull: Duration,
    /// Export throughput in bytes per second (0 = unthrottled).
    pub export_bytes_per_sec: u64,
    /// Import throughput in bytes per second (0 = unthrottled).
    pub import_bytes_per_sec: u64,
}

impl Default for Latencies {
    fn default() -> Self {
        let ms = Duration::from_millis;
        Latencies {
            run: ms(20),
            clone: ms(20),
            start: ms(10),
            remove: ms(10),
            save: ms(20),
            save_per_gib: ms(5),
            net_resize: ms(5),
            exec: ms(2),
            query: ms(1),
            snapshot_rm: ms(2),
            image_pull: ms(10),
            export_bytes_per_sec: 1 << 30,
            import_bytes_per_sec: 1 << 30,
        }
    }
}

/// The largest `VK_SIM_LATENCY_SCALE`: slow motion, not a hang.
pub const MAX_LATENCY_SCALE: f64 = 1e6;

impl Latencies {
    /// Every duration multiplied by `factor` (throughputs divided), for slow-motion demos;
    /// `factor` is clamped to `[0, MAX_LATENCY_SCALE]` (NaN counts as 0).
    pub fn scaled(&self, factor: f64) -> Self {
        let f = if factor.is_nan() {
            0.0
        } else {
            factor.clamp(0.0, MAX_LATENCY_SCALE)
        };
        let d = |x: Duration| x.mul_f64(f);
        let rate = |r: u64| {
            if r == 0 || f == 0.0 {
                0
            } else {
                ((r as f64) / f).max(1.0) as u64
            }
        };
        Latencies {
            run: d(self.run),
            clone: d(self.clone),
            start: d(self.start),
            remove: d(self.remove),
            save: d(self.save),
            save_per_gib: d(self.save_per_gib),
            net_resize: d(self.net_resize),
            exec: d(self.exec),
            query: d(self.query),
            snapshot_rm: d(self.snapshot_rm),
            image_pull: d(self.image_pull),
            export_bytes_per_sec: rate(self.export_bytes_per_sec),
            import_bytes_per_sec: rate(self.import_bytes_per_sec),
        }
    }
}

/// Make a verb fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailRule {
    /// The verb.
    pub verb: Verb,
    /// Only calls naming this target (VM id/name, snapshot name, image ref); `None` = all.
    pub target: Option<String>,
    /// How many more failures; `None` = always.
    pub times: Option<u32>,
    /// The error text. It goes through the §3.4 classifier, so `VM not found` becomes
    /// `VmNotFound`, `is in use by an active` becomes `InUse`, and so on.
    pub message: String,
    /// Fail only after the verb took effect (a `vm rm` that removed the VM and still
    /// exited non-zero). Honoured by `remove`; other verbs ignore such rules.
    pub after_effect: bool,
}

impl FailRule {
    /// Fail `verb` always with `message` (narrow it with [`times`](Self::times) and
    /// [`target`](Self::target)).
    pub fn new(verb: Verb, message: impl Into<String>) -> Self {
        FailRule {
            verb,
            target: None,
            times: None,
            message: message.into(),
            after_effect: false,
        }
    }

    /// The failure comes after the verb took effect (see [`FailRule::after_effect`]).
    pub fn after_effect(mut self) -> Self {
        self.after_effect = true;
        self
    }

    /// Only the next `n` matching calls fail.
    pub fn times(mut self, n: u32) -> Self {
        self.times = Some(n);
        self
    }

    /// Only calls naming `target` fail.
    pub fn target(mut self, target: impl Into<String>) -> Self {
        self.target = Some(target.into());
        self
    }
}

/// One recorded call.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// The verb.
    pub verb: Verb,
    /// What the call names: the reference as given, then the resolved VM id and name (VM
    /// verbs), or the snapshot name / image ref.
    pub targets: Vec<String>,
    /// The request arguments as JSON (for `clone`/`run` the whole request).
    pub args: serde_json::Value,
}

/// How to crash a VM out of band (wire names `stopped`, `error`, `kill_process`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CrashKind {
    /// Record `stopped`, process gone.
    Stopped,
    /// Record `error`, process gone.
    Error,
    /// Process killed, record still says running → reported as `stopped (stale)`.
    KillProcess,
}

/// A block on a verb: matching calls wait until unblocked (then proceed) or cancelled (then
/// fail with `Cancelled`), or until the caller drops them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BlockRule {
    pub verb: Verb,
    pub target: Option<String>,
}

/// Mutable control state.
#[derive(Debug, Default)]
pub(crate) struct Control {
    pub calls: Vec<Call>,
    pub fail_rules: Vec<FailRule>,
    pub blocks: Vec<BlockRule>,
    /// Calls currently waiting on a block, per verb.
    pub blocked_now: HashMap<Verb, usize>,
    /// Bumped by `cancel_blocked(verb)`.
    pub cancel_gen: HashMap<Verb, u64>,
    pub withhold_all_leases: bool,
    pub withhold_leases: BTreeSet<String>,
    /// VM ids or names whose guest ignores `stop` (never shuts down; the caller's deadline
    /// ends the call).
    pub ignore_shutdown: BTreeSet<String>,
    pub stale_create_script: VecDeque<StaleCreateOutcome>,
    pub latencies: Latencies,
    pub disk: DiskSpec,
    pub memory_file_size: u64,
    pub memory_fill: super::MemoryFill,
    pub known_images: BTreeMap<String, ImageKind>,
    pub permissive_pull: bool,
    pub wording: CollisionWording,
    /// Busy clocks of the VMs marked busy, by VM id (`SimHandle::set_busy`).
    pub busy: super::echo::BusyClocks,
}

/// Kind of an image the simulator can "pull".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ImageKind {
    /// An OCI image (`image_type: oci`, guest disk `cow.raw`).
    #[default]
    Oci,
    /// A cloud image (`image_type: cloudimg`, guest disk `overlay.qcow2`).
    CloudImg,
}

impl ImageKind {
    /// The `image_type` wire value.
    pub fn image_type(self) -> &'static str {
        match self {
            ImageKind::Oci => crate::types::IMAGE_TYPE_OCI,
            ImageKind::CloudImg => crate::types::IMAGE_TYPE_CLOUDIMG,
        }
    }
}

impl Control {
    fn matches(target: &Option<String>, targets: &[String]) -> bool {
        target
            .as_ref()
            .is_none_or(|t| targets.iter().any(|x| x == t))
    }

    /// Consumes one matching failure (of those before the effect), if any, and returns its
    /// message.
    pub fn take_failure(&mut self, verb: Verb, targets: &[String]) -> Option<String> {
        self.take_rule(verb, targets, false)
    }

    /// Consumes one matching after-the-effect failure, if any, and returns its message.
    pub fn take_failure_after(&mut self, verb: Verb, targets: &[String]) -> Option<String> {
        self.take_rule(verb, targets, true)
    }

    fn take_rule(&mut self, verb: Verb, targets: &[String], after: bool) -> Option<String> {
        let idx = self.fail_rules.iter().position(|r| {
            r.verb == verb
                && r.after_effect == after
                && r.times != Some(0)
                && Self::matches(&r.target, targets)
        })?;
        let rule = &mut self.fail_rules[idx];
        let message = rule.message.clone();
        if let Some(n) = rule.times.as_mut() {
            *n -= 1;
            if *n == 0 {
                self.fail_rules.remove(idx);
            }
        }
        Some(message)
    }

    /// True while a block rule matches the call.
    pub fn is_blocked(&self, verb: Verb, targets: &[String]) -> bool {
        self.blocks
            .iter()
            .any(|b| b.verb == verb && Self::matches(&b.target, targets))
    }

    /// The latency of a verb (export/import use byte rates instead).
    pub fn latency(&self, verb: Verb) -> Duration {
        let l = &self.latencies;
        match verb {
            Verb::Clone => l.clone,
            Verb::Run => l.run,
            Verb::Start => l.start,
            // A guest that answers the power button stops as fast as a remove.
            Verb::Remove | Verb::Stop => l.remove,
            Verb::SnapshotSave => l.save,
            Verb::NetResize => l.net_resize,
            Verb::Exec => l.exec,
            Verb::SnapshotRemove => l.snapshot_rm,
            Verb::EnsureImage => l.image_pull,
            Verb::Inspect
            | Verb::List
            | Verb::Logs
            | Verb::SnapshotInspect
            | Verb::SnapshotList
            | Verb::ImagePresent
            | Verb::ReconcileStaleCreate
            | Verb::Stats => l.query,
            Verb::SnapshotImport | Verb::SnapshotExport | Verb::ImageImport | Verb::WatchEvents => {
                Duration::ZERO
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn after_effect_rules_fire_only_after_the_effect() {
        let mut c = Control::default();
        let t = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        c.fail_rules
            .push(FailRule::new(Verb::Remove, "late").times(1).after_effect());
        assert_eq!(c.take_failure(Verb::Remove, &t(&["vm-a"])), None);
        assert_eq!(
            c.take_failure_after(Verb::Remove, &t(&["vm-a"])).as_deref(),
            Some("late")
        );
        assert_eq!(c.take_failure_after(Verb::Remove, &t(&["vm-a"])), None);
    }

    #[test]
    fn fail_rules_count_down_and_match_targets() {
        let mut c = Control::default();
        c.fail_rules
            .push(FailRule::new(Verb::Inspect, "transient").times(2));
        c.fail_rules
            .push(FailRule::new(Verb::Clone, "boom").target("vm-b"));
        assert_eq!(
            c.take_failure(Verb::Inspect, &t(&["x"])).as_deref(),
            Some("transient")
        );
        assert_eq!(
            c.take_failure(Verb::Inspect, &t(&["y"])).as_deref(),
            Some("transient")
        );
        assert_eq!(c.take_failure(Verb::Inspect, &t(&["z"])), None);
        assert_eq!(c.take_failure(Verb::Clone, &t(&["vm-a"])), None);
        for _ in 0..3 {
            assert_eq!(
                c.take_failure(Verb::Clone, &t(&["snap", "vm-b"]))
                    .as_deref(),
                Some("boom")
            );
        }
    }

    #[test]
    fn verb_names_round_trip_through_serde_and_from_str() {
        for v in Verb::ALL {
            let wire = serde_json::to_value(v).expect("serialize");
            assert_eq!(wire, serde_json::Value::String(v.as_str().to_owned()));
            assert_eq!(v.as_str().parse::<Verb>(), Ok(v));
            assert_eq!(v.as_str().replace('_', "-").parse::<Verb>(), Ok(v));
        }
        let err = "reboot".parse::<Verb>().expect_err("unknown");
        assert!(
            err.to_string()
                .starts_with(r#"unknown verb "reboot" (one of: clone, run,"#)
        );
    }

    #[test]
    fn collision_wordings() {
        assert_eq!(
            CollisionWording::AlreadyExists.message("vk-a", "id1"),
            r#"snapshot name "vk-a" already exists"#
        );
        assert_eq!(
            CollisionWording::InUseBy.message("vk-a", "id1"),
            r#"snapshot name "vk-a" already in use by id1"#
        );
        assert_eq!(
            CollisionWording::HeldBy.message("vk-a", "id1"),
            r#"snapshot name "vk-a" already exists (held by id1)"#
        );
    }

    #[test]
    fn latencies_scale() {
        let l = Latencies::default().scaled(10.0);
        assert_eq!(l.run, Duration::from_millis(200));
        assert_eq!(l.export_bytes_per_sec, (1u64 << 30) / 10);
        assert_eq!(Latencies::default().scaled(0.0).run, Duration::ZERO);
        // Out-of-range factors are clamped, never a panic.
        assert_eq!(Latencies::default().scaled(f64::NAN).run, Duration::ZERO);
        assert_eq!(Latencies::default().scaled(-3.0).run, Duration::ZERO);
        assert_eq!(
            Latencies::default().scaled(f64::INFINITY),
            Latencies::default().scaled(MAX_LATENCY_SCALE)
        );
    }
}
