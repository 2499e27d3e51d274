//! The v2 snapshot wire format against the recorded output of the Go cocoon-common v0.3.0
//! (`shared/fixtures/cocoon-common-v0.3.0-snapshots`): each layout is loaded into the real
//! registry with its exact manifest bytes and pulled by this client; tampering fails closed;
//! and this client's v2 pushes of the same source are structured exactly like Go's.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use cocoon_api::contract::oci;
use cocoon_registry::{
    Digest, Manifest, PushOptions, RegistryClient, RegistryConfig, SnapshotConfig, V2Options,
};
use cocoon_testenv::paths::snapshot_fixtures;
use cocoon_testenv::{Registry, unique_name};
use common::TempDir;

/// The real `cocoon` v0.3.8 envelope of the fixtures (README "The envelope").
const ENVELOPE: &str = r#"{
  "config": {
    "cpu": 2,
    "memory": 1073741824,
    "storage": 10737418240,
    "image": "tinyimg",
    "image_digest": "sha256:1b7af784841125887e688254229e282829e17245d0e47fe7280da9b68a30d9e1",
    "image_type": "cloudimg",
    "id": "gosnap-fixture",
    "name": "gosnap-fixture",
    "description": "probe",
    "image_blob_ids": {
      "1b7af784841125887e688254229e282829e17245d0e47fe7280da9b68a30d9e1": {}
    },
    "hypervisor": "cloud-hypervisor",
    "nics": 1
  },
  "version": 1
}
"#;

const VARIANTS: [&str; 3] = ["v1", "v2-zstd3", "v2-zstd3-chunk1"];
const SOURCE_FILES: [(&str, u32); 3] = [
    ("config.json", 0o640),
    ("memory-ranges", 0o600),
    ("state.json", 0o640),
];

fn client(reg: &Registry, v2: V2Options) -> RegistryClient {
    let mut cfg = RegistryConfig::for_registry(reg.addr()).expect("config");
    cfg.v2 = v2;
    RegistryClient::new(cfg).expect("client")
}

fn blob_path(layout: &Path, digest: &str) -> PathBuf {
    layout
        .join("blobs/sha256")
        .join(digest.trim_start_matches("sha256:"))
}

/// The manifest of an OCI layout (its `index.json`'s only descriptor): digest and bytes.
fn layout_manifest(layout: &Path) -> (String, Vec<u8>) {
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).expect("index.json"))
            .expect("index json");
    let digest = index["manifests"][0]["digest"]
        .as_str()
        .expect("digest")
        .to_string();
    let bytes = std::fs::read(blob_path(layout, &digest)).expect("manifest blob");
    (digest, bytes)
}

/// Uploads every blob of the layout and puts its manifest bytes unchanged under `tag`.
async fn load_layout(c: &RegistryClient, layout: &Path, repo: &str, tag: &str) -> Manifest {
    let (digest, bytes) = layout_manifest(layout);
    let m = Manifest::parse(&bytes).expect("manifest");
    let mut blobs: Vec<String> = m.layers.iter().map(|l| l.digest.clone()).collect();
    blobs.extend(m.config.iter().map(|c| c.digest.clone()));
    for d in blobs {
        let data = std::fs::read(blob_path(layout, &d)).expect("blob");
        let put = c
            .put_blob_bytes(repo, Bytes::from(data))
            .await
            .expect("put blob");
        assert_eq!(put.to_string(), d);
    }
    let put = c
        .put_manifest(repo, tag, Bytes::from(bytes), oci::MEDIA_OCI_MANIFEST)
        .await
        .expect("put manifest");
    assert_eq!(put.to_string(), digest, "the exact manifest bytes");
    m
}

fn assert_envelope(env_bytes: &[u8], local: &str) {
    let env: serde_json::Value = serde_json::from_slice(env_bytes).expect("envelope json");
    let want: serde_json::Value = serde_json::from_str(ENVELOPE).expect("fixture envelope");
    let mut want = want;
    want["config"]["name"] = local.into();
    assert_eq!(env, want, "the envelope equals the real export's as JSON");
}

