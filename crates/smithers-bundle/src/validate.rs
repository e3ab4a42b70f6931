//! Validating a bundle directory (spec §2, "Validating"), in the JavaScript package's order.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rustix::fs::{openat, statat, AtFlags, Dir, FileType, Mode, OFlags, CWD};
use serde_json::Value;

use crate::error::BundleError;
use crate::js_json::js_trim;
use crate::limits::{SANDBOX_MAX_BUNDLE_BYTES, SANDBOX_MAX_PATCH_FILES, SANDBOX_MAX_README_BYTES};
use crate::manifest::{BundleStatus, ChangeNotes, Manifest, ValidatedBundle};
use smithers_paths::{is_within, resolve};

/// Validates the bundle at `bundle_path` (spec §2): README.md, manifest, symlinks, sizes,
/// patch files, patch paths, log file — the first failure in that order is returned.
///
/// Only metadata is read for files other than README.md, so validating is cheap whatever
/// the artifacts weigh. Nothing is followed: README.md and the log are checked with lstat,
/// README.md is opened with `O_NOFOLLOW`, and any symlink in the tree is an error.
pub fn validate_bundle(bundle_path: impl AsRef<Path>) -> Result<ValidatedBundle, BundleError> {
    let bundle_path = bundle_path.as_ref();
    let readme_path = resolve_in(bundle_path, "README.md")?;
    let raw = read_readme(bundle_path, &readme_path)?;
    let (manifest, notes) = parse_readme(&raw)?;
    let change_notes = change_notes_of(notes)?;

    let walked = walk(bundle_path)?;
    if walked.total_bytes > SANDBOX_MAX_BUNDLE_BYTES {
        return Err(BundleError::BundleTooLarge {
            actual: walked.total_bytes,
            estimated: false,
            largest: Vec::new(),
        });
    }
    let mut patch_files = walked.patch_files;
    if patch_files.len() > SANDBOX_MAX_PATCH_FILES {
        return Err(BundleError::TooManyPatchFiles {
            actual: patch_files.len(),
        });
    }
    patch_files.sort_unstable();
    // Resolved once: with an absolute root, resolving 2000 patch paths needs no getcwd.
    let root_abs = resolve_in(bundle_path, ".")?;
    let base = resolve_in(&root_abs, "patches")?;
    for p in patch_files.iter().chain(manifest.patches.iter().flatten()) {
        check_patch_path(&root_abs, &base, p)?;
    }

    let logs_path = resolve_in(bundle_path, "logs/stream.ndjson")?;
    let logs = match fs::symlink_metadata(&logs_path) {
        Ok(meta) if meta.file_type().is_symlink() => {
            return Err(BundleError::LogsSymlink {
                bundle_path: bundle_path.to_path_buf(),
            })
        }
        Ok(meta) if meta.file_type().is_file() => Some(logs_path),
        _ => None,
    };

    Ok(ValidatedBundle {
        manifest,
        bundle_size_bytes: walked.total_bytes,
        patch_files,
        logs_path: logs,
        bundle_path: bundle_path.to_path_buf(),
        change_notes,
    })
}

/// README.md's `changeNotes` (our key; see [`ChangeNotes`]): absent is empty, and one that is
/// present but malformed fails validation rather than being dropped, since `accept` relies on
/// its `hostChanged` list. (`raw` has already been parsed once by [`parse_manifest`].)
pub fn parse_change_notes(raw: &[u8]) -> Result<ChangeNotes, BundleError> {
    let text = String::from_utf8_lossy(raw);
    let Ok(Value::Object(mut map)) = serde_json::from_str::<Value>(js_trim(&text)) else {
        return Ok(ChangeNotes::default());
    };
    change_notes_of(map.shift_remove("changeNotes"))
}

fn change_notes_of(value: Option<Value>) -> Result<ChangeNotes, BundleError> {
    match value {
        None => Ok(ChangeNotes::default()),
        Some(v) => serde_json::from_value(v).map_err(|e| BundleError::ReadmeInvalidJson {
            reason: format!("changeNotes: {e}"),
        }),
    }
}

fn resolve_in(bundle_path: &Path, rel: &str) -> Result<PathBuf, BundleError> {
    resolve(bundle_path, rel).map_err(|source| BundleError::Path {
        path: rel.to_string(),
        source,
    })
}

