//! cocoon-registry against the real registry (docker-registry 2.8.2 via cocoon-testenv): round
//! trips (dir, tar, sparse, >1 GiB), resume, corruption, delete, missing repos, auth, kinds.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use cocoon_api::contract::oci;
use cocoon_registry::tar::{
    PAX_SPARSE_MAP, PAX_SPARSE_SIZE, end_of_archive, padding, regular_file_header,
};
use cocoon_registry::{
    CredentialSource, Credentials, DeleteOutcome, Digest, ErrorClass, Manifest, PushEvent,
    PushOptions, Reference, RegistryClient, RegistryConfig,
};
use cocoon_testenv::{Registry, RegistryAuth, unique_name};
use common::{
    FileSpec, TempDir, allocated, fs_keeps_holes, mode, same_content, write_snapshot_dir,
};

const MIB: u64 = 1 << 20;
const BASE_IMAGE: &str = "ghcr.io/cocoonstack/cocoon/ubuntu:24.04";

async fn registry(auth: Option<RegistryAuth>) -> Registry {
    Registry::start_temp(auth)
        .await
        .expect("starting the test registry")
}

fn client_for(reg: &Registry, creds: Credentials) -> RegistryClient {
    let mut cfg = RegistryConfig::for_registry(reg.addr()).expect("config");
    cfg.credentials = CredentialSource::Static(creds);
    RegistryClient::new(cfg).expect("client")
}

fn client(reg: &Registry) -> RegistryClient {
    client_for(reg, Credentials::Anonymous)
}

/// A client for the gigabyte round trip: the production timeouts (30 s a request, 60 s idle
/// mid-transfer) are about a registry that hangs; on a test machine whose disk is busy with
/// every other test's writes, the registry storing a gigabyte may just be slow. The test is
/// about what arrives, not how fast.
fn patient_client(reg: &Registry) -> RegistryClient {
    let mut cfg = RegistryConfig::for_registry(reg.addr()).expect("config");
    cfg.credentials = CredentialSource::Static(Credentials::Anonymous);
    cfg.request_timeout = std::time::Duration::from_secs(300);
    cfg.transfer_idle_timeout = std::time::Duration::from_secs(300);
    RegistryClient::new(cfg).expect("client")
}

fn small_snapshot() -> Vec<FileSpec> {
    vec![
        FileSpec::dense("config.json", 3000),
        FileSpec::dense("state.json", 20_000),
        FileSpec::sparse(
            "memory-ranges",
            64 * MIB,
            vec![(0, MIB), (40 * MIB, 2 * MIB)],
        ),
        FileSpec::dense("cidata.img", 300_000),
    ]
}

/// Every file of `src` is in `dst` with the same content and mode, and `snapshot.json`
/// carries the local name and the pushed snapshot id.
fn assert_same_snapshot(
    src: &std::path::Path,
    dst: &std::path::Path,
    files: &[FileSpec],
    local: &str,
    id: &str,
) {
    for f in files {
        let (a, b) = (src.join(f.name), dst.join(f.name));
        assert_eq!(
            std::fs::metadata(&b).map(|m| m.len()).ok(),
            Some(f.size),
            "{} size",
            f.name
        );
        assert!(same_content(&a, &b).unwrap_or(false), "{} content", f.name);
        assert_eq!(mode(&b), f.mode, "{} mode", f.name);
    }
    let env: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dst.join("snapshot.json")).expect("snapshot.json"))
            .expect("json");
    assert_eq!(env["version"], 1);
    assert_eq!(env["config"]["name"], local);
    assert_eq!(env["config"]["id"], id);
    assert_eq!(env["config"]["image"], BASE_IMAGE);
    assert_eq!(env["config"]["cpu"], 2);
    assert_eq!(
        env["config"]["image_blob_ids"],
        serde_json::json!({"abcd": {}})
    );
}

