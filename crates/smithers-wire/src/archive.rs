//! Streamed tar packing and confined unpacking, shared by both ends of the wire: the client
//! packs the workspace and unpacks the result bundle, the server unpacks the workspace and
//! packs the bundle. Everything is a `Read`/`Write` stream; nothing holds an archive in memory.
//!
//! # What unpacking accepts (the archive is untrusted)
//!
//! * Entry paths must be relative and plain: an absolute path, a `..` component or a NUL is
//!   refused ([`ArchiveError::PathEscape`]); `.` components are dropped (`./src/a.rs` is fine).
//! * Regular files and directories are created with [`smithers_paths::Beneath`], whose every
//!   operation refuses to traverse a symlink (openat2 `RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS`).
//!   Modes keep the `0o777` bits only (no setuid/setgid/sticky); owners and times are not
//!   restored.
//! * Symlink entries, when [`UnpackLimits::allow_symlinks`] is set (workspaces: projects contain
//!   links such as `node_modules/.bin/*`), are stored **as data**: created with their target
//!   text, never followed during extraction — an entry that would be written through one is
//!   refused as an escape. A link whose target is absolute or climbs out of the root is refused
//!   outright. Bundles allow none (the bundle format forbids symlinks).
//! * Names in [`UnpackLimits::reserved_names`] (`.smithers` for a workspace) are refused at
//!   any depth, as an entry's component or in a symlink's target: a `.smithers/` below the top
//!   holds a runtime's state and database, which recovery there would trust.
//! * Hard links are always refused: a link to a path outside the archive would alias a host
//!   file, and we do not need them.
//! * Character/block devices, fifos, sparse files and other special entries are refused.
//! * Totals are bounded: bytes of regular files, number of entries, path length. The check
//!   runs on header sizes before anything is written and again on the bytes actually copied.
//! * Unpacking targets a fresh staging directory; callers rename it into place only on success,
//!   so a refused archive leaves nothing half-extracted.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use bytes::Bytes;
use serde_json::{json, Value};
use smithers_errors::{CodedError, ErrorCode};
use smithers_paths::{Beneath, EntryKind, PathError};

/// Failure to pack or unpack an archive. The variants that describe the archive (not our own
/// I/O) carry the offending entry path.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// An entry path is absolute, contains `..`, or would be written through a symlink.
    #[error("archive entry {path:?} escapes the destination: {reason}")]
    PathEscape { path: String, reason: String },

    /// A symlink entry's target is absolute or leaves the destination.
    #[error("archive entry {path:?} is a symlink to {target:?}, which leaves the destination")]
    SymlinkEscape { path: String, target: String },

    /// A symlink entry where none may be.
    #[error("archive entry {path:?} is a symlink; symlinks are not allowed here")]
    SymlinkRefused { path: String },

    /// A hard link entry (always refused).
    #[error("archive entry {path:?} is a hard link to {target:?}; hard links are not allowed")]
    HardLink { path: String, target: String },

    /// A device, fifo or other special entry.
    #[error("archive entry {path:?} has unsupported type {kind}")]
    UnsupportedEntry { path: String, kind: String },

    /// An entry path (or a symlink's target) uses a name reserved by the destination
    /// (`.smithers` in a workspace, at any depth).
    #[error("archive entry {path:?} uses the reserved name {reserved}")]
    Reserved { path: String, reserved: String },

    /// The same path appears twice, or a file where a directory was created.
    #[error("archive entry {path:?} collides with an earlier entry")]
    Duplicate { path: String },

    /// A limit was exceeded (`limit` names it: totalBytes, entries, pathBytes).
    #[error("archive exceeds the {limit} limit of {max}")]
    TooLarge { limit: &'static str, max: u64 },

    /// The stream is not a valid (compressed) tar.
    #[error("malformed archive: {reason}")]
    Malformed { reason: String },

    /// The operation was cancelled (the request went away or timed out).
    #[error("archive transfer cancelled")]
    Cancelled,

    /// Reading the stream failed (client went away, connection reset).
    #[error("reading the archive stream failed: {source}")]
    Stream {
        #[source]
        source: io::Error,
    },

    /// I/O on our own side (the destination, the tree being packed).
    #[error("{operation} {path}: {source}")]
    Io {
        operation: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },
}

impl ArchiveError {
    fn io(operation: &'static str, path: impl AsRef<Path>, source: io::Error) -> Self {
        ArchiveError::Io {
            operation,
            path: path.as_ref().display().to_string(),
            source,
        }
    }

    /// True when the archive (the client's input) is at fault, not our side.
    pub fn is_client_fault(&self) -> bool {
        !matches!(
            self,
            ArchiveError::Io { .. } | ArchiveError::Cancelled | ArchiveError::Stream { .. }
        )
    }
}

impl CodedError for ArchiveError {
    fn code(&self) -> ErrorCode {
        match self {
            ArchiveError::PathEscape { .. }
            | ArchiveError::SymlinkEscape { .. }
            | ArchiveError::SymlinkRefused { .. }
            | ArchiveError::HardLink { .. } => ErrorCode::ToolPathEscape,
            ArchiveError::UnsupportedEntry { .. }
            | ArchiveError::Reserved { .. }
            | ArchiveError::Duplicate { .. }
            | ArchiveError::TooLarge { .. }
            | ArchiveError::Malformed { .. }
            | ArchiveError::Stream { .. } => ErrorCode::InvalidInput,
            ArchiveError::Cancelled => ErrorCode::ProcessAborted,
            ArchiveError::Io { .. } => ErrorCode::Internal,
        }
    }

