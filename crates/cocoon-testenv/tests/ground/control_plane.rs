//! The control plane is up: version, namespaces, CRDs, and the upstream kubectl works.

use std::time::Duration;

use cocoon_testenv::{crds, create_namespace, delete_namespace, paths, run_test};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;

#[tokio::test]
async fn apiserver_reports_pinned_version_and_creates_namespaces() {
    run_test(|env| async move {
        let client = env.client()?;
        let version = client.apiserver_version().await?;
        anyhow::ensure!(
            version.git_version == paths::k8s_version(),
            "gitVersion {} != pin {}",
            version.git_version,
            paths::k8s_version()
        );

        let ns = create_namespace(&client, "cp").await?;
        let got = Api::<Namespace>::all(client.clone()).get(&ns).await?;
        anyhow::ensure!(got.metadata.name.as_deref() == Some(ns.as_str()));
        delete_namespace(&client, &ns).await?;
        Ok::<_, anyhow::Error>(())
    })
    .await;
}

#[tokio::test]
async fn cocoon_crds_are_established_and_reinstall_is_idempotent() {
    run_test(|env| async move {
        let client = env.client()?;
        let api: Api<CustomResourceDefinition> = Api::all(client.clone());
        for name in [
            "cocoonsets.cocoonset.cocoonstack.io",
            "cocoonhibernations.cocoonset.cocoonstack.io",
            "cocooncheckpoints.cocoonset.cocoonstack.io",
        ] {
            let crd = api.get(name).await?;
            anyhow::ensure!(crds::is_established(&crd), "{name} is not Established");
        }
        // Server-side apply: installing again into the running env must just work.
        let names = crds::install(&client, Duration::from_secs(30)).await?;
        anyhow::ensure!(names.len() >= 3, "installed {names:?}");
        Ok::<_, anyhow::Error>(())
    })
    .await;
}

#[tokio::test]
async fn upstream_kubectl_talks_to_the_env() {
    run_test(|env| async move {
        let out = tokio::process::Command::from(env.kubectl())
            .args(["get", "crd", "-o", "name"])
            .output()
            .await?;
        anyhow::ensure!(
            out.status.success(),
            "kubectl failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        anyhow::ensure!(
            stdout.contains("cocoonsets.cocoonset.cocoonstack.io"),
            "kubectl output: {stdout}"
        );
        Ok::<_, anyhow::Error>(())
    })
    .await;
}
