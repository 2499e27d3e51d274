//! The lifecycle verbs: each edits desired state (a merge patch of a spec field, or a
//! CocoonHibernation created or patched) and then waits for the phase at the new generation.

use std::io::{IsTerminal, Write};

use cocoon_api::crd::hibernation::{CocoonHibernation, CocoonHibernationSpec, Desire, PodRef};
use cocoon_api::crd::set::CocoonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::cli::{DryRun, Selection, WaitFlags};
use crate::dryrun::{self, Action};
use crate::error::CliError;
use crate::output::print_object;
use crate::wait::{Goal, Observation};
use crate::waiter::{WaitSpec, wait_for};

/// Annotation where `migrate`/`pin` remember the pin they replaced, for `migrate --cancel`.
pub const PREVIOUS_PIN: &str = "kubectl.cocoonstack.io/previous-node-name";
/// Value stored in [`PREVIOUS_PIN`] when there was no pin.
const NO_PIN: &str = "-";

fn set_observation(cs: Option<&CocoonSet>) -> Observation {
    let Some(cs) = cs else {
        return Observation::default();
    };
    let st = cs.status.clone().unwrap_or_default();
    let ready_message = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.message.clone())
        .unwrap_or_default();
    Observation {
        exists: true,
        generation: cs.metadata.generation.unwrap_or(0),
        observed_generation: st.observed_generation,
        phase: st.phase.map(|p| p.as_str().to_string()).unwrap_or_default(),
        ready_message,
        ..Default::default()
    }
}

fn hibernation_observation(ch: Option<&CocoonHibernation>) -> Observation {
    let Some(ch) = ch else {
        return Observation::default();
    };
    let st = ch.status.clone().unwrap_or_default();
    Observation {
        exists: true,
        generation: ch.metadata.generation.unwrap_or(0),
        observed_generation: st.observed_generation,
        phase: st.phase.map(|p| p.as_str().to_string()).unwrap_or_default(),
        ready_message: st
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| c.message.clone())
            .unwrap_or_default(),
        ..Default::default()
    }
}

