//! The VM spec pod annotations of `contract.md` §5 and their enums (mode, OS, backend,
//! connection type, snapshot policy): the operator writes them at build, the node agent reads.
//!
//! Enum fields are `Option`: `None` means the key is absent, empty or not a known value, and is
//! never written. The `effective_*` accessors apply the reader defaults of the spec.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::annotations as ann;
use super::parse::{bool_value, get_bool, get_i32, get_str, non_empty, positive};
use super::patch::{AnnotationCodec, AnnotationDelta};

/// Declares a closed string enum with its exact wire spelling.
macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        $name:ident { $( $(#[$vmeta:meta])* $variant:ident => $wire:literal ),+ $(,)? }
    ) => {
        $(#[$meta])*
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
            schemars::JsonSchema,
        )]
        pub enum $name {
            $( $(#[$vmeta])* #[serde(rename = $wire)] $variant ),+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The exact wire spelling.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $wire),+
                }
            }

            /// Exact-match parse of the wire spelling; anything else is `None`.
            pub fn from_wire(value: &str) -> Option<Self> {
                match value {
                    $($wire => Some($name::$variant),)+
                    _ => None,
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

wire_enum! {
    /// How the node agent brings the VM up (`cocoonset.cocoonstack.io/mode`).
    Mode {
        /// Clone from a snapshot artifact (reader default).
        Clone => "clone",
        /// Boot a fresh VM from an image.
        Run => "run",
        /// Managed outside cocoon (toolboxes only); the node never touches the runtime.
        Static => "static",
    }
}

impl Mode {
    /// Node-side parse: case-insensitive, because the spec compares `run` case-insensitively;
    /// empty or unknown is `None` (which [`VmSpec::effective_mode`] reads as `clone`).
    pub fn parse_lenient(value: &str) -> Option<Self> {
        Self::ALL
            .iter()
            .copied()
            .find(|m| value.eq_ignore_ascii_case(m.as_str()))
    }
}

wire_enum! {
    /// Guest OS (`cocoonset.cocoonstack.io/os`).
    #[derive(Default)]
    Os {
        /// Linux guest (default).
        #[default]
        Linux => "linux",
        /// Windows guest.
        Windows => "windows",
        /// Android guest.
        Android => "android",
        /// macOS guest (driven by `cocoon-macos`; cannot hibernate).
        Macos => "macos",
    }
}

wire_enum! {
    /// Hypervisor backend (`vm.cocoonstack.io/backend`).
    #[derive(Default)]
    Backend {
        /// cloud-hypervisor (default).
        #[default]
        CloudHypervisor => "cloud-hypervisor",
        /// Firecracker.
        Firecracker => "firecracker",
    }
}

wire_enum! {
    /// Connection type hint (`vm.cocoonstack.io/conn-type`).
    ConnType {
        /// SSH.
        Ssh => "ssh",
        /// Remote desktop.
        Rdp => "rdp",
        /// VNC.
        Vnc => "vnc",
        /// Android debug bridge.
        Adb => "adb",
    }
}

impl ConnType {
    /// Status inference (`crds.md` §1.6): the explicit value; else `vnc` when a VNC port is
    /// known; else `adb` for Android, `rdp` for Windows, otherwise `ssh`.
    pub fn infer(explicit: Option<ConnType>, vnc_port: i32, os: Os) -> ConnType {
        match (explicit, os) {
            (Some(c), _) => c,
            (None, _) if vnc_port > 0 => ConnType::Vnc,
            (None, Os::Android) => ConnType::Adb,
            (None, Os::Windows) => ConnType::Rdp,
            (None, _) => ConnType::Ssh,
        }
    }
}

wire_enum! {
    /// Which VMs get a routine `:latest` snapshot on pod delete
    /// (`cocoonset.cocoonstack.io/snapshot-policy`).
    #[derive(Default)]
    SnapshotPolicy {
        /// Every VM (default; also what empty or unknown values mean).
        #[default]
        Always => "always",
        /// Only the main (slot 0).
        MainOnly => "main-only",
        /// No routine snapshots.
        Never => "never",
    }
}

/// The VM spec annotations of one pod (§5).
///
/// The writer skips empty strings, zero and false, so applying a spec never clears a key;
/// clearing is an explicit removal by the caller.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VmSpec {
    /// `vm.cocoonstack.io/name`; required by the node agent.
    pub vm_name: String,
    /// `cocoonset.cocoonstack.io/image`.
    pub image: String,
    /// `cocoonset.cocoonstack.io/mode`; see [`VmSpec::effective_mode`].
    pub mode: Option<Mode>,
    /// `cocoonset.cocoonstack.io/os`; see [`VmSpec::effective_os`].
    pub os: Option<Os>,
    /// `cocoonset.cocoonstack.io/storage` (Quantity string).
    pub storage: String,
    /// `cocoonset.cocoonstack.io/network` (CNI conflist name).
    pub network: String,
    /// `cocoonset.cocoonstack.io/snapshot-policy`; see [`VmSpec::effective_snapshot_policy`].
    pub snapshot_policy: Option<SnapshotPolicy>,
    /// `vm.cocoonstack.io/fork-from` (sub-agents only).
    pub fork_from: String,
    /// `vm.cocoonstack.io/conn-type`.
    pub conn_type: Option<ConnType>,
    /// `vm.cocoonstack.io/backend`; see [`VmSpec::effective_backend`].
    pub backend: Option<Backend>,
    /// `cocoonset.cocoonstack.io/managed`.
    pub managed: bool,
    /// `cocoonset.cocoonstack.io/force-pull`.
    pub force_pull: bool,
    /// `vm.cocoonstack.io/no-direct-io`.
    pub no_direct_io: bool,
    /// `vm.cocoonstack.io/probe-port`; 0 = ICMP probe.
    pub probe_port: i32,
}

impl VmSpec {
    /// Mode with the reader default: empty or unknown means `clone`.
    pub fn effective_mode(&self) -> Mode {
        self.mode.unwrap_or(Mode::Clone)
    }

    /// True when the VM boots fresh (`run`, compared case-insensitively at parse).
    pub fn is_run(&self) -> bool {
        self.effective_mode() == Mode::Run
    }

    /// OS with the CRD default `linux`.
    pub fn effective_os(&self) -> Os {
        self.os.unwrap_or(Os::Linux)
    }

    /// Backend with the CRD default `cloud-hypervisor`.
    pub fn effective_backend(&self) -> Backend {
        self.backend.unwrap_or(Backend::CloudHypervisor)
    }

    /// Snapshot policy with the reader default: empty or unknown means `always`.
    pub fn effective_snapshot_policy(&self) -> SnapshotPolicy {
        self.snapshot_policy.unwrap_or(SnapshotPolicy::Always)
    }
}

impl AnnotationCodec for VmSpec {
    fn from_annotations(a: &BTreeMap<String, String>) -> Self {
        VmSpec {
            vm_name: get_str(a, ann::VM_NAME).to_owned(),
            image: get_str(a, ann::IMAGE).to_owned(),
            mode: Mode::parse_lenient(get_str(a, ann::MODE)),
            os: Os::from_wire(get_str(a, ann::OS)),
            storage: get_str(a, ann::STORAGE).to_owned(),
            network: get_str(a, ann::NETWORK).to_owned(),
            snapshot_policy: SnapshotPolicy::from_wire(get_str(a, ann::SNAPSHOT_POLICY)),
            fork_from: get_str(a, ann::FORK_FROM).to_owned(),
            conn_type: ConnType::from_wire(get_str(a, ann::CONN_TYPE)),
            backend: Backend::from_wire(get_str(a, ann::BACKEND)),
            managed: get_bool(a, ann::MANAGED),
            force_pull: get_bool(a, ann::FORCE_PULL),
            no_direct_io: get_bool(a, ann::NO_DIRECT_IO),
            probe_port: get_i32(a, ann::PROBE_PORT),
        }
    }

    /// Only non-empty, non-zero, true values: the spec writer can never clear a key.
    fn desired(&self) -> AnnotationDelta {
        let entries = [
            (ann::VM_NAME, non_empty(&self.vm_name)),
            (ann::IMAGE, non_empty(&self.image)),
            (ann::MODE, self.mode.map(|m| m.as_str().to_owned())),
            (ann::OS, self.os.map(|o| o.as_str().to_owned())),
            (ann::STORAGE, non_empty(&self.storage)),
            (ann::NETWORK, non_empty(&self.network)),
            (
                ann::SNAPSHOT_POLICY,
                self.snapshot_policy.map(|p| p.as_str().to_owned()),
            ),
            (ann::FORK_FROM, non_empty(&self.fork_from)),
            (
                ann::CONN_TYPE,
                self.conn_type.map(|c| c.as_str().to_owned()),
            ),
            (ann::BACKEND, self.backend.map(|b| b.as_str().to_owned())),
            (ann::MANAGED, bool_value(self.managed)),
            (ann::FORCE_PULL, bool_value(self.force_pull)),
            (ann::NO_DIRECT_IO, bool_value(self.no_direct_io)),
            (ann::PROBE_PORT, positive(self.probe_port)),
        ];
        entries
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k.to_owned(), Some(v))))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn full_spec() -> VmSpec {
        VmSpec {
            vm_name: "vk-ns-demo-1-d239dc".into(),
            image: "ghcr.io/cocoonstack/cocoon/ubuntu:24.04".into(),
            mode: Some(Mode::Run),
            os: Some(Os::Windows),
            storage: "100Gi".into(),
            network: "cocoon".into(),
            snapshot_policy: Some(SnapshotPolicy::MainOnly),
            fork_from: "vk-ns-demo-0-505043".into(),
            conn_type: Some(ConnType::Rdp),
            backend: Some(Backend::Firecracker),
            managed: true,
            force_pull: true,
            no_direct_io: true,
            probe_port: 22,
        }
    }

    #[test]
    fn enums_round_trip_and_match_serde() {
        fn check<T>(all: &[T], as_str: fn(T) -> &'static str, from: fn(&str) -> Option<T>)
        where
            T: Copy + PartialEq + fmt::Debug + Serialize,
        {
            for v in all {
                assert_eq!(from(as_str(*v)), Some(*v));
                assert_eq!(
                    serde_json::to_value(v).ok(),
                    Some(serde_json::Value::String(as_str(*v).to_owned()))
                );
            }
        }
        check(Mode::ALL, Mode::as_str, Mode::from_wire);
        check(Os::ALL, Os::as_str, Os::from_wire);
        check(Backend::ALL, Backend::as_str, Backend::from_wire);
        check(ConnType::ALL, ConnType::as_str, ConnType::from_wire);
        check(
            SnapshotPolicy::ALL,
            SnapshotPolicy::as_str,
            SnapshotPolicy::from_wire,
        );
        assert_eq!(SnapshotPolicy::MainOnly.to_string(), "main-only");
        assert_eq!(Backend::CloudHypervisor.to_string(), "cloud-hypervisor");
    }

    #[test]
    fn full_spec_round_trips() {
        let spec = full_spec();
        let a = spec.to_annotations();
        assert_eq!(a.len(), 14);
        assert_eq!(a[ann::MODE], "run");
        assert_eq!(a[ann::SNAPSHOT_POLICY], "main-only");
        assert_eq!(a[ann::BACKEND], "firecracker");
        assert_eq!(a[ann::PROBE_PORT], "22");
        assert_eq!(a[ann::MANAGED], "true");
        assert_eq!(VmSpec::from_annotations(&a), spec);
        assert!(spec.delta(&a).is_empty());
        assert_eq!(spec.merge_patch(&a), None);
    }

    #[test]
    fn writer_skips_empty_zero_and_false() {
        let spec = VmSpec {
            vm_name: "vk-ns-demo-tb-7f9787".into(),
            mode: Some(Mode::Static),
            ..VmSpec::default()
        };
        assert_eq!(
            spec.to_annotations(),
            map(&[
                (ann::VM_NAME, "vk-ns-demo-tb-7f9787"),
                (ann::MODE, "static")
            ])
        );
        // An empty spec writes nothing and so can never clear a key.
        let current = map(&[(ann::MANAGED, "true"), (ann::IMAGE, "img")]);
        assert!(VmSpec::default().delta(&current).is_empty());
    }

    #[test]
    fn applying_does_not_clobber_other_keys() {
        let mut a = map(&[(ann::GENERATION, "7")]);
        full_spec().apply_to(&mut a);
        assert_eq!(a[ann::GENERATION], "7");
        assert_eq!(a[ann::VM_NAME], "vk-ns-demo-1-d239dc");
    }

    #[test]
    fn reader_defaults() {
        let empty = VmSpec::from_annotations(&BTreeMap::new());
        assert_eq!(empty, VmSpec::default());
        assert_eq!(empty.effective_mode(), Mode::Clone);
        assert_eq!(empty.effective_os(), Os::Linux);
        assert_eq!(empty.effective_backend(), Backend::CloudHypervisor);
        assert_eq!(empty.effective_snapshot_policy(), SnapshotPolicy::Always);
        assert!(!empty.is_run());
    }

    /// (key, raw value, what the decoded spec must satisfy)
    type Case = (&'static str, &'static str, fn(&VmSpec) -> bool);

    #[test]
    fn malformed_values_read_as_defaults() {
        let cases: &[Case] = &[
            (ann::MODE, "RUN", |s| s.is_run()),
            (ann::MODE, "Run", |s| s.mode == Some(Mode::Run)),
            (ann::MODE, "", |s| s.effective_mode() == Mode::Clone),
            (ann::MODE, "fork", |s| s.effective_mode() == Mode::Clone),
            (ann::SNAPSHOT_POLICY, "", |s| {
                s.effective_snapshot_policy() == SnapshotPolicy::Always
            }),
            (ann::SNAPSHOT_POLICY, "NEVER", |s| {
                s.effective_snapshot_policy() == SnapshotPolicy::Always
            }),
            (ann::OS, "beos", |s| s.os.is_none()),
            (ann::BACKEND, "qemu", |s| s.backend.is_none()),
            (ann::CONN_TYPE, "telnet", |s| s.conn_type.is_none()),
            (ann::MANAGED, "TRUE", |s| !s.managed),
            (ann::MANAGED, "yes", |s| !s.managed),
            (ann::FORCE_PULL, "1", |s| !s.force_pull),
            (ann::NO_DIRECT_IO, "", |s| !s.no_direct_io),
            (ann::PROBE_PORT, "http", |s| s.probe_port == 0),
            (ann::PROBE_PORT, "99999999999", |s| s.probe_port == 0),
            (ann::PROBE_PORT, "8080", |s| s.probe_port == 8080),
        ];
        for (key, value, check) in cases {
            let spec = VmSpec::from_annotations(&map(&[(key, value)]));
            assert!(check(&spec), "{key}={value:?} -> {spec:?}");
        }
    }

    #[test]
    fn conn_type_inference() {
        for (explicit, port, os, want) in [
            (Some(ConnType::Ssh), 5900, Os::Windows, ConnType::Ssh),
            (None, 5900, Os::Linux, ConnType::Vnc),
            (None, 0, Os::Android, ConnType::Adb),
            (None, 0, Os::Windows, ConnType::Rdp),
            (None, 0, Os::Linux, ConnType::Ssh),
            (None, 0, Os::Macos, ConnType::Ssh),
        ] {
            assert_eq!(ConnType::infer(explicit, port, os), want);
        }
    }
}
