//! Change detection for a full copy: the project (lower, never written) against a copy of it
//! that the step wrote — the workspace of a runtime that could not mount an overlay. The
//! result is the same [`ChangeSet`] that [`detect_changes`](crate::detect_changes) gives for an
//! overlay with the same post-step tree: same changes, same rendering, same `.gitignore` and
//! exclusion rules.
//!
//! Both trees are walked. Entries are compared without following any symlink: type first,
//! then for regular files the executable bit and the size, and only when the sizes agree the
//! contents, streamed in blocks (an unchanged file is never held in memory). Changed files
//! are then loaded exactly as the overlay walk loads its copied-up files.
//!
//! Differences from the overlay walk, all about what is *reported*, never about patches:
//! - an ignored (or excluded) directory present on both sides is not walked and not reported
//!   (it may be large: `target/`, `node_modules/`); one the step created is reported;
//! - a file the step rewrote with identical content is not reported as ignored (the overlay
//!   cannot tell it from a real write, the comparison can).

use std::ffi::OsString;
use std::fs::Metadata;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::detect::{
    birth_time, finish, is_protected_name, join_rel, node_of, read_dir_sorted, rules_key,
    Candidate, ChangeSet, DetectOptions, IgnoreReason, Node, StaleCheck, Walker,
};
use crate::error::PatchError;
use crate::gitignore::IgnoreRules;
use crate::manifest::{CopyIdentity, CopyManifest};
use crate::overlay::lstat;

/// Block size of the streamed content comparison.
const BLOCK: usize = 64 * 1024;

const SPECIAL: &str = "special file (fifo, socket or device) is not representable in a git patch";

/// Turns (project, full copy of it written by the step) into the list of changes the step
/// made: the same [`ChangeSet`] as [`detect_changes`](crate::detect_changes) for an overlay,
/// computed by comparing the two trees (see the module documentation).
///
/// `lower` is only read. [`ChangeSet::stale_base`] lists every changed path whose lower entry
/// changed (ctime) at or after the copy root was created (its birth time): the host edited it
/// while the step ran, so the patch's base is not what the step saw.
pub fn detect_changes_by_compare(
    lower: &Path,
    copy: &Path,
    opts: &DetectOptions,
) -> Result<ChangeSet, PatchError> {
    crate::detect::require_dirs(&[lower, copy], "tree root is not a directory")?;
    let since = birth_time(copy);
    let mut w = Walker {
        upper_root: copy,
        opts,
        rules: IgnoreRules::for_tree(lower, copy, opts.respect_gitignore),
        cands: Default::default(),
        out: ChangeSet::default(),
    };
    w.walk_compare("", Some(lower.to_path_buf()))?;
    w.note_index_problem();
    let mut cands = std::mem::take(&mut w.cands);
    if let Some(manifest) = &opts.copy_manifest {
        w.out
            .stale_base
            .extend(drop_host_only(&mut cands, manifest));
    }
    let mut out = finish(cands, w.out, opts, StaleCheck::Since(since))?;
    out.stale_base.sort();
    out.stale_base.dedup();
    Ok(out)
}

/// Takes out of `cands` the differences the host made while the step ran, so that accept
/// never undoes them, by the copy's manifest of what it held when complete; returns the
/// paths the host deleted while the step changed them (their base is lost).
///
/// - A copy entry with the inode and ctime the copy gave it was not touched by the step (any
///   write, chmod, rename or link changes its ctime): a difference there is the host's.
/// - A project path the copy never had, gone from the copy, was made by the host after the
///   copy (or moved there by it): not a deletion by the step.
/// - A copy entry at a path the copy had, changed by the step, whose project entry is gone:
///   the host deleted a file the step changed; a path the copy never had that both the host
///   and the step made: the host's file would be overwritten. Both are host-changed.
///
/// A path the step renamed or moved (its inode now at another path) is the step's change on
/// both sides: a deletion where it was, an addition where it is.
fn drop_host_only(
    cands: &mut std::collections::BTreeMap<String, Candidate>,
    manifest: &CopyManifest,
) -> Vec<String> {
    let mut host_deleted = Vec::new();
    cands.retain(|path, c| {
        let recorded = manifest.get(path);
        if let Some(n) = c.new.as_ref().map(node_path) {
            if recorded.is_some() && recorded == identity(n) {
                return false;
            }
        }
        match (&c.old, &c.new) {
            (Some(_), None) => recorded.is_some(),
            // The host deleted a file the copy had and the step changed; or both made a path
            // the copy never had: either way the step's side has no base the host still has.
            (None, Some(_)) | (Some(_), Some(_)) if recorded.is_some() == c.old.is_none() => {
                host_deleted.push(path.clone());
                true
            }
            _ => true,
        }
    });
    host_deleted
}

