//! `logs NAME [--slot N | --toolbox T] [-f]`: a member's guest log, read through the API
//! server (`pods/log`), which the node agent answers from the VM's console log.

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
    let pod = member_pod(set, slot, toolbox);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let p = pods
        .get_opt(&pod)
        .await
        .map_err(|e| CliError::from_kube(&format!("get pod {ns}/{pod}"), e))?;
    let Some(p) = p else {
        return Err(CliError::NotFound(format!(
            "cocoonset {set} has no member pod {pod} in {ns}"
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
}
