//! The API server, not just our code, enforces the CRD contract: every invalid case of the CEL
//! rules and field validations is rejected with the expected message, and valid objects pass
//! with the schema defaults applied.

use cocoon_api::{CocoonHibernation, CocoonSet};
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::ApiResource;
use kube::{Client, Resource};
use serde_json::{Value, json};

fn api<K: Resource<DynamicType = ()>>(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &ApiResource::erase::<K>(&()))
}

fn cocoonset(name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "cocoonset.cocoonstack.io/v1", "kind": "CocoonSet",
        "metadata": {"name": name}, "spec": spec
    }))
    .expect("object")
}

fn hibernation(name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "cocoonset.cocoonstack.io/v1", "kind": "CocoonHibernation",
        "metadata": {"name": name}, "spec": spec
    }))
    .expect("object")
}

/// Creates the object; returns the API server's rejection message, or None when accepted.
async fn create(api: &Api<DynamicObject>, obj: &DynamicObject) -> Option<String> {
    match api.create(&PostParams::default(), obj).await {
        Ok(_) => None,
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "rejections are 422 Invalid: {status:?}");
            Some(status.message)
        }
        Err(e) => panic!("unexpected error: {e}"),
    }
}

/// Replaces the object's spec; returns the rejection message, or None when accepted.
async fn update_spec(api: &Api<DynamicObject>, name: &str, spec: Value) -> Option<String> {
    let mut current = api.get(name).await.expect("get");
    current.data["spec"] = spec;
    match api.replace(name, &PostParams::default(), &current).await {
        Ok(_) => None,
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "rejections are 422 Invalid: {status:?}");
            Some(status.message)
        }
        Err(e) => panic!("unexpected error: {e}"),
    }
}

