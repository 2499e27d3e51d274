//! Kubeconfig files per identity (absolute paths to the generated PKI), and loading them back
//! into a kube client configuration through kube's own kubeconfig loader.

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::error::{Error, Result};
use crate::pki::{IDENTITIES, Pki};

/// A YAML double-quoted scalar (JSON string syntax is valid YAML).
pub(crate) fn quote(p: &Path) -> Result<String> {
    serde_json::to_string(&p.to_string_lossy()).map_err(|e| Error::Invalid {
        what: "path".into(),
        detail: e.to_string(),
    })
}

/// Writes `<stem>.kubeconfig` for every identity, with absolute paths.
pub(crate) fn write_kubeconfigs(run_dir: &Path, pki: &Pki, port: u16) -> Result<()> {
    for id in IDENTITIES {
        let yaml = format!(
            "apiVersion: v1
kind: Config
clusters:
- name: testenv
  cluster:
    server: https://127.0.0.1:{port}
    certificate-authority: {ca}
users:
- name: {user}
  user:
    client-certificate: {cert}
    client-key: {key}
contexts:
- name: testenv
  context:
    cluster: testenv
    user: {user}
current-context: testenv
",
            ca = quote(&pki.ca_cert())?,
            user = id.stem,
            cert = quote(&pki.cert(id.stem))?,
            key = quote(&pki.key(id.stem))?,
        );
        let path = run_dir.join(format!("{}.kubeconfig", id.stem));
        std::fs::write(&path, yaml)
            .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
    }
    Ok(())
}

/// Builds a client configuration from a kubeconfig file via kube's own loader.
pub(crate) async fn load_kubeconfig(path: &Path) -> Result<kube::Config> {
    let kubeconfig = Kubeconfig::read_from(path)?;
    Ok(kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?)
}

/// A client that authenticates as the kubeconfig at `path` says (a ServiceAccount token, a
/// node's certificate, …).
pub async fn client_for(path: &Path) -> Result<kube::Client> {
    Ok(kube::Client::try_from(load_kubeconfig(path).await?)?)
}
