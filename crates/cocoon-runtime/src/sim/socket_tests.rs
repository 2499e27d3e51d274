//! Unit tests of [`super::socket`]: the simulator's control socket.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio_util::sync::CancellationToken;

use super::socket::*;
use super::{CrashKind, OutOfBandVm, SimConfig, SimHandle, SimRuntime, Verb, VmRow};

fn sim(dir: &Path) -> (SimRuntime, SimHandle) {
    let rt = SimRuntime::open(SimConfig::new(dir)).expect("open");
    let h = rt.handle();
    (rt, h)
}

/// Polls `check` until it returns `Some`, for at most `timeout` (each attempt bounded by
/// what is left), as `cocoon_testenv::wait_until` does; this crate does not depend on the
/// test environment, which would bring the Kubernetes client into its tests.
async fn wait_until<T, Fut>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Fut,
) -> Result<T, String>
where
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if let Ok(Some(v)) = tokio::time::timeout(left.max(Duration::from_millis(1)), check()).await
        {
            return Ok(v);
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return Err(format!("{what}: not within {timeout:?}"));
        }
        tokio::time::sleep(left.min(Duration::from_millis(200))).await;
    }
}

async fn call(root: &Path, req: Request) -> Result<Reply, ClientError> {
    let root = root.to_owned();
    tokio::task::spawn_blocking(move || request(&root, &req))
        .await
        .expect("join")
}

/// Sends raw bytes on a fresh connection and reads one reply line.
async fn raw(path: &Path, bytes: &[u8]) -> (String, UnixStream) {
    let mut s = UnixStream::connect(path).await.expect("connect");
    s.write_all(bytes).await.expect("write");
    let line = read_line(&mut s).await;
    (line, s)
}

async fn read_line(s: &mut UnixStream) -> String {
    let mut line = String::new();
    let mut r = BufReader::new(s);
    tokio::time::timeout(Duration::from_secs(10), r.read_line(&mut line))
        .await
        .expect("reply in time")
        .expect("read");
    line
}

fn running_vm(h: &SimHandle, name: &str) -> String {
    h.create_vm(OutOfBandVm {
        name: name.into(),
        ..OutOfBandVm::default()
    })
    .expect("create")
    .id
}

#[test]
fn requests_have_their_wire_form() {
    let cases = [
        (Request::List, r#"{"op":"list"}"#),
        (
            Request::Crash {
                vm: "a".into(),
                kind: CrashKind::KillProcess,
            },
            r#"{"op":"crash","vm":"a","kind":"kill_process"}"#,
        ),
        (
            Request::Fail {
                verb: Verb::NetResize,
                times: 2,
                message: None,
                target: Some("a".into()),
            },
            r#"{"op":"fail","verb":"net_resize","times":2,"target":"a"}"#,
        ),
        (Request::ClearFailures, r#"{"op":"clear_failures"}"#),
    ];
    for (req, wire) in cases {
        assert_eq!(serde_json::to_string(&req).expect("encode"), wire);
        assert_eq!(serde_json::from_str::<Request>(wire).expect("decode"), req);
    }
    for bad in [
        r#"{"op":"reboot"}"#,
        r#"{"op":"delete"}"#,
        r#"{"op":"delete","vm":"a","force":true}"#,
        r#"{"op":"fail","verb":"fly","times":1}"#,
        r#"{"op":"fail","verb":"start","times":-1}"#,
    ] {
        assert!(serde_json::from_str::<Request>(bad).is_err(), "{bad}");
    }
    let calls = Response::Ok(Reply::Calls(BTreeMap::from([(Verb::Start, 2)])));
    assert_eq!(
        serde_json::to_string(&calls).expect("encode"),
        r#"{"ok":{"calls":{"start":2}}}"#
    );
}

#[tokio::test]
async fn crash_delete_fail_and_list_over_the_socket() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (rt, h) = sim(tmp.path());
    let id = running_vm(&h, "vm-a");
    running_vm(&h, "vm-b");
    let shutdown = CancellationToken::new();
    let server =
        ControlServer::start(h.clone(), &socket_path(tmp.path()), &shutdown).expect("serve");
    let mode = std::fs::metadata(server.path()).expect("stat").mode();
    assert_eq!(mode & 0o777, 0o600, "owner-only socket");
    assert!(
        std::fs::read_dir(tmp.path())
            .expect("ls")
            .flatten()
            .all(|e| !e.file_name().to_string_lossy().starts_with(".cs")),
        "no private bind directory left behind"
    );

    let Reply::Vms(rows) = call(tmp.path(), Request::List).await.expect("list") else {
        panic!("list answers vms");
    };
    let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["vm-a", "vm-b"]);
    assert!(rows.iter().all(|r| r.state == "running" && r.alive));

    let crashed = call(
        tmp.path(),
        Request::Crash {
            vm: "vm-a".into(),
            kind: CrashKind::KillProcess,
        },
    )
    .await
    .expect("crash");
    assert_eq!(
        crashed,
        Reply::Vm(VmRow {
            name: "vm-a".into(),
            id: id.clone(),
            state: "stopped (stale)".into(),
            alive: false,
        })
    );
    assert!(!h.vm_info("vm-a").expect("info").alive);

    call(tmp.path(), Request::Delete { vm: "vm-b".into() })
        .await
        .expect("delete");
    assert!(h.vm_info("vm-b").is_err(), "deleted out of band");
    let err = call(tmp.path(), Request::Delete { vm: "vm-b".into() })
        .await
        .expect_err("gone");
    assert_eq!(err.to_string(), "VM not found: vm-b");

    call(
        tmp.path(),
        Request::Fail {
            verb: Verb::Start,
            times: 1,
            message: Some("boom".into()),
            target: None,
        },
    )
    .await
    .expect("fail");
    use crate::Runtime as _;
    let err = rt.start(&id).await.expect_err("injected");
    assert_eq!(err.to_string(), "boom");
    rt.start(&id).await.expect("only the next call failed");
    let err = call(
        tmp.path(),
        Request::Fail {
            verb: Verb::Start,
            times: 0,
            message: None,
            target: None,
        },
    )
    .await
    .expect_err("zero");
    assert_eq!(err.to_string(), "times must be at least 1");
    let Reply::Calls(counts) = call(tmp.path(), Request::Calls).await.expect("calls") else {
        panic!("calls answers counts");
    };
    assert_eq!(counts.get(&Verb::Start), Some(&2), "both starts counted");
    drop(server);
    assert!(
        !socket_path(tmp.path()).exists(),
        "socket removed when the server ends"
    );
    let err = call(tmp.path(), Request::List)
        .await
        .expect_err("no server");
    assert!(
        err.to_string().starts_with(&format!(
            "no simulated runtime agent at {}: ",
            tmp.path().display()
        )),
        "{err}"
    );
}

