//! At most two v2 pulls run at once in one process, i.e. one node agent (registry.md §5.5):
//! each may hold up to the pull budget in memory. Its own test binary, so that no other test
//! takes the process-wide slots meanwhile.

mod common;

use std::time::Duration;

use cocoon_registry::{PushOptions, RegistryClient, RegistryConfig, V2Options};
use cocoon_testenv::{Registry, unique_name};
use common::TempDir;
use tokio::io::{AsyncReadExt, DuplexStream};
use tokio::sync::oneshot;

const MIB: u64 = 1 << 20;

/// One tar pull into a pipe whose reader reads the first tar header, reports it, and then
/// reads nothing more until `drain` fires: the pull blocks on a full pipe, holding its slot.
struct StuckPull {
    started: oneshot::Receiver<()>,
    drain: Option<oneshot::Sender<()>>,
    pull: tokio::task::JoinHandle<Result<cocoon_registry::PullReport, cocoon_registry::Error>>,
    reader: tokio::task::JoinHandle<std::io::Result<u64>>,
}

fn start_pull(c: &RegistryClient, repo: &str) -> StuckPull {
    let (w, mut r): (DuplexStream, DuplexStream) = tokio::io::duplex(64 << 10);
    let (started_tx, started) = oneshot::channel();
    let (drain, drain_rx) = oneshot::channel::<()>();
    let reader = tokio::spawn(async move {
        let mut header = [0u8; 512];
        r.read_exact(&mut header).await?;
        let _ = started_tx.send(());
        let _ = drain_rx.await;
        let mut rest = Vec::new();
        let n = r.read_to_end(&mut rest).await?;
        Ok(512 + n as u64)
    });
    let (c, repo) = (c.clone(), repo.to_string());
    let pull =
        tokio::spawn(async move { c.pull_snapshot_to_tar(&repo, "latest", "limit-vm", w).await });
    StuckPull {
        started,
        drain: Some(drain),
        pull,
        reader,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_third_v2_pull_waits_until_one_of_two_finishes() {
    let reg = Registry::start_temp(None).await.expect("registry");
    let work = TempDir::new("cocoon-v2-limit");
    let src = work.path().join("src");
    std::fs::create_dir_all(&src).expect("mkdir");
    // Random data: the zstd stream stays larger than the pipe, so a pull that nobody
    // drains blocks on it.
    let files = [
        common::FileSpec::dense("config.json", 4096),
        common::FileSpec::dense("memory-ranges", 4 * MIB),
    ];
    common::write_snapshot_dir(&src, "limit-vm", "sid-limit", &files, 11);
    let mut cfg = RegistryConfig::for_registry(reg.addr()).expect("config");
    cfg.v2 = V2Options {
        zstd_level: 1,
        chunk_size: MIB,
    };
    let c = RegistryClient::new(cfg).expect("client");
    let repos: Vec<String> = (0..3).map(|_| unique_name("rs-limit")).collect();
    for repo in &repos {
        c.push_snapshot_dir(repo, &src, &PushOptions::new("latest", ""))
            .await
            .expect("push");
    }
    // A v1 artifact is not limited: it pulls while two v2 pulls hold both slots.
    let v1_repo = unique_name("rs-limit-v1");
    RegistryClient::new(RegistryConfig::for_registry(reg.addr()).expect("config"))
        .expect("client")
        .push_snapshot_dir(&v1_repo, &src, &PushOptions::new("latest", ""))
        .await
        .expect("push v1");

    let deadline = Duration::from_secs(60);
    let mut first = start_pull(&c, &repos[0]);
    let mut second = start_pull(&c, &repos[1]);
    tokio::time::timeout(deadline, &mut first.started)
        .await
        .expect("the first v2 pull starts")
        .expect("first reader");
    tokio::time::timeout(deadline, &mut second.started)
        .await
        .expect("the second v2 pull starts")
        .expect("second reader");

    let mut v1 = start_pull(&c, &v1_repo);
    tokio::time::timeout(deadline, &mut v1.started)
        .await
        .expect("a v1 pull does not wait for a v2 slot")
        .expect("v1 reader");
    let _ = v1.drain.take().map(|d| d.send(()));
    let v1_report = v1.pull.await.expect("join").expect("v1 pull");
    assert!(!v1_report.format.contains("v2"), "{}", v1_report.format);

    // Both slots are held by pulls that cannot move: the third cannot start. Its chance to
    // start is a window (2 s: a manifest, a config and the first header on loopback take
    // milliseconds), the only way to observe "does not happen".
    let mut third = start_pull(&c, &repos[2]);
    assert!(
        tokio::time::timeout(Duration::from_secs(2), &mut third.started)
            .await
            .is_err(),
        "a third v2 pull started while two held both slots"
    );
    // The first finishes: the third takes its slot.
    let _ = first.drain.take().map(|d| d.send(()));
    let report = tokio::time::timeout(deadline, first.pull)
        .await
        .expect("the first pull finishes once drained")
        .expect("join")
        .expect("first pull");
    assert!(report.format.contains("v2"), "{}", report.format);
    assert!(first.reader.await.expect("join").expect("read") > 4 * MIB);
    tokio::time::timeout(deadline, &mut third.started)
        .await
        .expect("the third v2 pull starts once a slot is free")
        .expect("third reader");
    for mut p in [second, third] {
        let _ = p.drain.take().map(|d| d.send(()));
        tokio::time::timeout(deadline, p.pull)
            .await
            .expect("a drained pull finishes")
            .expect("join")
            .expect("pull");
    }
}
