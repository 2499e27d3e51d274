//! The CRDs as crds.md specifies them: names, columns, defaults, validation and CEL rules
//! evaluated locally, and the committed YAML in manifests/crds/ and charts/cocoon/files/crds/
//! (which the chart's templates/crds.yaml renders) matching the code.

use cocoon_api::crd::{self, checkpoint, hibernation, set};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Value, json};

fn cocoonset_crd() -> CustomResourceDefinition {
    crd::all().remove(0)
}
fn hibernation_crd() -> CustomResourceDefinition {
    crd::all().remove(1)
}

fn schema_of(crd: &CustomResourceDefinition) -> Value {
    serde_json::to_value(
        crd.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .expect("schema"),
    )
    .expect("json")
}

fn cs(spec: Value) -> Value {
    json!({"apiVersion": "cocoonset.cocoonstack.io/v1", "kind": "CocoonSet",
           "metadata": {"name": "demo", "namespace": "ns"}, "spec": spec})
}

fn ch(spec: Value) -> Value {
    json!({"apiVersion": "cocoonset.cocoonstack.io/v1", "kind": "CocoonHibernation",
           "metadata": {"name": "demo-0", "namespace": "ns"}, "spec": spec})
}

fn messages(r: Result<(), crd::ValidationErrors>) -> Vec<String> {
    match r {
        Ok(()) => vec![],
        Err(errs) => errs.iter().map(|e| e.message.clone()).collect(),
    }
}

#[test]
fn names_scope_and_category() {
    for (crd, kind, plural, singular, short, list) in [
        (
            cocoonset_crd(),
            "CocoonSet",
            "cocoonsets",
            "cocoonset",
            &["cset", "cs", "cocoonsets"][..],
            "CocoonSetList",
        ),
        (
            hibernation_crd(),
            "CocoonHibernation",
            "cocoonhibernations",
            "cocoonhibernation",
            &["ch", "cocoonhibernations"][..],
            "CocoonHibernationList",
        ),
    ] {
        assert_eq!(crd.spec.group, "cocoonset.cocoonstack.io");
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(crd.spec.names.kind, kind);
        assert_eq!(crd.spec.names.plural, plural);
        assert_eq!(crd.spec.names.singular.as_deref(), Some(singular));
        assert_eq!(crd.spec.names.list_kind.as_deref().unwrap_or(list), list);
        assert_eq!(
            crd.spec.names.short_names.as_deref(),
            Some(&short.iter().map(|s| s.to_string()).collect::<Vec<_>>()[..])
        );
        assert_eq!(
            crd.spec.names.categories.as_deref(),
            Some(&["cocoon".to_string()][..])
        );
        assert_eq!(crd.spec.versions.len(), 1);
        let v = &crd.spec.versions[0];
        assert_eq!(v.name, "v1");
        assert!(v.served && v.storage);
        assert!(
            v.subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some()
        );
    }
}

/// `kubectl scale cocoonset/x --replicas N` writes `spec.agent.replicas` (the sub-agents);
/// the scale's status count is `status.replicas`, the sub-agent pods that exist.
#[test]
fn scale_subresource_on_the_sub_agents() {
    let crd = cocoonset_crd();
    let scale = crd.spec.versions[0]
        .subresources
        .as_ref()
        .and_then(|s| s.scale.as_ref())
        .expect("scale subresource");
    assert_eq!(scale.spec_replicas_path, ".spec.agent.replicas");
    assert_eq!(scale.status_replicas_path, ".status.replicas");
    assert_eq!(scale.label_selector_path, None);
    let status = &schema_of(&crd)["properties"]["status"]["properties"]["replicas"];
    assert_eq!(status["type"], "integer");
    // A hibernation has no replicas to scale.
    let h = hibernation_crd();
    assert!(
        h.spec.versions[0]
            .subresources
            .as_ref()
            .is_some_and(|s| s.scale.is_none())
    );
}

