//! Table tests of stale-create reconciliation, row by row as `node.md` §14 ("Stale-create
//! reconciliation") and §9.1 step 3 state it: what the verb's answer means at startup, the
//! inspect after `not-creating`, and the watcher's turns.

use std::time::Duration;

use cocoon_runtime::{RuntimeError, StaleCreateOutcome, VmRecord};

use super::stale::{
    End, Next, Record, Turn, after_ask_again, give_up, on_answer, on_reinspect, outcome, watch_turn,
};
use crate::pods::rules::InspectOutcome;

fn state(s: &str) -> InspectOutcome {
    InspectOutcome::State(s.into())
}

#[test]
fn startup_answer_table() {
    use StaleCreateOutcome::*;
    let rows = [
        ("collected frees the name", Some(Collected), Next::NameFreed),
        ("not-found frees the name", Some(NotFound), Next::NameFreed),
        (
            "busy starts the watcher",
            Some(Busy),
            Next::Watch(Record::Listed),
        ),
        (
            "a verb error starts the watcher",
            None,
            Next::Watch(Record::Listed),
        ),
        (
            "not-creating → inspect again",
            Some(NotCreating),
            Next::InspectAgain,
        ),
    ];
    for (rule, answer, want) in rows {
        assert_eq!(on_answer(answer), want, "{rule}");
    }
}

#[test]
fn inspect_after_not_creating_table() {
    let rows = [
        (
            "still creating → watch the fresh record",
            state("creating"),
            Next::Watch(Record::Fresh),
        ),
        (
            "running → reconcile it like any listed VM",
            state("running"),
            Next::ReconcileAsListed,
        ),
        (
            "stopped → reconcile it like any listed VM",
            state("stopped"),
            Next::ReconcileAsListed,
        ),
        (
            "gone → the name is free",
            InspectOutcome::NotFound,
            Next::NameFreed,
        ),
        (
            "the inspect failed → watch the listed record",
            InspectOutcome::Transient,
            Next::Watch(Record::Listed),
        ),
    ];
    for (rule, inspected, want) in rows {
        assert_eq!(on_reinspect(&inspected), want, "{rule}");
    }
}

#[test]
fn watcher_turn_table() {
    let rows = [
        (
            "gone → the name is free",
            InspectOutcome::NotFound,
            false,
            Turn::Over(End::NameFreed),
        ),
        (
            "running → indexed by name for adoption",
            state("running"),
            false,
            Turn::Over(End::IndexForAdoption),
        ),
        (
            "running, even when a pod tracks it (the index checks)",
            state("running"),
            true,
            Turn::Over(End::IndexForAdoption),
        ),
        (
            "dead → the orphan policy",
            state("stopped"),
            false,
            Turn::Over(End::OrphanPolicy),
        ),
        (
            "created (a dead create) → the orphan policy",
            state("created"),
            false,
            Turn::Over(End::OrphanPolicy),
        ),
        (
            "error → the orphan policy",
            state("error"),
            false,
            Turn::Over(End::OrphanPolicy),
        ),
        (
            "dead but tracked by a pod → that pod owns it",
            state("stopped (stale)"),
            true,
            Turn::Over(End::Owned),
        ),
        (
            "still creating → ask the verb again",
            state("creating"),
            false,
            Turn::AskAgain,
        ),
        (
            "the inspect failed → look again",
            InspectOutcome::Transient,
            false,
            Turn::LookAgain,
        ),
    ];
    for (rule, inspected, owned, want) in rows {
        assert_eq!(watch_turn(&inspected, owned), want, "{rule}");
    }
}

#[test]
fn asked_again_table() {
    use StaleCreateOutcome::*;
    let rows = [
        (
            "collected → the name is free",
            Some(Collected),
            Turn::Over(End::NameFreed),
        ),
        (
            "not-found → the name is free",
            Some(NotFound),
            Turn::Over(End::NameFreed),
        ),
        ("busy → look again", Some(Busy), Turn::LookAgain),
        (
            "not-creating → look again (the next inspect decides)",
            Some(NotCreating),
            Turn::LookAgain,
        ),
        ("a verb error → look again", None, Turn::LookAgain),
    ];
    for (rule, answer, want) in rows {
        assert_eq!(after_ask_again(answer), want, "{rule}");
    }
}

#[test]
fn the_budget_and_the_inspect() {
    let budget = Duration::from_secs(30 * 60);
    assert!(
        !give_up(Duration::from_secs(29 * 60), budget),
        "within the 30 min budget"
    );
    assert!(
        give_up(budget, budget),
        "the budget used up: leave the record to the runtime"
    );
    let running = VmRecord {
        state: "running".into(),
        ..VmRecord::default()
    };
    let rows: [(Result<VmRecord, RuntimeError>, InspectOutcome); 3] = [
        (Ok(running), state("running")),
        (
            Err(RuntimeError::VmNotFound("vm x: VM not found".into())),
            InspectOutcome::NotFound,
        ),
        (
            Err(RuntimeError::Other("connection reset".into())),
            InspectOutcome::Transient,
        ),
    ];
    for (inspected, want) in rows {
        assert_eq!(outcome(&inspected), want, "{inspected:?}");
    }
}
