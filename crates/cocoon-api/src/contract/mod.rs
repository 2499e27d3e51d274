//! The cocoonstack wire contract (`spec/contract.md`) as typed, pure code: every shared string,
//! the lenient annotation parsers, the annotation codecs and the merge-patch builder.
//!
//! Nothing in here talks to the API server. The operator and the node agent both use these
//! items so that they cannot drift apart, and so that they stay byte-compatible with the Go
//! cocoonstack components.
//!
//! Layout:
//! * string constants: [`labels`], [`annotations`], [`finalizers`], [`taints`], [`tags`],
//!   [`oci`], [`events`], [`metrics`], [`env`](mod@env);
//! * parsing rules of §1: [`parse`];
//! * patches that only carry changed keys: [`patch`] ([`AnnotationDelta`], [`AnnotationCodec`]);
//! * codecs: [`vmspec`] (§5), [`runtime`] and [`lifecycle`] (§6), [`cocoonset`] (§7);
//! * placement and tolerations (§3.3, §4): [`placement`];
//! * Go-compatible time and duration text: [`timefmt`].
//!
//! Naming (§2) lives next door in [`crate::naming`].

pub mod annotations;
pub mod checkpoint;
pub mod cocoonset;
pub mod env;
pub mod events;
pub mod finalizers;
pub mod idle;
pub mod labels;
pub mod lifecycle;
pub mod metrics;
pub mod oci;
pub mod owner;
pub mod parse;
pub mod patch;
pub mod placement;
pub mod runtime;
pub mod tags;
pub mod taints;
pub mod timefmt;
pub mod vmspec;

pub use cocoonset::{
    DeleteVmNames, HibernatedOnNode, RebuildEntry, RebuildHistory, ReclaimRecord, SuspendingSince,
};
pub use lifecycle::{Lifecycle, LifecycleState};
pub use patch::{
    AnnotationCodec, AnnotationDelta, annotations_merge_patch, apply_delta, bool_delta,
    diff_annotations, meta_annotations, meta_labels,
};
pub use runtime::{DeadLetter, GenerationStamp, HibernateFlags, VmRuntime};
pub use timefmt::go_duration;
pub use vmspec::{Backend, ConnType, Mode, Os, SnapshotPolicy, VmSpec};
