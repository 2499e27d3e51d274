//! `registry gc`: find `:hibernate` (and, on request, `:latest`) tags whose VM no live object
//! accounts for, and `:checkpoint` tags of checkpoint artifacts no CocoonCheckpoint accounts
//! for, and delete them by digest. Dry run unless `--yes` (or `--interactive` and a `y`).
//!
//! # What is a candidate
//!
//! Only repositories **named like a VM** (or like a checkpoint artifact, see below): one path
//! component under the registry base of the hashed form of `contract.md` §2.2,
//! `vk-<…>-<6 lowercase hex>`, a valid VM name and OCI component ([`vm_shaped`]). Everything
//! else under the base — base images such as `<base>/ubuntu` or `<base>/library/ubuntu` — is
//! never touched, whatever its tags. The legacy unhashed form (`vk-<ns>-<pod>`) is not a
//! candidate either: it cannot be told from an image that happens to start with `vk-`, so
//! legacy VMs' tags are left for an administrator.
//!
//! # What is live (never collected)
//!
//! Every pod's `vm.cocoonstack.io/name`; every CocoonSet's status entries, `delete-vm-names`
//! stash, reclaim record, and the VM names its spec implies (slots 0..replicas, toolboxes);
//! every CocoonHibernation's `status.vmName` and its pod's VM; and every repository an image
//! reference of a set (`spec.agent.image`, `spec.toolboxes[].image`) or a pod
//! (`cocoonset.cocoonstack.io/image`, container images) names, compared by its last path
//! component. `:latest` tags are left alone unless `--include-latest`: the operator keeps them
//! after teardown on purpose (snapshotPolicy `always`/`main-only`).
//!
//! # Recorded owners (issue 35 item 2)
//!
//! A VM name is a 24-bit hash for long names, so a repository that no live object names may
//! still be the snapshot of a live pod of another namespace whose name collides with a dead
//! one. Before a tag is deleted its manifest annotations are read
//! (`cocoon_api::contract::owner`), and a tag that records an owner is deleted only when
//! that owner is gone ([`owner_lives`]): it is **kept** while
//!
//! * its recorded namespace exists with the recorded namespace UID (any UID when none is
//!   recorded; a namespace re-created under the same name is another owner), **and**
//! * the recorded pod (when recorded) exists in it, or a CocoonSet of that namespace whose
//!   pods are named `<set>-…` could own it, or a CocoonHibernation there names it; when no pod
//!   is recorded, the namespace existing is enough.
//!
//! Kept tags are listed as `kept (owner <ns>/<pod> lives)`. A tag that records no owner (the
//! Go components, cocoon-common v0.3.0, push none) is decided by the name rule above alone.
//! The delete names the digest whose owner was checked.
//!
//! # Checkpoint artifacts (issue 38)
//!
//! Repositories of the exact form `checkpoint_artifact` derives, `ckpt-<M>-<12 lowercase hex>`
//! ([`checkpoint_shaped`]), are candidates too, for their `:checkpoint` tag only (any other tag,
//! and any other `ckpt-…`-looking name, stays untouched). Such a tag is **live** while a
//! CocoonCheckpoint of any namespace derives that repository from its namespace, name and UID
//! (a checkpoint being deleted included: its finalizer deletes the artifact), and while an image
//! reference of a set or pod names the repository (a forked set's main starts from
//! `<repo>@<digest>` or `<repo>:checkpoint`). Otherwise (its CR deleted with the finalizer
//! stripped by hand, say) it is collected, subject to its owner record: kept while the recorded
//! namespace exists (UID rule as above) and a CocoonCheckpoint named by the recorded
//! `owner-pod` (`cocooncheckpoint/<name>`) exists in it. A checkpoint artifact whose record names
//! a pod-shaped owner (anything but `cocooncheckpoint/<name>`) is never trusted: it is kept and
//! reported as `kept (owner record <ns>/<pod> is not a checkpoint)`, JSON `ownerMismatch`.
//!
//! # Races
//!
//! The objects are read once for the walk, and **again right before each DELETE**: a tag whose
//! VM became live meanwhile (its pod appeared, a set now names it — a VM that hibernated during
//! a long walk) is kept and reported as `kept`. Only the window between that re-read and the
//! DELETE itself remains.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;

use cocoon_api::contract::checkpoint as ckpt;
use cocoon_api::contract::{
    AnnotationCodec, DeleteVmNames, ReclaimRecord, annotations as ann, tags,
};
use cocoon_api::crd::checkpoint::CocoonCheckpoint;
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

