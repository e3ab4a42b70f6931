//! Git's binary patches (`git diff --binary`): after `GIT binary patch`, a forward hunk (old →
//! new) and a reverse hunk (new → old; always written, optional on input). Each is
//! `literal <size>` (the whole content of its result) or `delta <size>` (a pack delta against
//! the other side, see [`crate::delta`]), `<size>` being the inflated size, followed by the
//! zlib-deflated bytes in base85 lines and a blank line. Like git, each direction is a delta
//! when that is smaller once deflated, else a literal.
//!
//! Nothing in a hunk is trusted: a declared size is capped by [`MAX_BINARY_BYTES`] and by what
//! the deflated data can really inflate to before anything is allocated by it.
//!
//! A file over [`crate::STREAM_THRESHOLD_BYTES`] is never held: its hunks are made while it
//! is read ([`encode_streamed`], [`best_streamed`]: a delta against the other side read in
//! place, when that is smaller) and kept deflated ([`EncodedHunk`]); a parsed hunk that
//! inflates past the threshold is checked as it inflates and kept deflated too, and
//! [`BinaryHunk::produce`] writes any hunk's result as it is made.

use std::io::{BufRead, Read, Write};
use std::sync::Arc;

use flate2::read::ZlibDecoder;
use flate2::write::ZlibEncoder;
use flate2::Compression;
use serde::{Deserialize, Serialize};

use crate::delta::{self, DeltaSizes, Source};
use crate::model::git_blob_oid;

/// Largest content a binary hunk may declare or produce (either side of a binary patch): 4 GiB,
/// what a delta's copy ops can address. Content this large is never held: a hunk past
/// [`crate::STREAM_THRESHOLD_BYTES`] stays deflated and its result is written as it is made.
pub const MAX_BINARY_BYTES: u64 = 1 << 32;

/// zlib (deflate) cannot expand data by more than about 1032:1 on inflation: the real ceiling
/// of what `n` deflated bytes can produce, used to cap an allocation by what the hunk holds.
const MAX_INFLATE_RATIO: usize = 1032;

/// One hunk of a git binary patch, inflated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum BinaryHunk {
    /// `literal`: the whole resulting content.
    Literal(Vec<u8>),
    /// `delta`: a git pack delta to apply to the other side's content. A parsed one has had its
    /// ops checked against its own header (see [`crate::delta::check`]).
    Delta(Vec<u8>),
    /// A hunk of a file too large to hold ([`crate::STREAM_THRESHOLD_BYTES`]), or one that
    /// inflates past it: kept as its deflated base85 lines.
    Encoded(EncodedHunk),
}

/// A `literal` or `delta` hunk kept deflated: made from a file read once and never held whole,
/// or parsed and checked as it inflated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EncodedHunk {
    /// The inflated size its header names: a literal's content, or a delta's own length.
    pub size: u64,
    /// For a `delta` hunk, the sizes its header declares (its ops were checked to produce
    /// exactly that result); `None` for a `literal`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<DeltaSizes>,
    /// The git blob id of the hunk's result, computed from the same read (of the file, or of a
    /// parsed literal's inflated stream) that made `lines`; empty for a parsed delta, whose
    /// result depends on its base (apply checks it against the index line).
    pub oid: Arc<str>,
    /// The base85 lines, the blank line that ends the hunk included.
    pub lines: Arc<str>,
}

impl EncodedHunk {
    /// The inflated bytes of the hunk (a literal's content or a delta's ops), read as they
    /// inflate.
    fn inflated(&self) -> impl BufRead + '_ {
        let lines = self.lines.lines().filter(|l| !l.is_empty());
        std::io::BufReader::new(ZlibDecoder::new(LinesReader::new(lines)))
    }
}

/// The deflated bytes of a hunk's base85 lines, decoded a line at a time.
struct LinesReader<'a, I: Iterator<Item = &'a str>> {
    lines: I,
    cur: Vec<u8>,
    pos: usize,
}

impl<'a, I: Iterator<Item = &'a str>> LinesReader<'a, I> {
    fn new(lines: I) -> Self {
        LinesReader {
            lines,
            cur: Vec::new(),
            pos: 0,
        }
    }
}

