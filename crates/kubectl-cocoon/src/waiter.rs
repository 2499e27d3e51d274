//! The wait loop around the pure evaluator: read the current object first, then watch from its
//! resourceVersion; re-list when the watch closes; retry only transient errors; fail fast on
//! RBAC and not-found; report progress, and the newest Warning Event of the object as it
//! arrives. A timeout or a Failed carries the last state and the newest warning.

use std::fmt::Debug;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::time::Instant;

use crate::before::After;
use crate::error::CliError;
use crate::progress::Line;
use crate::wait::{Goal, Observation, Verdict, WaitState};

/// What to wait for and how.
pub struct WaitSpec<'a> {
    pub kind: &'static str,
    pub name: &'a str,
    pub goal: Goal,
    pub goal_text: String,
    pub generation: i64,
    /// The shared deadline of every target of the command.
    pub deadline: Instant,
    /// The budget the deadline came from (for the timeout message).
    pub timeout: Duration,
    pub grace: Duration,
    /// Where the object's Warning Events are read.
    pub warnings: Option<Warnings>,
}

/// The Warning Events of one target: core/v1 Events whose involvedObject is one of
/// `objects` (kind, name), or a member pod the observations name, that happened after the
/// write (`after`).
#[derive(Clone)]
pub struct Warnings {
    pub api: Api<Event>,
    pub objects: Vec<(&'static str, String)>,
    /// Older events, and those already there before the write, describe an earlier round.
    pub after: After,
}

/// When an Event last happened (series, lastTimestamp, eventTime, creation).
pub fn last_seen(e: &Event) -> Option<Timestamp> {
    e.series
        .as_ref()
        .and_then(|s| s.last_observed_time.as_ref().map(|t| t.0))
        .or(e.last_timestamp.as_ref().map(|t| t.0))
        .or(e.event_time.as_ref().map(|t| t.0))
        .or(e.first_timestamp.as_ref().map(|t| t.0))
        .or(e.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// The newest Warning of `events` about one of `objects` (kind, name, and uid when known),
/// that happened after the write, as `Reason: message`.
pub fn newest_warning(
    events: &[Event],
    objects: &[(&str, &str, Option<&str>)],
    after: &After,
) -> Option<String> {
    newest_of(events, objects, after, |e| {
        e.type_.as_deref() == Some("Warning")
    })
    .map(|e| {
        format!(
            "{}: {}",
            e.reason.clone().unwrap_or_default(),
            e.message.clone().unwrap_or_default()
        )
    })
}

/// The node agent's Normal Events that say how much a snapshot transfer moved (additive
/// reasons of the node agent; the message is `pushed 1.6 GiB of 6.0 GiB (v2 zstd) in 4.2 s`).
pub const TRANSFER_REASONS: [&str; 2] = [
    cocoon_api::contract::events::node::SNAPSHOT_PUSHED,
    cocoon_api::contract::events::node::SNAPSHOT_PULLED,
];

/// The message of the newest snapshot transfer Event about one of `objects` (the member
/// pods) that happened after the write.
pub fn newest_transfer(
    events: &[Event],
    objects: &[(&str, &str, Option<&str>)],
    after: &After,
) -> Option<String> {
    newest_of(events, objects, after, |e| {
        e.type_.as_deref() == Some("Normal")
            && e.reason
                .as_deref()
                .is_some_and(|r| TRANSFER_REASONS.contains(&r))
    })
    .and_then(|e| e.message.clone())
}

/// Every snapshot transfer Event about one of `pods` that happened after the write, oldest first,
/// as the `transfers` entries of a lifecycle verb's `-o json|yaml` result:
/// `{"pod", "reason", "message", "time"}` (the message says how much moved, e.g.
/// `pushed 1.6 GiB of 6.0 GiB (v2 zstd) in 4.2 s`).
pub fn transfers_of(events: &[Event], pods: &[&str], after: &After) -> Vec<serde_json::Value> {
    let mut found: Vec<&Event> = events
        .iter()
        .filter(|e| {
            e.type_.as_deref() == Some("Normal")
                && e.reason
                    .as_deref()
                    .is_some_and(|r| TRANSFER_REASONS.contains(&r))
                && e.involved_object.kind.as_deref() == Some("Pod")
                && e.involved_object
                    .name
                    .as_deref()
                    .is_some_and(|n| pods.contains(&n))
        })
        .filter(|e| after.admits(e))
        .collect();
    found.sort_by_key(|e| last_seen(e));
    found
        .into_iter()
        .map(|e| {
            serde_json::json!({
                "pod": e.involved_object.name,
                "reason": e.reason,
                "message": e.message,
                "time": last_seen(e).map(|t| t.to_string()),
            })
        })
        .collect()
}

fn newest_of<'e>(
    events: &'e [Event],
    objects: &[(&str, &str, Option<&str>)],
    after: &After,
    pick: impl Fn(&Event) -> bool,
) -> Option<&'e Event> {
    events
        .iter()
        .filter(|e| pick(e))
        .filter(|e| {
            let io = &e.involved_object;
            let uid = io.uid.as_deref().unwrap_or("");
            objects.iter().any(|(k, n, u)| {
                io.kind.as_deref() == Some(*k)
                    && io.name.as_deref() == Some(*n)
                    && (uid.is_empty() || u.is_none_or(|u| u == uid))
            })
        })
        .filter(|e| after.admits(e))
        .max_by_key(|e| last_seen(e))
}

impl Warnings {
    /// One request: by name when every object shares one (a pod and its hibernation), else
    /// the namespace's Warnings.
    async fn newest(&self, members: &[String], uids: &[(&'static str, String)]) -> Option<String> {
        let uid_of = |kind: &str| {
            uids.iter()
                .find(|(k, _)| *k == kind)
                .map(|(_, u)| u.as_str())
        };
        let mut objects: Vec<(&str, &str, Option<&str>)> = self
            .objects
            .iter()
            .map(|(k, n)| (*k, n.as_str(), uid_of(k)))
            .collect();
        objects.extend(members.iter().map(|m| ("Pod", m.as_str(), None)));
        let first = objects.first().map(|o| o.1)?;
        let selector = if objects.iter().all(|o| o.1 == first) {
            format!("involvedObject.name={first},type=Warning")
        } else {
            "type=Warning".to_string()
        };
        let list = self
            .api
            .list(&ListParams::default().fields(&selector))
            .await
            .ok()?;
        newest_warning(&list.items, &objects, &self.after)
    }

    /// The newest transfer Event of the member pods (and pod objects), if any.
    async fn newest_transfer(&self, members: &[String]) -> Option<String> {
        let mut pods: Vec<(&str, &str, Option<&str>)> = self
            .objects
            .iter()
            .filter(|(k, _)| *k == "Pod")
            .map(|(k, n)| (*k, n.as_str(), None))
            .collect();
        pods.extend(members.iter().map(|m| ("Pod", m.as_str(), None)));
        let first = pods.first().map(|o| o.1)?;
        let selector = if pods.iter().all(|o| o.1 == first) {
            format!("involvedObject.name={first},type=Normal")
        } else {
            "type=Normal".to_string()
        };
        let list = self
            .api
            .list(&ListParams::default().fields(&selector))
            .await
            .ok()?;
        newest_transfer(&list.items, &pods, &self.after)
    }
}

/// The state of one wait between observations.
struct Judge<'s, 'a> {
    spec: &'s WaitSpec<'a>,
    line: &'s Line,
    state: WaitState,
    started: Instant,
    last_failure: Option<String>,
    last_state: Option<String>,
    last_warning: Option<String>,
    /// The last snapshot transfer line shown.
    last_transfer: Option<String>,
    /// The member pods the last observation named (their Warnings count too).
    members: Vec<String>,
    /// The (kind, uid) of the objects the last observation read.
    uids: Vec<(&'static str, String)>,
}

impl Judge<'_, '_> {
    fn judge<K: Clone>(
        &mut self,
        (obj, obs): (Option<K>, Observation),
    ) -> Result<Option<Option<K>>, CliError> {
        let spec = self.spec;
        if !obs.members.is_empty() {
            self.members = obs.members.clone();
        }
        if !obs.uids.is_empty() {
            self.uids = obs.uids.clone();
        }
        let verdict = self.state.evaluate(
            &spec.goal,
            &obs,
            spec.generation,
            spec.grace,
            self.started.elapsed(),
        );
        if obs.phase == crate::wait::FAILED {
            self.last_failure = Some(if obs.ready_message.is_empty() {
                obs.phase.clone()
            } else {
                obs.ready_message.clone()
            });
        }
        match verdict {
            Verdict::Done => {
                let text = if obs.phase.is_empty() {
                    spec.goal_text.clone()
                } else if spec.goal == Goal::PodReady {
                    format!("{} (pod Ready)", obs.phase)
                } else {
                    obs.phase.clone()
                };
                self.line.finish(&text);
                Ok(Some(obj))
            }
            Verdict::Waiting(msg) => {
                self.line.say(&msg);
                self.last_state = Some(msg);
                Ok(None)
            }
            Verdict::Failed(msg) => {
                self.line.finish(&msg);
                Err(CliError::Failed {
                    kind: spec.kind,
                    name: spec.name.to_string(),
                    reason: msg,
                    last_warning: self.last_warning.clone(),
                })
            }
            Verdict::Gone => Err(CliError::NotFound(format!(
                "{} {} not found",
                spec.kind, spec.name
            ))),
        }
    }

    async fn poll_warnings(&mut self) {
        let Some(w) = &self.spec.warnings else {
            return;
        };
        if let Some(text) = w.newest(&self.members, &self.uids).await
            && self.last_warning.as_deref() != Some(text.as_str())
        {
            self.line.warn(&text);
            self.last_warning = Some(text);
        }
        if let Some(text) = w.newest_transfer(&self.members).await
            && self.last_transfer.as_deref() != Some(text.as_str())
        {
            self.line.note(&text);
            self.last_transfer = Some(text);
        }
    }

    fn timeout(&self) -> CliError {
        CliError::Timeout {
            kind: self.spec.kind,
            name: self.spec.name.to_string(),
            goal: self.spec.goal_text.clone(),
            after: self.spec.timeout,
            seen: Box::new(crate::error::Seen {
                failure: self.last_failure.clone(),
                state: self.last_state.clone(),
                warning: self.last_warning.clone(),
            }),
        }
    }
}

/// Waits until `observe` says the goal holds at the spec's generation, or the deadline.
/// `observe` may read more than the object (the migration reads the main pod, a pod target
/// its pod). A zero timeout checks once. The object is None only for a pod target without a
/// CocoonHibernation.
pub async fn wait_for<K, F, Fut>(
    api: &Api<K>,
    spec: WaitSpec<'_>,
    line: &Line,
    observe: F,
) -> Result<Option<K>, CliError>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    F: Fn(Option<K>) -> Fut,
    Fut: Future<Output = Result<(Option<K>, Observation), CliError>>,
{
    let mut j = Judge {
        spec: &spec,
        line,
        state: WaitState::default(),
        started: Instant::now(),
        last_failure: None,
        last_state: None,
        last_warning: None,
        last_transfer: None,
        members: Vec::new(),
        uids: Vec::new(),
    };
    if spec.timeout.is_zero() {
        let current = api
            .get_opt(spec.name)
            .await
            .map_err(|e| CliError::from_kube(&format!("get {} {}", spec.kind, spec.name), e))?;
        let judged = j.judge(observe(current).await?)?;
        if let Some(done) = judged {
            return Ok(done);
        }
        j.poll_warnings().await;
        return Err(j.timeout());
    }
    let result = tokio::time::timeout_at(spec.deadline, async {
        let mut first = true;
        loop {
            // Current state first: an object that is already done returns at once.
            let current = match api.get_opt(spec.name).await {
                Ok(o) => o,
                Err(e) if CliError::is_transient_kube(&e) => {
                    line.say(&format!("retrying after a transient error: {e}"));
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
                Err(e) => return Err(CliError::from_kube(&format!("get {} {}", spec.kind, spec.name), e)),
            };
            let rv = current.as_ref().and_then(|o| o.resource_version()).unwrap_or_default();
            if let Some(done) = j.judge(observe(current).await?)? {
                return Ok(done);
            }
            if first {
                first = false;
                j.poll_warnings().await;
            }
            let params = WatchParams::default()
                .fields(&format!("metadata.name={}", spec.name))
                .timeout(60);
            let stream = match api.watch(&params, &rv).await {
                Ok(s) => s,
                Err(e) if CliError::is_transient_kube(&e) => continue,
                Err(e) => return Err(CliError::from_kube(&format!("watch {} {}", spec.kind, spec.name), e)),
            };
            let mut stream = stream.boxed();
            // A tick re-evaluates even without events (a migration or a pod target also reads
            // a pod) and reads the newest Warning Event.
            let mut tick = tokio::time::interval(Duration::from_secs(2));
            tick.tick().await;
            loop {
                let ev = tokio::select! {
                    ev = stream.try_next() => ev,
                    _ = tick.tick() => {
                        j.poll_warnings().await;
                        let cur = api.get_opt(spec.name).await.map_err(|e| CliError::from_kube(spec.kind, e));
                        if let Ok(cur) = cur && let Some(done) = j.judge(observe(cur).await?)? {
                            return Ok(done);
                        }
                        continue;
                    }
                };
                match ev {
                    Ok(Some(WatchEvent::Added(o) | WatchEvent::Modified(o))) => {
                        if let Some(done) = j.judge(observe(Some(o)).await?)? {
                            return Ok(done);
                        }
                    }
                    Ok(Some(WatchEvent::Deleted(_))) => {
                        return Err(CliError::NotFound(format!("{} {} was deleted while waiting", spec.kind, spec.name)));
                    }
                    // Closed, expired or errored: re-read and re-watch.
                    Ok(Some(WatchEvent::Error(_))) | Ok(None) | Err(_) => break,
                    Ok(Some(WatchEvent::Bookmark(_))) => {}
                }
            }
        }
    })
    .await;
    match result {
        Ok(r) => r,
        Err(_) => {
            // The newest warning may have arrived since the last tick.
            if spec.warnings.is_some() {
                let _ = tokio::time::timeout(Duration::from_secs(2), j.poll_warnings()).await;
            }
            let e = j.timeout();
            line.finish(&format!(
                "timed out ({})",
                j.last_state.as_deref().unwrap_or("no status")
            ));
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The time filter only (nothing known from before the write).
    fn since(t: Option<Timestamp>) -> After {
        After {
            since: t,
            before: None,
        }
    }

    fn event(kind: &str, type_: &str, reason: &str, at: &str) -> Event {
        serde_json::from_value(json!({
            "metadata": {"name": format!("e-{reason}-{at}"), "namespace": "ns"},
            "involvedObject": {"kind": kind, "name": "demo"},
            "type": type_, "reason": reason, "message": format!("{reason} at {at}"),
            "lastTimestamp": at
        }))
        .expect("event")
    }

    #[test]
    fn the_newest_transfer_of_a_member_pod_is_shown() {
        let mut pushed = event("Pod", "Normal", "SnapshotPushed", "2026-12-01T10:00:00Z");
        pushed.message = Some("pushed 1.6 GiB of 6.0 GiB (v2 zstd) in 4.2 s".into());
        let mut pulled = event("Pod", "Normal", "SnapshotPulled", "2026-12-01T10:05:00Z");
        pulled.message = Some("pulled 1.6 GiB of 6.0 GiB (v2 zstd) in 3.1 s".into());
        let other = event("Pod", "Normal", "Started", "2026-12-01T10:06:00Z");
        let warning = event("Pod", "Warning", "SnapshotPulled", "2026-12-01T10:07:00Z");
        let events = vec![pushed, pulled, other, warning];
        let pod = [("Pod", "demo", None)];
        assert_eq!(
            newest_transfer(&events, &pod, &since(None)).as_deref(),
            Some("pulled 1.6 GiB of 6.0 GiB (v2 zstd) in 3.1 s")
        );
        let before_wake: Timestamp = "2026-12-01T10:01:00Z".parse().expect("ts");
        let since_push = newest_transfer(&events[..1], &pod, &since(None));
        assert_eq!(
            since_push.as_deref(),
            Some("pushed 1.6 GiB of 6.0 GiB (v2 zstd) in 4.2 s")
        );
        // An earlier round's transfer is not this wait's; another pod's is not this one's.
        assert_eq!(
            newest_transfer(&events[..1], &pod, &since(Some(before_wake))),
            None
        );
        assert_eq!(
            newest_transfer(&events, &[("Pod", "x", None)], &since(None)),
            None
        );
    }

    #[test]
    fn every_transfer_of_the_members_since_the_write_goes_into_the_result() {
        let mut pushed = event("Pod", "Normal", "SnapshotPushed", "2026-12-01T10:00:00Z");
        pushed.message = Some("pushed 1.6 GiB of 6.0 GiB (v2 zstd) in 4.2 s".into());
        let mut pulled = event("Pod", "Normal", "SnapshotPulled", "2026-12-01T10:05:00Z");
        pulled.message = Some("pulled 1.6 GiB of 6.0 GiB (v2 zstd) in 3.1 s".into());
        let mut old = event("Pod", "Normal", "SnapshotPushed", "2026-12-01T09:00:00Z");
        old.message = Some("pushed 1.0 GiB of 2.0 GiB (v1) in 9.0 s".into());
        let mut stranger = pulled.clone();
        stranger.involved_object.name = Some("other".into());
        let set = event(
            "CocoonSet",
            "Normal",
            "SnapshotPushed",
            "2026-12-01T10:06:00Z",
        );
        let noise = event("Pod", "Normal", "Started", "2026-12-01T10:06:00Z");
        let events = vec![pulled, noise, pushed, old, stranger, set];
        let at: Timestamp = "2026-12-01T09:30:00Z".parse().expect("ts");
        assert_eq!(
            transfers_of(&events, &["demo"], &since(Some(at))),
            vec![
                json!({"pod": "demo", "reason": "SnapshotPushed",
                       "message": "pushed 1.6 GiB of 6.0 GiB (v2 zstd) in 4.2 s",
                       "time": "2026-12-01T10:00:00Z"}),
                json!({"pod": "demo", "reason": "SnapshotPulled",
                       "message": "pulled 1.6 GiB of 6.0 GiB (v2 zstd) in 3.1 s",
                       "time": "2026-12-01T10:05:00Z"}),
            ],
            "oldest first, this round's only, member pods only"
        );
        assert!(transfers_of(&events, &["nobody"], &since(None)).is_empty());
    }

    #[test]
    fn the_newest_warning_of_the_object_counts() {
        let events = vec![
            event(
                "CocoonSet",
                "Warning",
                "SuspendTimedOut",
                "2026-12-01T10:00:00Z",
            ),
            event(
                "CocoonSet",
                "Warning",
                "WakeNoCapacity",
                "2026-12-01T10:05:00Z",
            ),
            event("CocoonSet", "Normal", "Resumed", "2026-12-01T10:09:00Z"),
            event(
                "Pod",
                "Warning",
                "HibernateSnapshotFailed",
                "2026-12-01T10:08:00Z",
            ),
        ];
        assert_eq!(
            newest_warning(&events, &[("CocoonSet", "demo", None)], &since(None)).as_deref(),
            Some("WakeNoCapacity: WakeNoCapacity at 2026-12-01T10:05:00Z")
        );
        assert_eq!(
            newest_warning(
                &events,
                &[("CocoonHibernation", "demo", None), ("Pod", "demo", None)],
                &since(None)
            )
            .as_deref(),
            Some("HibernateSnapshotFailed: HibernateSnapshotFailed at 2026-12-01T10:08:00Z")
        );
        // Another object's warning is not this one's.
        assert_eq!(
            newest_warning(&events, &[("CocoonSet", "demo-two", None)], &since(None)),
            None
        );
        // An earlier object of the same name is not this one.
        let mut stale = event("CocoonSet", "Warning", "Stale", "2026-12-01T10:07:00Z");
        stale.involved_object.uid = Some("old".into());
        let mut current = event("CocoonSet", "Warning", "Current", "2026-12-01T10:06:30Z");
        current.involved_object.uid = Some("new".into());
        assert_eq!(
            newest_warning(
                &[stale, current],
                &[("CocoonSet", "demo", Some("new"))],
                &since(None)
            )
            .as_deref(),
            Some("Current: Current at 2026-12-01T10:06:30Z")
        );
        // An earlier round's warning is not this wait's.
        let at: Timestamp = "2026-12-01T10:06:00Z".parse().expect("ts");
        assert_eq!(
            newest_warning(&events, &[("CocoonSet", "demo", None)], &since(Some(at))),
            None
        );
    }
}
