//! The grant rule of the registry token service, pure: who the caller is (from the
//! TokenReview's user), what it asked for (the `scope` parameters of the distribution token
//! spec) and which pods are bound to its node decide the `access` claim of the token.
//!
//! The rule is the registry's counterpart of the Kubernetes Node authorizer:
//!
//! * a **node** (`system:node:<n>` in group `system:nodes`, or the ServiceAccount
//!   `system:serviceaccount:<node namespace>:<n>`) gets `pull,push` on the repository of the VM
//!   of every pod whose `spec.nodeName` is `<n>` (`VMNameForPod(ns, pod)` under the registry
//!   prefix), and `pull` on the repository of each such pod's clone/run image
//!   (`cocoonset.cocoonstack.io/image`) unless that repository is a VM repository (`vk-…`): a
//!   pod must not reach another VM's snapshots by naming them as its image;
//! * checkpoint repositories (`ckpt-…`) are reached only through a CocoonCheckpoint, never
//!   through a pod's string: a node gets `pull,push` on the repository derived
//!   (`checkpoint_artifact(ns, name, uid)`) from a checkpoint whose `status.node` is that node
//!   while it is `Pending`/`Saving`/`Pushing`, and `pull` on it for a pod bound to it whose
//!   image names it only when a `Ready` checkpoint of the pod's own namespace derives it (a pod
//!   of namespace B naming namespace A's checkpoint as its image gets nothing);
//! * the **operator** (its configured usernames) gets `pull,delete` on every repository under
//!   the prefix: it probes, reads and deletes tags, and never pushes;
//! * an **administrator** (configured usernames or groups: whoever pushes base images and runs
//!   `kubectl cocoon registry gc`) gets `pull,push,delete` on every repository under the prefix
//!   and the catalog (`registry:catalog:*`);
//! * anyone else gets nothing (an empty access list, which the registry refuses).
//!
//! A token grants the intersection of what was asked and what is allowed; `*` is granted only
//! as the catalog's action to an administrator.

use std::collections::BTreeSet;

use cocoon_api::contract::checkpoint::{
    REPOSITORY_PREFIX as CHECKPOINT_PREFIX, checkpoint_artifact,
};
use cocoon_api::crd::checkpoint::CheckpointPhase;
use cocoon_api::naming::{VM_NAME_PREFIX, vm_name_for_pod};
use cocoon_registry::RegistryBase;
use serde::Serialize;

/// The username prefix of kubelet identities.
pub const NODE_USER_PREFIX: &str = "system:node:";
/// The group of kubelet identities.
pub const NODES_GROUP: &str = "system:nodes";
/// The username prefix of ServiceAccounts.
pub const SA_USER_PREFIX: &str = "system:serviceaccount:";
/// Most scopes one token request may ask for; more is a bad request.
pub const MAX_SCOPES: usize = 16;
/// Longest scope string accepted (a repository name is at most 255 characters).
pub const MAX_SCOPE_LEN: usize = 512;

/// An action of the distribution token spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Action {
    Pull,
    Push,
    Delete,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Pull => "pull",
            Action::Push => "push",
            Action::Delete => "delete",
        }
    }

    const ALL: [Action; 3] = [Action::Pull, Action::Push, Action::Delete];
}

/// One requested scope: `repository:<name>:<actions>` (other resource types are kept so that
/// they can be refused by name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    /// `repository`, `registry`, … (a `(class)` suffix removed).
    pub kind: String,
    pub name: String,
    /// The actions asked for; `*` expands to every action.
    pub actions: BTreeSet<Action>,
}

/// Why a token request is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScopeError {
    #[error("scope {0:?} is not <type>:<name>:<actions>")]
    Malformed(String),
    #[error("scope is longer than {MAX_SCOPE_LEN} characters")]
    TooLong,
    #[error("more than {MAX_SCOPES} scopes in one request")]
    TooMany,
}

/// Parses every `scope` parameter; each may hold several scopes separated by spaces (Docker
/// sends one parameter per scope, some clients join them).
pub fn parse_scopes<'a>(
    params: impl IntoIterator<Item = &'a str>,
) -> Result<Vec<Scope>, ScopeError> {
    let mut out = Vec::new();
    for p in params {
        for s in p.split(' ').filter(|s| !s.is_empty()) {
            if out.len() == MAX_SCOPES {
                return Err(ScopeError::TooMany);
            }
            out.push(parse_scope(s)?);
        }
    }
    Ok(out)
}

