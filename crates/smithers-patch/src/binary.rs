//! Git's binary patches (`git diff --binary`): after `GIT binary patch`, a forward hunk (old →
//! new) and a reverse hunk (new → old; always written, optional on input). Each is
//! `literal <size>` (the whole content of its result) or `delta <size>` (a pack delta against
//! the other side, see [`crate::delta`]), `<size>` being the inflated size, followed by the
//! zlib-deflated bytes in base85 lines and a blank line. Like git, each direction is a delta
//! when that is smaller once deflated, else a literal.
//!
//! Nothing in a hunk is trusted: a declared size is capped by [`MAX_BINARY_BYTES`] and by what
//! the deflated data can really inflate to before anything is allocated by it.

use std::io::{Read, Write};

use flate2::read::ZlibDecoder;
use flate2::write::ZlibEncoder;
use flate2::Compression;
use serde::{Deserialize, Serialize};

use crate::delta;
use crate::model::git_blob_oid;

/// Largest content a binary hunk may declare or produce (either side of a binary patch). Our
/// own patches never come near it: detection holds at most 1 GiB of old + new content
/// (`DetectOptions::max_content_bytes`' default).
pub const MAX_BINARY_BYTES: u64 = 1 << 30;

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
        }
    }

    /// The content this hunk makes of `base` (the other side's content).
    pub fn resolve(&self, base: &[u8]) -> Result<Vec<u8>, String> {
        match self {
            BinaryHunk::Literal(d) => Ok(d.clone()),
            BinaryHunk::Delta(d) => delta::apply(base, d, MAX_BINARY_BYTES),
        }
    }

    /// The hunk as git writes it: header, base85 lines, blank line.
    pub(crate) fn render(&self, out: &mut String) {
        let (kind, data) = match self {
            BinaryHunk::Literal(d) => ("literal", d),
            BinaryHunk::Delta(d) => ("delta", d),
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
    out.push('\n');
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
        let b = line.as_bytes();
        let Some(&c) = b.first() else {
            return Err("empty line inside binary hunk".into());
        };
        let n = match c {
            b'A'..=b'Z' => (c - b'A') as usize + 1,
            b'a'..=b'z' => (c - b'a') as usize + 27,
            _ => return Err(format!("bad binary line length character {:?}", c as char)),
        };
        let chunk = decode_85(&b[1..], n).ok_or("corrupt base85 line in binary hunk")?;
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
        BinaryHunk::Delta(_) => true,
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
    fn empty_literal_matches_git() {
        // What git prints for an empty side of a binary patch.
        assert_eq!(literal_hunk(b""), "literal 0\nHcmV?d00001\n\n");
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
