//! Issue 35 item 5 on the real control plane and the real registry (docker-registry 2.8 with
//! `auth.token`): the registry token service of `cocoon-operator run` gives a node agent only
//! the repositories of the VMs of pods bound to its node (and pull on their images), the
//! operator pull and delete, anyone else nothing. Every registry call goes through
//! `cocoon_registry::RegistryClient` with the Kubernetes credential, as the node agent and the
//! operator make them; one test reads the registry's own 401 with a raw token.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cocoon_api::contract::checkpoint::{
    CHECKPOINT_TAG, FROM_CHECKPOINT_ANNOTATION, checkpoint_artifact,
};
use cocoon_api::crd::checkpoint::{
    CheckpointSource, CocoonCheckpoint, CocoonCheckpointSpec, NameRef,
};
use cocoon_api::naming::vm_name_for_pod;
use cocoon_operator::registry_token::{TokenConfig, TokenService, bind};
use cocoon_registry::{
    CredentialSource, ErrorClass, Reference, RegistryClient, RegistryConfig, RetryPolicy,
};
use cocoon_testenv::{Registry, TestNode, TokenAuth};
use cocoon_testsupport::BoxError;
use cocoon_testsupport::registry_token::{
    ISSUER, PREFIX, SERVICE, TokenRegistry, sa_token, token_for,
};
use cocoon_testsupport::scripted::push_tag;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use kube::Client;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};

/// The image annotation a pod clones from.
const IMAGE: &str = "cocoonset.cocoonstack.io/image";

/// A token service in front of a registry with token auth, and the identities of the test.
struct Fixture {
    client: Client,
    tr: TokenRegistry,
    /// Namespace of the per-node ServiceAccounts.
    nodes_ns: String,
    node_a: TestNode,
    node_b: TestNode,
    /// Bearer tokens: node A's and node B's ServiceAccounts, the operator's, an administrator's.
    token_a: String,
    token_b: String,
    token_operator: String,
    token_admin: String,
}

impl Fixture {
    async fn start(env: &cocoon_testenv::Shared) -> Result<Fixture, BoxError> {
        let client = env.client()?;
        let nodes_ns = cocoon_testenv::create_namespace(&client, "rt-nodes").await?;
        let ops_ns = cocoon_testenv::create_namespace(&client, "rt-ops").await?;
        let node_a =
            TestNode::create(&client, &cocoon_testenv::unique_name("rt-a"), [("x", "a")]).await?;
        let node_b =
            TestNode::create(&client, &cocoon_testenv::unique_name("rt-b"), [("x", "b")]).await?;
        let token_a = sa_token(&client, &nodes_ns, node_a.name()).await?;
        let token_b = sa_token(&client, &nodes_ns, node_b.name()).await?;
        let token_operator = sa_token(&client, &ops_ns, "cocoon-operator").await?;
        let token_admin = sa_token(&client, &ops_ns, "image-pusher").await?;
        let tr = TokenRegistry::start(
            &client,
            &[
                ("REGISTRY_TOKEN_NODE_SA_NAMESPACE", nodes_ns.clone()),
                (
                    "REGISTRY_TOKEN_OPERATOR_USERS",
                    format!("system:serviceaccount:{ops_ns}:cocoon-operator"),
                ),
                (
                    "REGISTRY_TOKEN_ADMIN_USERS",
                    format!("system:serviceaccount:{ops_ns}:image-pusher"),
                ),
            ],
        )
        .await?;
        Ok(Fixture {
            client,
            tr,
            nodes_ns,
            node_a,
            node_b,
            token_a,
            token_b,
            token_operator,
            token_admin,
        })
    }

    /// A registry client presenting `token` to the token realm.
    fn registry_as(&self, token: Option<&str>) -> Result<RegistryClient, BoxError> {
        self.tr.client_as(token)
    }

    /// Pod `ns/name` bound to `node` (as the scheduler or a migration binds it), optionally
    /// cloning from `image`.
    async fn bind_pod(
        &self,
        ns: &str,
        name: &str,
        node: &str,
        image: Option<&str>,
    ) -> Result<(), BoxError> {
        let annotations: Vec<(&str, &str)> = image.map(|i| (IMAGE, i)).into_iter().collect();
        self.bind_pod_annotated(ns, name, node, &annotations).await
    }

