//! The `status` view model: CocoonSets, their pods and CocoonHibernations turned into rows,
//! built purely from objects so it can be tested with fixtures and rendered as table or JSON.

use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::labels;
use cocoon_api::crd::hibernation::CocoonHibernation;
use cocoon_api::crd::set::CocoonSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use serde::Serialize;

use crate::table::{Cell, Tone, phase_tone};

/// One line of the set list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SetRow {
    pub namespace: String,
    pub name: String,
    pub phase: String,
    pub agents: String,
    pub toolboxes: String,
    pub node: String,
    pub suspend: bool,
    pub age: String,
}

/// One agent slot or toolbox of a set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemberRow {
    pub role: String,
    pub slot: String,
    pub pod: String,
    pub vm: String,
    pub node: String,
    pub phase: String,
    pub ready: bool,
    pub lifecycle: String,
    pub hibernation: String,
}

/// kubectl-style age: `45s`, `12m`, `3h`, `5d`.
pub fn age(created: Option<Timestamp>, now: Timestamp) -> String {
    let Some(c) = created else {
        return "<unknown>".into();
    };
    let secs = now.duration_since(c).as_secs().max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

fn main_node(set: &CocoonSet, pods: &[Pod]) -> String {
    let main = cocoon_api::naming::pod_name_for_agent(&set.name_any(), 0);
    pods.iter()
        .find(|p| p.name_any() == main)
        .and_then(|p| p.spec.as_ref()?.node_name.clone())
        .unwrap_or_default()
}

/// The list row of one set.
pub fn set_row(set: &CocoonSet, pods: &[Pod], now: Timestamp) -> SetRow {
    let st = set.status.clone().unwrap_or_default();
    SetRow {
        namespace: set.namespace().unwrap_or_default(),
        name: set.name_any(),
        phase: st.phase.map(|p| p.as_str().to_string()).unwrap_or_default(),
        agents: format!("{}/{}", st.ready_agents, set.spec.desired_agents()),
        toolboxes: format!("{}/{}", st.ready_toolboxes, set.spec.toolboxes.len()),
        node: main_node(set, pods),
        suspend: set.spec.suspend,
        age: age(set.metadata.creation_timestamp.as_ref().map(|t| t.0), now),
    }
}

fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The member rows of one set: agents by slot, then toolboxes in spec order.
pub fn member_rows(
    set: &CocoonSet,
    pods: &[Pod],
    hibernations: &[CocoonHibernation],
) -> Vec<MemberRow> {
    let name = set.name_any();
    let mut owned: Vec<&Pod> = pods
        .iter()
        .filter(|p| {
            p.labels().get(labels::COCOONSET_NAME).map(String::as_str) == Some(name.as_str())
        })
        .collect();
    owned.sort_by_key(|p| {
        let slot = p.labels().get(labels::SLOT).cloned().unwrap_or_default();
        (
            slot.parse::<i64>()
                .map(|n| (0, n, String::new()))
                .unwrap_or((1, 0, slot)),
            p.name_any(),
        )
    });
    owned
        .into_iter()
        .map(|p| {
            let a = p.annotations();
            let get = |k: &str| a.get(k).cloned().unwrap_or_default();
            let hib = hibernations
                .iter()
                .find(|h| h.spec.pod_ref.name == p.name_any())
                .map(|h| {
                    format!(
                        "{}/{}",
                        h.spec.desire.as_str(),
                        h.status
                            .as_ref()
                            .and_then(|s| s.phase)
                            .map(|p| p.as_str())
                            .unwrap_or("-")
                    )
                })
                .unwrap_or_default();
            MemberRow {
                role: p.labels().get(labels::ROLE).cloned().unwrap_or_default(),
                slot: p.labels().get(labels::SLOT).cloned().unwrap_or_default(),
                pod: p.name_any(),
                vm: get(ann::VM_NAME),
                node: p
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .unwrap_or_default(),
                phase: p
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.clone())
                    .unwrap_or_default(),
                ready: pod_ready(p),
                lifecycle: get(ann::LIFECYCLE_STATE),
                hibernation: hib,
            }
        })
        .collect()
}

/// One item of `status -o json`: the set as the API returns it, plus its `members` (the rows
/// `status NAME` shows) and the CocoonHibernations of its pods.
pub fn computed_set(
    set: &CocoonSet,
    pods: &[Pod],
    hibernations: &[CocoonHibernation],
) -> serde_json::Value {
    let members = member_rows(set, pods, hibernations);
    let hibs: Vec<&CocoonHibernation> = hibernations
        .iter()
        .filter(|h| members.iter().any(|m| m.pod == h.spec.pod_ref.name))
        .collect();
    let mut v = serde_json::to_value(set).unwrap_or_default();
    if let Some(obj) = v.as_object_mut() {
        obj.insert("members".into(), serde_json::json!(members));
        obj.insert("hibernations".into(), serde_json::json!(hibs));
    }
    v
}

