//! The tar subset of `cocoon snapshot export`/`import` (runtime.md §2.3): ustar, PAX records
//! (`COCOON.sparse.*`, long names, big sizes), GNU long names; async reader, pure header coding.

use std::collections::BTreeMap;
use std::io;

use tokio::io::{AsyncRead, AsyncReadExt};

/// Tar block size.
pub const BLOCK: usize = 512;
/// PAX record: the sparse file's data extents (JSON list of `{"o","l"}`).
pub const PAX_SPARSE_MAP: &str = "COCOON.sparse.map";
/// PAX record: the sparse file's logical size.
pub const PAX_SPARSE_SIZE: &str = "COCOON.sparse.size";

/// Largest size an octal ustar size field holds (11 digits).
const MAX_OCTAL_SIZE: u64 = 0o77_777_777_777;

/// Bytes of zero padding after `size` bytes of entry data.
pub fn padding(size: u64) -> usize {
    ((BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64) as usize
}

/// The two zero blocks that end an archive.
pub fn end_of_archive() -> [u8; 2 * BLOCK] {
    [0u8; 2 * BLOCK]
}

/// The header bytes (PAX header entry when needed, then the ustar header) of a regular file
/// entry. `pax` records are written as given; `path` and `size` records are added when the
/// name or size do not fit the ustar fields.
pub fn regular_file_header(
    name: &str,
    size: u64,
    mode: u32,
    mtime: u64,
    pax: &[(&str, &str)],
) -> Vec<u8> {
    let mut records: Vec<(String, String)> = Vec::new();
    if name.len() > 100 {
        records.push(("path".into(), name.into()));
    }
    if size > MAX_OCTAL_SIZE {
        records.push(("size".into(), size.to_string()));
    }
    records.extend(pax.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let mut out = Vec::with_capacity(3 * BLOCK);
    if !records.is_empty() {
        let body = encode_pax_records(&records);
        let pax_name = format!("PaxHeaders.0/{}", truncate_name(name, 87));
        out.extend_from_slice(&ustar_header(
            &pax_name,
            body.len() as u64,
            0o644,
            mtime,
            b'x',
        ));
        out.extend_from_slice(&body);
        out.resize(out.len() + padding(body.len() as u64), 0);
    }
    out.extend_from_slice(&ustar_header(
        &truncate_name(name, 100),
        size,
        mode,
        mtime,
        b'0',
    ));
    out
}

fn truncate_name(name: &str, max: usize) -> String {
    let mut end = name.len().min(max);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].to_string()
}

/// `"<len> <key>=<value>\n"` records, where `<len>` counts the whole record.
pub fn encode_pax_records(records: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in records {
        let rest = k.len() + v.len() + 3; // ' ', '=', '\n'
        let mut len = rest + 1;
        while len != rest + len.to_string().len() {
            len = rest + len.to_string().len();
        }
        out.extend_from_slice(format!("{len} {k}={v}\n").as_bytes());
    }
    out
}

fn ustar_header(name: &str, size: u64, mode: u32, mtime: u64, typeflag: u8) -> [u8; BLOCK] {
    let mut h = [0u8; BLOCK];
    h[..name.len()].copy_from_slice(name.as_bytes());
    put_octal(&mut h[100..108], u64::from(mode & 0o7777));
    put_octal(&mut h[108..116], 0);
    put_octal(&mut h[116..124], 0);
    if size <= MAX_OCTAL_SIZE {
        put_octal(&mut h[124..136], size);
    } else {
        // GNU base-256: high bit set, big-endian value (the PAX `size` record also carries it).
        let field = &mut h[124..136];
        field.fill(0);
        field[4..].copy_from_slice(&size.to_be_bytes());
        field[0] = 0x80;
    }
    put_octal(&mut h[136..148], mtime.min(0o77_777_777_777));
    h[156] = typeflag;
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].fill(b' ');
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    put_octal(&mut h[148..155], u64::from(sum));
    h[155] = b' ';
    h
}

/// Zero-padded octal with a trailing NUL.
fn put_octal(field: &mut [u8], v: u64) {
    let digits = field.len() - 1;
    let s = format!("{v:0digits$o}");
    let s = &s[s.len().saturating_sub(digits)..];
    field[..digits].copy_from_slice(s.as_bytes());
    field[digits] = 0;
}

