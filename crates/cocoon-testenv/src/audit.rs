//! The API server's audit log (Metadata level, service accounts of `cocoon-system` only): what
//! a component under test actually called, to compare with what its RBAC grants.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use k8s_openapi::jiff::Timestamp;

use crate::error::{Error, Result};

/// One audited request (stage `ResponseComplete` or `Panic`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct AuditRecord {
    /// The authenticated user (`system:serviceaccount:<ns>:<name>`).
    pub user: String,
    /// The API verb (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, …).
    pub verb: String,
    /// The API group ("" for the core group).
    pub api_group: String,
    /// The resource, with `/<subresource>` when there is one (`pods/status`).
    pub resource: String,
    /// The namespace ("" for cluster-scoped or all-namespace requests).
    pub namespace: String,
    /// The object name ("" for collections).
    pub name: String,
    /// The response code (0 when the record has none).
    pub code: u16,
    /// The request's `User-Agent` ("" when it sent none).
    pub user_agent: String,
    /// When the API server received the request (`requestReceivedTimestamp`, microseconds).
    pub received: Option<Timestamp>,
    /// When the record's stage was reached (`stageTimestamp`): for `ResponseComplete`, when
    /// the response was sent, so a write's effect was durable by then.
    pub completed: Option<Timestamp>,
}

impl AuditRecord {
    /// Whether the request could change state (`create`, `update`, `patch`, `delete`,
    /// `deletecollection`): what a controller's "no write" promise is about.
    pub fn is_write(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        )
    }
}

/// The audit log of a test environment.
#[derive(Debug, Clone)]
pub struct AuditLog {
    path: PathBuf,
}

impl AuditLog {
    /// The log at `path` (it may not exist yet: nothing audited so far).
    pub fn at(path: impl Into<PathBuf>) -> Self {
        AuditLog { path: path.into() }
    }

    /// Where the log is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every completed request `user` made so far, in log order.
    pub fn records_of(&self, user: &str) -> Result<Vec<AuditRecord>> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(Error::io(format!("reading {}", self.path.display()), e)),
        };
        let mut out = Vec::new();
        // The last line may be half written while the API server appends: skip what does not
        // parse rather than fail.
        for line in text.lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            let record = parse(&v);
            if let Some(r) = record.filter(|r| r.user == user) {
                out.push(r);
            }
        }
        Ok(out)
    }

    /// The completed writes ([`AuditRecord::is_write`]) `user` made in `namespace` so far,
    /// in log order.
    pub fn writes_of(&self, user: &str, namespace: &str) -> Result<Vec<AuditRecord>> {
        Ok(self
            .records_of(user)?
            .into_iter()
            .filter(|r| r.is_write() && r.namespace == namespace)
            .collect())
    }

    /// The distinct (group, resource, verb) triples `user` called so far.
    pub fn calls_of(&self, user: &str) -> Result<BTreeSet<(String, String, String)>> {
        Ok(self
            .records_of(user)?
            .into_iter()
            .map(|r| (r.api_group, r.resource, r.verb))
            .collect())
    }
}

fn parse(v: &serde_json::Value) -> Option<AuditRecord> {
    let stage = v.get("stage")?.as_str()?;
    if stage != "ResponseComplete" && stage != "Panic" {
        return None;
    }
    let text = |x: Option<&serde_json::Value>| x.and_then(|s| s.as_str()).unwrap_or("").to_owned();
    let obj = v.get("objectRef");
    let field = |k: &str| text(obj.and_then(|o| o.get(k)));
    let sub = field("subresource");
    let resource = field("resource");
    if resource.is_empty() {
        // Non-resource URLs (/version, /readyz …) are not governed by these roles.
        return None;
    }
    Some(AuditRecord {
        user: text(v.get("user").and_then(|u| u.get("username"))),
        verb: text(v.get("verb")),
        api_group: field("apiGroup"),
        resource: if sub.is_empty() {
            resource
        } else {
            format!("{resource}/{sub}")
        },
        namespace: field("namespace"),
        name: field("name"),
        code: v
            .get("responseStatus")
            .and_then(|s| s.get("code"))
            .and_then(|c| c.as_u64())
            .and_then(|c| u16::try_from(c).ok())
            .unwrap_or(0),
        user_agent: text(v.get("userAgent")),
        received: text(v.get("requestReceivedTimestamp")).parse().ok(),
        completed: text(v.get("stageTimestamp")).parse().ok(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_completed_resource_requests_of_one_user() {
        let dir = std::env::temp_dir().join(format!("audit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("audit.log");
        let sa = "system:serviceaccount:cocoon-system:cocoon-operator";
        let lines = [
            format!(
                r#"{{"stage":"ResponseComplete","verb":"patch","user":{{"username":"{sa}"}},"userAgent":"cocoon-operator/0.1.0","requestReceivedTimestamp":"2026-12-01T17:00:00.123456Z","stageTimestamp":"2026-12-01T17:00:00.234567Z","objectRef":{{"resource":"cocoonsets","subresource":"status","namespace":"a","name":"s","apiGroup":"cocoonset.cocoonstack.io"}},"responseStatus":{{"code":200}}}}"#
            ),
            format!(
                r#"{{"stage":"ResponseStarted","verb":"watch","user":{{"username":"{sa}"}},"objectRef":{{"resource":"pods"}}}}"#
            ),
            r#"{"stage":"ResponseComplete","verb":"get","user":{"username":"other"},"objectRef":{"resource":"pods"}}"#.into(),
            format!(r#"{{"stage":"ResponseComplete","verb":"get","user":{{"username":"{sa}"}},"requestURI":"/version"}}"#),
            format!(r#"{{"stage":"ResponseComplete","verb":"create","user":{{"username":"{sa}"}},"objectRef":{{"resource":"leases","apiGroup":"coordination.k8s.io"}},"responseStatus":{{"code":403}}}}"#),
            "{\"stage\":\"Resp".into(),
        ];
        std::fs::write(&path, lines.join("\n")).unwrap();
        let log = AuditLog::at(&path);
        let records = log.records_of(sa).unwrap();
        assert_eq!(records.len(), 2, "{records:?}");
        assert_eq!(records[0].resource, "cocoonsets/status");
        assert_eq!(records[0].code, 200);
        assert_eq!(records[0].user_agent, "cocoon-operator/0.1.0");
        assert_eq!(records[1].user_agent, "");
        assert_eq!(
            records[0].received,
            Some("2026-12-01T17:00:00.123456Z".parse().unwrap())
        );
        assert_eq!(
            records[0].completed.map(|t| t.as_microsecond() % 1_000_000),
            Some(234_567)
        );
        assert_eq!(records[1].completed, None, "a record without timestamps");
        assert_eq!(records[1].code, 403);
        let calls = log.calls_of(sa).unwrap();
        assert!(calls.contains(&(
            "coordination.k8s.io".into(),
            "leases".into(),
            "create".into()
        )));
        let writes = log.writes_of(sa, "a").unwrap();
        assert_eq!(
            writes.len(),
            1,
            "the patch in `a`, not the reads: {writes:?}"
        );
        assert_eq!(writes[0].verb, "patch");
        assert!(
            log.writes_of(sa, "b").unwrap().is_empty(),
            "other namespaces"
        );
        assert!(
            AuditLog::at(dir.join("missing"))
                .records_of(sa)
                .unwrap()
                .is_empty()
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