/// An unknown `spec.hibernatePolicy` is refused with cocoon-webhook's message.
#[test]
fn cel_hibernate_policy_is_retain_or_release() {
    let crd = cocoonset_crd();
    for (policy, ok) in [
        ("retain", true),
        ("release", true),
        ("drop", false),
        ("", false),
        ("Retain", false),
    ] {
        let got = messages(crd::validate_cel(
            &crd,
            &cs(json!({"hibernatePolicy": policy, "agent": {"image": "i"}})),
            None,
        ));
        if ok {
            assert!(got.is_empty(), "{policy:?}: expected accepted, got {got:?}");
        } else {
            assert_eq!(
                got,
                vec![set::MSG_HIBERNATE_POLICY.to_string()],
                "{policy:?}"
            );
        }
    }
    assert_eq!(set::MSG_HIBERNATE_POLICY, "must be retain or release");
}

#[test]
fn printer_columns() {
    let cols = |crd: CustomResourceDefinition| -> Vec<(String, String, String)> {
        crd.spec.versions[0]
            .additional_printer_columns
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|c| (c.name, c.type_, c.json_path))
            .collect()
    };
    let t = |a: &str, b: &str, c: &str| (a.to_string(), b.to_string(), c.to_string());
    assert_eq!(
        cols(cocoonset_crd()),
        vec![
            t("Phase", "string", ".status.phase"),
            t("Ready", "integer", ".status.readyAgents"),
            t("Desired", "integer", ".status.desiredAgents"),
            t("Age", "date", ".metadata.creationTimestamp"),
        ]
    );
    assert_eq!(
        cols(hibernation_crd()),
        vec![
            t("Pod", "string", ".spec.podRef.name"),
            t("Desire", "string", ".spec.desire"),
            t("Phase", "string", ".status.phase"),
            t("Age", "date", ".metadata.creationTimestamp"),
        ]
    );
}