impl<'a, I: Iterator<Item = &'a str>> Read for LinesReader<'a, I> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.pos == self.cur.len() {
            let Some(line) = self.lines.next() else {
                return Ok(0);
            };
            self.cur = decode_line(line).map_err(std::io::Error::other)?;
            self.pos = 0;
        }
        let n = buf.len().min(self.cur.len() - self.pos);
        buf[..n].copy_from_slice(&self.cur[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

impl BinaryHunk {
    /// The smaller hunk (once deflated, as git compares) that turns `base` into `target`. Like
    /// git, no delta against or to an empty side.
    pub(crate) fn best(base: &[u8], target: &[u8]) -> BinaryHunk {
        if base.is_empty() || target.is_empty() {
            return BinaryHunk::Literal(target.to_vec());
        }
        // A delta is useless once it is as long as the literal itself.
        let Some(d) = delta::encode(base, target, target.len()) else {
            return BinaryHunk::Literal(target.to_vec());
        };
        let delta_z = deflate(&d).len();
        // The literal deflates to at least target / MAX_INFLATE_RATIO bytes: below that the
        // delta wins without deflating the (possibly large) literal.
        if delta_z.saturating_mul(MAX_INFLATE_RATIO + 100) < target.len()
            || delta_z < deflate(target).len()
        {
            BinaryHunk::Delta(d)
        } else {
            BinaryHunk::Literal(target.to_vec())
        }
    }

    /// Size of the content this hunk produces.
    pub fn result_len(&self) -> u64 {
        match self {
            BinaryHunk::Literal(d) => d.len() as u64,
            BinaryHunk::Delta(d) => delta::check(d, MAX_BINARY_BYTES).map_or(0, |s| s.target),
            BinaryHunk::Encoded(e) => e.delta.map_or(e.size, |d| d.target),
        }
    }

    /// The content this hunk makes of `base` (the other side's content), in memory.
    pub fn resolve(&self, base: &[u8]) -> Result<Vec<u8>, String> {
        match self {
            BinaryHunk::Literal(d) => Ok(d.clone()),
            BinaryHunk::Delta(d) => delta::apply(base, d, MAX_BINARY_BYTES),
            BinaryHunk::Encoded(EncodedHunk { delta: None, .. }) => {
                let lines: Vec<&str> = self.encoded_lines();
                decode_data(&lines, self.result_len())
            }
            BinaryHunk::Encoded(_) => {
                let mut out = Vec::new();
                self.produce(&base, &mut out)?;
                Ok(out)
            }
        }
    }

    fn encoded_lines(&self) -> Vec<&str> {
        match self {
            BinaryHunk::Encoded(e) => e.lines.lines().filter(|l| !l.is_empty()).collect(),
            _ => Vec::new(),
        }
    }

    /// Writes the content this hunk makes of `base` (the other side's content, read in place)
    /// to `out` as it is made, holding neither; the bytes written. A result that is not what
    /// the hunk declares is an error (after part of it was written: callers write where they
    /// can discard it, and check the result's id).
    pub(crate) fn produce(&self, base: &dyn Source, out: &mut dyn Write) -> Result<u64, String> {
        match self {
            BinaryHunk::Literal(d) => {
                out.write_all(d)
                    .map_err(|e| format!("writing a binary hunk's result: {e}"))?;
                Ok(d.len() as u64)
            }
            BinaryHunk::Delta(d) => delta::apply_reader(&d[..], base, out, MAX_BINARY_BYTES),
            BinaryHunk::Encoded(e) if e.delta.is_some() => {
                delta::apply_reader(e.inflated(), base, out, MAX_BINARY_BYTES)
            }
            BinaryHunk::Encoded(e) => {
                let mut limited = e.inflated().take(e.size + 1);
                let n = std::io::copy(&mut limited, out).map_err(|err| {
                    format!("corrupt zlib data in binary hunk, or a failed write: {err}")
                })?;
                if n != e.size {
                    return Err(format!(
                        "binary hunk inflates to {n} bytes or more, header says {}",
                        e.size
                    ));
                }
                Ok(n)
            }
        }
    }

    /// The hunk as git writes it: header, base85 lines, blank line.
    pub(crate) fn render(&self, out: &mut String) {
        let (kind, data) = match self {
            BinaryHunk::Literal(d) => ("literal", d),
            BinaryHunk::Delta(d) => ("delta", d),
            BinaryHunk::Encoded(e) => {
                let kind = if e.delta.is_some() {
                    "delta"
                } else {
                    "literal"
                };
                out.push_str(&format!("{kind} {}\n", e.size));
                out.push_str(&e.lines);
                return;
            }
        };
        out.push_str(&format!("{kind} {}\n", data.len()));
        encode_lines(&deflate(data), out);
    }
}

fn deflate(data: &[u8]) -> Vec<u8> {
    let mut enc = ZlibEncoder::new(Vec::new(), Compression::fast());
    enc.write_all(data).expect("writing to a Vec cannot fail");
    enc.finish().expect("writing to a Vec cannot fail")
}

const ALPHABET: &[u8; 85] =
    b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~";

/// Bytes of (deflated) data per base85 line, as git does.
const LINE_BYTES: usize = 52;

fn decode_digit(c: u8) -> Option<u32> {
    ALPHABET.iter().position(|a| *a == c).map(|p| p as u32)
}

/// Encodes `data` in git's base85 (4 bytes → 5 characters, zero-padded).
fn encode_85(data: &[u8], out: &mut String) {
    for chunk in data.chunks(4) {
        let mut acc: u32 = 0;
        for i in 0..4 {
            acc = (acc << 8) | u32::from(*chunk.get(i).unwrap_or(&0));
        }
        let mut digits = [0u8; 5];
        for d in digits.iter_mut().rev() {
            *d = ALPHABET[(acc % 85) as usize];
            acc /= 85;
        }
        for d in digits {
            out.push(d as char);
        }
    }
}

/// Decodes `len` bytes from git base85 text.
fn decode_85(text: &[u8], len: usize) -> Option<Vec<u8>> {
    if text.len() != len.div_ceil(4) * 5 {
        return None;
    }
    let mut out = Vec::with_capacity(len + 3);
    for group in text.chunks(5) {
        let mut acc: u64 = 0;
        for c in group {
            acc = acc * 85 + u64::from(decode_digit(*c)?);
        }
        if acc > u64::from(u32::MAX) {
            return None;
        }
        out.extend_from_slice(&(acc as u32).to_be_bytes());
    }
    out.truncate(len);
    Some(out)
}

/// Deflated bytes as base85 lines (a length character, then the digits), then the blank line
/// that ends a hunk.
fn encode_lines(deflated: &[u8], out: &mut String) {
    for line in deflated.chunks(LINE_BYTES) {
        push_line(line, out);
    }
    out.push('\n');
}

/// One base85 data line: its length character, the digits, a newline.
fn push_line(line: &[u8], out: &mut String) {
    let n = line.len();
    let c = if n <= 26 {
        b'A' + n as u8 - 1
    } else {
        b'a' + (n - 27) as u8
    };
    out.push(c as char);
    encode_85(line, out);
    out.push('\n');
}

/// What [`encode_streamed`] or [`best_streamed`] made of a file.
#[derive(Debug)]
pub(crate) enum Streamed {
    /// The file's git blob id and its hunk.
    Done { oid: String, hunk: EncodedHunk },
    /// The encoded hunk passed `cap` bytes after this many bytes of the file were read.
    OverCap { read: u64 },
    /// The file did not hold `size` bytes when read (it changed meanwhile).
    SizeChanged { read: u64 },
}

/// The sink of the deflater: base85 lines appended as each 52 bytes come, refusing to grow
/// past its cap (so a file whose hunk cannot fit costs no more than the cap).
struct LineSink {
    out: String,
    pending: [u8; LINE_BYTES],
    filled: usize,
    cap: usize,
    over: bool,
}

impl LineSink {
    fn new(cap: u64) -> Self {
        LineSink {
            out: String::new(),
            pending: [0; LINE_BYTES],
            filled: 0,
            cap: usize::try_from(cap).unwrap_or(usize::MAX),
            over: false,
        }
    }

    /// The hunk's lines once the deflater is done: the last short line and the blank line
    /// that ends a hunk added; `None` past the cap.
    fn finish(mut self) -> Option<String> {
        if self.filled > 0 {
            let (pending, filled) = (self.pending, self.filled);
            push_line(&pending[..filled], &mut self.out);
        }
        self.out.push('\n');
        (self.out.len() <= self.cap).then_some(self.out)
    }
}

impl Write for LineSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.over {
            return Err(std::io::Error::other("over the cap"));
        }
        for &b in buf {
            self.pending[self.filled] = b;
            self.filled += 1;
            if self.filled == LINE_BYTES {
                push_line(&self.pending, &mut self.out);
                self.filled = 0;
            }
        }
        if self.out.len() > self.cap {
            self.over = true;
            return Err(std::io::Error::other("over the cap"));
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A git blob id being computed over content of `size` bytes.
pub(crate) fn blob_hasher(size: u64) -> sha1::Sha1 {
    use sha1::Digest;
    let mut hash = sha1::Sha1::new();
    hash.update(format!("blob {size}\0").as_bytes());
    hash
}

pub(crate) fn hex_of(hash: sha1::Sha1) -> String {
    use sha1::Digest;
    crate::model::hex(&hash.finalize())
}

/// Reads `file` (which should hold `size` bytes) once, in fixed-size chunks, into its git blob
/// id and its `literal` hunk lines, without ever holding more than `cap` bytes of lines: the
/// memory a huge file costs is the cap, not its size. The lines are exactly what
/// [`BinaryHunk::Literal`] of the same bytes renders.
pub(crate) fn encode_streamed(
    mut file: impl Read,
    size: u64,
    cap: u64,
) -> std::io::Result<Streamed> {
    use sha1::Digest;
    let mut hash = blob_hasher(size);
    let mut enc = ZlibEncoder::new(LineSink::new(cap), Compression::fast());
    let mut buf = vec![0u8; 1 << 16];
    let mut read: u64 = 0;
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        read += n as u64;
        if read > size {
            return Ok(Streamed::SizeChanged { read });
        }
        hash.update(&buf[..n]);
        if enc.write_all(&buf[..n]).is_err() {
            if enc.get_ref().over {
                return Ok(Streamed::OverCap { read });
            }
            return Err(std::io::Error::other("deflating a changed file"));
        }
    }
    if read != size {
        return Ok(Streamed::SizeChanged { read });
    }
    let Some(lines) = enc.finish().ok().and_then(LineSink::finish) else {
        return Ok(Streamed::OverCap { read });
    };
    let oid = hex_of(hash);
    Ok(Streamed::Done {
        hunk: EncodedHunk {
            size,
            delta: None,
            oid: Arc::from(oid.as_str()),
            lines: Arc::from(lines),
        },
        oid,
    })
}

/// The `delta` hunk turning `src` (read in place; `index` was built over it) into the
/// `target_len` bytes `target` reads, made as the target is read once and deflated into at
/// most `cap` bytes of lines; the target's git blob id, hashed from that same read unless
/// `known_oid` gives it (the target was hashed by an earlier read of it).
fn delta_streamed(
    src: &dyn Source,
    index: &delta::Index,
    target: impl Read,
    target_len: u64,
    cap: u64,
    known_oid: Option<&str>,
) -> std::io::Result<Streamed> {
    use sha1::Digest;
    let mut hash = known_oid.is_none().then(|| blob_hasher(target_len));
    let mut read = 0u64;
    let mut enc = ZlibEncoder::new(LineSink::new(cap), Compression::fast());
    let mut observe = |b: &[u8]| {
        read += b.len() as u64;
        if let Some(h) = hash.as_mut() {
            h.update(b);
        }
    };
    let encoded = delta::encode_stream(src, index, target, target_len, &mut observe, &mut enc);
    let raw = match encoded {
        Ok(n) => n,
        Err(delta::EncodeError::Output) => return Ok(Streamed::OverCap { read }),
        Err(delta::EncodeError::SizeChanged { read }) => return Ok(Streamed::SizeChanged { read }),
        // The source ended before the size it had when looked at: it changed meanwhile.
        Err(delta::EncodeError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Ok(Streamed::SizeChanged { read })
        }
        Err(delta::EncodeError::Io(e)) => return Err(e),
    };
    let Some(lines) = enc.finish().ok().and_then(LineSink::finish) else {
        return Ok(Streamed::OverCap { read });
    };
    let oid = match (hash, known_oid) {
        (Some(h), _) => hex_of(h),
        (None, known) => known.unwrap_or_default().to_string(),
    };
    Ok(Streamed::Done {
        hunk: EncodedHunk {
            size: raw,
            delta: Some(DeltaSizes {
                source: src.size(),
                target: target_len,
            }),
            oid: Arc::from(oid.as_str()),
            lines: Arc::from(lines),
        },
        oid,
    })
}

/// Indexes `src` for deltas against it ([`delta::Index`]) and hashes it into its git blob id,
/// both from one read.
pub(crate) fn index_and_oid(src: &dyn Source) -> std::io::Result<(delta::Index, String)> {
    use sha1::Digest;
    let mut hash = blob_hasher(src.size());
    let index = delta::Index::build(src, &mut |b| hash.update(b))?;
    Ok((index, hex_of(hash)))
}

/// The hunk, smaller once deflated (as git chooses), that turns `src` (the other side, read in
/// place; `index` was built over it) into the file `target`: a `delta` against `src`, or else
/// a `literal`, each made while `target` is read and never held, and at most `cap` bytes of
/// lines (`OverCap` when neither fits). Like git, no delta against or to an empty side.
/// `known_oid`: the target's id from an earlier read, which the delta need not hash again (a
/// literal is hashed as it is made, and must agree).
pub(crate) fn best_streamed(
    src: &dyn Source,
    index: &delta::Index,
    target: &delta::FileSource,
    cap: u64,
    known_oid: Option<&str>,
) -> std::io::Result<Streamed> {
    if src.size() == 0 || target.len == 0 {
        return encode_streamed(target.reader(), target.len, cap);
    }
    let made = delta_streamed(src, index, target.reader(), target.len, cap, known_oid)?;
    let (oid, delta) = match made {
        Streamed::Done { oid, hunk } => (oid, hunk),
        // No delta fits: the literal may still (a file rewritten with compressible content).
        Streamed::OverCap { .. } => return encode_streamed(target.reader(), target.len, cap),
        changed @ Streamed::SizeChanged { .. } => return Ok(changed),
    };
    let delta_len = delta.lines.len() as u64;
    // Deflate cannot shrink data by more than MAX_INFLATE_RATIO: below that the delta wins
    // without reading the target again.
    if delta_len.saturating_mul(MAX_INFLATE_RATIO as u64 + 100) < target.len {
        return Ok(Streamed::Done { oid, hunk: delta });
    }
    // The literal is only wanted if it is smaller: it stops as soon as it is not.
    match encode_streamed(target.reader(), target.len, delta_len.saturating_sub(1))? {
        Streamed::Done { oid: again, hunk } if again == oid => Ok(Streamed::Done { oid, hunk }),
        Streamed::Done { .. } => Ok(Streamed::SizeChanged { read: target.len }),
        Streamed::OverCap { .. } => Ok(Streamed::Done { oid, hunk: delta }),
        changed @ Streamed::SizeChanged { .. } => Ok(changed),
    }
}

/// One `literal <n>` hunk: the header, the base85 lines, and the blank line that ends it.
#[cfg(test)]
fn literal_hunk(data: &[u8]) -> String {
    let mut out = String::new();
    BinaryHunk::Literal(data.to_vec()).render(&mut out);
    out
}

/// Inflates the data lines of a hunk (without header and blank line) that declares `size`
/// inflated bytes. The declared size is only trusted up to [`MAX_BINARY_BYTES`] and up to what
/// the deflated bytes can inflate to: a few hundred bytes claiming gigabytes allocate nothing
/// big, they fail when the data runs out.
fn decode_data(lines: &[&str], size: u64) -> Result<Vec<u8>, String> {
    if size > MAX_BINARY_BYTES {
        return Err(format!(
            "binary hunk declares {size} bytes, over the {MAX_BINARY_BYTES}-byte limit"
        ));
    }
    let mut deflated = Vec::new();
    for line in lines {
        let chunk = decode_line(line)?;
        deflated.extend_from_slice(&chunk);
    }
    let ceiling = deflated
        .len()
        .saturating_mul(MAX_INFLATE_RATIO)
        .saturating_add(64);
    let mut data = Vec::with_capacity(usize::try_from(size).unwrap_or(usize::MAX).min(ceiling));
    ZlibDecoder::new(&deflated[..])
        .take(size + 1)
        .read_to_end(&mut data)
        .map_err(|e| format!("corrupt zlib data in binary hunk: {e}"))?;
    if data.len() as u64 != size {
        return Err(format!(
            "binary hunk inflates to {} bytes, header says {size}",
            data.len()
        ));
    }
    Ok(data)
}

/// Inflates the data lines of a `literal` hunk declaring `size` bytes without holding the
/// result: its git blob id, once it inflated to exactly `size` bytes. Memory: one line and
/// the inflater's window.
fn verify_streamed(lines: &[&str], size: u64) -> Result<String, String> {
    use sha1::{Digest, Sha1};
    if size > MAX_BINARY_BYTES {
        return Err(format!(
            "binary hunk declares {size} bytes, over the {MAX_BINARY_BYTES}-byte limit"
        ));
    }
    /// Hashes and counts what the inflater writes, refusing a byte past the declared size.
    struct HashSink {
        hash: Sha1,
        written: u64,
        size: u64,
    }
    impl Write for HashSink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if self.written + buf.len() as u64 > self.size {
                return Err(std::io::Error::other("inflates past the declared size"));
            }
            self.hash.update(buf);
            self.written += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut hash = Sha1::new();
    hash.update(format!("blob {size}\0").as_bytes());
    let mut inflater = flate2::write::ZlibDecoder::new(HashSink {
        hash,
        written: 0,
        size,
    });
    let too_long = |e: std::io::Error| {
        format!(
            "corrupt zlib data in binary hunk, or more than the {size} bytes its header says: {e}"
        )
    };
    for line in lines {
        let chunk = decode_line(line)?;
        inflater.write_all(&chunk).map_err(too_long)?;
    }
    let sink = inflater.finish().map_err(too_long)?;
    if sink.written != size {
        return Err(format!(
            "binary hunk inflates to {} bytes, header says {size}",
            sink.written
        ));
    }
    Ok(crate::model::hex(&sink.hash.finalize()))
}

/// Checks the data lines of a `delta` hunk declaring `size` inflated bytes as they inflate,
/// without holding them: its ops (each within its source and its data, producing exactly the
/// declared result, at most [`MAX_BINARY_BYTES`]) and its length. Memory: one line, the
/// inflater's window and a read buffer.
fn check_streamed_delta(lines: &[&str], size: u64) -> Result<DeltaSizes, String> {
    // A delta's ops carry at most its result, plus an op byte per 127 inserted bytes.
    if size > MAX_BINARY_BYTES + MAX_BINARY_BYTES / 64 {
        return Err(format!(
            "delta hunk declares {size} bytes, over the {MAX_BINARY_BYTES}-byte limit"
        ));
    }
    /// Counts what passes through.
    struct Counted<R> {
        r: R,
        n: u64,
    }
    impl<R: Read> Read for Counted<R> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let k = self.r.read(buf)?;
            self.n += k as u64;
            Ok(k)
        }
    }
    let inflated = ZlibDecoder::new(LinesReader::new(lines.iter().copied())).take(size + 1);
    let mut counted = Counted { r: inflated, n: 0 };
    let sizes = delta::check_reader(std::io::BufReader::new(&mut counted), MAX_BINARY_BYTES)?;
    // The ops were read to the data's end (or one byte past the declared size).
    if counted.n != size {
        return Err(format!(
            "binary hunk inflates to {} bytes, header says {size}",
            counted.n
        ));
    }
    Ok(sizes)
}

