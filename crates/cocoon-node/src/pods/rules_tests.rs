//! Unit tests of `pods/rules.rs`.

use super::rules::*;
use cocoon_api::contract::Mode;
use cocoon_api::contract::{Backend, Os, VmSpec};
use cocoon_runtime::StaleCreateOutcome;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn spec() -> VmSpec {
    VmSpec {
        vm_name: "vk-ns-a-0".into(),
        image: "ubuntu:24.04".into(),
        managed: true,
        ..Default::default()
    }
}

#[test]
fn parse_ref_splits_at_first_colon() {
    let cases = [
        ("ubuntu:24.04", ("ubuntu", "24.04")),
        ("ubuntu", ("ubuntu", "latest")),
        (":x", (":x", "latest")),
        ("host:5000/repo:tag", ("host", "5000/repo:tag")),
    ];
    for (input, (repo, tag)) in cases {
        assert_eq!(
            parse_ref(input),
            (repo.to_owned(), tag.to_owned()),
            "{input}"
        );
    }
    assert_eq!(local_snapshot_name("ubuntu", "latest"), "ubuntu:latest");
    assert_eq!(local_snapshot_name("ubuntu", "24.04"), "ubuntu:24.04");
}

#[test]
fn clone_from_dir_validation_reads_like_the_spec() {
    let s = spec();
    assert_eq!(clone_from_dir(None, &s), Ok(None));
    assert_eq!(clone_from_dir(Some("  "), &s), Ok(None));
    assert_eq!(
        clone_from_dir(Some("/srv/snap"), &s),
        Ok(Some(PathBuf::from("/srv/snap")))
    );
    assert_eq!(
        clone_from_dir(Some("srv/snap"), &s).unwrap_err(),
        "annotation vm.cocoonstack.io/clone-from-dir must be an absolute path, got \"srv/snap\""
    );
    assert_eq!(
        clone_from_dir(Some("/srv/../snap/"), &s).unwrap_err(),
        "annotation vm.cocoonstack.io/clone-from-dir must be a canonical path, got \"/srv/../snap/\" (cleaned: \"/snap\")"
    );
    let run = VmSpec {
        mode: Some(Mode::Run),
        ..spec()
    };
    assert_eq!(
        clone_from_dir(Some("/d"), &run).unwrap_err(),
        "annotation vm.cocoonstack.io/clone-from-dir is incompatible with mode=run"
    );
    let fork = VmSpec {
        fork_from: "vk-src".into(),
        ..spec()
    };
    assert_eq!(
        clone_from_dir(Some("/d"), &fork).unwrap_err(),
        "annotation vm.cocoonstack.io/clone-from-dir is incompatible with fork-from \"vk-src\""
    );
}

#[test]
fn bring_up_path_first_match_wins() {
    let run = VmSpec {
        mode: Some(Mode::Run),
        ..spec()
    };
    let fork_run = VmSpec {
        fork_from: "src".into(),
        mode: Some(Mode::Run),
        ..spec()
    };
    assert_eq!(bring_up_path(&fork_run, true, None), Ok(BringUp::Restore));
    assert_eq!(
        bring_up_path(&spec(), false, Some("/d")),
        Ok(BringUp::CloneFromDir("/d".into()))
    );
    assert_eq!(
        bring_up_path(&fork_run, false, None),
        Ok(BringUp::Fork("src".into()))
    );
    assert_eq!(bring_up_path(&run, false, None), Ok(BringUp::Run));
    assert_eq!(bring_up_path(&spec(), false, None), Ok(BringUp::Clone));
    assert!(!is_cloned(&run, None));
    assert!(is_cloned(&run, Some("/d")));
    assert!(is_cloned(&spec(), None));
}

