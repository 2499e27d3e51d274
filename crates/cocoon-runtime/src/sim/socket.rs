//! The simulator's control socket: part of [`SimHandle`] served to other processes, so that
//! black-box tests and demos can crash, delete or fail things under a running node agent
//! (`runtime.md` §7.10 leaves the surface open; this is the chosen one).
//!
//! * **Where.** `<VK_SIM_ROOT>/control.sock`, mode `0600` (only the agent's user can connect).
//!   Only the node agent on the simulated runtime serves it; with `VK_RUNTIME=cocoon` there is
//!   none. It is bound in a private `0700` directory, chmod'ed, then renamed into place, so it is
//!   never reachable with wider permissions. A socket left by a killed agent is replaced; a live
//!   one (another agent on the same root) or a non-socket file at the path is an error.
//! * **Protocol.** Line-delimited JSON: each request is one JSON object on one line, answered by
//!   one line, `{"ok": <reply>}` or `{"error": "<text>"}`. A connection may send several.
//!   Requests: `{"op":"list"}`, `{"op":"crash","vm":V,"kind":"stopped"|"error"|"kill_process"}`,
//!   `{"op":"delete","vm":V}`, `{"op":"fail","verb":"start","times":N,"message":M,"target":T}`
//!   (`message` and `target` optional), `{"op":"clear_failures"}`, `{"op":"calls"}`,
//!   `{"op":"close_event_streams"}`, `{"op":"print","vm":V,"text":T,"repeat":N}` (the guest
//!   prints `T` on its console `N` times, default 1, at most [`MAX_PRINT_BYTES`] in all).
//!   `V` is a VM name or id.
//! * **Bounds.** A request line is at most [`MAX_REQUEST_BYTES`]; a longer one is answered with
//!   an error and the connection is closed. At most [`MAX_CONNECTIONS`] connections are served
//!   at once; one more is answered with an error and closed. A connection idle for
//!   [`IDLE_TIMEOUT`] (or whose reader stalls a reply that long) is closed.
//!
//! [`request`] is the client side (`cocoon-operator sim` uses it).

use std::collections::BTreeMap;
use std::io::{self, BufRead, Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::state::random_hex;
use super::{CrashKind, FailRule, SimHandle, Verb, VmRow};

/// File name of the socket under the simulator root.
pub const SOCKET_NAME: &str = "control.sock";
/// Longest request line (without its newline).
pub const MAX_REQUEST_BYTES: usize = 64 << 10;
/// Longest reply line the client accepts.
pub const MAX_REPLY_BYTES: usize = 16 << 20;
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 8;
/// A connection with no complete request (or a stalled reply) for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the client waits for the agent.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// The control socket of the simulator rooted at `root`.
pub fn socket_path(root: &Path) -> PathBuf {
    root.join(SOCKET_NAME)
}

/// One request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Every VM ([`Reply::Vms`]).
    List,
    /// Crash a VM out of band ([`SimHandle::crash`]; [`Reply::Vm`]).
    Crash {
        /// VM name or id.
        vm: String,
        /// How.
        kind: CrashKind,
    },
    /// Delete a VM out of band ([`SimHandle::delete_vm`]; [`Reply::Done`]).
    Delete {
        /// VM name or id.
        vm: String,
    },
    /// Fail the next `times` calls of a verb ([`SimHandle::fail`]; [`Reply::Done`]).
    Fail {
        /// The verb.
        verb: Verb,
        /// How many calls (at least 1).
        times: u32,
        /// The error text (it goes through the runtime's error classifier); default
        /// `simulated failure of <verb>`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
        /// Only calls naming this VM name/id, snapshot name or image ref.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        target: Option<String>,
    },
    /// Remove every failure rule ([`Reply::Done`]).
    ClearFailures,
    /// Call counts per verb ([`Reply::Calls`]).
    Calls,
    /// End every open event stream; the agent reconnects ([`Reply::Done`]).
    CloseEventStreams,
    /// The guest prints `text` on its console, `repeat` times ([`SimHandle::guest_print`];
    /// [`Reply::Done`]): how a test or demo makes a guest's log grow, huge lines included.
    Print {
        /// VM name or id.
        vm: String,
        /// The bytes printed, as is (add the newline yourself).
        text: String,
        /// How many times (default 1); `text` × `repeat` is at most [`MAX_PRINT_BYTES`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        repeat: Option<u64>,
    },
    /// The guest's load: `busy` makes it use every vCPU, so its CPU time grows
    /// ([`SimHandle::set_busy`]; [`Reply::Done`]).
    Busy {
        /// VM name or id.
        vm: String,
        /// Busy (`true`) or idle again (`false`).
        busy: bool,
    },
}

