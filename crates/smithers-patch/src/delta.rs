//! Git's pack delta format, as `delta` hunks of binary patches carry it (git's
//! `diff-delta.c` / `patch-delta.c`): two varints (source size, target size; 7 bits a byte, least
//! significant first, high bit = more), then ops. A copy op is `0x80 | flags` followed by the
//! offset bytes flagged by bits 0x01..0x08 and the size bytes flagged by 0x10..0x40 (little
//! endian, absent bytes are zero, a size of 0 means 0x10000); an insert op is a byte `1..=127`
//! followed by that many literal bytes. Op byte 0 is reserved and refused.
//!
//! The encoder indexes the source in aligned 16-byte blocks (one table slot per block hash) and
//! rolls a hash over the target: any common run of 31 bytes or more contains an aligned source
//! block, is found, and is then extended both ways. Every target byte is hashed at most once and
//! every extension consumes the bytes it covers, so the cost is linear in the two sizes.
//!
//! Decoding never trusts the header: every op is checked (a copy stays within the source, an
//! insert within the delta) and the sizes they really produce are summed before anything is
//! allocated, so a hostile header can neither make us allocate by its word nor read out of bounds.

/// Bytes per indexed source block (git's `RABIN_WINDOW`).
const BLOCK: usize = 16;
/// Largest copy op we emit (git's encoder emits at most this much per copy, and every decoder
/// since pack version 2 accepts it).
const MAX_COPY: usize = 0x10000;
/// Largest insert op (the op byte is the length, 1..=127).
const MAX_INSERT: usize = 0x7f;
/// Copy offsets have four bytes: only the first 4 GiB of a source can be copied from.
const MAX_SOURCE: usize = u32::MAX as usize;
/// Multiplier of the rolling polynomial hash (odd, so powers never become 0 mod 2^64).
const HASH_MUL: u64 = 0x100_0000_01b3;
/// Fibonacci hashing constant: spreads the rolling hash over the table's bits.
const SPREAD: u64 = 0x9e37_79b9_7f4a_7c15;