/// `repository:<name>:<a,b>` (the name may hold `:` only as a port of a host; actions are
/// after the last `:`). Unknown actions are dropped: they are never granted.
pub fn parse_scope(s: &str) -> Result<Scope, ScopeError> {
    if s.len() > MAX_SCOPE_LEN {
        return Err(ScopeError::TooLong);
    }
    let bad = || ScopeError::Malformed(s.to_owned());
    let (rest, actions) = s.rsplit_once(':').ok_or_else(bad)?;
    let (kind, name) = rest.split_once(':').ok_or_else(bad)?;
    let kind = kind.split_once('(').map_or(kind, |(k, _)| k);
    if kind.is_empty() || name.is_empty() {
        return Err(bad());
    }
    let mut set = BTreeSet::new();
    for a in actions.split(',').map(str::trim) {
        match a {
            "pull" => {
                set.insert(Action::Pull);
            }
            "push" => {
                set.insert(Action::Push);
            }
            "delete" => {
                set.insert(Action::Delete);
            }
            "*" => set.extend(Action::ALL),
            _ => {}
        }
    }
    Ok(Scope {
        kind: kind.to_owned(),
        name: name.to_owned(),
        actions: set,
    })
}

/// Who asked, as the grant rule sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// A node agent of this node.
    Node(String),
    /// The operator.
    Operator,
    /// An administrator.
    Admin,
    /// Authenticated, but neither: gets nothing.
    Other,
}

/// Who is who: the operator's usernames, the administrators, the per-node ServiceAccounts'
/// namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Principals {
    pub operators: Vec<String>,
    pub admin_users: Vec<String>,
    pub admin_groups: Vec<String>,
    /// Namespace of per-node ServiceAccounts (`cocoon-nodes`).
    pub node_sa_namespace: String,
}

/// Classifies the user a TokenReview (or a client certificate) names.
pub fn classify(username: &str, groups: &[String], who: &Principals) -> Caller {
    if who.operators.iter().any(|o| o == username) {
        return Caller::Operator;
    }
    if who.admin_users.iter().any(|a| a == username)
        || groups.iter().any(|g| who.admin_groups.contains(g))
    {
        return Caller::Admin;
    }
    let node_sa_namespace = who.node_sa_namespace.as_str();
    if let Some(node) = username.strip_prefix(NODE_USER_PREFIX) {
        if !node.is_empty() && groups.iter().any(|g| g == NODES_GROUP) {
            return Caller::Node(node.to_owned());
        }
        return Caller::Other;
    }
    if let Some(rest) = username.strip_prefix(SA_USER_PREFIX)
        && let Some((ns, name)) = rest.split_once(':')
        && ns == node_sa_namespace
        && !name.is_empty()
    {
        return Caller::Node(name.to_owned());
    }
    Caller::Other
}

/// A pod bound to the caller's node, as far as the rule needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundPod {
    pub namespace: String,
    pub name: String,
    /// `cocoonset.cocoonstack.io/image`, when set.
    pub image: Option<String>,
    /// `cocoonset.cocoonstack.io/from-checkpoint`, when set: the name of a checkpoint of the
    /// pod's own namespace that its VM starts from (a forked main).
    pub from_checkpoint: Option<String>,
}

/// A CocoonCheckpoint, as far as the rule needs it: its identity (the artifact is derived from
/// it, never read from a string a tenant wrote), the node its status names and its phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointFact {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `status.node` (empty before the operator's hand-off).
    pub node: String,
    pub phase: Option<CheckpointPhase>,
}

impl CheckpointFact {
    /// The wire name of the derived repository; `None` when the identity is incomplete.
    fn repository(&self, base: &RegistryBase) -> Option<String> {
        checkpoint_artifact(&self.namespace, &self.name, &self.uid)
            .ok()
            .map(|a| base.repository_path(&a.repository))
    }

    /// Whether the node agent of `node` is taking this checkpoint now.
    fn in_flight_on(&self, node: &str) -> bool {
        !self.node.is_empty()
            && self.node == node
            && matches!(
                self.phase,
                Some(CheckpointPhase::Pending | CheckpointPhase::Saving | CheckpointPhase::Pushing)
            )
    }
}

/// One entry of the token's `access` claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Access {
    #[serde(rename = "type")]
    pub kind: String,
    pub name: String,
    pub actions: Vec<String>,
}

/// The repository (without tag or digest) of a registry-relative image ref `repo[:tag]` or
/// `repo@sha256:…`; `None` for URLs and empty refs (they are not read from this registry).
pub fn image_repository(image: &str) -> Option<&str> {
    let image = image.trim();
    if image.is_empty() || image.contains("://") {
        return None;
    }
    let no_digest = image.split_once('@').map_or(image, |(r, _)| r);
    // A tag is after the last `:` of the last path segment.
    let last_slash = no_digest.rfind('/').map_or(0, |i| i + 1);
    let repo = match no_digest[last_slash..].rfind(':') {
        Some(i) => &no_digest[..last_slash + i],
        None => no_digest,
    };
    (!repo.is_empty()).then_some(repo)
}

