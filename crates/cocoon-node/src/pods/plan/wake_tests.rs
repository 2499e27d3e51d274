//! Table tests of the wake plan (`node.md` §8.3): the wake source decided on the reads so far,
//! the steps of a warm (node-local copy) and a cold (registry pull) wake, and what runs when
//! a step fails.

use super::wake::{
    ArtifactRead, LocalRead, Source, SourceFacts, SourceNext, SourceRead, VerifyRead, begin, plan,
    source,
};
use crate::pods::exec;
use crate::pods::plan::StepFailed;
use crate::pods::plan::testkit::{self, Script};
use cocoon_runtime::SnapshotRecord;

const VM: &str = "vk-a";

fn local() -> Box<SnapshotRecord> {
    Box::new(SnapshotRecord {
        id: "snap-1".into(),
        name: VM.into(),
        image: "img:1".into(),
        ..SnapshotRecord::default()
    })
}

fn owned() -> Option<ArtifactRead> {
    Some(ArtifactRead::Owned {
        digest: "sha256:d".into(),
    })
}

fn read(
    registry: bool,
    artifact: Option<ArtifactRead>,
    local: Option<LocalRead>,
    verify: Option<VerifyRead>,
) -> SourceFacts {
    SourceFacts {
        registry,
        artifact,
        local,
        verify,
    }
}

fn pull(reference: &str, drop_stale: bool) -> SourceNext {
    SourceNext::Use(Source::Pull {
        reference: reference.into(),
        drop_stale,
    })
}

#[test]
fn wake_source_table() {
    let present = || Some(LocalRead::Present(local()));
    let rows: Vec<(&str, SourceFacts, SourceNext)> = vec![
        (
            "nothing read yet: the `:hibernate` manifest, through the trust gate, first",
            read(true, None, None, None),
            SourceNext::Read(SourceRead::Artifact),
        ),
        (
            "the manifest records another owner: refused, nothing else is read",
            read(
                true,
                Some(ArtifactRead::Refused("not yours".into())),
                None,
                None,
            ),
            SourceNext::Fail("wake vk-a: not yours".into()),
        ),
        (
            "then the node-local snapshot <vm>",
            read(true, owned(), None, None),
            SourceNext::Read(SourceRead::Local),
        ),
        (
            "a local copy is verified against the registry before it is trusted",
            read(true, owned(), present(), None),
            SourceNext::Read(SourceRead::Verify),
        ),
        (
            "warm: the local copy is the registry's snapshot",
            read(true, owned(), present(), Some(VerifyRead::Matches)),
            SourceNext::Use(Source::Local(local())),
        ),
        (
            "warm without a registry: the local copy is trusted",
            read(
                false,
                Some(ArtifactRead::Absent),
                present(),
                Some(VerifyRead::Matches),
            ),
            SourceNext::Use(Source::Local(local())),
        ),
        (
            "a stale local copy is dropped, then the checked digest pulled",
            read(true, owned(), present(), Some(VerifyRead::Stale)),
            pull("sha256:d", true),
        ),
        (
            "an unverifiable local copy fails the wake and stays",
            read(
                true,
                owned(),
                present(),
                Some(VerifyRead::Failed("503".into())),
            ),
            SourceNext::Fail("verify local snapshot vk-a: 503".into()),
        ),
        (
            "a local inspect error fails the wake",
            read(true, owned(), Some(LocalRead::Failed("boom".into())), None),
            SourceNext::Fail("inspect local snapshot vk-a: boom".into()),
        ),
        (
            "cold: no local copy, the checked digest is pulled",
            read(true, owned(), Some(LocalRead::Absent), None),
            pull("sha256:d", false),
        ),
        (
            "an unreadable manifest (a transient registry error) fails the wake closed: \
             nothing else is read, nothing is pulled by tag",
            read(
                true,
                Some(ArtifactRead::Unreadable(
                    "get manifest vk-a:hibernate: 503".into(),
                )),
                None,
                None,
            ),
            SourceNext::Fail(
                "wake vk-a: get manifest vk-a:hibernate: 503 (refusing to pull \
                 vk-a:hibernate unchecked; the next update retries)"
                    .into(),
            ),
        ),
        (
            "an unreadable manifest fails closed even with a local copy at hand",
            read(
                true,
                Some(ArtifactRead::Unreadable("timeout".into())),
                present(),
                None,
            ),
            SourceNext::Fail(
                "wake vk-a: timeout (refusing to pull vk-a:hibernate unchecked; the next \
                 update retries)"
                    .into(),
            ),
        ),
        (
            "no `:hibernate` and no local copy: nothing checked, so nothing is pulled by tag",
            read(
                true,
                Some(ArtifactRead::Absent),
                Some(LocalRead::Absent),
                None,
            ),
            SourceNext::Fail(
                "wake vk-a: no usable local snapshot and no vk-a:hibernate in the registry".into(),
            ),
        ),
        (
            "no `:hibernate` and a stale local copy: the wake fails, the copy is kept",
            read(
                true,
                Some(ArtifactRead::Absent),
                present(),
                Some(VerifyRead::Stale),
            ),
            SourceNext::Fail(
                "wake vk-a: no usable local snapshot and no vk-a:hibernate in the registry".into(),
            ),
        ),
        (
            "no local copy and no registry",
            read(
                false,
                Some(ArtifactRead::Absent),
                Some(LocalRead::Absent),
                None,
            ),
            SourceNext::Fail("wake vk-a: no local snapshot and no puller configured".into()),
        ),
    ];
    for (situation, facts, want) in rows {
        assert_eq!(source(VM, &facts), want, "{situation}");
    }
}