#[tokio::test]
async fn cocoonset_cel_rules_and_field_validation() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "crd-cs").await?;
        let sets = api::<CocoonSet>(&client, &ns);
        const RELEASE: &str = "hibernatePolicy=release requires agent.replicas=0 and no toolboxes";

        // Rejected on create: (name, spec, text the message must contain).
        let rejected: Vec<(&str, Value, &str)> = vec![
            ("release-subagent", json!({"hibernatePolicy": "release", "agent": {"image": "i", "replicas": 1}}), RELEASE),
            ("release-toolbox", json!({"hibernatePolicy": "release", "agent": {"image": "i"}, "toolboxes": [{"name": "tb"}]}), RELEASE),
            ("no-agent", json!({"nodePool": "p"}), "spec.agent: Required value"),
            ("no-image", json!({"agent": {"replicas": 1}}), "spec.agent.image: Required value"),
            ("empty-image", json!({"agent": {"image": ""}}), "spec.agent.image"),
            ("negative-replicas", json!({"agent": {"image": "i", "replicas": -1}}), "spec.agent.replicas"),
            ("bad-snapshot-policy", json!({"snapshotPolicy": "sometimes", "agent": {"image": "i"}}), "spec.snapshotPolicy: Unsupported value: \"sometimes\""),
            // Issue 36 item 6: cocoon-webhook's words, on the field.
            ("bad-hibernate-policy", json!({"hibernatePolicy": "drop", "agent": {"image": "i"}}), "spec.hibernatePolicy: Invalid value: \"drop\": must be retain or release"),
            ("empty-hibernate-policy", json!({"hibernatePolicy": "", "agent": {"image": "i"}}), "spec.hibernatePolicy: Invalid value: \"\": must be retain or release"),
            ("bad-mode", json!({"agent": {"image": "i", "mode": "static"}}), "spec.agent.mode: Unsupported value"),
            ("bad-os", json!({"agent": {"image": "i", "os": "beos"}}), "spec.agent.os: Unsupported value"),
            ("bad-backend", json!({"agent": {"image": "i", "backend": "qemu"}}), "spec.agent.backend: Unsupported value"),
            ("bad-conn", json!({"agent": {"image": "i", "connType": "telnet"}}), "spec.agent.connType: Unsupported value"),
            ("bad-probe-port", json!({"agent": {"image": "i", "probePort": 70000}}), "spec.agent.probePort"),
            ("bad-class-pattern", json!({"snapshotCompatibilityClass": "-skylake", "agent": {"image": "i"}}), "spec.snapshotCompatibilityClass in body should match"),
            ("bad-class-length", json!({"snapshotCompatibilityClass": "a".repeat(64), "agent": {"image": "i"}}), "spec.snapshotCompatibilityClass: Too long"),
            ("bad-toolbox-name", json!({"agent": {"image": "i"}, "toolboxes": [{"name": "Bad_Name"}]}), "spec.toolboxes[0].name in body should match"),
            ("long-toolbox-name", json!({"agent": {"image": "i"}, "toolboxes": [{"name": "a".repeat(64)}]}), "spec.toolboxes[0].name: Too long"),
            ("nameless-toolbox", json!({"agent": {"image": "i"}, "toolboxes": [{"image": "x"}]}), "spec.toolboxes[0].name: Required value"),
            ("dup-toolbox", json!({"agent": {"image": "i"}, "toolboxes": [{"name": "tb"}, {"name": "tb"}]}), "spec.toolboxes[1]: Duplicate value"),
            ("bad-toolbox-mode", json!({"agent": {"image": "i"}, "toolboxes": [{"name": "tb", "mode": "fork"}]}), "spec.toolboxes[0].mode: Unsupported value"),
            ("bad-vnc-port", json!({"agent": {"image": "i"}, "toolboxes": [{"name": "tb", "mode": "static", "vncPort": -1}]}), "spec.toolboxes[0].vncPort"),
        ];
        for (name, spec, want) in rejected {
            let msg = create(&sets, &cocoonset(name, spec)).await;
            let msg = msg.unwrap_or_else(|| panic!("{name}: the API server accepted an invalid CocoonSet"));
            assert!(msg.contains(want), "{name}: message {msg:?} lacks {want:?}");
        }

        // Accepted on create.
        let accepted: Vec<(&str, Value)> = vec![
            ("release-lone-main", json!({"hibernatePolicy": "release", "agent": {"image": "i"}})),
            ("release-zero", json!({"hibernatePolicy": "release", "agent": {"image": "i", "replicas": 0}, "toolboxes": []})),
            ("retain-full", json!({"agent": {"image": "i", "replicas": 3, "connType": "vnc", "storage": "10Gi", "probePort": 22},
                                   "toolboxes": [{"name": "tb", "mode": "static", "staticIP": "10.1.2.3", "staticVMID": "x", "vncPort": 5901}, {"name": "db-0"}]})),
            ("class-set", json!({"snapshotCompatibilityClass": "skylake-v1", "agent": {"image": "i"}})),
            ("minimal", json!({"agent": {"image": "i"}})),
        ];
        for (name, spec) in accepted {
            assert_eq!(create(&sets, &cocoonset(name, spec)).await, None, "{name} must be accepted");
        }

        // The server applies the schema defaults.
        let typed: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        let minimal = typed.get("minimal").await?;
        assert_eq!(minimal.spec, cocoon_api::CocoonSetSpec::with_image("i"));
        let raw = sets.get("minimal").await?;
        assert_eq!(
            raw.data["spec"],
            json!({"snapshotPolicy": "always", "hibernatePolicy": "retain", "nodePool": "default",
                   "agent": {"image": "i", "replicas": 0, "mode": "clone", "os": "linux", "backend": "cloud-hypervisor"}})
        );
        let full = typed.get("retain-full").await?;
        assert_eq!(full.spec.toolboxes[1].mode.as_str(), "run");

        // Rule 2, a transition rule: unset -> set is fine; set -> changed or removed is not.
        let with_class = |class: Option<&str>| {
            let mut spec = json!({"agent": {"image": "i"}});
            if let Some(c) = class {
                spec["snapshotCompatibilityClass"] = json!(c);
            }
            spec
        };
        const IMMUTABLE: &str = "snapshotCompatibilityClass is immutable once set";
        assert_eq!(update_spec(&sets, "minimal", with_class(Some("icelake"))).await, None, "unset -> set");
        assert_eq!(update_spec(&sets, "class-set", with_class(Some("skylake-v1"))).await, None, "unchanged");
        let changed = update_spec(&sets, "class-set", with_class(Some("icelake"))).await;
        assert!(changed.as_deref().is_some_and(|m| m.contains(IMMUTABLE)), "changed: {changed:?}");
        let removed = update_spec(&sets, "class-set", with_class(None)).await;
        assert!(removed.as_deref().is_some_and(|m| m.contains(IMMUTABLE)), "removed: {removed:?}");

        // An unknown policy is refused on update too.
        let dropped = update_spec(&sets, "minimal", json!({"hibernatePolicy": "Release", "agent": {"image": "i"}})).await;
        assert!(dropped.as_deref().is_some_and(|m| m.contains("must be retain or release")), "dropped: {dropped:?}");

        // Rule 1 also holds on update.
        let grown = update_spec(&sets, "release-lone-main", json!({"hibernatePolicy": "release", "agent": {"image": "i", "replicas": 2}})).await;
        assert!(grown.as_deref().is_some_and(|m| m.contains(RELEASE)), "grown: {grown:?}");

        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await;
}

