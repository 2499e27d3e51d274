//! The grant rule as a table: caller, pods bound to its node, requested scope → granted
//! actions.

use cocoon_api::contract::checkpoint::checkpoint_artifact;
use cocoon_api::crd::checkpoint::CheckpointPhase;
use cocoon_api::naming::vm_name_for_pod;
use cocoon_registry::RegistryBase;

use super::grant::*;

fn base() -> RegistryBase {
    RegistryBase::parse("reg.example:5000/cocoon").expect("base")
}

fn pod(ns: &str, name: &str, image: Option<&str>) -> BoundPod {
    BoundPod {
        namespace: ns.into(),
        name: name.into(),
        image: image.map(str::to_owned),
        from_checkpoint: None,
    }
}

/// A forked main: bound to the node, starting from the checkpoint `ckpt` of its namespace.
fn fork_pod(ns: &str, name: &str, ckpt: &str) -> BoundPod {
    BoundPod {
        from_checkpoint: Some(ckpt.into()),
        ..pod(ns, name, Some("ubuntu:24.04"))
    }
}

fn repo(ns: &str, pod: &str) -> String {
    format!("cocoon/{}", vm_name_for_pod(ns, pod))
}

fn granted(caller: &Caller, pods: &[BoundPod], scope: &str) -> Vec<String> {
    let scopes = parse_scopes([scope]).expect("scope parses");
    let access = grant(caller, &scopes, pods, &[], &base());
    assert!(access.len() <= 1, "{access:?}");
    access.into_iter().flat_map(|a| a.actions).collect()
}

/// What, who, the pods bound to its node, the scope asked for, the actions granted.
type Row<'a> = (&'a str, &'a Caller, &'a [BoundPod], String, &'a [&'a str]);

#[test]
fn grant_table() {
    let node_a = Caller::Node("a".into());
    let on_a = [
        pod("team-a", "agent-0", Some("ubuntu-base:24.04")),
        pod("team-a", "tool", Some("vk-team-b-victim-0-123456:latest")),
    ];
    let own = repo("team-a", "agent-0");
    let other_node = repo("team-b", "victim-0");
    let rows: Vec<Row> = vec![
        (
            "a node pulls and pushes its own pod's VM repository",
            &node_a,
            &on_a,
            format!("repository:{own}:pull,push"),
            &["pull", "push"],
        ),
        (
            "a node never gets delete, even on its own VM",
            &node_a,
            &on_a,
            format!("repository:{own}:delete"),
            &[],
        ),
        (
            "* on its own VM expands to what is allowed, never to delete or *",
            &node_a,
            &on_a,
            format!("repository:{own}:*"),
            &["pull", "push"],
        ),
        (
            "a pod bound to another node: nothing",
            &node_a,
            &on_a,
            format!("repository:{other_node}:pull"),
            &[],
        ),
        (
            "the image its pods clone from: pull only",
            &node_a,
            &on_a,
            "repository:cocoon/ubuntu-base:pull,push".into(),
            &["pull"],
        ),
        (
            "a VM repository named as a pod's image: nothing",
            &node_a,
            &on_a,
            "repository:cocoon/vk-team-b-victim-0-123456:pull".into(),
            &[],
        ),
        (
            "a repository outside the prefix with a VM's name: nothing",
            &node_a,
            &on_a,
            format!("repository:{}:pull", vm_name_for_pod("team-a", "agent-0")),
            &[],
        ),
        (
            "no pods on the node: nothing",
            &node_a,
            &[],
            format!("repository:{own}:pull"),
            &[],
        ),
        (
            "the operator reads and deletes any VM repository",
            &Caller::Operator,
            &[],
            format!("repository:{other_node}:pull,push,delete"),
            &["pull", "delete"],
        ),
        (
            "the operator: nothing outside the prefix",
            &Caller::Operator,
            &[],
            "repository:elsewhere/x:pull,delete".into(),
            &[],
        ),
        (
            "the operator: not the bare prefix",
            &Caller::Operator,
            &[],
            "repository:cocoon:pull".into(),
            &[],
        ),
        (
            "anyone else: nothing",
            &Caller::Other,
            &on_a,
            format!("repository:{own}:pull"),
            &[],
        ),
        (
            "the catalog: not the operator",
            &Caller::Operator,
            &[],
            "registry:catalog:*".into(),
            &[],
        ),
        (
            "the catalog: not a node",
            &node_a,
            &on_a,
            "registry:catalog:*".into(),
            &[],
        ),
        (
            "an administrator: the catalog",
            &Caller::Admin,
            &[],
            "registry:catalog:*".into(),
            &["*"],
        ),
        (
            "an administrator pushes base images and deletes anything under the prefix",
            &Caller::Admin,
            &[],
            "repository:cocoon/ubuntu-base:pull,push,delete".into(),
            &["pull", "push", "delete"],
        ),
        (
            "an administrator: nothing outside the prefix",
            &Caller::Admin,
            &[],
            "repository:elsewhere/x:pull".into(),
            &[],
        ),
    ];
    for (what, caller, pods, scope, want) in rows {
        assert_eq!(granted(caller, pods, &scope), want, "{what}");
    }
}

