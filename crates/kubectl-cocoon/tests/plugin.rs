//! The plugin binary end to end on the real control plane and registry: exit codes, waits,
//! output streams, completion and help, as a user or a CI script meets them. The operator's
//! CocoonHibernation controller runs in-process scoped to the test namespace; a scripted actor
//! stands in for the node agent (writes what it writes).

mod cli_support;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cocoon_api::naming::vm_name_for_pod;
use cocoon_operator::hibernation::{self, decide::Timing};
use cocoon_operator::metrics::Metrics;
use cocoon_registry::{RegistryClient, RegistryConfig};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::oneshot;

use cli_support::{operator_recorder, run, tag_registry, text};

fn start_operator(
    client: &Client,
    ns: &str,
    registry_addr: &str,
    timing: Timing,
) -> oneshot::Sender<()> {
    let recorder = operator_recorder(client);
    let registry = tag_registry(registry_addr);
    let ctx = Arc::new(hibernation::Context::new(
        client.clone(),
        recorder,
        Arc::new(Metrics::new()),
        registry,
        timing,
    ));
    let (tx, rx) = oneshot::channel::<()>();
    let ns = ns.to_string();
    tokio::spawn(async move {
        hibernation::run(
            ctx,
            Some(&ns),
            4,
            async move {
                let _ = rx.await;
            },
            Arc::new(cocoon_operator::admin::Readiness::default()),
        )
        .await;
    });
    tx
}

async fn create_pod(pods: &Api<Pod>, ns: &str, name: &str) -> Result<String, kube::Error> {
    let vm = vm_name_for_pod(ns, name);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {"vm.cocoonstack.io/name": vm, "cocoonset.cocoonstack.io/generation": "1", "vm.cocoonstack.io/id": "vm-1"}},
        "spec": {"containers": [{"name": "agent", "image": "cocoon/placeholder"}], "restartPolicy": "Never"}
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod).await?;
    Ok(vm)
}

/// Stand-in for the node agent: answers hibernate and wake requests on one pod until stopped.
fn node_actor(
    pods: Api<Pod>,
    reg: RegistryClient,
    pod: String,
    vm: String,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut hibernated = false;
        loop {
            let Ok(p) = pods.get(&pod).await else { return };
            let want = p
                .annotations()
                .get("vm.cocoonstack.io/hibernate")
                .map(String::as_str)
                == Some("true");
            if want && !hibernated {
                let cfg = Bytes::from(format!(
                    r#"{{"snapshotId":"{}"}}"#,
                    cocoon_testenv::unique_name("s")
                ));
                let size = cfg.len();
                let Ok(d) = reg.put_blob_bytes(&vm, cfg).await else {
                    continue;
                };
                let m = json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "artifactType": "application/vnd.cocoonstack.snapshot.v1+json",
                    "config": {"mediaType": "application/vnd.cocoonstack.snapshot.config.v1+json", "digest": d.to_string(), "size": size},
                    "layers": [], "annotations": {"org.opencontainers.image.created": "2026-11-29T10:00:00Z"}});
                if reg
                    .put_manifest(
                        &vm,
                        "hibernate",
                        Bytes::from(m.to_string()),
                        "application/vnd.oci.image.manifest.v1+json",
                    )
                    .await
                    .is_err()
                {
                    continue;
                }
                let patch = json!({"metadata": {"annotations": {"vm.cocoonstack.io/id": null, "vm.cocoonstack.io/lifecycle-state": "hibernated", "vm.cocoonstack.io/lifecycle-observed-generation": "1"}}});
                let _ = pods
                    .patch(&pod, &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
                hibernated = true;
            } else if !want && hibernated {
                let patch = json!({"metadata": {"annotations": {"vm.cocoonstack.io/id": "vm-2", "vm.cocoonstack.io/lifecycle-state": "ready", "vm.cocoonstack.io/lifecycle-observed-generation": "1"}}});
                let _ = pods
                    .patch(&pod, &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
                let status = json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}], "containerStatuses": [{"name": "agent", "ready": true, "restartCount": 0, "image": "x", "imageID": "", "state": {"running": {"startedAt": "2026-11-29T10:00:00Z"}}}]}});
                let _ = pods
                    .patch_status(&pod, &PatchParams::default(), &Patch::Merge(&status))
                    .await;
                hibernated = false;
            }
            // The actor reacts to what it reads; the poll interval is its own pace, not a test sync.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}

