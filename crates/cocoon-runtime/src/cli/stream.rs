//! The CLI's line-oriented output: bounded event lines, the agent's own `vm logs` tail and
//! the `vm status` event stream.

use tokio::io::{AsyncBufRead, AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdout};
use tokio::task::JoinHandle;

use super::super::error::{Result, RuntimeError, classify};
use super::super::events::{VmEvent, parse_event_line};
use super::{MAX_EVENT_LINE, exit_text, trimmed};

/// One line of the event stream, bounded by `max` bytes.
#[derive(Debug, PartialEq, Eq)]
enum Line {
    /// A complete line without its newline.
    Text(Vec<u8>),
    /// A line longer than `max`, skipped up to its newline.
    TooLong,
}

/// Reads the next line (the last one may lack its newline); `None` at end of input.
async fn next_line(
    r: &mut (impl AsyncBufRead + Unpin),
    max: usize,
) -> std::io::Result<Option<Line>> {
    let mut buf = Vec::new();
    let mut too_long = false;
    loop {
        let avail = r.fill_buf().await?;
        if avail.is_empty() {
            return Ok(match (too_long, buf.is_empty()) {
                (true, _) => Some(Line::TooLong),
                (false, true) => None,
                (false, false) => Some(Line::Text(buf)),
            });
        }
        let (take, newline) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (avail.len(), false),
        };
        if !too_long {
            if buf.len() + take > max {
                too_long = true;
                buf = Vec::new();
            } else {
                buf.extend_from_slice(&avail[..take]);
            }
        }
        r.consume(take + usize::from(newline));
        if newline {
            return Ok(Some(if too_long {
                Line::TooLong
            } else {
                Line::Text(buf)
            }));
        }
    }
}

/// Keeps the last `lines` lines of a byte stream within `max_bytes` (older lines, then the
/// start of an over-long line, are dropped first): the agent's own tail for a `vm logs`
/// without `--tail`.
#[derive(Debug)]
pub struct TailKeeper {
    lines: usize,
    max_bytes: usize,
    done: std::collections::VecDeque<Vec<u8>>,
    bytes: usize,
    partial: Vec<u8>,
}

impl TailKeeper {
    /// A keeper of the last `lines` lines, at most `max_bytes` bytes.
    pub fn new(lines: usize, max_bytes: usize) -> Self {
        TailKeeper {
            lines,
            max_bytes,
            done: std::collections::VecDeque::new(),
            bytes: 0,
            partial: Vec::new(),
        }
    }

    /// Feeds the next chunk of the stream.
    pub fn push(&mut self, mut chunk: &[u8]) {
        while let Some(i) = chunk.iter().position(|&b| b == b'\n') {
            self.partial.extend_from_slice(&chunk[..=i]);
            self.cut_partial();
            let line = std::mem::take(&mut self.partial);
            self.bytes += line.len();
            self.done.push_back(line);
            chunk = &chunk[i + 1..];
            self.trim();
        }
        self.partial.extend_from_slice(chunk);
        self.trim();
    }

    fn trim(&mut self) {
        while self.done.len() > self.lines
            || (self.bytes + self.partial.len() > self.max_bytes && !self.done.is_empty())
        {
            if let Some(old) = self.done.pop_front() {
                self.bytes -= old.len();
            }
        }
        // Cut an over-long line only once it reaches twice the bound, so a huge line costs
        // one move per `max_bytes` of input, not one per chunk.
        if self.partial.len() > self.max_bytes.saturating_mul(2) {
            self.cut_partial();
        }
    }

    fn cut_partial(&mut self) {
        if self.partial.len() > self.max_bytes {
            let cut = self.partial.len() - self.max_bytes;
            self.partial.drain(..cut);
        }
    }

    /// The kept tail. A last line without newline counts as a line.
    pub fn finish(mut self) -> Vec<u8> {
        self.cut_partial();
        if !self.partial.is_empty() {
            let line = std::mem::take(&mut self.partial);
            self.bytes += line.len();
            self.done.push_back(line);
            self.trim();
        }
        self.done.into_iter().flatten().collect()
    }
}

/// State of the CLI event stream: the child, its stdout lines and its drained stderr.
pub(super) struct Watch {
    pub(super) child: Child,
    pub(super) lines: BufReader<ChildStdout>,
    pub(super) stderr: Option<JoinHandle<Vec<u8>>>,
    pub(super) finished: bool,
}

