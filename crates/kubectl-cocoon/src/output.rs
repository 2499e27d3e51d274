//! Printing objects as JSON or YAML on stdout, and the colour decision of cli.md §3.

use std::io::IsTerminal;

use serde::Serialize;
use serde_json::Value;

use crate::cli::ColorMode;
use crate::error::CliError;
use crate::jsonpath::Template;

/// An `-o` format.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    Json,
    Yaml,
    /// The table with more columns (only where there is a table).
    Wide,
    /// `kind.group/name`, one per line.
    Name,
    /// kubectl's JSONPath template.
    JsonPath(Template),
}

/// `-o` of the verbs that print a table.
pub const TABLE_FORMATS: &[&str] = &["wide", "json", "yaml", "name", "jsonpath"];
/// `-o` of the verbs that print objects.
pub const OBJECT_FORMATS: &[&str] = &["json", "yaml", "name", "jsonpath"];
/// `-o` of the verbs that print a report that is not a Kubernetes object.
pub const VERSION_FORMATS: &[&str] = &["json", "yaml", "jsonpath"];

/// Parses `-o` against the formats a verb offers.
pub fn parse_format(value: &str, allowed: &[&str]) -> Result<OutputFormat, String> {
    let (name, template) = match value.split_once('=') {
        Some((n, t)) => (n, Some(t)),
        None => (value, None),
    };
    if !allowed.contains(&name) || (name == "jsonpath") != template.is_some() {
        let shown: Vec<String> = allowed
            .iter()
            .map(|a| {
                if *a == "jsonpath" {
                    "jsonpath=TEMPLATE".to_string()
                } else {
                    a.to_string()
                }
            })
            .collect();
        return Err(format!(
            "unsupported output format {value:?} [possible values: {}]",
            shown.join(", ")
        ));
    }
    Ok(match (name, template) {
        ("json", _) => OutputFormat::Json,
        ("yaml", _) => OutputFormat::Yaml,
        ("wide", _) => OutputFormat::Wide,
        ("name", _) => OutputFormat::Name,
        (_, Some(t)) => OutputFormat::JsonPath(Template::parse(t).map_err(|e| e.to_string())?),
        _ => unreachable!("checked against allowed"),
    })
}

/// A clap value parser for `-o` offering `allowed`.
pub fn formats(
    allowed: &'static [&'static str],
) -> impl Fn(&str) -> Result<OutputFormat, String> + Clone + Send + Sync + 'static {
    move |v| parse_format(v, allowed)
}

/// kubectl's `-o name` of one object: `kind.group/name` (`kind/name` for the core group).
pub fn resource_name(obj: &Value) -> String {
    let kind = obj["kind"].as_str().unwrap_or_default().to_lowercase();
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    match obj["apiVersion"].as_str().and_then(|a| a.split_once('/')) {
        Some((group, _)) => format!("{kind}.{group}/{name}"),
        None => format!("{kind}/{name}"),
    }
}

/// The text `-o FORMAT` prints for an object (or a `List`).
pub fn format_value(v: &Value, fmt: &OutputFormat) -> Result<String, CliError> {
    Ok(match fmt {
        OutputFormat::Json | OutputFormat::Wide => {
            let mut text =
                serde_json::to_string_pretty(v).map_err(|e| CliError::Api(e.to_string()))?;
            text.push('\n');
            text
        }
        OutputFormat::Yaml => {
            serde_saphyr::to_string(v).map_err(|e| CliError::Api(e.to_string()))?
        }
        OutputFormat::Name => {
            let items = match v.get("kind").and_then(Value::as_str) {
                Some("List") => v["items"].as_array().cloned().unwrap_or_default(),
                _ => vec![v.clone()],
            };
            items
                .iter()
                .map(|i| format!("{}\n", resource_name(i)))
                .collect()
        }
        OutputFormat::JsonPath(t) => t.render(v),
    })
}

/// Prints one object (or list) in the requested format.
/// JSON and YAML keep the object's own field order; name and jsonpath read it as a value.
pub fn print_object<T: Serialize>(obj: &T, fmt: &OutputFormat) -> Result<(), CliError> {
    match fmt {
        OutputFormat::Json | OutputFormat::Wide => {
            let text =
                serde_json::to_string_pretty(obj).map_err(|e| CliError::Api(e.to_string()))?;
            println!("{text}");
        }
        OutputFormat::Yaml => {
            let text = serde_saphyr::to_string(obj).map_err(|e| CliError::Api(e.to_string()))?;
            print!("{text}");
        }
        _ => {
            let v = serde_json::to_value(obj).map_err(|e| CliError::Api(e.to_string()))?;
            print!("{}", format_value(&v, fmt)?);
        }
    }
    Ok(())
}

/// `auto`: colour only when stdout is a TTY, `NO_COLOR` is unset and `TERM` is not `dumb`.
pub fn use_color(mode: ColorMode) -> bool {
    match mode {
        ColorMode::Always => true,
        ColorMode::Never => false,
        ColorMode::Auto => decide_auto(
            std::io::stdout().is_terminal(),
            std::env::var_os("NO_COLOR").is_some(),
            std::env::var("TERM").ok().as_deref(),
        ),
    }
}

/// The pure `auto` rule.
pub fn decide_auto(tty: bool, no_color: bool, term: Option<&str>) -> bool {
    tty && !no_color && term != Some("dumb")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn formats_offered_per_verb() {
        assert_eq!(parse_format("wide", TABLE_FORMATS), Ok(OutputFormat::Wide));
        assert!(parse_format("wide", OBJECT_FORMATS).is_err());
        assert!(parse_format("name", VERSION_FORMATS).is_err());
        assert!(parse_format("jsonpath", OBJECT_FORMATS).is_err());
        assert!(parse_format("json=x", OBJECT_FORMATS).is_err());
        assert!(matches!(
            parse_format("jsonpath={.kind}", OBJECT_FORMATS),
            Ok(OutputFormat::JsonPath(_))
        ));
        let e = parse_format("table", OBJECT_FORMATS).unwrap_err();
        assert!(e.contains("json, yaml, name, jsonpath=TEMPLATE"), "{e}");
    }

    #[test]
    fn names_like_kubectl() {
        let set = json!({"apiVersion": "cocoonset.cocoonstack.io/v1", "kind": "CocoonSet", "metadata": {"name": "demo"}});
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "demo-0"}});
        assert_eq!(
            resource_name(&set),
            "cocoonset.cocoonset.cocoonstack.io/demo"
        );
        assert_eq!(resource_name(&pod), "pod/demo-0");
        let list = json!({"apiVersion": "v1", "kind": "List", "items": [set, pod]});
        assert_eq!(
            format_value(&list, &OutputFormat::Name).expect("name"),
            "cocoonset.cocoonset.cocoonstack.io/demo\npod/demo-0\n"
        );
    }

    #[test]
    fn auto_colour_rule() {
        assert!(decide_auto(true, false, Some("xterm")));
        assert!(!decide_auto(false, false, Some("xterm")));
        assert!(!decide_auto(true, true, Some("xterm")));
        assert!(!decide_auto(true, false, Some("dumb")));
        assert!(decide_auto(true, false, None));
    }
}
