//! SPDY/3.1 framing, as far as the Kubernetes streaming protocol needs it (`node.md` §13).
//!
//! The API server speaks SPDY/3.1 to a kubelet for exec: it opens one SPDY stream per
//! channel (`error`, `stdin`, `stdout`, `stderr`, `resize`) with `SYN_STREAM`, expects a
//! `SYN_REPLY` for each, moves bytes in `DATA` frames, half-closes with the FIN flag and sends
//! `PING`s that the peer echoes. Header blocks are zlib streams that use the SPDY/3 dictionary;
//! each direction of a connection keeps one compression context for its whole life, so every
//! header block must pass through the same [`Encoder`] or [`Decoder`], in order.
//!
//! What is not needed and not implemented: flow control (the Go peer neither sends nor honours
//! `WINDOW_UPDATE`), server push, priorities and settings (read and ignored).
//!
//! Frame layout (all integers big-endian):
//! * control: `1 | version(15) | type(16) | flags(8) | length(24) | payload`;
//! * data: `0 | stream id(31) | flags(8) | length(24) | payload`.

use std::io;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
use tokio::io::{AsyncRead, AsyncReadExt};

/// The protocol version carried by every control frame.
pub const VERSION: u16 = 3;
/// `Upgrade:` token of the HTTP upgrade.
pub const UPGRADE_TOKEN: &str = "SPDY/3.1";

const TYPE_SYN_STREAM: u16 = 1;
const TYPE_SYN_REPLY: u16 = 2;
const TYPE_RST_STREAM: u16 = 3;
const TYPE_PING: u16 = 6;
const TYPE_GOAWAY: u16 = 7;
const TYPE_HEADERS: u16 = 8;

/// FIN flag, on control and data frames alike.
const FLAG_FIN: u8 = 0x01;
/// Largest payload a frame header can describe (24-bit length).
pub const MAX_PAYLOAD: usize = 0x00FF_FFFF;
/// Largest decompressed header block accepted from a peer.
const MAX_HEADER_BLOCK: usize = 1 << 20;

/// `RST_STREAM` status `REFUSED_STREAM`: the stream was not processed.
pub const RST_REFUSED_STREAM: u32 = 3;
/// `RST_STREAM` status `CANCEL`.
pub const RST_CANCEL: u32 = 5;

/// Name/value pairs of a header block, names in lower case. Several values of one name are
/// joined with NUL on the wire; they are kept joined here.
pub type Headers = Vec<(String, String)>;

/// One decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// The peer opens a stream.
    SynStream {
        stream_id: u32,
        fin: bool,
        headers: Headers,
    },
    /// The answer to a `SYN_STREAM`.
    SynReply {
        stream_id: u32,
        fin: bool,
        headers: Headers,
    },
    /// Abrupt end of a stream.
    RstStream { stream_id: u32, status: u32 },
    /// Liveness check; the receiver echoes the peer's pings.
    Ping { id: u32 },
    /// The sender opens no more streams.
    GoAway {
        last_good_stream_id: u32,
        status: u32,
    },
    /// Additional headers for a stream.
    Headers {
        stream_id: u32,
        fin: bool,
        headers: Headers,
    },
    /// Stream bytes; `fin` half-closes the sender's side of the stream.
    Data {
        stream_id: u32,
        fin: bool,
        data: Vec<u8>,
    },
    /// A control frame this implementation ignores (`SETTINGS`, `WINDOW_UPDATE`, ...).
    Ignored { frame_type: u16 },
}

