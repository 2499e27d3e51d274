//! `describe`: a CocoonSet (with its members), a pod or a CocoonHibernation (the pod and its
//! hibernation), with the Events of exactly those objects: selected by involvedObject kind,
//! name and uid, never by a name prefix (`describe demo` must not show `demo-two`'s events).

use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::labels;
use cocoon_api::crd::checkpoint::CocoonCheckpoint;
use cocoon_api::crd::hibernation::CocoonHibernation;
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use crate::cli::Selection;
use crate::error::CliError;
use crate::table::{self, Cell, Tone};
use crate::targets::{self, Kind};
use crate::view::age;
use crate::waiter::last_seen;

/// One object whose Events belong in the view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Involved {
    pub kind: String,
    pub name: String,
    pub uid: String,
}

impl Involved {
    fn of<K: kube::Resource<DynamicType = ()>>(o: &K) -> Involved {
        Involved {
            kind: K::kind(&()).to_string(),
            name: o.meta().name.clone().unwrap_or_default(),
            uid: o.meta().uid.clone().unwrap_or_default(),
        }
    }
}

/// The events that regard one of `objects` (same kind and name, and the same uid when the
/// event records one), oldest first.
pub fn select_events(events: &[Event], objects: &[Involved]) -> Vec<Event> {
    let mut out: Vec<Event> = events
        .iter()
        .filter(|e| {
            let io = &e.involved_object;
            objects.iter().any(|o| {
                io.kind.as_deref() == Some(o.kind.as_str())
                    && io.name.as_deref() == Some(o.name.as_str())
                    && io
                        .uid
                        .as_deref()
                        .is_none_or(|u| u.is_empty() || o.uid.is_empty() || u == o.uid)
            })
        })
        .cloned()
        .collect();
    out.sort_by_key(last_seen);
    out
}

/// Who reported an event: `source.component[, host]`, else the reporting controller.
fn from(e: &Event) -> String {
    let src = e.source.as_ref();
    let component = src
        .and_then(|s| s.component.clone())
        .filter(|c| !c.is_empty())
        .or(e.reporting_component.clone().filter(|c| !c.is_empty()));
    match (
        component,
        src.and_then(|s| s.host.clone()).filter(|h| !h.is_empty()),
    ) {
        (Some(c), Some(h)) => format!("{c}, {h}"),
        (Some(c), None) => c,
        (None, _) => "-".into(),
    }
}

/// How often an event happened (`series.count`, else `count`, at least 1).
fn count(e: &Event) -> i32 {
    e.series
        .as_ref()
        .and_then(|s| s.count)
        .or(e.count)
        .unwrap_or(1)
        .max(1)
}

/// The Events table: TYPE REASON AGE (since last seen) COUNT FROM OBJECT MESSAGE; the last
/// `limit` events.
pub fn event_cells(
    events: &[Event],
    now: Timestamp,
    limit: usize,
) -> (Vec<&'static str>, Vec<Vec<Cell>>) {
    let headers = vec![
        "type", "reason", "age", "count", "from", "object", "message",
    ];
    let skip = events.len().saturating_sub(limit);
    let cells = events
        .iter()
        .skip(skip)
        .map(|e| {
            let type_ = e.type_.clone().unwrap_or_default();
            let tone = if type_ == "Warning" {
                Tone::Warn
            } else {
                Tone::Plain
            };
            vec![
                Cell::toned(type_, tone),
                Cell::plain(e.reason.clone().unwrap_or_default()),
                Cell::plain(age(last_seen(e), now)),
                Cell::plain(count(e).to_string()),
                Cell::plain(from(e)),
                Cell::plain(format!(
                    "{}/{}",
                    e.involved_object
                        .kind
                        .clone()
                        .unwrap_or_default()
                        .to_lowercase(),
                    e.involved_object.name.clone().unwrap_or_default()
                )),
                Cell::plain(e.message.clone().unwrap_or_default().replace('\n', " ")),
            ]
        })
        .collect();
    (headers, cells)
}

/// Lists the namespace's Events about objects of `kind` (one request per kind), keeping
/// those of `objects`.
async fn events_of(
    client: &Client,
    ns: &str,
    objects: &[Involved],
) -> Result<Vec<Event>, CliError> {
    let api: Api<Event> = Api::namespaced(client.clone(), ns);
    let mut kinds: Vec<&str> = objects.iter().map(|o| o.kind.as_str()).collect();
    kinds.sort();
    kinds.dedup();
    let mut all = Vec::new();
    for kind in kinds {
        let same: Vec<&Involved> = objects.iter().filter(|o| o.kind == kind).collect();
        // One object: the server selects it exactly; several: by kind, then by uid here.
        let selector = match same.as_slice() {
            [one] if !one.uid.is_empty() => format!(
                "involvedObject.kind={kind},involvedObject.name={},involvedObject.uid={}",
                one.name, one.uid
            ),
            [one] => format!(
                "involvedObject.kind={kind},involvedObject.name={}",
                one.name
            ),
            _ => format!("involvedObject.kind={kind}"),
        };
        let list = api
            .list(&ListParams::default().fields(&selector))
            .await
            .map_err(|e| CliError::from_kube("list events", e))?;
        all.extend(list.items);
    }
    Ok(select_events(&all, objects))
}

