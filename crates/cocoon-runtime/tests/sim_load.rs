//! The simulated guests' load (issue 39): a running VM echoes TCP on `VK_SIM_ECHO_PORTS` at
//! its address and counts the bytes in its TAP stats; stopped, it serves nothing; started
//! again, it serves again. A VM marked busy uses its vCPUs: its CPU time grows far faster than
//! an idle one's, and stays counted once it is idle again.

use std::net::SocketAddr;
use std::time::Duration;

use cocoon_runtime::sim::{CrashKind, ImageKind, IpPool, SimConfig, SimRuntime};
use cocoon_runtime::{RunRequest, Runtime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const IMAGE: &str = "ghcr.io/cocoonstack/cocoon/ubuntu:24.04";
const WAIT: Duration = Duration::from_secs(10);
const PORT: u16 = 7000;

fn config(root: &std::path::Path, pool: &str) -> SimConfig {
    let mut cfg = SimConfig::new(root);
    cfg.lease_delay = Duration::from_millis(30);
    cfg.tick_interval = Duration::from_millis(100);
    cfg.known_images.insert(IMAGE.into(), ImageKind::Oci);
    // Loopback addresses are local without a route: the test needs no privileges.
    cfg.ip_pool = IpPool::parse(pool).expect("pool");
    cfg.echo_ports = vec![PORT];
    cfg
}

/// Connects to `addr` once its listener is up (within [`WAIT`]).
async fn connect(addr: SocketAddr) -> TcpStream {
    let end = tokio::time::Instant::now() + WAIT;
    loop {
        match TcpStream::connect(addr).await {
            Ok(s) => return s,
            Err(e) if tokio::time::Instant::now() >= end => panic!("echo at {addr}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// Waits until `addr` refuses connections (within [`WAIT`]).
async fn refused(addr: SocketAddr) -> bool {
    let end = tokio::time::Instant::now() + WAIT;
    while tokio::time::Instant::now() < end {
        if TcpStream::connect(addr).await.is_err() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test]
async fn a_running_vm_echoes_on_its_address_and_counts_the_bytes() {
    let dir = tempfile::tempdir().expect("tmp");
    let rt = SimRuntime::open(config(dir.path(), "127.77.1.0/24")).expect("open");
    let sim = rt.handle();
    rt.ensure_image(IMAGE, false).await.expect("pull");
    let req = RunRequest {
        image: IMAGE.into(),
        name: "echo".into(),
        network: "cocoon-dhcp".into(),
        ..RunRequest::default()
    };
    let vm = rt.run(req).await.expect("run");
    // The first lease of a fresh pool: its second host.
    let addr = SocketAddr::from(([127, 77, 1, 2], PORT));
    assert_eq!(sim.stats("echo").expect("stats").taps[0].rx_bytes, 0);

    let mut s = connect(addr).await;
    s.write_all(b"hello, guest").await.expect("send");
    let mut back = [0u8; 12];
    s.read_exact(&mut back).await.expect("echo");
    assert_eq!(&back, b"hello, guest");
    drop(s);
    let st = rt.vm_stats(&vm).await.expect("stats");
    assert_eq!((st.taps[0].rx_bytes, st.taps[0].tx_bytes), (12, 12));

    // Stopped: nothing answers; started again: it echoes again.
    sim.crash("echo", CrashKind::Stopped).expect("stop");
    assert!(refused(addr).await, "a stopped VM serves no echo");
    rt.start(&vm.id).await.expect("start");
    let mut s = connect(addr).await;
    s.write_all(b"again").await.expect("send");
    let mut back = [0u8; 5];
    s.read_exact(&mut back).await.expect("echo");
    assert_eq!(&back, b"again");
}

#[tokio::test]
async fn a_busy_vm_uses_its_vcpus_until_it_is_idle_again() {
    let dir = tempfile::tempdir().expect("tmp");
    let rt = SimRuntime::open(config(dir.path(), "127.77.2.0/24")).expect("open");
    let sim = rt.handle();
    rt.ensure_image(IMAGE, false).await.expect("pull");
    let req = RunRequest {
        image: IMAGE.into(),
        name: "load".into(),
        network: "cocoon-dhcp".into(),
        ..RunRequest::default()
    };
    rt.run(req).await.expect("run");
    let cpu = || sim.stats("load").expect("stats").cpu_time_ns;
    let window = Duration::from_millis(300);
    let (a, t0) = (cpu(), std::time::Instant::now());
    tokio::time::sleep(window).await;
    let idle_rate = (cpu() - a) as f64 / t0.elapsed().as_nanos() as f64;
    assert!(idle_rate < 0.2, "idle: {idle_rate} cores");

    sim.set_busy("load", true).expect("busy");
    let (a, t0) = (cpu(), std::time::Instant::now());
    tokio::time::sleep(window).await;
    let busy_rate = (cpu() - a) as f64 / t0.elapsed().as_nanos() as f64;
    assert!(busy_rate > 1.0, "busy with 2 vCPUs: {busy_rate} cores");

    sim.set_busy("load", false).expect("idle");
    let after = cpu();
    assert!(after >= a, "the busy time stays counted");
    let t0 = std::time::Instant::now();
    tokio::time::sleep(window).await;
    let idle_again = (cpu() - after) as f64 / t0.elapsed().as_nanos() as f64;
    assert!(idle_again < 0.2, "idle again: {idle_again} cores");
    assert!(
        sim.set_busy("nope", true).is_err(),
        "an unknown VM is an error"
    );
}
