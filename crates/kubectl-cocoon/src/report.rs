//! `report NAME`: a support bundle (tar.gz) of one CocoonSet: the set, its pods and
//! hibernations, their Events, the operator Deployment and its recent logs, the nodes of its
//! members and `version -o json`. Secrets and tokens are redacted; a part the caller may not
//! read (RBAC) or that is missing becomes a line in `NOTES.txt` and the bundle goes on.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use cocoon_api::contract::labels;
use cocoon_api::crd::hibernation::CocoonHibernation;
use cocoon_api::crd::set::CocoonSet;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, LogParams};
use kube::{Client, ResourceExt};
use serde::Serialize;
use serde_json::Value;

use crate::error::CliError;
use crate::version::{self, OPERATOR_DEPLOYMENT, OPERATOR_NAMESPACE};

/// What replaces a secret value.
pub const REDACTED: &str = "[REDACTED]";
/// Lines of operator log per pod.
const LOG_TAIL: i64 = 2000;

/// Keys whose string values are secrets (compared lower-case, without `-`/`_`), plus names
/// ending in `_PASS`/`-PASS`/`Pass` and `_KEY_ID`/`KeyId` (`DB_PASS`, `AWS_ACCESS_KEY_ID`),
/// and a Docker `config.json`'s credentials: `auth` (base64 `user:pass`), `identitytoken`,
/// `registrytoken`, and a Secret's whole `.dockerconfigjson` / `.dockercfg`.
fn is_secret_key(key: &str) -> bool {
    let k: String = key
        .chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_lowercase)
        .collect();
    // References name a secret; they are not one.
    if k.ends_with("name") || k.ends_with("ref") || k.ends_with("file") || k.ends_with("path") {
        return false;
    }
    let lower = key.to_ascii_lowercase();
    let pass_suffix = lower == "pass"
        || lower.ends_with("_pass")
        || lower.ends_with("-pass")
        || key.ends_with("Pass");
    pass_suffix
        || k.ends_with("keyid")
        || k == "auth"
        || [
            "dockerconfigjson",
            "dockercfg",
            "token",
            "password",
            "passwd",
            "secret",
            "credential",
            "apikey",
            "privatekey",
        ]
        .iter()
        .any(|s| k.contains(s))
}

/// Redacts secrets in an object: string values under secret-looking keys, `env` entries
/// (`{name, value}`) with a secret-looking name, kubectl's last-applied annotation (a copy
/// of everything, secrets included), and whatever [`redact_text`] finds in other strings.
pub fn redact(v: &mut Value) {
    match v {
        Value::Object(map) => {
            let env_secret = map
                .get("name")
                .and_then(Value::as_str)
                .is_some_and(is_secret_key)
                && map.get("value").is_some_and(Value::is_string);
            if env_secret {
                map.insert("value".into(), Value::String(REDACTED.into()));
            }
            map.remove("kubectl.kubernetes.io/last-applied-configuration");
            for (k, child) in map.iter_mut() {
                if child.is_string() && is_secret_key(k) {
                    *child = Value::String(REDACTED.into());
                } else {
                    redact(child);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact),
        // Free text (Event notes, env values, annotations) gets the log rules.
        Value::String(text) => {
            let clean = redact_text(text);
            if clean != *text {
                *text = clean;
            }
        }
        _ => {}
    }
}

/// Redacts secrets in log text, line by line:
/// * the credential after an `Authorization` scheme: `Bearer <x>`, `Basic <x>` (also inside
///   JSON strings, `"Authorization":"Basic <x>"`);
/// * the value of a secret-looking key ([`is_secret_key`]) written `key=value`, `key: value`
///   (YAML, headers) or `"key": "value"` (JSON), quoted or not;
/// * URL userinfo: `https://user:pass@host` → `https://[REDACTED]@host`;
/// * a base64 word that decodes to a Docker `config.json` with credentials (a Secret's
///   `.dockerconfigjson` copied into a log line or an annotation).
///
/// A Docker config written as JSON (`{"auths":{"host":{"auth":"…"}}}`, escaped inside a
/// log's JSON string too) loses its credentials by the key rule.
pub fn redact_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let line = redact_userinfo(line);
        let line = redact_auth_schemes(&line);
        let line = redact_docker_config_b64(&line);
        out.push_str(&redact_key_values(&line));
    }
    out
}

/// Shortest base64 word [`redact_docker_config_b64`] decodes (`{"auths":{}}` is 16).
const MIN_B64_CONFIG: usize = 16;