/// Most bytes one `print` request makes the guest print.
pub const MAX_PRINT_BYTES: u64 = 256 << 20;

/// What a successful request returns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    /// Done, nothing to report.
    Done,
    /// Every VM.
    Vms(Vec<VmRow>),
    /// The VM after the change.
    Vm(VmRow),
    /// Calls per verb (verbs never called are absent).
    Calls(BTreeMap<Verb, usize>),
}

/// One reply line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Response {
    /// The request was applied.
    Ok(Reply),
    /// It was refused or failed; the text says why.
    Error(String),
}

/// Why the agent could not serve the socket.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Another process answers on it (two agents on one simulator root).
    #[error(
        "control socket {}: another simulated runtime agent serves it (one agent per VK_SIM_ROOT)",
        .0.display()
    )]
    InUse(PathBuf),
    /// Something that is not a socket sits at the path; it is left alone.
    #[error("control socket {}: the path exists and is not a socket", .0.display())]
    NotASocket(PathBuf),
    /// Binding failed.
    #[error("control socket {}: {source}", path.display())]
    Io {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
}

/// Why a control request did not get an answer (or got a refusal).
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing serves the socket (no agent, or it ended).
    #[error("no simulated runtime agent at {}: {source}", root.display())]
    NoAgent {
        /// The simulator root asked for.
        root: PathBuf,
        /// The connect error.
        source: io::Error,
    },
    /// Talking to the socket failed.
    #[error("control socket {}: {source}", path.display())]
    Io {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// The reply was not a reply.
    #[error("control socket {}: bad reply: {message}", path.display())]
    BadReply {
        /// The socket path.
        path: PathBuf,
        /// What was wrong.
        message: String,
    },
    /// The agent refused or failed the request; its text.
    #[error("{0}")]
    Refused(String),
}

/// Applies one request to the simulator.
pub fn execute(handle: &SimHandle, req: Request) -> Result<Reply, String> {
    let non_empty = |field: &str, v: &str| {
        if v.trim().is_empty() {
            Err(format!("{field} must not be empty"))
        } else {
            Ok(())
        }
    };
    match req {
        Request::List => Ok(Reply::Vms(handle.vm_rows())),
        Request::Crash { vm, kind } => {
            non_empty("vm", &vm)?;
            let rec = handle.crash(&vm, kind).map_err(|e| e.to_string())?;
            handle
                .vm_rows()
                .into_iter()
                .find(|r| r.id == rec.id)
                .map(Reply::Vm)
                .ok_or_else(|| format!("VM not found: {vm}"))
        }
        Request::Delete { vm } => {
            non_empty("vm", &vm)?;
            handle.delete_vm(&vm).map_err(|e| e.to_string())?;
            Ok(Reply::Done)
        }
        Request::Print { vm, text, repeat } => {
            non_empty("vm", &vm)?;
            let repeat = repeat.unwrap_or(1);
            let total = (text.len() as u64).saturating_mul(repeat);
            if total > MAX_PRINT_BYTES {
                return Err(format!(
                    "print: {total} bytes asked, at most {MAX_PRINT_BYTES} per request"
                ));
            }
            // Written in chunks of about 1 MiB, so a huge print never sits in memory whole.
            let per_chunk = if text.is_empty() {
                1
            } else {
                ((1u64 << 20) / text.len() as u64).max(1)
            };
            let mut left = repeat;
            while left > 0 {
                let n = left.min(per_chunk);
                let chunk = text.repeat(usize::try_from(n).unwrap_or(1));
                handle
                    .guest_print(&vm, chunk.as_bytes())
                    .map_err(|e| e.to_string())?;
                left -= n;
            }
            Ok(Reply::Done)
        }
        Request::Fail {
            verb,
            times,
            message,
            target,
        } => {
            if times == 0 {
                return Err("times must be at least 1".into());
            }
            if let Some(t) = &target {
                non_empty("target", t)?;
            }
            let message = message
                .filter(|m| !m.trim().is_empty())
                .unwrap_or_else(|| format!("simulated failure of {verb}"));
            let mut rule = FailRule::new(verb, message).times(times);
            if let Some(t) = target {
                rule = rule.target(t);
            }
            handle.fail(rule);
            Ok(Reply::Done)
        }
        Request::Busy { vm, busy } => {
            non_empty("vm", &vm)?;
            handle.set_busy(&vm, busy).map_err(|e| e.to_string())?;
            Ok(Reply::Done)
        }
        Request::ClearFailures => {
            handle.clear_failures();
            Ok(Reply::Done)
        }
        Request::Calls => Ok(Reply::Calls(handle.call_counts())),
        Request::CloseEventStreams => {
            handle.close_event_streams();
            Ok(Reply::Done)
        }
    }
}

