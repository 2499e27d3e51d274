//! Bounds on the work a client of the kubelet API can make the agent do (issue 26 item 8):
//! how much console log one answer carries, how many `logs -f` followers and exec sessions
//! run at once (per pod and per node), how many connections may sit before authentication
//! and for how long their TLS handshake may take, and how long a stream may stay idle.
//!
//! The limits are [`KubeletLimits`] (defaults below, each an env var of the node agent, see
//! `cocoon_node::config`); the rules are pure functions and a slot table ([`Slots`]) so that they
//! are table-tested here, and the server only acts on their answers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;

/// Default of [`KubeletLimits::log_max_bytes`] (`VK_LOG_MAX_BYTES`): 4 MiB.
pub const DEFAULT_LOG_MAX_BYTES: usize = 4 << 20;
/// Default of [`KubeletLimits::log_max_line_bytes`] (`VK_LOG_MAX_LINE_BYTES`): 16 KiB, the
/// line size at which the kubelet's CRI log format splits a line.
pub const DEFAULT_LOG_MAX_LINE_BYTES: usize = 16 << 10;
/// Default of [`KubeletLimits::log_followers_per_pod`] (`VK_LOG_FOLLOWERS_PER_POD`).
pub const DEFAULT_LOG_FOLLOWERS_PER_POD: usize = 4;
/// Default of [`KubeletLimits::log_followers_per_node`] (`VK_LOG_FOLLOWERS_PER_NODE`).
pub const DEFAULT_LOG_FOLLOWERS_PER_NODE: usize = 64;
/// Default of [`KubeletLimits::log_reads_per_node`] (`VK_LOG_READS_PER_NODE`).
pub const DEFAULT_LOG_READS_PER_NODE: usize = 16;
/// Default of [`KubeletLimits::exec_sessions_per_pod`] (`VK_EXEC_SESSIONS_PER_POD`).
pub const DEFAULT_EXEC_SESSIONS_PER_POD: usize = 8;
/// Default of [`KubeletLimits::exec_sessions_per_node`] (`VK_EXEC_SESSIONS_PER_NODE`).
pub const DEFAULT_EXEC_SESSIONS_PER_NODE: usize = 64;
/// Default of [`KubeletLimits::preauth_connections`] (`VK_KUBELET_PREAUTH_CONNECTIONS`).
pub const DEFAULT_PREAUTH_CONNECTIONS: usize = 128;
/// Default of [`KubeletLimits::tls_handshake_timeout`] (`VK_KUBELET_TLS_HANDSHAKE_TIMEOUT`).
pub const DEFAULT_TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default of [`KubeletLimits::streaming_idle_timeout`]
/// (`VK_STREAMING_CONNECTION_IDLE_TIMEOUT`): 4 h, the kubelet's
/// `--streaming-connection-idle-timeout` default.
pub const DEFAULT_STREAMING_IDLE_TIMEOUT: Duration = Duration::from_secs(4 * 3600);

/// The limits of one kubelet API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KubeletLimits {
    /// Most console-log bytes one logs answer (or one read of a followed log) carries; the
    /// newest lines are kept.
    pub log_max_bytes: usize,
    /// Longer log lines are cut to this many bytes (their start is kept).
    pub log_max_line_bytes: usize,
    /// Concurrent `follow=true` log streams of one pod.
    pub log_followers_per_pod: usize,
    /// Concurrent `follow=true` log streams of the node.
    pub log_followers_per_node: usize,
    /// Concurrent log captures on the node (one-shot answers, a follower's first read, a
    /// followed pod's periodic read), each holding up to `log_max_bytes` until its answer is
    /// sent; beyond, a request gets HTTP 429 and a followed pod's read waits for its next turn.
    pub log_reads_per_node: usize,
    /// Concurrent exec sessions into one pod.
    pub exec_sessions_per_pod: usize,
    /// Concurrent exec sessions on the node.
    pub exec_sessions_per_node: usize,
    /// Connections accepted but not yet through authentication (TLS handshake, then the
    /// first authorized request); more are closed at once.
    pub preauth_connections: usize,
    /// A TLS handshake taking longer is dropped.
    pub tls_handshake_timeout: Duration,
    /// An exec session or followed log moving no data for this long is closed (zero: never,
    /// as the kubelet's flag).
    pub streaming_idle_timeout: Duration,
}

