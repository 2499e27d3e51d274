//! The lifecycle verbs: each edits desired state (a merge patch of a spec field, or a
//! CocoonHibernation created or patched) and then waits for the phase at the new generation.
//! Several targets are all written first and then waited for together (`multi`).

use std::io::{IsTerminal, Write};

use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::idle;
use cocoon_api::crd::hibernation::{CocoonHibernation, CocoonHibernationSpec, Desire, PodRef};
use cocoon_api::crd::set::CocoonSet;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use std::sync::Arc;

use crate::before::{self, After, Before};
use crate::cli::{DryRun, Selection, WaitFlags};
use crate::dryrun::{self, Action};
use crate::error::CliError;
use crate::multi::{self, Job, set_observation};
use crate::output::print_object;
use crate::progress::Progress;
use crate::targets::{self, GoalSpec, Kind, Target, Verb};
use crate::wait::{Goal, Observation};
use crate::waiter::{WaitSpec, wait_for};

/// Annotation where `migrate`/`pin` remember the pin they replaced, for `migrate --cancel`.
pub const PREVIOUS_PIN: &str = "kubectl.cocoonstack.io/previous-node-name";
/// Value stored in [`PREVIOUS_PIN`] when there was no pin.
const NO_PIN: &str = "-";
/// How many writes (or first reads) run at once.
const WRITE_CONCURRENCY: usize = 16;

/// A lifecycle verb's targets are names, or a selection (`-l`/`-A`), never both and never
/// neither. `verb` says what the names are: CocoonSets for suspend and resume, pods for
/// hibernate, pods or `cocoonset/NAME` for wake. Pure: run before connecting, and again by
/// the verbs themselves, so none of them ever lists a whole namespace by accident.
pub fn check_selection(names: &[String], sel: &Selection, verb: Verb) -> Result<(), CliError> {
    let selected = sel.all_namespaces || sel.selector.is_some();
    match (names.is_empty(), selected) {
        (false, true) => Err(CliError::Usage("give names or -l/-A, not both".into())),
        (true, false) => Err(CliError::Usage(
            match verb {
                Verb::Wake => "name at least one pod or cocoonset/NAME (or use -l / -A)",
                Verb::Hibernate => "name at least one pod (or use -l / -A)",
                _ => "name at least one CocoonSet (or use -l / -A)",
            }
            .into(),
        )),
        _ => Ok(()),
    }
}

/// Resolves the sets a verb acts on: names, or `-l`/`-A`.
async fn target_sets(
    client: &Client,
    ns: &str,
    names: &[String],
    sel: &Selection,
) -> Result<Vec<(String, String)>, CliError> {
    check_selection(names, sel, Verb::Suspend)?;
    if !names.is_empty() {
        return Ok(names.iter().map(|n| (ns.to_string(), n.clone())).collect());
    }
    let api: Api<CocoonSet> = if sel.all_namespaces {
        Api::all(client.clone())
    } else {
        Api::namespaced(client.clone(), ns)
    };
    let mut lp = ListParams::default();
    if let Some(s) = &sel.selector {
        lp = lp.labels(s);
    }
    let list = api
        .list(&lp)
        .await
        .map_err(|e| CliError::from_kube("list cocoonsets", e))?;
    Ok(list
        .items
        .iter()
        .map(|cs| (cs.namespace().unwrap_or_default(), cs.name_any()))
        .collect())
}

