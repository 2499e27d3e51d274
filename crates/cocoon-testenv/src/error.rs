//! The harness's error type: one enum for everything that can go wrong while starting,
//! probing or tearing down the local control plane and registry.

use std::path::PathBuf;
use std::time::Duration;

/// Everything the harness can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An upstream binary or the registry binary has not been built or fetched yet.
    #[error("{what} not found at {path}: run {script}")]
    MissingBinary {
        what: String,
        path: PathBuf,
        script: &'static str,
    },

    /// A filesystem or process operation failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },

    /// In-process certificate generation failed.
    #[error("generating test PKI: {0}")]
    Pki(#[from] rcgen::Error),

    /// A kubeconfig could not be read or turned into a client configuration.
    #[error("kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),

    /// A Kubernetes API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),

    /// A plain-HTTP request (etcd health, registry) failed.
    #[error("http: {0}")]
    Http(#[from] reqwest::Error),

    /// A condition did not become true before its deadline.
    #[error("timed out after {after:?} waiting for {what} (last seen: {last})")]
    Timeout {
        what: String,
        after: Duration,
        last: String,
    },

    /// A component process exited while we were waiting for it to become ready.
    #[error("{component} exited early ({status}); log tail:\n{tail}")]
    Exited {
        component: String,
        status: String,
        tail: String,
    },

    /// The long-lived spawner thread could not be started or is gone.
    #[error("the process spawner thread is unavailable")]
    Spawner,

    /// The shared environment failed to start earlier in this process.
    #[error("shared test environment unavailable: {0}")]
    Shared(String),

    /// The external env named by `TESTENV_KUBECONFIG` cannot be used.
    #[error(
        "external test environment TESTENV_KUBECONFIG={}: {detail} (is `cocoon-testenv up` still running?)",
        kubeconfig.display()
    )]
    External { kubeconfig: PathBuf, detail: String },

    /// A kubectl call made for a test helper failed.
    #[error("{0}")]
    Kubectl(String),

    /// Something we generated or were handed is malformed.
    #[error("invalid {what}: {detail}")]
    Invalid { what: String, detail: String },
}

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// True when a component died because another process grabbed its port first, which
    /// is the one start failure worth retrying with fresh ports.
    pub(crate) fn is_port_race(&self) -> bool {
        match self {
            Error::Exited { tail, .. } => {
                tail.contains("address already in use") || tail.contains("bind: address")
            }
            _ => false,
        }
    }
}

/// Shorthand used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
