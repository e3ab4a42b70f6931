//! The `diff` attribute of the project's top-level `.gitattributes`: whether git shows a
//! path as binary whatever its content says.
//!
//! Only what decides "binary" for `git diff` is read: `binary` (the built-in macro
//! `-diff -merge -text`) and `-diff` make a path binary; `diff` (set) makes it text even with
//! a NUL in it; `!diff` and `diff=<driver>` leave it to the content (a driver's `binary`
//! setting lives in git config, which is not read). `-text` alone does not make a path binary
//! for `git diff` (it only turns off end-of-line conversion), so it is not binary here either.
//!
//! Supported, as git reads them: one pattern and its attributes per line, `#` comments, the
//! last matching line deciding; a pattern without `/` matches a name at any depth, one with
//! `/` is anchored at the top, `*`, `?`, `[...]` and `**`. Not supported (their lines are
//! skipped, so the path is judged by its content, never hidden by a rule we misread):
//! `.gitattributes` files below the top, `.git/info/attributes` and `core.attributesFile`,
//! macros other than `binary` (`[attr]` lines), quoted patterns, and patterns ending in `/`
//! (which match no file in git either).
//!
//! The file is the host tree's (before the change): a step cannot relabel its own edits.

use std::path::Path;

use ignore::gitignore::{Gitignore, GitignoreBuilder};

/// The largest `.gitattributes` read (a real one is a few KiB).
const MAX_ATTRIBUTES_BYTES: u64 = 1 << 20;

/// What a `.gitattributes` line says about the `diff` attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DiffAttr {
    /// `binary` or `-diff`: shown as binary.
    Binary,
    /// `diff`: shown as text, even with a NUL in it.
    Text,
    /// Not said (or `!diff`, `diff=<driver>`): the content decides.
    Unspecified,
}

/// The `diff` rules of a `.gitattributes`, as two matchers over the same lines in the same
/// order: `gitignore` matching is "the last matching line wins", as attributes are, so the
/// lines that make a path binary are `binary`'s ignore rules (the others its whitelist), and
/// likewise for `text`.
#[derive(Debug, Default)]
pub(crate) struct Attributes {
    binary: Option<Gitignore>,
    text: Option<Gitignore>,
}

/// The effect of one line's attributes on `diff` (later ones win), `None` when it names none.
fn diff_effect<'a>(attrs: impl Iterator<Item = &'a str>) -> Option<DiffAttr> {
    let mut effect = None;
    for a in attrs {
        effect = match a {
            "binary" | "-diff" => Some(DiffAttr::Binary),
            "diff" => Some(DiffAttr::Text),
            "!diff" => Some(DiffAttr::Unspecified),
            a if a.starts_with("diff=") => Some(DiffAttr::Unspecified),
            _ => effect,
        };
    }
    effect
}

impl Attributes {
    /// The rules of `<root>/.gitattributes`, read through [`smithers_paths::Beneath`] (no
    /// link followed, at most 1 MiB): the tree is untrusted. None when it is missing, not a
    /// regular file or larger.
    pub(crate) fn read(root: &smithers_paths::Beneath) -> Attributes {
        match root.read_regular(Path::new(".gitattributes"), MAX_ATTRIBUTES_BYTES) {
            Ok(Some(bytes)) => Attributes::parse(&String::from_utf8_lossy(&bytes)),
            _ => Attributes::default(),
        }
    }

    /// The rules of `.gitattributes` text.
    pub(crate) fn parse(text: &str) -> Attributes {
        let mut binary = GitignoreBuilder::new("/");
        let mut forced_text = GitignoreBuilder::new("/");
        let mut any = false;
        for line in text.lines() {
            let mut words = line.split_ascii_whitespace();
            let Some(pattern) = words.next() else {
                continue;
            };
            // Comments, macro definitions, negative patterns (an error in git), quoted
            // patterns and directory patterns (`dir/` matches no file in git): skipped.
            if pattern.starts_with(['#', '!', '"'])
                || pattern.starts_with("[attr]")
                || pattern.ends_with('/')
            {
                continue;
            }
            let Some(effect) = diff_effect(words) else {
                continue;
            };
            let rule = |yes: bool| {
                if yes {
                    pattern.to_string()
                } else {
                    format!("!{pattern}")
                }
            };
            // A pattern the matcher refuses is skipped alike in both.
            if binary
                .add_line(None, &rule(effect == DiffAttr::Binary))
                .is_ok()
            {
                let _ = forced_text.add_line(None, &rule(effect == DiffAttr::Text));
                any = true;
            }
        }
        if !any {
            return Attributes::default();
        }
        Attributes {
            binary: binary.build().ok(),
            text: forced_text.build().ok(),
        }
    }

