//! Typed registry errors (registry.md §3): callers branch on the class, and only `NotFound`
//! means "absent"; every other class fails closed. Also maps HTTP answers to those classes.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The class a caller branches on (registry.md §3, plus the local classes of this crate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// HTTP 404: the manifest, blob or repository does not exist.
    NotFound,
    /// HTTP 401 after any token exchange, or a token endpoint refusing the credentials.
    Unauthorized,
    /// HTTP 403.
    Forbidden,
    /// HTTP 5xx.
    Server,
    /// Connect, TLS, timeout, reset, or an I/O error on the connection.
    Transport,
    /// Other 4xx, malformed JSON, digest or size mismatch, a manifest of the wrong kind.
    Protocol,
    /// Bad input from the caller or the environment (names the field).
    Invalid,
    /// A local file or process error (snapshot directory, spool file, credential helper).
    Local,
}

/// A registry error. `Display` is the message callers show; [`Error::class`] is what they
/// branch on.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// 404. For manifests the message is exactly `manifest not found` (registry.md §3).
    #[error("{what} not found")]
    NotFound {
        /// `manifest`, `blob`, `repository`, ...
        what: String,
        /// The OCI error code, when the registry sent one (`MANIFEST_UNKNOWN`, ...).
        code: Option<String>,
    },

    /// 401 (after the token exchange, if any).
    #[error("unauthorized: {message}")]
    Unauthorized { message: String },

    /// 403.
    #[error("forbidden: {message}")]
    Forbidden { message: String },

    /// 5xx.
    #[error("registry server error {status}: {message}")]
    Server { status: u16, message: String },

    /// Connect, TLS, timeout, reset.
    #[error("transport: {message}")]
    Transport {
        message: String,
        /// Whether this was a timeout (the call or the transfer made no progress in time).
        timeout: bool,
    },

    /// Other 4xx and malformed answers.
    #[error("{}{message}", protocol_prefix(*status, code.as_deref()))]
    Protocol {
        status: Option<u16>,
        code: Option<String>,
        message: String,
        /// A `Retry-After` the registry sent with a 429.
        retry_after: Option<Duration>,
    },

    /// Deletion is disabled on the registry (405, or 400 `UNSUPPORTED`).
    #[error("manifest deletion is disabled on the registry (HTTP {status})")]
    DeleteUnsupported { status: u16 },

    /// The bytes did not hash to the digest that names them.
    #[error("digest mismatch for {what}: expected {expected}, got {actual}")]
    DigestMismatch {
        what: String,
        expected: String,
        actual: String,
    },

    /// The byte count differed from the descriptor's size.
    #[error("size mismatch for {what}: expected {expected} bytes, got {actual}")]
    SizeMismatch {
        what: String,
        expected: u64,
        actual: u64,
    },

    /// The manifest is not of the kind the operation needs.
    #[error("manifest is {kind}, not a {wanted}")]
    WrongKind { kind: String, wanted: String },

    /// Bad input: `field` names the flag, variable or manifest field.
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },

    /// `OCI_REGISTRY` (or another required setting) is missing.
    #[error("{name} must be set")]
    MissingSetting { name: String },

    /// A local I/O error, with what was being done.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },

    /// A `docker-credential-<helper>` gave no answer in time and was killed.
    #[error("docker-credential-{helper} get: no answer within {}; killed", cocoon_api::contract::go_duration(*.after))]
    HelperTimeout {
        /// The helper's name (`docker-credential-` is prepended).
        helper: String,
        /// The limit it ran into.
        after: Duration,
    },

    /// A paginated listing went past a bound (page cap, entry cap, or a `Link` loop).
    #[error("list {what}: {reason}")]
    ListLimit { what: String, reason: String },

    /// The caller's [`crate::ManifestGate`] refused the manifest put: nothing is under the tag.
    #[error("manifest put withheld: {reason}")]
    ManifestWithheld { reason: String },

    /// An error with the caller's context prepended; the class is the inner error's.
    #[error("{context}: {source}")]
    Context {
        context: String,
        #[source]
        source: Box<Error>,
    },
}