    fn details(&self) -> Value {
        match self {
            ArchiveError::PathEscape { path, .. }
            | ArchiveError::SymlinkRefused { path }
            | ArchiveError::Duplicate { path } => json!({ "path": path }),
            ArchiveError::SymlinkEscape { path, target }
            | ArchiveError::HardLink { path, target } => json!({ "path": path, "target": target }),
            ArchiveError::UnsupportedEntry { path, kind } => json!({ "path": path, "kind": kind }),
            ArchiveError::Reserved { path, reserved } => {
                json!({ "path": path, "reserved": reserved })
            }
            ArchiveError::TooLarge { limit, max } => json!({ "limit": limit, "max": max }),
            ArchiveError::Malformed { .. } | ArchiveError::Cancelled => Value::Null,
            ArchiveError::Stream { source } => json!({ "error": source.to_string() }),
            ArchiveError::Io {
                operation,
                path,
                source,
            } => json!({ "operation": operation, "path": path, "os_error": source.raw_os_error() }),
        }
    }
}

/// Bounds and rules for [`unpack`].
#[derive(Debug, Clone)]
pub struct UnpackLimits {
    /// Total bytes of regular file content.
    pub max_total_bytes: u64,
    /// Number of entries of any type.
    pub max_entries: u64,
    /// Length in bytes of one entry path.
    pub max_path_bytes: usize,
    /// Store symlink entries as data (never followed); when false they are refused.
    pub allow_symlinks: bool,
    /// Path components that may not appear at any depth, nor in a symlink's target (e.g.
    /// `.smithers`).
    pub reserved_names: Vec<String>,
}

impl UnpackLimits {
    /// Limits for a result bundle: the bundle format's 100 MiB, no symlinks, and room for
    /// 1000 patches + 1000 artifacts + the manifest, log and their directories.
    pub fn bundle() -> Self {
        UnpackLimits {
            max_total_bytes: 100 * 1024 * 1024,
            max_entries: 4096,
            max_path_bytes: 4096,
            allow_symlinks: false,
            reserved_names: Vec::new(),
        }
    }
}

/// What [`unpack`] wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnpackStats {
    pub entries: u64,
    pub bytes: u64,
}

/// Compression of a stream, recognised by its magic bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

/// Recognises gzip (`1f 8b`) and zstd (`28 b5 2f fd`); anything else is taken as plain tar,
/// which the tar parser then validates.
pub fn detect_compression(head: &[u8]) -> Compression {
    if head.starts_with(&[0x1f, 0x8b]) {
        Compression::Gzip
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Compression::Zstd
    } else {
        Compression::None
    }
}

/// Largest zstd window a decoder accepts (32 MiB): bounds the decoder's memory whatever the
/// frame header claims.
const ZSTD_WINDOW_LOG_MAX: u32 = 25;

/// Wraps `reader` in the decoder its magic bytes call for.
pub fn decompress<'a, R: Read + 'a>(reader: R) -> Result<Box<dyn Read + 'a>, ArchiveError> {
    let mut buffered = BufReader::with_capacity(64 * 1024, reader);
    let head = loop {
        match buffered.fill_buf() {
            Ok(h) => break h,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(ArchiveError::Stream { source: e }),
        }
    };
    Ok(match detect_compression(head) {
        Compression::None => Box::new(buffered),
        Compression::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(buffered)),
        Compression::Zstd => {
            let mut decoder = zstd::stream::read::Decoder::with_buffer(buffered).map_err(|e| {
                ArchiveError::Malformed {
                    reason: format!("zstd: {e}"),
                }
            })?;
            decoder
                .window_log_max(ZSTD_WINDOW_LOG_MAX)
                .map_err(|e| ArchiveError::Malformed {
                    reason: format!("zstd: {e}"),
                })?;
            Box::new(decoder)
        }
    })
}

/// Errors surfacing from the tar reader are either the transport failing (our wrapper marks
/// those) or the data being bad.
fn classify_read_error(e: io::Error) -> ArchiveError {
    if let Some(inner) = e.get_ref() {
        if let Some(over) = inner.downcast_ref::<DecodedBudgetExceeded>() {
            return ArchiveError::TooLarge {
                limit: "decodedBytes",
                max: over.0,
            };
        }
        if inner.is::<StreamFailure>() {
            return ArchiveError::Stream {
                source: io::Error::other(inner.to_string()),
            };
        }
    }
    ArchiveError::Malformed {
        reason: e.to_string(),
    }
}

/// Marker for an I/O error that came from the underlying transport, not from the decoder.
#[derive(Debug)]
struct StreamFailure(String);

impl std::fmt::Display for StreamFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StreamFailure {}

/// Marks read errors of the transport so they are reported as such (a dropped connection is
/// not a "malformed archive").
#[derive(Debug)]
pub struct MarkStreamErrors<R>(pub R);