#[tokio::test]
async fn bad_and_oversized_requests_get_an_error_line() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (_rt, h) = sim(tmp.path());
    let shutdown = CancellationToken::new();
    let server = ControlServer::start(h, &socket_path(tmp.path()), &shutdown).expect("serve");
    let (line, mut s) = raw(server.path(), b"not json\n").await;
    assert!(line.starts_with(r#"{"error":"invalid request: "#), "{line}");
    // The connection stays usable after a bad request.
    s.write_all(b"{\"op\":\"list\"}\r\n").await.expect("write");
    assert_eq!(read_line(&mut s).await, "{\"ok\":{\"vms\":[]}}\n");

    let mut long = vec![b' '; MAX_REQUEST_BYTES + 10];
    long.push(b'\n');
    let (line, mut s) = raw(server.path(), &long).await;
    assert_eq!(
        line,
        format!(
            "{{\"error\":\"request longer than {MAX_REQUEST_BYTES} bytes; closing the connection\"}}\n"
        )
    );
    let mut rest = Vec::new();
    // The server closed the connection: the remaining input is not read.
    let n = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut rest))
        .await
        .expect("closed in time")
        .unwrap_or(0);
    assert_eq!(n, 0, "nothing after the error");

    // A request of exactly the limit is read and served.
    let mut max = vec![b' '; MAX_REQUEST_BYTES - 13];
    max.extend_from_slice(b"{\"op\":\"list\"}\n");
    assert_eq!(max.len(), MAX_REQUEST_BYTES + 1);
    let (line, _s) = raw(server.path(), &max).await;
    assert_eq!(line, "{\"ok\":{\"vms\":[]}}\n");
}

#[tokio::test]
async fn connections_beyond_the_limit_are_refused() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (_rt, h) = sim(tmp.path());
    let shutdown = CancellationToken::new();
    let server = ControlServer::start(h, &socket_path(tmp.path()), &shutdown).expect("serve");
    let mut held = Vec::new();
    for _ in 0..MAX_CONNECTIONS {
        let (line, s) = raw(server.path(), b"{\"op\":\"list\"}\n").await;
        assert_eq!(line, "{\"ok\":{\"vms\":[]}}\n");
        held.push(s);
    }
    let (line, _s) = raw(server.path(), b"{\"op\":\"list\"}\n").await;
    assert_eq!(
        line,
        format!("{{\"error\":\"too many control connections (at most {MAX_CONNECTIONS})\"}}\n")
    );
    drop(held.pop());
    // The freed slot is served again (the server notices the close asynchronously).
    let served = wait_until("a freed slot served", Duration::from_secs(10), || async {
        let mut s = UnixStream::connect(server.path()).await.ok()?;
        s.write_all(b"{\"op\":\"list\"}\n").await.ok()?;
        let line = read_line(&mut s).await;
        line.starts_with("{\"ok\"").then_some(())
    })
    .await;
    assert!(served.is_ok(), "a slot frees when a connection closes");
}

