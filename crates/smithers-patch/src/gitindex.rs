//! The paths the git index of the project tracks, for `.gitignore` semantics as git has them:
//! ignore rules apply to untracked files only, so an edit or deletion of a tracked file that
//! matches a `.gitignore` pattern is still a change (and a patch).
//!
//! Only what that needs is read: the index header and each entry's path (versions 2, 3 and 4,
//! SHA-1 or SHA-256 object ids). The file is the host's, but it lives in a tree a step or a
//! cloned repository may have crafted, so it is read with `O_NOFOLLOW`, bounded in size, and
//! every length is checked before it is used; a malformed index gives an error (the caller
//! then says tracked files could not be told apart), never a panic.

use std::collections::HashSet;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// An index larger than this is not read (git's own index of a 1M-file tree is ~100 MiB).
pub(crate) const MAX_INDEX_BYTES: u64 = 256 << 20;

/// The tracked paths of an index: files, and every directory that holds one.
#[derive(Debug, Default)]
pub(crate) struct Tracked {
    pub(crate) files: HashSet<String>,
    pub(crate) dirs: HashSet<String>,
}

impl Tracked {
    /// The part below the directory `prefix` (a project below its repository's top), with
    /// paths relative to it.
    pub(crate) fn below(self, prefix: &str) -> Tracked {
        let lead = format!("{prefix}/");
        let strip = |set: HashSet<String>| {
            set.into_iter()
                .filter_map(|p| p.strip_prefix(&lead).map(str::to_string))
                .collect()
        };
        Tracked {
            files: strip(self.files),
            dirs: strip(self.dirs),
        }
    }
}

/// Reads `<root>/.git/index` when `<root>/.git` is a directory (not a link, not a worktree's
/// `.git` file). `Ok(None)`: no index there. `Err`: an index that cannot be read or parsed.
pub(crate) fn read_tracked(root: &Path) -> Result<Option<Tracked>, String> {
    let git = root.join(".git");
    match std::fs::symlink_metadata(&git) {
        Ok(md) if md.is_dir() => {}
        _ => return Ok(None),
    }
    let path = git.join("index");
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc_o_nofollow())
        .open(&path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot open .git/index: {e}")),
    };
    let md = file
        .metadata()
        .map_err(|e| format!("cannot stat .git/index: {e}"))?;
    if !md.is_file() {
        return Err(".git/index is not a regular file".into());
    }
    if md.len() > MAX_INDEX_BYTES {
        return Err(format!(
            ".git/index is {} bytes, over the {MAX_INDEX_BYTES}-byte limit",
            md.len()
        ));
    }
    let mut bytes = Vec::with_capacity(md.len() as usize);
    file.take(MAX_INDEX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read .git/index: {e}"))?;
    let id_len = object_id_len(&git);
    parse_index(&bytes, id_len).map(|paths| {
        let mut t = Tracked::default();
        for p in paths {
            let mut dir = p.as_str();
            while let Some(i) = dir.rfind('/') {
                dir = &dir[..i];
                if !t.dirs.insert(dir.to_string()) {
                    break;
                }
            }
            t.files.insert(p);
        }
        Some(t)
    })
}

/// The stage-0 entries of the index file `index` (in a repository whose object ids are
/// `id_len` bytes), by path; `None` when there is no such file or it cannot be read.
pub(crate) fn read_entries(
    index: &Path,
    id_len: usize,
) -> Option<std::collections::HashMap<String, IndexEntry>> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc_o_nofollow())
        .open(index)
        .ok()?;
    let md = file.metadata().ok()?;
    if !md.is_file() || md.len() > MAX_INDEX_BYTES {
        return None;
    }
    let mut bytes = Vec::with_capacity(md.len() as usize);
    file.take(MAX_INDEX_BYTES + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    let entries = parse_entries(&bytes, id_len).ok()?;
    Some(
        entries
            .into_iter()
            .filter(|e| e.stage == 0)
            .map(|e| (e.path.clone(), e))
            .collect(),
    )
}

fn libc_o_nofollow() -> i32 {
    rustix::fs::OFlags::NOFOLLOW.bits() as i32
}