/// Sizes a delta declares, after its ops were checked to produce exactly the target size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeltaSizes {
    pub source: u64,
    pub target: u64,
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads one header varint at `*pos`; refuses one longer than a u64.
fn get_varint(data: &[u8], pos: &mut usize) -> Result<u64, String> {
    let mut v: u64 = 0;
    let mut shift = 0u32;
    loop {
        let b = *data
            .get(*pos)
            .ok_or("delta header is truncated (size varint runs past the end)")?;
        *pos += 1;
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

/// Rolling polynomial hash of a window of [`BLOCK`] bytes.
struct Roller {
    hash: u64,
    /// `HASH_MUL^(BLOCK-1)`: the weight of the byte leaving the window.
    top: u64,
}

impl Roller {
    fn new(window: &[u8]) -> Self {
        let top = (1..BLOCK).fold(1u64, |acc, _| acc.wrapping_mul(HASH_MUL));
        Roller {
            hash: hash_block(window),
            top,
        }
    }

    fn roll(&mut self, out: u8, inn: u8) {
        self.hash = self
            .hash
            .wrapping_sub(u64::from(out).wrapping_mul(self.top))
            .wrapping_mul(HASH_MUL)
            .wrapping_add(u64::from(inn));
    }
}

fn hash_block(window: &[u8]) -> u64 {
    window.iter().fold(0u64, |h, &b| {
        h.wrapping_mul(HASH_MUL).wrapping_add(u64::from(b))
    })
}

/// One slot per hash bucket holding (block number + 1) of the first source block with that
/// bucket; 0 = empty. A lost collision only costs a missed match (matches are verified).
struct Index {
    slots: Vec<u32>,
    shift: u32,
}

impl Index {
    fn new(src: &[u8]) -> Self {
        let blocks = src.len() / BLOCK;
        let bits = blocks.max(1).next_power_of_two().trailing_zeros().max(1);
        let mut index = Index {
            slots: vec![0; 1usize << bits],
            shift: 64 - bits,
        };
        for b in 0..blocks {
            let slot = index.slot(hash_block(&src[b * BLOCK..(b + 1) * BLOCK]));
            if index.slots[slot] == 0 {
                // `blocks` ≤ MAX_SOURCE / 16, so the block number + 1 fits in a u32.
                index.slots[slot] = b as u32 + 1;
            }
        }
        index
    }

    fn slot(&self, hash: u64) -> usize {
        (hash.wrapping_mul(SPREAD) >> self.shift) as usize
    }

    /// The source offset of a block equal to `window`, if the index holds one.
    fn find(&self, src: &[u8], hash: u64, window: &[u8]) -> Option<usize> {
        let b = self.slots[self.slot(hash)];
        let off = (b as usize).checked_sub(1)? * BLOCK;
        (src[off..off + BLOCK] == *window).then_some(off)
    }
}

/// Length of the common prefix of `a` and `b`, compared a chunk at a time (memcmp) first.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    const CHUNK: usize = 256;
    let max = a.len().min(b.len());
    let mut n = 0;
    while n + CHUNK <= max && a[n..n + CHUNK] == b[n..n + CHUNK] {
        n += CHUNK;
    }
    while n < max && a[n] == b[n] {
        n += 1;
    }
    n
}

fn emit_inserts(out: &mut Vec<u8>, bytes: &[u8]) {
    for chunk in bytes.chunks(MAX_INSERT) {
        out.push(chunk.len() as u8);
        out.extend_from_slice(chunk);
    }
}

/// Copy ops for `len` bytes at `offset` (offset + len ≤ 2^32, checked by the caller's source
/// cap), split at [`MAX_COPY`].
fn emit_copies(out: &mut Vec<u8>, mut offset: usize, mut len: usize) {
    while len > 0 {
        let n = len.min(MAX_COPY);
        let at = out.len();
        out.push(0x80);
        let mut cmd = 0x80u8;
        for (i, byte) in (offset as u32).to_le_bytes().into_iter().enumerate() {
            if byte != 0 {
                cmd |= 1 << i;
                out.push(byte);
            }
        }
        // n ≤ 0x10000 needs three size bytes at most.
        for (i, byte) in (n as u32).to_le_bytes().into_iter().take(3).enumerate() {
            if byte != 0 {
                cmd |= 0x10 << i;
                out.push(byte);
            }
        }
        out[at] = cmd;
        offset += n;
        len -= n;
    }
}

/// A delta that turns `src` into `dst`, or `None` once it would exceed `max_len` bytes (the
/// caller then uses a literal). Linear in `src.len() + dst.len()`.
pub(crate) fn encode(src: &[u8], dst: &[u8], max_len: usize) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    put_varint(&mut out, src.len() as u64);
    put_varint(&mut out, dst.len() as u64);
    let src = &src[..src.len().min(MAX_SOURCE)];
    let index = Index::new(src);
    // dst[pending..p] is not emitted yet; dst[p..p + BLOCK] is the window being hashed.
    let mut pending = 0;
    let mut p = 0;
    let mut roller = (dst.len() >= BLOCK).then(|| Roller::new(&dst[..BLOCK]));
    while let Some(r) = roller.as_mut() {
        if let Some(s) = index.find(src, r.hash, &dst[p..p + BLOCK]) {
            let back = common_suffix_len(&src[..s], &dst[pending..p]);
            let fwd = common_prefix(&src[s + BLOCK..], &dst[p + BLOCK..]);
            let (copy_src, copy_dst) = (s - back, p - back);
            let len = back + BLOCK + fwd;
            emit_inserts(&mut out, &dst[pending..copy_dst]);
            emit_copies(&mut out, copy_src, len);
            p = copy_dst + len;
            pending = p;
            if out.len() > max_len {
                return None;
            }
            roller = (p + BLOCK <= dst.len()).then(|| Roller::new(&dst[p..p + BLOCK]));
        } else if p + BLOCK < dst.len() {
            r.roll(dst[p], dst[p + BLOCK]);
            p += 1;
        } else {
            roller = None;
        }
        // Flush long unmatched runs, so `max_len` also stops a delta of pure inserts early.
        if p - pending >= MAX_INSERT * 64 {
            emit_inserts(&mut out, &dst[pending..p]);
            pending = p;
            if out.len() > max_len {
                return None;
            }
        }
    }
    emit_inserts(&mut out, &dst[pending..]);
    (out.len() <= max_len).then_some(out)
}

/// How many trailing bytes `a` and `b` share.
fn common_suffix_len(a: &[u8], b: &[u8]) -> usize {
    a.iter()
        .rev()
        .zip(b.iter().rev())
        .take_while(|(x, y)| x == y)
        .count()
}

/// One decoded op.
enum Op<'a> {
    Copy { offset: u64, len: u64 },
    Insert(&'a [u8]),
}

/// The ops after the header, each checked against the delta's length and the declared source.
struct Ops<'a> {
    data: &'a [u8],
    pos: usize,
    source: u64,
}