/// Issue 27 item 1: every fixture layout, loaded with its exact manifest bytes, pulls into a
/// directory and into an import tar with every file byte-identical to `source/`.
#[tokio::test]
async fn go_written_layouts_pull_byte_identical_to_their_source() {
    let fx = snapshot_fixtures();
    let reg = Registry::start_temp(None).await.expect("registry");
    let c = client(&reg, V2Options::default());
    let work = TempDir::new("cocoon-v2-fixture");
    for variant in VARIANTS {
        let repo = unique_name("gosnap");
        load_layout(&c, &fx.join(variant), &repo, variant).await;
        let dst = work.path().join(variant);
        let report = c
            .pull_snapshot_to_dir(&repo, variant, &dst, "clone-local")
            .await
            .unwrap_or_else(|e| panic!("{variant}: pull: {e}"));
        assert_eq!(report.snapshot_id, "gosnap-fixture");
        for (name, mode) in SOURCE_FILES {
            let want = std::fs::read(fx.join("source").join(name)).expect("source");
            let got = std::fs::read(dst.join(name)).expect("pulled");
            assert!(got == want, "{variant}: {name} differs from source/");
            assert_eq!(
                common::mode(&dst.join(name)),
                mode,
                "{variant}: {name} mode"
            );
        }
        assert_envelope(
            &std::fs::read(dst.join("snapshot.json")).expect("snapshot.json"),
            "clone-local",
        );

        let mut tar = Vec::new();
        c.pull_snapshot_to_tar(&repo, variant, "clone-local", &mut tar)
            .await
            .unwrap_or_else(|e| panic!("{variant}: tar pull: {e}"));
        let entries = read_tar(tar).await.expect("complete archive");
        let names: Vec<&str> = entries.iter().map(|(n, _, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "snapshot.json",
                "config.json",
                "memory-ranges",
                "state.json"
            ],
            "{variant}"
        );
        assert_envelope(&entries[0].2, "clone-local");
        for ((name, mode), (_, got_mode, data)) in SOURCE_FILES.iter().zip(&entries[1..]) {
            let want = std::fs::read(fx.join("source").join(name)).expect("source");
            assert!(*data == want, "{variant}: tar {name} differs");
            assert_eq!(got_mode, mode, "{variant}: tar {name} mode");
        }
    }
}

async fn read_tar(bytes: Vec<u8>) -> std::io::Result<Vec<(String, u32, Vec<u8>)>> {
    Ok(common::read_tar_entries(bytes)
        .await?
        .into_iter()
        .map(|(e, data)| (e.name, e.mode, data))
        .collect())
}

/// A chunk changed in the registry's storage (same length) fails the pull before any of its
/// bytes are written: the directory pull leaves nothing, the import tar is cut short.
#[tokio::test]
async fn a_tampered_chunk_fails_closed() {
    let fx = snapshot_fixtures();
    let reg = Registry::start_temp(None).await.expect("registry");
    let c = client(&reg, V2Options::default());
    let repo = unique_name("gosnap-bad");
    let m = load_layout(&c, &fx.join("v2-zstd3-chunk1"), &repo, "t").await;
    // Chunk 2 of memory-ranges.
    let chunk = &m.layers[3];
    assert_eq!(
        chunk
            .annotations
            .get(oci::ANNOTATION_CHUNK_INDEX)
            .map(String::as_str),
        Some("2")
    );
    let path = reg.blob_file(&chunk.digest);
    let mut bytes = std::fs::read(&path).expect("chunk");
    bytes[1000] ^= 0x01;
    std::fs::write(&path, &bytes).expect("tamper");

    let work = TempDir::new("cocoon-v2-bad");
    let dst = work.path().join("dst");
    let err = c
        .pull_snapshot_to_dir(&repo, "t", &dst, "x")
        .await
        .expect_err("tampered chunk");
    assert!(err.to_string().contains("digest mismatch"), "{err}");
    assert!(!dst.exists());
    assert_eq!(
        std::fs::read_dir(work.path()).expect("ls").count(),
        0,
        "no staging left"
    );

    let mut tar = Vec::new();
    let err = c
        .pull_snapshot_to_tar(&repo, "t", "x", &mut tar)
        .await
        .expect_err("tampered chunk");
    assert!(err.to_string().contains("digest mismatch"), "{err}");
    assert!(
        read_tar(tar.clone()).await.is_err(),
        "the memory-ranges entry must stay short"
    );
    // Chunks 0 and 1 verified and may have been written; nothing of chunk 2 was: the
    // written part of the file is a prefix of the source of at most two chunks.
    let source = std::fs::read(fx.join("source/memory-ranges")).expect("source");
    let start = tar
        .windows(13)
        .position(|w| w == b"memory-ranges")
        .expect("memory-ranges header")
        / 512
        * 512
        + 512;
    let written = &tar[start..];
    assert!(written.len() <= 2 << 20, "{} bytes", written.len());
    assert_eq!(written, &source[..written.len()]);
}

