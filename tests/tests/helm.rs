//! The Helm chart (charts/cocoon) with the real Helm v3 CLI (helm.sh/helm/v3, built from Go
//! modules by scripts/helm.sh, or `COCOON_HELM`): it lints; with default values it renders the
//! same objects as `kubectl kustomize manifests/` (compared as parsed objects, keyed by
//! apiVersion/kind/namespace/name, ignoring only the labels Helm adds: helm.sh/chart,
//! app.kubernetes.io/managed-by, app.kubernetes.io/instance, and the CRDs'
//! helm.sh/resource-policy annotation); values show in the render; values.schema.json covers
//! every value and refuses a mistyped one by name; and on the test cluster `helm install`
//! creates the objects, `helm upgrade` upgrades a changed CRD, and `helm uninstall` removes
//! what it created but the CRDs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use cocoon_e2e::{helm, run_ok, stdout, workspace_root, workspace_version};
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
/// The annotation the chart puts on its CRDs so that `helm uninstall` keeps them.
const KEEP: &str = "helm.sh/resource-policy";
const CRDS: [&str; 3] = [
    "cocoonsets.cocoonset.cocoonstack.io",
    "cocoonhibernations.cocoonset.cocoonstack.io",
    "cocooncheckpoints.cocoonset.cocoonstack.io",
];

fn chart() -> PathBuf {
    workspace_root().join("charts/cocoon")
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

/// `helm template cocoon charts/cocoon` for the Kubernetes version the tests run (a helm built
/// from Go modules, as scripts/helm.sh does, would otherwise assume v1.20, which Chart.yaml's
/// kubeVersion refuses; `helm install` takes the cluster's).
fn template(home: &Path) -> Command {
    let mut cmd = helm(home);
    cmd.args(["template", "cocoon"])
        .arg(chart())
        .args(["--kube-version", cocoon_testenv::paths::k8s_version()])
        .args(["--set", REGISTRY]);
    cmd
}

/// `registry.base` has no default (issue 36 item 6): every render names one, the value
/// manifests/operator/deployment.yaml holds (a later `--set` overrides it).
const REGISTRY: &str = "registry.base=registry.example.com/cocoon";

fn render(home: &Path, args: &[&str]) -> BTreeMap<String, Value> {
    let out = run_ok(template(home).args(args));
    objects(&stdout(&out))
}

/// `objs` without the CRDs' `helm.sh/resource-policy: keep` (manifests/ has no use for it), as
/// the comparison with kustomize wants them; the annotation is checked to be there first.
fn without_keep(mut objs: BTreeMap<String, Value>) -> BTreeMap<String, Value> {
    for (key, obj) in objs.iter_mut() {
        if !key.contains("/CustomResourceDefinition/") {
            continue;
        }
        let meta = obj["metadata"].as_object_mut().expect("metadata");
        let annotations = meta
            .get_mut("annotations")
            .and_then(Value::as_object_mut)
            .unwrap_or_else(|| panic!("{key} has no annotations"));
        assert_eq!(annotations.remove(KEEP), Some(Value::from("keep")), "{key}");
        if annotations.is_empty() {
            meta.remove("annotations");
        }
    }
    objs
}

/// The same objects, each the same, or a message naming the first difference.
fn assert_same_objects(got: &BTreeMap<String, Value>, want: &BTreeMap<String, Value>) {
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "the same objects"
    );
    for (key, obj) in want {
        assert!(
            &got[key] == obj,
            "{key} differs:\n--- helm template\n{:#}\n--- kubectl kustomize\n{obj:#}",
            got[key]
        );
    }
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
    let out = run_ok(
        helm(home.path())
            .args(["lint", "--strict", "--set", REGISTRY])
            .arg(chart()),
    );
    assert!(
        stdout(&out).contains("1 chart(s) linted, 0 chart(s) failed"),
        "{}",
        stdout(&out)
    );
}

/// Issue 36 item 6: the chart's defaults alone do not render: `registry.base` has no usable
/// default and is refused, by name, at template (and so install) time; `helm lint`, which
/// renders `required` values leniently, names it as missing.
#[test]
fn the_registry_must_be_named_at_install() {
    let home = tempfile::tempdir().unwrap();
    let text = |out: &std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    const NAMED: &str = "registry.base (OCI_REGISTRY) must be set";
    let out = helm(home.path())
        .args(["template", "cocoon"])
        .arg(chart())
        .args(["--kube-version", cocoon_testenv::paths::k8s_version()])
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "rendered without registry.base: {}",
        text(&out)
    );
    assert!(text(&out).contains(NAMED), "{}", text(&out));
    let out = helm(home.path())
        .args(["lint", "--strict"])
        .arg(chart())
        .output()
        .unwrap();
    assert!(
        text(&out).contains(&format!("Missing required value: {NAMED}")),
        "{}",
        text(&out)
    );
}