#[test]
fn schema_defaults_enums_and_list_maps() {
    let s = schema_of(&cocoonset_crd());
    let spec = &s["properties"]["spec"];
    assert_eq!(spec["required"], json!(["agent"]));
    assert_eq!(spec["properties"]["snapshotPolicy"]["default"], "always");
    assert_eq!(
        spec["properties"]["snapshotPolicy"]["enum"],
        json!(["always", "main-only", "never"])
    );
    // hibernatePolicy: no `enum` (an enum violation would stop the API server before the CEL
    // rule that answers with cocoon-webhook's message), one CEL rule instead.
    let policy = &spec["properties"]["hibernatePolicy"];
    assert_eq!(policy["default"], "retain");
    assert_eq!(policy["type"], "string");
    assert_eq!(policy.get("enum"), None);
    assert_eq!(
        policy["x-kubernetes-validations"],
        json!([{"rule": "self == 'retain' || self == 'release'", "message": "must be retain or release"}])
    );
    assert_eq!(spec["properties"]["nodePool"]["default"], "default");
    let class = &spec["properties"]["snapshotCompatibilityClass"];
    assert_eq!(class["maxLength"], 63);
    assert_eq!(class["pattern"], set::CPU_CLASS_PATTERN);
    let agent = &spec["properties"]["agent"];
    assert_eq!(agent["required"], json!(["image"]));
    assert_eq!(agent["properties"]["image"]["minLength"], 1);
    assert_eq!(agent["properties"]["replicas"]["default"], 0);
    assert_eq!(agent["properties"]["replicas"]["minimum"], 0.0);
    assert_eq!(agent["properties"]["mode"]["default"], "clone");
    assert_eq!(agent["properties"]["mode"]["enum"], json!(["clone", "run"]));
    assert_eq!(agent["properties"]["os"]["default"], "linux");
    assert_eq!(
        agent["properties"]["os"]["enum"],
        json!(["linux", "windows", "android", "macos"])
    );
    assert_eq!(
        agent["properties"]["backend"]["default"],
        "cloud-hypervisor"
    );
    assert_eq!(
        agent["properties"]["connType"]["enum"],
        json!(["ssh", "rdp", "vnc", "adb"])
    );
    assert_eq!(agent["properties"]["probePort"]["maximum"], 65535.0);
    assert!(
        agent["properties"]["storage"]["x-kubernetes-int-or-string"]
            .as_bool()
            .unwrap_or(false)
    );
    let tb = &spec["properties"]["toolboxes"];
    assert_eq!(tb["x-kubernetes-list-type"], "map");
    assert_eq!(tb["x-kubernetes-list-map-keys"], json!(["name"]));
    let tbi = &tb["items"];
    assert_eq!(tbi["required"], json!(["name"]));
    assert_eq!(
        tbi["properties"]["name"]["pattern"],
        set::TOOLBOX_NAME_PATTERN
    );
    assert_eq!(tbi["properties"]["name"]["maxLength"], 63);
    assert_eq!(tbi["properties"]["mode"]["default"], "run");
    assert_eq!(
        tbi["properties"]["mode"]["enum"],
        json!(["run", "clone", "static"])
    );
    assert!(tbi["properties"]["staticIP"].is_object());
    assert!(tbi["properties"]["staticVMID"].is_object());
    assert_eq!(tbi["properties"]["vncPort"]["maximum"], 65535.0);

    let status = &s["properties"]["status"]["properties"];
    assert_eq!(
        status["agents"]["x-kubernetes-list-map-keys"],
        json!(["slot"])
    );
    assert_eq!(
        status["agents"]["items"]["required"],
        json!(["role", "slot"])
    );
    assert_eq!(
        status["toolboxes"]["x-kubernetes-list-map-keys"],
        json!(["name"])
    );
    assert_eq!(
        status["conditions"]["x-kubernetes-list-map-keys"],
        json!(["type"])
    );
    assert_eq!(
        status["phase"]["enum"],
        json!([
            "Pending",
            "Scaling",
            "Running",
            "Suspending",
            "Suspended",
            "Waking",
            "Migrating",
            "Failed"
        ])
    );
    assert!(
        !serde_json::to_string(&s)
            .expect("json")
            .contains("nullable")
    );

    let h = schema_of(&hibernation_crd());
    let hs = &h["properties"]["spec"];
    assert_eq!(hs["required"], json!(["desire", "podRef"]));
    assert_eq!(
        hs["properties"]["desire"]["enum"],
        json!(["Hibernate", "Wake"])
    );
    assert_eq!(hs["properties"]["podRef"]["required"], json!(["name"]));
    assert_eq!(
        hs["properties"]["podRef"]["properties"]["name"]["minLength"],
        1
    );
    let hst = &h["properties"]["status"]["properties"];
    assert_eq!(
        hst["phase"]["enum"],
        json!([
            "Pending",
            "Hibernating",
            "Hibernated",
            "Waking",
            "Active",
            "Failed"
        ])
    );
    assert_eq!(
        hst["conditions"]["x-kubernetes-list-map-keys"],
        json!(["type"])
    );
}

#[test]
fn cel_rules_are_the_exact_spec_strings() {
    let s = schema_of(&cocoonset_crd());
    assert_eq!(
        s["properties"]["spec"]["x-kubernetes-validations"],
        json!([
            {"rule": "!has(self.hibernatePolicy) || self.hibernatePolicy != 'release' || ((!has(self.agent.replicas) || self.agent.replicas == 0) && (!has(self.toolboxes) || size(self.toolboxes) == 0))",
             "message": "hibernatePolicy=release requires agent.replicas=0 and no toolboxes"},
            {"rule": "!has(oldSelf.snapshotCompatibilityClass) || (has(self.snapshotCompatibilityClass) && self.snapshotCompatibilityClass == oldSelf.snapshotCompatibilityClass)",
             "message": "snapshotCompatibilityClass is immutable once set"},
            {"rule": "!has(self.idle) || !has(self.idle.suspendAfter) || !has(self.hibernatePolicy) || self.hibernatePolicy != 'release'",
             "message": "spec.idle.suspendAfter requires hibernatePolicy=retain"}
        ])
    );
    let h = schema_of(&hibernation_crd());
    assert_eq!(
        h["properties"]["spec"]["properties"]["podRef"]["x-kubernetes-validations"],
        json!([{"rule": "self == oldSelf", "message": "spec.podRef is immutable"}])
    );
}

