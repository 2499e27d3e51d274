//! Wake on connect (issue 39): the set's Service and EndpointSlice, and the activator that
//! holds a connection to an idle-suspended set, resumes the set once and splices the bytes
//! to the main agent's VM when it is back.
//!
//! **Service and EndpointSlice** ([`service`], leader only). A set with `spec.idle.ports`
//! gets a Service named after it (no selector, one port `p<port>` per set port, owned by the
//! set) and an EndpointSlice `<set>-cocoon` of that Service: the main VM's IP and the set's
//! ports while the set is up and its main Ready, the activator replicas' addresses and each
//! port's activator port otherwise ([`plan`]). A Service of the set's name that the set does
//! not own is never touched (Warning `ServiceConflict`).
//!
//! **Activator ports.** The leader assigns one port of `ACTIVATOR_PORTS` per (namespace, set,
//! port) and records the pool in the ConfigMap [`POOL_CONFIGMAP`] of the operator's own
//! namespace — not on the tenant's Service, which a tenant could forge: what a port means is
//! only ever read from there, never from anything a client sends.
//!
//! **Replicas** ([`advertise`]). Every replica (leader or not) listens on `ACTIVATOR_ADDR`
//! (default the pod IP) on every port of the pool ([`listen`]) and publishes its address in
//! a Lease `cocoon-activator-<pod>` of the operator's namespace, renewed every
//! [`advertise::RENEW`]; the leader puts the addresses of the fresh Leases into the slices.
//!
//! **A connection** ([`listen`], [`wake`]). Beyond `ACTIVATOR_MAX_CONNECTIONS` held ones it is
//! closed (Warning `ActivatorFull`). Else one flight per set, however many connections wait:
//! an idle-suspended set whose `wakeOn` admits `connect` is resumed once
//! ([`cocoon_api::contract::idle::wake_patch`], field manager `cocoon-activator`); a set the
//! user suspended is not (the connection is closed, a Warning `WakeIgnored` says why). Each
//! connection then dials the main VM's IP and its port until it answers, at most
//! `ACTIVATOR_WAKE_WAIT` (then it is closed, Warning `WakeWaitExceeded`), and splices.

pub mod advertise;
pub mod listen;
pub mod metrics;
pub mod plan;
#[cfg(test)]
mod plan_tests;
pub mod service;
pub mod wake;

use std::net::IpAddr;
use std::time::Duration;

use self::plan::PortRange;

/// The ConfigMap (in the operator's namespace) that records the activator port pool: data
/// `"<port>": "<namespace>/<set>/<set port>"`. Only the leader writes it.
pub const POOL_CONFIGMAP: &str = "cocoon-activator-ports";

/// Environment variables of the activator.
pub mod env {
    /// The address the activator listens on and advertises (default: `POD_IP`).
    pub const ADDR: &str = "ACTIVATOR_ADDR";
    /// The pod IP from the Downward API.
    pub const POD_IP: &str = "POD_IP";
    /// The activator port pool, `first-last` (default [`super::DEFAULT_PORTS`]).
    pub const PORTS: &str = "ACTIVATOR_PORTS";
    /// How long a connection waits for the VM (Go duration, default 60s).
    pub const WAKE_WAIT: &str = "ACTIVATOR_WAKE_WAIT";
    /// Most connections held at once (default 1000).
    pub const MAX_CONNECTIONS: &str = "ACTIVATOR_MAX_CONNECTIONS";
    /// Comma-separated CIDRs the activator may dial VMs in (default: any).
    pub const VM_CIDRS: &str = "ACTIVATOR_VM_CIDRS";
}

/// Default of `ACTIVATOR_PORTS`.
pub const DEFAULT_PORTS: &str = "40000-40999";
/// Default of `ACTIVATOR_WAKE_WAIT`.
pub const DEFAULT_WAKE_WAIT: Duration = Duration::from_secs(60);
/// Default of `ACTIVATOR_MAX_CONNECTIONS`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1000;
/// Largest `ACTIVATOR_MAX_CONNECTIONS`.
pub const MAX_MAX_CONNECTIONS: usize = 100_000;

/// The activator's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Where this replica listens and what it advertises; `None`: this replica does not
    /// listen (no `ACTIVATOR_ADDR`, no `POD_IP`).
    pub addr: Option<IpAddr>,
    pub ports: PortRange,
    pub wake_wait: Duration,
    pub max_connections: usize,
    /// The operator's namespace (the pool ConfigMap, the replica Leases).
    pub namespace: String,
    /// This replica's name (its Lease is `cocoon-activator-<identity>`).
    pub identity: String,
    /// The networks the activator may dial VMs in (`ACTIVATOR_VM_CIDRS`); empty: any IP the
    /// main pod's `vm.cocoonstack.io/ip` names (a tenant can write it: set this in production).
    pub vm_networks: Vec<wake::Cidr>,
}