#[test]
fn wake_plan_table() {
    let warm = Source::Local(local());
    let cold = Source::Pull {
        reference: "sha256:d".into(),
        drop_stale: false,
    };
    let stale = Source::Pull {
        reference: "sha256:d".into(),
        drop_stale: true,
    };
    let rows: [(&str, &Source, bool, &[&str]); 4] = [
        (
            "warm from the node-local copy: no pull, nothing to clean up",
            &warm,
            false,
            &[
                "start the boot clock",
                "ensure the snapshot's base image | fail WakeCloneFailed",
                "clone from vk-a (--pull if the snapshot has an image) | fail WakeCloneFailed: \
                 clone vm vk-a from vk-a",
                "observe boot clone",
                "finish bring-up, then Restore",
                "event Woken: cloned from vk-a",
            ],
        ),
        (
            "warm CH+Windows: the clone hot-adds the NIC the hibernate dropped",
            &warm,
            true,
            &[
                "start the boot clock",
                "ensure the snapshot's base image | fail WakeCloneFailed",
                "clone from vk-a (--pull if the snapshot has an image) --nics 1 | fail \
                 WakeCloneFailed: clone vm vk-a from vk-a",
                "observe boot clone",
                "finish bring-up, then Restore",
                "event Woken: cloned from vk-a",
            ],
        ),
        (
            "cold pull into the one-shot import, removed after the clone",
            &cold,
            false,
            &[
                "pull vk-a@sha256:d into vk-a-hibernate-import | fail WakePullFailed: pull \
                 hibernation snapshot vk-a",
                "inspect snapshot vk-a-hibernate-import | fail WakePullFailed: inspect imported \
                 snapshot vk-a-hibernate-import | undo: remove snapshot vk-a-hibernate-import in \
                 the background",
                "start the boot clock",
                "ensure the snapshot's base image | fail WakeCloneFailed",
                "clone from vk-a-hibernate-import (--pull if the snapshot has an image) | fail \
                 WakeCloneFailed: clone vm vk-a from vk-a-hibernate-import",
                "remove snapshot vk-a-hibernate-import in the background",
                "observe boot clone",
                "finish bring-up, then Restore",
                "event Woken: cloned from vk-a-hibernate-import",
            ],
        ),
        (
            "a stale local copy goes (with its fork baseline) before the pull",
            &stale,
            false,
            &[
                "drop local snapshots vk-a and fork-vk-a",
                "pull vk-a@sha256:d into vk-a-hibernate-import | fail WakePullFailed: pull \
                 hibernation snapshot vk-a",
                "inspect snapshot vk-a-hibernate-import | fail WakePullFailed: inspect imported \
                 snapshot vk-a-hibernate-import | undo: remove snapshot vk-a-hibernate-import in \
                 the background",
                "start the boot clock",
                "ensure the snapshot's base image | fail WakeCloneFailed",
                "clone from vk-a-hibernate-import (--pull if the snapshot has an image) | fail \
                 WakeCloneFailed: clone vm vk-a from vk-a-hibernate-import",
                "remove snapshot vk-a-hibernate-import in the background",
                "observe boot clone",
                "finish bring-up, then Restore",
                "event Woken: cloned from vk-a-hibernate-import",
            ],
        ),
    ];
    for (situation, src, ch_windows, want) in rows {
        assert_eq!(
            testkit::steps(&plan(VM, src, ch_windows)),
            want,
            "{situation}"
        );
    }
    assert_eq!(
        testkit::steps(&begin()),
        ["lifecycle creating", "clear id/ip | warn"],
        "before the source is read: a new attempt, stale runtime annotations cleared"
    );
}

