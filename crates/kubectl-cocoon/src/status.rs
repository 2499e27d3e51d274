//! `status` (list, detail, watch) and `describe`: read-only views of CocoonSets with their
//! pods, CocoonHibernations and Events.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use cocoon_api::crd::hibernation::CocoonHibernation;
use cocoon_api::crd::set::{CocoonSet, WakeOn};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::cli::{OutputFormat, Selection};
use crate::error::CliError;
use crate::output::print_object;
use crate::table;
use crate::view;

pub(crate) struct Snapshot {
    pub sets: Vec<CocoonSet>,
    pub pods: Vec<Pod>,
    pub hibernations: Vec<CocoonHibernation>,
}

pub(crate) async fn read(
    client: &Client,
    ns: &str,
    names: &[String],
    sel: &Selection,
) -> Result<Snapshot, CliError> {
    let (sets, pods, chs): (Api<CocoonSet>, Api<Pod>, Api<CocoonHibernation>) =
        if sel.all_namespaces {
            (
                Api::all(client.clone()),
                Api::all(client.clone()),
                Api::all(client.clone()),
            )
        } else {
            (
                Api::namespaced(client.clone(), ns),
                Api::namespaced(client.clone(), ns),
                Api::namespaced(client.clone(), ns),
            )
        };
    let mut lp = ListParams::default();
    if let Some(s) = &sel.selector {
        lp = lp.labels(s);
    }
    let mut set_list = if names.is_empty() {
        sets.list(&lp)
            .await
            .map_err(|e| CliError::from_kube("list cocoonsets", e))?
            .items
    } else {
        let mut out = Vec::new();
        for n in names {
            out.push(
                sets.get(n)
                    .await
                    .map_err(|e| CliError::from_kube(&format!("cocoonset {n}"), e))?,
            );
        }
        out
    };
    set_list.sort_by_key(|s| (s.namespace(), s.name_any()));
    let pod_lp = ListParams::default().labels(cocoon_api::contract::labels::COCOONSET_NAME);
    let pods = pods
        .list(&pod_lp)
        .await
        .map_err(|e| CliError::from_kube("list pods", e))?
        .items;
    let hibernations = chs
        .list(&ListParams::default())
        .await
        .map_err(|e| CliError::from_kube("list cocoonhibernations", e))?
        .items;
    Ok(Snapshot {
        sets: set_list,
        pods,
        hibernations,
    })
}

/// How `status` prints: the `-o` format, the header line and colour.
#[derive(Debug, Clone)]
pub struct View {
    pub output: Option<OutputFormat>,
    pub no_headers: bool,
    pub color: bool,
}

/// The pods and hibernations of a snapshot in one set's namespace.
fn in_namespace(snap: &Snapshot, s: &CocoonSet) -> (Vec<Pod>, Vec<CocoonHibernation>) {
    let pods = snap
        .pods
        .iter()
        .filter(|p| p.namespace() == s.namespace())
        .cloned()
        .collect();
    let chs = snap
        .hibernations
        .iter()
        .filter(|h| h.namespace() == s.namespace())
        .cloned()
        .collect();
    (pods, chs)
}

/// The computed view `-o json|yaml|name|jsonpath` prints: a kubectl `List` of the sets, each
/// with its `members` (pods, VMs, nodes, lifecycle, hibernation) and its `hibernations`.
fn computed(snap: &Snapshot) -> serde_json::Value {
    let items: Vec<serde_json::Value> = snap
        .sets
        .iter()
        .map(|s| {
            let (pods, chs) = in_namespace(snap, s);
            view::computed_set(s, &pods, &chs)
        })
        .collect();
    json!({"apiVersion": "v1", "kind": "List", "items": items})
}

/// kubectl's message for an empty list, which it prints on stderr.
fn nothing_found(ns: &str, all_ns: bool) -> String {
    if all_ns {
        "No resources found".to_string()
    } else {
        format!("No resources found in {ns} namespace.")
    }
}