impl<R: Read> Read for MarkStreamErrors<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0
            .read(buf)
            .map_err(|e| io::Error::new(e.kind(), StreamFailure(e.to_string())))
    }
}

/// Bytes of tar framing allowed per entry beyond its content: its header block and padding,
/// and extension headers (pax, GNU long names) carrying its path and link target.
fn framing_per_entry(limits: &UnpackLimits) -> u64 {
    16 * 1024 + 2 * limits.max_path_bytes as u64
}

/// The decoded stream exceeded what the archive's entries may take; carries the budget.
#[derive(Debug)]
struct DecodedBudgetExceeded(u64);

impl std::fmt::Display for DecodedBudgetExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the decompressed archive exceeds {} bytes", self.0)
    }
}

impl std::error::Error for DecodedBudgetExceeded {}

/// Counts the bytes the decompressor produces and fails the read past the allowance the
/// unpack loop keeps current (content limit plus framing for the entries seen so far, and a
/// few more). The content limit alone would not bound what the tar reader decodes and skips
/// (data of a directory entry, a huge pax header read into memory, bytes after the end), so a
/// compression bomb is cut off here whatever shape it has.
struct DecodedBudget<R> {
    inner: R,
    read: u64,
    allowed: std::rc::Rc<std::cell::Cell<u64>>,
}

impl<R: Read> Read for DecodedBudget<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let allowed = self.allowed.get();
        if self.read >= allowed {
            // One byte more than allowed tells "exactly at the budget" from "past it".
            let mut probe = [0u8; 1];
            if self.inner.read(&mut probe)? == 0 {
                return Ok(0);
            }
            return Err(io::Error::other(DecodedBudgetExceeded(allowed)));
        }
        let room = (allowed - self.read).min(buf.len() as u64) as usize;
        let n = self.inner.read(&mut buf[..room])?;
        self.read += n as u64;
        Ok(n)
    }
}

/// Unpacks a (possibly compressed) tar stream into `dest`, an existing empty directory, under
/// the rules of the module documentation. `cancelled` is polled between entries and chunks.
/// On error `dest` may hold part of the archive: the caller removes it (it is a staging
/// directory by contract).
pub fn unpack(
    reader: impl Read,
    dest: &Path,
    limits: &UnpackLimits,
    cancelled: &dyn Fn() -> bool,
) -> Result<UnpackStats, ArchiveError> {
    let beneath = Beneath::open(dest).map_err(|e| path_error(e, dest))?;
    let framing = framing_per_entry(limits);
    let budget = |entries: u64| {
        limits
            .max_total_bytes
            .saturating_add(entries.saturating_add(4).saturating_mul(framing))
    };
    let allowed = std::rc::Rc::new(std::cell::Cell::new(budget(0)));
    let decoded = DecodedBudget {
        inner: decompress(MarkStreamErrors(reader))?,
        read: 0,
        allowed: allowed.clone(),
    };
    let mut archive = tar::Archive::new(decoded);
    let mut stats = UnpackStats::default();
    let entries = archive.entries().map_err(classify_read_error)?;
    for entry in entries {
        if cancelled() {
            return Err(ArchiveError::Cancelled);
        }
        let mut entry = entry.map_err(classify_read_error)?;
        allowed.set(budget(stats.entries + 1));
        let kind = entry.header().entry_type();
        // Extension headers the tar reader did not fold into the next entry carry no file.
        if matches!(kind, tar::EntryType::XGlobalHeader) {
            continue;
        }
        stats.entries += 1;
        if stats.entries > limits.max_entries {
            return Err(ArchiveError::TooLarge {
                limit: "entries",
                max: limits.max_entries,
            });
        }
        let Some((rel, shown)) = entry_path(&entry, kind, limits)? else {
            continue;
        };
        let mode = entry.header().mode().unwrap_or(0o644) & 0o777;
        match kind {
            tar::EntryType::Directory => {
                beneath
                    .create_dir_all(&rel, 0o755)
                    .map_err(|e| path_error_entry(e, &shown, dest))?;
                // Keep the directory traversable and writable by us whatever the archive says,
                // so later entries can land in it.
                let _ = beneath.set_mode(&rel, (mode | 0o700) & 0o777);
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let size = entry.header().size().map_err(|e| ArchiveError::Malformed {
                    reason: e.to_string(),
                })?;
                if stats.bytes.saturating_add(size) > limits.max_total_bytes {
                    return Err(ArchiveError::TooLarge {
                        limit: "totalBytes",
                        max: limits.max_total_bytes,
                    });
                }
                if let Some(parent) = rel.parent().filter(|p| !p.as_os_str().is_empty()) {
                    beneath
                        .create_dir_all(parent, 0o755)
                        .map_err(|e| path_error_entry(e, &shown, dest))?;
                }
                let mut file = beneath.create_new(&rel, mode | 0o600).map_err(|e| {
                    if e.raw_os_error() == Some(17) {
                        ArchiveError::Duplicate {
                            path: shown.clone(),
                        }
                    } else {
                        path_error_entry(e, &shown, dest)
                    }
                })?;
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    if cancelled() {
                        return Err(ArchiveError::Cancelled);
                    }
                    let n = match entry.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(classify_read_error(e)),
                    };
                    stats.bytes += n as u64;
                    if stats.bytes > limits.max_total_bytes {
                        return Err(ArchiveError::TooLarge {
                            limit: "totalBytes",
                            max: limits.max_total_bytes,
                        });
                    }
                    file.write_all(&buf[..n])
                        .map_err(|e| ArchiveError::io("write", dest.join(&rel), e))?;
                }
                if mode & 0o600 != 0o600 {
                    let _ = beneath.set_mode(&rel, mode);
                }
            }
            tar::EntryType::Symlink => unpack_symlink(&entry, &beneath, &rel, shown, dest, limits)?,
            tar::EntryType::Link => {
                let target = entry
                    .link_name_bytes()
                    .map(|t| String::from_utf8_lossy(&t).into_owned())
                    .unwrap_or_default();
                return Err(ArchiveError::HardLink {
                    path: shown,
                    target,
                });
            }
            other => {
                return Err(ArchiveError::UnsupportedEntry {
                    path: shown,
                    kind: entry_kind_name(other).to_string(),
                })
            }
        }
    }
    Ok(stats)
}

