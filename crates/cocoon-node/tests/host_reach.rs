//! Host reach (issue 26 item 9) on the real control plane and the real registry, with
//! in-process agents on the simulator:
//!
//! * a `mode=run` image URL (the host downloads it) and a `cocoonset.cocoonstack.io/network`
//!   (the host wires the VM into that CNI network) are refused with a `TenantIsolationRefused`
//!   Event and lifecycle `failed` naming the annotation unless the node's allowlists
//!   (`VK_RUN_IMAGE_URL_ALLOW`, `VK_NETWORK_ALLOW`) admit them; nothing is fetched or run. The
//!   default (empty) allowlists still run registry images on the default network;
//! * a wake whose annotations changed to a network outside the allowlist is refused too;
//! * hibernate's compensating `:hibernate` delete after a failed `vm rm` happens only while
//!   the VM provably still exists: a `vm rm` that removed the VM and then failed keeps the tag
//!   (now the only copy of the VM's state) and the hibernate stands.

mod common;

use common::{
    AgentOptions, BoxError, hibernate_pod, node_agent, patch_ann, registry, run_pod,
    start_agent_with, vm_pod, wait_lifecycle, wait_refused_at, wait_running, wake_pod,
};

use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::{AnnotationCodec, Lifecycle, LifecycleState};
use cocoon_api::naming::vm_name_for_pod;
use cocoon_node::pods::host_reach::{HostReach, parse_network_allow, parse_url_allow};
use cocoon_runtime::sim::{FailRule, Verb};
use cocoon_testenv::{TestNode, create_namespace, delete_namespace, run_test, unique_name};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;

