//! The README's in-source test convention ("Contributing: where tests go"), checked over every
//! crate's `src/`: a file's own tests are one `#[cfg(test)] mod tests { … }`; a test module
//! of 300 lines or more lives in a sibling `<name>_tests.rs` that the parent module declares
//! (never through `#[path]`); no inline test module goes by another name. And no source file
//! under a crate's `src/` reaches 1000 lines, except the few still listed to be split.
//!
//! And the node agent's planners (`crates/cocoon-node/src/pods/plan/`) are the pure leaf of
//! the pod operations: they reach nothing of the crate but plan's own modules and the pure
//! rule modules `pods::{rules, tenant, intent}`, and no I/O handle of another crate.

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

/// The node agent's planners, from the workspace root.
const PLAN_DIR: &str = "crates/cocoon-node/src/pods/plan";

/// The modules of `crate::pods` the planners may use: pure rules, no handle.
const PURE_POD_MODULES: [&str; 3] = ["rules", "tenant", "intent"];

/// What test code of the planners may use beyond that: the executor their tables run the
/// plans through (against a recording fake, never the handler).
const TEST_POD_MODULES: [&str; 1] = ["exec"];

/// The roots of a path a planner could reach the crate or an I/O handle through.
const ROOTS: [&str; 7] = [
    "crate",
    "super",
    "self",
    "kube",
    "tokio",
    "cocoon_runtime",
    "cocoon_registry",
];

fn is_ident_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// A tiny parser of a path or use tree (`a::b::{c, d::{self, e}, f as g}`) into its leaves,
/// each as its segments (`self` and `*` leaves are their prefix).
struct TreeParser<'a> {
    s: &'a [u8],
    i: usize,
}

impl TreeParser<'_> {
    fn skip_ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn ident(&mut self) -> Option<String> {
        self.skip_ws();
        let start = self.i;
        while self.i < self.s.len() && is_ident_byte(self.s[self.i]) {
            self.i += 1;
        }
        (self.i > start).then(|| String::from_utf8_lossy(&self.s[start..self.i]).into_owned())
    }

    fn eat(&mut self, token: &str) -> bool {
        let save = self.i;
        self.skip_ws();
        if self.s[self.i..].starts_with(token.as_bytes()) {
            self.i += token.len();
            true
        } else {
            self.i = save;
            false
        }
    }

    /// One tree after `prefix`, its leaves appended to `out`.
    fn tree(&mut self, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
        let mut path = prefix;
        loop {
            if self.eat("{") {
                loop {
                    if self.eat("}") {
                        return;
                    }
                    self.tree(path.clone(), out);
                    if !self.eat(",") {
                        self.eat("}");
                        return;
                    }
                }
            }
            if self.eat("*") {
                out.push(path);
                return;
            }
            match self.ident() {
                Some(seg) if seg == "self" && !path.is_empty() => {}
                Some(seg) => path.push(seg),
                None => {
                    out.push(path);
                    return;
                }
            }
            if !self.eat("::") {
                if self.eat(" as ") || self.eat("as ") {
                    self.ident();
                }
                out.push(path);
                return;
            }
        }
    }
}

/// The inline module each line sits in (its names, and whether it is test code), from
/// rustfmt's layout: `mod name {` opens one, a `}` at its indent closes it.
fn inline_modules(lines: &[&str]) -> Vec<(Vec<String>, bool)> {
    let mut stack: Vec<(String, usize, bool)> = Vec::new();
    let mut out = Vec::with_capacity(lines.len());
    let mut prev = "";
    for line in lines {
        let indent = line.len() - line.trim_start().len();
        let t = line.trim();
        if t == "}" && stack.last().is_some_and(|m| m.1 == indent) {
            stack.pop();
        }
        let rest = t
            .strip_prefix("pub(crate) ")
            .or_else(|| t.strip_prefix("pub(super) "))
            .or_else(|| t.strip_prefix("pub "))
            .unwrap_or(t);
        if let Some(name) = rest.strip_prefix("mod ").and_then(|r| r.strip_suffix(" {")) {
            let test = prev == "#[cfg(test)]" || stack.last().is_some_and(|m| m.2);
            stack.push((name.trim().to_owned(), indent, test));
        }
        if !t.is_empty() {
            prev = t;
        }
        out.push((
            stack.iter().map(|m| m.0.clone()).collect(),
            stack.last().is_some_and(|m| m.2),
        ));
    }
    out
}

