//! `/exec/{ns}/{pod}/{container}`: the kubelet side of the remote-command streaming protocol
//! (`node.md` §13), over SPDY/3.1.
//!
//! When `kubectl exec` goes through kube-apiserver (v1.36), the API server accepts the
//! client's WebSocket (`v5.channel.k8s.io`) or SPDY request and talks **SPDY/3.1** to the
//! kubelet: it translates WebSocket to SPDY itself unless the Node declares the
//! `ExtendWebSocketsToKubelet` feature, which this agent does not. So SPDY is the one wire
//! protocol a kubelet must serve for exec.
//!
//! The exchange:
//! 1. `POST` (or `GET`) with `Connection: Upgrade`, `Upgrade: SPDY/3.1` and the offered
//!    `X-Stream-Protocol-Version`s; the query carries `command` (repeated), `input`,
//!    `output`, `error`, `tty` (`1`/`true`; `stdin`/`stdout`/`stderr` are accepted as well). We pick the first offered protocol we speak
//!    ([`PROTOCOLS`]) and answer `101 Switching Protocols` naming it.
//! 2. The client opens the streams (`streamtype` header): `error` always, then `stdin`,
//!    `stdout`, `stderr` as requested (`stderr` never with a TTY), `resize` with a TTY (v3+).
//!    Each gets a `SYN_REPLY` (streams past the five of one exec get `RST_STREAM`
//!    `REFUSED_STREAM`). They must all exist within [`STREAM_CREATION_TIMEOUT`].
//! 3. The command runs through [`PodBackend::exec`]; stdin `DATA` feeds the guest, guest
//!    output goes out as `DATA` on `stdout`/`stderr`, each ended with FIN when the guest side
//!    closes.
//! 4. The outcome goes on the `error` stream, then FIN: with v4, a JSON `metav1.Status`
//!    (`Success`; `Failure` with reason `NonZeroExitCode` and an `ExitCode` cause carrying the
//!    code; or `Failure` with the error message, e.g. `... no live VM`). With v2/v3, the error
//!    text only, and nothing on success. The client's pings are echoed throughout.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use super::limits::{Slots, refusal_message};
use super::spdy::{self, Decoder, Encoder, Frame};
use super::{ExecError, ExecIo, PodBackend};

/// `v4.channel.k8s.io`: JSON status on the error stream (exit codes survive).
pub const PROTOCOL_V4: &str = "v4.channel.k8s.io";
/// `v3.channel.k8s.io`: adds the resize stream; error stream is text.
pub const PROTOCOL_V3: &str = "v3.channel.k8s.io";
/// `v2.channel.k8s.io`: one SPDY stream per channel; error stream is text.
pub const PROTOCOL_V2: &str = "v2.channel.k8s.io";
/// The protocols served, in preference order (the client's order decides among them).
pub const PROTOCOLS: [&str; 3] = [PROTOCOL_V4, PROTOCOL_V3, PROTOCOL_V2];
/// Request header with the offered protocols; response header with the chosen one.
pub const HEADER_PROTOCOL_VERSION: &str = "X-Stream-Protocol-Version";
/// Response header listing the served protocols when negotiation fails.
pub const HEADER_ACCEPTED_PROTOCOL_VERSIONS: &str = "X-Accepted-Stream-Protocol-Versions";
/// How long the client gets to open every expected stream.
pub const STREAM_CREATION_TIMEOUT: Duration = Duration::from_secs(30);
/// After the status is written, how long the client gets to close the connection itself.
const PEER_CLOSE_GRACE: Duration = Duration::from_secs(5);
/// Capacity of the outgoing frame queue.
const FRAME_QUEUE: usize = 64;
/// Buffered stdin frames before the reader waits for the guest to consume them.
const STDIN_QUEUE: usize = 16;
/// Streams one session accepts: one exec opens at most `error`, `stdin`, `stdout`, `stderr`
/// and `resize`. Further `SYN_STREAM`s are refused (`RST_STREAM` `REFUSED_STREAM`), so a
/// client cannot make the session remember streams without end.
const MAX_STREAMS: usize = 5;
/// Pipe size between the guest's output and its SPDY stream.
const OUTPUT_PIPE: usize = 64 * 1024;

