//! `checkpoint` and `fork` (issue 38): create a CocoonCheckpoint of a pod or a set's main and
//! follow it to `Ready`; create N CocoonSets that start from a checkpoint and follow them to
//! `Running`. The plugin only writes desired state (cli.md): the CRs; the operator and the
//! node agent do the rest.

use std::time::Duration;

use cocoon_api::contract::events::human_bytes;
use cocoon_api::crd::checkpoint::{
    CheckpointPhase, CheckpointSource, CocoonCheckpoint, CocoonCheckpointSpec, NameRef,
};
use cocoon_api::crd::set::{AgentMode, CocoonSet, CocoonSetSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use tokio::time::Instant;

use crate::before::After;
use crate::cli::{DryRun, WaitFlags};
use crate::dryrun::{self, Action, Shown};
use crate::error::CliError;
use crate::output::{format_value, resource_name};
use crate::progress::Progress;
use crate::wait::{Goal, Observation};
use crate::waiter::{WaitSpec, Warnings, wait_for};

/// Most sets one `fork` creates.
pub const MAX_FORKS: u32 = 100;

/// What `checkpoint` takes: `POD`, `pod/POD` or `cocoonset/NAME` (`cset/`, `cs/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceArg {
    Pod(String),
    CocoonSet(String),
}

/// Parses the checkpoint's source argument.
pub fn parse_source(arg: &str) -> Result<SourceArg, CliError> {
    let (kind, name) = match arg.split_once('/') {
        Some((k, n)) => (Some(k), n),
        None => (None, arg),
    };
    if name.is_empty() {
        return Err(CliError::Usage(format!(
            "checkpoint: {arg:?} names no object (POD, pod/POD or cocoonset/NAME)"
        )));
    }
    match kind {
        None | Some("pod" | "pods" | "po") => Ok(SourceArg::Pod(name.to_owned())),
        Some("cocoonset" | "cocoonsets" | "cset" | "cs") => {
            Ok(SourceArg::CocoonSet(name.to_owned()))
        }
        Some(other) => Err(CliError::Usage(format!(
            "checkpoint: {other:?} is not a source kind (POD, pod/POD or cocoonset/NAME)"
        ))),
    }
}

/// The CocoonCheckpoint `checkpoint` creates.
pub fn checkpoint_object(ns: &str, name: &str, source: &SourceArg) -> CocoonCheckpoint {
    let r = |n: &str| Some(NameRef { name: n.to_owned() });
    let source = match source {
        SourceArg::Pod(p) => CheckpointSource {
            pod_ref: r(p),
            cocoon_set_ref: None,
        },
        SourceArg::CocoonSet(s) => CheckpointSource {
            pod_ref: None,
            cocoon_set_ref: r(s),
        },
    };
    let mut c = CocoonCheckpoint::new(name, CocoonCheckpointSpec { source });
    c.metadata.namespace = Some(ns.to_owned());
    c
}

/// The names `fork` creates: `PREFIX-1` … `PREFIX-N`.
pub fn fork_names(prefix: &str, count: u32) -> Vec<String> {
    (1..=count).map(|i| format!("{prefix}-{i}")).collect()
}

/// The spec of every fork: the source set's spec when the checkpoint names one (its
/// placement class, VM options, toolboxes), without its pin and suspend, with `replicas`
/// sub-agents and `agent.fromCheckpoint`; else a minimal agent spec whose image is the
/// checkpoint's artifact as a clone-mode reference (`<repository>:<tag>`).
pub fn fork_spec(
    ckpt: &CocoonCheckpoint,
    source_set: Option<&CocoonSet>,
    replicas: i32,
) -> Result<CocoonSetSpec, CliError> {
    let name = ckpt.name_any();
    let mut spec = match source_set {
        Some(cs) => {
            let mut spec = cs.spec.clone();
            spec.node_name.clear();
            spec.suspend = false;
            spec
        }
        None => {
            let status = ckpt.status.clone().unwrap_or_default();
            if status.repository.is_empty() {
                return Err(CliError::Api(format!(
                    "cocooncheckpoint {name} has no artifact yet (phase {}): nothing to fork from",
                    phase_text(ckpt)
                )));
            }
            let mut spec =
                CocoonSetSpec::with_image(format!("{}:{}", status.repository, status.tag));
            spec.agent.mode = AgentMode::Clone;
            spec
        }
    };
    spec.agent.replicas = replicas;
    spec.agent.from_checkpoint = Some(name);
    Ok(spec)
}

