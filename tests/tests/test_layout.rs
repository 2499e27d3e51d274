//! The README's in-source test convention ("Contributing: where tests go"), checked over every
//! crate's `src/`: a file's own tests are one `#[cfg(test)] mod tests { … }`; a test module
//! of 300 lines or more lives in a sibling `<name>_tests.rs` that the parent module declares
//! (never through `#[path]`); no inline test module goes by another name. And no source file
//! under a crate's `src/` reaches 1000 lines, except the few still listed to be split.

use std::path::{Path, PathBuf};

use cocoon_e2e::workspace_root;

/// An inline test module this long or longer belongs in a sibling file.
const MAX_INLINE_TEST_LINES: usize = 300;

/// A source file this long or longer is to be split by responsibility.
const MAX_SOURCE_LINES: usize = 1000;

/// The files still at or over [`MAX_SOURCE_LINES`], relative to the workspace root. Each entry
/// must still be there and still be over the limit: a split file leaves the list with it.
/// Empty since issue 37 item 6 split the last ones.
const OVERSIZE_ALLOWED: &[&str] = &[];

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// What in one source file breaks the convention (empty: nothing).
fn violations(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim();
        if t.starts_with("#[path") {
            found.push(format!("line {}: a module declared through #[path]", i + 1));
        }
        if t != "#[cfg(test)]" {
            continue;
        }
        let Some(next) = lines.get(i + 1).map(|l| l.trim()) else {
            continue;
        };
        let Some(rest) = next
            .strip_prefix("mod ")
            .or_else(|| next.strip_prefix("pub(crate) mod "))
            .or_else(|| next.strip_prefix("pub(super) mod "))
        else {
            continue;
        };
        let Some(name) = rest.strip_suffix(" {").map(str::trim) else {
            continue; // `mod x;`: a file of its own
        };
        if name != "tests" {
            found.push(format!(
                "line {}: inline test module `{name}` (call it `tests`, or move it to a file)",
                i + 2
            ));
        }
        let len = inline_len(&lines[i + 1..]);
        if len >= MAX_INLINE_TEST_LINES {
            found.push(format!(
                "line {}: inline test module of {len} lines (move it to a sibling `<name>_tests.rs`)",
                i + 2
            ));
        }
    }
    found
}

/// Lines of the brace block opening on `lines[0]`, up to its closing brace at column 0.
fn inline_len(lines: &[&str]) -> usize {
    lines
        .iter()
        .skip(1)
        .position(|l| *l == "}")
        .map_or(lines.len(), |end| end + 2)
}

#[test]
fn the_checker_sees_each_kind_of_breach() {
    let small = "fn a() {}\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn t() {}\n}\n";
    assert!(violations(small).is_empty(), "{:?}", violations(small));
    let sibling = "#[cfg(test)]\nmod rules_tests;\n";
    assert!(violations(sibling).is_empty());
    let named = "#[cfg(test)]\nmod error_tests {\n}\n";
    assert_eq!(violations(named).len(), 1, "{:?}", violations(named));
    let path = "#[cfg(test)]\n#[path = \"x_tests.rs\"]\nmod tests;\n";
    assert_eq!(violations(path).len(), 1, "{:?}", violations(path));
    let long = format!(
        "#[cfg(test)]\nmod tests {{\n{}}}\n",
        "    // row\n".repeat(MAX_INLINE_TEST_LINES)
    );
    let seen = violations(&long);
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen[0].contains("302 lines"), "{seen:?}");
    let just_under = format!(
        "#[cfg(test)]\nmod tests {{\n{}}}\n",
        "    // row\n".repeat(MAX_INLINE_TEST_LINES - 3)
    );
    assert!(violations(&just_under).is_empty());
}

