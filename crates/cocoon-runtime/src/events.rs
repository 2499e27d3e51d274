//! The VM event stream of §5: event kinds, the line format of `vm status --event --format json`
//! and the pure tick-to-tick diff both backends use.
//!
//! A tick compares the tuple `(id, name, state, cpu, memory, IP list, image)` of every VM with
//! the previous tick; the first tick reports every VM as `ADDED`.

use std::collections::BTreeMap;
use std::pin::Pin;

use futures::Stream;
use serde::{Deserialize, Serialize};

use super::error::RuntimeError;
use super::types::VmRecord;

/// Kind of a VM event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EventKind {
    /// A VM not seen before (every VM on the first tick).
    #[serde(rename = "ADDED")]
    Added,
    /// A VM whose tuple changed.
    #[serde(rename = "MODIFIED")]
    Modified,
    /// A VM that disappeared; carries the last record seen.
    #[serde(rename = "DELETED")]
    Deleted,
}

/// One event: the kind and the full VM record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmEvent {
    /// `ADDED` | `MODIFIED` | `DELETED`.
    #[serde(rename = "event")]
    pub kind: EventKind,
    /// Full VM record; `state` may be `stopped (stale)`.
    pub vm: VmRecord,
}

/// The event stream returned by `watch_events`. It ends when the source ends (the CLI child
/// exited, or the simulator closed it); a final `Err` item reports a non-zero exit.
pub type EventStream = Pin<Box<dyn Stream<Item = Result<VmEvent, RuntimeError>> + Send>>;

/// The compared tuple of §5 (state as reported, i.e. stale-reconciled).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Tuple {
    id: String,
    name: String,
    state: String,
    cpu: i64,
    memory: i64,
    ips: Vec<String>,
    image: String,
}

impl Tuple {
    fn of(vm: &VmRecord) -> Self {
        Tuple {
            id: vm.id.clone(),
            name: vm.config.name.clone(),
            state: vm.state.clone(),
            cpu: vm.config.cpu,
            memory: vm.config.memory,
            ips: vm.ips().into_iter().map(str::to_owned).collect(),
            image: vm.config.image.clone(),
        }
    }
}

/// What one tick knows about the VMs of the previous tick, keyed by id.
#[derive(Debug, Clone, Default)]
pub struct EventDiffer {
    seen: BTreeMap<String, VmRecord>,
}

impl EventDiffer {
    /// A differ whose first tick reports every VM as `ADDED`.
    pub fn new() -> Self {
        Self::default()
    }

    /// Compares the current VM list with the previous tick and returns the events: `ADDED`
    /// first, then `MODIFIED`, then `DELETED`, each group in list (or id) order. VMs with an
    /// empty id are ignored, as the list parser skips them.
    pub fn tick(&mut self, current: &[VmRecord]) -> Vec<VmEvent> {
        let mut added = Vec::new();
        let mut modified = Vec::new();
        let mut next = BTreeMap::new();
        for vm in current.iter().filter(|vm| !vm.id.is_empty()) {
            match self.seen.get(&vm.id) {
                None => added.push(VmEvent {
                    kind: EventKind::Added,
                    vm: vm.clone(),
                }),
                Some(prev) if Tuple::of(prev) != Tuple::of(vm) => modified.push(VmEvent {
                    kind: EventKind::Modified,
                    vm: vm.clone(),
                }),
                Some(_) => {}
            }
            next.insert(vm.id.clone(), vm.clone());
        }
        let deleted = self
            .seen
            .iter()
            .filter(|(id, _)| !next.contains_key(*id))
            .map(|(_, vm)| VmEvent {
                kind: EventKind::Deleted,
                vm: vm.clone(),
            })
            .collect::<Vec<_>>();
        self.seen = next;
        added.into_iter().chain(modified).chain(deleted).collect()
    }
}

