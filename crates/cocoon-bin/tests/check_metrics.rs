//! `cocoon-operator check-metrics` (the chart's `helm test`) against the real `cocoon-operator
//! run` binary with secured metrics (the default), on the real control plane: the check runs
//! as a ServiceAccount with the hook's Role, presents that ServiceAccount's token, fails with
//! the operator's 403 (naming the role to bind) until `cocoon-metrics-reader` is bound to it,
//! then passes. The metrics Service selects a pod object whose status the test sets Ready at
//! 127.0.0.1 (no kubelet here), so the check's fetch reaches the operator's listener.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use cocoon_testenv::{TestNode, unique_name};
use k8s_openapi::api::core::v1::{Pod, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const BIN: &str = env!("CARGO_BIN_EXE_cocoon-operator");

/// The rules of the shipped ClusterRole `cocoon-metrics-reader` (manifests/operator/rbac.yaml).
fn shipped_reader_rules() -> Result<Value, BoxError> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../manifests/operator/rbac.yaml");
    for doc in std::fs::read_to_string(path)?.split("\n---\n") {
        let v: Value = serde_saphyr::from_str(doc)?;
        if v["kind"] == "ClusterRole" && v["metadata"]["name"] == "cocoon-metrics-reader" {
            return Ok(v["rules"].clone());
        }
    }
    Err("no ClusterRole cocoon-metrics-reader in manifests/operator/rbac.yaml".into())
}

/// Runs the check as the kubeconfig's user; (exit success, stdout + stderr).
async fn check(kubeconfig: &Path, ns: &str, service: &str) -> Result<(bool, String), BoxError> {
    let out = tokio::process::Command::new(BIN)
        .args([
            "check-metrics",
            "--service",
            service,
            "--namespace",
            ns,
            "--timeout",
            "6s",
        ])
        .env("KUBECONFIG", kubeconfig)
        .stdin(Stdio::null())
        .output()
        .await?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((out.status.success(), text))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_presents_its_token_and_needs_the_metrics_reader_role() {
    cocoon_testenv::run_test(|env| async move {
        let admin = env.client()?;
        let ns = cocoon_testenv::create_namespace(&admin, "check-metrics").await?;
        let port = cocoon_testenv::free_ports(1)?[0];
        // The real operator, metrics secured by default, reviewing as the admin.
        let mut operator = tokio::process::Command::new(BIN)
            .arg("run")
            .env("KUBECONFIG", env.kubeconfig_path())
            .env("OCI_REGISTRY", env.registry_addr())
            .env("POD_NAMESPACE", &ns)
            .env("WATCH_NAMESPACE", &ns)
            .env("METRICS_ADDR", format!("127.0.0.1:{port}"))
            .env("PROBE_ADDR", "127.0.0.1:0")
            .env("LEADER_ELECT", "false")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;

        // The metrics Service and the "operator pod" it selects, Ready at 127.0.0.1.
        let node = unique_name("check-node");
        let _node = TestNode::in_pool(&admin, &node, &unique_name("pool")).await?;
        let services: Api<Service> = Api::namespaced(admin.clone(), &ns);
        services
            .create(&PostParams::default(), &serde_json::from_value(json!({
                "metadata": {"name": "op-metrics"},
                "spec": {"selector": {"app": "op"}, "ports": [{"name": "metrics", "port": 8080, "targetPort": "metrics"}]}
            }))?)
            .await?;
        let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns);
        pods.create(&PostParams::default(), &serde_json::from_value(json!({
            "metadata": {"name": "op-0", "labels": {"app": "op"}},
            "spec": {"nodeName": node, "containers": [{"name": "manager", "image": "x",
                "ports": [{"name": "metrics", "containerPort": port}]}]}
        }))?)
        .await?;
        pods.patch_status("op-0", &PatchParams::default(), &Patch::Merge(json!({"status": {
            "phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
            "conditions": [{"type": "Ready", "status": "True"}]
        }})))
        .await?;

        // The hook's ServiceAccount and Role (templates/tests/metrics.yaml), nothing more yet.
        let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), &ns);
        sas.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "hook"}}))?).await?;
        let role: Role = serde_json::from_value(json!({
            "metadata": {"name": "hook"},
            "rules": [
                {"apiGroups": [""], "resources": ["services"], "resourceNames": ["op-metrics"], "verbs": ["get"]},
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}
            ]
        }))?;
        Api::<Role>::namespaced(admin.clone(), &ns).create(&PostParams::default(), &role).await?;
        let rb: RoleBinding = serde_json::from_value(json!({
            "metadata": {"name": "hook"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "hook"},
            "subjects": [{"kind": "ServiceAccount", "name": "hook", "namespace": ns}]
        }))?;
        Api::<RoleBinding>::namespaced(admin.clone(), &ns).create(&PostParams::default(), &rb).await?;
        let dir = tempfile::tempdir()?;
        let kubeconfig = env.service_account_kubeconfig(&ns, "hook", "1h", dir.path())?;

        // Its token is reviewed, but its user may not get /metrics: the check fails naming why.
        let (ok, out) = cocoon_testenv::wait_until("the check reaches the operator", Duration::from_secs(60), || async {
            let (ok, out) = check(&kubeconfig, &ns, "op-metrics").await.ok()?;
            out.contains("HTTP 4").then_some((ok, out))
        })
        .await?;
        assert!(!ok, "{out}");
        assert!(
            out.contains("127.0.0.1") && out.contains("HTTP 403")
                && out.contains(&format!("user=system:serviceaccount:{ns}:hook"))
                && out.contains("cocoon-metrics-reader"),
            "{out}"
        );

        // With the shipped reader role bound to it, the check passes on the build info.
        let reader = format!("{ns}-metrics-reader");
        let cr: ClusterRole = serde_json::from_value(json!({"metadata": {"name": reader}, "rules": shipped_reader_rules()?}))?;
        let roles: Api<ClusterRole> = Api::all(admin.clone());
        roles.create(&PostParams::default(), &cr).await?;
        let crb: ClusterRoleBinding = serde_json::from_value(json!({
            "metadata": {"name": reader},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": reader},
            "subjects": [{"kind": "ServiceAccount", "name": "hook", "namespace": ns}]
        }))?;
        let bindings: Api<ClusterRoleBinding> = Api::all(admin.clone());
        bindings.create(&PostParams::default(), &crb).await?;
        // A denial is cached for 30 s: the check retries within its own --timeout until then.
        let out = cocoon_testenv::wait_until("the check passes", Duration::from_secs(90), || async {
            let (ok, out) = check(&kubeconfig, &ns, "op-metrics").await.ok()?;
            ok.then_some(out)
        })
        .await?;
        assert!(out.contains("1 ready pods answer") && out.contains("cocoon_operator_build_info"), "{out}");

        let _ = bindings.delete(&reader, &DeleteParams::default()).await;
        let _ = roles.delete(&reader, &DeleteParams::default()).await;
        let _ = operator.start_kill();
        let _ = operator.wait().await;
        cocoon_testenv::delete_namespace(&admin, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}