/// Resolves the pods `hibernate`/`wake` act on with `-l`/`-A`: cocoon VM pods (those with a
/// VM name) matching the selector; for `wake`, only those with a CocoonHibernation.
async fn target_pods(
    client: &Client,
    ns: &str,
    sel: &Selection,
    need_hibernation: bool,
) -> Result<Vec<(String, String)>, CliError> {
    let (pods, chs): (Api<Pod>, Api<CocoonHibernation>) = if sel.all_namespaces {
        (Api::all(client.clone()), Api::all(client.clone()))
    } else {
        (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        )
    };
    let mut lp = ListParams::default();
    if let Some(s) = &sel.selector {
        lp = lp.labels(s);
    }
    let list = pods
        .list(&lp)
        .await
        .map_err(|e| CliError::from_kube("list pods", e))?;
    let hibernations: Vec<(String, String)> = if need_hibernation {
        chs.list(&ListParams::default())
            .await
            .map_err(|e| CliError::from_kube("list cocoonhibernations", e))?
            .items
            .iter()
            .map(|h| (h.namespace().unwrap_or_default(), h.name_any()))
            .collect()
    } else {
        Vec::new()
    };
    let mut out: Vec<(String, String)> = list
        .items
        .iter()
        .filter(|p| p.annotations().contains_key(ann::VM_NAME))
        .map(|p| (p.namespace().unwrap_or_default(), p.name_any()))
        .filter(|t| !need_hibernation || hibernations.contains(t))
        .collect();
    out.sort();
    Ok(out)
}

/// Asks before acting on several objects, unless `-y`; refuses without a TTY.
fn confirm(
    verb: &str,
    targets: &[(String, String)],
    multi: bool,
    yes: bool,
) -> Result<(), CliError> {
    if !multi || yes {
        return Ok(());
    }
    if !std::io::stdin().is_terminal() {
        return Err(CliError::Usage(format!(
            "{verb} would act on {} objects; pass -y/--yes to proceed without a terminal",
            targets.len()
        )));
    }
    let mut err = std::io::stderr();
    for (ns, name) in targets {
        let _ = writeln!(err, "  {ns}/{name}");
    }
    let _ = write!(err, "Do you want to proceed? [y/n] ");
    let _ = err.flush();
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer)?;
    if matches!(answer.trim(), "y" | "Y" | "yes") {
        Ok(())
    } else {
        Err(CliError::Api("aborted".into()))
    }
}

/// Every write names `--field-manager` and sends `dryRun=All` under `--dry-run=server`.
fn patch_params(flags: &WaitFlags) -> PatchParams {
    PatchParams {
        dry_run: flags.dry_run == DryRun::Server,
        field_manager: Some(flags.field_manager.clone()),
        ..Default::default()
    }
}

fn post_params(flags: &WaitFlags) -> PostParams {
    PostParams {
        dry_run: flags.dry_run == DryRun::Server,
        field_manager: Some(flags.field_manager.clone()),
    }
}

/// The wait options of a write verb. Events from before this command (less some clock skew),
/// and those already there before the write (`before`), are an earlier round's.
fn wait_options(flags: &WaitFlags, before: Option<Arc<Before>>) -> multi::Options {
    multi::Options {
        timeout: flags.timeout,
        grace: flags.failure_grace,
        output: flags.output.clone(),
        no_wait: !flags.waits(),
        after: After {
            since: Timestamp::now()
                .checked_sub(SignedDuration::from_secs(5))
                .ok(),
            before,
        },
    }
}

/// The Events of the targets' namespaces as they are before a write verb writes, when it will
/// wait (a dry run or `--wait=false` shows no Events).
async fn events_before<'a>(
    client: &Client,
    flags: &WaitFlags,
    namespaces: impl IntoIterator<Item = &'a str>,
) -> Option<Arc<Before>> {
    if flags.dry_run != DryRun::None || !flags.waits() {
        return None;
    }
    Some(Arc::new(before::read(client, namespaces).await))
}

/// What one write did: a job to wait for, a dry run's outcome (printed with the others once
/// every write is done), or an error.
type Written = Result<Wrote, (Target, CliError)>;

/// A write that succeeded.
enum Wrote {
    /// Written for real: wait for it.
    Wait(Job),
    /// A dry run: what it would have done.
    DryRun(dryrun::Shown),
}