    /// Pod `ns/name` bound to `node`, carrying `annotations`.
    async fn bind_pod_annotated(
        &self,
        ns: &str,
        name: &str,
        node: &str,
        annotations: &[(&str, &str)],
    ) -> Result<(), BoxError> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let annotations: std::collections::BTreeMap<String, String> = annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                annotations: (!annotations.is_empty()).then_some(annotations),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.into()),
                containers: vec![Container {
                    name: "agent".into(),
                    image: Some("cocoon/agent".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        pods.create(&PostParams::default(), &pod).await?;
        Ok(())
    }

    /// Deletes pod `ns/name` at once and waits until it is gone.
    async fn unbind_pod(&self, ns: &str, name: &str) -> Result<(), BoxError> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        pods.delete(name, &DeleteParams::default().grace_period(0))
            .await?;
        cocoon_testenv::wait_until(
            &format!("pod {ns}/{name} gone"),
            Duration::from_secs(60),
            || {
                let pods = pods.clone();
                async move { matches!(pods.get_opt(name).await, Ok(None)).then_some(()) }
            },
        )
        .await?;
        Ok(())
    }
}

/// The class of a refusal; panics with the outcome when the call succeeded.
fn refused<T: std::fmt::Debug>(what: &str, r: Result<T, cocoon_registry::Error>) -> ErrorClass {
    match r {
        Ok(v) => panic!("{what}: expected a refusal, got {v:?}"),
        Err(e) => {
            let class = e.class();
            assert!(
                matches!(class, ErrorClass::Unauthorized | ErrorClass::Forbidden),
                "{what}: expected 401/403, got {class:?}: {e}"
            );
            class
        }
    }
}

fn tag(t: &str) -> Reference {
    Reference::Tag(t.into())
}

