//! Unit tests of [`crate::config`]: the node agent's configuration read from its environment.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use cocoon_runtime::BackendChoice;

use super::config::*;
use crate::kubelet::limits::KubeletLimits;
use crate::pods::host_reach::{self, HostReach};

#[test]
fn log_format_is_text_or_json_and_a_bad_value_names_the_variable() {
    for (raw, want) in [
        ("", LogFormat::Text),
        ("text", LogFormat::Text),
        (" JSON ", LogFormat::Json),
        ("json", LogFormat::Json),
    ] {
        assert_eq!(parse_log_format(raw).ok(), Some(want), "{raw:?}");
    }
    let err = parse_log_format("logfmt").expect_err("refused");
    assert_eq!(
        err.to_string(),
        "parse VK_LOG_FORMAT=\"logfmt\": want text or json"
    );
}

fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned()
}

fn parse(pairs: &[(&str, &str)]) -> Result<NodeConfig, ConfigError> {
    let mut all = vec![("OCI_REGISTRY", "http://127.0.0.1:5000")];
    all.extend_from_slice(pairs);
    NodeConfig::from_lookup(lookup(&all), || Some(Ipv4Addr::new(10, 1, 2, 3)))
}

#[test]
fn defaults() {
    let c = parse(&[]).expect("config");
    assert_eq!(c.node_name, "cocoon-pool");
    assert_eq!(c.pool, "default");
    assert_eq!(c.node_ip, IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3)));
    assert_eq!(c.provider_id, None);
    assert_eq!(c.orphan_policy, OrphanPolicy::Destroy);
    assert_eq!(c.log_level, "info");
    assert_eq!(
        c.leases_path,
        PathBuf::from("/var/lib/cocoon/net/leases.json")
    );
    assert_eq!(c.cocoon_bin, PathBuf::from("/usr/local/bin/cocoon"));
    assert_eq!(c.restore_mode, RestoreMode::OnDemand);
    // Loopback unless configured otherwise: the metrics listener has no authentication.
    assert_eq!(
        c.metrics_addr,
        "127.0.0.1:9091".parse::<SocketAddr>().unwrap()
    );
    // No client CA and no anonymous access unless configured.
    assert_eq!(c.client_ca_file, None);
    assert!(!c.anonymous_auth);
    assert_eq!(
        c.tls_cert,
        PathBuf::from("/etc/cocoon/vk/tls/vk-kubelet.crt")
    );
    assert_eq!(
        c.tls_key,
        PathBuf::from("/etc/cocoon/vk/tls/vk-kubelet.key")
    );
    assert_eq!(c.reserve_percent, 20);
    assert_eq!(c.overrides, CapacityOverrides::default());
    assert_eq!(c.pods, 256);
    assert_eq!(c.cocoon_root_dir, PathBuf::from("/var/lib/cocoon"));
    assert_eq!(c.snapshot_pull_budget_mib, 2048);
    assert_eq!(c.snapshot_zstd_level, 0);
    assert_eq!(c.kubelet_port, 10250);
    assert_eq!(
        c.cocoon_net_control_socket,
        Some(PathBuf::from("/run/cocoon-net/control.sock"))
    );
    assert_eq!(c.cgroup_parent, "cocoon.slice");
    assert_eq!(c.peer_addr, ":12501");
    assert_eq!(c.snapshot_cpu_class, None);
    assert_eq!(
        c.runtime,
        BackendChoice::Cocoon {
            bin: "/usr/local/bin/cocoon".into()
        }
    );
    assert_eq!(c.timings, Timings::default());
    assert!(
        c.clone_from_dir_roots.is_empty(),
        "no clone root by default"
    );
    assert!(
        !c.accept_legacy_vm_names,
        "legacy VM names refused by default"
    );
    assert_eq!(c.clone_base_keep, 4);
}

#[test]
fn tenant_knobs() {
    for (raw, want) in [
        ("true", true),
        (" true ", true),
        ("1", false),
        ("TRUE", false),
    ] {
        let c = parse(&[("VK_ACCEPT_LEGACY_VM_NAMES", raw)]).expect(raw);
        assert_eq!(c.accept_legacy_vm_names, want, "{raw:?}");
    }
    let c = parse(&[("VK_CLONE_BASE_KEEP", "0")]).expect("0");
    assert_eq!(c.clone_base_keep, 0);
    let err = parse(&[("VK_CLONE_BASE_KEEP", "-1")]).expect_err("-1");
    assert_eq!(
        err.to_string(),
        "parse VK_CLONE_BASE_KEEP: must be a non-negative integer, got \"-1\""
    );
}

