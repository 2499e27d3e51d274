//! Issue 38's acceptance scenario end to end: the real plugin binary (`kubectl cocoon
//! checkpoint`, `fork`, `suspend`, `resume`), the operator's controllers in-process, four REAL
//! node agents (`cocoon_testsupport::Agent`: the production node agent on the simulated
//! runtime), the real scheduler, registry and control plane. Nothing here writes a
//! checkpoint's status or pushes its artifact: the source's node agent takes it.
//!
//! 1. A set's main writes a file; `checkpoint cocoonset/src --name golden` returns 0 once
//!    `Ready` (digest, bytes, takenAt); the main writes the file again and keeps running (same
//!    VM id, pod Ready).
//! 2. The source node is cordoned (and holds no local copy of the checkpoint: the node agent
//!    removes its save after the push); `fork golden --count 3` returns 0 with three sets
//!    Running, none on the source node, each guest holding the file as it was at the checkpoint
//!    and the source's state token.
//! 3. Deleting the checkpoint deletes its artifact (the manifest 404s by tag and by digest);
//!    the forks keep running; one suspends and wakes with its file intact.
//! 4. The operator killed while a checkpoint is `Saving` (the source runtime's save held), and
//!    again while one is `Pushing` (its export held): after a restart each ends `Ready` with its
//!    artifact under the tag (the node agent finishes it; the operator changes nothing in
//!    flight), the request is cleared, and the source VM keeps running.

use std::process::Output;
use std::time::Duration;

use cocoon_api::contract::checkpoint::{CHECKPOINT_TAG, REQUEST_ANNOTATION};
use cocoon_api::crd::checkpoint::{CheckpointPhase, CocoonCheckpoint};
use cocoon_api::crd::set::{AgentMode, CocoonSet, CocoonSetPhase, CocoonSetSpec};
use cocoon_api::naming::vm_name_for_agent;
use cocoon_e2e::kubectl_cocoon;
use cocoon_registry::{Reference, RegistryClient};
use cocoon_runtime::exec_capture;
use cocoon_runtime::sim::Verb;
use cocoon_testenv::{Shared, TestNode};
use cocoon_testsupport::{
    Agent, BoxError, Operator, OperatorOptions, PoolMember, all_vms, guest_of, host_of, registry,
};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

type TestResult = Result<(), BoxError>;

const WAIT: Duration = Duration::from_secs(120);
const IMAGE: &str = "ubuntu:24.04";
const SOURCE: &str = "src";
const CKPT: &str = "golden";
/// The checkpoints taken across an operator crash (held in `Saving`, in `Pushing`).
const CKPT2: &str = "again-saving";
const CKPT3: &str = "again-pushing";
/// The guest file the scenario follows.
const MARKER: &str = "/root/checkpoint-marker";

struct Cluster {
    client: Client,
    pool: String,
    reg: RegistryClient,
    nodes: Vec<TestNode>,
    agents: Vec<Agent>,
    roots: Vec<tempfile::TempDir>,
}

impl Cluster {
    async fn new(env: &Shared, n: usize) -> Result<Cluster, BoxError> {
        let mut c = Cluster {
            client: env.client()?,
            pool: cocoon_testenv::unique_name("pool"),
            reg: registry(env.registry_addr()),
            nodes: Vec::new(),
            agents: Vec::new(),
            roots: Vec::new(),
        };
        for _ in 0..n {
            let m = PoolMember::start(env, &c.pool, "ckpt-node", env.registry_addr(), WAIT).await?;
            c.nodes.push(m.node);
            c.agents.push(m.agent);
            c.roots.push(m.root);
        }
        Ok(c)
    }

    /// The agent whose runtime holds `vm`, and the VM's id.
    async fn host(&self, vm: &str) -> Result<(&Agent, String), BoxError> {
        host_of(&self.agents, vm).await
    }

    /// `vm`'s guest: its state token and the marker file.
    async fn guest(&self, vm: &str) -> Result<(String, Option<String>), BoxError> {
        guest_of(self.host(vm).await?.0, vm, MARKER)
    }

    /// Writes `value` into `vm`'s marker file through the runtime's exec.
    async fn write_marker(&self, vm: &str, value: &str) -> TestResult {
        let (agent, _) = self.host(vm).await?;
        let script = format!("echo {value} > {MARKER}");
        let out = exec_capture(agent.runtime.as_ref(), vm, &["sh", "-c", &script], None).await;
        out.result.map_err(|e| format!("exec in {vm}: {e}"))?;
        Ok(())
    }
}