impl Default for KubeletLimits {
    fn default() -> Self {
        KubeletLimits {
            log_max_bytes: DEFAULT_LOG_MAX_BYTES,
            log_max_line_bytes: DEFAULT_LOG_MAX_LINE_BYTES,
            log_followers_per_pod: DEFAULT_LOG_FOLLOWERS_PER_POD,
            log_followers_per_node: DEFAULT_LOG_FOLLOWERS_PER_NODE,
            log_reads_per_node: DEFAULT_LOG_READS_PER_NODE,
            exec_sessions_per_pod: DEFAULT_EXEC_SESSIONS_PER_POD,
            exec_sessions_per_node: DEFAULT_EXEC_SESSIONS_PER_NODE,
            preauth_connections: DEFAULT_PREAUTH_CONNECTIONS,
            tls_handshake_timeout: DEFAULT_TLS_HANDSHAKE_TIMEOUT,
            streaming_idle_timeout: DEFAULT_STREAMING_IDLE_TIMEOUT,
        }
    }
}

/// Bounds a console log for an answer: every line longer than `max_line` is cut to its first
/// `max_line` bytes, then the newest lines that fit in `max_bytes` are kept (a last line
/// without newline counts as a line). Pure; the runtime already bounded what it captured,
/// this makes the answer's bound independent of the backend.
pub fn bound_log(body: &[u8], max_bytes: usize, max_line: usize) -> Vec<u8> {
    // A cut line plus its newline always fits the byte bound.
    let max_line = max_line.min(max_bytes.saturating_sub(1));
    let lines: Vec<(&[u8], bool)> = body
        .split_inclusive(|&b| b == b'\n')
        .map(|piece| {
            let (text, nl) = match piece.strip_suffix(b"\n") {
                Some(t) => (t, true),
                None => (piece, false),
            };
            (&text[..text.len().min(max_line)], nl)
        })
        .collect();
    let mut total = 0usize;
    let mut start = lines.len();
    while start > 0 {
        let (text, nl) = lines[start - 1];
        let len = text.len() + usize::from(nl);
        if total + len > max_bytes {
            break;
        }
        total += len;
        start -= 1;
    }
    let mut out = Vec::with_capacity(total);
    for (text, nl) in &lines[start..] {
        out.extend_from_slice(text);
        if *nl {
            out.push(b'\n');
        }
    }
    out
}

/// Why a slot was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotRefusal {
    /// The key (a pod) has `max` slots in use.
    PerKey { max: usize },
    /// The whole table (the node) has `max` slots in use.
    Total { max: usize },
}

#[derive(Debug)]
struct SlotTable {
    per_key: HashMap<String, usize>,
    total: usize,
    max_per_key: usize,
    max_total: usize,
}

/// Counted slots per key (a pod) and in total (the node): [`Slots::try_acquire`] hands out a
/// [`SlotGuard`] that frees its slot when dropped. The table holds only keys with a slot in
/// use, so it never holds more than `max_total` entries.
#[derive(Debug, Clone)]
pub struct Slots(Arc<Mutex<SlotTable>>);

impl Slots {
    pub fn new(max_per_key: usize, max_total: usize) -> Self {
        Slots(Arc::new(Mutex::new(SlotTable {
            per_key: HashMap::new(),
            total: 0,
            max_per_key,
            max_total,
        })))
    }

