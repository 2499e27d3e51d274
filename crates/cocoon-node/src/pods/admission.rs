//! The shell of two CreatePod admission rules (issue 35 items 3 and 4): it gathers what the
//! pure rules need from the agent's tables and applies their verdicts.
//!
//! * The claim is the kubelet's resource admission ([`super::resources`]): the pod is tracked
//!   only if its requests fit the allocatable next to the pods already tracked (not terminal),
//!   decided and claimed under one lock. A rejected pod gets what a kubelet writes (phase
//!   `Failed`, reason `OutOfcpu`…, message `Pod was rejected: Node didn't have enough
//!   resource: …`, the QoS class kept) and a Warning Event with the same reason and the bare
//!   message; it is never tracked, so it holds nothing and is not counted.
//! * An unmanaged pod's pre-assigned IP ([`super::unmanaged_ip`]) is checked against every
//!   IP the agent knows to be in use on its node and, when it passes, the pod is admitted in
//!   the same lock.

use std::net::IpAddr;

use cocoon_api::contract::{AnnotationCodec, VmRuntime, VmSpec};
use k8s_openapi::api::core::v1::Pod;
use tracing::warn;

use super::PodConfig;
use super::resources::{self, Amounts, Rejection};
use super::store::PodStore;
use super::unmanaged_ip::{self, IpRefusal};

/// Whether the pod is done (`Succeeded` or `Failed`): its requests no longer count.
pub(super) fn terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// A pod's effective requests; a tracked pod whose quantities do not read counts as nothing
/// (the API server validated them, and the pod was admitted with them).
pub(super) fn requests_of(pod: &Pod) -> Result<Amounts, Rejection> {
    pod.spec
        .as_ref()
        .map_or(Ok(Amounts::default()), resources::pod_requests)
}

/// The check of an unmanaged pod's pre-assigned IP ([`unmanaged_ip::check`]) against the
/// node's ranges and the IPs in use: the lease file's, every tracked VM's (but the pod's
/// own VM name) and every other admitted pod's IP annotation and `status.podIP(s)`. On
/// success the pod is admitted under the same lock. An empty IP passes (the mode
/// dispatch refuses it as missing). (The claim is [`PodStore::claim_if_fits`], the
/// kubelet-style rejection `ApiWriter::reject_pod`.)
pub(crate) fn unmanaged_ip_check(
    store: &PodStore,
    cfg: &PodConfig,
    key: &str,
    pod: &Pod,
) -> Result<(), IpRefusal> {
    let raw = VmRuntime::from_meta(&pod.metadata).ip;
    if raw.trim().is_empty() {
        return Ok(());
    }
    let own_vm = VmSpec::from_meta(&pod.metadata).vm_name;
    let mut in_use: Vec<(IpAddr, String)> = leased_ips(&cfg.leases_path)
        .into_iter()
        .map(|ip| (ip, "a DHCP lease of this node".to_owned()))
        .collect();
    let mut t = store.tables();
    for (who, vm) in t
        .vms_by_pod
        .iter()
        .map(|(k, v)| (k.as_str(), v))
        .chain(t.vms_by_name.iter().map(|(name, v)| (name.as_str(), v)))
    {
        if who == key || vm.name() == own_vm {
            continue;
        }
        let ips = std::iter::once(vm.ip.as_str()).chain(vm.record.ips());
        in_use.extend(
            ips.filter_map(unmanaged_ip::parse_ip)
                .map(|ip| (ip, format!("VM {} ({who})", vm.name()))),
        );
    }
    for (k, p) in &t.pods {
        if k == key || !t.admitted.contains_key(k) {
            continue;
        }
        let annotated = VmRuntime::from_meta(&p.metadata).ip;
        let status = p.status.as_ref();
        let reported = status.and_then(|s| s.pod_ip.clone()).into_iter().chain(
            status
                .and_then(|s| s.pod_ips.clone())
                .into_iter()
                .flatten()
                .map(|i| i.ip),
        );
        for raw in std::iter::once(annotated).chain(reported) {
            if let Some(ip) = unmanaged_ip::parse_ip(&raw) {
                in_use.push((ip, format!("pod {k}")));
            }
        }
    }
    let ips: Vec<IpAddr> = in_use.iter().map(|(ip, _)| *ip).collect();
    match unmanaged_ip::check(&raw, &cfg.tenant.unmanaged_ip_ranges, &ips) {
        Ok(_) => {
            t.admit(key, pod);
            Ok(())
        }
        Err(e) => {
            drop(t);
            let holder = match &e {
                IpRefusal::InUse(ip) => {
                    in_use.iter().find(|(u, _)| u == ip).map(|(_, w)| w.clone())
                }
                _ => None,
            };
            warn!(pod = %key, ip = %raw, ?holder, refusal = %e, "unmanaged pod's IP refused");
            Err(e)
        }
    }
}

/// Every IP of the cocoon-net lease file (unreadable or absent: none).
fn leased_ips(path: &std::path::Path) -> Vec<IpAddr> {
    #[derive(serde::Deserialize)]
    struct Lease {
        #[serde(default)]
        ip: String,
    }
    std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice::<Vec<Lease>>(&b).ok())
        .unwrap_or_default()
        .iter()
        .filter_map(|l| unmanaged_ip::parse_ip(&l.ip))
        .collect()
}
