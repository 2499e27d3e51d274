//! Installs cocoon's CustomResourceDefinitions with server-side apply (so re-installing into
//! a running env just updates them) and waits until the apiserver reports them Established.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};

use crate::error::{Error, Result};
use crate::wait::{Probe, poll};

/// Field manager for everything the harness applies.
pub const FIELD_MANAGER: &str = "cocoon-testenv";

/// Applies `cocoon_api::crd::all()` and waits until every CRD is Established.
pub async fn install(client: &Client, timeout: Duration) -> Result<Vec<String>> {
    install_these(client, cocoon_api::crd::all(), timeout).await
}

/// Applies the given CRDs and waits until every one is Established.
pub async fn install_these(
    client: &Client,
    crds: Vec<CustomResourceDefinition>,
    timeout: Duration,
) -> Result<Vec<String>> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut names = Vec::with_capacity(crds.len());
    for mut crd in crds {
        let Some(name) = crd.metadata.name.clone() else {
            return Err(Error::Invalid {
                what: "CRD".into(),
                detail: "metadata.name is missing".into(),
            });
        };
        // Server-side apply rejects objects that carry server-owned metadata.
        crd.metadata.managed_fields = None;
        crd.metadata.resource_version = None;
        crd.metadata.uid = None;
        crd.metadata.creation_timestamp = None;
        crd.status = None;
        api.patch(&name, &params, &Patch::Apply(&crd)).await?;
        tracing::debug!(crd = %name, "applied");
        names.push(name);
    }
    for name in &names {
        wait_established(&api, name, timeout).await?;
    }
    tracing::info!(crds = ?names, "CRDs established");
    Ok(names)
}

/// Polls until the CRD's `Established` condition is `True`.
pub async fn wait_established(
    api: &Api<CustomResourceDefinition>,
    name: &str,
    timeout: Duration,
) -> Result<()> {
    poll(&format!("CRD {name} Established"), timeout, || async move {
        match api.get_opt(name).await {
            Ok(Some(crd)) if is_established(&crd) => Probe::Ready(()),
            Ok(Some(_)) => Probe::NotYet("not Established yet".into()),
            Ok(None) => Probe::NotYet("not found".into()),
            Err(e) => Probe::NotYet(e.to_string()),
        }
    })
    .await
}

/// True when the CRD has condition `Established=True`.
pub fn is_established(crd: &CustomResourceDefinition) -> bool {
    crd.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        })
}
