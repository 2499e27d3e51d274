//! Pod placement of `contract.md` §3.3 and §4 as k8s-openapi values: the pool lookup
//! (`PodNodePool`), the node selector, the hostname affinities, the tolerations and the node taint.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod,
    PreferredSchedulingTerm, Taint, Toleration,
};

use super::labels::{DEFAULT_POOL, HOSTNAME, POOL, SNAPSHOT_CPU_CLASS};
use super::taints::{
    EFFECT_NO_EXECUTE, EFFECT_NO_SCHEDULE, NOT_READY_KEY, OPERATOR_EXISTS, PROVIDER_KEY,
    PROVIDER_VALUE, UNREACHABLE_KEY,
};

/// Weight of the release-wake preferred hostname affinity.
pub const WAKE_HINT_WEIGHT: i32 = 100;

/// `PodNodePool(pod)`: the first non-empty `cocoonstack.io/pool` of, in order, the pod's
/// nodeSelector, its labels and its annotations; otherwise `default`.
pub fn pod_node_pool(
    node_selector: Option<&BTreeMap<String, String>>,
    labels: Option<&BTreeMap<String, String>>,
    annotations: Option<&BTreeMap<String, String>>,
) -> String {
    [node_selector, labels, annotations]
        .into_iter()
        .flatten()
        .filter_map(|m| m.get(POOL))
        .find(|v| !v.is_empty())
        .map_or_else(|| DEFAULT_POOL.to_owned(), Clone::clone)
}

/// [`pod_node_pool`] over a pod.
pub fn pod_node_pool_of(pod: &Pod) -> String {
    pod_node_pool(
        pod.spec.as_ref().and_then(|s| s.node_selector.as_ref()),
        pod.metadata.labels.as_ref(),
        pod.metadata.annotations.as_ref(),
    )
}

/// The managed-pod nodeSelector: `cocoonstack.io/pool` (empty pool → `default`) plus
/// `cocoonstack.io/snapshot-cpu-class` only when the class is non-empty.
pub fn pod_node_selector(pool: &str, cpu_class: &str) -> BTreeMap<String, String> {
    let pool = if pool.is_empty() { DEFAULT_POOL } else { pool };
    let mut selector = BTreeMap::from([(POOL.to_owned(), pool.to_owned())]);
    if !cpu_class.is_empty() {
        selector.insert(SNAPSHOT_CPU_CLASS.to_owned(), cpu_class.to_owned());
    }
    selector
}

fn hostname_term(node: &str) -> NodeSelectorTerm {
    NodeSelectorTerm {
        match_expressions: Some(vec![NodeSelectorRequirement {
            key: HOSTNAME.to_owned(),
            operator: "In".to_owned(),
            values: Some(vec![node.to_owned()]),
        }]),
        match_fields: None,
    }
}

/// Required node affinity `kubernetes.io/hostname In [node]` (the main's `spec.nodeName` pin).
pub fn required_hostname_affinity(node: &str) -> Affinity {
    Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![hostname_term(node)],
            }),
            preferred_during_scheduling_ignored_during_execution: None,
        }),
        ..Affinity::default()
    }
}

/// Preferred node affinity, weight 100, `kubernetes.io/hostname In [node]` (release-wake hint).
pub fn preferred_hostname_affinity(node: &str) -> Affinity {
    Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: None,
            preferred_during_scheduling_ignored_during_execution: Some(vec![
                PreferredSchedulingTerm {
                    weight: WAKE_HINT_WEIGHT,
                    preference: hostname_term(node),
                },
            ]),
        }),
        ..Affinity::default()
    }
}