/// What in one file of `pods/plan/` reaches beyond the planners' leaf. `module` is the
/// file's module path (`["pods", "plan", "wake"]`); `test_file`: the file is test code
/// only (a `_tests.rs` sibling, a `#[cfg(test)]` helper module).
fn plan_import_breaches(module: &[&str], test_file: bool, text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let modules = inline_modules(&lines);
    // The code without its comments (doc links are no imports), one line per line.
    let code: Vec<&str> = lines
        .iter()
        .map(|l| l.find("//").map_or(*l, |c| &l[..c]))
        .collect();
    let mut starts = Vec::with_capacity(code.len());
    let mut joined = String::new();
    for l in &code {
        starts.push(joined.len());
        joined.push_str(l);
        joined.push('\n');
    }
    let bytes = joined.as_bytes();
    let mut found = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let boundary = i == 0 || !(is_ident_byte(bytes[i - 1]) || bytes[i - 1] == b':');
        let root = ROOTS
            .iter()
            .find(|r| boundary && bytes[i..].starts_with(format!("{r}::").as_bytes()));
        let Some(root) = root else {
            i += 1;
            continue;
        };
        let line = starts.partition_point(|&s| s <= i) - 1;
        let mut parser = TreeParser { s: bytes, i };
        let mut leaves = Vec::new();
        parser.tree(Vec::new(), &mut leaves);
        let shown = joined[i..parser.i]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        i = parser.i.max(i + root.len());
        let (inline, test_code) = &modules[line];
        let test_code = test_file || *test_code;
        let here: Vec<String> = module
            .iter()
            .map(|s| (*s).to_owned())
            .chain(inline.iter().cloned())
            .collect();
        for leaf in leaves {
            if let Some(why) = reach_breach(&here, test_code, &leaf) {
                found.push(format!("line {}: `{shown}` {why}", line + 1));
            }
        }
    }
    found
}

/// Why a path from the module `here` leaves the planners' leaf, if it does.
fn reach_breach(here: &[String], test_code: bool, path: &[String]) -> Option<String> {
    let first = path.first()?.as_str();
    let resolved: Vec<String> = match first {
        "crate" => path[1..].to_vec(),
        "self" => here.iter().chain(&path[1..]).cloned().collect(),
        "super" => {
            let ups = path.iter().take_while(|s| *s == "super").count();
            let base = &here[..here.len().saturating_sub(ups)];
            base.iter().chain(&path[ups..]).cloned().collect()
        }
        // Test code runs its async tables on tokio (`#[tokio::test]`).
        "tokio" if test_code => return None,
        "kube" | "tokio" => return Some(format!("uses the I/O crate `{first}`")),
        "cocoon_runtime" => {
            let item = path.get(1).map_or("", String::as_str);
            return ["Runtime", "cli", "sim", "io"]
                .contains(&item)
                .then(|| format!("reaches the runtime itself (`cocoon_runtime::{item}`)"));
        }
        "cocoon_registry" => {
            let item = path.get(1).map_or("", String::as_str);
            return (item == "client" || item.contains("Client"))
                .then(|| format!("reaches a registry client (`cocoon_registry::{item}`)"));
        }
        _ => return None,
    };
    let r: Vec<&str> = resolved.iter().map(String::as_str).collect();
    let allowed = match r.as_slice() {
        ["pods", "plan", ..] => true,
        ["pods", m, ..] if PURE_POD_MODULES.contains(m) => true,
        ["pods", m, ..] if test_code && TEST_POD_MODULES.contains(m) => true,
        _ => false,
    };
    (!allowed).then(|| format!("reaches `crate::{}`", r.join("::")))
}

