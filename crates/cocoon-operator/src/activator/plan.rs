//! The rules of the set's Service and EndpointSlice and of the activator port pool, as pure
//! functions: facts in, the desired objects and the writes out.
//!
//! - [`route`]: where a set's traffic goes — the main agent's VM while the set is up and the
//!   main is Ready, the activator otherwise.
//! - [`plan`]: the Service (named after the set, no selector, owned by it) and the
//!   EndpointSlice (`<set>-cocoon`) the set should have, against what exists: create, patch,
//!   delete or nothing; a Service of the set's name the set does not own is a conflict and is
//!   never written.
//! - [`allocate`]: one activator port per (namespace, set, port), from a bounded range,
//!   keeping every existing assignment that is still wanted.

use std::collections::{BTreeMap, BTreeSet};

use cocoon_api::contract::idle::ENDPOINTSLICE_MANAGED_BY;
use cocoon_api::contract::labels;
use cocoon_api::crd::set::{CocoonSet, CocoonSetPhase};
use k8s_openapi::api::core::v1::{Pod, Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};

/// Label of an EndpointSlice naming its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Label of an EndpointSlice naming who manages it.
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";

/// The EndpointSlice the operator keeps for `set`.
pub fn slice_name(set: &str) -> String {
    format!("{set}-cocoon")
}

/// The name of a set's port in the Service and the slice (`p7000`).
pub fn port_name(port: u16) -> String {
    format!("p{port}")
}

/// One port of one set: what an activator port stands for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Target {
    pub namespace: String,
    pub set: String,
    pub port: u16,
}

impl Target {
    /// The ConfigMap value (`<namespace>/<set>/<port>`).
    pub fn encode(&self) -> String {
        format!("{}/{}/{}", self.namespace, self.set, self.port)
    }

    /// Reads a ConfigMap value back; `None` for anything malformed.
    pub fn decode(text: &str) -> Option<Self> {
        let mut parts = text.split('/');
        let (ns, set, port) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || ns.is_empty() || set.is_empty() {
            return None;
        }
        Some(Target {
            namespace: ns.to_owned(),
            set: set.to_owned(),
            port: port.parse().ok().filter(|p| *p != 0)?,
        })
    }
}

/// Where a set's traffic goes now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// The main agent's VM at this IP serves the set's ports.
    Vm(String),
    /// The set is suspended, suspending, waking or its main is not Ready: the activator holds
    /// the connections.
    Activator,
}

/// The main agent's VM IP: the main pod's `status.podIP`, which only the node agent writes
/// (through `pods/status`, which a tenant's `edit` role does not grant). Never the pod
/// annotation `vm.cocoonstack.io/ip` nor `status.agents` (built from it): a tenant may write
/// annotations on its own pods, and an address taken from one would let it point the
/// EndpointSlice and the activator's dial at any host.
pub fn main_ip(main: Option<&Pod>) -> Option<String> {
    main.and_then(|p| p.status.as_ref())
        .and_then(|s| s.pod_ip.clone())
        .filter(|ip| !ip.is_empty())
}

fn ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The VM serves while the set is not asked to suspend, its phase is neither Suspending,
/// Suspended nor Waking (nor unknown), and its main pod is Ready with a VM IP; else the
/// activator takes the connections.
pub fn route(set: &CocoonSet, main: Option<&Pod>) -> Route {
    let phase = set.status.as_ref().and_then(|s| s.phase);
    let up = !set.spec.suspend
        && phase.is_some_and(|p| {
            !matches!(
                p,
                CocoonSetPhase::Suspending | CocoonSetPhase::Suspended | CocoonSetPhase::Waking
            )
        });
    match (up, main.filter(|p| ready(p)).and(main_ip(main))) {
        (true, Some(ip)) => Route::Vm(ip),
        _ => Route::Activator,
    }
}

/// The set's ports (`spec.idle.ports` in 1..=65535, deduplicated, in order).
pub fn set_ports(set: &CocoonSet) -> Vec<u16> {
    let ports: BTreeSet<u16> = set
        .spec
        .idle
        .iter()
        .flat_map(|i| i.ports.iter())
        .filter_map(|p| u16::try_from(*p).ok().filter(|p| *p != 0))
        .collect();
    ports.into_iter().collect()
}

/// A write of one object.
#[derive(Debug, Clone, PartialEq)]
pub enum Write<K> {
    /// Nothing to do.
    Keep,
    Create(K),
    /// A merge patch of the fields the operator owns.
    Patch(serde_json::Value),
    /// Delete ours (and create it again on the next pass, when the plan still wants it).
    Delete,
}

/// What one pass writes for one set.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub service: Write<Service>,
    pub slice: Write<EndpointSlice>,
    /// A Service of the set's name exists and is not the set's: nothing was planned for it
    /// (a Warning `ServiceConflict`).
    pub conflict: bool,
}

/// What a pass sees of one set.
pub struct Observed<'a> {
    pub set: &'a CocoonSet,
    pub main: Option<&'a Pod>,
    pub service: Option<&'a Service>,
    pub slice: Option<&'a EndpointSlice>,
    /// The fresh activator replicas' addresses.
    pub activator_addresses: &'a [String],
    /// The activator port of each of the set's ports (from the pool).
    pub activator_ports: &'a BTreeMap<u16, u16>,
}

