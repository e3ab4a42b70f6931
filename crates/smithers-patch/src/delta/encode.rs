//! The delta encoder: a [`Source`] (read at offsets: a file where it lies, or bytes in memory)
//! and a target read once, front to back, become git delta ops, with neither held.
//!
//! - **Index.** The source's first 4 GiB (what a copy op's four offset bytes reach) are
//!   indexed in aligned blocks, one 8-byte slot per block hash (a few probes; 32 bits of the
//!   hash kept to check a hit before the source is read). Blocks are 16 bytes up to a 32 MiB
//!   source and grow with it past that, so the index never passes 2 Mi blocks and 32 MiB of
//!   slots: a common run of two blocks' length contains an aligned block and is found.
//! - **Diagonal first.** Before the index, the source at the shift of the last copy is tried:
//!   a byte edited in place (a database page rewritten) or a short insertion is resynchronised
//!   after 16 equal bytes, whatever the block size.
//! - **Extension.** A match is extended backwards over the target bytes not yet emitted, then
//!   forwards a chunk at a time for as long as both sides agree; copy ops are emitted as the
//!   extension goes (16 MiB at most an op), so a copy of a gigabyte holds one chunk.
//!
//! Cost is linear: every target byte is read once, compared at most a bounded number of times
//! and hashed at most [`HASH_WORK_PER_BYTE`] times on average (a target crafted to make every
//! copy short, each costing a block's re-hash, only loses the index for its rest). Memory:
//! the index, one chunk of each side, the unmatched target bytes (flushed as inserts every
//! ~8 KiB) and the op buffer.

use std::io::{self, Read, Write};

use super::format::{put_varint, MAX_COPY, MAX_INSERT, MAX_SOURCE};
use super::source::Source;

/// Smallest indexed block (git's `RABIN_WINDOW`).
const MIN_BLOCK: u64 = 16;
/// Most blocks indexed: past `MIN_BLOCK * MAX_BLOCKS` (32 MiB) bytes, blocks grow instead.
const MAX_BLOCKS: u64 = 1 << 21;
/// Slots probed for a hash (neighbours: one cache line).
const PROBES: u64 = 4;
/// Equal bytes that make the last copy's diagonal a match.
const DIAG_MIN: u64 = 16;
/// Bytes read from either side at a time.
const CHUNK: usize = 64 << 10;
/// Unmatched target bytes are emitted as inserts once this many have gathered.
const FLUSH: u64 = MAX_INSERT as u64 * 64;
/// Multiplier of the rolling polynomial hash (odd, so powers never become 0 mod 2^64).
const HASH_MUL: u64 = 0x100_0000_01b3;
/// Fibonacci hashing constant: spreads the rolling hash over the slot bits.
const SPREAD: u64 = 0x9e37_79b9_7f4a_7c15;
/// Mixes the hash again for the 32 check bits kept in a slot.
const CHECK_MIX: u64 = 0xbf58_476d_1ce4_e5b9;
/// Hash work (bytes hashed, lookups) allowed per target byte, on average, before the index
/// is given up for the rest of the target.
const HASH_WORK_PER_BYTE: u64 = 8;

/// Why [`encode_stream`] stopped.
#[derive(Debug)]
pub(crate) enum EncodeError {
    /// Reading the source or the target failed.
    Io(io::Error),
    /// The target did not hold the bytes it was said to (it changed while read): how many
    /// had been read when that was seen.
    SizeChanged { read: u64 },
    /// The writer refused the ops (the delta passed its caller's cap).
    Output,
}

impl From<io::Error> for EncodeError {
    fn from(e: io::Error) -> Self {
        EncodeError::Io(e)
    }
}

/// The block size for a source of `usable` indexed bytes: a power of two, at least
/// [`MIN_BLOCK`], so that at most [`MAX_BLOCKS`] blocks are indexed.
fn block_for(usable: u64) -> u64 {
    usable
        .div_ceil(MAX_BLOCKS)
        .next_power_of_two()
        .max(MIN_BLOCK)
}

