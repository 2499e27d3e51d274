//! What follows a bring-up (`node.md` §6.1 steps 12–15, §6.9, §8.3 "Post-restore step") as
//! pure functions over what the shell ([`crate::pods::create`]) knows: whether `ready` is
//! published at once, which background step runs (the post-clone hint, or the ready-after-IP
//! wait), the hint's script, and how a timed-out IP wait fails. Nothing here does I/O.
//!
//! The rules:
//! * `ready` is published at once only without a follow-up step and unless the lifecycle
//!   already is `failed`; otherwise the status is refreshed and `ready` comes later;
//! * a CH+Windows restore or wake (its NIC was dropped and hot-added) only waits for the IP:
//!   the Windows PnP script must not run over the hot-added NIC;
//! * otherwise a fixup is needed iff the guest is Windows, the backend is Firecracker, or a
//!   NIC is static; needed → the hint (this agent never runs fixups itself), else the wait;
//! * the hint is the Windows PnP command, or the Linux script (cloud-init for a cloud image:
//!   an http(s) image, or an `overlay.qcow2` in the VM's run directory);
//! * a timed-out wait: `WakeIPWaitTimeout` for a wake or restore, `PostCloneIPWaitTimeout`
//!   for a clone, with `<wake|clone> <vm>: dhcp lease not observed within <n>s`.

use std::time::Duration;

use cocoon_api::contract::events::node as ev;
use cocoon_api::contract::{Backend, Os, VmSpec};

use super::ch_windows;
use crate::pods::rules::{self, NicInfo};

/// Which background step follows a bring-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FollowUp {
    /// Ready now.
    None,
    /// Post-restore (wake accounting).
    Restore,
    /// Post-clone (op `create`).
    Clone,
}

/// §6.1 step 15: publish `ready` now (else refresh the status; `ready` comes later).
pub(crate) fn ready_now(follow: FollowUp, failed: bool) -> bool {
    follow == FollowUp::None && !failed
}

/// The background step after a bring-up with a follow-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Background {
    /// Hint mode: write the fixup as the `post-clone-hint` annotation; `ready` follows the
    /// probe.
    Hint,
    /// Wait for the IP, then publish `ready` (`wake`: with wake accounting).
    ReadyAfterIp { wake: bool },
}

/// The post-restore (`FollowUp::Restore`) or post-clone (`FollowUp::Clone`) step of `spec`'s
/// VM; `any_static_nic`: one of its NICs has a static address.
pub(crate) fn background(spec: &VmSpec, follow: FollowUp, any_static_nic: bool) -> Background {
    let wake = follow == FollowUp::Restore;
    let needs_fixup = !(wake && ch_windows(spec)) && rules::post_clone_needed(spec, any_static_nic);
    if needs_fixup {
        Background::Hint
    } else {
        Background::ReadyAfterIp { wake }
    }
}

/// The hint's script for VM `vm`; `overlay`: the VM's run directory holds an
/// `overlay.qcow2` (a cloud image).
pub(crate) fn hint(spec: &VmSpec, vm: &str, overlay: bool, nics: &[NicInfo]) -> String {
    if spec.effective_os() == Os::Windows {
        return rules::WINDOWS_FIXUP.to_owned();
    }
    let cloud = spec.image.starts_with("http://") || spec.image.starts_with("https://") || overlay;
    rules::linux_fixup_script(vm, spec.backend == Some(Backend::Firecracker), cloud, nics)
}

/// How a timed-out IP wait fails: the Warning Event's reason and the lifecycle `failed`
/// message (also the Event's).
pub(crate) fn ip_wait_timeout(wake: bool, vm: &str, wait: Duration) -> (&'static str, String) {
    let (what, reason) = if wake {
        ("wake", ev::WAKE_IP_WAIT_TIMEOUT)
    } else {
        ("clone", ev::POST_CLONE_IP_WAIT_TIMEOUT)
    };
    (
        reason,
        format!(
            "{what} {vm}: dhcp lease not observed within {}s",
            wait.as_secs()
        ),
    )
}
