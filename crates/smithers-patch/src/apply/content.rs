//! What a regular file holds while patches are planned and staged: its bytes in memory, or,
//! for a file over [`crate::STREAM_THRESHOLD_BYTES`], the host's file where it lies, or a
//! binary hunk with the content it applies to. Applying a small delta to a large file then
//! holds neither side: the base is hashed where it lies, the result is made once into a hash
//! (to check it against the patch's new id before anything is written) and once into the
//! staged file (hashed again as it is written: the host's file may have changed in between,
//! which is then a conflict, not a wrong file).

use std::borrow::Cow;
use std::fs::File;
use std::io::{self, Write};
use std::sync::Arc;

use sha1::Digest;

use crate::binary::{blob_hasher, hex_of, BinaryHunk};
use crate::delta::{FileSource, Source};
use crate::limit::STREAM_THRESHOLD_BYTES;
use crate::model::git_blob_oid;

/// Bytes read from a host file at a time.
const CHUNK: usize = 64 << 10;

#[derive(Debug, Clone)]
pub(super) enum Content {
    /// In memory (a file up to the threshold, a symlink's target, a text merge's result).
    Held(Vec<u8>),
    /// Past the threshold: never held.
    Large(Arc<Large>),
}

#[derive(Debug)]
pub(super) struct Large {
    size: u64,
    /// Its git blob id: hashed where it lies, or made once into the hash.
    oid: String,
    origin: Origin,
}

#[derive(Debug)]
enum Origin {
    /// The host's file, kept open: the inode that was hashed.
    Host(File),
    /// What `hunk` makes of `base` (a held content or a host file).
    Hunk { hunk: BinaryHunk, base: Content },
}

/// Why [`Content::write_to`] failed.
pub(super) enum WriteError {
    /// Reading the host's file or writing the result failed.
    Io(io::Error),
    /// The content is not what was planned: the host's file changed since.
    Changed(String),
}

/// A writer that hashes what passes through into a git blob id, writing it on to `inner`
/// (if any); the first error of `inner` is kept, so that a failed write is told from a base
/// that changed.
struct Hashing<'a> {
    hash: sha1::Sha1,
    inner: Option<&'a mut dyn Write>,
    error: Option<io::Error>,
}

impl<'a> Hashing<'a> {
    fn new(size: u64, inner: Option<&'a mut dyn Write>) -> Self {
        Hashing {
            hash: blob_hasher(size),
            inner,
            error: None,
        }
    }
}

impl Write for Hashing<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some(w) = self.inner.as_mut() {
            if let Err(e) = w.write_all(buf) {
                let kind = e.kind();
                self.error = Some(e);
                return Err(kind.into());
            }
        }
        self.hash.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl PartialEq for Content {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Content::Held(a), Content::Held(b)) => a == b,
            _ => self.len() == other.len() && self.oid() == other.oid(),
        }
    }
}

impl Eq for Content {}

impl Content {
    /// A host file: held up to the threshold; past it hashed where it lies, read in chunks.
    pub(super) fn of_host_file(mut file: File) -> io::Result<Content> {
        let size = file.metadata()?.len();
        if size <= STREAM_THRESHOLD_BYTES {
            let mut buf = Vec::new();
            io::Read::read_to_end(&mut file, &mut buf)?;
            return Ok(Content::Held(buf));
        }
        let mut hash = blob_hasher(size);
        let mut buf = vec![0u8; CHUNK];
        let mut at = 0u64;
        while at < size {
            let n = (size - at).min(CHUNK as u64) as usize;
            std::os::unix::fs::FileExt::read_exact_at(&file, &mut buf[..n], at)?;
            hash.update(&buf[..n]);
            at += n as u64;
        }
        Ok(Content::Large(Arc::new(Large {
            size,
            oid: hex_of(hash),
            origin: Origin::Host(file),
        })))
    }

    pub(super) fn len(&self) -> u64 {
        match self {
            Content::Held(v) => v.len() as u64,
            Content::Large(l) => l.size,
        }
    }

    pub(super) fn oid(&self) -> String {
        match self {
            Content::Held(v) => git_blob_oid(v),
            Content::Large(l) => l.oid.clone(),
        }
    }

