//! The runtime error type and the error-phrase classifier of §3.4, shared by both backends so
//! the simulator's texts go through the same parser as the real CLI's.
//!
//! Matching is a case-insensitive substring test; a bare "not found" is never matched because
//! it can also mean that the binary or its configuration is missing.

use thiserror::Error;

/// Result of every runtime operation.
pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;

/// Errors of the runtime layer. The message is always the full text (for the CLI backend it
/// embeds the stderr or output), so `to_string()` is what callers wrap and report.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RuntimeError {
    /// `VM not found` / `no such vm`: definitive for `inspect` and `remove`.
    #[error("{0}")]
    VmNotFound(String),
    /// `snapshot not found` / `no such snapshot`.
    #[error("{0}")]
    SnapshotNotFound(String),
    /// `not found in any backend`.
    #[error("{0}")]
    ImageNotFound(String),
    /// A name is taken: `already exists`, `already in use by <ID>` or `(held by <ID>)`.
    /// `holder` is the id parsed after `already in use by ` / `held by `, if any (§3.3).
    #[error("{message}")]
    AlreadyExists {
        /// Full error text.
        message: String,
        /// Id of the snapshot holding the name, when the wording names it.
        holder: Option<String>,
    },
    /// `is in use by an active` clone/restore/export: retry later.
    #[error("{0}")]
    InUse(String),
    /// `exec` ran and the guest command exited non-zero.
    #[error("{message}")]
    ExitCode {
        /// The guest exit code (never 0).
        code: i32,
        /// `cocoon vm exec <id>: exit <n>`.
        message: String,
    },
    /// The operation was cancelled before it completed.
    #[error("cancelled: {0}")]
    Cancelled(String),
    /// The installed `cocoon` lacks a feature the request needs (capability detection, §3.1),
    /// or the backend cannot do it at all (net resize on Firecracker).
    #[error("{0}")]
    Unsupported(String),
    /// Anything else: spawn/transport failures, undecodable output, other CLI errors.
    #[error("{0}")]
    Other(String),
    /// A name, ref or path that must not reach the `cocoon` argv (it could read as a flag or
    /// break the argument rules); refused before anything runs.
    #[error("{0}")]
    InvalidArgument(String),
}

impl RuntimeError {
    /// True for [`RuntimeError::VmNotFound`].
    pub fn is_vm_not_found(&self) -> bool {
        matches!(self, RuntimeError::VmNotFound(_))
    }

    /// True for [`RuntimeError::SnapshotNotFound`].
    pub fn is_snapshot_not_found(&self) -> bool {
        matches!(self, RuntimeError::SnapshotNotFound(_))
    }

    /// True for [`RuntimeError::ImageNotFound`].
    pub fn is_image_not_found(&self) -> bool {
        matches!(self, RuntimeError::ImageNotFound(_))
    }