/// Parses and applies one request line.
async fn respond(handle: &SimHandle, line: &[u8]) -> Response {
    let req: Request = match serde_json::from_slice(line) {
        Ok(r) => r,
        Err(e) => return Response::Error(format!("invalid request: {e}")),
    };
    info!(request = ?req, "simulator control request");
    let h = handle.clone();
    // Crashes and deletes rewrite the VM index on disk.
    match tokio::task::spawn_blocking(move || execute(&h, req)).await {
        Ok(Ok(reply)) => Response::Ok(reply),
        Ok(Err(e)) => Response::Error(e),
        Err(e) => Response::Error(format!("control request failed: {e}")),
    }
}

fn encode(r: &Response) -> Vec<u8> {
    let mut out = serde_json::to_vec(r)
        .or_else(|e| serde_json::to_vec(&Response::Error(format!("encode reply: {e}"))))
        .unwrap_or_default();
    out.push(b'\n');
    out
}

/// The socket an agent serves; it is removed when this is dropped.
#[derive(Debug)]
pub struct ControlServer {
    path: PathBuf,
    /// (device, inode) of the socket file, so that only our own file is removed.
    file: (u64, u64),
    stop: CancellationToken,
}

impl ControlServer {
    /// Binds `path` and serves `handle` on it until `shutdown` is cancelled or this is
    /// dropped. Needs a Tokio runtime.
    pub fn start(
        handle: SimHandle,
        path: &Path,
        shutdown: &CancellationToken,
    ) -> Result<ControlServer, ServeError> {
        let (std_listener, file) = bind(path)?;
        let io = |source| ServeError::Io {
            path: path.to_owned(),
            source,
        };
        std_listener.set_nonblocking(true).map_err(io)?;
        let listener = UnixListener::from_std(std_listener).map_err(io)?;
        let stop = shutdown.child_token();
        tokio::spawn(accept_loop(listener, handle, stop.clone()));
        info!(path = %path.display(), "simulator control socket listening");
        Ok(ControlServer {
            path: path.to_owned(),
            file,
            stop,
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Ok(m) = std::fs::symlink_metadata(&self.path)
            && (m.dev(), m.ino()) == self.file
        {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Binds a listener at `path` that is never reachable with permissions wider than 0600.
fn bind(path: &Path) -> Result<(std::os::unix::net::UnixListener, (u64, u64)), ServeError> {
    let io = |source| ServeError::Io {
        path: path.to_owned(),
        source,
    };
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(ServeError::InUse(path.to_owned()));
            }
            // Left by an agent that ended without cleaning up: the rename replaces it.
        }
        Ok(_) => return Err(ServeError::NotASocket(path.to_owned())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    // Short, so that the temporary path fits sun_path whenever the final one does.
    let private = parent.join(format!(".cs{}", random_hex(3)));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&private)
        .map_err(io)?;
    let bound = (|| -> io::Result<_> {
        let tmp = private.join("s");
        let listener = std::os::unix::net::UnixListener::bind(&tmp)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&tmp, path)?;
        let m = std::fs::symlink_metadata(path)?;
        Ok((listener, (m.dev(), m.ino())))
    })();
    let _ = std::fs::remove_dir_all(&private);
    bound.map_err(io)
}

async fn accept_loop(listener: UnixListener, handle: SimHandle, stop: CancellationToken) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((stream, _)) => match slots.clone().try_acquire_owned() {
                Ok(permit) => {
                    let (h, s) = (handle.clone(), stop.clone());
                    tokio::spawn(async move {
                        serve_connection(stream, h, s).await;
                        drop(permit);
                    });
                }
                Err(_) => {
                    warn!(
                        max = MAX_CONNECTIONS,
                        "simulator control socket: too many connections, refusing one"
                    );
                    // Best effort and non-blocking: a refused client must not hold the loop.
                    let _ = stream.try_write(&encode(&Response::Error(format!(
                        "too many control connections (at most {MAX_CONNECTIONS})"
                    ))));
                }
            },
            Err(e) => {
                // E.g. out of file descriptors: back off instead of spinning.
                warn!(error = %e, "simulator control socket: accept failed");
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
            }
        }
    }
}

