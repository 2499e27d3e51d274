//! What the controllers need of the registry: probe a tag, read nothing more, delete a tag by
//! digest. A trait so that pure tests can count calls; production wires cocoon-registry.

use std::future::Future;
use std::pin::Pin;

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A registry call failed (transport, 5xx or auth); "not found" is never an error here.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct RegistryError(pub String);

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
}