#[tokio::test]
async fn cocoonhibernation_validation() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "crd-ch").await?;
        let chs = api::<CocoonHibernation>(&client, &ns);

        let rejected: Vec<(&str, Value, &str)> = vec![
            (
                "no-desire",
                json!({"podRef": {"name": "p"}}),
                "spec.desire: Required value",
            ),
            (
                "bad-desire",
                json!({"podRef": {"name": "p"}, "desire": "Sleep"}),
                "spec.desire: Unsupported value: \"Sleep\"",
            ),
            (
                "no-podref",
                json!({"desire": "Wake"}),
                "spec.podRef: Required value",
            ),
            (
                "empty-pod",
                json!({"podRef": {"name": ""}, "desire": "Wake"}),
                "spec.podRef.name",
            ),
        ];
        for (name, spec, want) in rejected {
            let msg = create(&chs, &hibernation(name, spec)).await;
            let msg = msg.unwrap_or_else(|| {
                panic!("{name}: the API server accepted an invalid CocoonHibernation")
            });
            assert!(msg.contains(want), "{name}: message {msg:?} lacks {want:?}");
        }

        assert_eq!(
            create(
                &chs,
                &hibernation(
                    "demo-0",
                    json!({"podRef": {"name": "demo-0"}, "desire": "Hibernate"})
                )
            )
            .await,
            None
        );
        // Flipping the desire is how wake works; the pod reference never changes.
        assert_eq!(
            update_spec(
                &chs,
                "demo-0",
                json!({"podRef": {"name": "demo-0"}, "desire": "Wake"})
            )
            .await,
            None
        );
        let moved = update_spec(
            &chs,
            "demo-0",
            json!({"podRef": {"name": "demo-1"}, "desire": "Wake"}),
        )
        .await;
        assert!(
            moved
                .as_deref()
                .is_some_and(|m| m.contains("spec.podRef is immutable")),
            "podRef change: {moved:?}"
        );

        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await;
}

/// Issue 36 item 6: `kubectl scale cocoonset/x --replicas 3` sets `spec.agent.replicas` through
/// the /scale subresource, whose status count is `status.replicas`; `kubectl get cset` finds
/// the set by its short name.
#[tokio::test]
async fn kubectl_scale_sets_the_sub_agents_and_cset_names_the_kind() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "crd-scale").await?;
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        sets.create(
            &PostParams::default(),
            &CocoonSet::new("x", cocoon_api::CocoonSetSpec::with_image("i")),
        )
        .await?;
        let kubectl = |args: &[&str]| {
            let out = env
                .kubectl()
                .args(["-n", &ns])
                .args(args)
                .output()
                .expect("run kubectl");
            assert!(
                out.status.success(),
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        kubectl(&["scale", "cocoonset/x", "--replicas", "3"]);
        assert_eq!(
            sets.get("x").await?.spec.agent.replicas,
            3,
            "scaled through /scale"
        );
        // The status subresource's count is what the scale reports (the operator writes it).
        let mut status = sets.get_status("x").await?;
        status.status = Some(cocoon_api::crd::set::CocoonSetStatus {
            replicas: 2,
            ..Default::default()
        });
        sets.replace_status("x", &PostParams::default(), &status)
            .await?;
        let scale: Value = serde_json::from_str(&kubectl(&[
            "get",
            "cset",
            "x",
            "--subresource=scale",
            "-o",
            "json",
        ]))?;
        assert_eq!(scale["kind"], "Scale");
        assert_eq!(scale["spec"]["replicas"], 3);
        assert_eq!(scale["status"]["replicas"], 2);
        // --current-replicas checks the spec count, then updates the scale.
        kubectl(&[
            "scale",
            "cset/x",
            "--current-replicas",
            "3",
            "--replicas",
            "0",
        ]);
        assert_eq!(sets.get("x").await?.spec.agent.replicas, 0);
        // `cset` names the kind (Go's `cs` stays in the CRD, but kubectl resolves it to
        // componentstatuses first).
        assert!(
            kubectl(&["get", "cset", "-o", "name"])
                .contains("cocoonset.cocoonset.cocoonstack.io/x")
        );

        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await;
}
