//! `version`: the plugin's version, the operator's (read from the `cocoon-operator` Deployment's
//! image tag in `cocoon-system`), and a warning when their minor versions differ.

use k8s_openapi::api::apps::v1::Deployment;
use kube::Client;
use kube::api::Api;
use serde::Serialize;

/// The plugin's version (the workspace version).
pub const CLIENT_VERSION: &str = env!("CARGO_PKG_VERSION");
/// The git revision the plugin was built from (`unknown` outside a git checkout).
pub const CLIENT_REVISION: &str = env!("COCOON_GIT_REVISION");
/// `--version`: the version and the git revision.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (git ",
    env!("COCOON_GIT_REVISION"),
    ")"
);

/// Namespace and name of the operator Deployment the version is read from.
pub const OPERATOR_NAMESPACE: &str = "cocoon-system";
pub const OPERATOR_DEPLOYMENT: &str = "cocoon-operator";

#[derive(Debug, Serialize)]
pub struct Versions {
    pub client: String,
    pub client_revision: String,
    /// `null` when unknown, and with `--client` (the cluster is not asked).
    pub operator: Option<String>,
}

/// The tag of an image reference (`repo:tag` or `repo@digest` → None).
pub fn image_tag(image: &str) -> Option<String> {
    if image.contains('@') {
        return None;
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    last.split_once(':').map(|(_, t)| t.to_string())
}

/// `(major, minor)` of `v1.2.3` / `1.2.3`.
pub fn major_minor(v: &str) -> Option<(u64, u64)> {
    let v = v.trim_start_matches('v');
    let mut it = v.split('.');
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// The skew warning, when both versions parse and their minor versions differ.
pub fn skew_warning(client: &str, operator: &str) -> Option<String> {
    let (c, o) = (major_minor(client)?, major_minor(operator)?);
    (c != o).then(|| {
        format!("warning: kubectl-cocoon {client} and cocoon-operator {operator} differ in minor version; some verbs may not behave as documented")
    })
}

pub async fn operator_version(client: &Client) -> Result<Option<String>, kube::Error> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let Some(d) = api.get_opt(OPERATOR_DEPLOYMENT).await? else {
        return Ok(None);
    };
    let image = d
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|p| p.containers.into_iter().find(|c| c.name == "manager"))
        .and_then(|c| c.image);
    Ok(image.as_deref().and_then(image_tag))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_and_skew() {
        assert_eq!(
            image_tag("ghcr.io/cocoonstack/cocoon-operator:v0.3.1").as_deref(),
            Some("v0.3.1")
        );
        assert_eq!(
            image_tag("localhost:5000/op:1.2.0").as_deref(),
            Some("1.2.0")
        );
        assert_eq!(image_tag("localhost:5000/op"), None);
        assert_eq!(image_tag("op@sha256:abc"), None);
        assert!(skew_warning("0.1.0", "v0.2.0").is_some());
        assert!(skew_warning("0.1.0", "v0.1.7").is_none());
        assert!(skew_warning("0.1.0", "latest").is_none());
    }
}
