//! Plugin start-up time and `status` latency against a local cluster, as figures (p50/p95 over
//! repeated runs of the real binary). `cargo bench -p kubectl-cocoon --bench plugin_latency`.

use std::time::{Duration, Instant};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn report(what: &str, mut samples: Vec<Duration>) {
    samples.sort();
    println!(
        "{what:<28} n={:<3} p50={:>7.1} ms  p95={:>7.1} ms  max={:>7.1} ms",
        samples.len(),
        percentile(&samples, 0.5).as_secs_f64() * 1e3,
        percentile(&samples, 0.95).as_secs_f64() * 1e3,
        samples.last().copied().unwrap_or_default().as_secs_f64() * 1e3
    );
}

fn bin() -> std::path::PathBuf {
    // benches live next to the binary in target/<profile>/
    let exe = std::env::current_exe().expect("exe");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    dir.join("kubectl-cocoon")
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("run with: cargo bench -p kubectl-cocoon --bench plugin_latency");
        return;
    }
    let bin = bin();
    let runs = 30;
    let mut help = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        let out = std::process::Command::new(&bin)
            .arg("--help")
            .output()
            .expect("run");
        assert!(out.status.success());
        help.push(t.elapsed());
    }
    report("start-up (--help)", help);

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let env = rt
        .block_on(cocoon_testenv::TestEnv::start(
            cocoon_testenv::Options::default(),
        ))
        .expect("test env");
    let kubeconfig = env.kubeconfig_path();
    let status = |args: &[&str]| {
        let t = Instant::now();
        let out = std::process::Command::new(&bin)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(args)
            .output()
            .expect("run");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        t.elapsed()
    };
    let client = rt.block_on(async { env.client() }).expect("client");
    rt.block_on(async {
        let sets: kube::Api<cocoon_api::CocoonSet> = kube::Api::namespaced(client, "default");
        for i in 0..20 {
            let _ = sets
                .create(
                    &kube::api::PostParams::default(),
                    &cocoon_api::CocoonSet::new(
                        &format!("bench-{i}"),
                        cocoon_api::CocoonSetSpec::with_image("img"),
                    ),
                )
                .await;
        }
    });
    report(
        "status (20 sets)",
        (0..runs).map(|_| status(&["status"])).collect(),
    );
    report(
        "status -o json (20 sets)",
        (0..runs)
            .map(|_| status(&["status", "-o", "json"]))
            .collect(),
    );
    report(
        "status NAME (detail)",
        (0..runs).map(|_| status(&["status", "bench-0"])).collect(),
    );
    env.shutdown();
}
