//! Snapshot pulls into the simulated runtime's import through a real registry: a tampered
//! blob leaves nothing registered (issue 26 item 7), and the v2 wire format of cocoon-common
//! v0.3.0 imports and wakes (issue 27 item 1).

mod common;

use std::path::Path;

use cocoon_node::pods::import_snapshot_from_registry;
use cocoon_registry::PushOptions;
use cocoon_registry::tar::{end_of_archive, padding, regular_file_header};
use cocoon_runtime::Runtime;
use cocoon_runtime::sim::SimRuntime;
use cocoon_testenv::Registry;
use cocoon_testenv::paths::snapshot_fixtures;
use common::{registry, sim_config};

/// An export tar (`snapshot.json` first) of `files`.
fn export_tar(id: &str, files: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let env = serde_json::to_vec_pretty(&serde_json::json!({
        "version": 1,
        "config": {"id": id, "name": id, "image": "ubuntu-test:1", "cpu": 1, "memory": 1 << 29}
    }))
    .expect("envelope");
    let mut out = Vec::new();
    let mut entry = |name: &str, data: &[u8], mode: u32| {
        out.extend(regular_file_header(name, data.len() as u64, mode, 0, &[]));
        out.extend_from_slice(data);
        out.resize(out.len() + padding(data.len() as u64), 0);
    };
    entry("snapshot.json", &env, 0o644);
    for (name, data) in files {
        entry(name, data, 0o600);
    }
    out.extend(end_of_archive());
    out
}

fn entries(dir: &Path) -> usize {
    std::fs::read_dir(dir).map(|r| r.count()).unwrap_or(0)
}

/// Issue 26 item 7: a blob whose size is a multiple of 512 and whose bytes were changed in
/// the registry's storage (same length, so the registry serves it) fails the pull, the
/// importer is stopped, and the runtime has neither the snapshot nor its data afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_block_aligned_blob_leaves_nothing_registered() {
    let reg = Registry::start_temp(None).await.expect("registry");
    let client = registry(reg.addr());
    let tmp = tempfile::tempdir().expect("tmp");
    let rt = SimRuntime::open(sim_config(tmp.path())).expect("sim");
    let data_dir = tmp.path().join("snapshot/localfile");

    let memory: Vec<u8> = (0..16 * 1024u32).map(|i| (i * 7 % 251) as u8).collect();
    let tar = export_tar(
        "sid-aligned",
        &[
            ("config.json", b"{\"cpus\":1}".to_vec()),
            ("memory-ranges", memory),
        ],
    );
    let repo = cocoon_testenv::unique_name("aligned");
    let pushed = client
        .push_snapshot_tar(
            &repo,
            std::io::Cursor::new(tar),
            &PushOptions::new("v1", ""),
        )
        .await
        .expect("push");

    // Untampered, the import registers the snapshot.
    import_snapshot_from_registry(&rt, &client, &repo, "v1", "good")
        .await
        .expect("good pull");
    assert_eq!(
        rt.snapshot_inspect("good").await.expect("good").id,
        "sid-aligned"
    );
    let before = entries(&data_dir);

    let layer = pushed
        .layers
        .iter()
        .find(|l| l.name == "memory-ranges")
        .expect("memory layer");
    assert_eq!(
        layer.size % 512,
        0,
        "the case under test: a block-aligned blob"
    );
    let path = reg.blob_file(layer.digest.as_str());
    let mut bytes = std::fs::read(&path).expect("blob");
    let last = bytes.len() - 1;
    bytes[last] ^= 0xa5;
    std::fs::write(&path, &bytes).expect("tamper");

    let err = import_snapshot_from_registry(&rt, &client, &repo, "v1", "tampered")
        .await
        .expect_err("a tampered blob must fail the pull");
    assert!(err.contains("digest mismatch"), "{err}");
    let inspected = rt.snapshot_inspect("tampered").await;
    assert!(
        inspected.as_ref().is_err_and(|e| e.is_snapshot_not_found()),
        "nothing registered: {inspected:?}"
    );
    let listed = rt.snapshot_list().await.expect("list");
    assert!(
        listed.iter().all(|s| s.name != "tampered"),
        "nothing listed: {listed:?}"
    );
    // The importer's data directory is gone as well (only the good snapshot's remains).
    cocoon_testenv::wait_until(
        "the failed import's data removed",
        std::time::Duration::from_secs(10),
        || async { (entries(&data_dir) == before).then_some(()) },
    )
    .await
    .expect("no data left behind");
}

