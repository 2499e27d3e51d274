//! The roles for plugin users (manifests/users/roles.yaml) are exactly what the plugin's verbs
//! need in one namespace. The roles are applied to the real control plane; ServiceAccounts of
//! `cocoon-system` (the namespace the test environment's API server audits) are bound to them
//! by a RoleBinding in a test namespace only, and the real `kubectl-cocoon` binary runs every
//! verb as each of them:
//!
//! * as cocoon-edit every verb works (each write is checked on the object it changed; there is
//!   no operator, so the writes use `--wait=false` and each kind of wait runs once into a short
//!   `--timeout`, exit 3);
//! * as cocoon-view the reads work, and every write verb exits 1 with "forbidden" and changes
//!   nothing (the objects' resourceVersions stay);
//! * the reads outside the namespace (nodes, the operator Deployment, `registry gc`'s lists of
//!   every namespace) are refused, and the verbs degrade as documented;
//! * the audit log then shows that every request either role made in the namespace was
//!   allowed, that every (resource, verb) the role grants was called, and that nothing else
//!   was refused;
//! * through the aggregation labels, a ServiceAccount bound to the built-in `edit` may patch a
//!   CocoonSet with the plugin and one bound to `view` may read but not patch; `admin` gains
//!   cocoon-edit's rules (the test environment's kube-controller-manager runs every controller,
//!   the ClusterRole aggregation controller among them).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use cocoon_api::crd::checkpoint::CocoonCheckpoint;
use cocoon_api::crd::hibernation::{CocoonHibernation, Desire};
use cocoon_api::crd::set::{CocoonSet, CocoonSetSpec};
use cocoon_testenv::unique_name;
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, RoleBinding, RoleRef, Subject};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// (API group, resource, verb).
type Grant = (String, String, String);
/// (API group, resource, verb, where): where is "ns" for the test namespace, "cluster" for a
/// cluster-scoped or all-namespaces request, else the namespace.
type Call = (String, String, String, String);

const WAIT: Duration = Duration::from_secs(60);
const SA_NAMESPACE: &str = "cocoon-system";
const GROUP: &str = "cocoonset.cocoonstack.io";
const SET: &str = "demo";
const POD: &str = "demo-0";

fn roles_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../manifests/users/roles.yaml")
}

fn shipped_roles() -> BTreeMap<String, ClusterRole> {
    let text = std::fs::read_to_string(roles_file()).expect("manifests/users/roles.yaml");
    let roles: Vec<ClusterRole> = serde_saphyr::from_multiple(&text).expect("ClusterRoles");
    roles.into_iter().map(|r| (r.name_any(), r)).collect()
}

/// Every (group, resource, verb) a role's rules grant.
fn grants(role: &ClusterRole) -> BTreeSet<Grant> {
    let mut out = BTreeSet::new();
    for rule in role.rules.iter().flatten() {
        for g in rule.api_groups.iter().flatten() {
            for r in rule.resources.iter().flatten() {
                for v in &rule.verbs {
                    out.insert((g.clone(), r.clone(), v.clone()));
                }
            }
        }
    }
    out
}

fn grant(g: &str, r: &str, v: &str) -> Grant {
    (g.into(), r.into(), v.into())
}

fn call(g: &str, r: &str, v: &str, scope: &str) -> Call {
    (g.into(), r.into(), v.into(), scope.into())
}

fn in_ns(grants: &BTreeSet<Grant>) -> BTreeSet<Call> {
    grants
        .iter()
        .map(|(g, r, v)| (g.clone(), r.clone(), v.clone(), "ns".into()))
        .collect()
}

/// The writes cocoon-edit adds to cocoon-view: full write on both kinds, as aggregated
/// edit/admin roles give on a namespace's own resources.
fn edit_writes() -> BTreeSet<Grant> {
    let mut out = BTreeSet::new();
    for r in KINDS {
        for v in ["create", "update", "patch", "delete", "deletecollection"] {
            out.insert(grant(GROUP, r, v));
        }
    }
    // kubectl scale: patch, and update with --current-replicas.
    for v in ["update", "patch"] {
        out.insert(grant(GROUP, "cocoonsets/scale", v));
    }
    out
}

/// The three kinds, by resource.
const KINDS: [&str; 3] = ["cocoonsets", "cocoonhibernations", "cocooncheckpoints"];
/// The checkpoint cocoon-edit takes of the set (no operator: it stays without a status).
const CKPT: &str = "good";

fn sample_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../manifests/samples/{name}"))
}

/// The requests outside the namespace that the verbs make and that a RoleBinding of either
/// role does not allow: pin/migrate and report read the node, completion lists nodes, version
/// and report read the operator Deployment, registry gc lists CocoonSets of every namespace.
fn outside_reads() -> BTreeSet<Call> {
    BTreeSet::from([
        call("", "nodes", "get", "cluster"),
        call("", "nodes", "list", "cluster"),
        call("apps", "deployments", "get", SA_NAMESPACE),
        call(GROUP, "cocoonsets", "list", "cluster"),
    ])
}