/// Chart.yaml's version and appVersion are the workspace version, and the chart's files/crds/
/// (which templates/crds.yaml renders) are byte for byte manifests/crds (the generated CRDs).
/// The chart has no crds/: Helm would install those once and never upgrade them.
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
        let in_chart = std::fs::read(chart().join("files/crds").join(&name)).unwrap_or_default();
        assert!(
            shipped == in_chart,
            "charts/cocoon/files/crds/{} differs from manifests/crds \
             (COCOON_UPDATE_CRDS=1 cargo test -p cocoon-api --test crd)",
            name.to_string_lossy()
        );
        names.push(name);
    }
    assert_eq!(
        std::fs::read_dir(chart().join("files/crds"))
            .unwrap()
            .count(),
        names.len(),
        "charts/cocoon/files/crds holds exactly manifests/crds"
    );
    assert!(!chart().join("crds").exists(), "charts/cocoon/crds exists");
    // Chart.yaml states the oldest Kubernetes the README supports.
    assert_eq!(meta["kubeVersion"], ">=1.30.0-0");
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
        // --skip-tests: the helm test pod is a hook of `helm test` only (never installed).
        let got = without_keep(render(home.path(), &["--skip-tests"]));
        assert_same_objects(&got, &want);
        for key in [
            "policy/v1/PodDisruptionBudget/cocoon-system/cocoon-operator",
            "apiextensions.k8s.io/v1/CustomResourceDefinition//cocoonsets.cocoonset.cocoonstack.io",
        ] {
            assert!(want.contains_key(key), "{key}: {:?}", want.keys());
        }
        // The CRDs are templates (upgraded with the release) and go with crds.create=false; the
        // test hook is the one object --skip-tests leaves out.
        let without = render(home.path(), &["--skip-tests", "--set", "crds.create=false"]);
        assert_eq!(without.len(), want.len() - CRDS.len());
        assert!(
            without
                .keys()
                .all(|k| !k.contains("CustomResourceDefinition"))
        );
        let with_tests = render(home.path(), &[]);
        let extra: Vec<_> = with_tests
            .keys()
            .filter(|k| !want.contains_key(*k))
            .collect();
        assert_eq!(
            extra,
            [
                "rbac.authorization.k8s.io/v1/ClusterRoleBinding//cocoon-operator-test-metrics",
                "rbac.authorization.k8s.io/v1/Role/cocoon-system/cocoon-operator-test-metrics",
                "rbac.authorization.k8s.io/v1/RoleBinding/cocoon-system/cocoon-operator-test-metrics",
                "v1/Pod/cocoon-system/cocoon-operator-test-metrics",
                "v1/ServiceAccount/cocoon-system/cocoon-operator-test-metrics",
            ]
        );
        Ok::<_, BoxError>(())
    })
    .await;
}

