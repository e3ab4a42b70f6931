//! Git's pack delta format, as `delta` hunks of binary patches carry it (git's
//! `diff-delta.c` / `patch-delta.c`): two varints (source size, target size; 7 bits a byte, least
//! significant first, high bit = more), then ops. A copy op is `0x80 | flags` followed by the
//! offset bytes flagged by bits 0x01..0x08 and the size bytes flagged by 0x10..0x40 (little
//! endian, absent bytes are zero, a size of 0 means 0x10000); an insert op is a byte `1..=127`
//! followed by that many literal bytes. Op byte 0 is reserved and refused.
//!
//! The encoder (`encode.rs`) reads its source in place through [`Source`] and its target
//! once, front to back, so a delta between two files of any size holds neither: a small edit
//! of a gigabyte is a small delta made in bounded memory. A copy op addresses the source with
//! four offset bytes, so only a source's first 4 GiB can be copied from ([`MAX_SOURCE`]); a
//! copy op carries up to three size bytes, so long copies are split at [`MAX_COPY`] (16 MiB,
//! which `patch-delta.c` has always read; git's own encoder stops at 64 KiB).
//!
//! Decoding never trusts the header: every op is checked (a copy stays within the source, an
//! insert within the delta) and what the ops produce must be exactly the declared result. It
//! streams too: ops are read from any [`BufRead`] (an inflater over a hunk's lines), copies
//! read their source range through [`Source`] and the result goes to any writer; nothing is
//! allocated by a size the delta declares.
//!
//! [`MAX_SOURCE`]: format::MAX_SOURCE
//! [`MAX_COPY`]: format::MAX_COPY

mod encode;
pub(crate) mod format;
mod source;
#[cfg(test)]
mod source_reads_tests;

use std::io::{self, BufRead, Write};

pub(crate) use encode::{encode, encode_stream, EncodeError, Index};
use format::MAX_INSERT;
use serde::{Deserialize, Serialize};
pub(crate) use source::{FileSource, Source};

/// Bytes copied from a source at a time when a delta is applied.
const COPY_CHUNK: usize = 64 << 10;

/// Sizes a delta declares, after its ops were checked to produce exactly the target size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeltaSizes {
    /// The length of the content the delta applies to.
    pub source: u64,
    /// The length of the content it makes.
    pub target: u64,
}

/// The next byte of `r`, `None` at its end. A reader's error is the delta's data being
/// corrupt (an inflater over a hunk's lines fails on bad zlib data).
fn next_byte(r: &mut impl BufRead) -> Result<Option<u8>, String> {
    let buf = r
        .fill_buf()
        .map_err(|e| format!("corrupt zlib data in delta hunk: {e}"))?;
    let Some(&b) = buf.first() else {
        return Ok(None);
    };
    r.consume(1);
    Ok(Some(b))
}

/// Reads one header varint; refuses one longer than a u64.
fn get_varint(r: &mut impl BufRead) -> Result<u64, String> {
    let mut v: u64 = 0;
    let mut shift = 0u32;
    loop {
        let b = next_byte(r)?.ok_or("delta header is truncated (size varint runs past the end)")?;
        if shift > 63 || (shift == 63 && b & 0x7e != 0) {
            return Err("delta header size does not fit in 64 bits".into());
        }
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
        shift += 7;
    }
}

/// One decoded op; an insert's bytes are in the buffer [`Ops::next_op`] was given.
enum Op {
    Copy { offset: u64, len: u64 },
    Insert(usize),
}

/// The ops after the header, each checked against the delta's data and the declared source.
struct Ops<R> {
    r: R,
    source: u64,
}