/// Replaces each base64 word that decodes to a Docker `config.json` carrying credentials.
fn redact_docker_config_b64(line: &str) -> String {
    use base64::Engine as _;
    // A word is base64 characters and at most two `=` of padding (so `config=eyJ…` splits).
    let b64 = |c: char| c.is_ascii_alphanumeric() || matches!(c, '+' | '/');
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(start) = rest.find(b64) {
        out.push_str(&rest[..start]);
        let body = rest[start..]
            .find(|c: char| !b64(c))
            .unwrap_or(rest.len() - start);
        let padding = rest[start + body..]
            .chars()
            .take(2)
            .take_while(|c| *c == '=')
            .count();
        let word_len = body + padding;
        let word = &rest[start..start + word_len];
        let decoded = (word.len() >= MIN_B64_CONFIG)
            .then(|| {
                base64::engine::general_purpose::STANDARD
                    .decode(word)
                    .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(word))
                    .ok()
            })
            .flatten();
        let is_config = decoded.as_deref().is_some_and(|d| {
            let d = String::from_utf8_lossy(d);
            d.contains("\"auths\"") || d.contains("\"auth\"") || d.contains("\"identitytoken\"")
        });
        out.push_str(if is_config { REDACTED } else { word });
        rest = &rest[start + word_len..];
    }
    out.push_str(rest);
    out
}

/// Ends a bare (unquoted) value or credential.
fn ends_bare(c: char) -> bool {
    c.is_whitespace() || matches!(c, '"' | '\'' | ',' | ';' | '}' | ']' | ')' | '&' | '>')
}

/// `scheme://userinfo@host` → `scheme://[REDACTED]@host`.
fn redact_userinfo(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        let auth_end = tail
            .find(|c: char| ends_bare(c) || matches!(c, '/' | '?' | '#'))
            .unwrap_or(tail.len());
        let authority = &tail[..auth_end];
        match authority.rfind('@') {
            Some(at) if at > 0 => {
                out.push_str(REDACTED);
                out.push_str(&authority[at..]);
            }
            _ => out.push_str(authority),
        }
        rest = &tail[auth_end..];
    }
    out.push_str(rest);
    out
}

/// Hides the credential after `Bearer` (any word) and `Basic` (a base64 word of 8 or more
/// characters, so prose such as "basic auth" stays).
fn redact_auth_schemes(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    let bytes = line.as_bytes();
    while i < line.len() {
        let word_start = i == 0 || !bytes[i - 1].is_ascii_alphanumeric();
        let scheme = [("bearer", false), ("basic", true)]
            .into_iter()
            .find(|(w, _)| {
                word_start
                    && line
                        .get(i..i + w.len())
                        .is_some_and(|s| s.eq_ignore_ascii_case(w))
                    && line[i + w.len()..].starts_with([' ', '\t'])
            });
        if let Some((w, basic)) = scheme {
            let after = i + w.len();
            let gap = line[after..]
                .find(|c: char| c != ' ' && c != '\t')
                .map_or(line.len(), |g| after + g);
            let end = line[gap..].find(ends_bare).map_or(line.len(), |e| gap + e);
            let cred = &line[gap..end];
            let b64 =
                |c: char| c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '=' | '-' | '_');
            let hide = if basic {
                cred.len() >= 8 && cred.chars().all(b64)
            } else {
                !cred.is_empty() && cred != REDACTED
            };
            out.push_str(&line[i..gap]);
            out.push_str(if hide { REDACTED } else { cred });
            i = end;
            continue;
        }
        let c = line[i..].chars().next().unwrap_or(' ');
        out.push(c);
        i += c.len_utf8();
    }
    out
}

