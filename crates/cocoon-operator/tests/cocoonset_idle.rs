//! Idle suspend and exec wake of the CocoonSet controller (issue 39) on the real control
//! plane, scheduler and registry. The node side is the scripted stand-in of
//! `cocoon_testsupport::scripted` (it hibernates into the registry and comes back up); the
//! node-owned pod annotations of the idle protocol — the last activity the node agent
//! publishes and an exec's wake request — are written by the test through the same API the
//! node agent uses.

use std::time::Duration;

use chrono::{DateTime, Utc};
use cocoon_api::contract::idle;
use cocoon_api::contract::timefmt::{parse_rfc3339, rfc3339_seconds};
use cocoon_api::crd::set::{CocoonSet, CocoonSetPhase, CocoonSetSpec, IdleSpec};
use cocoon_testsupport::BoxError;
use cocoon_testsupport::scripted::{
    controller, event_reasons, hibernating_node_actor, nodes, phase_is, registry_client, spec,
    suspend_timing, wait_event, wait_set_watched as wait_set,
};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;

type TestResult = Result<(), BoxError>;

const LIMIT: Duration = Duration::from_secs(10);

fn idle_spec(pool: &str) -> CocoonSetSpec {
    let mut s = spec(pool, 0);
    s.idle = Some(IdleSpec {
        suspend_after: Some("10s".into()),
        ..IdleSpec::default()
    });
    s
}

fn ann(cs: &CocoonSet, key: &str) -> Option<String> {
    cs.annotations().get(key).cloned()
}

/// The `Idle` condition's (status, reason).
fn idle_condition(cs: &CocoonSet) -> Option<(String, String)> {
    let c = cs
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == idle::CONDITION_IDLE)?;
    Some((c.status.clone(), c.reason.clone()))
}

fn idle_suspended_at(cs: &CocoonSet) -> Option<DateTime<Utc>> {
    parse_rfc3339(&ann(cs, idle::IDLE_SUSPENDED)?)
}

/// The field manager that owns `spec.suspend`.
fn suspend_manager(cs: &CocoonSet) -> Option<String> {
    cs.metadata
        .managed_fields
        .as_ref()?
        .iter()
        .find(|f| {
            f.fields_v1
                .as_ref()
                .and_then(|v| v.0.get("f:spec"))
                .is_some_and(|s| s.get("f:suspend").is_some())
        })
        .and_then(|f| f.manager.clone())
}

/// Whole seconds, as the annotations carry times.
fn now() -> DateTime<Utc> {
    DateTime::from_timestamp(Utc::now().timestamp(), 0).unwrap_or_default()
}

/// Writes a node-owned annotation of the pod, as the node agent does.
async fn node_writes(pods: &Api<Pod>, pod: &str, key: &str, value: &str) -> TestResult {
    pods.patch(
        pod,
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"annotations": {key: value}}})),
    )
    .await?;
    Ok(())
}

/// Stands in for the node agent publishing traffic on `pod` every 2 s (it publishes at half
/// the set's `suspendAfter` at the latest) until dropped; returns the last time written.
struct Activity {
    task: tokio::task::JoinHandle<()>,
    last: std::sync::Arc<std::sync::Mutex<DateTime<Utc>>>,
}

impl Activity {
    fn start(pods: &Api<Pod>, pod: &str) -> Self {
        let (pods, pod) = (pods.clone(), pod.to_owned());
        let last = std::sync::Arc::new(std::sync::Mutex::new(now()));
        let written = last.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(2));
            loop {
                tick.tick().await;
                let at = now();
                let ok = node_writes(&pods, &pod, idle::LAST_ACTIVITY, &rfc3339_seconds(at))
                    .await
                    .is_ok()
                    && node_writes(&pods, &pod, idle::LAST_ACTIVITY_KIND, "traffic")
                        .await
                        .is_ok();
                if ok && let Ok(mut l) = written.lock() {
                    *l = at;
                }
            }
        });
        Activity { task, last }
    }

    /// Stops publishing; the last activity written.
    async fn stop(self) -> DateTime<Utc> {
        self.task.abort();
        let _ = self.task.await;
        self.last.lock().map(|l| *l).unwrap_or_default()
    }
}

