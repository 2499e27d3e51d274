//! Readiness probes (`node.md` §11.1): one probe loop per pod with the warm-up/steady interval
//! state machine, results held for the status computation.
//!
//! The ICMP pinger is the no-op variant the spec allows without raw-socket capability: a pod
//! without `probe-port` is ready once its IP resolves; with `probe-port` a TCP connect decides.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

/// Probe timing (spec defaults in [`ProbeSchedule::default`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProbeSchedule {
    /// First warm-up delay (100 ms).
    pub warmup_start: Duration,
    /// Warm-up growth factor (1.5).
    pub warmup_factor: f64,
    /// Warm-up cap (1 s).
    pub warmup_cap: Duration,
    /// Steady interval once ready (5 s).
    pub ready_every: Duration,
    /// Consecutive failures before ready → not ready (3).
    pub fail_threshold: u32,
    /// Per-probe timeout (3 s).
    pub timeout: Duration,
}

impl Default for ProbeSchedule {
    fn default() -> Self {
        ProbeSchedule {
            warmup_start: Duration::from_millis(100),
            warmup_factor: 1.5,
            warmup_cap: Duration::from_secs(1),
            ready_every: Duration::from_secs(5),
            fail_threshold: 3,
            timeout: Duration::from_secs(3),
        }
    }
}

/// The interval state machine of §11.1.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeState {
    /// Current readiness.
    pub ready: bool,
    /// Consecutive failures while ready.
    pub failures: u32,
    /// Delay before the next probe.
    pub delay: Duration,
}

impl ProbeState {
    /// Not ready, warm-up delay.
    pub fn new(s: &ProbeSchedule) -> Self {
        ProbeState {
            ready: false,
            failures: 0,
            delay: s.warmup_start,
        }
    }

    /// Feeds one probe result; returns true when readiness flipped (call `on_update`).
    pub fn observe(&mut self, ok: bool, s: &ProbeSchedule) -> bool {
        match (self.ready, ok) {
            (false, true) => {
                self.ready = true;
                self.failures = 0;
                self.delay = s.ready_every;
                true
            }
            (false, false) => {
                self.delay = self.delay.mul_f64(s.warmup_factor).min(s.warmup_cap);
                false
            }
            (true, true) => {
                self.failures = 0;
                false
            }
            (true, false) => {
                self.failures += 1;
                if self.failures >= s.fail_threshold {
                    self.ready = false;
                    self.failures = 0;
                    self.delay = s.warmup_start;
                    true
                } else {
                    false
                }
            }
        }
    }
}

/// The result of a probe as the status sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeResult {
    /// Ready (and live).
    pub ready: bool,
    /// Last message.
    pub message: String,
    /// When the last probe ran.
    pub last_seen: Instant,
}

/// One probe run.
pub type ProbeFn = Arc<dyn Fn() -> BoxFuture<'static, (bool, String)> + Send + Sync>;
/// Called when readiness flips.
pub type UpdateFn = Arc<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>;

/// Beyond the spec: an early re-probe of a pod that is not ready, before its warm-up
/// interval is over. `start` is called before each probe (so nothing that happens during the
/// probe is missed) and resolves when re-probing is worth it; its wait is kept only when the
/// probe's message satisfies `when`. The warm-up intervals stay the fallback.
#[derive(Clone)]
pub struct Nudge {
    /// Starts one wait.
    pub start: Arc<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>,
    /// Whether a failed probe with this message keeps the wait.
    pub when: fn(&str) -> bool,
}

struct Agent {
    epoch: u64,
    stop: CancellationToken,
    result: Option<ProbeResult>,
}

/// Per-pod probe loops.
pub struct ProbeManager {
    schedule: ProbeSchedule,
    agents: Mutex<HashMap<String, Agent>>,
    epoch: std::sync::atomic::AtomicU64,
    shutdown: CancellationToken,
    observe: Arc<dyn Fn(Duration) + Send + Sync>,
    nudge: Option<Nudge>,
}

impl ProbeManager {
    /// A manager whose loops end with `shutdown`; `observe` records each probe's duration.
    pub fn new(
        schedule: ProbeSchedule,
        shutdown: CancellationToken,
        observe: Arc<dyn Fn(Duration) + Send + Sync>,
    ) -> Self {
        ProbeManager {
            schedule,
            agents: Mutex::new(HashMap::new()),
            epoch: Default::default(),
            shutdown,
            observe,
            nudge: None,
        }
    }

    /// The same manager, re-probing a not-ready pod early on `nudge`.
    pub fn with_nudge(mut self, nudge: Nudge) -> Self {
        self.nudge = Some(nudge);
        self
    }