/// The polynomial hash of a window: `Σ b[i]·M^(n−1−i)`, evaluated in eight interleaved lanes
/// over 8-byte loads (one lane's serial multiply chain was the index build's bottleneck).
/// `window.len()` is a multiple of 8.
fn hash_block(window: &[u8]) -> u64 {
    let mut pow = [1u64; 9];
    for i in 1..9 {
        pow[i] = pow[i - 1].wrapping_mul(HASH_MUL);
    }
    let mut acc = [0u64; 8];
    for word in window.chunks_exact(8) {
        let w = u64::from_le_bytes(word.try_into().expect("8 bytes"));
        for (j, a) in acc.iter_mut().enumerate() {
            *a = a.wrapping_mul(pow[8]).wrapping_add((w >> (8 * j)) & 0xff);
        }
    }
    acc.iter()
        .enumerate()
        .fold(0u64, |h, (j, a)| h.wrapping_add(a.wrapping_mul(pow[7 - j])))
}

/// The hash of the window one byte on: `out` leaves, `inn` comes in; `top` is `M^(n−1)`.
fn roll(hash: u64, out: u8, inn: u8, top: u64) -> u64 {
    hash.wrapping_sub(u64::from(out).wrapping_mul(top))
        .wrapping_mul(HASH_MUL)
        .wrapping_add(u64::from(inn))
}

/// The 32 bits kept in a slot to check a hit without reading the source (never 0 in a
/// used slot: the block number + 1 in the low half makes a used slot nonzero).
fn check_bits(hash: u64) -> u64 {
    (hash ^ (hash >> 29)).wrapping_mul(CHECK_MIX) >> 32
}

/// Hashes of a source's aligned blocks: slot = (check bits << 32) | (block number + 1), 0
/// when empty. A collision only costs a missed match (every hit is compared with the source).
pub(crate) struct Index {
    slots: Vec<u64>,
    shift: u32,
    block: u64,
    /// `HASH_MUL^(block−1)`: the weight of the byte leaving a rolled window.
    top: u64,
    /// Source bytes copies may come from: the first 4 GiB (four offset bytes).
    usable: u64,
}

impl Index {
    /// Reads `src` once, front to back, in chunks; `observe` sees every byte (e.g. to hash
    /// the whole source, past the 4 GiB indexed too).
    pub(crate) fn build(src: &dyn Source, observe: &mut dyn FnMut(&[u8])) -> io::Result<Index> {
        let usable = src.size().min(MAX_SOURCE);
        let block = block_for(usable);
        let blocks = usable / block;
        let bits = (blocks * 2).max(16).next_power_of_two().trailing_zeros();
        let mut index = Index {
            slots: vec![0; 1usize << bits],
            shift: 64 - bits,
            block,
            top: (1..block).fold(1u64, |acc, _| acc.wrapping_mul(HASH_MUL)),
            usable,
        };
        // A whole number of blocks per chunk (blocks are powers of two ≤ 2 KiB), so that no
        // block straddles two reads.
        let mut buf = vec![0u8; CHUNK];
        let mut at = 0u64;
        while at < src.size() {
            let n = (CHUNK as u64).min(src.size() - at) as usize;
            src.read_exact_at(&mut buf[..n], at)?;
            observe(&buf[..n]);
            let mut off = 0usize;
            while off as u64 + block <= n as u64 && at + off as u64 + block <= usable {
                let hash = hash_block(&buf[off..off + block as usize]);
                index.insert(hash, (at + off as u64) / block);
                off += block as usize;
            }
            at += n as u64;
        }
        Ok(index)
    }

    fn first_slot(&self, hash: u64) -> u64 {
        hash.wrapping_mul(SPREAD) >> self.shift
    }

    /// Keeps the first block of each hash (an earlier copy source is as good as a later one).
    fn insert(&mut self, hash: u64, block_no: u64) {
        let check = check_bits(hash);
        let mask = self.slots.len() as u64 - 1;
        let first = self.first_slot(hash);
        for i in 0..PROBES {
            let slot = &mut self.slots[((first + i) & mask) as usize];
            if *slot == 0 {
                *slot = (check << 32) | (block_no + 1);
                return;
            }
            if *slot >> 32 == check {
                return;
            }
        }
    }