fn phase_text(c: &CocoonCheckpoint) -> String {
    c.phase()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "none yet".into())
}

/// The wait's view of a checkpoint: its phase, and a progress message that carries the bytes
/// the node agent reported (the transfer line of suspend, fed from the status).
pub fn checkpoint_observation(c: Option<&CocoonCheckpoint>) -> Observation {
    let Some(c) = c else {
        return Observation::default();
    };
    let st = c.status.clone().unwrap_or_default();
    let ready = st
        .conditions
        .iter()
        .find(|x| x.type_ == "Ready")
        .map(|x| x.message.clone())
        .unwrap_or_default();
    let transfer = transfer_text(&st.bytes_on_wire, &st.data_bytes, st.phase);
    let ready_message = match (ready.is_empty(), transfer) {
        (_, None) => ready,
        (true, Some(t)) => t,
        (false, Some(t)) => format!("{ready}; {t}"),
    };
    Observation {
        exists: true,
        generation: c.metadata.generation.unwrap_or(0),
        observed_generation: st.observed_generation,
        phase: st.phase.map(|p| p.as_str().to_owned()).unwrap_or_default(),
        ready_message,
        members: [st.pod_name]
            .into_iter()
            .filter(|p| !p.is_empty())
            .collect(),
        uids: c
            .metadata
            .uid
            .clone()
            .map(|u| vec![("CocoonCheckpoint", u)])
            .unwrap_or_default(),
        ..Observation::default()
    }
}

/// `pushed 1.2 GiB of 4.0 GiB` once the node agent reports bytes.
fn transfer_text(wire: &i64, data: &i64, phase: Option<CheckpointPhase>) -> Option<String> {
    if *wire <= 0 {
        return None;
    }
    let verb = if phase == Some(CheckpointPhase::Ready) {
        "pushed"
    } else {
        "pushing"
    };
    let wire = human_bytes(u64::try_from(*wire).unwrap_or(0));
    Some(if *data > 0 {
        format!(
            "{verb} {wire} of {}",
            human_bytes(u64::try_from(*data).unwrap_or(0))
        )
    } else {
        format!("{verb} {wire}")
    })
}

fn post_params(flags: &WaitFlags) -> PostParams {
    PostParams {
        dry_run: flags.dry_run == DryRun::Server,
        field_manager: Some(flags.field_manager.clone()),
    }
}

fn after_now() -> After {
    After {
        since: Timestamp::now()
            .checked_sub(SignedDuration::from_secs(5))
            .ok(),
        before: None,
    }
}

/// `kubectl cocoon checkpoint SOURCE --name CKPT`.
pub async fn checkpoint(
    client: &Client,
    ns: &str,
    source: &str,
    name: &str,
    flags: &WaitFlags,
) -> Result<(), CliError> {
    let source = parse_source(source)?;
    let obj = checkpoint_object(ns, name, &source);
    if flags.dry_run == DryRun::Client {
        return dryrun::report(&obj, Action::Created, flags);
    }
    let api: Api<CocoonCheckpoint> = Api::namespaced(client.clone(), ns);
    let created = api
        .create(&post_params(flags), &obj)
        .await
        .map_err(|e| CliError::from_kube(&format!("create cocooncheckpoint {ns}/{name}"), e))?;
    if flags.dry_run == DryRun::Server {
        return dryrun::report(&created, Action::Created, flags);
    }
    if !flags.waits() {
        return print_written(&[Shown::of(&created, Action::Created)?], flags);
    }
    let done = follow(
        client,
        ns,
        name,
        &[CheckpointPhase::Ready.as_str()],
        flags.timeout,
    )
    .await?;
    match &flags.output {
        Some(fmt) => crate::output::print_object(&done, fmt),
        None => {
            let st = done.status.clone().unwrap_or_default();
            let size = human_bytes(u64::try_from(st.bytes_on_wire).unwrap_or(0));
            println!(
                "cocooncheckpoint/{name} Ready: {}:{} ({size} on the wire, from {} on {})",
                st.repository, st.tag, st.vm_name, st.node
            );
            Ok(())
        }
    }
}

