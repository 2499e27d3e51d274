//! An identity of its own for a controller under test, so that the API server's audit log
//! tells its requests from the test's.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};

use crate::BoxError;

/// How long the audit log may take to show a request.
const AUDIT_WAIT: Duration = Duration::from_secs(120);

/// A ServiceAccount of cocoon-system (the namespace the API server audits) made for one test,
/// bound to cluster-admin: an identity of its own, so that the audit log tells this
/// controller's requests from the test's.
pub struct AuditedIdentity {
    /// A client of the identity.
    pub client: Client,
    /// The audit log's username of the identity.
    pub user: String,
    name: String,
    _dir: tempfile::TempDir,
}

impl AuditedIdentity {
    /// Makes the identity (`prefix` + a unique suffix) and a client of it.
    pub async fn new(
        env: &cocoon_testenv::Shared,
        admin: &Client,
        prefix: &str,
    ) -> Result<Self, BoxError> {
        use k8s_openapi::api::core::v1::ServiceAccount;
        use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
        let name = cocoon_testenv::unique_name(prefix);
        cocoon_testenv::ensure_namespace(admin, "cocoon-system").await?;
        let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), "cocoon-system");
        let mut sa = ServiceAccount::default();
        sa.metadata.name = Some(name.clone());
        sas.create(&PostParams::default(), &sa).await?;
        let binding = ClusterRoleBinding {
            metadata: kube::api::ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "ClusterRole".into(),
                name: "cluster-admin".into(),
            },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".into(),
                name: name.clone(),
                namespace: Some("cocoon-system".into()),
                ..Default::default()
            }]),
        };
        Api::<ClusterRoleBinding>::all(admin.clone())
            .create(&PostParams::default(), &binding)
            .await?;
        let dir = tempfile::tempdir()?;
        let path = env.service_account_kubeconfig("cocoon-system", &name, "1h", dir.path())?;
        let config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(&path)?,
            &kube::config::KubeConfigOptions::default(),
        )
        .await?;
        Ok(AuditedIdentity {
            client: Client::try_from(config)?,
            user: format!("system:serviceaccount:cocoon-system:{name}"),
            name,
            _dir: dir,
        })
    }

    /// How many writes the identity made in `ns` so far, once the log shows a read it made
    /// after them (the log is appended as requests complete: every write finished before
    /// that read is in it by then).
    pub async fn writes_in(
        &self,
        audit: &cocoon_testenv::AuditLog,
        ns: &str,
    ) -> Result<usize, BoxError> {
        let marker = cocoon_testenv::unique_name("audit-marker");
        let probe: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let _ = probe.get_opt(&marker).await?;
        cocoon_testenv::wait_until("the marker read in the audit log", AUDIT_WAIT, || async {
            audit
                .records_of(&self.user)
                .ok()?
                .iter()
                .any(|r| r.name == marker)
                .then_some(())
        })
        .await?;
        Ok(audit.writes_of(&self.user, ns)?.len())
    }

    /// Deletes the ServiceAccount and its binding.
    pub async fn delete(&self, admin: &Client) -> Result<(), BoxError> {
        use k8s_openapi::api::core::v1::ServiceAccount;
        use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
        Api::<ClusterRoleBinding>::all(admin.clone())
            .delete(&self.name, &DeleteParams::default())
            .await?;
        Api::<ServiceAccount>::namespaced(admin.clone(), "cocoon-system")
            .delete(&self.name, &DeleteParams::default())
            .await?;
        Ok(())
    }
}
