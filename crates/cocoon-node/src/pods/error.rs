//! The node agent's errors, classified once by kind: the runtime ([`RuntimeFailure`]), the
//! registry ([`RegistryFailure`]), the Kubernetes API ([`ApiError`]) and a refusal by a rule
//! ([`Refused`]: tenant isolation, host reach, the plans' own refusals). [`PodError`] is the
//! error of a pod operation; [`PodError::reason`] and [`PodError::message`] are the one place
//! an error becomes the contract's Event reason and message (`node.md` §12.3, §16).
//!
//! The texts are the contract's: each variant displays exactly what the agent reported as a
//! string before these types existed (tests and `shared/spec/node.md` rely on them).

use cocoon_api::contract::events::node as ev;
use std::sync::Arc;

use cocoon_runtime::RuntimeError;

use super::plan::transfer::GateError;
use super::plan::{ActionError, StepFailed};
use super::tenant;

/// A runtime verb failed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeFailure {
    /// The verb's own error, as the runtime words it.
    #[error(transparent)]
    Verb(#[from] RuntimeError),
    /// The verb's error, after what the agent was doing.
    #[error("{what}: {source}")]
    During {
        /// What the agent was doing (`start vm <id>`, `inspect fork source vm <vm>`…).
        what: String,
        /// The runtime's error.
        source: RuntimeError,
    },
    /// The runtime answered, but not what the agent needs (the contract's text).
    #[error("{0}")]
    Unexpected(String),
}

impl RuntimeFailure {
    /// The runtime's `source` while the agent was doing `what`.
    pub(crate) fn during(what: impl Into<String>, source: RuntimeError) -> Self {
        RuntimeFailure::During {
            what: what.into(),
            source,
        }
    }
}