impl<R: BufRead> Ops<R> {
    fn next_op(&mut self, insert: &mut [u8; MAX_INSERT]) -> Result<Option<Op>, String> {
        let Some(cmd) = next_byte(&mut self.r)? else {
            return Ok(None);
        };
        if cmd == 0 {
            return Err("delta op 0 is reserved".into());
        }
        if cmd & 0x80 == 0 {
            let n = usize::from(cmd);
            self.r.read_exact(&mut insert[..n]).map_err(|e| {
                if e.kind() == io::ErrorKind::UnexpectedEof {
                    "delta insert op runs past the end of the delta".to_string()
                } else {
                    format!("corrupt zlib data in delta hunk: {e}")
                }
            })?;
            return Ok(Some(Op::Insert(n)));
        }
        let offset = self.flagged(cmd, 0, 4)?;
        let len = match self.flagged(cmd, 4, 3)? {
            0 => 0x10000,
            n => n,
        };
        if offset.checked_add(len).is_none_or(|end| end > self.source) {
            return Err(format!(
                "delta copy op ({len} bytes at {offset}) reaches past the {}-byte source",
                self.source
            ));
        }
        Ok(Some(Op::Copy { offset, len }))
    }

    /// The little-endian value of the bytes flagged by bits `first..first + count` of `cmd`.
    fn flagged(&mut self, cmd: u8, first: u32, count: u32) -> Result<u64, String> {
        let mut v = 0u64;
        for i in 0..count {
            if cmd & (1 << (first + i)) != 0 {
                let b = next_byte(&mut self.r)?
                    .ok_or("delta copy op runs past the end of the delta")?;
                v |= u64::from(b) << (8 * i);
            }
        }
        Ok(v)
    }
}

fn header<R: BufRead>(mut r: R, limit: u64) -> Result<(DeltaSizes, Ops<R>), String> {
    let source = get_varint(&mut r)?;
    let target = get_varint(&mut r)?;
    if target > limit {
        return Err(format!(
            "delta declares a {target}-byte result, over the {limit}-byte limit"
        ));
    }
    Ok((DeltaSizes { source, target }, Ops { r, source }))
}

/// Counts what ops produce, refusing a byte past the declared result.
fn produced(total: &mut u64, n: u64, target: u64) -> Result<(), String> {
    *total += n;
    if *total > target {
        return Err(format!(
            "delta produces more than the {target} bytes its header declares"
        ));
    }
    Ok(())
}

/// Walks a delta read from `r`: the declared result must be at most `limit` and exactly what
/// the ops produce. Allocates nothing by what the delta declares.
pub(crate) fn check_reader(r: impl BufRead, limit: u64) -> Result<DeltaSizes, String> {
    let (sizes, mut ops) = header(r, limit)?;
    let mut insert = [0u8; MAX_INSERT];
    let mut total: u64 = 0;
    while let Some(op) = ops.next_op(&mut insert)? {
        let n = match op {
            Op::Copy { len, .. } => len,
            Op::Insert(n) => n as u64,
        };
        produced(&mut total, n, sizes.target)?;
    }
    if total != sizes.target {
        return Err(format!(
            "delta produces {total} bytes, its header declares {}",
            sizes.target
        ));
    }
    Ok(sizes)
}

/// [`check_reader`] of a delta in memory.
pub(crate) fn check(delta: &[u8], limit: u64) -> Result<DeltaSizes, String> {
    check_reader(delta, limit)
}