/// Puts an OCI layout's blobs and its exact manifest bytes into `<repo>:<tag>`.
async fn load_layout(c: &cocoon_registry::RegistryClient, layout: &Path, repo: &str, tag: &str) {
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).expect("index"))
            .expect("index json");
    let digest = index["manifests"][0]["digest"].as_str().expect("digest");
    let blob = |d: &str| {
        std::fs::read(
            layout
                .join("blobs/sha256")
                .join(d.trim_start_matches("sha256:")),
        )
        .expect("blob")
    };
    let bytes = blob(digest);
    let m = cocoon_registry::Manifest::parse(&bytes).expect("manifest");
    for d in m
        .layers
        .iter()
        .map(|l| l.digest.as_str())
        .chain(m.config.iter().map(|c| c.digest.as_str()))
    {
        c.put_blob_bytes(repo, blob(d).into()).await.expect("blob");
    }
    let put = c
        .put_manifest(
            repo,
            tag,
            bytes.into(),
            cocoon_api::contract::oci::MEDIA_OCI_MANIFEST,
        )
        .await
        .expect("manifest");
    assert_eq!(put.to_string(), digest);
}

/// Issue 27 item 1: a pod hibernated by this agent whose `:hibernate` is then replaced by the
/// v2 artifact the Go cocoon-common v0.3.0 wrote (zstd 3, 1 MiB chunks) wakes from it: the
/// runtime imports exactly the source files and the VM is cloned from that import.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pod_wakes_from_a_go_written_v2_hibernate() {
    use cocoon_api::contract::annotations as ann;
    use cocoon_api::naming::{hibernate_import_snapshot_name, vm_name_for_pod};
    use cocoon_node::pods::OrphanPolicy;
    use cocoon_runtime::sim::{ImageKind, Verb};
    use common::{
        BoxError, WAIT, hibernate_pod, patch_ann, start_agent_prepared, vm_pod, wait_running,
    };
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, PostParams};

    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "node-v2wake").await?;
        let tmp = tempfile::tempdir()?;
        let node = cocoon_testenv::unique_name("node");
        let _node_obj = cocoon_testenv::TestNode::in_pool(&client, &node, "default").await?;
        // The fixture's envelope is a real export of a VM from the cloud image `tinyimg`.
        let agent = start_agent_prepared(
            env,
            &node,
            &tmp.path().join(&node),
            OrphanPolicy::Destroy,
            |sim| {
                sim.add_pullable_image("tinyimg", ImageKind::CloudImg);
                Ok(())
            },
        )
        .await?;
        let reg = registry(env.registry_addr());
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        api.create(&PostParams::default(), &vm_pod(&ns, "w", &node, &[]))
            .await?;
        wait_running(&client, &ns, "w").await?;
        let vm = vm_name_for_pod(&ns, "w");
        hibernate_pod(&client, &ns, "w", 2).await?;

        // The Go writer's v2 artifact takes the place of this agent's `:hibernate`.
        load_layout(
            &reg,
            &snapshot_fixtures().join("v2-zstd3-chunk1"),
            &vm,
            "hibernate",
        )
        .await;
        let imports = agent.sim.call_count(Verb::SnapshotImport);
        agent.sim.block(Verb::Clone, Some(&vm));
        patch_ann(
            &client,
            &ns,
            "w",
            serde_json::json!({ann::HIBERNATE: null, ann::GENERATION: "3"}),
        )
        .await?;
        assert!(
            agent.sim.wait_blocked(Verb::Clone, 1, WAIT).await,
            "the wake clones"
        );
        assert_eq!(agent.sim.call_count(Verb::SnapshotImport), imports + 1);
        let import = hibernate_import_snapshot_name(&vm);
        let dir = agent
            .sim
            .snapshot_dir(&import)
            .ok_or("the v2 hibernate snapshot is imported")?;
        for name in ["config.json", "memory-ranges", "state.json"] {
            assert!(
                std::fs::read(dir.join(name))?
                    == std::fs::read(snapshot_fixtures().join("source").join(name))?,
                "{name} imported byte-identical to the source"
            );
        }
        let clone = agent
            .sim
            .calls_of(Verb::Clone)
            .last()
            .cloned()
            .ok_or("clone call")?;
        assert!(
            clone.targets.iter().any(|t| t == &import),
            "cloned from the import: {clone:?}"
        );
        agent.sim.unblock(Verb::Clone);
        wait_running(&client, &ns, "w").await?;

        // Issue 27 item 5: the pod's Events say how much each transfer moved.
        let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), &ns);
        let messages = cocoon_testenv::wait_until("transfer events", WAIT, || {
            let events = events.clone();
            async move {
                let list = events.list(&Default::default()).await.ok()?;
                let of = |reason: &str| {
                    list.items
                        .iter()
                        .find(|e| {
                            e.reason.as_deref() == Some(reason)
                                && e.involved_object.name.as_deref() == Some("w")
                        })
                        .and_then(|e| e.message.clone())
                };
                Some((of("SnapshotPushed")?, of("SnapshotPulled")?))
            }
        })
        .await?;
        assert!(
            messages.0.starts_with("pushed ") && messages.0.contains(" (v1) in "),
            "{}",
            messages.0
        );
        // 1,596,254 bytes of chunks for 6 MiB + 900 bytes of data.
        assert!(
            messages
                .1
                .starts_with("pulled 1.5 MiB of 6.0 MiB (v2 zstd+chunks) in "),
            "{}",
            messages.1
        );

        agent.kill().await;
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

