//! Who the API server says this agent is, asked once at startup (a SelfSubjectReview).
//!
//! A per-node identity `system:node:<name>` in group `system:nodes` (a kubelet client
//! certificate) is what the shipped install expects: the Node authorizer and the NodeRestriction
//! admission plugin then hold the agent to its own Node, Lease and pods, and the shipped
//! ValidatingAdmissionPolicy to the pod annotations a node writes. Such an agent must not try
//! what NodeRestriction refuses (see [`NodeRegistration::node_restricted`]); a node identity of
//! another node is a configuration error that would otherwise surface as 403s much later.

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::Client;
use kube::api::{Api, PostParams};

/// The username prefix of kubelet identities (the Node authorizer's and NodeRestriction's).
pub const NODE_USER_PREFIX: &str = "system:node:";
/// The group of kubelet identities.
pub const NODES_GROUP: &str = "system:nodes";

/// How the API server holds this agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Held {
    /// `system:node:<this node>`: Node authorizer and NodeRestriction.
    AsNode,
    /// Any other user (a ServiceAccount or user bound to an RBAC role), or unknown.
    ByRbac { user: String },
}

/// Errors of the identity check.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdentityError {
    #[error(
        "the kubeconfig authenticates as {user}, a node identity of another node, but \
         VK_NODE_NAME is {node}: use the credentials issued for system:node:{node}"
    )]
    OtherNode { user: String, node: String },
    #[error(
        "the kubeconfig authenticates as {user} without group {NODES_GROUP}: the Node \
         authorizer would not recognise it (issue the certificate with O={NODES_GROUP})"
    )]
    NoNodesGroup { user: String },
}

/// Classifies the authenticated user for `node`.
pub fn classify(user: &str, groups: &[String], node: &str) -> Result<Held, IdentityError> {
    let Some(name) = user.strip_prefix(NODE_USER_PREFIX) else {
        return Ok(Held::ByRbac {
            user: user.to_owned(),
        });
    };
    if name != node {
        return Err(IdentityError::OtherNode {
            user: user.to_owned(),
            node: node.to_owned(),
        });
    }
    if !groups.iter().any(|g| g == NODES_GROUP) {
        return Err(IdentityError::NoNodesGroup {
            user: user.to_owned(),
        });
    }
    Ok(Held::AsNode)
}

/// Asks the API server who the client is. A server that cannot answer (no SelfSubjectReview
/// API, or refused) yields `ByRbac` with an empty user: the agent then registers as before.
pub async fn detect(client: &Client, node: &str) -> Result<Held, IdentityError> {
    let api: Api<SelfSubjectReview> = Api::all(client.clone());
    let review = SelfSubjectReview::default();
    match api.create(&PostParams::default(), &review).await {
        Ok(r) => {
            let info = r.status.and_then(|s| s.user_info).unwrap_or_default();
            let held = classify(
                info.username.as_deref().unwrap_or_default(),
                info.groups.as_deref().unwrap_or_default(),
                node,
            )?;
            tracing::info!(?held, "API identity");
            Ok(held)
        }
        Err(e) => {
            tracing::warn!(error = %e, "SelfSubjectReview failed: assuming an RBAC identity");
            Ok(Held::ByRbac {
                user: String::new(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups(g: &[&str]) -> Vec<String> {
        g.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn classify_table() {
        let nodes = groups(&["system:nodes", "system:authenticated"]);
        assert_eq!(classify("system:node:vk1", &nodes, "vk1"), Ok(Held::AsNode));
        assert_eq!(
            classify("system:node:vk2", &nodes, "vk1"),
            Err(IdentityError::OtherNode {
                user: "system:node:vk2".into(),
                node: "vk1".into()
            })
        );
        assert_eq!(
            classify("system:node:vk1", &groups(&["system:authenticated"]), "vk1"),
            Err(IdentityError::NoNodesGroup {
                user: "system:node:vk1".into()
            })
        );
        let sa = "system:serviceaccount:cocoon-system:cocoon-node";
        assert_eq!(
            classify(sa, &groups(&["system:serviceaccounts"]), "vk1"),
            Ok(Held::ByRbac { user: sa.into() })
        );
    }

    #[test]
    fn other_node_error_names_the_setting() {
        let e = classify("system:node:b", &groups(&["system:nodes"]), "a").unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("VK_NODE_NAME is a"), "{msg}");
        assert!(msg.contains("system:node:a"), "{msg}");
    }
}