/// Errors of the SPDY layer.
#[derive(Debug, thiserror::Error)]
pub enum SpdyError {
    #[error("spdy connection: {0}")]
    Io(#[from] io::Error),
    #[error("spdy: unsupported protocol version {0}")]
    Version(u16),
    #[error("spdy: malformed {what}")]
    Malformed { what: &'static str },
    #[error("spdy: header compression: {0}")]
    Compression(String),
    #[error("spdy: frame payload of {0} bytes exceeds the 24-bit length")]
    TooLarge(usize),
}

type Result<T, E = SpdyError> = std::result::Result<T, E>;

/// The SPDY/3 header-compression dictionary (draft 3, §2.6.10.1): length-prefixed header names
/// and values followed by a run of common tokens.
pub fn dictionary() -> &'static [u8] {
    static DICT: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    DICT.get_or_init(|| {
        const WORDS: &[&str] = &[
            "options",
            "head",
            "post",
            "put",
            "delete",
            "trace",
            "accept",
            "accept-charset",
            "accept-encoding",
            "accept-language",
            "accept-ranges",
            "age",
            "allow",
            "authorization",
            "cache-control",
            "connection",
            "content-base",
            "content-encoding",
            "content-language",
            "content-length",
            "content-location",
            "content-md5",
            "content-range",
            "content-type",
            "date",
            "etag",
            "expect",
            "expires",
            "from",
            "host",
            "if-match",
            "if-modified-since",
            "if-none-match",
            "if-range",
            "if-unmodified-since",
            "last-modified",
            "location",
            "max-forwards",
            "pragma",
            "proxy-authenticate",
            "proxy-authorization",
            "range",
            "referer",
            "retry-after",
            "server",
            "te",
            "trailer",
            "transfer-encoding",
            "upgrade",
            "user-agent",
            "vary",
            "via",
            "warning",
            "www-authenticate",
            "method",
            "get",
            "status",
            "200 OK",
            "version",
            "HTTP/1.1",
            "url",
            "public",
            "set-cookie",
            "keep-alive",
            "origin",
        ];
        const TAIL: &[&str] = &[
            "100101201202205206300302303304305306307402405406407408409410411412413414415416417",
            "502504505",
            "203 Non-Authoritative Information",
            "204 No Content",
            "301 Moved Permanently",
            "400 Bad Request",
            "401 Unauthorized",
            "403 Forbidden",
            "404 Not Found",
            "500 Internal Server Error",
            "501 Not Implemented",
            "503 Service Unavailable",
            "Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec",
            " 00:00:00",
            " Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT",
            "chunked,text/html,image/png,image/jpg,image/gif,application/xml,",
            "application/xhtml+xml,text/plain,text/javascript,",
            "publicprivatemax-age=gzip,deflate,sdch",
            "charset=utf-8charset=iso-8859-1,utf-,*,enq=0.",
        ];
        let mut d = Vec::with_capacity(1423);
        for w in WORDS {
            let len = u32::try_from(w.len()).unwrap_or(u32::MAX);
            d.extend_from_slice(&len.to_be_bytes());
            d.extend_from_slice(w.as_bytes());
        }
        for t in TAIL {
            d.extend_from_slice(t.as_bytes());
        }
        d
    })
}

/// The sending half of a connection's header compression: one zlib context, primed with the
/// SPDY/3 dictionary, through which every outgoing header block passes in order.
pub struct Encoder {
    deflate: Compress,
}

/// The receiving half: one zlib context for every incoming header block, in order.
pub struct Decoder {
    inflate: Decompress,
    dict_set: bool,
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder").finish_non_exhaustive()
    }
}

impl Encoder {
    /// A fresh context for a new connection.
    pub fn new() -> Result<Self> {
        let mut deflate = Compress::new(Compression::default(), true);
        deflate
            .set_dictionary(dictionary())
            .map_err(|e| SpdyError::Compression(e.to_string()))?;
        Ok(Encoder { deflate })
    }

    /// Compresses one header block, ending it with a sync flush so the peer can decode it
    /// without further input.
    fn compress(&mut self, block: &[u8]) -> Result<Vec<u8>> {
        let start = self.deflate.total_in();
        let mut out = Vec::with_capacity(block.len() + 64);
        loop {
            let done = usize::try_from(self.deflate.total_in() - start).unwrap_or(usize::MAX);
            self.deflate
                .compress_vec(&block[done..], &mut out, FlushCompress::Sync)
                .map_err(|e| SpdyError::Compression(e.to_string()))?;
            let done = usize::try_from(self.deflate.total_in() - start).unwrap_or(usize::MAX);
            // A sync flush is complete once all input is taken and output space remains.
            if done >= block.len() && out.len() < out.capacity() {
                return Ok(out);
            }
            out.reserve(out.capacity().max(256));
        }
    }

    /// Encodes a header block (count, then length-prefixed names and values) and compresses it.
    fn encode_headers(&mut self, headers: &Headers) -> Result<Vec<u8>> {
        let mut block = Vec::new();
        push_len(&mut block, headers.len())?;
        for (name, value) in headers {
            let name = name.to_ascii_lowercase();
            push_len(&mut block, name.len())?;
            block.extend_from_slice(name.as_bytes());
            push_len(&mut block, value.len())?;
            block.extend_from_slice(value.as_bytes());
        }
        self.compress(&block)
    }

