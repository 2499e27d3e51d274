//! Shell words: tokens, `$VAR` / `$?` expansion, path normalisation and globs.

use std::collections::BTreeMap;

/// Shell tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Tok {
    Word(String),
    /// `;` or a newline.
    Seq,
    And,
    Or,
    Pipe,
    /// `>`, `>>`, `<`, `2>`, `2>>`, `2>&1`.
    Redir(&'static str),
}

/// Stands for `$?` in tokens until the command runs.
pub(super) const STATUS_MARK: &str = "\u{1}?\u{1}";

pub(super) fn tokenize(script: &str, env: &BTreeMap<String, String>) -> Result<Vec<Tok>, String> {
    let mut toks = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = script.chars().peekable();
    let expand = |chars: &mut std::iter::Peekable<std::str::Chars<'_>>| -> String {
        if chars.peek() == Some(&'?') {
            chars.next();
            // Resolved when the command runs: earlier commands of the script set it.
            return STATUS_MARK.to_owned();
        }
        let braced = chars.peek() == Some(&'{');
        if braced {
            chars.next();
        }
        let mut name = String::new();
        while let Some(&c) = chars.peek() {
            if c.is_ascii_alphanumeric() || c == '_' {
                name.push(c);
                chars.next();
            } else {
                break;
            }
        }
        if braced && chars.peek() == Some(&'}') {
            chars.next();
        }
        if name.is_empty() && !braced {
            return "$".to_owned();
        }
        env.get(&name).cloned().unwrap_or_default()
    };
    macro_rules! flush {
        () => {
            if in_word {
                toks.push(Tok::Word(std::mem::take(&mut word)));
                in_word = false;
            }
        };
    }
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => word.push(c),
                        None => return Err("unterminated quote".into()),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\' | '$' | '`')) => word.push(c),
                            Some(c) => {
                                word.push('\\');
                                word.push(c);
                            }
                            None => return Err("unterminated quote".into()),
                        },
                        Some('$') => word.push_str(&expand(&mut chars)),
                        Some(c) => word.push(c),
                        None => return Err("unterminated quote".into()),
                    }
                }
            }
            '\\' => {
                in_word = true;
                match chars.next() {
                    Some('\n') | None => {}
                    Some(c) => word.push(c),
                }
            }
            '$' => {
                in_word = true;
                word.push_str(&expand(&mut chars));
            }
            '#' if !in_word => {
                while chars.peek().is_some_and(|&c| c != '\n') {
                    chars.next();
                }
            }
            ' ' | '\t' | '\r' => flush!(),
            '\n' | ';' => {
                flush!();
                toks.push(Tok::Seq);
            }
            '&' if chars.peek() == Some(&'&') => {
                chars.next();
                flush!();
                toks.push(Tok::And);
            }
            '|' => {
                flush!();
                if chars.peek() == Some(&'|') {
                    chars.next();
                    toks.push(Tok::Or);
                } else {
                    toks.push(Tok::Pipe);
                }
            }
            '>' | '<' => {
                // `2>` only when the 2 stands alone as a word start.
                let stderr = in_word && word == "2";
                if stderr {
                    word.clear();
                    in_word = false;
                } else {
                    flush!();
                }
                let op = match (c, stderr, chars.peek().copied()) {
                    ('<', _, _) => "<",
                    ('>', false, Some('>')) => {
                        chars.next();
                        ">>"
                    }
                    ('>', false, _) => ">",
                    ('>', true, Some('>')) => {
                        chars.next();
                        "2>>"
                    }
                    ('>', true, Some('&')) => {
                        chars.next();
                        if chars.next() != Some('1') {
                            return Err("unsupported redirection".into());
                        }
                        "2>&1"
                    }
                    _ => "2>",
                };
                toks.push(Tok::Redir(op));
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        toks.push(Tok::Word(word));
    }
    Ok(toks)
}

/// Normalises a guest path to an absolute path without `.`/`..`/double slashes.
pub(super) fn norm(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for p in path.split('/') {
        match p {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    format!("/{}", parts.join("/"))
}

/// Paths under these prefixes are virtual: writes succeed and are not stored.
pub(super) fn is_virtual(path: &str) -> bool {
    ["/proc/", "/sys/", "/dev/"]
        .iter()
        .any(|p| path.starts_with(p))
}

/// `*` matches any run of characters except `/`.
pub(super) fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    fn go(p: &[char], t: &[char]) -> bool {
        match p.split_first() {
            None => t.is_empty(),
            Some(('*', rest)) => (0..=t.len())
                .take_while(|&i| i == 0 || t[i - 1] != '/')
                .any(|i| go(rest, &t[i..])),
            Some((c, rest)) => t.first() == Some(c) && go(rest, &t[1..]),
        }
    }
    go(&p, &t)
}