#[test]
fn clone_from_dir_roots() {
    let ok: &[(&str, &[&str])] = &[
        ("", &[]),
        ("  ", &[]),
        ("/srv/staged", &["/srv/staged"]),
        ("/srv/staged,/data/snaps", &["/srv/staged", "/data/snaps"]),
        ("/srv/staged:/data/snaps", &["/srv/staged", "/data/snaps"]),
        (
            " /srv/staged/ , ,/data/snaps:",
            &["/srv/staged", "/data/snaps"],
        ),
        ("/", &["/"]),
    ];
    for (raw, want) in ok {
        let c = parse(&[("VK_CLONE_FROM_DIR_ROOTS", raw)]).expect(raw);
        let want: Vec<PathBuf> = want.iter().map(PathBuf::from).collect();
        assert_eq!(c.clone_from_dir_roots, want, "{raw:?}");
    }
    for (raw, bad) in [
        ("srv/staged", "srv/staged"),
        ("/srv/staged,relative", "relative"),
        ("/srv/../etc", "/srv/../etc"),
        ("/srv//staged", "/srv//staged"),
        ("./x", "./x"),
    ] {
        let err = parse(&[("VK_CLONE_FROM_DIR_ROOTS", raw)]).expect_err(raw);
        assert_eq!(
            err.to_string(),
            format!(
                "parse VK_CLONE_FROM_DIR_ROOTS: root {bad:?} must be an absolute, canonical path"
            ),
            "{raw:?}"
        );
    }
}

#[test]
fn host_reach_allowlists() {
    let c = parse(&[]).expect("defaults");
    assert_eq!(
        c.host_reach,
        HostReach::default(),
        "no URL, default network only"
    );
    let c = parse(&[
        (
            "VK_RUN_IMAGE_URL_ALLOW",
            "https://images.example/cloud/, http://10.0.0.5:8080",
        ),
        ("VK_NETWORK_ALLOW", "cocoon-dhcp tenant-a"),
    ])
    .expect("config");
    assert_eq!(c.host_reach.run_image_urls.len(), 2);
    assert_eq!(
        c.host_reach.networks,
        host_reach::NetworkAllow::Names(vec!["cocoon-dhcp".into(), "tenant-a".into()])
    );
    let err = parse(&[("VK_RUN_IMAGE_URL_ALLOW", "images.example")]).expect_err("bad url");
    assert!(
        err.to_string()
            .starts_with("parse VK_RUN_IMAGE_URL_ALLOW: \"images.example\" is not a URL"),
        "{err}"
    );
    let err = parse(&[("VK_NETWORK_ALLOW", "-x")]).expect_err("bad net");
    assert_eq!(
        err.to_string(),
        "parse VK_NETWORK_ALLOW: \"-x\" is not a network name"
    );
}

/// `VK_UNMANAGED_IP_CIDRS`: empty by default (unmanaged pods with a pre-assigned IP are
/// refused), IPv4 and IPv6 CIDRs, a bad one stops the agent naming the variable.
#[test]
fn unmanaged_ip_cidrs() {
    let c = parse(&[]).expect("defaults");
    assert!(c.unmanaged_ip_ranges.is_empty());
    let c = parse(&[("VK_UNMANAGED_IP_CIDRS", "10.9.0.0/16, fd00:9::/64")]).expect("config");
    assert_eq!(
        c.unmanaged_ip_ranges
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["10.9.0.0/16", "fd00:9::/64"]
    );
    assert_eq!(
        crate::agent::pod_config(&c).tenant.unmanaged_ip_ranges,
        c.unmanaged_ip_ranges
    );
    let err = parse(&[("VK_UNMANAGED_IP_CIDRS", "10.9.0.1/16")]).expect_err("host bits");
    assert_eq!(
        err.to_string(),
        "parse VK_UNMANAGED_IP_CIDRS: \"10.9.0.1/16\": host bits are set"
    );
}

