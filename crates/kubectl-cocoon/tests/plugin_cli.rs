//! The plugin's command-line surface on the real control plane: kubectl's flag habits, dry
//! runs that say what they did, output formats and the computed status view.

mod cli_support;

use cli_support::{member_pod, plain_pod, run, text};
use cocoon_api::{CocoonSet, CocoonSetSpec};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::Value;

async fn create_set(client: &kube::Client, ns: &str, name: &str) -> Result<(), kube::Error> {
    let sets: Api<CocoonSet> = Api::namespaced(client.clone(), ns);
    let mut set = CocoonSet::new(name, CocoonSetSpec::with_image("img"));
    set.metadata.labels = Some([("team".to_string(), "a".to_string())].into());
    sets.create(&PostParams::default(), &set).await?;
    Ok(())
}

fn managers(set: &CocoonSet) -> Vec<String> {
    set.metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.clone())
        .collect()
}

#[tokio::test]
async fn dry_runs_say_what_they_did_and_change_nothing() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "cli-dry").await?;
        create_set(&client, &ns, "demo").await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        member_pod(&pods, &ns, "demo", "0").await?;
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);

        let out = run(env, &["-n", &ns, "suspend", "--dry-run=server", "demo"]).await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert_eq!(
            text(&out.stdout),
            "cocoonset.cocoonset.cocoonstack.io/demo patched (server dry run)\n"
        );
        // A bare --dry-run is client and never takes the name as its value.
        let out = run(env, &["-n", &ns, "suspend", "--dry-run", "demo"]).await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert_eq!(
            text(&out.stdout),
            "cocoonset.cocoonset.cocoonstack.io/demo patched (dry run)\n"
        );
        // With -o, both print the object as it would be, in the same shape.
        for mode in ["--dry-run=client", "--dry-run=server"] {
            let out = run(env, &["-n", &ns, "suspend", "demo", mode, "-o", "json"]).await;
            assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
            let obj: Value = serde_json::from_slice(&out.stdout)?;
            assert_eq!(obj["kind"], "CocoonSet", "{mode}");
            assert_eq!(obj["metadata"]["name"], "demo", "{mode}");
            assert_eq!(obj["spec"]["suspend"], true, "{mode}");
        }
        let out = run(
            env,
            &[
                "-n",
                &ns,
                "suspend",
                "demo",
                "--dry-run=server",
                "-o",
                "yaml",
            ],
        )
        .await;
        assert!(
            text(&out.stdout).contains("suspend: true"),
            "{}",
            text(&out.stdout)
        );
        assert!(
            !sets.get("demo").await?.spec.suspend,
            "a dry run changes nothing"
        );

        // Hibernations: created (client and server), the object with -o, nothing left behind.
        let out = run(env, &["-n", &ns, "hibernate", "demo-0", "--dry-run=client"]).await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert_eq!(
            text(&out.stdout),
            "cocoonhibernation.cocoonset.cocoonstack.io/demo-0 created (dry run)\n"
        );
        let out = run(env, &["-n", &ns, "hibernate", "demo-0", "--dry-run=server"]).await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert_eq!(
            text(&out.stdout),
            "cocoonhibernation.cocoonset.cocoonstack.io/demo-0 created (server dry run)\n"
        );
        for mode in ["--dry-run=client", "--dry-run=server"] {
            let out = run(env, &["-n", &ns, "hibernate", "demo-0", mode, "-o", "json"]).await;
            let obj: Value = serde_json::from_slice(&out.stdout)?;
            assert_eq!(obj["kind"], "CocoonHibernation", "{mode}");
            assert_eq!(obj["metadata"]["namespace"], ns.as_str(), "{mode}");
            assert_eq!(obj["spec"]["desire"], "Hibernate", "{mode}");
            assert_eq!(obj["spec"]["podRef"]["name"], "demo-0", "{mode}");
        }
        let chs: Api<cocoon_api::crd::hibernation::CocoonHibernation> =
            Api::namespaced(client.clone(), &ns);
        assert!(chs.get_opt("demo-0").await?.is_none(), "nothing created");

        // Several targets: the writes run concurrently, the report keeps the targets' order;
        // with -o json|yaml it is one kubectl List, not objects one after another.
        create_set(&client, &ns, "demo-b").await?;
        member_pod(&pods, &ns, "demo", "1").await?;
        for mode in ["--dry-run=client", "--dry-run=server"] {
            let out = run(env, &["-n", &ns, "suspend", "demo", "demo-b", mode]).await;
            assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
            let word = if mode.ends_with("server") { "server dry run" } else { "dry run" };
            assert_eq!(
                text(&out.stdout),
                format!(
                    "cocoonset.cocoonset.cocoonstack.io/demo patched ({word})\n\
                     cocoonset.cocoonset.cocoonstack.io/demo-b patched ({word})\n"
                ),
                "{mode}"
            );
            let out = run(env, &["-n", &ns, "suspend", "demo", "demo-b", mode, "-o", "json"]).await;
            assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
            let list: Value = serde_json::from_slice(&out.stdout)
                .map_err(|e| format!("{mode}: one JSON document: {e}\n{}", text(&out.stdout)))?;
            assert_eq!(list["kind"], "List", "{mode}");
            let names: Vec<&str> = list["items"]
                .as_array()
                .ok_or("items")?
                .iter()
                .filter_map(|i| i["metadata"]["name"].as_str())
                .collect();
            assert_eq!(names, ["demo", "demo-b"], "{mode}");
            assert!(list["items"].as_array().ok_or("items")?.iter().all(|i| i["spec"]["suspend"] == true));
            let out = run(env, &["-n", &ns, "suspend", "demo", "demo-b", mode, "-o", "yaml"]).await;
            assert!(text(&out.stdout).starts_with("apiVersion: v1\nitems:"), "{mode}: {}", text(&out.stdout));
        }
        let out = run(env, &["-n", &ns, "hibernate", "demo-0", "demo-1", "--dry-run=server", "-o", "name"]).await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert_eq!(
            text(&out.stdout),
            "cocoonhibernation.cocoonset.cocoonstack.io/demo-0\ncocoonhibernation.cocoonset.cocoonstack.io/demo-1\n"
        );
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await;
}