/// Follows checkpoint `name` until its phase is one of `phases` (progress on stderr, the
/// transfer line fed from the status bytes, its Warning Events). `Failed` ends it at once,
/// unless it is what is waited for: the operator does not retry a checkpoint.
pub async fn follow(
    client: &Client,
    ns: &str,
    name: &str,
    phases: &[&str],
    timeout: Duration,
) -> Result<CocoonCheckpoint, CliError> {
    let api: Api<CocoonCheckpoint> = Api::namespaced(client.clone(), ns);
    let progress = Progress::new();
    let line = progress.line(format!("cocooncheckpoint/{name}"));
    let spec = WaitSpec {
        kind: "cocooncheckpoint",
        name,
        goal: Goal::Phase(phases.iter().map(|p| p.to_string()).collect()),
        goal_text: phases.join(" or "),
        // The operator writes observedGeneration 1 with its first status (the spec never
        // changes).
        generation: 1,
        deadline: Instant::now() + timeout,
        timeout,
        grace: Duration::ZERO,
        warnings: Some(Warnings {
            api: Api::namespaced(client.clone(), ns),
            objects: vec![("CocoonCheckpoint", name.to_owned())],
            after: after_now(),
        }),
    };
    let done = wait_for(&api, spec, &line, |c| async move {
        let obs = checkpoint_observation(c.as_ref());
        Ok((c, obs))
    })
    .await;
    progress.clear();
    done?.ok_or_else(|| CliError::NotFound(format!("cocooncheckpoint {name} not found")))
}

/// The phases `wait checkpoint/NAME --for=PHASE` accepts.
pub const PHASES: &[&str] = &["Pending", "Saving", "Pushing", "Ready", "Failed"];

/// `--for PHASE` of `wait checkpoint/NAME`: one of [`PHASES`].
pub fn check_phase(phase: &str) -> Result<(), CliError> {
    if PHASES.contains(&phase) {
        Ok(())
    } else {
        Err(CliError::Usage(format!(
            "invalid value '{phase}' for '--for <PHASE>': a cocooncheckpoint has no such phase [possible values: {}]",
            PHASES.join(", ")
        )))
    }
}

/// `wait checkpoint/NAME --for=PHASE` (read-only).
pub async fn wait(
    client: &Client,
    ns: &str,
    name: &str,
    phase: &str,
    timeout: Duration,
    output: Option<&crate::cli::OutputFormat>,
) -> Result<(), CliError> {
    check_phase(phase)?;
    let api: Api<CocoonCheckpoint> = Api::namespaced(client.clone(), ns);
    api.get(name)
        .await
        .map_err(|e| CliError::from_kube(&format!("get cocooncheckpoint {ns}/{name}"), e))?;
    let done = follow(client, ns, name, &[phase], timeout).await?;
    if let Some(fmt) = output {
        crate::output::print_object(&done, fmt)?;
    }
    Ok(())
}

/// `--wait=false`: kubectl's `created` line per object, or the objects with `-o`.
fn print_written(shown: &[Shown], flags: &WaitFlags) -> Result<(), CliError> {
    match &flags.output {
        Some(fmt) if shown.len() == 1 => print!("{}", format_value(&shown[0].object, fmt)?),
        Some(fmt) => {
            let items = shown.iter().map(|s| s.object.clone()).collect();
            print!("{}", format_value(&dryrun::list(items), fmt)?)
        }
        None => {
            for s in shown {
                println!("{} created", resource_name(&s.object));
            }
        }
    }
    Ok(())
}