/// Did the simulator see any call of `verb` naming something that contains `needle`?
fn touched(sim: &cocoon_runtime::sim::SimHandle, verb: Verb, needle: &str) -> bool {
    sim.calls_of(verb).iter().any(|c| {
        c.targets.iter().any(|t| t.contains(needle)) || c.args.to_string().contains(needle)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn url_images_and_networks_need_the_node_allowlists() {
    run_test(|env| async move {
        let client = env.client()?;
        let ns = create_namespace(&client, "host-reach").await?;
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);

        // The default node configuration: no URL image, only the default network.
        let tmp = tempfile::tempdir()?;
        let (node, _node_obj, agent) = node_agent(env, &client, tmp.path()).await?;
        let metadata = "http://169.254.169.254/latest/meta-data/iam/security-credentials/";
        api.create(
            &PostParams::default(),
            &vm_pod(&ns, "ssrf", &node, &[(ann::IMAGE, metadata)]),
        )
        .await?;
        api.create(
            &PostParams::default(),
            &vm_pod(&ns, "net", &node, &[(ann::NETWORK, "host-mgmt")]),
        )
        .await?;
        api.create(&PostParams::default(), &vm_pod(&ns, "plain", &node, &[]))
            .await?;
        let msg = wait_refused_at(&client, &ns, "ssrf", "create", 1).await?;
        assert_eq!(
            msg,
            format!(
                "annotation cocoonset.cocoonstack.io/image: URL {metadata:?} is not allowed on this node (VK_RUN_IMAGE_URL_ALLOW: no URL image is allowed on this node)"
            )
        );
        let msg = wait_refused_at(&client, &ns, "net", "create", 1).await?;
        assert_eq!(
            msg,
            "annotation cocoonset.cocoonstack.io/network: CNI network \"host-mgmt\" is not allowed on this node (VK_NETWORK_ALLOW)"
        );
        // The safe default still runs a registry image on the default network.
        wait_running(&client, &ns, "plain").await?;
        assert!(
            !touched(&agent.sim, Verb::EnsureImage, "169.254.169.254"),
            "the host never fetched the metadata URL"
        );
        for pod in ["ssrf", "net"] {
            let vm = vm_name_for_pod(&ns, pod);
            assert!(!touched(&agent.sim, Verb::Run, &vm), "{pod}: no VM run");
            assert!(agent.sim.vm_info(&vm).is_err(), "{pod}: no VM");
        }
        agent.stop().await;

        // A node that allows one image prefix and one network.
        let tmp2 = tempfile::tempdir()?;
        let node2 = unique_name("node");
        let _node_obj2 = TestNode::in_pool(&client, &node2, "default").await?;
        let opts = AgentOptions {
            host_reach: HostReach {
                run_image_urls: parse_url_allow("https://images.example/cloud/")?,
                networks: parse_network_allow("tenant-net")?,
            },
            ..AgentOptions::new(tmp2.path())
        };
        let agent2 = start_agent_with(
            client.clone(),
            env.registry_addr(),
            &node2,
            tmp2.path(),
            opts,
            |_| Ok(()),
        )
        .await?;
        let allowed = "https://images.example/cloud/jammy.qcow2";
        let lookalikes = [
            ("evil-host", "https://images.example.evil/cloud/jammy.qcow2"),
            ("evil-path", "https://images.example/cloud-old/jammy.qcow2"),
            ("evil-user", "https://images.example@169.254.169.254/cloud/x"),
            ("evil-dots", "https://images.example/cloud/../admin"),
        ];
        api.create(
            &PostParams::default(),
            &vm_pod(
                &ns,
                "ok",
                &node2,
                &[(ann::IMAGE, allowed), (ann::NETWORK, "tenant-net")],
            ),
        )
        .await?;
        for (pod, image) in lookalikes {
            api.create(
                &PostParams::default(),
                &vm_pod(&ns, pod, &node2, &[(ann::IMAGE, image)]),
            )
            .await?;
        }
        api.create(
            &PostParams::default(),
            &vm_pod(&ns, "other-net", &node2, &[(ann::NETWORK, "tenant-net-admin")]),
        )
        .await?;
        wait_running(&client, &ns, "ok").await?;
        assert!(
            touched(&agent2.sim, Verb::EnsureImage, allowed),
            "the allowed URL was fetched"
        );
        assert!(
            agent2.sim.calls_of(Verb::Run).iter().any(|c| {
                c.args.get("network").and_then(|v| v.as_str()) == Some("tenant-net")
            }),
            "the allowed network reached the runtime: {:?}",
            agent2.sim.calls_of(Verb::Run)
        );
        for (pod, image) in lookalikes {
            let msg = wait_refused_at(&client, &ns, pod, "create", 1).await?;
            assert!(
                msg.starts_with(&format!(
                    "annotation cocoonset.cocoonstack.io/image: URL {image:?} is not allowed on this node (VK_RUN_IMAGE_URL_ALLOW: "
                )),
                "{pod}: {msg}"
            );
            assert!(
                !touched(&agent2.sim, Verb::EnsureImage, image),
                "{pod}: never fetched"
            );
        }
        let msg = wait_refused_at(&client, &ns, "other-net", "create", 1).await?;
        assert!(msg.contains("\"tenant-net-admin\" is not allowed"), "{msg}");

        // A pod that slept on the default network cannot wake into another one.
        run_pod(&client, &ns, "sleeper", &node2, &[]).await?;
        hibernate_pod(&client, &ns, "sleeper", 2).await?;
        patch_ann(
            &client,
            &ns,
            "sleeper",
            json!({ann::HIBERNATE: null, ann::NETWORK: "host-mgmt", ann::GENERATION: "3"}),
        )
        .await?;
        let msg = wait_refused_at(&client, &ns, "sleeper", "update", 3).await?;
        assert!(
            msg.starts_with("annotation cocoonset.cocoonstack.io/network:"),
            "{msg}"
        );
        let sleeper = vm_name_for_pod(&ns, "sleeper");
        assert!(
            agent2.sim.vm_info(&sleeper).is_err(),
            "the refused wake started no VM"
        );
        agent2.stop().await;
        delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hibernate_keeps_the_tag_when_the_failed_remove_did_remove_the_vm() {
    run_test(|env| async move {
        let client = env.client()?;
        let ns = create_namespace(&client, "hib-comp").await?;
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let tmp = tempfile::tempdir()?;
        let (node, _node_obj, agent) = node_agent(env, &client, tmp.path()).await?;
        let reg = registry(env.registry_addr());
        for pod in ["gone", "alive"] {
            api.create(&PostParams::default(), &vm_pod(&ns, pod, &node, &[]))
                .await?;
        }
        wait_running(&client, &ns, "gone").await?;
        wait_running(&client, &ns, "alive").await?;

        // `vm rm` removes the VM and still fails: the tag is the only copy now and stays.
        let gone = vm_name_for_pod(&ns, "gone");
        let token = agent.sim.guest_token(&gone)?;
        agent.sim.fail(
            FailRule::new(
                Verb::Remove,
                "simulated: lost the connection to the hypervisor",
            )
            .target(gone.clone())
            .times(1)
            .after_effect(),
        );
        hibernate_pod(&client, &ns, "gone", 2).await?;
        assert!(agent.sim.vm_info(&gone).is_err(), "the VM is gone");
        assert!(
            reg.has_manifest(&gone, "hibernate").await?,
            ":hibernate kept: it is the VM's only copy"
        );
        wake_pod(&client, &ns, "gone", 3).await?;
        assert_eq!(
            agent.sim.guest_token(&gone)?,
            token,
            "the wake restored the VM's state"
        );

        // `vm rm` fails before removing anything: the VM holds its state, so the
        // compensation drops the tag and the hibernate fails.
        let alive = vm_name_for_pod(&ns, "alive");
        agent.sim.fail(
            FailRule::new(Verb::Remove, "simulated: device or resource busy")
                .target(alive.clone())
                .times(1),
        );
        patch_ann(
            &client,
            &ns,
            "alive",
            json!({ann::HIBERNATE: "true", ann::GENERATION: "2"}),
        )
        .await?;
        let p = wait_lifecycle(&client, &ns, "alive", LifecycleState::Failed, 2).await?;
        assert!(
            Lifecycle::from_meta(&p.metadata)
                .message
                .starts_with("remove vm "),
            "{:?}",
            Lifecycle::from_meta(&p.metadata)
        );
        assert!(agent.sim.vm_info(&alive).is_ok(), "the VM still runs");
        assert!(
            !reg.has_manifest(&alive, "hibernate").await?,
            "the compensation dropped the duplicate tag"
        );
        agent.stop().await;
        delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}