#[test]
fn fatal_messages() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[("VK_RESTORE_MODE", "lazy")],
            "parse VK_RESTORE_MODE: restore mode must be copy, ondemand or mmap, got \"lazy\"",
        ),
        (
            &[("VK_RESERVE_PERCENT", "101")],
            "parse VK_RESERVE_PERCENT=\"101\": must be 0-100",
        ),
        (
            &[("VK_RESERVE_PERCENT", "-1")],
            "parse VK_RESERVE_PERCENT=\"-1\": must be 0-100",
        ),
        (
            &[("VK_RESERVE_PERCENT", "ten")],
            "parse VK_RESERVE_PERCENT=\"ten\": must be 0-100",
        ),
        (
            &[("VK_LOG_LEVEL", "loud")],
            "parse VK_LOG_LEVEL: invalid log level \"loud\"",
        ),
        (
            &[("VK_NODE_IP", "not-an-ip")],
            "parse VK_NODE_IP=\"not-an-ip\": not an IP address",
        ),
        (
            &[("VK_SNAPSHOT_CPU_CLASS", "-bad-")],
            "parse VK_SNAPSHOT_CPU_CLASS=\"-bad-\": must be a valid label value",
        ),
        (
            &[("VK_METRICS_ADDR", "nowhere")],
            "parse VK_METRICS_ADDR=\"nowhere\": want [host]:port with an IP host",
        ),
    ];
    for (env, want) in cases {
        let err = parse(env).expect_err(want);
        assert_eq!(err.to_string(), *want);
    }
    let missing = NodeConfig::from_lookup(lookup(&[("OCI_REGISTRY", "  ")]), || {
        Some(Ipv4Addr::new(10, 0, 0, 1))
    });
    assert_eq!(
        missing.expect_err("registry").to_string(),
        "construct registry client: OCI_REGISTRY must be set"
    );
    let no_ip = NodeConfig::from_lookup(lookup(&[("OCI_REGISTRY", "r")]), || None);
    assert_eq!(no_ip.expect_err("no ip"), ConfigError::NoNodeIp);
    let bad_runtime = parse(&[("VK_RUNTIME", "qemu")]).expect_err("runtime");
    assert!(matches!(bad_runtime, ConfigError::Runtime(_)));
}

#[test]
fn parsed_values() {
    let c = parse(&[
        ("VK_NODE_NAME", "vk1"),
        ("VK_NODE_POOL", "gpu"),
        ("VK_NODE_IP", "192.168.1.9"),
        ("VK_PROVIDER_ID", "cocoon://vk1"),
        ("VK_RESTORE_MODE", "  MMAP "),
        ("VK_RESERVE_PERCENT", "0"),
        ("VK_METRICS_ADDR", "127.0.0.1:19091"),
        ("VK_NODE_CPU", "16"),
        ("VK_NODE_MEM", "64Gi"),
        ("VK_NODE_PODS", "12"),
        ("VK_KUBELET_PORT", "0"),
        ("VK_COCOON_NET_CONTROL_SOCKET", ""),
        ("VK_SNAPSHOT_CPU_CLASS", "icelake"),
        ("VK_LOG_LEVEL", "DEBUG"),
        ("SNAPSHOT_ZSTD_LEVEL", "-3"),
        ("SNAPSHOT_CHUNK_SIZE_MIB", "x"),
        ("SNAPSHOT_PULL_BUDGET_MIB", "512"),
        ("VK_RUNTIME", "sim"),
        ("VK_SIM_ROOT", "/tmp/sim"),
        ("VK_CLIENT_CA_FILE", " /etc/kubernetes/pki/ca.crt "),
        ("VK_ANONYMOUS_AUTH", "true"),
    ])
    .expect("config");
    assert_eq!(
        c.client_ca_file,
        Some(PathBuf::from("/etc/kubernetes/pki/ca.crt"))
    );
    assert!(c.anonymous_auth);
    assert_eq!(c.node_name, "vk1");
    assert_eq!(c.pool, "gpu");
    assert_eq!(c.node_ip.to_string(), "192.168.1.9");
    assert_eq!(c.provider_id.as_deref(), Some("cocoon://vk1"));
    assert_eq!(c.restore_mode, RestoreMode::Mmap);
    assert_eq!(c.reserve_percent, 0);
    assert_eq!(c.metrics_addr.to_string(), "127.0.0.1:19091");
    assert_eq!(c.overrides.cpu.as_deref(), Some("16"));
    assert_eq!(c.overrides.memory.as_deref(), Some("64Gi"));
    assert_eq!(c.pods, 12);
    assert_eq!(c.kubelet_port, 0);
    assert_eq!(c.cocoon_net_control_socket, None);
    assert_eq!(c.snapshot_cpu_class.as_deref(), Some("icelake"));
    assert_eq!(c.log_level, "debug");
    // Integer knobs: negative or unparsable become 0.
    assert_eq!(c.snapshot_zstd_level, 0);
    assert_eq!(c.snapshot_chunk_size_mib, 0);
    assert_eq!(c.snapshot_pull_budget_mib, 512);
    assert_eq!(
        c.runtime,
        BackendChoice::Sim {
            root: "/tmp/sim".into()
        }
    );
}

