//! What every controller's reconcile needs around its own rules: the finalizer patches, and
//! the pass wrapper (a tracing span per pass naming the object and its generation, the pass
//! timed into `reconcile_duration_seconds`, failures counted into `reconcile_errors_total`).

use std::future::Future;
use std::time::Instant;

use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use tracing::Instrument as _;

use crate::metrics::{ControllerLabel, ErrorLabels, Metrics};

/// Trims an object before a cache keeps it: `metadata.managedFields` (often the largest part
/// of a pod, never read by a controller here) is dropped, so a cache of thousands of pods
/// holds what the passes read.
pub fn slim<K: Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

/// Whether `obj` carries `finalizer`.
pub fn has_finalizer<K: Resource>(obj: &K, finalizer: &str) -> bool {
    obj.finalizers().iter().any(|f| f == finalizer)
}

/// The merge patch that appends `finalizer` to `obj`'s list, guarded by its resourceVersion
/// (a concurrent change of the list makes the patch fail instead of dropping an entry).
pub fn add_finalizer_patch<K: Resource>(obj: &K, finalizer: &str) -> Value {
    let mut list = obj.finalizers().to_vec();
    list.push(finalizer.to_string());
    json!({"metadata": {"finalizers": list, "resourceVersion": obj.resource_version()}})
}

/// The merge patch that removes `finalizer` from `obj`'s list (the others stay), guarded by
/// its resourceVersion.
pub fn remove_finalizer_patch<K: Resource>(obj: &K, finalizer: &str) -> Value {
    let list: Vec<&String> = obj
        .finalizers()
        .iter()
        .filter(|f| *f != finalizer)
        .collect();
    json!({"metadata": {"finalizers": list, "resourceVersion": obj.resource_version()}})
}

/// `<namespace>/<name>` (or the name alone for a cluster-scoped object).
pub fn object_name<K: Resource>(obj: &K) -> String {
    match obj.namespace() {
        Some(ns) => format!("{ns}/{}", obj.name_any()),
        None => obj.name_any(),
    }
}

/// Runs one pass of `controller` on `obj`: inside a `reconcile` span (controller, object,
/// generation), timed into the `reconcile_duration_seconds` histogram (whose count is the
/// number of passes).
pub async fn pass<K, T, F>(controller: &'static str, metrics: &Metrics, obj: &K, body: F) -> T
where
    K: Resource,
    F: Future<Output = T>,
{
    let span = tracing::info_span!(
        "reconcile",
        controller,
        object = %object_name(obj),
        generation = obj.meta().generation,
    );
    let started = Instant::now();
    let out = body.instrument(span).await;
    metrics
        .reconcile_duration
        .get_or_create(&ControllerLabel {
            controller: controller.into(),
        })
        .observe(started.elapsed().as_secs_f64());
    out
}

/// Counts a failed pass of `controller` under its error class.
pub fn count_error(controller: &'static str, metrics: &Metrics, kind: &'static str) {
    metrics
        .reconcile_errors
        .get_or_create(&ErrorLabels {
            controller: controller.into(),
            kind: kind.into(),
        })
        .inc();
}

/// An error with its sources, `outer: inner: innermost` (for logs: `Display` alone shows only
/// the outermost context).
pub fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut next = err.source();
    while let Some(e) = next {
        out.push_str(": ");
        out.push_str(&e.to_string());
        next = e.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    fn cm(finalizers: &[&str]) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some("a".into()),
                namespace: Some("ns".into()),
                resource_version: Some("7".into()),
                finalizers: Some(finalizers.iter().map(|f| f.to_string()).collect()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    #[test]
    fn finalizer_patches_keep_the_other_entries_and_guard_the_version() {
        let obj = cm(&["other/keep", "ours/f"]);
        assert!(has_finalizer(&obj, "ours/f"));
        assert!(!has_finalizer(&obj, "ours/g"));
        assert_eq!(
            add_finalizer_patch(&cm(&["other/keep"]), "ours/f"),
            json!({"metadata": {"finalizers": ["other/keep", "ours/f"], "resourceVersion": "7"}})
        );
        assert_eq!(
            remove_finalizer_patch(&obj, "ours/f"),
            json!({"metadata": {"finalizers": ["other/keep"], "resourceVersion": "7"}})
        );
        assert_eq!(object_name(&obj), "ns/a");
    }

    #[test]
    fn a_cached_object_keeps_everything_but_its_managed_fields() {
        let mut obj = cm(&["ours/f"]);
        obj.metadata.managed_fields = Some(vec![Default::default(); 3]);
        obj.metadata.annotations = Some([("k".to_string(), "v".to_string())].into());
        let mut want = obj.clone();
        want.metadata.managed_fields = None;
        slim(&mut obj);
        assert_eq!(obj, want);
    }

    #[derive(Debug, thiserror::Error)]
    #[error("outer step")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn chain_names_every_source_once() {
        let e = Outer(std::io::Error::other("inner cause"));
        assert_eq!(chain(&e), "outer step: inner cause");
    }

    #[tokio::test]
    async fn a_pass_is_timed_under_its_controller() {
        let m = Metrics::new();
        let out = pass("test-controller", &m, &cm(&[]), async { 5 }).await;
        assert_eq!(out, 5);
        count_error("test-controller", &m, "kube");
        let text = m.render();
        assert!(
            text.contains(
                "cocoon_operator_reconcile_duration_seconds_count{controller=\"test-controller\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "cocoon_operator_reconcile_errors_total{controller=\"test-controller\",kind=\"kube\"} 1"
            ),
            "{text}"
        );
    }
}