/// Issue 27 item 1: a chunk of the Go-written v2 artifact changed in the registry's storage
/// fails the pull, and the runtime is left with nothing under the name (the good artifact
/// imports first, so the path itself works).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_v2_chunk_leaves_nothing_registered() {
    let reg = Registry::start_temp(None).await.expect("registry");
    let client = registry(reg.addr());
    let tmp = tempfile::tempdir().expect("tmp");
    let rt = SimRuntime::open(sim_config(tmp.path())).expect("sim");
    let data_dir = tmp.path().join("snapshot/localfile");
    let repo = cocoon_testenv::unique_name("gosnap");
    load_layout(
        &client,
        &snapshot_fixtures().join("v2-zstd3-chunk1"),
        &repo,
        "t",
    )
    .await;

    import_snapshot_from_registry(&rt, &client, &repo, "t", "good")
        .await
        .expect("good pull");
    assert_eq!(
        rt.snapshot_inspect("good").await.expect("good").id,
        "gosnap-fixture"
    );
    let before = entries(&data_dir);

    // Chunk 4 of memory-ranges, one bit flipped in place.
    let chunk = "sha256:1a9133b97dcd4575407689e9563351d94f272bc62b2f74568fe5313d0e0cc58a";
    let path = reg.blob_file(chunk);
    let mut bytes = std::fs::read(&path).expect("chunk");
    bytes[4096] ^= 0x10;
    std::fs::write(&path, &bytes).expect("tamper");

    let err = import_snapshot_from_registry(&rt, &client, &repo, "t", "tampered")
        .await
        .expect_err("a tampered chunk must fail the pull");
    assert!(err.contains("digest mismatch"), "{err}");
    assert!(
        rt.snapshot_inspect("tampered")
            .await
            .is_err_and(|e| e.is_snapshot_not_found()),
        "nothing registered"
    );
    assert_eq!(entries(&data_dir), before, "no data left behind");
}

