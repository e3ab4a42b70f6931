//! Lexical path handling: no filesystem access except in [`assert_within_root`].

use std::io::ErrorKind;
use std::path::{Component, Path, PathBuf};

use crate::PathError;

/// Normalises `.` and `..` without touching the disk, like Node's `path.resolve` on an
/// absolute path: `..` at the root stays at the root, repeated and trailing separators vanish.
/// A relative input stays relative, with leading `..` kept (they cannot be resolved lexically).
pub fn normalize_lexically(path: &Path) -> PathBuf {
    let mut out: Vec<Component<'_>> = Vec::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => match out.last() {
                Some(Component::Normal(_)) => {
                    out.pop();
                }
                // `/..` is `/`.
                Some(Component::RootDir) | Some(Component::Prefix(_)) => {}
                // Relative path already climbing: keep climbing.
                Some(Component::ParentDir) | None => out.push(Component::ParentDir),
                Some(Component::CurDir) => unreachable!("CurDir is never pushed"),
            },
            other => out.push(other),
        }
    }
    if out.is_empty() {
        return PathBuf::from(".");
    }
    out.iter().map(|c| c.as_os_str()).collect()
}

/// True when `path` is `root` or beneath it, comparing whole components (`/a/bc` is not
/// beneath `/a/b`; everything absolute is beneath `/`). Both should be normalised.
pub fn is_within(root: &Path, path: &Path) -> bool {
    path.starts_with(root)
}

/// Resolves an untrusted `input` against `root` lexically (spec section 3).
///
/// Empty input → `TOOL_PATH_INVALID` "Path must be a string"; a relative input resolves
/// against `root`, an absolute one is taken as it is; the result must be `root` or beneath it
/// by components, else `TOOL_PATH_ESCAPE` "Path escapes sandbox root". A relative `root` is
/// taken relative to the current directory, as Node does.
pub fn resolve(root: &Path, input: &str) -> Result<PathBuf, PathError> {
    if input.is_empty() {
        return Err(PathError::Invalid {
            message: "Path must be a string".to_string(),
            path: String::new(),
        });
    }
    // Stricter than the original: a NUL byte can never name a file, and would be cut short by
    // the kernel, so the path checked would not be the path used.
    if input.contains('\0') {
        return Err(PathError::Invalid {
            message: "Path must not contain NUL bytes".to_string(),
            path: input.replace('\0', "\\0"),
        });
    }
    let root = absolute_root(root)?;
    let input_path = Path::new(input);
    let resolved = if input_path.is_absolute() {
        normalize_lexically(input_path)
    } else {
        normalize_lexically(&root.join(input_path))
    };
    if !is_within(&root, &resolved) {
        return Err(PathError::Escape {
            path: input.to_string(),
            root: root.display().to_string(),
        });
    }
    Ok(resolved)
}

fn absolute_root(root: &Path) -> Result<PathBuf, PathError> {
    if root.is_absolute() {
        return Ok(normalize_lexically(root));
    }
    let cwd = std::env::current_dir()
        .map_err(|e| PathError::io("read current directory for", root.display().to_string(), e))?;
    Ok(normalize_lexically(&cwd.join(root)))
}

/// Symlink-aware containment: the real path of the nearest existing ancestor of `resolved`
/// (itself included) must lie under the real path of `root`, else `TOOL_PATH_ESCAPE`
/// "Path escapes sandbox root (via symlink)". "Does not exist" (ENOENT, ENOTDIR) moves up to
/// the parent; any other error propagates.
///
/// This is a check, not a capability: the tree can change after it returns. For writes into
/// a tree others control, use [`crate::Beneath`].
pub fn assert_within_root(root: &Path, resolved: &Path) -> Result<(), PathError> {
    let root_abs = absolute_root(root)?;
    let root_real = std::fs::canonicalize(&root_abs).map_err(|e| {
        PathError::io(
            "resolve real path of root",
            root_abs.display().to_string(),
            e,
        )
    })?;
    let mut current = if resolved.is_absolute() {
        resolved.to_path_buf()
    } else {
        root_abs.join(resolved)
    };
    loop {
        match std::fs::canonicalize(&current) {
            Ok(real) => {
                return if is_within(&root_real, &real) {
                    Ok(())
                } else {
                    Err(PathError::EscapeViaSymlink {
                        path: resolved.display().to_string(),
                        root: root_real.display().to_string(),
                    })
                };
            }
            Err(e)
                if e.kind() == ErrorKind::NotFound
                    || e.raw_os_error() == Some(20 /* ENOTDIR */) =>
            {
                match current.parent() {
                    Some(parent) => current = parent.to_path_buf(),
                    // Nothing of the path exists, not even `/`: cannot happen on a live system,
                    // but refusing is the safe answer.
                    None => {
                        return Err(PathError::io(
                            "resolve real path of",
                            resolved.display().to_string(),
                            e,
                        ))
                    }
                }
            }
            Err(e) => {
                return Err(PathError::io(
                    "resolve real path of",
                    current.display().to_string(),
                    e,
                ))
            }
        }
    }
}

