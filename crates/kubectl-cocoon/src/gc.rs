//! `registry gc`: find `:hibernate` (and, on request, `:latest`) tags whose VM no live object
//! accounts for, and delete them by digest. Dry run unless `--yes`.
//!
//! Live references (never collected): every pod's `vm.cocoonstack.io/name`; every CocoonSet's
//! status entries, `delete-vm-names` stash, reclaim record, and the VM names its spec implies
//! (slots 0..replicas, toolboxes); every CocoonHibernation's `status.vmName` and its pod's VM.
//! `:latest` tags are left alone unless `--include-latest`: the operator keeps them after
//! teardown on purpose (snapshotPolicy `always`/`main-only`).

use std::collections::{BTreeMap, BTreeSet};

use cocoon_api::contract::{
    AnnotationCodec, DeleteVmNames, ReclaimRecord, annotations as ann, tags,
};
use cocoon_api::crd::hibernation::CocoonHibernation;
use cocoon_api::crd::set::CocoonSet;
use cocoon_api::naming;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use serde::Serialize;

/// One tag the collector would delete.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Orphan {
    pub repository: String,
    pub tag: String,
}

/// Every VM name a live object references.
pub fn live_vms(
    sets: &[CocoonSet],
    pods: &[Pod],
    hibernations: &[CocoonHibernation],
) -> BTreeSet<String> {
    let mut live = BTreeSet::new();
    let mut pod_vm: BTreeMap<(String, String), String> = BTreeMap::new();
    for p in pods {
        if let Some(vm) = p.annotations().get(ann::VM_NAME).filter(|v| !v.is_empty()) {
            live.insert(vm.clone());
            pod_vm.insert(
                (p.namespace().unwrap_or_default(), p.name_any()),
                vm.clone(),
            );
        }
    }
    for s in sets {
        let ns = s.namespace().unwrap_or_default();
        let name = s.name_any();
        if let Some(st) = &s.status {
            live.extend(st.agents.iter().map(|a| a.vm_name.clone()));
            live.extend(st.toolboxes.iter().map(|t| t.vm_name.clone()));
        }
        live.extend(DeleteVmNames::from_annotations(s.annotations()).0);
        live.extend(ReclaimRecord::from_annotations(s.annotations()).vms);
        for slot in 0..=s.spec.agent.replicas.max(0) {
            live.insert(naming::vm_name_for_pod(
                &ns,
                &naming::pod_name_for_agent(&name, slot),
            ));
        }
        for t in &s.spec.toolboxes {
            live.insert(naming::vm_name_for_pod(
                &ns,
                &naming::pod_name_for_toolbox(&name, &t.name),
            ));
        }
    }
    for h in hibernations {
        if let Some(vm) = h.status.as_ref().map(|s| s.vm_name.clone()) {
            live.insert(vm);
        }
        let key = (
            h.namespace().unwrap_or_default(),
            h.spec.pod_ref.name.clone(),
        );
        if let Some(vm) = pod_vm.get(&key) {
            live.insert(vm.clone());
        }
    }
    live.remove("");
    live
}

/// The tags to collect, given each repository's tags.
pub fn orphans(
    repos: &[(String, Vec<String>)],
    live: &BTreeSet<String>,
    include_latest: bool,
) -> Vec<Orphan> {
    let mut out = Vec::new();
    for (repo, repo_tags) in repos {
        // The repository is named after the VM (the last path component under the base).
        let vm = repo.rsplit('/').next().unwrap_or(repo);
        if live.contains(vm) {
            continue;
        }
        for t in repo_tags {
            if t == tags::HIBERNATE || (include_latest && t == tags::LATEST) {
                out.push(Orphan {
                    repository: repo.clone(),
                    tag: t.clone(),
                });
            }
        }
    }
    out.sort_by(|a, b| (&a.repository, &a.tag).cmp(&(&b.repository, &b.tag)));
    out
}