    /// What the rules say of the file at `path` (its raw bytes, from the top of the tree).
    pub(crate) fn diff(&self, path: &[u8]) -> DiffAttr {
        use std::os::unix::ffi::OsStrExt;
        let full = Path::new("/").join(std::ffi::OsStr::from_bytes(path));
        let says = |m: &Option<Gitignore>| {
            m.as_ref()
                .is_some_and(|m| m.matched(&full, false).is_ignore())
        };
        if says(&self.binary) {
            DiffAttr::Binary
        } else if says(&self.text) {
            DiffAttr::Text
        } else {
            DiffAttr::Unspecified
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_matching_line_decides() {
        let a = Attributes::parse(
            "# data\n*.dat binary\nkeep.dat !diff\n*.bin -diff -merge\n*.txt -text\n\
             /top.raw -diff\ndocs/**/*.pdf binary\nforced.bin diff\nx.drv diff=word\n\
             dir/ binary\n!neg binary\n[attr]mine -diff\n[ab].raw binary\n",
        );
        for (path, want) in [
            (&b"a.dat"[..], DiffAttr::Binary),
            (b"deep/er/a.dat", DiffAttr::Binary),
            (b"keep.dat", DiffAttr::Unspecified),
            (b"sub/keep.dat", DiffAttr::Unspecified),
            (b"a.bin", DiffAttr::Binary),
            (b"forced.bin", DiffAttr::Text),
            // `-text` alone is not binary to git diff.
            (b"a.txt", DiffAttr::Unspecified),
            (b"top.raw", DiffAttr::Binary),
            (b"sub/top.raw", DiffAttr::Unspecified),
            (b"docs/a/b/c.pdf", DiffAttr::Binary),
            (b"c.pdf", DiffAttr::Unspecified),
            (b"x.drv", DiffAttr::Unspecified),
            (b"dir/file", DiffAttr::Unspecified),
            (b"dir", DiffAttr::Unspecified),
            (b"neg", DiffAttr::Unspecified),
            (b"caf\xe9.dat", DiffAttr::Binary),
            (b"a.raw", DiffAttr::Binary),
            (b"c.raw", DiffAttr::Unspecified),
            (b"plain.rs", DiffAttr::Unspecified),
        ] {
            assert_eq!(a.diff(path), want, "{}", String::from_utf8_lossy(path));
        }
        assert_eq!(Attributes::parse("").diff(b"a.dat"), DiffAttr::Unspecified);
    }

    #[test]
    fn read_is_confined_and_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let root = smithers_paths::Beneath::open(dir.path()).unwrap();
        assert_eq!(
            Attributes::read(&root).diff(b"a.dat"),
            DiffAttr::Unspecified
        );
        std::fs::write(dir.path().join(".gitattributes"), "*.dat binary\n").unwrap();
        assert_eq!(Attributes::read(&root).diff(b"a.dat"), DiffAttr::Binary);
        // A link is not followed.
        let other = tempfile::tempdir().unwrap();
        std::fs::write(other.path().join("attrs"), "*.dat binary\n").unwrap();
        std::fs::remove_file(dir.path().join(".gitattributes")).unwrap();
        std::os::unix::fs::symlink(
            other.path().join("attrs"),
            dir.path().join(".gitattributes"),
        )
        .unwrap();
        assert_eq!(
            Attributes::read(&root).diff(b"a.dat"),
            DiffAttr::Unspecified
        );
    }
}
