//! Several targets at once: every write is done first (by the verb), then this waits for all
//! of them concurrently under one deadline. A failure of one target never stops the others;
//! the end is a per-target result table and the worst exit code. Ctrl-C during the wait says
//! that the writes already happened and prints the `wait` command that resumes waiting.

use std::sync::Mutex;
use std::time::Duration;

use cocoon_api::crd::hibernation::CocoonHibernation;
use cocoon_api::crd::set::CocoonSet;
use futures::future::join_all;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::Client;
use kube::api::Api;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::before::After;
use crate::cli::OutputFormat;
use crate::error::{CliError, EXIT_OK};
use crate::output::print_object;
use crate::progress::{Line, Progress};
use crate::targets::{self, GoalSpec, Kind, Outcome, ResultRow, Target};
use crate::wait::Observation;
use crate::waiter::{WaitSpec, Warnings, wait_for};

/// One target whose write is done (or that is only watched) and whose wait remains.
#[derive(Debug, Clone)]
pub struct Job {
    pub target: Target,
    pub goal: GoalSpec,
    /// The generation the write produced (or the current one).
    pub generation: i64,
    /// What was written (`spec.suspend=true`), empty when nothing was.
    pub written: String,
}

/// How the waits run and end.
#[derive(Debug, Clone)]
pub struct Options {
    pub timeout: Duration,
    pub grace: Duration,
    pub output: Option<OutputFormat>,
    /// Only write (`--no-wait`): print the objects and stop.
    pub no_wait: bool,
    /// Which Events belong to this round: newer than the write, and not already there
    /// before it.
    pub after: After,
}

/// The observation of a CocoonSet.
pub fn set_observation(cs: Option<&CocoonSet>) -> Observation {
    let Some(cs) = cs else {
        return Observation::default();
    };
    let st = cs.status.clone().unwrap_or_default();
    Observation {
        exists: true,
        generation: cs.metadata.generation.unwrap_or(0),
        observed_generation: st.observed_generation,
        phase: st.phase.map(|p| p.as_str().to_string()).unwrap_or_default(),
        ready_message: ready_message(&st.conditions),
        members: st
            .agents
            .iter()
            .map(|a| a.pod_name.clone())
            .chain(st.toolboxes.iter().map(|t| t.pod_name.clone()))
            .filter(|n| !n.is_empty())
            .collect(),
        uids: cs
            .metadata
            .uid
            .iter()
            .map(|u| ("CocoonSet", u.clone()))
            .collect(),
        ..Default::default()
    }
}

fn ready_message(conds: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]) -> String {
    conds
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

/// The observation of a pod target: its CocoonHibernation (a pod without one is `Active`) and
/// whether the pod is Ready.
pub fn pod_observation(ch: Option<&CocoonHibernation>, pod: Option<&Pod>) -> Observation {
    let pod_ready = pod.is_some_and(|p| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    });
    match (ch, pod) {
        (Some(ch), _) => {
            let st = ch.status.clone().unwrap_or_default();
            Observation {
                exists: true,
                generation: ch.metadata.generation.unwrap_or(0),
                observed_generation: st.observed_generation,
                phase: st.phase.map(|p| p.as_str().to_string()).unwrap_or_default(),
                ready_message: ready_message(&st.conditions),
                pod_ready,
                uids: ch
                    .metadata
                    .uid
                    .iter()
                    .map(|u| ("CocoonHibernation", u.clone()))
                    .chain(pod.and_then(|p| p.metadata.uid.clone()).map(|u| ("Pod", u)))
                    .collect(),
                ..Default::default()
            }
        }
        (None, Some(p)) => Observation {
            exists: true,
            phase: crate::wait::ACTIVE.into(),
            pod_ready,
            uids: p.metadata.uid.iter().map(|u| ("Pod", u.clone())).collect(),
            ..Default::default()
        },
        (None, None) => Observation::default(),
    }
}

fn to_value<T: serde::Serialize>(o: &T) -> Option<Value> {
    serde_json::to_value(o).ok()
}

