//! Step 5 — stamp `cs.Generation` onto each owned pod's `cocoonset.cocoonstack.io/generation`
//! annotation, so vk-cocoon can echo it back as `lifecycle-observed-generation`.
//!
//! The stamps ride on the first patch the later steps make to each pod (a suspend's
//! hibernate annotation, its clear on unsuspend); the executor writes the rest after step 10.

use std::collections::BTreeMap;

use cocoon_api::contract::{AnnotationCodec, AnnotationDelta, GenerationStamp};

use crate::cocoonset::pods::Classified;

/// The stamp of every classified pod that lacks this generation, by pod name.
pub fn plan(classified: &Classified, generation: i64) -> BTreeMap<String, AnnotationDelta> {
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
    use cocoon_api::crd::set::{CocoonSet, CocoonSetSpec};
    use kube::ResourceExt;

    use super::*;
    use crate::cocoonset::pods;

    #[test]
    fn every_owned_pod_lacking_the_generation_is_stamped_and_no_other() {
        let mut cs = CocoonSet::new("demo", CocoonSetSpec::with_image("img:1"));
        cs.metadata.namespace = Some("ns".into());
        let stale = pods::build_agent_pod(&cs, "ns", 0, "", None);
        let mut current = pods::build_agent_pod(&cs, "ns", 1, "vm", Some("n"));
        cocoon_api::contract::apply_delta(current.annotations_mut(), &GenerationStamp(4).desired());
        let classified = Classified::from_owned([&stale, &current]);
        let stamps = plan(&classified, 4);
        assert_eq!(
            stamps,
            BTreeMap::from([("demo-0".to_string(), GenerationStamp(4).desired())])
        );
        assert!(plan(&Classified::from_owned([&current]), 4).is_empty());
    }
}
