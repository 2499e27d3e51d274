//! Finalizers of `contract.md` §8.
//! The operator owns both; it removes them only after its teardown work is done.

/// Finalizer on every CocoonSet; removed after the registry GC of teardown.
pub const COCOONSET: &str = "cocoonset.cocoonstack.io/finalizer";
/// Finalizer on every CocoonHibernation; removed after its deletion cleanup.
pub const COCOONHIBERNATION: &str = "cocoonhibernation.cocoonset.cocoonstack.io/finalizer";