/// The shipped roles: no wildcard anywhere, only the namespaced resources the plugin touches,
/// cocoon-view only reads, cocoon-edit is cocoon-view plus full write on both kinds, and the
/// aggregation labels put cocoon-view into view and cocoon-edit into edit and admin.
#[test]
fn shipped_roles_have_no_wildcard_and_view_only_reads() {
    let roles = shipped_roles();
    assert_eq!(
        roles.keys().map(String::as_str).collect::<Vec<_>>(),
        ["cocoon-edit", "cocoon-view"]
    );
    let namespaced = [
        "cocoonsets",
        "cocoonsets/scale",
        "cocoonhibernations",
        "cocooncheckpoints",
        "pods",
        "pods/log",
        "events",
    ];
    for (name, role) in &roles {
        assert!(role.aggregation_rule.is_none(), "{name}: rules of its own");
        let rules = role.rules.as_deref().unwrap_or_default();
        assert!(!rules.is_empty(), "{name} has rules");
        for rule in rules {
            let words = rule
                .api_groups
                .iter()
                .flatten()
                .chain(rule.resources.iter().flatten())
                .chain(&rule.verbs)
                .chain(rule.resource_names.iter().flatten());
            for w in words {
                assert!(!w.contains('*'), "{name}: wildcard {w:?} in {rule:?}");
            }
            assert!(rule.non_resource_urls.is_none(), "{name}: {rule:?}");
            for r in rule.resources.iter().flatten() {
                assert!(
                    namespaced.contains(&r.as_str()),
                    "{name}: {r} is not a namespaced resource the plugin uses"
                );
            }
        }
    }
    let view = grants(&roles["cocoon-view"]);
    let edit = grants(&roles["cocoon-edit"]);
    for (g, r, v) in &view {
        assert!(
            matches!(v.as_str(), "get" | "list" | "watch"),
            "cocoon-view grants {v} on {g}/{r}"
        );
    }
    assert!(view.is_subset(&edit), "cocoon-edit includes cocoon-view");
    assert_eq!(
        edit.difference(&view).cloned().collect::<BTreeSet<_>>(),
        edit_writes()
    );
    let label = |role: &str, to: &str| {
        roles[role]
            .labels()
            .get(&format!("rbac.authorization.k8s.io/aggregate-to-{to}"))
            .cloned()
    };
    assert_eq!(label("cocoon-view", "view").as_deref(), Some("true"));
    assert_eq!(label("cocoon-edit", "edit").as_deref(), Some("true"));
    assert_eq!(label("cocoon-edit", "admin").as_deref(), Some("true"));
    assert_eq!(
        label("cocoon-view", "edit"),
        None,
        "edit gets reads from cocoon-edit"
    );
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// One ServiceAccount of cocoon-system, bound in the test namespace to one ClusterRole.
struct User {
    role: &'static str,
    name: String,
    kubeconfig: PathBuf,
    ns: String,
    /// The test environment's `kubectl`.
    kubectl: PathBuf,
}

impl User {
    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_kubectl-cocoon"));
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["-n", &self.ns])
            .args(args);
        cmd.env_remove("KUBECONFIG").env("NO_COLOR", "1");
        cmd.stdin(Stdio::null());
        cmd
    }

    async fn run(&self, args: &[&str]) -> Output {
        self.command(args)
            .output()
            .await
            .expect("run kubectl-cocoon")
    }

    /// Runs the test environment's `kubectl` as this user in its namespace, with `stdin`.
    async fn kubectl(&self, args: &[&str], stdin: &str) -> Output {
        use tokio::io::AsyncWriteExt;
        let mut cmd = tokio::process::Command::new(self.kubectl.clone());
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["-n", &self.ns])
            .args(args)
            .env_remove("KUBECONFIG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("run kubectl");
        let mut input = child.stdin.take().expect("stdin");
        input
            .write_all(stdin.as_bytes())
            .await
            .expect("kubectl stdin");
        drop(input);
        child.wait_with_output().await.expect("kubectl output")
    }

    /// `kubectl args` (with `stdin`) exits 0, or, when `ok` is false, is refused (`Forbidden`).
    async fn kubectl_expect(&self, args: &[&str], stdin: &str, ok: bool) -> Output {
        let out = self.kubectl(args, stdin).await;
        let err = text(&out.stderr);
        if ok {
            assert!(
                out.status.success(),
                "kubectl {} as {}: {err}",
                args.join(" "),
                self.role
            );
        } else {
            assert!(
                !out.status.success() && err.contains("forbidden"),
                "kubectl {} as {} must be forbidden: {err}",
                args.join(" "),
                self.role
            );
        }
        out
    }

    /// Runs `args` and expects `code`, naming the role, the command and what it printed.
    async fn expect(&self, args: &[&str], code: i32) -> Output {
        let out = self.run(args).await;
        assert_eq!(
            out.status.code(),
            Some(code),
            "{} as {}: exit code\nstdout: {}\nstderr: {}",
            args.join(" "),
            self.role,
            text(&out.stdout),
            text(&out.stderr)
        );
        out
    }

    /// A write the role does not allow: exit 1, "forbidden".
    async fn refused(&self, args: &[&str]) {
        let out = self.expect(args, 1).await;
        assert!(
            text(&out.stderr).contains("forbidden"),
            "{} as {}: {}",
            args.join(" "),
            self.role,
            text(&out.stderr)
        );
    }

    /// `args` runs to `code` without any request being refused.
    async fn allowed(&self, args: &[&str], code: i32) -> Output {
        let out = self.expect(args, code).await;
        assert!(
            !text(&out.stderr).contains("forbidden"),
            "{} as {}: {}",
            args.join(" "),
            self.role,
            text(&out.stderr)
        );
        out
    }
}

