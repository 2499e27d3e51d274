//! `kubectl explain` needs a description on every property: walk each generated CRD's
//! openAPIV3Schema and name every property that has none.

use cocoon_api::crd;
use serde_json::Value;

/// Records `path` of every property below `node` (through `properties`, `items` and any
/// `allOf`/`anyOf`/`oneOf` branch) without a non-empty description; counts the properties seen.
fn walk(node: &Value, path: &str, seen: &mut usize, missing: &mut Vec<String>) {
    if let Some(props) = node.get("properties").and_then(Value::as_object) {
        for (name, prop) in props {
            let here = format!("{path}.{name}");
            *seen += 1;
            let described = prop
                .get("description")
                .and_then(Value::as_str)
                .is_some_and(|d| !d.trim().is_empty());
            if !described {
                missing.push(here.clone());
            }
            walk(prop, &here, seen, missing);
        }
    }
    if let Some(items) = node.get("items") {
        walk(items, &format!("{path}[]"), seen, missing);
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        for branch in node
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            walk(branch, path, seen, missing);
        }
    }
}

#[test]
fn every_crd_property_has_a_description() {
    let mut report = Vec::new();
    for crd in crd::all() {
        let kind = crd.spec.names.kind.clone();
        for version in &crd.spec.versions {
            let schema = version
                .schema
                .as_ref()
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .expect("openAPIV3Schema");
            let schema = serde_json::to_value(schema).expect("json");
            let (mut seen, mut missing) = (0, Vec::new());
            walk(&schema, "", &mut seen, &mut missing);
            assert!(seen > 10, "{kind}: walked only {seen} properties");
            report.extend(
                missing
                    .into_iter()
                    .map(|p| format!("{kind} {}: {p}", version.name)),
            );
        }
    }
    assert!(
        report.is_empty(),
        "properties without a description:\n{}",
        report.join("\n")
    );
}

/// The walk itself finds a hole at any depth (properties and items).
#[test]
fn the_walk_names_undescribed_paths() {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "spec": {"description": "s", "type": "object", "properties": {
                "list": {"description": "l", "type": "array", "items": {
                    "type": "object", "properties": {"x": {"type": "string"},
                                                      "y": {"description": " ", "type": "string"}}}},
                "ok": {"description": "fine", "type": "string"}}},
            "status": {"type": "object"}
        }
    });
    let (mut seen, mut missing) = (0, Vec::new());
    walk(&schema, "", &mut seen, &mut missing);
    assert_eq!(seen, 6);
    assert_eq!(missing, [".spec.list[].x", ".spec.list[].y", ".status"]);
}