/// What the live objects hold on to: VM names, and the repositories of the images they use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Live {
    pub vms: BTreeSet<String>,
    /// The last path component of every image reference's repository.
    pub image_repos: BTreeSet<String>,
    /// The repository every CocoonCheckpoint derives from its namespace, name and UID.
    pub checkpoints: BTreeSet<String>,
}

impl Live {
    /// Whether repository `repo` (a logical name under the base) must be kept.
    pub fn keeps(&self, repo: &str) -> bool {
        let last = last_component(repo);
        self.vms.contains(last)
            || self.image_repos.contains(last)
            || self.checkpoints.contains(last)
    }
}

fn last_component(repo: &str) -> &str {
    repo.rsplit('/').next().unwrap_or(repo)
}

/// The objects a recorded owner may be: namespaces (with their UIDs), pods, CocoonSets, the
/// pods CocoonHibernations name and CocoonCheckpoints, each by `(namespace, name)`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Owners {
    pub namespaces: BTreeMap<String, String>,
    pub pods: BTreeSet<(String, String)>,
    pub sets: BTreeSet<(String, String)>,
    pub hibernated_pods: BTreeSet<(String, String)>,
    pub checkpoints: BTreeSet<(String, String)>,
}

impl Owners {
    /// The owners among these objects (namespaces are added by the caller).
    pub fn of(
        sets: &[CocoonSet],
        pods: &[Pod],
        hibernations: &[CocoonHibernation],
        checkpoints: &[CocoonCheckpoint],
    ) -> Owners {
        let key = |ns: Option<String>, name: String| (ns.unwrap_or_default(), name);
        Owners {
            namespaces: BTreeMap::new(),
            pods: pods
                .iter()
                .map(|p| key(p.namespace(), p.name_any()))
                .collect(),
            sets: sets
                .iter()
                .map(|s| key(s.namespace(), s.name_any()))
                .collect(),
            hibernated_pods: hibernations
                .iter()
                .map(|h| key(h.namespace(), h.spec.pod_ref.name.clone()))
                .collect(),
            checkpoints: checkpoints
                .iter()
                .map(|c| key(c.namespace(), c.name_any()))
                .collect(),
        }
    }
}

/// `<ns>/<pod>` of the owner `annotations` record, for the report.
fn owner_of(annotations: &BTreeMap<String, String>) -> String {
    cocoon_api::contract::owner::RecordedOwner::from_annotations(annotations)
        .map(|o| format!("{}/{}", o.namespace, o.pod.unwrap_or_default()))
        .unwrap_or_default()
}

/// Does the owner a tag's manifest `annotations` record still live (see the module docs)?
/// `None` when they record no owner: the name rule alone decides.
pub fn owner_lives(annotations: &BTreeMap<String, String>, owners: &Owners) -> Option<bool> {
    let owner = cocoon_api::contract::owner::RecordedOwner::from_annotations(annotations)?;
    let ns = owner.namespace.as_str();
    let Some(uid) = owners.namespaces.get(ns) else {
        return Some(false);
    };
    if owner.namespace_uid.as_ref().is_some_and(|u| u != uid) {
        return Some(false);
    }
    let Some(pod) = owner.pod else {
        return Some(true);
    };
    let key = (ns.to_string(), pod.clone());
    Some(
        owners.pods.contains(&key)
            || owners.hibernated_pods.contains(&key)
            || owners.sets.iter().any(|(set_ns, set)| {
                set_ns == ns
                    && pod
                        .strip_prefix(set.as_str())
                        .and_then(|rest| rest.strip_prefix('-'))
                        .is_some_and(|suffix| !suffix.is_empty())
            }),
    )
}

/// Why a candidate tag is kept after reading its manifest's owner record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerKeep {
    /// The recorded owner (`<ns>/<pod>`) lives.
    Lives(String),
    /// A checkpoint artifact records an owner (`<ns>/<pod>`) that is not a checkpoint.
    Mismatch(String),
}

impl OwnerKeep {
    /// The action column of the report.
    pub fn action(&self) -> String {
        match self {
            OwnerKeep::Lives(o) => format!("kept (owner {o} lives)"),
            OwnerKeep::Mismatch(o) => format!("kept (owner record {o} is not a checkpoint)"),
        }
    }
}