/// 32 for a repository whose `extensions.objectFormat` is `sha256`, else 20. Only a bounded
/// prefix of `.git/config` is looked at, as text.
pub(crate) fn object_id_len(git: &Path) -> usize {
    let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc_o_nofollow())
        .open(git.join("config"))
    else {
        return 20;
    };
    let mut text = String::new();
    if f.take(1 << 20).read_to_string(&mut text).is_err() {
        return 20;
    }
    let sha256 = text.lines().any(|l| {
        let l: String = l.chars().filter(|c| !c.is_whitespace()).collect();
        l.eq_ignore_ascii_case("objectformat=sha256")
    });
    if sha256 {
        32
    } else {
        20
    }
}

/// The paths of the entries of an index file (stage 0 and conflict stages alike; a path in
/// conflict is tracked), as change path strings ([`crate::model::path_from_bytes`]: a name
/// that is not UTF-8 in git's quoted form, as detection names it).
pub(crate) fn parse_index(b: &[u8], id_len: usize) -> Result<Vec<String>, String> {
    parse_entries(b, id_len).map(|e| e.into_iter().map(|e| e.path).collect())
}

/// One entry of an index file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IndexEntry {
    /// As [`parse_index`] gives it.
    pub(crate) path: String,
    /// The git mode (`0o100644`, `0o100755`, `0o120000`, `0o160000`).
    pub(crate) mode: u32,
    /// The object id, in lowercase hex.
    pub(crate) oid: String,
    /// 0, or the conflict stage (1 to 3).
    pub(crate) stage: u8,
}

/// The entries of an index file (see [`parse_index`]).
pub(crate) fn parse_entries(b: &[u8], id_len: usize) -> Result<Vec<IndexEntry>, String> {
    let bad = |what: &str| format!(".git/index is malformed: {what}");
    if b.len() < 12 || &b[..4] != b"DIRC" {
        return Err(bad("no DIRC header"));
    }
    let version = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
    if !(2..=4).contains(&version) {
        return Err(bad(&format!("unsupported version {version}")));
    }
    let count = u32::from_be_bytes([b[8], b[9], b[10], b[11]]) as usize;
    // Each entry takes at least 40 + id + 2 + 1 bytes: a count the file cannot hold is a lie.
    let fixed = 40 + id_len + 2;
    if count > b.len() / (fixed + 1) {
        return Err(bad("entry count larger than the file"));
    }
    let mut out = Vec::with_capacity(count);
    let mut pos = 12usize;
    let mut prev: Vec<u8> = Vec::new();
    for _ in 0..count {
        let start = pos;
        let flags_at = start + 40 + id_len;
        let flags = b
            .get(flags_at..flags_at + 2)
            .ok_or_else(|| bad("truncated entry"))?;
        let flags = u16::from_be_bytes([flags[0], flags[1]]);
        let mode = u32::from_be_bytes([b[start + 24], b[start + 25], b[start + 26], b[start + 27]]);
        let oid = crate::model::hex(&b[start + 40..flags_at]);
        pos = flags_at + 2;
        if flags & 0x4000 != 0 {
            if version < 3 {
                return Err(bad("extended flag in a version 2 index"));
            }
            pos += 2;
        }
        let name: Vec<u8> = if version == 4 {
            let (strip, used) = varint(b.get(pos..).ok_or_else(|| bad("truncated entry"))?)
                .ok_or_else(|| bad("bad path prefix length"))?;
            pos += used;
            if strip > prev.len() {
                return Err(bad("path prefix longer than the previous path"));
            }
            let rest = b.get(pos..).ok_or_else(|| bad("truncated entry"))?;
            let nul = rest
                .iter()
                .position(|&c| c == 0)
                .ok_or_else(|| bad("unterminated path"))?;
            let mut name = prev[..prev.len() - strip].to_vec();
            name.extend_from_slice(&rest[..nul]);
            pos += nul + 1;
            name
        } else {
            let rest = b.get(pos..).ok_or_else(|| bad("truncated entry"))?;
            let nul = rest
                .iter()
                .position(|&c| c == 0)
                .ok_or_else(|| bad("unterminated path"))?;
            let name = rest[..nul].to_vec();
            // Entries are padded with 1 to 8 NULs to a multiple of 8 bytes.
            let len = pos - start + nul;
            pos = start + (len + 8) / 8 * 8;
            if pos > b.len() {
                return Err(bad("truncated entry padding"));
            }
            name
        };
        out.push(IndexEntry {
            path: crate::model::path_from_bytes(&name),
            mode,
            oid,
            stage: ((flags >> 12) & 3) as u8,
        });
        prev = name;
    }
    // Extensions follow the entries (then the trailing checksum). A split index keeps most
    // entries in another file (`link`) and a sparse one folds directories into one entry
    // (`sdir`): read as they are, their files would look untracked, so they are refused and
    // the caller says tracked files could not be told apart.
    while pos + 8 + id_len <= b.len() {
        let sig = &b[pos..pos + 4];
        let size = u32::from_be_bytes([b[pos + 4], b[pos + 5], b[pos + 6], b[pos + 7]]) as usize;
        if sig == b"link" || sig == b"sdir" {
            return Err(format!(
                ".git/index is a {} index, which is not read",
                if sig == b"link" { "split" } else { "sparse" }
            ));
        }
        pos = match pos.checked_add(8).and_then(|p| p.checked_add(size)) {
            Some(p) => p,
            None => break,
        };
    }
    Ok(out)
}

