//! zstd for the v2 snapshot wire format (registry.md §5.5), on libzstd through the `zstd`
//! crate: a bounded streaming decoder for pulls and one-frame-per-blob encoders for pushes.

use bytes::Bytes;
use zstd::stream::raw::{Decoder, InBuffer, Operation, OutBuffer};

use crate::error::{Error, Result};

/// Decoded bytes are handed on in pieces of this size.
pub const PIECE: usize = 1 << 18;

/// A streaming zstd decoder that refuses to produce more than `limit` bytes (a blob claiming
/// a small file cannot decompress into a huge one) and knows whether its input ended on a
/// frame boundary.
pub struct ZstdStream {
    dec: Decoder<'static>,
    out: Vec<u8>,
    pos: usize,
    produced: u64,
    limit: u64,
    frame_done: bool,
    what: String,
}

impl ZstdStream {
    /// A decoder for blob `what` that may produce at most `limit` bytes.
    pub fn new(what: impl Into<String>, limit: u64) -> Result<ZstdStream> {
        let dec = Decoder::new().map_err(|e| Error::io("starting a zstd decoder", e))?;
        Ok(ZstdStream {
            dec,
            out: vec![0u8; PIECE],
            pos: 0,
            produced: 0,
            limit,
            frame_done: false,
            what: what.into(),
        })
    }

    /// Decodes `input`; full pieces go to `emit`.
    pub fn feed(&mut self, input: &[u8], emit: &mut dyn FnMut(Bytes) -> Result<()>) -> Result<()> {
        let mut inb = InBuffer::around(input);
        loop {
            let (in_before, out_before) = (inb.pos(), self.pos);
            let mut outb = OutBuffer::around_pos(self.out.as_mut_slice(), self.pos);
            let hint = self
                .dec
                .run(&mut inb, &mut outb)
                .map_err(|e| Error::protocol(format!("{}: zstd: {e}", self.what)))?;
            let full = outb.pos() == PIECE;
            self.pos = outb.pos();
            // A call without progress (no input left, nothing pending) says nothing new
            // about where the stream stands.
            if inb.pos() != in_before || self.pos != out_before {
                self.frame_done = hint == 0;
            }
            if full {
                self.emit(emit)?;
            } else if inb.pos() == input.len() {
                return Ok(());
            }
        }
    }

    /// Hands out the rest; the input must have ended with a complete frame. Returns the
    /// decoded size.
    pub fn finish(mut self, emit: &mut dyn FnMut(Bytes) -> Result<()>) -> Result<u64> {
        // Output the decoder still holds (its last run filled the piece exactly).
        self.feed(&[], emit)?;
        if !self.frame_done {
            return Err(Error::protocol(format!(
                "{}: zstd stream ends inside a frame",
                self.what
            )));
        }
        if self.pos > 0 {
            self.emit(emit)?;
        }
        Ok(self.produced)
    }

    fn emit(&mut self, emit: &mut dyn FnMut(Bytes) -> Result<()>) -> Result<()> {
        self.produced += self.pos as u64;
        if self.produced > self.limit {
            return Err(Error::SizeMismatch {
                what: format!("{} (decoded)", self.what),
                expected: self.limit,
                actual: self.produced,
            });
        }
        emit(Bytes::copy_from_slice(&self.out[..self.pos]))?;
        self.pos = 0;
        Ok(())
    }
}

/// Decodes a whole zstd blob held in memory.
pub fn decode_all(
    what: &str,
    input: &[u8],
    limit: u64,
    emit: &mut dyn FnMut(Bytes) -> Result<()>,
) -> Result<u64> {
    let mut d = ZstdStream::new(what, limit)?;
    d.feed(input, emit)?;
    d.finish(emit)
}

/// Compresses `data` into one zstd frame at `level` with a content checksum and the content
/// size in the header (a chunk: the Go writer's `EncodeAll`). `workers` > 0 lets libzstd
/// compress with that many threads.
pub fn encode_frame(data: &[u8], level: i32, workers: u32) -> Result<Vec<u8>> {
    use zstd::zstd_safe::CParameter;
    let mut c = zstd::bulk::Compressor::new(level).map_err(|e| Error::io("zstd encoder", e))?;
    let set = |c: &mut zstd::bulk::Compressor<'_>, p| {
        c.set_parameter(p)
            .map_err(|e| Error::io("zstd encoder parameter", e))
    };
    set(&mut c, CParameter::ChecksumFlag(true))?;
    set(&mut c, CParameter::ContentSizeFlag(true))?;
    if workers > 1 {
        set(&mut c, CParameter::NbWorkers(workers))?;
    }
    c.compress(data)
        .map_err(|e| Error::io("zstd compression", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(input: &[u8], limit: u64, split: usize) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut d = ZstdStream::new("t", limit)?;
        let mut emit = |b: Bytes| {
            out.extend_from_slice(&b);
            Ok(())
        };
        for part in input.chunks(split.max(1)) {
            d.feed(part, &mut emit)?;
        }
        d.finish(&mut emit)?;
        Ok(out)
    }

    fn sample(n: usize) -> Vec<u8> {
        (0..n)
            .map(|i| {
                if (i / 4096) % 3 == 0 {
                    0
                } else {
                    (i * 31 % 253) as u8
                }
            })
            .collect()
    }

    #[test]
    fn frames_round_trip_in_any_input_split() {
        let data = sample(3 * PIECE + 1234);
        let frame = encode_frame(&data, 3, 0).expect("encode");
        assert!(frame.len() < data.len());
        for split in [1 << 20, 4096, 7] {
            assert_eq!(
                collect(&frame, data.len() as u64, split).expect("decode"),
                data
            );
        }
        // Two frames back to back decode as their concatenation.
        let mut two = frame.clone();
        two.extend(encode_frame(b"tail", 1, 0).expect("encode"));
        let mut want = data.clone();
        want.extend_from_slice(b"tail");
        assert_eq!(
            collect(&two, want.len() as u64, 5000).expect("decode"),
            want
        );
        // Multithreaded compression produces an equally valid frame.
        let mt = encode_frame(&data, 1, 2).expect("encode mt");
        assert_eq!(
            collect(&mt, data.len() as u64, 1 << 16).expect("decode"),
            data
        );
    }

    #[test]
    fn truncated_corrupt_and_oversized_streams_fail() {
        let data = sample(PIECE * 2);
        let frame = encode_frame(&data, 3, 0).expect("encode");
        let cut = &frame[..frame.len() - 5];
        assert!(collect(cut, data.len() as u64, 4096).is_err(), "truncated");
        let mut bad = frame.clone();
        let mid = bad.len() / 2;
        bad[mid] ^= 0xff;
        assert!(collect(&bad, data.len() as u64, 4096).is_err(), "corrupt");
        let e = collect(&frame, data.len() as u64 - 1, 4096).expect_err("bomb");
        assert!(e.to_string().contains("size mismatch"), "{e}");
        assert!(collect(b"not zstd at all", 100, 4).is_err());
        assert!(collect(b"", 100, 4).is_err(), "no frame at all");
    }
}