/// Splits write outcomes (in the targets' order) into jobs, dry-run outcomes and errors.
fn sort_writes(writes: Vec<Written>) -> (Vec<Job>, Vec<dryrun::Shown>, Vec<(Target, CliError)>) {
    let mut jobs = Vec::new();
    let mut shown = Vec::new();
    let mut failed = Vec::new();
    for w in writes {
        match w {
            Ok(Wrote::Wait(j)) => jobs.push(j),
            Ok(Wrote::DryRun(s)) => shown.push(s),
            Err(e) => failed.push(e),
        }
    }
    (jobs, shown, failed)
}

/// Writes `spec.suspend` of one set (or prints it for a client dry run).
async fn write_suspend(
    client: &Client,
    tns: &str,
    name: &str,
    suspend: bool,
    goal: &GoalSpec,
    flags: &WaitFlags,
) -> Written {
    let target = Target::new(Kind::CocoonSet, tns, name);
    let api: Api<CocoonSet> = Api::namespaced(client.clone(), tns);
    let fail = |e| (target.clone(), e);
    let cs = api.get(name).await.map_err(|e| {
        fail(CliError::from_kube(
            &format!("get cocoonset {tns}/{name}"),
            e,
        ))
    })?;
    // The user's suspend or resume owns the set's suspend: the idle mark goes with it, so no
    // connection or exec wakes what the user suspended (issue 39), and suspending an
    // idle-suspended set makes it the user's.
    let idle_marked = cs.annotations().contains_key(idle::IDLE_SUSPENDED);
    let mut patch = json!({"spec": {"suspend": suspend}});
    if idle_marked {
        patch["metadata"] = idle::user_owns_suspend_patch()["metadata"].clone();
    }
    let unchanged = cs.spec.suspend == suspend && !idle_marked;
    if flags.dry_run == DryRun::Client {
        let shown = dryrun::Shown::client_patch(&cs, &patch, unchanged).map_err(fail)?;
        return Ok(Wrote::DryRun(shown));
    }
    let (generation, written) = if unchanged {
        eprintln!(
            "cocoonset {name} already {}",
            if suspend { "suspended" } else { "resumed" }
        );
        if flags.dry_run == DryRun::Server {
            return Ok(Wrote::DryRun(
                dryrun::Shown::of(&cs, Action::Unchanged).map_err(fail)?,
            ));
        }
        (cs.metadata.generation.unwrap_or(0), String::new())
    } else {
        let after = api
            .patch(name, &patch_params(flags), &Patch::Merge(&patch))
            .await
            .map_err(|e| {
                fail(CliError::from_kube(
                    &format!("patch cocoonset {tns}/{name}"),
                    e,
                ))
            })?;
        if flags.dry_run == DryRun::Server {
            return Ok(Wrote::DryRun(
                dryrun::Shown::of(&after, Action::Patched).map_err(fail)?,
            ));
        }
        (
            after.metadata.generation.unwrap_or(0),
            format!("spec.suspend={suspend}"),
        )
    };
    Ok(Wrote::Wait(Job {
        target,
        goal: goal.clone(),
        generation,
        written,
    }))
}

/// Finishes a write verb: a dry run ends with its first error; otherwise wait for every job.
async fn conclude(
    client: &Client,
    writes: Vec<Written>,
    flags: &WaitFlags,
    before: Option<Arc<Before>>,
) -> Result<(), CliError> {
    let (jobs, shown, failed) = sort_writes(writes);
    if flags.dry_run != DryRun::None {
        // Every outcome, in the targets' order (one List with -o json|yaml), then the first
        // error is the command's.
        dryrun::print_all(&shown, flags)?;
        return match failed.into_iter().next() {
            Some((_, e)) => Err(e),
            None => Ok(()),
        };
    }
    multi::wait_all(client, jobs, failed, &wait_options(flags, before)).await
}

