//! `kubectl cocoon registry gc` end to end (issue 26 item 6): the plugin binary against the
//! real control plane and a registry of its own. Only VM-named repositories are candidates
//! (base images survive `--include-latest --yes`, used or not), and a tag whose VM becomes
//! live between the walk and the delete is kept. A tag whose recorded owner (issue 35 item 2)
//! still lives is kept although no object names its VM. Checkpoint artifacts (issue 38) are
//! live while their CocoonCheckpoint exists, and collected once it is gone.

// Shared with plugin_cli.rs; this file uses part of it.
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

/// The rows of table `out` that name `repo`, one per line, columns one blank apart.
fn rows_of(out: &str, repo: &str) -> String {
    let rows: Vec<String> = out
        .lines()
        .filter(|l| l.contains(repo))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    rows.join("\n")
}

/// Creates CocoonCheckpoint `<ns>/<name>` (with the operator's finalizer when `finalizer`) and
/// returns its UID.
async fn checkpoint_cr(
    client: &kube::Client,
    ns: &str,
    name: &str,
    finalizer: bool,
) -> Result<String, BoxError> {
    use cocoon_api::contract::checkpoint::FINALIZER;
    use cocoon_api::crd::checkpoint::CocoonCheckpoint;
    let finalizers: Vec<&str> = if finalizer { vec![FINALIZER] } else { vec![] };
    let cr: CocoonCheckpoint = serde_json::from_value(json!({
        "apiVersion": "cocoonset.cocoonstack.io/v1", "kind": "CocoonCheckpoint",
        "metadata": {"name": name, "finalizers": finalizers},
        "spec": {"source": {"podRef": {"name": "source-0"}}},
    }))?;
    let crs: Api<CocoonCheckpoint> = Api::namespaced(client.clone(), ns);
    let cr = crs.create(&PostParams::default(), &cr).await?;
    Ok(cr.metadata.uid.ok_or("checkpoint uid")?)
}

