//! Reading an overlayfs upper layer: whiteouts, opaque directories, and the xattrs that mean
//! "this layer uses a feature we cannot interpret" (redirect_dir, metacopy, xattr whiteouts).

use std::fs::Metadata;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::error::PatchError;

/// Both xattr namespaces overlayfs uses: `trusted.` as real root, `user.` with `-o userxattr`
/// (the only form available inside a user namespace).
const XATTR_PREFIXES: [&str; 2] = ["trusted.overlay.", "user.overlay."];

/// Overlay xattrs whose presence changes the meaning of an upper entry in ways a plain
/// "upper entry = merged entry" reading gets wrong: refuse rather than emit wrong patches.
const UNSUPPORTED: [&str; 3] = ["redirect", "metacopy", "whiteout"];

/// `lstat`, with "does not exist" (and "a parent is not a directory") as `None`.
pub(crate) fn lstat(path: &Path) -> Result<Option<Metadata>, PatchError> {
    match std::fs::symlink_metadata(path) {
        Ok(md) => Ok(Some(md)),
        Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(20) => Ok(None),
        Err(source) => Err(PatchError::ReadLayer {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// A whiteout is a character device with device number 0:0.
pub(crate) fn is_whiteout(md: &Metadata) -> bool {
    md.file_type().is_char_device() && md.rdev() == 0
}

/// Lists the entry's xattrs (without following symlinks). Filesystems without xattr support
/// simply have none.
fn list_xattrs(path: &Path) -> Result<Vec<String>, PatchError> {
    let mut buf = vec![0u8; 4096];
    loop {
        match rustix::fs::llistxattr(path, &mut buf[..]) {
            Ok(n) => {
                return Ok(buf[..n]
                    .split(|b| *b == 0)
                    .filter(|s| !s.is_empty())
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                    .collect())
            }
            Err(rustix::io::Errno::RANGE) if buf.len() < (1 << 20) => {
                let new_len = buf.len() * 4;
                buf.resize(new_len, 0);
            }
            Err(rustix::io::Errno::NOTSUP) => return Ok(Vec::new()),
            Err(e) => {
                return Err(PatchError::ReadLayer {
                    path: path.to_path_buf(),
                    source: e.into(),
                })
            }
        }
    }
}

fn get_xattr(path: &Path, name: &str) -> Result<Vec<u8>, PatchError> {
    let mut buf = vec![0u8; 256];
    match rustix::fs::lgetxattr(path, name, &mut buf[..]) {
        Ok(n) => {
            buf.truncate(n);
            Ok(buf)
        }
        Err(e) => Err(PatchError::ReadLayer {
            path: path.to_path_buf(),
            source: e.into(),
        }),
    }
}

/// Checks an upper-layer entry's overlay xattrs. Returns whether it is an opaque directory;
/// fails on redirect/metacopy/xattr-whiteout markers.
pub(crate) fn check_upper_entry(path: &Path) -> Result<bool, PatchError> {
    let mut opaque = false;
    for name in list_xattrs(path)? {
        let Some(key) = XATTR_PREFIXES.iter().find_map(|p| name.strip_prefix(p)) else {
            continue;
        };
        if UNSUPPORTED.contains(&key) {
            return Err(PatchError::UnsupportedOverlayFeature {
                path: path.to_path_buf(),
                xattr: name,
            });
        }
        // "y" = opaque. ("x" marks a directory holding xattr whiteouts, a lower-layer-only
        // composefs feature; any such whiteout inside is refused above when reached.)
        if key == "opaque" && get_xattr(path, &name)? == b"y" {
            opaque = true;
        }
    }
    Ok(opaque)
}

/// Where the merged view's regular file `rel` lives on disk (upper or lower), resolved without
/// scanning: component by component, honouring whiteouts and opaque directories. Symlinked
/// components and symlinked files are not followed (git refuses symlinked `.gitignore` too).
pub(crate) fn merged_regular_file(
    lower: &Path,
    upper: &Path,
    rel: &str,
) -> Result<Option<PathBuf>, PatchError> {
    let comps: Vec<&str> = rel.split('/').collect();
    let (file, dirs) = comps.split_last().expect("split never yields nothing");
    let mut up: Option<PathBuf> = Some(upper.to_path_buf());
    let mut low: Option<PathBuf> = Some(lower.to_path_buf());
    for d in dirs {
        if let Some(u) = up.take() {
            let p = u.join(d);
            match lstat(&p)? {
                Some(md) if is_whiteout(&md) => return Ok(None),
                Some(md) if md.is_dir() => {
                    if check_upper_entry(&p)? {
                        low = None;
                    }
                    up = Some(p);
                }
                Some(_) => return Ok(None),
                None => {}
            }
        }
        if let Some(l) = low.take() {
            let p = l.join(d);
            if let Some(md) = lstat(&p)? {
                if md.is_dir() {
                    low = Some(p);
                }
            }
        }
        if up.is_none() && low.is_none() {
            return Ok(None);
        }
    }
    if let Some(u) = &up {
        let p = u.join(file);
        if let Some(md) = lstat(&p)? {
            return Ok(if md.is_file() { Some(p) } else { None });
        }
    }
    if let Some(l) = &low {
        let p = l.join(file);
        if let Some(md) = lstat(&p)? {
            return Ok(if md.is_file() { Some(p) } else { None });
        }
    }
    Ok(None)
}
