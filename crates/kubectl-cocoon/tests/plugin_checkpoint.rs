//! `checkpoint`, `fork`, `describe checkpoint/NAME`, the checkpoints under `status` and their
//! completion, with the real plugin binary on the real control plane and registry. The
//! operator's CocoonCheckpoint controller runs in-process scoped to the test namespace; a
//! scripted actor stands in for the node agent and writes what docs/checkpoints.md says it
//! writes (`Saving`, `Pushing` with the bytes, `Ready` with the digest). The forks' wait to
//! `Running` needs real node agents and the CocoonSet walk's fromCheckpoint (next step): here
//! the sets are only created (`--wait=false`, dry runs).

mod cli_support;

use std::sync::Arc;
use std::time::Duration;

use cocoon_api::contract::checkpoint::REQUEST_ANNOTATION;
use cocoon_api::crd::checkpoint::CocoonCheckpoint;
use cocoon_api::crd::set::{CocoonSet, CocoonSetSpec};
use cocoon_api::naming::vm_name_for_pod;
use cocoon_operator::checkpoint;
use cocoon_operator::metrics::Metrics;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;
use tokio::sync::oneshot;

use cli_support::{operator_recorder, plugin, run, tag_registry, text};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
const WAIT: Duration = Duration::from_secs(60);

/// The checkpoint controller on `ns`; it stops when the sender is dropped.
fn start_controller(client: &Client, ns: &str, registry_addr: &str) -> oneshot::Sender<()> {
    let recorder = operator_recorder(client);
    let registry = tag_registry(registry_addr);
    let ctx = Arc::new(checkpoint::Context::new(
        client.clone(),
        recorder,
        Arc::new(Metrics::new()),
        registry,
    ));
    let (tx, rx) = oneshot::channel::<()>();
    let ns = ns.to_string();
    tokio::spawn(async move {
        checkpoint::run(
            ctx,
            Some(&ns),
            2,
            async move {
                let _ = rx.await;
            },
            Arc::new(cocoon_operator::admin::Readiness::default()),
        )
        .await;
    });
    tx
}

/// A Running managed pod bound to node-a, as the node agent keeps it.
async fn running_pod(pods: &Api<Pod>, ns: &str, name: &str) -> Result<(), BoxError> {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {
            "vm.cocoonstack.io/name": vm_name_for_pod(ns, name),
            "vm.cocoonstack.io/id": "vm-1",
            "cocoonset.cocoonstack.io/managed": "true"}},
        "spec": {"nodeName": "node-a", "restartPolicy": "Never",
                 "containers": [{"name": "agent", "image": "cocoon/placeholder"}]}
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": {"phase": "Running"}})),
    )
    .await?;
    Ok(())
}

/// The node agent's side of one checkpoint up to the push, as docs/checkpoints.md has it: once
/// the request is on the pod, `Saving`, then `Pushing` with the bytes so far.
async fn node_saves_and_pushes(
    crs: &Api<CocoonCheckpoint>,
    pods: &Api<Pod>,
    name: &str,
    pod: &str,
) -> Result<(), BoxError> {
    cocoon_testenv::wait_until("the request on the pod", WAIT, || async {
        let p = pods.get(pod).await.ok()?;
        p.annotations()
            .contains_key(REQUEST_ANNOTATION)
            .then_some(())
    })
    .await?;
    for step in [
        json!({"phase": "Saving"}),
        json!({"phase": "Pushing", "bytesOnWire": 3i64 << 29, "dataBytes": 4i64 << 30}),
    ] {
        crs.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": step})),
        )
        .await?;
    }
    Ok(())
}

/// The node agent's last write: `Ready` with the digest, the pause and the bytes.
async fn finish_ready(crs: &Api<CocoonCheckpoint>, name: &str) -> Result<(), BoxError> {
    let ready = json!({"status": {"phase": "Ready", "bytesOnWire": 3i64 << 29, "dataBytes": 4i64 << 30,
        "digest": "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "sourcePauseMillis": 180, "takenAt": "2026-12-07T10:00:00Z",
        "conditions": [{"type": "Ready", "status": "True", "reason": "Pushed",
                        "message": "pushed and verified",
                        "lastTransitionTime": "2026-12-07T10:00:01Z"}]}});
    crs.patch_status(name, &PatchParams::default(), &Patch::Merge(&ready))
        .await?;
    Ok(())
}

