//! What the controllers need of the registry: probe a tag, read nothing more, delete a tag by
//! digest. A trait so that pure tests can count calls; production wires cocoon-registry.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use cocoon_api::contract::owner::{Actor, OwnerVerdict, RecordedOwner, owner_verdict};
use cocoon_registry::CheckedDelete;

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A registry call failed (transport, 5xx, auth, a malformed answer); "not found" is never an
/// error here. It is the registry client's own error, kept with its type: the operator's
/// errors carry it as their `#[source]` and add the step and the call
/// (`<step>: <call> <vm>:<tag>: <this>`), so it has no prefix of its own.
pub type RegistryError = cocoon_registry::Error;

/// How [`TagRegistry::delete_owned_tag`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TagDelete {
    /// Deleted: it recorded the acting pod, or no owner (Go components).
    Deleted,
    /// There was no such tag.
    Absent,
    /// Kept: the artifact records another owner (a colliding VM name).
    Foreign(RecordedOwner),
}

/// Tag probes and deletes on `<base>/<vm>:<tag>`.
pub trait TagRegistry: Send + Sync + 'static {
    /// Whether the manifest `<vm>:<tag>` exists. A missing repository answers `false`
    /// without creating it.
    fn has_manifest<'a>(
        &'a self,
        vm: &'a str,
        tag: &'a str,
    ) -> BoxFuture<'a, Result<bool, RegistryError>>;

    /// Deletes `<vm>:<tag>` if present (probe, resolve to digest, DELETE by digest); an absent
    /// tag is success.
    fn delete_tag<'a>(
        &'a self,
        vm: &'a str,
        tag: &'a str,
    ) -> BoxFuture<'a, Result<(), RegistryError>>;

    /// Deletes `<vm>:<tag>` only when the artifact records `actor` as its owner or records
    /// no owner ([`cocoon_api::contract::owner`]); one recording another owner is kept and
    /// answered as [`TagDelete::Foreign`]. Every tag delete of the controllers goes through
    /// it, after their name gates. The default reads the annotations, then deletes by tag;
    /// the production registry deletes the very digest it checked.
    fn delete_owned_tag<'a>(
        &'a self,
        vm: &'a str,
        tag: &'a str,
        actor: Actor<'a>,
    ) -> BoxFuture<'a, Result<TagDelete, RegistryError>> {
        Box::pin(async move {
            let Some(annotations) = self.manifest_annotations(vm, tag).await? else {
                return Ok(TagDelete::Absent);
            };
            if let OwnerVerdict::Foreign { owner } = owner_verdict(&annotations, &actor) {
                return Ok(TagDelete::Foreign(owner));
            }
            self.delete_tag(vm, tag).await?;
            Ok(TagDelete::Deleted)
        })
    }

    /// The annotations of manifest `<vm>:<tag>`, or `None` when the tag does not exist. The
    /// CocoonSet create protocol reads the recorded base image from them. The default answers
    /// from a probe with no annotations, for registries that only probe.
    fn manifest_annotations<'a>(
        &'a self,
        vm: &'a str,
        tag: &'a str,
    ) -> BoxFuture<'a, Result<Option<BTreeMap<String, String>>, RegistryError>> {
        Box::pin(async move {
            Ok(self
                .has_manifest(vm, tag)
                .await?
                .then(BTreeMap::<String, String>::new))
        })
    }
}

/// The production registry: cocoon-registry's client for the `OCI_REGISTRY` base.
pub struct OciTagRegistry(cocoon_registry::RegistryClient);

impl OciTagRegistry {
    pub fn new(client: cocoon_registry::RegistryClient) -> Self {
        OciTagRegistry(client)
    }
}

impl TagRegistry for OciTagRegistry {
    fn delete_owned_tag<'a>(
        &'a self,
        vm: &'a str,
        tag: &'a str,
        actor: Actor<'a>,
    ) -> BoxFuture<'a, Result<TagDelete, RegistryError>> {
        Box::pin(async move {
            let checked = self
                .0
                .delete_tag_checked(vm, tag, |a| owner_verdict(a, &actor).may_act())
                .await?;
            Ok(match checked {
                CheckedDelete::Deleted(_) => TagDelete::Deleted,
                CheckedDelete::Absent => TagDelete::Absent,
                CheckedDelete::Kept(a) => {
                    TagDelete::Foreign(RecordedOwner::from_annotations(&a).unwrap_or_default())
                }
            })
        })
    }

    fn has_manifest<'a>(
        &'a self,
        vm: &'a str,
        tag: &'a str,
    ) -> BoxFuture<'a, Result<bool, RegistryError>> {
        Box::pin(async move { self.0.has_manifest(vm, tag).await })
    }

    fn delete_tag<'a>(
        &'a self,
        vm: &'a str,
        tag: &'a str,
    ) -> BoxFuture<'a, Result<(), RegistryError>> {
        Box::pin(async move { self.0.delete_tag_if_present(vm, tag).await.map(|_| ()) })
    }

    fn manifest_annotations<'a>(
        &'a self,
        vm: &'a str,
        tag: &'a str,
    ) -> BoxFuture<'a, Result<Option<BTreeMap<String, String>>, RegistryError>> {
        Box::pin(async move {
            match self.0.manifest_annotations(vm, tag).await {
                Ok(a) => Ok(Some(a)),
                Err(e) if e.is_not_found() => Ok(None),
                Err(e) => Err(e),
            }
        })
    }
}

/// Connects to the registry named by an `OCI_REGISTRY` value (credentials from the environment
/// and docker config.json, as cocoon-registry resolves them).
pub fn connect(oci_registry: &str) -> Result<std::sync::Arc<dyn TagRegistry>, RegistryError> {
    connect_with_env(oci_registry, &|k| std::env::var(k).ok())
}

/// [`connect`] with the access settings (credentials, CA, client certificate, insecure hosts:
/// [`cocoon_registry::RegistryConfig::with_access_env`]) read from `env`.
pub fn connect_with_env(
    oci_registry: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<std::sync::Arc<dyn TagRegistry>, RegistryError> {
    let config = cocoon_registry::RegistryConfig::for_registry(oci_registry)?
        .with_access_env(env)
        .map(crate::user_agent::registry_config)?;
    let client = cocoon_registry::RegistryClient::new(config)?;
    Ok(std::sync::Arc::new(OciTagRegistry(client)))
}