/// Query options of an exec request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecOptions {
    pub command: Vec<String>,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

impl ExecOptions {
    /// Parses the kubelet exec query (`command` repeated; booleans as `1` or `true`).
    pub fn from_query(query: &str) -> Self {
        let mut o = ExecOptions::default();
        let flag = |v: &str| v == "1" || v.eq_ignore_ascii_case("true");
        for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
            match k.as_ref() {
                "command" => o.command.push(v.into_owned()),
                // The API server's names (`input`, `output`, `error`); the pod subresource's
                // names are accepted too.
                "input" | "stdin" => o.stdin = flag(&v),
                "output" | "stdout" => o.stdout = flag(&v),
                "error" | "stderr" => o.stderr = flag(&v),
                "tty" => o.tty = flag(&v),
                _ => {}
            }
        }
        // A TTY merges stderr into stdout; no stderr stream is opened.
        if o.tty {
            o.stderr = false;
        }
        o
    }

    /// The stream types the client must open, `error` first.
    fn expected_streams(&self, protocol: &str) -> Vec<&'static str> {
        let mut v = vec![STREAM_ERROR];
        if self.stdin {
            v.push(STREAM_STDIN);
        }
        if self.stdout {
            v.push(STREAM_STDOUT);
        }
        if self.stderr {
            v.push(STREAM_STDERR);
        }
        if self.tty && protocol != PROTOCOL_V2 {
            v.push(STREAM_RESIZE);
        }
        v
    }
}

const STREAM_ERROR: &str = "error";
const STREAM_STDIN: &str = "stdin";
const STREAM_STDOUT: &str = "stdout";
const STREAM_STDERR: &str = "stderr";
const STREAM_RESIZE: &str = "resize";

fn text(status: StatusCode, msg: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        msg,
    )
        .into_response()
}

/// Why an exec request cannot be upgraded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpgradeError {
    #[error("unable to upgrade: header {HEADER_PROTOCOL_VERSION} names no protocol")]
    NoProtocolOffered,
    #[error(
        "unable to upgrade: unable to negotiate protocol: client supports {offered:?}, server accepts {PROTOCOLS:?}"
    )]
    NoCommonProtocol { offered: Vec<String> },
}

impl IntoResponse for UpgradeError {
    fn into_response(self) -> Response {
        match self {
            UpgradeError::NoProtocolOffered => text(StatusCode::BAD_REQUEST, self.to_string()),
            UpgradeError::NoCommonProtocol { .. } => {
                let mut resp = text(StatusCode::FORBIDDEN, self.to_string());
                for p in PROTOCOLS {
                    resp.headers_mut().append(
                        HEADER_ACCEPTED_PROTOCOL_VERSIONS,
                        header::HeaderValue::from_static(p),
                    );
                }
                resp
            }
        }
    }
}

/// Picks the first protocol the client offers that is served.
pub fn negotiate(headers: &HeaderMap) -> Result<&'static str, UpgradeError> {
    let offered: Vec<String> = headers
        .get_all(HEADER_PROTOCOL_VERSION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_owned())
        .filter(|p| !p.is_empty())
        .collect();
    if offered.is_empty() {
        return Err(UpgradeError::NoProtocolOffered);
    }
    offered
        .iter()
        .find_map(|o| PROTOCOLS.iter().find(|p| **p == o.as_str()).copied())
        .ok_or(UpgradeError::NoCommonProtocol { offered })
}

fn is_spdy_upgrade(headers: &HeaderMap) -> bool {
    let has = |name: header::HeaderName, token: &str| {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.to_ascii_lowercase().contains(token))
    };
    has(header::CONNECTION, "upgrade") && has(header::UPGRADE, "spdy/3.1")
}