fn print_events(events: &[Event], color: bool) {
    println!("\nEvents:");
    if events.is_empty() {
        println!("  <none>");
        return;
    }
    let (h, c) = event_cells(events, Timestamp::now(), 20);
    for line in table::render(&h, &c, color).lines() {
        println!("  {line}");
    }
}

/// `describe NAME|cocoonset/NAME|pod/NAME|cocoonhibernation/NAME`.
pub async fn describe(client: &Client, ns: &str, arg: &str, color: bool) -> Result<(), CliError> {
    if let Some(name) = crate::checkpoint::describe_target(arg) {
        return describe_checkpoint(client, ns, name, color).await;
    }
    let (kind, name) = targets::parse_target(arg, Kind::CocoonSet)?;
    match kind {
        Kind::CocoonSet => describe_set(client, ns, &name, color).await,
        Kind::Pod => describe_pod(client, ns, &name, color).await,
    }
}

async fn describe_set(client: &Client, ns: &str, name: &str, color: bool) -> Result<(), CliError> {
    let snap = crate::status::read(client, ns, &[name.to_string()], &Selection::default()).await?;
    let view = crate::status::View {
        output: None,
        no_headers: false,
        color,
    };
    print!("{}", crate::status::render(&snap, true, false, &view));
    let mut objects: Vec<Involved> = snap.sets.iter().map(Involved::of).collect();
    let members: Vec<&Pod> = snap
        .pods
        .iter()
        .filter(|p| p.labels().get(labels::COCOONSET_NAME).map(String::as_str) == Some(name))
        .collect();
    objects.extend(members.iter().map(|p| Involved::of(*p)));
    objects.extend(
        snap.hibernations
            .iter()
            .filter(|h| members.iter().any(|p| p.name_any() == h.spec.pod_ref.name))
            .map(Involved::of),
    );
    print_events(&events_of(client, ns, &objects).await?, color);
    Ok(())
}

async fn describe_checkpoint(
    client: &Client,
    ns: &str,
    name: &str,
    color: bool,
) -> Result<(), CliError> {
    if name.is_empty() || name.contains('/') {
        return Err(CliError::Usage(format!(
            "checkpoint/{name:?}: expected checkpoint/NAME"
        )));
    }
    let c = Api::<CocoonCheckpoint>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(|e| CliError::from_kube(&format!("get cocooncheckpoint {ns}/{name}"), e))?
        .ok_or_else(|| CliError::NotFound(format!("cocooncheckpoint {ns}/{name}: not found")))?;
    print!("{}", crate::checkpoint::checkpoint_text(ns, &c));
    print_events(&events_of(client, ns, &[Involved::of(&c)]).await?, color);
    Ok(())
}

async fn describe_pod(client: &Client, ns: &str, name: &str, color: bool) -> Result<(), CliError> {
    let pod = Api::<Pod>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(|e| CliError::from_kube(&format!("get pod {ns}/{name}"), e))?;
    let ch = Api::<CocoonHibernation>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(|e| CliError::from_kube(&format!("get cocoonhibernation {ns}/{name}"), e))?;
    if pod.is_none() && ch.is_none() {
        return Err(CliError::NotFound(format!(
            "pod {ns}/{name}: not found (nor a CocoonHibernation of that name)"
        )));
    }
    print!("{}", pod_text(ns, name, pod.as_ref(), ch.as_ref()));
    let mut objects = Vec::new();
    if let Some(p) = &pod {
        objects.push(Involved::of(p));
    }
    if let Some(h) = &ch {
        objects.push(Involved::of(h));
    }
    print_events(&events_of(client, ns, &objects).await?, color);
    Ok(())
}

