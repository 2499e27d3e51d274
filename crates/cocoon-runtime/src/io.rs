//! Streaming handles of the runtime (import sinks, export streams, their completion futures)
//! and a shareable in-memory writer for capturing `exec` output.
//!
//! Protocol of both handles: finish (or drop) the stream side first, then await `done`. The
//! real backend's child only exits after its pipe closes, so awaiting `done` with the stream
//! still open would wait forever.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::error::{Result, RuntimeError};
use super::types::{ByteReader, ByteWriter};

/// Resolves when the producing/consuming side has finished; carries its error.
pub type Completion = Pin<Box<dyn Future<Output = Result<()>> + Send>>;

/// Tells an import to stop without registering anything (the real backend kills its child).
pub type AbortFn = Box<dyn FnOnce() + Send>;

/// A writable sink (snapshot tar, image bytes) plus its completion.
pub struct ImportHandle {
    /// Write the bytes here, then `shutdown()` or drop it.
    pub sink: ByteWriter,
    /// Resolves once the import is registered (or failed). Dropping it before it resolves
    /// kills the real backend's child.
    pub done: Completion,
    /// Stops the import so that it registers nothing, even if the bytes written so far form a
    /// complete stream; `done` then resolves (with an error) once the importer is gone.
    pub abort: AbortFn,
}

impl ImportHandle {
    /// Kills the import and waits until the importer is gone: used when the bytes fed to it
    /// turned out to be bad (a digest mismatch), so nothing of them may be registered.
    pub async fn kill(self) -> Result<()> {
        let ImportHandle { sink, done, abort } = self;
        abort();
        drop(sink);
        done.await
    }

    /// Copies `reader` into the sink, closes it and waits for completion. A failure of the
    /// copy (e.g. the consumer died) still waits for completion so its error wins: it explains
    /// why the pipe broke.
    pub async fn feed(self, mut reader: impl AsyncRead + Unpin) -> Result<u64> {
        let ImportHandle { mut sink, done, .. } = self;
        let copied = async {
            let n = tokio::io::copy(&mut reader, &mut sink).await?;
            sink.shutdown().await?;
            Ok::<u64, io::Error>(n)
        }
        .await;
        drop(sink);
        let finished = done.await;
        match (copied, finished) {
            (Ok(n), Ok(())) => Ok(n),
            (_, Err(e)) => Err(e),
            (Err(e), Ok(())) => Err(RuntimeError::Other(format!("write import stream: {e}"))),
        }
    }

    /// [`feed`](Self::feed) from memory.
    pub async fn write_all(self, data: &[u8]) -> Result<()> {
        self.feed(data).await.map(|_| ())
    }
}

/// A readable stream (snapshot tar) plus its completion.
pub struct ExportHandle {
    /// Read the bytes from here, then drop it.
    pub stream: ByteReader,
    /// Resolves once the producer exited; an error means the stream is not trustworthy even
    /// if it ended cleanly.
    pub done: Completion,
}

impl ExportHandle {
    /// Reads the whole stream into memory, closes it and waits for completion.
    pub async fn read_to_end(self) -> Result<Vec<u8>> {
        let ExportHandle { mut stream, done } = self;
        let mut buf = Vec::new();
        let read = stream.read_to_end(&mut buf).await;
        drop(stream);
        done.await?;
        read.map_err(|e| RuntimeError::Other(format!("read export stream: {e}")))?;
        Ok(buf)
    }
}

/// A cloneable in-memory writer: hand one clone to `exec` as stdout/stderr, read the other.
#[derive(Debug, Clone, Default)]
pub struct CaptureBuf(Arc<Mutex<Vec<u8>>>);

impl CaptureBuf {
    /// An empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of everything written so far.
    pub fn contents(&self) -> Vec<u8> {
        self.0.lock().map(|b| b.clone()).unwrap_or_default()
    }

    /// [`contents`](Self::contents) as lossy UTF-8.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.contents()).into_owned()
    }

    /// A boxed writer for [`ExecRequest`](super::types::ExecRequest) fields.
    pub fn writer(&self) -> ByteWriter {
        Box::pin(self.clone())
    }
}

impl AsyncWrite for CaptureBuf {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.0.lock() {
            Ok(mut b) => {
                b.extend_from_slice(buf);
                Poll::Ready(Ok(buf.len()))
            }
            Err(_) => Poll::Ready(Err(io::Error::other("capture buffer poisoned"))),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn capture_buf_collects_writes_from_any_clone() {
        let buf = CaptureBuf::new();
        let mut w = buf.writer();
        w.write_all(b"hello ").await.expect("write");
        w.write_all(b"world").await.expect("write");
        assert_eq!(buf.text(), "hello world");
    }

    #[tokio::test]
    async fn import_handle_reports_completion_error_over_copy_error() {
        let (w, r) = tokio::io::duplex(8);
        // The consumer runs on its own (like the CLI child): it reads 4 bytes and fails, so
        // the copy then sees a broken pipe.
        let consumer = tokio::spawn(async move {
            let mut r = r;
            let mut b = [0u8; 4];
            r.read_exact(&mut b)
                .await
                .map_err(|e| RuntimeError::Other(e.to_string()))?;
            Err::<(), _>(RuntimeError::Other("bad tar header".into()))
        });
        let done: Completion = Box::pin(async move {
            consumer
                .await
                .map_err(|e| RuntimeError::Other(e.to_string()))?
        });
        let h = ImportHandle {
            sink: Box::pin(w),
            done,
            abort: Box::new(|| {}),
        };
        let err = h.write_all(&[0u8; 1 << 16]).await.expect_err("fails");
        assert_eq!(err.to_string(), "bad tar header");
    }

    #[tokio::test]
    async fn export_handle_reads_all_then_completes() {
        let h = ExportHandle {
            stream: Box::pin(&b"tar bytes"[..]),
            done: Box::pin(async { Ok(()) }),
        };
        assert_eq!(h.read_to_end().await.expect("read"), b"tar bytes");
        let h = ExportHandle {
            stream: Box::pin(&b"partial"[..]),
            done: Box::pin(async { Err(RuntimeError::Other("exit status 1".into())) }),
        };
        assert!(h.read_to_end().await.is_err());
    }
}