fn node_path(n: &Node) -> &Path {
    match n {
        Node::File { path, .. } | Node::Symlink { path } => path,
    }
}

/// The inode and ctime of `path` (not followed).
fn identity(path: &Path) -> Option<CopyIdentity> {
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::symlink_metadata(path).ok()?;
    Some(CopyIdentity {
        ino: md.ino(),
        ctime: (md.ctime(), md.ctime_nsec() as u32),
    })
}

/// One side of an entry: its path and lstat.
type Side = Option<(PathBuf, Metadata)>;

fn side(path: Option<PathBuf>) -> Result<Side, PatchError> {
    match path {
        Some(p) => Ok(lstat(&p)?.map(|md| (p, md))),
        None => Ok(None),
    }
}

fn read_err(path: &Path) -> impl FnOnce(std::io::Error) -> PatchError + '_ {
    move |source| PatchError::ReadLayer {
        path: path.to_path_buf(),
        source,
    }
}

fn open_nofollow(path: &Path) -> Result<std::fs::File, PatchError> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .map_err(read_err(path))
}

/// Reads until `buf` is full or the file ends; the number of bytes read.
fn fill(f: &mut std::fs::File, buf: &mut [u8], path: &Path) -> Result<usize, PatchError> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(read_err(path)(e)),
        }
    }
    Ok(n)
}

/// Whether two regular files hold the same bytes, read block by block.
fn same_bytes(a: &Path, b: &Path) -> Result<bool, PatchError> {
    let (mut fa, mut fb) = (open_nofollow(a)?, open_nofollow(b)?);
    let (mut ba, mut bb) = (vec![0u8; BLOCK], vec![0u8; BLOCK]);
    loop {
        let na = fill(&mut fa, &mut ba, a)?;
        let nb = fill(&mut fb, &mut bb, b)?;
        if na != nb || ba[..na] != bb[..nb] {
            return Ok(false);
        }
        if na < BLOCK {
            return Ok(true);
        }
    }
}

/// Whether the lower and copy entries are the same as far as a git patch can tell: same
/// kind; for files the same executable bit, size and bytes; for symlinks the same target;
/// for special files the same file type.
fn same_entry(lower: &(PathBuf, Metadata), copy: &(PathBuf, Metadata)) -> Result<bool, PatchError> {
    let (lp, lmd) = lower;
    let (cp, cmd) = copy;
    let (lt, ct) = (lmd.file_type(), cmd.file_type());
    if lt.is_symlink() || ct.is_symlink() {
        if !(lt.is_symlink() && ct.is_symlink()) {
            return Ok(false);
        }
        let a = std::fs::read_link(lp).map_err(read_err(lp))?;
        let b = std::fs::read_link(cp).map_err(read_err(cp))?;
        return Ok(a == b);
    }
    if lt.is_file() && ct.is_file() {
        return Ok(crate::model::GitMode::from_regular_permissions(lmd.mode())
            == crate::model::GitMode::from_regular_permissions(cmd.mode())
            && lmd.len() == cmd.len()
            && same_bytes(lp, cp)?);
    }
    if lt.is_dir() || ct.is_dir() || lt.is_file() || ct.is_file() {
        return Ok(lt.is_dir() && ct.is_dir());
    }
    // Both special: the same kind of special file.
    Ok((lt.is_fifo() && ct.is_fifo())
        || (lt.is_socket() && ct.is_socket())
        || (lt.is_char_device() && ct.is_char_device() && lmd.rdev() == cmd.rdev())
        || (lt.is_block_device() && ct.is_block_device() && lmd.rdev() == cmd.rdev()))
}

