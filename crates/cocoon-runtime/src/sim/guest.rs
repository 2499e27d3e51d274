//! The simulated guest: a disk file that really holds the guest's files (so snapshots, exports
//! and clones carry them), and a tiny shell that `exec` runs against those files.
//!
//! Disk layout: `COCOON-SIM-GUEST v1\n`, a 16-digit length, `\n`, the JSON of [`GuestFs`], then
//! zeros up to [`GUEST_REGION`]; the rest of the file up to the configured disk size is a hole
//! (sparse) or pseudo-random bytes (filled), so tests can move realistic byte counts.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::tarfmt::data_extents;

/// Magic line at offset 0 of every simulated guest disk.
pub const GUEST_MAGIC: &[u8] = b"COCOON-SIM-GUEST v1\n";
/// Bytes reserved at the start of the disk for the guest files.
pub const GUEST_REGION: u64 = 1 << 20;
/// The state token: random hex written at first boot and carried through every snapshot.
pub const TOKEN_PATH: &str = "/var/lib/cocoon-sim/state-token";
/// The guest hostname (the VM name at first boot; a restored VM keeps its source's).
pub const HOSTNAME_PATH: &str = "/etc/hostname";
const LEN_DIGITS: usize = 16;

/// The guest's files: absolute path → text content.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestFs {
    /// Files by normalised absolute path.
    pub files: BTreeMap<String, String>,
}

impl GuestFs {
    /// The files of a first boot: hostname and a fresh state token.
    pub fn first_boot(hostname: &str, token: &str) -> Self {
        let mut fs = GuestFs::default();
        fs.files
            .insert(HOSTNAME_PATH.to_owned(), format!("{hostname}\n"));
        fs.files.insert(TOKEN_PATH.to_owned(), format!("{token}\n"));
        fs
    }

    /// The state token, trimmed.
    pub fn token(&self) -> Option<String> {
        self.files.get(TOKEN_PATH).map(|t| t.trim().to_owned())
    }
}

/// How the part of the disk beyond the guest region is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DiskFill {
    /// A hole: the file has the size but (almost) no data.
    Sparse,
    /// Pseudo-random bytes: every byte is data and hardly compressible.
    Filled,
}

/// Size and fill of a new guest disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskSpec {
    /// Logical file size in bytes (at least the header is always written).
    pub size: u64,
    /// Layout beyond the guest region.
    pub fill: DiskFill,
}

impl Default for DiskSpec {
    fn default() -> Self {
        DiskSpec {
            size: 16 << 20,
            fill: DiskFill::Sparse,
        }
    }
}

fn header_bytes(fs: &GuestFs) -> io::Result<Vec<u8>> {
    let json = serde_json::to_vec(fs).map_err(io::Error::other)?;
    let mut out = Vec::with_capacity(GUEST_MAGIC.len() + LEN_DIGITS + 1 + json.len());
    out.extend_from_slice(GUEST_MAGIC);
    out.extend_from_slice(format!("{:0width$}\n", json.len(), width = LEN_DIGITS).as_bytes());
    out.extend_from_slice(&json);
    if out.len() as u64 > GUEST_REGION {
        return Err(io::Error::new(
            io::ErrorKind::StorageFull,
            "no space left on device",
        ));
    }
    Ok(out)
}

/// Reads the guest files; `None` if the disk carries no (valid) guest header, e.g. a snapshot
/// imported from elsewhere.
pub fn read_guest(path: &Path) -> io::Result<Option<GuestFs>> {
    let mut f = File::open(path)?;
    let mut head = vec![0u8; GUEST_MAGIC.len() + LEN_DIGITS + 1];
    if f.read_exact(&mut head).is_err() || !head.starts_with(GUEST_MAGIC) {
        return Ok(None);
    }
    let len: Option<u64> =
        std::str::from_utf8(&head[GUEST_MAGIC.len()..GUEST_MAGIC.len() + LEN_DIGITS])
            .ok()
            .and_then(|s| s.parse().ok());
    let Some(len) = len.filter(|l| *l <= GUEST_REGION) else {
        return Ok(None);
    };
    let mut json = vec![0u8; len as usize];
    if f.read_exact(&mut json).is_err() {
        return Ok(None);
    }
    Ok(serde_json::from_slice(&json).ok())
}

/// Rewrites the guest files in place, zeroing what is left of a longer previous header.
pub fn write_guest(path: &Path, fs: &GuestFs) -> io::Result<()> {
    let new = header_bytes(fs)?;
    let old_len = old_header_len(path)?;
    let mut f = OpenOptions::new().write(true).open(path)?;
    f.write_all(&new)?;
    if old_len > new.len() as u64 {
        io::copy(&mut io::repeat(0).take(old_len - new.len() as u64), &mut f)?;
    }
    f.sync_data()
}

