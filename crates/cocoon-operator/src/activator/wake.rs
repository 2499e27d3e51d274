//! The rule of one look of a wake flight: given the set (and its main pod), what the flight
//! does next. Pure; the flight ([`super::listen`]) reads the facts and acts.

use std::net::IpAddr;

use cocoon_api::contract::idle::IDLE_SUSPENDED;
use cocoon_api::crd::set::{CocoonSet, WakeOn};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::plan::{Route, route};

/// Why a connection may not wake its set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Suspended without the idle annotation: the user's suspend.
    UserSuspended,
    /// Idle-suspended, but `spec.idle.wakeOn` does not list `connect`.
    ConnectNotAllowed,
    /// The main VM's IP (the pod's `status.podIP`) is outside `ACTIVATOR_VM_CIDRS`.
    VmNotAllowed,
}

impl Refusal {
    /// The `reason` label of the refused counter.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::UserSuspended => super::metrics::reason::USER_SUSPENDED,
            Refusal::ConnectNotAllowed => super::metrics::reason::CONNECT_NOT_ALLOWED,
            Refusal::VmNotAllowed => super::metrics::reason::VM_NOT_ALLOWED,
        }
    }

    /// The Event message.
    pub fn message(self) -> &'static str {
        match self {
            Refusal::UserSuspended => {
                "a connection reached the set while its user suspended it: not woken, connection closed"
            }
            Refusal::ConnectNotAllowed => {
                "a connection reached the idle-suspended set but spec.idle.wakeOn does not list connect: not woken, connection closed"
            }
            Refusal::VmNotAllowed => {
                "the main VM's IP (the main pod's status.podIP) is outside ACTIVATOR_VM_CIDRS: the activator does not dial it, connection closed"
            }
        }
    }
}

/// What a flight does after one look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The set is gone: close the connections.
    Gone,
    /// Write the wake (guarded by this resourceVersion).
    Resume { resource_version: String },
    /// The set may not be woken by a connection.
    Refuse(Refusal),
    /// Awake, not serving yet (resuming, main not Ready): look again.
    Wait,
    /// The main VM serves at this IP: the connections dial it.
    Serve(String),
}

/// A network the activator may dial VMs in (`ACTIVATOR_VM_CIDRS`, `10.88.0.0/16`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Reads `addr/prefix` (prefix within the family's bits); `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        let (a, p) = text.trim().split_once('/')?;
        let addr: IpAddr = a.parse().ok()?;
        let prefix: u8 = p.parse().ok()?;
        let bits = if addr.is_ipv4() { 32 } else { 128 };
        (prefix <= bits).then_some(Cidr { addr, prefix })
    }

    /// Whether `ip` is inside.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let (net, ip, bits) = match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(i)) => {
                (u128::from(n.to_bits()), u128::from(i.to_bits()), 32)
            }
            (IpAddr::V6(n), IpAddr::V6(i)) => (n.to_bits(), i.to_bits(), 128),
            _ => return false,
        };
        let shift = bits - u32::from(self.prefix);
        shift >= bits || (net >> shift) == (ip >> shift)
    }
}

/// Whether the activator may dial `ip`: inside one of `allowed`, or anywhere when none are set.
pub fn may_dial(ip: &str, allowed: &[Cidr]) -> bool {
    match ip.parse::<IpAddr>() {
        Ok(ip) => allowed.is_empty() || allowed.iter().any(|c| c.contains(ip)),
        Err(_) => false,
    }
}