#[tokio::test]
async fn hibernate_and_wake_a_pod_with_exit_codes_and_json() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "plugin-hib").await?;
        let _op = start_operator(
            &client,
            &ns,
            env.registry_addr(),
            Timing {
                requeue: Duration::from_millis(500),
                ..Timing::default()
            },
        );
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let vm = create_pod(&pods, &ns, "demo-0").await?;
        let reg = RegistryClient::new(RegistryConfig::for_registry(env.registry_addr())?)?;
        let actor = node_actor(pods.clone(), reg, "demo-0".into(), vm);

        let out = run(
            env,
            &[
                "-n",
                &ns,
                "hibernate",
                "demo-0",
                "--timeout",
                "60s",
                "-o",
                "json",
            ],
        )
        .await;
        assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
        let obj: Value = serde_json::from_slice(&out.stdout)?;
        assert_eq!(obj["kind"], "CocoonHibernation");
        assert_eq!(obj["status"]["phase"], "Hibernated");
        assert!(
            text(&out.stderr).contains("Hibernated"),
            "progress goes to stderr"
        );

        // Idempotent: already hibernated returns at once with success.
        let out = run(env, &["-n", &ns, "hibernate", "demo-0"]).await;
        assert_eq!(out.status.code(), Some(0));
        assert!(text(&out.stderr).contains("already wants Hibernate"));
        assert!(out.stdout.is_empty(), "nothing on stdout without -o");

        let out = run(env, &["-n", &ns, "wake", "pod/demo-0", "--timeout", "60s"]).await;
        assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
        let out = run(env, &["-n", &ns, "status", "-o", "yaml"]).await;
        assert_eq!(out.status.code(), Some(0));
        assert!(text(&out.stdout).contains("kind: List"));

        actor.abort();
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await;
}

#[tokio::test]
async fn timeout_and_failed_have_distinct_exit_codes() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "plugin-codes").await?;
        let _op = start_operator(
            &client,
            &ns,
            env.registry_addr(),
            Timing {
                hibernate_timeout: Duration::from_secs(2),
                requeue: Duration::from_millis(500),
                ..Timing::default()
            },
        );
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        create_pod(&pods, &ns, "quiet-0").await?;
        create_pod(&pods, &ns, "quiet-1").await?;

        // No node agent answers. A wait shorter than the operator's deadline times out: 3.
        let out = run(env, &["-n", &ns, "hibernate", "quiet-0", "--timeout", "1s"]).await;
        assert_eq!(out.status.code(), Some(3), "stderr: {}", text(&out.stderr));
        assert!(
            text(&out.stderr)
                .contains("timeout: cocoonhibernation quiet-0 not Hibernated after 1s")
        );

        // The operator gives up after 2s; with no failure grace the plugin reports Failed: 4.
        let out = run(
            env,
            &[
                "-n",
                &ns,
                "hibernate",
                "quiet-1",
                "--timeout",
                "60s",
                "--failure-grace",
                "0s",
            ],
        )
        .await;
        assert_eq!(out.status.code(), Some(4), "stderr: {}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("hibernate not confirmed within 2s"),
            "{}",
            text(&out.stderr)
        );

        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await;
}

#[tokio::test]
async fn errors_and_usage() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "plugin-err").await?;
        // Not found: 1, reported at once.
        let out = run(env, &["-n", &ns, "suspend", "missing"]).await;
        assert_eq!(out.status.code(), Some(1));
        assert!(
            text(&out.stderr).contains("not found"),
            "{}",
            text(&out.stderr)
        );
        let out = run(env, &["-n", &ns, "hibernate", "no-such-pod"]).await;
        assert_eq!(out.status.code(), Some(1));
        // Usage: 2, no help on stdout.
        let out = run(env, &["suspend", "--bogus"]).await;
        assert_eq!(out.status.code(), Some(2));
        assert!(out.stdout.is_empty());
        let out = run(env, &["-n", &ns, "suspend"]).await;
        assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
        let out = run(env, &["-n", &ns, "suspend", "--timeout", "soon", "x"]).await;
        assert_eq!(out.status.code(), Some(2));
        assert!(text(&out.stderr).contains("invalid duration"));
        // Help exits 0 on stdout and documents the exit codes.
        let out = run(env, &["--help"]).await;
        assert_eq!(out.status.code(), Some(0));
        let help = text(&out.stdout);
        assert!(help.contains("Usage: kubectl cocoon"), "{help}");
        assert!(help.contains("3  the wait timed out"));
        // RBAC: a user with no grants is told at once what was denied (exit 1, no retry loop).
        let out = run(
            env,
            &[
                "-n",
                &ns,
                "--as",
                "nobody",
                "suspend",
                "x",
                "--timeout",
                "60s",
            ],
        )
        .await;
        assert_eq!(out.status.code(), Some(1));
        assert!(
            text(&out.stderr).contains("forbidden"),
            "{}",
            text(&out.stderr)
        );
        // version: the operator Deployment is not installed here.
        let out = run(env, &["version"]).await;
        assert_eq!(out.status.code(), Some(0));
        let v = text(&out.stdout);
        assert!(
            v.contains(&format!("Client Version: {}", env!("CARGO_PKG_VERSION"))),
            "{v}"
        );
        assert!(v.contains("Operator Version: unknown"), "{v}");
        // An empty namespace lists nothing, successfully.
        let out = run(env, &["-n", &ns, "status"]).await;
        assert_eq!(out.status.code(), Some(0));
        assert_eq!(text(&out.stdout), "");
        assert_eq!(
            text(&out.stderr),
            format!("No resources found in {ns} namespace.\n")
        );
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await;
}

