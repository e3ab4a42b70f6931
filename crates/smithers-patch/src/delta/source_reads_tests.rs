//! How often the encoder reads its source, each delta checked with the decoder. A test of
//! the encoder, kept among its parent's tests: the decoder is the parent's, and the encoder
//! (which the parent uses) then needs nothing from its parent, not even in its tests.

use std::io;

use super::{encode_stream, Index, Source};

fn noise(n: usize, mut seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(n + 8);
    seed |= 1;
    while out.len() < n {
        seed ^= seed >> 12;
        seed ^= seed << 25;
        seed ^= seed >> 27;
        out.extend_from_slice(&seed.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(n);
    out
}

/// A source in memory that counts the bytes read from it.
struct Counting<'a> {
    bytes: &'a [u8],
    read: std::cell::Cell<u64>,
}

impl Source for Counting<'_> {
    fn size(&self) -> u64 {
        self.bytes.len() as u64
    }

    fn read_exact_at(&self, buf: &mut [u8], at: u64) -> io::Result<()> {
        self.read.set(self.read.get() + buf.len() as u64);
        self.bytes.read_exact_at(buf, at)
    }
}

/// Bytes read from `src` to encode `dst` (the index build's one read not counted); the
/// delta is checked to make `dst`.
fn source_reads(src: &[u8], dst: &[u8]) -> u64 {
    let counting = Counting {
        bytes: src,
        read: std::cell::Cell::new(0),
    };
    let index = Index::build(&counting, &mut |_| {}).unwrap();
    let built = counting.read.get();
    let mut out = Vec::new();
    encode_stream(
        &counting,
        &index,
        dst,
        dst.len() as u64,
        &mut |_| {},
        &mut out,
    )
    .unwrap();
    assert!(super::apply(src, &out, u64::MAX).unwrap() == dst);
    counting.read.get() - built
}

/// Many short copies (fixed-size records each with a changed field, or a target crafted
/// for it) read the source a bounded number of times: each refill was a whole chunk for
/// a copy of 16 bytes (thousands of times the source).
#[test]
fn short_copies_read_the_source_a_bounded_number_of_times() {
    let src = noise(4 << 20, 1);
    // One byte in every 17 changed: a copy per 16 bytes, along one diagonal.
    let mut dst = src.clone();
    for i in (0..dst.len()).step_by(17) {
        dst[i] ^= 0xff;
    }
    let read = source_reads(&src, &dst);
    assert!(read < 4 * src.len() as u64, "{read} bytes read");
    // Pieces of 64 bytes from all over the source: a hit in the index for each.
    let mut dst = Vec::new();
    let mut at = 7u64;
    while dst.len() < src.len() {
        at = (at
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407))
            >> 1;
        let from = (at % (src.len() as u64 - 64)) as usize & !15;
        dst.extend_from_slice(&src[from..from + 64]);
    }
    let read = source_reads(&src, &dst);
    assert!(read < 8 * dst.len() as u64, "{read} bytes read");
}