/// One look at `set` (`None`: gone) and its main pod; a VM IP outside `allowed` is refused.
pub fn step(set: Option<&CocoonSet>, main: Option<&Pod>, allowed: &[Cidr]) -> Step {
    let Some(set) = set else {
        return Step::Gone;
    };
    if set.metadata.deletion_timestamp.is_some() {
        return Step::Gone;
    }
    if set.spec.suspend {
        if !set.annotations().contains_key(IDLE_SUSPENDED) {
            return Step::Refuse(Refusal::UserSuspended);
        }
        if !set
            .spec
            .idle
            .as_ref()
            .is_some_and(|i| i.wakes_on(WakeOn::Connect))
        {
            return Step::Refuse(Refusal::ConnectNotAllowed);
        }
        return Step::Resume {
            resource_version: set.resource_version().unwrap_or_default(),
        };
    }
    match route(set, main) {
        Route::Vm(ip) if may_dial(&ip, allowed) => Step::Serve(ip),
        Route::Vm(_) => Step::Refuse(Refusal::VmNotAllowed),
        Route::Activator => Step::Wait,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cocoon_api::crd::set::{CocoonSetPhase, CocoonSetSpec, CocoonSetStatus, IdleSpec};
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};

    fn set(suspend: bool, idle_suspended: bool, wake_on: &[WakeOn]) -> CocoonSet {
        let mut cs = CocoonSet::new("web", CocoonSetSpec::with_image("img:1"));
        cs.metadata.resource_version = Some("17".into());
        cs.spec.suspend = suspend;
        cs.spec.idle = Some(IdleSpec {
            ports: vec![7000],
            wake_on: wake_on.to_vec(),
            ..IdleSpec::default()
        });
        if idle_suspended {
            cs.metadata.annotations =
                Some([(IDLE_SUSPENDED.to_owned(), "2026-12-07T22:00:00Z".to_owned())].into());
        }
        cs.status = Some(CocoonSetStatus {
            phase: Some(if suspend {
                CocoonSetPhase::Suspended
            } else {
                CocoonSetPhase::Running
            }),
            ..CocoonSetStatus::default()
        });
        cs
    }

    fn main(ready: bool) -> Pod {
        Pod {
            status: Some(PodStatus {
                pod_ip: Some("10.1.0.7".to_owned()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..PodCondition::default()
                }]),
                ..PodStatus::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn only_an_idle_suspend_that_admits_connect_is_woken() {
        use WakeOn::*;
        let resume = Step::Resume {
            resource_version: "17".into(),
        };
        let rows = [
            (
                "idle-suspended, wakeOn empty",
                set(true, true, &[]),
                resume.clone(),
            ),
            (
                "idle-suspended, wakeOn connect",
                set(true, true, &[Connect]),
                resume.clone(),
            ),
            (
                "idle-suspended, wakeOn both",
                set(true, true, &[Exec, Connect]),
                resume,
            ),
            (
                "idle-suspended, wakeOn exec only",
                set(true, true, &[Exec]),
                Step::Refuse(Refusal::ConnectNotAllowed),
            ),
            (
                "the user's suspend",
                set(true, false, &[]),
                Step::Refuse(Refusal::UserSuspended),
            ),
        ];
        for (what, cs, want) in rows {
            assert_eq!(step(Some(&cs), Some(&main(false)), &[]), want, "{what}");
        }
    }

    #[test]
    fn an_awake_set_is_dialled_once_its_main_is_ready() {
        let cs = set(false, false, &[]);
        assert_eq!(step(Some(&cs), Some(&main(false)), &[]), Step::Wait);
        assert_eq!(step(Some(&cs), None, &[]), Step::Wait);
        assert_eq!(
            step(Some(&cs), Some(&main(true)), &[]),
            Step::Serve("10.1.0.7".into())
        );
        assert_eq!(step(None, None, &[]), Step::Gone);
    }

    #[test]
    fn a_vm_ip_outside_the_vm_networks_is_never_dialled() {
        let cs = set(false, false, &[]);
        let nets =
            |list: &[&str]| -> Vec<Cidr> { list.iter().map(|c| Cidr::parse(c).unwrap()).collect() };
        assert_eq!(
            step(Some(&cs), Some(&main(true)), &nets(&["10.1.0.0/16"])),
            Step::Serve("10.1.0.7".into())
        );
        assert_eq!(
            step(
                Some(&cs),
                Some(&main(true)),
                &nets(&["10.2.0.0/16", "fd00::/8"])
            ),
            Step::Refuse(Refusal::VmNotAllowed)
        );
        for (net, ip, inside) in [
            ("10.1.0.7/32", "10.1.0.7", true),
            ("10.1.0.7/32", "10.1.0.8", false),
            ("0.0.0.0/0", "192.0.2.1", true),
            ("fd00::/8", "fd12::1", true),
            ("fd00::/8", "10.1.0.7", false),
        ] {
            assert_eq!(
                Cidr::parse(net).unwrap().contains(ip.parse().unwrap()),
                inside,
                "{net} {ip}"
            );
        }
        for bad in ["10.0.0.0", "10.0.0.0/33", "x/8", "fd00::/129"] {
            assert_eq!(Cidr::parse(bad), None, "{bad}");
        }
        assert!(!may_dial("not-an-ip", &[]));
    }
}
