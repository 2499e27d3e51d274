//! The activator's metrics, registered with the operator's ([`crate::metrics::Metrics`]).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Histogram: seconds from accepting a connection to splicing it to the VM.
pub const WAKE_SECONDS: &str = "cocoon_operator_activator_wake_seconds";
/// Gauge: connections the activator holds (waiting or spliced).
pub const CONNECTIONS: &str = "cocoon_operator_activator_connections";
/// Counter: connections closed without a splice, by `reason`.
pub const REFUSED_TOTAL: &str = "cocoon_operator_activator_refused_total";

/// Values of `reason` of [`REFUSED_TOTAL`].
pub mod reason {
    /// `ACTIVATOR_MAX_CONNECTIONS` connections were held already.
    pub const FULL: &str = "full";
    /// The set was suspended by its user (no idle suspend): not woken.
    pub const USER_SUSPENDED: &str = "user_suspended";
    /// The set's `spec.idle.wakeOn` does not list `connect`.
    pub const CONNECT_NOT_ALLOWED: &str = "connect_not_allowed";
    /// The VM did not answer within `ACTIVATOR_WAKE_WAIT`.
    pub const WAIT_EXCEEDED: &str = "wait_exceeded";
    /// The port is not (or no longer) assigned, or the set is gone.
    pub const UNMAPPED: &str = "unmapped";
    /// The main VM's IP is outside `ACTIVATOR_VM_CIDRS`.
    pub const VM_NOT_ALLOWED: &str = "vm_not_allowed";
    /// Every value, so each series exists from the start.
    pub const ALL: [&str; 6] = [
        FULL,
        USER_SUSPENDED,
        CONNECT_NOT_ALLOWED,
        WAIT_EXCEEDED,
        UNMAPPED,
        VM_NOT_ALLOWED,
    ];
}

/// `reason`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

/// The activator's metric handles.
#[derive(Clone, Debug)]
pub struct ActivatorMetrics {
    pub wake_seconds: Histogram,
    pub connections: Gauge,
    pub refused: Family<ReasonLabel, Counter>,
}

impl Default for ActivatorMetrics {
    fn default() -> Self {
        ActivatorMetrics {
            wake_seconds: Histogram::new([0.01, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]),
            connections: Gauge::default(),
            refused: Family::default(),
        }
    }
}

impl ActivatorMetrics {
    /// Registers the three metrics (the counter without its `_total`, which the client adds).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            WAKE_SECONDS,
            "Seconds from accepting a connection to splicing it to the woken VM",
            self.wake_seconds.clone(),
        );
        registry.register(
            CONNECTIONS,
            "Connections the activator holds",
            self.connections.clone(),
        );
        registry.register(
            REFUSED_TOTAL.trim_end_matches("_total"),
            "Connections the activator closed without splicing, by reason",
            self.refused.clone(),
        );
        for r in reason::ALL {
            let _ = self
                .refused
                .get_or_create(&ReasonLabel { reason: r.into() });
        }
    }

    /// Counts one refused connection.
    pub fn refuse(&self, reason: &str) {
        self.refused
            .get_or_create(&ReasonLabel {
                reason: reason.into(),
            })
            .inc();
    }
}