fn dash(s: &str) -> String {
    if s.is_empty() {
        "-".into()
    } else {
        s.to_string()
    }
}

/// Table cells of the set list.
pub fn set_cells(rows: &[SetRow], all_namespaces: bool) -> (Vec<&'static str>, Vec<Vec<Cell>>) {
    let mut headers = vec![
        "name",
        "phase",
        "agents",
        "toolboxes",
        "node",
        "suspend",
        "age",
    ];
    if all_namespaces {
        headers.insert(0, "namespace");
    }
    let cells = rows
        .iter()
        .map(|r| {
            let mut c = vec![
                Cell::plain(&r.name),
                Cell::toned(dash(&r.phase), phase_tone(&r.phase)),
                Cell::plain(&r.agents),
                Cell::plain(&r.toolboxes),
                Cell::plain(dash(&r.node)),
                Cell::plain(r.suspend.to_string()),
                Cell::plain(&r.age),
            ];
            if all_namespaces {
                c.insert(0, Cell::plain(&r.namespace));
            }
            c
        })
        .collect();
    (headers, cells)
}

/// Table cells of a set's members.
pub fn member_cells(rows: &[MemberRow]) -> (Vec<&'static str>, Vec<Vec<Cell>>) {
    let headers = vec![
        "role",
        "slot",
        "pod",
        "vm",
        "node",
        "phase",
        "ready",
        "lifecycle",
        "hibernation",
    ];
    let cells = rows
        .iter()
        .map(|r| {
            vec![
                Cell::plain(dash(&r.role)),
                Cell::plain(dash(&r.slot)),
                Cell::plain(&r.pod),
                Cell::plain(dash(&r.vm)),
                Cell::plain(dash(&r.node)),
                Cell::toned(dash(&r.phase), phase_tone(&r.phase)),
                Cell::toned(
                    r.ready.to_string(),
                    if r.ready { Tone::Good } else { Tone::Warn },
                ),
                Cell::plain(dash(&r.lifecycle)),
                Cell::plain(dash(&r.hibernation)),
            ]
        })
        .collect();
    (headers, cells)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).expect("ts")
    }

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(age(Some(ts(0)), ts(45)), "45s");
        assert_eq!(age(Some(ts(0)), ts(600)), "10m");
        assert_eq!(age(Some(ts(0)), ts(3 * 3600)), "3h");
        assert_eq!(age(Some(ts(0)), ts(5 * 86_400)), "5d");
        assert_eq!(age(None, ts(0)), "<unknown>");
    }

    #[test]
    fn rows_from_objects() {
        let set: CocoonSet = serde_json::from_value(json!({
            "apiVersion": "cocoonset.cocoonstack.io/v1", "kind": "CocoonSet",
            "metadata": {"name": "demo", "namespace": "ns", "creationTimestamp": "2027-01-15T08:00:00Z"},
            "spec": {"agent": {"image": "i", "replicas": 1}, "toolboxes": [{"name": "tb"}]},
            "status": {"phase": "Running", "readyAgents": 2, "desiredAgents": 2, "readyToolboxes": 1, "desiredToolboxes": 1}
        })).expect("set");
        let pod = |name: &str, role: &str, slot: &str, node: &str| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "ns",
                    "labels": {"cocoonset.cocoonstack.io/name": "demo", "cocoonset.cocoonstack.io/role": role, "cocoonset.cocoonstack.io/slot": slot},
                    "annotations": {"vm.cocoonstack.io/name": format!("vk-ns-{name}"), "vm.cocoonstack.io/lifecycle-state": "ready"}},
                "spec": {"nodeName": node, "containers": [{"name": "agent", "image": "x"}]},
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
            })).expect("pod")
        };
        let pods = vec![
            pod("demo-tb", "toolbox", "tb", "n1"),
            pod("demo-1", "sub-agent", "1", "n1"),
            pod("demo-0", "main", "0", "n1"),
        ];
        let row = set_row(
            &set,
            &pods,
            Timestamp::from_second(1_800_000_000).expect("ts"),
        );
        assert_eq!(
            (
                row.phase.as_str(),
                row.agents.as_str(),
                row.toolboxes.as_str(),
                row.node.as_str()
            ),
            ("Running", "2/2", "1/1", "n1")
        );
        let members = member_rows(&set, &pods, &[]);
        let order: Vec<&str> = members.iter().map(|m| m.pod.as_str()).collect();
        assert_eq!(
            order,
            ["demo-0", "demo-1", "demo-tb"],
            "agents by slot, then toolboxes"
        );
        assert!(members.iter().all(|m| m.ready && m.lifecycle == "ready"));
    }
}