/// A registry read or transfer failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryFailure {
    /// No registry is configured (`VK_REGISTRY_URL` unset) but the operation needs one.
    #[error("no registry configured")]
    NotConfigured,
    /// The client's own error, as it words it.
    #[error(transparent)]
    Client(#[from] cocoon_registry::Error),
    /// The client's error, after what the agent was doing.
    #[error("{what}: {source}")]
    During {
        /// What the agent was doing (`get manifest <repo>:<tag>`…).
        what: String,
        /// The client's error.
        source: cocoon_registry::Error,
    },
    /// The artifact the operation needs is not in the registry.
    #[error("no snapshot artifact {0} in the registry")]
    NoArtifact(String),
    /// A transfer task ended without an answer (the agent shutting down, a panic).
    #[error("{0}")]
    Transfer(String),
    /// The runtime's side of a transfer (export, import) failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeFailure),
    /// A pull shared by several callers failed ([`super::Handler::shared_pull`]).
    #[error(transparent)]
    Shared(#[from] Arc<RegistryFailure>),
}

impl RegistryFailure {
    /// The client's `source` while the agent was doing `what`.
    pub(crate) fn during(what: impl Into<String>, source: cocoon_registry::Error) -> Self {
        RegistryFailure::During {
            what: what.into(),
            source,
        }
    }
}

impl From<RuntimeError> for RegistryFailure {
    fn from(e: RuntimeError) -> Self {
        RegistryFailure::Runtime(RuntimeFailure::Verb(e))
    }
}

/// A Kubernetes API call failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The API server's (or the client's) error, as kube words it.
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// The call did not answer within its budget (5 s, §5.1).
    #[error("{0} timed out")]
    TimedOut(&'static str),
    /// Every attempt failed without an error to show.
    #[error("{0} failed")]
    Failed(&'static str),
    /// The body could not be encoded.
    #[error(transparent)]
    Encode(#[from] serde_json::Error),
    /// A namespace without a UID.
    #[error("namespace {0} has no uid")]
    NoNamespaceUid(String),
    /// Reading a namespace failed.
    #[error("read namespace {0} (its uid is recorded with every snapshot): {1}")]
    ReadNamespace(String, kube::Error),
    /// A listing the operation needs failed.
    #[error("list {what}: {source}")]
    List {
        /// What was listed (`pods on <node>`).
        what: String,
        /// The API's error.
        source: kube::Error,
    },
}

/// A rule refused the operation: the failOp reason and the rule's text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refused {
    /// The Event reason (`TenantIsolationRefused`, `CreateValidationFailed`…).
    pub reason: &'static str,
    /// The rule's text.
    pub message: String,
}

impl From<tenant::Refusal> for Refused {
    fn from(r: tenant::Refusal) -> Self {
        Refused {
            reason: ev::TENANT_ISOLATION_REFUSED,
            message: r.to_string(),
        }
    }
}

/// The error of a pod operation.
#[derive(Debug, thiserror::Error)]
pub enum PodError {
    /// A Kubernetes API call failed.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// A runtime verb failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeFailure),
    /// The registry failed.
    #[error(transparent)]
    Registry(#[from] RegistryFailure),
    /// A rule refused the operation.
    #[error(transparent)]
    Refused(#[from] Refused),
    /// A planned operation failed at a step (its compensations already ran), or a plan
    /// refused it: the plan's reason (if it gives one) and text.
    #[error("{message}")]
    Plan {
        /// The failOp reason the plan gives.
        reason: Option<&'static str>,
        /// The plan's text.
        message: String,
    },
    /// An operation resumed at startup still runs for the pod: the controller retries.
    #[error("resumed operation still in flight for {0}")]
    InFlight(String),
    /// The pod is not this agent's to act on (the admission's skip): the plan's text.
    #[error("{0}")]
    Skipped(String),
    /// An error, after what the agent was doing.
    #[error("{what}: {source}")]
    During {
        /// What the agent was doing (`ensure snapshot base image <image>`).
        what: String,
        /// The error.
        source: Box<PodError>,
    },
}

impl From<StepFailed> for PodError {
    fn from(f: StepFailed) -> Self {
        PodError::Plan {
            reason: f.reason,
            message: f.message,
        }
    }
}

impl From<kube::Error> for PodError {
    fn from(e: kube::Error) -> Self {
        PodError::Api(ApiError::Kube(e))
    }
}

impl From<RuntimeError> for PodError {
    fn from(e: RuntimeError) -> Self {
        PodError::Runtime(RuntimeFailure::Verb(e))
    }
}

impl PodError {
    /// A plan's failure text without a reason of its own.
    pub(crate) fn plan(message: impl Into<String>) -> Self {
        PodError::Plan {
            reason: None,
            message: message.into(),
        }
    }

    /// `self`, after what the agent was doing.
    pub(crate) fn during(self, what: impl Into<String>) -> Self {
        PodError::During {
            what: what.into(),
            source: Box::new(self),
        }
    }

    /// The failOp Event reason of the error, for an operation whose own failure reason is
    /// `fallback` (e.g. `CreateBringUpFailed`): a refusal and a plan speak for themselves,
    /// everything else is the operation's failure.
    pub(crate) fn reason_or(&self, fallback: &'static str) -> &'static str {
        match self {
            PodError::Refused(r) => r.reason,
            PodError::Plan { reason, .. } => reason.unwrap_or(fallback),
            PodError::During { source, .. } => source.reason_or(fallback),
            PodError::Api(_)
            | PodError::Runtime(_)
            | PodError::Registry(_)
            | PodError::InFlight(_)
            | PodError::Skipped(_) => fallback,
        }
    }

    /// The contract text of the error (the message of failOp's Event and of the `failed`
    /// lifecycle, `node.md` §12.3, §16).
    pub(crate) fn message(&self) -> String {
        self.to_string()
    }
}

/// An action's failure as the executor takes it: a refusal fails the operation with its
/// reason whatever the step's failure policy; anything else is the step's failure text.
impl From<PodError> for ActionError {
    fn from(e: PodError) -> Self {
        match e {
            PodError::Refused(Refused { reason, message }) => {
                ActionError::Refused { reason, message }
            }
            e => ActionError::Failed(e.message()),
        }
    }
}

impl From<RuntimeFailure> for ActionError {
    fn from(e: RuntimeFailure) -> Self {
        ActionError::Failed(e.to_string())
    }
}

impl From<RegistryFailure> for ActionError {
    fn from(e: RegistryFailure) -> Self {
        ActionError::Failed(e.to_string())
    }
}

impl From<GateError> for RegistryFailure {
    fn from(e: GateError) -> Self {
        // The gate's text (a refusal's or the read's) is what the step reports.
        RegistryFailure::Transfer(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_come_from_refusals_and_plans_else_the_operation() {
        let op = ev::CREATE_BRING_UP_FAILED;
        let refused = PodError::from(Refused {
            reason: ev::TENANT_ISOLATION_REFUSED,
            message: "no".into(),
        });
        assert_eq!(refused.reason_or(op), ev::TENANT_ISOLATION_REFUSED);
        assert_eq!(refused.message(), "no");
        let plan = PodError::from(StepFailed {
            reason: None,
            message: "clone failed".into(),
        });
        assert_eq!(plan.reason_or(op), op);
        assert_eq!(plan.message(), "clone failed");
        let named = PodError::from(StepFailed::refused(ev::TENANT_ISOLATION_REFUSED, "x"));
        let wrapped = named.during("ensure something");
        assert_eq!(wrapped.reason_or(op), ev::TENANT_ISOLATION_REFUSED);
        assert_eq!(wrapped.message(), "ensure something: x");
        let reg = PodError::from(RegistryFailure::NotConfigured);
        assert_eq!(reg.reason_or(op), op);
        assert_eq!(reg.message(), "no registry configured");
    }

    #[test]
    fn texts_keep_the_contract_wording() {
        assert_eq!(
            ApiError::TimedOut("status patch").to_string(),
            "status patch timed out"
        );
        assert_eq!(
            ApiError::Failed("annotation patch").to_string(),
            "annotation patch failed"
        );
        assert_eq!(
            RegistryFailure::NoArtifact("vm:tag".into()).to_string(),
            "no snapshot artifact vm:tag in the registry"
        );
        let during = RuntimeFailure::during(
            "start vm abc",
            RuntimeError::VmNotFound("VM not found: \"abc\"".into()),
        );
        assert!(during.to_string().starts_with("start vm abc: "), "{during}");
        let shared = RegistryFailure::from(Arc::new(RegistryFailure::NotConfigured));
        assert_eq!(shared.to_string(), "no registry configured");
        let refused: ActionError = PodError::from(Refused {
            reason: ev::TENANT_ISOLATION_REFUSED,
            message: "no".into(),
        })
        .into();
        assert!(
            matches!(refused, ActionError::Refused { reason, .. } if reason == ev::TENANT_ISOLATION_REFUSED)
        );
    }
}
