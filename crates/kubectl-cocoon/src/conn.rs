//! kubectl's connection flags (cli.md §2) mapped onto kube's kubeconfig loader and client
//! config, so exec plugins, OIDC and token refresh work as they do for kubectl.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::error::CliError;

/// The heading the connection flags are listed under in every verb's help.
pub const CONNECTION: &str = "Connection options";

/// The standard kubectl connection flags.
#[derive(Args, Debug, Clone, Default)]
pub struct ConnFlags {
    /// Path to the kubeconfig file to use.
    #[arg(long, global = true, help_heading = CONNECTION, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// The name of the kubeconfig context to use.
    #[arg(long, global = true, help_heading = CONNECTION, value_name = "NAME")]
    pub context: Option<String>,
    /// The name of the kubeconfig cluster to use.
    #[arg(long, global = true, help_heading = CONNECTION, value_name = "NAME")]
    pub cluster: Option<String>,
    /// The name of the kubeconfig user to use.
    #[arg(long, global = true, help_heading = CONNECTION, value_name = "NAME")]
    pub user: Option<String>,
    /// The namespace scope for this request.
    #[arg(short = 'n', long, global = true, help_heading = CONNECTION, value_name = "NS")]
    pub namespace: Option<String>,
    /// The address and port of the Kubernetes API server.
    #[arg(short = 's', long, global = true, help_heading = CONNECTION, value_name = "URL")]
    pub server: Option<String>,
    /// Bearer token for authentication to the API server.
    #[arg(long, global = true, help_heading = CONNECTION, value_name = "TOKEN")]
    pub token: Option<String>,
    /// Username to impersonate for the operation.
    #[arg(long = "as", global = true, help_heading = CONNECTION, value_name = "USER")]
    pub as_user: Option<String>,
    /// Group to impersonate for the operation (repeatable).
    #[arg(long = "as-group", global = true, help_heading = CONNECTION, value_name = "GROUP")]
    pub as_group: Vec<String>,
    /// UID to impersonate for the operation.
    #[arg(long = "as-uid", global = true, help_heading = CONNECTION, value_name = "UID")]
    pub as_uid: Option<String>,
    /// Path to a cert file for the certificate authority.
    #[arg(long, global = true, help_heading = CONNECTION, value_name = "PATH")]
    pub certificate_authority: Option<PathBuf>,
    /// Path to a client certificate file for TLS.
    #[arg(long, global = true, help_heading = CONNECTION, value_name = "PATH")]
    pub client_certificate: Option<PathBuf>,
    /// Path to a client key file for TLS.
    #[arg(long, global = true, help_heading = CONNECTION, value_name = "PATH")]
    pub client_key: Option<PathBuf>,
    /// If true, the server's certificate will not be checked for validity.
    #[arg(long, global = true, help_heading = CONNECTION)]
    pub insecure_skip_tls_verify: bool,
    /// Server name to use for server certificate validation.
    #[arg(long, global = true, help_heading = CONNECTION, value_name = "NAME")]
    pub tls_server_name: Option<String>,
    /// The length of time to wait before giving up on a single server request (e.g. 30s).
    #[arg(long, global = true, help_heading = CONNECTION, value_name = "DURATION", value_parser = crate::duration::parse_flag)]
    pub request_timeout: Option<Duration>,
}

/// A connected client and the namespace the command acts in.
pub struct Conn {
    pub client: Client,
    pub namespace: String,
}

