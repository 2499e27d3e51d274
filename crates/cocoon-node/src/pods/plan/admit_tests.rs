//! Table tests of the CreatePod admission, row by row as `node.md` §6.1 steps 1–3 state it
//! (with the tenant isolation and host reach checks before any use of the names): which pods
//! are refused, why, with which message, and in which order the checks run.

use cocoon_api::contract::VmSpec;

use super::admit::{Found, Next, Rejection, SKIPPED, next};

/// The answers the shell would get: the claim (the resource fit), the runtime lookup of the
/// pre-assigned id, the tenant check, the host reach check, the unmanaged IP check.
struct Answers {
    fits: Result<(), (&'static str, &'static str)>,
    lookup: Result<bool, &'static str>,
    tenant: Result<(), &'static str>,
    host_reach: Result<(), &'static str>,
    unmanaged_ip: Result<(), &'static str>,
}

const ALL_PASS: Answers = Answers {
    fits: Ok(()),
    lookup: Ok(false),
    tenant: Ok(()),
    host_reach: Ok(()),
    unmanaged_ip: Ok(()),
};

/// Runs the admission as the shell does, every step as a sentence.
fn walk(spec: &VmSpec, pre_id: &str, a: &Answers) -> Vec<String> {
    let mut found = Found::default();
    let mut seen = Vec::new();
    for _ in 0..10 {
        match next("ns/a", spec, pre_id, &found) {
            Next::Skip(e) => {
                seen.push(format!("skip: {e}"));
                return seen;
            }
            Next::Claim => match a.fits {
                Ok(()) => {
                    seen.push("claim, creating".into());
                    found.claimed = true;
                }
                Err((reason, message)) => {
                    seen.push("claim refused".into());
                    found.rejected = Some(Rejection {
                        reason: reason.into(),
                        message: message.into(),
                    });
                }
            },
            Next::Reject(r) => {
                seen.push(format!("reject {}: {}", r.reason, r.message));
                return seen;
            }
            Next::LookUpPreId => {
                seen.push(format!("look up {pre_id:?}"));
                found.pre_id_known = Some(a.lookup.map_err(str::to_owned));
            }
            Next::CheckTenant { id_known } => {
                seen.push(format!("tenant check (id known: {id_known})"));
                found.tenant = Some(a.tenant.map_err(str::to_owned));
            }
            Next::CheckHostReach => {
                seen.push("host reach check".into());
                found.host_reach = Some(a.host_reach.map_err(str::to_owned));
            }
            Next::CheckUnmanagedIp => {
                seen.push("unmanaged ip check".into());
                found.unmanaged_ip = Some(a.unmanaged_ip.map_err(str::to_owned));
            }
            Next::Refuse(f) => {
                seen.push(format!("refuse {}: {}", f.reason.unwrap_or("-"), f.message));
                return seen;
            }
            Next::Admit => {
                seen.push("admit".into());
                return seen;
            }
        }
    }
    panic!("the admission did not end: {seen:?}");
}

#[test]
fn admission_table() {
    let managed = VmSpec {
        vm_name: "vk-ns-a".into(),
        managed: true,
        ..VmSpec::default()
    };
    let unmanaged = VmSpec {
        managed: false,
        ..managed.clone()
    };
    let nameless = VmSpec {
        vm_name: String::new(),
        ..managed.clone()
    };
    const TENANT: &str = "vm name vk-other is held by ns/b";
    const REACH: &str = "image https://x/disk.img is not in the run image URL allowlist";
    const IP: &str =
        "annotation vm.cocoonstack.io/ip: 10.1.2.3 is already used by another pod on this node";
    const CPU: &str =
        "Node didn't have enough resource: cpu, requested: 100000000, used: 1200, capacity: 4000";
    let rows: Vec<(&str, &VmSpec, &str, Answers, Vec<&str>)> = vec![
        (
            "no VM name: an error, counted skipped, no Event and no claim",
            &nameless,
            "",
            ALL_PASS,
            vec!["skip: pod ns/a missing vm.cocoonstack.io/name annotation"],
        ),
        (
            "managed: claimed first, then tenant isolation, then host reach",
            &managed,
            "",
            ALL_PASS,
            vec![
                "claim, creating",
                "tenant check (id known: false)",
                "host reach check",
                "admit",
            ],
        ),
        (
            "managed: a pre-assigned id is never looked up",
            &managed,
            "ext-1",
            Answers {
                lookup: Err("must not be asked"),
                ..ALL_PASS
            },
            vec![
                "claim, creating",
                "tenant check (id known: false)",
                "host reach check",
                "admit",
            ],
        ),
        (
            "unmanaged: its pre-assigned id is looked up before the tenant check",
            &unmanaged,
            "ext-1",
            Answers {
                lookup: Ok(true),
                ..ALL_PASS
            },
            vec![
                "claim, creating",
                "look up \"ext-1\"",
                "tenant check (id known: true)",
                "host reach check",
                "unmanaged ip check",
                "admit",
            ],
        ),
        (
            "unmanaged: its pre-assigned IP is checked last, refused as tenant isolation",
            &unmanaged,
            "ext-1",
            Answers {
                unmanaged_ip: Err(IP),
                ..ALL_PASS
            },
            vec![
                "claim, creating",
                "look up \"ext-1\"",
                "tenant check (id known: false)",
                "host reach check",
                "unmanaged ip check",
                "refuse TenantIsolationRefused: annotation vm.cocoonstack.io/ip: 10.1.2.3 is already used by another pod on this node",
            ],
        ),
        (
            "a pod that does not fit the node is rejected at the claim: nothing else is asked",
            &unmanaged,
            "ext-1",
            Answers {
                fits: Err(("OutOfcpu", CPU)),
                lookup: Err("must not be asked"),
                tenant: Err("must not be asked"),
                host_reach: Err("must not be asked"),
                unmanaged_ip: Err("must not be asked"),
            },
            vec![
                "claim refused",
                "reject OutOfcpu: Node didn't have enough resource: cpu, requested: 100000000, used: 1200, capacity: 4000",
            ],
        ),
        (
            "unmanaged: a failed lookup fails the create before the tenant check",
            &unmanaged,
            "ext-1",
            Answers {
                lookup: Err("connection reset"),
                ..ALL_PASS
            },
            vec![
                "claim, creating",
                "look up \"ext-1\"",
                "refuse CreateBringUpFailed: look up pre-assigned VM id \"ext-1\": connection reset",
            ],
        ),
        (
            "a tenant refusal: TenantIsolationRefused, host reach never asked",
            &managed,
            "",
            Answers {
                tenant: Err(TENANT),
                ..ALL_PASS
            },
            vec![
                "claim, creating",
                "tenant check (id known: false)",
                "refuse TenantIsolationRefused: vm name vk-other is held by ns/b",
            ],
        ),
        (
            "a host reach refusal: TenantIsolationRefused with its message",
            &managed,
            "",
            Answers {
                host_reach: Err(REACH),
                ..ALL_PASS
            },
            vec![
                "claim, creating",
                "tenant check (id known: false)",
                "host reach check",
                "refuse TenantIsolationRefused: image https://x/disk.img is not in the run image URL allowlist",
            ],
        ),
    ];
    for (rule, spec, pre_id, answers, want) in rows {
        assert_eq!(walk(spec, pre_id, &answers), want, "{rule}");
    }
    assert_eq!(SKIPPED, ("create", "skipped", "missing_vmname"));
}
