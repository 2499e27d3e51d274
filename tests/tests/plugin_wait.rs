//! The plugin's waits end to end, as a CI script meets them: the read-only `wait` verb, several
//! targets written first and waited for together under one deadline (one stuck target never
//! stops the others; a result table and the worst exit code), why a wait is stuck (the newest
//! Warning Event in progress lines and in the timeout error), `wake POD` returning only when
//! the pod is Ready, Ctrl-C printing the command that resumes the wait, `describe` selecting
//! Events by involvedObject, and the progress display on a terminal and in a log. Real
//! controllers (in-process, scoped to the test namespace) and real node agents on the
//! simulated runtime, whose verbs are failed, blocked or starved of DHCP leases through the
//! simulator's controls.

use std::process::{Output, Stdio};
use std::time::Duration;

use cocoon_api::naming::vm_name_for_pod;
use cocoon_api::{CocoonSet, CocoonSetSpec};
use cocoon_e2e::kubectl_cocoon;
use cocoon_runtime::sim::Verb;
use cocoon_testsupport::{Agent, AgentOptions, BoxError, Operator, OperatorOptions, wait_set};
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;

fn command(env: &cocoon_testenv::Shared, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(kubectl_cocoon());
    cmd.arg("--kubeconfig")
        .arg(env.kubeconfig_path())
        .args(args)
        .env_remove("KUBECONFIG")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

async fn plugin(env: &cocoon_testenv::Shared, args: &[&str]) -> Output {
    command(env, args)
        .output()
        .await
        .expect("run kubectl-cocoon")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A set of one VM (mode run, no sub-agents) in `pool`, with `toolboxes`.
fn small_set(name: &str, pool: &str, toolboxes: &[&str]) -> CocoonSet {
    let mut spec = CocoonSetSpec::with_image("ubuntu:24.04");
    spec.node_pool = pool.to_string();
    spec.agent.mode = cocoon_api::crd::set::AgentMode::Run;
    spec.agent.replicas = 0;
    spec.toolboxes = toolboxes
        .iter()
        .map(|t| cocoon_api::crd::set::ToolboxSpec {
            name: t.to_string(),
            image: "ubuntu:24.04".into(),
            ..Default::default()
        })
        .collect();
    CocoonSet::new(name, spec)
}

fn is_phase(cs: &CocoonSet, phase: &str) -> bool {
    cs.status
        .as_ref()
        .and_then(|s| s.phase)
        .is_some_and(|p| p.as_str() == phase)
}

/// A node in a pool of its own with a real agent on the simulated runtime.
struct Node {
    pool: String,
    agent: Agent,
    _node: cocoon_testenv::TestNode,
    _root: tempfile::TempDir,
}

async fn node(env: &cocoon_testenv::Shared, opts: AgentOptions) -> Result<Node, BoxError> {
    let client = env.client()?;
    let pool = cocoon_testenv::unique_name("pool");
    let name = cocoon_testenv::unique_name("node");
    let node = cocoon_testenv::TestNode::in_pool(&client, &name, &pool).await?;
    let root = tempfile::tempdir()?;
    let agent = Agent::start(client, &name, root.path(), env.registry_addr(), opts).await?;
    Ok(Node {
        pool,
        agent,
        _node: node,
        _root: root,
    })
}

fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Items 4, 5, 6 and 12: two sets suspended at once, the first one unable to finish (its
/// node's snapshots fail); Ctrl-C during a resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn several_sets_at_once_one_stuck_the_other_still_succeeds() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "pwait-multi").await?;
        let a = node(env, AgentOptions::default()).await?;
        let b = node(env, AgentOptions::default()).await?;
        let _operator = Operator::start(&client, &ns, env.registry_addr(), OperatorOptions::fast());
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        sets.create(&PostParams::default(), &small_set("fine", &a.pool, &[]))
            .await?;
        sets.create(&PostParams::default(), &small_set("stuck", &b.pool, &[]))
            .await?;
        for name in ["fine", "stuck"] {
            wait_set(&sets, name, "Running", Duration::from_secs(120), |cs| {
                is_phase(cs, "Running")
            })
            .await?;
        }
        // From now on every snapshot on b's node fails: `stuck` can never be Suspended.
        b.agent.sim.fail_always(
            Verb::SnapshotSave,
            "no space left on device (injected by the test)",
        );

        // The stuck one first: the old plugin waited for it alone and never wrote `fine`.
        let out = plugin(
            env,
            &[
                "-n",
                &ns,
                "suspend",
                "stuck",
                "fine",
                "-y",
                "--timeout",
                "90s",
                "--failure-grace",
                "10m",
                "-o",
                "json",
            ],
        )
        .await;
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert_eq!(
            out.status.code(),
            Some(3),
            "stdout: {stdout}\nstderr: {stderr}"
        );
        assert!(
            is_phase(&sets.get("fine").await?, "Suspended"),
            "the other set finished"
        );
        // -o json with several objects: a kubectl List of what reached the goal.
        let list: Value = serde_json::from_str(&stdout)?;
        assert_eq!(list["kind"], "List", "{stdout}");
        let items = list["items"].as_array().cloned().unwrap_or_default();
        assert_eq!(items.len(), 1, "{stdout}");
        assert_eq!(items[0]["metadata"]["name"], "fine");
        assert_eq!(items[0]["status"]["phase"], "Suspended");
        // The result table (on stderr, as stdout holds the List) has both, with outcomes.
        let row = |target: &str| {
            // The table comes last; progress lines of the target come before it.
            stderr
                .lines()
                .rev()
                .find(|l| l.starts_with(target) && !l.contains(" Warning "))
                .map(str::to_string)
                .unwrap_or_default()
        };
        assert!(stderr.contains("TARGET"), "{stderr}");
        assert!(row("cocoonset/fine ").contains("done"), "{stderr}");
        let stuck = row("cocoonset/stuck ");
        assert!(stuck.contains("timed out"), "{stderr}");
        // Why it is stuck: the failing snapshot's Warning arrived as a progress line and is in
        // the timeout message with the last state.
        assert!(
            stderr.lines().any(|l| l.starts_with("cocoonset/stuck")
                && l.contains(" Warning ")
                && l.contains("(injected by the test)")),
            "{stderr}"
        );
        assert!(
            stuck.contains("timeout: cocoonset stuck not Suspended after 1m30s")
                && stuck.contains("last state: ")
                && stuck.contains("last warning: ")
                && stuck.contains("(injected by the test)"),
            "{stuck}"
        );
        assert!(
            stderr.contains("error: 1 of 2 targets did not succeed (1 timed out)"),
            "{stderr}"
        );

        // The read-only wait: checks once with --timeout 0, the same table and exit codes.
        let out = plugin(
            env,
            &[
                "-n",
                &ns,
                "wait",
                "cocoonset/fine",
                "cocoonset/stuck",
                "--for=Suspended",
                "--timeout",
                "0",
                "--failure-grace",
                "10m",
            ],
        )
        .await;
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with("cocoonset/fine ") && l.contains("done")),
            "{stdout}"
        );
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with("cocoonset/stuck ") && l.contains("timed out")),
            "{stdout}"
        );
        let out = plugin(
            env,
            &[
                "-n",
                &ns,
                "wait",
                "fine",
                "--for=Suspended",
                "--timeout=0",
                "-o",
                "json",
            ],
        )
        .await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let obj: Value = serde_json::from_slice(&out.stdout)?;
        assert_eq!(obj["kind"], "CocoonSet");
        let out = plugin(
            env,
            &["-n", &ns, "wait", "cocoonset/fine", "--for=Hibernated"],
        )
        .await;
        assert_eq!(out.status.code(), Some(2), "not a phase of a set");
        assert!(text(&out.stderr).contains("--for"), "{}", text(&out.stderr));

        // Ctrl-C while a resume waits (its VM's restore held back on a's node): the write
        // stays, and the printed command resumes the wait.
        a.agent.sim.block(Verb::Clone, None);
        let mut child = command(env, &["-n", &ns, "resume", "fine", "--timeout", "5m"])
            .stderr(Stdio::piped())
            .spawn()?;
        let stderr = child.stderr.take().expect("stderr");
        let mut lines = tokio::io::BufReader::new(stderr).lines();
        let mut seen = Vec::new();
        // The first progress line: the write is done and the wait has begun.
        tokio::time::timeout(Duration::from_secs(60), async {
            while let Ok(Some(l)) = lines.next_line().await {
                let progress = l.starts_with("cocoonset/fine ");
                seen.push(l);
                if progress {
                    break;
                }
            }
        })
        .await?;
        let pid = child.id().expect("pid").to_string();
        let kill = tokio::process::Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .await?;
        assert!(kill.success());
        while let Ok(Some(l)) = lines.next_line().await {
            seen.push(l);
        }
        let status = child.wait().await?;
        let said = seen.join("\n");
        assert_eq!(status.code(), Some(130), "{said}");
        assert!(
            said.contains("the write already happened (cocoonset/fine spec.suspend=false)"),
            "{said}"
        );
        let hint =
            format!("kubectl cocoon wait -n {ns} cocoonset/fine --for=Running --timeout=5m0s");
        assert!(said.contains(&hint), "{said}");
        assert!(!sets.get("fine").await?.spec.suspend, "the write stays");
        a.agent.sim.unblock(Verb::Clone);
        let resumed: Vec<String> = hint
            .split_whitespace()
            .skip(3) // "kubectl cocoon wait" -> the plugin's own argv
            .map(str::to_string)
            .collect();
        let mut args = vec!["wait"];
        args.extend(resumed.iter().map(String::as_str));
        let out = plugin(env, &args).await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert!(is_phase(&sets.get("fine").await?, "Running"));

        b.agent.sim.clear_failures();
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