fn owned_by(meta: &ObjectMeta, uid: &str) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == uid)
}

fn owner_ref(set: &CocoonSet) -> Option<OwnerReference> {
    set.controller_owner_ref(&()).map(|mut o| {
        o.block_owner_deletion = Some(true);
        o
    })
}

/// The Service the set should have.
pub fn desired_service(set: &CocoonSet, ports: &[u16]) -> Service {
    let name = set.name_any();
    Service {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: set.namespace(),
            labels: Some([(labels::COCOONSET_NAME.to_owned(), name)].into()),
            owner_references: owner_ref(set).map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            ports: Some(
                ports
                    .iter()
                    .map(|p| ServicePort {
                        name: Some(port_name(*p)),
                        port: i32::from(*p),
                        target_port: Some(IntOrString::Int(i32::from(*p))),
                        protocol: Some("TCP".into()),
                        ..ServicePort::default()
                    })
                    .collect(),
            ),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

fn address_type(address: &str) -> &'static str {
    if address.contains(':') {
        "IPv6"
    } else {
        "IPv4"
    }
}

/// The EndpointSlice the set should have on `route`: the VM's IP and the set's ports, or the
/// activator addresses (of the VM's family, IPv4 by default) and each port's activator port
/// (a port without one is left out).
pub fn desired_slice(
    set: &CocoonSet,
    ports: &[u16],
    route: &Route,
    activator_addresses: &[String],
    activator_ports: &BTreeMap<u16, u16>,
) -> EndpointSlice {
    let name = set.name_any();
    let (family, addresses, slice_ports): (&str, Vec<String>, Vec<(u16, u16)>) = match route {
        Route::Vm(ip) => (
            address_type(ip),
            vec![ip.clone()],
            ports.iter().map(|p| (*p, *p)).collect(),
        ),
        Route::Activator => {
            let family = activator_addresses
                .first()
                .map_or("IPv4", |a| address_type(a));
            let mut addrs: Vec<String> = activator_addresses
                .iter()
                .filter(|a| address_type(a) == family)
                .cloned()
                .collect();
            addrs.sort();
            addrs.dedup();
            (
                family,
                addrs,
                ports
                    .iter()
                    .filter_map(|p| activator_ports.get(p).map(|a| (*p, *a)))
                    .collect(),
            )
        }
    };
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(slice_name(&name)),
            namespace: set.namespace(),
            labels: Some(
                [
                    (SERVICE_NAME_LABEL.to_owned(), name.clone()),
                    (
                        MANAGED_BY_LABEL.to_owned(),
                        ENDPOINTSLICE_MANAGED_BY.to_owned(),
                    ),
                    (labels::COCOONSET_NAME.to_owned(), name),
                ]
                .into(),
            ),
            owner_references: owner_ref(set).map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        address_type: family.to_owned(),
        endpoints: addresses
            .into_iter()
            .map(|a| Endpoint {
                addresses: vec![a],
                conditions: Some(EndpointConditions {
                    ready: Some(true),
                    serving: Some(true),
                    terminating: Some(false),
                }),
                ..Endpoint::default()
            })
            .collect(),
        ports: Some(
            slice_ports
                .into_iter()
                .map(|(set_port, port)| EndpointPort {
                    name: Some(port_name(set_port)),
                    port: Some(i32::from(port)),
                    protocol: Some("TCP".into()),
                    ..EndpointPort::default()
                })
                .collect(),
        ),
    }
}

/// The Service's ports as (name, port, target port), for comparison (the server adds
/// defaults elsewhere).
fn service_ports(svc: &Service) -> Vec<(Option<String>, i32, Option<IntOrString>)> {
    let mut out: Vec<_> = svc
        .spec
        .iter()
        .flat_map(|s| s.ports.iter().flatten())
        .map(|p| (p.name.clone(), p.port, p.target_port.clone()))
        .collect();
    out.sort_by_key(|a| a.1);
    out
}

/// Whether `have` carries every label of `want` with the same value.
fn has_labels(have: &ObjectMeta, want: &ObjectMeta) -> bool {
    want.labels.iter().flatten().all(|(k, v)| {
        have.labels
            .as_ref()
            .and_then(|l| l.get(k))
            .is_some_and(|h| h == v)
    })
}

/// A slice's ready endpoints' addresses and its (name, port) pairs, both sorted.
type SliceContent = (Vec<Vec<String>>, Vec<(Option<String>, Option<i32>)>);

fn slice_content(s: &EndpointSlice) -> SliceContent {
    let mut endpoints: Vec<Vec<String>> = s
        .endpoints
        .iter()
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
        .map(|e| e.addresses.clone())
        .collect();
    endpoints.sort();
    let mut ports: Vec<_> = s
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.clone(), p.port))
        .collect();
    ports.sort();
    (endpoints, ports)
}