const RELEASE_MSG: &str = "hibernatePolicy=release requires agent.replicas=0 and no toolboxes";
const CLASS_MSG: &str = "snapshotCompatibilityClass is immutable once set";

#[test]
fn cel_rule_1_release_needs_a_lone_main() {
    let crd = cocoonset_crd();
    let cases: &[(&str, Value, bool)] = &[
        (
            "retain with sub-agents and toolboxes",
            json!({"agent": {"image": "i", "replicas": 2}, "toolboxes": [{"name": "tb"}]}),
            true,
        ),
        (
            "policy absent",
            json!({"agent": {"image": "i", "replicas": 3}}),
            true,
        ),
        (
            "release, lone main",
            json!({"hibernatePolicy": "release", "agent": {"image": "i"}}),
            true,
        ),
        (
            "release, replicas 0 explicit",
            json!({"hibernatePolicy": "release", "agent": {"image": "i", "replicas": 0}, "toolboxes": []}),
            true,
        ),
        (
            "release with a sub-agent",
            json!({"hibernatePolicy": "release", "agent": {"image": "i", "replicas": 1}}),
            false,
        ),
        (
            "release with a toolbox",
            json!({"hibernatePolicy": "release", "agent": {"image": "i"}, "toolboxes": [{"name": "tb"}]}),
            false,
        ),
    ];
    for (name, spec, ok) in cases {
        let got = messages(crd::validate_cel(&crd, &cs(spec.clone()), None));
        if *ok {
            assert!(got.is_empty(), "{name}: expected accepted, got {got:?}");
        } else {
            assert_eq!(got, vec![RELEASE_MSG.to_string()], "{name}");
        }
    }
}

#[test]
fn idle_rules_name_the_field() {
    let crd = cocoonset_crd();
    let cases: &[(&str, Value, Option<&str>)] = &[
        (
            "20s with retain",
            json!({"agent": {"image": "i"}, "idle": {"suspendAfter": "20s", "ports": [7000]}}),
            None,
        ),
        (
            "exactly 10s",
            json!({"agent": {"image": "i"}, "idle": {"suspendAfter": "10s"}}),
            None,
        ),
        (
            "an hour and a half",
            json!({"agent": {"image": "i"}, "idle": {"suspendAfter": "1h30m"}}),
            None,
        ),
        (
            "ports only, release policy",
            json!({"hibernatePolicy": "release", "agent": {"image": "i"}, "idle": {"ports": [80]}}),
            None,
        ),
        (
            "under 10s",
            json!({"agent": {"image": "i"}, "idle": {"suspendAfter": "9s"}}),
            Some("spec.idle.suspendAfter must be at least 10s"),
        ),
        (
            "500ms",
            json!({"agent": {"image": "i"}, "idle": {"suspendAfter": "500ms"}}),
            Some("spec.idle.suspendAfter must be at least 10s"),
        ),
        (
            "idle suspend with release",
            json!({"hibernatePolicy": "release", "agent": {"image": "i"}, "idle": {"suspendAfter": "1m"}}),
            Some("spec.idle.suspendAfter requires hibernatePolicy=retain"),
        ),
    ];
    for (name, spec, want) in cases {
        let got = messages(crd::validate_cel(&crd, &cs(spec.clone()), None));
        match want {
            None => assert!(got.is_empty(), "{name}: expected accepted, got {got:?}"),
            Some(msg) => assert_eq!(got, vec![msg.to_string()], "{name}"),
        }
    }
    let s = schema_of(&crd);
    let idle = &s["properties"]["spec"]["properties"]["idle"]["properties"];
    assert_eq!(idle["ports"]["maxItems"], json!(16));
    assert_eq!(idle["ports"]["items"]["minimum"], json!(1.0));
    assert_eq!(idle["ports"]["items"]["maximum"], json!(65535.0));
    assert_eq!(idle["ports"]["x-kubernetes-list-type"], json!("set"));
    assert_eq!(idle["wakeOn"]["items"]["enum"], json!(["connect", "exec"]));
}