/// Items 5 and 7: `hibernate`/`wake -l` on pods; `wake POD` returns when the pod is Ready
/// again (its VM serves), not when the CocoonHibernation reads Active.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wake_returns_when_the_pod_is_ready_and_pods_are_selected_by_label() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "pwait-pods").await?;
        // The woken VM's DHCP wait outlasts the test, so a withheld lease keeps it not Ready.
        let mut opts = AgentOptions::default();
        opts.timing.ready_ip_wait = Duration::from_secs(600);
        let n = node(env, opts).await?;
        let sim = n.agent.sim.clone();
        let _operator = Operator::start(&client, &ns, env.registry_addr(), OperatorOptions::fast());
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        sets.create(
            &PostParams::default(),
            &small_set("one", &n.pool, &["tb1", "tb2"]),
        )
        .await?;
        wait_set(&sets, "one", "Running", Duration::from_secs(120), |cs| {
            is_phase(cs, "Running")
        })
        .await?;
        let toolboxes = "cocoonset.cocoonstack.io/role=toolbox";

        let out = plugin(
            env,
            &[
                "-n",
                &ns,
                "hibernate",
                "-l",
                toolboxes,
                "-y",
                "--timeout",
                "3m",
            ],
        )
        .await;
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        for pod in ["pod/one-tb1 ", "pod/one-tb2 "] {
            assert!(
                stdout
                    .lines()
                    .any(|l| l.starts_with(pod) && l.contains("done")),
                "{stdout}"
            );
        }
        assert!(
            !stdout.contains("pod/one-0"),
            "the main is not a toolbox: {stdout}"
        );

        // tb1's woken VM gets no DHCP lease: it runs (Active) but does not serve (not Ready).
        sim.withhold_leases(Some(&vm_name_for_pod(&ns, "one-tb1")), true);
        let out = plugin(
            env,
            &["-n", &ns, "wake", "-l", toolboxes, "-y", "--timeout", "60s"],
        )
        .await;
        let stdout = text(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(3),
            "{stdout}\n{}",
            text(&out.stderr)
        );
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with("pod/one-tb2 ") && l.contains("done")),
            "{stdout}"
        );
        assert!(
            stdout.lines().any(|l| l.starts_with("pod/one-tb1 ")
                && l.contains("timed out")
                && l.contains("not Ready after 1m0s")
                && l.contains("Active; the pod is not Ready yet")),
            "{stdout}"
        );
        // --until Active keeps the old behaviour.
        let out = plugin(
            env,
            &[
                "-n",
                &ns,
                "wake",
                "one-tb1",
                "--until",
                "Active",
                "--timeout",
                "60s",
            ],
        )
        .await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let out = plugin(
            env,
            &[
                "-n",
                &ns,
                "wait",
                "pod/one-tb1",
                "--for=Ready",
                "--timeout=0",
            ],
        )
        .await;
        assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));

        // The lease comes: wake returns, and at that moment the pod is Ready.
        sim.withhold_leases(Some(&vm_name_for_pod(&ns, "one-tb1")), false);
        let out = plugin(
            env,
            &[
                "-n",
                &ns,
                "wake",
                "pod/one-tb1",
                "--timeout",
                "3m",
                "-o",
                "json",
            ],
        )
        .await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        assert!(
            pod_ready(&pods.get("one-tb1").await?),
            "Ready when wake returned"
        );
        let obj: Value = serde_json::from_slice(&out.stdout)?;
        assert_eq!(obj["kind"], "CocoonHibernation");
        assert_eq!(obj["status"]["phase"], "Active");
        // Several objects with -o yaml: a List.
        let out = plugin(
            env,
            &[
                "-n",
                &ns,
                "wait",
                "pod/one-tb1",
                "pod/one-tb2",
                "--for=Ready",
                "-o",
                "yaml",
            ],
        )
        .await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let yaml = text(&out.stdout);
        assert!(
            yaml.contains("kind: List") && yaml.matches("kind: CocoonHibernation").count() == 2,
            "{yaml}"
        );

        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