impl ConnFlags {
    /// Loads the kubeconfig (the flag, else `KUBECONFIG`, else `~/.kube/config`, else
    /// in-cluster) and applies the overrides.
    pub async fn connect(&self) -> Result<Conn, CliError> {
        let options = KubeConfigOptions {
            context: self.context.clone(),
            cluster: self.cluster.clone(),
            user: self.user.clone(),
        };
        let mut config = match &self.kubeconfig {
            Some(path) => {
                let kc = Kubeconfig::read_from(path).map_err(|e| {
                    CliError::Usage(format!("--kubeconfig {}: {e}", path.display()))
                })?;
                Config::from_custom_kubeconfig(kc, &options)
                    .await
                    .map_err(|e| CliError::Config(e.to_string()))?
            }
            None => match Config::from_kubeconfig(&options).await {
                Ok(c) => c,
                Err(kube_err) => match Config::incluster() {
                    Ok(c)
                        if self.server.is_some()
                            || std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() =>
                    {
                        c
                    }
                    _ => return Err(CliError::Config(kube_err.to_string())),
                },
            },
        };
        if let Some(server) = &self.server {
            config.cluster_url = server
                .parse()
                .map_err(|e| CliError::Usage(format!("--server {server:?}: {e}")))?;
        }
        if let Some(ca) = &self.certificate_authority {
            let pem = std::fs::read(ca).map_err(|e| {
                CliError::Usage(format!("--certificate-authority {}: {e}", ca.display()))
            })?;
            config.root_cert = Some(pem_certs(&pem).map_err(|e| {
                CliError::Usage(format!("--certificate-authority {}: {e}", ca.display()))
            })?);
        }
        if self.insecure_skip_tls_verify {
            config.accept_invalid_certs = true;
        }
        if let Some(name) = &self.tls_server_name {
            config.tls_server_name = Some(name.clone());
        }
        if let Some(token) = &self.token {
            config.auth_info.token = Some(secrecy::SecretString::from(token.clone()));
            config.auth_info.token_file = None;
        }
        if let Some(cert) = &self.client_certificate {
            config.auth_info.client_certificate = Some(cert.display().to_string());
            config.auth_info.client_certificate_data = None;
        }
        if let Some(key) = &self.client_key {
            config.auth_info.client_key = Some(key.display().to_string());
            config.auth_info.client_key_data = None;
        }
        if let Some(user) = &self.as_user {
            config.auth_info.impersonate = Some(user.clone());
        }
        if !self.as_group.is_empty() {
            config.auth_info.impersonate_groups = Some(self.as_group.clone());
        }
        if let Some(uid) = &self.as_uid {
            config.auth_info.impersonate_uid = Some(uid.clone());
        }
        if let Some(t) = self.request_timeout.filter(|t| !t.is_zero()) {
            config.read_timeout = Some(t);
            config.write_timeout = Some(t);
            config.connect_timeout = Some(t);
        }
        // -n, then the context's namespace, then `default` (kube fills the latter two).
        let namespace = self
            .namespace
            .clone()
            .unwrap_or_else(|| config.default_namespace.clone());
        let client = Client::try_from(crate::user_agent::kube_config(config))
            .map_err(|e| CliError::Config(e.to_string()))?;
        Ok(Conn { client, namespace })
    }
}

/// DER certificates from a PEM bundle.
fn pem_certs(pem: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let text = std::str::from_utf8(pem).map_err(|_| "not a PEM file".to_string())?;
    let mut out = Vec::new();
    let mut inside = false;
    let mut b64 = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line == "-----BEGIN CERTIFICATE-----" {
            inside = true;
            b64.clear();
        } else if line == "-----END CERTIFICATE-----" {
            inside = false;
            out.push(decode_base64(&b64).ok_or("invalid base64 in certificate")?);
        } else if inside {
            b64.push_str(line);
        }
    }
    if out.is_empty() {
        return Err("no certificate found".into());
    }
    Ok(out)
}

fn decode_base64(s: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(s).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_decodes() {
        assert_eq!(decode_base64("aGVsbG8="), Some(b"hello".to_vec()));
        assert_eq!(decode_base64("aGk="), Some(b"hi".to_vec()));
        assert_eq!(decode_base64("a$"), None);
    }

    #[test]
    fn pem_bundle_yields_each_certificate() {
        let pem = b"-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n-----BEGIN CERTIFICATE-----\naGk=\n-----END CERTIFICATE-----\n";
        assert_eq!(pem_certs(pem), Ok(vec![b"hello".to_vec(), b"hi".to_vec()]));
        assert!(pem_certs(b"nothing").is_err());
    }
}