    /// Serialises `frame`, compressing its header block through this connection's context.
    pub fn encode(&mut self, frame: &Frame) -> Result<Vec<u8>> {
        let (frame_type, flags, payload) = match frame {
            Frame::Data {
                stream_id,
                fin,
                data,
            } => {
                if data.len() > MAX_PAYLOAD {
                    return Err(SpdyError::TooLarge(data.len()));
                }
                let mut out = Vec::with_capacity(8 + data.len());
                out.extend_from_slice(&(stream_id & 0x7FFF_FFFF).to_be_bytes());
                out.push(if *fin { FLAG_FIN } else { 0 });
                push_u24(&mut out, data.len());
                out.extend_from_slice(data);
                return Ok(out);
            }
            Frame::SynStream {
                stream_id,
                fin,
                headers,
            } => {
                let mut p = Vec::new();
                p.extend_from_slice(&(stream_id & 0x7FFF_FFFF).to_be_bytes());
                p.extend_from_slice(&0u32.to_be_bytes());
                p.extend_from_slice(&[0, 0]);
                p.extend_from_slice(&self.encode_headers(headers)?);
                (TYPE_SYN_STREAM, fin_flag(*fin), p)
            }
            Frame::SynReply {
                stream_id,
                fin,
                headers,
            } => {
                let mut p = (stream_id & 0x7FFF_FFFF).to_be_bytes().to_vec();
                p.extend_from_slice(&self.encode_headers(headers)?);
                (TYPE_SYN_REPLY, fin_flag(*fin), p)
            }
            Frame::Headers {
                stream_id,
                fin,
                headers,
            } => {
                let mut p = (stream_id & 0x7FFF_FFFF).to_be_bytes().to_vec();
                p.extend_from_slice(&self.encode_headers(headers)?);
                (TYPE_HEADERS, fin_flag(*fin), p)
            }
            Frame::RstStream { stream_id, status } => {
                let mut p = (stream_id & 0x7FFF_FFFF).to_be_bytes().to_vec();
                p.extend_from_slice(&status.to_be_bytes());
                (TYPE_RST_STREAM, 0, p)
            }
            Frame::Ping { id } => (TYPE_PING, 0, id.to_be_bytes().to_vec()),
            Frame::GoAway {
                last_good_stream_id,
                status,
            } => {
                let mut p = (last_good_stream_id & 0x7FFF_FFFF).to_be_bytes().to_vec();
                p.extend_from_slice(&status.to_be_bytes());
                (TYPE_GOAWAY, 0, p)
            }
            Frame::Ignored { frame_type } => (*frame_type, 0, Vec::new()),
        };
        if payload.len() > MAX_PAYLOAD {
            return Err(SpdyError::TooLarge(payload.len()));
        }
        let mut out = Vec::with_capacity(8 + payload.len());
        out.extend_from_slice(&(0x8000 | VERSION).to_be_bytes());
        out.extend_from_slice(&frame_type.to_be_bytes());
        out.push(flags);
        push_u24(&mut out, payload.len());
        out.extend_from_slice(&payload);
        Ok(out)
    }
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder::new()
    }
}

impl Decoder {
    /// A fresh context for a new connection.
    pub fn new() -> Self {
        Decoder {
            inflate: Decompress::new(true),
            dict_set: false,
        }
    }

