//! The operator's Prometheus metrics (`contract.md` §11.1), registered once per process and
//! rendered in the OpenMetrics text format by the admin server.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, RwLock};

use cocoon_api::contract::metrics::operator as names;
use cocoon_api::process::ProcessCollector;
use kube::runtime::reflector::Store;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// `namespace`, `cocoonset`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SetLabels {
    pub namespace: String,
    pub cocoonset: String,
}

/// `result` = `ok` | `timeout`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

/// `phase` before the Failed patch.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    pub phase: String,
}

/// `namespace`, `cocoonset`, `placement` = `hint-node` | `pool`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PlacementLabels {
    pub namespace: String,
    pub cocoonset: String,
    pub placement: String,
}

/// `trigger` = `connection` | `exec` of `cocoon_operator_idle_wakes_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TriggerLabel {
    pub trigger: String,
}

/// `controller`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabel {
    pub controller: String,
}

/// `controller`, `kind` (the error class).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub controller: String,
    pub kind: String,
}

/// `version`, `revision` of `cocoon_operator_build_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    pub version: String,
    pub revision: String,
}

/// `kind`, `phase` of `cocoon_operator_objects`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ObjectLabels {
    pub kind: String,
    pub phase: String,
}

/// The phases of one cache's objects, read at scrape time (`None`: no phase yet).
type PhaseSource = Box<dyn Fn() -> Vec<Option<&'static str>> + Send + Sync>;

/// What the scrape-time collector reads: the leadership probe and the object caches, both
/// installed once the controllers exist.
#[derive(Default)]
struct Live {
    leader: RwLock<Option<Box<dyn Fn() -> bool + Send + Sync>>>,
    phases: RwLock<Vec<(&'static str, PhaseSource)>>,
}

impl fmt::Debug for Live {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Live").finish_non_exhaustive()
    }
}

/// Renders `cocoon_operator_leader` and `cocoon_operator_objects` from [`Live`] on every
/// scrape: no bookkeeping in the controllers can drift from the caches or the Lease.
#[derive(Debug)]
struct LiveCollector(Arc<Live>);

