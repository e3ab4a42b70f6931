//! The numbers of git's pack delta format that both its decoder and its encoder obey: the
//! largest op of each kind, the part of a source a copy op can reach, and the varints of the
//! header. Below both (and the source reading of [`super::source`]) so that the encoder needs
//! nothing from the decoder's module, which uses the encoder.

/// Largest copy op we emit: three size bytes. Every git since the pack format's first
/// version reads them (`patch-delta.c`), so `git apply` applies such copies.
pub(crate) const MAX_COPY: u64 = 0xff_ffff;
/// Largest insert op (the op byte is the length, 1..=127).
pub(crate) const MAX_INSERT: usize = 0x7f;
/// Copy offsets have four bytes: only the first 4 GiB of a source can be copied from.
pub(crate) const MAX_SOURCE: u64 = u32::MAX as u64;

pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}