/// One entry's header as the reader sees it (PAX and GNU long-name records applied).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub size: u64,
    pub mode: u32,
    /// The ustar type flag (`b'0'` for regular files).
    pub typeflag: u8,
    /// PAX records of this entry (global records are not applied).
    pub pax: BTreeMap<String, String>,
}

impl Entry {
    /// Regular file (`'0'`, the old `'\0'`, or contiguous `'7'`).
    pub fn is_regular(&self) -> bool {
        matches!(self.typeflag, b'0' | 0 | b'7')
    }
}

/// Parses a numeric header field: octal text, or GNU base-256 when the high bit is set.
pub fn parse_numeric(field: &[u8]) -> io::Result<u64> {
    if field.first().is_some_and(|b| b & 0x80 != 0) {
        let mut v: u64 = u64::from(field[0] & 0x7f);
        for &b in &field[1..] {
            v = v
                .checked_mul(256)
                .and_then(|v| v.checked_add(u64::from(b)))
                .ok_or_else(|| bad("base-256 number overflows"))?;
        }
        return Ok(v);
    }
    let text: Vec<u8> = field
        .iter()
        .copied()
        .take_while(|&b| b != 0)
        .filter(|&b| b != b' ')
        .collect();
    if text.is_empty() {
        return Ok(0);
    }
    let s = std::str::from_utf8(&text).map_err(|_| bad("non-ASCII number"))?;
    u64::from_str_radix(s, 8).map_err(|_| bad(&format!("invalid octal number {s:?}")))
}

/// Parses PAX records.
pub fn parse_pax_records(mut body: &[u8]) -> io::Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    while !body.is_empty() {
        if body.iter().all(|&b| b == 0) {
            break;
        }
        let sp = body
            .iter()
            .position(|&b| b == b' ')
            .ok_or_else(|| bad("PAX record without length"))?;
        let len: usize = std::str::from_utf8(&body[..sp])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("PAX record length is not a number"))?;
        if len <= sp + 1 || len > body.len() || body[len - 1] != b'\n' {
            return Err(bad("malformed PAX record"));
        }
        let rec = &body[sp + 1..len - 1];
        let eq = rec
            .iter()
            .position(|&b| b == b'=')
            .ok_or_else(|| bad("PAX record without '='"))?;
        let key = String::from_utf8(rec[..eq].to_vec()).map_err(|_| bad("PAX key is not UTF-8"))?;
        let val =
            String::from_utf8(rec[eq + 1..].to_vec()).map_err(|_| bad("PAX value is not UTF-8"))?;
        out.insert(key, val);
        body = &body[len..];
    }
    Ok(out)
}

fn bad(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("tar: {msg}"))
}