/// An unchunked zstd layer decodes into the staging directory while it downloads (its digest
/// is known only at the end): one changed near its end has had most of its bytes decoded
/// into staging when the pull fails, and still nothing is left, neither the destination nor
/// the staging directory.
#[tokio::test]
async fn a_tampered_unchunked_zstd_layer_leaves_nothing_behind() {
    let fx = snapshot_fixtures();
    let reg = Registry::start_temp(None).await.expect("registry");
    let c = client(&reg, V2Options::default());
    let repo = unique_name("gosnap-bad-zstd");
    let m = load_layout(&c, &fx.join("v2-zstd3"), &repo, "t").await;
    let layer = m
        .layers
        .iter()
        .find(|l| {
            l.annotations.get(oci::ANNOTATION_TITLE).map(String::as_str) == Some("memory-ranges")
        })
        .expect("memory-ranges layer");
    assert!(layer.media_type.ends_with("+zstd"), "{}", layer.media_type);
    let path = reg.blob_file(&layer.digest);
    let mut bytes = std::fs::read(&path).expect("layer");
    let at = bytes.len() - 100;
    bytes[at] ^= 0x01;
    std::fs::write(&path, &bytes).expect("tamper");

    let work = TempDir::new("cocoon-v2-bad-zstd");
    let dst = work.path().join("dst");
    c.pull_snapshot_to_dir(&repo, "t", &dst, "x")
        .await
        .expect_err("tampered zstd layer");
    assert!(!dst.exists());
    assert_eq!(
        std::fs::read_dir(work.path()).expect("ls").count(),
        0,
        "no staging left"
    );
}