/// Step 1: README.md exists, is a regular file (not a symlink), and fits the limit. Returns
/// its bytes. lstat first, for the JS messages; then an `O_NOFOLLOW | O_NONBLOCK` open and a
/// bounded read, so a file swapped for a symlink, a FIFO or a bigger file in between is
/// caught instead of followed, blocked on or read whole.
fn read_readme(bundle_path: &Path, readme: &Path) -> Result<Vec<u8>, BundleError> {
    let missing = || BundleError::ReadmeMissing {
        bundle_path: bundle_path.to_path_buf(),
    };
    let symlink = || BundleError::ReadmeSymlink {
        bundle_path: bundle_path.to_path_buf(),
    };
    let too_large = |actual: u64| BundleError::ReadmeTooLarge {
        bundle_path: bundle_path.to_path_buf(),
        actual,
    };
    let meta = fs::symlink_metadata(readme).map_err(|_| missing())?;
    if meta.file_type().is_symlink() {
        return Err(symlink());
    }
    if !meta.file_type().is_file() {
        return Err(missing());
    }
    if meta.len() > SANDBOX_MAX_README_BYTES {
        return Err(too_large(meta.len()));
    }
    let file: File = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(readme)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => symlink(),
            Some(libc::ENOENT) => missing(),
            _ => BundleError::ReadBundle {
                path: readme.to_path_buf(),
                source: e,
            },
        })?;
    let read_err = |e: io::Error| BundleError::ReadBundle {
        path: readme.to_path_buf(),
        source: e,
    };
    let meta = file.metadata().map_err(read_err)?;
    if !meta.file_type().is_file() {
        return Err(missing());
    }
    let mut raw = Vec::with_capacity(meta.len() as usize);
    file.take(SANDBOX_MAX_README_BYTES + 1)
        .read_to_end(&mut raw)
        .map_err(read_err)?;
    if raw.len() as u64 > SANDBOX_MAX_README_BYTES {
        return Err(too_large(raw.len() as u64));
    }
    Ok(raw)
}

/// Step 2: README bytes → normalised manifest, exactly as JS `parseReadmeJson` after
/// `readFile(..., "utf8")` (invalid UTF-8 becomes U+FFFD, then `trim()`, then `JSON.parse`).
///
/// Never panics on any input (property-tested).
pub fn parse_manifest(raw: &[u8]) -> Result<Manifest, BundleError> {
    parse_readme(raw).map(|(manifest, _)| manifest)
}

/// [`parse_manifest`], also returning README.md's `changeNotes` value (our key, which the
/// manifest leaves out as JavaScript does), so that validation parses the JSON once.
fn parse_readme(raw: &[u8]) -> Result<(Manifest, Option<Value>), BundleError> {
    let text = String::from_utf8_lossy(raw);
    let trimmed = js_trim(&text);
    if trimmed.is_empty() {
        return Err(BundleError::ReadmeEmpty);
    }
    let parsed: Value =
        serde_json::from_str(trimmed).map_err(|e| BundleError::ReadmeInvalidJson {
            reason: e.to_string(),
        })?;
    // In JS an array passes `typeof parsed === "object"` and then has no `status`.
    let map = match parsed {
        Value::Object(map) => map,
        Value::Array(_) => return Err(BundleError::ReadmeStatus),
        _ => return Err(BundleError::ReadmeNotObject),
    };
    let mut map = map;
    let status = match map.get("status") {
        Some(Value::String(s)) => BundleStatus::parse(s).ok_or(BundleError::ReadmeStatus)?,
        _ => return Err(BundleError::ReadmeStatus),
    };
    let outputs = map.shift_remove("outputs");
    let run_id = match map.shift_remove("runId") {
        Some(Value::String(s)) => Some(s),
        _ => None,
    };
    let patches = match map.shift_remove("patches") {
        Some(Value::Array(items)) => Some(
            items
                .into_iter()
                .filter_map(|v| match v {
                    Value::String(s) => Some(s),
                    _ => None,
                })
                .collect(),
        ),
        _ => None,
    };
    // JS keeps `diffBundle` when it is truthy and `typeof === "object"`: objects and arrays.
    let diff_bundle = match map.shift_remove("diffBundle") {
        Some(v @ (Value::Object(_) | Value::Array(_))) => Some(v),
        _ => None,
    };
    let change_notes = map.shift_remove("changeNotes");
    Ok((
        Manifest {
            outputs,
            status,
            run_id,
            patches,
            diff_bundle,
        },
        change_notes,
    ))
}

