//! The guest's tiny shell: what `exec` runs against the guest's files (see the module docs
//! of `sim` for the command set).

use std::collections::BTreeMap;

use super::lex::{STATUS_MARK, Tok, glob_match, is_virtual, norm, tokenize};
use super::{GuestFs, HOSTNAME_PATH};

/// Result of one `exec`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecResult {
    /// Exit status of the last command run.
    pub code: i32,
    /// Guest stdout.
    pub stdout: Vec<u8>,
    /// Guest stderr.
    pub stderr: Vec<u8>,
    /// True when a file was written or removed (the disk must be rewritten).
    pub modified: bool,
}

/// Commands that succeed without effect: system tools whose guest-side work the simulator
/// does not model (network restarts, cloud-init, Windows NIC tools).
const NO_OPS: &[&str] = &[
    ":",
    "sync",
    "mkdir",
    "systemctl",
    "ip",
    "cloud-init",
    "ipconfig",
    "cmd",
    "powershell",
    "hostnamectl",
    "chmod",
    "chown",
    "netplan",
    "dhclient",
];

/// Runs `argv` against `fs` (see the module docs of `sim` for the command set).
pub fn run(
    fs: &mut GuestFs,
    env: &BTreeMap<String, String>,
    argv: &[String],
    stdin: &[u8],
) -> ExecResult {
    let mut sh = Shell {
        fs,
        env,
        stdin: Some(stdin.to_vec()),
        out: Vec::new(),
        err: Vec::new(),
        modified: false,
        last: 0,
        exited: None,
    };
    let code = sh.simple(argv, None);
    let code = sh.exited.unwrap_or(code);
    ExecResult {
        code,
        stdout: sh.out,
        stderr: sh.err,
        modified: sh.modified,
    }
}

/// Where a command's stdout goes.
enum Sink {
    Out,
    Discard,
    File { path: String, append: bool },
    Pipe,
}

struct Shell<'a> {
    fs: &'a mut GuestFs,
    env: &'a BTreeMap<String, String>,
    /// Exec stdin, consumed by the first command that reads it.
    stdin: Option<Vec<u8>>,
    out: Vec<u8>,
    err: Vec<u8>,
    modified: bool,
    last: i32,
    /// Set by `exit`.
    exited: Option<i32>,
}

