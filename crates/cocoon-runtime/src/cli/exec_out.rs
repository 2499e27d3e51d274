//! What an `exec` child's output streams say beyond the guest's bytes: the CLI's own refusals
//! (a release without the verb or flag) and the CLI's own failures (v0.5.x, issue 40).
//!
//! `vm exec` streams the guest's stdout and stderr to the caller, so the CLI's texts are told
//! from guest output only where they cannot be the guest's:
//!
//! | exit | what the streams show | meaning | result |
//! |---|---|---|---|
//! | 0 | stdout is exactly the `vm` group help (undetected capabilities only) | the release has no `vm exec` | `Unsupported` |
//! | ≠ 0 | stderr is exactly `unknown flag` / `unknown shorthand flag` (undetected only) | the release lacks a flag | `Unsupported` |
//! | 1 | the last stderr line starts with `Error: exec: ` | cocoon itself failed (no agent, dial, vsock, VM not running); the guest command never ran or its result never came back | a runtime error (`VmNotFound` or `Other`, by §3.4 phrase), never `ExitCode(1)` |
//! | n ≠ 0 | anything else | the guest command exited n (v0.5.x silences its own `exit code n` line) | `ExitCode(n)` |
//!
//! The third row is the one ambiguity left: a guest command that itself ends its stderr with
//! `Error: exec: …` and exits 1 is reported as a runtime failure. cocoon prints that prefix for
//! every failure of its own `exec` handler (`fmt.Errorf("exec: …")` through cobra's `Error: `),
//! and the kubelet API then answers with a failure status instead of exit code 1.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use super::super::args;
use super::super::error::{RuntimeError, classify, says_unknown_flag, strip_ansi};
use super::super::types::ByteWriter;

/// Last bytes of stderr kept to find the CLI's own `Error: exec: ` line.
pub(super) const EXEC_TAIL: usize = 4 << 10;

/// The prefix of every failure of cocoon's own `vm exec` handler, as cobra prints it.
pub const CLI_EXEC_FAILURE: &str = "Error: exec: ";

/// What [`pump`] saw of a pipe: its first bytes (up to the peek size), its last bytes (up to
/// [`EXEC_TAIL`]) and its length.
#[derive(Debug, Default)]
pub(super) struct Peeked {
    pub(super) head: Vec<u8>,
    pub(super) tail: Vec<u8>,
    pub(super) total: usize,
}

impl Peeked {
    /// The whole output, if it fit in the peek.
    pub(super) fn whole(&self) -> Option<&[u8]> {
        (self.total == self.head.len()).then_some(self.head.as_slice())
    }

    /// Records a chunk: the head up to `peek` bytes, the tail up to [`EXEC_TAIL`].
    pub(super) fn see(&mut self, chunk: &[u8], peek: usize) {
        let keep = peek.saturating_sub(self.head.len()).min(chunk.len());
        self.head.extend_from_slice(&chunk[..keep]);
        self.total += chunk.len();
        self.tail.extend_from_slice(chunk);
        if self.tail.len() > EXEC_TAIL {
            let cut = self.tail.len() - EXEC_TAIL;
            self.tail.drain(..cut);
        }
    }

    /// The last non-empty line of the output (ANSI escapes stripped, trimmed), if the kept
    /// tail holds one whole.
    pub(super) fn last_line(&self) -> Option<String> {
        let text = strip_ansi(&String::from_utf8_lossy(&self.tail));
        let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
        let last = lines.next_back()?.to_owned();
        // A line cut at the start of the tail is not a whole line.
        let whole = self.total == self.tail.len() || lines.next().is_some();
        whole.then_some(last)
    }
}

/// Copies a child pipe into the caller's writer (or discards it), keeping its first `peek`
/// bytes and its last [`EXEC_TAIL`] bytes.
pub(super) async fn pump(
    pipe: Option<impl AsyncRead + Unpin>,
    mut sink: Option<ByteWriter>,
    peek: usize,
) -> std::io::Result<Peeked> {
    let mut seen = Peeked::default();
    let Some(mut pipe) = pipe else {
        return Ok(seen);
    };
    let mut buf = vec![0u8; 32 << 10];
    loop {
        let n = pipe.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        let chunk = &buf[..n];
        seen.see(chunk, peek);
        if let Some(w) = sink.as_mut() {
            w.write_all(chunk).await?;
        }
    }
    if let Some(w) = sink.as_mut() {
        w.flush().await?;
    }
    Ok(seen)
}

/// For an `exec` whose capabilities were not detected: the CLI's own refusal, told from guest
/// output by its texts. Exit 0 with nothing but the group help on stdout is a missing verb;
/// a failure whose stderr is the flag parser's `unknown flag` is a missing flag.
pub(super) fn exec_cli_refusal(
    label: &str,
    code: Option<i32>,
    out: &Peeked,
    err: &Peeked,
) -> Option<RuntimeError> {
    match code {
        Some(0) => out
            .whole()
            .filter(|o| args::is_group_help(&String::from_utf8_lossy(o)))
            .map(|_| {
                RuntimeError::Unsupported(format!(
                    "{label}: the installed cocoon CLI has no vm exec"
                ))
            }),
        Some(_) => err
            .whole()
            .map(|e| strip_ansi(&String::from_utf8_lossy(e)).trim().to_owned())
            .filter(|e| says_unknown_flag(e))
            .map(|e| {
                RuntimeError::Unsupported(format!(
                    "{label}: the installed cocoon CLI refused the invocation: {e}"
                ))
            }),
        None => None,
    }
}