#[tokio::test]
async fn multi_file_round_trip_keeps_holes_and_moves_a_file_over_1_gib() {
    let reg = registry(None).await;
    let c = patient_client(&reg);
    let work = TempDir::new("cocoon-reg-big");
    let src = work.path().join("src");
    std::fs::create_dir_all(&src).expect("mkdir");
    let files = vec![
        FileSpec::dense("config.json", 2048),
        FileSpec::dense("state.json", 12_345),
        FileSpec::sparse(
            "memory-ranges",
            256 * MIB,
            vec![(0, 2 * MIB), (100 * MIB, 3 * MIB + 123)],
        ),
        FileSpec::dense("cidata.img", MIB),
        // Over 1 GiB of real data (so it travels in many PATCH chunks), then a hole.
        FileSpec::sparse(
            "cow.raw",
            1280 * MIB,
            vec![(0, 1040 * MIB), (1279 * MIB, MIB)],
        ),
        // Dense on disk but with written zero runs: the pull turns those into holes.
        FileSpec {
            zero_ranges: vec![(4 * MIB, 8 * MIB)],
            ..FileSpec::dense("overlay.qcow2", 16 * MIB)
        },
    ];
    write_snapshot_dir(&src, "vm-big", "sid-big-1", &files, 7);
    let repo = unique_name("vk-big");

    let report = c
        .push_snapshot_dir(&repo, &src, &PushOptions::new("hibernate", BASE_IMAGE))
        .await
        .expect("push");
    assert_eq!(report.snapshot_id, "sid-big-1");
    assert!(report.layers.iter().all(|l| l.uploaded));
    let cow = report
        .layers
        .iter()
        .find(|l| l.name == "cow.raw")
        .expect("cow.raw layer");
    assert_eq!(
        cow.size,
        1041 * MIB,
        "a sparse file travels as its data extents only"
    );
    assert!(cow.size > 1 << 30);

    // The artifact has the layout of registry.md §5.
    let fetched = c
        .get_manifest(&repo, &Reference::parse("hibernate").expect("ref"))
        .await
        .expect("manifest");
    assert_eq!(fetched.digest, report.manifest_digest);
    let m = Manifest::parse(&fetched.bytes).expect("parse");
    assert_eq!(m.artifact_type.as_deref(), Some(oci::ARTIFACT_SNAPSHOT_V1));
    assert_eq!(m.media_type.as_deref(), Some(oci::MEDIA_OCI_MANIFEST));
    assert_eq!(
        m.config.as_ref().map(|c| c.media_type.as_str()),
        Some(oci::MEDIA_SNAPSHOT_CONFIG_V1)
    );
    let by_title: BTreeMap<&str, &str> = m
        .layers
        .iter()
        .map(|l| (l.title().unwrap_or(""), l.media_type.as_str()))
        .collect();
    assert_eq!(
        by_title,
        BTreeMap::from([
            ("cidata.img", oci::MEDIA_VM_CIDATA),
            ("config.json", oci::MEDIA_VM_CONFIG),
            ("cow.raw", oci::MEDIA_DISK_RAW),
            ("memory-ranges", oci::MEDIA_VM_MEMORY),
            ("overlay.qcow2", oci::MEDIA_DISK_QCOW2),
            ("state.json", oci::MEDIA_VM_STATE),
        ])
    );
    assert_eq!(
        m.annotations
            .get(oci::ANNOTATION_BASE_IMAGE)
            .map(String::as_str),
        Some(BASE_IMAGE)
    );
    assert!(m.annotations.contains_key(oci::ANNOTATION_CREATED));
    let info = c
        .snapshot_info(&repo, "hibernate")
        .await
        .expect("info")
        .expect("present");
    assert_eq!(info.snapshot_id, "sid-big-1");
    assert_eq!(info.base_image.as_deref(), Some(BASE_IMAGE));
    let cow_meta = info.config.files.get("cow.raw").expect("files[cow.raw]");
    assert_eq!(cow_meta.sparse_size, (1280 * MIB) as i64);
    assert!(cow_meta.sparse_map.is_some());
    assert_eq!(
        info.config.files.get("config.json").map(|f| f.mode),
        Some(0o640)
    );

    // Pull back into a directory.
    let dst = work.path().join("dst");
    let pulled = c
        .pull_snapshot_to_dir(&repo, "hibernate", &dst, "vm-big-hibernate-import")
        .await
        .expect("pull");
    assert_eq!(pulled.snapshot_id, "sid-big-1");
    assert_same_snapshot(&src, &dst, &files, "vm-big-hibernate-import", "sid-big-1");
    if fs_keeps_holes(work.path()) {
        assert!(
            allocated(&dst.join("cow.raw")) < 1100 * MIB,
            "cow.raw lost its hole"
        );
        assert!(
            allocated(&dst.join("memory-ranges")) < 16 * MIB,
            "memory-ranges lost its holes"
        );
        assert!(
            allocated(&dst.join("overlay.qcow2")) <= 9 * MIB,
            "zero runs were not left as holes"
        );
    }

    // A second push of the same files sends no layer again.
    let again = c
        .push_snapshot_dir(&repo, &src, &PushOptions::new("latest", BASE_IMAGE))
        .await
        .expect("second push");
    assert!(again.layers.iter().all(|l| !l.uploaded));
    assert_eq!(again.bytes_uploaded, 0);
    assert_ne!(
        again.manifest_digest, report.manifest_digest,
        "two tags never share manifest bytes"
    );
}

/// Builds the tar `cocoon snapshot export` writes for a snapshot directory: snapshot.json
/// first, sparse files as their data extents with COCOON.sparse.* records.
fn export_tar(dir: &std::path::Path, files: &[FileSpec]) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let mut out = Vec::new();
    let env = std::fs::read(dir.join("snapshot.json")).expect("snapshot.json");
    out.extend(regular_file_header(
        "snapshot.json",
        env.len() as u64,
        0o644,
        0,
        &[],
    ));
    out.extend(&env);
    out.resize(out.len() + padding(env.len() as u64), 0);
    for f in files {
        let file = std::fs::File::open(dir.join(f.name)).expect("open");
        let layout = cocoon_registry::sparse::layout_of(&file).expect("layout");
        let size = layout.packed_size();
        let map = layout.map_text();
        let logical = layout.size.to_string();
        let pax: Vec<(&str, &str)> = match &map {
            Some(m) => vec![
                (PAX_SPARSE_MAP, m.as_str()),
                (PAX_SPARSE_SIZE, logical.as_str()),
            ],
            None => vec![],
        };
        out.extend(regular_file_header(f.name, size, f.mode, 0, &pax));
        for e in layout.extents() {
            let mut buf = vec![0u8; e.length as usize];
            file.read_exact_at(&mut buf, e.offset).expect("read");
            out.extend(buf);
        }
        out.resize(out.len() + padding(size), 0);
    }
    out.extend(end_of_archive());
    out
}