#[test]
fn restore_verdicts_follow_the_guards() {
    let found = |img: &str| Evidence::Found {
        recorded_image: img.into(),
    };
    let s = spec();
    assert_eq!(
        restore_verdict(&s, false, None, &Evidence::None),
        Verdict::FreshBoot
    );
    assert_eq!(
        restore_verdict(&s, true, None, &Evidence::None),
        Verdict::Restore
    );
    assert_eq!(
        restore_verdict(&s, false, None, &found("ubuntu:24.04")),
        Verdict::Restore
    );
    assert_eq!(
        restore_verdict(&s, false, None, &found("")),
        Verdict::Restore
    );
    let img = restore_verdict(&s, false, None, &found("debian:12"));
    assert_eq!(img.label(), Some("image_conflict"));
    assert_eq!(
        img,
        Verdict::ImageConflict("hibernate snapshot of vm vk-ns-a-0 came from image \"debian:12\" but the pod requests \"ubuntu:24.04\"; delete the hibernate tag to discard the hibernated state".into())
    );
    // The explicit path keeps the identity check ...
    assert_eq!(
        restore_verdict(&s, true, None, &found("debian:12")).label(),
        Some("image_conflict")
    );
    // ... but not the source-conflict check: a restore-marked sub-agent keeps fork-from.
    let fork = VmSpec {
        fork_from: "src".into(),
        ..spec()
    };
    assert_eq!(
        restore_verdict(&fork, true, None, &found("ubuntu:24.04")),
        Verdict::Restore
    );
    let conflict = restore_verdict(&fork, false, None, &found("ubuntu:24.04"));
    assert_eq!(conflict.label(), Some("source_conflict"));
    assert_eq!(
        restore_verdict(&s, false, Some("/d"), &found("")).label(),
        Some("source_conflict")
    );
}

#[test]
fn backend_assertion() {
    use Backend::*;
    assert!(assert_snapshot_backend("s", "", Some(Firecracker)).is_ok());
    assert!(assert_snapshot_backend("s", "cloud-hypervisor", None).is_ok());
    assert!(assert_snapshot_backend("s", "firecracker", Some(Firecracker)).is_ok());
    assert_eq!(
        assert_snapshot_backend("s", "cloud-hypervisor", Some(Firecracker)).unwrap_err(),
        "snapshot s was taken with cloud-hypervisor but CocoonSet requests firecracker"
    );
    assert!(assert_snapshot_backend("s", "firecracker", Some(CloudHypervisor)).is_err());
}

#[test]
fn cpu_policy_table() {
    let r = |req: Option<u64>, lim: Option<u64>| PodResources {
        request_milli: req,
        limit_milli: lim,
        memory: String::new(),
    };
    let cases = [
        (r(Some(500), Some(2000)), (20, 200_000, 100_000)),
        (r(None, Some(1000)), (39, 100_000, 100_000)),
        (r(Some(2000), None), (79, 0, 0)),
        (r(None, Some(5)), (1, 1000, 100_000)),
        (r(None, None), (1, 0, 0)),
    ];
    for (res, (w, q, p)) in cases {
        let pol = res.cpu_policy();
        assert_eq!(
            (pol.weight, pol.quota_us, pol.period_us),
            (w, q, p),
            "{res:?}"
        );
    }
    assert_eq!(r(Some(500), Some(1500)).vcpus(), 2);
    assert_eq!(r(Some(2500), None).vcpus(), 3);
    assert_eq!(milli_cpu(&Quantity("1.5".into())), Some(1500));
    assert_eq!(milli_cpu(&Quantity("250m".into())), Some(250));
}

#[test]
fn owed_op_table() {
    use OwedOp::*;
    let cases = [
        ((true, "ready", "", false), Hibernate),
        ((true, "creating", "", false), Hibernate),
        ((false, "ready", "", true), None),
        ((false, "failed", "running", true), None),
        ((false, "creating", "failed", true), None),
        ((false, "creating", "running", false), PostClone),
        ((false, "", "running", false), PostClone),
        ((false, "creating", "done", true), ReadyWait),
        ((false, "creating", "", true), PostClone),
        ((false, "creating", "", false), ReadyWait),
        ((false, "", "", false), None),
    ];
    for ((h, l, p, n), want) in cases {
        assert_eq!(owed_op(h, l, p, n), want, "{h} {l} {p} {n}");
    }
}