/// cocoon's own `exec` failure (the third row of the module table): exit status 1 and a last
/// stderr line starting with [`CLI_EXEC_FAILURE`]. The error is classified by its §3.4
/// phrases (`VM not found` → `VmNotFound`), otherwise `Other`; never `ExitCode`.
pub(super) fn exec_cli_failure(
    label: &str,
    code: Option<i32>,
    err: &Peeked,
) -> Option<RuntimeError> {
    if code != Some(1) {
        return None;
    }
    let line = err.last_line()?;
    line.starts_with(CLI_EXEC_FAILURE).then(|| {
        match classify(format!(
            "{label}: cocoon failed before the guest command's exit was known: {line}"
        )) {
            // A phrase the classifier maps to a guest exit cannot come from here.
            RuntimeError::ExitCode { message, .. } => RuntimeError::Other(message),
            e => e,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peeked(b: &[u8]) -> Peeked {
        let mut p = Peeked::default();
        p.see(b, 16 << 10);
        p
    }

    #[test]
    fn undetected_exec_tells_cli_refusals_from_guest_output() {
        let help = peeked(b"Manage virtual machines\n\nUsage:\n  cocoon vm [command]\n\nAvailable Commands:\n  clone  x\n");
        let none = peeked(b"");
        let flag = peeked(b"Error: unknown shorthand flag: 'i' in -i\n");
        let guest = peeked(b"sh: 1: nope: not found\n");
        let cut = Peeked {
            head: help.head.clone(),
            tail: help.tail.clone(),
            total: help.total + 1,
        };
        let cases: &[(Option<i32>, &Peeked, &Peeked, bool)] = &[
            (Some(0), &help, &none, true),
            (Some(0), &cut, &none, false),
            (Some(0), &guest, &none, false),
            (Some(1), &none, &flag, true),
            (Some(1), &none, &guest, false),
            (Some(3), &help, &none, false),
            (None, &none, &flag, false),
        ];
        for (code, out, err, want) in cases {
            let got = exec_cli_refusal("cocoon vm exec x", *code, out, err);
            assert_eq!(
                matches!(got, Some(RuntimeError::Unsupported(_))),
                *want,
                "{code:?} {out:?} {err:?}"
            );
        }
    }

    /// The exit, the stderr, and the class: `None` = the guest's own exit (`ExitCode`).
    #[test]
    fn cli_exec_failures_are_runtime_errors_not_guest_exits() {
        #[derive(Debug, PartialEq)]
        enum Class {
            Guest,
            VmNotFound,
            Other,
        }
        let dial = b"Error: exec: dial agent: dial unix /run/x/vsock.sock: connect: no such file or directory (cocoon-agent may still be starting; retry shortly)\n";
        let cases: &[(Option<i32>, &[u8], Class)] = &[
            // cocoon's own failures (v0.5.x `vm exec`): exit 1, `Error: exec: …` last.
            (Some(1), dial, Class::Other),
            (
                Some(1),
                b"Error: exec: vsock not configured for this VM (recreate the VM to enable agent exec)\n",
                Class::Other,
            ),
            (Some(1), b"Error: exec: vm x: VM not found\n", Class::VmNotFound),
            // Guest output before cocoon's line does not hide it.
            (Some(1), b"partial guest line\nError: exec: agent: connection reset\n", Class::Other),
            // ANSI colour and trailing blank lines are ignored.
            (Some(1), b"\x1b[31mError: exec: agent gone\x1b[0m\n\n", Class::Other),
            // The guest's own exits.
            (Some(1), b"", Class::Guest),
            (Some(1), b"sh: nope: not found\n", Class::Guest),
            (Some(1), b"Error: exec: x\nthen the guest wrote more\n", Class::Guest),
            (Some(1), b"Error: something else\n", Class::Guest),
            // Only exit status 1 is cocoon's own failure status.
            (Some(2), dial, Class::Guest),
            (Some(0), dial, Class::Guest),
            (None, dial, Class::Guest),
        ];
        for (code, err, want) in cases {
            let got = match exec_cli_failure("cocoon vm exec x", *code, &peeked(err)) {
                None => Class::Guest,
                Some(RuntimeError::VmNotFound(_)) => Class::VmNotFound,
                Some(RuntimeError::ExitCode { .. }) => panic!("never an exit code"),
                Some(_) => Class::Other,
            };
            assert_eq!(&got, want, "{code:?} {:?}", String::from_utf8_lossy(err));
        }
    }

    #[test]
    fn the_tail_is_bounded_and_a_cut_line_is_not_read() {
        let mut p = Peeked::default();
        p.see(&vec![b'x'; 3 * EXEC_TAIL], 16);
        assert_eq!(p.tail.len(), EXEC_TAIL);
        assert_eq!(p.head.len(), 16);
        assert_eq!(p.last_line(), None, "a line cut at the tail's start");
        p.see(b"\nError: exec: late\n", 16);
        assert_eq!(p.last_line().as_deref(), Some("Error: exec: late"));
        assert_eq!(p.total, 3 * EXEC_TAIL + 19);
    }
}