/// `suspend` (true) or `resume` (false) of CocoonSets.
pub async fn set_suspend(
    client: &Client,
    ns: &str,
    names: &[String],
    sel: &Selection,
    suspend: bool,
    flags: &WaitFlags,
) -> Result<(), CliError> {
    let verb = if suspend { Verb::Suspend } else { Verb::Resume };
    let goal = targets::goal_for(verb, Kind::CocoonSet, flags.until.as_deref())?;
    let targets = target_sets(client, ns, names, sel).await?;
    if targets.is_empty() {
        return Err(CliError::NotFound("no CocoonSet matched".into()));
    }
    let multi = targets.len() > 1 || sel.selector.is_some() || sel.all_namespaces;
    if flags.dry_run == DryRun::None {
        confirm(
            if suspend { "suspend" } else { "resume" },
            &targets,
            multi,
            flags.yes,
        )?;
    }
    let before = events_before(client, flags, targets.iter().map(|(tns, _)| tns.as_str())).await;
    let writes: Vec<Written> = futures::stream::iter(targets.iter())
        .map(|(tns, name)| write_suspend(client, tns, name, suspend, &goal, flags))
        .buffered(WRITE_CONCURRENCY)
        .collect()
        .await;
    conclude(client, writes, flags, before).await
}

/// Sets `desire` on one pod's CocoonHibernation (created, named after the pod, if missing).
async fn write_desire(
    client: &Client,
    ns: &str,
    pod: &str,
    desire: Desire,
    goal: &GoalSpec,
    flags: &WaitFlags,
) -> Written {
    let target = Target::new(Kind::Pod, ns, pod);
    let fail = |e| (target.clone(), e);
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let api: Api<CocoonHibernation> = Api::namespaced(client.clone(), ns);
    pod_api
        .get(pod)
        .await
        .map_err(|e| fail(CliError::from_kube(&format!("get pod {ns}/{pod}"), e)))?;
    let existing = api.get_opt(pod).await.map_err(|e| {
        fail(CliError::from_kube(
            &format!("get cocoonhibernation {ns}/{pod}"),
            e,
        ))
    })?;
    let written = format!("spec.desire={}", desire.as_str());
    let (generation, written) = match (&existing, flags.dry_run) {
        (Some(ch), DryRun::Client) => {
            let patch = json!({"spec": {"desire": desire.as_str()}});
            let shown =
                dryrun::Shown::client_patch(ch, &patch, ch.spec.desire == desire).map_err(fail)?;
            return Ok(Wrote::DryRun(shown));
        }
        (None, DryRun::Client) => {
            let mut obj = new_hibernation(pod, desire);
            obj.metadata.namespace = Some(ns.to_string());
            return Ok(Wrote::DryRun(
                dryrun::Shown::of(&obj, Action::Created).map_err(fail)?,
            ));
        }
        (Some(ch), _) if ch.spec.desire == desire => {
            eprintln!("cocoonhibernation {pod} already wants {}", desire.as_str());
            if flags.dry_run == DryRun::Server {
                return Ok(Wrote::DryRun(
                    dryrun::Shown::of(ch, Action::Unchanged).map_err(fail)?,
                ));
            }
            (ch.metadata.generation.unwrap_or(0), String::new())
        }
        (Some(_), _) => {
            let patch = json!({"spec": {"desire": desire.as_str()}});
            let after = api
                .patch(pod, &patch_params(flags), &Patch::Merge(&patch))
                .await
                .map_err(|e| {
                    fail(CliError::from_kube(
                        &format!("patch cocoonhibernation {ns}/{pod}"),
                        e,
                    ))
                })?;
            if flags.dry_run == DryRun::Server {
                return Ok(Wrote::DryRun(
                    dryrun::Shown::of(&after, Action::Patched).map_err(fail)?,
                ));
            }
            (after.metadata.generation.unwrap_or(0), written)
        }
        (None, _) => {
            let after = api
                .create(&post_params(flags), &new_hibernation(pod, desire))
                .await
                .map_err(|e| {
                    fail(CliError::from_kube(
                        &format!("create cocoonhibernation {ns}/{pod}"),
                        e,
                    ))
                })?;
            if flags.dry_run == DryRun::Server {
                return Ok(Wrote::DryRun(
                    dryrun::Shown::of(&after, Action::Created).map_err(fail)?,
                ));
            }
            (
                after.metadata.generation.unwrap_or(0),
                format!("created cocoonhibernation with {written}"),
            )
        }
    };
    Ok(Wrote::Wait(Job {
        target,
        goal: goal.clone(),
        generation,
        written,
    }))
}