#[test]
fn the_plan_checker_sees_each_kind_of_reach() {
    let file = ["pods", "plan", "wake"];
    let clean = "use super::{Action, Step};\nuse super::wake::{self, Source};\n\
                 use crate::pods::rules::{self, Evidence};\nuse crate::pods::{intent::Intent, tenant};\n\
                 use cocoon_runtime::{RuntimeError, VmRecord};\n\
                 /// See [`super::super::create::FollowUp`] and `crate::pods::Handler`.\n\
                 fn f() { crate::pods::plan::exec_free(); } // crate::pods::owned::Owner\n";
    let seen = plan_import_breaches(&file, false, clean);
    assert!(seen.is_empty(), "{seen:?}");

    let dirty = "use crate::pods::create::{FollowUp, ch_windows};\n\
                 use super::super::{Handler, status};\n\
                 use crate::pods::{\n    rules,\n    owned::Owner,\n};\n\
                 use crate::node::capacity::CPU;\n\
                 use cocoon_runtime::{Runtime, VmRecord};\n\
                 use kube::Client;\n\
                 fn f() { let _ = crate::pods::exec::run; }\n";
    let seen = plan_import_breaches(&file, false, dirty);
    let want = [
        "line 1: `crate::pods::create::{FollowUp, ch_windows}` reaches `crate::pods::create::FollowUp`",
        "line 1: `crate::pods::create::{FollowUp, ch_windows}` reaches `crate::pods::create::ch_windows`",
        "line 2: `super::super::{Handler, status}` reaches `crate::pods::Handler`",
        "line 2: `super::super::{Handler, status}` reaches `crate::pods::status`",
        "line 3: `crate::pods::{ rules, owned::Owner, }` reaches `crate::pods::owned::Owner`",
        "line 7: `crate::node::capacity::CPU` reaches `crate::node::capacity::CPU`",
        "line 8: `cocoon_runtime::{Runtime, VmRecord}` reaches the runtime itself (`cocoon_runtime::Runtime`)",
        "line 9: `kube::Client` uses the I/O crate `kube`",
        "line 10: `crate::pods::exec::run` reaches `crate::pods::exec::run`",
    ];
    assert_eq!(seen, want);

    // `super::` of plan's own `mod.rs` is `pods`; of an inline module, its file.
    let seen = plan_import_breaches(&["pods", "plan"], false, "use super::create::FollowUp;\n");
    assert_eq!(seen.len(), 1, "{seen:?}");
    let inline = "fn a() {}\n\n#[cfg(test)]\nmod tests {\n    use super::super::Step;\n    use super::*;\n    \
                  use crate::pods::exec::run;\n}\nuse crate::pods::exec::run;\n";
    let seen = plan_import_breaches(&file, false, inline);
    assert_eq!(
        seen,
        ["line 9: `crate::pods::exec::run` reaches `crate::pods::exec::run`"],
        "test code may run the executor, the planner itself may not"
    );
    let test_file = "use crate::pods::exec;\n#[tokio::test]\nasync fn t() {}\n";
    assert!(plan_import_breaches(&file, true, test_file).is_empty());
    let seen = plan_import_breaches(&file, false, "fn f() { tokio::spawn(g()); }\n");
    assert_eq!(seen, ["line 1: `tokio::spawn` uses the I/O crate `tokio`"]);
}

