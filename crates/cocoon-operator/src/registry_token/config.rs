//! The token service's settings, from the environment of `cocoon-operator run` (empty counts
//! as unset). [`ENV_ADDR`] unset: no token service.

use std::path::PathBuf;
use std::time::Duration;

use cocoon_registry::RegistryBase;

use crate::config::{listen_addr, parse_go_duration};

/// Listen address of the token service (`host:port`, or `:port` for every interface); unset =
/// off.
pub const ENV_ADDR: &str = "REGISTRY_TOKEN_ADDR";
/// PEM PKCS#8 EC P-256 private key the tokens are signed with (required with [`ENV_ADDR`]).
/// The registry's `auth.token.rootcertbundle` must hold a certificate of its public key.
pub const ENV_KEY_FILE: &str = "REGISTRY_TOKEN_KEY_FILE";
/// The tokens' `iss`; the registry's `auth.token.issuer` (default [`DEFAULT_ISSUER`]).
pub const ENV_ISSUER: &str = "REGISTRY_TOKEN_ISSUER";
/// The registry's `auth.token.service`: requests naming another service are refused, tokens
/// carry it as `aud` (default: the `OCI_REGISTRY` host).
pub const ENV_SERVICE: &str = "REGISTRY_TOKEN_SERVICE";
/// Token lifetime, Go duration (default 5m0s; at least 1m, at most 1h).
pub const ENV_TTL: &str = "REGISTRY_TOKEN_TTL";
/// Comma-separated usernames granted the operator's access (pull and delete on every
/// repository under the prefix); default: the operator's own identity (SelfSubjectReview).
pub const ENV_OPERATOR_USERS: &str = "REGISTRY_TOKEN_OPERATOR_USERS";
/// Comma-separated usernames granted administrator access (pull, push, delete on every
/// repository under the prefix, and the catalog): who pushes base images and runs
/// `kubectl cocoon registry gc` (default: none).
pub const ENV_ADMIN_USERS: &str = "REGISTRY_TOKEN_ADMIN_USERS";
/// Comma-separated groups granted administrator access (default: none).
pub const ENV_ADMIN_GROUPS: &str = "REGISTRY_TOKEN_ADMIN_GROUPS";
/// Comma-separated audiences a presented bearer token must carry (TokenReview
/// `spec.audiences`), e.g. `cocoon-registry` for projected ServiceAccount tokens made for the
/// registry only, which the API server itself refuses (so a token leaked from a registry client
/// is no API credential). Default: none, the API server's own audiences.
pub const ENV_AUDIENCES: &str = "REGISTRY_TOKEN_AUDIENCES";
/// Namespace of the per-node ServiceAccounts (default `cocoon-nodes`).
pub const ENV_NODE_SA_NAMESPACE: &str = "REGISTRY_TOKEN_NODE_SA_NAMESPACE";
/// Serving certificate (PEM chain) for HTTPS; with [`ENV_TLS_KEY_FILE`]. Unset: plain HTTP
/// (only for a loopback address or behind a TLS-terminating proxy).
pub const ENV_TLS_CERT_FILE: &str = "REGISTRY_TOKEN_TLS_CERT_FILE";
/// Serving key (PEM) for HTTPS.
pub const ENV_TLS_KEY_FILE: &str = "REGISTRY_TOKEN_TLS_KEY_FILE";
/// CA bundle (PEM) client certificates are verified against: the cluster CA, so that node
/// agents with a kubelet client certificate (`system:node:<n>`, `O=system:nodes`) authenticate
/// by it. Needs HTTPS. Unset: only bearer tokens authenticate.
pub const ENV_CLIENT_CA_FILE: &str = "REGISTRY_TOKEN_CLIENT_CA_FILE";

/// Default `iss`.
pub const DEFAULT_ISSUER: &str = "cocoon-registry-token";
/// Default per-node ServiceAccount namespace.
pub const DEFAULT_NODE_SA_NAMESPACE: &str = "cocoon-nodes";
/// Default token lifetime.
pub const DEFAULT_TTL: Duration = Duration::from_secs(300);