/// `hibernate POD…` (Hibernate) and `wake POD…` (Wake) through CocoonHibernations named after
/// their pods; `wake cocoonset/NAME` resumes sets in the same run. Pods may also be selected
/// with `-l`/`-A`.
pub async fn pods_and_sets(
    client: &Client,
    ns: &str,
    args: &[String],
    sel: &Selection,
    desire: Desire,
    flags: &WaitFlags,
) -> Result<(), CliError> {
    let verb = match desire {
        Desire::Hibernate => Verb::Hibernate,
        Desire::Wake => Verb::Wake,
    };
    let word = desire.as_str().to_lowercase();
    let mut sets: Vec<(String, String)> = Vec::new();
    let mut pods: Vec<(String, String)> = Vec::new();
    check_selection(args, sel, verb)?;
    if !args.is_empty() {
        for a in args {
            match targets::parse_target(a, Kind::Pod)? {
                (Kind::CocoonSet, _) if verb == Verb::Hibernate => {
                    return Err(CliError::Usage(format!(
                        "hibernate {a:?}: hibernate acts on pods (use suspend for a CocoonSet)"
                    )));
                }
                (Kind::CocoonSet, n) => sets.push((ns.to_string(), n)),
                (Kind::Pod, n) => pods.push((ns.to_string(), n)),
            }
        }
    } else if sel.all_namespaces || sel.selector.is_some() {
        pods = target_pods(client, ns, sel, verb == Verb::Wake).await?;
        if pods.is_empty() {
            return Err(CliError::NotFound("no cocoon pod matched".into()));
        }
    }
    // `--until` must be a phase of each kind it applies to (only the kinds named).
    let goal = |kind: Kind, none: bool| {
        if none {
            Ok(None)
        } else {
            targets::goal_for(verb, kind, flags.until.as_deref()).map(Some)
        }
    };
    let set_goal = goal(Kind::CocoonSet, sets.is_empty())?;
    let pod_goal = goal(Kind::Pod, pods.is_empty())?;
    let all: Vec<(String, String)> = sets.iter().chain(pods.iter()).cloned().collect();
    let multi = all.len() > 1 || sel.selector.is_some() || sel.all_namespaces;
    if flags.dry_run == DryRun::None {
        confirm(&word, &all, multi, flags.yes)?;
    }
    let before = events_before(client, flags, all.iter().map(|(tns, _)| tns.as_str())).await;
    let mut writes: Vec<Written> = Vec::new();
    if let Some(goal) = &set_goal {
        writes.extend(
            futures::stream::iter(sets.iter())
                .map(|(tns, name)| write_suspend(client, tns, name, false, goal, flags))
                .buffered(WRITE_CONCURRENCY)
                .collect::<Vec<_>>()
                .await,
        );
    }
    if let Some(goal) = &pod_goal {
        writes.extend(
            futures::stream::iter(pods.iter())
                .map(|(tns, pod)| write_desire(client, tns, pod, desire, goal, flags))
                .buffered(WRITE_CONCURRENCY)
                .collect::<Vec<_>>()
                .await,
        );
    }
    conclude(client, writes, flags, before).await
}

fn new_hibernation(pod: &str, desire: Desire) -> CocoonHibernation {
    CocoonHibernation::new(
        pod,
        CocoonHibernationSpec {
            pod_ref: PodRef {
                name: pod.to_string(),
            },
            desire,
        },
    )
}

