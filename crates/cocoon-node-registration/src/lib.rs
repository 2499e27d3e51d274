//! The node agent's virtual Node (`node.md` §2), re-exported by `cocoon-node` as its `node`
//! module: create or update the virtual Node, keep its Lease and Ready heartbeat fresh, and
//! re-assert labels and the daemon endpoint after start; the capacity it reports
//! ([`capacity`]) and who the API server holds the agent to be ([`identity`]).
//!
//! The agent's configuration reaches this crate through [`RegistrationConfig`] and
//! [`CapacityConfig`] (`cocoon-node` converts its `NodeConfig` into both).
//!
//! * [`register_or_update`] writes metadata (labels merged, taint appended once, providerID)
//!   and then the full status (conditions, capacity, addresses, nodeInfo, daemon endpoint).
//! * [`NodeHeartbeat::start`] runs two loops until cancelled: the Lease in `kube-node-lease`
//!   (40 s duration, renewed every 10 s, owned by the Node, recreated if deleted) and the
//!   status refresh, which re-stamps the conditions' `lastHeartbeatTime` every
//!   [`Timings::status_refresh`] (10 s; the test env's node-monitor grace is 15 s, real
//!   clusters use 40 s). Either signal alone keeps the node-lifecycle controller happy; both
//!   are sent, as a kubelet does.
//! * [`NodeHeartbeat::start`] also runs the fix-up loop: after 5 s, up to 10 attempts 2 s
//!   apart; an attempt re-applies the labels (update) and the daemon endpoint (status patch),
//!   and the loop ends early once a GET shows both already in place.
//!
//! Graceful shutdown: [`NodeHeartbeat::stop`] only stops renewing. The Node and its Lease are
//! left as they are: the node-lifecycle controller marks the node NotReady once the Lease
//! expires, and managed pods tolerate `not-ready`/`unreachable` forever, so a restart
//! re-registers without disturbing bound pods.

pub mod capacity;
pub mod identity;
pub mod object;

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use cocoon_kubelet::heartbeat::Heartbeat;

pub use capacity::{CapacityConfig, CapacityOverrides, HostFigures, HostReader, Resources};
pub use object::{COCOON_VERSION, NodeRegistration, RegistrationConfig, Timings};

/// Namespace of node Leases.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";

/// Conflicting writes are retried this many times before giving up.
const CONFLICT_RETRIES: usize = 5;

