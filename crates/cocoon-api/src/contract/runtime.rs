//! Runtime pod annotations of `contract.md` §6: VM id/ip/vnc-port, the hibernate request and
//! restore/keep flags, the operator's generation stamp and the dead-letter mark.

use std::collections::BTreeMap;

use super::annotations as ann;
use super::parse::{bool_value, get_bool, get_i32, get_i64, get_str, non_empty, positive};
use super::patch::{AnnotationCodec, AnnotationDelta};

/// VM identity reported by the node agent (or pre-written by the operator for `static`
/// toolboxes).
///
/// Like the spec writer, [`desired`](AnnotationCodec::desired) only sets non-empty values; the
/// node's explicit clearing of the id (hibernate, start of a wake) is [`VmRuntime::clear_id`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VmRuntime {
    /// `vm.cocoonstack.io/id`.
    pub id: String,
    /// `vm.cocoonstack.io/ip`; may be empty.
    pub ip: String,
    /// `vm.cocoonstack.io/vnc-port`; 0 = none (unparsable reads as 0).
    pub vnc_port: i32,
}

impl VmRuntime {
    /// The delta removing `vm.cocoonstack.io/id` (node: during hibernate, before removing the
    /// VM, and at the start of a wake).
    pub fn clear_id() -> AnnotationDelta {
        AnnotationDelta::from([(ann::VM_ID.to_owned(), None)])
    }
}

impl AnnotationCodec for VmRuntime {
    fn from_annotations(a: &BTreeMap<String, String>) -> Self {
        VmRuntime {
            id: get_str(a, ann::VM_ID).to_owned(),
            ip: get_str(a, ann::VM_IP).to_owned(),
            vnc_port: get_i32(a, ann::VNC_PORT),
        }
    }

    fn desired(&self) -> AnnotationDelta {
        [
            (ann::VM_ID, non_empty(&self.id)),
            (ann::VM_IP, non_empty(&self.ip)),
            (ann::VNC_PORT, positive(self.vnc_port)),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k.to_owned(), Some(v))))
        .collect()
    }
}

/// The three operator-written boolean flags. False is written by removing the key, so this
/// codec owns all three keys: decode, flip the field you mean to change, take the delta.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HibernateFlags {
    /// `vm.cocoonstack.io/hibernate`: true = hibernate requested; awake = absent.
    pub hibernate: bool,
    /// `vm.cocoonstack.io/restore-from-hibernate`: restore from `:hibernate` at create.
    pub restore_from_hibernate: bool,
    /// `vm.cocoonstack.io/keep-snapshot-on-delete`: keep host-local snapshots on delete.
    pub keep_snapshot_on_delete: bool,
}

impl AnnotationCodec for HibernateFlags {
    fn from_annotations(a: &BTreeMap<String, String>) -> Self {
        HibernateFlags {
            hibernate: get_bool(a, ann::HIBERNATE),
            restore_from_hibernate: get_bool(a, ann::RESTORE_FROM_HIBERNATE),
            keep_snapshot_on_delete: get_bool(a, ann::KEEP_SNAPSHOT_ON_DELETE),
        }
    }

    fn desired(&self) -> AnnotationDelta {
        AnnotationDelta::from([
            (ann::HIBERNATE.to_owned(), bool_value(self.hibernate)),
            (
                ann::RESTORE_FROM_HIBERNATE.to_owned(),
                bool_value(self.restore_from_hibernate),
            ),
            (
                ann::KEEP_SNAPSHOT_ON_DELETE.to_owned(),
                bool_value(self.keep_snapshot_on_delete),
            ),
        ])
    }
}

/// `cocoonset.cocoonstack.io/generation`: the CocoonSet `metadata.generation` stamped on a pod.
/// Missing or unparsable reads as 0; a stamp of 0 (or less) is never written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct GenerationStamp(pub i64);

impl AnnotationCodec for GenerationStamp {
    fn from_annotations(a: &BTreeMap<String, String>) -> Self {
        GenerationStamp(get_i64(a, ann::GENERATION))
    }

    fn desired(&self) -> AnnotationDelta {
        positive(self.0)
            .map(|v| AnnotationDelta::from([(ann::GENERATION.to_owned(), Some(v))]))
            .unwrap_or_default()
    }
}

/// `cocoonset.cocoonstack.io/dead-letter`: `None` = not dead-lettered (key absent);
/// `Some(g)` = the budget ran out at generation `g` (an unparsable value reads as `Some(0)`,
/// which never equals a real generation, so it behaves like a lifted mark).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeadLetter(pub Option<i64>);