#[tokio::test]
async fn export_tar_push_matches_dir_push_and_pulls_back_as_an_import_tar() {
    let reg = registry(None).await;
    let c = client(&reg);
    let work = TempDir::new("cocoon-reg-tar");
    let files = small_snapshot();
    write_snapshot_dir(work.path(), "vm-t", "sid-tar", &files, 3);
    let tar = export_tar(work.path(), &files);
    let repo = unique_name("vk-tar");

    let from_tar = c
        .push_snapshot_tar(
            &repo,
            std::io::Cursor::new(tar),
            &PushOptions::new("latest", BASE_IMAGE),
        )
        .await
        .expect("tar push");
    // The same snapshot pushed from the directory produces the same layers, so a dir push
    // after a tar push sends nothing.
    let from_dir = c
        .push_snapshot_dir(
            &repo,
            work.path(),
            &PushOptions::new("hibernate", BASE_IMAGE),
        )
        .await
        .expect("dir push");
    let digests = |r: &cocoon_registry::PushReport| {
        r.layers
            .iter()
            .map(|l| (l.name.clone(), l.digest.clone()))
            .collect::<Vec<_>>()
    };
    let mut tar_layers = digests(&from_tar);
    tar_layers.sort();
    assert_eq!(
        tar_layers,
        digests(&from_dir),
        "dir layers are in name order"
    );
    assert_eq!(from_dir.bytes_uploaded, 0);

    // Pull as the tar `cocoon snapshot import` reads.
    let mut import = Vec::new();
    let report = c
        .pull_snapshot_to_tar(&repo, "latest", "vm-t-clone", &mut import)
        .await
        .expect("tar pull");
    assert_eq!(report.snapshot_id, "sid-tar");
    let entries = common::read_tar_entries(import).await.expect("entries");
    assert_eq!(
        entries[0].0.name, "snapshot.json",
        "snapshot.json comes first"
    );
    let env: serde_json::Value = serde_json::from_slice(&entries[0].1).expect("json");
    assert_eq!(env["config"]["name"], "vm-t-clone");
    assert_eq!(env["config"]["id"], "sid-tar");
    let names: Vec<&str> = entries[1..].iter().map(|(e, _)| e.name.as_str()).collect();
    assert_eq!(
        names,
        ["config.json", "state.json", "memory-ranges", "cidata.img"],
        "tar (layer) order"
    );
    let mem = &entries[3];
    assert_eq!(
        mem.0.pax.get(PAX_SPARSE_SIZE).map(String::as_str),
        Some("67108864")
    );
    assert!(mem.0.pax.contains_key(PAX_SPARSE_MAP));
    assert_eq!(mem.0.mode, 0o600);
    assert_eq!(
        mem.1.len() as u64,
        3 * MIB,
        "sparse entries carry only their extents"
    );
    let state = std::fs::read(work.path().join("state.json")).expect("state");
    assert_eq!(entries[2].1, state);
}

