//! Clone-base collection (not in the spec; bounds tenant-driven disk use). Every distinct
//! `cocoonset.cocoonstack.io/image` of a `mode=clone` pod leaves a clone-base snapshot on the
//! host; a tenant cycling image tags would otherwise fill the disk.
//!
//! # The rule
//!
//! A clone base is a host snapshot in the clone-base name space (its name contains `:`, see
//! `cocoon_api::naming::clone_base_snapshot_name`; VM snapshots never do, so they are never
//! candidates). A clone base is **in use** while a pod tracked by this agent (any state,
//! including a create in progress) names its image. Of the clone bases not in use, the newest
//! `VK_CLONE_BASE_KEEP` (default 4) by save time stay as a cache; older ones are removed.
//! Collection runs after a create imported a new clone base and after the startup reconcile.
//! A removal the runtime refuses (a clone still holds the snapshot) is retried next time.

use std::collections::HashSet;

use cocoon_api::naming::is_clone_base_name;
use cocoon_runtime::SnapshotRecord;
use tracing::{info, warn};

use super::Artifacts;
use crate::pods::rules::{local_snapshot_name, parse_ref};
use crate::pods::store::PodStore;

/// The clone bases to remove: not in use, beyond the newest `keep` unused ones.
pub fn clone_bases_to_remove(
    snapshots: &[SnapshotRecord],
    in_use: &HashSet<String>,
    keep: usize,
) -> Vec<String> {
    let mut unused: Vec<&SnapshotRecord> = snapshots
        .iter()
        .filter(|s| is_clone_base_name(&s.name) && !in_use.contains(&s.name))
        .collect();
    // Newest first; a record without a save time counts as the oldest; ties by name.
    unused.sort_by(|a, b| {
        b.created_at
            .cmp(&a.created_at)
            .then_with(|| a.name.cmp(&b.name))
    });
    unused
        .into_iter()
        .skip(keep)
        .map(|s| s.name.clone())
        .collect()
}

/// The clone-base name an image would use.
pub fn clone_base_of(image: &str) -> Option<String> {
    if image.is_empty() {
        return None;
    }
    let (repo, tag) = parse_ref(image);
    Some(local_snapshot_name(&repo, &tag))
}

impl Artifacts {
    /// Removes the clone bases [`clone_bases_to_remove`] picks; the ones `store`'s pods use
    /// stay.
    pub(crate) async fn collect_clone_bases(&self, store: &PodStore) {
        let gate = self.flight("clone-base gc");
        let _one_at_a_time = gate.lock().await;
        let list = match self.rt.snapshot_list().await {
            Ok(l) => l,
            Err(e) => {
                warn!(error = %e, "listing snapshots for clone-base collection failed");
                return;
            }
        };
        let keep = self.clone_base_keep;
        for name in clone_bases_to_remove(&list, &store.clone_bases_in_use(), keep) {
            // The pull of the same base holds this lock; re-check the use under it.
            let lock = self.flight(&format!("snapshot {name}"));
            let _held = lock.lock().await;
            if store.clone_bases_in_use().contains(&name) {
                continue;
            }
            match self.rt.snapshot_remove_if_exists(&name).await {
                Ok(()) => info!(snapshot = %name, keep, "removed an unused clone base"),
                Err(e) => {
                    warn!(snapshot = %name, error = %e, "removing an unused clone base failed")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};

    fn snap(name: &str, t: Option<i64>) -> SnapshotRecord {
        SnapshotRecord {
            name: name.into(),
            created_at: t.map(|s| Utc.timestamp_opt(s, 0).single().expect("time")),
            ..SnapshotRecord::default()
        }
    }

    #[test]
    fn unused_clone_bases_beyond_the_limit_go_oldest_first() {
        let list = vec![
            snap("base:v1", Some(1)),
            snap("base:v2", Some(2)),
            snap("base:v3", Some(3)),
            snap("base:v4", Some(4)),
            snap("other:latest", None),
            // VM snapshots are never candidates, however old.
            snap("vk-a-main-123456", Some(0)),
            snap("fork-vk-a-main-123456", Some(0)),
            snap("vk-a-main-123456-hibernate-import", Some(0)),
        ];
        let in_use: HashSet<String> = ["base:v1".to_owned()].into();
        // (row, keep, expected removals)
        let cases: [(&str, usize, Vec<&str>); 4] = [
            (
                "keep none",
                0,
                vec!["base:v4", "base:v3", "base:v2", "other:latest"],
            ),
            ("keep one", 1, vec!["base:v3", "base:v2", "other:latest"]),
            ("keep two", 2, vec!["base:v2", "other:latest"]),
            ("keep all", 10, vec![]),
        ];
        for (row, keep, want) in cases {
            assert_eq!(clone_bases_to_remove(&list, &in_use, keep), want, "{row}");
        }
    }

    #[test]
    fn images_map_to_their_clone_base() {
        assert_eq!(clone_base_of("ubuntu").as_deref(), Some("ubuntu:latest"));
        assert_eq!(
            clone_base_of("ubuntu:24.04").as_deref(),
            Some("ubuntu:24.04")
        );
        assert_eq!(clone_base_of(""), None);
    }
}