#[test]
fn cel_rule_2_cpu_class_immutable_once_set() {
    let crd = cocoonset_crd();
    let with = |class: Option<&str>| {
        let mut spec = json!({"agent": {"image": "i"}});
        if let Some(c) = class {
            spec["snapshotCompatibilityClass"] = json!(c);
        }
        cs(spec)
    };
    let cases: &[(&str, Option<&str>, Option<&str>, bool)] = &[
        ("unset stays unset", None, None, true),
        ("unset to set", None, Some("skylake-v1"), true),
        (
            "set stays the same",
            Some("skylake-v1"),
            Some("skylake-v1"),
            true,
        ),
        (
            "set to another value",
            Some("skylake-v1"),
            Some("icelake-v2"),
            false,
        ),
        ("set to removed", Some("skylake-v1"), None, false),
    ];
    for (name, old, new, ok) in cases {
        let got = messages(crd::validate_cel(&crd, &with(*new), Some(&with(*old))));
        if *ok {
            assert!(got.is_empty(), "{name}: expected accepted, got {got:?}");
        } else {
            assert_eq!(got, vec![CLASS_MSG.to_string()], "{name}");
        }
    }
    // On create the transition rule is not evaluated.
    assert!(messages(crd::validate_cel(&crd, &with(Some("x")), None)).is_empty());
}

#[test]
fn cel_pod_ref_immutable() {
    let crd = hibernation_crd();
    let obj = |pod: &str, desire: &str| ch(json!({"podRef": {"name": pod}, "desire": desire}));
    assert!(messages(crd::validate_cel(&crd, &obj("demo-0", "Hibernate"), None)).is_empty());
    assert!(
        messages(crd::validate_cel(
            &crd,
            &obj("demo-0", "Wake"),
            Some(&obj("demo-0", "Hibernate"))
        ))
        .is_empty(),
        "changing desire is allowed"
    );
    assert_eq!(
        messages(crd::validate_cel(
            &crd,
            &obj("demo-1", "Hibernate"),
            Some(&obj("demo-0", "Hibernate"))
        )),
        vec!["spec.podRef is immutable".to_string()]
    );
}

#[test]
fn derived_cel_methods_agree_with_the_committed_schema() {
    let mut a = set::CocoonSet::new("demo", set::CocoonSetSpec::with_image("img"));
    assert!(a.validate_cel().is_ok());
    a.spec.hibernate_policy = set::HibernatePolicy::Release;
    a.spec.agent.replicas = 1;
    assert!(a.validate_cel().is_err());
    let mut old = set::CocoonSet::new("demo", set::CocoonSetSpec::with_image("img"));
    old.spec.snapshot_compatibility_class = "a".into();
    let mut new = old.clone();
    new.spec.snapshot_compatibility_class = "b".into();
    assert!(new.validate_cel_update(&old).is_err());
    assert!(old.validate_cel_update(&old).is_ok());
}