/// Manifests the Go reader refuses: a `files[].size` claim that does not match what the
/// blobs decode to, and a v2 layer type in a v1 manifest. Both are put with real blobs
/// (the registry verifies those), so only the claims are false.
#[tokio::test]
async fn false_size_claims_and_v2_layers_in_v1_fail_before_anything_is_written() {
    let fx = snapshot_fixtures();
    let reg = Registry::start_temp(None).await.expect("registry");
    let c = client(&reg, V2Options::default());
    let layout = fx.join("v2-zstd3");
    let repo = unique_name("gosnap-claims");
    let m = load_layout(&c, &layout, &repo, "orig").await;
    let cfg_desc = m.config.clone().expect("config");
    let cfg_bytes = std::fs::read(blob_path(&layout, &cfg_desc.digest)).expect("config blob");

    let put_variant = |tag: &'static str, cfg: serde_json::Value, artifact: &'static str| {
        let c = c.clone();
        let (repo, m) = (repo.clone(), m.clone());
        async move {
            let bytes = Bytes::from(serde_json::to_vec(&cfg).expect("json"));
            let size = bytes.len() as i64;
            let d = c.put_blob_bytes(&repo, bytes).await.expect("config");
            let mut m = m;
            m.artifact_type = Some(artifact.to_string());
            if let Some(cd) = m.config.as_mut() {
                cd.digest = d.to_string();
                cd.size = size;
            }
            c.put_manifest(
                &repo,
                tag,
                Bytes::from(serde_json::to_vec(&m).expect("json")),
                oci::MEDIA_OCI_MANIFEST,
            )
            .await
            .expect("manifest");
        }
    };
    let orig: serde_json::Value = serde_json::from_slice(&cfg_bytes).expect("config json");
    // One byte less than memory-ranges decodes to.
    let mut short = orig.clone();
    short["files"]["memory-ranges"]["size"] = (6_291_456 - 1).into();
    put_variant("short", short, oci::ARTIFACT_SNAPSHOT_V2).await;
    let mut long = orig.clone();
    long["files"]["memory-ranges"]["size"] = (6_291_456 + 512).into();
    put_variant("long", long, oci::ARTIFACT_SNAPSHOT_V2).await;
    // A raw file whose size claim differs from its layer.
    let mut raw = orig.clone();
    raw["files"]["config.json"]["size"] = 512.into();
    put_variant("raw", raw, oci::ARTIFACT_SNAPSHOT_V2).await;
    let mut v1 = orig.clone();
    v1["schemaVersion"] = "v1".into();
    put_variant("as-v1", v1, oci::ARTIFACT_SNAPSHOT_V1).await;

    let work = TempDir::new("cocoon-v2-claims");
    for (tag, want) in [
        ("short", "size mismatch"),
        ("long", "size mismatch"),
        ("raw", "files[config.json].size"),
        ("as-v1", "zstd layer in a v1 manifest"),
    ] {
        let dst = work.path().join(tag);
        let err = c
            .pull_snapshot_to_dir(&repo, tag, &dst, "x")
            .await
            .expect_err(tag);
        assert!(err.to_string().contains(want), "{tag}: {err}");
        assert!(!dst.exists(), "{tag}");
        let mut tar = Vec::new();
        let err = c
            .pull_snapshot_to_tar(&repo, tag, "x", &mut tar)
            .await
            .expect_err(tag);
        assert!(err.to_string().contains(want), "{tag}: {err}");
        assert!(
            read_tar(tar).await.is_err() || tag == "raw" || tag == "as-v1",
            "{tag}"
        );
    }
}

/// The fixture's source directory with its envelope, modes as recorded.
fn source_dir(work: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let fx = snapshot_fixtures();
    let dir = work.join("src");
    std::fs::create_dir_all(&dir).expect("mkdir");
    for (name, mode) in SOURCE_FILES {
        let data = std::fs::read(fx.join("source").join(name)).expect("source");
        std::fs::write(dir.join(name), data).expect("write");
        std::fs::set_permissions(dir.join(name), std::fs::Permissions::from_mode(mode))
            .expect("chmod");
    }
    std::fs::write(dir.join("snapshot.json"), ENVELOPE).expect("envelope");
    dir
}

/// A manifest as structure: everything but blob digests/sizes of encoded layers, the config
/// digest/size and the created time.
fn manifest_shape(m: &Manifest) -> serde_json::Value {
    let layers: Vec<serde_json::Value> = m
        .layers
        .iter()
        .map(|l| {
            let encoded = l.media_type.ends_with(oci::ZSTD_SUFFIX);
            serde_json::json!({
                "mediaType": l.media_type,
                "annotations": l.annotations,
                // Raw layers are the same bytes, so the same digests.
                "digest": if encoded { serde_json::Value::Null } else { l.digest.clone().into() },
            })
        })
        .collect();
    let mut ann: BTreeMap<String, String> = m.annotations.clone();
    ann.remove(oci::ANNOTATION_CREATED);
    serde_json::json!({
        "schemaVersion": m.schema_version,
        "mediaType": m.media_type,
        "artifactType": m.artifact_type,
        "configMediaType": m.config.as_ref().map(|c| c.media_type.clone()),
        "layers": layers,
        "annotations": ann,
    })
}

/// A config as structure: `createdAt` dropped, chunk digests replaced by their count.
fn config_shape(bytes: &[u8]) -> serde_json::Value {
    let mut v: serde_json::Value = serde_json::from_slice(bytes).expect("config json");
    if let Some(o) = v.as_object_mut() {
        o.remove("createdAt");
    }
    if let Some(files) = v["files"].as_object_mut() {
        for f in files.values_mut() {
            if let Some(chunks) = f.get("chunks").and_then(|c| c.as_array()).map(Vec::len) {
                f["chunks"] = chunks.into();
            }
        }
    }
    v
}

