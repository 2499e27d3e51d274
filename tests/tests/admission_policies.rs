//! The admission policies of manifests/admission/policies.yaml (the Go cocoon-webhook's rules)
//! against the real API server: for every rule an allowed and a refused object, the refusal
//! naming the field. The policies are cluster-wide; so that they cannot refuse what other tests
//! running on the same control plane create, the test applies them under names of its own with
//! bindings narrowed to its own namespace (the policies themselves as shipped).

use std::path::Path;
use std::time::Duration;

use cocoon_api::{CocoonHibernation, CocoonSet};
use cocoon_e2e::workspace_root;
use cocoon_testenv::{Shared, unique_name};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use kube::{Client, Resource};
use serde_json::{Value, json};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const WAIT: Duration = Duration::from_secs(60);
const OPERATOR_NS: &str = "cocoon-system";
const OPERATOR_SA: &str = "cocoon-operator";

fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..Default::default()
    }
}

fn api<K: Resource<DynamicType = ()>>(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &ApiResource::erase::<K>(&()))
}

fn object(kind: &str, name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "cocoonset.cocoonstack.io/v1", "kind": kind,
        "metadata": {"name": name}, "spec": spec
    }))
    .expect("object")
}

/// A pod with these tolerations and owner references, unschedulable (its node selector matches
/// no node), so that a pod really created is never bound and deletes at once.
fn pod(name: &str, tolerations: Value, owners: Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "ownerReferences": owners},
        "spec": {
            "nodeSelector": {"cocoonstack.io/pool": "admission-policies-test-no-such-pool"},
            "containers": [{"name": "agent", "image": "cocoon/vm"}],
            "tolerations": tolerations
        }
    }))
    .expect("pod")
}

fn cocoon_toleration() -> Value {
    json!({"key": "virtual-kubelet.io/provider", "operator": "Exists"})
}

fn cocoonset_owner() -> Value {
    json!([{"apiVersion": "cocoonset.cocoonstack.io/v1", "kind": "CocoonSet", "name": "demo",
        "uid": "00000000-0000-0000-0000-000000000001", "controller": true}])
}

/// The refusal of `res`: its HTTP code and message; panics (failing the test) when admitted.
fn refusal<T: std::fmt::Debug>(what: &str, res: Result<T, kube::Error>) -> (u16, String) {
    match res {
        Err(kube::Error::Api(e)) => (e.code, e.message),
        other => panic!("{what}: expected a refusal, got {other:?}"),
    }
}

/// Whether `res` is a refusal whose message contains `text`.
fn refused_with<T>(res: Result<T, kube::Error>, text: &str) -> bool {
    matches!(res, Err(kube::Error::Api(e)) if e.message.contains(text))
}

fn admitted<T>(what: &str, res: Result<T, kube::Error>) {
    if let Err(e) = res {
        panic!("{what}: expected it admitted, got {e}");
    }
}

async fn client_for(kubeconfig: &Path) -> Result<Client, BoxError> {
    Ok(cocoon_testenv::client_for(kubeconfig).await?)
}

/// The shipped policies and bindings, renamed `<prefix>-<name>`, each binding narrowed to `ns`.
fn test_copies(prefix: &str, ns: &str) -> (Vec<Value>, Vec<Value>) {
    let text = std::fs::read_to_string(workspace_root().join("manifests/admission/policies.yaml"))
        .expect("manifests/admission/policies.yaml");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("a YAML stream");
    let (mut policies, mut bindings) = (Vec::new(), Vec::new());
    for mut doc in docs {
        let name = format!("{prefix}-{}", doc["metadata"]["name"].as_str().unwrap());
        doc["metadata"]["name"] = json!(name);
        match doc["kind"].as_str().unwrap() {
            "ValidatingAdmissionPolicy" => policies.push(doc),
            "ValidatingAdmissionPolicyBinding" => {
                assert!(
                    doc["spec"].get("matchResources").is_none(),
                    "shipped bindings hold every namespace"
                );
                assert_eq!(doc["spec"]["validationActions"], json!(["Deny"]));
                let policy = format!("{prefix}-{}", doc["spec"]["policyName"].as_str().unwrap());
                doc["spec"]["policyName"] = json!(policy);
                doc["spec"]["matchResources"] = json!({"namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": ns}}});
                bindings.push(doc);
            }
            other => panic!("unexpected {other} in policies.yaml"),
        }
    }
    assert_eq!((policies.len(), bindings.len()), (3, 3));
    (policies, bindings)
}