#[tokio::test]
async fn a_node_reaches_only_the_vms_of_pods_bound_to_it() {
    cocoon_testenv::run_test(|env| async move {
        let f = Fixture::start(env).await?;
        let tenant = cocoon_testenv::create_namespace(&f.client, "rt-tenant").await?;
        let victim = cocoon_testenv::create_namespace(&f.client, "rt-victim").await?;
        let (a, b) = (f.node_a.name().to_owned(), f.node_b.name().to_owned());
        f.bind_pod(&tenant, "own-0", &a, Some("base/ubuntu:24.04"))
            .await?;
        f.bind_pod(&victim, "secret-0", &b, None).await?;
        let own_vm = vm_name_for_pod(&tenant, "own-0");
        let victim_vm = vm_name_for_pod(&victim, "secret-0");
        // A decoy of the tenant on node A names the victim's VM as the image it clones from.
        f.bind_pod(
            &tenant,
            "decoy-0",
            &a,
            Some(&format!("{victim_vm}:hibernate")),
        )
        .await?;

        let node_a = f.registry_as(Some(&f.token_a))?;
        let node_b = f.registry_as(Some(&f.token_b))?;
        let admin = f.registry_as(Some(&f.token_admin))?;
        // The base image, pushed by an administrator; each node hibernates its own pod.
        push_tag(&admin, "base/ubuntu", "24.04", "").await?;
        push_tag(&node_b, &victim_vm, "hibernate", "img:1").await?;
        push_tag(&node_a, &own_vm, "hibernate", "base/ubuntu:24.04").await?;

        // Node A: its own VM and its pod's image, yes.
        node_a.get_manifest(&own_vm, &tag("hibernate")).await?;
        node_a.get_manifest("base/ubuntu", &tag("24.04")).await?;
        // The attack: node A reads, overwrites and deletes the VM of a pod on node B.
        refused(
            "node A pulls B's pod's VM",
            node_a.get_manifest(&victim_vm, &tag("hibernate")).await,
        );
        refused(
            "node A probes B's pod's VM",
            node_a.has_manifest(&victim_vm, "hibernate").await,
        );
        refused(
            "node A pushes a forged :hibernate over B's pod's VM",
            push_tag(&node_a, &victim_vm, "hibernate", "forged:1")
                .await
                .map_err(|e| match e.downcast::<cocoon_registry::Error>() {
                    Ok(e) => *e,
                    Err(e) => panic!("not a registry error: {e}"),
                }),
        );
        // A node deletes nothing, not even its own VM's tags; nor pushes images.
        refused(
            "node A deletes its own tag",
            node_a.delete_tag_if_present(&own_vm, "hibernate").await,
        );
        refused(
            "node A pushes over its pod's image",
            push_tag(&node_a, "base/ubuntu", "24.04", "x")
                .await
                .map_err(|e| {
                    *e.downcast::<cocoon_registry::Error>()
                        .expect("registry error")
                }),
        );
        // Node B has no pod cloning from the image.
        refused(
            "node B pulls an image none of its pods uses",
            node_b.get_manifest("base/ubuntu", &tag("24.04")).await,
        );
        // Strangers: an unknown identity, no credential at all, a forged bearer.
        let stranger_token = sa_token(&f.client, &tenant, "stranger").await?;
        for (who, token) in [
            (
                "a ServiceAccount of the tenant",
                Some(stranger_token.as_str()),
            ),
            ("no credential", None),
        ] {
            let c = f.registry_as(token)?;
            refused(who, c.get_manifest(&victim_vm, &tag("hibernate")).await);
            refused(who, c.get_manifest(&own_vm, &tag("hibernate")).await);
        }
        // A client trusts only its configured realm: one configured for another realm never
        // presents node B's token to this registry's realm, so it gets nothing.
        let mut elsewhere = f.registry_as(Some(&f.token_b))?.config().clone();
        if let CredentialSource::KubernetesToken { realm, .. } = &mut elsewhere.credentials {
            *realm = url::Url::parse("http://127.0.0.1:1/token")?;
        }
        refused(
            "node B's token with another realm configured",
            RegistryClient::new(elsewhere)?
                .get_manifest(&victim_vm, &tag("hibernate"))
                .await,
        );
        let forged = f.registry_as(Some("not-a-kubernetes-token"))?;
        refused(
            "a forged bearer token",
            forged.get_manifest(&own_vm, &tag("hibernate")).await,
        );

        // The victim's artifact is intact.
        let m = node_b.get_manifest(&victim_vm, &tag("hibernate")).await?;
        assert!(
            String::from_utf8_lossy(&m.bytes).contains("img:1"),
            "the victim's :hibernate is the one node B pushed"
        );
        // The operator deletes tags of any VM (and the victim's pod is untouched by it here).
        let operator = f.registry_as(Some(&f.token_operator))?;
        assert!(operator.has_manifest(&own_vm, "hibernate").await?);
        operator.delete_tag_if_present(&own_vm, "hibernate").await?;
        assert!(!operator.has_manifest(&own_vm, "hibernate").await?);
        // The catalog (`kubectl cocoon registry gc`): administrators only.
        let repos = admin.catalog().await?;
        assert!(repos.iter().any(|r| r.ends_with(&victim_vm)), "{repos:?}");
        refused("the operator lists the catalog", operator.catalog().await);
        refused("node A lists the catalog", node_a.catalog().await);
        refused(
            "the operator pushes",
            push_tag(&operator, &own_vm, "hibernate", "x")
                .await
                .map_err(|e| {
                    *e.downcast::<cocoon_registry::Error>()
                        .expect("registry error")
                }),
        );
        Ok::<(), BoxError>(())
    })
    .await;
}