    /// Decompresses one header block of the peer.
    fn decompress(&mut self, block: &[u8]) -> Result<Vec<u8>> {
        let start = self.inflate.total_in();
        let mut out = Vec::with_capacity(block.len() * 4 + 64);
        loop {
            let before_in = self.inflate.total_in();
            let before_out = out.len();
            let done = usize::try_from(before_in - start).unwrap_or(usize::MAX);
            match self
                .inflate
                .decompress_vec(&block[done..], &mut out, FlushDecompress::Sync)
            {
                Ok(Status::Ok | Status::BufError | Status::StreamEnd) => {}
                Err(e) if e.needs_dictionary().is_some() && !self.dict_set => {
                    self.inflate
                        .set_dictionary(dictionary())
                        .map_err(|e| SpdyError::Compression(e.to_string()))?;
                    self.dict_set = true;
                    continue;
                }
                Err(e) => return Err(SpdyError::Compression(e.to_string())),
            }
            let done = usize::try_from(self.inflate.total_in() - start).unwrap_or(usize::MAX);
            if out.len() > MAX_HEADER_BLOCK {
                return Err(SpdyError::Malformed {
                    what: "header block (too large)",
                });
            }
            if out.len() == out.capacity() {
                out.reserve(out.capacity().max(256));
                continue;
            }
            if done >= block.len() {
                return Ok(out);
            }
            if self.inflate.total_in() == before_in && out.len() == before_out {
                return Err(SpdyError::Malformed {
                    what: "header block (no progress)",
                });
            }
        }
    }

    /// Decompresses and parses a header block.
    fn decode_headers(&mut self, compressed: &[u8]) -> Result<Headers> {
        let block = self.decompress(compressed)?;
        let mut cur = Cursor {
            buf: &block,
            pos: 0,
        };
        let count = cur.u32("header count")?;
        let mut out = Vec::new();
        for _ in 0..count {
            let name = cur.string("header name")?;
            let value = cur.string("header value")?;
            out.push((name.to_ascii_lowercase(), value));
        }
        Ok(out)
    }

    /// Reads the next frame; `Ok(None)` on a clean end of the connection between frames.
    pub async fn read_frame<R: AsyncRead + Unpin>(&mut self, r: &mut R) -> Result<Option<Frame>> {
        let mut head = [0u8; 8];
        // A clean EOF is only possible before the first byte of a frame.
        let n = r.read(&mut head[..1]).await?;
        if n == 0 {
            return Ok(None);
        }
        r.read_exact(&mut head[1..]).await?;
        let flags = head[4];
        let len = (usize::from(head[5]) << 16) | (usize::from(head[6]) << 8) | usize::from(head[7]);
        let mut payload = vec![0u8; len];
        r.read_exact(&mut payload).await?;
        let fin = flags & FLAG_FIN != 0;
        if head[0] & 0x80 == 0 {
            let stream_id = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) & 0x7FFF_FFFF;
            return Ok(Some(Frame::Data {
                stream_id,
                fin,
                data: payload,
            }));
        }
        let version = u16::from_be_bytes([head[0] & 0x7F, head[1]]);
        if version != VERSION {
            return Err(SpdyError::Version(version));
        }
        let frame_type = u16::from_be_bytes([head[2], head[3]]);
        let mut cur = Cursor {
            buf: &payload,
            pos: 0,
        };
        let frame = match frame_type {
            TYPE_SYN_STREAM => {
                let stream_id = cur.u32("SYN_STREAM")? & 0x7FFF_FFFF;
                cur.skip(6, "SYN_STREAM")?;
                let headers = self.decode_headers(cur.rest())?;
                Frame::SynStream {
                    stream_id,
                    fin,
                    headers,
                }
            }
            TYPE_SYN_REPLY => {
                let stream_id = cur.u32("SYN_REPLY")? & 0x7FFF_FFFF;
                let headers = self.decode_headers(cur.rest())?;
                Frame::SynReply {
                    stream_id,
                    fin,
                    headers,
                }
            }
            TYPE_HEADERS => {
                let stream_id = cur.u32("HEADERS")? & 0x7FFF_FFFF;
                let headers = self.decode_headers(cur.rest())?;
                Frame::Headers {
                    stream_id,
                    fin,
                    headers,
                }
            }
            TYPE_RST_STREAM => Frame::RstStream {
                stream_id: cur.u32("RST_STREAM")? & 0x7FFF_FFFF,
                status: cur.u32("RST_STREAM")?,
            },
            TYPE_PING => Frame::Ping {
                id: cur.u32("PING")?,
            },
            TYPE_GOAWAY => Frame::GoAway {
                last_good_stream_id: cur.u32("GOAWAY")? & 0x7FFF_FFFF,
                // SPDY/3 added the status; tolerate its absence.
                status: cur.u32("GOAWAY").unwrap_or(0),
            },
            other => Frame::Ignored { frame_type: other },
        };
        Ok(Some(frame))
    }
}

fn fin_flag(fin: bool) -> u8 {
    if fin { FLAG_FIN } else { 0 }
}