#[test]
fn the_pod_planners_import_only_plan_and_the_pure_rules() {
    let root = workspace_root();
    let dir = root.join(PLAN_DIR);
    let mod_rs = std::fs::read_to_string(dir.join("mod.rs")).expect("read pods/plan/mod.rs");
    // The files `mod.rs` declares under `#[cfg(test)]`: test code only.
    let mod_lines: Vec<&str> = mod_rs.lines().map(str::trim).collect();
    let test_only: Vec<String> = mod_lines
        .windows(2)
        .filter(|w| w[0] == "#[cfg(test)]")
        .filter_map(|w| {
            let rest = w[1].strip_prefix("pub(crate) ").unwrap_or(w[1]);
            rest.strip_prefix("mod ")?
                .strip_suffix(';')
                .map(str::to_owned)
        })
        .collect();
    let mut breaches = Vec::new();
    let mut files = 0;
    for file in rust_files(&dir) {
        files += 1;
        let stem = file
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("a UTF-8 file name");
        let mut module = vec!["pods", "plan"];
        if stem != "mod" {
            module.push(stem);
        }
        let test_file = stem.ends_with("_tests") || test_only.iter().any(|t| t == stem);
        let text = std::fs::read_to_string(&file).expect("read a planner");
        let shown = file
            .strip_prefix(&root)
            .unwrap_or(&file)
            .display()
            .to_string();
        for b in plan_import_breaches(&module, test_file, &text) {
            breaches.push(format!("{shown}: {b}"));
        }
    }
    assert!(files >= 10, "only {files} files found under {PLAN_DIR}");
    assert!(
        breaches.is_empty(),
        "pods/plan/ must import nothing from the crate but plan's own modules and \
         pods::{{{}}} (README \"Contributing\"):\n{}",
        PURE_POD_MODULES.join(", "),
        breaches.join("\n")
    );
}

/// The node agent crate's sources, from the workspace root.
const NODE_SRC: &str = "crates/cocoon-node/src";

/// The node crate's code (its `src/` files not ending `_tests.rs`, inline test modules
/// included) stays under this many lines (issue 37 item 6).
const MAX_NODE_CODE_LINES: usize = 15_000;

#[test]
fn the_node_crate_code_stays_under_its_size_limit() {
    let root = workspace_root();
    let mut lines = 0;
    let mut files = 0;
    for file in rust_files(&root.join(NODE_SRC)) {
        let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.ends_with("_tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read a node source file");
        lines += text.lines().count();
        files += 1;
    }
    assert!(
        files >= 20,
        "only {files} source files found under {NODE_SRC}"
    );
    assert!(
        lines < MAX_NODE_CODE_LINES,
        "{NODE_SRC} holds {lines} lines of code (files not ending `_tests.rs`), the limit is \
         {MAX_NODE_CODE_LINES} (issue 37 item 6): move a cohesive concern with its tests into \
         a crate of its own, re-exported from cocoon-node's lib.rs so its paths keep working, \
         as cocoon-kubelet (`kubelet`) and cocoon-node-registration (`node`) were"
    );
}

/// The `<x>_tests.rs` files outside this branch's reach that test no `<x>` yet, relative to the
/// workspace root (issue 37 item 5). Each entry must still be a breach: a renamed file leaves
/// the list with it.
const UNMATCHED_TESTS_ALLOWED: &[&str] = &[];

/// What breaks the naming rule of sibling test files, given every source file (relative path,
/// `/`-separated) and the allowlist: an `<x>_tests.rs` without an `<x>.rs` or an `<x>/mod.rs`
/// in its folder (the tests test an `<x>`), and a listed file that is gone or that now has
/// its `<x>`. Empty: nothing.
fn unmatched_test_files(files: &[String], allowed: &[&str]) -> Vec<String> {
    let has = |path: &str| files.iter().any(|f| f == path);
    let mut found = Vec::new();
    for file in files {
        let Some(stem) = file.strip_suffix("_tests.rs") else {
            continue;
        };
        let tested = has(&format!("{stem}.rs")) || has(&format!("{stem}/mod.rs"));
        if !tested && !allowed.contains(&file.as_str()) {
            found.push(format!(
                "{file}: tests no `{stem}.rs` or `{stem}/mod.rs` next to it"
            ));
        }
    }
    for listed in allowed {
        let stem = listed.strip_suffix("_tests.rs").unwrap_or(listed);
        if !has(listed) {
            found.push(format!("{listed}: listed as unmatched but gone"));
        } else if has(&format!("{stem}.rs")) || has(&format!("{stem}/mod.rs")) {
            found.push(format!(
                "{listed}: listed as unmatched but tests its `{stem}`"
            ));
        }
    }
    found
}