/// Issue 38: a checkpoint repository (`ckpt-…`) is reached only through its CocoonCheckpoint:
/// pushed by the node its status names while it is being taken, pulled by pods of its own
/// namespace once it is Ready; a pod of another namespace naming it as its image gets nothing.
#[tokio::test]
async fn checkpoint_repositories_are_reached_only_through_their_checkpoint() {
    cocoon_testenv::run_test(|env| async move {
        let f = Fixture::start(env).await?;
        let owner = cocoon_testenv::create_namespace(&f.client, "rt-ckpt").await?;
        let thief = cocoon_testenv::create_namespace(&f.client, "rt-thief").await?;
        let (a, b) = (f.node_a.name().to_owned(), f.node_b.name().to_owned());
        let ckpts: Api<CocoonCheckpoint> = Api::namespaced(f.client.clone(), &owner);
        let spec = CocoonCheckpointSpec {
            source: CheckpointSource {
                pod_ref: Some(NameRef {
                    name: "main".into(),
                }),
                cocoon_set_ref: None,
            },
        };
        let created = ckpts
            .create(&PostParams::default(), &CocoonCheckpoint::new("snap", spec))
            .await?;
        let uid = created.metadata.uid.ok_or("uid")?;
        let repo = checkpoint_artifact(&owner, "snap", &uid)?.repository;
        let phase = |phase: &str| {
            let ckpts = ckpts.clone();
            let status = serde_json::json!({"status": {"phase": phase, "node": a}});
            async move {
                ckpts
                    .patch_status("snap", &PatchParams::default(), &Patch::Merge(status))
                    .await
            }
        };
        phase("Pending").await?;
        let node_a = f.registry_as(Some(&f.token_a))?;
        let node_b = f.registry_as(Some(&f.token_b))?;
        let as_error = |e: BoxError| {
            *e.downcast::<cocoon_registry::Error>()
                .expect("registry error")
        };
        // The node taking it pushes; another node does not.
        push_tag(&node_a, &repo, CHECKPOINT_TAG, "img:1").await?;
        refused(
            "node B pushes a checkpoint its status does not name",
            push_tag(&node_b, &repo, CHECKPOINT_TAG, "forged:1")
                .await
                .map_err(as_error),
        );
        phase("Ready").await?;
        // A fresh client: a token already issued lives out its short TTL.
        let node_a = f.registry_as(Some(&f.token_a))?;
        refused(
            "node A pushes over a Ready checkpoint",
            push_tag(&node_a, &repo, CHECKPOINT_TAG, "forged:2")
                .await
                .map_err(as_error),
        );
        // The attack: a pod of another namespace names the checkpoint as its image.
        f.bind_pod(
            &thief,
            "loot-0",
            &b,
            Some(&format!("{repo}:{CHECKPOINT_TAG}")),
        )
        .await?;
        refused(
            "node B pulls another namespace's checkpoint for its pod",
            node_b.get_manifest(&repo, &tag(CHECKPOINT_TAG)).await,
        );
        // A pod of the checkpoint's own namespace starting from it: pull.
        f.bind_pod(
            &owner,
            "fork-0",
            &b,
            Some(&format!("{repo}:{CHECKPOINT_TAG}")),
        )
        .await?;
        let m = node_b.get_manifest(&repo, &tag(CHECKPOINT_TAG)).await?;
        assert!(String::from_utf8_lossy(&m.bytes).contains("img:1"));
        Ok::<(), BoxError>(())
    })
    .await;
}

/// Creates CocoonCheckpoint `ns/name` (a pod source), hands it to `node` (`Pending`, as the
/// operator does) and returns its derived repository.
async fn pending_checkpoint(
    client: &Client,
    ns: &str,
    name: &str,
    node: &str,
) -> Result<String, BoxError> {
    let ckpts: Api<CocoonCheckpoint> = Api::namespaced(client.clone(), ns);
    let spec = CocoonCheckpointSpec {
        source: CheckpointSource {
            pod_ref: Some(NameRef {
                name: "main".into(),
            }),
            cocoon_set_ref: None,
        },
    };
    let created = ckpts
        .create(&PostParams::default(), &CocoonCheckpoint::new(name, spec))
        .await?;
    let uid = created.metadata.uid.ok_or("uid")?;
    set_checkpoint_phase(client, ns, name, node, "Pending").await?;
    Ok(checkpoint_artifact(ns, name, &uid)?.repository)
}

/// Writes `status.phase` (and `status.node`) of checkpoint `ns/name`.
async fn set_checkpoint_phase(
    client: &Client,
    ns: &str,
    name: &str,
    node: &str,
    phase: &str,
) -> Result<(), BoxError> {
    let ckpts: Api<CocoonCheckpoint> = Api::namespaced(client.clone(), ns);
    let status = serde_json::json!({"status": {"phase": phase, "node": node}});
    ckpts
        .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await?;
    Ok(())
}