/// Errors of node registration.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("{op} node {node}: {source}")]
    Kube {
        op: &'static str,
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("{op} node {node}: still conflicting after {CONFLICT_RETRIES} attempts")]
    Conflict { op: &'static str, node: String },
    #[error(transparent)]
    Identity(#[from] identity::IdentityError),
    #[error("encode the node status: {0}")]
    Encode(String),
}

fn kube_err(op: &'static str, node: &str) -> impl FnOnce(kube::Error) -> NodeError + use<> {
    let node = node.to_string();
    move |source| NodeError::Kube { op, node, source }
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

fn now() -> Time {
    Time(Timestamp::now())
}

/// Creates the Node or updates the existing one (labels merged, others preserved; taint
/// appended only if absent; providerID), then writes the full status. Returns the Node as
/// stored after the status write.
pub async fn register_or_update(
    client: &Client,
    reg: &NodeRegistration,
) -> Result<Node, NodeError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let name = reg.node_name.as_str();
    let mut attempt = 0;
    let node = loop {
        attempt += 1;
        let result = match nodes.get_opt(name).await.map_err(kube_err("get", name))? {
            None => {
                let created = nodes.create(&PostParams::default(), &reg.new_node()).await;
                if created.is_ok() {
                    tracing::info!(node = name, "node created");
                }
                created
            }
            Some(mut existing) => {
                if reg.apply_meta(&mut existing) {
                    tracing::info!(node = name, "node metadata updated");
                    if reg.node_restricted {
                        // A node identity changes only labels and providerID, by a merge
                        // patch: a PUT would carry our copy's taints, which the node
                        // lifecycle controller may have changed since, and NodeRestriction
                        // refuses that (403) as the node modifying taints.
                        let patch = serde_json::json!({
                            "metadata": {"labels": existing.metadata.labels},
                            "spec": {"providerID": existing.spec.as_ref().and_then(|s| s.provider_id.clone())},
                        });
                        nodes
                            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                            .await
                    } else {
                        nodes.replace(name, &PostParams::default(), &existing).await
                    }
                } else {
                    Ok(existing)
                }
            }
        };
        match result {
            Ok(n) => break n,
            // 409 on create (someone else created it) or on replace (stale resourceVersion):
            // re-read and merge again.
            Err(e) if is_status(&e, 409) && attempt < CONFLICT_RETRIES => continue,
            Err(e) if is_status(&e, 409) => {
                return Err(NodeError::Conflict {
                    op: "register",
                    node: name.to_string(),
                });
            }
            Err(e) => return Err(kube_err("register", name)(e)),
        }
    };
    write_status(&nodes, reg, node).await
}

/// Replaces the whole status (so stale capacity keys such as a dropped hugepages entry go
/// away) with a merge patch of the status subresource that turns the status we know into the
/// new one ([`merge_patch_to`]). Not a PUT: a PUT carries our copy's `spec.taints`, and when
/// the node lifecycle controller has tainted the Node since we read it (it adds
/// `node.kubernetes.io/not-ready` to every new Node), NodeRestriction refuses a node
/// identity's write as a taint change (403) before the API server could answer 409.
async fn write_status(
    nodes: &Api<Node>,
    reg: &NodeRegistration,
    node: Node,
) -> Result<Node, NodeError> {
    let name = reg.node_name.as_str();
    let stamp = now();
    let old = node
        .status
        .as_ref()
        .and_then(|s| serde_json::to_value(s).ok())
        .unwrap_or(serde_json::Value::Null);
    let new = serde_json::to_value(reg.status(&stamp, &stamp))
        .map_err(|e| NodeError::Encode(e.to_string()))?;
    let patch = serde_json::json!({ "status": merge_patch_to(&old, &new) });
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(kube_err("update status", name))
}

/// The JSON merge patch (RFC 7386) that turns `old` into `new`: `new` itself, plus `null` for
/// every object key `old` has and `new` lacks, at any depth (arrays and scalars are replaced
/// whole, as a merge patch does).
pub fn merge_patch_to(old: &serde_json::Value, new: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let mut out = serde_json::Map::new();
            for (k, nv) in n {
                let pv = match o.get(k) {
                    Some(ov) => merge_patch_to(ov, nv),
                    None => nv.clone(),
                };
                out.insert(k.clone(), pv);
            }
            for k in o.keys().filter(|k| !n.contains_key(*k)) {
                out.insert(k.clone(), Value::Null);
            }
            Value::Object(out)
        }
        _ => new.clone(),
    }
}

/// Re-stamps the conditions' heartbeat times (a merge patch replaces the conditions list).
pub async fn refresh_status(
    client: &Client,
    reg: &NodeRegistration,
    transition: &Time,
) -> Result<(), NodeError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let name = reg.node_name.as_str();
    let patch = serde_json::json!({
        "status": { "conditions": object::conditions(&now(), transition) }
    });
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(kube_err("refresh status of", name))?;
    Ok(())
}

