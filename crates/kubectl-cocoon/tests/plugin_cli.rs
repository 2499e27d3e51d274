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