/// `wait TARGET… --for=PHASE`: read-only; the same waiter, deadline and exit codes as the
/// verbs. The generation to judge is the object's current one.
pub async fn wait(
    client: &Client,
    ns: &str,
    args: &[String],
    wanted: &str,
    opts: multi::Options,
) -> Result<(), CliError> {
    if args.is_empty() {
        return Err(CliError::Usage(crate::cli::WAIT_NEEDS_A_TARGET.into()));
    }
    let mut parsed = Vec::new();
    for a in args {
        let (kind, name) = targets::parse_target(a, Kind::CocoonSet)?;
        let goal = targets::goal_for(Verb::Wait, kind, Some(wanted))?;
        parsed.push((Target::new(kind, ns, &name), goal));
    }
    let reads: Vec<Written> = futures::stream::iter(parsed)
        .map(|(target, goal)| async move {
            let fail = |e| (target.clone(), e);
            let generation = match target.kind {
                Kind::CocoonSet => Api::<CocoonSet>::namespaced(client.clone(), ns)
                    .get(&target.name)
                    .await
                    .map_err(|e| {
                        fail(CliError::from_kube(
                            &format!("get cocoonset {ns}/{}", target.name),
                            e,
                        ))
                    })?
                    .metadata
                    .generation
                    .unwrap_or(0),
                Kind::Pod => {
                    let ch = Api::<CocoonHibernation>::namespaced(client.clone(), ns)
                        .get_opt(&target.name)
                        .await
                        .map_err(|e| {
                            fail(CliError::from_kube(
                                &format!("get cocoonhibernation {ns}/{}", target.name),
                                e,
                            ))
                        })?;
                    match ch {
                        Some(ch) => ch.metadata.generation.unwrap_or(0),
                        None => {
                            Api::<Pod>::namespaced(client.clone(), ns)
                                .get(&target.name)
                                .await
                                .map_err(|e| {
                                    fail(CliError::from_kube(
                                        &format!("get pod {ns}/{}", target.name),
                                        e,
                                    ))
                                })?;
                            0
                        }
                    }
                }
            };
            Ok(Wrote::Wait(Job {
                target,
                goal,
                generation,
                written: String::new(),
            }))
        })
        .buffered(WRITE_CONCURRENCY)
        .collect()
        .await;
    let (jobs, _, failed) = sort_writes(reads);
    multi::wait_all(client, jobs, failed, &opts).await
}

/// Waits for one set after a pin change (a single target, with its own progress line).
async fn finish<F, Fut>(
    api: &Api<CocoonSet>,
    flags: &WaitFlags,
    spec: WaitSpec<'_>,
    observe: F,
) -> Result<(), CliError>
where
    F: Fn(Option<CocoonSet>) -> Fut,
    Fut: Future<Output = Result<(Option<CocoonSet>, Observation), CliError>>,
{
    if !flags.waits() {
        if let Some(fmt) = &flags.output
            && let Some(o) = api
                .get_opt(spec.name)
                .await
                .map_err(|e| CliError::from_kube(spec.kind, e))?
        {
            print_object(&o, fmt)?;
        }
        return Ok(());
    }
    let progress = Progress::new();
    let line = progress.line(format!("{}/{}", spec.kind, spec.name));
    let done = wait_for(api, spec, &line, observe).await?;
    if let (Some(fmt), Some(done)) = (&flags.output, done) {
        print_object(&done, fmt)?;
    }
    Ok(())
}

/// `migrate --to` / `pin` (Some(node)), `unpin` (None), `migrate --cancel` (restore).
pub enum PinChange {
    To(String),
    Unpin,
    Cancel,
}

/// Checks that the node a pin names exists. Nodes are cluster-scoped, so a user whose rights
/// come from a RoleBinding (cocoon-edit in one namespace) may not read them: then the pin goes
/// ahead unchecked, with a warning, and the wait reports a node the operator cannot use. A node
/// that is not there (404) is still refused.
async fn check_node(client: &Client, node: &str) -> Result<(), CliError> {
    match Api::<Node>::all(client.clone()).get(node).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 403 => {
            eprintln!(
                "warning: cannot check that node {node} exists (get nodes is forbidden: nodes are cluster-scoped); pinning to it unchecked"
            );
            Ok(())
        }
        Err(e) => Err(CliError::from_kube(&format!("get node {node}"), e)),
    }
}

