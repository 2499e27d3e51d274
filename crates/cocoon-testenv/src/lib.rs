//! A real local Kubernetes control plane (etcd, kube-apiserver, kube-scheduler,
//! kube-controller-manager, built from upstream Go modules) and an OCI registry for tests.
//!
//! Start order: PKI → etcd ∥ registry → apiserver (`/readyz`) → scheduler ∥ controller-manager
//! (`/healthz`) → `sa/default` → CRDs Established. Teardown runs in reverse, registry last.
//! Tests normally use [`shared`] (one env per process, or an external one named by
//! `TESTENV_KUBECONFIG`/`TESTENV_REGISTRY`) through [`run_test`], isolate by namespace
//! ([`create_namespace`]) and node name ([`unique_name`]), and get schedulable nodes from
//! [`TestNode`]. A test that runs pods for real asks for [`Shared::kubelet`]: one kubelet
//! node with containerd, started on first use only.

pub mod audit;
pub mod bench;
pub mod crds;
mod env;
mod error;
mod identity;
mod kubeconfig;
pub mod kubelet;
pub mod node;
pub mod paths;
mod pki;
mod process;
pub mod registry;
mod rundir;
mod shared;
mod wait;

pub use audit::{AuditLog, AuditRecord};
pub use env::{ComponentMemory, Options, StartupReport, TestEnv};
pub use error::{Error, Result};
pub use identity::{bind_cluster_role, service_account_token};
pub use kubeconfig::client_for;
pub use kubelet::{
    KUBELET_NODE_IP, KUBELET_TAINT_KEY, Kubelet, KubeletOptions, SIM_VM_RANGE,
    ensure_loopback_address, ensure_sim_vm_range,
};
pub use node::TestNode;
pub use process::free_ports;
pub use registry::{Registry, RegistryAuth, TokenAuth};
pub use rundir::log_tails_in;
pub use shared::{
    DEFAULT_WAIT, LOG_TAIL_LINES, LogsOnFailure, QUIET_FILTER, Shared, TEST_NAMESPACE_LABEL,
    TestOutcome, create_namespace, delete_namespace, ensure_namespace, init_tracing, run_test,
    shared, try_shared, unique_name,
};
pub use wait::{POLL_INTERVAL, Probe, poll, wait_until};