/// Decodes one line of `vm status --event --format json`. `None` for a blank line.
pub fn parse_event_line(line: &str) -> Option<Result<VmEvent, serde_json::Error>> {
    let line = line.trim();
    (!line.is_empty()).then(|| serde_json::from_str(line))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{NetworkConfig, NicNetwork};

    fn vm(id: &str, name: &str, state: &str) -> VmRecord {
        let mut vm = VmRecord {
            id: id.into(),
            state: state.into(),
            ..VmRecord::default()
        };
        vm.config.name = name.into();
        vm.config.cpu = 2;
        vm.config.memory = 1 << 30;
        vm.config.image = "img".into();
        vm
    }

    fn kinds(events: &[VmEvent]) -> Vec<(EventKind, String)> {
        events.iter().map(|e| (e.kind, e.vm.id.clone())).collect()
    }

    #[test]
    fn first_tick_reports_every_vm_as_added() {
        let mut d = EventDiffer::new();
        let events = d.tick(&[vm("a", "va", "running"), vm("b", "vb", "stopped")]);
        assert_eq!(
            kinds(&events),
            vec![
                (EventKind::Added, "a".into()),
                (EventKind::Added, "b".into())
            ]
        );
        assert!(
            d.tick(&[vm("a", "va", "running"), vm("b", "vb", "stopped")])
                .is_empty()
        );
    }

    #[test]
    fn tuple_changes_are_modified_and_other_changes_are_not() {
        let mut d = EventDiffer::new();
        d.tick(&[vm("a", "va", "running")]);

        // PID, timestamps and MACs are not part of the tuple.
        let mut same = vm("a", "va", "running");
        same.pid = 42;
        same.network_configs.push(NetworkConfig {
            mac: "m".into(),
            ..NetworkConfig::default()
        });
        assert!(d.tick(&[same.clone()]).is_empty());

        type Change = Box<dyn Fn(&mut VmRecord)>;
        let changes: Vec<Change> = vec![
            Box::new(|v| v.state = "stopped (stale)".into()),
            Box::new(|v| v.config.name = "renamed".into()),
            Box::new(|v| v.config.cpu = 4),
            Box::new(|v| v.config.memory = 2 << 30),
            Box::new(|v| v.config.image = "other".into()),
            Box::new(|v| {
                v.network_configs[0].network = Some(NicNetwork {
                    ip: "10.0.0.9".into(),
                    gateway: "10.0.0.1".into(),
                    prefix: 24,
                })
            }),
        ];
        for change in changes {
            let mut d = EventDiffer::new();
            d.tick(&[same.clone()]);
            let mut changed = same.clone();
            change(&mut changed);
            let events = d.tick(&[changed.clone()]);
            assert_eq!(kinds(&events), vec![(EventKind::Modified, "a".into())]);
            assert_eq!(
                events[0].vm, changed,
                "the event carries the full new record"
            );
        }
    }

    #[test]
    fn deleted_carries_the_last_record_and_order_is_added_modified_deleted() {
        let mut d = EventDiffer::new();
        let old_b = vm("b", "vb", "running");
        d.tick(&[vm("a", "va", "running"), old_b.clone()]);
        let events = d.tick(&[vm("c", "vc", "running"), vm("a", "va", "stopped")]);
        assert_eq!(
            kinds(&events),
            vec![
                (EventKind::Added, "c".into()),
                (EventKind::Modified, "a".into()),
                (EventKind::Deleted, "b".into())
            ]
        );
        assert_eq!(events[2].vm, old_b);
        // Gone VMs are forgotten: no second DELETED.
        assert!(
            d.tick(&[vm("c", "vc", "running"), vm("a", "va", "stopped")])
                .is_empty()
        );
    }

    #[test]
    fn event_lines() {
        let line =
            r#"{"event":"MODIFIED","vm":{"id":"x","state":"stopped","config":{"name":"n"}}}"#;
        let ev = parse_event_line(line).expect("line").expect("decode");
        assert_eq!(ev.kind, EventKind::Modified);
        assert_eq!(ev.vm.name(), "n");
        assert!(parse_event_line("   ").is_none());
        assert!(parse_event_line("not json").expect("line").is_err());
        assert!(
            parse_event_line(r#"{"event":"RENAMED","vm":{}}"#)
                .expect("line")
                .is_err()
        );
        // The printed form is the compact line format.
        let text = serde_json::to_string(&ev).expect("print");
        assert!(
            text.starts_with(r#"{"event":"MODIFIED","vm":{"id":"x""#),
            "{text}"
        );
    }
}