/// What a session needs besides the connection.
pub(super) struct Target {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

/// Handles an exec request: validates, negotiates, answers 101 and runs the session on the
/// upgraded connection in a task of `sessions`.
pub(super) fn handle(
    backend: Arc<dyn PodBackend>,
    sessions: &TaskTracker,
    cancel: &CancellationToken,
    slots: &Slots,
    idle: Duration,
    target: Target,
    mut req: Request,
) -> Response {
    let opts = ExecOptions::from_query(req.uri().query().unwrap_or(""));
    if opts.command.is_empty() {
        return text(
            StatusCode::BAD_REQUEST,
            "you must specify at least one command".into(),
        );
    }
    if !(opts.stdin || opts.stdout || opts.stderr) {
        return text(
            StatusCode::BAD_REQUEST,
            "you must specify at least 1 of stdin, stdout, stderr".into(),
        );
    }
    if !is_spdy_upgrade(req.headers()) {
        return text(
            StatusCode::BAD_REQUEST,
            "unable to upgrade: missing upgrade headers in request (want Connection: Upgrade, Upgrade: SPDY/3.1)".into(),
        );
    }
    let protocol = match negotiate(req.headers()) {
        Ok(p) => p,
        Err(e) => {
            debug!(error = %e, "exec: protocol negotiation failed");
            return e.into_response();
        }
    };
    // The session's slot is taken before the upgrade: beyond the limit the client gets a
    // plain HTTP refusal it can show.
    let who = format!("{}/{}", target.namespace, target.pod);
    let slot = match slots.try_acquire(&who) {
        Ok(slot) => slot,
        Err(refusal) => {
            let msg = refusal_message("exec sessions", &who, &refusal);
            info!("{msg}");
            return text(StatusCode::TOO_MANY_REQUESTS, msg);
        }
    };
    let Some(on_upgrade) = req.extensions_mut().remove::<hyper::upgrade::OnUpgrade>() else {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "unable to upgrade: the connection does not support upgrades".into(),
        );
    };
    let cancel = cancel.clone();
    let open = backend.stream_opened(&target.namespace, &target.pod);
    sessions.spawn(async move {
        let _slot = (slot, open);
        match on_upgrade.await {
            Ok(upgraded) => {
                session(
                    TokioIo::new(upgraded),
                    protocol,
                    opts,
                    target,
                    backend,
                    cancel,
                    idle,
                )
                .await;
            }
            Err(e) => warn!(error = %e, "exec: connection upgrade failed"),
        }
    });
    let mut resp = Response::new(Body::empty());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(
        header::CONNECTION,
        header::HeaderValue::from_static("Upgrade"),
    );
    h.insert(
        header::UPGRADE,
        header::HeaderValue::from_static(spdy::UPGRADE_TOKEN),
    );
    h.insert(
        HEADER_PROTOCOL_VERSION,
        header::HeaderValue::from_static(protocol),
    );
    resp
}

/// Something the frame reader tells the session.
#[derive(Debug)]
struct NewStream {
    id: u32,
    kind: String,
}

