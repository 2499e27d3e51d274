//! Identities for tests of authorization: a ServiceAccount with a token of its own, and a
//! ClusterRole bound to one.

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleRef, Subject};
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};

use crate::{Error, Result};

/// Creates the ServiceAccount `ns/name` and returns a token of it for the API server's
/// audience (TokenRequest, ten minutes).
pub async fn service_account_token(client: &Client, ns: &str, name: &str) -> Result<String> {
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        ..Default::default()
    };
    sas.create(&PostParams::default(), &sa).await?;
    let request = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(600),
            ..Default::default()
        },
        ..Default::default()
    };
    let issued: TokenRequest = sas
        .create_subresource("token", name, &PostParams::default(), &request)
        .await?;
    issued
        .status
        .map(|s| s.token)
        .ok_or_else(|| Error::Invalid {
            what: format!("TokenRequest of {ns}/{name}"),
            detail: "no token in its status".into(),
        })
}

/// Creates `role` and a ClusterRoleBinding of the same name that binds it to the
/// ServiceAccount `ns/sa`.
pub async fn bind_cluster_role(
    client: &Client,
    role: ClusterRole,
    ns: &str,
    sa: &str,
) -> Result<()> {
    let name = role.metadata.name.clone().ok_or_else(|| Error::Invalid {
        what: "ClusterRole".into(),
        detail: "metadata.name is not set".into(),
    })?;
    Api::<ClusterRole>::all(client.clone())
        .create(&PostParams::default(), &role)
        .await?;
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name,
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: sa.to_owned(),
            namespace: Some(ns.to_owned()),
            ..Default::default()
        }]),
    };
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await?;
    Ok(())
}
