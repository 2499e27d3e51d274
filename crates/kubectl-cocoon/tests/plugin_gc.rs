//! `kubectl cocoon registry gc` end to end (issue 26 item 6): the plugin binary against the
//! real control plane and a registry of its own. Only VM-named repositories are candidates
//! (base images survive `--include-latest --yes`, used or not), and a tag whose VM becomes
//! live between the walk and the delete is kept. A tag whose recorded owner (issue 35 item 2)
//! still lives is kept although no object names its VM.

// Shared with plugin_cli.rs; this file uses part of it.
#[allow(dead_code)]
mod cli_support;

use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use cocoon_api::crd::set::{CocoonSet, CocoonSetSpec};
use cocoon_api::naming::vm_name_for_pod;
use cocoon_registry::{RegistryClient, RegistryConfig};
use cocoon_testsupport::BoxError;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use cli_support::{member_pod, run, text};

/// Pushes a small artifact as `<repo>:<tag>`.
async fn push(reg: &RegistryClient, repo: &str, tag: &str) -> Result<(), BoxError> {
    push_with(reg, repo, tag, &[]).await
}

/// [`push`] with `extra` manifest annotations.
async fn push_with(
    reg: &RegistryClient,
    repo: &str,
    tag: &str,
    extra: &[(&str, &str)],
) -> Result<(), BoxError> {
    let cfg = Bytes::from(format!(r#"{{"snapshotId":"{repo}-{tag}"}}"#));
    let size = cfg.len();
    let d = reg.put_blob_bytes(repo, cfg).await?;
    let m = json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "artifactType": "application/vnd.cocoonstack.snapshot.v1+json",
        "config": {"mediaType": "application/vnd.cocoonstack.snapshot.config.v1+json", "digest": d.to_string(), "size": size},
        "layers": [], "annotations": {"org.opencontainers.image.title": format!("{repo}:{tag}")}});
    let mut m = m;
    for (k, v) in extra {
        m["annotations"][*k] = json!(v);
    }
    reg.put_manifest(
        repo,
        tag,
        Bytes::from(m.to_string()),
        "application/vnd.oci.image.manifest.v1+json",
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn base_images_survive_include_latest() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "gc-base").await?;
        let registry = cocoon_testenv::Registry::start_temp(None).await?;
        let reg = RegistryClient::new(RegistryConfig::for_registry(registry.addr())?)?;
        // A base image a running set uses, one nobody uses, and one under a path.
        for (repo, tag) in [("ubuntu", "latest"), ("debian", "latest"), ("library/alpine", "3")] {
            push(&reg, repo, tag).await?;
        }
        let dead = vm_name_for_pod(&ns, "gone-0");
        for tag in ["hibernate", "latest"] {
            push(&reg, &dead, tag).await?;
        }
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        let spec = CocoonSetSpec::with_image(format!("{}/ubuntu:latest", registry.addr()));
        sets.create(&PostParams::default(), &CocoonSet::new("uses-ubuntu", spec))
            .await?;

        let out = run(
            env,
            &[
                "registry", "gc", "--registry", registry.addr(), "--include-latest", "--yes", "-o",
                "json",
            ],
        )
        .await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let report: Value = serde_json::from_slice(&out.stdout)?;
        assert_eq!(
            report["deleted"],
            json!([{"repository": dead, "tag": "hibernate"}, {"repository": dead, "tag": "latest"}]),
            "{report}"
        );
        assert!(reg.has_manifest("ubuntu", "latest").await?, "used by a set");
        assert!(reg.has_manifest("debian", "latest").await?, "not named like a VM");
        assert!(reg.has_manifest("library/alpine", "3").await?);
        assert!(!reg.has_manifest(&dead, "hibernate").await?);
        assert!(!reg.has_manifest(&dead, "latest").await?);
        registry.shutdown();
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

/// Reads `stream` until `needle` has appeared (or the deadline passes); returns what was read.
async fn read_until(
    stream: &mut (impl AsyncReadExt + Unpin),
    needle: &str,
) -> Result<String, BoxError> {
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    tokio::time::timeout(Duration::from_secs(60), async {
        while !String::from_utf8_lossy(&seen).contains(needle) {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&buf[..n]);
        }
        Ok::<_, std::io::Error>(())
    })
    .await
    .map_err(|_| {
        format!(
            "no {needle:?} within 60s: {}",
            String::from_utf8_lossy(&seen)
        )
    })??;
    Ok(String::from_utf8_lossy(&seen).into_owned())
}

