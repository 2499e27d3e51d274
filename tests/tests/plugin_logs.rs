//! `kubectl cocoon logs` end to end: the built binary reads members' guest logs through the
//! API server (`pods/log`), which reaches a real node agent's kubelet API (authenticated and
//! authorized as a kubelet's) on loopback; the agent answers from the simulated VM's console.

use std::process::Stdio;
use std::time::Duration;

use cocoon_api::naming::vm_name_for_pod;
use cocoon_api::{CocoonSet, CocoonSetSpec};
use cocoon_e2e::kubectl_cocoon;
use cocoon_testsupport::{
    Agent, AgentOptions, BoxError, KubeletOptions, Operator, OperatorOptions,
};
use kube::api::{Api, PostParams};
use tokio::io::AsyncBufReadExt;

async fn run(env: &cocoon_testenv::Shared, args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(kubectl_cocoon())
        .arg("--kubeconfig")
        .arg(env.kubeconfig_path())
        .args(args)
        .env_remove("KUBECONFIG")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run kubectl-cocoon")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

const WAIT: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn logs_reads_each_members_guest_log_and_follows_it() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "plugin-logs").await?;
        let pool = cocoon_testenv::unique_name("pool");
        let node = cocoon_testenv::unique_name("node-logs");
        let root = tempfile::tempdir()?;
        // The agent registers its Node (InternalIP 127.0.0.1, its kubelet port) in the pool.
        let mut agent = Agent::start(
            env.client()?,
            &node,
            root.path(),
            env.registry_addr(),
            AgentOptions {
                kubelet: Some(KubeletOptions::for_env(env, &pool)?),
                ..AgentOptions::fast()
            },
        )
        .await?;
        assert!(agent.kubelet_port().is_some_and(|p| p != 0));
        let _operator = Operator::start(&client, &ns, env.registry_addr(), OperatorOptions::fast());

        let mut spec = CocoonSetSpec::with_image("ubuntu:24.04");
        spec.node_pool = pool.clone();
        spec.agent.mode = cocoon_api::crd::set::AgentMode::Run;
        spec.agent.replicas = 1;
        spec.toolboxes = vec![cocoon_api::crd::set::ToolboxSpec {
            name: "tb".into(),
            image: "ubuntu:24.04".into(),
            ..Default::default()
        }];
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        sets.create(&PostParams::default(), &CocoonSet::new("demo", spec))
            .await?;
        let [main, sub, tb] = ["demo-0", "demo-1", "demo-tb"].map(|p| vm_name_for_pod(&ns, p));

        // Each member's log is its own VM's console: the main and the toolbox boot from the
        // image (their boot line names the VM), the sub-agent is cloned from the main's fork
        // snapshot. The first read waits until the members run and the kubelet API answers.
        let first_boot = |vm: &str| format!("boot: first boot of {vm} from image ubuntu:24.04");
        let cloned = format!("boot: restored from snapshot fork-{main}");
        for (args, boot, other) in [
            (&["logs", "demo"][..], first_boot(&main), first_boot(&tb)),
            (
                &["logs", "demo", "--slot", "1"],
                cloned.clone(),
                first_boot(&main),
            ),
            (
                &["logs", "demo", "--toolbox", "tb"],
                first_boot(&tb),
                first_boot(&main),
            ),
        ] {
            let mut cmd = vec!["-n", ns.as_str()];
            cmd.extend_from_slice(args);
            let last = std::sync::Mutex::new(String::new());
            let out =
                cocoon_testenv::wait_until(&format!("{args:?} shows {boot:?}"), WAIT, || async {
                    let out = run(env, &cmd).await;
                    *last.lock().expect("lock") = format!(
                        "{:?} {}{}",
                        out.status.code(),
                        text(&out.stdout),
                        text(&out.stderr)
                    );
                    (out.status.code() == Some(0) && text(&out.stdout).contains(&boot))
                        .then_some(out)
                })
                .await
                .inspect_err(|_| eprintln!("last {args:?}: {}", last.lock().expect("lock")))?;
            let shown = text(&out.stdout);
            assert!(
                !shown.contains(&other),
                "{args:?}: only its member: {shown}"
            );
        }

        // -f: the lines the log gains while it runs appear, without the command ending.
        let mut child = tokio::process::Command::new(kubectl_cocoon())
            .arg("--kubeconfig")
            .arg(env.kubeconfig_path())
            .args(["-n", &ns, "logs", "demo", "--slot", "1", "-f"])
            .env_remove("KUBECONFIG")
            .stdout(Stdio::piped())
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let mut lines = tokio::io::BufReader::new(child.stdout.take().ok_or("stdout")?).lines();
        let seen = tokio::time::timeout(WAIT, async {
            while let Some(l) = lines.next_line().await? {
                if l.contains(&cloned) {
                    return Ok::<_, std::io::Error>(true);
                }
            }
            Ok(false)
        })
        .await??;
        assert!(seen, "the followed log starts with what is there");
        let marker = cocoon_testenv::unique_name("marker");
        let exec =
            cocoon_runtime::exec_capture(&*agent.runtime, &sub, &["echo", &marker], None).await;
        assert!(
            exec.result.is_ok(),
            "exec in the sub-agent: {:?}",
            exec.result
        );
        let followed = tokio::time::timeout(WAIT, async {
            while let Some(l) = lines.next_line().await? {
                if l.contains(&marker) {
                    return Ok::<_, std::io::Error>(Some(l));
                }
            }
            Ok(None)
        })
        .await??;
        let line = followed.ok_or("the followed log ended before the new line")?;
        assert!(
            line.contains("exec [\"echo\"") && line.contains("exit 0"),
            "{line}"
        );
        assert!(
            child.try_wait()?.is_none(),
            "still following after the new line"
        );
        child.kill().await?;

        // A member the set does not have: a usage error naming the flag; a missing set: not found.
        let out = run(env, &["-n", &ns, "logs", "demo", "--slot", "5"]).await;
        assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
        assert!(
            text(&out.stderr)
                .contains("--slot 5: cocoonset demo has slots 0 (the main agent) to 1"),
            "{}",
            text(&out.stderr)
        );
        let out = run(env, &["-n", &ns, "logs", "demo", "--toolbox", "db"]).await;
        assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("--toolbox db"),
            "{}",
            text(&out.stderr)
        );
        let out = run(env, &["-n", &ns, "logs", "nosuch"]).await;
        assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("\"nosuch\" not found"),
            "{}",
            text(&out.stderr)
        );
        assert!(out.stdout.is_empty());

        cocoon_testenv::delete_namespace(&client, &ns).await?;
        agent.stop_and_deregister().await;
        Ok::<_, BoxError>(())
    })
    .await;
}
