//! Unmanaged pods' IPs (issue 35 item 3): which `vm.cocoonstack.io/ip` an unmanaged pod may
//! pre-assign.
//!
//! An unmanaged pod (`cocoonset.cocoonstack.io/managed: "false"`, a static toolbox) never
//! reaches the runtime: the agent tracks a synthetic record and publishes the pre-assigned IP
//! as the pod's `status.podIP`. Without a limit a tenant could name another tenant's VM IP
//! there and have its own Service or Ingress send traffic to that VM (the CVE-2021-25740
//! class). So the IP must be:
//!
//! * an IP address (IPv4 or IPv6; an IPv4-mapped IPv6 address counts as its IPv4 address);
//! * never loopback, unspecified, multicast, broadcast or link-local (the cloud metadata
//!   address `169.254.169.254` among them), whatever the ranges say;
//! * inside one of the node's `VK_UNMANAGED_IP_CIDRS` ranges (comma- or whitespace-separated
//!   CIDRs, IPv4 and IPv6). Unset or empty: **every unmanaged pod with a pre-assigned IP is
//!   refused**;
//! * not used by any other pod this agent knows on its node: the IPs of the VMs it tracks
//!   (managed VMs' cached or static IPs, VMs kept for adoption, other unmanaged pods'
//!   synthetic records), the DHCP leases of the node's lease file, and the IP annotation and
//!   `status.podIP(s)` of every other admitted pod.
//!
//! What it cannot check: pods on other nodes (a node identity lists only the pods bound to
//! its own node). The ranges are the cross-node guard: give each node a range no other node,
//! no DHCP pool and no Service network uses.
//!
//! The rules are pure ([`check`]); CreatePod gathers the IPs in use and refuses with
//! `TenantIsolationRefused`. A refusal never names the other pod (its namespace is not the
//! caller's business); the agent's log does.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::env::node as env;

/// One CIDR of `VK_UNMANAGED_IP_CIDRS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpRange {
    /// The network address (host bits zero).
    network: IpAddr,
    /// The prefix length.
    prefix: u8,
}

impl IpRange {
    /// Whether `ip` (canonical: IPv4-mapped addresses as IPv4) lies in the range.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.network, ip.to_canonical()) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                masked(u128::from(u32::from(a)), self.prefix, 32) == u128::from(u32::from(n))
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                masked(u128::from(a), self.prefix, 128) == u128::from(n)
            }
            _ => false,
        }
    }
}

/// `bits` of width `width` with everything past the first `prefix` bits cleared.
fn masked(bits: u128, prefix: u8, width: u8) -> u128 {
    if prefix == 0 {
        return 0;
    }
    let keep = u32::from(width - prefix);
    (bits >> keep) << keep
}

impl FromStr for IpRange {
    type Err = String;

    /// `a.b.c.d/n` or `v6/n`; host bits must be zero (`10.0.0.1/8` is a typo, not a range).
    fn from_str(raw: &str) -> Result<Self, String> {
        let (addr, prefix) = raw
            .split_once('/')
            .ok_or_else(|| format!("{raw:?} is not a CIDR (want address/prefix)"))?;
        let network: IpAddr = addr
            .parse()
            .map_err(|_| format!("{raw:?}: {addr:?} is not an IP address"))?;
        let width: u8 = if network.is_ipv4() { 32 } else { 128 };
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|p| *p <= width)
            .ok_or_else(|| format!("{raw:?}: the prefix must be 0-{width}"))?;
        let bits = match network {
            IpAddr::V4(a) => u128::from(u32::from(a)),
            IpAddr::V6(a) => u128::from(a),
        };
        if masked(bits, prefix, width) != bits {
            return Err(format!("{raw:?}: host bits are set"));
        }
        Ok(IpRange { network, prefix })
    }
}

impl fmt::Display for IpRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// Parses `VK_UNMANAGED_IP_CIDRS`: CIDRs separated by `,` or whitespace, blanks dropped.
pub fn parse_ranges(raw: &str) -> Result<Vec<IpRange>, String> {
    raw.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(str::parse)
        .collect()
}

/// Why an unmanaged pod's pre-assigned IP is refused; the text is the pod's failure message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IpRefusal {
    #[error("annotation {key}: {0:?} is not an IP address", key = ann::VM_IP)]
    NotAnIp(String),
    #[error(
        "annotation {key}: {0} is a loopback, unspecified, multicast, broadcast or link-local address, which no pod may claim",
        key = ann::VM_IP
    )]
    Special(IpAddr),
    #[error(
        "annotation {key}: {0} is refused: {var} is empty on this node, so no unmanaged pod may pre-assign an IP",
        key = ann::VM_IP,
        var = env::UNMANAGED_IP_CIDRS
    )]
    NoRanges(IpAddr),
    #[error(
        "annotation {key}: {ip} lies outside this node's {var} ({ranges})",
        key = ann::VM_IP,
        var = env::UNMANAGED_IP_CIDRS
    )]
    OutOfRanges { ip: IpAddr, ranges: String },
    #[error(
        "annotation {key}: {0} is already used by another pod on this node",
        key = ann::VM_IP
    )]
    InUse(IpAddr),
}

/// Parses an IP as it appears in annotations, statuses and lease files (canonical form).
pub fn parse_ip(raw: &str) -> Option<IpAddr> {
    raw.trim()
        .parse::<IpAddr>()
        .ok()
        .map(|ip| ip.to_canonical())
}