impl Collector for LiveCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let leader = self
            .0
            .leader
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|probe| probe());
        // Before the leadership is installed the replica has not started reconciling.
        let value = ConstGauge::new(i64::from(leader.unwrap_or(false)));
        let me = encoder.encode_descriptor(
            names::LEADER,
            "Whether this replica holds the leader Lease (1) or stands by (0)",
            None,
            value.metric_type(),
        )?;
        value.encode(me)?;

        let sources = self.0.phases.read().unwrap_or_else(|e| e.into_inner());
        let mut counts: BTreeMap<(&'static str, &'static str), i64> = BTreeMap::new();
        for (kind, source) in sources.iter() {
            for phase in source() {
                *counts
                    .entry((kind, phase.unwrap_or(names::PHASE_UNKNOWN)))
                    .or_default() += 1;
            }
        }
        let mut me = encoder.encode_descriptor(
            names::OBJECTS,
            "Cached CocoonSets and CocoonHibernations by status.phase",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for ((kind, phase), n) in counts {
            let labels = ObjectLabels {
                kind: kind.to_string(),
                phase: phase.to_string(),
            };
            ConstGauge::new(n).encode(me.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

fn phase_histogram() -> Histogram {
    Histogram::new(names::PHASE_DURATION_BUCKETS)
}

fn reconcile_histogram() -> Histogram {
    Histogram::new([0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0])
}

/// Every operator metric.
pub struct Metrics {
    pub registry: Registry,
    pub subagent_rebuild: Family<SetLabels, Counter>,
    pub subagent_dead_letter: Family<SetLabels, Counter>,
    pub hibernate_phase_duration: Family<ResultLabel, Histogram>,
    pub wake_phase_duration: Family<ResultLabel, Histogram>,
    pub lifecycle_state_failed_observed: Family<PhaseLabel, Counter>,
    pub slot_release_pods_deleted: Family<SetLabels, Counter>,
    pub slot_release_wake: Family<PlacementLabels, Counter>,
    pub slot_release_wake_unschedulable: Family<SetLabels, Counter>,
    pub migrate_unschedulable: Family<SetLabels, Counter>,
    pub idle_suspends: Counter,
    pub idle_wakes: Family<TriggerLabel, Counter>,
    pub reconcile_duration: Family<ControllerLabel, Histogram>,
    pub reconcile_errors: Family<ErrorLabels, Counter>,
    pub build_info: Family<BuildLabels, Gauge>,
    /// The activator's (wake on connect).
    pub activator: crate::activator::metrics::ActivatorMetrics,
    live: Arc<Live>,
}

/// Registers one metric under its full name from the contract: prometheus-client appends
/// `_total` to counters by itself, so the suffix is stripped here (for every kind: no other
/// metric name ends in it).
fn register(
    registry: &mut Registry,
    full_name: &str,
    help: &str,
    metric: impl prometheus_client::registry::Metric,
) {
    let name = full_name.strip_suffix("_total").unwrap_or(full_name);
    registry.register(name, help, metric);
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let m = Metrics {
            subagent_rebuild: Family::default(),
            subagent_dead_letter: Family::default(),
            hibernate_phase_duration: Family::new_with_constructor(phase_histogram),
            wake_phase_duration: Family::new_with_constructor(phase_histogram),
            lifecycle_state_failed_observed: Family::default(),
            slot_release_pods_deleted: Family::default(),
            slot_release_wake: Family::default(),
            slot_release_wake_unschedulable: Family::default(),
            migrate_unschedulable: Family::default(),
            idle_suspends: Counter::default(),
            idle_wakes: Family::default(),
            reconcile_duration: Family::new_with_constructor(reconcile_histogram),
            reconcile_errors: Family::default(),
            build_info: Family::default(),
            activator: Default::default(),
            live: Arc::default(),
            registry: Registry::default(),
        };
        register(
            &mut registry,
            names::SUBAGENT_REBUILD_TOTAL,
            "Budgeted rebuild deletes of CocoonSet pods",
            m.subagent_rebuild.clone(),
        );
        register(
            &mut registry,
            names::SUBAGENT_DEAD_LETTER_TOTAL,
            "CocoonSet pods left in dead-letter",
            m.subagent_dead_letter.clone(),
        );
        register(
            &mut registry,
            names::HIBERNATE_PHASE_DURATION_SECONDS,
            "Time a CocoonHibernation spent in Hibernating",
            m.hibernate_phase_duration.clone(),
        );
        register(
            &mut registry,
            names::WAKE_PHASE_DURATION_SECONDS,
            "Time a CocoonHibernation spent in Waking",
            m.wake_phase_duration.clone(),
        );
        register(
            &mut registry,
            names::LIFECYCLE_STATE_FAILED_OBSERVED_TOTAL,
            "Main agents found failed through lifecycle-state=failed",
            m.lifecycle_state_failed_observed.clone(),
        );
        register(
            &mut registry,
            names::SLOT_RELEASE_PODS_DELETED_TOTAL,
            "Pods deleted to release their scheduling seat",
            m.slot_release_pods_deleted.clone(),
        );
        register(
            &mut registry,
            names::SLOT_RELEASE_WAKE_TOTAL,
            "Release-policy wakes that reached a live VM",
            m.slot_release_wake.clone(),
        );
        register(
            &mut registry,
            names::SLOT_RELEASE_WAKE_UNSCHEDULABLE_TOTAL,
            "Passes that saw a release wake pod Unschedulable",
            m.slot_release_wake_unschedulable.clone(),
        );
        register(
            &mut registry,
            names::MIGRATE_UNSCHEDULABLE_TOTAL,
            "Migrating passes that saw the restored main Unschedulable",
            m.migrate_unschedulable.clone(),
        );
        register(
            &mut registry,
            names::IDLE_SUSPENDS_TOTAL,
            "Idle suspends of CocoonSets (every member idle for spec.idle.suspendAfter)",
            m.idle_suspends.clone(),
        );
        register(
            &mut registry,
            names::IDLE_WAKES_TOTAL,
            "Wakes of idle-suspended CocoonSets, by what woke them",
            m.idle_wakes.clone(),
        );
        register(
            &mut registry,
            names::RECONCILE_DURATION_SECONDS,
            "Duration of one reconcile pass",
            m.reconcile_duration.clone(),
        );
        register(
            &mut registry,
            names::RECONCILE_ERRORS_TOTAL,
            "Reconcile passes that returned an error",
            m.reconcile_errors.clone(),
        );
        register(
            &mut registry,
            names::BUILD_INFO,
            "The running build: version and git revision (always 1)",
            m.build_info.clone(),
        );
        // Both triggers of the wake counter exist from the start.
        for trigger in [
            cocoon_api::contract::idle::WOKEN_BY_CONNECTION,
            cocoon_api::contract::idle::WOKEN_BY_EXEC,
        ] {
            let _ = m.idle_wakes.get_or_create(&TriggerLabel {
                trigger: trigger.into(),
            });
        }
        // Both outcomes of the phase histograms exist from the start.
        for result in [names::RESULT_OK, names::RESULT_TIMEOUT] {
            let labels = ResultLabel {
                result: result.into(),
            };
            let _ = m.hibernate_phase_duration.get_or_create(&labels);
            let _ = m.wake_phase_duration.get_or_create(&labels);
        }
        m.activator.register(&mut registry);
        registry.register_collector(Box::new(LiveCollector(m.live.clone())));
        registry.register_collector(Box::new(ProcessCollector::new()));
        Metrics { registry, ..m }
    }

    /// The counter families labelled by CocoonSet alone.
    fn set_families(&self) -> [&Family<SetLabels, Counter>; 5] {
        [
            &self.subagent_rebuild,
            &self.subagent_dead_letter,
            &self.slot_release_pods_deleted,
            &self.slot_release_wake_unschedulable,
            &self.migrate_unschedulable,
        ]
    }

    /// Creates every series of one CocoonSet at 0 (called when the controller first sees the
    /// set): `increase()` and `rate()` then see its first event, and the families are in the
    /// scrape before anything happened ([`Metrics::forget_set`] removes them again).
    pub fn init_set(&self, set: &SetLabels) {
        for family in self.set_families() {
            let _ = family.get_or_create(set);
        }
        for placement in [names::PLACEMENT_HINT_NODE, names::PLACEMENT_POOL] {
            let _ = self.slot_release_wake.get_or_create(&PlacementLabels {
                namespace: set.namespace.clone(),
                cocoonset: set.cocoonset.clone(),
                placement: placement.to_string(),
            });
        }
    }

    /// Creates `cocoon_operator_reconcile_errors_total{controller, kind}` at 0 for each error
    /// class `kinds` of `controller` (called when the controller starts), so the error-ratio
    /// alert sees the first failure.
    pub fn init_controller(&self, controller: &str, kinds: &[&str]) {
        for kind in kinds {
            let _ = self.reconcile_errors.get_or_create(&ErrorLabels {
                controller: controller.into(),
                kind: (*kind).into(),
            });
        }
    }

    /// Sets `cocoon_operator_build_info{version, revision}` = 1 (the binary knows both).
    pub fn set_build_info(&self, version: &str, revision: &str) {
        self.build_info
            .get_or_create(&BuildLabels {
                version: version.into(),
                revision: revision.into(),
            })
            .set(1);
    }

    /// `cocoon_operator_leader` follows `leadership` from now on (read on every scrape).
    pub fn watch_leadership(&self, leadership: crate::leader::Leadership) {
        let mut slot = self.live.leader.write().unwrap_or_else(|e| e.into_inner());
        *slot = Some(Box::new(move || leadership.is_leader()));
    }

    /// `cocoon_operator_objects{kind}` counts the objects of `store` by `phase_of` from now
    /// on (read on every scrape).
    pub fn count_phases<K>(
        &self,
        kind: &'static str,
        store: Store<K>,
        phase_of: fn(&K) -> Option<&'static str>,
    ) where
        K: kube::Resource + Clone + Send + Sync + 'static,
        K::DynamicType: std::hash::Hash + Eq + Clone + Send + Sync,
    {
        let source: PhaseSource =
            Box::new(move || store.state().iter().map(|o| phase_of(o)).collect());
        self.live
            .phases
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push((kind, source));
    }

    /// Removes every series of one CocoonSet (it was deleted): a long-running operator
    /// would otherwise render every set it ever saw.
    pub fn forget_set(&self, set: &SetLabels) {
        for family in self.set_families() {
            family.remove(set);
        }
        for placement in [
            cocoon_api::contract::metrics::operator::PLACEMENT_HINT_NODE,
            cocoon_api::contract::metrics::operator::PLACEMENT_POOL,
        ] {
            self.slot_release_wake.remove(&PlacementLabels {
                namespace: set.namespace.clone(),
                cocoonset: set.cocoonset.clone(),
                placement: placement.to_string(),
            });
        }
    }

    /// The registry in the OpenMetrics text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Encoding into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposes_the_spec_names() {
        let m = Metrics::new();
        m.hibernate_phase_duration
            .get_or_create(&ResultLabel {
                result: "ok".into(),
            })
            .observe(12.0);
        m.subagent_rebuild
            .get_or_create(&SetLabels {
                namespace: "ns".into(),
                cocoonset: "demo".into(),
            })
            .inc();
        let text = m.render();
        assert!(text.contains("cocoon_operator_hibernate_phase_duration_seconds_bucket{le=\"10.0\",result=\"ok\"} 0"), "{text}");
        assert!(text.contains("cocoon_operator_hibernate_phase_duration_seconds_bucket{le=\"30.0\",result=\"ok\"} 1"), "{text}");
        assert!(
            text.contains(
                "cocoon_operator_subagent_rebuild_total{namespace=\"ns\",cocoonset=\"demo\"} 1"
            ),
            "{text}"
        );
        assert!(text.contains("# TYPE cocoon_operator_hibernate_phase_duration_seconds histogram"));
        assert!(text.contains("# TYPE cocoon_operator_subagent_rebuild counter"));
    }

    #[test]
    fn build_info_leader_objects_and_process_families() {
        use cocoon_api::crd::set::{CocoonSet, CocoonSetPhase, CocoonSetSpec, CocoonSetStatus};
        use kube::runtime::watcher::Event;

        let m = Metrics::new();
        let text = m.render();
        assert!(text.contains("\ncocoon_operator_leader 0\n"), "{text}");
        assert!(
            text.contains("# TYPE cocoon_operator_objects gauge\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE process_cpu_seconds counter\n"),
            "{text}"
        );
        assert!(text.contains("\nprocess_resident_memory_bytes "), "{text}");

        m.set_build_info("1.2.3", "abc1234");
        m.watch_leadership(crate::leader::Leadership::always());
        let (store, mut writer) = kube::runtime::reflector::store::<CocoonSet>();
        let set = |name: &str, phase: Option<CocoonSetPhase>| {
            let mut cs = CocoonSet::new(name, CocoonSetSpec::with_image("ubuntu:24.04"));
            cs.metadata.namespace = Some("ns".into());
            cs.status = phase.map(|p| CocoonSetStatus {
                phase: Some(p),
                ..CocoonSetStatus::default()
            });
            cs
        };
        for (name, phase) in [
            ("a", Some(CocoonSetPhase::Failed)),
            ("b", Some(CocoonSetPhase::Failed)),
            ("c", Some(CocoonSetPhase::Running)),
            ("d", None),
        ] {
            writer.apply_watcher_event(&Event::Apply(set(name, phase)));
        }
        m.count_phases(names::KIND_COCOONSET, store, |cs| {
            cs.status.as_ref()?.phase.map(|p| p.as_str())
        });
        let text = m.render();
        for want in [
            "cocoon_operator_build_info{version=\"1.2.3\",revision=\"abc1234\"} 1\n",
            "\ncocoon_operator_leader 1\n",
            "cocoon_operator_objects{kind=\"CocoonSet\",phase=\"Failed\"} 2\n",
            "cocoon_operator_objects{kind=\"CocoonSet\",phase=\"Running\"} 1\n",
            "cocoon_operator_objects{kind=\"CocoonSet\",phase=\"Unknown\"} 1\n",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
    }

    #[test]
    fn a_forgotten_set_loses_every_series_and_others_keep_theirs() {
        let m = Metrics::new();
        let set = |name: &str| SetLabels {
            namespace: "ns".into(),
            cocoonset: name.into(),
        };
        for name in ["gone", "kept"] {
            m.subagent_rebuild.get_or_create(&set(name)).inc();
            m.subagent_dead_letter.get_or_create(&set(name)).inc();
            m.slot_release_pods_deleted.get_or_create(&set(name)).inc();
            m.slot_release_wake_unschedulable
                .get_or_create(&set(name))
                .inc();
            m.migrate_unschedulable.get_or_create(&set(name)).inc();
            for placement in ["hint-node", "pool"] {
                m.slot_release_wake
                    .get_or_create(&PlacementLabels {
                        namespace: "ns".into(),
                        cocoonset: name.into(),
                        placement: placement.into(),
                    })
                    .inc();
            }
        }
        m.forget_set(&set("gone"));
        let text = m.render();
        assert!(!text.contains("cocoonset=\"gone\""), "{text}");
        assert_eq!(
            text.matches("cocoonset=\"kept\"").count(),
            7,
            "every series of the other set stays: {text}"
        );
    }

    #[test]
    fn idle_suspends_and_wakes_are_counted_by_trigger() {
        let m = Metrics::new();
        let text = m.render();
        assert!(
            text.contains("cocoon_operator_idle_suspends_total 0"),
            "{text}"
        );
        for trigger in ["connection", "exec"] {
            let series = format!("cocoon_operator_idle_wakes_total{{trigger=\"{trigger}\"}} 0");
            assert!(text.contains(&series), "{series} from the start: {text}");
        }
        m.idle_suspends.inc();
        m.idle_wakes
            .get_or_create(&TriggerLabel {
                trigger: "exec".into(),
            })
            .inc();
        let text = m.render();
        assert!(
            text.contains("cocoon_operator_idle_suspends_total 1"),
            "{text}"
        );
        assert!(
            text.contains("cocoon_operator_idle_wakes_total{trigger=\"exec\"} 1"),
            "{text}"
        );
    }
}