    /// The guest exit code of a failed `exec`, if that is what this is.
    pub fn exit_code(&self) -> Option<i32> {
        match self {
            RuntimeError::ExitCode { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Builds an [`RuntimeError::ExitCode`] with the CLI's wording.
    pub fn exit(id: &str, code: i32) -> Self {
        RuntimeError::ExitCode {
            code,
            message: format!("cocoon vm exec {id}: exit {code}"),
        }
    }
}

/// Phrases of §3.4, lower-case.
const VM_NOT_FOUND: &[&str] = &["vm not found", "no such vm"];
const SNAPSHOT_NOT_FOUND: &[&str] = &["snapshot not found", "no such snapshot"];
const IMAGE_NOT_FOUND: &[&str] = &["not found in any backend"];
const IN_USE: &[&str] = &["is in use by an active"];
const ALREADY: &[&str] = &["already exists", "already in use by", "held by"];
/// The CLI's flag parser refused the invocation (a release without that flag): nothing ran.
const UNKNOWN_FLAG: &[&str] = &["unknown flag: ", "unknown shorthand flag: "];

fn contains_any(haystack_lower: &str, phrases: &[&str]) -> bool {
    phrases.iter().any(|p| haystack_lower.contains(p))
}

/// True when the text says the snapshot is missing (`snapshot rm` treats that as success).
pub fn says_snapshot_not_found(text: &str) -> bool {
    contains_any(&text.to_ascii_lowercase(), SNAPSHOT_NOT_FOUND)
}

/// True when the text is the CLI's flag parser refusing a flag (`unknown flag: --tail`,
/// `unknown shorthand flag: 'i' in -i`).
pub fn says_unknown_flag(text: &str) -> bool {
    contains_any(&text.to_ascii_lowercase(), UNKNOWN_FLAG)
}

/// Maps an error text to its class by the §3.4 phrases; unmatched text is `Other`.
///
/// An unknown flag (`unknown flag: `, `unknown shorthand flag: `) is tested first and is
/// [`RuntimeError::Unsupported`]: the installed release lacks the flag and nothing ran, so
/// no other phrase in the text can be a result.
///
/// The lock phrase (`is in use by an active`) is tested before the name-taken phrases so that
/// a lock message that happens to mention a holder is still retried, not healed.
pub fn classify(message: impl Into<String>) -> RuntimeError {
    let message = message.into();
    let lower = message.to_ascii_lowercase();
    if contains_any(&lower, UNKNOWN_FLAG) {
        RuntimeError::Unsupported(message)
    } else if contains_any(&lower, VM_NOT_FOUND) {
        RuntimeError::VmNotFound(message)
    } else if contains_any(&lower, SNAPSHOT_NOT_FOUND) {
        RuntimeError::SnapshotNotFound(message)
    } else if contains_any(&lower, IMAGE_NOT_FOUND) {
        RuntimeError::ImageNotFound(message)
    } else if contains_any(&lower, IN_USE) {
        RuntimeError::InUse(message)
    } else if contains_any(&lower, ALREADY) {
        let holder = parse_holder(&message);
        RuntimeError::AlreadyExists { message, holder }
    } else {
        RuntimeError::Other(message)
    }
}

/// The text without ANSI escape sequences (colour codes of the CLI's log lines): CSI
/// (`ESC [ ... final`), OSC (`ESC ] ... BEL` or `ESC \\`) and two-byte escapes.
pub fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('[') => {
                // Parameters and intermediates up to the final byte (0x40..=0x7e).
                for c in chars.by_ref() {
                    if ('\u{40}'..='\u{7e}').contains(&c) {
                        break;
                    }
                }
            }
            Some(']') => {
                while let Some(c) = chars.next() {
                    if c == '\u{7}' {
                        break;
                    }
                    if c == '\u{1b}' && chars.peek() == Some(&'\\') {
                        chars.next();
                        break;
                    }
                }
            }
            // A two-byte escape (or a lone ESC at the end): dropped.
            _ => {}
        }
    }
    out
}