impl Watch {
    /// The next decodable event; undecodable or over-long lines are logged and skipped, events
    /// whose VM has neither id nor name are dropped. At end of output the child is reaped and
    /// a non-zero exit becomes a final error item.
    pub(super) async fn next_event(&mut self) -> Option<Result<VmEvent>> {
        if self.finished {
            return None;
        }
        loop {
            match next_line(&mut self.lines, MAX_EVENT_LINE).await {
                Ok(Some(Line::Text(bytes))) => {
                    let text = String::from_utf8_lossy(&bytes);
                    match parse_event_line(&text) {
                        None => continue,
                        Some(Ok(ev)) if ev.vm.id.is_empty() && ev.vm.config.name.is_empty() => {
                            tracing::debug!("event without VM id or name dropped");
                        }
                        Some(Ok(ev)) => return Some(Ok(ev)),
                        Some(Err(e)) => {
                            tracing::warn!(error = %e, "undecodable VM event line skipped");
                        }
                    }
                }
                Ok(Some(Line::TooLong)) => {
                    tracing::warn!(max = MAX_EVENT_LINE, "over-long VM event line skipped");
                }
                Ok(None) => return self.finish().await,
                Err(e) => {
                    self.finished = true;
                    return Some(Err(RuntimeError::Other(format!(
                        "cocoon vm status: read events: {e}"
                    ))));
                }
            }
        }
    }

    async fn finish(&mut self) -> Option<Result<VmEvent>> {
        self.finished = true;
        let status = match self.child.wait().await {
            Ok(s) => s,
            Err(e) => {
                return Some(Err(RuntimeError::Other(format!(
                    "cocoon vm status: wait: {e}"
                ))));
            }
        };
        let stderr = match self.stderr.take() {
            Some(h) => h.await.unwrap_or_default(),
            None => Vec::new(),
        };
        (!status.success()).then(|| {
            Err(classify(format!(
                "cocoon vm status: {} (stderr: {})",
                exit_text(&status),
                trimmed(&stderr)
            )))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_bounded_and_skipped_when_too_long() {
        let input = b"first\nxxxxxxxxxxxxxxxxxxxx\n\nlast-no-newline".to_vec();
        let mut r = tokio::io::BufReader::with_capacity(4, input.as_slice());
        let mut got = Vec::new();
        while let Some(l) = next_line(&mut r, 16).await.expect("read") {
            got.push(l);
        }
        assert_eq!(
            got,
            vec![
                Line::Text(b"first".to_vec()),
                Line::TooLong,
                Line::Text(Vec::new()),
                Line::Text(b"last-no-newline".to_vec()),
            ]
        );
    }

    #[test]
    fn tail_keeper_keeps_the_last_lines_within_the_byte_bound() {
        // chunks, lines, max bytes, the kept tail.
        type Case = (&'static [&'static [u8]], usize, usize, &'static [u8]);
        let cases: &[Case] = &[
            (&[b"a\nb\nc\n"], 2, 100, b"b\nc\n"),
            // Chunks split lines anywhere.
            (
                &[b"on", b"e\ntw", b"o\nthr", b"ee\n"],
                2,
                100,
                b"two\nthree\n",
            ),
            // A last line without newline is a line.
            (&[b"a\nb\nc"], 2, 100, b"b\nc"),
            (&[b"a\n"], 5, 100, b"a\n"),
            (&[b""], 5, 100, b""),
            (&[b"a\nb\n"], 0, 100, b""),
            // The byte bound drops older lines first ...
            (&[b"aaaa\nbbbb\ncccc\n"], 10, 10, b"bbbb\ncccc\n"),
            // ... then the start of a line longer than the bound.
            (&[b"x\n0123456789abcdef"], 10, 8, b"89abcdef"),
            (
                &[b"0123456789", b"abcdefghij", b"klmnopqrst"],
                10,
                8,
                b"mnopqrst",
            ),
            // A cut line that then ends is kept (its end), later lines after it.
            (&[b"0123456789abcdefghij\n", b"z\n"], 10, 8, b"z\n"),
            (&[b"0123456789abcdefghij\n"], 10, 8, b"defghij\n"),
        ];
        for (chunks, lines, max, want) in cases {
            let mut k = TailKeeper::new(*lines, *max);
            for c in *chunks {
                k.push(c);
            }
            assert_eq!(
                String::from_utf8_lossy(&k.finish()),
                String::from_utf8_lossy(want),
                "{chunks:?} lines={lines} max={max}"
            );
        }
    }
}