/// Creates the node Lease (owned by the Node) or bumps its renew time. Looks the Node UID up
/// when creating, so a Lease recreated after the Node was recreated points at the right owner.
pub async fn renew_lease(client: &Client, reg: &NodeRegistration) -> Result<(), NodeError> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let name = reg.node_name.as_str();
    let duration = i32::try_from(reg.timings.lease_duration.as_secs()).unwrap_or(i32::MAX);
    let stamp = MicroTime(Timestamp::now());
    let renew = serde_json::json!({
        "spec": { "holderIdentity": name, "leaseDurationSeconds": duration, "renewTime": stamp }
    });
    match leases
        .patch(name, &PatchParams::default(), &Patch::Merge(&renew))
        .await
    {
        Ok(_) => return Ok(()),
        Err(e) if is_status(&e, 404) => {}
        Err(e) => return Err(kube_err("renew lease of", name)(e)),
    }
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes.get(name).await.map_err(kube_err("get", name))?;
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(LEASE_NAMESPACE.to_string()),
            owner_references: Some(vec![OwnerReference {
                api_version: Node::api_version(&()).into_owned(),
                kind: Node::kind(&()).into_owned(),
                name: name.to_string(),
                uid: node.metadata.uid.unwrap_or_default(),
                ..Default::default()
            }]),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(name.to_string()),
            lease_duration_seconds: Some(duration),
            renew_time: Some(stamp.clone()),
            acquire_time: Some(stamp),
            ..Default::default()
        }),
    };
    match leases.create(&PostParams::default(), &lease).await {
        Ok(_) => {
            tracing::info!(node = name, "node lease created");
            Ok(())
        }
        // Created concurrently; the next renew patches it.
        Err(e) if is_status(&e, 409) => Ok(()),
        Err(e) => Err(kube_err("create lease of", name)(e)),
    }
}

/// One fix-up attempt. Returns true when the node already carried labels and endpoint.
pub async fn fixup_once(client: &Client, reg: &NodeRegistration) -> Result<bool, NodeError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let name = reg.node_name.as_str();
    let mut node = nodes.get(name).await.map_err(kube_err("get", name))?;
    if reg.node_is_fixed_up(&node) {
        return Ok(true);
    }
    if reg.apply_labels(node.metadata.labels.get_or_insert_default()) {
        nodes
            .replace(name, &PostParams::default(), &node)
            .await
            .map_err(kube_err("re-label", name))?;
    }
    let patch = serde_json::json!({ "status": { "daemonEndpoints": reg.daemon_endpoints() } });
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(kube_err("set daemon endpoint of", name))?;
    Ok(false)
}

/// The background liveness tasks of a registered node. Cancelled by [`NodeHeartbeat::stop`],
/// by the parent token passed to [`NodeHeartbeat::start`], or by drop.
#[derive(Debug)]
pub struct NodeHeartbeat {
    cancel: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    beats: Vec<Heartbeat>,
}

/// Runs `tick` now and then every `period` until `cancel` fires; errors are logged. `beat`
/// beats on every pass (whatever its outcome: a failing API call is a live loop).
fn spawn_loop<F, Fut>(
    cancel: CancellationToken,
    first_delay: Duration,
    period: Duration,
    what: &'static str,
    beat: Heartbeat,
    mut tick: F,
) -> JoinHandle<()>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), NodeError>> + Send,
{
    tokio::spawn(async move {
        let start = tokio::time::Instant::now() + first_delay;
        let mut interval = tokio::time::interval_at(start, period);
        // After a stall (slow apiserver), renew once and continue the cadence from there.
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = cancel.cancelled() => break,
                _ = interval.tick() => {}
            }
            let res = tokio::select! {
                () = cancel.cancelled() => break,
                r = tick() => r,
            };
            beat.beat();
            if let Err(e) = res {
                tracing::warn!(error = %e, "{what} failed");
            }
        }
        tracing::debug!("{what} loop stopped");
    })
}