    /// The source offset of the block this hash was indexed for, if any.
    fn lookup(&self, hash: u64) -> Option<u64> {
        let check = check_bits(hash);
        let mask = self.slots.len() as u64 - 1;
        let first = self.first_slot(hash);
        (0..PROBES)
            .map(|i| self.slots[((first + i) & mask) as usize])
            .take_while(|&s| s != 0)
            .find(|&s| s >> 32 == check)
            .map(|s| ((s & 0xffff_ffff) - 1) * self.block)
    }
}

/// One chunk of the source, read in place when asked for a range it does not hold.
struct Cache<'a> {
    src: &'a dyn Source,
    buf: Vec<u8>,
    start: u64,
    filled: usize,
}

impl Cache<'_> {
    /// `src[at..at + n]` (the range within the source); when not held, `fill` bytes (`n` ≤
    /// `fill` ≤ [`CHUNK`]) are read from `at`.
    fn get(&mut self, at: u64, n: usize, fill: usize) -> io::Result<&[u8]> {
        if at < self.start || at + n as u64 > self.start + self.filled as u64 {
            self.refill(at, fill)?;
        }
        let off = (at - self.start) as usize;
        Ok(&self.buf[off..off + n])
    }

    /// At most `max` bytes of the source from `at` (within the source): what is held from
    /// there, else `fill` bytes read from `at` (then `true`). Never reads again what it
    /// holds, so a scan along the source costs one read of it whatever the lengths asked for.
    fn get_from(&mut self, at: u64, max: usize, fill: usize) -> io::Result<(&[u8], bool)> {
        let end = self.start + self.filled as u64;
        let read = at < self.start || at >= end;
        if read {
            self.refill(at, fill)?;
        }
        let off = (at - self.start) as usize;
        let n = max.min(self.filled - off);
        Ok((&self.buf[off..off + n], read))
    }

    fn refill(&mut self, at: u64, fill: usize) -> io::Result<()> {
        let want = (fill.min(CHUNK) as u64).min(self.src.size() - at) as usize;
        self.src.read_exact_at(&mut self.buf[..want], at)?;
        self.start = at;
        self.filled = want;
        Ok(())
    }
}

/// The target bytes from `keep` on, read front to back; every byte read is shown to
/// `observe` once.
struct Window<'a, R> {
    reader: R,
    buf: Vec<u8>,
    /// Target offset of `buf[0]`.
    start: u64,
    /// Bytes before this offset are no longer needed.
    keep: u64,
    /// The target's declared length.
    len: u64,
    observe: &'a mut dyn FnMut(&[u8]),
}

impl<R: Read> Window<'_, R> {
    /// Makes the window hold the target up to `end` (≤ `len`).
    fn ensure(&mut self, end: u64) -> Result<(), EncodeError> {
        while self.start + (self.buf.len() as u64) < end {
            let done = (self.keep - self.start) as usize;
            if done >= CHUNK && done * 2 >= self.buf.len() {
                self.buf.drain(..done);
                self.start = self.keep;
            }
            let have = self.start + self.buf.len() as u64;
            let want = (CHUNK as u64).min(self.len - have) as usize;
            let old = self.buf.len();
            self.buf.resize(old + want, 0);
            let got = read_full(&mut self.reader, &mut self.buf[old..])?;
            self.buf.truncate(old + got);
            (self.observe)(&self.buf[old..]);
            if got < want {
                return Err(EncodeError::SizeChanged {
                    read: have + got as u64,
                });
            }
        }
        Ok(())
    }

    fn slice(&self, from: u64, to: u64) -> &[u8] {
        &self.buf[(from - self.start) as usize..(to - self.start) as usize]
    }

    fn byte(&self, at: u64) -> u8 {
        self.buf[(at - self.start) as usize]
    }

    /// After the last byte: a target that holds more than its declared length changed.
    fn finish(&mut self) -> Result<(), EncodeError> {
        let mut one = [0u8; 1];
        match read_full(&mut self.reader, &mut one)? {
            0 => Ok(()),
            _ => Err(EncodeError::SizeChanged { read: self.len + 1 }),
        }
    }
}

/// Reads until `buf` is full or the reader ends; the bytes read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Ops gathered and handed to the writer a chunk at a time.
struct OpWriter<W> {
    w: W,
    buf: Vec<u8>,
    written: u64,
}