/// Within `window`, the set never shows `spec.suspend: true` (watched, every version).
async fn never_suspended_within(sets: &Api<CocoonSet>, window: Duration) -> TestResult {
    let suspended = |cs: Option<&CocoonSet>| cs.is_some_and(|cs| cs.spec.suspend);
    match tokio::time::timeout(
        window,
        kube::runtime::wait::await_condition(sets.clone(), "demo", suspended),
    )
    .await
    {
        Err(_elapsed) => Ok(()),
        Ok(seen) => Err(format!(
            "the set was suspended: {:?}",
            seen.map(|c| c.map(|c| c.spec))
        )
        .into()),
    }
}

#[tokio::test]
async fn an_idle_set_suspends_itself_and_an_exec_wakes_it() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "cs-idle").await?;
        let pool = cocoon_testenv::unique_name("pool");
        let _nodes = nodes(&client, &pool, 1).await?;
        let _actor = hibernating_node_actor(&client, &ns, env.registry_addr());
        let running =
            controller(&client, &ns, registry_client(env.registry_addr())).sets(suspend_timing());
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        sets.create(
            &PostParams::default(),
            &CocoonSet::new("demo", idle_spec(&pool)),
        )
        .await?;
        let activity = Activity::start(&pods, "demo-0");
        wait_set(&sets, "demo", "Running", |cs| {
            phase_is(cs, CocoonSetPhase::Running)
        })
        .await?;
        let main = pods.get("demo-0").await?;
        assert_eq!(
            main.annotations()
                .get(idle::SUSPEND_AFTER)
                .map(String::as_str),
            Some("10s"),
            "the member carries suspendAfter for its node"
        );

        // (a) While its node publishes activity, the set stays Running past suspendAfter...
        never_suspended_within(&sets, LIMIT + Duration::from_secs(5)).await?;
        let cs = sets.get("demo").await?;
        let status_idle = cs.status.as_ref().and_then(|s| s.idle.clone());
        assert_eq!(
            status_idle.map(|i| i.last_activity_kind).as_deref(),
            Some("traffic"),
            "status.idle reports the activity"
        );
        // ...and once it stops, the set suspends itself, suspendAfter after the last one.
        let last = activity.stop().await;
        let cs = wait_set(&sets, "demo", "idle-suspended", |cs| {
            cs.spec.suspend && ann(cs, idle::IDLE_SUSPENDED).is_some()
        })
        .await?;
        let at = idle_suspended_at(&cs).ok_or("idle-suspended is a time")?;
        assert!(
            at >= last + LIMIT,
            "suspended at {at}, the last activity was at {last}"
        );
        assert_eq!(
            suspend_manager(&cs).as_deref(),
            Some(idle::IDLE_FIELD_MANAGER)
        );
        let cs = wait_set(&sets, "demo", "Suspended, Idle=True", |cs| {
            phase_is(cs, CocoonSetPhase::Suspended) && idle_condition(cs).is_some()
        })
        .await?;
        assert_eq!(
            idle_condition(&cs),
            Some(("True".into(), idle::reasons::IDLE_SUSPENDED.into()))
        );
        wait_event(&client, &ns, idle::reasons::IDLE_SUSPENDED).await?;
        assert!(
            running
                .metrics
                .render()
                .contains("cocoon_operator_idle_suspends_total 1"),
            "{}",
            running.metrics.render()
        );

        // (b) An exec to the suspended main asks for a wake: the set resumes.
        let request = rfc3339_seconds(now());
        node_writes(&pods, "demo-0", idle::WAKE_REQUEST, &request).await?;
        let cs = wait_set(&sets, "demo", "woken by exec", |cs| {
            !cs.spec.suspend
                && idle_condition(cs) == Some(("False".into(), idle::reasons::WOKEN_BY_EXEC.into()))
        })
        .await?;
        assert_eq!(
            suspend_manager(&cs).as_deref(),
            Some(idle::ACTIVATOR_FIELD_MANAGER)
        );
        assert!(ann(&cs, idle::IDLE_SUSPENDED).is_none());
        assert_eq!(
            ann(&cs, idle::WAKE_HANDLED).as_deref(),
            Some(request.as_str()),
            "the request is handled with the wake"
        );
        wait_event(&client, &ns, idle::reasons::WOKEN_BY_EXEC).await?;
        let cs = wait_set(&sets, "demo", "Running again, woken-by gone", |cs| {
            phase_is(cs, CocoonSetPhase::Running) && ann(cs, idle::WOKEN_BY).is_none()
        })
        .await?;
        let clock = cs
            .status
            .as_ref()
            .and_then(|s| s.idle.clone())
            .ok_or("status.idle")?;
        assert_eq!(
            clock.last_activity_kind, "woken",
            "the wake restarts the idle clock"
        );
        let rendered = running.metrics.render();
        assert!(
            rendered.contains("cocoon_operator_idle_wakes_total{trigger=\"exec\"} 1"),
            "{rendered}"
        );
        TestResult::Ok(())
    })
    .await;
}