#[test]
fn classify_table() {
    let g = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let who = Principals {
        operators: g(&["system:serviceaccount:cocoon-system:cocoon-operator"]),
        admin_users: g(&["bob"]),
        admin_groups: g(&["registry-admins"]),
        node_sa_namespace: "cocoon-nodes".into(),
    };
    let rows = [
        (
            "a kubelet identity",
            "system:node:vk1",
            g(&["system:nodes"]),
            Caller::Node("vk1".into()),
        ),
        (
            "system:node: without the nodes group",
            "system:node:vk1",
            g(&["system:authenticated"]),
            Caller::Other,
        ),
        (
            "a per-node ServiceAccount",
            "system:serviceaccount:cocoon-nodes:vk2",
            g(&["system:serviceaccounts"]),
            Caller::Node("vk2".into()),
        ),
        (
            "a ServiceAccount of another namespace",
            "system:serviceaccount:team-a:vk2",
            g(&[]),
            Caller::Other,
        ),
        (
            "the operator",
            "system:serviceaccount:cocoon-system:cocoon-operator",
            g(&[]),
            Caller::Operator,
        ),
        ("a user", "alice", g(&["system:masters"]), Caller::Other),
        ("an administrator by name", "bob", g(&[]), Caller::Admin),
        (
            "an administrator by group",
            "carol",
            g(&["registry-admins"]),
            Caller::Admin,
        ),
    ];
    for (what, user, groups, want) in rows {
        assert_eq!(classify(user, &groups, &who), want, "{what}");
    }
}

#[test]
fn scopes_parse_like_docker_sends_them() {
    let s = parse_scopes([
        "repository:cocoon/vk-a:pull,push",
        "repository:x/y:pull registry:catalog:*",
    ])
    .expect("parses");
    assert_eq!(s.len(), 3);
    assert_eq!(s[0].name, "cocoon/vk-a");
    assert_eq!(
        s[0].actions.iter().copied().collect::<Vec<_>>(),
        [Action::Pull, Action::Push]
    );
    assert_eq!(s[2].kind, "registry");
    // A resource class is dropped from the type; unknown actions are never granted.
    let s = parse_scope("repository(plugin):p:pull,frobnicate").expect("parses");
    assert_eq!((s.kind.as_str(), s.actions.len()), ("repository", 1));
    assert!(matches!(
        parse_scope("repository"),
        Err(ScopeError::Malformed(_))
    ));
    assert!(matches!(
        parse_scope(&format!("repository:{}:pull", "a".repeat(600))),
        Err(ScopeError::TooLong)
    ));
    let many = vec!["repository:a:pull"; MAX_SCOPES + 1];
    assert_eq!(parse_scopes(many), Err(ScopeError::TooMany));
}