    fn table(&self) -> std::sync::MutexGuard<'_, SlotTable> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A slot for `key`, or why not: the per-key limit is checked first (the more specific
    /// answer), then the total.
    pub fn try_acquire(&self, key: &str) -> Result<SlotGuard, SlotRefusal> {
        let mut t = self.table();
        let used = t.per_key.get(key).copied().unwrap_or(0);
        if used >= t.max_per_key {
            return Err(SlotRefusal::PerKey { max: t.max_per_key });
        }
        if t.total >= t.max_total {
            return Err(SlotRefusal::Total { max: t.max_total });
        }
        t.total += 1;
        *t.per_key.entry(key.to_owned()).or_insert(0) += 1;
        Ok(SlotGuard {
            slots: self.clone(),
            key: key.to_owned(),
        })
    }

    /// Slots in use for `key`, and in total.
    pub fn in_use(&self, key: &str) -> (usize, usize) {
        let t = self.table();
        (t.per_key.get(key).copied().unwrap_or(0), t.total)
    }

    /// Keys with a slot in use.
    pub fn keys(&self) -> usize {
        self.table().per_key.len()
    }
}

/// One slot of a [`Slots`] table, freed on drop.
#[derive(Debug)]
pub struct SlotGuard {
    slots: Slots,
    key: String,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let mut t = self.slots.table();
        t.total = t.total.saturating_sub(1);
        if let Some(n) = t.per_key.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                t.per_key.remove(&self.key);
            }
        }
    }
}

/// The refusal text of a stream beyond its limit: names the limit and its variable.
pub fn refusal_message(what: &str, pod: &str, refusal: &SlotRefusal) -> String {
    match refusal {
        SlotRefusal::PerKey { max } => format!(
            "vk-cocoon: too many concurrent {what} for pod {pod} (limit {max}, {})",
            if what.starts_with("exec") {
                "VK_EXEC_SESSIONS_PER_POD"
            } else {
                "VK_LOG_FOLLOWERS_PER_POD"
            }
        ),
        SlotRefusal::Total { max } => format!(
            "vk-cocoon: too many concurrent {what} on this node (limit {max}, {})",
            if what.starts_with("exec") {
                "VK_EXEC_SESSIONS_PER_NODE"
            } else {
                "VK_LOG_FOLLOWERS_PER_NODE"
            }
        ),
    }
}

/// The pre-authentication slot of one connection: held from accept until the connection's
/// first request passes authentication and authorization ([`PreAuthSlot::release`]), or the
/// connection ends. Cloned into every request of the connection.
#[derive(Debug, Clone)]
pub struct PreAuthSlot(Arc<Mutex<Option<OwnedSemaphorePermit>>>);

impl PreAuthSlot {
    pub fn new(permit: OwnedSemaphorePermit) -> Self {
        PreAuthSlot(Arc::new(Mutex::new(Some(permit))))
    }

    /// Frees the slot (the connection is authenticated); later calls do nothing.
    pub fn release(&self) {
        let permit = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        drop(permit);
    }
}