    /// A wait for an early probe, taken before a probe whose outcome decides whether it is
    /// kept ([`ProbeManager::keep_nudge`]).
    fn nudge_wait(&self) -> Option<BoxFuture<'static, ()>> {
        self.nudge.as_ref().map(|n| (n.start)())
    }

    fn keep_nudge(
        &self,
        wait: Option<BoxFuture<'static, ()>>,
        ready: bool,
        message: &str,
    ) -> Option<BoxFuture<'static, ()>> {
        let n = self.nudge.as_ref()?;
        wait.filter(|_| !ready && (n.when)(message))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Agent>> {
        self.agents.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn run_once(&self, probe: &ProbeFn) -> (bool, String) {
        let start = Instant::now();
        let out = match tokio::time::timeout(self.schedule.timeout, probe()).await {
            Ok(r) => r,
            Err(_) => (false, "probe timed out".to_owned()),
        };
        (self.observe)(start.elapsed());
        out
    }

    fn record(&self, key: &str, epoch: u64, ready: bool, message: String) -> bool {
        let mut agents = self.lock();
        match agents.get_mut(key) {
            Some(a) if a.epoch == epoch => {
                a.result = Some(ProbeResult {
                    ready,
                    message,
                    last_seen: Instant::now(),
                });
                true
            }
            _ => false,
        }
    }

    /// Cancels any earlier loop for `key`, runs the first probe synchronously, records it and
    /// starts the loop.
    pub async fn start(self: &Arc<Self>, key: &str, probe: ProbeFn, on_update: UpdateFn) {
        let epoch = self
            .epoch
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let stop = self.shutdown.child_token();
        if let Some(old) = self.lock().insert(
            key.to_owned(),
            Agent {
                epoch,
                stop: stop.clone(),
                result: None,
            },
        ) {
            old.stop.cancel();
        }
        let wait = self.nudge_wait();
        let (ok, msg) = self.run_once(&probe).await;
        let mut early = self.keep_nudge(wait, ok, &msg);
        if !self.record(key, epoch, ok, msg) {
            return;
        }
        let mut state = ProbeState::new(&self.schedule);
        state.observe(ok, &self.schedule);
        let me = self.clone();
        let key = key.to_owned();
        tokio::spawn(async move {
            loop {
                let nudged = async {
                    match early.as_mut() {
                        Some(w) => w.await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(state.delay) => {}
                    _ = nudged => {}
                }
                let wait = if state.ready { None } else { me.nudge_wait() };
                let (ok, msg) = tokio::select! {
                    _ = stop.cancelled() => return,
                    r = me.run_once(&probe) => r,
                };
                early = me.keep_nudge(wait, ok, &msg);
                let flipped = state.observe(ok, &me.schedule);
                // The recorded readiness follows the state machine, not the raw probe: a
                // ready pod stays ready until the failure threshold is reached.
                if !me.record(&key, epoch, state.ready, msg) {
                    return;
                }
                if flipped {
                    on_update().await;
                }
            }
        });
    }

    /// The recorded result for `key`.
    pub fn result(&self, key: &str) -> Option<ProbeResult> {
        self.lock().get(key).and_then(|a| a.result.clone())
    }

    /// Cancels the loop and drops the result.
    pub fn forget(&self, key: &str) {
        if let Some(a) = self.lock().remove(key) {
            a.stop.cancel();
        }
    }

    /// Cancels every loop.
    pub fn close(&self) {
        for (_, a) in self.lock().drain() {
            a.stop.cancel();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_grows_to_cap_then_ready_every_5s() {
        let s = ProbeSchedule::default();
        let mut st = ProbeState::new(&s);
        assert_eq!(st.delay, Duration::from_millis(100));
        assert!(!st.observe(false, &s));
        assert_eq!(st.delay, Duration::from_millis(150));
        for _ in 0..10 {
            st.observe(false, &s);
        }
        assert_eq!(st.delay, Duration::from_secs(1));
        assert!(st.observe(true, &s), "not ready → ready flips at once");
        assert_eq!(st.delay, Duration::from_secs(5));
    }

    #[test]
    fn ready_drops_only_after_three_consecutive_failures() {
        let s = ProbeSchedule::default();
        let mut st = ProbeState::new(&s);
        st.observe(true, &s);
        assert!(!st.observe(false, &s));
        assert!(!st.observe(false, &s));
        assert!(!st.observe(true, &s), "a success resets the count");
        assert!(!st.observe(false, &s));
        assert!(!st.observe(false, &s));
        assert!(st.ready);
        assert!(st.observe(false, &s));
        assert!(!st.ready);
        assert_eq!(st.delay, Duration::from_millis(100));
    }
}