#[tokio::test]
async fn on_off_flags_take_values_and_writes_name_their_manager() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "cli-flags").await?;
        create_set(&client, &ns, "demo").await?;
        create_set(&client, &ns, "other").await?;
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);

        // --wait=false returns after the write (no operator runs here, a wait would time out).
        let out = run(
            env,
            &["-n", &ns, "suspend", "demo", "--wait=false", "-o", "name"],
        )
        .await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert_eq!(
            text(&out.stdout),
            "cocoonset.cocoonset.cocoonstack.io/demo\n"
        );
        let demo = sets.get("demo").await?;
        assert!(demo.spec.suspend);
        assert!(
            managers(&demo).contains(&"kubectl-cocoon".to_string()),
            "{:?}",
            managers(&demo)
        );

        let out = run(
            env,
            &[
                "-n",
                &ns,
                "resume",
                "demo",
                "--wait=false",
                "--field-manager",
                "ci-bot",
            ],
        )
        .await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let demo = sets.get("demo").await?;
        assert!(!demo.spec.suspend);
        assert!(
            managers(&demo).contains(&"ci-bot".to_string()),
            "{:?}",
            managers(&demo)
        );

        // -y=true skips the prompt (stdin is no terminal: without it the verb refuses).
        let out = run(
            env,
            &[
                "-n",
                &ns,
                "suspend",
                "-l",
                "team=a",
                "--wait=false",
                "-y=false",
            ],
        )
        .await;
        assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
        let out = run(
            env,
            &[
                "-n",
                &ns,
                "suspend",
                "-l",
                "team=a",
                "--wait=false",
                "-y=true",
            ],
        )
        .await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert!(sets.get("other").await?.spec.suspend);
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await;
}