/// One data line of a binary hunk: its length character, then base85: the deflated bytes.
fn decode_line(line: &str) -> Result<Vec<u8>, String> {
    let b = line.as_bytes();
    let Some(&c) = b.first() else {
        return Err("empty line inside binary hunk".into());
    };
    let n = match c {
        b'A'..=b'Z' => (c - b'A') as usize + 1,
        b'a'..=b'z' => (c - b'a') as usize + 27,
        _ => return Err(format!("bad binary line length character {:?}", c as char)),
    };
    Ok(decode_85(&b[1..], n).ok_or("corrupt base85 line in binary hunk")?)
}

fn strip_nl(l: &str) -> &str {
    l.strip_suffix('\n').unwrap_or(l)
}

/// The forward and (optional) reverse hunks of a binary patch, and the index of the line
/// after them.
pub(crate) type ParsedHunks = (BinaryHunk, Option<BinaryHunk>, usize);

/// Parses the hunks after a `GIT binary patch` line; `lines[i]` is the line after it (lines
/// keep their `\n`). A delta's ops are checked against its header here; what it is applied to
/// is checked by [`BinaryHunk::resolve`]. Errors carry the index of the offending line.
pub(crate) fn parse_hunks(lines: &[&str], mut i: usize) -> Result<ParsedHunks, (usize, String)> {
    let n = lines.len();
    let mut hunks = Vec::new();
    while hunks.len() < 2 && i < n {
        let l = strip_nl(lines[i]);
        let (is_delta, size) = if let Some(s) = l.strip_prefix("literal ") {
            (false, s)
        } else if let Some(s) = l.strip_prefix("delta ") {
            (true, s)
        } else {
            break;
        };
        let size: u64 = size
            .parse()
            .map_err(|_| (i, format!("malformed binary hunk size {size:?}")))?;
        let start = i + 1;
        let mut end = start;
        while end < n && !strip_nl(lines[end]).is_empty() {
            end += 1;
        }
        let data_lines: Vec<&str> = lines[start..end].iter().map(|l| strip_nl(l)).collect();
        if size > crate::limit::STREAM_THRESHOLD_BYTES {
            // A large hunk is checked as it inflates and kept deflated, as the bundle carries
            // it: a well-compressing file of hundreds of megabytes is a small hunk, and
            // reading the patch must not cost its inflated size (issue 13).
            let (oid, delta) = if is_delta {
                let sizes = check_streamed_delta(&data_lines, size).map_err(|r| (start, r))?;
                (String::new(), Some(sizes))
            } else {
                (
                    verify_streamed(&data_lines, size).map_err(|r| (start, r))?,
                    None,
                )
            };
            let mut text =
                String::with_capacity(lines[start..end].iter().map(|l| l.len() + 1).sum());
            for l in &data_lines {
                text.push_str(l);
                text.push('\n');
            }
            text.push('\n');
            hunks.push(BinaryHunk::Encoded(EncodedHunk {
                size,
                delta,
                oid: Arc::from(oid.as_str()),
                lines: Arc::from(text),
            }));
            i = (end + 1).min(n);
            continue;
        }
        let data = decode_data(&data_lines, size).map_err(|r| (start, r))?;
        hunks.push(if is_delta {
            delta::check(&data, MAX_BINARY_BYTES).map_err(|r| (i, r))?;
            BinaryHunk::Delta(data)
        } else {
            BinaryHunk::Literal(data)
        });
        i = (end + 1).min(n);
    }
    let mut it = hunks.into_iter();
    let forward = it.next().ok_or_else(|| {
        (
            i,
            "'GIT binary patch' without a literal or delta hunk".into(),
        )
    })?;
    Ok((forward, it.next(), i))
}