#[test]
fn the_sibling_name_check_sees_each_kind_of_breach() {
    let files = |paths: &[&str]| paths.iter().map(|p| p.to_string()).collect::<Vec<_>>();
    let good = files(&[
        "a/src/pods.rs",
        "a/src/pods_tests.rs",
        "a/src/steps/suspend/mod.rs",
        "a/src/steps/suspend_tests.rs",
        "a/src/steps/suspend/rules.rs",
        "a/src/steps/suspend/rules_tests.rs",
    ]);
    assert!(unmatched_test_files(&good, &[]).is_empty());
    // Tests of the planner in `mod.rs`, named after a `plan.rs` that is not there.
    let orphan = files(&[
        "a/src/steps/suspend/mod.rs",
        "a/src/steps/suspend/plan_tests.rs",
    ]);
    let seen = unmatched_test_files(&orphan, &[]);
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen[0].contains("plan_tests.rs"), "{seen:?}");
    assert!(unmatched_test_files(&orphan, &["a/src/steps/suspend/plan_tests.rs"]).is_empty());
    // A stale allowlist: the file is gone, or it has its `<x>` now.
    assert_eq!(
        unmatched_test_files(&good, &["a/src/gone_tests.rs", "a/src/pods_tests.rs"]).len(),
        2
    );
}

#[test]
fn every_sibling_test_file_tests_its_namesake() {
    let root = workspace_root();
    let mut files = Vec::new();
    let crates = std::fs::read_dir(root.join("crates")).expect("read crates/");
    for krate in crates.flatten() {
        for file in rust_files(&krate.path().join("src")) {
            let shown = file.strip_prefix(&root).unwrap_or(&file);
            let parts: Vec<String> = shown
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            files.push(parts.join("/"));
        }
    }
    assert!(files.len() > 100, "only {} source files found", files.len());
    assert!(
        files.iter().filter(|f| f.ends_with("_tests.rs")).count() > 10,
        "too few sibling test files found"
    );
    let breaches = unmatched_test_files(&files, UNMATCHED_TESTS_ALLOWED);
    assert!(
        breaches.is_empty(),
        "an `<x>_tests.rs` tests an `<x>` next to it (README \"Contributing\"):\n{}",
        breaches.join("\n")
    );
}

/// The node agent's pod code (issue 37 item 2): the handler is a thin composition of parts
/// with narrow interfaces, so no type under this directory has more inherent methods, summed
/// over all its `impl` blocks in all files, than [`MAX_METHODS_PER_TYPE`].
const POD_DIR: &str = "crates/cocoon-node/src/pods";

/// The most inherent methods one type of the pod code may have.
const MAX_METHODS_PER_TYPE: usize = 30;

/// The parts the handler is composed of: each must still be found (a rename that hid a
/// type from the count would otherwise pass unseen).
const HANDLER_PARTS: [&str; 5] = ["Handler", "PodStore", "ApiWriter", "Artifacts", "Publisher"];