impl<'a> Ops<'a> {
    fn next_op(&mut self) -> Option<Result<Op<'a>, String>> {
        let &cmd = self.data.get(self.pos)?;
        self.pos += 1;
        Some(self.op(cmd))
    }

    fn op(&mut self, cmd: u8) -> Result<Op<'a>, String> {
        if cmd == 0 {
            return Err("delta op 0 is reserved".into());
        }
        if cmd & 0x80 == 0 {
            let n = usize::from(cmd);
            let bytes = self
                .data
                .get(self.pos..self.pos + n)
                .ok_or("delta insert op runs past the end of the delta")?;
            self.pos += n;
            return Ok(Op::Insert(bytes));
        }
        let offset = self.flagged(cmd, 0, 4)?;
        let len = match self.flagged(cmd, 4, 3)? {
            0 => MAX_COPY as u64,
            n => n,
        };
        if offset.checked_add(len).is_none_or(|end| end > self.source) {
            return Err(format!(
                "delta copy op ({len} bytes at {offset}) reaches past the {}-byte source",
                self.source
            ));
        }
        Ok(Op::Copy { offset, len })
    }

    /// The little-endian value of the bytes flagged by bits `first..first + count` of `cmd`.
    fn flagged(&mut self, cmd: u8, first: u32, count: u32) -> Result<u64, String> {
        let mut v = 0u64;
        for i in 0..count {
            if cmd & (1 << (first + i)) != 0 {
                let b = *self
                    .data
                    .get(self.pos)
                    .ok_or("delta copy op runs past the end of the delta")?;
                self.pos += 1;
                v |= u64::from(b) << (8 * i);
            }
        }
        Ok(v)
    }
}

/// Parses the header and walks every op: the declared target must be at most `limit` and
/// exactly what the ops produce. Allocates nothing.
pub(crate) fn check(delta: &[u8], limit: u64) -> Result<DeltaSizes, String> {
    let (sizes, mut ops) = header(delta)?;
    if sizes.target > limit {
        return Err(format!(
            "delta declares a {}-byte result, over the {limit}-byte limit",
            sizes.target
        ));
    }
    let mut produced: u64 = 0;
    while let Some(op) = ops.next_op() {
        produced += match op? {
            Op::Copy { len, .. } => len,
            Op::Insert(b) => b.len() as u64,
        };
        if produced > sizes.target {
            return Err(format!(
                "delta produces more than the {} bytes its header declares",
                sizes.target
            ));
        }
    }
    if produced != sizes.target {
        return Err(format!(
            "delta produces {produced} bytes, its header declares {}",
            sizes.target
        ));
    }
    Ok(sizes)
}

fn header(delta: &[u8]) -> Result<(DeltaSizes, Ops<'_>), String> {
    let mut pos = 0;
    let source = get_varint(delta, &mut pos)?;
    let target = get_varint(delta, &mut pos)?;
    let ops = Ops {
        data: delta,
        pos,
        source,
    };
    Ok((DeltaSizes { source, target }, ops))
}

/// Applies `delta` to `src`. Every op is checked (by [`check`]) before the result is
/// allocated, at the size the ops really produce.
pub(crate) fn apply(src: &[u8], delta: &[u8], limit: u64) -> Result<Vec<u8>, String> {
    let sizes = check(delta, limit)?;
    if sizes.source != src.len() as u64 {
        return Err(format!(
            "delta is against a {}-byte source, the base has {} bytes",
            sizes.source,
            src.len()
        ));
    }
    let target = usize::try_from(sizes.target).map_err(|_| "delta result too large")?;
    let mut out = Vec::with_capacity(target);
    let (_, mut ops) = header(delta)?;
    while let Some(op) = ops.next_op() {
        match op? {
            // `check` bounded offset + len by the source size, which equals src.len().
            Op::Copy { offset, len } => {
                out.extend_from_slice(&src[offset as usize..(offset + len) as usize]);
            }
            Op::Insert(b) => out.extend_from_slice(b),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
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
            let mut pos = 0;
            assert_eq!(get_varint(&b, &mut pos).unwrap(), v);
            assert_eq!(pos, b.len());
        }
        let mut pos = 0;
        assert!(get_varint(&[0xff; 11], &mut pos).is_err());
        let mut pos = 0;
        assert!(get_varint(&[0x80, 0x80], &mut pos).is_err());
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
        // A copy longer than MAX_COPY splits.
        let big = noise(3 * MAX_COPY + 5, 3);
        round_trip(&big, &big);
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
        let src = noise(MAX_COPY, 6);
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