    /// The bytes in memory, a large content read or made whole (for what needs all of it at
    /// once: a text merge, a delta on a result made in the same apply).
    pub(super) fn held(&self) -> Result<Cow<'_, [u8]>, String> {
        match self {
            Content::Held(v) => Ok(Cow::Borrowed(v)),
            Content::Large(l) => {
                let mut out = Vec::new();
                match self.write_to(&mut out) {
                    Ok(()) => Ok(Cow::Owned(out)),
                    Err(WriteError::Io(e)) => Err(format!("reading a {}-byte file: {e}", l.size)),
                    Err(WriteError::Changed(why)) => Err(why),
                }
            }
        }
    }

    /// This content as a delta's source, read in place; `None` for one made from a hunk.
    fn source(&self) -> Option<Box<dyn Source + '_>> {
        match self {
            Content::Held(v) => Some(Box::new(&v[..])),
            Content::Large(l) => match &l.origin {
                Origin::Host(file) => Some(Box::new(FileSource { file, len: l.size })),
                Origin::Hunk { .. } => None,
            },
        }
    }

    /// The content `hunk` makes of this one: in memory up to the threshold; past it the hunk
    /// and this base, made once into a hash here (a literal kept deflated has its id from
    /// the read that made or parsed it).
    pub(super) fn apply(&self, hunk: &BinaryHunk) -> Result<Content, String> {
        let len = hunk.result_len();
        let large = len > STREAM_THRESHOLD_BYTES;
        if let (Content::Held(base), false) =
            (self, large || matches!(hunk, BinaryHunk::Encoded(_)))
        {
            return hunk.resolve(base).map(Content::Held);
        }
        // A base made from a hunk itself (two patches of one large path in one apply) is
        // made whole first.
        let base = match self.source() {
            Some(_) => self.clone(),
            None => Content::Held(self.held()?.into_owned()),
        };
        let src = base
            .source()
            .expect("a held or host content reads in place");
        if !large {
            let mut out = Vec::new();
            hunk.produce(&*src, &mut out)?;
            return Ok(Content::Held(out));
        }
        let oid = match hunk {
            BinaryHunk::Encoded(e) if e.delta.is_none() => e.oid.to_string(),
            _ => {
                let mut sink = Hashing::new(len, None);
                hunk.produce(&*src, &mut sink)?;
                hex_of(sink.hash)
            }
        };
        drop(src);
        Ok(Content::Large(Arc::new(Large {
            size: len,
            oid,
            origin: Origin::Hunk {
                hunk: hunk.clone(),
                base,
            },
        })))
    }

    /// Writes the content to `out`. A large one is hashed as it is written and must be what
    /// was planned.
    pub(super) fn write_to(&self, out: &mut dyn Write) -> Result<(), WriteError> {
        let l = match self {
            Content::Held(v) => return out.write_all(v).map_err(WriteError::Io),
            Content::Large(l) => l,
        };
        let mut sink = Hashing::new(l.size, Some(out));
        let made = match &l.origin {
            Origin::Host(file) => copy_at(file, l.size, &mut sink),
            Origin::Hunk { hunk, base } => {
                let src = base.source().expect("planned on a base read in place");
                hunk.produce(&*src, &mut sink).map(drop)
            }
        };
        if let Some(e) = sink.error.take() {
            return Err(WriteError::Io(e));
        }
        made.map_err(|e| WriteError::Changed(format!("no longer what was checked ({e})")))?;
        let got = hex_of(sink.hash);
        if got != l.oid {
            return Err(WriteError::Changed(format!(
                "made {got} where {} was checked: the host's file changed while it was applied",
                l.oid
            )));
        }
        Ok(())
    }
}

/// Copies the first `size` bytes of `file` to `out`, read in place.
fn copy_at(file: &File, size: u64, out: &mut dyn Write) -> Result<(), String> {
    let mut buf = vec![0u8; CHUNK];
    let mut at = 0u64;
    while at < size {
        let n = (size - at).min(CHUNK as u64) as usize;
        std::os::unix::fs::FileExt::read_exact_at(file, &mut buf[..n], at)
            .map_err(|e| format!("reading the host's file: {e}"))?;
        out.write_all(&buf[..n])
            .map_err(|e| format!("writing: {e}"))?;
        at += n as u64;
    }
    Ok(())
}