/// `kubectl cocoon fork CKPT --count N`.
pub async fn fork(
    client: &Client,
    ns: &str,
    ckpt_name: &str,
    count: u32,
    prefix: Option<&str>,
    replicas: i32,
    flags: &WaitFlags,
) -> Result<(), CliError> {
    if !(1..=MAX_FORKS).contains(&count) {
        return Err(CliError::Usage(format!(
            "--count must be between 1 and {MAX_FORKS}, got {count}"
        )));
    }
    let ckpts: Api<CocoonCheckpoint> = Api::namespaced(client.clone(), ns);
    let ckpt = ckpts
        .get_opt(ckpt_name)
        .await
        .map_err(|e| CliError::from_kube(&format!("get cocooncheckpoint {ns}/{ckpt_name}"), e))?;
    let Some(ckpt) = ckpt else {
        return Err(CliError::NotFound(format!(
            "cocooncheckpoint {ckpt_name} not found in namespace {ns}"
        )));
    };
    if ckpt.phase() == Some(CheckpointPhase::Failed) {
        return Err(CliError::Api(format!(
            "cocooncheckpoint {ckpt_name} is Failed: nothing to fork from"
        )));
    }
    let sets: Api<CocoonSet> = Api::namespaced(client.clone(), ns);
    let source_set = match &ckpt.spec.source.cocoon_set_ref {
        Some(r) => {
            let found = sets
                .get_opt(&r.name)
                .await
                .map_err(|e| CliError::from_kube(&format!("get cocoonset {ns}/{}", r.name), e))?;
            if found.is_none() {
                eprintln!(
                    "warning: cocoonset {} (the checkpoint's source) is gone: the forks get a minimal agent spec",
                    r.name
                );
            }
            found
        }
        None => None,
    };
    let spec = fork_spec(&ckpt, source_set.as_ref(), replicas)?;
    let prefix = prefix.unwrap_or(ckpt_name);
    let mut shown = Vec::new();
    let mut created = Vec::new();
    for name in fork_names(prefix, count) {
        let mut obj = CocoonSet::new(&name, spec.clone());
        obj.metadata.namespace = Some(ns.to_owned());
        if flags.dry_run == DryRun::Client {
            shown.push(Shown::of(&obj, Action::Created)?);
            continue;
        }
        let after = sets
            .create(&post_params(flags), &obj)
            .await
            .map_err(|e| CliError::from_kube(&format!("create cocoonset {ns}/{name}"), e))?;
        shown.push(Shown::of(&after, Action::Created)?);
        created.push(after);
    }
    if flags.dry_run != DryRun::None {
        return dryrun::print_all(&shown, flags);
    }
    if !flags.waits() {
        return print_written(&shown, flags);
    }
    wait_forks(client, ns, &created, flags).await
}