/// Issue 27 item 2 through the node agent: an agent configured with the spec's knobs
/// (`SNAPSHOT_ZSTD_LEVEL=3`, `SNAPSHOT_CHUNK_SIZE_MIB=1`) hibernates a pod into a v2
/// `:hibernate` (zstd chunks, from the runtime's export stream), and an agent on another node
/// with every knob at 0 (a v1 writer, which reads both) restores the pod from it with the
/// guest's state.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_with_the_v2_knobs_hibernates_into_v2_and_another_node_restores_it() {
    use cocoon_api::contract::annotations as ann;
    use cocoon_api::contract::oci;
    use cocoon_api::naming::vm_name_for_pod;
    use cocoon_registry::{Manifest, Reference};
    use common::{
        AgentOptions, BoxError, WAIT, hibernate_pod, start_agent_with, vm_pod, wait_running,
    };
    use k8s_openapi::api::core::v1::{Event, Pod};
    use kube::api::{Api, DeleteParams, PostParams};

    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "node-v2push").await?;
        let tmp = tempfile::tempdir()?;
        let (node_a, node_b) = (
            cocoon_testenv::unique_name("node-v2a"),
            cocoon_testenv::unique_name("node-v2b"),
        );
        let _objs = (
            cocoon_testenv::TestNode::in_pool(&client, &node_a, "default").await?,
            cocoon_testenv::TestNode::in_pool(&client, &node_b, "default").await?,
        );
        let root_a = tmp.path().join(&node_a);
        let mut opts = AgentOptions::new(&root_a);
        // A memory image large enough to be compressed and cut into chunks (files under 1 MiB
        // stay raw, as the Go writer keeps them).
        opts.sim.memory_file_size = 6 << 20;
        opts.sim.memory_fill = cocoon_runtime::sim::MemoryFill::Realistic;
        opts.snapshot_knobs = [3, 1, 0, 0];
        let agent_a = start_agent_with(
            env.client()?,
            env.registry_addr(),
            &node_a,
            &root_a,
            opts,
            |_| Ok(()),
        )
        .await?;
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        api.create(&PostParams::default(), &vm_pod(&ns, "w", &node_a, &[]))
            .await?;
        wait_running(&client, &ns, "w").await?;
        let vm = vm_name_for_pod(&ns, "w");
        let token = agent_a.sim.guest_token(&vm)?;
        hibernate_pod(&client, &ns, "w", 2).await?;

        // The artifact is v2: zstd layers, the memory image in 1 MiB chunks.
        let reg = registry(env.registry_addr());
        let fetched = reg
            .get_manifest(&vm, &Reference::parse("hibernate")?)
            .await?;
        let m = Manifest::parse(&fetched.bytes)?;
        assert_eq!(
            m.artifact_type.as_deref(),
            Some(oci::ARTIFACT_SNAPSHOT_V2),
            "artifactType"
        );
        let memory: Vec<_> = m
            .layers
            .iter()
            .filter(|l| l.title() == Some("memory-ranges"))
            .collect();
        // The data of 6 MiB (its zero runs travel as holes) in 1 MiB chunks, in order.
        assert!(memory.len() >= 2, "chunked: {:?}", m.layers);
        let count = memory.len().to_string();
        for (i, l) in memory.iter().enumerate() {
            assert!(l.media_type.ends_with(oci::ZSTD_SUFFIX), "{}", l.media_type);
            assert_eq!(
                l.annotations.get(oci::ANNOTATION_CHUNK_INDEX),
                Some(&i.to_string())
            );
            assert_eq!(l.annotations.get(oci::ANNOTATION_CHUNK_COUNT), Some(&count));
            assert!(l.size < 1 << 20, "compressed: {} bytes", l.size);
        }

        // Another node, knobs at 0, restores the pod from that artifact.
        // Node a deletes the hibernated pod (no VM, nothing pushed), then goes away.
        api.delete("w", &DeleteParams::default()).await?;
        cocoon_testenv::wait_until("w gone", WAIT, || async {
            matches!(api.get_opt("w").await, Ok(None)).then_some(())
        })
        .await?;
        agent_a.kill().await;
        let root_b = tmp.path().join(&node_b);
        let agent_b = start_agent_with(
            env.client()?,
            env.registry_addr(),
            &node_b,
            &root_b,
            AgentOptions::new(&root_b),
            |_| Ok(()),
        )
        .await?;
        api.create(
            &PostParams::default(),
            &vm_pod(&ns, "w", &node_b, &[(ann::RESTORE_FROM_HIBERNATE, "true")]),
        )
        .await?;
        wait_running(&client, &ns, "w").await?;
        assert_eq!(agent_b.sim.guest_token(&vm)?, token, "the guest's state");

        let events: Api<Event> = Api::namespaced(client.clone(), &ns);
        let pushed = cocoon_testenv::wait_until("the push Event", WAIT, || {
            let events = events.clone();
            async move {
                let list = events.list(&Default::default()).await.ok()?;
                list.items
                    .into_iter()
                    .filter(|e| e.reason.as_deref() == Some("SnapshotPushed"))
                    .find_map(|e| e.message)
            }
        })
        .await?;
        assert!(pushed.contains(" (v2 zstd+chunks) in "), "{pushed}");

        agent_b.kill().await;
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}