/// Issue 38: a forked main's node pulls a checkpoint repository through its pod's
/// `cocoonset.cocoonstack.io/from-checkpoint`, which names a checkpoint of the pod's own
/// namespace and only once it is `Ready`. The same name in another namespace, or a checkpoint
/// still being taken, gives the node nothing.
#[tokio::test]
async fn a_forked_main_pulls_only_the_ready_checkpoint_its_namespace_names() {
    cocoon_testenv::run_test(|env| async move {
        let f = Fixture::start(env).await?;
        let own = cocoon_testenv::create_namespace(&f.client, "rt-fork").await?;
        let other = cocoon_testenv::create_namespace(&f.client, "rt-fork-b").await?;
        let (a, b) = (f.node_a.name().to_owned(), f.node_b.name().to_owned());
        let as_error = |e: BoxError| {
            *e.downcast::<cocoon_registry::Error>()
                .expect("registry error")
        };
        // Three checkpoints taken on node A, each with its artifact: `golden` of each namespace
        // (the same name) Ready, and `wip` of the fork's namespace still Pushing.
        let own_repo = pending_checkpoint(&f.client, &own, "golden", &a).await?;
        let other_repo = pending_checkpoint(&f.client, &other, "golden", &a).await?;
        let wip_repo = pending_checkpoint(&f.client, &own, "wip", &a).await?;
        let node_a = f.registry_as(Some(&f.token_a))?;
        for (repo, image) in [
            (&own_repo, "own:1"),
            (&other_repo, "other:1"),
            (&wip_repo, "wip:1"),
        ] {
            push_tag(&node_a, repo, CHECKPOINT_TAG, image).await?;
        }
        set_checkpoint_phase(&f.client, &own, "golden", &a, "Ready").await?;
        set_checkpoint_phase(&f.client, &other, "golden", &a, "Ready").await?;
        set_checkpoint_phase(&f.client, &own, "wip", &a, "Pushing").await?;

        // Before any forked main is bound to it, node B pulls no checkpoint.
        refused(
            "node B pulls a checkpoint no pod of it starts from",
            f.registry_as(Some(&f.token_b))?
                .get_manifest(&own_repo, &tag(CHECKPOINT_TAG))
                .await,
        );
        // A forked main of the checkpoint's namespace on node B, naming it (no image
        // annotation: the grant comes from the annotation alone).
        f.bind_pod_annotated(
            &own,
            "fork-0",
            &b,
            &[(FROM_CHECKPOINT_ANNOTATION, "golden")],
        )
        .await?;
        // A fresh client: a token already issued lives out its short TTL.
        let node_b = f.registry_as(Some(&f.token_b))?;
        let m = node_b.get_manifest(&own_repo, &tag(CHECKPOINT_TAG)).await?;
        assert!(
            String::from_utf8_lossy(&m.bytes).contains("own:1"),
            "node B pulled its namespace's checkpoint"
        );
        // The attack: the same name resolves in the pod's namespace only; the other
        // namespace's `golden` stays out of reach.
        refused(
            "node B pulls another namespace's checkpoint of the same name",
            node_b.get_manifest(&other_repo, &tag(CHECKPOINT_TAG)).await,
        );
        // A pull grant, never a push.
        refused(
            "node B pushes over the checkpoint it forks from",
            push_tag(&node_b, &own_repo, CHECKPOINT_TAG, "forged:1")
                .await
                .map_err(as_error),
        );
        // A forked main naming a checkpoint that is not Ready yet gets nothing.
        f.bind_pod_annotated(&own, "early-0", &b, &[(FROM_CHECKPOINT_ANNOTATION, "wip")])
            .await?;
        let node_b = f.registry_as(Some(&f.token_b))?;
        refused(
            "node B pulls a checkpoint that is not Ready",
            node_b.get_manifest(&wip_repo, &tag(CHECKPOINT_TAG)).await,
        );
        // Once it is Ready, it does.
        set_checkpoint_phase(&f.client, &own, "wip", &a, "Ready").await?;
        let node_b = f.registry_as(Some(&f.token_b))?;
        let m = node_b.get_manifest(&wip_repo, &tag(CHECKPOINT_TAG)).await?;
        assert!(String::from_utf8_lossy(&m.bytes).contains("wip:1"));
        // A pod of the other namespace naming `golden` gives node B that namespace's: the
        // rule follows the pod's namespace, not the name.
        f.bind_pod_annotated(
            &other,
            "fork-0",
            &b,
            &[(FROM_CHECKPOINT_ANNOTATION, "golden")],
        )
        .await?;
        let node_b = f.registry_as(Some(&f.token_b))?;
        let m = node_b
            .get_manifest(&other_repo, &tag(CHECKPOINT_TAG))
            .await?;
        assert!(String::from_utf8_lossy(&m.bytes).contains("other:1"));
        // And node A, where none of these pods runs, pulls none of the Ready ones.
        let node_a = f.registry_as(Some(&f.token_a))?;
        refused(
            "node A pulls a Ready checkpoint no pod of it starts from",
            node_a.get_manifest(&own_repo, &tag(CHECKPOINT_TAG)).await,
        );
        Ok::<(), BoxError>(())
    })
    .await;
}