/// The entry's path beneath the destination and as shown in errors, checked: its length, a
/// plain relative path, nothing reserved (nor a symlink's target). None: a directory entry
/// naming the destination itself (`./` or an empty name), which is skipped.
fn entry_path<R: Read>(
    entry: &tar::Entry<'_, R>,
    kind: tar::EntryType,
    limits: &UnpackLimits,
) -> Result<Option<(PathBuf, String)>, ArchiveError> {
    let raw_path = entry.path_bytes().into_owned();
    let shown = String::from_utf8_lossy(&raw_path).into_owned();
    if raw_path.len() > limits.max_path_bytes {
        return Err(ArchiveError::TooLarge {
            limit: "pathBytes",
            max: limits.max_path_bytes as u64,
        });
    }
    let Some(rel) = plain_relative(&raw_path, &shown)? else {
        // `./` or an empty name: the destination itself.
        if kind.is_dir() {
            return Ok(None);
        }
        return Err(ArchiveError::PathEscape {
            path: shown,
            reason: "an entry that is not a directory names the destination itself".into(),
        });
    };
    reject_reserved(&rel, &shown, limits)?;
    if kind == tar::EntryType::Symlink {
        if let Some(target) = entry.link_name_bytes() {
            reject_reserved(Path::new(OsStr::from_bytes(&target)), &shown, limits)?;
        }
    }
    Ok(Some((rel, shown)))
}

/// Makes a symlink entry at `rel`, when symlinks are allowed and its target stays inside the
/// destination.
fn unpack_symlink<R: Read>(
    entry: &tar::Entry<'_, R>,
    beneath: &Beneath,
    rel: &Path,
    shown: String,
    dest: &Path,
    limits: &UnpackLimits,
) -> Result<(), ArchiveError> {
    let target = entry
        .link_name_bytes()
        .map(|t| t.into_owned())
        .unwrap_or_default();
    let target_shown = String::from_utf8_lossy(&target).into_owned();
    if !limits.allow_symlinks {
        return Err(ArchiveError::SymlinkRefused { path: shown });
    }
    if !symlink_stays_inside(rel, &target) {
        return Err(ArchiveError::SymlinkEscape {
            path: shown,
            target: target_shown,
        });
    }
    if let Some(parent) = rel.parent().filter(|p| !p.as_os_str().is_empty()) {
        beneath
            .create_dir_all(parent, 0o755)
            .map_err(|e| path_error_entry(e, &shown, dest))?;
    }
    beneath
        .symlink(Path::new(OsStr::from_bytes(&target)), rel)
        .map_err(|e| {
            if e.raw_os_error() == Some(17) {
                ArchiveError::Duplicate {
                    path: shown.clone(),
                }
            } else {
                path_error_entry(e, &shown, dest)
            }
        })?;
    Ok(())
}

/// Refuses a path with a reserved name as any of its components.
fn reject_reserved(path: &Path, shown: &str, limits: &UnpackLimits) -> Result<(), ArchiveError> {
    for component in path.components() {
        if let Component::Normal(c) = component {
            if let Some(r) = limits
                .reserved_names
                .iter()
                .find(|r| OsStr::new(r.as_str()) == c)
            {
                return Err(ArchiveError::Reserved {
                    path: shown.to_string(),
                    reserved: r.clone(),
                });
            }
        }
    }
    Ok(())
}

fn entry_kind_name(kind: tar::EntryType) -> &'static str {
    match kind {
        tar::EntryType::Char => "character device",
        tar::EntryType::Block => "block device",
        tar::EntryType::Fifo => "fifo",
        tar::EntryType::GNUSparse => "sparse file",
        tar::EntryType::GNULongName | tar::EntryType::GNULongLink => "dangling long-name header",
        tar::EntryType::XHeader => "dangling pax header",
        _ => "unknown",
    }
}

