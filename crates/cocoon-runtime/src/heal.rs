//! Snapshot-save name-collision healing (§3.3), written once over two raw verbs so the CLI
//! backend and the simulator heal identically (and the simulator exercises both wordings).
//!
//! Saving into a taken name removes the holder (retrying while it is locked) and saves again,
//! which makes hibernate retries idempotent.

use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::error::{Result, RuntimeError};

/// The two raw verbs healing needs: one `snapshot save` and one `snapshot rm`.
#[async_trait]
pub(crate) trait RawSnapshotVerbs: Send + Sync {
    /// One `snapshot save --name <name> <vm_id>`, errors classified.
    async fn raw_save(&self, name: &str, vm_id: &str) -> Result<()>;
    /// One `snapshot rm <name-or-id>`, errors classified.
    async fn raw_rm(&self, name_or_id: &str) -> Result<()>;
}

/// How long healing retries a locked holder (§3.3: every 500 ms for up to 30 s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Pause between `snapshot rm` attempts while the holder is locked.
    pub interval: Duration,
    /// Give up after this long.
    pub deadline: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            interval: Duration::from_millis(500),
            deadline: Duration::from_secs(30),
        }
    }
}

/// `snapshot save` with §3.3 healing:
/// 1. on `already exists` / `already in use by` / `held by`, the holder is the parsed id, else
///    the name;
/// 2. `snapshot rm <holder>`, retried every `interval` while it says `is in use by an active`,
///    up to `deadline`; any other rm error fails at once;
/// 3. save again (once).
pub(crate) async fn save_healing(
    verbs: &dyn RawSnapshotVerbs,
    name: &str,
    vm_id: &str,
    policy: RetryPolicy,
) -> Result<()> {
    let holder = match verbs.raw_save(name, vm_id).await {
        Ok(()) => return Ok(()),
        Err(RuntimeError::AlreadyExists { holder, .. }) => {
            holder.unwrap_or_else(|| name.to_owned())
        }
        Err(e) => return Err(e),
    };
    tracing::info!(snapshot = name, holder = %holder, "snapshot name taken; replacing it");
    let deadline = Instant::now() + policy.deadline;
    loop {
        match verbs.raw_rm(&holder).await {
            Ok(()) => break,
            Err(e @ RuntimeError::InUse(_)) => {
                if Instant::now() + policy.interval > deadline {
                    return Err(e);
                }
                tokio::time::sleep(policy.interval).await;
            }
            Err(e) => return Err(e),
        }
    }
    verbs.raw_save(name, vm_id).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::classify;
    use std::collections::VecDeque;
    use std::sync::Mutex;

    /// Scripted raw verbs: each call pops the next answer (`None` = success) and is logged.
    struct Script {
        saves: Mutex<VecDeque<Option<&'static str>>>,
        rms: Mutex<VecDeque<Option<&'static str>>>,
        log: Mutex<Vec<String>>,
    }

    impl Script {
        fn new(saves: &[Option<&'static str>], rms: &[Option<&'static str>]) -> Self {
            Script {
                saves: Mutex::new(saves.iter().copied().collect()),
                rms: Mutex::new(rms.iter().copied().collect()),
                log: Mutex::new(Vec::new()),
            }
        }

        fn log(&self) -> Vec<String> {
            self.log.lock().map(|l| l.clone()).unwrap_or_default()
        }

        fn answer(q: &Mutex<VecDeque<Option<&'static str>>>) -> Result<()> {
            let next = q.lock().ok().and_then(|mut q| q.pop_front()).flatten();
            next.map_or(Ok(()), |text| Err(classify(text)))
        }
    }

    #[async_trait]
    impl RawSnapshotVerbs for Script {
        async fn raw_save(&self, name: &str, vm_id: &str) -> Result<()> {
            if let Ok(mut l) = self.log.lock() {
                l.push(format!("save {name} {vm_id}"));
            }
            Self::answer(&self.saves)
        }
        async fn raw_rm(&self, name: &str) -> Result<()> {
            if let Ok(mut l) = self.log.lock() {
                l.push(format!("rm {name}"));
            }
            Self::answer(&self.rms)
        }
    }

    fn fast() -> RetryPolicy {
        RetryPolicy {
            interval: Duration::from_millis(1),
            deadline: Duration::from_millis(200),
        }
    }

    #[tokio::test]
    async fn free_name_saves_once() {
        let s = Script::new(&[None], &[]);
        save_healing(&s, "vk-a", "id1", fast()).await.expect("save");
        assert_eq!(s.log(), ["save vk-a id1"]);
    }

    #[tokio::test]
    async fn old_wording_removes_by_name_and_saves_again() {
        let s = Script::new(
            &[Some(r#"snapshot name "vk-a" already exists"#), None],
            &[None],
        );
        save_healing(&s, "vk-a", "id1", fast()).await.expect("save");
        assert_eq!(s.log(), ["save vk-a id1", "rm vk-a", "save vk-a id1"]);
    }

    #[tokio::test]
    async fn new_wordings_remove_the_holder_id() {
        for text in [
            r#"snapshot name "vk-a" already in use by 0a1b2c"#,
            r#"snapshot name "vk-a" already exists (held by 0a1b2c)"#,
        ] {
            let s = Script::new(&[Some(text), None], &[None]);
            save_healing(&s, "vk-a", "id1", fast()).await.expect("save");
            assert_eq!(
                s.log(),
                ["save vk-a id1", "rm 0a1b2c", "save vk-a id1"],
                "{text}"
            );
        }
    }

    #[tokio::test]
    async fn locked_holder_is_retried_then_removed() {
        let locked = Some(r#"snapshot "vk-a" is in use by an active export"#);
        let s = Script::new(&[Some("already exists"), None], &[locked, locked, None]);
        save_healing(&s, "vk-a", "id1", fast()).await.expect("save");
        assert_eq!(
            s.log(),
            [
                "save vk-a id1",
                "rm vk-a",
                "rm vk-a",
                "rm vk-a",
                "save vk-a id1"
            ]
        );
    }

    #[tokio::test]
    async fn locked_holder_gives_up_at_the_deadline() {
        let locked = Some("is in use by an active clone");
        let s = Script::new(&[Some("already exists")], &[locked; 1000]);
        let policy = RetryPolicy {
            interval: Duration::from_millis(5),
            deadline: Duration::from_millis(40),
        };
        let err = save_healing(&s, "vk-a", "id1", policy)
            .await
            .expect_err("gives up");
        assert!(matches!(err, RuntimeError::InUse(_)), "{err:?}");
        let rms = s.log().iter().filter(|l| l.starts_with("rm")).count();
        assert!((2..=10).contains(&rms), "{rms} rm attempts");
    }

    #[tokio::test]
    async fn other_rm_error_fails_at_once_and_other_save_errors_pass_through() {
        let s = Script::new(&[Some("already exists")], &[Some("permission denied")]);
        let err = save_healing(&s, "vk-a", "id1", fast())
            .await
            .expect_err("fails");
        assert_eq!(err.to_string(), "permission denied");
        assert_eq!(s.log(), ["save vk-a id1", "rm vk-a"]);

        let s = Script::new(&[Some("VM not found")], &[]);
        let err = save_healing(&s, "vk-a", "id1", fast())
            .await
            .expect_err("fails");
        assert!(err.is_vm_not_found());
        assert_eq!(s.log().len(), 1);
    }
}