impl Shell<'_> {
    fn script(&mut self, text: &str) -> i32 {
        let toks = match tokenize(text, self.env) {
            Ok(t) => t,
            Err(e) => {
                self.err
                    .extend_from_slice(format!("sh: syntax error: {e}\n").as_bytes());
                return 2;
            }
        };
        // Split into and-or lists separated by `;`/newline.
        let mut status = 0;
        for list in toks.split(|t| *t == Tok::Seq).filter(|l| !l.is_empty()) {
            status = self.and_or(list);
            self.last = status;
            if self.exited.is_some() {
                break;
            }
        }
        self.exited.unwrap_or(status)
    }

    fn and_or(&mut self, toks: &[Tok]) -> i32 {
        let mut status = 0;
        let mut run_next = true;
        let mut start = 0;
        for i in 0..=toks.len() {
            let op = toks.get(i);
            if !matches!(op, None | Some(Tok::And) | Some(Tok::Or)) {
                continue;
            }
            if run_next {
                status = self.pipeline(&toks[start..i]);
                self.last = status;
                if self.exited.is_some() {
                    return status;
                }
            }
            run_next = match op {
                Some(Tok::And) => status == 0,
                Some(Tok::Or) => status != 0,
                _ => false,
            };
            start = i + 1;
        }
        status
    }

    fn pipeline(&mut self, toks: &[Tok]) -> i32 {
        let stages: Vec<&[Tok]> = toks.split(|t| *t == Tok::Pipe).collect();
        let mut input: Option<Vec<u8>> = None;
        let mut status = 0;
        for (i, stage) in stages.iter().enumerate() {
            let last = i + 1 == stages.len();
            let sink = if last { Sink::Out } else { Sink::Pipe };
            let (code, piped) = self.command(stage, input.take(), sink);
            status = code;
            input = piped;
            if self.exited.is_some() {
                break;
            }
        }
        status
    }

    /// One command with its redirections. Returns the status and, for a pipe sink, its output.
    fn command(
        &mut self,
        toks: &[Tok],
        piped_in: Option<Vec<u8>>,
        mut sink: Sink,
    ) -> (i32, Option<Vec<u8>>) {
        let mut argv = Vec::new();
        let mut input = piped_in;
        let mut err_to: Option<Sink> = None;
        let mut it = toks.iter();
        while let Some(t) = it.next() {
            match t {
                Tok::Word(w) => argv.push(w.replace(STATUS_MARK, &self.last.to_string())),
                Tok::Redir("2>&1") => err_to = Some(Sink::Out),
                Tok::Redir(op) => {
                    let Some(Tok::Word(target)) = it.next() else {
                        self.err
                            .extend_from_slice(b"sh: syntax error: missing redirection target\n");
                        return (2, None);
                    };
                    let path = norm(target);
                    match *op {
                        "<" => match self.fs.files.get(&path) {
                            Some(c) => input = Some(c.clone().into_bytes()),
                            None => {
                                self.err.extend_from_slice(
                                    format!("sh: {target}: No such file or directory\n").as_bytes(),
                                );
                                return (1, None);
                            }
                        },
                        ">" | ">>" if path == "/dev/null" => sink = Sink::Discard,
                        ">" | ">>" => {
                            sink = Sink::File {
                                path,
                                append: *op == ">>",
                            }
                        }
                        _ if path == "/dev/null" => err_to = Some(Sink::Discard),
                        _ => {
                            err_to = Some(Sink::File {
                                path,
                                append: *op == "2>>",
                            })
                        }
                    }
                }
                _ => {}
            }
        }
        if argv.is_empty() {
            return (0, None);
        }
        // Run with private buffers, then route them.
        let saved_out = std::mem::take(&mut self.out);
        let saved_err = std::mem::take(&mut self.err);
        let code = self.simple(&argv, input);
        let out = std::mem::replace(&mut self.out, saved_out);
        let err = std::mem::replace(&mut self.err, saved_err);
        let mut piped = None;
        let route = |sh: &mut Self, sink: &Sink, bytes: Vec<u8>, to_err: bool| match sink {
            Sink::Out if to_err => sh.err.extend_from_slice(&bytes),
            Sink::Out => sh.out.extend_from_slice(&bytes),
            Sink::Discard => {}
            Sink::File { path, append } => sh.write_file(path, &bytes, *append),
            Sink::Pipe => {}
        };
        match &sink {
            Sink::Pipe => piped = Some(out),
            s => route(self, s, out, false),
        }
        match err_to {
            Some(Sink::Out) => match &sink {
                Sink::Pipe => piped.get_or_insert_with(Vec::new).extend_from_slice(&err),
                s => route(self, s, err, false),
            },
            Some(s) => route(self, &s, err, true),
            None => self.err.extend_from_slice(&err),
        }
        (code, piped)
    }

    fn write_file(&mut self, path: &str, bytes: &[u8], append: bool) {
        if is_virtual(path) {
            return;
        }
        let text = String::from_utf8_lossy(bytes);
        let entry = self.fs.files.entry(path.to_owned()).or_default();
        if !append {
            entry.clear();
        }
        entry.push_str(&text);
        self.modified = true;
    }

    fn take_stdin(&mut self, piped: Option<Vec<u8>>) -> Vec<u8> {
        piped.or_else(|| self.stdin.take()).unwrap_or_default()
    }

    fn expand_globs(&self, args: &[String]) -> Vec<String> {
        args.iter()
            .flat_map(|a| {
                if !a.contains('*') {
                    return vec![a.clone()];
                }
                let pattern = norm(a);
                let hits: Vec<String> = self
                    .fs
                    .files
                    .keys()
                    .filter(|k| glob_match(&pattern, k))
                    .cloned()
                    .collect();
                if hits.is_empty() {
                    vec![a.clone()]
                } else {
                    hits
                }
            })
            .collect()
    }

    fn fail(&mut self, msg: String, code: i32) -> i32 {
        self.err.extend_from_slice(msg.as_bytes());
        self.err.push(b'\n');
        code
    }

    /// A simple command (argv already split).
    fn simple(&mut self, argv: &[String], piped: Option<Vec<u8>>) -> i32 {
        let Some((cmd, args)) = argv.split_first() else {
            return 0;
        };
        let name = cmd.rsplit('/').next().unwrap_or(cmd);
        match name {
            "true" => 0,
            "false" => 1,
            "exit" => {
                let code = match args.first() {
                    Some(a) => a.parse::<i32>().map(|c| c & 0xff).unwrap_or(2),
                    None => self.last,
                };
                self.exited = Some(code);
                code
            }
            "sh" | "bash" => match args {
                [flag, script, ..] if flag == "-c" => self.script(script),
                [] => {
                    let input = self.take_stdin(piped);
                    self.script(&String::from_utf8_lossy(&input))
                }
                _ => self.fail(format!("{name}: only -c SCRIPT is supported"), 2),
            },
            "echo" => {
                let (newline, words) = match args.first() {
                    Some(f) if f == "-n" => (false, &args[1..]),
                    _ => (true, args),
                };
                self.out.extend_from_slice(words.join(" ").as_bytes());
                if newline {
                    self.out.push(b'\n');
                }
                0
            }
            "printf" => {
                let Some((fmt, rest)) = args.split_first() else {
                    return self.fail("printf: usage: printf FORMAT [ARG...]".into(), 2);
                };
                let text = printf(fmt, rest);
                self.out.extend_from_slice(text.as_bytes());
                0
            }
            "cat" => {
                let files = self.expand_globs(args);
                if files.is_empty() || files == ["-"] {
                    let input = self.take_stdin(piped);
                    self.out.extend_from_slice(&input);
                    return 0;
                }
                let mut status = 0;
                for f in files {
                    match self.fs.files.get(&norm(&f)) {
                        Some(c) => {
                            let c = c.clone();
                            self.out.extend_from_slice(c.as_bytes());
                        }
                        None => {
                            status = self.fail(format!("cat: {f}: No such file or directory"), 1)
                        }
                    }
                }
                status
            }
            "tee" => {
                let (append, files) = match args.first() {
                    Some(f) if f == "-a" => (true, &args[1..]),
                    _ => (false, args),
                };
                let input = self.take_stdin(piped);
                for f in files {
                    let path = norm(f);
                    self.write_file(&path, &input, append);
                }
                self.out.extend_from_slice(&input);
                0
            }
            "rm" => {
                let force = args.iter().any(|a| a.starts_with('-') && a.contains('f'));
                let files: Vec<String> = args
                    .iter()
                    .filter(|a| !a.starts_with('-'))
                    .cloned()
                    .collect();
                let mut status = 0;
                for f in self.expand_globs(&files) {
                    if self.fs.files.remove(&norm(&f)).is_some() {
                        self.modified = true;
                    } else if !force {
                        status = self.fail(
                            format!("rm: cannot remove '{f}': No such file or directory"),
                            1,
                        );
                    }
                }
                status
            }
            "ls" => {
                let dir = norm(
                    args.iter()
                        .find(|a| !a.starts_with('-'))
                        .map_or("/", |s| s.as_str()),
                );
                let prefix = if dir == "/" {
                    "/".to_owned()
                } else {
                    format!("{dir}/")
                };
                let mut names: Vec<String> = self
                    .fs
                    .files
                    .keys()
                    .filter_map(|k| k.strip_prefix(&prefix))
                    .map(|rest| rest.split('/').next().unwrap_or(rest).to_owned())
                    .collect();
                names.dedup();
                if names.is_empty() && !self.fs.files.contains_key(&dir) {
                    return self.fail(
                        format!("ls: cannot access '{dir}': No such file or directory"),
                        2,
                    );
                }
                for n in names {
                    self.out.extend_from_slice(format!("{n}\n").as_bytes());
                }
                0
            }
            "test" | "[" => {
                let args: &[String] = if name == "[" {
                    match args.split_last() {
                        Some((last, rest)) if last == "]" => rest,
                        _ => return self.fail("[: missing ]".into(), 2),
                    }
                } else {
                    args
                };
                let ok = match args {
                    [op, f] if op == "-f" || op == "-e" || op == "-s" => {
                        let content = self.fs.files.get(&norm(f));
                        content.is_some_and(|c| op != "-s" || !c.is_empty())
                    }
                    [op, s] if op == "-n" => !s.is_empty(),
                    [op, s] if op == "-z" => s.is_empty(),
                    [a, op, b] if op == "=" || op == "==" => a == b,
                    [a, op, b] if op == "!=" => a != b,
                    [s] => !s.is_empty(),
                    _ => false,
                };
                i32::from(!ok)
            }
            "touch" => {
                for f in args.iter().filter(|a| !a.starts_with('-')) {
                    let path = norm(f);
                    if !is_virtual(&path) && !self.fs.files.contains_key(&path) {
                        self.fs.files.insert(path, String::new());
                        self.modified = true;
                    }
                }
                0
            }
            "hostname" => {
                let h = self
                    .fs
                    .files
                    .get(HOSTNAME_PATH)
                    .map(|h| h.trim().to_owned())
                    .unwrap_or_default();
                self.out.extend_from_slice(format!("{h}\n").as_bytes());
                0
            }
            "printenv" | "env" => {
                match args.first() {
                    Some(k) => match self.env.get(k) {
                        Some(v) => self.out.extend_from_slice(format!("{v}\n").as_bytes()),
                        None => return 1,
                    },
                    None => {
                        for (k, v) in self.env {
                            self.out.extend_from_slice(format!("{k}={v}\n").as_bytes());
                        }
                    }
                }
                0
            }
            n if NO_OPS.contains(&n) => 0,
            _ => self.fail(format!("sh: {cmd}: command not found"), 127),
        }
    }
}

