//! Running the plugin binary against the shared control plane, and the pieces the tests that run
//! an operator controller in-process share. Each test file uses a part of it.
#![allow(dead_code)]

use std::process::Output;
use std::sync::Arc;

use cocoon_operator::registry::{OciTagRegistry, TagRegistry};
use cocoon_registry::{RegistryClient, RegistryConfig};
use kube::Client;
use kube::runtime::events::{Recorder, Reporter};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;

/// The plugin binary with the shared control plane's kubeconfig, no colour and no stdin.
pub fn plugin(env: &cocoon_testenv::Shared, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_kubectl-cocoon"));
    cmd.arg("--kubeconfig")
        .arg(env.kubeconfig_path())
        .args(args)
        .env_remove("KUBECONFIG")
        .env("NO_COLOR", "1")
        .stdin(std::process::Stdio::null());
    cmd
}

pub async fn run(env: &cocoon_testenv::Shared, args: &[&str]) -> Output {
    plugin(env, args)
        .output()
        .await
        .expect("run kubectl-cocoon")
}

/// The Event recorder an in-process operator controller writes with.
pub fn operator_recorder(client: &Client) -> Recorder {
    Recorder::new(
        client.clone(),
        Reporter {
            controller: "cocoon-operator".into(),
            instance: None,
        },
    )
}

/// The operator's tag registry on the test registry at `registry_addr`.
pub fn tag_registry(registry_addr: &str) -> Arc<dyn TagRegistry> {
    Arc::new(OciTagRegistry::new(
        RegistryClient::new(RegistryConfig::for_registry(registry_addr).expect("cfg"))
            .expect("client"),
    ))
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A pod as the CocoonSet controller makes it: set labels and the VM annotations.
pub async fn member_pod(
    pods: &Api<Pod>,
    ns: &str,
    set: &str,
    slot: &str,
) -> Result<String, kube::Error> {
    let name = format!("{set}-{slot}");
    let vm = cocoon_api::naming::vm_name_for_pod(ns, &name);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name,
            "labels": {"cocoonset.cocoonstack.io/name": set, "cocoonset.cocoonstack.io/role": "main", "cocoonset.cocoonstack.io/slot": slot},
            "annotations": {"vm.cocoonstack.io/name": vm, "vm.cocoonstack.io/lifecycle-state": "ready"}},
        "spec": {"containers": [{"name": "agent", "image": "cocoon/placeholder"}], "restartPolicy": "Never"}
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod).await?;
    Ok(vm)
}

/// A pod with nothing of cocoon on it.
pub async fn plain_pod(pods: &Api<Pod>, name: &str) -> Result<(), kube::Error> {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "web", "image": "nginx"}]}
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod).await?;
    Ok(())
}