/// Hides the value of every secret-looking key: `k=v`, `k: v`, `"k": "v"`, `'k': 'v'`.
fn redact_key_values(line: &str) -> String {
    let key_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < line.len() {
        let c = line[i..].chars().next().unwrap_or(' ');
        let boundary = i == 0 || !line[..i].ends_with(key_char);
        if !(boundary && key_char(c)) {
            out.push(c);
            i += c.len_utf8();
            continue;
        }
        let key_end = line[i..]
            .find(|c: char| !key_char(c))
            .map_or(line.len(), |e| i + e);
        let key = &line[i..key_end];
        out.push_str(key);
        i = key_end;
        if !is_secret_key(key) {
            continue;
        }
        // Optional closing quote of a quoted key (`\"` inside a JSON string), spaces, then
        // `=` or `:`.
        let mut j = i;
        if line[j..].starts_with("\\\"") {
            j += 2;
        } else if line[j..].starts_with(['"', '\'']) {
            j += 1;
        }
        let spaced = |from: usize| {
            line[from..]
                .find(|c: char| c != ' ' && c != '\t')
                .map_or(line.len(), |g| from + g)
        };
        j = spaced(j);
        let Some(sep) = line[j..].chars().next().filter(|c| matches!(c, '=' | ':')) else {
            continue;
        };
        // `key: value` needs the space YAML needs; `key:value` is a URL scheme or a time.
        if sep == ':' && !line[j + 1..].starts_with([' ', '\t', '"', '\'', '\\']) {
            continue;
        }
        let v = spaced(j + 1);
        let escaped_quote = line[v..].starts_with("\\\"");
        let (open, body_start) = match line[v..].chars().next() {
            _ if escaped_quote => (Some('"'), v + 2),
            Some(q @ ('"' | '\'')) => (Some(q), v + 1),
            Some('{' | '[') | None => continue,
            Some(_) => (None, v),
        };
        let body_end = match open {
            // `\"value\"` inside a JSON string: up to the next `\`.
            Some(_) if escaped_quote => line[body_start..]
                .find('\\')
                .map_or(line.len(), |e| body_start + e),
            Some(q) => quoted_end(line, body_start, q),
            None => line[body_start..]
                .find(ends_bare)
                .map_or(line.len(), |e| body_start + e),
        };
        if body_end == body_start || &line[body_start..body_end] == REDACTED {
            continue;
        }
        out.push_str(&line[i..body_start]);
        out.push_str(REDACTED);
        i = body_end;
    }
    out
}

/// The index of the closing quote `q` (not escaped by `\\`) at or after `from`, or the
/// line's end without a newline.
fn quoted_end(line: &str, from: usize, q: char) -> usize {
    let mut escaped = false;
    for (k, c) in line[from..].char_indices() {
        match c {
            '\\' if !escaped => escaped = true,
            c if c == q && !escaped => return from + k,
            '\n' => return from + k,
            _ => escaped = false,
        }
    }
    line.len()
}

/// The files of a bundle and the notes about what could not be read.
#[derive(Debug, Default)]
pub struct Bundle {
    pub files: Vec<(String, Vec<u8>)>,
    pub notes: Vec<String>,
}

impl Bundle {
    fn yaml<T: Serialize>(&mut self, path: &str, obj: &T) {
        match serde_json::to_value(obj) {
            Ok(mut v) => {
                redact(&mut v);
                match serde_saphyr::to_string(&v) {
                    Ok(text) => self.files.push((path.to_string(), text.into_bytes())),
                    Err(e) => self.notes.push(format!("{path}: cannot encode: {e}")),
                }
            }
            Err(e) => self.notes.push(format!("{path}: cannot encode: {e}")),
        }
    }

    fn note(&mut self, part: &str, e: &kube::Error) {
        let why = match e {
            kube::Error::Api(s) if s.code == 403 || s.code == 401 => {
                format!("forbidden (RBAC): {}", s.message)
            }
            kube::Error::Api(s) if s.code == 404 => "not found".to_string(),
            other => other.to_string(),
        };
        self.notes.push(format!("{part}: skipped: {why}"));
    }

    /// The bundle as a gzip'd tar under `dir/`, `NOTES.txt` included.
    pub fn to_tar_gz(&self, dir: &str) -> std::io::Result<Vec<u8>> {
        let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        let mut tar = tar::Builder::new(gz);
        let mut notes = String::new();
        if self.notes.is_empty() {
            notes.push_str("Every part was collected.\n");
        }
        for n in &self.notes {
            notes.push_str(n);
            notes.push('\n');
        }
        let notes_file = ("NOTES.txt".to_string(), notes.into_bytes());
        for (path, body) in self.files.iter().chain(std::iter::once(&notes_file)) {
            let mut h = tar::Header::new_gnu();
            h.set_size(body.len() as u64);
            h.set_mode(0o644);
            h.set_mtime(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0),
            );
            h.set_cksum();
            tar.append_data(&mut h, format!("{dir}/{path}"), body.as_slice())?;
        }
        let gz = tar.into_inner()?;
        gz.finish()
    }
}