/// Issue 27 item 2: pushing the fixture's source with the knobs of each Go variant gives a
/// manifest and config structured exactly like the Go writer's (v1: identical layer digests),
/// every chunk one frame, and the pull gives the source back.
#[tokio::test]
async fn v2_pushes_are_structured_like_the_go_writer_and_read_back() {
    let fx = snapshot_fixtures();
    let reg = Registry::start_temp(None).await.expect("registry");
    let work = TempDir::new("cocoon-v2-push");
    let src = source_dir(work.path());
    for (variant, knobs) in [
        ("v1", V2Options::default()),
        (
            "v2-zstd3",
            V2Options {
                zstd_level: 3,
                chunk_size: 0,
            },
        ),
        (
            "v2-zstd3-chunk1",
            V2Options {
                zstd_level: 3,
                chunk_size: 1 << 20,
            },
        ),
    ] {
        let c = client(&reg, knobs);
        let repo = unique_name("rs-snap");
        let report = c
            .push_snapshot_dir(&repo, &src, &PushOptions::new(variant, ""))
            .await
            .unwrap_or_else(|e| panic!("{variant}: push: {e}"));
        let fetched = c
            .get_manifest(&repo, &cocoon_registry::Reference::Tag(variant.into()))
            .await
            .expect("manifest");
        let ours = Manifest::parse(&fetched.bytes).expect("ours");
        let layout = fx.join(variant);
        let (_, go_bytes) = layout_manifest(&layout);
        let go = Manifest::parse(&go_bytes).expect("go");
        assert_eq!(
            manifest_shape(&ours),
            manifest_shape(&go),
            "{variant}: manifest"
        );

        let go_cfg = std::fs::read(blob_path(&layout, &go.config.as_ref().expect("cfg").digest))
            .expect("go config");
        let d = ours.config.as_ref().expect("cfg");
        assert_eq!(d.digest, report.config_digest.to_string());
        let our_cfg = c
            .get_blob_bytes(&repo, &report.config_digest, d.size as u64, 1 << 20)
            .await
            .expect("config")
            .to_vec();
        assert_eq!(
            config_shape(&our_cfg),
            config_shape(&go_cfg),
            "{variant}: config"
        );
        let cfg: SnapshotConfig = serde_json::from_slice(&our_cfg).expect("config");
        if let Some(f) = cfg.files.get("memory-ranges")
            && !f.chunks.is_empty()
        {
            let layer_digests: Vec<&str> = ours
                .layers
                .iter()
                .filter(|l| l.title() == Some("memory-ranges"))
                .map(|l| l.digest.as_str())
                .collect();
            assert_eq!(
                f.chunks.iter().map(String::as_str).collect::<Vec<_>>(),
                layer_digests,
                "{variant}: chunks list the layers in order"
            );
            // Each chunk is one frame over exactly 1 MiB (the frame header says so).
            for l in ours
                .layers
                .iter()
                .filter(|l| l.title() == Some("memory-ranges"))
            {
                let d = Digest::parse(&l.digest).expect("digest");
                let blob = c
                    .get_blob_bytes(&repo, &d, l.size as u64, 64 << 20)
                    .await
                    .expect("chunk");
                assert_eq!(&blob[..4], &[0x28, 0xb5, 0x2f, 0xfd], "zstd magic");
                let content = zstd_frame_content_size(&blob);
                assert_eq!(
                    content,
                    Some(1 << 20),
                    "{variant}: chunk frame content size"
                );
            }
        }

        let dst = work.path().join(format!("pulled-{variant}"));
        c.pull_snapshot_to_dir(&repo, variant, &dst, "gosnap-fixture")
            .await
            .unwrap_or_else(|e| panic!("{variant}: pull: {e}"));
        for (name, _) in SOURCE_FILES {
            assert!(
                std::fs::read(dst.join(name)).ok() == std::fs::read(src.join(name)).ok(),
                "{variant}: {name} read back"
            );
        }
    }
}