pub async fn pin(
    client: &Client,
    ns: &str,
    name: &str,
    change: PinChange,
    flags: &WaitFlags,
) -> Result<(), CliError> {
    let api: Api<CocoonSet> = Api::namespaced(client.clone(), ns);
    let cs = api
        .get(name)
        .await
        .map_err(|e| CliError::from_kube(&format!("get cocoonset {ns}/{name}"), e))?;
    let current = cs.spec.node_name.clone();
    let target: Option<String> = match &change {
        PinChange::To(node) => {
            check_node(client, node).await?;
            Some(node.clone())
        }
        PinChange::Unpin => None,
        PinChange::Cancel => match cs.annotations().get(PREVIOUS_PIN).map(String::as_str) {
            None => {
                return Err(CliError::Api(format!(
                    "cocoonset {name}: no previous pin recorded (only a pin made by migrate/pin can be cancelled)"
                )));
            }
            Some(NO_PIN) | Some("") => None,
            Some(prev) => Some(prev.to_string()),
        },
    };
    let wanted = target.clone().unwrap_or_default();
    let mut patch =
        json!({"spec": {"nodeName": if wanted.is_empty() { Value::Null } else { json!(wanted) }}});
    if matches!(change, PinChange::To(_)) && current != wanted {
        let prev = if current.is_empty() {
            NO_PIN.to_string()
        } else {
            current.clone()
        };
        patch["metadata"] = json!({"annotations": {PREVIOUS_PIN: prev}});
    }
    if matches!(change, PinChange::Cancel) {
        patch["metadata"] = json!({"annotations": {PREVIOUS_PIN: null}});
    }
    let unchanged = current == wanted && !matches!(change, PinChange::Cancel);
    if flags.dry_run == DryRun::Client {
        return dryrun::report_client_patch(&cs, &patch, unchanged, flags);
    }
    let before = if unchanged {
        None
    } else {
        events_before(client, flags, [ns]).await
    };
    let generation = if unchanged {
        eprintln!(
            "cocoonset {name} already pinned to {}",
            if wanted.is_empty() {
                "no node"
            } else {
                &wanted
            }
        );
        if flags.dry_run == DryRun::Server {
            return dryrun::report(&cs, Action::Unchanged, flags);
        }
        cs.metadata.generation.unwrap_or(0)
    } else {
        let after = api
            .patch(name, &patch_params(flags), &Patch::Merge(&patch))
            .await
            .map_err(|e| CliError::from_kube(&format!("patch cocoonset {ns}/{name}"), e))?;
        if flags.dry_run == DryRun::Server {
            return dryrun::report(&after, Action::Patched, flags);
        }
        after.metadata.generation.unwrap_or(0)
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let main = cocoon_api::naming::pod_name_for_agent(name, 0);
    let (goal, goal_text) = match &target {
        Some(node) => (
            Goal::Migrated { node: node.clone() },
            format!("migrated to {node}"),
        ),
        None => (Goal::Observed, "observed".to_string()),
    };
    finish(
        &api,
        flags,
        WaitSpec {
            kind: "cocoonset",
            name,
            goal,
            goal_text,
            generation,
            deadline: tokio::time::Instant::now() + flags.timeout,
            timeout: flags.timeout,
            grace: flags.failure_grace,
            warnings: Some(crate::waiter::Warnings {
                api: Api::namespaced(client.clone(), ns),
                objects: vec![("CocoonSet", name.to_string())],
                after: wait_options(flags, before).after,
            }),
        },
        |o| {
            let pods = pods.clone();
            let main = main.clone();
            async move {
                let mut obs = set_observation(o.as_ref());
                if let Ok(Some(p)) = pods.get_opt(&main).await {
                    obs.main_node = p
                        .spec
                        .as_ref()
                        .and_then(|s| s.node_name.clone())
                        .unwrap_or_default();
                    obs.main_has_vm = p
                        .annotations()
                        .get(cocoon_api::contract::annotations::VM_ID)
                        .is_some_and(|v| !v.is_empty());
                }
                Ok((o, obs))
            }
        },
    )
    .await
}
