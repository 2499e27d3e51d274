//! Unit tests of [`crate::systemd`]: the notification socket, the watchdog timeout, the
//! "are all main loops alive" decision, and real datagrams on real unix sockets.

use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::settings::Settings;
use super::systemd::*;

#[test]
fn notify_socket_is_a_path_or_abstract() {
    assert_eq!(
        parse_notify_socket("/run/systemd/notify"),
        Ok(NotifyAddr::Path(PathBuf::from("/run/systemd/notify")))
    );
    assert_eq!(
        parse_notify_socket("@/org/freedesktop/systemd1/notify/42"),
        Ok(NotifyAddr::Abstract(
            b"/org/freedesktop/systemd1/notify/42".to_vec()
        ))
    );
    for bad in ["@", "run/notify", "vsock:2:1234"] {
        assert!(parse_notify_socket(bad).is_err(), "{bad}");
    }
}

/// `WATCHDOG_USEC`, `WATCHDOG_PID`, and the timeout (or the error) they give process 4242.
type WatchdogCase = (
    Option<&'static str>,
    Option<&'static str>,
    Result<Option<Duration>, &'static str>,
);

#[test]
fn watchdog_timeout_follows_sd_watchdog_enabled() {
    let cases: &[WatchdogCase] = &[
        (None, None, Ok(None)),
        (Some(""), None, Ok(None)),
        (Some("0"), None, Ok(None)),
        (Some("60000000"), None, Ok(Some(Duration::from_secs(60)))),
        (
            Some("60000000"),
            Some("4242"),
            Ok(Some(Duration::from_secs(60))),
        ),
        // Meant for another process (a parent that forgot to unset it): no pings.
        (Some("60000000"), Some("1"), Ok(None)),
        (
            Some("1m"),
            None,
            Err("WATCHDOG_USEC=\"1m\": not a number of microseconds"),
        ),
        (
            Some("1000"),
            Some("me"),
            Err("WATCHDOG_PID=\"me\": not a process id"),
        ),
    ];
    for (usec, pid, want) in cases {
        assert_eq!(
            watchdog_timeout(*usec, *pid, 4242),
            (*want).map_err(str::to_string),
            "{usec:?} {pid:?}"
        );
    }
}

fn age(name: &'static str, period: u64, age: u64) -> LoopAge {
    LoopAge {
        name,
        period: Duration::from_secs(period),
        age: Duration::from_secs(age),
    }
}

/// The watchdog pings only while every main loop beat within its period plus the timeout.
#[test]
fn decide_pings_only_while_every_loop_is_fresh() {
    let slack = Duration::from_secs(60);
    let cases: &[(&[LoopAge], Verdict)] = &[
        (
            &[age("pod watch", 5, 1), age("lease renew", 10, 9)],
            Verdict::Ping,
        ),
        // Slow, but within period + timeout.
        (&[age("lease renew", 10, 70)], Verdict::Ping),
        (
            &[age("pod watch", 5, 2), age("lease renew", 10, 71)],
            Verdict::Withhold {
                stale: vec!["lease renew"],
            },
        ),
        (
            &[age("pod watch", 5, 600), age("kubelet API accept", 5, 66)],
            Verdict::Withhold {
                stale: vec!["pod watch", "kubelet API accept"],
            },
        ),
        // Nothing registered: nothing vouches for the agent.
        (&[], Verdict::Withhold { stale: vec![] }),
    ];
    for (loops, want) in cases {
        assert_eq!(&decide(loops, slack), want, "{loops:?}");
    }
}

#[test]
fn a_heartbeat_ages_until_it_beats() {
    let hb = Heartbeat::new("x", Duration::from_secs(5));
    let liveness = Liveness::default();
    liveness.register(hb.clone());
    let later = Instant::now() + Duration::from_secs(30);
    let seen = liveness.observe(later);
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].name, "x");
    assert!(
        seen[0].age >= Duration::from_secs(29),
        "aged: {:?}",
        seen[0].age
    );
    hb.beat();
    assert!(hb.observe(Instant::now()).age < Duration::from_secs(1));
}

fn settings_with_socket(value: &str) -> Settings {
    let value = value.to_string();
    Settings::capture(move |k| (k == NOTIFY_SOCKET).then(|| value.clone()))
}

fn recv(sock: &UnixDatagram) -> String {
    let mut buf = [0u8; 256];
    let n = sock
        .recv(&mut buf)
        .expect("a datagram before the read timeout");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn notifications_reach_a_path_and_an_abstract_socket() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&path).expect("bind");
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let n = Notifier::from_settings(&settings_with_socket(path.to_str().expect("utf-8")))
        .expect("notifier");
    n.notify("READY=1").expect("send");
    assert_eq!(recv(&sock), "READY=1");

    use std::os::linux::net::SocketAddrExt as _;
    let name = format!("cocoon-node-test-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).expect("addr");
    let abs = UnixDatagram::bind_addr(&addr).expect("bind abstract");
    abs.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let n = Notifier::from_settings(&settings_with_socket(&format!("@{name}"))).expect("notifier");
    n.notify("STOPPING=1").expect("send");
    assert_eq!(recv(&abs), "STOPPING=1");

    assert!(Notifier::from_settings(&Settings::default()).is_none());
    assert!(Notifier::from_settings(&settings_with_socket("relative")).is_none());
}

/// The watchdog task sends `WATCHDOG=1` while its loop beats, and stops once the loop does.
#[tokio::test]
async fn the_watchdog_stops_pinging_when_a_loop_stops_beating() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&path).expect("bind");
    let notifier = Arc::new(
        Notifier::from_settings(&settings_with_socket(path.to_str().expect("utf-8")))
            .expect("notifier"),
    );
    let liveness = Liveness::default();
    let hb = Heartbeat::new("test loop", Duration::from_millis(100));
    liveness.register(hb.clone());
    let timeout = Duration::from_millis(400);
    let stop = CancellationToken::new();
    let beating = CancellationToken::new();
    let (b, beat) = (beating.clone(), hb.clone());
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        while !b.is_cancelled() {
            tick.tick().await;
            beat.beat();
        }
    });
    let task = tokio::spawn(run_watchdog(notifier, liveness, timeout, stop.clone()));

    let sock = tokio::task::spawn_blocking(move || {
        sock.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        for _ in 0..3 {
            assert_eq!(recv(&sock), "WATCHDOG=1");
        }
        sock
    })
    .await
    .expect("pings while the loop beats");

    // The loop stops: once its heartbeat is older than period + timeout (500 ms), no ping
    // follows; 300 ms more let a ping decided just before that arrive before the drain.
    beating.cancel();
    let deadline = Instant::now() + Duration::from_secs(10);
    while hb.observe(Instant::now()).age <= Duration::from_millis(800) {
        assert!(Instant::now() < deadline, "the heartbeat never went stale");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let quiet = tokio::task::spawn_blocking(move || {
        // Drop what was sent before the verdict changed, then expect silence for several
        // watchdog periods.
        sock.set_nonblocking(true).expect("nonblocking");
        let mut buf = [0u8; 64];
        while sock.recv(&mut buf).is_ok() {}
        sock.set_nonblocking(false).expect("blocking");
        sock.set_read_timeout(Some(timeout * 2)).expect("timeout");
        sock.recv(&mut buf).map(|n| buf[..n].to_vec())
    })
    .await
    .expect("join");
    assert!(
        quiet.is_err(),
        "a ping after the loop stopped: {:?}",
        quiet.map(|b| String::from_utf8_lossy(&b).into_owned())
    );
    stop.cancel();
    task.await.expect("watchdog ends on stop");
}