/// The pod and hibernation part of `describe pod/NAME`.
pub fn pod_text(ns: &str, name: &str, pod: Option<&Pod>, ch: Option<&CocoonHibernation>) -> String {
    let mut out = format!("Pod:          {ns}/{name}\n");
    let dash = |s: String| if s.is_empty() { "-".to_string() } else { s };
    match pod {
        None => out.push_str("              (the pod does not exist)\n"),
        Some(p) => {
            let l = p.labels();
            let a = p.annotations();
            let get = |m: &std::collections::BTreeMap<String, String>, k: &str| {
                dash(m.get(k).cloned().unwrap_or_default())
            };
            let status = p.status.as_ref();
            let ready = status
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
                .map(|c| c.status.clone())
                .unwrap_or_else(|| "Unknown".into());
            out.push_str(&format!(
                "CocoonSet:    {} (role {}, slot {})\n",
                get(l, labels::COCOONSET_NAME),
                get(l, labels::ROLE),
                get(l, labels::SLOT)
            ));
            out.push_str(&format!(
                "Node:         {}\n",
                dash(
                    p.spec
                        .as_ref()
                        .and_then(|s| s.node_name.clone())
                        .unwrap_or_default()
                )
            ));
            out.push_str(&format!(
                "Phase:        {}\n",
                dash(status.and_then(|s| s.phase.clone()).unwrap_or_default())
            ));
            out.push_str(&format!("Ready:        {ready}\n"));
            out.push_str(&format!("VM:           {}\n", get(a, ann::VM_NAME)));
            out.push_str(&format!("VM ID:        {}\n", get(a, ann::VM_ID)));
            out.push_str(&format!("Lifecycle:    {}\n", get(a, ann::LIFECYCLE_STATE)));
        }
    }
    match ch {
        None => out.push_str("Hibernation:  <none>\n"),
        Some(h) => {
            let st = h.status.clone().unwrap_or_default();
            out.push_str(&format!(
                "Hibernation:  desire {}, phase {} (generation {}, observed {})\n",
                h.spec.desire.as_str(),
                st.phase.map(|p| p.as_str()).unwrap_or("-"),
                h.metadata.generation.unwrap_or(0),
                st.observed_generation
            ));
            for c in &st.conditions {
                out.push_str(&format!(
                    "  {}={} ({}): {}\n",
                    c.type_, c.status, c.reason, c.message
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(kind: &str, name: &str, uid: &str, reason: &str, at: &str, count: Option<i32>) -> Event {
        serde_json::from_value(json!({
            "metadata": {"name": format!("{name}.{reason}"), "namespace": "ns"},
            "involvedObject": {"kind": kind, "name": name, "uid": uid},
            "type": if reason.starts_with('W') { "Warning" } else { "Normal" },
            "reason": reason, "message": format!("{reason} of {name}"),
            "lastTimestamp": at, "count": count,
            "source": {"component": "cocoon-operator"}
        }))
        .expect("event")
    }

    fn who(kind: &str, name: &str, uid: &str) -> Involved {
        Involved {
            kind: kind.into(),
            name: name.into(),
            uid: uid.into(),
        }
    }

    #[test]
    fn events_are_selected_by_involved_object_not_by_prefix() {
        let events = vec![
            ev(
                "CocoonSet",
                "demo-two",
                "u2",
                "WakeNoCapacity",
                "2026-12-01T10:02:00Z",
                None,
            ),
            ev(
                "CocoonSet",
                "demo",
                "u1",
                "Suspended",
                "2026-12-01T10:01:00Z",
                Some(3),
            ),
            ev(
                "CocoonSet",
                "demo",
                "old",
                "Stale",
                "2026-12-01T09:00:00Z",
                None,
            ),
            ev(
                "Pod",
                "demo-0",
                "p0",
                "Hibernated",
                "2026-12-01T10:00:00Z",
                None,
            ),
            ev(
                "Pod",
                "demo-two-0",
                "p9",
                "Hibernated",
                "2026-12-01T10:00:00Z",
                None,
            ),
            ev(
                "CocoonHibernation",
                "demo",
                "x",
                "NotASet",
                "2026-12-01T10:00:00Z",
                None,
            ),
        ];
        let picked = select_events(
            &events,
            &[who("CocoonSet", "demo", "u1"), who("Pod", "demo-0", "p0")],
        );
        let reasons: Vec<&str> = picked.iter().filter_map(|e| e.reason.as_deref()).collect();
        assert_eq!(
            reasons,
            ["Hibernated", "Suspended"],
            "oldest first, only demo's"
        );
    }

    #[test]
    fn event_table_has_age_count_and_from() {
        let events = vec![
            ev(
                "CocoonSet",
                "demo",
                "u1",
                "Suspended",
                "2026-12-01T10:01:00Z",
                Some(3),
            ),
            ev(
                "CocoonSet",
                "demo",
                "u1",
                "WakeNoCapacity",
                "2026-12-01T10:09:30Z",
                None,
            ),
        ];
        let now: Timestamp = "2026-12-01T10:10:00Z".parse().expect("ts");
        let (h, c) = event_cells(&events, now, 20);
        assert_eq!(
            table::render(&h, &c, false),
            "TYPE      REASON           AGE   COUNT   FROM              OBJECT           MESSAGE\n\
             Normal    Suspended        9m    3       cocoon-operator   cocoonset/demo   Suspended of demo\n\
             Warning   WakeNoCapacity   30s   1       cocoon-operator   cocoonset/demo   WakeNoCapacity of demo\n"
        );
        let (_, c) = event_cells(&events, now, 1);
        assert_eq!(c.len(), 1, "only the newest `limit`");
        assert_eq!(c[0][1].text, "WakeNoCapacity");
    }
}
