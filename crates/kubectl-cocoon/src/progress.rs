//! Wait progress on stderr. On a terminal: one indicatif spinner per target with its live
//! elapsed time and state, truncated to the terminal width (a long message never wraps and so
//! never leaves a half-erased line behind), with warnings and results printed above the
//! spinners. Elsewhere (CI logs, pipes): plain `<target> %7.3fs <message>` lines, one per
//! change, so a log keeps every step.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::wait::Progress as Dedupe;

/// The progress display of one command.
pub struct Progress {
    multi: Option<MultiProgress>,
    started: Instant,
}

impl Progress {
    /// Spinners when stderr is a terminal, plain lines otherwise.
    pub fn new() -> Progress {
        Progress::with_tty(std::io::stderr().is_terminal())
    }

    pub fn with_tty(tty: bool) -> Progress {
        Progress {
            multi: tty.then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr())),
            started: Instant::now(),
        }
    }

    /// A line for one target, labelled `prefix` (`cocoonset/demo`).
    pub fn line(&self, prefix: String) -> Line {
        let bar = self.multi.as_ref().map(|m| {
            let style = ProgressStyle::with_template("{spinner} {prefix} {elapsed:>4} {wide_msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner());
            let bar = m.add(ProgressBar::new_spinner().with_style(style));
            bar.set_prefix(prefix.clone());
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        Line {
            bar,
            multi: self.multi.clone(),
            prefix,
            started: self.started,
            dedupe: Mutex::new(Dedupe::default()),
        }
    }

    /// Prints a line that stays (above the spinners on a terminal).
    pub fn println(&self, text: &str) {
        match &self.multi {
            Some(m) => m.suspend(|| eprintln!("{text}")),
            None => {
                let mut err = std::io::stderr();
                let _ = writeln!(err, "{text}");
                let _ = err.flush();
            }
        }
    }

    /// Removes every spinner (before an interruption note).
    pub fn clear(&self) {
        if let Some(m) = &self.multi {
            let _ = m.clear();
        }
    }
}

impl Default for Progress {
    fn default() -> Self {
        Progress::new()
    }
}

/// The progress of one target.
pub struct Line {
    bar: Option<ProgressBar>,
    multi: Option<MultiProgress>,
    prefix: String,
    started: Instant,
    dedupe: Mutex<Dedupe>,
}

impl Line {
    fn plain(&self, msg: &str) {
        let line = self
            .dedupe
            .lock()
            .ok()
            .and_then(|mut d| d.line(self.started.elapsed(), msg));
        if let Some(line) = line {
            let mut err = std::io::stderr();
            let _ = writeln!(err, "{} {line}", self.prefix);
            let _ = err.flush();
        }
    }

    /// The target's current state changed (repeats are dropped).
    pub fn say(&self, msg: &str) {
        match &self.bar {
            Some(bar) => bar.set_message(msg.to_string()),
            None => self.plain(msg),
        }
    }

    /// A Warning Event arrived: always its own line, which stays.
    pub fn warn(&self, text: &str) {
        self.stay(&format!("Warning {text}"));
    }

    /// A fact worth keeping (how much a snapshot transfer moved): its own line, which stays.
    pub fn note(&self, text: &str) {
        self.stay(text);
    }

    fn stay(&self, text: &str) {
        let line = format!(
            "{} {:7.3}s {text}",
            self.prefix,
            self.started.elapsed().as_secs_f64()
        );
        match &self.multi {
            // Above the spinners, whole (a line printed once may wrap like any log line).
            Some(m) => m.suspend(|| eprintln!("{line}")),
            None => {
                let mut err = std::io::stderr();
                let _ = writeln!(err, "{line}");
                let _ = err.flush();
            }
        }
    }

    /// The wait ended: the spinner goes and a final line stays (plain output prints it if
    /// new).
    pub fn finish(&self, msg: &str) {
        match (&self.bar, &self.multi) {
            (Some(bar), Some(m)) => {
                let line = format!(
                    "{} {:7.3}s {msg}",
                    self.prefix,
                    self.started.elapsed().as_secs_f64()
                );
                bar.finish_and_clear();
                m.remove(bar);
                m.suspend(|| eprintln!("{line}"));
            }
            _ => self.plain(msg),
        }
    }
}