/// A setting was present but unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenConfigError {
    #[error("{0} must be set when {ENV_ADDR} is set")]
    Missing(&'static str),
    #[error("{name}: {detail}")]
    Invalid { name: &'static str, detail: String },
}

/// The token service's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenConfig {
    pub addr: String,
    pub key_file: PathBuf,
    pub issuer: String,
    pub service: String,
    pub ttl: Duration,
    /// `None`: ask the API server who the operator is.
    pub operator_users: Option<Vec<String>>,
    pub admin_users: Vec<String>,
    pub admin_groups: Vec<String>,
    /// Audiences bearer tokens must carry (empty: the API server's).
    pub audiences: Vec<String>,
    pub node_sa_namespace: String,
    /// `(cert, key)` PEM files for HTTPS.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// CA bundle for client certificates (HTTPS only).
    pub client_ca: Option<PathBuf>,
    /// The registry base whose prefix the repository names carry.
    pub base: RegistryBase,
}

impl TokenConfig {
    /// Reads the settings for the registry `oci_registry`; `Ok(None)` when [`ENV_ADDR`] is
    /// unset.
    pub fn from_env(
        oci_registry: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<TokenConfig>, TokenConfigError> {
        let get = |k: &str| {
            env(k)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let Some(addr) = get(ENV_ADDR) else {
            return Ok(None);
        };
        let key_file = get(ENV_KEY_FILE).ok_or(TokenConfigError::Missing(ENV_KEY_FILE))?;
        let base = RegistryBase::parse(oci_registry).map_err(|e| TokenConfigError::Invalid {
            name: "OCI_REGISTRY",
            detail: e.to_string(),
        })?;
        let ttl = match get(ENV_TTL) {
            None => DEFAULT_TTL,
            Some(v) => {
                let d = parse_go_duration(&v).map_err(|_| TokenConfigError::Invalid {
                    name: ENV_TTL,
                    detail: format!("{v:?} is not a Go duration such as 5m0s"),
                })?;
                if !(Duration::from_secs(60)..=Duration::from_secs(3600)).contains(&d) {
                    return Err(TokenConfigError::Invalid {
                        name: ENV_TTL,
                        detail: format!("{v} is outside 1m..1h"),
                    });
                }
                d
            }
        };
        let list = |v: String| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        let operator_users = get(ENV_OPERATOR_USERS).map(list);
        let admin_users = get(ENV_ADMIN_USERS).map(list).unwrap_or_default();
        let admin_groups = get(ENV_ADMIN_GROUPS).map(list).unwrap_or_default();
        if admin_groups.iter().any(|g| {
            g == "system:authenticated" || g == "system:serviceaccounts" || g == "system:nodes"
        }) {
            return Err(TokenConfigError::Invalid {
                name: ENV_ADMIN_GROUPS,
                detail:
                    "must not name system:authenticated, system:serviceaccounts or system:nodes"
                        .into(),
            });
        }
        let tls = match (get(ENV_TLS_CERT_FILE), get(ENV_TLS_KEY_FILE)) {
            (Some(c), Some(k)) => Some((PathBuf::from(c), PathBuf::from(k))),
            (None, None) => None,
            (Some(_), None) => return Err(TokenConfigError::Missing(ENV_TLS_KEY_FILE)),
            (None, Some(_)) => return Err(TokenConfigError::Missing(ENV_TLS_CERT_FILE)),
        };
        let client_ca = get(ENV_CLIENT_CA_FILE).map(PathBuf::from);
        if client_ca.is_some() && tls.is_none() {
            return Err(TokenConfigError::Invalid {
                name: ENV_CLIENT_CA_FILE,
                detail: format!(
                    "client certificates need HTTPS: set {ENV_TLS_CERT_FILE} and {ENV_TLS_KEY_FILE}"
                ),
            });
        }
        Ok(Some(TokenConfig {
            addr: listen_addr(&addr),
            key_file: PathBuf::from(key_file),
            issuer: get(ENV_ISSUER).unwrap_or_else(|| DEFAULT_ISSUER.to_owned()),
            service: get(ENV_SERVICE).unwrap_or_else(|| base.host().to_owned()),
            ttl,
            operator_users,
            admin_users,
            admin_groups,
            audiences: get(ENV_AUDIENCES).map(list).unwrap_or_default(),
            node_sa_namespace: get(ENV_NODE_SA_NAMESPACE)
                .unwrap_or_else(|| DEFAULT_NODE_SA_NAMESPACE.to_owned()),
            tls,
            client_ca,
            base,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn off_unless_the_address_is_set() {
        assert_eq!(TokenConfig::from_env("reg:5000", &env(&[])), Ok(None));
        assert_eq!(
            TokenConfig::from_env("reg:5000", &env(&[(ENV_ADDR, " ")])),
            Ok(None)
        );
    }

    #[test]
    fn defaults_and_overrides() {
        let c = TokenConfig::from_env(
            "reg.example:5000/cocoon",
            &env(&[(ENV_ADDR, "0.0.0.0:5002"), (ENV_KEY_FILE, "/k.pem")]),
        )
        .expect("valid")
        .expect("on");
        assert_eq!(c.service, "reg.example:5000");
        assert_eq!(c.issuer, DEFAULT_ISSUER);
        assert_eq!(c.ttl, DEFAULT_TTL);
        assert_eq!(c.operator_users, None);
        assert_eq!(c.node_sa_namespace, "cocoon-nodes");
        assert_eq!(c.base.prefix(), "cocoon");
        let c = TokenConfig::from_env(
            "reg:5000",
            &env(&[
                (ENV_ADDR, "127.0.0.1:0"),
                (ENV_KEY_FILE, "/k.pem"),
                (ENV_SERVICE, "my-registry"),
                (ENV_TTL, "10m"),
                (ENV_OPERATOR_USERS, "a, b,"),
            ]),
        )
        .expect("valid")
        .expect("on");
        assert_eq!(c.service, "my-registry");
        assert_eq!(c.ttl, Duration::from_secs(600));
        assert_eq!(c.operator_users, Some(vec!["a".into(), "b".into()]));
    }

    #[test]
    fn bad_settings_name_the_variable() {
        let rows: [(&[(&str, &str)], &str); 6] = [
            (
                &[
                    (ENV_ADDR, "x:1"),
                    (ENV_KEY_FILE, "k"),
                    (ENV_ADMIN_GROUPS, "ops,system:authenticated"),
                ],
                ENV_ADMIN_GROUPS,
            ),
            (
                &[
                    (ENV_ADDR, "x:1"),
                    (ENV_KEY_FILE, "k"),
                    (ENV_CLIENT_CA_FILE, "ca"),
                ],
                ENV_CLIENT_CA_FILE,
            ),
            (&[(ENV_ADDR, "x:1")], ENV_KEY_FILE),
            (
                &[(ENV_ADDR, "x:1"), (ENV_KEY_FILE, "k"), (ENV_TTL, "5s")],
                ENV_TTL,
            ),
            (
                &[(ENV_ADDR, "x:1"), (ENV_KEY_FILE, "k"), (ENV_TTL, "soon")],
                ENV_TTL,
            ),
            (
                &[
                    (ENV_ADDR, "x:1"),
                    (ENV_KEY_FILE, "k"),
                    (ENV_TLS_CERT_FILE, "c"),
                ],
                ENV_TLS_KEY_FILE,
            ),
        ];
        for (pairs, name) in rows {
            let err = TokenConfig::from_env("reg:5000", &env(pairs)).unwrap_err();
            assert!(err.to_string().contains(name), "{err} should name {name}");
        }
    }
}
