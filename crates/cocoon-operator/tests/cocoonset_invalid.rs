//! An invalid CocoonSet spec on the real control plane: a toolbox list step 13.1 refuses
//! (here a toolbox named like an agent slot; the CRD's list-map already refuses duplicate
//! names) is reported on the set — `Ready=False` with a reason naming the field, and a
//! Warning Event — and the controller waits for a spec change instead of failing passes with
//! backoff. The node side is the scripted stand-in of `cocoon_testsupport::scripted`.

use cocoon_api::crd::set::{CocoonSet, CocoonSetPhase, ToolboxSpec};
use cocoon_operator::cocoonset::steps::toolboxes::INVALID_TOOLBOXES;
use cocoon_testsupport::BoxError;
use cocoon_testsupport::scripted::{
    Script, controller, node_actor, nodes, phase_is, registry_client, spec, suspend_timing,
    wait_event, wait_set,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

type TestResult = Result<(), BoxError>;

fn ready_condition(cs: &CocoonSet) -> Option<(String, String, String)> {
    let c = cs
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[tokio::test]
async fn an_invalid_toolbox_list_is_reported_and_waits_for_a_spec_change() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "cs-invalid").await?;
        let pool = cocoon_testenv::unique_name("pool");
        let _nodes = nodes(&client, &pool, 1).await?;
        let _actor = node_actor(&client, &ns, Script::default());
        let running =
            controller(&client, &ns, registry_client(env.registry_addr())).sets(suspend_timing());
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);

        let mut s = spec(&pool, 0);
        s.toolboxes = vec![ToolboxSpec {
            name: "7".into(),
            ..ToolboxSpec::default()
        }];
        sets.create(&PostParams::default(), &CocoonSet::new("demo", s))
            .await?;

        // Reported on the set, naming the field, with a Warning Event.
        let cs = wait_set(&sets, "demo", "Ready=False naming spec.toolboxes", |cs| {
            cs.status.as_ref().map(|s| s.observed_generation) == cs.metadata.generation
                && ready_condition(cs).is_some_and(|(_, r, _)| r == INVALID_TOOLBOXES)
        })
        .await?;
        let (status, _, message) = ready_condition(&cs).ok_or("no Ready condition")?;
        assert_eq!(status, "False");
        assert_eq!(
            message,
            "spec.toolboxes: toolbox name \"7\" must not be an integer: collides with agent slot pod naming"
        );
        wait_event(&client, &ns, INVALID_TOOLBOXES).await?;
        // The rest of the set is still kept (its main runs), the toolbox is not created...
        assert!(pods.get_opt("demo-0").await?.is_some(), "the main runs");
        assert!(pods.get_opt("demo-7").await?.is_none(), "no toolbox pod");
        // ...and no pass failed over it: the set waits for a change, not for a retry.
        // (The series exists from the start, at 0, so that alerts see its first increase.)
        let rendered = running.metrics.render();
        let invalid = rendered
            .lines()
            .find(|l| {
                l.starts_with("cocoon_operator_reconcile_errors_total{")
                    && l.contains("controller=\"cocoonset\"")
                    && l.contains("kind=\"invalid\"")
            })
            .ok_or("no invalid-error series")?;
        assert!(
            invalid.ends_with(" 0"),
            "no pass failed as invalid: {invalid}"
        );

        // A spec change is acted on.
        sets.patch(
            "demo",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"toolboxes": [{"name": "tb7"}]}})),
        )
        .await?;
        let cs = wait_set(&sets, "demo", "Running after the fix", |cs| {
            phase_is(cs, CocoonSetPhase::Running)
        })
        .await?;
        let (status, reason, _) = ready_condition(&cs).ok_or("no Ready condition")?;
        assert_eq!((status.as_str(), reason.as_str()), ("True", "AllAgentsReady"));
        assert!(pods.get_opt("demo-tb7").await?.is_some());
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        TestResult::Ok(())
    })
    .await;
}
