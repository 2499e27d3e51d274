//! The custom resources of group `cocoonset.cocoonstack.io/v1` and their CRD rendering.
//! The committed YAML under manifests/crds/ is generated from these types and checked for drift.

pub mod checkpoint;
pub mod hibernation;
pub mod set;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// API group of both kinds.
pub const GROUP: &str = "cocoonset.cocoonstack.io";
/// The only version, served and stored.
pub const VERSION: &str = "v1";
/// `group/version`, as written in `apiVersion`.
pub const API_VERSION: &str = "cocoonset.cocoonstack.io/v1";
/// The category `kubectl get cocoon` lists.
pub const CATEGORY: &str = "cocoon";

/// Rendering the CRDs failed (only possible if serialisation itself breaks).
#[derive(Debug, thiserror::Error)]
#[error("render CRD {name} as YAML: {source}")]
pub struct RenderError {
    name: String,
    #[source]
    source: serde_saphyr::SerializeError,
}

/// Every CustomResourceDefinition: CocoonSet, CocoonHibernation, CocoonCheckpoint.
pub fn all() -> Vec<CustomResourceDefinition> {
    vec![
        without_nullable(set::CocoonSet::crd()),
        without_nullable(hibernation::CocoonHibernation::crd()),
        without_nullable(checkpoint::CocoonCheckpoint::crd()),
    ]
}

/// Drops `nullable: true` and `null` enum members that `Option<T>` fields bring in. Our writers
/// never send `null` (absent fields are skipped), the Go operator's CRDs carry no `nullable`,
/// and without it the API server prunes a stray `null` instead of storing it.
fn without_nullable(crd: CustomResourceDefinition) -> CustomResourceDefinition {
    fn walk(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(map) => {
                map.remove("nullable");
                if let Some(serde_json::Value::Array(members)) = map.get_mut("enum") {
                    members.retain(|m| !m.is_null());
                }
                map.values_mut().for_each(walk);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    let Ok(mut value) = serde_json::to_value(&crd) else {
        return crd;
    };
    walk(&mut value);
    serde_json::from_value(value).unwrap_or(crd)
}

/// One CRD as YAML. Keys come out in struct order (the schema's properties are a sorted map),
/// so the text is stable between builds.
pub fn render_yaml(crd: &CustomResourceDefinition) -> Result<String, RenderError> {
    serde_saphyr::to_string(crd).map_err(|source| RenderError {
        name: crd.metadata.name.clone().unwrap_or_default(),
        source,
    })
}

/// The file name the CRD is committed under: `<group>_<plural>.yaml`.
pub fn file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural)
}

/// Every CRD as `(file name, YAML)`, the form manifests/crds/ holds.
pub fn render_files() -> Result<Vec<(String, String)>, RenderError> {
    all()
        .iter()
        .map(|crd| Ok((file_name(crd), render_yaml(crd)?)))
        .collect()
}

/// Every CRD as one multi-document YAML stream, as `cocoon-operator crd` prints it.
pub fn render_all_yaml() -> Result<String, RenderError> {
    let mut out = String::new();
    for crd in all() {
        out.push_str("---\n");
        out.push_str(&render_yaml(&crd)?);
    }
    Ok(out)
}

/// The CEL rules of a CRD did not hold for an object (client-side check).
pub use kube::core::cel::ValidationErrors;

/// Evaluates the CEL rules (`x-kubernetes-validations`) of the committed CRD schema against
/// `object` (and `old` for transition rules) without an API server, the way the API server
/// would: schema defaults first, then the rules. The plugin runs this before it patches.
pub fn validate_cel(
    crd: &CustomResourceDefinition,
    object: &serde_json::Value,
    old: Option<&serde_json::Value>,
) -> Result<(), ValidationErrors> {
    let schema = crd
        .spec
        .versions
        .first()
        .and_then(|v| v.schema.as_ref())
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| serde_json::to_value(s).ok())
        .unwrap_or(serde_json::Value::Null);
    kube::core::cel::Validator::new().validate(&schema, object, old)
}
