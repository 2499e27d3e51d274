//! The install manifests are valid for the real API server: `kubectl apply -k manifests/`
//! with server-side dry run accepts every object.

#[tokio::test]
async fn kustomization_applies_on_the_real_api_server() {
    cocoon_testenv::run_test(|env| async move {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests");
        // A server-side dry run cannot place objects in a namespace that does not exist yet.
        let ns = env
            .kubectl()
            .args(["apply", "-f"])
            .arg(dir.join("operator/namespace.yaml"))
            .output()?;
        assert!(ns.status.success(), "{}", String::from_utf8_lossy(&ns.stderr));
        let out = env
            .kubectl()
            .args(["apply", "--dry-run=server", "-k"])
            .arg(&dir)
            .output()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "kubectl apply -k failed: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
        for object in [
            "customresourcedefinition.apiextensions.k8s.io/cocoonsets.cocoonset.cocoonstack.io",
            "customresourcedefinition.apiextensions.k8s.io/cocoonhibernations.cocoonset.cocoonstack.io",
            "namespace/cocoon-system",
            "serviceaccount/cocoon-operator",
            "clusterrole.rbac.authorization.k8s.io/cocoon-operator",
            "clusterrolebinding.rbac.authorization.k8s.io/cocoon-operator",
            "deployment.apps/cocoon-operator",
            "clusterrole.rbac.authorization.k8s.io/cocoon-node",
        ] {
            assert!(stdout.contains(object), "{object} missing from:\n{stdout}");
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await;
}