pub(crate) fn render(snap: &Snapshot, detail: bool, all_ns: bool, view: &View) -> String {
    let now = Timestamp::now();
    let (color, headers_shown) = (view.color, !view.no_headers);
    let mut out = String::new();
    if snap.sets.is_empty() {
        return String::new();
    }
    let rows: Vec<view::SetRow> = snap
        .sets
        .iter()
        .map(|s| {
            let pods: Vec<Pod> = snap
                .pods
                .iter()
                .filter(|p| p.namespace() == s.namespace())
                .cloned()
                .collect();
            view::set_row(s, &pods, now)
        })
        .collect();
    let (headers, cells) = view::set_cells(&rows, all_ns);
    out.push_str(&table::render_with(&headers, &cells, color, headers_shown));
    if detail {
        for s in &snap.sets {
            let (pods, chs) = in_namespace(snap, s);
            let members = view::member_rows(s, &pods, &chs);
            out.push_str(&format!(
                "\n{}/{}:\n",
                s.namespace().unwrap_or_default(),
                s.name_any()
            ));
            if members.is_empty() {
                out.push_str("  (no pods)\n");
            } else {
                let (h, c) = view::member_cells(&members);
                out.push_str(&table::render_with(&h, &c, color, headers_shown));
            }
            if let Some(line) = idle_line(s, now) {
                out.push_str(&line);
            }
            for c in s
                .status
                .as_ref()
                .map(|st| st.conditions.clone())
                .unwrap_or_default()
            {
                out.push_str(&format!(
                    "  {}={} ({}): {}\n",
                    c.type_, c.status, c.reason, c.message
                ));
            }
        }
    }
    out
}

/// The set's `spec.idle` and `status.idle` in one line of the detail view (issue 39), or
/// `None` for a set without `spec.idle`.
fn idle_line(s: &CocoonSet, now: Timestamp) -> Option<String> {
    let spec = s.spec.idle.as_ref()?;
    let mut parts = vec![format!(
        "suspendAfter={}",
        spec.suspend_after.as_deref().unwrap_or("off")
    )];
    if !spec.ports.is_empty() {
        let ports: Vec<String> = spec.ports.iter().map(i32::to_string).collect();
        parts.push(format!("ports={}", ports.join(",")));
    }
    let wake: Vec<&str> = [(WakeOn::Connect, "connect"), (WakeOn::Exec, "exec")]
        .into_iter()
        .filter(|(w, _)| spec.wakes_on(*w))
        .map(|(_, name)| name)
        .collect();
    parts.push(format!("wakeOn={}", wake.join(",")));
    let last = s.status.as_ref().and_then(|st| st.idle.as_ref()).map(|i| {
        let at = i.last_activity.parse::<Timestamp>().ok();
        format!(
            "; last activity {} {} ago",
            i.last_activity_kind,
            view::age(at, now)
        )
    });
    Some(format!(
        "  Idle: {}{}\n",
        parts.join(" "),
        last.unwrap_or_default()
    ))
}

/// `status [NAME…] [-A] [-l] [-o] [-w]`.
pub async fn status(
    client: &Client,
    ns: &str,
    names: &[String],
    sel: &Selection,
    view: &View,
    watch: bool,
) -> Result<(), CliError> {
    let snap = read(client, ns, names, sel).await?;
    match &view.output {
        Some(fmt) if *fmt != OutputFormat::Wide && !watch => {
            if snap.sets.is_empty() && *fmt != OutputFormat::Json && *fmt != OutputFormat::Yaml {
                eprintln!("{}", nothing_found(ns, sel.all_namespaces));
            }
            return print_object(&computed(&snap), fmt);
        }
        _ => {}
    }
    let detail = !names.is_empty() || view.output == Some(OutputFormat::Wide);
    if !watch {
        if snap.sets.is_empty() {
            eprintln!("{}", nothing_found(ns, sel.all_namespaces));
        }
        print!("{}", render(&snap, detail, sel.all_namespaces, view));
        if names.is_empty() {
            print_checkpoints(client, ns, sel, view).await;
        }
        return Ok(());
    }
    watch_loop(client, ns, names, sel, view, detail).await
}