/// Collects the bundle of set `ns/name`. Fails only when the set itself cannot be read.
pub async fn collect(client: &Client, ns: &str, name: &str) -> Result<Bundle, CliError> {
    let mut b = Bundle::default();
    let sets: Api<CocoonSet> = Api::namespaced(client.clone(), ns);
    let set = sets
        .get(name)
        .await
        .map_err(|e| CliError::from_kube(&format!("cocoonset {ns}/{name}"), e))?;
    b.yaml("cocoonset.yaml", &set);

    let pods_api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().labels(&format!("{}={name}", labels::COCOONSET_NAME));
    let pods = match pods_api.list(&lp).await {
        Ok(l) => {
            b.yaml("pods.yaml", &list(&l.items));
            l.items
        }
        Err(e) => {
            b.note("pods.yaml", &e);
            Vec::new()
        }
    };
    let pod_names: BTreeSet<String> = pods.iter().map(|p| p.name_any()).collect();

    let chs: Api<CocoonHibernation> = Api::namespaced(client.clone(), ns);
    match chs.list(&ListParams::default()).await {
        Ok(l) => {
            let mine: Vec<&CocoonHibernation> = l
                .items
                .iter()
                .filter(|h| pod_names.contains(&h.spec.pod_ref.name))
                .collect();
            b.yaml("hibernations.yaml", &list(&mine));
        }
        Err(e) => b.note("hibernations.yaml", &e),
    }

    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    match events.list(&ListParams::default()).await {
        Ok(l) => {
            let mine: Vec<&Event> = l
                .items
                .iter()
                .filter(|e| {
                    let Some(r) = e.regarding.as_ref() else {
                        return false;
                    };
                    let n = r.name.as_deref().unwrap_or_default();
                    match r.kind.as_deref() {
                        Some("CocoonSet") => n == name,
                        Some("Pod" | "CocoonHibernation") => pod_names.contains(n),
                        _ => false,
                    }
                })
                .collect();
            b.yaml("events.yaml", &list(&mine));
        }
        Err(e) => b.note("events.yaml", &e),
    }

    let nodes: Api<Node> = Api::all(client.clone());
    let node_names: BTreeSet<String> = pods
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    let mut found = Vec::new();
    for n in &node_names {
        match nodes.get(n).await {
            Ok(node) => found.push(node),
            Err(e) => b.note(&format!("nodes.yaml ({n})"), &e),
        }
    }
    b.yaml("nodes.yaml", &list(&found));

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    match deployments.get(OPERATOR_DEPLOYMENT).await {
        Ok(d) => {
            b.yaml("operator/deployment.yaml", &d);
            operator_logs(client, &d, &mut b).await;
        }
        Err(e) => b.note("operator/deployment.yaml", &e),
    }

    let operator = match version::operator_version(client).await {
        Ok(v) => v,
        Err(e) => {
            b.note("version.json (operator)", &e);
            None
        }
    };
    let v = version::Versions {
        client: version::CLIENT_VERSION.to_string(),
        client_revision: version::CLIENT_REVISION.to_string(),
        operator,
    };
    if let Ok(text) = serde_json::to_string_pretty(&v) {
        b.files.push(("version.json".into(), text.into_bytes()));
    }
    Ok(b)
}

/// The recent logs of the operator Deployment's pods.
async fn operator_logs(client: &Client, d: &Deployment, b: &mut Bundle) {
    let selector = d
        .spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.as_ref())
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let list = match pods.list(&ListParams::default().labels(&selector)).await {
        Ok(l) => l.items,
        Err(e) => return b.note("operator/logs", &e),
    };
    for p in list {
        let lp = LogParams {
            container: Some("manager".into()),
            tail_lines: Some(LOG_TAIL),
            ..Default::default()
        };
        let path = format!("operator/logs/{}.log", p.name_any());
        match pods.logs(&p.name_any(), &lp).await {
            Ok(text) => b.files.push((path, redact_text(&text).into_bytes())),
            Err(e) => b.note(&path, &e),
        }
    }
}

fn list<T: Serialize>(items: &[T]) -> Value {
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items})
}