/// The writes of one pass for one set.
pub fn plan(o: &Observed<'_>) -> Plan {
    let uid = o.set.uid().unwrap_or_default();
    let ports = set_ports(o.set);
    let ours_service = o.service.filter(|s| owned_by(&s.metadata, &uid));
    let ours_slice = o.slice.filter(|s| owned_by(&s.metadata, &uid));
    let conflict = !ports.is_empty() && o.service.is_some() && ours_service.is_none();
    if ports.is_empty() || conflict || o.set.metadata.deletion_timestamp.is_some() {
        // No ports (or a foreign Service of our name): ours go, a foreign one stays.
        return Plan {
            service: if ours_service.is_some() {
                Write::Delete
            } else {
                Write::Keep
            },
            slice: if ours_slice.is_some() {
                Write::Delete
            } else {
                Write::Keep
            },
            conflict,
        };
    }
    let want_service = desired_service(o.set, &ports);
    let service = match ours_service {
        None => Write::Create(want_service),
        Some(have)
            if service_ports(have) == service_ports(&want_service)
                && has_labels(&have.metadata, &want_service.metadata) =>
        {
            Write::Keep
        }
        Some(_) => Write::Patch(serde_json::json!({
            "metadata": { "labels": want_service.metadata.labels },
            "spec": { "ports": want_service.spec.as_ref().and_then(|s| s.ports.clone()) },
        })),
    };
    let route = route(o.set, o.main);
    let want_slice = desired_slice(
        o.set,
        &ports,
        &route,
        o.activator_addresses,
        o.activator_ports,
    );
    // A slice of the set's name that is not the set's is left alone: its Service's
    // endpoints are its owner's business; ours waits for the name.
    let slice = match (o.slice, ours_slice) {
        (None, _) => Write::Create(want_slice),
        (Some(_), None) => Write::Keep,
        (Some(_), Some(have)) if have.address_type != want_slice.address_type => Write::Delete,
        (Some(_), Some(have))
            if slice_content(have) == slice_content(&want_slice)
                && has_labels(&have.metadata, &want_slice.metadata) =>
        {
            Write::Keep
        }
        (Some(_), Some(_)) => Write::Patch(serde_json::json!({
            "metadata": { "labels": want_slice.metadata.labels },
            "endpoints": want_slice.endpoints,
            "ports": want_slice.ports,
        })),
    };
    Plan {
        service,
        slice,
        conflict,
    }
}

/// An inclusive range of activator ports (`ACTIVATOR_PORTS`, `40000-40999`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    /// Reads `first-last` (both in 1..=65535, first ≤ last, at most 10000 ports).
    pub fn parse(text: &str) -> Option<Self> {
        let (a, b) = text.trim().split_once('-')?;
        let (first, last): (u16, u16) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
        (first != 0 && first <= last && last - first < 10_000).then_some(PortRange { first, last })
    }

    pub fn contains(&self, port: u16) -> bool {
        (self.first..=self.last).contains(&port)
    }
}

/// The pool after [`allocate`]: every assignment, and what found no free port.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Allocation {
    pub ports: BTreeMap<u16, Target>,
    pub unallocated: Vec<Target>,
}

/// Assigns one port of `range` to each of `wanted`: an existing assignment that is still
/// wanted (and in the range) keeps its port, the rest are dropped, new targets take the
/// lowest free ports in order; targets beyond the pool are listed as unallocated.
pub fn allocate(
    current: &BTreeMap<u16, Target>,
    wanted: &BTreeSet<Target>,
    range: PortRange,
) -> Allocation {
    let mut ports: BTreeMap<u16, Target> = BTreeMap::new();
    let mut placed: BTreeSet<&Target> = BTreeSet::new();
    for (port, target) in current {
        if range.contains(*port) && wanted.contains(target) && placed.insert(target) {
            ports.insert(*port, target.clone());
        }
    }
    let taken: BTreeSet<u16> = ports.keys().copied().collect();
    let mut free = (range.first..=range.last).filter(|p| !taken.contains(p));
    let mut unallocated = Vec::new();
    for target in wanted.iter().filter(|t| !placed.contains(t)) {
        match free.next() {
            Some(p) => {
                ports.insert(p, target.clone());
            }
            None => unallocated.push(target.clone()),
        }
    }
    Allocation { ports, unallocated }
}

/// The activator port of each port of `namespace/set` in `pool`.
pub fn ports_of(pool: &BTreeMap<u16, Target>, namespace: &str, set: &str) -> BTreeMap<u16, u16> {
    pool.iter()
        .filter(|(_, t)| t.namespace == namespace && t.set == set)
        .map(|(p, t)| (t.port, *p))
        .collect()
}

/// Reads the pool from the ConfigMap's data (malformed entries are skipped).
pub fn decode_pool(data: &BTreeMap<String, String>) -> BTreeMap<u16, Target> {
    data.iter()
        .filter_map(|(k, v)| Some((k.parse().ok()?, Target::decode(v)?)))
        .collect()
}

/// The pool as ConfigMap data.
pub fn encode_pool(pool: &BTreeMap<u16, Target>) -> BTreeMap<String, String> {
    pool.iter()
        .map(|(p, t)| (p.to_string(), t.encode()))
        .collect()
}