/// git's offset varint (`decode_varint`): the value and the bytes used.
fn varint(b: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    let mut c = *b.first()?;
    let mut val = (c & 0x7f) as usize;
    while c & 0x80 != 0 {
        i += 1;
        c = *b.get(i)?;
        val = val.checked_add(1)?.checked_mul(128)? | (c & 0x7f) as usize;
    }
    Some((val, i + 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn git(dir: &Path, args: &[&str]) -> bool {
        Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    }

    /// Real indexes of every version, written by git itself.
    #[test]
    fn reads_indexes_git_writes() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        if !git(root, &["init", "-q"]) {
            smithers_test_support::skip_or_fail("git not found");
            return;
        }
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        for f in ["top.txt", "a/b/deep.log", "a/x.txt", "a/b/c d.txt", "zz"] {
            std::fs::write(root.join(f), f).unwrap();
        }
        assert!(git(root, &["add", "-A"]));
        for v in ["2", "3", "4"] {
            assert!(git(root, &["update-index", "--index-version", v]));
            let tr = read_tracked(root).unwrap().unwrap();
            let mut files: Vec<_> = tr.files.iter().cloned().collect();
            files.sort();
            assert_eq!(
                files,
                ["a/b/c d.txt", "a/b/deep.log", "a/x.txt", "top.txt", "zz"],
                "version {v}"
            );
            assert!(tr.dirs.contains("a") && tr.dirs.contains("a/b"));
        }
    }

    /// A split index (most entries in a shared file) is refused, not read as if complete.
    #[test]
    fn split_indexes_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        if !git(root, &["init", "-q"]) {
            smithers_test_support::skip_or_fail("git not found");
            return;
        }
        std::fs::write(root.join("a"), "a").unwrap();
        assert!(git(root, &["add", "a"]));
        assert!(git(root, &["update-index", "--split-index"]));
        let err = read_tracked(root).unwrap_err();
        assert!(err.contains("split"), "{err}");
    }

    #[test]
    fn hostile_indexes_are_errors_not_panics() {
        assert!(parse_index(b"", 20).is_err());
        assert!(parse_index(b"DIRC\0\0\0\x05\0\0\0\0", 20).is_err());
        // A count far beyond the file.
        assert!(parse_index(b"DIRC\0\0\0\x02\xff\xff\xff\xff", 20).is_err());
        // Truncated entries and bad v4 prefixes, byte by byte.
        let mut e = b"DIRC\0\0\0\x04\0\0\0\x01".to_vec();
        e.extend_from_slice(&[0u8; 62]);
        e.extend_from_slice(&[0x85, 0x01, b'a', 0]);
        for n in 0..=e.len() {
            let _ = parse_index(&e[..n], 20);
        }
        assert!(parse_index(&e, 20).is_err(), "prefix longer than previous");
    }
}