async fn event(
    client: &Client,
    ns: &str,
    name: &str,
    (kind, api_version, object, uid): (&str, &str, &str, &str),
    (type_, reason): (&str, &str),
    count: i32,
) -> Result<(), BoxError> {
    let now = Time(Timestamp::now());
    let ev = Event {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        involved_object: k8s_openapi::api::core::v1::ObjectReference {
            kind: Some(kind.into()),
            api_version: Some(api_version.into()),
            name: Some(object.into()),
            namespace: Some(ns.into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        type_: Some(type_.into()),
        reason: Some(reason.into()),
        message: Some(format!("{reason} of {kind} {object}")),
        count: Some(count),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        source: Some(k8s_openapi::api::core::v1::EventSource {
            component: Some("cocoon-operator".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    Api::<Event>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &ev)
        .await?;
    Ok(())
}

/// Item 6 (`describe`) and item 10 (progress on a terminal and in a log). No controllers: the
/// objects and Events are written by the test.
#[tokio::test]
async fn describe_selects_events_by_involved_object_and_progress_fits_the_terminal() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "pwait-describe").await?;
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        let demo = sets
            .create(&PostParams::default(), &small_set("demo", "p", &[]))
            .await?;
        let two = sets
            .create(&PostParams::default(), &small_set("demo-two", "p", &[]))
            .await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "demo-0", "labels": {"cocoonset.cocoonstack.io/name": "demo", "cocoonset.cocoonstack.io/role": "main", "cocoonset.cocoonstack.io/slot": "0"},
                "annotations": {"vm.cocoonstack.io/name": vm_name_for_pod(&ns, "demo-0")}},
            "spec": {"containers": [{"name": "agent", "image": "cocoon/placeholder"}], "nodeName": "nowhere"}
        }))?;
        let pod = pods.create(&PostParams::default(), &pod).await?;
        let chs: Api<cocoon_api::crd::hibernation::CocoonHibernation> =
            Api::namespaced(client.clone(), &ns);
        let ch = chs
            .create(
                &PostParams::default(),
                &cocoon_api::crd::hibernation::CocoonHibernation::new(
                    "demo-0",
                    cocoon_api::crd::hibernation::CocoonHibernationSpec {
                        pod_ref: cocoon_api::crd::hibernation::PodRef {
                            name: "demo-0".into(),
                        },
                        desire: cocoon_api::crd::hibernation::Desire::Hibernate,
                    },
                ),
            )
            .await?;
        let set_ref = |cs: &CocoonSet| ("CocoonSet", "cocoonset.cocoonstack.io/v1", cs.name_any(), cs.uid().unwrap_or_default());
        let (k, v, n, u) = set_ref(&demo);
        event(&client, &ns, "e1", (k, v, &n, &u), ("Normal", "DemoSuspended"), 3).await?;
        let (k, v, n, u) = set_ref(&two);
        event(&client, &ns, "e2", (k, v, &n, &u), ("Warning", "TwoNoCapacity"), 1).await?;
        // An event of an earlier `demo` (another uid) is not this one's.
        event(&client, &ns, "e3", (k, v, "demo", "0000-old"), ("Warning", "StaleDemo"), 1).await?;
        let pod_uid = pod.uid().unwrap_or_default();
        event(&client, &ns, "e4", ("Pod", "v1", "demo-0", &pod_uid), ("Warning", "PodSnapshotFailed"), 2).await?;
        let ch_uid = ch.uid().unwrap_or_default();
        event(&client, &ns, "e5", ("CocoonHibernation", "cocoonset.cocoonstack.io/v1", "demo-0", &ch_uid), ("Normal", "HibRetry"), 1).await?;

        let out = plugin(env, &["-n", &ns, "describe", "demo"]).await;
        let shown = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        for want in ["DemoSuspended", "PodSnapshotFailed", "HibRetry", "AGE", "COUNT", "FROM", "cocoon-operator"] {
            assert!(shown.contains(want), "{want}: {shown}");
        }
        for unwanted in ["TwoNoCapacity", "StaleDemo"] {
            assert!(!shown.contains(unwanted), "{unwanted}: {shown}");
        }
        let counted = shown
            .lines()
            .find(|l| l.contains("DemoSuspended"))
            .unwrap_or_default()
            .split_whitespace()
            .nth(3)
            .map(str::to_string);
        assert_eq!(counted.as_deref(), Some("3"), "{shown}");
        for target in ["pod/demo-0", "cocoonhibernation/demo-0"] {
            let out = plugin(env, &["-n", &ns, "describe", target]).await;
            let shown = text(&out.stdout);
            assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
            assert!(shown.contains("Hibernation:  desire Hibernate"), "{shown}");
            assert!(shown.contains("PodSnapshotFailed") && shown.contains("HibRetry"), "{shown}");
            assert!(!shown.contains("DemoSuspended"), "{shown}");
        }
        let out = plugin(env, &["-n", &ns, "describe", "pod/absent"]).await;
        assert_eq!(out.status.code(), Some(1));

        // No operator runs here, so the set's status never catches up: a long progress message.
        let long = "waiting for the operator to observe generation 1 (status is at 0)";
        // In a log (stderr not a terminal): plain lines, each kept whole.
        let out = plugin(env, &["-n", &ns, "wait", "demo", "--for=Suspended", "--timeout", "3s"]).await;
        let log = text(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{log}");
        assert!(
            log.lines().any(|l| l.starts_with("cocoonset/demo ") && l.ends_with(long)),
            "{log}"
        );
        assert!(!log.contains('\r') && !log.contains('\u{1b}'), "{log:?}");
        // On a 40-column terminal: the spinner line is cut to the width, never wrapped.
        let bin = kubectl_cocoon();
        let script = format!(
            "stty cols 40 rows 20; exec {} --kubeconfig {} -n {ns} wait demo --for=Suspended --timeout 3s",
            bin.display(),
            env.kubeconfig_path().display()
        );
        let out = tokio::process::Command::new("script")
            .args(["-q", "-e", "-c", &script, "/dev/null"])
            .env_remove("KUBECONFIG")
            .env("TERM", "xterm")
            .env_remove("NO_COLOR")
            .stdin(Stdio::null())
            .output()
            .await?;
        let tty = text(&out.stdout);
        // The redrawn spinner lines (they start with a spinner glyph); lines printed once,
        // like the final one, may wrap as any log line does.
        let fragments: Vec<String> = strip_ansi(&tty)
            .split(['\n', '\r'])
            .filter(|f| f.starts_with(|c: char| ('\u{2800}'..='\u{28ff}').contains(&c)))
            .map(str::to_string)
            .collect();
        assert!(
            fragments.iter().any(|f| f.contains("cocoonset/demo") && f.contains("waiting for")),
            "a spinner with the live state: {tty:?}"
        );
        for f in &fragments {
            assert!(f.trim_end().chars().count() <= 40, "wider than the terminal: {f:?} in {tty:?}");
        }
        // The final state stays on its own line, and the error starts a line of its own.
        assert!(tty.contains("\nerror: timeout: cocoonset demo not Suspended"), "{tty:?}");
        assert!(!tty.contains("StaleDemo"), "another object's warning: {tty:?}");

        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

/// Terminal output with its escape sequences (CSI and two-byte ESC sequences) removed; what
/// was drawn on one line is split by the line's cursor moves ("\r", erase, up).
fn strip_ansi(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        // CSI sequences; a two-byte escape is dropped with its second byte.
        if chars.next() == Some('[') {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() || c == '~' {
                    break;
                }
            }
            // A cursor move or erase ends what was drawn so far on this line.
            out.push('\r');
        }
    }
    out
}
