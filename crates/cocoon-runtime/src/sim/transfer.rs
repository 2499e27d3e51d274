//! Transfer plumbing shared by imports and exports: pacing, abort on drop.

use std::io::{self, Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::io_err;
use crate::error::Result;
use crate::io::ImportHandle;

/// A Read/Write adapter that paces bytes to a rate and can be aborted (import/export).
pub(super) struct Throttle<T> {
    inner: T,
    rate: u64,
    owed: Duration,
    abort: Option<Arc<AtomicBool>>,
}

impl<T> Throttle<T> {
    pub(super) fn new(inner: T, rate: u64, abort: Option<Arc<AtomicBool>>) -> Self {
        Throttle {
            inner,
            rate,
            owed: Duration::ZERO,
            abort,
        }
    }

    fn check(&self) -> io::Result<()> {
        match &self.abort {
            Some(a) if a.load(Ordering::SeqCst) => {
                // Not `Interrupted`: std's write_all/read_exact retry that kind forever.
                Err(io::Error::new(io::ErrorKind::ConnectionAborted, "aborted"))
            }
            _ => Ok(()),
        }
    }

    /// Sleeps off the time `n` bytes take at the rate, in slices of at least 2 ms (shorter
    /// sleeps would cost more than they pace).
    fn pace(&mut self, n: usize) {
        if self.rate == 0 || n == 0 {
            return;
        }
        self.owed += Duration::from_secs_f64(n as f64 / self.rate as f64);
        if self.owed >= Duration::from_millis(2) {
            std::thread::sleep(self.owed);
            self.owed = Duration::ZERO;
        }
    }
}

impl<T: Write> Write for Throttle<T> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.check()?;
        let n = self.inner.write(buf)?;
        self.pace(n);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<T: Read> Read for Throttle<T> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.check()?;
        let n = self.inner.read(buf)?;
        self.pace(n);
        Ok(n)
    }
}

/// Sets the abort flag when the completion future is dropped before it finished.
/// The handle of a simulated import. Its completion is created outside the future, so that
/// dropping it unpolled aborts the transfer too, as dropping the CLI's completion kills its child.
pub(super) fn import_handle(
    sink: tokio::io::DuplexStream,
    task: tokio::task::JoinHandle<Result<()>>,
    aborted: Arc<AtomicBool>,
    label: String,
) -> ImportHandle {
    let signal = aborted.clone();
    let guard = AbortOnDrop(Some(aborted));
    let done = async move {
        let mut guard = guard;
        let res = task.await.map_err(|e| io_err(&label, e));
        guard.0 = None;
        res?
    };
    ImportHandle {
        sink: Box::pin(sink),
        done: Box::pin(done),
        abort: Box::new(move || signal.store(true, Ordering::SeqCst)),
    }
}

pub(super) struct AbortOnDrop(pub(super) Option<Arc<AtomicBool>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(a) = self.0.take() {
            a.store(true, Ordering::SeqCst);
        }
    }
}
