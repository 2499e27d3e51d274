//! The wait loop around the pure evaluator: read the current object first, then watch from its
//! resourceVersion; re-list when the watch closes; retry only transient errors; fail fast on
//! RBAC and not-found; print progress on stderr.

use std::fmt::Debug;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, WatchEvent, WatchParams};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;

use crate::error::CliError;
use crate::wait::{Goal, Observation, Progress, Verdict, WaitState};

/// What to wait for and how.
pub struct WaitSpec<'a> {
    pub kind: &'static str,
    pub name: &'a str,
    pub goal: Goal,
    pub goal_text: String,
    pub generation: i64,
    pub timeout: Duration,
    pub grace: Duration,
}

/// Progress output on stderr: one rewritten line on a TTY, plain lines otherwise.
struct Reporter {
    progress: Progress,
    tty: bool,
    started: Instant,
    prefix: String,
}

impl Reporter {
    fn say(&mut self, msg: &str) {
        let Some(line) = self.progress.line(self.started.elapsed(), msg) else {
            return;
        };
        let mut err = std::io::stderr();
        if self.tty {
            let _ = write!(err, "\r\x1b[K{} {line}", self.prefix);
        } else {
            let _ = writeln!(err, "{} {line}", self.prefix);
        }
        let _ = err.flush();
    }

    fn finish(&mut self) {
        if self.tty {
            let _ = writeln!(std::io::stderr());
        }
    }
}

/// Waits until `observe` says the goal holds at the spec's generation. `observe` may read more
/// than the object (the migration reads the main pod).
pub async fn wait_for<K, F, Fut>(
    api: &Api<K>,
    spec: WaitSpec<'_>,
    observe: F,
) -> Result<K, CliError>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    F: Fn(Option<K>) -> Fut,
    Fut: Future<Output = Result<(Option<K>, Observation), CliError>>,
{
    let mut reporter = Reporter {
        progress: Progress::default(),
        tty: std::io::stderr().is_terminal(),
        started: Instant::now(),
        prefix: format!("{}/{}", spec.kind, spec.name),
    };
    let mut state = WaitState::default();
    let mut last_failure: Option<String> = None;
    let result = tokio::time::timeout(spec.timeout, async {
        loop {
            // Current state first: an object that is already done returns at once.
            let current = match api.get_opt(spec.name).await {
                Ok(o) => o,
                Err(e) if CliError::is_transient_kube(&e) => {
                    reporter.say(&format!("retrying after a transient error: {e}"));
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
                Err(e) => return Err(CliError::from_kube(&format!("get {} {}", spec.kind, spec.name), e)),
            };
            let rv = current.as_ref().and_then(|o| o.resource_version()).unwrap_or_default();
            if let Some(done) = judge(&spec, &mut state, &mut reporter, &mut last_failure, observe(current).await?)? {
                return Ok(done);
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
            // A tick re-evaluates even without events (the migration also reads a pod).
            let mut tick = tokio::time::interval(Duration::from_secs(2));
            tick.tick().await;
            loop {
                let ev = tokio::select! {
                    ev = stream.try_next() => ev,
                    _ = tick.tick() => {
                        let cur = api.get_opt(spec.name).await.map_err(|e| CliError::from_kube(spec.kind, e));
                        if let Ok(cur) = cur && let Some(done) = judge(&spec, &mut state, &mut reporter, &mut last_failure, observe(cur).await?)? {
                            return Ok(done);
                        }
                        continue;
                    }
                };
                match ev {
                    Ok(Some(WatchEvent::Added(o) | WatchEvent::Modified(o))) => {
                        if let Some(done) = judge(&spec, &mut state, &mut reporter, &mut last_failure, observe(Some(o)).await?)? {
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
    reporter.finish();
    match result {
        Ok(r) => r,
        Err(_) => Err(CliError::Timeout {
            kind: spec.kind,
            name: spec.name.to_string(),
            goal: spec.goal_text.clone(),
            after: spec.timeout,
            last_failure,
        }),
    }
}

fn judge<K: Clone>(
    spec: &WaitSpec<'_>,
    state: &mut WaitState,
    reporter: &mut Reporter,
    last_failure: &mut Option<String>,
    (obj, obs): (Option<K>, Observation),
) -> Result<Option<K>, CliError> {
    let verdict = state.evaluate(
        &spec.goal,
        &obs,
        spec.generation,
        spec.grace,
        reporter.started.elapsed(),
    );
    if obs.phase == crate::wait::FAILED {
        *last_failure = Some(if obs.ready_message.is_empty() {
            obs.phase.clone()
        } else {
            obs.ready_message.clone()
        });
    }
    match verdict {
        Verdict::Done => {
            reporter.say(&obs.phase);
            Ok(obj)
        }
        Verdict::Waiting(msg) => {
            reporter.say(&msg);
            Ok(None)
        }
        Verdict::Failed(msg) => Err(CliError::Failed {
            kind: spec.kind,
            name: spec.name.to_string(),
            reason: msg,
        }),
        Verdict::Gone => Err(CliError::NotFound(format!(
            "{} {} not found",
            spec.kind, spec.name
        ))),
    }
}
