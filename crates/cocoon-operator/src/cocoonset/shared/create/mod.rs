//! The create protocol (`cocoonset.md` §7) as a step's reads and writes: every step that
//! creates a pod (the main in steps 6 and 11, the migration's recreate in step 8, the wake's
//! in step 9, the sub-agents in step 12, a toolbox in step 13) reads the VM's `:hibernate`
//! manifest first ([`Read::Manifest`]), then drops a tag the new pod could not boot over,
//! forgets the VM in the reclaim record, and marks the pod for restore as [`rules::decide`]
//! says. The pure rules are [`rules`].

use std::collections::BTreeSet;

use cocoon_api::contract::{AnnotationCodec, ReclaimRecord};
use cocoon_api::naming::Role;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use self::rules::{CreateDecision, CreateFacts, TagRead};
use crate::cocoonset::pods;
use crate::cocoonset::steps::{Answers, Effect, Observed, Read, Write, log};

pub mod rules;
#[cfg(test)]
mod rules_tests;

/// The create facts of `pod` (its role, its VM's standing in the reclaim record, restore
/// intent); [`protocol`] fills in the image and the tag read.
pub fn facts(
    o: &Observed<'_>,
    pod: &Pod,
    role: Role,
    restorable: &BTreeSet<String>,
    unconditional: bool,
) -> CreateFacts<'static> {
    let record = ReclaimRecord::from_meta(&o.cs.metadata);
    let vm = pods::vm_name(pod);
    CreateFacts {
        role,
        image: "",
        tag: TagRead::Skipped,
        recorded: record.contains_vm(vm),
        owed_restore: record.owes_restore(vm),
        cr_restorable: restorable.contains(&pod.name_any()),
        unconditional_intent: unconditional,
    }
}

/// §7 for a pod a step posts itself (the migration's and the wake's recreate): the tag read
/// it needs first, or what the protocol decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Protocol {
    /// Read the VM's `:hibernate` manifest first.
    Read(Read),
    /// The pod (marked for restore when so decided), the writes that go before its post
    /// (the image rule's tag drop, the VM leaving the record), what the read found, and the
    /// decision.
    Decided {
        pod: Box<Pod>,
        writes: Vec<Effect>,
        tag: TagRead,
        decision: CreateDecision,
    },
}

/// [`Protocol`] for `pod`: its tag read from `answers` (none for an unmanaged pod or one
/// without a VM), then [`rules::decide`].
pub fn protocol(
    answers: &Answers,
    mut pod: Pod,
    facts: CreateFacts<'static>,
    step: &'static str,
) -> Protocol {
    let vm = pods::vm_name(&pod).to_string();
    let image = pod
        .annotations()
        .get(cocoon_api::contract::annotations::IMAGE)
        .cloned()
        .unwrap_or_default();
    let tag = if !pods::is_managed(&pod) || vm.is_empty() {
        TagRead::Skipped
    } else {
        match answers.manifests.get(&vm) {
            Some(t) => t.clone(),
            None => return Protocol::Read(Read::Manifest { vm, step }),
        }
    };
    let decision = rules::decide(&CreateFacts {
        image: &image,
        tag: tag.clone(),
        ..facts
    });
    let mut writes = Vec::new();
    if decision.drop_tag {
        writes.push(
            Write::DropTag {
                vm: vm.clone(),
                tag: cocoon_api::contract::tags::HIBERNATE,
                step,
            }
            .into(),
        );
        writes.push(
            log(format!(
                "dropped the :hibernate tag of {vm}: the new pod could not boot over it"
            ))
            .into(),
        );
    }
    if decision.forget {
        writes.push(Write::ForgetVms(vec![vm]).into());
    }
    if decision.restore {
        pods::mark_restore(&mut pod);
    }
    Protocol::Decided {
        pod: Box::new(pod),
        writes,
        tag,
        decision,
    }
}

/// §7 for several pods a step creates at once (the sub-agents' fan-out): the manifest reads
/// still missing, all at once, or the writes that go before the posts (each image-rule or
/// pre-create tag drop, then the dropped VMs leaving the record in one patch) and the pods to
/// post, each marked for restore when so decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Protocols {
    Read(Vec<Read>),
    Decided { writes: Vec<Effect>, pods: Vec<Pod> },
}

/// [`Protocols`] for `jobs`, in their order.
pub fn protocols(
    answers: &Answers,
    jobs: Vec<(Pod, CreateFacts<'static>)>,
    step: &'static str,
) -> Protocols {
    let mut reads = Vec::new();
    let (mut writes, mut forget, mut pods) = (Vec::new(), Vec::new(), Vec::new());
    for (pod, facts) in jobs {
        match protocol(answers, pod, facts, step) {
            Protocol::Read(read) => reads.push(read),
            Protocol::Decided { pod, writes: w, .. } => {
                for w in w {
                    match w {
                        Effect::Write(Write::ForgetVms(vms)) => forget.extend(vms),
                        other => writes.push(other),
                    }
                }
                pods.push(*pod);
            }
        }
    }
    if !reads.is_empty() {
        return Protocols::Read(reads);
    }
    if !forget.is_empty() {
        writes.push(Write::ForgetVms(forget).into());
    }
    Protocols::Decided { writes, pods }
}