/// A row of the execution table: the situation, the source, what fails, the calls made and
/// the outcome.
type Row<'a> = (
    &'a str,
    &'a Source,
    Script,
    &'a [&'a str],
    Result<(), StepFailed>,
);

#[tokio::test]
async fn wake_execution_table() {
    let cold = Source::Pull {
        reference: "sha256:d".into(),
        drop_stale: false,
    };
    let warm = Source::Local(local());
    let rows: Vec<Row<'_>> = vec![
        (
            "the pull fails: nothing imported, nothing to remove",
            &cold,
            Script::default().fail("pull", 1),
            &["pull vk-a@sha256:d into vk-a-hibernate-import ✗"],
            Err(StepFailed::refused(
                "WakePullFailed",
                "pull hibernation snapshot vk-a: boom",
            )),
        ),
        (
            "the import cannot be inspected: the wake fails, the import is not removed",
            &cold,
            Script::default().fail("inspect", 1),
            &[
                "pull vk-a@sha256:d into vk-a-hibernate-import",
                "inspect snapshot vk-a-hibernate-import ✗",
            ],
            Err(StepFailed::refused(
                "WakePullFailed",
                "inspect imported snapshot vk-a-hibernate-import: boom",
            )),
        ),
        (
            "the clone fails: the one-shot import is removed anyway",
            &cold,
            Script::default().fail("clone", 1),
            &[
                "pull vk-a@sha256:d into vk-a-hibernate-import",
                "inspect snapshot vk-a-hibernate-import",
                "start the boot clock",
                "ensure the snapshot's base image",
                "clone from vk-a-hibernate-import (--pull if the snapshot has an image) ✗",
                "undo: remove snapshot vk-a-hibernate-import in the background",
            ],
            Err(StepFailed::refused(
                "WakeCloneFailed",
                "clone vm vk-a from vk-a-hibernate-import: boom",
            )),
        ),
        (
            "the base image fails: its own words, and the import removed",
            &cold,
            Script::default().fail("ensure", 1),
            &[
                "pull vk-a@sha256:d into vk-a-hibernate-import",
                "inspect snapshot vk-a-hibernate-import",
                "start the boot clock",
                "ensure the snapshot's base image ✗",
                "undo: remove snapshot vk-a-hibernate-import in the background",
            ],
            Err(StepFailed::refused("WakeCloneFailed", "boom")),
        ),
        (
            "a warm clone fails: the local copy stays",
            &warm,
            Script::default().fail("clone", 1),
            &[
                "start the boot clock",
                "ensure the snapshot's base image",
                "clone from vk-a (--pull if the snapshot has an image) ✗",
            ],
            Err(StepFailed::refused(
                "WakeCloneFailed",
                "clone vm vk-a from vk-a: boom",
            )),
        ),
    ];
    for (situation, src, script, calls, outcome) in rows {
        let res = exec::run(&script, &plan(VM, src, false)).await;
        assert_eq!(script.calls(), calls, "{situation}");
        assert_eq!(res, outcome, "{situation}");
    }
}