impl<W: Write> OpWriter<W> {
    fn insert(&mut self, bytes: &[u8]) {
        debug_assert!(!bytes.is_empty() && bytes.len() <= MAX_INSERT);
        self.buf.push(bytes.len() as u8);
        self.buf.extend_from_slice(bytes);
    }

    /// One copy op; `offset` < 2^32 and `0 < len ≤ MAX_COPY` (callers split).
    fn copy(&mut self, offset: u64, len: u64) {
        let at = self.buf.len();
        self.buf.push(0);
        let mut cmd = 0x80u8;
        for (i, byte) in (offset as u32).to_le_bytes().into_iter().enumerate() {
            if byte != 0 {
                cmd |= 1 << i;
                self.buf.push(byte);
            }
        }
        // len ≤ 0xff_ffff: three size bytes. It is never a multiple of 2^24, so never encoded
        // as "no size bytes" (which means 0x10000).
        for (i, byte) in (len as u32).to_le_bytes().into_iter().take(3).enumerate() {
            if byte != 0 {
                cmd |= 0x10 << i;
                self.buf.push(byte);
            }
        }
        self.buf[at] = cmd;
    }

    fn flush_if_full(&mut self) -> Result<(), EncodeError> {
        if self.buf.len() >= CHUNK {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), EncodeError> {
        self.w
            .write_all(&self.buf)
            .map_err(|_| EncodeError::Output)?;
        self.written += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }
}

/// Length of the common prefix of `a` and `b` (memcmp a chunk at a time first).
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    const STEP: usize = 256;
    let max = a.len().min(b.len());
    let mut n = 0;
    while n + STEP <= max && a[n..n + STEP] == b[n..n + STEP] {
        n += STEP;
    }
    while n < max && a[n] == b[n] {
        n += 1;
    }
    n
}

/// Length of the common suffix of `a` and `b` (memcmp a chunk at a time first).
fn common_suffix(a: &[u8], b: &[u8]) -> usize {
    const STEP: usize = 256;
    let max = a.len().min(b.len());
    let (a, b) = (&a[a.len() - max..], &b[b.len() - max..]);
    let mut n = 0;
    while n + STEP <= max && a[max - n - STEP..max - n] == b[max - n - STEP..max - n] {
        n += STEP;
    }
    while n < max && a[max - n - 1] == b[max - n - 1] {
        n += 1;
    }
    n
}

struct Encoder<'a, R, W> {
    src: Cache<'a>,
    index: &'a Index,
    tgt: Window<'a, R>,
    out: OpWriter<W>,
    /// The target's length.
    len: u64,
    /// Target bytes before this offset are emitted (as inserts or copies).
    pending: u64,
    /// Source offset − target offset of the last copy: the diagonal tried first.
    diag: Option<i64>,
}