/// `Some(path)` of `Normal` components only; `None` for the destination itself; an error for
/// absolute paths, `..`, or NUL.
fn plain_relative(raw: &[u8], shown: &str) -> Result<Option<PathBuf>, ArchiveError> {
    if raw.contains(&0) {
        return Err(ArchiveError::PathEscape {
            path: shown.to_string(),
            reason: "the path contains a NUL byte".into(),
        });
    }
    let path = Path::new(OsStr::from_bytes(raw));
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(c) => out.push(c),
            Component::CurDir => {}
            Component::ParentDir => {
                return Err(ArchiveError::PathEscape {
                    path: shown.to_string(),
                    reason: "the path contains '..'".into(),
                })
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(ArchiveError::PathEscape {
                    path: shown.to_string(),
                    reason: "the path is absolute".into(),
                })
            }
        }
    }
    Ok(if out.as_os_str().is_empty() {
        None
    } else {
        Some(out)
    })
}

/// A symlink at `link` (relative to the root) with content `target` stays inside the root when
/// the target is relative and, resolved lexically from the link's directory, never climbs above
/// the root. (It is never followed by us anyway; this keeps the tree meaningful for the step.)
fn symlink_stays_inside(link: &Path, target: &[u8]) -> bool {
    if target.is_empty() || target.contains(&0) {
        return false;
    }
    let target = Path::new(OsStr::from_bytes(target));
    let mut depth: i64 = link.components().count() as i64 - 1;
    for component in target.components() {
        match component {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    true
}

fn path_error(e: PathError, dest: &Path) -> ArchiveError {
    ArchiveError::io("open destination", dest, io::Error::other(e.to_string()))
}

fn path_error_entry(e: PathError, shown: &str, dest: &Path) -> ArchiveError {
    match e {
        PathError::Escape { .. } | PathError::EscapeViaSymlink { .. } => ArchiveError::PathEscape {
            path: shown.to_string(),
            reason: "a parent of the entry is a symlink or not a directory".into(),
        },
        PathError::Invalid { message, .. } => ArchiveError::PathEscape {
            path: shown.to_string(),
            reason: message,
        },
        other => {
            // ENOTDIR / EEXIST on a parent: a file where a directory is needed.
            match other.raw_os_error() {
                Some(20) | Some(17) => ArchiveError::Duplicate {
                    path: shown.to_string(),
                },
                _ => ArchiveError::io(
                    "unpack",
                    dest.join(shown),
                    io::Error::other(other.to_string()),
                ),
            }
        }
    }
}

/// How [`pack`] treats what it finds.
#[derive(Debug, Clone, Default)]
pub struct PackOptions {
    /// Top-level names left out (e.g. `.git`).
    pub skip_top: Vec<String>,
    /// Names left out at any depth (`.smithers`: a runtime's state, never project content,
    /// and refused by the server's unpack wherever it appears).
    pub skip_anywhere: Vec<String>,
    /// Refuse symlinks instead of storing them as links (bundles may hold none).
    pub refuse_symlinks: bool,
    /// Refuse a tree whose regular files hold more bytes than this (`None`: no cap).
    pub max_total_bytes: Option<u64>,
}

/// What [`pack`] wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PackStats {
    pub entries: u64,
    pub bytes: u64,
    /// Sockets, fifos and devices found and left out (they are not data).
    pub skipped_special: Vec<String>,
    /// Entries left out by [`PackOptions::skip_anywhere`] below the top level.
    pub skipped_names: Vec<String>,
}

/// Writes `root` as a tar stream into `out` (sorted, so the same tree gives the same archive),
/// never following a symlink. Returns the writer so the caller can finish a compressor.
///
/// Every entry is examined and opened through [`Beneath`] (no symlink at any component, not
/// even one swapped in after the directory was listed), so what is read is always a file of
/// the tree, never one a link in it names; its size, mode and time come from the opened file
/// itself. Listing a directory goes by path, which can only yield names: each is then opened
/// beneath the root again.
pub fn pack<W: Write>(
    root: &Path,
    out: W,
    options: &PackOptions,
) -> Result<(W, PackStats), ArchiveError> {
    let beneath = Beneath::open(root).map_err(|e| path_error(e, root))?;
    let mut builder = tar::Builder::new(out);
    builder.follow_symlinks(false);
    let mut stats = PackStats::default();
    let mut stack: Vec<PathBuf> = vec![PathBuf::new()];
    while let Some(rel_dir) = stack.pop() {
        let abs_dir = root.join(&rel_dir);
        let mut names: Vec<_> = std::fs::read_dir(&abs_dir)
            .map_err(|e| ArchiveError::io("read directory", &abs_dir, e))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(|e| ArchiveError::io("read directory", &abs_dir, e))?;
        names.sort();
        let mut subdirs = Vec::new();
        for name in names {
            let top = rel_dir.as_os_str().is_empty();
            if top && options.skip_top.iter().any(|s| OsStr::new(s) == name) {
                continue;
            }
            let rel = rel_dir.join(&name);
            if options.skip_anywhere.iter().any(|s| OsStr::new(s) == name) {
                if !top {
                    stats.skipped_names.push(rel.display().to_string());
                }
                continue;
            }
            if pack_entry(&beneath, &mut builder, &rel, options, &mut stats)? {
                subdirs.push(rel);
            }
        }
        // Depth-first in sorted order: push in reverse so the first subdirectory comes next.
        stack.extend(subdirs.into_iter().rev());
    }
    let out = builder
        .into_inner()
        .map_err(|e| ArchiveError::io("finish archive", root, e))?;
    Ok((out, stats))
}

/// Appends one entry; true when it is a directory to descend into.
fn pack_entry<W: Write>(
    beneath: &Beneath,
    builder: &mut tar::Builder<W>,
    rel: &Path,
    options: &PackOptions,
    stats: &mut PackStats,
) -> Result<bool, ArchiveError> {
    let abs = beneath.root_path().join(rel);
    let meta = beneath
        .metadata(rel)
        .map_err(|e| path_error(e, &abs))?
        .ok_or_else(|| ArchiveError::io("stat", &abs, io::Error::from(io::ErrorKind::NotFound)))?;
    let mut header = tar::Header::new_gnu();
    header.set_mode(meta.mode & 0o777);
    let mut is_dir = false;
    match meta.kind {
        EntryKind::Dir => {
            header.set_entry_type(tar::EntryType::Directory);
            header.set_size(0);
            header.set_mtime(dir_mtime(&abs));
            builder
                .append_data(&mut header, rel, io::empty())
                .map_err(|e| ArchiveError::io("write archive entry", &abs, e))?;
            is_dir = true;
        }
        EntryKind::File => {
            let file = beneath.open_read(rel).map_err(|e| path_error(e, &abs))?;
            let fmeta = file
                .metadata()
                .map_err(|e| ArchiveError::io("stat", &abs, e))?;
            if !fmeta.is_file() {
                // Swapped for something else since it was listed: not data.
                stats.skipped_special.push(rel.display().to_string());
                return Ok(false);
            }
            let size = fmeta.len();
            if let Some(max) = options.max_total_bytes {
                if stats.bytes.saturating_add(size) > max {
                    return Err(ArchiveError::TooLarge {
                        limit: "totalBytes",
                        max,
                    });
                }
            }
            header.set_mode(fmeta.mode() & 0o777);
            header.set_mtime(fmeta.mtime().max(0) as u64);
            header.set_entry_type(tar::EntryType::Regular);
            header.set_size(size);
            builder
                .append_data(&mut header, rel, ExactReader::new(file, size, &abs))
                .map_err(|e| ArchiveError::io("write archive entry", &abs, e))?;
            stats.bytes += size;
        }
        EntryKind::Symlink => {
            if options.refuse_symlinks {
                return Err(ArchiveError::SymlinkRefused {
                    path: rel.display().to_string(),
                });
            }
            let target = beneath.read_link(rel).map_err(|e| path_error(e, &abs))?;
            header.set_entry_type(tar::EntryType::Symlink);
            header.set_size(0);
            header.set_mtime(0);
            builder
                .append_link(&mut header, rel, &target)
                .map_err(|e| ArchiveError::io("write archive entry", &abs, e))?;
        }
        EntryKind::Other => {
            stats.skipped_special.push(rel.display().to_string());
            return Ok(false);
        }
    }
    stats.entries += 1;
    Ok(is_dir)
}

/// A directory's modification time (its metadata only; nothing is read through it).
fn dir_mtime(abs: &Path) -> u64 {
    std::fs::symlink_metadata(abs)
        .map(|m| m.mtime().max(0) as u64)
        .unwrap_or(0)
}

/// Yields exactly `size` bytes of a file whose header already promised `size`: a file that
/// shrank while being packed is an error (the archive would be corrupt), one that grew is cut
/// at the size it had when stat'ed.
struct ExactReader {
    inner: io::Take<File>,
    remaining: u64,
    path: PathBuf,
}

impl ExactReader {
    fn new(file: File, size: u64, path: &Path) -> Self {
        ExactReader {
            inner: file.take(size),
            remaining: size,
            path: path.to_path_buf(),
        }
    }
}

impl Read for ExactReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n == 0 && self.remaining > 0 && !buf.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{} shrank while being archived", self.path.display()),
            ));
        }
        self.remaining -= n as u64;
        Ok(n)
    }
}