/// Step 5: `patch_path` must resolve strictly inside `<bundle>/patches`, compared by path
/// components. (JS compares the `path.relative` string with `startsWith("..")`, which also
/// rejects legal names such as `patches/..x.patch`; we do not copy that.) A path that leaves
/// the bundle altogether, or is empty, fails with the path-resolution error, as in JS.
pub fn assert_patch_path_safe(bundle_path: &Path, patch_path: &str) -> Result<(), BundleError> {
    let root_abs = resolve_in(bundle_path, ".")?;
    let base = resolve_in(&root_abs, "patches")?;
    check_patch_path(&root_abs, &base, patch_path)
}

/// [`assert_patch_path_safe`] with the absolute bundle root and its `patches` dir resolved.
fn check_patch_path(root_abs: &Path, base: &Path, patch_path: &str) -> Result<(), BundleError> {
    let resolved = resolve(root_abs, patch_path).map_err(|source| BundleError::Path {
        path: patch_path.to_string(),
        source,
    })?;
    if resolved == base || !is_within(base, &resolved) {
        return Err(BundleError::PatchPathEscape {
            patch_path: patch_path.to_string(),
        });
    }
    Ok(())
}

struct Walked {
    total_bytes: u64,
    patch_files: Vec<String>,
}

/// One directory being listed during [`walk`].
struct Level {
    dir: Dir,
    /// Bundle-relative POSIX path of the directory ("" for the root).
    rel: String,
    /// Whether the directory is the top-level `patches/` or beneath it.
    in_patches: bool,
}