#[test]
fn minimal_objects_decode_with_the_schema_defaults() {
    let obj: set::CocoonSet =
        serde_json::from_value(cs(json!({"agent": {"image": "img"}}))).expect("decode");
    assert_eq!(obj.spec, set::CocoonSetSpec::with_image("img"));
    assert_eq!(obj.spec.snapshot_policy.as_str(), "always");
    assert_eq!(obj.spec.hibernate_policy.as_str(), "retain");
    assert_eq!(obj.spec.node_pool, "default");
    assert_eq!(obj.spec.agent.mode.as_str(), "clone");
    assert_eq!(obj.spec.agent.vm.os.as_str(), "linux");
    assert_eq!(obj.spec.agent.vm.backend.as_str(), "cloud-hypervisor");
    assert_eq!(obj.spec.desired_agents(), 1);

    let tb: set::ToolboxSpec = serde_json::from_value(json!({"name": "tb"})).expect("decode");
    assert_eq!(tb.mode.as_str(), "run");

    // Empty and false fields are not written; the status counters always are.
    let written = serde_json::to_value(set::CocoonSetSpec::with_image("img")).expect("encode");
    assert_eq!(
        written,
        json!({"snapshotPolicy": "always", "hibernatePolicy": "retain", "nodePool": "default",
               "agent": {"replicas": 0, "image": "img", "mode": "clone", "os": "linux", "backend": "cloud-hypervisor"}})
    );
    let status = serde_json::to_value(set::CocoonSetStatus::default()).expect("encode");
    assert_eq!(
        status,
        json!({"readyAgents": 0, "desiredAgents": 0, "replicas": 0, "readyToolboxes": 0, "desiredToolboxes": 0})
    );
}

#[test]
fn full_spec_round_trips_with_go_field_names() {
    let doc = cs(json!({
        "suspend": true, "snapshotPolicy": "main-only", "hibernatePolicy": "retain", "nodePool": "gpu",
        "snapshotCompatibilityClass": "skylake-v1", "nodeName": "node-a",
        "agent": {"replicas": 2, "image": "reg/agent:1", "mode": "run", "os": "windows",
                  "backend": "firecracker", "connType": "rdp", "network": "cni0", "forcePull": true,
                  "noDirectIO": true, "probePort": 2222, "storage": "100Gi",
                  "resources": {"requests": {"cpu": "2"}},
                  "envFrom": [{"secretRef": {"name": "s"}}], "serviceAccountName": "sa"},
        "toolboxes": [{"name": "tb", "image": "x", "mode": "static", "staticIP": "10.0.0.9",
                       "staticVMID": "vm-1", "vncPort": 5901, "os": "linux", "backend": "cloud-hypervisor"}]
    }));
    let obj: set::CocoonSet = serde_json::from_value(doc.clone()).expect("decode");
    assert!(obj.spec.suspend);
    assert_eq!(obj.spec.agent.vm.conn_type, Some(set::ConnType::Rdp));
    assert_eq!(obj.spec.toolboxes[0].static_vm_id, "vm-1");
    let back = serde_json::to_value(&obj).expect("encode");
    assert_eq!(back["spec"], doc["spec"]);
    assert!(crd::validate_cel(&cocoonset_crd(), &back, None).is_ok());

    let h: hibernation::CocoonHibernation =
        serde_json::from_value(ch(json!({"podRef": {"name": "demo-0"}, "desire": "Wake"})))
            .expect("decode");
    assert_eq!(h.spec.desire, hibernation::Desire::Wake);
}

#[test]
fn committed_crds_match_the_code() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let files = crd::render_files().expect("render");
    assert_eq!(files.len(), 3);
    // `COCOON_UPDATE_CRDS=1` rewrites the committed copies instead of comparing them.
    let update = std::env::var_os("COCOON_UPDATE_CRDS").is_some_and(|v| v == "1");
    // The kustomization's and the Helm chart's copies. The chart's are not in its crds/ (Helm
    // never upgrades those) but in files/crds/, rendered as templates (charts/cocoon/README.md).
    let dirs = ["manifests/crds", "charts/cocoon/files/crds"];
    for dir in dirs {
        for (name, yaml) in &files {
            let path = root.join(dir).join(name);
            if update {
                std::fs::write(&path, yaml).expect("write CRD");
                continue;
            }
            let committed = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                &committed == yaml,
                "{} differs from the code; regenerate with `COCOON_UPDATE_CRDS=1 cargo test -p cocoon-api --test crd` \
                 or `cargo run -p cocoon-bin -- crd --out-dir {dir}`",
                path.display()
            );
        }
        // Nothing else in the directory: a stale CRD file would be installed too.
        let mut present: Vec<String> = std::fs::read_dir(root.join(dir))
            .expect("read CRD dir")
            .map(|f| f.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        present.sort();
        let mut want: Vec<String> = files.iter().map(|(n, _)| n.clone()).collect();
        want.sort();
        assert_eq!(present, want, "{dir} holds exactly the generated CRDs");
    }
    // A chart crds/ directory would make Helm install the CRDs once and never upgrade them.
    assert!(
        !root.join("charts/cocoon/crds").exists(),
        "charts/cocoon/crds must not exist: the chart renders files/crds/ as templates"
    );
    // Rendering twice gives the same bytes.
    assert_eq!(
        crd::render_all_yaml().expect("render"),
        crd::render_all_yaml().expect("render")
    );
}