fn old_header_len(path: &Path) -> io::Result<u64> {
    let mut f = File::open(path)?;
    let mut head = vec![0u8; GUEST_MAGIC.len() + LEN_DIGITS + 1];
    if f.read_exact(&mut head).is_err() || !head.starts_with(GUEST_MAGIC) {
        return Ok(0);
    }
    let len: u64 = std::str::from_utf8(&head[GUEST_MAGIC.len()..GUEST_MAGIC.len() + LEN_DIGITS])
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(GUEST_REGION);
    Ok((head.len() as u64 + len).min(GUEST_REGION))
}

/// Creates a new guest disk holding `fs`, laid out per `spec`. `seed` varies the filled bytes.
pub fn create_disk(path: &Path, fs: &GuestFs, spec: DiskSpec, seed: u64) -> io::Result<()> {
    let header = header_bytes(fs)?;
    let mut f = File::create(path)?;
    f.write_all(&header)?;
    let size = spec.size.max(header.len() as u64);
    f.set_len(size)?;
    if spec.fill == DiskFill::Filled && size > GUEST_REGION {
        f.seek(SeekFrom::Start(GUEST_REGION))?;
        // xorshift64*: cheap, deterministic per seed, and incompressible enough.
        let mut x = seed | 1;
        let mut left = size - GUEST_REGION;
        let mut buf = vec![0u8; 1 << 20];
        while left > 0 {
            for chunk in buf.chunks_mut(8) {
                x ^= x >> 12;
                x ^= x << 25;
                x ^= x >> 27;
                let v = x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
                chunk.copy_from_slice(&v[..chunk.len()]);
            }
            let n = left.min(buf.len() as u64) as usize;
            f.write_all(&buf[..n])?;
            left -= n as u64;
        }
    }
    f.sync_all()
}

/// What a snapshot's `memory-ranges` holds beyond its header.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemoryFill {
    /// A hole: the file has the size but (almost) no data.
    #[default]
    Sparse,
    /// Like a real guest's memory image: every 4 KiB page is data, half of them zero pages, a
    /// quarter text-like (words and spaces, as page cache and program text are), a quarter
    /// pseudo-random (compressed or encrypted data), in a deterministic shuffled order. zstd
    /// cuts it to about a third; v1 moves every byte.
    Realistic,
}

/// Page size of a [`MemoryFill::Realistic`] image.
pub const MEMORY_PAGE: usize = 4096;