#[tokio::test]
async fn checkpoint_dry_runs_write_nothing_and_wait_false_creates_the_cr() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "plugin-ckpt").await?;
        let crs: Api<CocoonCheckpoint> = Api::namespaced(client.clone(), &ns);

        let out = run(
            env,
            &[
                "-n",
                &ns,
                "checkpoint",
                "cocoonset/demo",
                "--name",
                "good",
                "--dry-run=client",
                "-o",
                "json",
            ],
        )
        .await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let obj: Value = serde_json::from_slice(&out.stdout)?;
        assert_eq!(obj["kind"], "CocoonCheckpoint");
        assert_eq!(obj["metadata"]["name"], "good");
        assert_eq!(
            obj["spec"]["source"],
            json!({"cocoonSetRef": {"name": "demo"}})
        );
        let out = run(
            env,
            &[
                "-n",
                &ns,
                "checkpoint",
                "demo-0",
                "--name",
                "good",
                "--dry-run=server",
            ],
        )
        .await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert_eq!(
            text(&out.stdout),
            "cocooncheckpoint.cocoonset.cocoonstack.io/good created (server dry run)\n"
        );
        assert!(
            crs.list(&ListParams::default()).await?.items.is_empty(),
            "a dry run creates nothing"
        );

        let out = run(
            env,
            &[
                "-n",
                &ns,
                "checkpoint",
                "pod/demo-0",
                "--name",
                "good",
                "--wait=false",
            ],
        )
        .await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert_eq!(
            text(&out.stdout),
            "cocooncheckpoint.cocoonset.cocoonstack.io/good created\n"
        );
        let c = crs.get("good").await?;
        assert_eq!(
            c.spec.source.pod_ref.as_ref().map(|r| r.name.as_str()),
            Some("demo-0")
        );
        // The same name again: the API server's refusal, exit 1.
        let out = run(
            env,
            &[
                "-n",
                &ns,
                "checkpoint",
                "demo-0",
                "--name",
                "good",
                "--wait=false",
            ],
        )
        .await;
        assert_eq!(out.status.code(), Some(1));
        // A source of an unknown kind is a usage error.
        let out = run(
            env,
            &["-n", &ns, "checkpoint", "deployment/x", "--name", "x"],
        )
        .await;
        assert_eq!(out.status.code(), Some(2));
        assert!(
            text(&out.stderr).contains("\"deployment\" is not a source kind"),
            "{}",
            text(&out.stderr)
        );
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