async fn bind(
    env: &cocoon_testenv::Shared,
    admin: &kube::Client,
    ns: &str,
    who: &str,
    role: &'static str,
    dir: &Path,
) -> Result<User, BoxError> {
    let sa = unique_name(&format!("roles-{who}"));
    Api::<ServiceAccount>::namespaced(admin.clone(), SA_NAMESPACE)
        .create(
            &PostParams::default(),
            &ServiceAccount {
                metadata: ObjectMeta {
                    name: Some(sa.clone()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await?;
    Api::<RoleBinding>::namespaced(admin.clone(), ns)
        .create(
            &PostParams::default(),
            &RoleBinding {
                metadata: ObjectMeta {
                    name: Some(sa.clone()),
                    ..Default::default()
                },
                role_ref: RoleRef {
                    api_group: "rbac.authorization.k8s.io".into(),
                    kind: "ClusterRole".into(),
                    name: role.into(),
                },
                subjects: Some(vec![Subject {
                    kind: "ServiceAccount".into(),
                    name: sa.clone(),
                    namespace: Some(SA_NAMESPACE.into()),
                    ..Default::default()
                }]),
            },
        )
        .await?;
    let kubeconfig = env.service_account_kubeconfig(SA_NAMESPACE, &sa, "1h", dir)?;
    Ok(User {
        role,
        name: format!("system:serviceaccount:{SA_NAMESPACE}:{sa}"),
        kubeconfig,
        ns: ns.to_string(),
        kubectl: env.bin_dir().join("kubectl"),
    })
}

/// Applies the shipped roles. The tests of this file run side by side on one control plane,
/// and two first `kubectl apply`s race (one creates, the other's create then conflicts), so
/// the apply is retried until it goes through.
async fn apply_roles(env: &cocoon_testenv::Shared) -> Result<(), BoxError> {
    let mut last = String::new();
    let applied = cocoon_testenv::wait_until("the roles applied", WAIT, || {
        let out = env
            .kubectl()
            .args(["apply", "-f"])
            .arg(roles_file())
            .output();
        let ok = match out {
            Ok(o) if o.status.success() => true,
            Ok(o) => {
                last = text(&o.stderr);
                false
            }
            Err(e) => {
                last = e.to_string();
                false
            }
        };
        async move { ok.then_some(()) }
    })
    .await;
    applied.map_err(|e| format!("{e}: {last}").into())
}

/// Waits until `args` as `user` exits 0: the binding is in force (RBAC caches take a moment).
async fn wait_allowed(user: &User, args: &[&str]) -> Result<(), BoxError> {
    let what = format!("{} as {} allowed", args.join(" "), user.role);
    let last = cocoon_testenv::wait_until(&what, WAIT, || async {
        let out = user.run(args).await;
        out.status.success().then_some(())
    })
    .await;
    if last.is_err() {
        let out = user.run(args).await;
        return Err(format!("{what}: still refused: {}", text(&out.stderr)).into());
    }
    Ok(())
}

/// The resourceVersions of the set and of the pod's CocoonHibernation (if any).
async fn versions(
    sets: &Api<CocoonSet>,
    chs: &Api<CocoonHibernation>,
) -> Result<(Option<String>, Option<String>), BoxError> {
    Ok((
        sets.get(SET).await?.resource_version(),
        chs.get_opt(POD).await?.and_then(|c| c.resource_version()),
    ))
}

/// A sample (manifests/samples/FILE) as JSON, renamed to `name` (a CocoonHibernation's
/// podRef too) and labelled `roles-crud=1`; no FILE is a CocoonCheckpoint of the set.
fn renamed_sample(file: &str, name: &str) -> Result<String, BoxError> {
    let mut v: Value = if file.is_empty() {
        json!({"apiVersion": "cocoonset.cocoonstack.io/v1", "kind": "CocoonCheckpoint",
               "metadata": {}, "spec": {"source": {"cocoonSetRef": {"name": SET}}}})
    } else {
        serde_saphyr::from_str(&std::fs::read_to_string(sample_file(file))?)?
    };
    v["metadata"]["name"] = json!(name);
    v["metadata"]["labels"] = json!({"roles-crud": "1"});
    if v["kind"] == "CocoonHibernation" {
        v["spec"]["podRef"]["name"] = json!(name);
    }
    Ok(v.to_string())
}

/// The object writes of `kubectl` (create, replace, delete) and a delete-collection, on the
/// three kinds, as `user`: all go through when `ok`, else each is refused and nothing changes.
/// `existing` names an object of each kind for the refused replace and delete. A checkpoint
/// is also labelled (a patch: its spec cannot change, its metadata can).
async fn object_writes(user: &User, ok: bool, existing: [&str; 3]) -> Result<(), BoxError> {
    let client = cocoon_testenv::client_for(&user.kubeconfig).await?;
    let samples = [
        ("cocoonset.yaml", "crud", "cocoonset"),
        ("cocoonhibernation.yaml", "crud-0", "cocoonhibernation"),
        ("", "crud-ckpt", "cocooncheckpoint"),
    ];
    for ((file, name, kind), there) in samples.into_iter().zip(existing) {
        let object = renamed_sample(file, name)?;
        user.kubectl_expect(&["create", "-f", "-"], &object, ok)
            .await;
        // update: the object as read, replaced (with its resourceVersion).
        let target = if ok { name } else { there };
        let read = user
            .kubectl_expect(&["get", kind, target, "-o", "json"], "", true)
            .await;
        user.kubectl_expect(&["replace", "-f", "-"], &text(&read.stdout), ok)
            .await;
        if kind == "cocooncheckpoint" {
            user.kubectl_expect(
                &["label", kind, target, "roles-touched=1", "--overwrite"],
                "",
                ok,
            )
            .await;
        }
        user.kubectl_expect(&["delete", kind, target, "--wait=false"], "", ok)
            .await;
        if ok {
            user.kubectl_expect(&["create", "-f", "-"], &object, true)
                .await;
        }
        let lp = kube::api::ListParams::default().labels("roles-crud=1");
        let dp = DeleteParams::default();
        let collected = if kind == "cocoonset" {
            Api::<CocoonSet>::namespaced(client.clone(), &user.ns)
                .delete_collection(&dp, &lp)
                .await
                .map(|_| ())
        } else if kind == "cocooncheckpoint" {
            Api::<CocoonCheckpoint>::namespaced(client.clone(), &user.ns)
                .delete_collection(&dp, &lp)
                .await
                .map(|_| ())
        } else {
            Api::<CocoonHibernation>::namespaced(client.clone(), &user.ns)
                .delete_collection(&dp, &lp)
                .await
                .map(|_| ())
        };
        match (ok, collected) {
            (true, Ok(())) => {}
            (false, Err(kube::Error::Api(e))) if e.code == 403 => {}
            (ok, other) => panic!(
                "delete-collection of {kind} as {} (ok={ok}): {other:?}",
                user.role
            ),
        }
    }
    Ok(())
}

/// `kubectl scale cocoonset/demo` (issue 36 item 6) as `user`: a patch of the scale, then an
/// update of it (`--current-replicas` reads it first); both go through when `ok` and set
/// `spec.agent.replicas`, else each is refused and nothing changes.
async fn scale_writes(user: &User, sets: &Api<CocoonSet>, ok: bool) -> Result<(), BoxError> {
    let target = format!("cocoonset/{SET}");
    let current = sets.get(SET).await?.spec.agent.replicas;
    let wanted = if ok { 3 } else { current + 5 };
    user.kubectl_expect(&["scale", &target, &format!("--replicas={wanted}")], "", ok)
        .await;
    let now = sets.get(SET).await?.spec.agent.replicas;
    assert_eq!(
        now,
        if ok { wanted } else { current },
        "scale as {}",
        user.role
    );
    user.kubectl_expect(
        &[
            "scale",
            &target,
            &format!("--current-replicas={now}"),
            &format!("--replicas={}", now + 1),
        ],
        "",
        ok,
    )
    .await;
    let after = sets.get(SET).await?.spec.agent.replicas;
    assert_eq!(
        after,
        if ok { now + 1 } else { now },
        "scale --current-replicas as {}",
        user.role
    );
    Ok(())
}

/// The calls `user` made, split into allowed and refused (403), keyed by where they went.
fn calls(
    log: &cocoon_testenv::AuditLog,
    user: &str,
    ns: &str,
) -> Result<(BTreeSet<Call>, BTreeSet<Call>), BoxError> {
    let mut allowed = BTreeSet::new();
    let mut refused = BTreeSet::new();
    for r in log.records_of(user)? {
        let scope = match r.namespace.as_str() {
            "" => "cluster".to_string(),
            n if n == ns => "ns".to_string(),
            n => n.to_string(),
        };
        let c = (r.api_group, r.resource, r.verb, scope);
        if r.code == 403 {
            refused.insert(c);
        } else {
            allowed.insert(c);
        }
    }
    Ok((allowed, refused))
}

/// Waits until the audit log shows exactly `allowed` and `refused` for `user` (the watches are
/// recorded when they end), else fails with the differences.
async fn expect_audit(
    log: &cocoon_testenv::AuditLog,
    user: &User,
    want_allowed: &BTreeSet<Call>,
    want_refused: &BTreeSet<Call>,
) -> Result<(), BoxError> {
    let seen = cocoon_testenv::wait_until(
        &format!("the audited calls of {}", user.role),
        WAIT,
        || async {
            let (a, r) = calls(log, &user.name, &user.ns).ok()?;
            (&a == want_allowed && &r == want_refused).then_some(())
        },
    )
    .await;
    if seen.is_err() {
        let (a, r) = calls(log, &user.name, &user.ns)?;
        let diff = |got: &BTreeSet<Call>, want: &BTreeSet<Call>| {
            format!(
                "made but not expected: {:?}; expected but not made: {:?}",
                got.difference(want).collect::<Vec<_>>(),
                want.difference(got).collect::<Vec<_>>()
            )
        };
        return Err(format!(
            "{}: allowed calls: {}\nrefused calls: {}",
            user.role,
            diff(&a, want_allowed),
            diff(&r, want_refused)
        )
        .into());
    }
    Ok(())
}

/// The read-only verbs, each with what it must print; the same for both roles.
async fn reads(
    log: &cocoon_testenv::AuditLog,
    user: &User,
    node: &str,
    dir: &Path,
) -> Result<(), BoxError> {
    let out = user.allowed(&["status"], 0).await;
    assert!(text(&out.stdout).contains(SET), "{}", text(&out.stdout));
    let out = user.allowed(&["status", SET, "-o", "json"], 0).await;
    let list: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(list["items"][0]["metadata"]["name"], SET, "{list}");
    let out = user.allowed(&["describe", SET], 0).await;
    assert!(
        text(&out.stdout).contains("Events:"),
        "{}",
        text(&out.stdout)
    );
    let out = user.allowed(&["describe", &format!("pod/{POD}")], 0).await;
    assert!(text(&out.stdout).contains(POD), "{}", text(&out.stdout));
    // The checkpoint: described, listed under the sets, waited for (no operator: a timeout).
    let out = user
        .allowed(&["describe", &format!("checkpoint/{CKPT}")], 0)
        .await;
    assert!(
        text(&out.stdout).contains(&format!("Source:       cocoonset/{SET}")),
        "{}",
        text(&out.stdout)
    );
    let out = user.allowed(&["status"], 0).await;
    assert!(
        text(&out.stdout).contains("CHECKPOINT"),
        "{}",
        text(&out.stdout)
    );
    user.allowed(
        &[
            "wait",
            &format!("checkpoint/{CKPT}"),
            "--for=Ready",
            "--timeout",
            "2s",
        ],
        3,
    )
    .await;
    let out = user.allowed(&["__completeNoDesc", "fork", ""], 0).await;
    assert!(
        text(&out.stdout).contains(&format!("{CKPT}\n")),
        "{}",
        text(&out.stdout)
    );
    // The /scale subresource reads as a Scale of the sub-agents.
    let out = user
        .kubectl_expect(
            &["get", "cocoonset", SET, "--subresource=scale", "-o", "json"],
            "",
            true,
        )
        .await;
    let scale: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(scale["kind"], "Scale", "{scale}");
    assert!(scale["spec"]["replicas"].is_i64(), "{scale}");
    // The waits read, watch and look for warnings; nothing moves without an operator.
    let out = user
        .allowed(
            &[
                "wait",
                &format!("cocoonset/{SET}"),
                "--for=Running",
                "--timeout",
                "2s",
            ],
            3,
        )
        .await;
    assert!(
        text(&out.stderr).contains("timeout"),
        "{}",
        text(&out.stderr)
    );
    user.allowed(
        &[
            "wait",
            &format!("pod/{POD}"),
            "--for=Active",
            "--timeout",
            "2s",
        ],
        3,
    )
    .await;
    // pods/log is allowed; the node behind the pod has no kubelet to answer.
    user.allowed(&["logs", SET], 1).await;
    // A client dry run of a write only reads.
    let out = user
        .allowed(&["hibernate", POD, "--dry-run=client", "-o", "json"], 0)
        .await;
    assert!(text(&out.stdout).contains(POD), "{}", text(&out.stdout));

    // report: written, with what it could not read outside the namespace noted.
    let file = dir.join(format!("{}-report.tar.gz", user.role));
    let out = user
        .expect(&["report", SET, "--file", &file.to_string_lossy()], 0)
        .await;
    assert!(file.is_file(), "report wrote {}", file.display());
    let err = text(&out.stderr);
    for part in [
        format!("nodes.yaml ({node}): skipped: forbidden (RBAC)"),
        "operator/deployment.yaml: skipped: forbidden (RBAC)".to_string(),
    ] {
        assert!(err.contains(&part), "report as {}: {err}", user.role);
    }
    for part in [
        "cocoonset.yaml",
        "pods.yaml",
        "hibernations.yaml",
        "events.yaml",
    ] {
        assert!(!err.contains(&format!("{part}: skipped")), "{part}: {err}");
    }

    // version: the operator's version is unknown (a warning says why), exit 0.
    let out = user.expect(&["version"], 0).await;
    assert!(
        text(&out.stdout).contains("Operator Version: unknown"),
        "{}",
        text(&out.stdout)
    );
    let err = text(&out.stderr);
    assert!(
        err.contains("cannot read the operator version") && err.contains("forbidden"),
        "{err}"
    );
    user.allowed(&["version", "--client"], 0).await;
    let out = user.allowed(&["completion", "bash"], 0).await;
    assert!(!out.stdout.is_empty());
    let out = user.allowed(&["__completeNoDesc", "suspend", ""], 0).await;
    assert!(
        text(&out.stdout).contains(&format!("{SET}\n")),
        "{}",
        text(&out.stdout)
    );
    let out = user.allowed(&["__completeNoDesc", "wake", ""], 0).await;
    assert!(
        text(&out.stdout).contains(&format!("{POD}\n")),
        "{}",
        text(&out.stdout)
    );
    // Node names cannot be listed: none offered, still exit 0.
    let out = user.expect(&["__completeNoDesc", "pin", SET, ""], 0).await;
    assert!(!text(&out.stdout).contains(node), "{}", text(&out.stdout));

    // registry gc reads every namespace: not for a namespace role.
    user.refused(&["registry", "gc", "--registry", "127.0.0.1:1"])
        .await;

    // status -w: the first state streams (JSON lines without a terminal).
    let mut child = user
        .command(&["status", "-w", "-o", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child.stdout.take().ok_or("status -w stdout")?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let first = tokio::time::timeout(WAIT, lines.next_line()).await;
    // Both watches are open (the audit log records a watch's start; its end, which the
    // comparison of calls reads, once the plugin is gone).
    let watching = cocoon_testenv::wait_until(
        &format!("status -w as {} watching sets and pods", user.role),
        WAIT,
        || async {
            let open = watches_started(log, &user.name);
            (open.contains("cocoonsets") && open.contains("pods")).then_some(())
        },
    )
    .await;
    child.kill().await?;
    watching?;
    let first = first
        .map_err(|_| format!("status -w as {} printed nothing", user.role))??
        .unwrap_or_default();
    assert!(first.contains(&format!("\"name\":\"{SET}\"")), "{first}");
    Ok(())
}

/// The resources `user` has started watches on (stage ResponseStarted of the audit log).
fn watches_started(log: &cocoon_testenv::AuditLog, user: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string(log.path()).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| {
            v["stage"] == "ResponseStarted" && v["verb"] == "watch" && v["user"]["username"] == user
        })
        .filter_map(|v| v["objectRef"]["resource"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test]
async fn plugin_verbs_under_cocoon_view_and_cocoon_edit() {
    cocoon_testenv::run_test(|env| async move {
        let log = env
            .audit_log()
            .ok_or("the audit log is unknown (set TESTENV_RUN_DIR for an external env)")?;
        let admin = env.client()?;
        apply_roles(env).await?;
        cocoon_testenv::ensure_namespace(&admin, SA_NAMESPACE).await?;
        let ns = cocoon_testenv::create_namespace(&admin, "roles").await?;

        // A set, its main pod on a node (a Node object only: no kubelet answers for it).
        let node = unique_name("roles-node");
        let nodes: Api<Node> = Api::all(admin.clone());
        nodes
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": node}}))?,
            )
            .await?;
        let sets: Api<CocoonSet> = Api::namespaced(admin.clone(), &ns);
        let chs: Api<CocoonHibernation> = Api::namespaced(admin.clone(), &ns);
        sets.create(
            &PostParams::default(),
            &CocoonSet::new(SET, CocoonSetSpec::with_image("img")),
        )
        .await?;
        let vm = cocoon_api::naming::vm_name_for_pod(&ns, POD);
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": POD,
                "labels": {"cocoonset.cocoonstack.io/name": SET, "cocoonset.cocoonstack.io/role": "main", "cocoonset.cocoonstack.io/slot": "0"},
                "annotations": {"vm.cocoonstack.io/name": vm}},
            "spec": {"nodeName": node, "containers": [{"name": "agent", "image": "cocoon/placeholder"}], "restartPolicy": "Never"}
        }))?;
        Api::<Pod>::namespaced(admin.clone(), &ns)
            .create(&PostParams::default(), &pod)
            .await?;

        let tmp = tempfile::tempdir()?;
        let view = bind(env, &admin, &ns, "view", "cocoon-view", tmp.path()).await?;
        let edit = bind(env, &admin, &ns, "edit", "cocoon-edit", tmp.path()).await?;
        let builtin_view = bind(env, &admin, &ns, "bview", "view", tmp.path()).await?;
        let builtin_edit = bind(env, &admin, &ns, "bedit", "edit", tmp.path()).await?;
        wait_allowed(&view, &["status", SET]).await?;
        wait_allowed(&edit, &["suspend", SET, "--dry-run=server"]).await?;

        // cocoon-view: no write goes through, and nothing changes.
        let before = versions(&sets, &chs).await?;
        assert!(before.1.is_none(), "no CocoonHibernation yet");
        for args in [
            vec!["suspend", SET, "--wait=false"],
            vec!["suspend", SET, "--dry-run=server"],
            vec!["pin", SET, &node, "--wait=false"],
            vec!["migrate", SET, "--to", &node, "--wait=false"],
            vec!["hibernate", POD, "--wait=false"],
            vec!["wake", POD, "--wait=false"],
            vec!["checkpoint", POD, "--name", "nope", "--wait=false"],
        ] {
            view.refused(&args).await;
        }
        assert_eq!(versions(&sets, &chs).await?, before, "cocoon-view changed nothing");

        // cocoon-edit: every write verb, checked on what it wrote.
        let set = |f: fn(&CocoonSet) -> Value| {
            let sets = sets.clone();
            async move { Ok::<_, BoxError>(f(&sets.get(SET).await?)) }
        };
        let suspend = |cs: &CocoonSet| json!(cs.spec.suspend);
        let pin = |cs: &CocoonSet| {
            json!([cs.spec.node_name, cs.annotations().get("kubectl.cocoonstack.io/previous-node-name")])
        };
        edit.allowed(&["suspend", SET, "--wait=false"], 0).await;
        assert_eq!(set(suspend).await?, json!(true));
        // Already suspended: the wait (get, watch, warnings) runs into its timeout.
        edit.allowed(&["suspend", SET, "--timeout", "2s"], 3).await;
        edit.allowed(&["resume", SET, "--wait=false"], 0).await;
        assert_eq!(set(suspend).await?, json!(false));
        edit.allowed(&["suspend", SET, "--wait=false"], 0).await;
        edit.allowed(&["wake", &format!("cocoonset/{SET}"), "--wait=false"], 0).await;
        assert_eq!(set(suspend).await?, json!(false));
        // The node cannot be read through a RoleBinding: pinned unchecked, with a warning.
        let out = edit.expect(&["pin", SET, &node, "--wait=false"], 0).await;
        assert!(
            text(&out.stderr).contains(&format!("cannot check that node {node} exists")),
            "{}",
            text(&out.stderr)
        );
        assert_eq!(set(pin).await?, json!([node, "-"]));
        edit.allowed(&["unpin", SET, "--wait=false"], 0).await;
        assert_eq!(set(pin).await?, json!(["", "-"]));
        edit.expect(&["migrate", SET, "--to", &node, "--wait=false"], 0).await;
        assert_eq!(set(pin).await?, json!([node, "-"]));
        edit.allowed(&["migrate", SET, "--cancel", "--wait=false"], 0).await;
        assert_eq!(set(pin).await?, json!(["", null]));
        // The migration wait (the set and its main pod) runs into its timeout.
        edit.expect(&["migrate", SET, "--to", &node, "--timeout", "2s"], 3).await;
        assert_eq!(set(pin).await?, json!([node, "-"]));
        let desire = || {
            let chs = chs.clone();
            async move { Ok::<_, BoxError>(chs.get(POD).await?.spec.desire) }
        };
        edit.allowed(&["hibernate", POD, "--wait=false"], 0).await;
        assert_eq!(desire().await?, Desire::Hibernate, "created");
        edit.allowed(&["wake", POD, "--wait=false"], 0).await;
        assert_eq!(desire().await?, Desire::Wake, "patched");
        edit.allowed(&["hibernate", POD, "--timeout", "2s"], 3).await;
        assert_eq!(desire().await?, Desire::Hibernate);
        edit.allowed(&["suspend", SET, "--wait=false"], 0).await;
        // A checkpoint of the set: created, then one followed into its timeout (get, watch,
        // warnings); a fork of it creates a set (no operator: --wait=false).
        let ckpts: Api<CocoonCheckpoint> = Api::namespaced(admin.clone(), &ns);
        edit.allowed(&["checkpoint", &format!("cocoonset/{SET}"), "--name", CKPT, "--wait=false"], 0)
            .await;
        assert!(ckpts.get(CKPT).await?.spec.source.cocoon_set_ref.is_some(), "created");
        edit.allowed(&["checkpoint", POD, "--name", "waited", "--timeout", "2s"], 3).await;
        edit.allowed(&["fork", CKPT, "--count", "1", "--name", "forked", "--wait=false"], 0)
            .await;
        assert_eq!(
            sets.get("forked-1").await?.spec.agent.from_checkpoint.as_deref(),
            Some(CKPT)
        );
        // kubectl's own writes of the three kinds (create, replace, delete, delete-collection).
        object_writes(&edit, true, [SET, POD, CKPT]).await?;
        scale_writes(&edit, &sets, true).await?;

        // Both roles read alike.
        reads(&log, &edit, &node, tmp.path()).await?;
        reads(&log, &view, &node, tmp.path()).await?;

        // cocoon-view again, now that there is something to resume, unpin, cancel and wake.
        let before = versions(&sets, &chs).await?;
        for args in [
            vec!["resume", SET, "--wait=false"],
            vec!["wake", "cocoonset/demo", "--wait=false"],
            vec!["unpin", SET, "--wait=false"],
            vec!["migrate", SET, "--cancel", "--wait=false"],
            vec!["wake", POD, "--wait=false"],
            vec!["wake", POD, "--dry-run=server"],
            vec!["fork", CKPT, "--count", "1", "--name", "nope", "--wait=false"],
        ] {
            view.refused(&args).await;
        }
        object_writes(&view, false, [SET, POD, CKPT]).await?;
        scale_writes(&view, &sets, false).await?;
        assert_eq!(versions(&sets, &chs).await?, before, "cocoon-view changed nothing");

        // What each role called: every grant used, nothing refused but the outside reads (and,
        // for cocoon-view, the writes).
        let roles = shipped_roles();
        let edit_grants = grants(&roles["cocoon-edit"]);
        let view_grants = grants(&roles["cocoon-view"]);
        expect_audit(&log, &edit, &in_ns(&edit_grants), &outside_reads()).await?;
        let view_refused: BTreeSet<Call> =
            outside_reads().into_iter().chain(in_ns(&edit_writes())).collect();
        expect_audit(&log, &view, &in_ns(&view_grants), &view_refused).await?;

        // Aggregation: the built-in edit may now patch CocoonSets, view may read them only,
        // admin has cocoon-edit's rules.
        wait_allowed(&builtin_edit, &["resume", SET, "--dry-run=server"]).await?;
        builtin_edit.allowed(&["resume", SET, "--wait=false"], 0).await;
        assert_eq!(set(suspend).await?, json!(false), "resumed as edit");
        wait_allowed(&builtin_view, &["status", SET]).await?;
        let before = versions(&sets, &chs).await?;
        builtin_view.refused(&["suspend", SET, "--wait=false"]).await;
        assert_eq!(versions(&sets, &chs).await?, before);
        let cluster_roles: Api<ClusterRole> = Api::all(admin.clone());
        let aggregated = cocoon_testenv::wait_until(
            "admin aggregates cocoon-edit",
            WAIT,
            || async {
                let admin_role = cluster_roles.get("admin").await.ok()?;
                grants(&admin_role).is_superset(&edit_grants).then_some(())
            },
        )
        .await;
        assert!(aggregated.is_ok(), "{aggregated:?}");

        let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), SA_NAMESPACE);
        for u in [&view, &edit, &builtin_view, &builtin_edit] {
            let sa = u.name.rsplit(':').next().unwrap_or_default();
            sas.delete(sa, &DeleteParams::default()).await?;
        }
        cocoon_testenv::delete_namespace(&admin, &ns).await.ok();
        nodes.delete(&node, &DeleteParams::default()).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

/// Issue 36 item 1: a namespace editor (the built-in `edit`, bound by a RoleBinding) applies
/// the samples with `kubectl`, runs every write verb of the plugin on them and deletes them;
/// an editor of another namespace can do none of it here and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_editor_applies_the_samples_runs_the_verbs_and_deletes_them() {
    cocoon_testenv::run_test(|env| async move {
        let admin = env.client()?;
        apply_roles(env).await?;
        cocoon_testenv::ensure_namespace(&admin, SA_NAMESPACE).await?;
        let ns = cocoon_testenv::create_namespace(&admin, "editor").await?;
        let other = cocoon_testenv::create_namespace(&admin, "elsewhere").await?;
        let node = unique_name("editor-node");
        let nodes: Api<Node> = Api::all(admin.clone());
        nodes
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": node}}))?,
            )
            .await?;
        let tmp = tempfile::tempdir()?;
        let editor = bind(env, &admin, &ns, "editor", "edit", tmp.path()).await?;
        // Bound to edit in its own namespace, acting in this one.
        let mut outsider = bind(env, &admin, &other, "outsider", "edit", tmp.path()).await?;
        outsider.ns = ns.clone();

        // The aggregation controller folds cocoon-edit into edit; then the RBAC cache follows.
        let edit_grants = grants(&shipped_roles()["cocoon-edit"]);
        let cluster_roles: Api<ClusterRole> = Api::all(admin.clone());
        cocoon_testenv::wait_until("edit aggregates cocoon-edit", WAIT, || async {
            let role = cluster_roles.get("edit").await.ok()?;
            grants(&role).is_superset(&edit_grants).then_some(())
        })
        .await?;
        let set_sample = sample_file("cocoonset.yaml");
        let ch_sample = sample_file("cocoonhibernation.yaml");
        let set_file = set_sample.to_str().ok_or("sample path")?;
        let ch_file = ch_sample.to_str().ok_or("sample path")?;
        cocoon_testenv::wait_until("edit may create CocoonSets", WAIT, || async {
            let out = editor
                .kubectl(&["apply", "--dry-run=server", "-f", set_file], "")
                .await;
            out.status.success().then_some(())
        })
        .await?;

        // The samples, applied by the editor: the set `demo` and the CocoonHibernation of its
        // main pod `demo-0` (created here as the operator would, for the pod verbs).
        editor.kubectl_expect(&["apply", "-f", set_file], "", true).await;
        editor.kubectl_expect(&["apply", "-f", ch_file], "", true).await;
        let sets: Api<CocoonSet> = Api::namespaced(admin.clone(), &ns);
        let chs: Api<CocoonHibernation> = Api::namespaced(admin.clone(), &ns);
        let vm = cocoon_api::naming::vm_name_for_pod(&ns, POD);
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": POD,
                "labels": {"cocoonset.cocoonstack.io/name": SET, "cocoonset.cocoonstack.io/role": "main", "cocoonset.cocoonstack.io/slot": "0"},
                "annotations": {"vm.cocoonstack.io/name": vm}},
            "spec": {"nodeName": node, "containers": [{"name": "agent", "image": "cocoon/placeholder"}], "restartPolicy": "Never"}
        }))?;
        Api::<Pod>::namespaced(admin.clone(), &ns)
            .create(&PostParams::default(), &pod)
            .await?;
        assert_eq!(chs.get(POD).await?.spec.desire, Desire::Hibernate);

        // Every write verb of the plugin, and what it wrote.
        let suspended = || {
            let sets = sets.clone();
            async move { Ok::<_, BoxError>(sets.get(SET).await?.spec.suspend) }
        };
        let desire = || {
            let chs = chs.clone();
            async move { Ok::<_, BoxError>(chs.get(POD).await?.spec.desire) }
        };
        let ch_wake = format!("cocoonset/{SET}");
        editor.allowed(&["suspend", SET, "--wait=false"], 0).await;
        assert!(suspended().await?);
        editor.allowed(&["resume", SET, "--wait=false"], 0).await;
        assert!(!suspended().await?);
        editor.allowed(&["suspend", SET, "--wait=false"], 0).await;
        editor.allowed(&["wake", &ch_wake, "--wait=false"], 0).await;
        assert!(!suspended().await?);
        editor.expect(&["pin", SET, &node, "--wait=false"], 0).await;
        assert_eq!(sets.get(SET).await?.spec.node_name, node);
        editor.allowed(&["unpin", SET, "--wait=false"], 0).await;
        editor.expect(&["migrate", SET, "--to", &node, "--wait=false"], 0).await;
        editor.allowed(&["migrate", SET, "--cancel", "--wait=false"], 0).await;
        assert_eq!(sets.get(SET).await?.spec.node_name, "");
        editor.allowed(&["wake", POD, "--wait=false"], 0).await;
        assert_eq!(desire().await?, Desire::Wake);
        editor.allowed(&["hibernate", POD, "--wait=false"], 0).await;
        assert_eq!(desire().await?, Desire::Hibernate);
        for reads in [
            vec!["status", SET],
            vec!["describe", SET],
            vec!["describe", &format!("pod/{POD}")],
        ] {
            editor.allowed(&reads, 0).await;
        }

        // The other namespace's editor: nothing here, by kubectl or by the plugin.
        let before = versions(&sets, &chs).await?;
        for args in [
            vec!["suspend", SET, "--wait=false"],
            vec!["resume", SET, "--wait=false"],
            vec!["pin", SET, &node, "--wait=false"],
            vec!["migrate", SET, "--cancel", "--wait=false"],
            vec!["hibernate", POD, "--wait=false"],
            vec!["wake", POD, "--wait=false"],
            vec!["status", SET],
        ] {
            outsider.refused(&args).await;
        }
        for args in [
            vec!["apply", "-f", set_file],
            vec!["delete", "-f", set_file, "--wait=false"],
            vec!["delete", "-f", ch_file, "--wait=false"],
        ] {
            outsider.kubectl_expect(&args, "", false).await;
        }
        assert_eq!(versions(&sets, &chs).await?, before, "the outsider changed nothing");

        // The editor deletes the samples.
        editor.kubectl_expect(&["delete", "-f", ch_file, "-f", set_file], "", true).await;
        assert!(chs.get_opt(POD).await?.is_none(), "CocoonHibernation deleted");
        assert!(sets.get_opt(SET).await?.is_none(), "CocoonSet deleted");

        let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), SA_NAMESPACE);
        for u in [&editor, &outsider] {
            let sa = u.name.rsplit(':').next().unwrap_or_default();
            sas.delete(sa, &DeleteParams::default()).await?;
        }
        cocoon_testenv::delete_namespace(&admin, &ns).await.ok();
        cocoon_testenv::delete_namespace(&admin, &other).await.ok();
        nodes.delete(&node, &DeleteParams::default()).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}