/// A blocking `Write` that sends its bytes, in chunks, to an async body stream. Used from a
/// blocking thread that packs an archive while the HTTP layer streams it out.
#[derive(Debug)]
pub struct ChannelWriter {
    tx: tokio::sync::mpsc::Sender<Result<Bytes, io::Error>>,
    buf: Vec<u8>,
    /// Bytes handed to the channel so far.
    pub sent: u64,
}

const CHUNK: usize = 64 * 1024;

impl ChannelWriter {
    pub fn new(tx: tokio::sync::mpsc::Sender<Result<Bytes, io::Error>>) -> Self {
        ChannelWriter {
            tx,
            buf: Vec::with_capacity(CHUNK),
            sent: 0,
        }
    }

    fn send_buf(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.sent += chunk.len() as u64;
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the receiver went away"))
    }

    /// Sends an error down the stream so the receiving side fails instead of seeing a clean
    /// (truncated) end.
    pub fn fail(self, error: io::Error) {
        let _ = self.tx.blocking_send(Err(error));
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.send_buf()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send_buf()
    }
}

/// Counts bytes read through it (the compressed size received).
#[derive(Debug)]
pub struct CountingReader<R> {
    inner: R,
    count: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl<R> CountingReader<R> {
    pub fn new(inner: R, count: std::sync::Arc<std::sync::atomic::AtomicU64>) -> Self {
        CountingReader { inner, count }
    }
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(n)
    }
}

