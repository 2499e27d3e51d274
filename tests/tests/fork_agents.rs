//! Sets started from a CocoonCheckpoint (`spec.agent.fromCheckpoint`, issue 38) end to end
//! with REAL node agents (`cocoon_testsupport::Agent`: the production node agent on the
//! simulated runtime), the real scheduler, registry and control plane, and the operator's
//! controllers in-process.
//!
//! The checkpoint is taken by the source's node agent (docs/checkpoints.md). The test only
//! holds the simulated runtime at two points to look at the states in between: the source's
//! `snapshot save` (so the checkpoint stays short of `Ready` while the sets wait), and every
//! node's `snapshot import` (so nothing can have pulled the checkpoint while namespace B's
//! attempts are refused).

use std::time::Duration;

use cocoon_api::contract::checkpoint::{CHECKPOINT_TAG, FROM_CHECKPOINT_ANNOTATION};
use cocoon_api::crd::checkpoint::{
    CheckpointPhase, CheckpointSource, CocoonCheckpoint, CocoonCheckpointSpec, NameRef,
};
use cocoon_api::crd::set::{AgentMode, CocoonSet, CocoonSetPhase, CocoonSetSpec};
use cocoon_api::naming::vm_name_for_agent;
use cocoon_operator::cocoonset::pods::build_agent_pod;
use cocoon_registry::RegistryClient;
use cocoon_runtime::exec_capture;
use cocoon_runtime::sim::Verb;
use cocoon_testenv::{Shared, TestNode};
use cocoon_testsupport::{
    Agent, BoxError, Operator, OperatorOptions, PoolMember, all_vms, guest_of, host_of, registry,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

type TestResult = Result<(), BoxError>;

const WAIT: Duration = Duration::from_secs(120);
const IMAGE: &str = "ubuntu:24.04";
const SOURCE: &str = "src";
const CKPT: &str = "golden";
/// The guest file the source main holds when the checkpoint is taken.
const MARKER: &str = "/root/checkpoint-marker";

struct Cluster {
    client: Client,
    pool: String,
    registry_addr: String,
    reg: RegistryClient,
    nodes: Vec<TestNode>,
    agents: Vec<Agent>,
    roots: Vec<tempfile::TempDir>,
}

impl Cluster {
    async fn new(env: &Shared, n: usize) -> Result<Cluster, BoxError> {
        let client = env.client()?;
        let mut c = Cluster {
            reg: registry(env.registry_addr()),
            registry_addr: env.registry_addr().to_owned(),
            pool: cocoon_testenv::unique_name("pool"),
            client,
            nodes: Vec::new(),
            agents: Vec::new(),
            roots: Vec::new(),
        };
        for _ in 0..n {
            let m = PoolMember::start(env, &c.pool, "fork-node", &c.registry_addr, WAIT).await?;
            c.nodes.push(m.node);
            c.agents.push(m.agent);
            c.roots.push(m.root);
        }
        Ok(c)
    }

    /// The agent whose runtime holds `vm`.
    async fn host(&self, vm: &str) -> Result<&Agent, BoxError> {
        Ok(host_of(&self.agents, vm).await?.0)
    }

    /// `vm`'s guest: its state token and the marker file.
    async fn guest(&self, vm: &str) -> Result<(String, Option<String>), BoxError> {
        guest_of(self.host(vm).await?, vm, MARKER)
    }
}

fn spec(pool: &str, from: Option<&str>) -> CocoonSetSpec {
    let mut s = CocoonSetSpec::with_image(IMAGE);
    s.node_pool = pool.to_owned();
    s.agent.mode = AgentMode::Run;
    s.agent.from_checkpoint = from.map(str::to_owned);
    s
}

fn running(cs: &CocoonSet, agents: i32) -> bool {
    cs.status.as_ref().is_some_and(|s| {
        s.phase == Some(CocoonSetPhase::Running)
            && Some(s.observed_generation) == cs.metadata.generation
            && (s.ready_agents, s.desired_agents) == (agents, agents)
    })
}

async fn wait_set(
    sets: &Api<CocoonSet>,
    name: &str,
    what: &str,
    check: impl Fn(&CocoonSet) -> bool,
) -> Result<CocoonSet, cocoon_testenv::Error> {
    cocoon_testsupport::scripted::wait_set_watched_within(sets, name, what, WAIT, check).await
}

/// The set's `Ready` condition (status, reason, message).
fn ready_condition(cs: &CocoonSet) -> Option<(String, String, String)> {
    let c = cs
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// The Events of `ns` with `reason` about object `name`.
async fn events(client: &Client, ns: &str, reason: &str, name: &str) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(client.clone(), ns);
    let Ok(list) = api.list(&ListParams::default()).await else {
        return Vec::new();
    };
    list.items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sets_start_from_a_ready_checkpoint_of_their_namespace_and_outlive_it() {
    cocoon_testenv::run_test(|env| async move {
        let c = Cluster::new(env, 2).await?;
        let ns = cocoon_testenv::create_namespace(&c.client, "fork").await?;
        let other = cocoon_testenv::create_namespace(&c.client, "fork-b").await?;
        let _op = Operator::start(&c.client, &ns, &c.registry_addr, OperatorOptions::fast());
        let _op_b = Operator::start(&c.client, &other, &c.registry_addr, OperatorOptions::fast());
        let sets: Api<CocoonSet> = Api::namespaced(c.client.clone(), &ns);
        let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ns);
        let ckpts: Api<CocoonCheckpoint> = Api::namespaced(c.client.clone(), &ns);
        let pp = PostParams::default();

        // (a) A set naming a checkpoint that does not exist waits, saying so, and creates no
        // main.
        sets.create(&pp, &CocoonSet::new("a", spec(&c.pool, Some(CKPT))))
            .await?;
        let waiting = wait_set(&sets, "a", "waiting for its checkpoint", |cs| {
            ready_condition(cs).is_some_and(|(s, r, _)| s == "False" && r == "CheckpointNotFound")
        })
        .await?;
        let (_, _, message) = ready_condition(&waiting).ok_or("no Ready condition")?;
        assert!(message.contains("spec.agent.fromCheckpoint"), "{message}");
        assert_eq!(
            waiting.status.as_ref().and_then(|s| s.phase),
            Some(CocoonSetPhase::Pending)
        );
        assert!(
            pods.get_opt("a-0").await?.is_none(),
            "no main while waiting"
        );
        cocoon_testenv::wait_until("the CheckpointNotFound Warning", WAIT, || async {
            let e = events(&c.client, &ns, "CheckpointNotFound", "a").await;
            (!e.is_empty()).then_some(())
        })
        .await?;

        // The source: a running set whose main holds a marker.
        sets.create(&pp, &CocoonSet::new(SOURCE, spec(&c.pool, None)))
            .await?;
        wait_set(&sets, SOURCE, "source Running", |cs| running(cs, 1)).await?;
        let src_vm = vm_name_for_agent(&ns, SOURCE, 0);
        let mark = cocoon_testenv::unique_name("ckpt");
        let script = format!("echo {mark} > {MARKER}");
        let out = exec_capture(
            c.host(&src_vm).await?.runtime.as_ref(),
            &src_vm,
            &["sh", "-c", &script],
            None,
        )
        .await;
        out.result.map_err(|e| format!("exec in {src_vm}: {e}"))?;
        let (src_token, _) = c.guest(&src_vm).await?;

        // The checkpoint: accepted by the operator (Pending, its derived repository) and handed
        // to the source's node agent, whose save is held here.
        let src_sim = c.host(&src_vm).await?.sim.clone();
        src_sim.block(Verb::SnapshotSave, None);
        let cr = CocoonCheckpoint::new(
            CKPT,
            CocoonCheckpointSpec {
                source: CheckpointSource {
                    cocoon_set_ref: Some(NameRef {
                        name: SOURCE.into(),
                    }),
                    pod_ref: None,
                },
            },
        );
        ckpts.create(&pp, &cr).await?;
        let repository =
            cocoon_testenv::wait_until("checkpoint Pending with its repository", WAIT, || async {
                let s = ckpts.get(CKPT).await.ok()?.status?;
                let early = matches!(
                    s.phase,
                    Some(CheckpointPhase::Pending | CheckpointPhase::Saving)
                );
                (early && !s.repository.is_empty()).then_some(s.repository)
            })
            .await?;
        // Not Ready yet: the set says so now.
        wait_set(&sets, "a", "waiting for a Ready checkpoint", |cs| {
            ready_condition(cs).is_some_and(|(_, r, _)| r == "CheckpointNotReady")
        })
        .await?;
        // Every node's import held: the checkpoint becomes Ready (the source's node agent takes
        // and pushes it), and nothing can pull it while B's attempts below are looked at.
        for a in &c.agents {
            a.sim.block(Verb::SnapshotImport, None);
        }
        assert!(
            src_sim.wait_blocked(Verb::SnapshotSave, 1, WAIT).await,
            "the source's save started"
        );
        src_sim.unblock(Verb::SnapshotSave);
        let digest = cocoon_testenv::wait_until("checkpoint Ready", WAIT, || async {
            let s = ckpts.get(CKPT).await.ok()?.status?;
            (s.phase == Some(CheckpointPhase::Ready) && s.repository == repository)
                .then_some(s.digest)
        })
        .await?;
        assert!(digest.starts_with("sha256:"), "{digest}");
        assert!(
            c.reg.has_manifest(&repository, &digest).await?,
            "the node pushed the artifact"
        );
        // The source node's own copy of the save is dropped after the push.
        let src_rt = c.host(&src_vm).await?.runtime.clone();
        cocoon_testenv::wait_until("the source's local save dropped", WAIT, || async {
            let snaps = src_rt.snapshot_list().await.ok()?;
            (!snaps.iter().any(|s| s.name == repository)).then_some(())
        })
        .await?;

        // (e) Namespace B names namespace A's checkpoint repository as its image (by tag and by
        // digest): refused before any pull, naming the field.
        let b_sets: Api<CocoonSet> = Api::namespaced(c.client.clone(), &other);
        for (name, image) in [
            ("steal-tag", format!("{repository}:{CHECKPOINT_TAG}")),
            ("steal-digest", format!("{repository}:{digest}")),
        ] {
            let mut s = spec(&c.pool, None);
            s.agent.image = image;
            s.agent.mode = AgentMode::Clone;
            b_sets.create(&pp, &CocoonSet::new(name, s)).await?;
            let pod = format!("{name}-0");
            let refused = cocoon_testenv::wait_until(&format!("{pod} refused"), WAIT, || async {
                let e = events(&c.client, &other, "TenantIsolationRefused", &pod).await;
                e.into_iter().next()
            })
            .await?;
            let note = refused.note.unwrap_or_default();
            assert!(
                note.contains("annotation cocoonset.cocoonstack.io/image"),
                "{note}"
            );
        }
        // B naming the checkpoint by name finds none in its own namespace.
        b_sets
            .create(&pp, &CocoonSet::new("named", spec(&c.pool, Some(CKPT))))
            .await?;
        wait_set(&b_sets, "named", "B waits: no such checkpoint in B", |cs| {
            ready_condition(cs).is_some_and(|(_, r, _)| r == "CheckpointNotFound")
        })
        .await?;
        // Nothing was pulled from A's repository on any node.
        for a in &c.agents {
            let snaps = a.runtime.snapshot_list().await?;
            assert!(
                !snaps.iter().any(|s| s.name.contains(&repository)),
                "no checkpoint base on {} while imports are held: {snaps:?}",
                a.node
            );
        }

        for a in &c.agents {
            a.sim.unblock(Verb::SnapshotImport);
        }

        // (a, c) The waiting set starts at once (the checkpoint watch), and two more start.
        for name in ["b", "c"] {
            sets.create(&pp, &CocoonSet::new(name, spec(&c.pool, Some(CKPT))))
                .await?;
        }
        for name in ["a", "b", "c"] {
            wait_set(&sets, name, "Running from the checkpoint", |cs| {
                running(cs, 1)
            })
            .await?;
            let main = pods.get(&format!("{name}-0")).await?;
            assert_eq!(
                main.annotations()
                    .get(FROM_CHECKPOINT_ANNOTATION)
                    .map(String::as_str),
                Some(CKPT)
            );
            // (b) The guest is the checkpoint's: its state token and its file.
            let (token, marker) = c.guest(&vm_name_for_agent(&ns, name, 0)).await?;
            assert_eq!(token, src_token, "{name}: the source's guest state");
            assert_eq!(
                marker.as_deref(),
                Some(mark.as_str()),
                "{name}: the source's file"
            );
        }
        // A pod of B carrying the annotation itself (written past the operator) names a
        // checkpoint of B, never A's: the node agent reads B's and finds none.
        let mut raw = CocoonSet::new("raw", spec(&c.pool, None));
        raw.metadata.namespace = Some(other.clone());
        let mut pod = build_agent_pod(&raw, &other, 0, "", Some(&c.agents[0].node));
        pod.annotations_mut()
            .insert(FROM_CHECKPOINT_ANNOTATION.into(), CKPT.into());
        let b_pods: Api<Pod> = Api::namespaced(c.client.clone(), &other);
        b_pods.create(&pp, &pod).await?;
        let failed = cocoon_testenv::wait_until("raw-0 refused", WAIT, || async {
            let e = events(&c.client, &other, "CreateBringUpFailed", "raw-0").await;
            e.into_iter().next()
        })
        .await?;
        let note = failed.note.unwrap_or_default();
        assert!(
            note.contains(&format!(
                "annotation {FROM_CHECKPOINT_ANNOTATION}: checkpoint {other}/{CKPT} does not exist"
            )),
            "{note}"
        );
        assert!(
            c.host(&vm_name_for_agent(&other, "raw", 0)).await.is_err(),
            "no VM for raw-0"
        );
        b_pods.delete("raw-0", &DeleteParams::default()).await?;
        // B's set still waits (A's checkpoint is not B's).
        let named = b_sets.get("named").await?;
        assert!(named.status.as_ref().and_then(|s| s.phase) == Some(CocoonSetPhase::Pending));
        assert!(
            Api::<Pod>::namespaced(c.client.clone(), &other)
                .get_opt("named-0")
                .await?
                .is_none()
        );

        // (d) Deleting the checkpoint (the operator deletes its artifact) leaves the sets
        // running, and they suspend and wake from their own snapshots.
        ckpts.delete(CKPT, &DeleteParams::default()).await?;
        cocoon_testenv::wait_until("checkpoint gone", WAIT, || async {
            matches!(ckpts.get_opt(CKPT).await, Ok(None)).then_some(())
        })
        .await?;
        assert!(
            !c.reg.has_manifest(&repository, CHECKPOINT_TAG).await?,
            "artifact deleted"
        );
        for name in ["a", "b", "c"] {
            assert!(running(&sets.get(name).await?, 1), "{name} still Running");
        }
        let patch = |on: bool| Patch::Merge(json!({ "spec": { "suspend": on } }));
        sets.patch("a", &PatchParams::default(), &patch(true))
            .await?;
        wait_set(&sets, "a", "Suspended", |cs| {
            cs.status.as_ref().and_then(|s| s.phase) == Some(CocoonSetPhase::Suspended)
        })
        .await?;
        sets.patch("a", &PatchParams::default(), &patch(false))
            .await?;
        wait_set(&sets, "a", "woken Running", |cs| running(cs, 1)).await?;
        let (token, marker) = c.guest(&vm_name_for_agent(&ns, "a", 0)).await?;
        assert_eq!(token, src_token, "woken from its own snapshot");
        assert_eq!(marker.as_deref(), Some(mark.as_str()));

        for (api, names) in [
            (&sets, vec!["a", "b", "c", SOURCE]),
            (&b_sets, vec!["steal-tag", "steal-digest", "named"]),
        ] {
            for name in names {
                api.delete(name, &DeleteParams::default()).await?;
            }
        }
        cocoon_testenv::wait_until("every VM gone", WAIT, || async {
            all_vms(&c.agents).await.is_empty().then_some(())
        })
        .await?;
        let Cluster {
            client,
            nodes,
            agents,
            roots,
            ..
        } = c;
        drop(agents);
        drop(nodes);
        drop(roots);
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        cocoon_testenv::delete_namespace(&client, &other).await?;
        TestResult::Ok(())
    })
    .await;
}