/// Does the owner record (manifest `annotations`) of a tag of candidate repository `repo`
/// keep it? `None`: collect it. VM repositories follow [`owner_lives`]; checkpoint
/// repositories the checkpoint rule of the module docs.
pub fn owner_keeps(
    repo: &str,
    annotations: &BTreeMap<String, String>,
    owners: &Owners,
) -> Option<OwnerKeep> {
    let lives = |a: &BTreeMap<String, String>| owner_lives(a, owners) == Some(true);
    if !checkpoint_shaped(repo) {
        return lives(annotations).then(|| OwnerKeep::Lives(owner_of(annotations)));
    }
    let owner = cocoon_api::contract::owner::RecordedOwner::from_annotations(annotations)?;
    let name = owner
        .pod
        .as_deref()
        .and_then(|p| p.strip_prefix(ckpt::OWNER_POD_PREFIX))
        .filter(|n| !n.is_empty() && !n.contains('/'));
    let Some(name) = name else {
        return Some(OwnerKeep::Mismatch(owner_of(annotations)));
    };
    let ns_lives = owners
        .namespaces
        .get(&owner.namespace)
        .is_some_and(|uid| owner.namespace_uid.as_ref().is_none_or(|u| u == uid));
    let key = (owner.namespace.clone(), name.to_string());
    (ns_lives && owners.checkpoints.contains(&key)).then(|| OwnerKeep::Lives(owner_of(annotations)))
}

/// Is `repo` named exactly as `checkpoint_artifact` names a checkpoint's repository
/// (`ckpt-<M>-<12 lowercase hex>`, `M` = `<ns>-<name>` made safe, 3 to 45 characters of
/// `[a-z0-9-]` starting and ending alphanumeric, one path component)?
pub fn checkpoint_shaped(repo: &str) -> bool {
    let hex = ckpt::REPOSITORY_HASH_HEX_LEN;
    let Some(rest) = repo.strip_prefix(ckpt::REPOSITORY_PREFIX) else {
        return false;
    };
    let Some((middle, hash)) = rest.rsplit_once('-') else {
        return false;
    };
    // The longest `M` the derivation keeps (45): the whole name is at most 63 characters.
    let middle_max = naming::MAX_NAME_LEN - ckpt::REPOSITORY_PREFIX.len() - 1 - hex;
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    hash.len() == hex
        && hash
            .bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
        && (3..=middle_max).contains(&middle.len())
        && middle.contains('-')
        && middle.bytes().all(|c| alnum(c) || c == b'-')
        && middle.bytes().next().is_some_and(alnum)
        && middle.bytes().last().is_some_and(alnum)
        && naming::is_valid_oci_component(repo)
}

/// Whether `repo` is a candidate repository at all, and `tag` a tag gc may collect from it:
/// `:hibernate` (and `:latest` when `include_latest`) of a VM repository, `:checkpoint` of a
/// checkpoint repository.
pub fn collectable(repo: &str, tag: &str, include_latest: bool) -> bool {
    if vm_shaped(repo) {
        tag == tags::HIBERNATE || (include_latest && tag == tags::LATEST)
    } else {
        checkpoint_shaped(repo) && tag == ckpt::CHECKPOINT_TAG
    }
}

/// Is `repo` named like a VM (the hashed form of `contract.md` §2.2, one path component)?
pub fn vm_shaped(repo: &str) -> bool {
    let hex = naming::VM_HASH_HEX_LEN;
    !repo.contains('/')
        && repo.starts_with(naming::VM_NAME_PREFIX)
        && naming::is_valid_vm_name(repo)
        && naming::is_valid_oci_component(repo)
        && repo.len() > naming::VM_NAME_PREFIX.len() + hex + 1
        && repo
            .get(repo.len() - hex - 1..)
            .and_then(|s| s.strip_prefix('-'))
            .is_some_and(|h| {
                h.bytes()
                    .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
            })
}

/// The repository of an image reference, by its last path component: `host:5000/a/ubuntu:24.04`
/// and `a/ubuntu@sha256:…` give `ubuntu`. Empty for an empty reference.
pub fn image_repo(image: &str) -> &str {
    let image = image.trim();
    let no_digest = image.split('@').next().unwrap_or(image);
    let last = last_component(no_digest);
    last.split(':').next().unwrap_or(last)
}