impl<R: Read, W: Write> Encoder<'_, R, W> {
    fn run(&mut self) -> Result<(), EncodeError> {
        let block = self.index.block;
        let mut budget = HASH_WORK_PER_BYTE
            .saturating_mul(self.len)
            .saturating_add(1 << 20);
        // The hash of target[p..p + block], while it is being rolled.
        let mut hash: Option<u64> = None;
        let mut p = 0u64;
        while p < self.len {
            if let Some(s) = self.on_diagonal(p)? {
                p = self.take(s, p)?;
                hash = None;
                continue;
            }
            if p + block <= self.len && budget > 0 {
                let h = match hash {
                    Some(h) => h,
                    None => {
                        budget = budget.saturating_sub(block);
                        self.tgt.ensure(p + block)?;
                        hash_block(self.tgt.slice(p, p + block))
                    }
                };
                budget = budget.saturating_sub(1);
                if let Some(s) = self.indexed(h, p)? {
                    p = self.take(s, p)?;
                    hash = None;
                    continue;
                }
                hash = if p + block < self.len {
                    self.tgt.ensure(p + block + 1)?;
                    let (out, inn) = (self.tgt.byte(p), self.tgt.byte(p + block));
                    Some(roll(h, out, inn, self.index.top))
                } else {
                    None
                };
            } else {
                hash = None;
            }
            p += 1;
            if p - self.pending >= FLUSH {
                self.inserts_to(p)?;
            }
        }
        self.inserts_to(self.len)
    }

    /// The source offset on the last copy's diagonal, when `DIAG_MIN` bytes agree there.
    fn on_diagonal(&mut self, p: u64) -> Result<Option<u64>, EncodeError> {
        let Some(d) = self.diag else { return Ok(None) };
        let Ok(s) = u64::try_from(p as i64 + d) else {
            return Ok(None);
        };
        if s + DIAG_MIN > self.index.usable || p + DIAG_MIN > self.len {
            return Ok(None);
        }
        self.tgt.ensure(p + DIAG_MIN)?;
        // The diagonal is scanned front to back: a whole chunk is read ahead.
        let a = self.src.get(s, DIAG_MIN as usize, CHUNK)?;
        Ok((a == self.tgt.slice(p, p + DIAG_MIN)).then_some(s))
    }

    /// The source offset of an indexed block equal to `target[p..p + block]`.
    fn indexed(&mut self, hash: u64, p: u64) -> Result<Option<u64>, EncodeError> {
        let Some(s) = self.index.lookup(hash) else {
            return Ok(None);
        };
        let block = self.index.block as usize;
        // A hit anywhere in the source: only its block is read to check it.
        let a = self.src.get(s, block, block)?;
        Ok((a == self.tgt.slice(p, p + block as u64)).then_some(s))
    }

    /// Emits the match of source `s` and target `t`, extended both ways; the target offset
    /// after it.
    fn take(&mut self, s: u64, t: u64) -> Result<u64, EncodeError> {
        let max_back = (t - self.pending).min(s);
        let back = if max_back > 0 {
            let a = self
                .src
                .get(s - max_back, max_back as usize, max_back as usize)?;
            common_suffix(a, self.tgt.slice(t - max_back, t)) as u64
        } else {
            0
        };
        let mut copy_from = s - back;
        self.inserts_to(t - back)?;
        // The copy not emitted yet: `run` bytes from `copy_from`.
        let mut run = back;
        let (mut bs, mut tt) = (s, t);
        // Reads of the source start small and double while the match goes on: a short copy
        // (one in many, crafted or not) costs a few blocks of reading, a long one whole chunks.
        let mut fill = (self.index.block as usize * 4).max(256);
        loop {
            let max = (CHUNK as u64)
                .min(self.index.usable - bs)
                .min(self.len - tt);
            if max == 0 {
                break;
            }
            let (a, read) = self.src.get_from(bs, max as usize, fill)?;
            let n = a.len() as u64;
            self.tgt.ensure(tt + n)?;
            let same = common_prefix(a, self.tgt.slice(tt, tt + n)) as u64;
            if read {
                fill = (fill * 2).min(CHUNK);
            }
            bs += same;
            tt += same;
            run += same;
            self.pending = tt;
            self.tgt.keep = tt;
            while run >= MAX_COPY {
                self.out.copy(copy_from, MAX_COPY);
                copy_from += MAX_COPY;
                run -= MAX_COPY;
            }
            self.out.flush_if_full()?;
            if same < n {
                break;
            }
        }
        if run > 0 {
            self.out.copy(copy_from, run);
        }
        self.out.flush_if_full()?;
        self.diag = Some(bs as i64 - tt as i64);
        Ok(tt)
    }

    /// Emits the target bytes from `pending` to `to` as inserts.
    fn inserts_to(&mut self, to: u64) -> Result<(), EncodeError> {
        self.tgt.ensure(to)?;
        while self.pending < to {
            let n = (MAX_INSERT as u64).min(to - self.pending);
            self.out
                .insert(self.tgt.slice(self.pending, self.pending + n));
            self.pending += n;
        }
        self.tgt.keep = self.pending;
        self.out.flush_if_full()
    }
}