/// The three tolerations of every managed pod, in spec order: the provider taint (`Exists`, no
/// effect), then not-ready and unreachable (`Exists`, `NoExecute`, no `tolerationSeconds`, so
/// the pod is never evicted while its node flaps).
pub fn pod_tolerations() -> Vec<Toleration> {
    let exists = |key: &str, effect: Option<&str>| Toleration {
        key: Some(key.to_owned()),
        operator: Some(OPERATOR_EXISTS.to_owned()),
        effect: effect.map(str::to_owned),
        toleration_seconds: None,
        value: None,
    };
    vec![
        exists(PROVIDER_KEY, None),
        exists(NOT_READY_KEY, Some(EFFECT_NO_EXECUTE)),
        exists(UNREACHABLE_KEY, Some(EFFECT_NO_EXECUTE)),
    ]
}

/// The node taint `virtual-kubelet.io/provider=cocoon:NoSchedule`.
pub fn node_provider_taint() -> Taint {
    Taint {
        key: PROVIDER_KEY.to_owned(),
        value: Some(PROVIDER_VALUE.to_owned()),
        effect: EFFECT_NO_SCHEDULE.to_owned(),
        time_added: None,
    }
}

/// True when the node already has a taint keyed `virtual-kubelet.io/provider` (whatever its
/// value or effect); the node agent adds [`node_provider_taint`] only otherwise.
pub fn has_provider_taint(taints: &[Taint]) -> bool {
    taints.iter().any(|t| t.key == PROVIDER_KEY)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn m(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn pool_lookup_order() {
        let sel = m(&[(POOL, "gpu")]);
        let lab = m(&[(POOL, "lab")]);
        let ann = m(&[(POOL, "ann")]);
        let empty = m(&[(POOL, "")]);
        let cases = [
            (Some(&sel), Some(&lab), Some(&ann), "gpu"),
            (None, Some(&lab), Some(&ann), "lab"),
            (None, None, Some(&ann), "ann"),
            (Some(&empty), None, Some(&ann), "ann"),
            (None, None, None, "default"),
            (Some(&empty), Some(&empty), Some(&empty), "default"),
        ];
        for (s, l, a, want) in cases {
            assert_eq!(pod_node_pool(s, l, a), want);
        }

        let pod = Pod {
            metadata: ObjectMeta {
                labels: Some(lab.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_selector: Some(sel.clone()),
                ..PodSpec::default()
            }),
            status: None,
        };
        assert_eq!(pod_node_pool_of(&pod), "gpu");
        assert_eq!(pod_node_pool_of(&Pod::default()), "default");
    }

    #[test]
    fn node_selector() {
        assert_eq!(pod_node_selector("", ""), m(&[(POOL, "default")]));
        assert_eq!(
            pod_node_selector("gpu", "icelake"),
            m(&[(POOL, "gpu"), (SNAPSHOT_CPU_CLASS, "icelake")])
        );
    }

    #[test]
    fn tolerations_serialise_as_the_spec() {
        let got = serde_json::to_value(pod_tolerations()).ok();
        let want = serde_json::json!([
            {"key": "virtual-kubelet.io/provider", "operator": "Exists"},
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
        ]);
        assert_eq!(got, Some(want));
    }

    #[test]
    fn taint() {
        let t = node_provider_taint();
        assert_eq!(
            serde_json::to_value(&t).ok(),
            Some(serde_json::json!({
                "key": "virtual-kubelet.io/provider", "value": "cocoon", "effect": "NoSchedule"
            }))
        );
        let other = Taint {
            key: PROVIDER_KEY.to_owned(),
            value: Some("other".into()),
            effect: "NoExecute".into(),
            time_added: None,
        };
        assert!(has_provider_taint(&[other]));
        assert!(!has_provider_taint(&[]));
    }

    #[test]
    fn affinities() {
        assert_eq!(
            serde_json::to_value(required_hostname_affinity("n1")).ok(),
            Some(
                serde_json::json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}]}}})
            )
        );
        assert_eq!(
            serde_json::to_value(preferred_hostname_affinity("n1")).ok(),
            Some(
                serde_json::json!({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "preference": {"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}}]}})
            )
        );
    }
}
