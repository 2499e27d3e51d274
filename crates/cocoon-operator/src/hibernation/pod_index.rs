//! The CRs by the pod they name (`spec.podRef.name` in the CR's namespace), kept from the CR
//! watch: a pod event wakes the CRs naming that pod by one lookup instead of a scan of every CR.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use cocoon_api::crd::hibernation::CocoonHibernation;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::Event;

/// A pod: namespace and name.
pub type PodKey = (String, String);
/// A CR: namespace and name.
type CrKey = (String, String);

fn cr_key(cr: &CocoonHibernation) -> CrKey {
    (cr.namespace().unwrap_or_default(), cr.name_any())
}

#[derive(Debug, Default)]
struct Maps {
    /// Pod → the CRs naming it.
    by_pod: BTreeMap<PodKey, BTreeSet<CrKey>>,
    /// CR → the pod it names now (to move it when its podRef changes).
    by_cr: BTreeMap<CrKey, PodKey>,
}

impl Maps {
    fn remove(&mut self, cr: &CrKey) {
        if let Some(pod) = self.by_cr.remove(cr)
            && let Some(set) = self.by_pod.get_mut(&pod)
        {
            set.remove(cr);
            if set.is_empty() {
                self.by_pod.remove(&pod);
            }
        }
    }

    fn upsert(&mut self, cr: &CocoonHibernation) {
        let key = cr_key(cr);
        self.remove(&key);
        if let Some(pod) = pod_of(cr) {
            self.by_pod
                .entry(pod.clone())
                .or_default()
                .insert(key.clone());
            self.by_cr.insert(key, pod);
        }
    }
}

/// The pod a CR names, if it names one.
pub fn pod_of(cr: &CocoonHibernation) -> Option<PodKey> {
    let ns = cr.namespace()?;
    let name = &cr.spec.pod_ref.name;
    (!name.is_empty()).then(|| (ns, name.clone()))
}

/// CRs by the pod they name.
#[derive(Debug, Default)]
pub struct PodIndex {
    maps: Mutex<Maps>,
    /// The relist in progress (between `Init` and `InitDone`), swapped in when complete so
    /// that CRs deleted while the watch was down leave the index.
    relist: Mutex<Option<Maps>>,
}

impl PodIndex {
    /// Applies one event of the CR watch.
    pub fn apply(&self, event: &Event<CocoonHibernation>) {
        match event {
            Event::Apply(cr) => self.lock().upsert(cr),
            Event::Delete(cr) => self.lock().remove(&cr_key(cr)),
            Event::Init => *self.relist_lock() = Some(Maps::default()),
            Event::InitApply(cr) => {
                if let Some(m) = self.relist_lock().as_mut() {
                    m.upsert(cr);
                }
            }
            Event::InitDone => {
                if let Some(m) = self.relist_lock().take() {
                    *self.lock() = m;
                }
            }
        }
    }

    /// The CRs that name the pod `namespace/name`.
    pub fn crs_for(&self, namespace: &str, name: &str) -> Vec<ObjectRef<CocoonHibernation>> {
        self.lock()
            .by_pod
            .get(&(namespace.to_string(), name.to_string()))
            .map(|s| {
                s.iter()
                    .map(|(ns, name)| ObjectRef::new(name).within(ns))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Maps> {
        self.maps
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn relist_lock(&self) -> std::sync::MutexGuard<'_, Option<Maps>> {
        self.relist
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cocoon_api::crd::hibernation::{CocoonHibernationSpec, Desire, PodRef};

    fn cr(ns: &str, name: &str, pod: &str) -> CocoonHibernation {
        let mut cr = CocoonHibernation::new(
            name,
            CocoonHibernationSpec {
                pod_ref: PodRef { name: pod.into() },
                desire: Desire::Hibernate,
            },
        );
        cr.metadata.namespace = Some(ns.into());
        cr
    }

    fn names(refs: Vec<ObjectRef<CocoonHibernation>>) -> Vec<String> {
        refs.into_iter().map(|r| r.name).collect()
    }

    /// An event, the pod looked up after it, the CRs expected.
    type Step = (
        Event<CocoonHibernation>,
        (&'static str, &'static str),
        Vec<&'static str>,
    );

    #[test]
    fn a_pod_finds_exactly_the_crs_naming_it() {
        let index = PodIndex::default();
        let steps: Vec<Step> = vec![
            (Event::Apply(cr("a", "h1", "p")), ("a", "p"), vec!["h1"]),
            (
                Event::Apply(cr("a", "h2", "p")),
                ("a", "p"),
                vec!["h1", "h2"],
            ),
            // Same pod name, other namespace: not the same pod.
            (
                Event::Apply(cr("b", "h3", "p")),
                ("a", "p"),
                vec!["h1", "h2"],
            ),
            // A podRef change moves the CR.
            (Event::Apply(cr("a", "h1", "q")), ("a", "p"), vec!["h2"]),
            (Event::Apply(cr("a", "h4", "x")), ("a", "q"), vec!["h1"]),
            (Event::Delete(cr("a", "h2", "p")), ("a", "p"), vec![]),
            // An empty podRef names no pod.
            (Event::Apply(cr("a", "h1", "")), ("a", "q"), vec![]),
            (Event::Apply(cr("a", "h5", "p")), ("b", "p"), vec!["h3"]),
        ];
        for (i, (event, (ns, pod), want)) in steps.into_iter().enumerate() {
            index.apply(&event);
            assert_eq!(names(index.crs_for(ns, pod)), want, "step {i}");
        }
    }

    #[test]
    fn a_relist_replaces_the_index_when_complete() {
        let index = PodIndex::default();
        index.apply(&Event::Apply(cr("a", "gone", "p")));
        index.apply(&Event::Init);
        index.apply(&Event::InitApply(cr("a", "kept", "p")));
        assert_eq!(
            names(index.crs_for("a", "p")),
            ["gone"],
            "until the relist is complete the old index answers"
        );
        index.apply(&Event::InitDone);
        assert_eq!(names(index.crs_for("a", "p")), ["kept"]);
    }
}
