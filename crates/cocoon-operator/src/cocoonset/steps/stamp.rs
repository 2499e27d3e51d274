//! Seed step 5 — stamp `cs.Generation` onto each owned pod's `cocoonset.cocoonstack.io/generation`
//! annotation, so vk-cocoon can echo it back as `lifecycle-observed-generation`.
//!
//! The stamps ride on the first patch the later steps make to each pod (a suspend's
//! hibernate annotation, its clear on unsuspend); the executor writes the rest after step 10.

use std::collections::BTreeMap;

use cocoon_api::contract::{AnnotationCodec, AnnotationDelta, GenerationStamp};

use crate::cocoonset::pods::Classified;

/// The stamp of every classified pod that lacks this generation, by pod name.
pub fn stamps(classified: &Classified, generation: i64) -> BTreeMap<String, AnnotationDelta> {
    let delta = GenerationStamp(generation).desired();
    classified
        .all_by_name
        .iter()
        .filter(|(_, p)| GenerationStamp::from_meta(&p.metadata).0 != generation)
        .map(|(name, _)| (name.clone(), delta.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use kube::ResourceExt;

    use super::*;
    use crate::cocoonset::fixtures::{NS, set};
    use crate::cocoonset::pods;

    #[test]
    fn every_owned_pod_lacking_the_generation_is_stamped_and_no_other() {
        let cs = set();
        let stale = pods::build_agent_pod(&cs, NS, 0, "", None);
        let mut current = pods::build_agent_pod(&cs, NS, 1, "vm", Some("n"));
        cocoon_api::contract::apply_delta(current.annotations_mut(), &GenerationStamp(4).desired());
        let classified = Classified::from_owned([&stale, &current]);
        assert_eq!(
            stamps(&classified, 4),
            BTreeMap::from([("demo-0".to_string(), GenerationStamp(4).desired())])
        );
        assert!(stamps(&Classified::from_owned([&current]), 4).is_empty());
    }
}
