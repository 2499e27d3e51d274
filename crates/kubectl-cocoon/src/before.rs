//! The Events that were there before a write verb's write (issue 36 item 8). A wait shows a
//! Warning or a snapshot transfer only when it happened after the write: an Event that is new,
//! or one whose series moved on (its count, series count or last time changed). A time filter
//! alone ("not older than the write", less clock skew) let `resume` print the `pushed …` line
//! of the `suspend` run a second before it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ListParams};

use crate::waiter::last_seen;

/// How far an Event's series had got: what changes when it happens again.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mark {
    count: i32,
    series: i32,
    last: Option<Timestamp>,
}

fn mark(e: &Event) -> Mark {
    Mark {
        count: e.count.unwrap_or(0),
        series: e.series.as_ref().and_then(|s| s.count).unwrap_or(0),
        last: last_seen(e),
    }
}

/// The Events of the namespaces read before the write, by uid.
#[derive(Debug, Clone, Default)]
pub struct Before {
    /// The namespaces whose Events were read; another namespace's Events are not judged.
    namespaces: BTreeSet<String>,
    marks: BTreeMap<String, Mark>,
}

impl Before {
    /// What `events` (the whole list of each of `namespaces`) showed.
    pub fn of<'a>(namespaces: impl IntoIterator<Item = &'a str>, events: &[Event]) -> Before {
        Before {
            namespaces: namespaces.into_iter().map(str::to_string).collect(),
            marks: events
                .iter()
                .filter_map(|e| Some((e.metadata.uid.clone()?, mark(e))))
                .collect(),
        }
    }

    /// Whether `e` happened after the write: it was not there before, or its series moved
    /// on since. An Event of a namespace that was not read (its list failed), or without a
    /// uid, cannot be judged and counts (the time filter still applies).
    pub fn happened_after(&self, e: &Event) -> bool {
        let ns = e.metadata.namespace.as_deref().unwrap_or_default();
        if !self.namespaces.contains(ns) {
            return true;
        }
        let Some(uid) = e.metadata.uid.as_deref() else {
            return true;
        };
        self.marks.get(uid).is_none_or(|m| *m != mark(e))
    }
}

/// Which Events belong to this wait: not older than `since` (the write, less clock skew) and,
/// when the Events before the write are known, new or moved on since.
#[derive(Debug, Clone, Default)]
pub struct After {
    pub since: Option<Timestamp>,
    pub before: Option<Arc<Before>>,
}

impl After {
    pub fn admits(&self, e: &Event) -> bool {
        let recent = match (self.since, last_seen(e)) {
            (Some(s), Some(t)) => t >= s,
            _ => true,
        };
        recent && self.before.as_ref().is_none_or(|b| b.happened_after(e))
    }
}

/// At most this many namespaces are read before a write (one list of Events each).
const MAX_NAMESPACES: usize = 64;

/// Reads the Events of the targets' namespaces right before the writes: the same `list
/// events` the waits make (no other permission). A namespace whose list fails is left out
/// (its Events then go by time only); so are namespaces past [`MAX_NAMESPACES`].
pub async fn read<'a>(client: &Client, namespaces: impl IntoIterator<Item = &'a str>) -> Before {
    let wanted: BTreeSet<&str> = namespaces.into_iter().collect();
    let lists: Vec<(String, Option<Vec<Event>>)> =
        futures::stream::iter(wanted.into_iter().take(MAX_NAMESPACES))
            .map(|ns| async move {
                let api: Api<Event> = Api::namespaced(client.clone(), ns);
                let items = api.list(&ListParams::default()).await.ok().map(|l| l.items);
                (ns.to_string(), items)
            })
            .buffer_unordered(8)
            .collect()
            .await;
    let read: Vec<&str> = lists
        .iter()
        .filter(|(_, l)| l.is_some())
        .map(|(ns, _)| ns.as_str())
        .collect();
    let events: Vec<Event> = lists
        .iter()
        .flat_map(|(_, l)| l.iter().flatten())
        .cloned()
        .collect();
    Before::of(read, &events)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(uid: &str, ns: &str, count: i32, series: Option<(i32, &str)>, last: &str) -> Event {
        let mut v = json!({
            "metadata": {"name": format!("e-{uid}"), "namespace": ns, "uid": uid},
            "involvedObject": {"kind": "Pod", "name": "demo-0"},
            "type": "Normal", "reason": "SnapshotPushed",
            "message": "pushed 8.5 KiB of 8.5 KiB (v1)",
            "count": count, "lastTimestamp": last
        });
        if let Some((n, at)) = series {
            v["series"] = json!({"count": n, "lastObservedTime": at});
        }
        serde_json::from_value(v).expect("event")
    }

    fn ts(s: &str) -> Timestamp {
        s.parse().expect("ts")
    }

    #[test]
    fn only_what_happened_after_the_write_counts() {
        let push = event("u-push", "ns", 1, None, "2026-12-01T10:00:00Z");
        let series = event(
            "u-series",
            "ns",
            1,
            Some((2, "2026-12-01T10:00:00.100000Z")),
            "2026-12-01T10:00:00Z",
        );
        let before = Before::of(["ns"], &[push.clone(), series.clone()]);
        // The write is in the same second as the push: the time filter alone keeps it.
        let after = After {
            since: Some(ts("2026-12-01T10:00:00Z")),
            before: Some(Arc::new(before.clone())),
        };
        let time_only = After {
            since: after.since,
            before: None,
        };
        let cases: Vec<(&str, Event, bool)> = vec![
            (
                "an event from the previous verb in the same second is not shown",
                push.clone(),
                false,
            ),
            (
                "a series seen before the write, unchanged, is not shown",
                series.clone(),
                false,
            ),
            (
                "a series that advanced after the write is shown",
                event(
                    "u-series",
                    "ns",
                    1,
                    Some((3, "2026-12-01T10:00:01Z")),
                    "2026-12-01T10:00:00Z",
                ),
                true,
            ),
            (
                "a core/v1 count that went up is shown",
                event("u-push", "ns", 2, None, "2026-12-01T10:00:02Z"),
                true,
            ),
            (
                "a new event is shown",
                event("u-pull", "ns", 1, None, "2026-12-01T10:00:01Z"),
                true,
            ),
            (
                "a new event older than the write (clock skew aside) is not",
                event("u-old", "ns", 1, None, "2026-12-01T09:59:00Z"),
                false,
            ),
            (
                "an event of a namespace that was not read goes by time",
                event("u-push", "other", 1, None, "2026-12-01T10:00:00Z"),
                true,
            ),
        ];
        for (what, e, shown) in cases {
            assert_eq!(after.admits(&e), shown, "{what}");
        }
        // The old filter: the previous verb's push passes.
        assert!(time_only.admits(&push), "the time filter alone shows it");
        // Nothing known before: every recent event counts.
        assert!(After::default().admits(&push));
    }

    #[test]
    fn an_event_without_a_uid_cannot_be_judged_and_counts() {
        let mut e = event("u", "ns", 1, None, "2026-12-01T10:00:00Z");
        let before = Before::of(["ns"], std::slice::from_ref(&e));
        assert!(!before.happened_after(&e));
        e.metadata.uid = None;
        assert!(before.happened_after(&e));
    }
}
