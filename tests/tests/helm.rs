//! The Helm chart (charts/cocoon) with the real Helm v3 CLI (helm.sh/helm/v3, built from Go
//! modules by scripts/helm.sh, or `COCOON_HELM`): it lints; with default values it renders the
//! same objects as `kubectl kustomize manifests/` (compared as parsed objects, keyed by
//! apiVersion/kind/namespace/name, ignoring only the labels Helm adds: helm.sh/chart,
//! app.kubernetes.io/managed-by, app.kubernetes.io/instance); values show in the render; and
//! `helm install` into the test cluster creates the objects, leaves the existing CRDs alone,
//! and `helm uninstall` removes what it created.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use cocoon_e2e::{run_ok, stdout, workspace_root, workspace_version};
use cocoon_testenv::{Shared, unique_name};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use serde_json::Value;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The labels the chart adds to every object it templates, on top of manifests/.
const HELM_LABELS: [&str; 3] = [
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
];
const CRDS: [&str; 2] = [
    "cocoonsets.cocoonset.cocoonstack.io",
    "cocoonhibernations.cocoonset.cocoonstack.io",
];

fn chart() -> PathBuf {
    workspace_root().join("charts/cocoon")
}

/// The helm binary: `COCOON_HELM` when set (it must be executable), else the one
/// scripts/helm.sh builds into the cache (once) and prints.
fn helm_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("COCOON_HELM").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "COCOON_HELM={} is not a file (unset it to use scripts/helm.sh)",
            path.display()
        );
        return path;
    }
    let script = workspace_root().join("scripts/helm.sh");
    let out = Command::new(&script).output().unwrap_or_else(|e| {
        panic!(
            "cannot run {} to find helm ({e}); set COCOON_HELM to a helm v3 binary",
            script.display()
        )
    });
    assert!(
        out.status.success(),
        "{} could not provide helm (set COCOON_HELM to a helm v3 binary):\n{}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let path = PathBuf::from(stdout(&out).trim());
    assert!(
        path.is_file(),
        "helm.sh printed {}, which is not a file",
        path.display()
    );
    path
}

/// `helm` with its config, cache and data inside `home` (nothing outside it is touched).
fn helm(home: &Path) -> Command {
    let mut cmd = Command::new(helm_bin());
    cmd.env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env_remove("KUBECONFIG");
    cmd
}

/// Numbers compared as numbers: the generated CRDs write `minimum: 0.0`, which kustomize
/// re-serializes as `0`.
fn normalize(v: &mut Value) {
    match v {
        Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 1e15) {
                *v = Value::from(f as i64);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(normalize),
        Value::Object(map) => map.values_mut().for_each(normalize),
        _ => {}
    }
}

/// The objects of a YAML stream, keyed by apiVersion/kind/namespace/name, with Helm's labels
/// removed (and a labels map left empty by that removed too).
fn objects(yaml: &str) -> BTreeMap<String, Value> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(yaml).expect("a YAML stream");
    let mut out = BTreeMap::new();
    for mut doc in docs {
        normalize(&mut doc);
        if let Some(meta) = doc.get_mut("metadata").and_then(Value::as_object_mut)
            && let Some(labels) = meta.get_mut("labels").and_then(Value::as_object_mut)
        {
            for l in HELM_LABELS {
                labels.remove(l);
            }
            if labels.is_empty() {
                meta.remove("labels");
            }
        }
        let field = |v: &Value, path: &[&str]| {
            path.iter()
                .try_fold(v, |v, k| v.get(*k))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let key = format!(
            "{}/{}/{}/{}",
            field(&doc, &["apiVersion"]),
            field(&doc, &["kind"]),
            field(&doc, &["metadata", "namespace"]),
            field(&doc, &["metadata", "name"]),
        );
        assert!(out.insert(key.clone(), doc).is_none(), "{key} twice");
    }
    out
}

fn render(home: &Path, args: &[&str]) -> BTreeMap<String, Value> {
    let out = run_ok(
        helm(home)
            .args(["template", "cocoon"])
            .arg(chart())
            .args(args),
    );
    objects(&stdout(&out))
}

fn deployment(objs: &BTreeMap<String, Value>, ns: &str, name: &str) -> Value {
    objs.get(&format!("apps/v1/Deployment/{ns}/{name}"))
        .unwrap_or_else(|| panic!("no Deployment {ns}/{name} in {:?}", objs.keys()))
        .clone()
}

