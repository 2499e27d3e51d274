//! Table tests of the rules of triage and the rebuild budget (`cocoonset.md` §6).

use std::time::Duration;

use cocoon_api::contract::{DeadLetter, RebuildEntry, RebuildHistory, annotations as ann};

use super::rules::{self, Triage};
use crate::cocoonset::Timing;
use crate::cocoonset::fixtures::{NS, SetFixture, at, phase, set, with};
use crate::cocoonset::pods;

#[test]
fn triage_table() {
    let t = Timing::default();
    let entry = |count: i64, last: i64| RebuildEntry {
        count,
        last_deleted: Some(at(last)),
        generation: Some(3),
        ..RebuildEntry::default()
    };
    let r = || Some("spec drifted".to_string());
    type Row = (
        &'static str,
        Option<String>,
        DeadLetter,
        Option<RebuildEntry>,
        Triage,
    );
    let cases: Vec<Row> = vec![
        (
            "healthy",
            None,
            DeadLetter(None),
            None,
            Triage::Leave {
                dead_lettered: false,
            },
        ),
        (
            "first rebuild is immediate",
            r(),
            DeadLetter(None),
            None,
            Triage::Rebuild {
                attempt: 1,
                reason: "spec drifted".into(),
            },
        ),
        (
            "1 s after the first",
            r(),
            DeadLetter(None),
            Some(entry(1, 100)),
            Triage::Wait(Duration::from_secs(1)),
        ),
        (
            "second after 1 s",
            r(),
            DeadLetter(None),
            Some(entry(1, 99)),
            Triage::Rebuild {
                attempt: 2,
                reason: "spec drifted".into(),
            },
        ),
        (
            "5 s after the second",
            r(),
            DeadLetter(None),
            Some(entry(2, 98)),
            Triage::Wait(Duration::from_secs(3)),
        ),
        (
            "30 s after the third",
            r(),
            DeadLetter(None),
            Some(entry(3, 90)),
            Triage::Wait(Duration::from_secs(20)),
        ),
        (
            "fourth after 30 s",
            r(),
            DeadLetter(None),
            Some(entry(3, 70)),
            Triage::Rebuild {
                attempt: 4,
                reason: "spec drifted".into(),
            },
        ),
        (
            "budget spent",
            r(),
            DeadLetter(None),
            Some(entry(4, 0)),
            Triage::DeadLetter {
                reason: "spec drifted".into(),
            },
        ),
        (
            "dead-lettered at this generation",
            r(),
            DeadLetter(Some(3)),
            Some(entry(4, 0)),
            Triage::Leave {
                dead_lettered: true,
            },
        ),
        (
            "spec edited since the dead-letter",
            r(),
            DeadLetter(Some(2)),
            Some(entry(4, 0)),
            Triage::ResetAndDelete,
        ),
    ];
    for (what, reason, dl, e, want) in cases {
        assert_eq!(
            rules::decide(reason, dl, e.as_ref(), 3, at(100), &t),
            want,
            "{what}"
        );
    }
}

#[test]
fn triage_reasons() {
    let cs = set().with_replicas(2);
    let pod = pods::build_agent_pod(&cs, NS, 1, "vm", Some("n"));
    assert_eq!(rules::rebuild_reason(&pod, true, false), None);
    assert_eq!(
        rules::rebuild_reason(&pod, true, true).as_deref(),
        Some("spec drifted")
    );
    let failed = with(
        phase(pod.clone(), "Running"),
        ann::LIFECYCLE_STATE,
        "failed",
    );
    assert_eq!(
        rules::rebuild_reason(&failed, true, true).as_deref(),
        Some("terminal (phase=Running lifecycle=failed)")
    );
    // The main's drift triage in step 11 does not count terminal (step 7 owns that).
    assert_eq!(rules::rebuild_reason(&failed, false, false), None);
}

#[test]
fn exhaustion_is_per_generation() {
    let mut h = RebuildHistory::default();
    h.record_delete("demo-1", at(0), 3);
    assert!(!rules::exhausted(&h, "demo-1", 3));
    rules::mark_exhausted(&mut h, "demo-1", 3);
    assert!(rules::exhausted(&h, "demo-1", 3));
    assert!(!rules::exhausted(&h, "demo-1", 4));
    assert!(rules::exhausted_earlier(&h, "demo-1", 4));
    // The mark survives the history codec (an extra field the Go operator ignores).
    let round = RebuildHistory::decode(&h.encode().unwrap_or_default());
    assert!(rules::exhausted(&round, "demo-1", 3));
}
