//! How every replica's activator is found: each replica keeps a `coordination.k8s.io` Lease
//! `cocoon-activator-<pod>` in the operator's namespace, labelled [`COMPONENT_LABEL`] =
//! [`COMPONENT`], its address in the annotation [`ADDRESS_ANNOTATION`], renewed every
//! [`RENEW`] for [`LEASE_SECONDS`]. The leader reads the fresh ones ([`fresh_addresses`]) into
//! the slices; a replica that stops renewing drops out of them after [`LEASE_SECONDS`].

use std::net::IpAddr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use tracing::{debug, warn};

/// Label key of the activator Leases.
pub const COMPONENT_LABEL: &str = "app.kubernetes.io/component";
/// Label value of the activator Leases.
pub const COMPONENT: &str = "cocoon-activator";
/// Annotation of a Lease: the replica's activator address.
pub const ADDRESS_ANNOTATION: &str = "cocoonset.cocoonstack.io/activator-address";
/// How long a Lease counts as fresh after its renew.
pub const LEASE_SECONDS: i32 = 30;
/// How often a replica renews its Lease.
pub const RENEW: Duration = Duration::from_secs(10);

/// The Lease of replica `identity`.
pub fn lease_name(identity: &str) -> String {
    format!("cocoon-activator-{identity}")
}

/// The Lease a replica writes.
pub fn lease(identity: &str, addr: IpAddr, now: Timestamp) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(lease_name(identity)),
            labels: Some([(COMPONENT_LABEL.to_owned(), COMPONENT.to_owned())].into()),
            annotations: Some([(ADDRESS_ANNOTATION.to_owned(), addr.to_string())].into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(identity.to_owned()),
            lease_duration_seconds: Some(LEASE_SECONDS),
            renew_time: Some(MicroTime(now)),
            ..LeaseSpec::default()
        }),
    }
}

/// The addresses of the Leases renewed within their duration before `now` (sorted, each
/// once; a Lease without a parsable address counts for nothing).
pub fn fresh_addresses<'a>(
    leases: impl IntoIterator<Item = &'a Lease>,
    now: DateTime<Utc>,
) -> Vec<String> {
    let mut out: Vec<String> = leases
        .into_iter()
        .filter(|l| {
            let Some(spec) = &l.spec else { return false };
            let (Some(renew), Some(secs)) = (&spec.renew_time, spec.lease_duration_seconds) else {
                return false;
            };
            let renewed = DateTime::<Utc>::from_timestamp(renew.0.as_second(), 0);
            renewed.is_some_and(|r| r + chrono::Duration::seconds(i64::from(secs)) > now)
        })
        .filter_map(|l| {
            let a = l.metadata.annotations.as_ref()?.get(ADDRESS_ANNOTATION)?;
            a.parse::<IpAddr>().ok().map(|ip| ip.to_string())
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Keeps this replica's Lease renewed until `shutdown`. The Lease is owned by this replica's
/// Pod (`identity` in `namespace`, when it exists), so it goes with the Pod; until then a
/// stopped replica's Lease only goes stale.
pub async fn publish(
    client: Client,
    namespace: String,
    identity: String,
    addr: IpAddr,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let owner = match Api::<Pod>::namespaced(client.clone(), &namespace)
        .get_opt(&identity)
        .await
    {
        Ok(Some(pod)) => pod.metadata.uid.map(|uid| OwnerReference {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: identity.clone(),
            uid,
            ..OwnerReference::default()
        }),
        Ok(None) => None,
        Err(e) => {
            warn!(pod = %identity, error = %e, "activator lease: own pod not read, lease not owned");
            None
        }
    };
    let api: Api<Lease> = Api::namespaced(client, &namespace);
    let name = lease_name(&identity);
    let params = PatchParams::apply(super::advertise::COMPONENT).force();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let mut l = lease(&identity, addr, Timestamp::now());
        l.metadata.namespace = Some(namespace.clone());
        l.metadata.owner_references = owner.clone().map(|o| vec![o]);
        let body = serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": l.metadata,
            "spec": l.spec,
        });
        match api.patch(&name, &params, &Patch::Apply(&body)).await {
            Ok(_) => debug!(lease = %name, %addr, "activator lease renewed"),
            Err(e) => warn!(lease = %name, error = %e, "activator lease renew failed"),
        }
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tokio::time::sleep(RENEW) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_fresh_leases_with_an_address_count() {
        let now = Timestamp::from_second(1_000_000).unwrap();
        let at = |s: i64| Timestamp::from_second(s).unwrap();
        let fresh = lease("a", "10.0.0.5".parse().unwrap(), at(1_000_000 - 29));
        let stale = lease("b", "10.0.0.6".parse().unwrap(), at(1_000_000 - 31));
        let twin = lease("c", "10.0.0.5".parse().unwrap(), now);
        let mut garbled = lease("d", "10.0.0.7".parse().unwrap(), now);
        garbled
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(ADDRESS_ANNOTATION.into(), "ten".into());
        let mut unrenewed = lease("e", "10.0.0.8".parse().unwrap(), now);
        unrenewed.spec.as_mut().unwrap().renew_time = None;
        let now = DateTime::<Utc>::from_timestamp(1_000_000, 0).unwrap();
        assert_eq!(
            fresh_addresses([&fresh, &stale, &twin, &garbled, &unrenewed], now),
            vec!["10.0.0.5".to_string()]
        );
    }
}
