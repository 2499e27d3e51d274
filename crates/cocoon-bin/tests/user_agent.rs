//! The binaries name themselves to the API server: the real `cocoon-operator run` and
//! `cocoon-operator node` run with tokens of fresh ServiceAccounts of `cocoon-system` (whose
//! requests the test environment's API server audits), and every request the audit log records
//! for each carries `cocoon-operator/<version>` or `cocoon-node/<version>` as its User-Agent.
//! The accounts have no roles: the requests are refused, and audited all the same, so nothing
//! here touches what other tests use (Leases, Nodes).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use cocoon_testenv::{AuditLog, Shared, unique_name};
use cocoon_testsupport::BoxError;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};

const WAIT: Duration = Duration::from_secs(60);
const SA_NAMESPACE: &str = "cocoon-system";

async fn create_service_account(client: &kube::Client, name: &str) -> Result<(), BoxError> {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), SA_NAMESPACE);
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    api.create(&PostParams::default(), &sa).await?;
    Ok(())
}

/// Waits until the audit log holds requests of `sa`, then returns their User-Agents.
async fn user_agents_of(log: &AuditLog, sa: &str) -> Result<BTreeSet<String>, BoxError> {
    let user = format!("system:serviceaccount:{SA_NAMESPACE}:{sa}");
    let agents = cocoon_testenv::wait_until(&format!("audited requests of {user}"), WAIT, || {
        let records = log.records_of(&user);
        async move {
            let records = records.ok()?;
            (!records.is_empty()).then(|| {
                records
                    .into_iter()
                    .map(|r| r.user_agent)
                    .collect::<BTreeSet<_>>()
            })
        }
    })
    .await?;
    Ok(agents)
}

fn spawn(
    mode: &str,
    kubeconfig: &Path,
    envs: &[(&str, &str)],
) -> Result<tokio::process::Child, BoxError> {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_cocoon-operator"));
    cmd.arg(mode).env("KUBECONFIG", kubeconfig);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    Ok(cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?)
}

#[tokio::test]
async fn operator_and_node_agent_requests_carry_their_user_agents() {
    cocoon_testenv::run_test(|env: &'static Shared| async move {
        let log = env
            .audit_log()
            .ok_or("the audit log is unknown (set TESTENV_RUN_DIR for an external env)")?;
        let admin = env.client()?;
        cocoon_testenv::ensure_namespace(&admin, SA_NAMESPACE).await?;
        let ns = cocoon_testenv::create_namespace(&admin, "user-agent").await?;
        let operator_sa = unique_name("ua-operator");
        let node_sa = unique_name("ua-node");
        let tmp = tempfile::tempdir()?;
        let mut kubeconfigs = Vec::new();
        for sa in [&operator_sa, &node_sa] {
            create_service_account(&admin, sa).await?;
            kubeconfigs.push(env.service_account_kubeconfig(SA_NAMESPACE, sa, "1h", tmp.path())?);
        }
        let version = env!("CARGO_PKG_VERSION");

        let root = tmp.path().join("sim");
        std::fs::create_dir_all(&root)?;
        let root_s = root.to_string_lossy().into_owned();
        let leases = root.join("leases.json").to_string_lossy().into_owned();
        let node_name = unique_name("ua-node");
        let mut operator = spawn(
            "run",
            &kubeconfigs[0],
            &[
                ("OCI_REGISTRY", env.registry_addr()),
                ("POD_NAMESPACE", &ns),
                ("WATCH_NAMESPACE", &ns),
                ("METRICS_ADDR", "127.0.0.1:0"),
                ("PROBE_ADDR", "127.0.0.1:0"),
            ],
        )?;
        let mut agent = spawn(
            "node",
            &kubeconfigs[1],
            &[
                ("OCI_REGISTRY", env.registry_addr()),
                ("VK_NODE_NAME", &node_name),
                ("VK_NODE_POOL", &node_name),
                ("VK_NODE_IP", "127.0.0.1"),
                ("VK_KUBELET_PORT", "0"),
                ("VK_METRICS_ADDR", "127.0.0.1:0"),
                ("VK_RUNTIME", "sim"),
                ("VK_SIM_ROOT", &root_s),
                ("COCOON_ROOT_DIR", &root_s),
                ("VK_LEASES_PATH", &leases),
            ],
        )?;

        let operator_agents = user_agents_of(&log, &operator_sa).await;
        let node_agents = user_agents_of(&log, &node_sa).await;
        let _ = operator.kill().await;
        let _ = agent.kill().await;
        let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), SA_NAMESPACE);
        for sa in [&operator_sa, &node_sa] {
            sas.delete(sa, &DeleteParams::default()).await?;
        }
        cocoon_testenv::delete_namespace(&admin, &ns).await?;

        assert_eq!(
            operator_agents?,
            BTreeSet::from([format!("cocoon-operator/{version}")]),
            "User-Agents of cocoon-operator run's requests"
        );
        assert_eq!(
            node_agents?,
            BTreeSet::from([format!("cocoon-node/{version}")]),
            "User-Agents of the node agent's requests"
        );
        Ok::<_, BoxError>(())
    })
    .await;
}