/// Waits for one target; the object (for `-o`) when done.
async fn wait_one(
    client: &Client,
    job: &Job,
    opts: &Options,
    deadline: Instant,
    line: &Line,
) -> Result<Option<Value>, CliError> {
    let t = &job.target;
    let events: Api<Event> = Api::namespaced(client.clone(), &t.namespace);
    match t.kind {
        Kind::CocoonSet => {
            let api: Api<CocoonSet> = Api::namespaced(client.clone(), &t.namespace);
            let spec = WaitSpec {
                kind: "cocoonset",
                name: &t.name,
                goal: job.goal.goal.clone(),
                goal_text: job.goal.text.clone(),
                generation: job.generation,
                deadline,
                timeout: opts.timeout,
                grace: opts.grace,
                warnings: Some(Warnings {
                    api: events,
                    objects: vec![("CocoonSet", t.name.clone())],
                    after: opts.after.clone(),
                }),
            };
            let done = wait_for(&api, spec, line, |o| async move {
                let obs = set_observation(o.as_ref());
                Ok((o, obs))
            })
            .await?;
            let members: Vec<String> = done.as_ref().map(set_members).unwrap_or_default();
            Ok(with_transfers(client, t, done.as_ref().and_then(to_value), &members, opts).await)
        }
        Kind::Pod => {
            let api: Api<CocoonHibernation> = Api::namespaced(client.clone(), &t.namespace);
            let pods: Api<Pod> = Api::namespaced(client.clone(), &t.namespace);
            let spec = WaitSpec {
                kind: "cocoonhibernation",
                name: &t.name,
                goal: job.goal.goal.clone(),
                goal_text: job.goal.text.clone(),
                generation: job.generation,
                deadline,
                timeout: opts.timeout,
                grace: opts.grace,
                warnings: Some(Warnings {
                    api: events,
                    objects: vec![
                        ("CocoonHibernation", t.name.clone()),
                        ("Pod", t.name.clone()),
                    ],
                    after: opts.after.clone(),
                }),
            };
            let name = t.name.clone();
            let done = wait_for(&api, spec, line, |o| {
                let pods = pods.clone();
                let name = name.clone();
                async move {
                    let pod = match pods.get_opt(&name).await {
                        Ok(p) => p,
                        Err(e) if CliError::is_transient_kube(&e) => None,
                        Err(e) => return Err(CliError::from_kube(&format!("get pod {name}"), e)),
                    };
                    let obs = pod_observation(o.as_ref(), pod.as_ref());
                    Ok((o, obs))
                }
            })
            .await?;
            let members = vec![t.name.clone()];
            Ok(with_transfers(client, t, done.as_ref().and_then(to_value), &members, opts).await)
        }
    }
}

/// At most this many sub-agent slots are named from a set's spec for its `transfers`.
const MAX_MEMBER_SLOTS: i32 = 1024;

/// The pods of a set's members: those its status names, and `<set>-<slot>` / `<set>-<toolbox>`
/// of its spec (a suspended set's status may list none, while its transfers are what moved).
fn set_members(cs: &CocoonSet) -> Vec<String> {
    let name = cs.metadata.name.clone().unwrap_or_default();
    let mut out = set_observation(Some(cs)).members;
    // Bounded: replicas has no maximum in the CRD, and only pods that exist have Events.
    let slots = cs.spec.agent.replicas.clamp(0, MAX_MEMBER_SLOTS);
    out.extend((0..=slots).map(|slot| format!("{name}-{slot}")));
    out.extend(
        cs.spec
            .toolboxes
            .iter()
            .map(|t| format!("{name}-{}", t.name)),
    );
    out.sort();
    out.dedup();
    out
}

/// With `-o json|yaml`, the printed object gains a top-level `transfers` list (additive, not
/// a field of the resource): every snapshot transfer the node agents reported for the member
/// pods during this wait (`SnapshotPushed` / `SnapshotPulled` Events), oldest first. Without
/// `-o`, or when nothing moved, the object is printed as the API server returned it.
async fn with_transfers(
    client: &Client,
    t: &Target,
    obj: Option<Value>,
    members: &[String],
    opts: &Options,
) -> Option<Value> {
    let mut obj = obj?;
    if opts.output.is_none() || members.is_empty() {
        return Some(obj);
    }
    let events: Api<Event> = Api::namespaced(client.clone(), &t.namespace);
    let Ok(list) = events
        .list(&kube::api::ListParams::default().fields("type=Normal"))
        .await
    else {
        return Some(obj);
    };
    let pods: Vec<&str> = members.iter().map(String::as_str).collect();
    let transfers = crate::waiter::transfers_of(&list.items, &pods, &opts.after);
    if !transfers.is_empty()
        && let Some(map) = obj.as_object_mut()
    {
        map.insert("transfers".into(), Value::Array(transfers));
    }
    Some(obj)
}

async fn current_object(client: &Client, t: &Target) -> Option<Value> {
    match t.kind {
        Kind::CocoonSet => Api::<CocoonSet>::namespaced(client.clone(), &t.namespace)
            .get_opt(&t.name)
            .await
            .ok()
            .flatten()
            .as_ref()
            .and_then(to_value),
        Kind::Pod => Api::<CocoonHibernation>::namespaced(client.clone(), &t.namespace)
            .get_opt(&t.name)
            .await
            .ok()
            .flatten()
            .as_ref()
            .and_then(to_value),
    }
}

fn message_of(result: &Result<(), CliError>, reached: &str) -> String {
    match result {
        Ok(()) => reached.to_string(),
        Err(e) => e.to_string(),
    }
}

