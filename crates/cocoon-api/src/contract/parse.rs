//! The general parsing and writing rules of `contract.md` §1, as small infallible helpers.
//! Readers never fail: a malformed value reads as the documented default.

use std::collections::BTreeMap;

use super::annotations::TRUE;

/// True only for the exact string `true`; anything else (including `TRUE`, `yes`) is false.
pub fn parse_bool(value: Option<&str>) -> bool {
    value == Some(TRUE)
}

/// Plain decimal int64; missing or unparsable reads as 0.
pub fn parse_i64(value: Option<&str>) -> i64 {
    value.and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// Plain decimal int32 (ports); missing or unparsable reads as 0.
pub fn parse_i32(value: Option<&str>) -> i32 {
    value.and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// Comma list: items trimmed, empty items dropped, order kept.
pub fn parse_list(value: Option<&str>) -> Vec<String> {
    value
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The annotation value, or `""` when the key is missing.
pub fn get_str<'a>(annotations: &'a BTreeMap<String, String>, key: &str) -> &'a str {
    annotations.get(key).map(String::as_str).unwrap_or_default()
}

/// [`parse_bool`] of a key.
pub fn get_bool(annotations: &BTreeMap<String, String>, key: &str) -> bool {
    parse_bool(annotations.get(key).map(String::as_str))
}

/// [`parse_i64`] of a key.
pub fn get_i64(annotations: &BTreeMap<String, String>, key: &str) -> i64 {
    parse_i64(annotations.get(key).map(String::as_str))
}

/// [`parse_i32`] of a key.
pub fn get_i32(annotations: &BTreeMap<String, String>, key: &str) -> i32 {
    parse_i32(annotations.get(key).map(String::as_str))
}

/// Writer form of a boolean: `Some("true")`, or `None` (= remove the key) for false.
pub fn bool_value(value: bool) -> Option<String> {
    value.then(|| TRUE.to_owned())
}

/// Writer form of a string: `None` for empty, because empty values are never written.
pub fn non_empty(value: &str) -> Option<String> {
    (!value.is_empty()).then(|| value.to_owned())
}

/// Writer form of an integer: `None` for zero or negative, because zero is never written.
pub fn positive<T: Into<i64>>(value: T) -> Option<String> {
    let v: i64 = value.into();
    (v > 0).then(|| v.to_string())
}

/// The longest prefix of `s` of at most `max_bytes` bytes that ends on a char boundary.
/// Used for the byte-bounded Event and lifecycle messages.
pub fn truncate_utf8(s: &str, max_bytes: usize) -> &str {
    if s.len() <= max_bytes {
        return s;
    }
    let mut end = max_bytes;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn booleans_are_true_only_for_exact_true() {
        for (input, want) in [
            (Some("true"), true),
            (Some("TRUE"), false),
            (Some("True"), false),
            (Some("yes"), false),
            (Some("1"), false),
            (Some(" true"), false),
            (Some("false"), false),
            (Some(""), false),
            (None, false),
        ] {
            assert_eq!(parse_bool(input), want, "{input:?}");
        }
    }

    #[test]
    fn integers_default_to_zero() {
        for (input, want) in [
            (Some("42"), 42),
            (Some("-3"), -3),
            (Some("9223372036854775807"), i64::MAX),
            (Some("9223372036854775808"), 0),
            (Some("4x"), 0),
            (Some(" 4"), 0),
            (Some("1.5"), 0),
            (Some(""), 0),
            (None, 0),
        ] {
            assert_eq!(parse_i64(input), want, "{input:?}");
        }
        for (input, want) in [
            (Some("8080"), 8080),
            (Some("2147483648"), 0),
            (Some("abc"), 0),
            (None, 0),
        ] {
            assert_eq!(parse_i32(input), want, "{input:?}");
        }
    }

    #[test]
    fn lists_are_trimmed_and_drop_empty_items() {
        for (input, want) in [
            (Some("a,b"), vec!["a", "b"]),
            (Some(" a , ,b,, "), vec!["a", "b"]),
            (Some(""), vec![]),
            (Some(",,"), vec![]),
            (None, vec![]),
        ] {
            assert_eq!(parse_list(input), want, "{input:?}");
        }
    }

    #[test]
    fn writers_skip_empty_zero_and_false() {
        assert_eq!(bool_value(true).as_deref(), Some("true"));
        assert_eq!(bool_value(false), None);
        assert_eq!(non_empty(""), None);
        assert_eq!(non_empty("x").as_deref(), Some("x"));
        assert_eq!(positive(0i32), None);
        assert_eq!(positive(-1i64), None);
        assert_eq!(positive(22i32).as_deref(), Some("22"));
    }

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(truncate_utf8("abc", 5), "abc");
        assert_eq!(truncate_utf8("abcdef", 3), "abc");
        assert_eq!(truncate_utf8("aé", 2), "a");
        assert_eq!(truncate_utf8("", 0), "");
    }
}
