//! `logs NAME [--slot N | --toolbox T] [-f]`: a member's guest log, read through the API
//! server (`pods/log`), which the node agent answers from the VM's console log.

use cocoon_api::{CocoonSet, CocoonSetSpec};
use futures::{AsyncBufReadExt, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, LogParams};

use crate::error::CliError;

/// The pod of a set's member: agent slot N (main: 0, the default) or toolbox T.
pub fn member_pod(set: &str, slot: Option<i32>, toolbox: Option<&str>) -> String {
    match toolbox {
        Some(t) => cocoon_api::naming::pod_name_for_toolbox(set, t),
        None => cocoon_api::naming::pod_name_for_agent(set, slot.unwrap_or(0)),
    }
}

/// Checks `--slot` / `--toolbox` against the set's spec (`replicas` sub-agents, so slots
/// `0..=replicas`; the toolboxes by name) and returns the member's pod name. A member the
/// spec does not have is a usage error naming the flag and what the set has.
pub fn resolve_member(
    set: &str,
    spec: &CocoonSetSpec,
    slot: Option<i32>,
    toolbox: Option<&str>,
) -> Result<String, CliError> {
    if let Some(t) = toolbox {
        if spec.toolboxes.iter().any(|tb| tb.name == t) {
            return Ok(member_pod(set, None, Some(t)));
        }
        let names: Vec<&str> = spec.toolboxes.iter().map(|tb| tb.name.as_str()).collect();
        let has = if names.is_empty() {
            "no toolboxes".to_owned()
        } else {
            format!("toolboxes {}", names.join(", "))
        };
        return Err(CliError::Usage(format!(
            "--toolbox {t}: cocoonset {set} has no such toolbox (it has {has})"
        )));
    }
    let slot = slot.unwrap_or(0);
    let last = spec.agent.replicas.max(0);
    if !(0..=last).contains(&slot) {
        let range = if last == 0 {
            "only slot 0, the main agent".to_owned()
        } else {
            format!("slots 0 (the main agent) to {last}")
        };
        return Err(CliError::Usage(format!(
            "--slot {slot}: cocoonset {set} has {range}"
        )));
    }
    Ok(member_pod(set, Some(slot), None))
}

/// Prints the member's log (following it with `follow`) on stdout.
pub async fn run(
    client: &Client,
    ns: &str,
    set: &str,
    slot: Option<i32>,
    toolbox: Option<&str>,
    follow: bool,
    tail: Option<i64>,
) -> Result<(), CliError> {
    if let Some(n) = tail.filter(|n| *n < 0) {
        return Err(CliError::Usage(format!(
            "--tail {n}: must be 0 or more lines"
        )));
    }
    let sets: Api<CocoonSet> = Api::namespaced(client.clone(), ns);
    let cs = sets
        .get_opt(set)
        .await
        .map_err(|e| CliError::from_kube(&format!("get cocoonset {ns}/{set}"), e))?
        .ok_or_else(|| {
            CliError::NotFound(format!(
                "cocoonsets.cocoonset.cocoonstack.io \"{set}\" not found in namespace {ns}"
            ))
        })?;
    let pod = resolve_member(set, &cs.spec, slot, toolbox)?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let p = pods
        .get_opt(&pod)
        .await
        .map_err(|e| CliError::from_kube(&format!("get pod {ns}/{pod}"), e))?;
    let Some(p) = p else {
        return Err(CliError::NotFound(format!(
            "cocoonset {set} has no member pod {pod} in {ns} (suspended with hibernatePolicy release, or not created yet)"
        )));
    };
    let container = p
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .map(|c| c.name.clone());
    let lp = LogParams {
        container,
        follow,
        tail_lines: tail,
        ..Default::default()
    };
    let what = format!("logs of pod {ns}/{pod}");
    let stream = pods
        .log_stream(&pod, &lp)
        .await
        .map_err(|e| CliError::from_kube(&what, e))?;
    let mut lines = stream.lines();
    while let Some(line) = lines.next().await {
        let line = line.map_err(|e| CliError::Api(format!("{what}: {e}")))?;
        println!("{line}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_resolve_to_their_pods() {
        assert_eq!(member_pod("demo", None, None), "demo-0");
        assert_eq!(member_pod("demo", Some(2), None), "demo-2");
        assert_eq!(member_pod("demo", None, Some("browser")), "demo-browser");
    }

    #[test]
    fn members_are_checked_against_the_spec() {
        let mut spec = CocoonSetSpec::with_image("img");
        spec.agent.replicas = 2;
        spec.toolboxes = vec![cocoon_api::crd::set::ToolboxSpec {
            name: "browser".into(),
            ..Default::default()
        }];
        let ok = |slot, tb| resolve_member("demo", &spec, slot, tb).map_err(|e| e.to_string());
        assert_eq!(ok(None, None), Ok("demo-0".into()));
        assert_eq!(ok(Some(2), None), Ok("demo-2".into()));
        assert_eq!(ok(None, Some("browser")), Ok("demo-browser".into()));
        assert_eq!(
            ok(Some(3), None),
            Err("--slot 3: cocoonset demo has slots 0 (the main agent) to 2".into())
        );
        assert_eq!(
            ok(Some(-1), None),
            Err("--slot -1: cocoonset demo has slots 0 (the main agent) to 2".into())
        );
        assert_eq!(
            ok(None, Some("db")),
            Err(
                "--toolbox db: cocoonset demo has no such toolbox (it has toolboxes browser)"
                    .into()
            )
        );
        let lone = CocoonSetSpec::with_image("img");
        let err = resolve_member("one", &lone, Some(1), None).unwrap_err();
        assert_eq!(err.exit_code(), crate::error::EXIT_USAGE);
        assert_eq!(
            err.to_string(),
            "--slot 1: cocoonset one has only slot 0, the main agent"
        );
    }
}
