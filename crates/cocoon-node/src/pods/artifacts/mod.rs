//! The artifact side of the node agent: the runtime, the registry, the shared registry pulls
//! and their transfer metrics, and the owner records of snapshots. The trust gate's lookups
//! are in `owned`, the transfers in `transfer`, the clone-base collection in `clone_gc`;
//! this file holds the part itself and its runtime reads.

pub(crate) mod clone_gc;
mod owned;
pub(crate) mod transfer;

pub(crate) use owned::PushRefusal;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cocoon_registry::RegistryClient;
use cocoon_runtime::{Runtime, StaleCreateOutcome, VmRecord};
use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::api_writer::ApiWriter;
use super::flights::{FlightLock, Flights};
use super::host_reach::UrlPrefix;
use super::reconcile::{confirmed_record, needs_liveness_check};
use super::rules::{self, InspectOutcome};
use crate::metrics::NodeMetrics;
use transfer::SharedPull;

/// The runtime, the registry, the pulls in flight and what transfers report.
pub(crate) struct Artifacts {
    rt: Arc<dyn Runtime>,
    registry: Option<RegistryClient>,
    metrics: Arc<NodeMetrics>,
    /// Registry pulls in flight, by destination snapshot (see `shared_pull`).
    pulls: Arc<Mutex<HashMap<String, SharedPull>>>,
    /// Single flights of snapshot, fork and image materialisation.
    flights: Flights,
    /// Ends the pulls and the detached removals.
    shutdown: CancellationToken,
    /// Transfer Events and the namespace reads of owner records.
    api: ApiWriter,
    /// `VK_RUN_IMAGE_URL_ALLOW` (a snapshot's URL base image is fetched by the host).
    run_image_urls: Vec<UrlPrefix>,
    /// `VK_CLONE_BASE_KEEP`.
    clone_base_keep: usize,
}

impl Artifacts {
    /// The artifact side over `rt` and `registry`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        rt: Arc<dyn Runtime>,
        registry: Option<RegistryClient>,
        metrics: Arc<NodeMetrics>,
        shutdown: CancellationToken,
        api: ApiWriter,
        run_image_urls: Vec<UrlPrefix>,
        clone_base_keep: usize,
    ) -> Self {
        Artifacts {
            rt,
            registry,
            metrics,
            pulls: Arc::default(),
            flights: Flights::default(),
            shutdown,
            api,
            run_image_urls,
            clone_base_keep,
        }
    }

    /// The runtime.
    pub(crate) fn rt(&self) -> &Arc<dyn Runtime> {
        &self.rt
    }

    /// The registry, if one is configured.
    pub(crate) fn registry(&self) -> Option<&RegistryClient> {
        self.registry.as_ref()
    }

    /// A per-key lock for single flights: the holder re-checks the local store, so concurrent
    /// callers end up doing the work once ([`super::flights`]).
    fn flight(&self, key: &str) -> FlightLock {
        self.flights.get(key)
    }

    /// Runs `fut` in the background until it ends or the agent shuts down.
    pub(crate) fn spawn<F>(&self, fut: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        super::spawn_until(&self.shutdown, fut);
    }

    /// `vm inspect` of `id` as the VM event handler reads it (§10): one retry of a failure
    /// that is not "not found".
    pub(crate) async fn inspect_outcome(&self, id: &str) -> InspectOutcome {
        for attempt in 1..=2u32 {
            match self.rt.inspect(id).await {
                Ok(vm) => return InspectOutcome::State(vm.state),
                Err(e) if e.is_vm_not_found() => return InspectOutcome::NotFound,
                Err(_) if attempt < 2 => {
                    tokio::time::sleep(Duration::from_millis(200) * attempt).await
                }
                Err(_) => {}
            }
        }
        InspectOutcome::Transient
    }

    /// Confirms every listed `running` VM with `inspect` (parallelism 8) before adoption
    /// counts it as up ([`confirmed_record`]).
    pub(crate) async fn confirm_listed_running(&self, vms: Vec<VmRecord>) -> Vec<VmRecord> {
        let checked: Vec<Option<VmRecord>> = futures::stream::iter(vms)
            .map(|vm| async move {
                if !needs_liveness_check(&vm) {
                    return Some(vm);
                }
                let inspected = self.rt.inspect(&vm.id).await;
                if let Err(e) = &inspected {
                    warn!(id = %vm.id, error = %e, "confirming a listed running VM failed");
                }
                let kept = confirmed_record(vm.clone(), inspected);
                match &kept {
                    None => info!(id = %vm.id, "listed VM is gone"),
                    Some(k) if !k.is_running() => {
                        info!(id = %vm.id, state = %k.state, "listed as running, but not live")
                    }
                    Some(_) => {}
                }
                kept
            })
            .buffered(8)
            .collect()
            .await;
        checked.into_iter().flatten().collect()
    }

    /// One `reconcile_stale_create` call (§14), logged and counted; `None` when the verb
    /// failed. The watcher's repeated asks (`again`) log at debug level only.
    pub(crate) async fn ask_stale_create(
        &self,
        vm: &VmRecord,
        again: bool,
    ) -> Option<StaleCreateOutcome> {
        let answer = match self.rt.reconcile_stale_create(&vm.id).await {
            Ok(outcome) if again => {
                debug!(vm = %vm.name(), id = %vm.id, outcome = outcome.as_wire(), "reconcile-stale-create answered again");
                Some(outcome)
            }
            Ok(outcome) => {
                info!(vm = %vm.name(), id = %vm.id, outcome = outcome.as_wire(), "reconcile-stale-create answered");
                Some(outcome)
            }
            Err(e) if again => {
                debug!(vm = %vm.name(), id = %vm.id, error = %e, "reconcile-stale-create failed again");
                None
            }
            Err(e) => {
                warn!(vm = %vm.name(), id = %vm.id, error = %e, "reconcile-stale-create failed");
                None
            }
        };
        self.metrics
            .stale_create_reconcile(rules::stale_create_label(answer));
        answer
    }
}