/// The Frame_Content_Size of a zstd frame header, when present.
fn zstd_frame_content_size(frame: &[u8]) -> Option<u64> {
    let fhd = *frame.get(4)?;
    let fcs_flag = fhd >> 6;
    let single = (fhd >> 5) & 1 == 1;
    let did_flag = fhd & 3;
    let mut pos = 5 + usize::from(!single);
    pos += [0, 1, 2, 4][usize::from(did_flag)];
    let n = match (fcs_flag, single) {
        (0, true) => 1,
        (0, false) => return None,
        (1, _) => 2,
        (2, _) => 4,
        _ => 8,
    };
    let mut v = 0u64;
    for i in (0..n).rev() {
        v = (v << 8) | u64::from(*frame.get(pos + i)?);
    }
    Some(if n == 2 { v + 256 } else { v })
}

/// A chunked pull whose budget holds fewer chunks than the read-ahead completes: permits are
/// taken in chunk order, so a chunk behind the front never holds what the front needs (the
/// pull used to deadlock when it did). Two chunked files pull in parallel on one budget, to
/// a directory and as an import tar; a deadlock fails at the deadline instead of hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_pulls_complete_with_a_budget_smaller_than_the_read_ahead() {
    const MIB: u64 = 1 << 20;
    let reg = Registry::start_temp(None).await.expect("registry");
    let work = TempDir::new("cocoon-v2-budget");
    let src = work.path().join("src");
    std::fs::create_dir_all(&src).expect("mkdir");
    let files = [
        common::FileSpec::dense("config.json", 4096),
        common::FileSpec::dense("memory-ranges", 12 * MIB),
        common::FileSpec::dense("overlay.qcow2", 6 * MIB),
    ];
    common::write_snapshot_dir(&src, "budget-vm", "sid-budget", &files, 7);
    for (zstd_level, budget) in [(0, 2 * MIB), (0, MIB), (1, 2 * MIB)] {
        let repo = unique_name("rs-budget");
        let knobs = V2Options {
            zstd_level,
            chunk_size: MIB,
        };
        client(&reg, knobs)
            .push_snapshot_dir(&repo, &src, &PushOptions::new("latest", ""))
            .await
            .expect("push");
        let mut cfg = RegistryConfig::for_registry(reg.addr()).expect("config");
        cfg.pull_budget = budget;
        cfg.transfer_concurrency = 4;
        let c = RegistryClient::new(cfg).expect("client");
        let case = format!("zstd {zstd_level}, budget {} MiB", budget / MIB);
        let deadline = std::time::Duration::from_secs(60);
        let dst = work.path().join(format!("pulled-{zstd_level}-{budget}"));
        let report = tokio::time::timeout(
            deadline,
            c.pull_snapshot_to_dir(&repo, "latest", &dst, "budget-vm"),
        )
        .await
        .unwrap_or_else(|_| panic!("{case}: directory pull did not finish (deadlock)"))
        .unwrap_or_else(|e| panic!("{case}: directory pull: {e}"));
        assert!(
            report.format.contains("chunks"),
            "{case}: {}",
            report.format
        );
        for f in &files {
            assert!(
                common::same_content(&src.join(f.name), &dst.join(f.name)).expect("compare"),
                "{case}: {} read back",
                f.name
            );
        }
        let mut tar = Vec::new();
        tokio::time::timeout(
            deadline,
            c.pull_snapshot_to_tar(&repo, "latest", "budget-vm", &mut tar),
        )
        .await
        .unwrap_or_else(|_| panic!("{case}: tar pull did not finish (deadlock)"))
        .unwrap_or_else(|e| panic!("{case}: tar pull: {e}"));
        let entries = read_tar(tar).await.expect("import tar");
        let memory = entries
            .iter()
            .find(|(name, _, _)| name == "memory-ranges")
            .expect("memory-ranges entry");
        assert!(
            std::fs::read(src.join("memory-ranges")).ok().as_ref() == Some(&memory.2),
            "{case}: memory-ranges in the tar"
        );
    }
}