/// Runs one exec over an established SPDY connection.
pub(super) async fn session<IO>(
    io: IO,
    protocol: &'static str,
    opts: ExecOptions,
    target: Target,
    backend: Arc<dyn PodBackend>,
    cancel: CancellationToken,
    idle: Duration,
) where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let activity = Activity::new();
    let (rd, wr) = tokio::io::split(io);
    let (frames, frames_rx) = mpsc::channel::<Frame>(FRAME_QUEUE);
    let writer = tokio::spawn(write_frames(wr, frames_rx));
    let (stdin_tx, stdin_rx) = mpsc::channel::<Vec<u8>>(STDIN_QUEUE);
    // Never full: the reader hands over at most MAX_STREAMS streams.
    let (streams_tx, mut streams_rx) = mpsc::channel::<NewStream>(MAX_STREAMS);
    let gone = CancellationToken::new();
    let reader = tokio::spawn(read_frames(
        rd,
        frames.clone(),
        streams_tx,
        stdin_tx,
        gone.clone(),
        activity.clone(),
    ));
    let Target {
        namespace,
        pod,
        container,
    } = target;

    // Wait until the client opened every stream it must open.
    let expected = opts.expected_streams(protocol);
    let mut ids: HashMap<&'static str, u32> = HashMap::new();
    let deadline = tokio::time::sleep(STREAM_CREATION_TIMEOUT);
    tokio::pin!(deadline);
    while ids.len() < expected.len() {
        tokio::select! {
            s = streams_rx.recv() => match s {
                Some(s) => {
                    if let Some(kind) = expected.iter().find(|k| **k == s.kind) {
                        ids.insert(kind, s.id);
                    } else {
                        debug!(kind = %s.kind, "exec: ignoring an unexpected stream");
                    }
                }
                None => {
                    debug!(namespace = %namespace, pod = %pod, "exec: client left before opening its streams");
                    finish(reader, writer, frames).await;
                    return;
                }
            },
            () = &mut deadline => {
                warn!(namespace = %namespace, pod = %pod, "exec: timed out waiting for the client's streams");
                finish(reader, writer, frames).await;
                return;
            }
            () = cancel.cancelled() => {
                finish(reader, writer, frames).await;
                return;
            }
        }
    }

    // Wire the guest's standard streams to the SPDY streams.
    let mut pumps = Vec::new();
    let mut output = |kind: &str| {
        ids.get(kind).map(|id| {
            let (guest_side, our_side) = tokio::io::duplex(OUTPUT_PIPE);
            pumps.push(tokio::spawn(pump_output(
                our_side,
                frames.clone(),
                *id,
                activity.clone(),
            )));
            Box::pin(guest_side) as cocoon_runtime::ByteWriter
        })
    };
    let stdout = output(STREAM_STDOUT);
    let stderr = output(STREAM_STDERR);
    let stdin = ids.contains_key(STREAM_STDIN).then(|| {
        Box::pin(ChannelReader {
            rx: stdin_rx,
            buf: Vec::new(),
            pos: 0,
        }) as cocoon_runtime::ByteReader
    });
    let io = ExecIo {
        command: opts.command.clone(),
        tty: opts.tty,
        stdin,
        stdout,
        stderr,
    };
    info!(namespace = %namespace, pod = %pod, command = ?opts.command, protocol, "exec started");
    activity.touch();
    let result = tokio::select! {
        r = backend.exec(&namespace, &pod, &container, io) => Some(r),
        () = gone.cancelled() => None,
        () = cancel.cancelled() => Some(Err(ExecError::Failed("vk-cocoon: kubelet API shutting down".into()))),
        () = activity.idle_for(idle) => {
            info!(namespace = %namespace, pod = %pod, idle = ?idle, "exec: no data in either direction for the streaming idle timeout; closing");
            Some(Err(ExecError::Failed(format!(
                "vk-cocoon: exec stream idle for longer than {idle:?} (VK_STREAMING_CONNECTION_IDLE_TIMEOUT); closed"
            ))))
        }
    };
    let Some(result) = result else {
        info!(namespace = %namespace, pod = %pod, "exec: client disconnected, command cancelled");
        finish(reader, writer, frames).await;
        return;
    };
    // All guest output is out before the status.
    for p in pumps {
        let _ = p.await;
    }
    match &result {
        Ok(()) => info!(namespace = %namespace, pod = %pod, "exec finished"),
        Err(ExecError::ExitCode(code)) => {
            info!(namespace = %namespace, pod = %pod, exit_code = code, "exec finished with a non-zero exit");
        }
        Err(e @ ExecError::NoLiveVm { .. }) => {
            info!(namespace = %namespace, pod = %pod, error = %e, "exec refused");
        }
        Err(e) => warn!(namespace = %namespace, pod = %pod, error = %e, "exec failed"),
    }
    if let Some(id) = ids.get(STREAM_ERROR) {
        let data = status_message(protocol, &result);
        let _ = frames
            .send(Frame::Data {
                stream_id: *id,
                fin: true,
                data,
            })
            .await;
    }
    // Let the client read the status and close the connection itself; then close ours.
    let _ = tokio::time::timeout(PEER_CLOSE_GRACE, gone.cancelled()).await;
    finish(reader, writer, frames).await;
}

/// Stops the reader, then lets the writer drain and close the connection.
async fn finish(reader: JoinHandle<()>, writer: JoinHandle<()>, frames: mpsc::Sender<Frame>) {
    reader.abort();
    let _ = reader.await;
    drop(frames);
    let _ = writer.await;
}