impl Walker<'_> {
    /// Compares copy directory `rel` with lower directory `lower_dir` (`None` when lower has
    /// no directory there: everything below is new).
    fn walk_compare(&mut self, rel: &str, lower_dir: Option<PathBuf>) -> Result<(), PatchError> {
        let copy_entries = self.entries_of(rel, lower_dir.is_some())?;
        let lower_entries = match &lower_dir {
            Some(l) => read_dir_sorted(l)?,
            None => Vec::new(),
        };
        // Merge the two sorted listings by name.
        let mut names: std::collections::BTreeMap<OsString, (Option<PathBuf>, Option<PathBuf>)> =
            Default::default();
        for (name, p) in lower_entries {
            names.entry(name).or_default().0 = Some(p);
        }
        for (name, p) in copy_entries {
            names.entry(name).or_default().1 = Some(p);
        }
        for (name, (lpath, cpath)) in names {
            let lower = side(lpath)?;
            let copy = side(cpath)?;
            self.compare_entry(rel, &name, lower, copy)?;
        }
        Ok(())
    }

    fn compare_entry(
        &mut self,
        rel: &str,
        name: &OsString,
        lower: Side,
        copy: Side,
    ) -> Result<(), PatchError> {
        let child = join_rel(rel, name);
        // `.git`/`.smithers` anywhere and the top-level exclusions are never content; reported
        // when the step created or removed one.
        let utf8 = name.to_str().unwrap_or("");
        if (rel.is_empty() && self.opts.excluded_top_level.iter().any(|e| e == utf8))
            || is_protected_name(utf8)
        {
            // A hidden name is never in the copy the step started from: whatever the copy
            // holds there, the step made.
            let hidden = rel.is_empty() && self.opts.hidden_top_level.iter().any(|e| e == utf8);
            let made_or_removed = if hidden {
                copy.is_some()
            } else {
                lower.is_some() != copy.is_some()
            };
            if made_or_removed {
                self.ignore(format!("{child}/"), IgnoreReason::Excluded);
            }
            return Ok(());
        }
        let Some((cpath, cmd)) = copy else {
            // Gone from the copy: deleted by the step.
            if let Some((lp, lmd)) = lower {
                self.delete_lower(&child, lp, &lmd)?;
            }
            return Ok(());
        };
        if cmd.is_dir() {
            let lower_is_dir = lower.as_ref().is_some_and(|(_, md)| md.is_dir());
            if self.rules.is_dir_ignored(&rules_key(&child))? {
                // Not walked when it was there before: it may be huge and is never patched.
                if !lower_is_dir {
                    self.ignore(format!("{child}/"), IgnoreReason::Gitignore);
                }
                return Ok(());
            }
            match lower {
                Some((lp, _)) if lower_is_dir => self.walk_compare(&child, Some(lp))?,
                Some((lp, lmd)) => {
                    // A directory replacing a file or symlink: that entry is deleted.
                    self.delete_lower(&child, lp, &lmd)?;
                    self.walk_compare(&child, None)?;
                }
                None => self.walk_compare(&child, None)?,
            }
            return Ok(());
        }
        let Some(new) = node_of(cpath.clone(), &cmd) else {
            // A special file: unchanged when lower has the same kind there.
            let copy_side = (cpath, cmd);
            let unchanged = match &lower {
                Some(l) => same_entry(l, &copy_side)?,
                None => false,
            };
            if !unchanged {
                self.skip(child, SPECIAL);
            }
            return Ok(());
        };
        if let Some((lp, lmd)) = &lower {
            if lmd.is_dir() {
                // A file replacing a directory: the directory's files are deleted.
                self.delete_lower(&child, lp.clone(), lmd)?;
            }
        }
        let copy_side = (cpath, cmd);
        let unchanged = match &lower {
            Some(l) => same_entry(l, &copy_side)?,
            None => false,
        };
        if self.rules.is_file_ignored(&rules_key(&child))? {
            if !unchanged {
                self.ignore(child, IgnoreReason::Gitignore);
            }
            return Ok(());
        }
        if unchanged {
            return Ok(());
        }
        let old: Option<Node> = lower.and_then(|(lp, lmd)| node_of(lp, &lmd));
        self.cands.insert(
            child,
            Candidate {
                old,
                new: Some(new),
            },
        );
        Ok(())
    }
}