#[tokio::test]
async fn an_interrupted_push_resumes_without_resending_blobs_that_are_there() {
    let reg = registry(None).await;
    let mut cfg = RegistryConfig::for_registry(reg.addr()).expect("cfg");
    cfg.transfer_concurrency = 1; // one blob at a time, so the interruption point is clear
    let c = RegistryClient::new(cfg).expect("client");
    let work = TempDir::new("cocoon-reg-resume");
    let files: Vec<FileSpec> = ["a.raw", "b.raw", "c.raw", "d.raw", "e.raw"]
        .into_iter()
        .map(|n| FileSpec::dense(n, 6 * MIB))
        .collect();
    write_snapshot_dir(work.path(), "vm-r", "sid-r", &files, 11);
    let repo = unique_name("vk-resume");

    // First attempt: stop once two blobs are in.
    let first: Arc<Mutex<Vec<Digest>>> = Arc::default();
    let two_in = Arc::new(tokio::sync::Notify::new());
    let mut opts = PushOptions::new("hibernate", BASE_IMAGE);
    let (seen, signal) = (first.clone(), two_in.clone());
    opts.observer = Some(Arc::new(move |e: &PushEvent| {
        if let PushEvent::BlobUploaded { digest, .. } = e {
            let mut s = seen.lock().unwrap_or_else(|p| p.into_inner());
            s.push(digest.clone());
            if s.len() == 2 {
                signal.notify_one();
            }
        }
    }));
    tokio::select! {
        r = c.push_snapshot_dir(&repo, work.path(), &opts) => panic!("push finished before the interruption: {r:?}"),
        _ = two_in.notified() => {}
    }
    assert!(
        !c.has_manifest(&repo, "hibernate").await.expect("probe"),
        "no manifest after an interrupted push"
    );
    let first: BTreeSet<Digest> = first
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .cloned()
        .collect();
    assert_eq!(first.len(), 2);

    // Second attempt: the two blobs are skipped, the rest is sent.
    let events: Arc<Mutex<Vec<PushEvent>>> = Arc::default();
    let mut opts = PushOptions::new("hibernate", BASE_IMAGE);
    let log = events.clone();
    opts.observer = Some(Arc::new(move |e: &PushEvent| {
        log.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(e.clone())
    }));
    let report = c
        .push_snapshot_dir(&repo, work.path(), &opts)
        .await
        .expect("resumed push");
    let skipped: BTreeSet<Digest> = report
        .layers
        .iter()
        .filter(|l| !l.uploaded)
        .map(|l| l.digest.clone())
        .collect();
    assert!(
        first.is_subset(&skipped),
        "blobs uploaded before the interruption were sent again"
    );
    assert!(skipped.len() < files.len(), "something was left to send");
    let resent: u64 = report
        .layers
        .iter()
        .filter(|l| l.uploaded)
        .map(|l| l.size)
        .sum();
    assert_eq!(report.bytes_uploaded, resent);
    assert_eq!(resent, (files.len() - skipped.len()) as u64 * 6 * MIB);
    let skip_events = events
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|e| matches!(e, PushEvent::BlobSkipped { .. }))
        .count();
    assert_eq!(skip_events, skipped.len());

    let dst = work.path().join("pulled");
    c.pull_snapshot_to_dir(&repo, "hibernate", &dst, "vm-r")
        .await
        .expect("pull");
    assert_same_snapshot(work.path(), &dst, &files, "vm-r", "sid-r");
}