/// A bad activator setting, naming its variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{var}={value:?}: {why}")]
pub struct ConfigError {
    pub var: &'static str,
    pub value: String,
    pub why: &'static str,
}

impl Config {
    /// Reads the settings through `get` (an empty value is unset); `namespace` and
    /// `identity` come from the caller (`POD_NAMESPACE`, `POD_NAME`).
    pub fn from_env(
        get: &dyn Fn(&str) -> Option<String>,
        namespace: &str,
        identity: &str,
    ) -> Result<Self, ConfigError> {
        let read = |var: &str| {
            get(var)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let bad =
            |var: &'static str, value: String, why: &'static str| ConfigError { var, value, why };
        let addr = match (read(env::ADDR), read(env::POD_IP)) {
            (Some(v), _) => Some(
                v.parse()
                    .map_err(|_| bad(env::ADDR, v, "not an IP address"))?,
            ),
            (None, Some(v)) => Some(
                v.parse()
                    .map_err(|_| bad(env::POD_IP, v, "not an IP address"))?,
            ),
            (None, None) => None,
        };
        let ports_text = read(env::PORTS).unwrap_or_else(|| DEFAULT_PORTS.to_owned());
        let ports = PortRange::parse(&ports_text).ok_or_else(|| {
            bad(
                env::PORTS,
                ports_text.clone(),
                "want first-last, 1..=65535, first <= last, at most 10000 ports",
            )
        })?;
        let wake_wait = match read(env::WAKE_WAIT) {
            None => DEFAULT_WAKE_WAIT,
            Some(v) => cocoon_api::contract::idle::parse_duration(&v)
                .ok()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| bad(env::WAKE_WAIT, v, "want a positive duration such as 60s"))?,
        };
        let max_connections = match read(env::MAX_CONNECTIONS) {
            None => DEFAULT_MAX_CONNECTIONS,
            Some(v) => v
                .parse()
                .ok()
                .filter(|n| (1..=MAX_MAX_CONNECTIONS).contains(n))
                .ok_or_else(|| bad(env::MAX_CONNECTIONS, v, "want a number in 1..=100000"))?,
        };
        let vm_networks = match read(env::VM_CIDRS) {
            None => Vec::new(),
            Some(v) => v
                .split(',')
                .filter(|c| !c.trim().is_empty())
                .map(wake::Cidr::parse)
                .collect::<Option<Vec<_>>>()
                .filter(|l| !l.is_empty())
                .ok_or_else(|| {
                    bad(
                        env::VM_CIDRS,
                        v.clone(),
                        "want CIDRs such as 10.88.0.0/16,fd00::/8",
                    )
                })?,
        };
        Ok(Config {
            vm_networks,
            addr,
            ports,
            wake_wait,
            max_connections,
            namespace: namespace.to_owned(),
            identity: identity.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let map: std::collections::BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_env(&|k| map.get(k).cloned(), "cocoon-system", "op-0")
    }

    #[test]
    fn defaults_and_the_pod_ip_fallback() {
        let c = from(&[]).unwrap();
        assert_eq!(c.addr, None);
        assert_eq!((c.ports.first, c.ports.last), (40000, 40999));
        assert_eq!(c.wake_wait, DEFAULT_WAKE_WAIT);
        assert_eq!(c.max_connections, 1000);
        assert!(c.vm_networks.is_empty());
        let c = from(&[(env::VM_CIDRS, "10.88.0.0/16, fd00::/8")]).unwrap();
        assert_eq!(c.vm_networks.len(), 2);
        let c = from(&[(env::POD_IP, "10.0.0.5")]).unwrap();
        assert_eq!(c.addr, Some("10.0.0.5".parse().unwrap()));
        let c = from(&[(env::POD_IP, "10.0.0.5"), (env::ADDR, "10.0.0.9")]).unwrap();
        assert_eq!(c.addr, Some("10.0.0.9".parse().unwrap()));
    }

    #[test]
    fn a_bad_value_names_its_variable() {
        for (var, value) in [
            (env::ADDR, "nope"),
            (env::PORTS, "40000"),
            (env::WAKE_WAIT, "0s"),
            (env::WAKE_WAIT, "soon"),
            (env::MAX_CONNECTIONS, "0"),
            (env::MAX_CONNECTIONS, "many"),
            (env::VM_CIDRS, "10.0.0.0"),
            (env::VM_CIDRS, "10.0.0.0/8,nope"),
        ] {
            let err = from(&[(var, value)]).unwrap_err();
            assert_eq!(err.var, var);
            assert!(err.to_string().starts_with(var), "{err}");
        }
    }
}