async fn plugin(env: &Shared, ns: &str, args: &[&str]) -> Output {
    tokio::process::Command::new(kubectl_cocoon())
        .arg("--kubeconfig")
        .arg(env.kubeconfig_path())
        .args(["-n", ns])
        .args(args)
        .env_remove("KUBECONFIG")
        .env("NO_COLOR", "1")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("run kubectl-cocoon")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn running(cs: &CocoonSet) -> bool {
    cs.status.as_ref().is_some_and(|s| {
        s.phase == Some(CocoonSetPhase::Running)
            && Some(s.observed_generation) == cs.metadata.generation
            && s.ready_agents == s.desired_agents
    })
}

fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn phase(c: &CocoonCheckpoint) -> Option<CheckpointPhase> {
    c.status.as_ref().and_then(|s| s.phase)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn checkpoint_fork_delete_and_an_operator_crash_with_the_plugin_and_real_agents() {
    cocoon_testenv::run_test(|env| async move {
        let c = Cluster::new(env, 4).await?;
        let ns = cocoon_testenv::create_namespace(&c.client, "ckpt-e2e").await?;
        let mut operator = Some(Operator::start(
            &c.client,
            &ns,
            env.registry_addr(),
            OperatorOptions::fast(),
        ));
        let sets: Api<CocoonSet> = Api::namespaced(c.client.clone(), &ns);
        let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ns);
        let ckpts: Api<CocoonCheckpoint> = Api::namespaced(c.client.clone(), &ns);

        // The source set, Running; its main writes the file.
        let mut spec = CocoonSetSpec::with_image(IMAGE);
        spec.node_pool = c.pool.clone();
        spec.agent.mode = AgentMode::Run;
        sets.create(&PostParams::default(), &CocoonSet::new(SOURCE, spec))
            .await?;
        cocoon_testsupport::scripted::wait_set_watched_within(
            &sets,
            SOURCE,
            "source Running",
            WAIT,
            running,
        )
        .await?;
        let src_vm = vm_name_for_agent(&ns, SOURCE, 0);
        let src_pod = format!("{SOURCE}-0");
        let at_checkpoint = cocoon_testenv::unique_name("at-checkpoint");
        c.write_marker(&src_vm, &at_checkpoint).await?;
        let (src_agent, src_id) = c.host(&src_vm).await?;
        let src_node = src_agent.node.clone();
        let (src_token, _) = c.guest(&src_vm).await?;

        // 1. The plugin takes the checkpoint and returns 0 once it is Ready.
        let out = plugin(
            env,
            &ns,
            &[
                "checkpoint",
                &format!("cocoonset/{SOURCE}"),
                "--name",
                CKPT,
                "--timeout",
                "2m",
                "-o",
                "json",
            ],
        )
        .await;
        assert_eq!(
            out.status.code(),
            Some(0),
            "checkpoint: {}",
            text(&out.stderr)
        );
        let shown: Value = serde_json::from_slice(&out.stdout)?;
        assert_eq!(shown["status"]["phase"], "Ready", "{shown}");
        let ckpt = ckpts.get(CKPT).await?;
        let st = ckpt.status.clone().ok_or("no status")?;
        assert_eq!(phase(&ckpt), Some(CheckpointPhase::Ready));
        assert!(st.digest.starts_with("sha256:"), "digest: {st:?}");
        assert!(st.bytes_on_wire > 0 && st.data_bytes > 0, "bytes: {st:?}");
        assert!(!st.taken_at.is_empty(), "takenAt: {st:?}");
        assert_eq!(
            (st.vm_name.as_str(), st.node.as_str()),
            (src_vm.as_str(), src_node.as_str())
        );
        assert_eq!(shown["status"]["digest"], st.digest.as_str());
        let (repository, digest) = (st.repository.clone(), st.digest.clone());
        assert!(
            c.reg.has_manifest(&repository, CHECKPOINT_TAG).await?,
            "artifact pushed"
        );

        // The source keeps running: it writes the file again, same VM, pod Ready.
        let after = cocoon_testenv::unique_name("after-checkpoint");
        c.write_marker(&src_vm, &after).await?;
        let (_, id_now) = c.host(&src_vm).await?;
        assert_eq!(id_now, src_id, "the source VM was not replaced");
        assert!(pod_ready(&pods.get(&src_pod).await?), "{src_pod} Ready");
        assert_eq!(c.guest(&src_vm).await?.1.as_deref(), Some(after.as_str()));

        // 2. The source node: no local copy of the checkpoint (the agent removed its save
        // after the push), and cordoned, so every fork pulls the artifact on another node.
        cocoon_testenv::wait_until("no local copy on the source node", WAIT, || async {
            let snaps = src_agent.runtime.snapshot_list().await.ok()?;
            (!snaps.iter().any(|s| s.name.contains(&repository))).then_some(())
        })
        .await?;
        let node_api: Api<Node> = Api::all(c.client.clone());
        node_api
            .patch(
                &src_node,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "unschedulable": true } })),
            )
            .await?;
        let out = plugin(env, &ns, &["fork", CKPT, "--count", "3", "--timeout", "2m"]).await;
        assert_eq!(out.status.code(), Some(0), "fork: {}", text(&out.stderr));
        let forks = ["golden-1", "golden-2", "golden-3"];
        for name in forks {
            let cs = sets.get(name).await?;
            assert!(running(&cs), "{name} Running: {:?}", cs.status);
            assert_eq!(cs.spec.agent.from_checkpoint.as_deref(), Some(CKPT));
            let main = pods.get(&format!("{name}-0")).await?;
            let node = main.spec.as_ref().and_then(|s| s.node_name.clone());
            assert!(
                node.is_some() && node.as_deref() != Some(src_node.as_str()),
                "{name} on {node:?}"
            );
            let (token, marker) = c.guest(&vm_name_for_agent(&ns, name, 0)).await?;
            assert_eq!(token, src_token, "{name}: the source's guest state");
            assert_eq!(
                marker.as_deref(),
                Some(at_checkpoint.as_str()),
                "{name}: the file as checkpointed"
            );
        }

        // 3. Deleting the checkpoint deletes its artifact; the forks keep running.
        ckpts.delete(CKPT, &DeleteParams::default()).await?;
        cocoon_testenv::wait_until("checkpoint gone", WAIT, || async {
            matches!(ckpts.get_opt(CKPT).await, Ok(None)).then_some(())
        })
        .await?;
        assert!(
            !c.reg.has_manifest(&repository, CHECKPOINT_TAG).await?,
            "tag 404s"
        );
        assert!(
            !c.reg.has_manifest(&repository, &digest).await?,
            "digest 404s"
        );
        for name in forks {
            assert!(running(&sets.get(name).await?), "{name} still Running");
            c.host(&vm_name_for_agent(&ns, name, 0)).await?;
        }
        let out = plugin(env, &ns, &["suspend", forks[0], "--timeout", "2m"]).await;
        assert_eq!(out.status.code(), Some(0), "suspend: {}", text(&out.stderr));
        let out = plugin(env, &ns, &["resume", forks[0], "--timeout", "2m"]).await;
        assert_eq!(out.status.code(), Some(0), "resume: {}", text(&out.stderr));
        let (token, marker) = c.guest(&vm_name_for_agent(&ns, forks[0], 0)).await?;
        assert_eq!(token, src_token, "woken from its own snapshot");
        assert_eq!(
            marker.as_deref(),
            Some(at_checkpoint.as_str()),
            "the file survives the wake"
        );

        // 4. The operator crashes while the node agent takes a checkpoint, once held in the save
        // (`Saving`) and once in the export that feeds the push (`Pushing`): after a restart
        // each ends Ready with its artifact under the tag, and the source keeps running.
        let held = [
            (CKPT2, Verb::SnapshotSave, CheckpointPhase::Saving),
            (CKPT3, Verb::SnapshotExport, CheckpointPhase::Pushing),
        ];
        for (name, verb, during) in held {
            src_agent.sim.block(verb, None);
            let source = format!("cocoonset/{SOURCE}");
            let args = ["checkpoint", &source, "--name", name, "--wait=false"];
            let out = plugin(env, &ns, &args).await;
            assert_eq!(
                out.status.code(),
                Some(0),
                "checkpoint {name}: {}",
                text(&out.stderr)
            );
            assert!(
                src_agent.sim.wait_blocked(verb, 1, WAIT).await,
                "{name}: the source's {verb:?} started"
            );
            assert_eq!(phase(&ckpts.get(name).await?), Some(during), "{name}");
            operator.take().ok_or("no operator")?.kill().await;
            src_agent.sim.unblock(verb);
            operator = Some(Operator::start(
                &c.client,
                &ns,
                env.registry_addr(),
                OperatorOptions::fast(),
            ));
            let done = cocoon_testenv::wait_until(&format!("{name} settled"), WAIT, || async {
                let c = ckpts.get(name).await.ok()?;
                matches!(
                    phase(&c),
                    Some(CheckpointPhase::Ready | CheckpointPhase::Failed)
                )
                .then_some(c)
            })
            .await?;
            let st = done.status.clone().ok_or("no status")?;
            assert_eq!(phase(&done), Some(CheckpointPhase::Ready), "{name}: {st:?}");
            let tag = Reference::Tag(CHECKPOINT_TAG.into());
            let fetched = c.reg.get_manifest(&st.repository, &tag).await?;
            assert_eq!(
                fetched.digest.to_string(),
                st.digest,
                "{name}: Ready names its artifact"
            );
            let (_, id_now) = c.host(&src_vm).await?;
            assert_eq!(id_now, src_id, "{name}: the source VM keeps running");
            assert!(pod_ready(&pods.get(&src_pod).await?), "{src_pod} Ready");
            // The (new) operator clears the settled checkpoint's request from the source pod.
            cocoon_testenv::wait_until(&format!("{name}'s request cleared"), WAIT, || async {
                let p = pods.get(&src_pod).await.ok()?;
                (!p.annotations().contains_key(REQUEST_ANNOTATION)).then_some(())
            })
            .await?;
        }

        for name in forks.iter().copied().chain([SOURCE]) {
            sets.delete(name, &DeleteParams::default()).await?;
        }
        for name in [CKPT2, CKPT3] {
            ckpts.delete(name, &DeleteParams::default()).await?;
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
        drop(operator);
        TestResult::Ok(())
    })
    .await;
}
