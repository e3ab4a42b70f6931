//! Git's binary patch encoding: zlib-deflated data in base85 lines (`git diff --binary`).

use std::io::{Read, Write};

use flate2::read::ZlibDecoder;
use flate2::write::ZlibEncoder;
use flate2::Compression;

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

/// One `literal <n>` hunk: the header, the base85 lines, and the blank line that ends it.
pub(crate) fn literal_hunk(data: &[u8]) -> String {
    let mut enc = ZlibEncoder::new(Vec::new(), Compression::fast());
    enc.write_all(data).expect("writing to a Vec cannot fail");
    let deflated = enc.finish().expect("writing to a Vec cannot fail");
    let mut out = format!("literal {}\n", data.len());
    for line in deflated.chunks(LINE_BYTES) {
        let n = line.len();
        let c = if n <= 26 {
            b'A' + n as u8 - 1
        } else {
            b'a' + (n - 27) as u8
        };
        out.push(c as char);
        encode_85(line, &mut out);
        out.push('\n');
    }
    out.push('\n');
    out
}

/// Decodes the data lines of a `literal <size>` hunk (without header and blank line).
pub(crate) fn decode_literal(lines: &[&str], size: usize) -> Result<Vec<u8>, String> {
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
    let mut data = Vec::with_capacity(size);
    ZlibDecoder::new(&deflated[..])
        .take(size as u64 + 1)
        .read_to_end(&mut data)
        .map_err(|e| format!("corrupt zlib data in binary hunk: {e}"))?;
    if data.len() != size {
        return Err(format!(
            "binary hunk inflates to {} bytes, header says {size}",
            data.len()
        ));
    }
    Ok(data)
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
        assert_eq!(decode_literal(&lines, data.len()).unwrap(), data);
        assert!(decode_literal(&lines, data.len() + 1).is_err());
    }
}