/// The same comparison with the optional monitoring objects on: the chart's ServiceMonitor,
/// node ScrapeConfig (with its RBAC), PrometheusRule and dashboard ConfigMap are those of
/// manifests/components/monitoring
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
        let got = without_keep(render(
            home.path(),
            &[
                "--skip-tests",
                "--set",
                "metrics.serviceMonitor.enabled=true,metrics.prometheusRule.enabled=true",
                "--set",
                "metrics.dashboard.enabled=true,metrics.nodeScrapeConfig.enabled=true",
            ],
        ));
        assert_same_objects(&got, &want);
        // The node agents' scrape (issue 36 item 3) is in the component: the ScrapeConfig, its
        // reader ClusterRole, the scraper ServiceAccount, its token Secret and their binding.
        let node_scrape: Vec<_> = want
            .keys()
            .filter(|k| k.contains("cocoon-node-metrics") || k.contains("ScrapeConfig"))
            .collect();
        assert_eq!(
            node_scrape,
            [
                "monitoring.coreos.com/v1alpha1/ScrapeConfig/cocoon-system/cocoon-node",
                "rbac.authorization.k8s.io/v1/ClusterRole//cocoon-node-metrics-reader",
                "rbac.authorization.k8s.io/v1/ClusterRoleBinding//cocoon-node-metrics-reader",
                "v1/Secret/cocoon-system/cocoon-node-metrics-scraper",
                "v1/ServiceAccount/cocoon-system/cocoon-node-metrics-scraper",
            ]
        );
        let service = "v1/Service/cocoon-system/cocoon-operator-metrics";
        assert!(want.contains_key(service), "{:?}", want.keys());
        let without = render(home.path(), &["--set", "metrics.service.enabled=false"]);
        assert!(!without.contains_key(service));
        // The helm test fetches /metrics through that Service: no Service, no test.
        assert!(without.keys().all(|k| !k.starts_with("v1/Pod/")));
        // /metrics is secured: the ServiceMonitor presents Prometheus' own ServiceAccount token,
        // or prometheus-operator's Secret-based authorization instead; readerSubjects binds
        // cocoon-metrics-reader to Prometheus.
        let monitor = "monitoring.coreos.com/v1/ServiceMonitor/cocoon-system/cocoon-operator";
        assert_eq!(
            got[monitor]["spec"]["endpoints"][0]["bearerTokenFile"],
            "/var/run/secrets/kubernetes.io/serviceaccount/token"
        );
        let with_secret = render(
            home.path(),
            &[
                "--set",
                "metrics.serviceMonitor.enabled=true,metrics.serviceMonitor.authorization.type=Bearer",
                "--set",
                "metrics.serviceMonitor.authorization.credentials.name=scrape,metrics.serviceMonitor.authorization.credentials.key=token",
                "--set-json",
                r#"metrics.readerSubjects=[{"kind":"ServiceAccount","name":"prometheus-k8s","namespace":"monitoring"}]"#,
            ],
        );
        let endpoint = &with_secret[monitor]["spec"]["endpoints"][0];
        assert_eq!(
            endpoint["authorization"],
            serde_json::json!({"type": "Bearer", "credentials": {"name": "scrape", "key": "token"}})
        );
        assert!(endpoint.get("bearerTokenFile").is_none(), "{endpoint}");
        let binding = &with_secret
            ["rbac.authorization.k8s.io/v1/ClusterRoleBinding//cocoon-metrics-reader"];
        assert_eq!(binding["roleRef"]["name"], "cocoon-metrics-reader");
        assert_eq!(
            binding["subjects"],
            serde_json::json!([{"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}])
        );
        assert!(
            !got.contains_key("rbac.authorization.k8s.io/v1/ClusterRoleBinding//cocoon-metrics-reader"),
            "no binding unless asked for"
        );
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
        let got = without_keep(render(
            home.path(),
            &["--skip-tests", "--set", "userRoles.aggregate=false"],
        ));
        assert_same_objects(&got, &want);
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

/// The node agents' ScrapeConfig (issue 36 item 3): node discovery kept to the cocoon virtual
/// nodes, job cocoon-node, HTTPS with the scraper ServiceAccount's token, which is allowed get
/// nodes/metrics; TLS verified against the configured CA unless insecureSkipVerify is asked
/// for (and one of them is required); another authorization drops the ServiceAccount.
#[test]
fn node_scrape_config_scrapes_cocoon_nodes_like_kubelets() {
    let home = tempfile::tempdir().unwrap();
    let key = "monitoring.coreos.com/v1alpha1/ScrapeConfig/cocoon-system/cocoon-node";
    let reader = "rbac.authorization.k8s.io/v1/ClusterRole//cocoon-node-metrics-reader";
    let binding = "rbac.authorization.k8s.io/v1/ClusterRoleBinding//cocoon-node-metrics-reader";
    let scraper = "v1/ServiceAccount/cocoon-system/cocoon-node-metrics-scraper";
    let token = "v1/Secret/cocoon-system/cocoon-node-metrics-scraper";
    let default = render(home.path(), &[]);
    assert!(
        [key, reader, binding, scraper, token]
            .iter()
            .all(|k| !default.contains_key(*k)),
        "off by default"
    );
    let on = render(
        home.path(),
        &["--set", "metrics.nodeScrapeConfig.enabled=true"],
    );
    let spec = &on[key]["spec"];
    assert_eq!(
        spec["jobName"], "cocoon-node",
        "the alerts' up{{job=\"cocoon-node\"}}"
    );
    assert_eq!(
        spec["kubernetesSDConfigs"],
        serde_json::json!([{"role": "Node"}])
    );
    assert_eq!(
        spec["relabelings"],
        serde_json::json!([{
            "action": "keep",
            "sourceLabels": ["__meta_kubernetes_node_label_type", "__meta_kubernetes_node_label_cocoonstack_io_pool"],
            "regex": "virtual-kubelet;.+",
        }])
    );
    assert_eq!(
        (&spec["scheme"], &spec["metricsPath"]),
        (&"HTTPS".into(), &"/metrics".into())
    );
    assert_eq!(
        spec["authorization"],
        serde_json::json!({"type": "Bearer", "credentials": {"name": "cocoon-node-metrics-scraper", "key": "token"}})
    );
    assert_eq!(
        spec["tlsConfig"],
        serde_json::json!({"ca": {"configMap": {"name": "kube-root-ca.crt", "key": "ca.crt"}}, "insecureSkipVerify": false})
    );
    assert_eq!(
        on[reader]["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"]}])
    );
    assert_eq!(
        on[token]["metadata"]["annotations"]["kubernetes.io/service-account.name"],
        "cocoon-node-metrics-scraper"
    );
    assert_eq!(on[token]["type"], "kubernetes.io/service-account-token");
    assert_eq!(
        on[binding]["subjects"],
        serde_json::json!([{"kind": "ServiceAccount", "name": "cocoon-node-metrics-scraper", "namespace": "cocoon-system"}])
    );

    // Self-signed agents: verification off only when asked, and then the CA may go.
    let insecure = render(
        home.path(),
        &[
            "--set",
            "metrics.nodeScrapeConfig.enabled=true,metrics.nodeScrapeConfig.insecureSkipVerify=true,metrics.nodeScrapeConfig.ca=null",
        ],
    );
    assert_eq!(
        insecure[key]["spec"]["tlsConfig"],
        serde_json::json!({"insecureSkipVerify": true})
    );
    let out = template(home.path())
        .args([
            "--set",
            "metrics.nodeScrapeConfig.enabled=true,metrics.nodeScrapeConfig.ca=null",
        ])
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "no CA and no insecureSkipVerify rendered"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("metrics.nodeScrapeConfig needs ca"), "{err}");

    // Another token (e.g. a scrape identity of your own): no scraper ServiceAccount; the
    // reader role is bound to metrics.readerSubjects, and to nobody without them.
    let own = [
        "--set",
        "metrics.nodeScrapeConfig.enabled=true,metrics.nodeScrapeConfig.authorization.type=Bearer",
        "--set",
        "metrics.nodeScrapeConfig.authorization.credentials.name=scrape,metrics.nodeScrapeConfig.authorization.credentials.key=token",
        "--set",
        "namePrefix=blue-,metrics.nodeScrapeConfig.labels.release=kube-prometheus,metrics.nodeScrapeConfig.interval=1m",
    ];
    let objs = render(home.path(), &own);
    let blue = |k: &str| k.replace("cocoon-node", "blue-cocoon-node");
    assert_eq!(
        objs[&blue(key)]["spec"]["authorization"],
        serde_json::json!({"type": "Bearer", "credentials": {"name": "scrape", "key": "token"}})
    );
    assert_eq!(objs[&blue(key)]["spec"]["scrapeInterval"], "1m");
    assert_eq!(
        objs[&blue(key)]["metadata"]["labels"]["release"],
        "kube-prometheus"
    );
    assert!(objs.contains_key(&blue(reader)));
    for gone in [binding, scraper, token] {
        assert!(!objs.contains_key(&blue(gone)), "{gone}: {:?}", objs.keys());
    }
    let mut with_subjects = own.to_vec();
    with_subjects.extend([
        "--set-json",
        r#"metrics.readerSubjects=[{"kind":"ServiceAccount","name":"prometheus-k8s","namespace":"monitoring"}]"#,
    ]);
    let objs = render(home.path(), &with_subjects);
    assert_eq!(
        objs[&blue(binding)]["subjects"],
        serde_json::json!([{"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}])
    );
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
        "rbac.authorization.k8s.io/v1/ClusterRole//blue-cocoon-metrics-reader",
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
    // So do the PodDisruptionBudget (3 replicas) and the helm test's five objects; the CRDs
    // keep their names. 24 objects (the metrics reader ClusterRole and the node agents'
    // namespace reader ClusterRole and ClusterRoleBinding among them), the 3 CRDs, the budget
    // and the test's pod, ServiceAccount, Role, RoleBinding and ClusterRoleBinding.
    for key in [
        "policy/v1/PodDisruptionBudget/ops/blue-cocoon-operator",
        "v1/Pod/ops/blue-cocoon-operator-test-metrics",
        "v1/ServiceAccount/ops/blue-cocoon-operator-test-metrics",
        "rbac.authorization.k8s.io/v1/Role/ops/blue-cocoon-operator-test-metrics",
        "rbac.authorization.k8s.io/v1/RoleBinding/ops/blue-cocoon-operator-test-metrics",
        "rbac.authorization.k8s.io/v1/ClusterRoleBinding//blue-cocoon-operator-test-metrics",
        "apiextensions.k8s.io/v1/CustomResourceDefinition//cocoonsets.cocoonset.cocoonstack.io",
        "apiextensions.k8s.io/v1/CustomResourceDefinition//cocoonhibernations.cocoonset.cocoonstack.io",
        "apiextensions.k8s.io/v1/CustomResourceDefinition//cocooncheckpoints.cocoonset.cocoonstack.io",
        "rbac.authorization.k8s.io/v1/ClusterRole//blue-cocoon-metrics-reader",
        "rbac.authorization.k8s.io/v1/ClusterRole//blue-cocoon-node-namespace-reader",
        "rbac.authorization.k8s.io/v1/ClusterRoleBinding//blue-cocoon-node-namespace-reader",
        "rbac.authorization.k8s.io/v1/ClusterRole//blue-cocoon-node-checkpoints",
        "rbac.authorization.k8s.io/v1/ClusterRoleBinding//blue-cocoon-node-checkpoints",
        "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy//blue-cocoon-node-checkpoints",
        "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicyBinding//blue-cocoon-node-checkpoints",
    ] {
        assert!(
            objs.contains_key(key),
            "{key} missing from {:?}",
            objs.keys()
        );
    }
    assert_eq!(objs.len(), 37, "{:?}", objs.keys());

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
        // The template's `required` names it (the schema has no minLength, whose message
        // would only give the path).
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
        let out = template(home.path()).args(["--set", set]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{set} rendered");
        assert!(err.contains(named), "{set}: {err}");
    }
    // Without the schema the template still names the value.
    let out = template(home.path())
        .args(["--skip-schema-validation", "--set", "registry.base="])
        .output()
        .unwrap();
    assert!(!out.status.success(), "rendered without registry.base");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("registry.base (OCI_REGISTRY) must be set"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Chart.yaml's kubeVersion: Kubernetes 1.29 serves no admissionregistration.k8s.io/v1
    // ValidatingAdmissionPolicy.
    let out = helm(home.path())
        .args(["template", "cocoon"])
        .arg(chart())
        .args(["--kube-version", "1.29.0"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "rendered for 1.29");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("chart requires kubeVersion: >=1.30.0-0"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The oldest supported release renders (the last --kube-version counts).
    run_ok(template(home.path()).args(["--kube-version", "1.30.0"]));
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
/// exist already (the test environment installs them): with `crds.create=false` Helm must
/// leave them as they are, on install and on uninstall. The webhook-rule policies are bound only to namespaces with a label
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
            REGISTRY.into(),
            // The test environment installed the CRDs (with kubectl): Helm cannot take them
            // over, so this release leaves them to it (the CRD test below has its own).
            "--set".into(),
            "crds.create=false".into(),
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

/// values.schema.json and values.yaml name the same values: every key of values.yaml is a
/// property of the schema at that place, and every property of the schema (but `global`, which
/// a parent chart may pass) is in values.yaml. Objects the schema closes
/// (`additionalProperties: false`) are walked; the free-form ones (resources, affinity, ...)
/// are Kubernetes types, not values of ours. The chart README's values table lists each.
#[test]
fn the_schema_covers_every_value() {
    let values: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(chart().join("values.yaml")).unwrap())
            .expect("values.yaml");
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(chart().join("values.schema.json")).unwrap())
            .expect("values.schema.json is JSON");
    assert_eq!(
        schema["$schema"], "http://json-schema.org/draft-07/schema#",
        "draft-07"
    );
    fn walk(
        path: &str,
        values: &Value,
        schema: &Value,
        closed: &mut Vec<String>,
        leaves: &mut Vec<String>,
    ) {
        let Some(props) = schema.get("properties").and_then(Value::as_object) else {
            leaves.push(path.trim_start_matches('.').to_string());
            return;
        };
        assert_eq!(
            schema["additionalProperties"],
            Value::Bool(false),
            "{path}: the schema lists its keys, so it refuses others"
        );
        closed.push(path.to_string());
        let map = values
            .as_object()
            .unwrap_or_else(|| panic!("{path} is a map in values.yaml"));
        for key in map.keys() {
            assert!(
                props.contains_key(key),
                "{path}.{key} is in values.yaml but not in values.schema.json"
            );
        }
        for (key, sub) in props {
            if path.is_empty() && key == "global" {
                continue;
            }
            let value = map.get(key).unwrap_or_else(|| {
                panic!("{path}.{key} is in values.schema.json but not in values.yaml")
            });
            assert!(
                sub.get("description").and_then(Value::as_str).is_some()
                    || sub.get("properties").is_some(),
                "{path}.{key} has a description"
            );
            walk(&format!("{path}.{key}"), value, sub, closed, leaves);
        }
    }
    let (mut closed, mut leaves) = (Vec::new(), Vec::new());
    walk("", &values, &schema, &mut closed, &mut leaves);
    // The chart README's table has a row for each.
    let readme = std::fs::read_to_string(chart().join("README.md")).unwrap();
    for leaf in &leaves {
        assert!(
            readme.contains(&format!("| `{leaf}` |")),
            "charts/cocoon/README.md has no row for {leaf}"
        );
    }
    assert!(leaves.len() > 70, "{leaves:?}");
    for level in [
        "",
        ".image",
        ".registry",
        ".metrics.service",
        ".podDisruptionBudget",
        ".networkPolicy.apiServer",
        ".tests",
        ".admissionPolicies",
    ] {
        assert!(
            closed.iter().any(|c| c == level),
            "{level} closed: {closed:?}"
        );
    }
}

/// A mistyped value fails `helm template` (and `helm install`, the same check) with Helm's
/// schema error naming the value, before anything renders; the defaults and every value the
/// other tests set validate.
#[test]
fn the_schema_refuses_mistyped_values_by_name() {
    let home = tempfile::tempdir().unwrap();
    for (set, named) in [
        ("replicas=two", "at '/replicas': got string, want integer"),
        (
            "replicaCount=2",
            "additional properties 'replicaCount' not allowed",
        ),
        (
            "image.pullPolicy=Sometimes",
            "at '/image/pullPolicy': value must be one of",
        ),
        (
            "image.digest=sha256:0",
            "at '/image': additional properties 'digest' not allowed",
        ),
        ("logging.format=xml", "at '/logging/format'"),
        ("metrics.port=0", "at '/metrics/port'"),
        ("timeouts.wake=5mins", "at '/timeouts/wake'"),
        ("leaderElection.enabled=yes", "at '/leaderElection/enabled'"),
        (
            "admissionPolicies.validationActions={Deny,Block}",
            "at '/admissionPolicies/validationActions/1'",
        ),
        (
            "podDisruptionBudget.maxUnavailable=one",
            "at '/podDisruptionBudget/maxUnavailable'",
        ),
        (
            "podDisruptionBudget.unhealthyPodEvictionPolicy=Never",
            "at '/podDisruptionBudget/unhealthyPodEvictionPolicy'",
        ),
        (
            "topologySpreadConstraints[0].whenUnsatisfiable=Maybe",
            "at '/topologySpreadConstraints/0/whenUnsatisfiable'",
        ),
        (
            "networkPolicy.enable=true",
            "at '/networkPolicy': additional properties 'enable' not allowed",
        ),
        ("crds.create=maybe", "at '/crds/create'"),
        ("tests.timeout=soon", "at '/tests/timeout'"),
        (
            "tests.image.tag=1.37",
            "at '/tests': additional properties 'image' not allowed",
        ),
        ("namespace.name=Cocoon_System", "at '/namespace/name'"),
        ("concurrency.cocoonset=many", "at '/concurrency/cocoonset'"),
    ] {
        let out = template(home.path()).args(["--set", set]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{set} rendered");
        assert!(
            err.contains("values don't meet the specifications of the schema"),
            "{set}: not the schema: {err}"
        );
        assert!(err.contains(named), "{set}: {err}");
    }
    // What --set makes of numbers and booleans is accepted where the value means it.
    render(
        home.path(),
        &[
            "--set",
            "concurrency.hibernation=2,registry.insecure=true",
            "--set-string",
            "concurrency.cocoonset=8,timeouts.hibernate=0",
            "--set",
            "podDisruptionBudget.maxUnavailable=50%,timeouts.wake=1m30s",
            "--set",
            "metrics.service.annotations.prometheus\\.io/port=8080",
        ],
    );
}

#[test]
fn pod_disruption_budget_and_topology_spread() {
    let home = tempfile::tempdir().unwrap();
    const PDB: &str = "policy/v1/PodDisruptionBudget/cocoon-system/cocoon-operator";
    let objs = render(home.path(), &[]);
    assert_eq!(
        objs[PDB]["spec"],
        serde_json::json!({
            "maxUnavailable": 1,
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
            "selector": {"matchLabels": {"app.kubernetes.io/name": "cocoon-operator"}},
        })
    );
    // It selects exactly the Deployment's pods.
    let d = deployment(&objs, "cocoon-system", "cocoon-operator");
    assert_eq!(
        objs[PDB]["spec"]["selector"], d["spec"]["selector"],
        "the Deployment's selector"
    );
    // One replica: no budget (it would either allow nothing or block every drain); off: none.
    for set in ["replicas=1", "podDisruptionBudget.enabled=false"] {
        let objs = render(home.path(), &["--set", set]);
        assert!(!objs.contains_key(PDB), "{set}");
    }
    let objs = render(
        home.path(),
        &[
            "--set",
            "replicas=3,podDisruptionBudget.minAvailable=2,podDisruptionBudget.unhealthyPodEvictionPolicy=",
        ],
    );
    assert_eq!(
        objs[PDB]["spec"],
        serde_json::json!({
            "minAvailable": 2,
            "selector": {"matchLabels": {"app.kubernetes.io/name": "cocoon-operator"}},
        })
    );
    let objs = render(
        home.path(),
        &["--set", "podDisruptionBudget.maxUnavailable=50%"],
    );
    assert_eq!(objs[PDB]["spec"]["maxUnavailable"], "50%");

    // The default spread: over nodes, never blocking scheduling, over the operator's own pods.
    let spread = |objs: &BTreeMap<String, Value>| {
        deployment(objs, "cocoon-system", "cocoon-operator")["spec"]["template"]["spec"]
            ["topologySpreadConstraints"]
            .clone()
    };
    assert_eq!(
        spread(&objs),
        serde_json::json!([{
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "cocoon-operator"}},
        }])
    );
    // Overridden: an entry's own labelSelector is kept; [] means none.
    let values = home.path().join("spread.yaml");
    std::fs::write(
        &values,
        "topologySpreadConstraints:\n\
         - maxSkew: 2\n  topologyKey: topology.kubernetes.io/zone\n  whenUnsatisfiable: DoNotSchedule\n\
         \x20 labelSelector: {matchLabels: {tier: control}}\n",
    )
    .unwrap();
    let objs = render(home.path(), &["-f", values.to_str().unwrap()]);
    assert_eq!(
        spread(&objs),
        serde_json::json!([{
            "maxSkew": 2,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"tier": "control"}},
        }])
    );
    let objs = render(home.path(), &["--set", "topologySpreadConstraints=null"]);
    assert_eq!(spread(&objs), Value::Null);
}

#[test]
fn network_policy_admits_metrics_in_and_dns_api_registry_out() {
    let home = tempfile::tempdir().unwrap();
    const NP: &str = "networking.k8s.io/v1/NetworkPolicy/cocoon-system/cocoon-operator";
    assert!(!render(home.path(), &[]).contains_key(NP), "off by default");
    let objs = render(home.path(), &["--set", "networkPolicy.enabled=true"]);
    let spec = &objs[NP]["spec"];
    assert_eq!(
        spec["podSelector"],
        serde_json::json!({"matchLabels": {"app.kubernetes.io/name": "cocoon-operator"}})
    );
    assert_eq!(
        spec["policyTypes"],
        serde_json::json!(["Ingress", "Egress"])
    );
    // In: only the metrics port (from anywhere unless networkPolicy.metrics.from says).
    assert_eq!(
        spec["ingress"],
        serde_json::json!([{"ports": [{"port": "metrics", "protocol": "TCP"}]}])
    );
    let ports = |rule: &Value| -> Vec<(i64, String)> {
        rule["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["port"].as_i64().unwrap(),
                    p["protocol"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let egress = spec["egress"].as_array().unwrap();
    assert_eq!(egress.len(), 3, "DNS, API server, registry: {egress:?}");
    assert_eq!(
        ports(&egress[0]),
        [(53, "UDP".to_string()), (53, "TCP".to_string())]
    );
    assert_eq!(
        egress[0]["to"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "kube-system"
    );
    assert_eq!(
        ports(&egress[1]),
        [(443, "TCP".to_string()), (6443, "TCP".to_string())]
    );
    // The registry's port: 443 for registry.example.com/cocoon; the one registry.base names;
    // 80 too when plain HTTP is allowed; or networkPolicy.registry.ports.
    assert_eq!(ports(&egress[2]), [(443, "TCP".to_string())]);
    for (set, want) in [
        ("registry.base=reg.lan:5000/vms", vec![5000]),
        ("registry.insecure=true", vec![443, 80]),
        ("networkPolicy.registry.ports={8443}", vec![8443]),
    ] {
        let objs = render(
            home.path(),
            &["--set", "networkPolicy.enabled=true", "--set", set],
        );
        let got: Vec<i64> = ports(&objs[NP]["spec"]["egress"][2])
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        assert_eq!(got, want, "{set}");
    }
    // A scraper selector: those peers and the helm test pod, nothing else.
    let objs = render(
        home.path(),
        &[
            "--set",
            "networkPolicy.enabled=true",
            "--set",
            "networkPolicy.metrics.from[0].namespaceSelector.matchLabels.team=monitoring",
            "--set",
            "networkPolicy.apiServer.to[0].ipBlock.cidr=10.0.0.1/32",
        ],
    );
    let spec = &objs[NP]["spec"];
    assert_eq!(
        spec["ingress"][0]["from"],
        serde_json::json!([
            {"namespaceSelector": {"matchLabels": {"team": "monitoring"}}},
            {"podSelector": {"matchLabels": {"app.kubernetes.io/component": "helm-test"}}},
        ])
    );
    assert_eq!(
        spec["egress"][1]["to"],
        serde_json::json!([{"ipBlock": {"cidr": "10.0.0.1/32"}}])
    );
    let test_pod = &objs["v1/Pod/cocoon-system/cocoon-operator-test-metrics"];
    assert_eq!(
        test_pod["metadata"]["labels"]["app.kubernetes.io/component"],
        "helm-test"
    );
}

/// The `helm test` hook: `cocoon-operator check-metrics` in the operator's image, under a
/// ServiceAccount of its own that may only get the metrics Service and list pods (all
/// four objects exist only while `helm test` runs). The pod is not selected by the operator's
/// Service, budget or NetworkPolicy. `in_cluster.rs` runs `helm test` itself.
#[test]
fn helm_test_hook_checks_the_metrics_endpoints() {
    let home = tempfile::tempdir().unwrap();
    let objs = render(
        home.path(),
        &[
            "--set",
            "namePrefix=blue-,namespace.name=ops,metrics.port=9090,image.tag=v9,tests.timeout=2m",
        ],
    );
    let name = "blue-cocoon-operator-test-metrics";
    for kind in [
        "v1/ServiceAccount",
        "rbac.authorization.k8s.io/v1/Role",
        "rbac.authorization.k8s.io/v1/RoleBinding",
        "v1/Pod",
    ] {
        let obj = &objs[&format!("{kind}/ops/{name}")];
        assert_eq!(
            obj["metadata"]["annotations"]["helm.sh/hook"], "test",
            "{kind}"
        );
        assert_eq!(
            obj["metadata"]["annotations"]["helm.sh/hook-delete-policy"],
            "before-hook-creation,hook-succeeded",
            "{kind}"
        );
    }
    let role = &objs[&format!("rbac.authorization.k8s.io/v1/Role/ops/{name}")];
    assert_eq!(
        role["rules"],
        serde_json::json!([
            {"apiGroups": [""], "resources": ["services"], "resourceNames": ["blue-cocoon-operator-metrics"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        ])
    );
    let binding = &objs[&format!("rbac.authorization.k8s.io/v1/RoleBinding/ops/{name}")];
    assert_eq!(binding["roleRef"]["name"], name);
    assert_eq!(
        binding["subjects"],
        serde_json::json!([{"kind": "ServiceAccount", "name": name, "namespace": "ops"}])
    );
    // /metrics is secured: the hook's ServiceAccount is bound to the metrics reader role.
    let reader = &objs[&format!("rbac.authorization.k8s.io/v1/ClusterRoleBinding//{name}")];
    assert_eq!(reader["metadata"]["annotations"]["helm.sh/hook"], "test");
    assert_eq!(
        reader["metadata"]["annotations"]["helm.sh/hook-delete-policy"],
        "before-hook-creation,hook-succeeded"
    );
    assert_eq!(reader["roleRef"]["name"], "blue-cocoon-metrics-reader");
    assert_eq!(
        reader["subjects"],
        serde_json::json!([{"kind": "ServiceAccount", "name": name, "namespace": "ops"}])
    );
    assert_eq!(
        objs["rbac.authorization.k8s.io/v1/ClusterRole//blue-cocoon-metrics-reader"]["rules"],
        serde_json::json!([{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}])
    );
    let pod = &objs[&format!("v1/Pod/ops/{name}")];
    assert_ne!(
        pod["metadata"]["labels"]["app.kubernetes.io/name"],
        "cocoon-operator"
    );
    assert_eq!(pod["spec"]["restartPolicy"], "Never");
    assert_eq!(pod["spec"]["serviceAccountName"], name);
    let c = &pod["spec"]["containers"][0];
    let deploy = deployment(&objs, "ops", "blue-cocoon-operator");
    assert_eq!(
        c["image"],
        deploy["spec"]["template"]["spec"]["containers"][0]["image"]
    );
    assert_eq!(
        c["args"],
        serde_json::json!([
            "check-metrics",
            "--service=blue-cocoon-operator-metrics",
            "--namespace=ops",
            "--port-name=metrics",
            "--timeout=2m"
        ])
    );
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    // The Service it checks names that port.
    let svc = &objs["v1/Service/ops/blue-cocoon-operator-metrics"];
    assert_eq!(svc["spec"]["ports"][0]["name"], "metrics");
    assert_eq!(svc["spec"]["ports"][0]["port"], 9090);
    let objs = render(home.path(), &["--set", "tests.enabled=false"]);
    assert!(
        objs.keys().all(|k| !k.contains("-test-metrics")),
        "{:?}",
        objs.keys().collect::<Vec<_>>()
    );
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// The CRDs follow the release: `helm install` creates them (labelled as the release's, with
/// `helm.sh/resource-policy: keep`), `helm upgrade` onto a chart whose CRD changed changes the
/// CRD on the API server, and `helm uninstall` removes the release but leaves the CRDs and the
/// objects stored under them. On a copy of the chart whose CRDs are renamed into an API group of
/// this run's own (`<run>.test.cocoonstack.io`): the real CRDs are shared by every test on this
/// control plane. Installed again, the release takes the kept CRDs back; the rollback the chart
/// README gives (`helm upgrade` with `crds.create=false`) leaves them too. A mistyped value is refused by `helm install` as by `helm template`. The
/// operator's replicas are pinned to a node label nothing has (they stay Pending: nothing of
/// theirs may act on other tests' resources) and the NetworkPolicy is on, so the API server
/// accepts the PodDisruptionBudget, the spread and the NetworkPolicy as the chart renders them.
#[tokio::test]
async fn helm_upgrade_upgrades_the_crds_and_uninstall_keeps_them() {
    cocoon_testenv::run_test(|env: &'static Shared| async move {
        let client = env.client()?;
        let ns = unique_name("helm-crd");
        let group = format!("{ns}.test.cocoonstack.io");
        let names = [
            format!("cocoonsets.{group}"),
            format!("cocoonhibernations.{group}"),
        ];
        let work = tempfile::tempdir()?;
        let copy = work.path().join("cocoon");
        copy_dir(&chart(), &copy)?;
        let crd_files = copy.join("files/crds");
        for f in std::fs::read_dir(&crd_files)? {
            let path = f?.path();
            let text = std::fs::read_to_string(&path)?;
            assert!(text.contains("group: cocoonset.cocoonstack.io"), "{}", path.display());
            std::fs::write(&path, text.replace("cocoonset.cocoonstack.io", &group))?;
        }
        let home = work.path().join("helm");
        let kubeconfig = env.kubeconfig_path().to_path_buf();
        let helm_cmd = {
            let home = home.clone();
            move |args: &[&str]| {
                let mut cmd = helm(&home);
                cmd.arg("--kubeconfig").arg(&kubeconfig).args(args);
                cmd
            }
        };
        let chart_dir = copy.to_string_lossy().into_owned();
        let sets = format!(
            "namespace.name={ns},namePrefix={ns}-,nodeSelector.cocoon-helm-test=nowhere,\
             networkPolicy.enabled=true,nodeRole.create=false,nodeAdmission.create=false,\
             admissionPolicies.create=false,{REGISTRY}"
        );
        let release_args = |verb: &'static str| {
            vec![
                verb,
                ns.as_str(),
                chart_dir.as_str(),
                "--namespace",
                "default",
                "--set",
                sets.as_str(),
                "--timeout",
                "2m",
            ]
        };
        // Refused before anything is created, naming the value.
        let bad = {
            let mut args = release_args("install");
            args.extend(["--set", "replicaCount=2"]);
            helm_cmd(&args).output()?
        };
        let err = String::from_utf8_lossy(&bad.stderr);
        assert!(!bad.status.success(), "installed with replicaCount");
        assert!(
            err.contains("additional properties 'replicaCount' not allowed"),
            "{err}"
        );

        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        let outcome = async {
            let mut install = helm_cmd(&release_args("install"));
            let out = tokio::task::spawn_blocking(move || run_ok(&mut install)).await?;
            assert!(stdout(&out).contains("STATUS: deployed"), "{}", stdout(&out));
            assert!(
                stdout(&out).contains("helm upgrade upgrades them"),
                "NOTES say how the CRDs are handled: {}",
                stdout(&out)
            );
            assert!(
                stdout(&out).contains(
                    "Before helm uninstall, delete every CocoonSet and CocoonHibernation"
                ),
                "NOTES give the uninstall order (issue 36 item 5): {}",
                stdout(&out)
            );
            for name in &names {
                let crd = crds.get(name).await?;
                let ann = crd.metadata.annotations.clone().unwrap_or_default();
                assert_eq!(ann.get(KEEP).map(String::as_str), Some("keep"), "{name}");
                assert_eq!(
                    ann.get("meta.helm.sh/release-name").map(String::as_str),
                    Some(ns.as_str()),
                    "{name} is the release's"
                );
            }
            let pdb = Api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>::namespaced(
                client.clone(),
                &ns,
            )
            .get(&format!("{ns}-cocoon-operator"))
            .await?;
            assert_eq!(
                pdb.spec.and_then(|s| s.max_unavailable),
                Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1))
            );
            Api::<k8s_openapi::api::networking::v1::NetworkPolicy>::namespaced(client.clone(), &ns)
                .get(&format!("{ns}-cocoon-operator"))
                .await?;

            // A CocoonHibernation stored under the CRD, outside the release's namespace.
            let hibernations = format!("cocoonhibernations.{group}");
            cocoon_testenv::wait_until(
                &format!("CRD {hibernations} established"),
                Duration::from_secs(60),
                || async {
                    let crd = crds.get_opt(&hibernations).await.ok().flatten()?;
                    crd.status?
                        .conditions?
                        .iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                        .then_some(())
                },
            )
            .await?;
            let resource = kube::core::ApiResource {
                group: group.clone(),
                version: "v1".into(),
                api_version: format!("{group}/v1"),
                kind: "CocoonHibernation".into(),
                plural: "cocoonhibernations".into(),
            };
            let stored: Api<kube::core::DynamicObject> =
                Api::namespaced_with(client.clone(), "default", &resource);
            let mut obj = kube::core::DynamicObject::new(&ns, &resource);
            obj.data = serde_json::json!({"spec": {"podRef": {"name": ns}, "desire": "Hibernate"}});
            stored.create(&kube::api::PostParams::default(), &obj).await?;

            // The chart's CocoonHibernation CRD gains a printer column; helm upgrade applies it.
            let file = crd_files.join("cocoonset.cocoonstack.io_cocoonhibernations.yaml");
            let mut crd: Value = serde_saphyr::from_str(&std::fs::read_to_string(&file)?)?;
            crd["spec"]["versions"][0]["additionalPrinterColumns"]
                .as_array_mut()
                .expect("printer columns")
                .push(serde_json::json!({"name": "Upgraded", "type": "string", "jsonPath": ".spec.desire"}));
            // JSON is YAML: the template reads it as it reads the generated file.
            std::fs::write(&file, serde_json::to_string_pretty(&crd)?)?;
            let column = |crd: &CustomResourceDefinition| {
                crd.spec.versions[0]
                    .additional_printer_columns
                    .iter()
                    .flatten()
                    .any(|c| c.name == "Upgraded")
            };
            assert!(!column(&crds.get(&hibernations).await?), "not before the upgrade");
            let mut upgrade = helm_cmd(&release_args("upgrade"));
            let out = tokio::task::spawn_blocking(move || run_ok(&mut upgrade)).await?;
            assert!(stdout(&out).contains("REVISION: 2"), "{}", stdout(&out));
            assert!(
                column(&crds.get(&hibernations).await?),
                "helm upgrade upgraded CRD {hibernations}"
            );

            // helm uninstall: the release's objects go, the CRDs and what they store stay.
            let mut uninstall = helm_cmd(&[
                "uninstall",
                &ns,
                "--namespace",
                "default",
                "--wait",
                "--timeout",
                "2m",
            ]);
            tokio::task::spawn_blocking(move || run_ok(&mut uninstall)).await?;
            assert!(
                Api::<Deployment>::namespaced(client.clone(), &ns)
                    .get_opt(&format!("{ns}-cocoon-operator"))
                    .await?
                    .is_none(),
                "the Deployment went with the release"
            );
            for name in &names {
                let crd = crds.get(name).await?;
                assert!(
                    crd.metadata.deletion_timestamp.is_none(),
                    "helm uninstall kept CRD {name}"
                );
            }
            let kept = stored.get(&ns).await?;
            assert!(kept.metadata.deletion_timestamp.is_none());

            // Installed again, the release takes the kept CRDs back (they still name it).
            let mut install = helm_cmd(&release_args("install"));
            tokio::task::spawn_blocking(move || run_ok(&mut install)).await?;
            // The rollback the chart README gives: the previous chart without the CRDs. Helm
            // drops them from the release but keeps them, as the newer chart left them.
            let mut without = release_args("upgrade");
            without.extend(["--set", "crds.create=false"]);
            let mut rollback = helm_cmd(&without);
            let out = tokio::task::spawn_blocking(move || run_ok(&mut rollback)).await?;
            assert!(stdout(&out).contains("REVISION: 2"), "{}", stdout(&out));
            let crd = crds.get(&hibernations).await?;
            assert!(
                crd.metadata.deletion_timestamp.is_none() && column(&crd),
                "crds.create=false kept CRD {hibernations} as it was"
            );

            let mut uninstall = helm_cmd(&["uninstall", &ns, "--namespace", "default", "--wait"]);
            tokio::task::spawn_blocking(move || run_ok(&mut uninstall)).await?;
            assert!(crds.get_opt(&hibernations).await?.is_some());
            Ok::<_, BoxError>(())
        }
        .await;
        // Whatever happened: neither the release nor CRDs of this run's group are left on the
        // shared control plane (after a successful run the uninstall finds nothing).
        if outcome.is_err() {
            let mut uninstall = helm_cmd(&["uninstall", &ns, "--namespace", "default"]);
            let _ = tokio::task::spawn_blocking(move || uninstall.output()).await;
        }
        for name in &names {
            let _ = crds.delete(name, &Default::default()).await;
        }
        outcome
    })
    .await;
}

/// Issue 36 item 2: the PrometheusRule's runbook links name the release tag of the chart's
/// `appVersion`, whatever the rule file says: a copy of the chart with another appVersion links
/// every alert to that tag's README.
#[test]
fn the_runbook_links_follow_the_app_version() {
    let home = tempfile::tempdir().unwrap();
    let copy = tempfile::tempdir().unwrap();
    let dir = copy.path().join("cocoon");
    copy_dir(&chart(), &dir).unwrap();
    let meta = std::fs::read_to_string(dir.join("Chart.yaml")).unwrap();
    let app = format!("appVersion: \"{}\"", workspace_version());
    assert!(meta.contains(&app), "{meta}");
    std::fs::write(
        dir.join("Chart.yaml"),
        meta.replace(&app, "appVersion: \"9.8.7\""),
    )
    .unwrap();
    let out = run_ok(
        helm(home.path())
            .args(["template", "cocoon"])
            .arg(&dir)
            .args(["--kube-version", cocoon_testenv::paths::k8s_version()])
            .args(["--set", REGISTRY])
            .args(["--set", "metrics.prometheusRule.enabled=true"])
            .args(["--show-only", "templates/prometheusrule.yaml"]),
    );
    let text = stdout(&out);
    let links: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("runbook_url: "))
        .collect();
    assert!(links.len() >= 12, "{text}");
    for link in links {
        assert!(
            link.starts_with("https://github.com/cocoonstack/cocoon/blob/v9.8.7/README.md#"),
            "{link}"
        );
    }
}
