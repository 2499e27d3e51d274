//! The admission of a CreatePod (`node.md` §6.1 steps 1–3, with this agent's tenant isolation
//! and host reach checks) as a pure planner: from what was found so far it says the next
//! thing to do — skip the pod, claim it, look up or check something, refuse it, or admit it —
//! so the shell ([`crate::pods::create`]) runs the checks in the planner's order and stops at
//! the first refusal. Nothing here does I/O.
//!
//! The rules:
//! * an empty VM name → the error `pod <ns>/<name> missing vm.cocoonstack.io/name annotation`,
//!   counted `{create,skipped,missing_vmname}`, with no Event and without tracking the pod;
//! * otherwise the pod is claimed first (tracked with no VM, lifecycle `creating`), so every
//!   later refusal is a failCreate of this incarnation; the claim is also the kubelet's
//!   resource admission ([`crate::pods::resources`]): the shell claims the pod only if its
//!   requests fit the node's allocatable next to the pods it already tracks (decided and
//!   claimed under one lock); a pod that does not fit is rejected as a kubelet rejects it
//!   (phase `Failed`, reason `OutOfcpu`…, a Warning Event), holding nothing, before any
//!   runtime call;
//! * an unmanaged pod's pre-assigned id is looked up in the runtime (it must not name a VM the
//!   runtime knows); a failed lookup → `CreateBringUpFailed`,
//!   `look up pre-assigned VM id "<id>": <err>`;
//! * tenant isolation, then host reach, each refusing with `TenantIsolationRefused` and the
//!   check's own message, before any runtime, registry or by-name-index use of the names;
//! * an unmanaged pod's pre-assigned IP last ([`crate::pods::unmanaged_ip`]: in the node's
//!   `VK_UNMANAGED_IP_CIDRS`, used by no other pod), refusing with `TenantIsolationRefused`;
//!   the shell admits the pod in the same lock as it checks, so two pods never both get one
//!   IP (an empty IP passes here and is refused as missing by the mode dispatch);
//! * only then is the pod admitted (a holder of its VM name).

use cocoon_api::contract::VmSpec;
use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::events::node as ev;
use cocoon_api::contract::metrics::node as m;

use super::StepFailed;

/// A refusal of the resource admission (`pods::resources::fit`): the pod's `status.reason`
/// and the kubelet's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub reason: String,
    pub message: String,
}

impl Rejection {
    /// The pod's `status.message`, as the kubelet's `rejectPod` writes it.
    pub fn status_message(&self) -> String {
        format!("Pod was rejected: {}", self.message)
    }
}

/// What the admission found so far (`None`: not done yet).
#[derive(Debug, Clone, Default)]
pub(crate) struct Found {
    /// The pod is tracked with no VM and its lifecycle is `creating`.
    pub claimed: bool,
    /// The claim was refused: the pod's requests do not fit the node.
    pub rejected: Option<Rejection>,
    /// Whether the runtime knows a VM by the unmanaged pod's pre-assigned id.
    pub pre_id_known: Option<Result<bool, String>>,
    /// The tenant isolation check's verdict (the refusal's text).
    pub tenant: Option<Result<(), String>>,
    /// The host reach check's verdict (the refusal's text).
    pub host_reach: Option<Result<(), String>>,
    /// The unmanaged pod's pre-assigned IP check (the refusal's text).
    pub unmanaged_ip: Option<Result<(), String>>,
}

/// The next thing the admission does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Next {
    /// Fail with this error, without an Event, a claim or a failCreate; count
    /// `{create, skipped, missing_vmname}` (see [`SKIPPED`]).
    Skip(String),
    /// Track the pod with no VM and write lifecycle `creating`, if its requests fit the
    /// node (else record the rejection).
    Claim,
    /// Reject the pod as a kubelet does (phase `Failed`, the reason, a Warning Event); it is
    /// not tracked and nothing is retried.
    Reject(Rejection),
    /// Look the unmanaged pod's pre-assigned id up in the runtime.
    LookUpPreId,
    /// The tenant isolation check; `id_known`: the pre-assigned id names a runtime VM.
    CheckTenant { id_known: bool },
    /// The host reach check.
    CheckHostReach,
    /// The unmanaged pod's pre-assigned IP check (admitting the pod when it passes).
    CheckUnmanagedIp,
    /// failCreate (not restoring) with this.
    Refuse(StepFailed),
    /// Admit the pod: the mode dispatch ([`super::create::route`]) follows.
    Admit,
}

/// The lifecycle count of a skipped pod.
pub(crate) const SKIPPED: (&str, &str, &str) =
    (ev::OP_CREATE, m::RESULT_SKIPPED, m::REASON_MISSING_VMNAME);

/// The admission of the pod `key` with `spec` (its pre-assigned id `pre_id`), given `found`.
pub(crate) fn next(key: &str, spec: &VmSpec, pre_id: &str, found: &Found) -> Next {
    if spec.vm_name.is_empty() {
        return Next::Skip(format!("pod {key} missing {} annotation", ann::VM_NAME));
    }
    if !found.claimed {
        return match &found.rejected {
            Some(r) => Next::Reject(r.clone()),
            None => Next::Claim,
        };
    }
    let id_known = if spec.managed {
        false
    } else {
        match &found.pre_id_known {
            None => return Next::LookUpPreId,
            Some(Err(e)) => {
                return Next::Refuse(StepFailed::refused(
                    ev::CREATE_BRING_UP_FAILED,
                    format!("look up pre-assigned VM id {pre_id:?}: {e}"),
                ));
            }
            Some(Ok(known)) => *known,
        }
    };
    match &found.tenant {
        None => return Next::CheckTenant { id_known },
        Some(Err(refusal)) => return refused(refusal),
        Some(Ok(())) => {}
    }
    match &found.host_reach {
        None => return Next::CheckHostReach,
        Some(Err(refusal)) => return refused(refusal),
        Some(Ok(())) => {}
    }
    if spec.managed {
        return Next::Admit;
    }
    match &found.unmanaged_ip {
        None => Next::CheckUnmanagedIp,
        Some(Err(refusal)) => refused(refusal),
        Some(Ok(())) => Next::Admit,
    }
}

fn refused(refusal: &str) -> Next {
    Next::Refuse(StepFailed::refused(ev::TENANT_ISOLATION_REFUSED, refusal))
}