#[tokio::test]
async fn stale_sockets_are_replaced_live_ones_and_files_refused() {
    let tmp = tempfile::tempdir().expect("tmp");
    let path = socket_path(tmp.path());
    let shutdown = CancellationToken::new();
    // A socket nobody listens on any more (a killed agent's).
    drop(std::os::unix::net::UnixListener::bind(&path).expect("bind"));
    assert!(path.exists());
    let (_rt, h) = sim(tmp.path());
    let server = ControlServer::start(h.clone(), &path, &shutdown).expect("stale replaced");
    call(tmp.path(), Request::List).await.expect("served");
    let err = ControlServer::start(h.clone(), &path, &shutdown).expect_err("in use");
    assert!(matches!(err, ServeError::InUse(_)), "{err}");
    assert!(
        err.to_string()
            .contains("another simulated runtime agent serves it")
    );
    call(tmp.path(), Request::List)
        .await
        .expect("the first server still serves");
    drop(server);

    std::fs::write(&path, "not a socket").expect("write");
    let err = ControlServer::start(h.clone(), &path, &shutdown).expect_err("file");
    assert!(matches!(err, ServeError::NotASocket(_)), "{err}");
    assert_eq!(
        std::fs::read_to_string(&path).expect("read"),
        "not a socket",
        "a non-socket is left alone"
    );

    // Cancelling the agent's shutdown token stops serving.
    std::fs::remove_file(&path).expect("rm");
    let server = ControlServer::start(h, &path, &shutdown).expect("serve");
    shutdown.cancel();
    let refused = wait_until(
        "requests refused after shutdown",
        Duration::from_secs(10),
        || async {
            let root = tmp.path().to_owned();
            let r = tokio::task::spawn_blocking(move || request(&root, &Request::List))
                .await
                .ok()?;
            r.is_err().then_some(())
        },
    )
    .await;
    assert!(refused.is_ok(), "no answers after shutdown");
    drop(server);
}

#[tokio::test]
async fn print_makes_the_guest_log_grow_within_its_bound() {
    use crate::Runtime as _;
    let tmp = tempfile::tempdir().expect("tmp");
    let (rt, h) = sim(tmp.path());
    running_vm(&h, "vm-a");
    let shutdown = CancellationToken::new();
    let server =
        ControlServer::start(h.clone(), &socket_path(tmp.path()), &shutdown).expect("serve");
    let print = |text: &str, repeat: Option<u64>| Request::Print {
        vm: "vm-a".into(),
        text: text.into(),
        repeat,
    };
    call(tmp.path(), print("x", Some(3 << 20)))
        .await
        .expect("a 3 MiB line");
    call(tmp.path(), print("\nlast line\n", None))
        .await
        .expect("print");
    let log = rt.logs_capped("vm-a", None, 1 << 20).await.expect("logs");
    assert!(log.len() <= 1 << 20, "{}", log.len());
    // The newest line that fits whole: the 3 MiB line does not, as with the real backend.
    assert_eq!(log, b"last line\n");
    let err = call(tmp.path(), print("xx", Some(MAX_PRINT_BYTES)))
        .await
        .expect_err("too much");
    assert!(err.to_string().contains("at most"), "{err}");
    let err = call(
        tmp.path(),
        Request::Print {
            vm: "nope".into(),
            text: "x".into(),
            repeat: None,
        },
    )
    .await
    .expect_err("no such VM");
    assert!(err.to_string().contains("nope"), "{err}");
    shutdown.cancel();
    drop(server);
}

#[tokio::test]
async fn busy_over_the_socket_makes_the_guest_use_its_vcpus() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (_rt, h) = sim(tmp.path());
    running_vm(&h, "vm-a");
    let shutdown = CancellationToken::new();
    let server =
        ControlServer::start(h.clone(), &socket_path(tmp.path()), &shutdown).expect("serve");
    let busy = |vm: &str, busy: bool| Request::Busy {
        vm: vm.into(),
        busy,
    };
    assert_eq!(
        serde_json::to_string(&busy("vm-a", true)).expect("encode"),
        r#"{"op":"busy","vm":"vm-a","busy":true}"#
    );
    let cpu = || h.stats("vm-a").expect("stats").cpu_time_ns;
    let before = cpu();
    call(tmp.path(), busy("vm-a", true)).await.expect("busy");
    // Busy, the guest's CPU time passes a whole second of one vCPU within moments.
    wait_until(
        "a busy guest's CPU time grows",
        Duration::from_secs(10),
        || async { (cpu() > before + 1_000_000_000).then_some(()) },
    )
    .await
    .expect("busy");
    call(tmp.path(), busy("vm-a", false)).await.expect("idle");
    let err = call(tmp.path(), busy("nope", true))
        .await
        .expect_err("no such VM");
    assert!(err.to_string().contains("nope"), "{err}");
    shutdown.cancel();
    drop(server);
}