#[tokio::test]
async fn a_migration_pushes_on_a_and_pulls_on_b_once_the_pod_is_bound_to_b() {
    cocoon_testenv::run_test(|env| async move {
        let f = Fixture::start(env).await?;
        let ns = cocoon_testenv::create_namespace(&f.client, "rt-migrate").await?;
        let (a, b) = (f.node_a.name().to_owned(), f.node_b.name().to_owned());
        let vm = vm_name_for_pod(&ns, "agent-0");

        // The pod runs on A, which hibernates it.
        f.bind_pod(&ns, "agent-0", &a, None).await?;
        let node_a = f.registry_as(Some(&f.token_a))?;
        push_tag(&node_a, &vm, "hibernate", "img:1").await?;
        refused(
            "node B pulls before the pod is bound to it",
            f.registry_as(Some(&f.token_b))?
                .get_manifest(&vm, &tag("hibernate"))
                .await,
        );

        // The migration deletes the pod on A and creates it on B; B wakes it there.
        f.unbind_pod(&ns, "agent-0").await?;
        f.bind_pod(&ns, "agent-0", &b, None).await?;
        let node_b = f.registry_as(Some(&f.token_b))?;
        let m = node_b.get_manifest(&vm, &tag("hibernate")).await?;
        assert!(String::from_utf8_lossy(&m.bytes).contains("img:1"));
        push_tag(&node_b, &vm, "hibernate", "img:2").await?;
        // A fresh token of A no longer reaches the VM that moved away.
        refused(
            "node A pulls the VM of a pod now on B",
            f.registry_as(Some(&f.token_a))?
                .get_manifest(&vm, &tag("hibernate"))
                .await,
        );
        Ok::<(), BoxError>(())
    })
    .await;
}

#[tokio::test]
async fn the_registry_answers_401_to_a_token_without_the_repository() {
    cocoon_testenv::run_test(|env| async move {
        let f = Fixture::start(env).await?;
        let ns = cocoon_testenv::create_namespace(&f.client, "rt-raw").await?;
        f.bind_pod(&ns, "p-0", f.node_b.name(), None).await?;
        let repo = format!("{PREFIX}/{}", vm_name_for_pod(&ns, "p-0"));
        push_tag(
            &f.registry_as(Some(&f.token_b))?,
            &vm_name_for_pod(&ns, "p-0"),
            "hibernate",
            "img:1",
        )
        .await?;
        let http = reqwest::Client::new();
        let token_for = |bearer: String| {
            let http = http.clone();
            let url = format!(
                "{}?service={SERVICE}&scope=repository:{repo}:pull",
                f.tr.realm
            );
            async move {
                let r: serde_json::Value = http
                    .get(url)
                    .bearer_auth(bearer)
                    .send()
                    .await?
                    .error_for_status()?
                    .json()
                    .await?;
                Ok::<_, BoxError>(r["token"].as_str().unwrap_or_default().to_owned())
            }
        };
        let manifest = format!("{}/v2/{repo}/manifests/hibernate", f.tr.registry.url());
        let get = |jwt: String| {
            http.get(&manifest)
                .bearer_auth(jwt)
                .header("Accept", "application/vnd.oci.image.manifest.v1+json")
                .send()
        };
        let b = get(token_for(f.token_b.clone()).await?).await?;
        assert_eq!(b.status(), 200, "node B's token pulls its pod's VM");
        let a = get(token_for(f.token_a.clone()).await?).await?;
        assert_eq!(a.status(), 401, "node A's token is refused by the registry");
        // The service refuses a token it cannot review, and a service it does not sign for.
        let bad = http
            .get(format!(
                "{}?service={SERVICE}&scope=repository:{repo}:pull",
                f.tr.realm
            ))
            .bearer_auth("forged")
            .send()
            .await?;
        assert_eq!(bad.status(), 401);
        let other = http
            .get(format!(
                "{}?service=elsewhere&scope=repository:{repo}:pull",
                f.tr.realm
            ))
            .bearer_auth(f.token_b.clone())
            .send()
            .await?;
        assert_eq!(other.status(), 400);
        Ok::<(), BoxError>(())
    })
    .await;
}