#[tokio::test]
async fn a_users_suspend_is_never_woken_and_a_users_resume_restarts_the_clock() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "cs-idle-user").await?;
        let pool = cocoon_testenv::unique_name("pool");
        let _nodes = nodes(&client, &pool, 1).await?;
        let _actor = hibernating_node_actor(&client, &ns, env.registry_addr());
        let _running =
            controller(&client, &ns, registry_client(env.registry_addr())).sets(suspend_timing());
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        sets.create(
            &PostParams::default(),
            &CocoonSet::new("demo", idle_spec(&pool)),
        )
        .await?;
        let activity = Activity::start(&pods, "demo-0");
        wait_set(&sets, "demo", "Running", |cs| {
            phase_is(cs, CocoonSetPhase::Running)
        })
        .await?;

        // (c) The user suspends (a merge patch of spec.suspend, without the idle mark).
        sets.patch(
            "demo",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"suspend": true}})),
        )
        .await?;
        activity.stop().await;
        wait_set(&sets, "demo", "Suspended by the user", |cs| {
            phase_is(cs, CocoonSetPhase::Suspended)
        })
        .await?;
        let request = rfc3339_seconds(now());
        node_writes(&pods, "demo-0", idle::WAKE_REQUEST, &request).await?;
        let cs = wait_set(&sets, "demo", "the wake request refused", |cs| {
            ann(cs, idle::WAKE_HANDLED).as_deref() == Some(request.as_str())
        })
        .await?;
        assert!(cs.spec.suspend, "a user's suspend stays");
        assert!(ann(&cs, idle::WOKEN_BY).is_none());
        wait_event(&client, &ns, idle::reasons::WAKE_IGNORED).await?;
        // Still suspended a while later, and the refusal was told once.
        never_woken_within(&sets, Duration::from_secs(3)).await?;
        let refusals = event_reasons(&client, &ns)
            .await
            .iter()
            .filter(|r| *r == idle::reasons::WAKE_IGNORED)
            .count();
        assert_eq!(refusals, 1, "one Event, not one per pass");

        // (d) The user resumes, long after the last activity: the idle clock restarts, and
        // the set is not suspended again before suspendAfter has passed once more.
        let resumed = now();
        sets.patch(
            "demo",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"suspend": false}})),
        )
        .await?;
        let cs = wait_set(&sets, "demo", "resumed, clock restarted", |cs| {
            idle_condition(cs) == Some(("False".into(), idle::reasons::ACTIVE.into()))
        })
        .await?;
        let clock = cs
            .status
            .as_ref()
            .and_then(|s| s.idle.clone())
            .ok_or("status.idle")?;
        assert_eq!(clock.last_activity_kind, "resumed");
        let cs = wait_set(&sets, "demo", "idle-suspended again", |cs| {
            cs.spec.suspend && ann(cs, idle::IDLE_SUSPENDED).is_some()
        })
        .await?;
        let at = idle_suspended_at(&cs).ok_or("idle-suspended is a time")?;
        assert!(
            at >= resumed + LIMIT,
            "suspended again at {at}, resumed at {resumed}"
        );
        TestResult::Ok(())
    })
    .await;
}

