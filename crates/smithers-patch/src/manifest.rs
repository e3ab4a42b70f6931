//! The copy manifest: what a full copy of the project held when it was complete, so that
//! comparing the copy with the project afterwards can tell the step's changes from the
//! host's (the project keeps changing while the step runs).
//!
//! One record per file and symlink of the copy: its path, and the inode and ctime the copy
//! entry had once the copy had set its times. An entry the step never touched still has both;
//! any write, chmod, rename or link by the step changes the ctime, which no process can set
//! back. Nothing depends on the clock's resolution or on it running forwards: the values are
//! compared for equality, never ordered.
//!
//! The file is written by the runtime into its private state directory (never where the
//! step can reach it) and read back bounded; a malformed one is an error.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::Path;

/// A manifest larger than this is not read (48 bytes a file: ~10M files).
pub const MAX_MANIFEST_BYTES: u64 = 512 << 20;

/// Identity of one copy entry as the copy left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyIdentity {
    pub ino: u64,
    pub ctime: (i64, u32),
}

/// Path (change path string, see [`crate::path_from_bytes`]) → identity.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CopyManifest {
    entries: HashMap<String, CopyIdentity>,
}

impl CopyManifest {
    /// The identity the copy gave `path`, if the copy had it.
    pub fn get(&self, path: &str) -> Option<CopyIdentity> {
        self.entries.get(path).copied()
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// No entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Reads a manifest written by [`CopyManifestWriter`].
    pub fn read(path: &Path) -> std::io::Result<CopyManifest> {
        let bad =
            |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
        let f = std::fs::File::open(path)?;
        let mut bytes = Vec::new();
        f.take(MAX_MANIFEST_BYTES + 1).read_to_end(&mut bytes)?;
        if bytes.len() as u64 > MAX_MANIFEST_BYTES {
            return Err(bad("copy manifest over its size limit"));
        }
        let mut entries = HashMap::new();
        let mut pos = 0usize;
        while pos < bytes.len() {
            let head = bytes
                .get(pos..pos + 24)
                .ok_or_else(|| bad("truncated copy manifest"))?;
            let ino = u64::from_le_bytes(head[0..8].try_into().unwrap_or_default());
            let sec = i64::from_le_bytes(head[8..16].try_into().unwrap_or_default());
            let nsec = u32::from_le_bytes(head[16..20].try_into().unwrap_or_default());
            let len = u32::from_le_bytes(head[20..24].try_into().unwrap_or_default()) as usize;
            pos += 24;
            let name = bytes
                .get(pos..pos.saturating_add(len))
                .filter(|_| pos.checked_add(len).is_some())
                .ok_or_else(|| bad("truncated copy manifest"))?;
            pos += len;
            entries.insert(
                crate::model::path_from_bytes(name),
                CopyIdentity {
                    ino,
                    ctime: (sec, nsec),
                },
            );
        }
        Ok(CopyManifest { entries })
    }
}

/// Writes a manifest record by record (buffered).
#[derive(Debug)]
pub struct CopyManifestWriter {
    out: std::io::BufWriter<std::fs::File>,
}

impl CopyManifestWriter {
    /// Creates (truncates) `path`, mode 0600.
    pub fn create(path: &Path) -> std::io::Result<CopyManifestWriter> {
        use std::os::unix::fs::OpenOptionsExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(path)?;
        Ok(CopyManifestWriter {
            out: std::io::BufWriter::new(f),
        })
    }

    /// One entry: its path relative to the copy root (raw bytes) and identity.
    pub fn add(&mut self, rel: &[u8], id: CopyIdentity) -> std::io::Result<()> {
        let len = u32::try_from(rel.len())
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "path too long"))?;
        self.out.write_all(&id.ino.to_le_bytes())?;
        self.out.write_all(&id.ctime.0.to_le_bytes())?;
        self.out.write_all(&id.ctime.1.to_le_bytes())?;
        self.out.write_all(&len.to_le_bytes())?;
        self.out.write_all(rel)
    }

    /// Flushes and syncs nothing more than the data (the file is private state).
    pub fn finish(mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_truncation() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("m");
        let mut w = CopyManifestWriter::create(&p).unwrap();
        let a = CopyIdentity {
            ino: 7,
            ctime: (1_700_000_000, 123),
        };
        w.add(b"src/a.rs", a).unwrap();
        w.add(b"caf\xe9", a).unwrap();
        w.finish().unwrap();
        let m = CopyManifest::read(&p).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m.get("src/a.rs"), Some(a));
        assert_eq!(m.get(&crate::model::path_from_bytes(b"caf\xe9")), Some(a));
        let bytes = std::fs::read(&p).unwrap();
        for n in 1..bytes.len() {
            if n == 32 {
                continue; // exactly one whole record
            }
            std::fs::write(&p, &bytes[..n]).unwrap();
            assert!(CopyManifest::read(&p).is_err(), "{n}");
        }
    }
}