#[test]
fn vm_gone_outcomes_and_cooldown() {
    assert_eq!(
        gone_action(&InspectOutcome::NotFound),
        GoneAction::Evict("VMGone", "vm no longer exists")
    );
    assert_eq!(gone_action(&InspectOutcome::Transient), GoneAction::Recheck);
    assert_eq!(
        gone_action(&InspectOutcome::State("running".into())),
        GoneAction::Ignore
    );
    for s in ["stopped", "error", "stopped (stale)"] {
        assert_eq!(
            gone_action(&InspectOutcome::State(s.into())),
            GoneAction::Restart
        );
    }
    let now = Instant::now();
    let cd = Duration::from_secs(30);
    assert!(cooldown_allows_restart(None, now, cd));
    assert!(!cooldown_allows_restart(
        Some(now - Duration::from_secs(5)),
        now,
        cd
    ));
    assert!(cooldown_allows_restart(
        Some(now - Duration::from_secs(31)),
        now,
        cd
    ));
}

#[test]
fn post_clone_rules_and_script() {
    let s = spec();
    assert!(!post_clone_needed(&s, false));
    assert!(post_clone_needed(&s, true));
    assert!(post_clone_needed(
        &VmSpec {
            backend: Some(Backend::Firecracker),
            ..spec()
        },
        false
    ));
    assert!(post_clone_needed(
        &VmSpec {
            os: Some(Os::Windows),
            ..spec()
        },
        false
    ));
    assert_eq!(
        restore_mode(
            &VmSpec {
                os: Some(Os::Windows),
                ..spec()
            },
            "ondemand"
        ),
        "copy"
    );
    assert_eq!(restore_mode(&s, "ondemand"), "ondemand");
    assert_eq!(
        restore_mode(
            &VmSpec {
                backend: Some(Backend::Firecracker),
                ..spec()
            },
            "x"
        ),
        ""
    );
    let script = linux_fixup_script(
        "vm1",
        false,
        false,
        &[NicInfo {
            mac: "02:00:00:00:00:01".into(),
            ip: String::new(),
            prefix: 0,
            gateway: String::new(),
        }],
    );
    assert!(script.starts_with("echo 3 > /proc/sys/vm/drop_caches\necho vm1 > /etc/hostname\n"));
    assert!(script.contains("printf '[Match]\\nMACAddress=02:00:00:00:00:01\\n\\n[Network]\\nDHCP=ipv4\\n\\n[DHCPv4]\\nClientIdentifier=mac\\n' > /etc/systemd/network/10-020000000001.network"));
    assert!(script.ends_with("systemctl restart systemd-networkd"));
}

#[test]
fn stale_create_outcome_to_action() {
    use StaleCreateAction::*;
    let table = [
        (Some(StaleCreateOutcome::Collected), NameFreed, "collected"),
        (Some(StaleCreateOutcome::NotFound), NameFreed, "not-found"),
        (Some(StaleCreateOutcome::Busy), Watch, "busy"),
        (
            Some(StaleCreateOutcome::NotCreating),
            InspectAgain,
            "not-creating",
        ),
        (None, Watch, "error"),
    ];
    for (answer, action, label) in table {
        assert_eq!(stale_create_action(answer), action, "{answer:?}");
        assert_eq!(stale_create_label(answer), label, "{answer:?}");
    }
}

#[test]
fn stale_create_watcher_steps() {
    use StaleWatchStep::*;
    let state = |s: &str| InspectOutcome::State(s.into());
    let table = [
        (InspectOutcome::NotFound, Freed),
        (InspectOutcome::Transient, Retry),
        (state("running"), Adopt),
        (state("creating"), StillCreating),
        (state("created"), Orphan),
        (state("stopped"), Orphan),
        (state("stopped (stale)"), Orphan),
        (state("error"), Orphan),
    ];
    for (outcome, step) in table {
        assert_eq!(stale_watch_step(&outcome), step, "{outcome:?}");
    }
}