/// The node-identity mode: a kubelet client certificate (`system:node:<n>`, `O=system:nodes`)
/// issued by the cluster CA authenticates over mutual TLS, no bearer token.
#[tokio::test]
async fn a_kubelet_client_certificate_authenticates_as_its_node() {
    cocoon_testenv::run_test(|env| async move {
        let f = Fixture::start(env).await?;
        let pki = env.pki_dir().ok_or("the env's PKI is unknown")?;
        let ns = cocoon_testenv::create_namespace(&f.client, "rt-mtls").await?;
        let (a, b) = (f.node_a.name().to_owned(), f.node_b.name().to_owned());
        f.bind_pod(&ns, "on-a", &a, None).await?;
        f.bind_pod(&ns, "on-b", &b, None).await?;

        // A second token service, over HTTPS, verifying client certificates against the
        // cluster CA, in front of a second registry that trusts the same key.
        let dir = f.tr.dir();
        let serving_key = rcgen::KeyPair::generate()?;
        let serving =
            rcgen::CertificateParams::new(vec!["localhost".into()])?.self_signed(&serving_key)?;
        let (tls_cert, tls_key) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&tls_cert, serving.pem())?;
        std::fs::write(&tls_key, serving_key.serialize_pem())?;
        let vars = [
            ("REGISTRY_TOKEN_ADDR", "127.0.0.1:0".to_owned()),
            (
                "REGISTRY_TOKEN_KEY_FILE",
                dir.join("token-key.pem").display().to_string(),
            ),
            ("REGISTRY_TOKEN_SERVICE", SERVICE.to_owned()),
            ("REGISTRY_TOKEN_OPERATOR_USERS", "nobody".to_owned()),
            ("REGISTRY_TOKEN_NODE_SA_NAMESPACE", f.nodes_ns.clone()),
            (
                "REGISTRY_TOKEN_TLS_CERT_FILE",
                tls_cert.display().to_string(),
            ),
            ("REGISTRY_TOKEN_TLS_KEY_FILE", tls_key.display().to_string()),
            (
                "REGISTRY_TOKEN_CLIENT_CA_FILE",
                pki.join("ca.crt").display().to_string(),
            ),
        ];
        let cfg = TokenConfig::from_env(&format!("127.0.0.1:1/{PREFIX}"), &|k| {
            vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
        })?
        .ok_or("configured")?;
        let (addr, serve) = bind(Arc::new(TokenService::new(cfg, f.client.clone()).await?)).await?;
        tokio::spawn(serve);
        let realm = url::Url::parse(&format!("https://localhost:{}/token", addr.port()))?;
        let registry = Registry::start_temp_with_token(TokenAuth {
            realm: realm.to_string(),
            service: SERVICE.into(),
            issuer: ISSUER.into(),
            rootcertbundle: dir.join("token-cert.pem"),
        })
        .await?;
        // Node A's kubelet certificate, issued by the cluster CA.
        env.node_kubeconfig(&a, dir)?;
        let client_for = |cert: Option<(PathBuf, PathBuf)>,
                          token: Option<&str>|
         -> Result<RegistryClient, BoxError> {
            let token_file = match token {
                Some(t) => {
                    let p = dir.join(cocoon_testenv::unique_name("bearer"));
                    std::fs::write(&p, t)?;
                    Some(p)
                }
                None => None,
            };
            let mut cfg = RegistryConfig::for_registry(&format!("{}/{PREFIX}", registry.addr()))?;
            cfg.credentials = CredentialSource::KubernetesToken {
                realm: realm.clone(),
                token_file,
            };
            cfg.ca_file = Some(tls_cert.clone());
            cfg.client_cert = cert;
            cfg.retry = RetryPolicy {
                attempts: 1,
                ..RetryPolicy::default()
            };
            Ok(RegistryClient::new(cfg)?)
        };
        let (on_a, on_b) = (vm_name_for_pod(&ns, "on-a"), vm_name_for_pod(&ns, "on-b"));
        // Node B, by its bearer token over the same HTTPS service, hibernates its pod.
        push_tag(
            &client_for(None, Some(&f.token_b))?,
            &on_b,
            "hibernate",
            "img:1",
        )
        .await?;
        let node_a = client_for(
            Some((dir.join(format!("{a}.crt")), dir.join(format!("{a}.key")))),
            None,
        )?;
        push_tag(&node_a, &on_a, "hibernate", "img:1").await?;
        node_a.get_manifest(&on_a, &tag("hibernate")).await?;
        refused(
            "node A's certificate pulls another node's pod's VM",
            node_a.get_manifest(&on_b, &tag("hibernate")).await,
        );
        refused(
            "no certificate, no token",
            client_for(None, None)?
                .get_manifest(&on_a, &tag("hibernate"))
                .await,
        );
        Ok::<(), BoxError>(())
    })
    .await;
}