impl NodeHeartbeat {
    /// Starts the Lease loop, the status refresh and the fix-up loop for a node that
    /// [`register_or_update`] has just written. `parent` cancels everything (the agent's
    /// shutdown token).
    pub fn start(client: Client, reg: NodeRegistration, parent: &CancellationToken) -> Self {
        let cancel = parent.child_token();
        let transition = now();
        let t = reg.timings.clone();

        // Each pass waits up to a period, then does its API call.
        let lease_beat = Heartbeat::new("lease renew", t.lease_renew);
        let status_beat = Heartbeat::new("node status refresh", t.status_refresh);
        let (c, r) = (client.clone(), reg.clone());
        let lease = spawn_loop(
            cancel.clone(),
            Duration::ZERO,
            t.lease_renew,
            "lease renew",
            lease_beat.clone(),
            move || {
                let (c, r) = (c.clone(), r.clone());
                async move { renew_lease(&c, &r).await }
            },
        );

        let (c, r) = (client.clone(), reg.clone());
        let status = spawn_loop(
            cancel.clone(),
            t.status_refresh,
            t.status_refresh,
            "node status refresh",
            status_beat.clone(),
            move || {
                let (c, r, tr) = (c.clone(), r.clone(), transition.clone());
                async move { refresh_status(&c, &r, &tr).await }
            },
        );

        let fix_cancel = cancel.clone();
        let fixup = tokio::spawn(async move {
            let sleep = |d| {
                let fix_cancel = fix_cancel.clone();
                async move {
                    tokio::select! {
                        () = fix_cancel.cancelled() => false,
                        () = tokio::time::sleep(d) => true,
                    }
                }
            };
            if !sleep(t.fixup_delay).await {
                return;
            }
            for attempt in 1..=t.fixup_attempts {
                match fixup_once(&client, &reg).await {
                    Ok(true) => {
                        tracing::debug!(attempt, "node labels and daemon endpoint in place");
                        return;
                    }
                    Ok(false) => {
                        tracing::info!(attempt, "re-applied node labels and daemon endpoint")
                    }
                    Err(e) => tracing::warn!(attempt, error = %e, "node fix-up failed"),
                }
                if attempt < t.fixup_attempts && !sleep(t.fixup_interval).await {
                    return;
                }
            }
        });

        NodeHeartbeat {
            cancel,
            tasks: vec![lease, status, fixup],
            beats: vec![lease_beat, status_beat],
        }
    }

    /// The heartbeats of the Lease and status loops, for the systemd watchdog.
    pub fn heartbeats(&self) -> Vec<Heartbeat> {
        self.beats.clone()
    }

    /// Stops renewing and waits for the loops to end. The Node and Lease are left in place.
    pub async fn stop(mut self) {
        self.cancel.cancel();
        for task in self.tasks.drain(..) {
            if let Err(e) = task.await
                && e.is_panic()
            {
                tracing::error!(error = %e, "heartbeat task panicked");
            }
        }
    }

    /// True while the loops are running.
    pub fn is_running(&self) -> bool {
        !self.cancel.is_cancelled() && self.tasks.iter().any(|t| !t.is_finished())
    }
}

impl Drop for NodeHeartbeat {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::merge_patch_to;
    use serde_json::json;

    /// Applies a JSON merge patch (RFC 7386), to check that the patch really yields `new`.
    fn apply(target: &serde_json::Value, patch: &serde_json::Value) -> serde_json::Value {
        match (target, patch) {
            (serde_json::Value::Object(t), serde_json::Value::Object(p)) => {
                let mut out = t.clone();
                for (k, v) in p {
                    if v.is_null() {
                        out.remove(k);
                    } else {
                        let merged = apply(t.get(k).unwrap_or(&serde_json::Value::Null), v);
                        out.insert(k.clone(), merged);
                    }
                }
                serde_json::Value::Object(out)
            }
            (_, p) if p.is_object() => apply(&json!({}), p),
            (_, p) => p.clone(),
        }
    }

    #[test]
    fn the_status_patch_turns_the_old_status_into_exactly_the_new_one() {
        let old = json!({
            "capacity": {"cpu": "8", "memory": "32Gi", "hugepages-2Mi": "1Gi"},
            "conditions": [{"type": "Ready", "status": "False"}, {"type": "Old"}],
            "nodeInfo": {"kernelVersion": "6.1", "osImage": "x"},
            "phase": "Pending",
        });
        let new = json!({
            "capacity": {"cpu": "8", "memory": "64Gi"},
            "conditions": [{"type": "Ready", "status": "True"}],
            "nodeInfo": {"kernelVersion": "6.12"},
        });
        let patch = merge_patch_to(&old, &new);
        assert_eq!(
            patch["capacity"]["hugepages-2Mi"],
            json!(null),
            "a dropped key goes"
        );
        assert_eq!(patch["phase"], json!(null));
        assert_eq!(patch["nodeInfo"]["osImage"], json!(null));
        assert_eq!(apply(&old, &patch), new, "old + patch = new");
        assert_eq!(merge_patch_to(&json!(null), &new), new, "no status yet");
    }
}