#[test]
fn every_crate_follows_the_in_source_test_convention() {
    let root = workspace_root();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .expect("read crates/")
        .flatten()
        .map(|e| e.path().join("src"))
        .filter(|p| p.is_dir())
        .collect();
    dirs.push(root.join("tests/src"));
    dirs.sort();
    let mut breaches = Vec::new();
    let mut files = 0;
    for dir in &dirs {
        for file in rust_files(dir) {
            files += 1;
            let text = std::fs::read_to_string(&file).expect("read a source file");
            for v in violations(&text) {
                let shown = file.strip_prefix(&root).unwrap_or(&file).display();
                breaches.push(format!("{shown}: {v}"));
            }
        }
    }
    assert!(
        files > 100,
        "only {files} source files found under {dirs:?}"
    );
    assert!(
        breaches.is_empty(),
        "the README's test convention is broken:\n{}",
        breaches.join("\n")
    );
}

/// What breaks the size rule, given each source file (relative path, line count) and the
/// allowlist: a file not listed at or over the limit, and a listed file that is gone or under
/// it (the list must not go stale). Empty: nothing.
fn size_breaches(files: &[(String, usize)], allowed: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for (file, lines) in files {
        if *lines >= MAX_SOURCE_LINES && !allowed.contains(&file.as_str()) {
            found.push(format!(
                "{file}: {lines} lines (split it below {MAX_SOURCE_LINES} by responsibility)"
            ));
        }
    }
    for listed in allowed {
        match files.iter().find(|(f, _)| f == listed) {
            None => found.push(format!(
                "{listed}: allowlisted but not found (drop it from OVERSIZE_ALLOWED)"
            )),
            Some((_, lines)) if *lines < MAX_SOURCE_LINES => found.push(format!(
                "{listed}: allowlisted but {lines} lines now (drop it from OVERSIZE_ALLOWED)"
            )),
            Some(_) => {}
        }
    }
    found
}

#[test]
fn the_size_check_sees_each_kind_of_breach() {
    /// Files (name, lines), the allowlist, how many breaches, a word each breach shows.
    struct Case {
        files: &'static [(&'static str, usize)],
        allowed: &'static [&'static str],
        breaches: usize,
        shows: &'static str,
    }
    const LIMIT: usize = MAX_SOURCE_LINES;
    let cases = [
        // Under the limit: fine.
        Case {
            files: &[("a.rs", LIMIT - 1)],
            allowed: &[],
            breaches: 0,
            shows: "",
        },
        // At the limit and not listed: a breach.
        Case {
            files: &[("a.rs", LIMIT)],
            allowed: &[],
            breaches: 1,
            shows: "a.rs: 1000 lines",
        },
        // Over the limit and listed: fine.
        Case {
            files: &[("a.rs", LIMIT + 5)],
            allowed: &["a.rs"],
            breaches: 0,
            shows: "",
        },
        // Listed but split below the limit: the list went stale.
        Case {
            files: &[("a.rs", LIMIT - 1)],
            allowed: &["a.rs"],
            breaches: 1,
            shows: "but 999 lines",
        },
        // Listed but gone: the list went stale.
        Case {
            files: &[("b.rs", 10)],
            allowed: &["a.rs"],
            breaches: 1,
            shows: "not found",
        },
    ];
    for c in cases {
        let files: Vec<(String, usize)> =
            c.files.iter().map(|(f, n)| (f.to_string(), *n)).collect();
        let seen = size_breaches(&files, c.allowed);
        assert_eq!(
            seen.len(),
            c.breaches,
            "{:?} {:?}: {seen:?}",
            c.files,
            c.allowed
        );
        assert!(seen.iter().all(|s| s.contains(c.shows)), "{seen:?}");
    }
}

#[test]
fn no_crate_source_file_reaches_the_size_limit() {
    let root = workspace_root();
    let mut files = Vec::new();
    let crates = std::fs::read_dir(root.join("crates")).expect("read crates/");
    for krate in crates.flatten() {
        for file in rust_files(&krate.path().join("src")) {
            let text = std::fs::read_to_string(&file).expect("read a source file");
            let shown = file.strip_prefix(&root).unwrap_or(&file);
            files.push((shown.to_string_lossy().into_owned(), text.lines().count()));
        }
    }
    assert!(files.len() > 100, "only {} source files found", files.len());
    let breaches = size_breaches(&files, OVERSIZE_ALLOWED);
    assert!(
        breaches.is_empty(),
        "source files of {MAX_SOURCE_LINES} lines or more (issue 37 item 6):\n{}",
        breaches.join("\n")
    );
}