/// Registries without token auth keep static credentials: the operator's registry client reads
/// `OCI_REGISTRY_USERNAME`/`_PASSWORD` from its environment (before issue 35 it ignored them and
/// went anonymous), and a realm setting is refused next to them.
#[tokio::test]
async fn static_credentials_reach_a_registry_without_token_auth() {
    cocoon_testenv::run_test(|_env| async move {
        let registry =
            Registry::start_temp(Some(cocoon_testenv::RegistryAuth::new("cocoon", "s3cret")))
                .await?;
        let vars = |pairs: Vec<(&'static str, &'static str)>| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let with_creds = cocoon_operator::registry::connect_with_env(
            registry.addr(),
            &vars(vec![
                ("OCI_REGISTRY_USERNAME", "cocoon"),
                ("OCI_REGISTRY_PASSWORD", "s3cret"),
            ]),
        )?;
        assert!(
            !with_creds
                .has_manifest("vk-x-y-000000", "hibernate")
                .await?
        );
        let anonymous =
            cocoon_operator::registry::connect_with_env(registry.addr(), &vars(vec![]))?;
        refused(
            "no credentials",
            anonymous.has_manifest("vk-x-y-000000", "hibernate").await,
        );
        let mixed = cocoon_operator::registry::connect_with_env(
            registry.addr(),
            &vars(vec![
                ("OCI_REGISTRY_USERNAME", "cocoon"),
                ("OCI_REGISTRY_PASSWORD", "s3cret"),
                ("OCI_REGISTRY_TOKEN_REALM", "https://t.example/token"),
            ]),
        );
        assert!(mixed.is_err(), "token auth and static credentials together");
        Ok::<(), BoxError>(())
    })
    .await;
}

/// `REGISTRY_TOKEN_AUDIENCES`: only tokens made for the registry authenticate; the node's API
/// token (the API server's audience) gets nothing, a projected token for the registry's
/// audience reaches the node's own VM.
#[tokio::test]
async fn with_audiences_only_registry_tokens_authenticate() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let nodes_ns = cocoon_testenv::create_namespace(&client, "rt-aud").await?;
        let node = TestNode::create(
            &client,
            &cocoon_testenv::unique_name("rt-aud"),
            [("x", "a")],
        )
        .await?;
        let api_token = sa_token(&client, &nodes_ns, node.name()).await?;
        let registry_token =
            token_for(&client, &nodes_ns, node.name(), &["cocoon-registry"]).await?;
        let tr = TokenRegistry::start(
            &client,
            &[
                ("REGISTRY_TOKEN_NODE_SA_NAMESPACE", nodes_ns.clone()),
                ("REGISTRY_TOKEN_OPERATOR_USERS", "nobody".to_owned()),
                ("REGISTRY_TOKEN_AUDIENCES", "cocoon-registry".to_owned()),
            ],
        )
        .await?;
        let ns = cocoon_testenv::create_namespace(&client, "rt-aud-t").await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        pods.create(
            &PostParams::default(),
            &Pod {
                metadata: ObjectMeta {
                    name: Some("p-0".into()),
                    ..Default::default()
                },
                spec: Some(PodSpec {
                    node_name: Some(node.name().into()),
                    containers: vec![Container {
                        name: "agent".into(),
                        image: Some("cocoon/agent".into()),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .await?;
        let vm = vm_name_for_pod(&ns, "p-0");
        push_tag(
            &tr.client_as(Some(&registry_token))?,
            &vm,
            "hibernate",
            "img:1",
        )
        .await?;
        tr.client_as(Some(&registry_token))?
            .get_manifest(&vm, &tag("hibernate"))
            .await?;
        refused(
            "the node's API-audience token",
            tr.client_as(Some(&api_token))?
                .get_manifest(&vm, &tag("hibernate"))
                .await,
        );
        Ok::<(), BoxError>(())
    })
    .await;
}