#[test]
fn orphan_policy_and_pods_fallbacks() {
    for (raw, want) in [
        ("destroy", OrphanPolicy::Destroy),
        ("KEEP", OrphanPolicy::Keep),
        (" Alert ", OrphanPolicy::Alert),
        ("nuke", OrphanPolicy::Alert),
    ] {
        let c = parse(&[("VK_ORPHAN_POLICY", raw)]).expect("config");
        assert_eq!(c.orphan_policy, want, "{raw}");
    }
    for raw in ["0", "-5", "many"] {
        assert_eq!(parse(&[("VK_NODE_PODS", raw)]).expect("config").pods, 256);
    }
    // Empty counts as unset.
    let c = parse(&[("VK_NODE_NAME", ""), ("VK_RESTORE_MODE", " ")]).expect("config");
    assert_eq!(c.node_name, "cocoon-pool");
    assert_eq!(c.restore_mode, RestoreMode::OnDemand);
    assert_eq!(
        parse(&[("VK_KUBELET_PORT", "x")]).expect("c").kubelet_port,
        10250
    );
}

#[test]
fn listen_addrs() {
    assert_eq!(
        parse_listen_addr(":9091").unwrap().to_string(),
        "0.0.0.0:9091"
    );
    assert_eq!(
        parse_listen_addr("localhost:1").unwrap().to_string(),
        "127.0.0.1:1"
    );
    assert_eq!(
        parse_listen_addr("[::1]:80").unwrap().to_string(),
        "[::1]:80"
    );
    assert!(parse_listen_addr(":x").is_err());
}

#[test]
fn kubelet_limits() {
    let c = parse(&[]).expect("config");
    assert_eq!(c.kubelet_limits, KubeletLimits::default());
    assert_eq!(c.kubelet_limits.log_max_bytes, 4 << 20);
    assert_eq!(c.kubelet_limits.log_max_line_bytes, 16 << 10);
    assert_eq!(c.kubelet_limits.log_followers_per_pod, 4);
    assert_eq!(c.kubelet_limits.log_followers_per_node, 64);
    assert_eq!(c.kubelet_limits.log_reads_per_node, 16);
    assert_eq!(c.kubelet_limits.exec_sessions_per_pod, 8);
    assert_eq!(c.kubelet_limits.exec_sessions_per_node, 64);
    assert_eq!(c.kubelet_limits.preauth_connections, 128);
    assert_eq!(
        c.kubelet_limits.tls_handshake_timeout,
        Duration::from_secs(10)
    );
    assert_eq!(
        c.kubelet_limits.streaming_idle_timeout,
        Duration::from_secs(4 * 3600),
        "the kubelet's --streaming-connection-idle-timeout default"
    );
    let c = parse(&[
        ("VK_LOG_MAX_BYTES", "1024"),
        ("VK_LOG_MAX_LINE_BYTES", " 80 "),
        ("VK_LOG_FOLLOWERS_PER_POD", "1"),
        ("VK_LOG_FOLLOWERS_PER_NODE", "2"),
        ("VK_EXEC_SESSIONS_PER_POD", "3"),
        ("VK_EXEC_SESSIONS_PER_NODE", "4"),
        ("VK_KUBELET_PREAUTH_CONNECTIONS", "5"),
        ("VK_KUBELET_TLS_HANDSHAKE_TIMEOUT", "2s"),
        ("VK_STREAMING_CONNECTION_IDLE_TIMEOUT", "0"),
    ])
    .expect("config");
    let l = c.kubelet_limits;
    assert_eq!(
        (
            l.log_max_bytes,
            l.log_max_line_bytes,
            l.log_followers_per_pod,
            l.log_followers_per_node,
            l.exec_sessions_per_pod,
            l.exec_sessions_per_node,
            l.preauth_connections,
        ),
        (1024, 80, 1, 2, 3, 4, 5)
    );
    assert_eq!(l.tls_handshake_timeout, Duration::from_secs(2));
    assert_eq!(l.streaming_idle_timeout, Duration::ZERO, "0 disables");
    for (var, raw, reason) in [
        ("VK_LOG_MAX_BYTES", "0", "must be a positive integer"),
        (
            "VK_EXEC_SESSIONS_PER_POD",
            "-1",
            "must be a positive integer",
        ),
        (
            "VK_LOG_FOLLOWERS_PER_NODE",
            "lots",
            "must be a positive integer",
        ),
        ("VK_KUBELET_TLS_HANDSHAKE_TIMEOUT", "0s", "must be positive"),
    ] {
        let err = parse(&[(var, raw)]).expect_err(var);
        assert_eq!(
            err.to_string(),
            format!("parse {var}={raw:?}: {reason}"),
            "{var}"
        );
    }
    let err = parse(&[("VK_STREAMING_CONNECTION_IDLE_TIMEOUT", "4 hours")]).expect_err("bad");
    assert!(
        err.to_string()
            .starts_with("parse VK_STREAMING_CONNECTION_IDLE_TIMEOUT=\"4 hours\": "),
        "{err}"
    );
}

#[test]
fn detects_some_ipv4_or_none() {
    // The host may have no non-loopback interface (sandbox); only check the invariant.
    if let Some(ip) = first_non_loopback_ipv4() {
        assert!(!ip.is_loopback());
    }
}
