//! kubectl's JSONPath templates (`-o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}'`):
//! text, `{expr}`, `{"quoted text"}`, `{range expr}…{end}` and `@` for the current element.
//! The template structure is parsed here; each path is evaluated by `jsonpath-rust` (RFC 9535,
//! already in the dependency tree through kube), after kubectl's leading `$` is made explicit.

use jsonpath_rust::JsonPath;
use serde_json::Value;

/// A parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    nodes: Vec<Node>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    Text(String),
    Path(String),
    Range(String, Vec<Node>),
}

/// A template that cannot be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("jsonpath template {template:?}: {reason}")]
pub struct TemplateError {
    pub template: String,
    pub reason: String,
}

/// kubectl's paths start at the root with or without `$`; `@` is the current element.
fn rfc_path(expr: &str) -> String {
    let e = expr.trim();
    if e.starts_with('$') {
        e.to_string()
    } else if let Some(rest) = e.strip_prefix('@') {
        format!("${rest}")
    } else if e.starts_with('.') || e.starts_with('[') {
        format!("${e}")
    } else {
        format!("$.{e}")
    }
}

/// `"text"` inside braces, with kubectl's escapes.
fn unquote(s: &str) -> Option<String> {
    let inner = s.strip_prefix('"')?.strip_suffix('"')?;
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some('r') => out.push('\r'),
                Some(other) => out.push(other),
                None => out.push('\\'),
            }
        } else {
            out.push(c);
        }
    }
    Some(out)
}

/// Splits the template into text and the contents of `{…}` (quotes may hold braces).
fn tokens(template: &str) -> Result<Vec<(bool, String)>, String> {
    let mut out = Vec::new();
    let mut text = String::new();
    let mut chars = template.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '{' {
            text.push(c);
            continue;
        }
        if !text.is_empty() {
            out.push((false, std::mem::take(&mut text)));
        }
        let mut inner = String::new();
        let mut quote: Option<char> = None;
        let mut closed = false;
        while let Some(c) = chars.next() {
            match (quote, c) {
                (Some(_), '\\') => {
                    inner.push(c);
                    if let Some(n) = chars.next() {
                        inner.push(n);
                    }
                }
                (Some(q), c) if c == q => {
                    quote = None;
                    inner.push(c);
                }
                (None, '"' | '\'') => {
                    quote = Some(c);
                    inner.push(c);
                }
                (None, '}') => {
                    closed = true;
                    break;
                }
                _ => inner.push(c),
            }
        }
        if !closed {
            return Err("unclosed action: a '{' has no '}'".into());
        }
        out.push((true, inner));
    }
    if !text.is_empty() {
        out.push((false, text));
    }
    Ok(out)
}

impl Template {
    /// Parses a template and checks every path's syntax.
    pub fn parse(template: &str) -> Result<Template, TemplateError> {
        let err = |reason: String| TemplateError {
            template: template.to_string(),
            reason,
        };
        let mut stack: Vec<(String, Vec<Node>)> = vec![(String::new(), Vec::new())];
        for (action, tok) in tokens(template).map_err(err)? {
            let top = &mut stack.last_mut().expect("root").1;
            if !action {
                top.push(Node::Text(tok));
                continue;
            }
            let t = tok.trim();
            if let Some(text) = unquote(t) {
                top.push(Node::Text(text));
            } else if t == "end" {
                if stack.len() == 1 {
                    return Err(err("{end} without {range}".into()));
                }
                let (path, body) = stack.pop().expect("range");
                stack
                    .last_mut()
                    .expect("root")
                    .1
                    .push(Node::Range(path, body));
            } else if let Some(expr) = t.strip_prefix("range ") {
                let path = rfc_path(expr);
                check(&path).map_err(|e| err(format!("{expr}: {e}")))?;
                stack.push((path, Vec::new()));
            } else if t.is_empty() {
                return Err(err("empty action {}".into()));
            } else {
                let path = rfc_path(t);
                check(&path).map_err(|e| err(format!("{t}: {e}")))?;
                top.push(Node::Path(path));
            }
        }
        if stack.len() != 1 {
            return Err(err("{range} without {end}".into()));
        }
        Ok(Template {
            nodes: stack.pop().expect("root").1,
        })
    }

    /// Renders the template against a value; missing fields print nothing, as with kubectl get.
    pub fn render(&self, value: &Value) -> String {
        let mut out = String::new();
        render_nodes(&self.nodes, value, &mut out);
        out
    }
}

fn check(path: &str) -> Result<(), String> {
    Value::Null
        .query(path)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// kubectl prints strings bare and everything else as JSON.
fn show(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn render_nodes(nodes: &[Node], current: &Value, out: &mut String) {
    for node in nodes {
        match node {
            Node::Text(t) => out.push_str(t),
            Node::Path(p) => {
                let found = current.query(p).unwrap_or_default();
                let shown: Vec<String> = found.into_iter().map(show).collect();
                out.push_str(&shown.join(" "));
            }
            Node::Range(p, body) => {
                for item in current.query(p).unwrap_or_default() {
                    // `range` over one array value walks its elements, as kubectl does.
                    match item {
                        Value::Array(items) if !p.ends_with("[*]") => {
                            for i in items {
                                render_nodes(body, i, out);
                            }
                        }
                        other => render_nodes(body, other, out),
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn list() -> Value {
        json!({"kind": "List", "items": [
            {"metadata": {"name": "a"}, "status": {"phase": "Running", "ready": 2}},
            {"metadata": {"name": "b"}, "status": {"phase": "Suspended", "ready": 0}}
        ]})
    }

    #[test]
    fn templates_render_like_kubectl() {
        let cases = [
            ("{.kind}", "List"),
            ("kind is {.kind}", "kind is List"),
            ("{$.kind}", "List"),
            ("{.items[*].metadata.name}", "a b"),
            ("{.items[0].status.ready}", "2"),
            ("{.items[1].status}", r#"{"phase":"Suspended","ready":0}"#),
            (
                r#"{range .items[*]}{.metadata.name}={.status.phase}{"\n"}{end}"#,
                "a=Running\nb=Suspended\n",
            ),
            (r#"{range .items[*]}[{@.metadata.name}]{end}"#, "[a][b]"),
            (r#"{range .items}{.metadata.name};{end}"#, "a;b;"),
            (
                r#"{.items[?(@.status.phase=="Running")].metadata.name}"#,
                "a",
            ),
            ("{.missing.field}", ""),
        ];
        for (t, want) in cases {
            let tpl = Template::parse(t).unwrap_or_else(|e| panic!("{t}: {e}"));
            assert_eq!(tpl.render(&list()), want, "{t}");
        }
    }

    #[test]
    fn malformed_templates_are_refused() {
        for t in [
            "{.kind",
            "{end}",
            "{range .items[*]}{.x}",
            "{}",
            "{.items[}",
        ] {
            assert!(Template::parse(t).is_err(), "{t}");
        }
    }
}
