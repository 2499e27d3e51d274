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
            "customresourcedefinition.apiextensions.k8s.io/cocooncheckpoints.cocoonset.cocoonstack.io",
            "namespace/cocoon-system",
            "serviceaccount/cocoon-operator",
            "clusterrole.rbac.authorization.k8s.io/cocoon-operator",
            "clusterrolebinding.rbac.authorization.k8s.io/cocoon-operator",
            "deployment.apps/cocoon-operator",
            "poddisruptionbudget.policy/cocoon-operator",
            "clusterrole.rbac.authorization.k8s.io/cocoon-node",
            "clusterrole.rbac.authorization.k8s.io/cocoon-view",
            "clusterrole.rbac.authorization.k8s.io/cocoon-edit",
            "validatingadmissionpolicy.admissionregistration.k8s.io/cocoon-node-pods",
            "validatingadmissionpolicybinding.admissionregistration.k8s.io/cocoon-node-pods",
            "validatingadmissionpolicy.admissionregistration.k8s.io/cocoon-node-self",
            "validatingadmissionpolicybinding.admissionregistration.k8s.io/cocoon-node-self",
            "validatingadmissionpolicy.admissionregistration.k8s.io/cocoon-hibernation-name",
            "validatingadmissionpolicybinding.admissionregistration.k8s.io/cocoon-hibernation-name",
            "validatingadmissionpolicy.admissionregistration.k8s.io/cocoon-pod-owner",
            "validatingadmissionpolicybinding.admissionregistration.k8s.io/cocoon-pod-owner",
            "validatingadmissionpolicy.admissionregistration.k8s.io/cocoon-set-spec",
            "validatingadmissionpolicybinding.admissionregistration.k8s.io/cocoon-set-spec",
        ] {
            assert!(stdout.contains(object), "{object} missing from:\n{stdout}");
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await;
}

/// The Deployment names this project's image at the workspace version, and the kustomization's
/// `images:` entry (what `kustomize edit set image` rewrites for a mirror) matches it: pointing
/// the entry at a mirror changes the rendered Deployment's image.
#[tokio::test]
async fn images_entry_retargets_the_operator_image() {
    cocoon_testenv::run_test(|env| async move {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests");
        let shipped = format!(
            "ghcr.io/cocoonstack/cocoon-operator-rs:v{}",
            env!("CARGO_PKG_VERSION")
        );
        let image_of = |dir: &std::path::Path| -> Result<String, Box<dyn std::error::Error>> {
            let out = env.kubectl().arg("kustomize").arg(dir).output()?;
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let text = String::from_utf8(out.stdout)?;
            let images: Vec<&str> = text
                .lines()
                .filter_map(|l| l.trim().strip_prefix("image: "))
                .collect();
            assert_eq!(images.len(), 1, "one container image in:\n{text}");
            Ok(images[0].to_string())
        };
        assert_eq!(image_of(&src)?, shipped);

        // A mirror: the same entry with another name and tag, as `kustomize edit set image`
        // leaves it.
        let tmp = tempfile::tempdir()?;
        for sub in ["crds", "operator", "node", "users", "admission"] {
            std::fs::create_dir_all(tmp.path().join(sub))?;
            for f in std::fs::read_dir(src.join(sub))? {
                let f = f?;
                std::fs::copy(f.path(), tmp.path().join(sub).join(f.file_name()))?;
            }
        }
        let kustomization = std::fs::read_to_string(src.join("kustomization.yaml"))?;
        let mirrored = kustomization
            .replace(
                "  newName: ghcr.io/cocoonstack/cocoon-operator-rs",
                "  newName: mirror.example.com/cocoon/cocoon-operator-rs",
            )
            .replace(
                &format!("  newTag: v{}", env!("CARGO_PKG_VERSION")),
                "  newTag: v9.9.9",
            );
        assert_ne!(
            mirrored, kustomization,
            "the images: entry has newName and newTag"
        );
        std::fs::write(tmp.path().join("kustomization.yaml"), mirrored)?;
        assert_eq!(
            image_of(tmp.path())?,
            "mirror.example.com/cocoon/cocoon-operator-rs:v9.9.9"
        );
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await;
}