/// `printf` with `\n \t \\ \'`, `%s %d %%`; missing arguments are empty.
fn printf(fmt: &str, args: &[String]) -> String {
    let mut out = String::new();
    let mut args = args.iter();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some('\\') => out.push('\\'),
                Some(o) => {
                    out.push('\\');
                    out.push(o);
                }
                None => out.push('\\'),
            },
            '%' => match chars.next() {
                Some('%') => out.push('%'),
                Some('s') | Some('d') => out.push_str(args.next().map_or("", |s| s.as_str())),
                Some(o) => {
                    out.push('%');
                    out.push(o);
                }
                None => out.push('%'),
            },
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(fs: &mut GuestFs, script: &str) -> ExecResult {
        run(
            fs,
            &BTreeMap::new(),
            &["sh".into(), "-c".into(), script.into()],
            b"",
        )
    }

    fn argv(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn write_then_read_a_file() {
        let mut fs = GuestFs::default();
        let r = sh(&mut fs, "echo hello > /tmp/marker && cat /tmp/marker");
        assert_eq!((r.code, r.stdout.as_slice()), (0, &b"hello\n"[..]));
        assert!(r.modified);
        let r = run(
            &mut fs,
            &BTreeMap::new(),
            &argv(&["cat", "/tmp/marker"]),
            b"",
        );
        assert_eq!(r.stdout, b"hello\n");
        assert!(!r.modified);
    }

    #[test]
    fn true_false_exit_and_status_lists() {
        let mut fs = GuestFs::default();
        let e = BTreeMap::new();
        assert_eq!(run(&mut fs, &e, &argv(&["true"]), b"").code, 0);
        assert_eq!(run(&mut fs, &e, &argv(&["false"]), b"").code, 1);
        assert_eq!(run(&mut fs, &e, &argv(&["exit", "7"]), b"").code, 7);
        assert_eq!(sh(&mut fs, "exit 3; echo never").code, 3);
        assert_eq!(sh(&mut fs, "false || echo fallback").stdout, b"fallback\n");
        assert_eq!(sh(&mut fs, "false && echo never").stdout, b"");
        assert_eq!(sh(&mut fs, "false; echo $?").stdout, b"1\n");
        let r = run(&mut fs, &e, &argv(&["nope"]), b"");
        assert_eq!(r.code, 127);
        assert!(String::from_utf8_lossy(&r.stderr).contains("command not found"));
    }

    #[test]
    fn stdin_writes_and_pipes() {
        let mut fs = GuestFs::default();
        let r = run(
            &mut fs,
            &BTreeMap::new(),
            &argv(&["sh", "-c", "cat > /data/in"]),
            b"from stdin",
        );
        assert_eq!(r.code, 0);
        assert_eq!(fs.files["/data/in"], "from stdin");
        let r = sh(&mut fs, "echo piped | tee -a /data/in | cat");
        assert_eq!(r.stdout, b"piped\n");
        assert_eq!(fs.files["/data/in"], "from stdinpiped\n");
    }

    #[test]
    fn post_clone_script_runs() {
        // The node agent's Linux fixup script (node.md §6.9), cloud-image branch excluded.
        let mut fs = GuestFs::first_boot("old-name", "tok");
        fs.files
            .insert("/etc/systemd/network/10-old.network".into(), "x".into());
        let script = "echo 3 > /proc/sys/vm/drop_caches\necho vm-new > /etc/hostname\n\
            rm -f /etc/systemd/network/10-*.network\n\
            printf '[Match]\\nMACAddress=02:00:00:00:00:01\\n\\n[Network]\\nDHCP=ipv4\\n' > /etc/systemd/network/10-020000000001.network\n\
            systemctl restart systemd-networkd";
        let r = sh(&mut fs, script);
        assert_eq!(r.code, 0, "{}", String::from_utf8_lossy(&r.stderr));
        assert_eq!(fs.files[HOSTNAME_PATH], "vm-new\n");
        assert!(!fs.files.contains_key("/etc/systemd/network/10-old.network"));
        assert!(!fs.files.keys().any(|k| k.starts_with("/proc")));
        assert_eq!(
            fs.files["/etc/systemd/network/10-020000000001.network"],
            "[Match]\nMACAddress=02:00:00:00:00:01\n\n[Network]\nDHCP=ipv4\n"
        );
        // Windows tools are accepted as no-ops.
        let e = BTreeMap::new();
        assert_eq!(
            run(
                &mut fs,
                &e,
                &argv(&["cmd", "/c", "ipconfig", "/release"]),
                b""
            )
            .code,
            0
        );
    }

    #[test]
    fn quoting_env_and_redirections() {
        let mut fs = GuestFs::default();
        let env: BTreeMap<String, String> = [("NAME".to_owned(), "world".to_owned())].into();
        let r = run(
            &mut fs,
            &env,
            &argv(&[
                "sh",
                "-c",
                r#"echo "hi $NAME" 'x $NAME' 2>/dev/null; cat /nope 2>&1"#,
            ]),
            b"",
        );
        assert_eq!(
            String::from_utf8_lossy(&r.stdout),
            "hi world x $NAME\ncat: /nope: No such file or directory\n"
        );
        assert!(r.stderr.is_empty());
        assert_eq!(sh(&mut fs, "test -f /nope").code, 1);
        assert_eq!(sh(&mut fs, "echo a > /f; [ -f /f ] && hostname").code, 0);
    }
}