fn cstr(field: &[u8]) -> String {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

fn checksum_ok(h: &[u8; BLOCK]) -> bool {
    let Ok(want) = parse_numeric(&h[148..156]) else {
        return false;
    };
    let mut unsigned: u64 = 0;
    let mut signed: i64 = 0;
    for (i, &b) in h.iter().enumerate() {
        let b = if (148..156).contains(&i) { b' ' } else { b };
        unsigned += u64::from(b);
        signed += i64::from(b as i8);
    }
    want == unsigned || i64::try_from(want).is_ok_and(|w| w == signed)
}

/// Metadata entries (PAX, GNU long names) are read into memory up to this size.
const MAX_META_ENTRY: u64 = 8 << 20;

/// A streaming tar reader: `next_entry`, then `read_body` until it returns 0.
pub struct TarReader<R> {
    r: R,
    /// Unread bytes of the current entry's data.
    remaining: u64,
    /// Padding after the current entry's data.
    pad: usize,
    done: bool,
}

impl<R: AsyncRead + Unpin> TarReader<R> {
    pub fn new(r: R) -> TarReader<R> {
        TarReader {
            r,
            remaining: 0,
            pad: 0,
            done: false,
        }
    }

    /// Advances to the next entry (skipping what is left of the current one); `None` at the
    /// end of the archive.
    pub async fn next_entry(&mut self) -> io::Result<Option<Entry>> {
        self.skip_rest().await?;
        let mut pax: BTreeMap<String, String> = BTreeMap::new();
        let mut long_name: Option<String> = None;
        loop {
            if self.done {
                return Ok(None);
            }
            let mut h = [0u8; BLOCK];
            if !self.read_block(&mut h).await? {
                self.done = true;
                return Ok(None);
            }
            if h.iter().all(|&b| b == 0) {
                self.done = true;
                return Ok(None);
            }
            if !checksum_ok(&h) {
                return Err(bad("header checksum mismatch"));
            }
            let typeflag = h[156];
            let mut size = parse_numeric(&h[124..136])?;
            match typeflag {
                b'x' | b'g' | b'L' | b'K' => {
                    if size > MAX_META_ENTRY {
                        return Err(bad("metadata entry too large"));
                    }
                    let mut body = vec![0u8; size as usize];
                    self.r.read_exact(&mut body).await?;
                    self.skip_bytes(padding(size) as u64).await?;
                    match typeflag {
                        b'x' => pax.extend(parse_pax_records(&body)?),
                        b'L' => long_name = Some(cstr(&body)),
                        _ => {} // global records and long link names do not matter here
                    }
                    continue;
                }
                _ => {}
            }
            let mut name = match long_name.take() {
                Some(n) => n,
                None => {
                    let base = cstr(&h[..100]);
                    let prefix = if &h[257..262] == b"ustar" {
                        cstr(&h[345..500])
                    } else {
                        String::new()
                    };
                    if prefix.is_empty() {
                        base
                    } else {
                        format!("{prefix}/{base}")
                    }
                }
            };
            if let Some(p) = pax.get("path") {
                name = p.clone();
            }
            if let Some(s) = pax.get("size") {
                size = s.parse().map_err(|_| bad("PAX size is not a number"))?;
            }
            let mode = u32::try_from(parse_numeric(&h[100..108])? & 0o7777).unwrap_or(0o644);
            // Only regular files carry data that matters; others (directories, links) are
            // stepped over, including any data they claim.
            self.remaining = if matches!(typeflag, b'1' | b'2' | b'3' | b'4' | b'5' | b'6') {
                0
            } else {
                size
            };
            self.pad = if self.remaining > 0 { padding(size) } else { 0 };
            return Ok(Some(Entry {
                name,
                size: self.remaining,
                mode,
                typeflag,
                pax,
            }));
        }
    }

    /// Reads the current entry's data; 0 at its end.
    pub async fn read_body(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.remaining == 0 {
            return Ok(0);
        }
        let want = buf
            .len()
            .min(usize::try_from(self.remaining).unwrap_or(usize::MAX));
        let n = self.r.read(&mut buf[..want]).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "tar: truncated entry data",
            ));
        }
        self.remaining -= n as u64;
        Ok(n)
    }

    async fn skip_rest(&mut self) -> io::Result<()> {
        let n = self.remaining + self.pad as u64;
        self.remaining = 0;
        self.pad = 0;
        self.skip_bytes(n).await
    }

    async fn skip_bytes(&mut self, n: u64) -> io::Result<()> {
        let copied = tokio::io::copy(&mut (&mut self.r).take(n), &mut tokio::io::sink()).await?;
        if copied != n {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "tar: truncated archive",
            ));
        }
        Ok(())
    }

    /// Reads one block; `false` at a clean end of input.
    async fn read_block(&mut self, h: &mut [u8; BLOCK]) -> io::Result<bool> {
        let mut filled = 0;
        while filled < BLOCK {
            let n = self.r.read(&mut h[filled..]).await?;
            if n == 0 {
                if filled == 0 {
                    return Ok(false);
                }
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "tar: truncated header",
                ));
            }
            filled += n;
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    async fn read_all(bytes: Vec<u8>) -> io::Result<Vec<(Entry, Vec<u8>)>> {
        let mut r = TarReader::new(std::io::Cursor::new(bytes));
        let mut out = Vec::new();
        while let Some(e) = r.next_entry().await? {
            let mut data = Vec::new();
            let mut buf = [0u8; 333];
            loop {
                let n = r.read_body(&mut buf).await?;
                if n == 0 {
                    break;
                }
                data.extend_from_slice(&buf[..n]);
            }
            out.push((e, data));
        }
        Ok(out)
    }

    fn entry(name: &str, data: &[u8], pax: &[(&str, &str)]) -> Vec<u8> {
        let mut v = regular_file_header(name, data.len() as u64, 0o640, 1_700_000_000, pax);
        v.extend_from_slice(data);
        v.resize(v.len() + padding(data.len() as u64), 0);
        v
    }

    #[test]
    fn pax_record_lengths_count_themselves() {
        let recs = encode_pax_records(&[("a".into(), "b".into())]);
        assert_eq!(recs, b"6 a=b\n");
        // 9 + 2 digits would be 11 → "11 key=val\n" is 11 bytes? k=3,v=3: rest=9, len=11.
        let recs = encode_pax_records(&[("key".into(), "val".into())]);
        assert_eq!(recs, b"11 key=val\n");
        let long = "x".repeat(95);
        let recs = encode_pax_records(&[("k".into(), long.clone())]);
        let parsed = parse_pax_records(&recs).expect("parse");
        assert_eq!(parsed.get("k"), Some(&long));
    }

    #[test]
    fn numbers_parse_in_octal_and_base_256() {
        assert_eq!(parse_numeric(b"0000644\0").ok(), Some(0o644));
        assert_eq!(parse_numeric(b"   12 \0").ok(), Some(0o12));
        let mut f = [0u8; 12];
        f[0] = 0x80;
        f[4..].copy_from_slice(&(20u64 << 30).to_be_bytes());
        assert_eq!(parse_numeric(&f).ok(), Some(20 << 30));
        assert!(parse_numeric(b"9\0").is_err());
    }

    #[tokio::test]
    async fn written_entries_read_back_with_their_records() {
        let long_name = "n".repeat(150);
        let mut tar = entry("snapshot.json", b"{\"version\":1}\n", &[]);
        tar.extend(entry(
            "cow.raw",
            &[1u8; 700],
            &[
                (PAX_SPARSE_MAP, r#"[{"o":4096,"l":700}]"#),
                (PAX_SPARSE_SIZE, "1048576"),
            ],
        ));
        tar.extend(entry(&long_name, b"", &[]));
        tar.extend_from_slice(&end_of_archive());
        let got = read_all(tar).await.expect("read");
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].0.name, "snapshot.json");
        assert_eq!(got[0].1, b"{\"version\":1}\n");
        assert_eq!(
            got[1].0.pax.get(PAX_SPARSE_SIZE).map(String::as_str),
            Some("1048576")
        );
        assert_eq!(got[1].0.mode, 0o640);
        assert_eq!(got[1].1.len(), 700);
        assert_eq!(got[2].0.name, long_name);
        assert!(got.iter().all(|(e, _)| e.is_regular()));
    }

    #[tokio::test]
    async fn truncated_and_corrupt_archives_fail() {
        let mut tar = entry("a", &[5u8; 1000], &[]);
        tar.truncate(BLOCK + 10);
        assert!(read_all(tar).await.is_err());
        let mut tar = entry("a", b"x", &[]);
        tar[0] = b'b'; // checksum no longer matches
        assert!(read_all(tar).await.is_err());
    }

    #[tokio::test]
    async fn gnu_tar_reads_ours_and_we_read_gnu_tar_pax() {
        let dir = std::env::temp_dir().join(format!("cocoon-tar-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("in")).expect("mkdir");
        // Ours → GNU tar.
        let long_name = format!("{}.raw", "l".repeat(120));
        let mut tar = entry("state.json", b"{}", &[(PAX_SPARSE_SIZE, "2")]);
        tar.extend(entry(&long_name, &[7u8; 513], &[]));
        tar.extend_from_slice(&end_of_archive());
        std::fs::write(dir.join("ours.tar"), &tar).expect("write");
        let out = Command::new("tar")
            .arg("-xf")
            .arg(dir.join("ours.tar"))
            .arg("-C")
            .arg(dir.join("in"))
            .output()
            .expect("run tar");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            std::fs::read(dir.join("in/state.json")).ok(),
            Some(b"{}".to_vec())
        );
        assert_eq!(
            std::fs::read(dir.join("in").join(&long_name))
                .map(|v| v.len())
                .ok(),
            Some(513)
        );

        // GNU tar (PAX format, a per-file custom record) → ours.
        let out = Command::new("tar")
            .arg("--format=pax")
            .arg(format!("--pax-option={PAX_SPARSE_SIZE}:=42"))
            .arg("-cf")
            .arg(dir.join("gnu.tar"))
            .arg("-C")
            .arg(dir.join("in"))
            .arg("state.json")
            .output()
            .expect("run tar");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got = read_all(std::fs::read(dir.join("gnu.tar")).expect("read"))
            .await
            .expect("parse");
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0.name, "state.json");
        assert_eq!(
            got[0].0.pax.get(PAX_SPARSE_SIZE).map(String::as_str),
            Some("42")
        );
        assert_eq!(got[0].1, b"{}");
    }
}