/// The namespace's CocoonCheckpoints under the sets, when there are any. A cluster without
/// the CRD, or a user who may not list them, just sees no such section.
async fn print_checkpoints(client: &Client, ns: &str, sel: &Selection, view: &View) {
    use cocoon_api::crd::checkpoint::CocoonCheckpoint;
    let api: Api<CocoonCheckpoint> = if sel.all_namespaces {
        Api::all(client.clone())
    } else {
        Api::namespaced(client.clone(), ns)
    };
    let mut lp = kube::api::ListParams::default();
    if let Some(l) = &sel.selector {
        lp = lp.labels(l);
    }
    let Ok(list) = api.list(&lp).await else {
        return;
    };
    if list.items.is_empty() {
        return;
    }
    println!();
    print!(
        "{}",
        crate::checkpoint::checkpoints_table(
            &list.items,
            sel.all_namespaces,
            k8s_openapi::jiff::Timestamp::now(),
            view.color,
            !view.no_headers
        )
    );
}

async fn watch_loop(
    client: &Client,
    ns: &str,
    names: &[String],
    sel: &Selection,
    view: &View,
    detail: bool,
) -> Result<(), CliError> {
    let json_lines = view.output == Some(OutputFormat::Json) || !std::io::stdout().is_terminal();
    let (sets, pods): (Api<CocoonSet>, Api<Pod>) = if sel.all_namespaces {
        (Api::all(client.clone()), Api::all(client.clone()))
    } else {
        (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        )
    };
    let mut changes = futures::stream::select(
        watcher(sets, watcher::Config::default())
            .touched_objects()
            .map(|r| r.map(|_| ()))
            .boxed(),
        watcher(
            pods,
            watcher::Config::default().labels(cocoon_api::contract::labels::COCOONSET_NAME),
        )
        .touched_objects()
        .map(|r| r.map(|_| ()))
        .boxed(),
    );
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    let mut last_draw = Instant::now() - Duration::from_secs(1);
    let mut last_json: Option<String> = None;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        tokio::select! {
            _ = &mut ctrl_c => return Ok(()),
            ev = changes.next() => match ev {
                None => return Ok(()),
                Some(Err(e)) => eprintln!("watch: {e}"),
                Some(Ok(())) => {}
            },
            _ = ticker.tick() => {}
        }
        // Flicker guard: redraw at most every 200 ms.
        if last_draw.elapsed() < Duration::from_millis(200) {
            continue;
        }
        let snap = read(client, ns, names, sel).await?;
        if json_lines {
            for s in &snap.sets {
                let line = serde_json::to_string(&json!({"namespace": s.namespace(), "name": s.name_any(), "spec": {"suspend": s.spec.suspend, "nodeName": s.spec.node_name}, "status": s.status})).unwrap_or_default();
                if last_json.as_deref() != Some(line.as_str()) || snap.sets.len() > 1 {
                    println!("{line}");
                }
                last_json = Some(line);
            }
        } else {
            let text = render(&snap, detail, sel.all_namespaces, view);
            let mut out = std::io::stdout();
            let _ = write!(out, "\x1b[H\x1b[2J{text}");
            let _ = out.flush();
        }
        last_draw = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use cocoon_api::crd::set::{CocoonSetSpec, CocoonSetStatus, IdleSpec, IdleStatus};

    use super::*;

    #[test]
    fn the_detail_view_says_the_idle_limit_and_the_last_activity() {
        let mut cs = CocoonSet::new("demo", CocoonSetSpec::with_image("img"));
        let now: Timestamp = "2026-12-07T22:01:30Z".parse().expect("time");
        assert_eq!(idle_line(&cs, now), None, "no spec.idle: no line");
        cs.spec.idle = Some(IdleSpec {
            suspend_after: Some("10m".into()),
            ports: vec![7000, 7001],
            wake_on: vec![WakeOn::Exec],
        });
        assert_eq!(
            idle_line(&cs, now).as_deref(),
            Some("  Idle: suspendAfter=10m ports=7000,7001 wakeOn=exec\n")
        );
        cs.status = Some(CocoonSetStatus {
            idle: Some(IdleStatus {
                last_activity: "2026-12-07T22:00:00Z".into(),
                last_activity_kind: "session".into(),
            }),
            ..CocoonSetStatus::default()
        });
        if let Some(i) = cs.spec.idle.as_mut() {
            i.wake_on.clear();
        }
        assert_eq!(
            idle_line(&cs, now).as_deref(),
            Some(
                "  Idle: suspendAfter=10m ports=7000,7001 wakeOn=connect,exec; last activity session 90s ago\n"
            )
        );
    }
}
