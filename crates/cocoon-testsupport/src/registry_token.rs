//! A registry with token authentication (docker-registry 2.8, `auth.token`) in front of the
//! registry token service of `cocoon-operator run`, both real and in-process, and registry
//! clients that present a Kubernetes credential to it as the node agent and the operator do.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cocoon_operator::registry_token::{TokenConfig, TokenService, bind};
use cocoon_registry::{CredentialSource, RegistryClient, RegistryConfig, RetryPolicy};
use cocoon_testenv::{Registry, TokenAuth};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};

use crate::BoxError;

/// The registry's `auth.token.service` and the tokens' `aud`.
pub const SERVICE: &str = "cocoon-test-registry";
/// The registry path prefix (`OCI_REGISTRY = <addr>/cocoon`).
pub const PREFIX: &str = "cocoon";
/// The tokens' issuer (the service's default).
pub const ISSUER: &str = "cocoon-registry-token";

/// The token service and its registry. Both stop on drop (the service with the test's runtime).
pub struct TokenRegistry {
    pub registry: Registry,
    /// `http://127.0.0.1:<port>/token`.
    pub realm: url::Url,
    dir: tempfile::TempDir,
}

impl TokenRegistry {
    /// Starts the token service with the settings `vars` (the `REGISTRY_TOKEN_*` variables
    /// beyond the address, key and service, which this sets) and a registry that trusts it.
    pub async fn start(
        client: &Client,
        vars: &[(&str, String)],
    ) -> Result<TokenRegistry, BoxError> {
        let dir = tempfile::tempdir()?;
        // The signing key and the certificate of it the registry trusts.
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let cert = rcgen::CertificateParams::new(vec![ISSUER.into()])?.self_signed(&key)?;
        std::fs::write(dir.path().join("token-key.pem"), key.serialize_pem())?;
        std::fs::write(dir.path().join("token-cert.pem"), cert.pem())?;
        let mut all: Vec<(String, String)> = vec![
            ("REGISTRY_TOKEN_ADDR".into(), "127.0.0.1:0".into()),
            (
                "REGISTRY_TOKEN_KEY_FILE".into(),
                dir.path().join("token-key.pem").display().to_string(),
            ),
            ("REGISTRY_TOKEN_SERVICE".into(), SERVICE.into()),
        ];
        all.extend(vars.iter().map(|(k, v)| (k.to_string(), v.clone())));
        // Only the prefix of OCI_REGISTRY matters to the grant; the registry starts below, once
        // the realm's port is known.
        let cfg = TokenConfig::from_env(&format!("127.0.0.1:1/{PREFIX}"), &|k| {
            all.iter()
                .rev()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
        })?
        .ok_or("REGISTRY_TOKEN_ADDR is set")?;
        let svc = TokenService::new(cfg, client.clone()).await?;
        let (addr, serve) = bind(Arc::new(svc)).await?;
        tokio::spawn(serve);
        let realm = url::Url::parse(&format!("http://{addr}/token"))?;
        let registry = Registry::start_temp_with_token(TokenAuth {
            realm: realm.to_string(),
            service: SERVICE.into(),
            issuer: ISSUER.into(),
            rootcertbundle: dir.path().join("token-cert.pem"),
        })
        .await?;
        Ok(TokenRegistry {
            registry,
            realm,
            dir,
        })
    }

    /// `OCI_REGISTRY` of the VM repositories: `<addr>/cocoon`.
    pub fn base(&self) -> String {
        format!("{}/{PREFIX}", self.registry.addr())
    }

    /// A scratch directory (holds `token-key.pem` and `token-cert.pem`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A registry client presenting `token` (None: no credential) to the realm, as the node
    /// agent and the operator are configured (`OCI_REGISTRY_TOKEN_REALM`,
    /// `OCI_REGISTRY_KUBERNETES_TOKEN_FILE`); one attempt per call.
    pub fn client_as(&self, token: Option<&str>) -> Result<RegistryClient, BoxError> {
        let token_file = match token {
            Some(t) => {
                let path = self.dir().join(cocoon_testenv::unique_name("bearer"));
                std::fs::write(&path, t)?;
                Some(path)
            }
            None => None,
        };
        let mut cfg = RegistryConfig::for_registry(&self.base())?;
        cfg.credentials = CredentialSource::KubernetesToken {
            realm: self.realm.clone(),
            token_file,
        };
        cfg.request_timeout = Duration::from_secs(10);
        cfg.retry = RetryPolicy {
            attempts: 1,
            ..RetryPolicy::default()
        };
        Ok(RegistryClient::new(cfg)?)
    }
}

/// Creates ServiceAccount `ns/name` and returns a token for it (TokenRequest, one hour).
pub async fn sa_token(client: &Client, ns: &str, name: &str) -> Result<String, BoxError> {
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        ..Default::default()
    };
    sas.create(&PostParams::default(), &sa).await?;
    token_for(client, ns, name, &[]).await
}

/// Another token of the existing ServiceAccount `ns/name`, for `audiences` (empty: the API
/// server's).
pub async fn token_for(
    client: &Client,
    ns: &str,
    name: &str,
    audiences: &[&str],
) -> Result<String, BoxError> {
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: audiences.iter().map(|a| a.to_string()).collect(),
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    let issued: TokenRequest = sas
        .create_subresource("token", name, &PostParams::default(), &request)
        .await?;
    Ok(issued
        .status
        .ok_or("no token in the TokenRequest status")?
        .token)
}