#[test]
fn image_repository_table() {
    for (image, want) in [
        ("ubuntu:24.04", Some("ubuntu")),
        ("ubuntu", Some("ubuntu")),
        ("team/base:v1", Some("team/base")),
        ("team/base@sha256:abcd", Some("team/base")),
        ("https://example.com/disk.img", None),
        ("", None),
    ] {
        assert_eq!(image_repository(image), want, "{image:?}");
    }
}

#[test]
fn repeated_scopes_merge_into_one_entry() {
    let own = repo("ns", "p");
    let scopes = parse_scopes([
        format!("repository:{own}:pull").as_str(),
        format!("repository:{own}:push").as_str(),
    ])
    .expect("parses");
    let access = grant(
        &Caller::Node("n".into()),
        &scopes,
        &[pod("ns", "p", None)],
        &[],
        &base(),
    );
    assert_eq!(access.len(), 1);
    assert_eq!(access[0].actions, ["pull", "push"]);
}

fn ckpt(ns: &str, name: &str, uid: &str, node: &str, phase: CheckpointPhase) -> CheckpointFact {
    CheckpointFact {
        namespace: ns.into(),
        name: name.into(),
        uid: uid.into(),
        node: node.into(),
        phase: Some(phase),
    }
}

/// The registry-relative repository of checkpoint `<ns>/<name>` of UID `uid`.
fn ckpt_repo(ns: &str, name: &str, uid: &str) -> String {
    checkpoint_artifact(ns, name, uid)
        .expect("derives")
        .repository
}

/// What, the pods bound to node `a`, the checkpoints, the scope asked, the actions granted.
type CkptRow<'a> = (
    &'a str,
    Vec<BoundPod>,
    Vec<CheckpointFact>,
    String,
    &'a [&'a str],
);