async fn serve_connection(stream: UnixStream, handle: SimHandle, stop: CancellationToken) {
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    let limit = MAX_REQUEST_BYTES as u64 + 1;
    loop {
        let mut line = Vec::new();
        let mut limited = (&mut read).take(limit);
        let got = tokio::select! {
            _ = stop.cancelled() => return,
            r = tokio::time::timeout(IDLE_TIMEOUT, limited.read_until(b'\n', &mut line)) => r,
        };
        match got {
            Err(_) => {
                debug!("simulator control connection idle, closing");
                return;
            }
            Ok(Err(e)) => {
                debug!(error = %e, "simulator control connection read failed");
                return;
            }
            Ok(Ok(0)) => return,
            Ok(Ok(_)) => {}
        }
        let complete = line.last() == Some(&b'\n');
        let response = if !complete && line.len() > MAX_REQUEST_BYTES {
            Response::Error(format!(
                "request longer than {MAX_REQUEST_BYTES} bytes; closing the connection"
            ))
        } else {
            while matches!(line.last(), Some(b'\n' | b'\r')) {
                line.pop();
            }
            respond(&handle, &line).await
        };
        let out = encode(&response);
        let sent = tokio::select! {
            _ = stop.cancelled() => return,
            r = tokio::time::timeout(IDLE_TIMEOUT, write.write_all(&out)) => r,
        };
        if !matches!(sent, Ok(Ok(()))) || !complete {
            // A write failure, a too-long line, or the peer's end of input.
            return;
        }
    }
}

/// Sends one request to the agent serving the simulator at `root` and returns its reply.
/// Blocking; waits at most [`CLIENT_TIMEOUT`] per read or write.
pub fn request(root: &Path, req: &Request) -> Result<Reply, ClientError> {
    let path = socket_path(root);
    let io = |source| ClientError::Io {
        path: path.clone(),
        source,
    };
    let bad = |message: String| ClientError::BadReply {
        path: path.clone(),
        message,
    };
    let mut stream = match std::os::unix::net::UnixStream::connect(&path) {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Err(ClientError::NoAgent {
                root: root.to_owned(),
                source: e,
            });
        }
        Err(e) => return Err(io(e)),
    };
    stream.set_read_timeout(Some(CLIENT_TIMEOUT)).map_err(io)?;
    stream.set_write_timeout(Some(CLIENT_TIMEOUT)).map_err(io)?;
    let mut line = serde_json::to_vec(req).map_err(|e| bad(e.to_string()))?;
    line.push(b'\n');
    stream.write_all(&line).map_err(io)?;
    let mut reader = io::BufReader::new(stream.take(MAX_REPLY_BYTES as u64 + 1));
    let mut buf = Vec::new();
    reader.read_until(b'\n', &mut buf).map_err(io)?;
    if buf.last() != Some(&b'\n') {
        return Err(bad(if buf.len() > MAX_REPLY_BYTES {
            format!("longer than {MAX_REPLY_BYTES} bytes")
        } else {
            "the agent closed the connection before replying".into()
        }));
    }
    match serde_json::from_slice::<Response>(&buf) {
        Ok(Response::Ok(reply)) => Ok(reply),
        Ok(Response::Error(e)) => Err(ClientError::Refused(e)),
        Err(e) => Err(bad(e.to_string())),
    }
}