/// A ServiceAccount `namespace/name` (created unless it exists) allowed to edit `ns`, and a
/// client authenticating as it.
async fn service_account(
    env: &Shared,
    admin: &Client,
    namespace: &str,
    name: &str,
    ns: &str,
    dir: &Path,
) -> Result<Client, BoxError> {
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": namespace}}))?;
    match Api::<ServiceAccount>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &sa)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("{namespace}-{name}-edit"), "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]
    }))?;
    Api::<RoleBinding>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &binding)
        .await?;
    let dir = dir.join(format!("{namespace}-{name}"));
    std::fs::create_dir_all(&dir)?;
    client_for(&env.service_account_kubeconfig(namespace, name, "1h", &dir)?).await
}

/// Waits until `probe` (a create the policy refuses) is refused: policies and bindings take
/// effect asynchronously.
async fn in_force<F, Fut>(what: &str, mut probe: F) -> Result<(), BoxError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    cocoon_testenv::wait_until(&format!("policy {what} in force"), WAIT, || {
        let refused = probe();
        async move { refused.await.then_some(()) }
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn the_webhook_rules_hold_on_the_real_api_server() {
    cocoon_testenv::run_test(|env| async move {
        let admin = env.client()?;
        let ns = cocoon_testenv::create_namespace(&admin, "vap").await?;
        let prefix = unique_name("vap");
        let tmp = tempfile::tempdir()?;
        let sets = api::<CocoonSet>(&admin, &ns);
        let hibernations = api::<CocoonHibernation>(&admin, &ns);

        // An invalid CocoonSet admitted before the policies: it must stay writable (metadata,
        // finalizers) and deletable afterwards.
        let legacy = object(
            "CocoonSet",
            "legacy",
            json!({"agent": {"image": "win:11", "mode": "run", "backend": "firecracker", "os": "windows"}}),
        );
        sets.create(&PostParams::default(), &legacy).await?;

        // The identities, each allowed to edit the namespace (RBAC in force before the
        // policies, so that no refusal below is RBAC's).
        let tenant = service_account(env, &admin, &ns, "tenant", &ns, tmp.path()).await?;
        cocoon_testenv::ensure_namespace(&admin, OPERATOR_NS).await?;
        let operator =
            service_account(env, &admin, OPERATOR_NS, OPERATOR_SA, &ns, tmp.path()).await?;
        let extra = service_account(env, &admin, &ns, "extra", &ns, tmp.path()).await?;
        let pods_as = |c: &Client| Api::<Pod>::namespaced(c.clone(), &ns);
        for (who, c) in [("tenant", &tenant), ("operator", &operator), ("extra", &extra)] {
            cocoon_testenv::wait_until(&format!("{who} may create pods"), WAIT, || async {
                let plain = pod("plain", json!([]), json!([]));
                pods_as(c).create(&dry_run(), &plain).await.ok()
            })
            .await?;
        }

        let (policies, bindings) = test_copies(&prefix, &ns);
        let vaps: Api<ValidatingAdmissionPolicy> = Api::all(admin.clone());
        let vapbs: Api<ValidatingAdmissionPolicyBinding> = Api::all(admin.clone());
        for p in &policies {
            vaps.create(&PostParams::default(), &serde_json::from_value(p.clone())?)
                .await?;
        }
        for b in &bindings {
            vapbs
                .create(&PostParams::default(), &serde_json::from_value(b.clone())?)
                .await?;
        }
        let bare = pod("bare", json!([cocoon_toleration()]), json!([]));
        in_force("cocoon-hibernation-name", || async {
            let cr = object(
                "CocoonHibernation",
                "other",
                json!({"podRef": {"name": "p"}, "desire": "Hibernate"}),
            );
            refused_with(hibernations.create(&dry_run(), &cr).await, "metadata.name")
        })
        .await?;
        in_force("cocoon-pod-owner", || async {
            refused_with(
                pods_as(&tenant).create(&dry_run(), &bare).await,
                "metadata.ownerReferences",
            )
        })
        .await?;
        in_force("cocoon-set-spec", || async {
            let cs = object(
                "CocoonSet",
                "probe",
                json!({"agent": {"image": "i", "backend": "firecracker"}}),
            );
            refused_with(sets.create(&dry_run(), &cs).await, "spec.agent.mode")
        })
        .await?;

        // One CocoonHibernation per pod, named after it.
        let hib = |name: &str, pod: &str| {
            object("CocoonHibernation", name, json!({"podRef": {"name": pod}, "desire": "Hibernate"}))
        };
        hibernations.create(&PostParams::default(), &hib("pod-a", "pod-a")).await?;
        let (code, msg) = refusal(
            "a second CR for pod-a under another name",
            hibernations.create(&dry_run(), &hib("pod-a-again", "pod-a")).await,
        );
        assert_eq!(code, 422, "{msg}");
        assert!(msg.contains("metadata.name: must equal spec.podRef.name (pod-a)"), "{msg}");
        let (code, msg) = refusal(
            "a second CR for pod-a under its name",
            hibernations.create(&dry_run(), &hib("pod-a", "pod-a")).await,
        );
        assert_eq!(code, 409, "AlreadyExists: {msg}");
        admitted("a CR for pod-b", hibernations.create(&dry_run(), &hib("pod-b", "pod-b")).await);
        // Only create is checked (the CRD keeps spec.podRef immutable): a later write passes.
        hibernations
            .patch(
                "pod-a",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"desire": "Wake"}})),
            )
            .await?;

        // A pod tolerating the cocoon taint: owned by a CocoonSet, or created by an allowed
        // identity.
        let (code, msg) = refusal(
            "a bare cocoon pod by a tenant",
            pods_as(&tenant).create(&dry_run(), &bare).await,
        );
        assert_eq!(code, 403, "{msg}");
        for part in [
            "metadata.ownerReferences: a pod that tolerates the cocoon taint (spec.tolerations[0].key",
            &format!("not system:serviceaccount:{ns}:tenant"),
        ] {
            assert!(msg.contains(part), "{part} in {msg}");
        }
        let second = pod(
            "second",
            json!([{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
                {"key": "virtual-kubelet.io/provider", "operator": "Equal", "value": "cocoon", "effect": "NoSchedule"}]),
            json!([]),
        );
        let (_, msg) = refusal(
            "the cocoon toleration second in the list",
            pods_as(&tenant).create(&dry_run(), &second).await,
        );
        assert!(msg.contains("spec.tolerations[1].key"), "{msg}");
        let (_, msg) = refusal(
            "a bare cocoon pod by the cluster admin",
            pods_as(&admin).create(&dry_run(), &bare).await,
        );
        assert!(msg.contains("metadata.ownerReferences"), "{msg}");
        let fake_owner = pod(
            "fake-owner",
            json!([cocoon_toleration()]),
            json!([{"apiVersion": "example.com/v1", "kind": "CocoonSet", "name": "demo",
                "uid": "00000000-0000-0000-0000-000000000002"}]),
        );
        refusal(
            "an owner of kind CocoonSet in another group",
            pods_as(&tenant).create(&dry_run(), &fake_owner).await,
        );
        admitted(
            "the bare cocoon pod by the operator",
            pods_as(&operator).create(&dry_run(), &bare).await,
        );
        let owned = pod("owned", json!([cocoon_toleration()]), cocoonset_owner());
        admitted(
            "a pod owned by a CocoonSet",
            pods_as(&tenant).create(&dry_run(), &owned).await,
        );
        admitted(
            "a pod without the cocoon toleration",
            pods_as(&tenant)
                .create(&dry_run(), &pod("plain", json!([]), json!([])))
                .await,
        );
        admitted(
            "a pod tolerating every taint (no key)",
            pods_as(&tenant)
                .create(&dry_run(), &pod("wildcard", json!([{"operator": "Exists"}]), json!([])))
                .await,
        );
        // An update that adds the toleration is a create for this rule; other updates of a
        // cocoon pod are not checked.
        pods_as(&tenant)
            .create(&PostParams::default(), &pod("later", json!([]), json!([])))
            .await?;
        let add = Patch::Merge(json!({"spec": {"tolerations": [cocoon_toleration()]}}));
        let dry_patch = PatchParams {
            dry_run: true,
            ..Default::default()
        };
        let (_, msg) = refusal(
            "a tenant adding the cocoon toleration",
            pods_as(&tenant).patch("later", &dry_patch, &add).await,
        );
        assert!(msg.contains("metadata.ownerReferences"), "{msg}");
        pods_as(&operator)
            .patch("later", &PatchParams::default(), &add)
            .await?;
        admitted(
            "a tenant labelling the operator's cocoon pod",
            pods_as(&tenant)
                .patch(
                    "later",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": {"team": "a"}}})),
                )
                .await,
        );

        // The allowed identities are the variable allowedCreators: listing one more admits it.
        let (_, msg) = refusal(
            "a bare cocoon pod by the extra identity",
            pods_as(&extra).create(&dry_run(), &bare).await,
        );
        assert!(msg.contains(&format!("not system:serviceaccount:{ns}:extra")), "{msg}");
        let owner_policy = format!("{prefix}-cocoon-pod-owner");
        let mut policy = vaps.get(&owner_policy).await?;
        let vars = policy.spec.as_mut().and_then(|s| s.variables.as_mut()).expect("variables");
        assert_eq!(vars[0].name, "allowedCreators");
        assert_eq!(
            vars[0].expression,
            format!(r#"["system:serviceaccount:{OPERATOR_NS}:{OPERATOR_SA}"]"#)
        );
        vars[0].expression = format!(
            r#"["system:serviceaccount:{OPERATOR_NS}:{OPERATOR_SA}", "system:serviceaccount:{ns}:extra"]"#
        );
        vaps.replace(&owner_policy, &PostParams::default(), &policy).await?;
        cocoon_testenv::wait_until("the extra identity allowed", WAIT, || async {
            pods_as(&extra).create(&dry_run(), &bare).await.ok()
        })
        .await?;
        refusal(
            "the tenant still refused",
            pods_as(&tenant).create(&dry_run(), &bare).await,
        );

        // The CocoonSet rules. Allowed: (name, spec).
        let mut allowed: Vec<(&str, Value)> = vec![
            ("minimal", json!({"agent": {"image": "ghcr.io/cocoonstack/cocoon/ubuntu:24.04"}})),
            ("clone-repo", json!({"agent": {"image": "ubuntu", "mode": "clone"}})),
            ("run-digest", json!({"agent": {"image": "ubuntu@sha256:deadbeef", "mode": "run"}})),
            ("run-port", json!({"agent": {"image": "registry:5000/ubuntu:24.04", "mode": "run"}})),
            ("ch-url", json!({"agent": {"image": "https://cloud-images.ubuntu.com/x.img", "mode": "run"}})),
            ("ch-windows", json!({"agent": {"image": "win:11", "os": "windows"}})),
            ("fc-run", json!({"agent": {"image": "ghcr.io/cocoonstack/cocoon/ubuntu:24.04", "mode": "run", "backend": "firecracker"}})),
            ("fc-static", json!({"agent": {"image": "ubuntu:24.04", "mode": "run", "backend": "firecracker"},
                "toolboxes": [{"name": "box", "mode": "static", "staticIP": "10.1.2.3", "staticVMID": "vm-a", "connType": "rdp"}]})),
            ("fc-toolbox", json!({"agent": {"image": "ubuntu:24.04", "mode": "run", "backend": "firecracker"},
                "toolboxes": [{"name": "tb", "image": "tools:v1", "backend": "firecracker"}]})),
            ("toolboxes", json!({"agent": {"image": "ubuntu:24.04"}, "toolboxes": [
                {"name": "run", "image": "https://example.com/tools.img"},
                {"name": "clone", "mode": "clone", "image": "team/tools:v1.2_3"},
                {"name": "1a", "image": "tools"},
                {"name": "static", "mode": "static", "staticIP": "10.0.0.9", "staticVMID": "qemu-1"}]})),
            // Beyond int64: not an integer for strconv.Atoi either.
            ("big-number", json!({"agent": {"image": "i"}, "toolboxes": [{"name": "99999999999999999999", "image": "t"}]})),
        ];
        // Many toolboxes stay well inside the policies' CEL cost budget.
        let many: Vec<Value> = (0..300)
            .map(|i| json!({"name": format!("tb-{i}"), "mode": "clone", "image": format!("team/tools-{i}:v1")}))
            .collect();
        allowed.push(("many", json!({"agent": {"image": "ubuntu:24.04"}, "toolboxes": many})));
        for (name, spec) in allowed {
            admitted(name, sets.create(&dry_run(), &object("CocoonSet", name, spec)).await);
        }
        // Refused: (name, spec, text the message must contain).
        let tb = |with: Value| {
            let mut t = json!({"name": "tb", "image": "tools:v1"});
            t.as_object_mut().unwrap().extend(with.as_object().unwrap().clone());
            t
        };
        let fc = json!({"image": "ubuntu:24.04", "mode": "run", "backend": "firecracker"});
        let refused: Vec<(&str, Value, &str)> = vec![
            ("fc-windows", json!({"agent": {"image": "win:11", "mode": "run", "backend": "firecracker", "os": "windows"}}),
                "spec.agent.os: firecracker does not support Windows guests"),
            ("fc-url", json!({"agent": {"image": "https://cloud-images.ubuntu.com/x.img", "mode": "run", "backend": "firecracker"}}),
                "spec.agent.image: firecracker needs an OCI image, not a cloud-image URL"),
            ("fc-http-url", json!({"agent": {"image": "http://mirror.lan/x.qcow2", "mode": "run", "backend": "firecracker"}}),
                "spec.agent.image: firecracker needs an OCI image"),
            ("fc-clone", json!({"agent": {"image": "ubuntu:24.04", "mode": "clone", "backend": "firecracker"}}),
                "spec.agent.mode: firecracker does not support mode clone"),
            ("fc-default-clone", json!({"agent": {"image": "ubuntu:24.04", "backend": "firecracker"}}),
                "spec.agent.mode: firecracker does not support mode clone"),
            ("clone-digest", json!({"agent": {"image": "ubuntu@sha256:deadbeef"}}),
                "spec.agent.image: must be repo[:tag] in clone mode (no registry port, no digest), not ubuntu@sha256:deadbeef"),
            ("clone-port", json!({"agent": {"image": "registry:5000/ubuntu:24.04"}}),
                "spec.agent.image: must be repo[:tag]"),
            ("clone-upper", json!({"agent": {"image": "Ubuntu:24.04"}}), "spec.agent.image: must be repo[:tag]"),
            ("clone-empty-tag", json!({"agent": {"image": "ubuntu:"}}), "spec.agent.image: must be repo[:tag]"),
            ("numeric", json!({"agent": {"image": "i"}, "toolboxes": [tb(json!({})), tb(json!({"name": "0"}))]}),
                "spec.toolboxes[1].name: must not be an integer (0)"),
            ("numeric-zeros", json!({"agent": {"image": "i"}, "toolboxes": [tb(json!({"name": "007"}))]}),
                "spec.toolboxes[0].name: must not be an integer (007)"),
            ("numeric-max", json!({"agent": {"image": "i"}, "toolboxes": [tb(json!({"name": "9223372036854775807"}))]}),
                "spec.toolboxes[0].name: must not be an integer"),
            ("static-no-ip", json!({"agent": {"image": "i"}, "toolboxes": [tb(json!({})),
                {"name": "st", "mode": "static", "staticVMID": "vm-a"}]}),
                "spec.toolboxes[1].staticIP: required for a static toolbox"),
            ("static-empty-ip", json!({"agent": {"image": "i"}, "toolboxes": [
                {"name": "st", "mode": "static", "staticIP": "", "staticVMID": "vm-a"}]}),
                "spec.toolboxes[0].staticIP: required for a static toolbox"),
            ("static-no-vmid", json!({"agent": {"image": "i"}, "toolboxes": [
                {"name": "st", "mode": "static", "staticIP": "10.0.0.1"}]}),
                "spec.toolboxes[0].staticVMID: required for a static toolbox"),
            ("no-image", json!({"agent": {"image": "i"}, "toolboxes": [{"name": "tb"}]}),
                "spec.toolboxes[0].image: required for a run or clone toolbox"),
            ("clone-no-image", json!({"agent": {"image": "i"}, "toolboxes": [{"name": "tb", "mode": "clone"}]}),
                "spec.toolboxes[0].image: required for a run or clone toolbox"),
            ("other-backend", json!({"agent": fc, "toolboxes": [tb(json!({}))]}),
                "spec.toolboxes[0].backend: must equal spec.agent.backend (firecracker)"),
            ("other-backend-fc", json!({"agent": {"image": "i"}, "toolboxes": [tb(json!({"backend": "firecracker"}))]}),
                "spec.toolboxes[0].backend: must equal spec.agent.backend (cloud-hypervisor)"),
            ("tb-fc-windows", json!({"agent": fc, "toolboxes": [tb(json!({"backend": "firecracker", "os": "windows"}))]}),
                "spec.toolboxes[0].os: firecracker does not support Windows guests"),
            ("tb-fc-url", json!({"agent": fc, "toolboxes": [tb(json!({"backend": "firecracker", "image": "https://x.example/y.img"}))]}),
                "spec.toolboxes[0].image: firecracker needs an OCI image"),
            ("tb-fc-clone", json!({"agent": fc, "toolboxes": [tb(json!({"backend": "firecracker", "mode": "clone"}))]}),
                "spec.toolboxes[0].mode: firecracker does not support mode clone"),
            ("tb-clone-port", json!({"agent": {"image": "i"}, "toolboxes": [tb(json!({"mode": "clone", "image": "reg:5000/tools:v1"}))]}),
                "spec.toolboxes[0].image: must be repo[:tag] in clone mode"),
            ("tb-clone-digest", json!({"agent": {"image": "i"}, "toolboxes": [tb(json!({"mode": "clone", "image": "tools@sha256:abc"}))]}),
                "spec.toolboxes[0].image: must be repo[:tag] in clone mode"),
            // Held by the CRD schema already (not repeated in the policy): unique names (a
            // list-map keyed by name), the DNS-1123 label, the enums.
            ("duplicate", json!({"agent": {"image": "i"}, "toolboxes": [tb(json!({})), tb(json!({}))]}),
                "spec.toolboxes[1]: Duplicate value"),
            ("bad-name", json!({"agent": {"image": "i"}, "toolboxes": [tb(json!({"name": "Bad_Name"}))]}),
                "spec.toolboxes[0].name in body should match"),
            ("long-name", json!({"agent": {"image": "i"}, "toolboxes": [tb(json!({"name": "a".repeat(64)}))]}),
                "spec.toolboxes[0].name: Too long"),
            ("static-bad-conn", json!({"agent": {"image": "i"}, "toolboxes": [
                {"name": "st", "mode": "static", "staticIP": "10.0.0.1", "staticVMID": "vm", "connType": "telnet"}]}),
                "spec.toolboxes[0].connType: Unsupported value"),
            ("tb-bad-backend", json!({"agent": {"image": "i"}, "toolboxes": [tb(json!({"backend": "qemu"}))]}),
                "spec.toolboxes[0].backend: Unsupported value"),
        ];
        for (name, spec, want) in refused {
            let (code, msg) = refusal(name, sets.create(&dry_run(), &object("CocoonSet", name, spec)).await);
            assert_eq!(code, 422, "{name}: {msg}");
            assert!(msg.contains(want), "{name}: want {want:?} in {msg}");
        }

        // The shipped samples pass.
        for f in std::fs::read_dir(workspace_root().join("manifests/samples"))? {
            let path = f?.path();
            let docs: Vec<DynamicObject> =
                serde_saphyr::from_multiple(&std::fs::read_to_string(&path)?)?;
            for doc in docs {
                let kind = doc.types.as_ref().map(|t| t.kind.clone()).unwrap_or_default();
                let api = match kind.as_str() {
                    "CocoonSet" => &sets,
                    "CocoonHibernation" => &hibernations,
                    other => panic!("{}: unexpected {other}", path.display()),
                };
                admitted(&path.display().to_string(), api.create(&dry_run(), &doc).await);
            }
        }

        // Updates: a spec change is checked, a metadata-only write of an object admitted before
        // the policy is not; it stays deletable.
        let valid = object("CocoonSet", "valid", json!({"agent": {"image": "ubuntu:24.04", "mode": "run", "backend": "firecracker"}}));
        sets.create(&PostParams::default(), &valid).await?;
        let (_, msg) = refusal(
            "a spec change into an invalid spec",
            sets.patch("valid", &PatchParams::default(), &Patch::Merge(json!({"spec": {"agent": {"mode": "clone"}}})))
                .await,
        );
        assert!(msg.contains("spec.agent.mode: firecracker"), "{msg}");
        sets.patch(
            "legacy",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "a"}, "finalizers": ["example.com/hold"]}})),
        )
        .await?;
        let (_, msg) = refusal(
            "a spec change of the legacy object that keeps it invalid",
            sets.patch("legacy", &PatchParams::default(), &Patch::Merge(json!({"spec": {"agent": {"image": "win:12"}}})))
                .await,
        );
        assert!(msg.contains("spec.agent.os: firecracker"), "{msg}");
        sets.patch(
            "legacy",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await?;
        sets.delete("legacy", &DeleteParams::default()).await?;

        for b in &bindings {
            vapbs.delete(b["metadata"]["name"].as_str().unwrap(), &DeleteParams::default()).await?;
        }
        for p in &policies {
            vaps.delete(p["metadata"]["name"].as_str().unwrap(), &DeleteParams::default()).await?;
        }
        cocoon_testenv::delete_namespace(&admin, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}