/// Checks a binary patch's hunks against its index line (`None`: that side is absent, the
/// empty blob): a literal must hash to its side's id, a delta's source must be as long as the
/// other side, and an absent side must be empty. A forward delta's result can only be hashed
/// once its base is known: apply checks it against the new id before writing anything.
pub(crate) fn check_sides(
    forward: &BinaryHunk,
    reverse: Option<&BinaryHunk>,
    old_oid: Option<&str>,
    new_oid: Option<&str>,
) -> Result<(), String> {
    let empty = git_blob_oid(b"");
    let literal_ok = |h: &BinaryHunk, id: Option<&str>| match h {
        BinaryHunk::Literal(d) => git_blob_oid(d) == id.unwrap_or(&empty),
        // Hashed from the same read that made it (of the file, or of the parsed hunk).
        BinaryHunk::Encoded(e) if e.delta.is_none() => *e.oid == *id.unwrap_or(&empty),
        BinaryHunk::Encoded(_) | BinaryHunk::Delta(_) => true,
    };
    if !literal_ok(forward, new_oid) {
        return Err("binary content does not match the index line's new id".into());
    }
    if reverse.is_some_and(|r| !literal_ok(r, old_oid)) {
        return Err("binary content does not match the index line's old id".into());
    }
    if new_oid.is_none() && forward.result_len() != 0 {
        return Err("binary hunk gives content to a deleted file".into());
    }
    if old_oid.is_none() && reverse.is_some_and(|r| r.result_len() != 0) {
        return Err("reverse binary hunk gives content to a created file".into());
    }
    let source_len = |h: &BinaryHunk| match h {
        BinaryHunk::Delta(d) => delta::check(d, MAX_BINARY_BYTES).ok().map(|s| s.source),
        BinaryHunk::Encoded(e) => e.delta.map(|d| d.source),
        BinaryHunk::Literal(_) => None,
    };
    if let Some(s) = source_len(forward) {
        let other = match reverse {
            Some(r) => r.result_len(),
            None if old_oid.is_none() => 0,
            None => s,
        };
        if s != other {
            return Err(format!(
                "forward delta is against {s} bytes, the old side has {other}"
            ));
        }
    }
    if let Some(s) = reverse.and_then(source_len) {
        if s != forward.result_len() {
            return Err(format!(
                "reverse delta is against {s} bytes, the new side has {}",
                forward.result_len()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_literal_is_checked_as_it_inflates_and_kept_deflated() {
        // 40 MiB that deflate to a few kilobytes: parsed, it must stay a few kilobytes.
        let data = vec![b'x'; 40 << 20];
        let hunk = literal_hunk(&data);
        let lines: Vec<&str> = hunk.split_inclusive('\n').collect();
        let (forward, reverse, _) = parse_hunks(&lines, 0).unwrap();
        assert!(reverse.is_none());
        let BinaryHunk::Encoded(e) = &forward else {
            panic!("a {}-byte literal was inflated whole", data.len());
        };
        assert!(e.lines.len() < 1 << 20, "{} bytes kept", e.lines.len());
        assert_eq!(forward.result_len(), data.len() as u64);
        let oid = git_blob_oid(&data);
        check_sides(&forward, None, None, Some(&oid)).unwrap();
        let other = git_blob_oid(b"something else");
        assert!(check_sides(&forward, None, None, Some(&other)).is_err());
        assert_eq!(forward.resolve(b"").unwrap(), data);
        let mut rendered = String::new();
        forward.render(&mut rendered);
        assert_eq!(rendered, hunk);
        // A header that claims more, or less, than the data inflates to is refused.
        for claimed in [data.len() + 1, data.len() - 1] {
            let lied = hunk.replacen(
                &format!("literal {}", data.len()),
                &format!("literal {claimed}"),
                1,
            );
            let lines: Vec<&str> = lied.split_inclusive('\n').collect();
            assert!(parse_hunks(&lines, 0).is_err(), "claimed {claimed}");
        }
    }

    #[test]
    fn empty_literal_matches_git() {
        // What git prints for an empty side of a binary patch.
        assert_eq!(literal_hunk(b""), "literal 0\nHcmV?d00001\n\n");
    }

    #[test]
    fn streamed_encoding_is_the_literal_hunk() {
        // Several chunks of the reader, compressible and not, and a last short line.
        let mut data: Vec<u8> = (0..300_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        data.extend((0..70_003u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8));
        let size = data.len() as u64;
        let Streamed::Done { oid, hunk: literal } =
            encode_streamed(&data[..], size, u64::MAX).unwrap()
        else {
            panic!("not encoded");
        };
        assert_eq!(oid, git_blob_oid(&data));
        let mut streamed = String::new();
        BinaryHunk::Encoded(literal.clone()).render(&mut streamed);
        assert_eq!(streamed, literal_hunk(&data));
        assert_eq!(BinaryHunk::Encoded(literal).resolve(&[]).unwrap(), data);
        // A cap below the hunk stops the reading early; a file that is not the size it was
        // said to be is named as changed.
        let noise: Vec<u8> = (0..4_000_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
            .collect();
        match encode_streamed(&noise[..], noise.len() as u64, 1000).unwrap() {
            Streamed::OverCap { read } => assert!(read < noise.len() as u64 / 2, "{read}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            encode_streamed(&data[..], size - 1, u64::MAX).unwrap(),
            Streamed::SizeChanged { .. }
        ));
        assert!(matches!(
            encode_streamed(&data[..], size + 1, u64::MAX).unwrap(),
            Streamed::SizeChanged { .. }
        ));
    }

    #[test]
    fn round_trip() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 256) as u8).collect();
        let h = literal_hunk(&data);
        let lines: Vec<&str> = h.lines().skip(1).filter(|l| !l.is_empty()).collect();
        assert_eq!(decode_data(&lines, data.len() as u64).unwrap(), data);
        assert!(decode_data(&lines, data.len() as u64 + 1).is_err());
    }
}