fn env_of(deploy: &Value) -> BTreeMap<String, Value> {
    deploy["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .expect("env")
        .iter()
        .map(|e| (e["name"].as_str().unwrap().to_string(), e.clone()))
        .collect()
}

#[test]
fn helm_lint_passes() {
    let home = tempfile::tempdir().unwrap();
    let out = run_ok(helm(home.path()).args(["lint", "--strict"]).arg(chart()));
    assert!(
        stdout(&out).contains("1 chart(s) linted, 0 chart(s) failed"),
        "{}",
        stdout(&out)
    );
}

/// Chart.yaml's version and appVersion are the workspace version, and the chart's crds/ are
/// byte for byte manifests/crds (the generated CRDs).
#[test]
fn chart_follows_the_workspace_version_and_crds() {
    let text = std::fs::read_to_string(chart().join("Chart.yaml")).unwrap();
    let meta: Value = serde_saphyr::from_str(&text).unwrap();
    assert_eq!(meta["version"], workspace_version());
    assert_eq!(meta["appVersion"], workspace_version());
    let crds = workspace_root().join("manifests/crds");
    let mut names = Vec::new();
    for f in std::fs::read_dir(&crds).unwrap() {
        let name = f.unwrap().file_name();
        let shipped = std::fs::read(crds.join(&name)).unwrap();
        let in_chart = std::fs::read(chart().join("crds").join(&name)).unwrap_or_default();
        assert!(
            shipped == in_chart,
            "charts/cocoon/crds/{} differs from manifests/crds (copy it over)",
            name.to_string_lossy()
        );
        names.push(name);
    }
    assert_eq!(
        std::fs::read_dir(chart().join("crds")).unwrap().count(),
        names.len(),
        "charts/cocoon/crds holds exactly manifests/crds"
    );
}

#[tokio::test]
async fn default_render_is_the_kustomization() {
    cocoon_testenv::run_test(|env| async move {
        let home = tempfile::tempdir()?;
        let kustomized = run_ok(
            env.kubectl()
                .arg("kustomize")
                .arg(workspace_root().join("manifests")),
        );
        let want = objects(&stdout(&kustomized));
        let got = render(home.path(), &["--include-crds"]);
        assert_eq!(
            got.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>(),
            "the same objects"
        );
        for (key, obj) in &want {
            assert!(
                &got[key] == obj,
                "{key} differs:\n--- helm template\n{:#}\n--- kubectl kustomize\n{obj:#}",
                got[key]
            );
        }
        // The CRDs come from crds/ (installed before the templates, never upgraded or deleted).
        let without = render(home.path(), &[]);
        assert!(
            without
                .keys()
                .all(|k| !k.contains("CustomResourceDefinition"))
        );
        Ok::<_, BoxError>(())
    })
    .await;
}

/// The same comparison with the optional monitoring objects on: the chart's ServiceMonitor,
/// PrometheusRule and dashboard ConfigMap are those of manifests/components/monitoring
/// (tests/monitoring-overlay puts it on top of manifests/); and the metrics Service goes with
/// `metrics.service.enabled=false`.
#[tokio::test]
async fn monitoring_render_is_the_monitoring_component() {
    cocoon_testenv::run_test(|env| async move {
        let home = tempfile::tempdir()?;
        let kustomized = run_ok(
            env.kubectl()
                .arg("kustomize")
                .arg(workspace_root().join("tests/monitoring-overlay")),
        );
        let want = objects(&stdout(&kustomized));
        let got = render(
            home.path(),
            &[
                "--include-crds",
                "--set",
                "metrics.serviceMonitor.enabled=true,metrics.prometheusRule.enabled=true",
                "--set",
                "metrics.dashboard.enabled=true",
            ],
        );
        assert_eq!(
            got.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>(),
            "the same objects"
        );
        for (key, obj) in &want {
            assert!(
                &got[key] == obj,
                "{key} differs:\n--- helm template\n{:#}\n--- kubectl kustomize\n{obj:#}",
                got[key]
            );
        }
        let service = "v1/Service/cocoon-system/cocoon-operator-metrics";
        assert!(want.contains_key(service), "{:?}", want.keys());
        let without = render(home.path(), &["--set", "metrics.service.enabled=false"]);
        assert!(!without.contains_key(service));
        Ok::<_, BoxError>(())
    })
    .await;
}

/// The same comparison with the user roles kept out of the built-in roles: the chart with
/// `userRoles.aggregate=false` is manifests/components/no-role-aggregation on top of manifests/
/// (tests/no-role-aggregation-overlay); the default render labels them into view, edit and
/// admin; `userRoles.create=false` leaves them out.
#[tokio::test]
async fn unaggregated_render_is_the_no_role_aggregation_component() {
    cocoon_testenv::run_test(|env| async move {
        let home = tempfile::tempdir()?;
        let kustomized = run_ok(
            env.kubectl()
                .arg("kustomize")
                .arg(workspace_root().join("tests/no-role-aggregation-overlay")),
        );
        let want = objects(&stdout(&kustomized));
        let got = render(
            home.path(),
            &["--include-crds", "--set", "userRoles.aggregate=false"],
        );
        assert_eq!(
            got.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>(),
            "the same objects"
        );
        for (key, obj) in &want {
            assert!(
                &got[key] == obj,
                "{key} differs:\n--- helm template\n{:#}\n--- kubectl kustomize\n{obj:#}",
                got[key]
            );
        }
        let role = |objs: &BTreeMap<String, Value>, name: &str| {
            objs[&format!("rbac.authorization.k8s.io/v1/ClusterRole//{name}")].clone()
        };
        for name in ["cocoon-view", "cocoon-edit"] {
            let labels = &role(&want, name)["metadata"]["labels"];
            assert!(
                labels
                    .as_object()
                    .is_none_or(|m| m.keys().all(|k| !k.contains("aggregate-to-"))),
                "{name} unaggregated: {labels}"
            );
        }
        let default = render(home.path(), &[]);
        assert_eq!(
            role(&default, "cocoon-view")["metadata"]["labels"]
                ["rbac.authorization.k8s.io/aggregate-to-view"],
            "true"
        );
        for to in ["edit", "admin"] {
            assert_eq!(
                role(&default, "cocoon-edit")["metadata"]["labels"]
                    [format!("rbac.authorization.k8s.io/aggregate-to-{to}")],
                "true",
                "cocoon-edit aggregated to {to}"
            );
        }
        let without = render(home.path(), &["--set", "userRoles.create=false"]);
        assert!(
            without
                .keys()
                .all(|k| !k.ends_with("/cocoon-view") && !k.ends_with("/cocoon-edit")),
            "{:?}",
            without.keys()
        );
        Ok::<_, BoxError>(())
    })
    .await;
}

#[test]
fn values_show_in_the_render() {
    let home = tempfile::tempdir().unwrap();
    let objs = render(
        home.path(),
        &[
            "--set",
            "replicas=3,image.repository=mirror.example.com/cocoon/operator,image.tag=v9.9.9",
            "--set",
            "image.pullPolicy=Always,namespace.name=ops,namePrefix=blue-",
            "--set",
            "concurrency.cocoonset=32,concurrency.hibernation=2,watchNamespace=tenants",
            "--set",
            "registry.base=reg.lan:5000/vms,registry.insecure=reg.lan:5000,registry.credentialsSecret=reg-creds",
            "--set",
            "leaderElection.leaseDuration=30s,leaderElection.renewDeadline=20s,leaderElection.retryPeriod=4s",
            "--set",
            "timeouts.suspend=5m,logging.format=json,resources.limits.memory=1Gi",
            "--set",
            "nodeAdmission.serviceAccountNamespace=hosts",
            "--set",
            "admissionPolicies.podCreators={system:serviceaccount:tools:importer,alice@example.com}",
            "--set",
            "admissionPolicies.validationActions={Warn,Audit}",
            "--set",
            "admissionPolicies.namespaceSelector.matchLabels.tenant=yes",
        ],
    );
    let d = deployment(&objs, "ops", "blue-cocoon-operator");
    assert_eq!(d["spec"]["replicas"], 3);
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "blue-cocoon-operator");
    let c = &pod["containers"][0];
    assert_eq!(c["image"], "mirror.example.com/cocoon/operator:v9.9.9");
    assert_eq!(c["imagePullPolicy"], "Always");
    assert_eq!(c["resources"]["limits"]["memory"], "1Gi");
    let env = env_of(&d);
    for (name, value) in [
        ("OCI_REGISTRY", "reg.lan:5000/vms"),
        ("OCI_REGISTRY_INSECURE", "reg.lan:5000"),
        ("COCOONSET_CONCURRENCY", "32"),
        ("HIBERNATION_CONCURRENCY", "2"),
        ("WATCH_NAMESPACE", "tenants"),
        ("LEADER_ELECT_LEASE_DURATION", "30s"),
        ("LEADER_ELECT_RENEW_DEADLINE", "20s"),
        ("LEADER_ELECT_RETRY_PERIOD", "4s"),
        ("COCOON_SUSPEND_TIMEOUT", "5m"),
        ("OPERATOR_LOG_FORMAT", "json"),
    ] {
        assert_eq!(
            env.get(name).map(|e| &e["value"]),
            Some(&Value::from(value)),
            "{name}"
        );
    }
    assert_eq!(
        env["OCI_REGISTRY_PASSWORD"]["valueFrom"]["secretKeyRef"],
        serde_json::json!({"name": "reg-creds", "key": "password", "optional": true})
    );
    // Settings left empty stay the binary's defaults: not in the environment at all.
    assert!(!env.contains_key("COCOON_WAKE_TIMEOUT"));
    // Every namespaced object is in `ops`, every name carries the prefix, and the bindings name
    // the prefixed ServiceAccount there.
    for key in [
        "v1/Namespace//ops",
        "v1/ServiceAccount/ops/blue-cocoon-operator",
        "rbac.authorization.k8s.io/v1/ClusterRole//blue-cocoon-operator",
        "rbac.authorization.k8s.io/v1/ClusterRoleBinding//blue-cocoon-operator",
        "rbac.authorization.k8s.io/v1/Role/ops/blue-cocoon-operator-leader-election",
        "rbac.authorization.k8s.io/v1/RoleBinding/ops/blue-cocoon-operator-leader-election",
        "rbac.authorization.k8s.io/v1/ClusterRole//blue-cocoon-node",
        "rbac.authorization.k8s.io/v1/ClusterRole//blue-cocoon-view",
        "rbac.authorization.k8s.io/v1/ClusterRole//blue-cocoon-edit",
        "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy//blue-cocoon-node-pods",
        "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicyBinding//blue-cocoon-node-pods",
        "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy//blue-cocoon-node-self",
        "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicyBinding//blue-cocoon-node-self",
        "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy//blue-cocoon-hibernation-name",
        "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicyBinding//blue-cocoon-hibernation-name",
        "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy//blue-cocoon-pod-owner",
        "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicyBinding//blue-cocoon-pod-owner",
        "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy//blue-cocoon-set-spec",
        "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicyBinding//blue-cocoon-set-spec",
    ] {
        assert!(
            objs.contains_key(key),
            "{key} missing from {:?}",
            objs.keys()
        );
    }
    let crb = &objs["rbac.authorization.k8s.io/v1/ClusterRoleBinding//blue-cocoon-operator"];
    assert_eq!(crb["roleRef"]["name"], "blue-cocoon-operator");
    assert_eq!(
        crb["subjects"][0],
        serde_json::json!({"kind": "ServiceAccount", "name": "blue-cocoon-operator", "namespace": "ops"})
    );
    // The node policies bind their own (prefixed) names and hold the ServiceAccounts of the
    // configured namespace.
    for which in ["pods", "self"] {
        let binding = &objs[&format!(
            "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicyBinding//blue-cocoon-node-{which}"
        )];
        assert_eq!(
            binding["spec"]["policyName"],
            format!("blue-cocoon-node-{which}")
        );
        let policy = &objs[&format!(
            "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy//blue-cocoon-node-{which}"
        )];
        let cond = policy["spec"]["matchConditions"][0]["expression"]
            .as_str()
            .unwrap_or_default();
        assert!(
            cond.contains("'system:serviceaccount:hosts:'"),
            "{which}: {cond}"
        );
    }
    // The webhook-rule policies: the bindings name their own (prefixed) policies with the
    // configured actions and namespace selector; the allowed pod creators are the prefixed
    // operator ServiceAccount in `ops` and then podCreators.
    for which in ["hibernation-name", "pod-owner", "set-spec"] {
        let binding = &objs[&format!(
            "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicyBinding//blue-cocoon-{which}"
        )];
        assert_eq!(
            binding["spec"]["policyName"],
            format!("blue-cocoon-{which}")
        );
        assert_eq!(
            binding["spec"]["validationActions"],
            serde_json::json!(["Warn", "Audit"])
        );
        assert_eq!(
            binding["spec"]["matchResources"],
            serde_json::json!({"namespaceSelector": {"matchLabels": {"tenant": "yes"}}})
        );
    }
    let owner =
        &objs["admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy//blue-cocoon-pod-owner"];
    assert_eq!(owner["spec"]["variables"][0]["name"], "allowedCreators");
    assert_eq!(
        owner["spec"]["variables"][0]["expression"],
        r#"["system:serviceaccount:ops:blue-cocoon-operator", "system:serviceaccount:tools:importer", "alice@example.com"]"#
    );
    // The metrics Service is on by default and follows namePrefix and namespace.name.
    assert!(objs.contains_key("v1/Service/ops/blue-cocoon-operator-metrics"));
    assert_eq!(objs.len(), 21, "{:?}", objs.keys());

    // An empty namespace.name means the release namespace; namespace.create=false leaves the
    // Namespace out; nodeRole.create=false the node ClusterRole.
    let objs = render(
        home.path(),
        &[
            "--namespace",
            "from-release",
            "--set",
            "namespace.name=,namespace.create=false,nodeRole.create=false,nodeAdmission.create=false",
            "--set",
            "admissionPolicies.create=false,userRoles.create=false",
        ],
    );
    assert!(objs.contains_key("apps/v1/Deployment/from-release/cocoon-operator"));
    assert!(objs.keys().all(|k| !k.starts_with("v1/Namespace/")));
    assert!(objs.keys().all(|k| !k.contains("/cocoon-node")));
    assert!(
        objs.keys()
            .all(|k| !k.ends_with("/cocoon-view") && !k.ends_with("/cocoon-edit"))
    );
    assert!(
        objs.keys()
            .all(|k| !k.contains("ValidatingAdmissionPolicy"))
    );
    // The operator ServiceAccount allowed to create cocoon pods is the release namespace's.
    let objs = render(
        home.path(),
        &["--namespace", "from-release", "--set", "namespace.name="],
    );
    assert_eq!(
        objs["admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy//cocoon-pod-owner"]["spec"]
            ["variables"][0]["expression"],
        r#"["system:serviceaccount:from-release:cocoon-operator"]"#
    );
}

