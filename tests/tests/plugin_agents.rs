//! The plugin's set verbs end to end against the real controllers (both, in-process, scoped to
//! the test namespace) and real node agents on the simulated runtime (in-process, one per
//! TestNode): suspend and resume keep each VM's guest state; `status` shows the members.

use std::process::Output;
use std::time::Duration;

use cocoon_api::naming::vm_name_for_pod;
use cocoon_api::{CocoonSet, CocoonSetSpec};
use cocoon_e2e::kubectl_cocoon;
use cocoon_testsupport::{Agent, AgentOptions, BoxError, Operator, OperatorOptions};
use kube::api::{Api, PostParams};
use serde_json::Value;

async fn plugin(env: &cocoon_testenv::Shared, args: &[&str]) -> Output {
    tokio::process::Command::new(kubectl_cocoon())
        .arg("--kubeconfig")
        .arg(env.kubeconfig_path())
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

/// A namespace of its own, one node in a pool of its own with a real agent on the simulated
/// runtime, and the operator scoped to the namespace; all stop when dropped.
struct OneNode {
    client: kube::Client,
    ns: String,
    pool: String,
    agent: Agent,
    _node: cocoon_testenv::TestNode,
    _root: tempfile::TempDir,
    _operator: Operator,
}

impl OneNode {
    async fn start(env: &cocoon_testenv::Shared, prefix: &str) -> Result<OneNode, BoxError> {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, prefix).await?;
        let pool = cocoon_testenv::unique_name("pool");
        let node = cocoon_testenv::unique_name("node");
        let node_obj = cocoon_testenv::TestNode::in_pool(&client, &node, &pool).await?;
        let root = tempfile::tempdir()?;
        let agent = Agent::start(
            env.client()?,
            &node,
            root.path(),
            env.registry_addr(),
            AgentOptions::default(),
        )
        .await?;
        let operator = Operator::start(
            &client,
            &ns,
            env.registry_addr(),
            OperatorOptions::default(),
        );
        Ok(OneNode {
            client,
            ns,
            pool,
            agent,
            _node: node_obj,
            _root: root,
            _operator: operator,
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn suspend_and_resume_keep_every_vm_state() {
    cocoon_testenv::run_test(|env| async move {
        let rig = OneNode::start(env, "plugin-e2e").await?;
        let (client, ns, pool, sim) = (
            rig.client.clone(),
            rig.ns.clone(),
            rig.pool.clone(),
            rig.agent.sim.clone(),
        );

        let mut spec = CocoonSetSpec::with_image("ubuntu:24.04");
        spec.node_pool = pool.clone();
        spec.agent.mode = cocoon_api::crd::set::AgentMode::Run;
        spec.agent.replicas = 1;
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        sets.create(&PostParams::default(), &CocoonSet::new("demo", spec))
            .await?;
        let vms = [
            vm_name_for_pod(&ns, "demo-0"),
            vm_name_for_pod(&ns, "demo-1"),
        ];
        let tokens =
            cocoon_testenv::wait_until("both VMs running", Duration::from_secs(90), || async {
                let a = sim.guest_token(&vms[0]).ok()?;
                let b = sim.guest_token(&vms[1]).ok()?;
                Some((a, b))
            })
            .await?;
        let out = plugin(env, &["-n", &ns, "resume", "demo", "--timeout", "90s"]).await;
        assert_eq!(
            out.status.code(),
            Some(0),
            "already running: {}",
            text(&out.stderr)
        );

        let out = plugin(
            env,
            &[
                "-n",
                &ns,
                "suspend",
                "demo",
                "--timeout",
                "3m",
                "-o",
                "json",
            ],
        )
        .await;
        assert_eq!(out.status.code(), Some(0), "suspend: {}", text(&out.stderr));
        let suspend_done = std::time::Instant::now();
        let obj: Value = serde_json::from_slice(&out.stdout)?;
        assert_eq!(obj["status"]["phase"], "Suspended");
        // Issue 27 item 5: the result says what each member's push moved.
        let transfers = obj["transfers"].as_array().cloned().unwrap_or_default();
        for pod in ["demo-0", "demo-1"] {
            assert!(
                transfers.iter().any(|t| t["pod"] == pod
                    && t["reason"] == "SnapshotPushed"
                    && t["message"]
                        .as_str()
                        .is_some_and(|m| m.starts_with("pushed ") && m.contains(" (v1) in "))),
                "{pod}'s push in the result: {transfers:?}"
            );
        }
        assert!(
            sim.guest_token(&vms[0]).is_err(),
            "the main VM was removed after its snapshot"
        );
        let reg = cocoon_testsupport::registry(env.registry_addr());
        for vm in &vms {
            assert!(
                reg.has_manifest(vm, "hibernate").await?,
                "{vm}:hibernate in the registry"
            );
        }

        // Issue 36 item 8: the resume, started within a second of the suspend's end, shows
        // none of the suspend's pushes (its progress lines or its `transfers`), only its own.
        let gap = suspend_done.elapsed();
        assert!(
            gap < Duration::from_secs(1),
            "resume started {gap:?} after the suspend"
        );
        let out = plugin(
            env,
            &["-n", &ns, "resume", "demo", "--timeout", "3m", "-o", "json"],
        )
        .await;
        assert_eq!(out.status.code(), Some(0), "resume: {}", text(&out.stderr));
        let progress = text(&out.stderr);
        assert!(
            !progress.contains("pushed "),
            "the resume shows the suspend's push: {progress}"
        );
        let obj: Value = serde_json::from_slice(&out.stdout)?;
        let transfers = obj["transfers"].as_array().cloned().unwrap_or_default();
        assert!(
            transfers.iter().all(|t| t["reason"] != "SnapshotPushed"),
            "the resume's result lists the suspend's push: {transfers:?}"
        );
        assert_eq!(
            sim.guest_token(&vms[0])?,
            tokens.0,
            "the main came back with its state"
        );
        assert_eq!(
            sim.guest_token(&vms[1])?,
            tokens.1,
            "the sub-agent came back with its state"
        );

        let out = plugin(env, &["-n", &ns, "describe", "demo"]).await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let described = text(&out.stdout);
        assert!(
            described.contains("Events:") && described.contains("Ready=True"),
            "{described}"
        );
        let out = plugin(env, &["-n", &ns, "status", "demo"]).await;
        assert_eq!(out.status.code(), Some(0));
        let table = text(&out.stdout);
        assert!(table.contains("Running"), "{table}");
        assert!(
            table.contains(&vms[0]) && table.contains(&vms[1]),
            "{table}"
        );

        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

#[tokio::test]
async fn status_watch_streams_json_lines() {
    cocoon_testenv::run_test(|env| async move {
        use tokio::io::AsyncBufReadExt;
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "plugin-watch").await?;
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        sets.create(
            &PostParams::default(),
            &CocoonSet::new("watched", CocoonSetSpec::with_image("img")),
        )
        .await?;
        // stdout is a pipe, so the watch streams one JSON object per change instead of redrawing.
        let mut child = tokio::process::Command::new(kubectl_cocoon())
            .arg("--kubeconfig")
            .arg(env.kubeconfig_path())
            .args(["-n", &ns, "status", "-w", "-o", "json"])
            .env_remove("KUBECONFIG")
            .stdout(std::process::Stdio::piped())
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await??;
        let v: Value = serde_json::from_str(first.as_deref().unwrap_or(""))?;
        assert_eq!(v["name"], "watched");
        assert_eq!(v["namespace"], ns.as_str());
        // A change produces another line.
        let patch = serde_json::json!({"spec": {"suspend": true}});
        sets.patch(
            "watched",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await?;
        let next = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                match lines.next_line().await {
                    Ok(Some(l)) => {
                        let v: Value = serde_json::from_str(&l).unwrap_or_default();
                        if v["spec"]["suspend"] == true {
                            return Some(v);
                        }
                    }
                    _ => return None,
                }
            }
        })
        .await?;
        assert!(next.is_some(), "the suspend edit was streamed");
        child.kill().await?;
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrate_moves_the_main_with_its_state_and_unpin_settles() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "plugin-mig").await?;
        let pool = cocoon_testenv::unique_name("pool");
        let (na, nb) = (
            cocoon_testenv::unique_name("node"),
            cocoon_testenv::unique_name("node"),
        );
        let _a = cocoon_testenv::TestNode::in_pool(&client, &na, &pool).await?;
        let _b = cocoon_testenv::TestNode::in_pool(&client, &nb, &pool).await?;
        let (ta, tb) = (tempfile::tempdir()?, tempfile::tempdir()?);
        let agent_sim_a = Agent::start(
            env.client()?,
            &na,
            ta.path(),
            env.registry_addr(),
            AgentOptions::default(),
        )
        .await?;
        let sim_a = agent_sim_a.sim.clone();
        let agent_sim_b = Agent::start(
            env.client()?,
            &nb,
            tb.path(),
            env.registry_addr(),
            AgentOptions::default(),
        )
        .await?;
        let sim_b = agent_sim_b.sim.clone();
        let _operator = Operator::start(
            &client,
            &ns,
            env.registry_addr(),
            OperatorOptions::default(),
        );

        let mut spec = CocoonSetSpec::with_image("ubuntu:24.04");
        spec.node_pool = pool.clone();
        spec.agent.mode = cocoon_api::crd::set::AgentMode::Run;
        spec.node_name = na.clone();
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        sets.create(&PostParams::default(), &CocoonSet::new("mig", spec))
            .await?;
        let vm = vm_name_for_pod(&ns, "mig-0");
        let token = cocoon_testenv::wait_until(
            "main running on node a",
            Duration::from_secs(90),
            || async { sim_a.guest_token(&vm).ok() },
        )
        .await?;

        let out = plugin(
            env,
            &["-n", &ns, "migrate", "mig", "--to", &nb, "--timeout", "3m"],
        )
        .await;
        assert_eq!(out.status.code(), Some(0), "migrate: {}", text(&out.stderr));
        assert_eq!(
            sim_b.guest_token(&vm)?,
            token,
            "the main moved with its state"
        );
        assert!(
            sim_a.guest_token(&vm).is_err(),
            "nothing left running on the old node"
        );
        let set = sets.get("mig").await?;
        assert_eq!(
            set.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("kubectl.cocoonstack.io/previous-node-name"))
                .map(String::as_str),
            Some(na.as_str()),
            "the replaced pin is remembered for --cancel"
        );
        // An unknown node is refused before anything is written.
        let out = plugin(env, &["-n", &ns, "pin", "mig", "no-such-node"]).await;
        assert_eq!(out.status.code(), Some(1));
        let out = plugin(env, &["-n", &ns, "unpin", "mig", "--timeout", "60s"]).await;
        assert_eq!(out.status.code(), Some(0), "unpin: {}", text(&out.stderr));
        assert_eq!(sets.get("mig").await?.spec.node_name, "");

        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hibernate_and_wake_one_pod_with_a_real_agent_and_guarded_multi_target_writes() {
    cocoon_testenv::run_test(|env| async move {
        let rig = OneNode::start(env, "plugin-pod").await?;
        let (client, ns, pool, sim) = (
            rig.client.clone(),
            rig.ns.clone(),
            rig.pool.clone(),
            rig.agent.sim.clone(),
        );

        let mut spec = CocoonSetSpec::with_image("ubuntu:24.04");
        spec.node_pool = pool.clone();
        spec.agent.mode = cocoon_api::crd::set::AgentMode::Run;
        spec.toolboxes = vec![cocoon_api::crd::set::ToolboxSpec {
            name: "tb".into(),
            image: "ubuntu:24.04".into(),
            ..Default::default()
        }];
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        let mut set = CocoonSet::new("one", spec);
        set.metadata.labels = Some([("team".to_string(), "a".to_string())].into());
        sets.create(&PostParams::default(), &set).await?;
        let vm = vm_name_for_pod(&ns, "one-tb");
        let token =
            cocoon_testenv::wait_until("toolbox VM running", Duration::from_secs(90), || async {
                sim.guest_token(&vm).ok()
            })
            .await?;
        cocoon_testenv::wait_until("set Running", Duration::from_secs(90), || async {
            let s = sets.get("one").await.ok()?;
            (s.status?.phase? == cocoon_api::crd::set::CocoonSetPhase::Running).then_some(())
        })
        .await?;

        let out = plugin(env, &["-n", &ns, "hibernate", "one-tb", "--timeout", "3m"]).await;
        assert_eq!(
            out.status.code(),
            Some(0),
            "hibernate: {}",
            text(&out.stderr)
        );
        assert!(
            sim.guest_token(&vm).is_err(),
            "the toolbox VM was removed after its snapshot"
        );
        let out = plugin(env, &["-n", &ns, "wake", "one-tb", "--timeout", "3m"]).await;
        assert_eq!(out.status.code(), Some(0), "wake: {}", text(&out.stderr));
        // Issue 36 item 8: the wake right after the hibernate shows none of its push.
        assert!(
            !text(&out.stderr).contains("pushed "),
            "the wake shows the hibernate's push: {}",
            text(&out.stderr)
        );
        assert_eq!(sim.guest_token(&vm)?, token, "woken with its state");

        // Several targets (-l) without a terminal and without -y: refused as a usage error.
        let out = plugin(env, &["-n", &ns, "suspend", "-l", "team=a"]).await;
        assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
        assert!(text(&out.stderr).contains("-y/--yes"));
        // Dry runs change nothing and do not wait.
        let out = plugin(
            env,
            &[
                "-n",
                &ns,
                "suspend",
                "one",
                "--dry-run=client",
                "-o",
                "json",
            ],
        )
        .await;
        assert_eq!(out.status.code(), Some(0));
        let printed: Value = serde_json::from_slice(&out.stdout)?;
        assert_eq!(printed["kind"], "CocoonSet");
        assert_eq!(printed["spec"]["suspend"], true);
        let out = plugin(env, &["-n", &ns, "suspend", "one", "--dry-run=server"]).await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert!(
            !sets.get("one").await?.spec.suspend,
            "a dry run does not suspend"
        );

        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}