#[test]
fn checkpoint_grant_table() {
    use CheckpointPhase::*;
    let node_a = Caller::Node("a".into());
    let mine = ckpt_repo("team-a", "snap", "uid-1");
    let mine_wire = format!("cocoon/{mine}");
    let theirs = ckpt_repo("team-a", "snap", "uid-1");
    let rows: Vec<CkptRow> = vec![
        (
            "the node of a Pending checkpoint pulls and pushes its derived repository",
            vec![],
            vec![ckpt("team-a", "snap", "uid-1", "a", Pending)],
            format!("repository:{mine_wire}:pull,push"),
            &["pull", "push"],
        ),
        (
            "… while Saving",
            vec![],
            vec![ckpt("team-a", "snap", "uid-1", "a", Saving)],
            format!("repository:{mine_wire}:pull,push"),
            &["pull", "push"],
        ),
        (
            "… while Pushing; never delete",
            vec![],
            vec![ckpt("team-a", "snap", "uid-1", "a", Pushing)],
            format!("repository:{mine_wire}:pull,push,delete"),
            &["pull", "push"],
        ),
        (
            "a Ready checkpoint: its node pushes no more",
            vec![],
            vec![ckpt("team-a", "snap", "uid-1", "a", Ready)],
            format!("repository:{mine_wire}:pull,push"),
            &[],
        ),
        (
            "a Failed checkpoint: nothing",
            vec![],
            vec![ckpt("team-a", "snap", "uid-1", "a", Failed)],
            format!("repository:{mine_wire}:push"),
            &[],
        ),
        (
            "a checkpoint whose status names another node: nothing",
            vec![],
            vec![ckpt("team-a", "snap", "uid-1", "b", Saving)],
            format!("repository:{mine_wire}:pull,push"),
            &[],
        ),
        (
            "a checkpoint with no node yet: nothing",
            vec![],
            vec![ckpt("team-a", "snap", "uid-1", "", Pending)],
            format!("repository:{mine_wire}:pull,push"),
            &[],
        ),
        (
            "a re-created checkpoint (new UID) derives another repository: the old one is not granted",
            vec![],
            vec![ckpt("team-a", "snap", "uid-2", "a", Saving)],
            format!("repository:{mine_wire}:push"),
            &[],
        ),
        (
            "the checkpoint repository outside the prefix: nothing",
            vec![],
            vec![ckpt("team-a", "snap", "uid-1", "a", Saving)],
            format!("repository:{mine}:push"),
            &[],
        ),
        (
            "a pod whose image is a Ready checkpoint of its own namespace pulls it",
            vec![pod("team-a", "fork-0", Some(&format!("{mine}:checkpoint")))],
            vec![ckpt("team-a", "snap", "uid-1", "z", Ready)],
            format!("repository:{mine_wire}:pull,push"),
            &["pull"],
        ),
        (
            "attack: a pod of namespace B naming namespace A's Ready checkpoint as its image",
            vec![pod(
                "team-b",
                "thief-0",
                Some(&format!("{theirs}:checkpoint")),
            )],
            vec![ckpt("team-a", "snap", "uid-1", "z", Ready)],
            format!("repository:{mine_wire}:pull"),
            &[],
        ),
        (
            "attack: a pod naming a checkpoint repository no checkpoint derives",
            vec![pod(
                "team-b",
                "thief-0",
                Some("ckpt-team-b-x-0123456789ab:checkpoint"),
            )],
            vec![],
            "repository:cocoon/ckpt-team-b-x-0123456789ab:pull".into(),
            &[],
        ),
        (
            "a forked main pulls the Ready checkpoint of its namespace its annotation names",
            vec![fork_pod("team-a", "fork-0", "snap")],
            vec![ckpt("team-a", "snap", "uid-1", "z", Ready)],
            format!("repository:{mine_wire}:pull,push"),
            &["pull"],
        ),
        (
            "… not before it is Ready",
            vec![fork_pod("team-a", "fork-0", "snap")],
            vec![ckpt("team-a", "snap", "uid-1", "z", Pushing)],
            format!("repository:{mine_wire}:pull"),
            &[],
        ),
        (
            "attack: a pod of namespace B whose annotation names A's checkpoint",
            vec![fork_pod("team-b", "thief-0", "snap")],
            vec![ckpt("team-a", "snap", "uid-1", "z", Ready)],
            format!("repository:{mine_wire}:pull"),
            &[],
        ),
        (
            "attack: an annotation naming another checkpoint of the namespace gets only that one",
            vec![fork_pod("team-a", "fork-0", "other")],
            vec![
                ckpt("team-a", "snap", "uid-1", "z", Ready),
                ckpt("team-a", "other", "uid-9", "z", Ready),
            ],
            format!("repository:{mine_wire}:pull"),
            &[],
        ),
        (
            "a pod naming its namespace's checkpoint before it is Ready: nothing",
            vec![pod("team-a", "fork-0", Some(&format!("{mine}:checkpoint")))],
            vec![ckpt("team-a", "snap", "uid-1", "z", Pushing)],
            format!("repository:{mine_wire}:pull"),
            &[],
        ),
        (
            "a pod's ordinary image is still pulled with checkpoints around",
            vec![pod("team-a", "agent-0", Some("ubuntu-base:24.04"))],
            vec![ckpt("team-a", "snap", "uid-1", "a", Saving)],
            "repository:cocoon/ubuntu-base:pull".into(),
            &["pull"],
        ),
    ];
    for (what, pods, ckpts, scope, want) in rows {
        let scopes = parse_scopes([scope.as_str()]).expect("scope parses");
        let got: Vec<String> = grant(&node_a, &scopes, &pods, &ckpts, &base())
            .into_iter()
            .flat_map(|a| a.actions)
            .collect();
        assert_eq!(got, want, "{what}");
    }
    // Neither the operator nor anyone else gains through a checkpoint.
    let ck = [ckpt("team-a", "snap", "uid-1", "a", Saving)];
    let scopes = parse_scopes([format!("repository:{mine_wire}:push").as_str()]).expect("parses");
    assert!(grant(&Caller::Operator, &scopes, &[], &ck, &base()).is_empty());
    assert!(grant(&Caller::Other, &scopes, &[], &ck, &base()).is_empty());
}