fn push_len(out: &mut Vec<u8>, len: usize) -> Result<()> {
    let len = u32::try_from(len).map_err(|_| SpdyError::TooLarge(len))?;
    out.extend_from_slice(&len.to_be_bytes());
    Ok(())
}

fn push_u24(out: &mut Vec<u8>, len: usize) {
    // Callers check `len <= MAX_PAYLOAD`.
    let b = u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes();
    out.extend_from_slice(&b[1..]);
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|e| *e <= self.buf.len())
            .ok_or(SpdyError::Malformed { what })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn skip(&mut self, n: usize, what: &'static str) -> Result<()> {
        self.take(n, what).map(drop)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn string(&mut self, what: &'static str) -> Result<String> {
        let len = usize::try_from(self.u32(what)?).map_err(|_| SpdyError::Malformed { what })?;
        let b = self.take(len, what)?;
        String::from_utf8(b.to_vec()).map_err(|_| SpdyError::Malformed { what })
    }

    fn rest(&self) -> &'a [u8] {
        &self.buf[self.pos..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dictionary_is_the_spdy3_one() {
        // Size and Adler-32 of the draft-3 dictionary (the checksum a peer's zlib header names).
        assert_eq!(dictionary().len(), 1423);
        let mut c = Compress::new(Compression::default(), true);
        assert_eq!(c.set_dictionary(dictionary()).expect("dict"), 0xe3c6_a7c2);
    }

    async fn round_trip(frames: &[Frame]) -> Vec<Frame> {
        let mut tx = Encoder::new().expect("encoder");
        let mut rx = Decoder::new();
        let mut wire = Vec::new();
        for f in frames {
            wire.extend_from_slice(&tx.encode(f).expect("encode"));
        }
        let mut r = wire.as_slice();
        let mut out = Vec::new();
        while let Some(f) = rx.read_frame(&mut r).await.expect("read") {
            out.push(f);
        }
        out
    }

    #[tokio::test]
    async fn frames_round_trip_through_one_compression_context() {
        let frames = vec![
            Frame::SynStream {
                stream_id: 1,
                fin: false,
                headers: vec![("streamtype".into(), "error".into())],
            },
            Frame::SynStream {
                stream_id: 3,
                fin: false,
                headers: vec![("streamtype".into(), "stdout".into())],
            },
            Frame::SynReply {
                stream_id: 3,
                fin: false,
                headers: Vec::new(),
            },
            Frame::Data {
                stream_id: 3,
                fin: true,
                data: b"hello\n".to_vec(),
            },
            Frame::Ping { id: 7 },
            Frame::RstStream {
                stream_id: 1,
                status: RST_CANCEL,
            },
            Frame::GoAway {
                last_good_stream_id: 3,
                status: 0,
            },
        ];
        assert_eq!(round_trip(&frames).await, frames);
    }

    #[tokio::test]
    async fn large_header_blocks_and_data_survive() {
        let big = "x".repeat(100_000);
        let frames = vec![
            Frame::SynStream {
                stream_id: 5,
                fin: false,
                headers: vec![
                    ("big".into(), big.clone()),
                    ("streamtype".into(), "stdin".into()),
                ],
            },
            Frame::Data {
                stream_id: 5,
                fin: false,
                data: vec![7u8; 200_000],
            },
        ];
        assert_eq!(round_trip(&frames).await, frames);
    }

    #[tokio::test]
    async fn truncated_and_foreign_input_is_an_error() {
        let mut rx = Decoder::new();
        // A control frame of version 2.
        let mut r: &[u8] = &[0x80, 0x02, 0x00, 0x06, 0x00, 0x00, 0x00, 0x04, 0, 0, 0, 1];
        assert!(matches!(
            rx.read_frame(&mut r).await,
            Err(SpdyError::Version(2))
        ));
        // A frame cut in its payload.
        let mut r: &[u8] = &[0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x09, 1, 2];
        assert!(rx.read_frame(&mut r).await.is_err());
        // A SYN_STREAM whose header block is not zlib.
        let mut r: &[u8] = &[
            0x80, 0x03, 0x00, 0x01, 0x00, 0x00, 0x00, 0x0e, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 2, 3,
            4,
        ];
        assert!(rx.read_frame(&mut r).await.is_err());
    }
}