/// Applies the delta read from `r` to `src`, writing the result to `out` as it is made; the
/// result's length. Each op is checked as it comes (a delta that fails midway has written
/// part of a result: callers write to a place they discard on error, and check the result's
/// id). Memory: one copy chunk, whatever the sizes.
pub(crate) fn apply_reader(
    r: impl BufRead,
    src: &dyn Source,
    out: &mut dyn Write,
    limit: u64,
) -> Result<u64, String> {
    let (sizes, mut ops) = header(r, limit)?;
    if sizes.source != src.size() {
        return Err(format!(
            "delta is against a {}-byte source, the base has {} bytes",
            sizes.source,
            src.size()
        ));
    }
    let write_err = |e: io::Error| format!("writing the delta's result: {e}");
    let mut insert = [0u8; MAX_INSERT];
    let mut chunk = Vec::new();
    let mut total: u64 = 0;
    while let Some(op) = ops.next_op(&mut insert)? {
        match op {
            Op::Copy { offset, len } => {
                produced(&mut total, len, sizes.target)?;
                chunk.resize(COPY_CHUNK.min(len as usize), 0);
                let mut done = 0u64;
                while done < len {
                    let n = (len - done).min(chunk.len() as u64) as usize;
                    src.read_exact_at(&mut chunk[..n], offset + done)
                        .map_err(|e| format!("reading the delta's base: {e}"))?;
                    out.write_all(&chunk[..n]).map_err(write_err)?;
                    done += n as u64;
                }
            }
            Op::Insert(n) => {
                produced(&mut total, n as u64, sizes.target)?;
                out.write_all(&insert[..n]).map_err(write_err)?;
            }
        }
    }
    if total != sizes.target {
        return Err(format!(
            "delta produces {total} bytes, its header declares {}",
            sizes.target
        ));
    }
    Ok(total)
}