#[tokio::test]
async fn status_formats_and_the_computed_view() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "cli-out").await?;

        // Nothing found: kubectl's message on stderr, stdout empty.
        let out = run(env, &["-n", &ns, "status"]).await;
        assert_eq!(out.status.code(), Some(0));
        assert_eq!(text(&out.stdout), "");
        assert_eq!(
            text(&out.stderr),
            format!("No resources found in {ns} namespace.\n")
        );

        create_set(&client, &ns, "demo").await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let vm = member_pod(&pods, &ns, "demo", "0").await?;
        let out = run(env, &["-n", &ns, "hibernate", "demo-0", "--wait=false"]).await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));

        let out = run(env, &["-n", &ns, "status", "-o", "name"]).await;
        assert_eq!(
            text(&out.stdout),
            "cocoonset.cocoonset.cocoonstack.io/demo\n"
        );
        let out = run(
            env,
            &[
                "-n",
                &ns,
                "status",
                "-o",
                "jsonpath={range .items[*]}{.metadata.name}:{.members[*].vm}{\"\\n\"}{end}",
            ],
        )
        .await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert_eq!(text(&out.stdout), format!("demo:{vm}\n"));

        let out = run(env, &["-n", &ns, "status"]).await;
        assert!(
            text(&out.stdout).starts_with("NAME "),
            "{}",
            text(&out.stdout)
        );
        let out = run(env, &["-n", &ns, "status", "--no-headers"]).await;
        let table = text(&out.stdout);
        assert!(table.starts_with("demo "), "{table}");
        assert_eq!(table.lines().count(), 1, "{table}");

        // The computed view: each set with its members and hibernations.
        let out = run(env, &["-n", &ns, "status", "demo", "-o", "json"]).await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let list: Value = serde_json::from_slice(&out.stdout)?;
        assert_eq!(list["kind"], "List");
        let set = &list["items"][0];
        assert_eq!(set["kind"], "CocoonSet");
        assert_eq!(set["members"][0]["pod"], "demo-0");
        assert_eq!(set["members"][0]["vm"], vm.as_str());
        assert_eq!(set["members"][0]["lifecycle"], "ready");
        assert_eq!(set["members"][0]["role"], "main");
        assert!(
            set["members"][0]["hibernation"]
                .as_str()
                .unwrap_or_default()
                .starts_with("Hibernate/")
        );
        assert_eq!(set["hibernations"][0]["kind"], "CocoonHibernation");
        assert_eq!(set["hibernations"][0]["spec"]["podRef"]["name"], "demo-0");
        let out = run(env, &["-n", &ns, "status", "demo", "-o", "yaml"]).await;
        assert!(
            text(&out.stdout).contains("members:"),
            "{}",
            text(&out.stdout)
        );

        // kubectl's refusals: a name across all namespaces, -o wide where there is no table.
        let out = run(env, &["status", "-A", "demo"]).await;
        assert_eq!(out.status.code(), Some(2));
        assert!(
            text(&out.stderr)
                .contains("a resource cannot be retrieved by name across all namespaces"),
            "{}",
            text(&out.stderr)
        );
        let out = run(env, &["-n", &ns, "suspend", "demo", "-o", "wide"]).await;
        assert_eq!(out.status.code(), Some(2));
        assert!(
            text(&out.stderr).contains("--output"),
            "{}",
            text(&out.stderr)
        );
        let out = run(env, &["-n", &ns, "status", "-o", "wide"]).await;
        assert_eq!(out.status.code(), Some(0));
        assert!(
            text(&out.stdout).contains("HIBERNATION"),
            "{}",
            text(&out.stdout)
        );
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await;
}

#[tokio::test]
async fn completion_offers_cocoon_pods_flags_registry_and_phases() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "cli-comp").await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        member_pod(&pods, &ns, "demo", "0").await?;
        plain_pod(&pods, "web").await?;

        // Only cocoon pods for hibernate and wake; a plain pod is not offered.
        for verb in ["hibernate", "wake"] {
            let out = run(env, &["__completeNoDesc", "-n", &ns, verb, ""]).await;
            assert_eq!(out.status.code(), Some(0));
            assert_eq!(text(&out.stdout), "demo-0\n:4\n", "{verb}");
        }
        let out = run(env, &["__complete", "-n", &ns, "suspend", "--field"]).await;
        assert_eq!(
            text(&out.stdout),
            "--field-manager\tName of the manager recorded in managedFields for every write\n:4\n"
        );
        let out = run(env, &["__completeNoDesc", "registry", ""]).await;
        assert_eq!(text(&out.stdout), "gc\n:4\n");
        let out = run(env, &["__completeNoDesc", "hibernate", "--until", "Hib"]).await;
        assert_eq!(text(&out.stdout), "Hibernating\nHibernated\n:4\n");
        let out = run(env, &["__completeNoDesc", "suspend", "--until", "Sus"]).await;
        assert_eq!(text(&out.stdout), "Suspending\nSuspended\n:4\n");
        let out = run(env, &["__completeNoDesc", "suspend", "--dry-run="]).await;
        assert_eq!(
            text(&out.stdout),
            "--dry-run=none\n--dry-run=client\n--dry-run=server\n:4\n"
        );
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await;
}

/// The files of a tar.gz bundle, by their path below the bundle's directory.
fn bundle_files(path: &std::path::Path) -> std::collections::BTreeMap<String, String> {
    let gz = flate2::read::GzDecoder::new(std::fs::File::open(path).expect("bundle"));
    let mut tar = tar::Archive::new(gz);
    let mut out = std::collections::BTreeMap::new();
    for entry in tar.entries().expect("tar") {
        let mut entry = entry.expect("entry");
        let name = entry.path().expect("path").to_string_lossy().into_owned();
        let (_, rest) = name.split_once('/').expect("under one directory");
        let mut body = String::new();
        std::io::Read::read_to_string(&mut entry, &mut body).expect("read");
        out.insert(rest.to_string(), body);
    }
    out
}