/// Whether wire name `name` is a checkpoint repository of this registry (`<prefix>/ckpt-…`).
fn is_checkpoint_wire_name(name: &str, base: &RegistryBase) -> bool {
    let prefix = base.prefix();
    let rel = if prefix.is_empty() {
        Some(name)
    } else {
        name.strip_prefix(prefix).and_then(|r| r.strip_prefix('/'))
    };
    rel.is_some_and(|r| r.starts_with(CHECKPOINT_PREFIX))
}

/// What `caller` may do on repository `name` (a wire name, prefix included).
fn allowed_on(
    caller: &Caller,
    name: &str,
    pods: &[BoundPod],
    checkpoints: &[CheckpointFact],
    base: &RegistryBase,
) -> BTreeSet<Action> {
    let mut out = BTreeSet::new();
    let prefix = base.prefix();
    let under = prefix.is_empty()
        || name
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/') && rest.len() > 1);
    match caller {
        Caller::Other => {}
        Caller::Operator if under => out.extend([Action::Pull, Action::Delete]),
        Caller::Admin if under => out.extend(Action::ALL),
        Caller::Operator | Caller::Admin => {}
        Caller::Node(node) => {
            let checkpoint = is_checkpoint_wire_name(name, base);
            if checkpoint
                && checkpoints
                    .iter()
                    .any(|c| c.in_flight_on(node) && c.repository(base).as_deref() == Some(name))
            {
                out.extend([Action::Pull, Action::Push]);
            }
            for p in pods {
                if base.repository_path(&vm_name_for_pod(&p.namespace, &p.name)) == name {
                    out.extend([Action::Pull, Action::Push]);
                }
                // A forked main pulls the Ready checkpoint its annotation names, looked up by
                // name in the pod's own namespace and derived from that checkpoint's identity.
                if checkpoint
                    && let Some(wanted) = p.from_checkpoint.as_deref()
                    && checkpoints.iter().any(|c| {
                        c.namespace == p.namespace
                            && c.name == wanted
                            && c.phase == Some(CheckpointPhase::Ready)
                            && c.repository(base).as_deref() == Some(name)
                    })
                {
                    out.insert(Action::Pull);
                }
                let Some(repo) = p.image.as_deref().and_then(image_repository) else {
                    continue;
                };
                if repo.starts_with(VM_NAME_PREFIX) || base.repository_path(repo) != name {
                    continue;
                }
                // A checkpoint is pulled only by pods of its own namespace, once it is Ready.
                if !checkpoint
                    || checkpoints.iter().any(|c| {
                        c.namespace == p.namespace
                            && c.phase == Some(CheckpointPhase::Ready)
                            && c.repository(base).as_deref() == Some(name)
                    })
                {
                    out.insert(Action::Pull);
                }
            }
        }
    }
    out
}

/// The `access` claim for `caller` asking `requested`, with `pods` the pods bound to the
/// caller's node and `checkpoints` the cluster's CocoonCheckpoints (both ignored for other
/// callers). Repositories only; each granted entry lists the asked-and-allowed actions in the
/// spec's order; nothing allowed → no entry.
pub fn grant(
    caller: &Caller,
    requested: &[Scope],
    pods: &[BoundPod],
    checkpoints: &[CheckpointFact],
    base: &RegistryBase,
) -> Vec<Access> {
    let mut out: Vec<Access> = Vec::new();
    if *caller == Caller::Admin
        && requested
            .iter()
            .any(|s| s.kind == "registry" && s.name == "catalog")
    {
        out.push(Access {
            kind: "registry".to_owned(),
            name: "catalog".to_owned(),
            actions: vec!["*".to_owned()],
        });
    }
    for s in requested.iter().filter(|s| s.kind == "repository") {
        let allowed = allowed_on(caller, &s.name, pods, checkpoints, base);
        let actions: Vec<String> = s
            .actions
            .intersection(&allowed)
            .map(|a| a.as_str().to_owned())
            .collect();
        if actions.is_empty() {
            continue;
        }
        match out.iter_mut().find(|a| a.name == s.name) {
            Some(a) => {
                for act in actions {
                    if !a.actions.contains(&act) {
                        a.actions.push(act);
                    }
                }
            }
            None => out.push(Access {
                kind: "repository".to_owned(),
                name: s.name.clone(),
                actions,
            }),
        }
    }
    out
}