/// `report NAME [--file PATH]`: writes the bundle, prints its path on stdout and the notes on
/// stderr.
pub async fn run(
    client: &Client,
    ns: &str,
    name: &str,
    file: Option<&Path>,
) -> Result<(), CliError> {
    let b = collect(client, ns, name).await?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let dir = format!("cocoon-report-{ns}-{name}-{stamp}");
    let path: PathBuf = file
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(format!("{dir}.tar.gz")));
    let bytes = b.to_tar_gz(&dir)?;
    let mut f = std::fs::File::create(&path)
        .map_err(|e| CliError::Usage(format!("--file {}: {e}", path.display())))?;
    f.write_all(&bytes)?;
    for n in &b.notes {
        eprintln!("note: {n}");
    }
    println!("{}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn secrets_are_redacted_references_are_kept() {
        let mut v = json!({
            "metadata": {"annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{…}", "keep": "x"}},
            "spec": {"containers": [{"env": [
                {"name": "REGISTRY_TOKEN", "value": "s3cr3t"},
                {"name": "OCI_REGISTRY", "value": "reg:5000"},
                {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "pw"}}}
            ]}],
            "token": "abc", "secretName": "db", "tokenFile": "/var/run/token", "authToken": "zzz"}
        });
        redact(&mut v);
        let env = &v["spec"]["containers"][0]["env"];
        assert_eq!(env[0]["value"], REDACTED);
        assert_eq!(env[1]["value"], "reg:5000");
        assert_eq!(env[2]["valueFrom"]["secretKeyRef"]["name"], "db");
        assert_eq!(v["spec"]["token"], REDACTED);
        assert_eq!(v["spec"]["authToken"], REDACTED);
        assert_eq!(v["spec"]["secretName"], "db");
        assert_eq!(v["spec"]["tokenFile"], "/var/run/token");
        assert!(
            v["metadata"]["annotations"]
                .get("kubectl.kubernetes.io/last-applied-configuration")
                .is_none()
        );
        assert_eq!(v["metadata"]["annotations"]["keep"], "x");
    }

    #[test]
    fn redactor_table() {
        // (input line, expected output)
        let rows: &[(&str, &str)] = &[
            (
                "Authorization: Basic dXNlcjpodW50ZXIy",
                "Authorization: Basic [REDACTED]",
            ),
            (
                r#"{"headers":{"Authorization":"Basic dXNlcjpodW50ZXIy"}}"#,
                r#"{"headers":{"Authorization":"Basic [REDACTED]"}}"#,
            ),
            (
                "authorization: bearer abc.def",
                "authorization: bearer [REDACTED]",
            ),
            (
                "basic auth failed for user bob",
                "basic auth failed for user bob",
            ),
            (
                r#"{"token": "s3cr3t", "user": "bob"}"#,
                r#"{"token": "[REDACTED]", "user": "bob"}"#,
            ),
            (
                r#"{"token":"s3cr3t","n":1}"#,
                r#"{"token":"[REDACTED]","n":1}"#,
            ),
            (
                r#"{"password":"p\"w","n":1}"#,
                r#"{"password":"[REDACTED]","n":1}"#,
            ),
            ("password: hunter2", "password: [REDACTED]"),
            ("  token: 'abc'", "  token: '[REDACTED]'"),
            (
                "registry_password=hunter2 user=bob",
                "registry_password=[REDACTED] user=bob",
            ),
            ("DB_PASS=hunter2", "DB_PASS=[REDACTED]"),
            (
                "export AWS_ACCESS_KEY_ID=AKIAEXAMPLE",
                "export AWS_ACCESS_KEY_ID=[REDACTED]",
            ),
            (r#"accessKeyId: "AKIA""#, r#"accessKeyId: "[REDACTED]""#),
            ("BYPASS=1 COMPASS=n", "BYPASS=1 COMPASS=n"),
            (
                "pull https://bob:hunter2@reg.example:5000/v2/x failed",
                "pull https://[REDACTED]@reg.example:5000/v2/x failed",
            ),
            (
                "git clone https://ghp_tok@github.com/o/r",
                "git clone https://[REDACTED]@github.com/o/r",
            ),
            (
                "see https://reg.example/v2/@x",
                "see https://reg.example/v2/@x",
            ),
            (
                "tokenFile=/var/run/token secretName: db",
                "tokenFile=/var/run/token secretName: db",
            ),
            ("at 12:30:45 token:abc", "at 12:30:45 token:abc"),
            ("token: {nested: 1}", "token: {nested: 1}"),
            (
                r#"{"auths":{"reg.example:5000":{"auth":"dXNlcjpodW50ZXIy"}}}"#,
                r#"{"auths":{"reg.example:5000":{"auth":"[REDACTED]"}}}"#,
            ),
            (
                r#"{"auths":{"r":{"identitytoken":"idt","registrytoken":"rt","email":"e"}}}"#,
                r#"{"auths":{"r":{"identitytoken":"[REDACTED]","registrytoken":"[REDACTED]","email":"e"}}}"#,
            ),
            (
                r#"{"level":"info","msg":"{\"auths\":{\"r\":{\"auth\":\"dXNlcjpodW50ZXIy\"}}}"}"#,
                r#"{"level":"info","msg":"{\"auths\":{\"r\":{\"auth\":\"[REDACTED]\"}}}"}"#,
            ),
            (
                "pull secret data: eyJhdXRocyI6eyJyZWcuZXhhbXBsZTo1MDAwIjp7ImF1dGgiOiJkWE5sY2pwb2RXNTBaWEl5In19fQ==",
                "pull secret data: [REDACTED]",
            ),
            (
                "config=eyJhdXRocyI6eyJyZWcuZXhhbXBsZTo1MDAwIjp7ImF1dGgiOiJkWE5sY2pwb2RXNTBaWEl5In19",
                "config=[REDACTED]",
            ),
            (
                ".dockerconfigjson: eyJhdXRocyI6eyJyZWcuZXhhbXBsZTo1MDAwIjp7ImF1dGgiOiJkWE5sY2pwb2RXNTBaWEl5In19fQ==",
                ".dockerconfigjson: [REDACTED]",
            ),
            ("auth: enabled=true", "auth: [REDACTED]"),
            (
                "aGVsbG8gd29ybGQsIGhlbGxvIGFnYWlu decodes to prose",
                "aGVsbG8gd29ybGQsIGhlbGxvIGFnYWlu decodes to prose",
            ),
            ("plain line", "plain line"),
        ];
        for (input, want) in rows {
            assert_eq!(redact_text(input), *want, "{input:?}");
        }
    }

    #[test]
    fn object_strings_get_the_text_rules() {
        let mut v = json!({"env": [
            {"name": "OCI_REGISTRY", "value": "https://bob:hunter2@reg:5000"},
            {"name": "SMTP_PASS", "value": "x"},
            {"name": "AWS_ACCESS_KEY_ID", "value": "AKIA"}
        ], "note": "login with Authorization: Basic dXNlcjpodW50ZXIy"});
        redact(&mut v);
        assert_eq!(v["env"][0]["value"], "https://[REDACTED]@reg:5000");
        assert_eq!(v["env"][1]["value"], REDACTED);
        assert_eq!(v["env"][2]["value"], REDACTED);
        assert_eq!(v["note"], "login with Authorization: Basic [REDACTED]");
    }

    /// A Docker `config.json` as a JSON document, as a Secret's base64 data, and as the
    /// base64 value of an annotation.
    #[test]
    fn docker_config_credentials_are_redacted_in_every_shape() {
        let b64 =
            "eyJhdXRocyI6eyJyZWcuZXhhbXBsZTo1MDAwIjp7ImF1dGgiOiJkWE5sY2pwb2RXNTBaWEl5In19fQ==";
        let mut v = json!({
            "document": {"auths": {"reg:5000": {
                "auth": "dXNlcjpodW50ZXIy", "identitytoken": "idt", "registrytoken": "rt",
                "username": "user"
            }}},
            "secret": {"type": "kubernetes.io/dockerconfigjson",
                "data": {".dockerconfigjson": b64},
                "stringData": {".dockercfg": "{\"reg\":{\"auth\":\"x\"}}"}},
            "annotations": {"example.com/pull-config": b64}
        });
        redact(&mut v);
        let auth = &v["document"]["auths"]["reg:5000"];
        assert_eq!(auth["auth"], REDACTED);
        assert_eq!(auth["identitytoken"], REDACTED);
        assert_eq!(auth["registrytoken"], REDACTED);
        assert_eq!(auth["username"], "user", "not a secret");
        assert_eq!(v["secret"]["data"][".dockerconfigjson"], REDACTED);
        assert_eq!(v["secret"]["stringData"][".dockercfg"], REDACTED);
        assert_eq!(v["annotations"]["example.com/pull-config"], REDACTED);
        assert!(!v.to_string().contains("dXNlcjpodW50ZXIy"));
    }

    #[test]
    fn log_text_loses_its_tokens() {
        let text =
            "GET /x Authorization: Bearer eyJabc\nlogin password=hunter2 user=bob\nplain line\n";
        assert_eq!(
            redact_text(text),
            "GET /x Authorization: Bearer [REDACTED]\nlogin password=[REDACTED] user=bob\nplain line\n"
        );
    }
}
