//! Table tests of what follows a bring-up, row by row as `node.md` §6.1 steps 12–15, §6.9
//! and §8.3 ("Post-restore step") state it.

use std::time::Duration;

use cocoon_api::contract::{Backend, Os, VmSpec};

use super::follow_up::{Background, FollowUp, background, hint, ip_wait_timeout, ready_now};
use crate::pods::rules::{NicInfo, WINDOWS_FIXUP};

fn spec(os: Option<Os>, backend: Option<Backend>) -> VmSpec {
    VmSpec {
        vm_name: "vk-a".into(),
        image: "img:1".into(),
        managed: true,
        os,
        backend,
        ..VmSpec::default()
    }
}

#[test]
fn ready_now_table() {
    let rows = [
        ("no follow-up → ready now", FollowUp::None, false, true),
        (
            "no follow-up, already failed → status only",
            FollowUp::None,
            true,
            false,
        ),
        (
            "a post-clone step → ready later",
            FollowUp::Clone,
            false,
            false,
        ),
        (
            "a post-restore step → ready later",
            FollowUp::Restore,
            false,
            false,
        ),
    ];
    for (rule, follow, failed, want) in rows {
        assert_eq!(ready_now(follow, failed), want, "{rule}");
    }
}

#[test]
fn background_step_table() {
    use Backend::{CloudHypervisor as Ch, Firecracker as Fc};
    use FollowUp::{Clone, Restore};
    const WAIT: Background = Background::ReadyAfterIp { wake: false };
    const WAKE_WAIT: Background = Background::ReadyAfterIp { wake: true };
    let linux_ch = spec(None, Some(Ch));
    let linux_fc = spec(None, Some(Fc));
    let win_ch = spec(Some(Os::Windows), Some(Ch));
    let win = spec(Some(Os::Windows), None);
    let rows = [
        (
            "a CH DHCP clone heals itself → wait for the IP",
            &linux_ch,
            Clone,
            false,
            WAIT,
        ),
        (
            "a clone with a static NIC → hint",
            &linux_ch,
            Clone,
            true,
            Background::Hint,
        ),
        (
            "a Firecracker clone → hint",
            &linux_fc,
            Clone,
            false,
            Background::Hint,
        ),
        (
            "a Windows clone → hint",
            &win_ch,
            Clone,
            false,
            Background::Hint,
        ),
        (
            "a CH+Windows restore → only the IP wait, with wake accounting",
            &win_ch,
            Restore,
            true,
            WAKE_WAIT,
        ),
        (
            "a Windows restore without a CH backend → hint",
            &win,
            Restore,
            false,
            Background::Hint,
        ),
        (
            "a Firecracker restore → hint",
            &linux_fc,
            Restore,
            false,
            Background::Hint,
        ),
        (
            "a CH DHCP restore → the IP wait, with wake accounting",
            &linux_ch,
            Restore,
            false,
            WAKE_WAIT,
        ),
    ];
    for (rule, s, follow, any_static, want) in rows {
        assert_eq!(background(s, follow, any_static), want, "{rule}");
    }
}

#[test]
fn hint_table() {
    let nic = NicInfo {
        mac: "02:00:00:00:00:01".into(),
        ip: String::new(),
        prefix: 0,
        gateway: String::new(),
    };
    let url = VmSpec {
        image: "https://x/disk.img".into(),
        ..spec(None, None)
    };
    let upper = VmSpec {
        image: "HTTPS://x/disk.img".into(),
        ..spec(None, None)
    };
    const CLOUD_INIT: &str = "cloud-init clean --logs --seed --configs network";
    const NETWORKD: &str = "printf '[Match]\\nMACAddress=02:00:00:00:00:01";
    let rows = [
        (
            "Windows → the PnP command",
            spec(Some(Os::Windows), None),
            true,
            WINDOWS_FIXUP,
        ),
        (
            "Linux, no cloud image → systemd-networkd files",
            spec(None, None),
            false,
            NETWORKD,
        ),
        (
            "Linux with an overlay.qcow2 → cloud-init",
            spec(None, None),
            true,
            CLOUD_INIT,
        ),
        ("Linux, an https image → cloud-init", url, false, CLOUD_INIT),
        (
            "the URL test is case-sensitive, as it was",
            upper,
            false,
            NETWORKD,
        ),
    ];
    for (rule, s, overlay, want) in rows {
        let got = hint(&s, "vk-a", overlay, std::slice::from_ref(&nic));
        assert!(got.contains(want), "{rule}: {got}");
    }
    let fc = hint(
        &spec(None, Some(Backend::Firecracker)),
        "vk-a",
        false,
        &[nic],
    );
    assert!(
        fc.contains("ip link set dev eth0 address 02:00:00:00:00:01"),
        "Firecracker sets each NIC's MAC: {fc}"
    );
}

#[test]
fn ip_wait_timeout_table() {
    let wait = Duration::from_secs(45);
    assert_eq!(
        ip_wait_timeout(true, "vk-a", wait),
        (
            "WakeIPWaitTimeout",
            "wake vk-a: dhcp lease not observed within 45s".to_owned()
        )
    );
    assert_eq!(
        ip_wait_timeout(false, "vk-a", wait),
        (
            "PostCloneIPWaitTimeout",
            "clone vk-a: dhcp lease not observed within 45s".to_owned()
        )
    );
}