/// Resolves the sets a verb acts on: names, or `-l`/`-A`.
async fn target_sets(
    client: &Client,
    ns: &str,
    names: &[String],
    sel: &Selection,
) -> Result<Vec<(String, String)>, CliError> {
    if !names.is_empty() {
        if sel.all_namespaces || sel.selector.is_some() {
            return Err(CliError::Usage("give names or -l/-A, not both".into()));
        }
        return Ok(names.iter().map(|n| (ns.to_string(), n.clone())).collect());
    }
    if sel.selector.is_none() && !sel.all_namespaces {
        return Err(CliError::Usage(
            "name at least one CocoonSet (or use -l / -A)".into(),
        ));
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

/// `suspend` (true) or `resume` (false) of CocoonSets.
pub async fn set_suspend(
    client: &Client,
    ns: &str,
    names: &[String],
    sel: &Selection,
    suspend: bool,
    flags: &WaitFlags,
) -> Result<(), CliError> {
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
    for (tns, name) in &targets {
        let api: Api<CocoonSet> = Api::namespaced(client.clone(), tns);
        let cs = api
            .get(name)
            .await
            .map_err(|e| CliError::from_kube(&format!("get cocoonset {tns}/{name}"), e))?;
        let patch = json!({"spec": {"suspend": suspend}});
        let unchanged = cs.spec.suspend == suspend;
        if flags.dry_run == DryRun::Client {
            dryrun::report_client_patch(&cs, &patch, unchanged, flags)?;
            continue;
        }
        let generation = if unchanged {
            eprintln!(
                "cocoonset {name} already {}",
                if suspend { "suspended" } else { "resumed" }
            );
            if flags.dry_run == DryRun::Server {
                dryrun::report(&cs, Action::Unchanged, flags)?;
                continue;
            }
            cs.metadata.generation.unwrap_or(0)
        } else {
            let after = api
                .patch(name, &patch_params(flags), &Patch::Merge(&patch))
                .await
                .map_err(|e| CliError::from_kube(&format!("patch cocoonset {tns}/{name}"), e))?;
            if flags.dry_run == DryRun::Server {
                dryrun::report(&after, Action::Patched, flags)?;
                continue;
            }
            after.metadata.generation.unwrap_or(0)
        };
        let goal_phase = flags
            .until
            .clone()
            .unwrap_or_else(|| if suspend { "Suspended" } else { "Running" }.to_string());
        finish(
            &api,
            flags,
            WaitSpec {
                kind: "cocoonset",
                name,
                goal: Goal::Phase(vec![goal_phase.clone()]),
                goal_text: goal_phase,
                generation,
                timeout: flags.timeout,
                grace: flags.failure_grace,
            },
            |o| async move {
                let obs = set_observation(o.as_ref());
                Ok((o, obs))
            },
        )
        .await?;
    }
    Ok(())
}

async fn finish<K, F, Fut>(
    api: &Api<K>,
    flags: &WaitFlags,
    spec: WaitSpec<'_>,
    observe: F,
) -> Result<(), CliError>
where
    K: kube::Resource
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug
        + Send
        + 'static,
    F: Fn(Option<K>) -> Fut,
    Fut: Future<Output = Result<(Option<K>, Observation), CliError>>,
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
    let done = wait_for(api, spec, observe).await?;
    if let Some(fmt) = &flags.output {
        print_object(&done, fmt)?;
    }
    Ok(())
}

/// `hibernate POD…` (Hibernate) and `wake POD…` (Wake) through CocoonHibernations named after
/// their pods.
pub async fn pod_desire(
    client: &Client,
    ns: &str,
    pods: &[String],
    desire: Desire,
    flags: &WaitFlags,
) -> Result<(), CliError> {
    if pods.is_empty() {
        return Err(CliError::Usage("name at least one pod".into()));
    }
    let targets: Vec<(String, String)> = pods.iter().map(|p| (ns.to_string(), p.clone())).collect();
    if flags.dry_run == DryRun::None {
        confirm(
            &desire.as_str().to_lowercase(),
            &targets,
            targets.len() > 1,
            flags.yes,
        )?;
    }
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let api: Api<CocoonHibernation> = Api::namespaced(client.clone(), ns);
    for pod in pods {
        pod_api
            .get(pod)
            .await
            .map_err(|e| CliError::from_kube(&format!("get pod {ns}/{pod}"), e))?;
        let existing = api
            .get_opt(pod)
            .await
            .map_err(|e| CliError::from_kube(&format!("get cocoonhibernation {ns}/{pod}"), e))?;
        let patch = json!({"spec": {"desire": desire.as_str()}});
        let generation = match (&existing, flags.dry_run) {
            (Some(ch), DryRun::Client) => {
                dryrun::report_client_patch(ch, &patch, ch.spec.desire == desire, flags)?;
                continue;
            }
            (None, DryRun::Client) => {
                let mut obj = new_hibernation(pod, desire);
                obj.metadata.namespace = Some(ns.to_string());
                dryrun::report(&obj, Action::Created, flags)?;
                continue;
            }
            (Some(ch), _) if ch.spec.desire == desire => {
                eprintln!("cocoonhibernation {pod} already wants {}", desire.as_str());
                if flags.dry_run == DryRun::Server {
                    dryrun::report(ch, Action::Unchanged, flags)?;
                    continue;
                }
                ch.metadata.generation.unwrap_or(0)
            }
            (Some(_), _) => {
                let after = api
                    .patch(pod, &patch_params(flags), &Patch::Merge(&patch))
                    .await
                    .map_err(|e| {
                        CliError::from_kube(&format!("patch cocoonhibernation {ns}/{pod}"), e)
                    })?;
                if flags.dry_run == DryRun::Server {
                    dryrun::report(&after, Action::Patched, flags)?;
                    continue;
                }
                after.metadata.generation.unwrap_or(0)
            }
            (None, _) => {
                let after = api
                    .create(&post_params(flags), &new_hibernation(pod, desire))
                    .await
                    .map_err(|e| {
                        CliError::from_kube(&format!("create cocoonhibernation {ns}/{pod}"), e)
                    })?;
                if flags.dry_run == DryRun::Server {
                    dryrun::report(&after, Action::Created, flags)?;
                    continue;
                }
                after.metadata.generation.unwrap_or(0)
            }
        };
        let goal_phase = flags.until.clone().unwrap_or_else(|| {
            match desire {
                Desire::Hibernate => "Hibernated",
                Desire::Wake => "Active",
            }
            .to_string()
        });
        finish(
            &api,
            flags,
            WaitSpec {
                kind: "cocoonhibernation",
                name: pod,
                goal: Goal::Phase(vec![goal_phase.clone()]),
                goal_text: goal_phase,
                generation,
                timeout: flags.timeout,
                grace: flags.failure_grace,
            },
            |o| async move {
                let obs = hibernation_observation(o.as_ref());
                Ok((o, obs))
            },
        )
        .await?;
    }
    Ok(())
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

/// `wake` targets: `cocoonset/NAME` resumes a set; anything else is a pod.
pub fn split_wake_targets(targets: &[String]) -> Result<(Vec<String>, Vec<String>), CliError> {
    let mut sets = Vec::new();
    let mut pods = Vec::new();
    for t in targets {
        match t.split_once('/') {
            Some(("cocoonset" | "cocoonsets" | "cs", name)) if !name.is_empty() => {
                sets.push(name.to_string())
            }
            Some(("pod" | "pods" | "po", name)) if !name.is_empty() => pods.push(name.to_string()),
            Some((kind, _)) => {
                return Err(CliError::Usage(format!(
                    "wake {t:?}: unknown kind {kind:?} (use POD, pod/POD or cocoonset/NAME)"
                )));
            }
            None => pods.push(t.clone()),
        }
    }
    if sets.is_empty() && pods.is_empty() {
        return Err(CliError::Usage(
            "name at least one pod or cocoonset/NAME".into(),
        ));
    }
    Ok((sets, pods))
}

/// `migrate --to` / `pin` (Some(node)), `unpin` (None), `migrate --cancel` (restore).
pub enum PinChange {
    To(String),
    Unpin,
    Cancel,
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
            let nodes: Api<Node> = Api::all(client.clone());
            nodes
                .get(node)
                .await
                .map_err(|e| CliError::from_kube(&format!("get node {node}"), e))?;
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
            timeout: flags.timeout,
            grace: flags.failure_grace,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wake_targets_split_by_kind() {
        let t =
            |v: &[&str]| split_wake_targets(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let (sets, pods) =
            t(&["cocoonset/demo", "demo-1", "pod/demo-2", "cs/other"]).expect("valid");
        assert_eq!(sets, ["demo", "other"]);
        assert_eq!(pods, ["demo-1", "demo-2"]);
        assert!(matches!(t(&["deployment/x"]), Err(CliError::Usage(_))));
        assert!(matches!(t(&[]), Err(CliError::Usage(_))));
    }
}