/// Sum of the sizes of regular files under `root` (not following links).
pub fn tree_size(root: &Path) -> io::Result<u64> {
    let mut total = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let meta = std::fs::symlink_metadata(entry.path())?;
            if meta.is_dir() {
                stack.push(entry.path());
            } else if meta.is_file() {
                total += meta.len();
            }
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_with(f: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        f(&mut b);
        b.into_inner().unwrap()
    }

    fn file(b: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8]) {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        // set_path refuses '..'; write the raw name to build hostile archives.
        let name = &mut h.as_old_mut().name;
        name[..path.len()].copy_from_slice(path.as_bytes());
        h.set_cksum();
        b.append(&h, data).unwrap();
    }

    fn unpack_bytes(
        bytes: &[u8],
        limits: &UnpackLimits,
    ) -> (tempfile::TempDir, Result<UnpackStats, ArchiveError>) {
        let dir = tempfile::tempdir().unwrap();
        let r = unpack(bytes, dir.path(), limits, &|| false);
        (dir, r)
    }

    fn ws_limits() -> UnpackLimits {
        UnpackLimits {
            max_total_bytes: 1 << 20,
            max_entries: 100,
            max_path_bytes: 4096,
            allow_symlinks: true,
            reserved_names: vec![".smithers".into()],
        }
    }

    /// A gzip of a tar whose one directory entry claims `size` bytes of zeros: the tar reader
    /// skips a directory's data, so only the decoded-bytes budget stops it.
    fn gz_directory_with_data(size: u64) -> Vec<u8> {
        let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        let mut b = tar::Builder::new(gz);
        let mut h = tar::Header::new_gnu();
        h.set_path("d/").unwrap();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o755);
        h.set_size(size);
        h.set_cksum();
        b.append(&h, io::repeat(0).take(size)).unwrap();
        b.into_inner().unwrap().finish().unwrap()
    }

    #[test]
    fn decoded_bytes_are_capped_whatever_the_entries_claim() {
        let limits = ws_limits();
        let bomb = gz_directory_with_data(16 << 20);
        assert!(bomb.len() < 64 * 1024, "a small upload: {}", bomb.len());
        let (_dir, r) = unpack_bytes(&bomb, &limits);
        match r {
            Err(ArchiveError::TooLarge { limit, max }) => {
                assert_eq!(limit, "decodedBytes");
                assert!(max < 2 << 20, "cut off near the content limit: {max}");
            }
            other => panic!("a 16 MiB directory body must be refused, got {other:?}"),
        }
        // Within the budget the same shape still unpacks (the framing allowance is real).
        let (_dir, r) = unpack_bytes(&gz_directory_with_data(4096), &limits);
        r.unwrap();
    }

    #[test]
    fn plain_files_and_dirs() {
        let t = tar_with(|b| {
            file(b, "./a/b.txt", b"hello");
            file(b, "c", b"x");
        });
        let (dir, r) = unpack_bytes(&t, &ws_limits());
        let s = r.unwrap();
        assert_eq!(s.bytes, 6);
        assert_eq!(std::fs::read(dir.path().join("a/b.txt")).unwrap(), b"hello");
    }

    #[test]
    fn hostile_paths_refused() {
        for p in ["../x", "a/../../x", "/etc/x"] {
            let t = tar_with(|b| file(b, p, b"x"));
            let (_d, r) = unpack_bytes(&t, &ws_limits());
            assert!(
                matches!(r, Err(ArchiveError::PathEscape { .. })),
                "{p}: {r:?}"
            );
        }
        let t = tar_with(|b| file(b, ".smithers/db", b"x"));
        assert!(matches!(
            unpack_bytes(&t, &ws_limits()).1,
            Err(ArchiveError::Reserved { .. })
        ));
    }

    /// A `.smithers` below the top (a planted database recovery would trust) and a link
    /// into one are refused like the top-level one.
    #[test]
    fn reserved_names_are_refused_at_any_depth_and_in_link_targets() {
        for p in [
            "sub/.smithers/sandbox.db",
            "a/b/.smithers",
            "./x/.smithers/y",
        ] {
            let t = tar_with(|b| file(b, p, b"x"));
            let (d, r) = unpack_bytes(&t, &ws_limits());
            assert!(
                matches!(r, Err(ArchiveError::Reserved { .. })),
                "{p}: {r:?}"
            );
            assert!(!d.path().join("sub/.smithers").exists());
        }
        let t = tar_with(|b| {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            b.append_link(&mut h, "state", ".smithers/sandboxes")
                .unwrap();
        });
        assert!(matches!(
            unpack_bytes(&t, &ws_limits()).1,
            Err(ArchiveError::Reserved { .. })
        ));
        // Similar names are not reserved.
        let t = tar_with(|b| file(b, "sub/.smithers-notes/x", b"x"));
        assert!(unpack_bytes(&t, &ws_limits()).1.is_ok());
    }

    #[test]
    fn symlink_rules() {
        let link = |name: &str, target: &str| {
            tar_with(|b| {
                let mut h = tar::Header::new_gnu();
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_size(0);
                b.append_link(&mut h, name, target).unwrap();
                file(b, "a/x", b"1");
            })
        };
        assert!(symlink_stays_inside(Path::new("a/l"), b"../b"));
        assert!(!symlink_stays_inside(Path::new("a/l"), b"../../b"));
        assert!(!symlink_stays_inside(Path::new("l"), b"/etc/passwd"));
        let (d, r) = unpack_bytes(&link("l", "a/x"), &ws_limits());
        r.unwrap();
        assert_eq!(
            std::fs::read_link(d.path().join("l")).unwrap(),
            Path::new("a/x")
        );
        let (_d, r) = unpack_bytes(&link("l", "/etc/passwd"), &ws_limits());
        assert!(
            matches!(r, Err(ArchiveError::SymlinkEscape { .. })),
            "{r:?}"
        );
        // A link named like a directory, then a file written through it.
        let (_d, r) = unpack_bytes(&link("a", "."), &ws_limits());
        assert!(matches!(r, Err(ArchiveError::PathEscape { .. })), "{r:?}");
        let (_d, r) = unpack_bytes(&link("l", "a/x"), &UnpackLimits::bundle());
        assert!(
            matches!(r, Err(ArchiveError::SymlinkRefused { .. })),
            "{r:?}"
        );
    }

    #[test]
    fn limits() {
        let t = tar_with(|b| file(b, "big", &vec![0u8; 2 << 20]));
        assert!(matches!(
            unpack_bytes(&t, &ws_limits()).1,
            Err(ArchiveError::TooLarge {
                limit: "totalBytes",
                ..
            })
        ));
        let t = tar_with(|b| {
            for i in 0..101 {
                file(b, &format!("f{i}"), b"");
            }
        });
        assert!(matches!(
            unpack_bytes(&t, &ws_limits()).1,
            Err(ArchiveError::TooLarge {
                limit: "entries",
                ..
            })
        ));
    }

    #[test]
    fn pack_then_unpack_round_trip_compressed() {
        let src = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(src.path().join("d/e")).unwrap();
        std::fs::write(src.path().join("d/e/f.txt"), b"content").unwrap();
        std::fs::create_dir_all(src.path().join(".smithers")).unwrap();
        std::fs::write(src.path().join(".smithers/db"), b"secret").unwrap();
        std::os::unix::fs::symlink("d/e/f.txt", src.path().join("link")).unwrap();
        let enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        let (enc, stats) = pack(
            src.path(),
            enc,
            &PackOptions {
                skip_top: vec![".smithers".into()],
                ..PackOptions::default()
            },
        )
        .unwrap();
        assert_eq!(stats.bytes, 7);
        let bytes = enc.finish().unwrap();
        assert_eq!(detect_compression(&bytes), Compression::Zstd);
        let (d, r) = unpack_bytes(&bytes, &ws_limits());
        r.unwrap();
        assert_eq!(std::fs::read(d.path().join("link")).unwrap(), b"content");
        assert!(!d.path().join(".smithers").exists());
    }

    /// Pack reads only files of the tree: a link (to a host file or directory) is stored as a
    /// link or refused, never read through; names reserved anywhere are left out and named;
    /// the byte cap holds.
    #[test]
    fn pack_reads_nothing_a_link_names_and_keeps_to_its_limits() {
        let host = tempfile::tempdir().unwrap();
        std::fs::write(host.path().join("secret"), b"host secret").unwrap();
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("a.txt"), b"0123456789").unwrap();
        std::os::unix::fs::symlink(host.path().join("secret"), d.path().join("f")).unwrap();
        std::os::unix::fs::symlink(host.path(), d.path().join("dir")).unwrap();
        std::fs::create_dir_all(d.path().join("sub/.smithers")).unwrap();
        std::fs::write(d.path().join("sub/.smithers/sandbox.db"), b"db").unwrap();
        let (out, stats) = pack(
            d.path(),
            Vec::new(),
            &PackOptions {
                skip_anywhere: vec![".smithers".into()],
                ..PackOptions::default()
            },
        )
        .unwrap();
        assert!(
            !out.windows(11).any(|w| w == b"host secret"),
            "a linked host file was read into the archive"
        );
        assert_eq!(stats.bytes, 10);
        assert_eq!(stats.skipped_names, vec!["sub/.smithers".to_string()]);
        let refused = pack(
            d.path(),
            Vec::new(),
            &PackOptions {
                refuse_symlinks: true,
                ..PackOptions::default()
            },
        );
        assert!(matches!(refused, Err(ArchiveError::SymlinkRefused { .. })));
        std::fs::remove_file(d.path().join("f")).unwrap();
        std::fs::remove_file(d.path().join("dir")).unwrap();
        let capped = pack(
            d.path(),
            Vec::new(),
            &PackOptions {
                max_total_bytes: Some(5),
                ..PackOptions::default()
            },
        );
        assert!(matches!(capped, Err(ArchiveError::TooLarge { .. })));
    }
}