#[tokio::test]
async fn report_writes_a_redacted_bundle_and_goes_on_where_rbac_refuses() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "cli-report").await?;
        let node = cocoon_testenv::unique_name("report-node");
        let _node = cocoon_testenv::TestNode::in_pool(&client, &node, &cocoon_testenv::unique_name("pool")).await?;
        create_set(&client, &ns, "demo").await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        // A Docker config.json (`auth` is base64 of user:hunter2) as JSON in an env value and
        // in an Event note, and base64-encoded (a copied `.dockerconfigjson`) in an annotation.
        let docker_config = r#"{"auths":{"reg.example:5000":{"auth":"dXNlcjpodW50ZXIy"}}}"#;
        let docker_config_b64 = "eyJhdXRocyI6eyJyZWcuZXhhbXBsZTo1MDAwIjp7ImF1dGgiOiJkWE5sY2pwb2RXNTBaWEl5In19fQ==";
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "demo-0", "labels": {"cocoonset.cocoonstack.io/name": "demo", "cocoonset.cocoonstack.io/slot": "0"},
                "annotations": {"example.com/pull-config": docker_config_b64}},
            "spec": {"nodeName": node, "containers": [{"name": "agent", "image": "x",
                "env": [{"name": "REGISTRY_TOKEN", "value": "supersecret"}, {"name": "MODE", "value": "run"},
                    {"name": "PULL_CONFIG", "value": docker_config}]}]}
        }))?;
        pods.create(&PostParams::default(), &pod).await?;
        let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), &ns);
        for (set, reason) in [("demo", "ReportMe"), ("demo-two", "OtherSet")] {
            let ev: k8s_openapi::api::events::v1::Event = serde_json::from_value(serde_json::json!({
                "metadata": {"name": cocoon_testenv::unique_name("ev")},
                "eventTime": "2026-12-01T10:00:00.000000Z", "reportingController": "test", "reportingInstance": "test",
                "action": "Test", "reason": reason, "type": "Normal", "note": format!("pull config {docker_config}"),
                "regarding": {"apiVersion": "cocoonset.cocoonstack.io/v1", "kind": "CocoonSet", "name": set, "namespace": ns}
            }))?;
            events.create(&PostParams::default(), &ev).await?;
        }
        let dir = tempfile::tempdir()?;

        let file = dir.path().join("admin.tar.gz");
        let out = run(env, &["-n", &ns, "report", "demo", "--file", file.to_str().unwrap_or_default()]).await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert_eq!(text(&out.stdout).trim(), file.display().to_string());
        let files = bundle_files(&file);
        for f in ["cocoonset.yaml", "pods.yaml", "hibernations.yaml", "events.yaml", "nodes.yaml", "version.json", "NOTES.txt"] {
            assert!(files.contains_key(f), "{f} in {:?}", files.keys());
        }
        assert!(files["cocoonset.yaml"].contains("name: demo"));
        assert!(files["pods.yaml"].contains("demo-0"));
        assert!(files["pods.yaml"].contains("[REDACTED]") && files["pods.yaml"].contains("run"));
        assert!(files.values().all(|b| !b.contains("supersecret")), "the token is redacted");
        for secret in ["dXNlcjpodW50ZXIy", docker_config_b64] {
            assert!(files.values().all(|b| !b.contains(secret)), "the Docker config's auth is redacted");
        }
        assert!(files["pods.yaml"].contains("auths") && files["events.yaml"].contains("auths"), "the rest of the config stays");
        assert!(files["events.yaml"].contains("ReportMe"));
        assert!(!files["events.yaml"].contains("OtherSet"), "events of another set stay out");
        assert!(files["nodes.yaml"].contains(&node));
        let v: Value = serde_json::from_str(&files["version.json"])?;
        assert_eq!(v["client"], env!("CARGO_PKG_VERSION"));
        assert!(files["NOTES.txt"].contains("operator/deployment.yaml: skipped: not found"), "{}", files["NOTES.txt"]);

        // A reader of the namespace only: nodes and the operator are refused, the rest is written.
        let role: k8s_openapi::api::rbac::v1::Role = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "report-reader"},
            "rules": [
                {"apiGroups": ["cocoonset.cocoonstack.io"], "resources": ["cocoonsets", "cocoonhibernations"], "verbs": ["get", "list"]},
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
                {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["list"]}
            ]
        }))?;
        Api::<k8s_openapi::api::rbac::v1::Role>::namespaced(client.clone(), &ns).create(&PostParams::default(), &role).await?;
        let binding: k8s_openapi::api::rbac::v1::RoleBinding = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "report-reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "report-reader"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "report-reader"}]
        }))?;
        Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(client.clone(), &ns).create(&PostParams::default(), &binding).await?;
        let file = dir.path().join("reader.tar.gz");
        let out = cocoon_testenv::wait_until("the role is in force", std::time::Duration::from_secs(30), || async {
            let out = run(env, &["-n", &ns, "--as", "report-reader", "report", "demo", "--file", file.to_str().unwrap_or_default()]).await;
            (out.status.code() == Some(0)).then_some(out)
        })
        .await?;
        let files = bundle_files(&file);
        assert!(files["pods.yaml"].contains("demo-0"));
        let notes = &files["NOTES.txt"];
        assert!(notes.contains(&format!("nodes.yaml ({node}): skipped: forbidden (RBAC)")), "{notes}");
        assert!(notes.contains("operator/deployment.yaml: skipped: forbidden (RBAC)"), "{notes}");
        assert!(text(&out.stderr).contains("note: operator/deployment.yaml: skipped: forbidden"), "{}", text(&out.stderr));
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await;
}