/// Every VM name a live object references, every image repository, and every checkpoint's
/// repository.
pub fn live_refs(
    sets: &[CocoonSet],
    pods: &[Pod],
    hibernations: &[CocoonHibernation],
    checkpoints: &[CocoonCheckpoint],
) -> Live {
    let mut live = BTreeSet::new();
    let mut images = BTreeSet::new();
    let mut pod_vm: BTreeMap<(String, String), String> = BTreeMap::new();
    for p in pods {
        if let Some(vm) = p.annotations().get(ann::VM_NAME).filter(|v| !v.is_empty()) {
            live.insert(vm.clone());
            pod_vm.insert(
                (p.namespace().unwrap_or_default(), p.name_any()),
                vm.clone(),
            );
        }
        if let Some(image) = p.annotations().get(ann::IMAGE) {
            images.insert(image_repo(image).to_string());
        }
        if let Some(spec) = &p.spec {
            images.extend(
                spec.containers
                    .iter()
                    .filter_map(|c| c.image.as_deref())
                    .map(|i| image_repo(i).to_string()),
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
        images.insert(image_repo(&s.spec.agent.image).to_string());
        for t in &s.spec.toolboxes {
            live.insert(naming::vm_name_for_pod(
                &ns,
                &naming::pod_name_for_toolbox(&name, &t.name),
            ));
            images.insert(image_repo(&t.image).to_string());
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
    images.remove("");
    let checkpoints = checkpoints
        .iter()
        .filter_map(|c| {
            let (ns, uid) = (
                c.namespace().unwrap_or_default(),
                c.uid().unwrap_or_default(),
            );
            ckpt::checkpoint_artifact(&ns, &c.name_any(), &uid).ok()
        })
        .map(|a| a.repository)
        .collect();
    Live {
        vms: live,
        image_repos: images,
        checkpoints,
    }
}

/// The tags to collect, given each repository's tags: only VM- or checkpoint-shaped
/// repositories that no live object holds on to, and only the tags [`collectable`] names.
pub fn orphans(repos: &[(String, Vec<String>)], live: &Live, include_latest: bool) -> Vec<Orphan> {
    let mut out = Vec::new();
    for (repo, repo_tags) in repos {
        if live.keeps(repo) {
            continue;
        }
        for t in repo_tags {
            if collectable(repo, t, include_latest) {
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

/// Reads every CocoonSet, CocoonCheckpoint, pod, CocoonHibernation and namespace of the
/// cluster (uncached):
/// what they hold on to by name, and the owners that live.
async fn read_live(client: &kube::Client) -> Result<(Live, Owners), crate::error::CliError> {
    use crate::error::CliError;
    use kube::api::{Api, ListParams};
    let lp = ListParams::default();
    let sets = Api::<CocoonSet>::all(client.clone())
        .list(&lp)
        .await
        .map_err(|e| CliError::from_kube("list cocoonsets (all namespaces)", e))?
        .items;
    let checkpoints = Api::<CocoonCheckpoint>::all(client.clone())
        .list(&lp)
        .await
        .map_err(|e| CliError::from_kube("list cocooncheckpoints (all namespaces)", e))?
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
    let namespaces = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .list(&lp)
        .await
        .map_err(|e| CliError::from_kube("list namespaces (the owners tags record)", e))?
        .items;
    let mut owners = Owners::of(&sets, &pods, &hibernations, &checkpoints);
    owners.namespaces = namespaces
        .iter()
        .map(|n| (n.name_any(), n.uid().unwrap_or_default()))
        .collect();
    Ok((live_refs(&sets, &pods, &hibernations, &checkpoints), owners))
}

/// Asks on stderr whether to delete `n` tags; true for an answer starting with `y`.
fn confirm(n: usize) -> bool {
    eprint!("delete {n} tag(s)? [y/N] ");
    let _ = std::io::stderr().flush();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).is_ok()
        && line.trim_start().to_ascii_lowercase().starts_with('y')
}

/// Runs `registry gc`. `interactive`: show the list, then ask before deleting.
pub async fn run(
    client: &kube::Client,
    registry: Option<&str>,
    include_latest: bool,
    yes: bool,
    interactive: bool,
    output: Option<&crate::cli::OutputFormat>,
) -> Result<(), crate::error::CliError> {
    use crate::error::CliError;
    let base = registry
        .filter(|r| !r.trim().is_empty())
        .ok_or_else(|| CliError::Usage("registry gc needs --registry or OCI_REGISTRY".into()))?;
    // Credentials (static, Docker config, or a token from the registry token service), CA and
    // insecure hosts from the environment, as README "Registry credentials" documents them.
    let cfg = cocoon_registry::RegistryConfig::for_registry(base)
        .and_then(|c| c.with_access_env(&|k| std::env::var(k).ok()))
        .map(crate::user_agent::registry_config)
        .map_err(|e| CliError::Usage(format!("--registry {base:?}: {e}")))?;
    let reg =
        cocoon_registry::RegistryClient::new(cfg).map_err(|e| CliError::Api(e.to_string()))?;
    let (live, owners) = read_live(client).await?;
    let mut repos = Vec::new();
    for repo in reg
        .catalog()
        .await
        .map_err(|e| CliError::Api(format!("registry catalog: {e}")))?
    {
        // Only VM- and checkpoint-shaped repositories are ever candidates: no tag listing for
        // the others.
        if !(vm_shaped(&repo) || checkpoint_shaped(&repo)) || live.keeps(&repo) {
            continue;
        }
        let t = reg
            .list_tags(&repo)
            .await
            .map_err(|e| CliError::Api(format!("list tags of {repo}: {e}")))?;
        repos.push((repo, t));
    }
    let mut found = Vec::new();
    let mut owned = Vec::new();
    for o in orphans(&repos, &live, include_latest) {
        match reg.manifest_annotations(&o.repository, &o.tag).await {
            Ok(a) => match owner_keeps(&o.repository, &a, &owners) {
                Some(keep) => owned.push((o, keep)),
                None => found.push(o),
            },
            Err(e) if e.is_not_found() => {}
            Err(e) => {
                return Err(CliError::Api(format!(
                    "read the owner of {}:{}: {e}",
                    o.repository, o.tag
                )));
            }
        }
    }
    // The question goes to stderr with the list it asks about: stdout keeps only the result.
    let delete = yes
        || (interactive && !found.is_empty() && {
            eprint!("{}", render(&found, "would delete"));
            confirm(found.len())
        });
    let (mut deleted, mut kept) = (Vec::new(), Vec::new());
    if delete {
        for o in &found {
            // The walk may have taken long: read the objects again right before each DELETE.
            let (live, owners) = read_live(client).await?;
            if live.keeps(&o.repository) {
                kept.push(o.clone());
                continue;
            }
            // The owner is checked on the very manifest the DELETE names.
            let done = reg
                .delete_tag_checked(&o.repository, &o.tag, |a| {
                    owner_keeps(&o.repository, a, &owners).is_none()
                })
                .await
                .map_err(|e| CliError::Api(format!("delete {}:{}: {e}", o.repository, o.tag)))?;
            match done {
                cocoon_registry::CheckedDelete::Kept(a) => {
                    let keep = owner_keeps(&o.repository, &a, &owners)
                        .unwrap_or_else(|| OwnerKeep::Lives(owner_of(&a)));
                    owned.push((o.clone(), keep));
                }
                _ => deleted.push(o.clone()),
            }
        }
    }
    if let Some(fmt) = output {
        return crate::output::print_object(
            &serde_json::json!({"dryRun": !delete, "orphans": found, "deleted": deleted, "kept": kept,
                "ownerLives": owner_report(&owned, false), "ownerMismatch": owner_report(&owned, true)}),
            fmt,
        );
    }
    let owner_kept = |o: &Orphan| {
        owned
            .iter()
            .find(|(k, _)| k == o)
            .map(|(_, keep)| keep.action())
    };
    let walk_kept: Vec<(Orphan, String)> = owned
        .iter()
        .filter(|(o, _)| !found.contains(o))
        .filter_map(|(o, _)| owner_kept(o).map(|a| (o.clone(), a)))
        .collect();
    if !walk_kept.is_empty() {
        let rows: Vec<(Orphan, &str)> = walk_kept
            .iter()
            .map(|(o, a)| (o.clone(), a.as_str()))
            .collect();
        print_rows(&rows);
    }
    if found.is_empty() {
        println!("No orphaned tags.");
        return Ok(());
    }
    if delete {
        let actions: Vec<(Orphan, String)> = found
            .iter()
            .map(|o| {
                let action = if kept.contains(o) {
                    "kept (live again)".to_string()
                } else {
                    owner_kept(o).unwrap_or_else(|| "deleted".to_string())
                };
                (o.clone(), action)
            })
            .collect();
        let rows: Vec<(Orphan, &str)> = actions
            .iter()
            .map(|(o, a)| (o.clone(), a.as_str()))
            .collect();
        print_rows(&rows);
    } else if interactive {
        eprintln!("nothing deleted");
    } else {
        print!("{}", render(&found, "would delete"));
        eprintln!("dry run: pass --yes to delete {} tag(s)", found.len());
    }
    Ok(())
}

/// The JSON list of the tags kept for their owner record: those whose owner lives, or (with
/// `mismatch`) the checkpoint artifacts whose record names no checkpoint.
fn owner_report(owned: &[(Orphan, OwnerKeep)], mismatch: bool) -> Vec<serde_json::Value> {
    owned
        .iter()
        .filter_map(|(o, keep)| match keep {
            OwnerKeep::Lives(owner) if !mismatch => Some((o, owner)),
            OwnerKeep::Mismatch(owner) if mismatch => Some((o, owner)),
            _ => None,
        })
        .map(|(o, owner)| serde_json::json!({"repository": o.repository, "tag": o.tag, "owner": owner}))
        .collect()
}

fn render(found: &[Orphan], action: &str) -> String {
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
    crate::table::render(&["repository", "tag", "action"], &rows, false)
}

fn print_rows(rows: &[(Orphan, &str)]) {
    let rows: Vec<Vec<crate::table::Cell>> = rows
        .iter()
        .map(|(o, action)| {
            vec![
                crate::table::Cell::plain(&o.repository),
                crate::table::Cell::plain(&o.tag),
                crate::table::Cell::plain(*action),
            ]
        })
        .collect();
    print!(
        "{}",
        crate::table::render(&["repository", "tag", "action"], &rows, false)
    );
    let _ = std::io::stdout().flush();
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn repo(name: &str, t: &[&str]) -> (String, Vec<String>) {
        (name.to_string(), t.iter().map(|t| t.to_string()).collect())
    }

    #[test]
    fn only_unreferenced_hibernate_tags_of_vm_repositories_by_default() {
        let stash = naming::vm_name_for_pod("ns", "stash-0");
        let reclaim = naming::vm_name_for_pod("ns", "reclaim-0");
        let status = naming::vm_name_for_pod("ns", "demo-5");
        let pod_vm = naming::vm_name_for_pod("other", "p");
        let ch_vm = naming::vm_name_for_pod("other", "ch");
        let set: CocoonSet = serde_json::from_value(json!({
            "metadata": {"name": "demo", "namespace": "ns",
                "annotations": {"cocoonset.cocoonstack.io/delete-vm-names": stash,
                                "cocoonset.cocoonstack.io/hibernate-reclaim": format!("{{\"generation\":2,\"vms\":[\"{reclaim}\"]}}")}},
            "spec": {"agent": {"image": "registry.example:5000/base/ubuntu:24.04", "replicas": 1},
                     "toolboxes": [{"name": "tb", "image": "tools@sha256:abc"}]},
            "status": {"agents": [{"slot": 5, "role": "sub-agent", "vmName": status}]}
        })).expect("set");
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "other",
            "annotations": {"vm.cocoonstack.io/name": pod_vm, "cocoonset.cocoonstack.io/image": "host/debian:12"}}})).expect("pod");
        let ch: CocoonHibernation = serde_json::from_value(json!({
            "metadata": {"name": "x", "namespace": "other"}, "spec": {"podRef": {"name": "gone"}, "desire": "Hibernate"},
            "status": {"vmName": ch_vm}})).expect("ch");
        let live = live_refs(&[set], &[pod], &[ch], &[]);
        for vm in [
            &stash,
            &reclaim,
            &status,
            &pod_vm,
            &ch_vm,
            &naming::vm_name_for_pod("ns", "demo-0"),
            &naming::vm_name_for_pod("ns", "demo-1"),
            &naming::vm_name_for_pod("ns", "demo-tb"),
        ] {
            assert!(live.keeps(vm), "{vm} is live");
        }
        for image in ["ubuntu", "tools", "debian"] {
            assert!(live.image_repos.contains(image), "{image} is in use");
        }
        let dead = naming::vm_name_for_pod("ns", "gone-0");
        let repos = vec![
            repo(&pod_vm, &["hibernate", "latest"]),
            repo(&dead, &["hibernate", "latest", "v1"]),
            // Base images: never candidates, used or not.
            repo("ubuntu", &["latest", "hibernate"]),
            repo("base/ubuntu", &["latest"]),
            repo("unused-image", &["latest", "hibernate"]),
            repo("vk-not-a-vm", &["latest"]),
        ];
        assert_eq!(
            orphans(&repos, &live, false),
            vec![Orphan {
                repository: dead.clone(),
                tag: "hibernate".into()
            }]
        );
        assert_eq!(
            orphans(&repos, &live, true),
            vec![
                Orphan {
                    repository: dead.clone(),
                    tag: "hibernate".into()
                },
                Orphan {
                    repository: dead,
                    tag: "latest".into()
                }
            ],
            "latest too when asked; never other tags, never other repositories"
        );
    }

    #[test]
    fn vm_shaped_is_the_hashed_vm_name_form_only() {
        let cases = [
            ("vk-ns-demo-0-505043", true),
            (
                naming::vm_name_for_pod(
                    "a-very-long-namespace-name-for-a-team",
                    "a-long-set-name-0",
                )
                .leak(),
                true,
            ),
            ("vk-ns-demo-0", false),
            ("vk-ns-demo-0-50504g", false),
            ("vk-ns-demo-0-ABCDEF", false),
            ("prefix/vk-ns-demo-0-505043", false),
            ("ubuntu", false),
            ("vk--505043", false),
            ("vk-505043", false),
            ("", false),
        ];
        for (repo, want) in cases {
            assert_eq!(vm_shaped(repo), want, "{repo}");
        }
    }

    #[test]
    fn image_references_name_their_repository() {
        for (image, want) in [
            ("ubuntu", "ubuntu"),
            ("ubuntu:24.04", "ubuntu"),
            ("host:5000/base/ubuntu:24.04", "ubuntu"),
            ("host:5000/base/ubuntu@sha256:abc", "ubuntu"),
            ("host:5000/ubuntu", "ubuntu"),
            ("", ""),
        ] {
            assert_eq!(image_repo(image), want, "{image}");
        }
    }

    #[test]
    fn a_tag_is_kept_while_its_recorded_owner_lives() {
        use cocoon_api::contract::owner::owner_annotations;
        let k = |a: &str, b: &str| (a.to_string(), b.to_string());
        let owners = Owners {
            namespaces: [k("eu1", "u1"), k("eu2", "u2")].into(),
            pods: [k("eu1", "solo")].into(),
            sets: [k("eu1", "analytics")].into(),
            hibernated_pods: [k("eu1", "sleeper")].into(),
            checkpoints: [k("eu1", "solo")].into(),
        };
        let pod_only: BTreeMap<String, String> = [(
            cocoon_api::contract::oci::ANNOTATION_OWNER_NAMESPACE.to_string(),
            "eu2".to_string(),
        )]
        .into();
        #[rustfmt::skip]
        let cases = [
            ("Go artifact: no owner, the name rule decides", BTreeMap::new(), None),
            ("the pod exists", owner_annotations("eu1", None, "solo"), Some(true)),
            ("a set of the namespace could own the pod", owner_annotations("eu1", Some("u1"), "analytics-warehouse-0"), Some(true)),
            ("a hibernation names the pod", owner_annotations("eu1", None, "sleeper"), Some(true)),
            ("namespace only, it exists", pod_only, Some(true)),
            ("the pod, its set and its hibernation are gone", owner_annotations("eu1", None, "gone-0"), Some(false)),
            ("a set name is not a pod-name prefix without a dash", owner_annotations("eu1", None, "analyticsx-0"), Some(false)),
            ("the namespace is gone", owner_annotations("eu3", None, "solo"), Some(false)),
            ("the namespace was re-created (uid differs)", owner_annotations("eu1", Some("old"), "solo"), Some(false)),
            ("a same-named pod in another namespace", owner_annotations("eu2", None, "solo"), Some(false)),
        ];
        for (what, annotations, want) in cases {
            assert_eq!(owner_lives(&annotations, &owners), want, "{what}");
        }
        let vm = naming::vm_name_for_pod("eu1", "solo");
        let ck = ckpt::checkpoint_artifact("eu1", "gone", "u")
            .expect("artifact")
            .repository;
        let lives = |o: &str| Some(OwnerKeep::Lives(o.into()));
        let mismatch = |o: &str| Some(OwnerKeep::Mismatch(o.into()));
        let ck_owner = ckpt::checkpoint_owner_annotations;
        #[rustfmt::skip]
        let cases = [
            ("VM: the pod lives", &vm, owner_annotations("eu1", None, "solo"), lives("eu1/solo")),
            ("VM: the owner is gone", &vm, owner_annotations("eu1", None, "gone-0"), None),
            ("checkpoint: no owner recorded, the name rule decides", &ck, BTreeMap::new(), None),
            ("checkpoint: the recorded checkpoint exists", &ck, ck_owner("eu1", "solo"), lives("eu1/cocooncheckpoint/solo")),
            ("checkpoint: another namespace's live checkpoint", &ck, ck_owner("eu2", "solo"), None),
            ("checkpoint: the recorded checkpoint is gone", &ck, ck_owner("eu1", "gone"), None),
            ("checkpoint: its namespace is gone", &ck, ck_owner("eu3", "solo"), None),
            ("checkpoint: namespace re-created", &ck, owner_annotations("eu1", Some("old"), "cocooncheckpoint/solo"), None),
            ("checkpoint: a pod-shaped owner record is never trusted", &ck, owner_annotations("eu3", None, "solo"), mismatch("eu3/solo")),
            ("checkpoint: a namespace-only record either", &ck, pod_only_ns("eu3"), mismatch("eu3/")),
            ("checkpoint: an empty checkpoint name either", &ck, owner_annotations("eu1", None, "cocooncheckpoint/"), mismatch("eu1/cocooncheckpoint/")),
        ];
        for (what, repo, annotations, want) in cases {
            assert_eq!(owner_keeps(repo, &annotations, &owners), want, "{what}");
        }
    }

    fn pod_only_ns(ns: &str) -> BTreeMap<String, String> {
        [(
            cocoon_api::contract::oci::ANNOTATION_OWNER_NAMESPACE.to_string(),
            ns.to_string(),
        )]
        .into()
    }

    #[test]
    fn checkpoint_shaped_is_exactly_what_checkpoint_artifact_derives() {
        let long = "a-namespace-name-that-is-long-enough";
        for (ns, name, uid) in [("a", "b", "u"), ("team-a", "x.y", "1"), (long, long, "u2")] {
            let repo = ckpt::checkpoint_artifact(ns, name, uid)
                .expect("artifact")
                .repository;
            assert!(checkpoint_shaped(&repo), "{repo}");
            assert!(collectable(&repo, "checkpoint", false), "{repo}");
            assert!(
                !collectable(&repo, "hibernate", true),
                "{repo}: only :checkpoint"
            );
        }
        #[rustfmt::skip]
        let cases = [
            ("ckpt-ns-demo-0123456789ab", true),
            ("ckpt-ns-demo-0123456789a", false),   // 11 hex
            ("ckpt-ns-demo-0123456789abc", false), // 13 hex
            ("ckpt-ns-demo-0123456789AB", false),
            ("ckpt-ns-demo-0123456789ag", false),
            ("ckpt-nsdemo-0123456789ab", false),   // no `<ns>-<name>`
            ("ckpt--ns-demo-0123456789ab", false),
            ("ckpt-ns-demo--0123456789ab", false),
            ("ckpt-ns_demo-0123456789ab", false),
            ("ckpt-0123456789ab", false),
            ("ckpt-my-backup", false),
            ("base/ckpt-ns-demo-0123456789ab", false),
            ("ckpt-ns-demo-0123456789ab/x", false),
            ("vk-ns-demo-0-505043", false),
            ("", false),
        ];
        for (repo, want) in cases {
            assert_eq!(checkpoint_shaped(repo), want, "{repo}");
        }
        let m46 = format!("ckpt-{}-0123456789ab", "a-".repeat(22) + "bc");
        assert!(
            !checkpoint_shaped(&m46),
            "M longer than 45 is cut by the derivation"
        );
    }

    #[test]
    fn a_checkpoint_artifact_is_live_while_its_cr_or_an_image_names_it() {
        let cr = |ns: &str, name: &str, uid: &str| -> CocoonCheckpoint {
            serde_json::from_value(
                json!({"metadata": {"name": name, "namespace": ns, "uid": uid},
                "spec": {"source": {"podRef": {"name": "p"}}}}),
            )
            .expect("checkpoint")
        };
        let art = |ns, name, uid| {
            ckpt::checkpoint_artifact(ns, name, uid)
                .expect("a")
                .repository
        };
        let (live_ck, by_digest, by_tag) = (
            art("a", "keep", "u1"),
            art("b", "x", "u"),
            art("b", "y", "u"),
        );
        let (recreated, orphan) = (art("a", "again", "old-uid"), art("a", "gone", "u3"));
        let set: CocoonSet = serde_json::from_value(json!({"metadata": {"name": "fork", "namespace": "b"},
            "spec": {"agent": {"image": format!("reg:5000/{by_digest}@sha256:abc"), "replicas": 0}}})).expect("set");
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "b",
            "annotations": {"cocoonset.cocoonstack.io/image": format!("reg:5000/{by_tag}:checkpoint")}}})).expect("pod");
        let live = live_refs(
            &[set],
            &[pod],
            &[],
            &[cr("a", "keep", "u1"), cr("a", "again", "new-uid")],
        );
        let repos: Vec<_> = [&live_ck, &by_digest, &by_tag, &recreated, &orphan]
            .into_iter()
            .map(|r| repo(r, &["checkpoint", "v1"]))
            .chain([repo("ckpt-my-backup", &["checkpoint"])])
            .collect();
        let want = [recreated, orphan].map(|r| Orphan {
            repository: r,
            tag: "checkpoint".into(),
        });
        let mut want = want.to_vec();
        want.sort_by(|a, b| a.repository.cmp(&b.repository));
        assert_eq!(
            orphans(&repos, &live, true),
            want,
            "the CR's UID counts; images keep theirs"
        );
    }
}