/// Writes `len` bytes of a [`MemoryFill::Realistic`] image to `out`, deterministic per `seed`.
pub fn write_realistic_memory(out: &mut impl Write, len: u64, seed: u64) -> io::Result<()> {
    const WORDS: [&[u8]; 16] = [
        b"the ",
        b"cocoon ",
        b"agent ",
        b"kernel ",
        b"page ",
        b"memory ",
        b"snapshot ",
        b"return ",
        b"struct ",
        b"fn ",
        b"0x7ffd ",
        b"error ",
        b"self ",
        b"let ",
        b"=> ",
        b"\n    ",
    ];
    let mut x = seed | 1;
    let mut next = move || {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let mut buf = vec![0u8; 256 * MEMORY_PAGE];
    let mut left = len;
    while left > 0 {
        for page in buf.chunks_mut(MEMORY_PAGE) {
            // The page's kind from the top bits: 0-1 zero, 2 text, 3 random.
            match next() >> 62 {
                0 | 1 => page.fill(0),
                2 => {
                    let mut at = 0;
                    while at < page.len() {
                        let w = WORDS[(next() & 15) as usize];
                        let n = w.len().min(page.len() - at);
                        page[at..at + n].copy_from_slice(&w[..n]);
                        at += n;
                    }
                }
                _ => {
                    for c in page.chunks_mut(8) {
                        let v = next().to_le_bytes();
                        c.copy_from_slice(&v[..c.len()]);
                    }
                }
            }
        }
        let n = left.min(buf.len() as u64) as usize;
        out.write_all(&buf[..n])?;
        left -= n as u64;
    }
    Ok(())
}

/// Copies a file keeping its holes: only the data extents are written.
pub fn copy_sparse(src: &Path, dst: &Path) -> io::Result<u64> {
    let mut from = File::open(src)?;
    let size = from.metadata()?.len();
    let extents = data_extents(&mut from, size)?;
    let mut to = File::create(dst)?;
    to.set_len(size)?;
    for e in &extents {
        from.seek(SeekFrom::Start(e.offset))?;
        to.seek(SeekFrom::Start(e.offset))?;
        io::copy(&mut (&mut from).take(e.length), &mut to)?;
    }
    to.sync_all()?;
    Ok(size)
}

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

/// Shell tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
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
const STATUS_MARK: &str = "\u{1}?\u{1}";

fn tokenize(script: &str, env: &BTreeMap<String, String>) -> Result<Vec<Tok>, String> {
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
fn norm(path: &str) -> String {
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
fn is_virtual(path: &str) -> bool {
    ["/proc/", "/sys/", "/dev/"]
        .iter()
        .any(|p| path.starts_with(p))
}

/// `*` matches any run of characters except `/`.
fn glob_match(pattern: &str, text: &str) -> bool {
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

    /// A realistic memory image: deterministic per seed, about half zero pages, a quarter
    /// text (printable bytes only) and a quarter random, mixed.
    #[test]
    fn a_realistic_memory_image_is_half_zero_pages_a_quarter_text_a_quarter_random() {
        let pages = 4096;
        let mut a = Vec::new();
        write_realistic_memory(&mut a, (pages * MEMORY_PAGE) as u64 + 100, 7).expect("write");
        assert_eq!(a.len(), pages * MEMORY_PAGE + 100, "the exact length");
        let mut b = Vec::new();
        write_realistic_memory(&mut b, (pages * MEMORY_PAGE) as u64 + 100, 7).expect("write");
        assert_eq!(a, b, "deterministic per seed");
        let mut c = Vec::new();
        write_realistic_memory(&mut c, MEMORY_PAGE as u64 * 16, 8).expect("write");
        assert_ne!(&a[..c.len()], &c[..], "another seed, another image");

        let (mut zero, mut text, mut random) = (0usize, 0usize, 0usize);
        let mut kinds = Vec::new();
        for page in a.chunks(MEMORY_PAGE).take(pages) {
            let kind = if page.iter().all(|b| *b == 0) {
                zero += 1;
                0
            } else if page
                .iter()
                .all(|b| b.is_ascii_graphic() || b" \n".contains(b))
            {
                text += 1;
                1
            } else {
                random += 1;
                2
            };
            kinds.push(kind);
        }
        let share = |n: usize| n as f64 / pages as f64;
        assert!((0.45..0.55).contains(&share(zero)), "zero pages {zero}");
        assert!((0.2..0.3).contains(&share(text)), "text pages {text}");
        assert!((0.2..0.3).contains(&share(random)), "random pages {random}");
        let runs = kinds.windows(2).filter(|w| w[0] != w[1]).count();
        assert!(
            runs > pages / 4,
            "shuffled, not in blocks: {runs} kind changes"
        );
    }

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

    #[test]
    fn disk_header_round_trip_and_sparse_copy() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("cow.raw");
        let fs = GuestFs::first_boot("vm-a", "abc123");
        create_disk(
            &p,
            &fs,
            DiskSpec {
                size: 4 << 20,
                fill: DiskFill::Sparse,
            },
            1,
        )
        .expect("create");
        assert_eq!(std::fs::metadata(&p).expect("meta").len(), 4 << 20);
        assert_eq!(read_guest(&p).expect("read"), Some(fs.clone()));

        let mut bigger = fs.clone();
        bigger.files.insert("/big".into(), "x".repeat(5000));
        write_guest(&p, &bigger).expect("write");
        write_guest(&p, &fs).expect("shrink");
        assert_eq!(read_guest(&p).expect("read"), Some(fs.clone()));

        let q = dir.path().join("copy.raw");
        copy_sparse(&p, &q).expect("copy");
        assert_eq!(std::fs::read(&p).expect("p"), std::fs::read(&q).expect("q"));
        assert_eq!(
            read_guest(&q).expect("read").and_then(|g| g.token()),
            Some("abc123".into())
        );

        let filled = dir.path().join("filled.raw");
        create_disk(
            &filled,
            &fs,
            DiskSpec {
                size: 3 << 20,
                fill: DiskFill::Filled,
            },
            7,
        )
        .expect("create");
        let bytes = std::fs::read(&filled).expect("read");
        assert_eq!(bytes.len(), 3 << 20);
        assert!(
            bytes[GUEST_REGION as usize..]
                .iter()
                .filter(|b| **b == 0)
                .count()
                < 100_000
        );

        std::fs::write(dir.path().join("foreign.raw"), b"not a sim disk").expect("w");
        assert_eq!(
            read_guest(&dir.path().join("foreign.raw")).expect("read"),
            None
        );
        let mut huge = GuestFs::default();
        huge.files
            .insert("/x".into(), "y".repeat(GUEST_REGION as usize));
        assert!(write_guest(&p, &huge).is_err(), "guest region is bounded");
    }
}