/// Writes the delta turning `src` (indexed by `index`, built over this same source) into the
/// `target_len` bytes `target` reads to `out`; the delta's length. Every target byte read is
/// shown to `observe` (e.g. to hash it). A target that does not hold exactly `target_len`
/// bytes is [`EncodeError::SizeChanged`]; a writer that refuses is [`EncodeError::Output`].
pub(crate) fn encode_stream<R: Read, W: Write>(
    src: &dyn Source,
    index: &Index,
    target: R,
    target_len: u64,
    observe: &mut dyn FnMut(&[u8]),
    out: W,
) -> Result<u64, EncodeError> {
    let mut header = Vec::new();
    put_varint(&mut header, src.size());
    put_varint(&mut header, target_len);
    let mut e = Encoder {
        src: Cache {
            src,
            buf: vec![0; CHUNK],
            start: 0,
            filled: 0,
        },
        index,
        tgt: Window {
            reader: target,
            buf: Vec::new(),
            start: 0,
            keep: 0,
            len: target_len,
            observe,
        },
        out: OpWriter {
            w: out,
            buf: header,
            written: 0,
        },
        len: target_len,
        pending: 0,
        diag: None,
    };
    e.run()?;
    e.tgt.finish()?;
    e.out.flush()?;
    Ok(e.out.written)
}

/// A writer into a `Vec` that refuses to pass `max` bytes.
struct Capped {
    v: Vec<u8>,
    max: usize,
}

impl Write for Capped {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.v.len() + buf.len() > self.max {
            return Err(io::Error::other("over the cap"));
        }
        self.v.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A delta that turns `src` into `dst`, or `None` once it would exceed `max_len` bytes (the
/// caller then uses a literal). Linear in `src.len() + dst.len()`.
pub(crate) fn encode(src: &[u8], dst: &[u8], max_len: usize) -> Option<Vec<u8>> {
    let index = Index::build(&src, &mut |_| {}).ok()?;
    let mut out = Capped {
        v: Vec::new(),
        max: max_len,
    };
    encode_stream(&src, &index, dst, dst.len() as u64, &mut |_| {}, &mut out).ok()?;
    Some(out.v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lane_hash_is_the_rolling_polynomial() {
        let data: Vec<u8> = (0..300u32).map(|i| (i * 7919 % 251) as u8).collect();
        for n in [8, 16, 64, 2048.min(data.len() / 8 * 8)] {
            let serial = data[..n].iter().fold(0u64, |h, &b| {
                h.wrapping_mul(HASH_MUL).wrapping_add(u64::from(b))
            });
            assert_eq!(hash_block(&data[..n]), serial, "{n}");
        }
        let block = 64usize;
        let top = (1..block).fold(1u64, |acc, _| acc.wrapping_mul(HASH_MUL));
        let serial = |w: &[u8]| {
            w.iter().fold(0u64, |h, &b| {
                h.wrapping_mul(HASH_MUL).wrapping_add(u64::from(b))
            })
        };
        let mut h = hash_block(&data[..block]);
        assert_eq!(h, serial(&data[..block]));
        for p in 0..data.len() - block {
            h = roll(h, data[p], data[p + block], top);
            assert_eq!(h, hash_block(&data[p + 1..p + 1 + block]), "at {p}");
        }
    }

    #[test]
    fn blocks_grow_so_the_index_stays_bounded() {
        assert_eq!(block_for(0), MIN_BLOCK);
        assert_eq!(block_for(32 << 20), MIN_BLOCK);
        assert_eq!(block_for((32 << 20) + 1), 32);
        assert_eq!(block_for(120_000_000), 64);
        assert_eq!(block_for(1 << 30), 512);
        assert_eq!(block_for(MAX_SOURCE), 2048);
        for size in [0u64, 1 << 20, 120_000_000, 1 << 30, MAX_SOURCE] {
            assert!(size / block_for(size) <= MAX_BLOCKS);
        }
    }

    #[test]
    fn suffix_and_prefix() {
        let a: Vec<u8> = (0..1000u32).map(|i| (i % 253) as u8).collect();
        let mut b = a.clone();
        assert_eq!(common_prefix(&a, &b), 1000);
        assert_eq!(common_suffix(&a, &b), 1000);
        b[10] ^= 1;
        assert_eq!(common_prefix(&a, &b), 10);
        assert_eq!(common_suffix(&a, &b), 989);
        assert_eq!(common_suffix(&a[..500], &b[200..700]), 0);
        assert_eq!(common_suffix(&a[..500], &b[..500]), 489);
    }
}