/// Runs `registry gc`.
pub async fn run(
    client: &kube::Client,
    registry: Option<&str>,
    include_latest: bool,
    yes: bool,
    output: Option<&crate::cli::OutputFormat>,
) -> Result<(), crate::error::CliError> {
    use crate::error::CliError;
    use kube::api::{Api, ListParams};
    let base = registry
        .filter(|r| !r.trim().is_empty())
        .ok_or_else(|| CliError::Usage("registry gc needs --registry or OCI_REGISTRY".into()))?;
    let cfg = cocoon_registry::RegistryConfig::for_registry(base)
        .map(crate::user_agent::registry_config)
        .map_err(|e| CliError::Usage(format!("--registry {base:?}: {e}")))?;
    let reg =
        cocoon_registry::RegistryClient::new(cfg).map_err(|e| CliError::Api(e.to_string()))?;
    let lp = ListParams::default();
    let sets = Api::<CocoonSet>::all(client.clone())
        .list(&lp)
        .await
        .map_err(|e| CliError::from_kube("list cocoonsets (all namespaces)", e))?
        .items;
    let hibernations = Api::<CocoonHibernation>::all(client.clone())
        .list(&lp)
        .await
        .map_err(|e| CliError::from_kube("list cocoonhibernations (all namespaces)", e))?
        .items;
    let pods = Api::<Pod>::all(client.clone())
        .list(&lp)
        .await
        .map_err(|e| CliError::from_kube("list pods (all namespaces)", e))?
        .items;
    let live = live_vms(&sets, &pods, &hibernations);
    let mut repos = Vec::new();
    for repo in reg
        .catalog()
        .await
        .map_err(|e| CliError::Api(format!("registry catalog: {e}")))?
    {
        let t = reg
            .list_tags(&repo)
            .await
            .map_err(|e| CliError::Api(format!("list tags of {repo}: {e}")))?;
        repos.push((repo, t));
    }
    let found = orphans(&repos, &live, include_latest);
    let mut deleted = Vec::new();
    if yes {
        for o in &found {
            reg.delete_tag_if_present(&o.repository, &o.tag)
                .await
                .map_err(|e| CliError::Api(format!("delete {}:{}: {e}", o.repository, o.tag)))?;
            deleted.push(o.clone());
        }
    }
    if let Some(fmt) = output {
        return crate::output::print_object(
            &serde_json::json!({"dryRun": !yes, "orphans": found, "deleted": deleted}),
            fmt,
        );
    }
    if found.is_empty() {
        println!("No orphaned tags.");
        return Ok(());
    }
    let action = if yes { "deleted" } else { "would delete" };
    let rows: Vec<Vec<crate::table::Cell>> = found
        .iter()
        .map(|o| {
            vec![
                crate::table::Cell::plain(&o.repository),
                crate::table::Cell::plain(&o.tag),
                crate::table::Cell::plain(action),
            ]
        })
        .collect();
    print!(
        "{}",
        crate::table::render(&["repository", "tag", "action"], &rows, false)
    );
    if !yes {
        eprintln!("dry run: pass --yes to delete {} tag(s)", found.len());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_unreferenced_hibernate_tags_by_default() {
        let set: CocoonSet = serde_json::from_value(json!({
            "metadata": {"name": "demo", "namespace": "ns",
                "annotations": {"cocoonset.cocoonstack.io/delete-vm-names": "vk-stash",
                                "cocoonset.cocoonstack.io/hibernate-reclaim": "{\"generation\":2,\"vms\":[\"vk-reclaim\"]}"}},
            "spec": {"agent": {"image": "i", "replicas": 1}, "toolboxes": [{"name": "tb"}]},
            "status": {"agents": [{"slot": 5, "role": "sub-agent", "vmName": "vk-status"}]}
        })).expect("set");
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "other", "annotations": {"vm.cocoonstack.io/name": "vk-pod"}}})).expect("pod");
        let ch: CocoonHibernation = serde_json::from_value(json!({
            "metadata": {"name": "x", "namespace": "other"}, "spec": {"podRef": {"name": "gone"}, "desire": "Hibernate"},
            "status": {"vmName": "vk-ch"}})).expect("ch");
        let live = live_vms(&[set], &[pod], &[ch]);
        for vm in [
            "vk-stash",
            "vk-reclaim",
            "vk-status",
            "vk-pod",
            "vk-ch",
            &naming::vm_name_for_pod("ns", "demo-0"),
            &naming::vm_name_for_pod("ns", "demo-1"),
            &naming::vm_name_for_pod("ns", "demo-tb"),
        ] {
            assert!(live.contains(vm), "{vm} is live");
        }
        let repos = vec![
            (
                "prefix/vk-pod".to_string(),
                vec!["hibernate".to_string(), "latest".to_string()],
            ),
            (
                "prefix/vk-dead".to_string(),
                vec![
                    "hibernate".to_string(),
                    "latest".to_string(),
                    "v1".to_string(),
                ],
            ),
        ];
        assert_eq!(
            orphans(&repos, &live, false),
            vec![Orphan {
                repository: "prefix/vk-dead".into(),
                tag: "hibernate".into()
            }]
        );
        assert_eq!(
            orphans(&repos, &live, true).len(),
            2,
            "latest too when asked; never other tags"
        );
    }
}