/// The inherent methods per type in one file: the `fn` items at the first indentation level
/// of every top-level `impl Type {` / `impl<…> Type<…> {` block (trait impls are left out:
/// their method set is the trait's).
fn inherent_methods(text: &str) -> Vec<(String, usize)> {
    let mut out: Vec<(String, usize)> = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if let Some(ty) = &current {
            if line == "}" {
                current = None;
                continue;
            }
            let item = line
                .strip_prefix("    ")
                .filter(|l| !l.starts_with(' '))
                .map(|l| {
                    let l = l.strip_prefix("pub ").unwrap_or(l);
                    let l = match l.strip_prefix("pub(") {
                        Some(rest) => rest.split_once(") ").map_or(l, |(_, r)| r),
                        None => l,
                    };
                    let l = l.strip_prefix("const ").unwrap_or(l);
                    let l = l.strip_prefix("async ").unwrap_or(l);
                    l.strip_prefix("unsafe ").unwrap_or(l)
                });
            if item.is_some_and(|l| l.starts_with("fn ")) {
                match out.iter_mut().find(|(t, _)| t == ty) {
                    Some((_, n)) => *n += 1,
                    None => out.push((ty.clone(), 1)),
                }
            }
            continue;
        }
        let Some(rest) = line.strip_prefix("impl") else {
            continue;
        };
        let Some(head) = rest.strip_suffix(" {") else {
            continue;
        };
        // Skip the generics of the impl itself: `impl<'a> PodOp<'a> {`.
        let head = match head.strip_prefix('<') {
            Some(g) => {
                let mut depth = 1;
                let mut end = g.len();
                for (i, c) in g.char_indices() {
                    match c {
                        '<' => depth += 1,
                        '>' => depth -= 1,
                        _ => {}
                    }
                    if depth == 0 {
                        end = i + 1;
                        break;
                    }
                }
                &g[end..]
            }
            None => head,
        };
        let Some(ty) = head.strip_prefix(' ') else {
            continue;
        };
        if ty.contains(" for ") {
            continue;
        }
        let name: String = ty
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            current = Some(name);
        }
    }
    out
}

/// The types over [`MAX_METHODS_PER_TYPE`], from per-file counts (empty: none).
fn method_breaches(counts: &[(String, usize)]) -> Vec<String> {
    let mut totals: Vec<(String, usize)> = Vec::new();
    for (ty, n) in counts {
        match totals.iter_mut().find(|(t, _)| t == ty) {
            Some((_, m)) => *m += n,
            None => totals.push((ty.clone(), *n)),
        }
    }
    totals
        .into_iter()
        .filter(|(_, n)| *n > MAX_METHODS_PER_TYPE)
        .map(|(ty, n)| format!("{ty}: {n} methods (at most {MAX_METHODS_PER_TYPE})"))
        .collect()
}

#[test]
fn the_method_counter_sees_inherent_methods_across_blocks_and_files() {
    let a = "impl Handler {\n    pub fn a(&self) {}\n    pub(crate) async fn b(&self) {\n        fn nested() {}\n    }\n    const C: u8 = 1;\n}\n\
             impl std::fmt::Display for Handler {\n    fn fmt(&self) {}\n}\n\
             impl<'a> PodOp<'a> {\n    fn c(&self) {}\n}\n";
    assert_eq!(
        inherent_methods(a),
        vec![("Handler".to_owned(), 2), ("PodOp".to_owned(), 1)]
    );
    let many: String = (0..MAX_METHODS_PER_TYPE)
        .map(|i| format!("    fn m{i}(&self) {{}}\n"))
        .collect();
    let b = format!("impl Handler {{\n{many}}}\n");
    let mut counts = inherent_methods(&b);
    assert!(
        method_breaches(&counts).is_empty(),
        "the limit itself passes"
    );
    counts.extend(inherent_methods(a));
    assert_eq!(
        method_breaches(&counts),
        vec![format!(
            "Handler: {} methods (at most {MAX_METHODS_PER_TYPE})",
            MAX_METHODS_PER_TYPE + 2
        )],
        "blocks in other files add up"
    );
}

#[test]
fn no_type_of_the_pod_handler_has_more_than_30_methods() {
    let root = workspace_root();
    let mut counts = Vec::new();
    for file in rust_files(&root.join(POD_DIR)) {
        let text = std::fs::read_to_string(&file).expect("read a pod source file");
        counts.extend(inherent_methods(&text));
    }
    for part in HANDLER_PARTS {
        assert!(
            counts.iter().any(|(t, _)| t == part),
            "no inherent methods of {part} found under {POD_DIR}"
        );
    }
    let breaches = method_breaches(&counts);
    assert!(
        breaches.is_empty(),
        "a type of the pod handler has too many methods: split it by responsibility \
         (issue 37 item 2):\n{}",
        breaches.join("\n")
    );
}