/// Splits an untrusted relative path into its normal components, refusing anything that is
/// not a plain downward path: absolute paths, `..`, empty paths, NUL bytes. `.` components and
/// repeated separators are dropped. Used by [`crate::Beneath`] and by archive/patch readers.
pub fn relative_components(rel: &Path) -> Result<Vec<&std::ffi::OsStr>, PathError> {
    let display = || rel.display().to_string();
    if rel.as_os_str().is_empty() {
        return Err(PathError::Invalid {
            message: "Path must be a string".to_string(),
            path: String::new(),
        });
    }
    if rel.as_os_str().as_encoded_bytes().contains(&0) {
        return Err(PathError::Invalid {
            message: "Path must not contain NUL bytes".to_string(),
            path: display().replace('\0', "\\0"),
        });
    }
    let mut parts = Vec::new();
    for component in rel.components() {
        match component {
            Component::Normal(part) => parts.push(part),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) | Component::ParentDir => {
                return Err(PathError::Escape {
                    path: display(),
                    root: String::new(),
                })
            }
        }
    }
    if parts.is_empty() {
        return Err(PathError::Invalid {
            message: "Path must name an entry beneath the root".to_string(),
            path: display(),
        });
    }
    Ok(parts)
}

/// `path` relative to `root` with `/` separators, or `None` when it is not beneath `root`.
pub fn to_posix_relative(root: &Path, path: &Path) -> Option<String> {
    let rel = path.strip_prefix(root).ok()?;
    let parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    Some(parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalises_like_node() {
        for (input, expected) in [
            ("/a/b/../c", "/a/c"),
            ("/a/./b/", "/a/b"),
            ("/../..", "/"),
            ("//a//b", "/a/b"),
            ("a/../..", ".."),
            ("a/..", "."),
            ("./a", "a"),
        ] {
            assert_eq!(
                normalize_lexically(Path::new(input)),
                PathBuf::from(expected),
                "{input}"
            );
        }
    }

    #[test]
    fn resolve_contract() {
        let root = Path::new("/root/dir");
        assert_eq!(
            resolve(root, "a/b").unwrap(),
            PathBuf::from("/root/dir/a/b")
        );
        assert_eq!(resolve(root, ".").unwrap(), PathBuf::from("/root/dir"));
        assert_eq!(
            resolve(root, "/root/dir/x").unwrap(),
            PathBuf::from("/root/dir/x")
        );
        assert_eq!(
            resolve(root, "a/../b").unwrap(),
            PathBuf::from("/root/dir/b")
        );
        assert!(matches!(
            resolve(root, "../x"),
            Err(PathError::Escape { .. })
        ));
        assert!(matches!(
            resolve(root, "/etc/passwd"),
            Err(PathError::Escape { .. })
        ));
        // The original's string-prefix comparison accepted this sibling; components do not.
        assert!(matches!(
            resolve(root, "/root/dirx/y"),
            Err(PathError::Escape { .. })
        ));
        assert!(matches!(resolve(root, ""), Err(PathError::Invalid { .. })));
        assert!(matches!(
            resolve(root, "a\0b"),
            Err(PathError::Invalid { .. })
        ));
    }

    #[test]
    fn root_slash_works_and_dotdot_prefixed_names_are_names() {
        assert_eq!(
            resolve(Path::new("/"), "etc").unwrap(),
            PathBuf::from("/etc")
        );
        assert_eq!(resolve(Path::new("/"), "/..").unwrap(), PathBuf::from("/"));
        let b = Path::new("/bundle/patches");
        assert_eq!(
            resolve(b, "..x.patch").unwrap(),
            PathBuf::from("/bundle/patches/..x.patch")
        );
    }

    #[test]
    fn relative_components_refuse_escapes() {
        assert_eq!(relative_components(Path::new("a/./b//c")).unwrap().len(), 3);
        assert!(relative_components(Path::new("../a")).is_err());
        assert!(relative_components(Path::new("a/../b")).is_err());
        assert!(relative_components(Path::new("/a")).is_err());
        assert!(relative_components(Path::new("")).is_err());
        assert!(relative_components(Path::new(".")).is_err());
    }
}