/// Runs the waits of `jobs` (write errors already known in `failed`) and reports. One target:
/// its own outcome, as before. Several: a result table (stdout, or stderr when `-o` prints
/// objects) and the worst exit code.
pub async fn wait_all(
    client: &Client,
    jobs: Vec<Job>,
    failed: Vec<(Target, CliError)>,
    opts: &Options,
) -> Result<(), CliError> {
    let several = jobs.len() + failed.len() > 1;
    let started = Instant::now();
    let mut rows: Vec<(ResultRow, Result<(), CliError>, Option<Value>)> = Vec::new();
    for (target, e) in failed {
        let row = ResultRow {
            target,
            outcome: Outcome::Error,
            elapsed: Duration::ZERO,
            message: e.to_string(),
        };
        rows.push((row, Err(e), None));
    }
    if opts.no_wait {
        for job in jobs {
            let obj = if opts.output.is_some() {
                current_object(client, &job.target).await
            } else {
                None
            };
            let row = ResultRow {
                target: job.target,
                outcome: Outcome::Written,
                elapsed: Duration::ZERO,
                message: job.written,
            };
            rows.push((row, Ok(()), obj));
        }
    } else {
        let progress = Progress::new();
        let deadline = Instant::now() + opts.timeout;
        let finished: Mutex<Vec<bool>> = Mutex::new(vec![false; jobs.len()]);
        let waits = jobs.iter().enumerate().map(|(i, job)| {
            let progress = &progress;
            let finished = &finished;
            async move {
                let line = progress.line(job.target.display());
                let begun = Instant::now();
                let r = wait_one(client, job, opts, deadline, &line).await;
                if let Ok(mut f) = finished.lock() {
                    f[i] = true;
                }
                (r, begun.elapsed())
            }
        });
        let all = join_all(waits);
        let results = tokio::select! {
            r = all => r,
            _ = tokio::signal::ctrl_c() => {
                progress.clear();
                let done = finished.lock().map(|f| f.clone()).unwrap_or_default();
                let pending: Vec<&Job> = jobs.iter().enumerate().filter(|(i, _)| !done.get(*i).copied().unwrap_or(false)).map(|(_, j)| j).collect();
                return Err(interrupted(&pending, opts));
            }
        };
        for (job, (r, elapsed)) in jobs.into_iter().zip(results) {
            let (result, obj) = match r {
                Ok(obj) => (Ok(()), obj),
                Err(e) => (Err(e), None),
            };
            let row = ResultRow {
                outcome: Outcome::of(&result),
                message: message_of(&result, &job.goal.text),
                target: job.target,
                elapsed,
            };
            rows.push((row, result, obj));
        }
    }
    let _ = started;
    rows.sort_by(|a, b| a.0.target.cmp(&b.0.target));
    if let Some(fmt) = &opts.output {
        let objects: Vec<Value> = rows.iter().filter_map(|(_, _, o)| o.clone()).collect();
        if several {
            print_object(
                &json!({"apiVersion": "v1", "kind": "List", "items": objects, "metadata": {"resourceVersion": ""}}),
                fmt,
            )?;
        } else if let Some(o) = objects.first() {
            print_object(o, fmt)?;
        }
    }
    if !several {
        return match rows.pop() {
            Some((_, result, _)) => result,
            None => Ok(()),
        };
    }
    let table_rows: Vec<ResultRow> = rows.iter().map(|(r, _, _)| r.clone()).collect();
    let (h, c) = targets::result_cells(&table_rows);
    let table = crate::table::render(&h, &c, false);
    if opts.output.is_some() {
        eprint!("{table}");
    } else {
        print!("{table}");
    }
    let outcomes: Vec<Outcome> = table_rows.iter().map(|r| r.outcome.clone()).collect();
    let code = targets::worst_exit(&outcomes);
    match targets::summary(&table_rows) {
        Some(message) if code != EXIT_OK => Err(CliError::Several { code, message }),
        _ => Ok(()),
    }
}

/// The Ctrl-C note: what was written, and the commands that resume waiting.
fn interrupted(pending: &[&Job], opts: &Options) -> CliError {
    let program = crate::cli::display_name(&std::env::args().next().unwrap_or_default());
    let written: Vec<String> = pending
        .iter()
        .filter(|j| !j.written.is_empty())
        .map(|j| format!("{} {}", j.target.display(), j.written))
        .collect();
    let mut text = if written.is_empty() {
        "nothing was written; stopped waiting".to_string()
    } else {
        format!(
            "the write already happened ({}); the operator carries on without the plugin",
            written.join(", ")
        )
    };
    let pairs: Vec<(Target, String)> = pending
        .iter()
        .map(|j| (j.target.clone(), j.goal.text.clone()))
        .collect();
    let cmds = targets::resume_commands(program, &pairs, opts.timeout, opts.grace);
    if !cmds.is_empty() {
        text.push_str("\nresume waiting with:");
        for c in cmds {
            text.push_str("\n  ");
            text.push_str(&c);
        }
    }
    CliError::Interrupted(text)
}