/// Parses a duration knob: Go-style (`4h`, `30m`, `1h30m`, `10s`, `500ms`, `0`) or a bare
/// number of seconds.
pub fn parse_duration(raw: &str) -> Result<Duration, String> {
    let s = raw.trim();
    if s.is_empty() {
        return Err("empty duration".into());
    }
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .ok_or_else(|| format!("{raw:?}: missing unit (h, m, s, ms)"))?;
        if digits == 0 {
            return Err(format!("{raw:?}: want a number before each unit"));
        }
        let value: f64 = rest[..digits]
            .parse()
            .map_err(|_| format!("{raw:?}: bad number {:?}", &rest[..digits]))?;
        let after = &rest[digits..];
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let per_unit = match &after[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            u => return Err(format!("{raw:?}: unknown unit {u:?} (h, m, s, ms)")),
        };
        total += Duration::try_from_secs_f64(value * per_unit)
            .map_err(|_| format!("{raw:?}: out of range"))?;
        rest = &after[unit_len..];
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_answers_are_bounded_in_bytes_and_line_length() {
        let cases: &[(&str, usize, usize, &str, &str)] = &[
            (
                "a\nb\nc\n",
                100,
                100,
                "a\nb\nc\n",
                "within bounds: unchanged",
            ),
            (
                "a\nb\nc",
                100,
                100,
                "a\nb\nc",
                "a last line without newline",
            ),
            ("", 100, 100, "", "empty"),
            (
                "aaaa\nbbbb\ncccc\n",
                10,
                100,
                "bbbb\ncccc\n",
                "older lines dropped first",
            ),
            (
                "0123456789\nab\n",
                100,
                4,
                "0123\nab\n",
                "a long line is cut, its newline kept",
            ),
            (
                "0123456789",
                100,
                4,
                "0123",
                "a cut last line without newline",
            ),
            (
                "0123456789\n0123456789\n",
                6,
                100,
                "01234\n",
                "a line longer than the whole bound is cut to fit it",
            ),
        ];
        for (body, max, line, want, what) in cases {
            let got = bound_log(body.as_bytes(), *max, *line);
            assert_eq!(String::from_utf8_lossy(&got), *want, "{what}");
            assert!(got.len() <= *max, "{what}: {} > {max}", got.len());
        }
        // The line cut is applied before the byte bound: a huge line costs its cut only.
        let huge = format!("{}\nok\n", "x".repeat(1 << 20));
        let got = bound_log(huge.as_bytes(), 100, 10);
        assert_eq!(String::from_utf8_lossy(&got), "xxxxxxxxxx\nok\n");
    }

    #[test]
    fn slots_are_counted_per_key_and_in_total_and_freed_on_drop() {
        let s = Slots::new(2, 3);
        let a1 = s.try_acquire("ns/a").expect("a1");
        let a2 = s.try_acquire("ns/a").expect("a2");
        assert_eq!(
            s.try_acquire("ns/a").expect_err("a3"),
            SlotRefusal::PerKey { max: 2 }
        );
        let b1 = s.try_acquire("ns/b").expect("b1");
        assert_eq!(
            s.try_acquire("ns/c").expect_err("node full"),
            SlotRefusal::Total { max: 3 }
        );
        assert_eq!(s.in_use("ns/a"), (2, 3));
        drop(a1);
        assert_eq!(s.in_use("ns/a"), (1, 2));
        let c1 = s.try_acquire("ns/c").expect("a slot freed");
        drop((a2, b1, c1));
        assert_eq!(s.in_use("ns/a"), (0, 0));
        assert_eq!(s.keys(), 0, "no key is remembered once free");
    }

    #[test]
    fn refusals_name_the_limit() {
        assert_eq!(
            refusal_message("exec sessions", "ns/p", &SlotRefusal::PerKey { max: 2 }),
            "vk-cocoon: too many concurrent exec sessions for pod ns/p (limit 2, VK_EXEC_SESSIONS_PER_POD)"
        );
        assert_eq!(
            refusal_message("log followers", "ns/p", &SlotRefusal::Total { max: 9 }),
            "vk-cocoon: too many concurrent log followers on this node (limit 9, VK_LOG_FOLLOWERS_PER_NODE)"
        );
    }

    #[test]
    fn durations() {
        for (raw, want) in [
            ("4h", 4 * 3_600_000),
            ("30m", 30 * 60_000),
            ("1h30m", 90 * 60_000),
            ("10s", 10_000),
            ("500ms", 500),
            ("1.5s", 1500),
            ("0", 0),
            ("0s", 0),
            ("15", 15_000),
        ] {
            assert_eq!(
                parse_duration(raw).expect(raw),
                Duration::from_millis(want),
                "{raw}"
            );
        }
        for bad in ["", "x", "10d", "h", "1h-3m"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }
}