/// The walk finds two orphans and asks; before the answer, a pod of one of them appears (a
/// VM hibernated during a long walk, a set created meanwhile). The objects are read again
/// right before each delete: that tag is kept, the other goes.
#[tokio::test]
async fn a_vm_that_becomes_live_before_the_delete_keeps_its_tag() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "gc-race").await?;
        let registry = cocoon_testenv::Registry::start_temp(None).await?;
        let reg = RegistryClient::new(RegistryConfig::for_registry(registry.addr())?)?;
        let late = vm_name_for_pod(&ns, "late-0");
        let gone = vm_name_for_pod(&ns, "gone-0");
        for vm in [&late, &gone] {
            push(&reg, vm, "hibernate").await?;
        }
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kubectl-cocoon"))
            .arg("--kubeconfig")
            .arg(env.kubeconfig_path())
            .args(["registry", "gc", "--registry", registry.addr(), "-i"])
            .env_remove("KUBECONFIG")
            .env("NO_COLOR", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let mut stderr = child.stderr.take().ok_or("stderr")?;
        let asked = read_until(&mut stderr, "delete 2 tag(s)? [y/N]").await?;
        assert!(asked.contains(&late) && asked.contains(&gone), "{asked}");

        // Between the walk and the delete, the VM becomes live.
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        assert_eq!(member_pod(&pods, &ns, "late", "0").await?, late);
        let mut stdin = child.stdin.take().ok_or("stdin")?;
        stdin.write_all(b"y\n").await?;
        drop(stdin);
        let mut rest = String::new();
        stderr.read_to_string(&mut rest).await?;
        let out = child.wait_with_output().await?;
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{asked}{rest}");
        assert!(
            reg.has_manifest(&late, "hibernate").await?,
            "live again: kept"
        );
        assert!(
            !reg.has_manifest(&gone, "hibernate").await?,
            "still an orphan: deleted"
        );
        let line = |vm: &str| {
            stdout
                .lines()
                .find(|l| l.contains(vm))
                .unwrap_or("")
                .to_string()
        };
        assert!(line(&late).contains("kept (live again)"), "{stdout}");
        assert!(line(&gone).contains("deleted"), "{stdout}");
        registry.shutdown();
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

/// Issue 35 item 2: a tag that no live object names by its VM, but whose manifest records an
/// owner pod that exists (a VM name colliding with a dead one), is kept; tags whose recorded
/// owner is gone, or whose namespace was re-created (another UID), are collected.
#[tokio::test]
async fn a_tag_whose_recorded_owner_lives_is_kept() {
    use cocoon_api::contract::oci::{
        ANNOTATION_OWNER_NAMESPACE as NS, ANNOTATION_OWNER_NAMESPACE_UID as UID,
        ANNOTATION_OWNER_POD as POD,
    };
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "gc-owner").await?;
        let uid = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
            .get(&ns)
            .await?
            .metadata
            .uid
            .ok_or("namespace uid")?;
        // The victim's pod exists; no object names the repository its tag sits in.
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "victim-0"},
            "spec": {"containers": [{"name": "c", "image": "img:1"}]},
        }))?;
        pods.create(&PostParams::default(), &pod).await?;
        let registry = cocoon_testenv::Registry::start_temp(None).await?;
        let reg = RegistryClient::new(RegistryConfig::for_registry(registry.addr())?)?;
        let colliding = vm_name_for_pod(&ns, "collides-0");
        let gone = vm_name_for_pod(&ns, "gone-0");
        let recreated = vm_name_for_pod(&ns, "recreated-0");
        push_with(&reg, &colliding, "hibernate", &[(NS, &ns), (POD, "victim-0"), (UID, &uid)]).await?;
        push_with(&reg, &gone, "hibernate", &[(NS, &ns), (POD, "gone-0")]).await?;
        push_with(&reg, &recreated, "hibernate", &[(NS, &ns), (POD, "victim-0"), (UID, "old-uid")]).await?;

        let out = run(
            env,
            &["registry", "gc", "--registry", registry.addr(), "--yes", "-o", "json"],
        )
        .await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let report: Value = serde_json::from_slice(&out.stdout)?;
        assert!(
            reg.has_manifest(&colliding, "hibernate").await?,
            "its recorded owner lives: kept ({report})"
        );
        assert_eq!(
            report["ownerLives"],
            json!([{"repository": colliding, "tag": "hibernate", "owner": format!("{ns}/victim-0")}]),
            "{report}"
        );
        assert!(!reg.has_manifest(&gone, "hibernate").await?, "owner gone: collected");
        assert!(
            !reg.has_manifest(&recreated, "hibernate").await?,
            "another namespace of the same name recorded: collected"
        );
        registry.shutdown();
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}