#[tokio::test]
async fn checkpoint_waits_for_ready_with_the_status_bytes_as_progress() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "plugin-ckpt-wait").await?;
        let _stop = start_controller(&client, &ns, env.registry_addr());
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let crs: Api<CocoonCheckpoint> = Api::namespaced(client.clone(), &ns);
        running_pod(&pods, &ns, "raw").await?;

        let mut child = plugin(
            env,
            &[
                "-n",
                &ns,
                "checkpoint",
                "raw",
                "--name",
                "good",
                "--timeout",
                "60s",
            ],
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
        let mut stderr = tokio::io::BufReader::new(child.stderr.take().expect("stderr")).lines();
        node_saves_and_pushes(&crs, &pods, "good", "raw").await?;
        // Ready only once the plugin has shown the transfer line fed from the status bytes.
        let mut progress = Vec::new();
        tokio::time::timeout(WAIT, async {
            while let Ok(Some(line)) = stderr.next_line().await {
                let seen = line.contains("pushing 1.5 GiB of 4.0 GiB");
                progress.push(line);
                if seen {
                    return;
                }
            }
        })
        .await
        .map_err(|_| format!("no transfer line on stderr: {progress:?}"))?;
        assert!(
            progress.iter().any(|l| l.contains("Pending")),
            "{progress:?}"
        );
        finish_ready(&crs, "good").await?;
        let out = child.wait_with_output().await?;
        assert_eq!(out.status.code(), Some(0), "{progress:?}");
        let stdout = text(&out.stdout);
        assert!(
            stdout.starts_with("cocooncheckpoint/good Ready: ckpt-"),
            "{stdout}"
        );
        assert!(
            stdout.contains(":checkpoint (1.5 GiB on the wire"),
            "{stdout}"
        );
        assert!(stdout.contains("on node-a)"), "{stdout}");
        assert!(
            !stdout.contains("Pending"),
            "progress stays on stderr: {stdout}"
        );

        // Describe shows it; status lists it under the sets.
        let out = run(env, &["-n", &ns, "describe", "checkpoint/good"]).await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let d = text(&out.stdout);
        assert!(d.contains(&format!("Checkpoint:   {ns}/good\n")), "{d}");
        assert!(d.contains("Source:       pod/raw\n"), "{d}");
        assert!(d.contains("Phase:        Ready\n"), "{d}");
        assert!(d.contains("Size:         1.5 GiB\n"), "{d}");
        assert!(d.contains("CheckpointRequested"), "its Events: {d}");
        let out = run(env, &["-n", &ns, "describe", "checkpoint/nope"]).await;
        assert_eq!(out.status.code(), Some(1));
        let out = run(env, &["-n", &ns, "status"]).await;
        let s = text(&out.stdout);
        assert!(s.contains("CHECKPOINT"), "{s}");
        assert!(
            s.lines().any(|l| l.starts_with("good")
                && l.contains("pod/raw")
                && l.contains("Ready")
                && l.contains("1.5 GiB")),
            "{s}"
        );
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

#[tokio::test]
async fn fork_refuses_bad_counts_and_missing_checkpoints_and_creates_the_sets() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "plugin-fork").await?;
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        let crs: Api<CocoonCheckpoint> = Api::namespaced(client.clone(), &ns);

        for bad in ["0", "101", "x"] {
            let out = run(env, &["-n", &ns, "fork", "good", "--count", bad]).await;
            assert_eq!(out.status.code(), Some(2), "--count {bad}");
            assert!(text(&out.stderr).contains("--count"), "{}", text(&out.stderr));
        }
        let out = run(env, &["-n", &ns, "fork", "missing", "--count", "2"]).await;
        assert_eq!(out.status.code(), Some(1));
        assert!(text(&out.stderr).contains("cocooncheckpoint missing not found"), "{}", text(&out.stderr));

        // A checkpoint of a set: the forks copy the set's spec.
        let mut spec = CocoonSetSpec::with_image("ubuntu:24.04");
        spec.snapshot_compatibility_class = "zen4".into();
        spec.node_name = "node-a".into();
        sets.create(&PostParams::default(), &CocoonSet::new("demo", spec)).await?;
        let out = run(env, &["-n", &ns, "checkpoint", "cocoonset/demo", "--name", "good", "--wait=false"]).await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));

        let out = run(env, &["-n", &ns, "fork", "good", "--count", "3", "--dry-run=client", "-o", "json"]).await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let list: Value = serde_json::from_slice(&out.stdout)?;
        let names: Vec<&str> = list["items"].as_array().expect("items").iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap_or_default()).collect();
        assert_eq!(names, ["good-1", "good-2", "good-3"]);
        for i in list["items"].as_array().expect("items") {
            assert_eq!(i["spec"]["agent"]["fromCheckpoint"], "good");
            assert_eq!(i["spec"]["snapshotCompatibilityClass"], "zen4");
            assert!(i["spec"].get("nodeName").is_none(), "the source's pin is dropped: {i}");
        }
        assert_eq!(sets.list(&ListParams::default()).await?.items.len(), 1, "a dry run creates nothing");

        let out = run(env, &["-n", &ns, "fork", "good", "--count", "2", "--name", "try", "--replicas", "1", "--wait=false"]).await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert_eq!(
            text(&out.stdout),
            "cocoonset.cocoonset.cocoonstack.io/try-1 created\ncocoonset.cocoonset.cocoonstack.io/try-2 created\n"
        );
        for name in ["try-1", "try-2"] {
            let cs = sets.get(name).await?;
            assert_eq!(cs.spec.agent.from_checkpoint.as_deref(), Some("good"));
            assert_eq!(cs.spec.agent.replicas, 1);
        }

        // Completion: fork offers checkpoints, describe offers checkpoint/NAME too.
        let out = run(env, &["__completeNoDesc", "-n", &ns, "fork", ""]).await;
        assert_eq!(text(&out.stdout), "good\n:4\n");
        let out = run(env, &["__completeNoDesc", "-n", &ns, "describe", "checkpoint/"]).await;
        assert_eq!(text(&out.stdout), "checkpoint/good\n:4\n");
        assert!(crs.get_opt("good").await?.is_some());
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}