/// `registry protocol error 400 CODE: ` for HTTP answers; nothing for local checks, whose
/// messages are the spec's own (`config blob too large`, ...).
fn protocol_prefix(status: Option<u16>, code: Option<&str>) -> String {
    match (status, code) {
        (Some(s), Some(c)) => format!("registry protocol error {s} {c}: "),
        (Some(s), None) => format!("registry protocol error {s}: "),
        (None, Some(c)) => format!("registry protocol error {c}: "),
        (None, None) => String::new(),
    }
}

impl Error {
    /// The class callers branch on.
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::NotFound { .. } => ErrorClass::NotFound,
            Error::Unauthorized { .. } => ErrorClass::Unauthorized,
            Error::Forbidden { .. } => ErrorClass::Forbidden,
            Error::Server { .. } => ErrorClass::Server,
            Error::Transport { .. } => ErrorClass::Transport,
            Error::Protocol { .. }
            | Error::DeleteUnsupported { .. }
            | Error::DigestMismatch { .. }
            | Error::SizeMismatch { .. }
            | Error::WrongKind { .. }
            | Error::ListLimit { .. }
            | Error::ManifestWithheld { .. } => ErrorClass::Protocol,
            Error::Invalid { .. } | Error::MissingSetting { .. } => ErrorClass::Invalid,
            Error::Io { .. } | Error::HelperTimeout { .. } => ErrorClass::Local,
            Error::Context { source, .. } => source.class(),
        }
    }

    /// True only for "absent" (registry.md §3: the one class that does not fail closed).
    pub fn is_not_found(&self) -> bool {
        self.class() == ErrorClass::NotFound
    }

    /// True for 401 and 403.
    pub fn is_auth(&self) -> bool {
        matches!(
            self.class(),
            ErrorClass::Unauthorized | ErrorClass::Forbidden
        )
    }

    /// Whether retrying the same call may succeed: transport errors, 5xx (except 501 and
    /// 505, which will not change), 408 and 429.
    pub fn is_transient(&self) -> bool {
        match self.innermost() {
            Error::Transport { .. } => true,
            Error::Server { status, .. } => !matches!(status, 501 | 505),
            Error::Protocol {
                status: Some(408 | 429),
                ..
            } => true,
            _ => false,
        }
    }

    /// The `Retry-After` the registry asked for, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self.innermost() {
            Error::Protocol { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// The HTTP status behind this error, if it came from one.
    pub fn status(&self) -> Option<u16> {
        match self.innermost() {
            Error::NotFound { .. } => Some(404),
            Error::Server { status, .. } | Error::DeleteUnsupported { status } => Some(*status),
            Error::Protocol { status, .. } => *status,
            _ => None,
        }
    }

    /// Prepends `context` (`probe snapshot vm:hibernate: ...`), keeping the class.
    pub fn context(self, context: impl Into<String>) -> Error {
        Error::Context {
            context: context.into(),
            source: Box::new(self),
        }
    }

    fn innermost(&self) -> &Error {
        match self {
            Error::Context { source, .. } => source.innermost(),
            e => e,
        }
    }

    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Error {
        Error::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn protocol(message: impl Into<String>) -> Error {
        Error::Protocol {
            status: None,
            code: None,
            message: message.into(),
            retry_after: None,
        }
    }

    pub(crate) fn transport(message: impl fmt::Display) -> Error {
        Error::Transport {
            message: message.to_string(),
            timeout: false,
        }
    }

    pub(crate) fn timeout(message: impl fmt::Display) -> Error {
        Error::Transport {
            message: message.to_string(),
            timeout: true,
        }
    }
}

/// Adds context to a `Result`'s error.
pub trait ResultExt<T> {
    /// Prepends `context` to the error, keeping its class.
    fn context(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> ResultExt<T> for Result<T> {
    fn context(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| e.context(context()))
    }
}

/// The OCI error body: `{"errors":[{"code":"...","message":"..."}]}`.
#[derive(Debug, Default, Deserialize)]
struct ErrorBody {
    #[serde(default)]
    errors: Vec<ErrorEntry>,
}

#[derive(Debug, Default, Deserialize)]
struct ErrorEntry {
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
}

/// The first OCI error code and message of a response body, if it has one.
pub(crate) fn parse_error_body(body: &[u8]) -> Option<(String, String)> {
    let parsed: ErrorBody = serde_json::from_slice(body).ok()?;
    parsed
        .errors
        .into_iter()
        .next()
        .map(|e| (e.code, e.message))
}

/// Maps a non-success HTTP answer to its class (registry.md §3). `what` names the object for
/// 404s (`manifest`, `blob`, ...); `body` is the (possibly truncated) response body.
pub(crate) fn error_from_status(
    what: &str,
    status: u16,
    body: &[u8],
    retry_after: Option<Duration>,
) -> Error {
    let (code, msg) = match parse_error_body(body) {
        Some((c, m)) => (Some(c).filter(|c| !c.is_empty()), m),
        None => (None, String::from_utf8_lossy(body).trim().to_string()),
    };
    let message = if msg.is_empty() {
        http::StatusCode::from_u16(status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or("no message")
            .to_string()
    } else {
        truncate(&msg, 512)
    };
    match status {
        404 => Error::NotFound {
            what: what.to_string(),
            code,
        },
        401 => Error::Unauthorized { message },
        403 => Error::Forbidden { message },
        500..=599 => Error::Server { status, message },
        _ => Error::Protocol {
            status: Some(status),
            code,
            message,
            retry_after,
        },
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_answers_map_to_the_classes_of_registry_md_section_3() {
        let oci = |code: &str| format!(r#"{{"errors":[{{"code":"{code}","message":"m"}}]}}"#);
        let cases: &[(u16, String, ErrorClass)] = &[
            (404, oci("MANIFEST_UNKNOWN"), ErrorClass::NotFound),
            (404, oci("NAME_UNKNOWN"), ErrorClass::NotFound),
            (404, oci("BLOB_UNKNOWN"), ErrorClass::NotFound),
            (404, "404 page not found".into(), ErrorClass::NotFound),
            (401, oci("UNAUTHORIZED"), ErrorClass::Unauthorized),
            (403, oci("DENIED"), ErrorClass::Forbidden),
            (500, String::new(), ErrorClass::Server),
            (503, String::new(), ErrorClass::Server),
            (400, oci("MANIFEST_BLOB_UNKNOWN"), ErrorClass::Protocol),
            (400, oci("DIGEST_INVALID"), ErrorClass::Protocol),
            (405, String::new(), ErrorClass::Protocol),
            (429, String::new(), ErrorClass::Protocol),
        ];
        for (status, body, want) in cases {
            let e = error_from_status("manifest", *status, body.as_bytes(), None);
            assert_eq!(e.class(), *want, "{status} {body}");
        }
    }

    #[test]
    fn manifest_not_found_message_is_exact() {
        let e = error_from_status("manifest", 404, b"", None);
        assert_eq!(e.to_string(), "manifest not found");
        assert!(e.is_not_found());
    }

    #[test]
    fn only_transport_5xx_408_and_429_are_transient() {
        let transient = [
            Error::transport("reset"),
            Error::timeout("no progress"),
            error_from_status("x", 500, b"", None),
            error_from_status("x", 502, b"", None),
            error_from_status("x", 503, b"", None),
            error_from_status("x", 429, b"", None),
            error_from_status("x", 408, b"", None),
        ];
        for e in &transient {
            assert!(e.is_transient(), "{e}");
        }
        let permanent = [
            error_from_status("x", 404, b"", None),
            error_from_status("x", 401, b"", None),
            error_from_status("x", 403, b"", None),
            error_from_status("x", 400, b"", None),
            error_from_status("x", 501, b"", None),
            Error::invalid("OCI_REGISTRY", "bad"),
            Error::DigestMismatch {
                what: "b".into(),
                expected: "a".into(),
                actual: "c".into(),
            },
        ];
        for e in &permanent {
            assert!(!e.is_transient(), "{e}");
        }
    }

    #[test]
    fn context_keeps_class_and_prefixes_message() {
        let e = Error::transport("connection refused").context("probe snapshot vm-a:hibernate");
        assert_eq!(e.class(), ErrorClass::Transport);
        assert!(e.is_transient());
        assert_eq!(
            e.to_string(),
            "probe snapshot vm-a:hibernate: transport: connection refused"
        );
    }

    #[test]
    fn oci_code_and_message_are_reported() {
        let body = br#"{"errors":[{"code":"MANIFEST_BLOB_UNKNOWN","message":"blob unknown to registry"}]}"#;
        let e = error_from_status("manifest", 400, body, None);
        assert_eq!(
            e.to_string(),
            "registry protocol error 400 MANIFEST_BLOB_UNKNOWN: blob unknown to registry"
        );
    }
}
