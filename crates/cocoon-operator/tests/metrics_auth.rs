//! Secure metrics on the real control plane: the operator's metrics listener, with the reviews
//! made as a ServiceAccount holding the shipped `cocoon-operator` ClusterRole, answers 401
//! without a token or with one the API server refuses, 403 to a ServiceAccount without the
//! shipped `cocoon-metrics-reader` role, and 200 with `cocoon_operator_build_info` once that
//! role is bound; the probe listener stays open.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cocoon_operator::admin::{self, Readiness};
use cocoon_operator::metrics::Metrics;
use cocoon_operator::metrics_auth::MetricsAuth;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `GET path` over HTTP/1.1 with an optional `Authorization` header; (status, body).
async fn get(
    addr: SocketAddr,
    path: &str,
    authorization: Option<&str>,
) -> std::io::Result<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let auth = authorization
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).await?;
    let status = raw
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// The shipped ClusterRole `name` of manifests/operator/rbac.yaml, renamed to `as_name` (the
/// control plane is shared: its rules, under a name of this test's own).
fn shipped_role(name: &str, as_name: &str) -> Result<ClusterRole, BoxError> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../manifests/operator/rbac.yaml");
    let text = std::fs::read_to_string(path)?;
    for doc in text.split("\n---\n") {
        let v: Value = serde_saphyr::from_str(doc)?;
        if v["kind"] == "ClusterRole" && v["metadata"]["name"] == name {
            let mut role: ClusterRole = serde_json::from_value(v)?;
            role.metadata.name = Some(as_name.to_owned());
            return Ok(role);
        }
    }
    Err(format!("no ClusterRole {name} in manifests/operator/rbac.yaml").into())
}

fn binding(name: &str, role: &str, ns: &str, sa: &str) -> Result<ClusterRoleBinding, BoxError> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]
    }))?)
}

/// A fresh token of ServiceAccount `ns/sa` (TokenRequest).
async fn token(client: &kube::Client, ns: &str, sa: &str) -> Result<String, BoxError> {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let req = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let answer: TokenRequest = api
        .create_subresource("token", sa, &PostParams::default(), &req)
        .await?;
    Ok(answer.status.ok_or("token request without status")?.token)
}

/// Whether RBAC lets `ns/sa` get `/metrics` yet (asked as the admin).
async fn may_scrape(client: &kube::Client, ns: &str, sa: &str) -> bool {
    let api: Api<SubjectAccessReview> = Api::all(client.clone());
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(format!("system:serviceaccount:{ns}:{sa}")),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                "system:authenticated".into(),
            ]),
            non_resource_attributes: Some(NonResourceAttributes {
                path: Some("/metrics".into()),
                verb: Some("get".into()),
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    api.create(&PostParams::default(), &review)
        .await
        .ok()
        .and_then(|r| r.status)
        .is_some_and(|s| s.allowed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_need_a_token_whose_user_may_read_them() {
    cocoon_testenv::run_test(|env| async move {
        let admin = env.client()?;
        let ns = cocoon_testenv::create_namespace(&admin, "metrics-auth").await?;
        let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), &ns);
        for sa in ["operator", "prometheus", "stranger"] {
            sas.create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": sa}}))?,
            )
            .await?;
        }
        // The operator's reviews are made as a ServiceAccount with the shipped operator role.
        let roles: Api<ClusterRole> = Api::all(admin.clone());
        let bindings: Api<ClusterRoleBinding> = Api::all(admin.clone());
        let (op_role, reader_role) = (format!("{ns}-operator"), format!("{ns}-metrics-reader"));
        roles
            .create(
                &PostParams::default(),
                &shipped_role("cocoon-operator", &op_role)?,
            )
            .await?;
        roles
            .create(
                &PostParams::default(),
                &shipped_role("cocoon-metrics-reader", &reader_role)?,
            )
            .await?;
        bindings
            .create(
                &PostParams::default(),
                &binding(&op_role, &op_role, &ns, "operator")?,
            )
            .await?;
        let dir = tempfile::tempdir()?;
        let op_client = cocoon_testenv::client_for(&env.service_account_kubeconfig(
            &ns,
            "operator",
            "1h",
            dir.path(),
        )?)
        .await?;

        let metrics = Arc::new(Metrics::new());
        metrics.set_build_info("9.9.9-test", "abc123");
        let auth = MetricsAuth::kube(op_client);
        let (maddr, paddr, serve) = admin::bind(
            "127.0.0.1:0",
            "127.0.0.1:0",
            metrics,
            Arc::new(Readiness::default()),
            Some(auth),
        )
        .await?;
        tokio::spawn(serve);

        // The reader role is bound to "prometheus" before anyone scrapes (a denial is cached).
        bindings
            .create(
                &PostParams::default(),
                &binding(&reader_role, &reader_role, &ns, "prometheus")?,
            )
            .await?;
        cocoon_testenv::wait_until(
            "the reader binding is in force",
            Duration::from_secs(30),
            || async { may_scrape(&admin, &ns, "prometheus").await.then_some(()) },
        )
        .await?;
        let (prometheus, stranger) = (
            token(&admin, &ns, "prometheus").await?,
            token(&admin, &ns, "stranger").await?,
        );

        // (situation, Authorization header, status)
        let rows: Vec<(&str, Option<String>, u16)> = vec![
            ("no token", None, 401),
            ("not a bearer token", Some("Basic dXNlcjpwYXNz".into()), 401),
            (
                "a token the API server refuses",
                Some("Bearer not-a-token".into()),
                401,
            ),
            (
                "a ServiceAccount without cocoon-metrics-reader",
                Some(format!("Bearer {stranger}")),
                403,
            ),
            (
                "a ServiceAccount bound to cocoon-metrics-reader",
                Some(format!("Bearer {prometheus}")),
                200,
            ),
        ];
        for (situation, header, want) in rows {
            let (status, body) = get(maddr, "/metrics", header.as_deref()).await?;
            assert_eq!(status, want, "{situation}: {body}");
            assert_eq!(
                body.contains("cocoon_operator_build_info"),
                want == 200,
                "{situation}: the metrics only for the reader: {body}"
            );
        }
        let (_, body) = get(maddr, "/metrics", Some(&format!("Bearer {stranger}"))).await?;
        assert!(
            body.contains(&format!(
                "user=system:serviceaccount:{ns}:stranger, verb=get, nonResourceURL=/metrics"
            )),
            "the 403 names who and what: {body}"
        );
        // Other paths of the metrics listener are refused before any 404, too.
        assert_eq!(get(maddr, "/debug", None).await?.0, 401);
        // The probes carry no token and stay open.
        assert_eq!(get(paddr, "/healthz", None).await?.0, 200);
        assert_eq!(get(paddr, "/livez", None).await?.0, 200);

        for name in [&op_role, &reader_role] {
            let _ = bindings.delete(name, &DeleteParams::default()).await;
            let _ = roles.delete(name, &DeleteParams::default()).await;
        }
        cocoon_testenv::delete_namespace(&admin, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}