/// Step 3 and the collection for step 4: a depth-first walk that never follows a link,
/// summing the sizes of regular files and collecting `patches/**.patch` as POSIX relative
/// paths. Sockets, FIFOs and devices are neither counted nor followed, as in JS.
///
/// Each directory is opened relative to its parent's descriptor with `O_NOFOLLOW`, and each
/// entry is typed by `d_type` or `fstatat(AT_SYMLINK_NOFOLLOW)` on that descriptor: a
/// directory swapped for a symlink during the walk fails the open (ELOOP/ENOTDIR) instead of
/// being followed out of the bundle. The stack of open directories is explicit (one descriptor
/// per level), so a pathologically deep tree ends in an error, never in a stack overflow.
fn walk(bundle_path: &Path) -> Result<Walked, BundleError> {
    let read_err = |rel: &str, e: rustix::io::Errno| BundleError::ReadBundle {
        path: bundle_path.join(rel),
        source: e.into(),
    };
    let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    // The bundle directory itself is named by the caller and trusted (it may be a link).
    let root_fd =
        openat(CWD, bundle_path, dir_flags, Mode::empty()).map_err(|e| read_err("", e))?;
    let root_dir = Dir::read_from(&root_fd).map_err(|e| read_err("", e))?;
    drop(root_fd);
    let mut total_bytes: u64 = 0;
    let mut patch_files = Vec::new();
    let mut stack = vec![Level {
        dir: root_dir,
        rel: String::new(),
        in_patches: false,
    }];
    while let Some(level) = stack.last_mut() {
        let entry = match level.dir.next() {
            None => {
                stack.pop();
                continue;
            }
            Some(entry) => entry.map_err(|e| read_err(&level.rel, e))?,
        };
        let name = entry.file_name();
        let name_bytes = name.to_bytes();
        if name_bytes == b"." || name_bytes == b".." {
            continue;
        }
        let name_str = String::from_utf8_lossy(name_bytes);
        let rel = if level.rel.is_empty() {
            name_str.into_owned()
        } else {
            format!("{}/{name_str}", level.rel)
        };
        let dir_fd = level.dir.fd().map_err(|e| read_err(&level.rel, e))?;
        let mut file_type = entry.file_type();
        let mut size = 0;
        if matches!(file_type, FileType::Unknown | FileType::RegularFile) {
            let st =
                statat(dir_fd, name, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| read_err(&rel, e))?;
            file_type = FileType::from_raw_mode(st.st_mode);
            size = u64::try_from(st.st_size).unwrap_or(0);
        }
        match file_type {
            FileType::Symlink => return Err(BundleError::ContainsSymlink { path: rel }),
            FileType::Directory => {
                let fd = openat(dir_fd, name, dir_flags | OFlags::NOFOLLOW, Mode::empty())
                    .map_err(|e| {
                        match e {
                            // Swapped for a symlink since it was listed.
                            rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR => {
                                BundleError::ContainsSymlink { path: rel.clone() }
                            }
                            e => read_err(&rel, e),
                        }
                    })?;
                let dir = Dir::read_from(&fd).map_err(|e| read_err(&rel, e))?;
                let in_patches =
                    level.in_patches || (level.rel.is_empty() && name_bytes == b"patches");
                stack.push(Level {
                    dir,
                    rel,
                    in_patches,
                });
            }
            FileType::RegularFile => {
                total_bytes = total_bytes.saturating_add(size);
                if level.in_patches && rel.ends_with(".patch") {
                    patch_files.push(rel);
                }
            }
            _ => {}
        }
    }
    Ok(Walked {
        total_bytes,
        patch_files,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn manifest_normalisation_follows_js() {
        let m = parse_manifest(
            br#"  {"status":"failed","runId":5,"patches":["patches/a.patch",1,null],"diffBundle":"x","extra":1}  "#,
        )
        .unwrap();
        assert_eq!(m.status, BundleStatus::Failed);
        assert_eq!(m.outputs, None);
        assert_eq!(m.run_id, None);
        assert_eq!(m.patches, Some(vec!["patches/a.patch".to_string()]));
        assert_eq!(m.diff_bundle, None);
        assert_eq!(
            serde_json::to_value(&m).unwrap(),
            json!({"status": "failed", "patches": ["patches/a.patch"]})
        );
        let m = parse_manifest(br#"{"outputs":null,"status":"finished","diffBundle":[]}"#).unwrap();
        assert_eq!(m.outputs, Some(Value::Null));
        assert_eq!(
            serde_json::to_value(&m).unwrap(),
            json!({"outputs": null, "status": "finished", "diffBundle": []})
        );
    }

    #[test]
    fn readme_rejections_in_js_order() {
        let code = |raw: &[u8]| parse_manifest(raw).unwrap_err().to_string();
        assert_eq!(
            code(b" \n\t\xef\xbb\xbf"),
            "Sandbox bundle README.md is empty."
        );
        assert_eq!(
            code(b"{"),
            "Sandbox bundle README.md must contain valid JSON."
        );
        assert_eq!(
            code(b"null"),
            "Sandbox bundle README.md JSON must be an object."
        );
        assert_eq!(
            code(b"0"),
            "Sandbox bundle README.md JSON must be an object."
        );
        assert_eq!(
            code(b"true"),
            "Sandbox bundle README.md JSON must be an object."
        );
        assert_eq!(
            code(b"\"s\""),
            "Sandbox bundle README.md JSON must be an object."
        );
        assert_eq!(
            code(b"[]"),
            "Sandbox bundle README.md must include status: finished | failed | cancelled."
        );
        assert_eq!(
            code(br#"{"status":"Finished"}"#),
            "Sandbox bundle README.md must include status: finished | failed | cancelled."
        );
        // A BOM is whitespace to JS trim().
        assert!(parse_manifest(b"\xef\xbb\xbf{\"status\":\"cancelled\"}").is_ok());
    }

    #[test]
    fn patch_paths_compare_components() {
        let root = Path::new("/b");
        assert!(assert_patch_path_safe(root, "patches/..x.patch").is_ok());
        assert!(assert_patch_path_safe(root, "patches/a/../b.patch").is_ok());
        assert!(assert_patch_path_safe(root, "/b/patches/x.patch").is_ok());
        for bad in [
            "patches",
            "patches/.",
            "README.md",
            "patchesx/a.patch",
            "patches/../a.patch",
        ] {
            assert!(
                matches!(
                    assert_patch_path_safe(root, bad),
                    Err(BundleError::PatchPathEscape { .. })
                ),
                "{bad}"
            );
        }
        let err = assert_patch_path_safe(root, "../x.patch").unwrap_err();
        assert_eq!(err.to_string(), "Path escapes sandbox root");
        let err = assert_patch_path_safe(root, "").unwrap_err();
        assert_eq!(err.to_string(), "Path must be a string");
        // Root `/` works (JS's string prefix `"//"` rejects everything there).
        assert!(assert_patch_path_safe(Path::new("/"), "patches/a.patch").is_ok());
    }
}