fn ckpt(spec: Value) -> Value {
    json!({"apiVersion": "cocoonset.cocoonstack.io/v1", "kind": "CocoonCheckpoint",
           "metadata": {"name": "good", "namespace": "ns"}, "spec": spec})
}

#[test]
fn checkpoint_crd_names_columns_and_rules() {
    let crd = crd::all().remove(2);
    assert_eq!(crd.spec.names.kind, "CocoonCheckpoint");
    assert_eq!(crd.spec.names.plural, "cocooncheckpoints");
    assert_eq!(crd.spec.names.short_names, Some(vec!["ckpt".to_string()]));
    assert_eq!(crd.spec.scope, "Namespaced");
    let columns: Vec<String> = crd.spec.versions[0]
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| c.name.clone())
        .collect();
    assert_eq!(columns, ["Source", "Phase", "Node", "Size", "Age"]);

    let pod = json!({"source": {"podRef": {"name": "demo-0"}}});
    assert!(messages(crd::validate_cel(&crd, &ckpt(pod.clone()), None)).is_empty());
    let set = json!({"source": {"cocoonSetRef": {"name": "demo"}}});
    assert!(messages(crd::validate_cel(&crd, &ckpt(set.clone()), None)).is_empty());
    for bad in [
        json!({"source": {}}),
        json!({"source": {"podRef": {"name": "a"}, "cocoonSetRef": {"name": "b"}}}),
    ] {
        let m = messages(crd::validate_cel(&crd, &ckpt(bad), None));
        assert_eq!(m, [checkpoint::MSG_ONE_SOURCE], "{m:?}");
        assert!(m[0].contains("spec.source.podRef"));
    }
    // Any edit of the spec is refused.
    let m = messages(crd::validate_cel(
        &crd,
        &ckpt(set),
        Some(&ckpt(pod.clone())),
    ));
    assert!(
        m.contains(&checkpoint::MSG_SPEC_IMMUTABLE.to_string()),
        "{m:?}"
    );
    assert!(
        messages(crd::validate_cel(
            &crd,
            &ckpt(pod.clone()),
            Some(&ckpt(pod))
        ))
        .is_empty()
    );
}

#[test]
fn from_checkpoint_is_an_optional_object_name() {
    let schema = schema_of(&cocoonset_crd());
    let field =
        &schema["properties"]["spec"]["properties"]["agent"]["properties"]["fromCheckpoint"];
    assert_eq!(field["type"], "string");
    assert_eq!(field["pattern"], checkpoint::OBJECT_NAME_PATTERN);
    let required = schema["properties"]["spec"]["properties"]["agent"]["required"].clone();
    assert!(!required.to_string().contains("fromCheckpoint"));
    let obj: set::CocoonSet = serde_json::from_value(cs(
        json!({"agent": {"image": "img", "fromCheckpoint": "good"}}),
    ))
    .expect("decode");
    assert_eq!(obj.spec.agent.from_checkpoint.as_deref(), Some("good"));
    let back = serde_json::to_value(set::CocoonSetSpec::with_image("img")).expect("encode");
    assert!(back["agent"].get("fromCheckpoint").is_none());
}