#[test]
fn bad_values_are_refused_naming_the_value() {
    let home = tempfile::tempdir().unwrap();
    for (set, named) in [
        ("registry.base=", "registry.base (OCI_REGISTRY) must be set"),
        (
            "leaderElection.enabled=false",
            "replicas: more than one replica needs leaderElection.enabled",
        ),
        (
            "registry.caSecret=a,registry.caConfigMap=b",
            "registry.caSecret and registry.caConfigMap",
        ),
    ] {
        let out = helm(home.path())
            .args(["template", "cocoon"])
            .arg(chart())
            .args(["--set", set])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{set} rendered");
        assert!(err.contains(named), "{set}: {err}");
    }
    // One replica without leader election is fine.
    let objs = render(
        home.path(),
        &["--set", "leaderElection.enabled=false,replicas=1"],
    );
    let d = deployment(&objs, "cocoon-system", "cocoon-operator");
    assert_eq!(
        d["spec"]["template"]["spec"]["containers"][0]["args"][3],
        "--leader-elect=false"
    );
}

/// `helm install` into the test cluster: a release of its own (unique name, namespace and
/// name prefix, so nothing collides with the objects other tests apply from manifests/), the
/// Deployment scaled to zero (no operator pod may act on other tests' resources). The CRDs
/// exist already (the test environment installs them): Helm must leave them as they are, on
/// install and on uninstall. The webhook-rule policies are bound only to namespaces with a label
/// no namespace has (they would otherwise refuse what other tests create).
#[tokio::test]
async fn helm_install_creates_the_objects_and_uninstall_removes_them() {
    cocoon_testenv::run_test(|env: &'static Shared| async move {
        let client = env.client()?;
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        let mut before = Vec::new();
        for name in CRDS {
            let crd = crds.get(name).await?;
            before.push((
                crd.metadata.uid.clone(),
                crd.metadata.resource_version.clone(),
            ));
        }

        let ns = unique_name("helm");
        let release = ns.clone();
        let prefix = format!("{ns}-");
        let operator = format!("{prefix}cocoon-operator");
        let node_role = format!("{prefix}cocoon-node");
        let home = tempfile::tempdir()?;
        let kubeconfig = env.kubeconfig_path().to_path_buf();
        let helm_cmd = {
            let home = home.path().to_path_buf();
            move |args: Vec<String>| {
                let mut cmd = helm(&home);
                cmd.arg("--kubeconfig").arg(&kubeconfig).args(args);
                cmd
            }
        };
        let install = helm_cmd(vec![
            "install".into(),
            release.clone(),
            chart().to_string_lossy().into_owned(),
            "--namespace".into(),
            "default".into(),
            "--set".into(),
            format!("namespace.name={ns},namePrefix={prefix},replicas=0"),
            "--set".into(),
            format!("admissionPolicies.namespaceSelector.matchLabels.cocoon-helm-test={ns}"),
            "--wait".into(),
            "--timeout".into(),
            "2m".into(),
        ]);
        let out = tokio::task::spawn_blocking(move || run_ok(&mut { install })).await?;
        assert!(
            stdout(&out).contains("STATUS: deployed"),
            "{}",
            stdout(&out)
        );

        let deploy = Api::<Deployment>::namespaced(client.clone(), &ns)
            .get(&operator)
            .await?;
        assert_eq!(deploy.spec.as_ref().and_then(|s| s.replicas), Some(0));
        let labels = deploy.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels
                .get("app.kubernetes.io/managed-by")
                .map(String::as_str),
            Some("Helm")
        );
        Api::<Namespace>::all(client.clone()).get(&ns).await?;
        Api::<ServiceAccount>::namespaced(client.clone(), &ns)
            .get(&operator)
            .await?;
        Api::<Role>::namespaced(client.clone(), &ns)
            .get(&format!("{operator}-leader-election"))
            .await?;
        Api::<RoleBinding>::namespaced(client.clone(), &ns)
            .get(&format!("{operator}-leader-election"))
            .await?;
        let roles: Api<ClusterRole> = Api::all(client.clone());
        roles.get(&operator).await?;
        roles.get(&node_role).await?;
        let user_roles = [
            format!("{prefix}cocoon-view"),
            format!("{prefix}cocoon-edit"),
        ];
        for name in &user_roles {
            roles.get(name).await?;
        }
        let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
        let policy_bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
        let node_policies = [
            format!("{node_role}-pods"),
            format!("{node_role}-self"),
            format!("{prefix}cocoon-hibernation-name"),
            format!("{prefix}cocoon-pod-owner"),
            format!("{prefix}cocoon-set-spec"),
        ];
        for name in &node_policies {
            policies.get(name).await?;
            policy_bindings.get(name).await?;
        }
        let binding = Api::<ClusterRoleBinding>::all(client.clone())
            .get(&operator)
            .await?;
        let subject = &binding.subjects.as_ref().expect("subjects")[0];
        assert_eq!(
            (subject.name.as_str(), subject.namespace.as_deref()),
            (operator.as_str(), Some(ns.as_str()))
        );
        for (name, was) in CRDS.iter().zip(&before) {
            let crd = crds.get(name).await?;
            assert_eq!(
                &(
                    crd.metadata.uid.clone(),
                    crd.metadata.resource_version.clone()
                ),
                was,
                "helm install left CRD {name} as it was"
            );
        }

        let uninstall = helm_cmd(vec![
            "uninstall".into(),
            release.clone(),
            "--namespace".into(),
            "default".into(),
            "--wait".into(),
            "--timeout".into(),
            "2m".into(),
        ]);
        tokio::task::spawn_blocking(move || run_ok(&mut { uninstall })).await?;
        for name in [&operator, &node_role].into_iter().chain(&user_roles) {
            assert!(
                roles.get_opt(name).await?.is_none(),
                "ClusterRole {name} left behind"
            );
        }
        for name in &node_policies {
            assert!(
                policies.get_opt(name).await?.is_none()
                    && policy_bindings.get_opt(name).await?.is_none(),
                "admission policy {name} left behind"
            );
        }
        assert!(
            Api::<ClusterRoleBinding>::all(client.clone())
                .get_opt(&operator)
                .await?
                .is_none()
        );
        // The Namespace is the release's: deleted (it may take a moment to finish).
        cocoon_testenv::wait_until(
            &format!("namespace {ns} deleted or terminating"),
            Duration::from_secs(60),
            || async {
                match Api::<Namespace>::all(client.clone()).get_opt(&ns).await {
                    Ok(None) => Some(()),
                    Ok(Some(n)) => n.metadata.deletion_timestamp.map(|_| ()),
                    Err(_) => None,
                }
            },
        )
        .await?;
        for (name, was) in CRDS.iter().zip(&before) {
            let crd = crds.get(name).await?;
            assert_eq!(
                &(
                    crd.metadata.uid.clone(),
                    crd.metadata.resource_version.clone()
                ),
                was,
                "helm uninstall left CRD {name} as it was"
            );
        }
        Ok::<_, BoxError>(())
    })
    .await;
}
