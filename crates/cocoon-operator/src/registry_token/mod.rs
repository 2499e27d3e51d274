//! The registry token service (distribution token spec): a node agent gets a registry token for
//! the repositories of the VMs of pods bound to its node, the operator for probing, reading and
//! deleting tags, anyone else an empty grant. Started by `cocoon-operator run` when
//! [`ENV_ADDR`] is set.
//!
//! `GET <realm>?service=<service>&scope=repository:<name>:<actions>…` with the caller's
//! Kubernetes bearer token (`Authorization: Bearer <token>`, or Basic with the token as the
//! password) → a TokenReview names the user → [`grant::classify`] and, for a node, the pods
//! with `spec.nodeName` = that node (read from the API at that moment) → [`grant::grant`] →
//! `{"token", "access_token", "expires_in", "issued_at"}` with an ES256 JWT ([`jwt`]).

pub mod config;
pub mod grant;
#[cfg(test)]
mod grant_tests;
pub mod jwt;
pub mod server;

pub use config::{
    ENV_ADDR, ENV_ADMIN_GROUPS, ENV_ADMIN_USERS, ENV_AUDIENCES, ENV_CLIENT_CA_FILE, ENV_ISSUER,
    ENV_KEY_FILE, ENV_NODE_SA_NAMESPACE, ENV_OPERATOR_USERS, ENV_SERVICE, ENV_TLS_CERT_FILE,
    ENV_TLS_KEY_FILE, ENV_TTL, TokenConfig,
};
pub use server::{TokenService, bind};