/// The verdict on an unmanaged pod's pre-assigned IP `raw` (the annotation's value) against
/// the node's `ranges` and the IPs `in_use` by every other pod the agent knows.
pub fn check(raw: &str, ranges: &[IpRange], in_use: &[IpAddr]) -> Result<IpAddr, IpRefusal> {
    let ip = parse_ip(raw).ok_or_else(|| IpRefusal::NotAnIp(raw.to_owned()))?;
    if special(ip) {
        return Err(IpRefusal::Special(ip));
    }
    if ranges.is_empty() {
        return Err(IpRefusal::NoRanges(ip));
    }
    if !ranges.iter().any(|r| r.contains(ip)) {
        let ranges = ranges
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        return Err(IpRefusal::OutOfRanges { ip, ranges });
    }
    if in_use.iter().any(|u| u.to_canonical() == ip) {
        return Err(IpRefusal::InUse(ip));
    }
    Ok(ip)
}

/// Addresses no pod may claim, whatever the configured ranges.
fn special(ip: IpAddr) -> bool {
    ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || match ip {
            IpAddr::V4(a) => a.is_link_local() || a.is_broadcast(),
            IpAddr::V6(a) => a.is_unicast_link_local(),
        }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges(raw: &str) -> Vec<IpRange> {
        parse_ranges(raw).expect("ranges")
    }

    fn ip(raw: &str) -> IpAddr {
        raw.parse().expect("ip")
    }

    #[test]
    fn ranges_parse_ipv4_and_ipv6_and_refuse_typos() {
        let r = ranges(" 10.9.0.0/16, fd00:9::/64\n192.168.7.7/32 ,, ");
        assert_eq!(
            r.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["10.9.0.0/16", "fd00:9::/64", "192.168.7.7/32"]
        );
        assert_eq!(parse_ranges("").expect("empty"), vec![]);
        for (bad, why) in [
            ("10.9.0.0", "is not a CIDR"),
            ("10.9.0.1/16", "host bits are set"),
            ("10.9.0.0/33", "the prefix must be 0-32"),
            ("fd00::/129", "the prefix must be 0-128"),
            ("ten/8", "is not an IP address"),
            ("10.0.0.0/x", "the prefix must be"),
        ] {
            let e = parse_ranges(bad).expect_err(bad);
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    /// Each row: the configured ranges, the IPs other pods use, the annotation's value, and
    /// the verdict (`Ok` = the canonical IP) or the refusal's message.
    #[test]
    fn an_unmanaged_ip_must_be_in_range_and_unused() {
        let node = "10.9.0.0/16, fd00:9::/64";
        let used = [ip("10.9.0.7"), ip("fd00:9::7")];
        let cases: &[(&str, &str, Result<&str, &str>)] = &[
            (node, "10.9.1.2", Ok("10.9.1.2")),
            (node, " 10.9.1.2 ", Ok("10.9.1.2")),
            (node, "fd00:9::1:2", Ok("fd00:9::1:2")),
            // An IPv4-mapped IPv6 address is its IPv4 address: in range, and in use.
            (node, "::ffff:10.9.1.2", Ok("10.9.1.2")),
            (
                node,
                "::ffff:10.9.0.7",
                Err(
                    "annotation vm.cocoonstack.io/ip: 10.9.0.7 is already used by another pod on this node",
                ),
            ),
            (
                node,
                "10.9.0.7",
                Err(
                    "annotation vm.cocoonstack.io/ip: 10.9.0.7 is already used by another pod on this node",
                ),
            ),
            (
                node,
                "fd00:9:0:0::7",
                Err(
                    "annotation vm.cocoonstack.io/ip: fd00:9::7 is already used by another pod on this node",
                ),
            ),
            (
                node,
                "10.10.0.1",
                Err(
                    "annotation vm.cocoonstack.io/ip: 10.10.0.1 lies outside this node's VK_UNMANAGED_IP_CIDRS (10.9.0.0/16, fd00:9::/64)",
                ),
            ),
            (
                "",
                "10.9.1.2",
                Err(
                    "annotation vm.cocoonstack.io/ip: 10.9.1.2 is refused: VK_UNMANAGED_IP_CIDRS is empty on this node, so no unmanaged pod may pre-assign an IP",
                ),
            ),
            (
                node,
                "10.9.1.2.3",
                Err("annotation vm.cocoonstack.io/ip: \"10.9.1.2.3\" is not an IP address"),
            ),
            (
                node,
                "",
                Err("annotation vm.cocoonstack.io/ip: \"\" is not an IP address"),
            ),
        ];
        for (cidrs, raw, want) in cases {
            let got = check(raw, &ranges(cidrs), &used)
                .map(|ip| ip.to_string())
                .map_err(|e| e.to_string());
            assert_eq!(
                got,
                want.map(str::to_owned).map_err(str::to_owned),
                "{cidrs} / {raw:?}"
            );
        }
    }

    /// Loopback, unspecified, multicast, broadcast and link-local addresses (the metadata
    /// service) are refused even when an administrator's range covers them.
    #[test]
    fn special_addresses_are_never_claimable() {
        let everything = ranges("0.0.0.0/0, ::/0");
        for raw in [
            "127.0.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "169.254.169.254",
            "::1",
            "::",
            "ff02::1",
            "fe80::1",
            "::ffff:127.0.0.1",
        ] {
            let e = check(raw, &everything, &[]).expect_err(raw);
            assert!(matches!(e, IpRefusal::Special(_)), "{raw}: {e}");
        }
        assert!(check("8.8.8.8", &everything, &[]).is_ok());
    }
}