#[tokio::test]
async fn logs_names_the_member_and_reports_what_the_api_server_refuses() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "cli-logs").await?;
        create_set(&client, &ns, "demo").await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        member_pod(&pods, &ns, "demo", "0").await?;

        // A member the spec does not have: a usage error naming the flag and what the set has.
        let out = run(env, &["-n", &ns, "logs", "demo", "--toolbox", "browser"]).await;
        assert_eq!(out.status.code(), Some(2));
        assert!(
            text(&out.stderr).contains(
                "--toolbox browser: cocoonset demo has no such toolbox (it has no toolboxes)"
            ),
            "{}",
            text(&out.stderr)
        );
        // The main pod (slot 0 by default) has no node yet: as with kubectl logs, an empty log.
        let out = run(env, &["-n", &ns, "logs", "demo"]).await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert_eq!(text(&out.stdout), "");
        let out = run(env, &["-n", &ns, "logs", "demo", "--slot", "3"]).await;
        assert_eq!(out.status.code(), Some(2));
        assert!(
            text(&out.stderr).contains("--slot 3: cocoonset demo has only slot 0, the main agent"),
            "{}",
            text(&out.stderr)
        );
        // A member the spec has but whose pod is not there: not found.
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        let mut spec = CocoonSetSpec::with_image("img");
        spec.agent.replicas = 1;
        sets.create(&PostParams::default(), &CocoonSet::new("two", spec))
            .await?;
        let out = run(env, &["-n", &ns, "logs", "two", "--slot", "1"]).await;
        assert_eq!(out.status.code(), Some(1));
        assert!(
            text(&out.stderr).contains(&format!("cocoonset two has no member pod two-1 in {ns}")),
            "{}",
            text(&out.stderr)
        );
        let out = run(
            env,
            &["-n", &ns, "logs", "demo", "--slot", "1", "--toolbox", "x"],
        )
        .await;
        assert_eq!(out.status.code(), Some(2));
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await;
}

/// Issue 39: the plugin's suspend and resume are the user's: they take the idle mark away, so
/// no connection or exec wakes what a user suspended, and suspending an idle-suspended set
/// makes the suspend the user's.
#[tokio::test]
async fn suspend_and_resume_take_the_idle_mark_away() {
    use cocoon_api::contract::idle;
    use kube::ResourceExt;
    use kube::api::{Patch, PatchParams};
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "cli-idle").await?;
        create_set(&client, &ns, "demo").await?;
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        let idle_suspend = serde_json::json!({
            "metadata": {"annotations": {idle::IDLE_SUSPENDED: "2026-12-07T22:00:00Z"}},
            "spec": {"suspend": true},
        });
        let marked = |cs: &CocoonSet| cs.annotations().contains_key(idle::IDLE_SUSPENDED);
        for verb in ["suspend", "resume"] {
            // The operator's idle suspend (its patch, as it writes it).
            sets.patch(
                "demo",
                &PatchParams::apply(idle::IDLE_FIELD_MANAGER),
                &Patch::Merge(&idle_suspend),
            )
            .await?;
            assert!(marked(&sets.get("demo").await?));
            let out = run(env, &["-n", &ns, verb, "demo", "--wait=false"]).await;
            assert_eq!(out.status.code(), Some(0), "{verb}: {}", text(&out.stderr));
            let cs = sets.get("demo").await?;
            assert!(!marked(&cs), "{verb} took the idle mark away");
            assert_eq!(cs.spec.suspend, verb == "suspend", "{verb}");
        }
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await;
}