/// The holder id of a name collision: the word after `already in use by ` or `held by `
/// (case-insensitive), stripped of quotes and closing punctuation (§3.3 step 1).
pub fn parse_holder(message: &str) -> Option<String> {
    let lower = message.to_ascii_lowercase();
    ["already in use by ", "held by "]
        .iter()
        .find_map(|marker| {
            let at = lower.find(marker)? + marker.len();
            // ASCII lower-casing keeps byte offsets, so `at` indexes the original text.
            let word = message.get(at..)?.split_whitespace().next()?;
            let id = word.trim_matches(|c: char| {
                matches!(c, '"' | '\'' | '(' | ')' | '.' | ',' | ';' | ':')
            });
            (!id.is_empty()).then(|| id.to_owned())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phrases_map_to_classes_case_insensitively() {
        let cases: &[(&str, &str)] = &[
            ("Error: VM not found: abc", "vm"),
            ("lookup: No such VM abc", "vm"),
            ("snapshot not found: vk-a", "snapshot"),
            ("NO SUCH SNAPSHOT", "snapshot"),
            ("image ubuntu:24.04 not found in any backend", "image"),
            (r#"snapshot "vk-a" is in use by an active export"#, "in_use"),
            (r#"snapshot name "vk-a" already exists"#, "exists"),
            (
                r#"snapshot name "vk-a" already in use by 0123abcd"#,
                "exists",
            ),
            (
                r#"snapshot name "vk-a" is taken (held by 0123abcd)"#,
                "exists",
            ),
            // A generic "not found" (missing binary, missing config) is not a class.
            ("exec: cocoon: not found", "other"),
            ("config file not found", "other"),
        ];
        for (text, want) in cases {
            let got = match classify(*text) {
                RuntimeError::VmNotFound(_) => "vm",
                RuntimeError::SnapshotNotFound(_) => "snapshot",
                RuntimeError::ImageNotFound(_) => "image",
                RuntimeError::InUse(_) => "in_use",
                RuntimeError::AlreadyExists { .. } => "exists",
                _ => "other",
            };
            assert_eq!(got, *want, "{text}");
        }
    }

    #[test]
    fn classification_keeps_the_full_text() {
        let e = classify("cocoon vm inspect x: exit status 1 (stderr: VM not found)");
        assert_eq!(
            e.to_string(),
            "cocoon vm inspect x: exit status 1 (stderr: VM not found)"
        );
    }

    #[test]
    fn holder_is_parsed_from_both_new_wordings_only() {
        let cases: &[(&str, Option<&str>)] = &[
            (r#"snapshot name "x" already exists"#, None),
            (
                r#"snapshot name "x" already in use by 9f86d081"#,
                Some("9f86d081"),
            ),
            (
                r#"snapshot name "x" already in use by "9f86d081"."#,
                Some("9f86d081"),
            ),
            (
                r#"snapshot name "x" already exists (held by 9f86d081)"#,
                Some("9f86d081"),
            ),
            ("HELD BY abc123)", Some("abc123")),
            ("held by ", None),
        ];
        for (text, want) in cases {
            assert_eq!(parse_holder(text).as_deref(), *want, "{text}");
        }
        match classify(r#"snapshot name "x" already in use by 9f86d081"#) {
            RuntimeError::AlreadyExists { holder, .. } => {
                assert_eq!(holder.as_deref(), Some("9f86d081"))
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn unknown_flags_are_unsupported_before_any_other_phrase() {
        let cases: &[(&str, bool)] = &[
            ("Error: unknown flag: --tail", true),
            ("Error: unknown shorthand flag: 'i' in -i", true),
            (
                "x: exit status 1 (stderr: Error: unknown flag: --nics)",
                true,
            ),
            // Even when the refused argument looks like another phrase.
            ("Error: unknown flag: --vm-not-found", true),
            ("Error: VM not found", false),
            ("unknown command \"exec\"", false),
        ];
        for (text, want) in cases {
            let got = matches!(classify(*text), RuntimeError::Unsupported(_));
            assert_eq!(got, *want, "{text}");
            assert_eq!(says_unknown_flag(text), *want, "{text}");
        }
    }

    #[test]
    fn ansi_escapes_are_stripped() {
        let cases: &[(&str, &str)] = &[
            ("plain", "plain"),
            (
                "\u{1b}[90m01 Dec 26 09:32 UTC\u{1b}[0m \u{1b}[32mINF\u{1b}[0m \u{1b}[1mimporting\u{1b}[0m",
                "01 Dec 26 09:32 UTC INF importing",
            ),
            ("\u{1b}[38;5;196mred\u{1b}[m!", "red!"),
            ("a\u{1b}]0;title\u{7}b", "ab"),
            ("a\u{1b}]8;;x\u{1b}\\b", "ab"),
            ("trailing\u{1b}", "trailing"),
            ("ünïcode \u{1b}[1m✓\u{1b}[0m", "ünïcode ✓"),
        ];
        for (text, want) in cases {
            assert_eq!(strip_ansi(text), *want, "{text:?}");
        }
    }

    #[test]
    fn exit_code_wording() {
        let e = RuntimeError::exit("vm1", 3);
        assert_eq!(e.exit_code(), Some(3));
        assert_eq!(e.to_string(), "cocoon vm exec vm1: exit 3");
        assert_eq!(classify("boom").exit_code(), None);
    }
}