/// Within `window`, the set never shows `spec.suspend: false`.
async fn never_woken_within(sets: &Api<CocoonSet>, window: Duration) -> TestResult {
    let woken = |cs: Option<&CocoonSet>| cs.is_some_and(|cs| !cs.spec.suspend);
    match tokio::time::timeout(
        window,
        kube::runtime::wait::await_condition(sets.clone(), "demo", woken),
    )
    .await
    {
        Err(_elapsed) => Ok(()),
        Ok(_) => Err("a user's suspend was woken".into()),
    }
}

/// The API server's refusal of a set named `name` with `spec` (raw JSON: what a client
/// may send, not what our types can hold), as text.
async fn refusal(sets: &Api<DynamicObject>, name: &str, spec: serde_json::Value) -> String {
    let object = json!({
        "apiVersion": "cocoonset.cocoonstack.io/v1",
        "kind": "CocoonSet",
        "metadata": {"name": name},
        "spec": spec,
    });
    let object: DynamicObject = match serde_json::from_value(object) {
        Ok(o) => o,
        Err(e) => return e.to_string(),
    };
    match sets.create(&PostParams::default(), &object).await {
        Ok(_) => format!("{name} was accepted"),
        Err(kube::Error::Api(s)) => s.message,
        Err(e) => e.to_string(),
    }
}

#[tokio::test]
async fn bad_idle_specs_are_refused_naming_the_field() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "cs-idle-bad").await?;
        let resource = ApiResource::erase::<CocoonSet>(&());
        let sets: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &resource);
        let with_idle = |idle: serde_json::Value| -> Result<serde_json::Value, BoxError> {
            let mut s = serde_json::to_value(spec("pool", 0))?;
            s["idle"] = idle;
            Ok(s)
        };
        let ports: Vec<i32> = (7000..7017).collect();
        let mut release = with_idle(json!({"suspendAfter": "30s"}))?;
        release["hibernatePolicy"] = json!("release");
        let cases = [
            (
                "short",
                with_idle(json!({"suspendAfter": "5s"}))?,
                "spec.idle.suspendAfter must be at least 10s",
            ),
            (
                "many",
                with_idle(json!({"ports": ports}))?,
                "spec.idle.ports: Too many: 17: must have at most 16 items",
            ),
            (
                "zero",
                with_idle(json!({"ports": [0]}))?,
                "spec.idle.ports[0]: Invalid value: 0: spec.idle.ports[0] in body should be greater than or equal to 1",
            ),
            (
                "high",
                with_idle(json!({"ports": [70000]}))?,
                "spec.idle.ports[0]: Invalid value: 70000: spec.idle.ports[0] in body should be less than or equal to 65535",
            ),
            (
                "ssh",
                with_idle(json!({"wakeOn": ["ssh"]}))?,
                "spec.idle.wakeOn[0]: Unsupported value: \"ssh\": supported values: \"connect\", \"exec\"",
            ),
            (
                "release",
                release,
                "spec.idle.suspendAfter requires hibernatePolicy=retain",
            ),
        ];
        let mut wrong = Vec::new();
        for (name, spec, expected) in cases {
            let message = refusal(&sets, name, spec).await;
            if !message.contains(expected) {
                wrong.push(format!("{name}: expected {expected:?} in {message:?}"));
            }
        }
        assert!(wrong.is_empty(), "{wrong:#?}");
        // The smallest valid limit and the extreme ports are accepted.
        let ok = with_idle(json!({"suspendAfter": "10s", "ports": [1, 65535], "wakeOn": ["exec"]}))?;
        let accepted = refusal(&sets, "fine", ok).await;
        assert_eq!(accepted, "fine was accepted");
        TestResult::Ok(())
    })
    .await;
}