#[tokio::test]
async fn a_corrupted_blob_is_detected_and_nothing_is_left_behind() {
    let reg = registry(None).await;
    let c = client(&reg);
    let work = TempDir::new("cocoon-reg-corrupt");
    let src = work.path().join("src");
    std::fs::create_dir_all(&src).expect("mkdir");
    let files = small_snapshot();
    write_snapshot_dir(&src, "vm-c", "sid-c", &files, 5);
    let repo = unique_name("vk-corrupt");
    let report = c
        .push_snapshot_dir(&repo, &src, &PushOptions::new("latest", ""))
        .await
        .expect("push");

    // Flip one byte of the cidata.img blob in the registry's storage (same length).
    let layer = report
        .layers
        .iter()
        .find(|l| l.name == "cidata.img")
        .expect("layer");
    let path = reg.blob_file(layer.digest.as_str());
    let mut bytes = std::fs::read(&path).expect("blob data");
    bytes[1000] ^= 0xff;
    std::fs::write(&path, &bytes).expect("corrupt");

    let dst = work.path().join("dst");
    let err = c
        .pull_snapshot_to_dir(&repo, "latest", &dst, "vm-c")
        .await
        .expect_err("corruption must fail the pull");
    assert!(err.to_string().contains("digest mismatch"), "{err}");
    assert_eq!(err.class(), ErrorClass::Protocol);
    assert!(!err.is_transient());
    assert!(
        !dst.exists(),
        "a failed pull must not leave the destination"
    );
    let leftovers: Vec<_> = std::fs::read_dir(work.path())
        .expect("ls")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(
        leftovers,
        vec![std::ffi::OsString::from("src")],
        "staging directory left behind"
    );

    let mut sink = Vec::new();
    let err = c
        .pull_snapshot_to_tar(&repo, "latest", "vm-c", &mut sink)
        .await
        .expect_err("tar pull");
    assert!(err.to_string().contains("digest mismatch"), "{err}");
    assert!(
        !sink.ends_with(&end_of_archive()),
        "a failed import tar must stay unterminated"
    );

    let mut blob = c
        .get_blob(&repo, &layer.digest, layer.size)
        .await
        .expect("get");
    let mut result = Ok(());
    loop {
        match blob.next().await {
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    assert!(
        matches!(result, Err(cocoon_registry::Error::DigestMismatch { .. })),
        "{result:?}"
    );
}

/// Reads an import tar the way a lenient importer does (a missing end-of-archive is a clean
/// end); `Err` when an entry is cut short.
async fn read_import_tar(bytes: Vec<u8>) -> std::io::Result<Vec<(String, Vec<u8>)>> {
    Ok(common::read_tar_entries(bytes)
        .await?
        .into_iter()
        .map(|(e, data)| (e.name, data))
        .collect())
}

/// Issue 26 item 7: a tampered blob whose size is a multiple of 512 used to end the import
/// tar on a block boundary, which a lenient reader takes for a complete archive. The last
/// piece of each blob is now held back until the blob verified, so the entry stays short.
#[tokio::test]
async fn a_tampered_block_aligned_blob_never_completes_the_import_tar() {
    let reg = registry(None).await;
    let c = client(&reg);
    let work = TempDir::new("cocoon-reg-aligned");
    // The tampered file is the last layer and 512-aligned, so that without the hold-back
    // every byte of the archive would be there except the end-of-archive blocks.
    let files = vec![
        FileSpec::dense("config.json", 3000),
        FileSpec::dense("state.json", 64 * 1024),
    ];
    write_snapshot_dir(work.path(), "vm-a", "sid-a", &files, 11);
    let repo = unique_name("vk-aligned");
    let report = c
        .push_snapshot_dir(&repo, work.path(), &PushOptions::new("latest", ""))
        .await
        .expect("push");
    let layer = report
        .layers
        .iter()
        .find(|l| l.name == "state.json")
        .expect("layer");
    assert_eq!(layer.size % 512, 0);

    // Untampered, the archive reads back whole.
    let mut good = Vec::new();
    c.pull_snapshot_to_tar(&repo, "latest", "vm-a", &mut good)
        .await
        .expect("pull");
    let entries = read_import_tar(good).await.expect("complete archive");
    assert_eq!(entries.len(), 3);

    // Same length, one byte changed near the end: the registry serves it as is.
    let path = reg.blob_file(layer.digest.as_str());
    let mut bytes = std::fs::read(&path).expect("blob data");
    let at = bytes.len() - 7;
    bytes[at] ^= 0x55;
    std::fs::write(&path, &bytes).expect("tamper");

    let mut sink = Vec::new();
    let err = c
        .pull_snapshot_to_tar(&repo, "latest", "vm-a", &mut sink)
        .await
        .expect_err("tampered blob");
    assert!(err.to_string().contains("digest mismatch"), "{err}");
    let read = read_import_tar(sink.clone()).await;
    assert!(
        read.is_err(),
        "the tampered entry must be cut short, not complete: {:?}",
        read.map(|e| e.into_iter().map(|(n, d)| (n, d.len())).collect::<Vec<_>>())
    );
}

#[tokio::test]
async fn delete_removes_the_tag_and_probes_of_missing_repositories_create_nothing() {
    let reg = registry(None).await;
    let c = client(&reg);
    let work = TempDir::new("cocoon-reg-del");
    let files = small_snapshot();
    write_snapshot_dir(work.path(), "vm-d", "sid-d", &files, 9);
    let repo = unique_name("vk-del");
    c.push_snapshot_dir(
        &repo,
        work.path(),
        &PushOptions::new("hibernate", BASE_IMAGE),
    )
    .await
    .expect("push");
    c.push_snapshot_dir(&repo, work.path(), &PushOptions::new("latest", BASE_IMAGE))
        .await
        .expect("push");

    assert!(
        c.has_manifest(&repo, "hibernate").await.expect("probe"),
        "OCI manifests are visible to probes"
    );
    let mut tags = c.list_tags(&repo).await.expect("tags");
    tags.sort();
    assert_eq!(tags, ["hibernate", "latest"]);

    let outcome = c
        .delete_tag_if_present(&repo, "hibernate")
        .await
        .expect("delete");
    assert!(matches!(outcome, DeleteOutcome::Deleted(_)), "{outcome:?}");
    assert!(!c.has_manifest(&repo, "hibernate").await.expect("probe"));
    assert_eq!(
        c.list_tags(&repo).await.expect("tags"),
        ["latest"],
        "latest is a different manifest and stays"
    );
    let err = c
        .get_manifest(&repo, &Reference::parse("hibernate").expect("ref"))
        .await
        .expect_err("gone");
    assert!(err.is_not_found());
    assert_eq!(err.to_string(), "manifest not found");
    assert_eq!(
        c.delete_tag(&repo, "hibernate").await.expect("again"),
        DeleteOutcome::Absent
    );

    // A repository nobody pushed: probes and deletes answer "absent" and leave no trace.
    let missing = unique_name("vk-never-pushed");
    assert!(!c.has_manifest(&missing, "hibernate").await.expect("probe"));
    assert_eq!(
        c.delete_tag_if_present(&missing, "hibernate")
            .await
            .expect("delete"),
        DeleteOutcome::Absent
    );
    assert!(c.list_tags(&missing).await.expect("tags").is_empty());
    assert!(
        c.snapshot_info(&missing, "hibernate")
            .await
            .expect("info")
            .is_none()
    );
    assert!(
        !reg.repo_dir(&missing).exists(),
        "a probe created the repository"
    );
    let catalog = c.catalog().await.expect("catalog");
    assert!(catalog.contains(&repo));
    assert!(!catalog.contains(&missing));
}

#[tokio::test]
async fn wrong_credentials_are_an_auth_error_and_right_ones_work() {
    let reg = registry(Some(RegistryAuth::new("alice", "s3cret-pw"))).await;
    let repo = unique_name("vk-auth");
    for creds in [
        Credentials::basic("alice", "wrong"),
        Credentials::basic("mallory", "s3cret-pw"),
        Credentials::Anonymous,
    ] {
        let c = client_for(&reg, creds.clone());
        let err = c
            .has_manifest(&repo, "hibernate")
            .await
            .expect_err("must be refused");
        assert_eq!(err.class(), ErrorClass::Unauthorized, "{creds:?}: {err}");
        assert!(err.is_auth() && !err.is_not_found() && !err.is_transient());
    }

    // The right credentials, from a Docker config.json (auths, base64 user:password).
    let work = TempDir::new("cocoon-reg-auth");
    let docker = work.path().join("docker");
    std::fs::create_dir_all(&docker).expect("mkdir");
    use base64::Engine as _;
    let auth = base64::engine::general_purpose::STANDARD.encode("alice:s3cret-pw");
    std::fs::write(
        docker.join("config.json"),
        serde_json::to_vec(&serde_json::json!({"auths": {reg.addr(): {"auth": auth}}}))
            .expect("json"),
    )
    .expect("write");
    let mut cfg = RegistryConfig::for_registry(reg.addr()).expect("cfg");
    cfg.credentials = CredentialSource::DockerConfig {
        path: docker.join("config.json"),
        helper_dir: None,
        helper_timeout: cocoon_registry::auth::DEFAULT_HELPER_TIMEOUT,
    };
    let c = RegistryClient::new(cfg).expect("client");
    let src = work.path().join("src");
    std::fs::create_dir_all(&src).expect("mkdir");
    let files = small_snapshot();
    write_snapshot_dir(&src, "vm-a", "sid-a", &files, 13);
    c.push_snapshot_dir(&repo, &src, &PushOptions::new("hibernate", BASE_IMAGE))
        .await
        .expect("authenticated push");
    assert!(c.has_manifest(&repo, "hibernate").await.expect("probe"));
    let dst = work.path().join("dst");
    c.pull_snapshot_to_dir(&repo, "hibernate", &dst, "vm-a")
        .await
        .expect("authenticated pull");
    assert_same_snapshot(&src, &dst, &files, "vm-a", "sid-a");
    assert!(matches!(
        c.delete_tag(&repo, "hibernate").await.expect("delete"),
        DeleteOutcome::Deleted(_)
    ));
}

#[tokio::test]
async fn a_hung_credential_helper_fails_pushes_and_pulls_instead_of_hanging() {
    let reg = registry(Some(RegistryAuth::new("alice", "s3cret-pw"))).await;
    let repo = unique_name("vk-hung-helper");
    let work = TempDir::new("cocoon-reg-hung");
    let docker = work.path().join("docker");
    std::fs::create_dir_all(&docker).expect("mkdir");
    // A credential helper that never answers.
    let src = work.path().join("helper.src");
    std::fs::write(&src, "#!/bin/sh\nsleep 100000 &\nwait\n").expect("write");
    let status = std::process::Command::new("install")
        .args(["-m", "0755"])
        .arg(&src)
        .arg(docker.join("docker-credential-stuck"))
        .status()
        .expect("install");
    assert!(status.success());
    std::fs::write(docker.join("config.json"), br#"{"credsStore":"stuck"}"#).expect("write");
    let mut cfg = RegistryConfig::for_registry(reg.addr()).expect("cfg");
    cfg.credentials = CredentialSource::DockerConfig {
        path: docker.join("config.json"),
        helper_dir: Some(docker.clone()),
        helper_timeout: std::time::Duration::from_millis(300),
    };
    let c = RegistryClient::new(cfg).expect("client");
    let snap = work.path().join("src");
    std::fs::create_dir_all(&snap).expect("mkdir");
    let files = small_snapshot();
    write_snapshot_dir(&snap, "vm-a", "sid-a", &files, 13);
    let is_helper_timeout = |e: &cocoon_registry::Error| {
        let mut cur: &(dyn std::error::Error + 'static) = e;
        loop {
            if let Some(cocoon_registry::Error::HelperTimeout { helper, .. }) =
                cur.downcast_ref::<cocoon_registry::Error>()
            {
                return helper == "stuck";
            }
            match cur.source() {
                Some(s) => cur = s,
                None => return false,
            }
        }
    };
    // The safety net only turns a regression (a hang) into a failure; nothing is timed.
    let guard = std::time::Duration::from_secs(120);
    let push = tokio::time::timeout(
        guard,
        c.push_snapshot_dir(&repo, &snap, &PushOptions::new("hibernate", BASE_IMAGE)),
    )
    .await
    .expect("the push must not hang on the helper")
    .expect_err("no credentials: the push fails");
    assert!(is_helper_timeout(&push), "{push:?}");
    assert!(
        push.to_string().contains("docker-credential-stuck"),
        "{push}"
    );
    let dst = work.path().join("dst");
    let pull = tokio::time::timeout(
        guard,
        c.pull_snapshot_to_dir(&repo, "hibernate", &dst, "vm-a"),
    )
    .await
    .expect("the pull must not hang on the helper")
    .expect_err("no credentials: the pull fails");
    assert!(is_helper_timeout(&pull), "{pull:?}");
}

#[tokio::test]
async fn non_snapshots_are_classified_and_cloud_images_stream_in_title_order() {
    let reg = registry(None).await;
    let c = client(&reg);
    let repo = unique_name("img");
    // A cloud image split into parts pushed out of order.
    let parts = [
        ("disk.qcow2.part.001", b"BBBB".to_vec()),
        ("disk.qcow2.part.000", b"AAAA".to_vec()),
    ];
    let mut layers = Vec::new();
    for (title, data) in &parts {
        let d = c
            .put_blob_bytes(&repo, Bytes::from(data.clone()))
            .await
            .expect("blob");
        layers.push(serde_json::json!({
            "mediaType": oci::MEDIA_DISK_QCOW2_PART, "digest": d.as_str(), "size": data.len(),
            "annotations": {oci::ANNOTATION_TITLE: title}
        }));
    }
    let cfg = c
        .put_blob_bytes(&repo, Bytes::from_static(b"{}"))
        .await
        .expect("cfg");
    let manifest = serde_json::json!({
        "schemaVersion": 2, "mediaType": oci::MEDIA_OCI_MANIFEST, "artifactType": oci::ARTIFACT_OS_IMAGE_V1,
        "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": cfg.as_str(), "size": 2},
        "layers": layers
    });
    let bytes = Bytes::from(serde_json::to_vec(&manifest).expect("json"));
    let image_size = bytes.len();
    let image_digest = c
        .put_manifest(&repo, "24.04", bytes, oci::MEDIA_OCI_MANIFEST)
        .await
        .expect("put");

    let mut disk = Vec::new();
    let n = c
        .stream_cloud_image(&repo, "24.04", &mut disk)
        .await
        .expect("stream");
    assert_eq!((n, disk.as_slice()), (8, b"AAAABBBB".as_slice()));
    let work = TempDir::new("cocoon-reg-kind");
    let err = c
        .pull_snapshot_to_dir(&repo, "24.04", &work.path().join("x"), "x")
        .await
        .expect_err("not a snapshot");
    assert_eq!(err.to_string(), "manifest is cloud-image, not a snapshot");

    // An index whose linux/amd64 child is the cloud image is followed.
    let index = serde_json::json!({
        "schemaVersion": 2, "mediaType": oci::MEDIA_OCI_INDEX,
        "manifests": [
            {"mediaType": oci::MEDIA_OCI_MANIFEST, "digest": image_digest.as_str(), "size": image_size,
             "platform": {"architecture": "amd64", "os": "linux"}}
        ]
    });
    let idx = Bytes::from(serde_json::to_vec(&index).expect("json"));
    c.put_manifest(&repo, "multi", idx, oci::MEDIA_OCI_INDEX)
        .await
        .expect("put index");
    let mut disk = Vec::new();
    c.stream_cloud_image(&repo, "multi", &mut disk)
        .await
        .expect("stream via index");
    assert_eq!(disk, b"AAAABBBB");
}

/// Paginated listings are bounded (issue 26 item 8). docker-registry 2.8 pages its catalog
/// (`?n=`, `Link: <…>; rel="next"`) but answers a tag list in one page, so: the catalog, asked
/// for pages of 1 over at least 3 repositories, is stopped by a page cap of 2 with an error
/// naming the limit, and walks through with a roomier cap (the cap, not the registry, stopped
/// it); a tag list of 5 is stopped by an entry cap of 4 and read whole with a cap of 5.
#[tokio::test]
async fn listing_walks_stop_at_the_page_and_entry_caps() {
    let reg = registry(None).await;
    let c = client(&reg);
    let work = TempDir::new("cocoon-reg-paging");
    write_snapshot_dir(work.path(), "vm-p", "sid-p", &small_snapshot(), 5);
    let repos: Vec<String> = (0..3)
        .map(|i| unique_name(&format!("vk-paging-{i}")))
        .collect();
    for r in &repos {
        c.push_snapshot_dir(r, work.path(), &PushOptions::new("t0", BASE_IMAGE))
            .await
            .expect("push");
    }
    let repo = &repos[0];
    let m = c
        .get_manifest(repo, &Reference::parse("t0").expect("ref"))
        .await
        .expect("manifest");
    let media = m.media_type.clone().expect("media type");
    for t in ["t1", "t2", "t3", "t4"] {
        c.put_manifest(repo, t, m.bytes.clone(), &media)
            .await
            .expect("tag");
    }
    let capped = |page_size: usize, max_pages: usize, max_entries: usize| {
        let mut cfg = RegistryConfig::for_registry(reg.addr()).expect("config");
        cfg.list_limits = cocoon_registry::ListLimits {
            page_size,
            max_pages,
            max_entries,
        };
        RegistryClient::new(cfg).expect("client")
    };

    let err = capped(1, 2, 1000)
        .catalog()
        .await
        .expect_err("3 pages, cap 2");
    assert_eq!(
        err.to_string(),
        "list catalog: more than 2 pages (limit OCI_REGISTRY_LIST_MAX_PAGES)"
    );
    assert_eq!(err.class(), ErrorClass::Protocol);
    let err = capped(1, 1000, 2)
        .catalog()
        .await
        .expect_err("3 entries, cap 2");
    assert_eq!(
        err.to_string(),
        "list catalog: more than 2 entries (limit OCI_REGISTRY_LIST_MAX_ENTRIES)"
    );
    let catalog = capped(1, 1000, 1000).catalog().await.expect("catalog");
    for r in &repos {
        assert!(catalog.contains(r), "{r} in {catalog:?}");
    }

    let err = capped(1000, 1000, 4)
        .list_tags(repo)
        .await
        .expect_err("5 tags, cap 4");
    assert_eq!(
        err.to_string(),
        format!("list tags of {repo}: more than 4 entries (limit OCI_REGISTRY_LIST_MAX_ENTRIES)")
    );
    let mut all = capped(1000, 1000, 5)
        .list_tags(repo)
        .await
        .expect("within caps");
    all.sort();
    assert_eq!(all, ["t0", "t1", "t2", "t3", "t4"]);
}

/// Issue 26 item 9: a snapshot config may claim setuid, setgid and sticky bits (ours records
/// `mode & 0o7777` as the Go writer does); a pull creates every file with its permission bits
/// only, so a registry artifact can never plant a setuid file on the host. (Modes without
/// group/other write bits: the process umask applies to created files.)
#[tokio::test]
async fn pulled_files_never_keep_setuid_setgid_or_sticky_bits() {
    let reg = registry(None).await;
    let c = client(&reg);
    let work = TempDir::new("cocoon-reg-modes");
    let src = work.path().join("src");
    std::fs::create_dir_all(&src).expect("mkdir");
    let files = vec![
        FileSpec {
            mode: 0o4755,
            ..FileSpec::dense("config.json", 3000)
        },
        FileSpec {
            mode: 0o2750,
            ..FileSpec::dense("state.json", 20_000)
        },
        FileSpec {
            mode: 0o1755,
            ..FileSpec::dense("cidata.img", 300_000)
        },
        FileSpec {
            mode: 0o6000,
            ..FileSpec::dense("overlay.qcow2", 4096)
        },
    ];
    write_snapshot_dir(&src, "vm-modes", "sid-modes", &files, 11);
    for f in &files {
        assert_eq!(mode(&src.join(f.name)), f.mode, "{} source mode", f.name);
    }
    let repo = unique_name("vk-modes");
    c.push_snapshot_dir(&repo, &src, &PushOptions::new("hibernate", BASE_IMAGE))
        .await
        .expect("push");
    let info = c
        .snapshot_info(&repo, "hibernate")
        .await
        .expect("info")
        .expect("present");
    // The artifact really carries the special bits.
    assert_eq!(
        info.config.files.get("config.json").map(|f| f.mode),
        Some(0o4755)
    );
    assert_eq!(
        info.config.files.get("overlay.qcow2").map(|f| f.mode),
        Some(0o6000)
    );

    let dst = work.path().join("dst");
    c.pull_snapshot_to_dir(&repo, "hibernate", &dst, "vm-modes-import")
        .await
        .expect("pull");
    for (name, want) in [
        ("config.json", 0o755),
        ("state.json", 0o750),
        ("cidata.img", 0o755),
        // Nothing left of 0o6000: the default file mode.
        (
            "overlay.qcow2",
            cocoon_registry::validate::DEFAULT_FILE_MODE,
        ),
    ] {
        let got = mode(&dst.join(name));
        assert_eq!(got, want, "{name}: pulled mode {got:o}");
        assert_eq!(got & 0o7000, 0, "{name}: special bits kept ({got:o})");
    }
}

/// `PushOptions::before_manifest` is asked right before the manifest put: a refusal leaves no
/// tag (the push fails with `ManifestWithheld` and its reason), a pass tags as usual.
#[tokio::test]
async fn a_withheld_manifest_put_leaves_no_tag() {
    let reg = registry(None).await;
    let c = client(&reg);
    let work = TempDir::new("cocoon-reg-gate");
    write_snapshot_dir(work.path(), "vm-g", "sid-g", &small_snapshot(), 5);
    let repo = unique_name("ckpt-gate");
    let asked = Arc::new(Mutex::new(0usize));
    let gate = |verdict: Result<(), String>| -> cocoon_registry::ManifestGate {
        let asked = asked.clone();
        Arc::new(move || {
            *asked.lock().expect("count") += 1;
            let verdict = verdict.clone();
            Box::pin(async move { verdict })
        })
    };
    let mut opts = PushOptions::new("checkpoint", BASE_IMAGE);
    opts.before_manifest = Some(gate(Err("the checkpoint is gone".into())));
    let err = c
        .push_snapshot_dir(&repo, work.path(), &opts)
        .await
        .expect_err("withheld");
    assert!(
        matches!(err, cocoon_registry::Error::ManifestWithheld { ref reason } if reason == "the checkpoint is gone"),
        "{err}"
    );
    assert!(!c.has_manifest(&repo, "checkpoint").await.expect("probe"));
    opts.before_manifest = Some(gate(Ok(())));
    c.push_snapshot_dir(&repo, work.path(), &opts)
        .await
        .expect("push");
    assert!(c.has_manifest(&repo, "checkpoint").await.expect("probe"));
    assert_eq!(*asked.lock().expect("count"), 2, "asked once per push");
}