impl DeadLetter {
    /// True when the pod is dead-lettered at exactly this generation (leave it alone).
    pub fn is_dead_at(&self, generation: i64) -> bool {
        self.0 == Some(generation)
    }

    /// True when the key is present at all.
    pub fn is_marked(&self) -> bool {
        self.0.is_some()
    }
}

impl AnnotationCodec for DeadLetter {
    fn from_annotations(a: &BTreeMap<String, String>) -> Self {
        DeadLetter(
            a.contains_key(ann::DEAD_LETTER)
                .then(|| get_i64(a, ann::DEAD_LETTER)),
        )
    }

    fn desired(&self) -> AnnotationDelta {
        AnnotationDelta::from([(ann::DEAD_LETTER.to_owned(), self.0.map(|g| g.to_string()))])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn runtime_round_trip_and_defaults() {
        let rt = VmRuntime {
            id: "abc123".into(),
            ip: "10.0.0.5".into(),
            vnc_port: 5901,
        };
        let a = rt.to_annotations();
        assert_eq!(
            a,
            map(&[
                (ann::VM_ID, "abc123"),
                (ann::VM_IP, "10.0.0.5"),
                (ann::VNC_PORT, "5901")
            ])
        );
        assert_eq!(VmRuntime::from_annotations(&a), rt);
        assert!(rt.delta(&a).is_empty());

        let bad = VmRuntime::from_annotations(&map(&[(ann::VNC_PORT, "vnc")]));
        assert_eq!(bad, VmRuntime::default());
        assert!(VmRuntime::default().to_annotations().is_empty());
        assert_eq!(
            VmRuntime::clear_id(),
            AnnotationDelta::from([(ann::VM_ID.to_owned(), None)])
        );
    }

    #[test]
    fn hibernate_flags_write_true_or_remove() {
        let current = map(&[(ann::KEEP_SNAPSHOT_ON_DELETE, "true")]);
        let mut f = HibernateFlags::from_annotations(&current);
        assert!(f.keep_snapshot_on_delete && !f.hibernate);
        assert!(f.delta(&current).is_empty());

        f.hibernate = true;
        assert_eq!(
            f.delta(&current),
            AnnotationDelta::from([(ann::HIBERNATE.to_owned(), Some("true".to_owned()))])
        );

        // Awake is absence: clearing the request removes the key.
        let hibernating = map(&[(ann::HIBERNATE, "true")]);
        let mut f = HibernateFlags::from_annotations(&hibernating);
        f.hibernate = false;
        assert_eq!(
            f.delta(&hibernating),
            AnnotationDelta::from([(ann::HIBERNATE.to_owned(), None)])
        );

        for v in ["TRUE", "yes", "1", "false", ""] {
            let f = HibernateFlags::from_annotations(&map(&[
                (ann::HIBERNATE, v),
                (ann::RESTORE_FROM_HIBERNATE, v),
            ]));
            assert_eq!(f, HibernateFlags::default(), "{v:?}");
        }
    }

    #[test]
    fn generation_stamp() {
        for (value, want) in [("7", 7), ("x", 0), ("", 0), ("-1", -1)] {
            assert_eq!(
                GenerationStamp::from_annotations(&map(&[(ann::GENERATION, value)])),
                GenerationStamp(want)
            );
        }
        let a = GenerationStamp(7).to_annotations();
        assert_eq!(a, map(&[(ann::GENERATION, "7")]));
        assert_eq!(GenerationStamp::from_annotations(&a), GenerationStamp(7));
        assert!(GenerationStamp(0).desired().is_empty());
        assert!(GenerationStamp(7).delta(&a).is_empty());
    }

    #[test]
    fn dead_letter() {
        let none = DeadLetter::from_annotations(&BTreeMap::new());
        assert_eq!(none, DeadLetter(None));
        assert!(!none.is_marked());

        let a = DeadLetter(Some(3)).to_annotations();
        assert_eq!(a, map(&[(ann::DEAD_LETTER, "3")]));
        let d = DeadLetter::from_annotations(&a);
        assert!(d.is_dead_at(3) && !d.is_dead_at(4));
        assert!(d.delta(&a).is_empty());

        let garbage = DeadLetter::from_annotations(&map(&[(ann::DEAD_LETTER, "soon")]));
        assert_eq!(garbage, DeadLetter(Some(0)));
        assert!(garbage.is_marked() && !garbage.is_dead_at(1));

        assert_eq!(
            DeadLetter(None).delta(&a),
            AnnotationDelta::from([(ann::DEAD_LETTER.to_owned(), None)])
        );
    }
}