/// The error-stream payload for `result` under `protocol`.
pub fn status_message(protocol: &str, result: &Result<(), ExecError>) -> Vec<u8> {
    if protocol != PROTOCOL_V4 {
        return match result {
            Ok(()) => Vec::new(),
            Err(e) => e.to_string().into_bytes(),
        };
    }
    let status = match result {
        Ok(()) => serde_json::json!({"metadata": {}, "status": "Success"}),
        Err(ExecError::ExitCode(code)) if (1..=255).contains(code) => serde_json::json!({
            "metadata": {},
            "status": "Failure",
            "message": result.as_ref().err().map(ToString::to_string),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
        }),
        Err(e) => serde_json::json!({
            "metadata": {},
            "status": "Failure",
            "message": e.to_string(),
            "reason": "InternalError",
            "details": {"causes": [{"message": e.to_string()}]},
            "code": 500,
        }),
    };
    status.to_string().into_bytes()
}

/// Serialises queued frames onto the connection; closes the write side when the queue ends.
async fn write_frames<W: AsyncWrite + Unpin>(mut wr: W, mut rx: mpsc::Receiver<Frame>) {
    let mut enc = match Encoder::new() {
        Ok(e) => e,
        Err(e) => {
            warn!(error = %e, "exec: header compression unavailable");
            return;
        }
    };
    while let Some(frame) = rx.recv().await {
        let bytes = match enc.encode(&frame) {
            Ok(b) => b,
            Err(e) => {
                warn!(error = %e, "exec: encoding a frame failed");
                return;
            }
        };
        if let Err(e) = wr.write_all(&bytes).await {
            debug!(error = %e, "exec: connection write failed");
            return;
        }
        if rx.is_empty()
            && let Err(e) = wr.flush().await
        {
            debug!(error = %e, "exec: connection flush failed");
            return;
        }
    }
    let _ = wr.shutdown().await;
}

/// Reads the client's frames: replies to new streams (refusing those past [`MAX_STREAMS`]),
/// feeds stdin, echoes pings. Cancels `gone` when the connection ends.
async fn read_frames<R: AsyncRead + Unpin>(
    mut rd: R,
    frames: mpsc::Sender<Frame>,
    streams: mpsc::Sender<NewStream>,
    stdin: mpsc::Sender<Vec<u8>>,
    gone: CancellationToken,
    activity: Activity,
) {
    let _gone = gone.drop_guard();
    let mut dec = Decoder::new();
    let mut stdin = Some(stdin);
    let mut stdin_id = None;
    let mut accepted = 0usize;
    loop {
        let frame = match dec.read_frame(&mut rd).await {
            Ok(Some(f)) => f,
            Ok(None) => return,
            Err(e) => {
                debug!(error = %e, "exec: connection read ended");
                return;
            }
        };
        match frame {
            Frame::SynStream {
                stream_id,
                headers,
                fin,
            } => {
                let kind = headers
                    .iter()
                    .find(|(k, _)| k == "streamtype")
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default();
                if accepted >= MAX_STREAMS {
                    debug!(stream_id, kind = %kind, "exec: refusing a stream past the per-session limit");
                    let refuse = Frame::RstStream {
                        stream_id,
                        status: spdy::RST_REFUSED_STREAM,
                    };
                    if frames.send(refuse).await.is_err() {
                        return;
                    }
                    continue;
                }
                accepted += 1;
                let reply = Frame::SynReply {
                    stream_id,
                    fin: false,
                    headers: Vec::new(),
                };
                if frames.send(reply).await.is_err() {
                    return;
                }
                if kind == STREAM_STDIN {
                    if fin {
                        stdin = None;
                    } else {
                        stdin_id = Some(stream_id);
                    }
                }
                // Never full: at most MAX_STREAMS are sent, its capacity.
                let _ = streams.try_send(NewStream {
                    id: stream_id,
                    kind,
                });
            }
            Frame::Data {
                stream_id,
                fin,
                data,
            } if Some(stream_id) == stdin_id => {
                if !data.is_empty() {
                    activity.touch();
                }
                if let Some(tx) = &stdin
                    && !data.is_empty()
                    && tx.send(data).await.is_err()
                {
                    // The guest stopped reading; drop the rest.
                    stdin = None;
                }
                if fin {
                    stdin = None;
                }
            }
            Frame::RstStream { stream_id, .. } if Some(stream_id) == stdin_id => stdin = None,
            Frame::Ping { id } => {
                // Echo: the API server pings every few seconds to keep proxies from idling
                // the connection out.
                let echoed = frames.send(Frame::Ping { id }).await;
                if echoed.is_err() {
                    return;
                }
            }
            Frame::GoAway { .. } => return,
            // Resize events, headers, settings and resets of output streams need no action.
            _ => {}
        }
    }
}

