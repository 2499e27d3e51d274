//! The plugin names itself: its API requests, as the test environment's API server audits them
//! (it audits the ServiceAccounts of `cocoon-system`), and its registry requests, as the
//! registry's access log records them, carry `kubectl-cocoon/<version>` as their User-Agent.

use std::collections::BTreeSet;
use std::time::Duration;

use cocoon_testenv::unique_name;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const WAIT: Duration = Duration::from_secs(60);
const SA_NAMESPACE: &str = "cocoon-system";

fn plugin(kubeconfig: &std::path::Path, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_kubectl-cocoon"));
    cmd.arg("--kubeconfig").arg(kubeconfig).args(args);
    cmd.env_remove("KUBECONFIG").env("NO_COLOR", "1");
    cmd.stdin(std::process::Stdio::null());
    cmd
}

#[tokio::test]
async fn plugin_requests_carry_its_user_agent() {
    cocoon_testenv::run_test(|env| async move {
        let log = env
            .audit_log()
            .ok_or("the audit log is unknown (set TESTENV_RUN_DIR for an external env)")?;
        let admin = env.client()?;
        let want = format!("kubectl-cocoon/{}", env!("CARGO_PKG_VERSION"));

        // API requests: as a fresh ServiceAccount without roles (refused, and audited).
        cocoon_testenv::ensure_namespace(&admin, SA_NAMESPACE).await?;
        let sa = unique_name("ua-plugin");
        let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), SA_NAMESPACE);
        sas.create(
            &PostParams::default(),
            &ServiceAccount {
                metadata: ObjectMeta {
                    name: Some(sa.clone()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await?;
        let tmp = tempfile::tempdir()?;
        let kubeconfig = env.service_account_kubeconfig(SA_NAMESPACE, &sa, "1h", tmp.path())?;
        let out = plugin(&kubeconfig, &["status", "-n", SA_NAMESPACE])
            .output()
            .await?;
        assert!(
            !out.status.success(),
            "a ServiceAccount without roles cannot list CocoonSets"
        );
        let user = format!("system:serviceaccount:{SA_NAMESPACE}:{sa}");
        let agents =
            cocoon_testenv::wait_until(&format!("audited requests of {user}"), WAIT, || {
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
            .await;
        sas.delete(&sa, &DeleteParams::default()).await?;
        assert_eq!(
            agents?,
            BTreeSet::from([want.clone()]),
            "User-Agents of the plugin's API requests"
        );

        // Registry requests: `registry gc` against a registry of its own, whose access log then
        // holds only the plugin's requests (and the harness's readiness probes, which send none).
        let registry = cocoon_testenv::Registry::start_temp(None).await?;
        let out = plugin(
            env.kubeconfig_path(),
            &[
                "registry",
                "gc",
                "--registry",
                registry.addr(),
                "-o",
                "json",
            ],
        )
        .output()
        .await?;
        assert!(
            out.status.success(),
            "registry gc: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The access log's combined format ends with the quoted User-Agent.
        let log = registry.log_tail(1000);
        let agents: BTreeSet<&str> = log
            .lines()
            .filter(|l| l.contains("\"GET /v2/_catalog"))
            .filter_map(|l| l.trim_end().strip_suffix('"'))
            .filter_map(|l| l.rsplit_once('"').map(|(_, ua)| ua))
            .collect();
        assert_eq!(
            agents,
            BTreeSet::from([want.as_str()]),
            "registry log:\n{log}"
        );
        registry.shutdown();
        Ok::<_, BoxError>(())
    })
    .await;
}