/// Issue 38: checkpoint artifacts (`ckpt-…:checkpoint`). A live checkpoint's artifact is kept
/// (also one pushed without an owner record: the CR alone keeps it), and so is one a set's
/// image names; the artifact of a checkpoint deleted with its finalizer stripped by hand is
/// listed in the dry run and deleted with `--yes`; an artifact whose owner record names another
/// namespace's live checkpoint is kept (`ownerLives`), one whose record names a pod is kept and
/// reported (`ownerMismatch`); `ckpt-`-looking repositories of another shape, and other tags of
/// checkpoint repositories, are untouched.
#[tokio::test]
async fn checkpoint_artifacts_are_live_while_their_checkpoint_exists() {
    use cocoon_api::contract::checkpoint::{checkpoint_artifact, checkpoint_owner_annotations};
    use cocoon_api::contract::owner::owner_annotations;
    use cocoon_api::crd::checkpoint::CocoonCheckpoint;
    use kube::api::{DeleteParams, Patch, PatchParams};
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "gc-ckpt").await?;
        let other = cocoon_testenv::create_namespace(&client, "gc-ckpt-b").await?;
        let registry = cocoon_testenv::Registry::start_temp(None).await?;
        let reg = RegistryClient::new(RegistryConfig::for_registry(registry.addr())?)?;
        let art = |ns: &str, name: &str, uid: &str| -> Result<String, BoxError> {
            Ok(checkpoint_artifact(ns, name, uid)?.repository)
        };
        let pairs = |m: &std::collections::BTreeMap<String, String>| -> Vec<(String, String)> {
            m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
        };
        let push_owned = |repo: String, owner: Vec<(String, String)>| {
            let reg = &reg;
            async move {
                let extra: Vec<(&str, &str)> = owner
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect();
                push_with(reg, &repo, "checkpoint", &extra).await?;
                Ok::<_, BoxError>(repo)
            }
        };

        // Live: its CR exists (one artifact with the owner record, one without any).
        let live_uid = checkpoint_cr(&client, &ns, "live", false).await?;
        let ck_owner = |ns: &str, name: &str| pairs(&checkpoint_owner_annotations(ns, name));
        let live = push_owned(art(&ns, "live", &live_uid)?, ck_owner(&ns, "live")).await?;
        let bare_uid = checkpoint_cr(&client, &ns, "bare", false).await?;
        let bare = push_owned(art(&ns, "bare", &bare_uid)?, vec![]).await?;
        // Orphan: the CR is deleted and its finalizer stripped by hand (no operator ran).
        let gone_uid = checkpoint_cr(&client, &ns, "gone", true).await?;
        let orphan = push_owned(art(&ns, "gone", &gone_uid)?, ck_owner(&ns, "gone")).await?;
        let crs: Api<CocoonCheckpoint> = Api::namespaced(client.clone(), &ns);
        crs.delete("gone", &DeleteParams::default()).await?;
        let strip = Patch::Merge(json!({"metadata": {"finalizers": null}}));
        crs.patch("gone", &PatchParams::default(), &strip).await?;
        assert!(crs.get_opt("gone").await?.is_none(), "the CR is gone");
        // No CR derives these; the owner record names another namespace's live checkpoint, or
        // a pod (a mismatched record).
        checkpoint_cr(&client, &other, "theirs", false).await?;
        let foreign = push_owned(art(&ns, "moved", "uid-1")?, ck_owner(&other, "theirs")).await?;
        let pod_record = pairs(&owner_annotations(&ns, None, "victim-0"));
        let pod_owned = push_owned(art(&ns, "podowned", "uid-2")?, pod_record).await?;
        // A forked set's main starts from the artifact: its image names it.
        let forked = push_owned(art(&ns, "forked", "uid-3")?, vec![]).await?;
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        let spec = CocoonSetSpec::with_image(format!("{}/{forked}:checkpoint", registry.addr()));
        sets.create(&PostParams::default(), &CocoonSet::new("fork", spec))
            .await?;
        // Not checkpoint-shaped, or not the checkpoint tag: untouched.
        push(&reg, "ckpt-my-backup", "checkpoint").await?;
        push(&reg, &orphan, "v1").await?;

        let dry = run(env, &["registry", "gc", "--registry", registry.addr()]).await;
        assert_eq!(dry.status.code(), Some(0), "{}", text(&dry.stderr));
        let listing = text(&dry.stdout);
        let line = |repo: &str| rows_of(&listing, repo);
        assert!(
            line(&orphan).ends_with("checkpoint would delete"),
            "{listing}"
        );
        let theirs = format!("{other}/cocooncheckpoint/theirs");
        let kept_for = format!("kept (owner {theirs} lives)");
        assert!(line(&foreign).ends_with(&kept_for), "{listing}");
        let mismatch = format!("kept (owner record {ns}/victim-0 is not a checkpoint)");
        assert!(line(&pod_owned).ends_with(&mismatch), "{listing}");
        for kept in [&live, &bare, &forked, "ckpt-my-backup"] {
            assert!(
                line(kept).is_empty(),
                "{kept}: live or no candidate\n{listing}"
            );
        }
        assert!(
            reg.has_manifest(&orphan, "checkpoint").await?,
            "a dry run deletes nothing"
        );

        let yes = run(
            env,
            &["registry", "gc", "--registry", registry.addr(), "--yes"],
        )
        .await;
        assert_eq!(yes.status.code(), Some(0), "{}", text(&yes.stderr));
        let done = text(&yes.stdout);
        let line = |repo: &str| rows_of(&done, repo);
        assert!(line(&orphan).ends_with("checkpoint deleted"), "{done}");
        assert!(line(&foreign).ends_with(&kept_for), "{done}");
        assert!(line(&pod_owned).ends_with(&mismatch), "{done}");

        // What is left, as JSON: no orphan; the two kept for their owner record.
        let out = run(
            env,
            &[
                "registry",
                "gc",
                "--registry",
                registry.addr(),
                "-o",
                "json",
            ],
        )
        .await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let report: Value = serde_json::from_slice(&out.stdout)?;
        assert_eq!(report["orphans"], json!([]), "{report}");
        let pod_owner = format!("{ns}/victim-0");
        assert_eq!(
            report["ownerLives"],
            json!([{"repository": foreign, "tag": "checkpoint", "owner": theirs}]),
            "only the foreign record: the live checkpoints are kept by their CR ({report})"
        );
        assert_eq!(
            report["ownerMismatch"],
            json!([{"repository": pod_owned, "tag": "checkpoint", "owner": pod_owner}]),
            "{report}"
        );
        assert!(
            !reg.has_manifest(&orphan, "checkpoint").await?,
            "the orphan is collected"
        );
        for kept in [&live, &bare, &foreign, &pod_owned, &forked] {
            assert!(
                reg.has_manifest(kept, "checkpoint").await?,
                "{kept}:checkpoint kept"
            );
        }
        assert!(
            reg.has_manifest(&orphan, "v1").await?,
            "only :checkpoint is collected"
        );
        assert!(
            reg.has_manifest("ckpt-my-backup", "checkpoint").await?,
            "another shape"
        );
        registry.shutdown();
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        cocoon_testenv::delete_namespace(&client, &other).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}