/// Moves one guest output stream into DATA frames, ending with FIN at the guest's EOF.
async fn pump_output(
    mut from: tokio::io::DuplexStream,
    frames: mpsc::Sender<Frame>,
    id: u32,
    activity: Activity,
) {
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                activity.touch();
                let frame = Frame::Data {
                    stream_id: id,
                    fin: false,
                    data: buf[..n].to_vec(),
                };
                if frames.send(frame).await.is_err() {
                    return;
                }
            }
        }
    }
    let _ = frames
        .send(Frame::Data {
            stream_id: id,
            fin: true,
            data: Vec::new(),
        })
        .await;
}

/// When a session last moved data (stdin in, stdout/stderr out); pings do not count, as with
/// the kubelet's idle timeout.
#[derive(Debug, Clone)]
struct Activity(Arc<std::sync::Mutex<tokio::time::Instant>>);

impl Activity {
    fn new() -> Self {
        Activity(Arc::new(std::sync::Mutex::new(tokio::time::Instant::now())))
    }

    fn last(&self) -> tokio::time::Instant {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn touch(&self) {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = tokio::time::Instant::now();
    }

    /// Resolves once no data moved for `idle` (never, for zero).
    async fn idle_for(&self, idle: Duration) {
        if idle.is_zero() {
            return std::future::pending().await;
        }
        loop {
            let deadline = self.last() + idle;
            if tokio::time::Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// The guest's stdin: bytes of the client's stdin stream; EOF at its FIN.
struct ChannelReader {
    rx: mpsc::Receiver<Vec<u8>>,
    buf: Vec<u8>,
    pos: usize,
}

impl AsyncRead for ChannelReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        loop {
            if self.pos < self.buf.len() {
                let n = out.remaining().min(self.buf.len() - self.pos);
                let start = self.pos;
                out.put_slice(&self.buf[start..start + n]);
                self.pos += n;
                return Poll::Ready(Ok(()));
            }
            match self.rx.poll_recv(cx) {
                Poll::Ready(Some(chunk)) => {
                    self.buf = chunk;
                    self.pos = 0;
                }
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_options() {
        let o = ExecOptions::from_query(
            "command=sh&command=-c&command=echo+a%20b&input=1&output=true&error=1&tty=0",
        );
        assert_eq!(o.command, ["sh", "-c", "echo a b"]);
        assert!(o.stdin && o.stdout && o.stderr && !o.tty);
        assert_eq!(
            o.expected_streams(PROTOCOL_V4),
            ["error", "stdin", "stdout", "stderr"]
        );
        let t = ExecOptions::from_query("command=sh&stdout=1&stderr=1&tty=1");
        assert!(!t.stderr, "no stderr stream with a TTY");
        assert_eq!(
            t.expected_streams(PROTOCOL_V4),
            ["error", "stdout", "resize"]
        );
        assert_eq!(t.expected_streams(PROTOCOL_V2), ["error", "stdout"]);
    }

    #[test]
    fn negotiation_follows_the_client_order() {
        let mut h = HeaderMap::new();
        h.append(
            HEADER_PROTOCOL_VERSION,
            "v5.channel.k8s.io".parse().expect("v"),
        );
        h.append(
            HEADER_PROTOCOL_VERSION,
            "v4.channel.k8s.io, v3.channel.k8s.io".parse().expect("v"),
        );
        assert_eq!(negotiate(&h).ok(), Some(PROTOCOL_V4));
        let mut old = HeaderMap::new();
        old.append(
            HEADER_PROTOCOL_VERSION,
            "v3.channel.k8s.io,v2.channel.k8s.io".parse().expect("v"),
        );
        assert_eq!(negotiate(&old).ok(), Some(PROTOCOL_V3));
        let mut none = HeaderMap::new();
        none.append(
            HEADER_PROTOCOL_VERSION,
            "channel.k8s.io".parse().expect("v"),
        );
        let resp = negotiate(&none).expect_err("v1 only").into_response();
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
        assert_eq!(
            resp.headers()
                .get_all(HEADER_ACCEPTED_PROTOCOL_VERSIONS)
                .iter()
                .count(),
            3
        );
        assert_eq!(
            negotiate(&HeaderMap::new())
                .expect_err("absent")
                .into_response()
                .status(),
            StatusCode::BAD_REQUEST
        );
    }

    #[test]
    fn status_payloads() {
        let ok: serde_json::Value =
            serde_json::from_slice(&status_message(PROTOCOL_V4, &Ok(()))).expect("json");
        assert_eq!(ok["status"], "Success");
        let exit: serde_json::Value =
            serde_json::from_slice(&status_message(PROTOCOL_V4, &Err(ExecError::ExitCode(7))))
                .expect("json");
        assert_eq!(exit["status"], "Failure");
        assert_eq!(exit["reason"], "NonZeroExitCode");
        assert_eq!(exit["details"]["causes"][0]["reason"], "ExitCode");
        assert_eq!(exit["details"]["causes"][0]["message"], "7");
        let gone = Err(ExecError::NoLiveVm {
            namespace: "ns".into(),
            pod: "p".into(),
        });
        let v: serde_json::Value =
            serde_json::from_slice(&status_message(PROTOCOL_V4, &gone)).expect("json");
        assert_eq!(v["status"], "Failure");
        assert!(
            v["message"]
                .as_str()
                .is_some_and(|m| m.contains("no live VM")),
            "{v}"
        );
        assert!(status_message(PROTOCOL_V3, &Ok(())).is_empty());
        assert!(
            String::from_utf8(status_message(PROTOCOL_V2, &gone))
                .expect("utf8")
                .contains("no live VM")
        );
    }

    #[tokio::test]
    async fn a_session_refuses_streams_past_one_exec_worth() {
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let (frames_tx, mut frames_rx) = mpsc::channel(FRAME_QUEUE);
        let (streams_tx, mut streams_rx) = mpsc::channel(MAX_STREAMS);
        let (stdin_tx, _stdin_rx) = mpsc::channel(STDIN_QUEUE);
        let reader = tokio::spawn(read_frames(
            server,
            frames_tx,
            streams_tx,
            stdin_tx,
            CancellationToken::new(),
            Activity::new(),
        ));
        let mut enc = Encoder::new().expect("encoder");
        let ids: Vec<u32> = (0..20).map(|i| 2 * i + 1).collect();
        for id in &ids {
            let syn = Frame::SynStream {
                stream_id: *id,
                fin: false,
                headers: vec![("streamtype".into(), STREAM_STDOUT.into())],
            };
            client
                .write_all(&enc.encode(&syn).expect("encode"))
                .await
                .expect("write");
        }
        // The reader answers in order: once the ping is echoed, every SYN_STREAM before it
        // has been answered.
        client
            .write_all(&enc.encode(&Frame::Ping { id: 99 }).expect("encode"))
            .await
            .expect("write");
        let (mut replied, mut refused) = (Vec::new(), Vec::new());
        loop {
            match frames_rx.recv().await.expect("reader alive") {
                Frame::SynReply { stream_id, .. } => replied.push(stream_id),
                Frame::RstStream { stream_id, status } => {
                    assert_eq!(status, spdy::RST_REFUSED_STREAM);
                    refused.push(stream_id);
                }
                Frame::Ping { id: 99 } => break,
                other => panic!("unexpected frame {other:?}"),
            }
        }
        assert_eq!(replied, ids[..MAX_STREAMS]);
        assert_eq!(refused, ids[MAX_STREAMS..]);
        let mut handed = Vec::new();
        while let Ok(s) = streams_rx.try_recv() {
            handed.push(s.id);
        }
        assert_eq!(
            handed,
            ids[..MAX_STREAMS],
            "only accepted streams reach the session"
        );
        drop(client);
        reader.await.expect("reader ends with the connection");
    }
}
