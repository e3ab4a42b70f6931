//! A delta's source, read at offsets: what the decoder copies from and the encoder indexes.
//! Below both, so that the encoder needs nothing from the decoder's module.

use std::io;

/// A delta's source, read at offsets: a file read in place, or bytes in memory.
pub(crate) trait Source {
    /// Its length in bytes.
    fn size(&self) -> u64;
    /// Fills `buf` from offset `at`; `at + buf.len()` ≤ [`Source::size`]. A file that is
    /// shorter than it was said to be is an error (`UnexpectedEof`).
    fn read_exact_at(&self, buf: &mut [u8], at: u64) -> io::Result<()>;
}

impl Source for &[u8] {
    fn size(&self) -> u64 {
        self.len() as u64
    }

    fn read_exact_at(&self, buf: &mut [u8], at: u64) -> io::Result<()> {
        let from = usize::try_from(at).map_err(|_| io::ErrorKind::UnexpectedEof)?;
        let bytes = self
            .get(from..from + buf.len())
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(bytes);
        Ok(())
    }
}

/// A regular file read in place, with the length it had when it was looked at.
pub(crate) struct FileSource<'a> {
    pub file: &'a std::fs::File,
    pub len: u64,
}

impl FileSource<'_> {
    /// The file read front to back from its start, by offset (`pread`): independent of the
    /// descriptor's position, so the file can be read again. It reads what the file holds,
    /// past `len` too: a reader of it sees a file that grew.
    pub(crate) fn reader(&self) -> impl std::io::Read + '_ {
        struct Pread<'a> {
            file: &'a std::fs::File,
            pos: u64,
        }
        impl std::io::Read for Pread<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let n = std::os::unix::fs::FileExt::read_at(self.file, buf, self.pos)?;
                self.pos += n as u64;
                Ok(n)
            }
        }
        Pread {
            file: self.file,
            pos: 0,
        }
    }
}

impl Source for FileSource<'_> {
    fn size(&self) -> u64 {
        self.len
    }

    fn read_exact_at(&self, buf: &mut [u8], at: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(self.file, buf, at)
    }
}