/// Waits until every fork is `Running`, then prints each set's node (or the sets with `-o`).
async fn wait_forks(
    client: &Client,
    ns: &str,
    created: &[CocoonSet],
    flags: &WaitFlags,
) -> Result<(), CliError> {
    let sets: Api<CocoonSet> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let progress = Progress::new();
    let deadline = Instant::now() + flags.timeout;
    let waits = created.iter().map(|cs| {
        let (sets, progress) = (&sets, &progress);
        let name = cs.name_any();
        async move {
            let line = progress.line(format!("cocoonset/{name}"));
            let spec = WaitSpec {
                kind: "cocoonset",
                name: &name,
                goal: Goal::Phase(vec!["Running".to_owned()]),
                goal_text: "Running".to_owned(),
                generation: cs.metadata.generation.unwrap_or(1),
                deadline,
                timeout: flags.timeout,
                grace: flags.failure_grace,
                warnings: Some(Warnings {
                    api: Api::namespaced(client.clone(), ns),
                    objects: vec![("CocoonSet", name.clone())],
                    after: after_now(),
                }),
            };
            wait_for(sets, spec, &line, |c| async move {
                let obs = crate::multi::set_observation(c.as_ref());
                Ok((c, obs))
            })
            .await
        }
    });
    let results = futures::future::join_all(waits).await;
    progress.clear();
    let mut done = Vec::new();
    let mut first_error = None;
    for (cs, r) in created.iter().zip(results) {
        match r {
            Ok(Some(obj)) => done.push(obj),
            Ok(None) => {}
            Err(e) => {
                eprintln!("cocoonset/{}: {e}", cs.name_any());
                first_error.get_or_insert(e);
            }
        }
    }
    if let Some(fmt) = &flags.output {
        let items = done
            .iter()
            .map(serde_json::to_value)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| CliError::Api(e.to_string()))?;
        print!("{}", format_value(&dryrun::list(items), fmt)?);
    } else {
        for cs in &done {
            let main = cocoon_api::naming::pod_name_for_agent(&cs.name_any(), 0);
            let node = pods
                .get_opt(&main)
                .await
                .ok()
                .flatten()
                .and_then(|p| p.spec.and_then(|s| s.node_name))
                .unwrap_or_else(|| "<unknown>".into());
            println!("cocoonset/{} Running on {node}", cs.name_any());
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Whether a `describe` argument names a checkpoint: `checkpoint/NAME`, `cocooncheckpoint/NAME`
/// or `ckpt/NAME` (the name, else `None`).
pub fn describe_target(arg: &str) -> Option<&str> {
    let (kind, name) = arg.split_once('/')?;
    matches!(
        kind,
        "checkpoint" | "checkpoints" | "cocooncheckpoint" | "cocooncheckpoints" | "ckpt"
    )
    .then_some(name)
}

fn dash(s: &str) -> String {
    if s.is_empty() {
        "-".into()
    } else {
        s.to_owned()
    }
}

/// The size column: bytes on the wire, `-` before the node agent reports them.
fn size_text(bytes: i64) -> String {
    if bytes > 0 {
        human_bytes(u64::try_from(bytes).unwrap_or(0))
    } else {
        "-".into()
    }
}

/// The checkpoints table of `status` (namespace overview).
pub fn checkpoints_table(
    items: &[CocoonCheckpoint],
    all_ns: bool,
    now: Timestamp,
    color: bool,
    headers_shown: bool,
) -> String {
    use crate::table::{Cell, phase_tone};
    let mut headers = vec!["CHECKPOINT", "SOURCE", "PHASE", "NODE", "SIZE", "AGE"];
    if all_ns {
        headers.insert(0, "NAMESPACE");
    }
    let rows: Vec<Vec<Cell>> = items
        .iter()
        .map(|c| {
            let st = c.status.clone().unwrap_or_default();
            let phase = phase_text(c);
            let source = c.spec.source.one().map(|s| s.display()).unwrap_or_default();
            let mut row = vec![
                Cell::plain(c.name_any()),
                Cell::plain(dash(&source)),
                Cell::toned(phase.clone(), phase_tone(&phase)),
                Cell::plain(dash(&st.node)),
                Cell::plain(size_text(st.bytes_on_wire)),
                Cell::plain(crate::view::age(
                    c.metadata.creation_timestamp.as_ref().map(|t| t.0),
                    now,
                )),
            ];
            if all_ns {
                row.insert(0, Cell::plain(c.namespace().unwrap_or_default()));
            }
            row
        })
        .collect();
    crate::table::render_with(&headers, &rows, color, headers_shown)
}

/// The text of `describe checkpoint/NAME` (its Events follow).
pub fn checkpoint_text(ns: &str, c: &CocoonCheckpoint) -> String {
    let st = c.status.clone().unwrap_or_default();
    let source = c.spec.source.one().map(|s| s.display()).unwrap_or_default();
    let ready = st.conditions.iter().find(|x| x.type_ == "Ready");
    let mut out = format!(
        "Checkpoint:   {ns}/{}
",
        c.name_any()
    );
    for (label, value) in [
        ("Source:", source),
        ("Phase:", phase_text(c)),
        ("Pod:", st.pod_name.clone()),
        ("VM:", st.vm_name.clone()),
        ("Node:", st.node.clone()),
        (
            "Artifact:",
            if st.repository.is_empty() {
                String::new()
            } else {
                format!("{}:{}", st.repository, st.tag)
            },
        ),
        ("Digest:", st.digest.clone()),
        ("Size:", size_text(st.bytes_on_wire)),
        ("Data:", size_text(st.data_bytes)),
        (
            "Paused:",
            if st.source_pause_millis > 0 {
                format!("{} ms", st.source_pause_millis)
            } else {
                String::new()
            },
        ),
        ("Taken:", st.taken_at.clone()),
        (
            "Ready:",
            ready
                .map(|r| format!("{} ({}) {}", r.status, r.reason, r.message))
                .unwrap_or_default(),
        ),
    ] {
        out.push_str(&format!("{label:<14}{}\n", dash(&value)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use cocoon_api::crd::checkpoint::CocoonCheckpointStatus;

    #[test]
    fn sources_parse_like_kubectl_targets() {
        let cases = [
            ("demo-0", Ok(SourceArg::Pod("demo-0".into()))),
            ("pod/demo-0", Ok(SourceArg::Pod("demo-0".into()))),
            ("cocoonset/demo", Ok(SourceArg::CocoonSet("demo".into()))),
            ("cs/demo", Ok(SourceArg::CocoonSet("demo".into()))),
            ("deployment/x", Err(())),
            ("pod/", Err(())),
        ];
        for (arg, want) in cases {
            let got = parse_source(arg).map_err(|e| assert_eq!(e.exit_code(), 2, "{arg}"));
            assert_eq!(got, want, "{arg}");
        }
    }

    fn ckpt(set: Option<&str>, repo: &str) -> CocoonCheckpoint {
        let source = match set {
            Some(s) => SourceArg::CocoonSet(s.into()),
            None => SourceArg::Pod("raw".into()),
        };
        let mut c = checkpoint_object("ns", "good", &source);
        c.status = Some(CocoonCheckpointStatus {
            phase: Some(CheckpointPhase::Ready),
            repository: repo.into(),
            tag: "checkpoint".into(),
            ..CocoonCheckpointStatus::default()
        });
        c
    }

    #[test]
    fn forks_copy_the_source_sets_spec_unpinned_or_get_a_minimal_one() {
        let mut src = CocoonSet::new("demo", CocoonSetSpec::with_image("ubuntu:24.04"));
        src.spec.node_name = "node-a".into();
        src.spec.suspend = true;
        src.spec.agent.replicas = 3;
        src.spec.snapshot_compatibility_class = "amd-zen4".into();
        let spec = fork_spec(&ckpt(Some("demo"), "ckpt-x"), Some(&src), 0).expect("spec");
        assert_eq!(spec.agent.image, "ubuntu:24.04");
        assert_eq!(spec.snapshot_compatibility_class, "amd-zen4");
        assert_eq!(
            (spec.node_name.as_str(), spec.suspend, spec.agent.replicas),
            ("", false, 0)
        );
        assert_eq!(spec.agent.from_checkpoint.as_deref(), Some("good"));

        let spec = fork_spec(&ckpt(None, "ckpt-x"), None, 2).expect("spec");
        assert_eq!(spec.agent.image, "ckpt-x:checkpoint");
        assert_eq!(spec.agent.mode, AgentMode::Clone);
        assert_eq!(spec.agent.replicas, 2);
        assert_eq!(spec.agent.from_checkpoint.as_deref(), Some("good"));
        // No artifact name yet and no set to copy: refused.
        assert!(fork_spec(&ckpt(None, ""), None, 0).is_err());
        assert_eq!(fork_names("p", 3), ["p-1", "p-2", "p-3"]);
    }

    #[test]
    fn describe_and_status_show_a_checkpoint() {
        assert_eq!(describe_target("checkpoint/good"), Some("good"));
        assert_eq!(describe_target("ckpt/good"), Some("good"));
        assert_eq!(describe_target("cocoonset/good"), None);
        assert_eq!(describe_target("good"), None);
        let mut c = ckpt(Some("demo"), "ckpt-x");
        if let Some(s) = c.status.as_mut() {
            s.node = "node-a".into();
            s.bytes_on_wire = 1536;
        }
        let text = checkpoint_text("ns", &c);
        assert!(text.starts_with("Checkpoint:   ns/good\n"), "{text}");
        assert!(text.contains("Source:       cocoonset/demo\n"), "{text}");
        assert!(text.contains("Artifact:     ckpt-x:checkpoint\n"), "{text}");
        assert!(text.contains("Size:         1.5 KiB\n"), "{text}");
        let table = checkpoints_table(&[c], false, Timestamp::now(), false, true);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("CHECKPOINT"), "{table}");
        assert!(
            lines[1].contains("cocoonset/demo")
                && lines[1].contains("Ready")
                && lines[1].contains("1.5 KiB"),
            "{table}"
        );
    }

    #[test]
    fn the_progress_message_carries_the_status_bytes() {
        let mut c = ckpt(None, "ckpt-x");
        if let Some(s) = c.status.as_mut() {
            s.phase = Some(CheckpointPhase::Pushing);
            s.bytes_on_wire = 3 << 29;
            s.data_bytes = 4 << 30;
        }
        let obs = checkpoint_observation(Some(&c));
        assert_eq!(obs.phase, "Pushing");
        assert_eq!(obs.ready_message, "pushing 1.5 GiB of 4.0 GiB");
        assert!(!checkpoint_observation(None).exists);
    }
}