/// Applies `delta` to `src` in memory. Every op is checked (by [`check`]) before the result
/// is allocated, at the size the ops really produce.
pub(crate) fn apply(src: &[u8], delta: &[u8], limit: u64) -> Result<Vec<u8>, String> {
    let sizes = check(delta, limit)?;
    let target = usize::try_from(sizes.target).map_err(|_| "delta result too large")?;
    if sizes.source != src.len() as u64 {
        return Err(format!(
            "delta is against a {}-byte source, the base has {} bytes",
            sizes.source,
            src.len()
        ));
    }
    let mut out = Vec::with_capacity(target);
    apply_reader(delta, &src, &mut out, limit)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::format::{put_varint, MAX_COPY};
    use super::*;
    use proptest::prelude::*;

    const NO_LIMIT: u64 = u64::MAX;

    fn round_trip(src: &[u8], dst: &[u8]) -> Vec<u8> {
        let d = encode(src, dst, usize::MAX).expect("no size cap");
        assert_eq!(apply(src, &d, NO_LIMIT).unwrap(), dst);
        d
    }

    fn noise(n: usize, mut seed: u64) -> Vec<u8> {
        (0..n)
            .map(|_| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (seed >> 56) as u8
            })
            .collect()
    }

    #[test]
    fn varints_round_trip_and_overflow_is_refused() {
        for v in [0u64, 1, 127, 128, 300, u32::MAX as u64, u64::MAX] {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            let mut r = &b[..];
            assert_eq!(get_varint(&mut r).unwrap(), v);
            assert!(r.is_empty());
        }
        assert!(get_varint(&mut &[0xff; 11][..]).is_err());
        assert!(get_varint(&mut &[0x80, 0x80][..]).is_err());
    }

    #[test]
    fn small_edit_is_mostly_copies() {
        let src = noise(100_000, 1);
        let mut dst = src.clone();
        dst[50_000..50_004].copy_from_slice(b"EDIT");
        let d = round_trip(&src, &dst);
        assert!(d.len() < 64, "{} bytes", d.len());
        // Insertions and deletions shift the rest: still copies.
        let mut ins = src.clone();
        ins.splice(777..777, b"inserted".iter().copied());
        ins.drain(90_000..90_100);
        assert!(round_trip(&src, &ins).len() < 80);
    }

    #[test]
    fn edge_cases_round_trip() {
        round_trip(b"", b"");
        round_trip(b"", b"new");
        round_trip(b"old", b"");
        round_trip(&[0; 5000], &[0; 9000]);
        let n = noise(300, 2);
        round_trip(&n, &n[1..]);
        round_trip(&n[..17], &n);
        // A copy longer than MAX_COPY splits: a few ops of 16 MiB.
        let big = vec![7u8; 2 * MAX_COPY as usize + 5];
        assert!(round_trip(&big, &big).len() < 32);
        let n = noise(100_000, 3);
        assert!(round_trip(&n, &n).len() < 16);
    }

    #[test]
    fn max_len_stops_the_encoder() {
        let a = noise(10_000, 4);
        let b = noise(10_000, 5);
        assert!(encode(&a, &b, 5_000).is_none());
        assert!(encode(&a, &b, 20_000).is_some());
    }

    #[test]
    fn hostile_deltas_are_errors() {
        let src = b"0123456789";
        // Copy past the source end.
        assert!(apply(src, &[10, 5, 0x80 | 0x01 | 0x10, 8, 5], NO_LIMIT)
            .unwrap_err()
            .contains("past"));
        // Copy whose offset + size overflows.
        let wrap = [10, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff];
        assert!(apply(src, &wrap, NO_LIMIT).is_err());
        // Insert past the delta's end.
        assert!(apply(src, &[10, 5, 5, b'a'], NO_LIMIT).is_err());
        // Reserved op.
        assert!(apply(src, &[10, 1, 0], NO_LIMIT).is_err());
        // Declared target bigger than produced, smaller than produced, over the limit.
        assert!(apply(src, &[10, 5, 1, b'a'], NO_LIMIT).is_err());
        assert!(apply(src, &[10, 1, 2, b'a', b'b'], NO_LIMIT).is_err());
        let mut huge = vec![10];
        put_varint(&mut huge, 1 << 40);
        huge.extend_from_slice(&[1, b'a']);
        assert!(check(&huge, 1 << 30).unwrap_err().contains("limit"));
        assert!(apply(src, &huge, NO_LIMIT).is_err());
        // Source size mismatch; truncated header.
        assert!(apply(src, &[9, 1, 1, b'a'], NO_LIMIT).is_err());
        assert!(apply(src, &[0x8a], NO_LIMIT).is_err());
        assert!(apply(src, &[], NO_LIMIT).is_err());
    }

    #[test]
    fn zero_size_copy_means_64k() {
        let src = noise(0x10000, 6);
        // Header: 65536 (varint 80 80 04) twice; copy op 0x80: offset 0, size 0 → 0x10000.
        let d = [0x80, 0x80, 0x04, 0x80, 0x80, 0x04, 0x80];
        assert_eq!(apply(&src, &d, NO_LIMIT).unwrap(), src);
    }

    /// Source data with repeats (so hash collisions and repeated blocks happen) or noise.
    fn data() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..3000),
            proptest::collection::vec(proptest::sample::select(vec![0u8, 1, 0xff]), 0..3000),
            (any::<u64>(), 0usize..200_000).prop_map(|(s, n)| noise(n, s)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn encode_decode_round_trip(
            src in data(),
            edits in proptest::collection::vec(
                (any::<usize>(), 0usize..500, proptest::collection::vec(any::<u8>(), 0..64)),
                0..8,
            ),
        ) {
            let mut dst = src.clone();
            for (at, del, ins) in &edits {
                let at = if dst.is_empty() { 0 } else { at % dst.len() };
                let end = (at + del).min(dst.len());
                dst.splice(at..end, ins.iter().copied());
            }
            let d = encode(&src, &dst, usize::MAX).unwrap();
            prop_assert_eq!(check(&d, NO_LIMIT).unwrap(), DeltaSizes {
                source: src.len() as u64,
                target: dst.len() as u64,
            });
            prop_assert_eq!(apply(&src, &d, NO_LIMIT).unwrap(), dst.clone());
            // Few edits of a large source: the delta stays near the edited bytes' size.
            if src.len() > 50_000 {
                let edited: usize = edits.iter().map(|e| e.2.len() + 64).sum();
                prop_assert!(d.len() < edited * 2 + src.len() / 1000 + 64, "{} bytes", d.len());
            }
        }
    }
}