#[tokio::test]
async fn dynamic_completion_lists_live_names() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "plugin-comp").await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        create_pod(&pods, &ns, "alpha-0").await?;
        let sets: Api<cocoon_api::CocoonSet> = Api::namespaced(client.clone(), &ns);
        sets.create(
            &PostParams::default(),
            &cocoon_api::CocoonSet::new("alpha", cocoon_api::CocoonSetSpec::with_image("img")),
        )
        .await?;

        let out = run(env, &["__complete", "-n", &ns, "wake", ""]).await;
        assert_eq!(out.status.code(), Some(0));
        assert_eq!(text(&out.stdout), "alpha-0\ncocoonset/alpha\n:4\n");
        let out = run(env, &["__complete", "-n", &ns, "wake", "coc"]).await;
        assert_eq!(text(&out.stdout), "cocoonset/alpha\n:4\n");
        let out = run(env, &["__complete", "-n", &ns, "suspend", ""]).await;
        assert_eq!(text(&out.stdout), "alpha\n:4\n");
        let out = run(env, &["__completeNoDesc", "sus"]).await;
        assert_eq!(text(&out.stdout), "suspend\n:4\n");
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await;
}

#[tokio::test]
async fn registry_gc_collects_only_unreferenced_tags() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "plugin-gc").await?;
        // Its own registry, so collecting cannot touch what other tests push.
        let registry = cocoon_testenv::Registry::start_temp(None).await?;
        let reg = RegistryClient::new(RegistryConfig::for_registry(registry.addr())?)?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let live_vm = create_pod(&pods, &ns, "kept-0").await?;
        let dead_vm = vm_name_for_pod(&ns, "gone-0");
        for (vm, tag) in [(&live_vm, "hibernate"), (&dead_vm, "hibernate"), (&dead_vm, "latest")] {
            let cfg = Bytes::from(format!(r#"{{"snapshotId":"{vm}-{tag}"}}"#));
            let size = cfg.len();
            let d = reg.put_blob_bytes(vm, cfg).await?;
            let m = json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "artifactType": "application/vnd.cocoonstack.snapshot.v1+json",
                "config": {"mediaType": "application/vnd.cocoonstack.snapshot.config.v1+json", "digest": d.to_string(), "size": size},
                "layers": [], "annotations": {"org.opencontainers.image.created": format!("2026-11-29T10:00:0{}Z", tag.len() % 10)}});
            reg.put_manifest(vm, tag, Bytes::from(m.to_string()), "application/vnd.oci.image.manifest.v1+json").await?;
        }
        // Dry run by default: lists, deletes nothing.
        let out = run(env, &["registry", "gc", "--registry", registry.addr(), "-o", "json"]).await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let report: Value = serde_json::from_slice(&out.stdout)?;
        assert_eq!(report["dryRun"], true);
        assert_eq!(report["orphans"], json!([{"repository": dead_vm, "tag": "hibernate"}]));
        assert!(reg.has_manifest(&dead_vm, "hibernate").await?);
        // --yes deletes the orphan; the live pod's tag and the kept :latest stay.
        let out = run(env, &["registry", "gc", "--registry", registry.addr(), "--yes"]).await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert!(!reg.has_manifest(&dead_vm, "hibernate").await?);
        assert!(reg.has_manifest(&dead_vm, "latest").await?);
        assert!(reg.has_manifest(&live_vm, "hibernate").await?);
        registry.shutdown();
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await;
}

#[test]
fn static_completion_scripts_match_completions_dir() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../completions");
    for (shell, file) in [
        ("bash", "kubectl-cocoon.bash"),
        ("zsh", "_kubectl-cocoon"),
        ("fish", "kubectl-cocoon.fish"),
        ("powershell", "kubectl-cocoon.ps1"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-cocoon"))
            .args(["completion", shell])
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(0));
        let committed = std::fs::read(dir.join(file)).unwrap_or_default();
        assert!(
            committed == out.stdout,
            "completions/{file} is stale; regenerate with scripts/gen-completions.sh"
        );
    }
}
