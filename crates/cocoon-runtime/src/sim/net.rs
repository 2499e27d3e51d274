//! Simulated networking: unique MACs, an IPv4 pool for DHCP and static NICs, and the
//! cocoon-net lease file (`[{"mac","ip","expiry"}]`) the node agent reads at `VK_LEASES_PATH`.
//!
//! Pure except for [`write_leases`], which replaces the file atomically.

use std::collections::HashSet;
use std::io;
use std::net::Ipv4Addr;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Result, RuntimeError};

/// An IPv4 pool: `network/prefix`; the gateway is the first host, leases start at the second.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpPool {
    /// Network address.
    pub network: Ipv4Addr,
    /// Prefix length (8..=30).
    pub prefix: u8,
}

impl Default for IpPool {
    fn default() -> Self {
        IpPool {
            network: Ipv4Addr::new(10, 88, 0, 0),
            prefix: 16,
        }
    }
}

impl IpPool {
    /// Parses `a.b.c.d/len` (host bits are cleared).
    pub fn parse(cidr: &str) -> Result<Self> {
        let bad = || RuntimeError::Other(format!("invalid IP pool {cidr:?}: want a.b.c.d/8..30"));
        let (addr, len) = cidr.trim().split_once('/').ok_or_else(bad)?;
        let addr: Ipv4Addr = addr.parse().map_err(|_| bad())?;
        let prefix: u8 = len.parse().map_err(|_| bad())?;
        if !(8..=30).contains(&prefix) {
            return Err(bad());
        }
        let mask = u32::MAX << (32 - prefix);
        Ok(IpPool {
            network: Ipv4Addr::from(u32::from(addr) & mask),
            prefix,
        })
    }

    /// The gateway (first host address).
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.network) + 1)
    }

    /// The lowest free host address from the second host up, skipping `used`.
    pub fn allocate(&self, used: &HashSet<Ipv4Addr>) -> Option<Ipv4Addr> {
        let base = u32::from(self.network);
        let hosts = (1u32 << (32 - self.prefix)) - 2;
        (2..=hosts)
            .map(|i| Ipv4Addr::from(base + i))
            .find(|ip| !used.contains(ip))
    }
}

/// A locally administered unicast MAC (`02:xx:xx:xx:xx:xx`) not in `used`.
pub fn new_mac(used: &HashSet<String>, random: impl Fn() -> [u8; 5]) -> String {
    loop {
        let b = random();
        let mac = format!(
            "02:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4]
        );
        if !used.contains(&mac) {
            return mac;
        }
    }
}

/// One cocoon-net lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// NIC MAC (lower case).
    pub mac: String,
    /// Leased IPv4 address.
    pub ip: String,
    /// Expiry, RFC3339.
    pub expiry: String,
}

/// Replaces the lease file with `leases` (a JSON array), atomically.
pub fn write_leases(path: &Path, leases: &[Lease]) -> io::Result<()> {
    let body = serde_json::to_vec_pretty(leases).map_err(io::Error::other)?;
    super::state::write_atomic(path, &body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn pool_allocates_lowest_free_after_gateway() {
        let pool = IpPool::parse("10.1.2.77/24").expect("pool");
        assert_eq!(pool.network, Ipv4Addr::new(10, 1, 2, 0));
        assert_eq!(pool.gateway(), Ipv4Addr::new(10, 1, 2, 1));
        let mut used = HashSet::new();
        assert_eq!(pool.allocate(&used), Some(Ipv4Addr::new(10, 1, 2, 2)));
        used.insert(Ipv4Addr::new(10, 1, 2, 2));
        assert_eq!(pool.allocate(&used), Some(Ipv4Addr::new(10, 1, 2, 3)));
        let tiny = IpPool::parse("10.0.0.0/30").expect("pool");
        used.insert(Ipv4Addr::new(10, 0, 0, 2));
        assert_eq!(tiny.allocate(&used), None, "/30 has one lease address");
        for bad in ["10.0.0.0", "10.0.0.0/31", "x/24", "10.0.0.0/abc"] {
            assert!(IpPool::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn macs_are_unique_and_locally_administered() {
        let n = Cell::new(0u8);
        // A generator that repeats its first value once forces the retry.
        let next = || {
            let v = n.get();
            n.set(v + 1);
            [0, 0, 0, 0, v.saturating_sub(1)]
        };
        let mut used = HashSet::new();
        let a = new_mac(&used, next);
        used.insert(a.clone());
        let b = new_mac(&used, next);
        assert_ne!(a, b);
        assert!(a.starts_with("02:"));
        assert_eq!(a.len(), 17);
    }

    #[test]
    fn lease_file_is_a_json_array() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("net/leases.json");
        let leases = vec![Lease {
            mac: "02:00:00:00:00:01".into(),
            ip: "10.88.0.2".into(),
            expiry: "2030-01-01T00:00:00Z".into(),
        }];
        write_leases(&p, &leases).expect("write");
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&p).expect("read")).expect("json");
        assert_eq!(
            v,
            serde_json::json!([{"mac":"02:00:00:00:00:01","ip":"10.88.0.2","expiry":"2030-01-01T00:00:00Z"}])
        );
    }
}
