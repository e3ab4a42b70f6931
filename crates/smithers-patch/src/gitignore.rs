//! `.gitignore` evaluation over the merged (post-step) view, git's precedence rules.
//!
//! Decision: rules are read from the **merged view** (upper if the step wrote the file, else
//! lower), i.e. the `.gitignore` files of the tree the patches produce, exactly what
//! `git status` would use after applying them. A step that edits a `.gitignore` therefore
//! changes what is reported; the `.gitignore` edit itself is a reviewed change. Root-level
//! `.git/info/exclude` of the lower tree is honoured with lower precedence than the root
//! `.gitignore`. Global excludes (`core.excludesFile`) are host-user configuration and are
//! not read. As in git, rules apply to untracked files only: a path the lower tree's git
//! index tracks is never ignored, and a directory holding tracked files is walked even when
//! a pattern excludes it (its untracked files stay ignored).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use ignore::gitignore::{Gitignore, GitignoreBuilder};
use ignore::Match;

use crate::error::PatchError;
use crate::gitindex::{read_tracked, Tracked};
use crate::overlay::merged_regular_file;

pub(crate) struct IgnoreRules<'a> {
    lower: &'a Path,
    upper: &'a Path,
    /// `upper` is a whole tree (a full copy of lower, then written by the step), not an
    /// overlay upper layer: the merged view is `upper` alone.
    whole_tree: bool,
    enabled: bool,
    /// Matcher of each directory's `.gitignore` ("" = root), `None` when it has none.
    matchers: HashMap<String, Option<Gitignore>>,
    /// Memoised "is this directory excluded by a pattern (itself or through an ancestor)".
    dir_ignored: HashMap<String, bool>,
    /// What the lower tree's git index tracks, read the first time a path matches a rule
    /// (`None` until then): a change that matches no rule never reads it, so collect costs
    /// what the step changed, not the index of a large tree (100k entries: an 8 MB file).
    /// Inside, `None`: no index, or it could not be read (see [`IgnoreRules::index_problem`]).
    tracked: Option<Option<Tracked>>,
    index_problem: Option<String>,
    /// When the project is below its repository's top: that top and the project's path in
    /// it, whose index stands in when the project has none of its own.
    index_top: Option<(PathBuf, String)>,
    /// When the project is a directory below its repository's top: the rules of the
    /// directories above it (their `.gitignore` files, deepest first, then the top's
    /// `.git/info/exclude`), each matched with the project's path from the top (`prefix`).
    outer: Vec<Gitignore>,
    prefix: String,
}

/// The repository a project directory lies below (the nearest ancestor with a `.git`), and
/// the project's path from it; `None` when the project is a repository's top or in none.
fn enclosing_repository(lower: &Path) -> Option<(PathBuf, String)> {
    let top = lower
        .ancestors()
        .skip(1)
        .find(|a| std::fs::symlink_metadata(a.join(".git")).is_ok())?;
    if std::fs::symlink_metadata(lower.join(".git")).is_ok() {
        return None;
    }
    let rel = lower.strip_prefix(top).ok()?.to_str()?.to_string();
    Some((top.to_path_buf(), rel))
}

/// The rules above a project that lies below its repository's top ([`enclosing_repository`]):
/// the `.gitignore` files from its parent up to the top, deepest first (git's precedence),
/// then the top's `.git/info/exclude`; with the top and the project's path from it. `None`
/// also for a project inside a directory the repository ignores (a home directory under a
/// dotfiles repository ignoring `*`, a build tree's `target/`): git lists none of its files,
/// so it is not part of that repository and its rules do not apply.
fn outer_rules(lower: &Path) -> Option<(PathBuf, Vec<Gitignore>, String)> {
    let (top, rel) = enclosing_repository(lower)?;
    let mut rules = Vec::new();
    for dir in lower.ancestors().skip(1) {
        rules.extend(outer_matcher(&dir.join(".gitignore"), dir));
        if dir == top {
            break;
        }
    }
    rules.extend(outer_matcher(&top.join(".git/info/exclude"), &top));
    let mut at = top.clone();
    let inside_ignored = rel.split('/').any(|c| {
        at.push(c);
        rules.iter().any(|m| m.matched(&at, true).is_ignore())
    });
    (!inside_ignored).then_some((top, rules, rel))
}

/// A `.gitignore`-format file's matcher whose patterns are relative to `root`, if it is a
/// regular file (no link followed) of at most 1 MiB.
fn outer_matcher(file: &Path, root: &Path) -> Option<Gitignore> {
    let md = std::fs::symlink_metadata(file).ok()?;
    if !md.is_file() || md.len() > 1 << 20 {
        return None;
    }
    let text = String::from_utf8_lossy(&std::fs::read(file).ok()?).into_owned();
    let mut b = GitignoreBuilder::new(root);
    for line in text.lines() {
        let _ = b.add_line(Some(file.to_path_buf()), line);
    }
    b.build().ok()
}

fn virtual_root(dir: &str) -> PathBuf {
    // Matchers are rooted at a fake absolute path so that `ignore` strips the prefix the same
    // way for the root and for nested directories.
    let mut p = PathBuf::from("/");
    if !dir.is_empty() {
        p.push(dir);
    }
    p
}

impl<'a> IgnoreRules<'a> {
    pub(crate) fn new(lower: &'a Path, upper: &'a Path, enabled: bool) -> Self {
        let (mut outer, mut prefix, mut index_top) = (Vec::new(), String::new(), None);
        if let Some((top, rules, rel)) = enabled.then(|| outer_rules(lower)).flatten() {
            index_top = Some((top, rel.clone()));
            (outer, prefix) = (rules, rel);
        }
        IgnoreRules {
            lower,
            upper,
            whole_tree: false,
            enabled,
            matchers: HashMap::new(),
            dir_ignored: HashMap::new(),
            tracked: None,
            index_problem: None,
            index_top,
            outer,
            prefix,
        }
    }

    /// Why tracked files could not be told from untracked ones (the index exists but could
    /// not be read, when a path matching a rule needed it): then every path matching a rule
    /// is treated as ignored, as before git's index was consulted, and the caller should say
    /// so.
    pub(crate) fn index_problem(&self) -> Option<&str> {
        self.index_problem.as_deref()
    }

    /// What the index tracks, read now if not yet (see [`IgnoreRules::tracked`]'s field).
    fn tracked(&mut self) -> Option<&Tracked> {
        if self.tracked.is_none() {
            let (mut tracked, mut problem) = match read_tracked(self.lower) {
                Ok(t) => (t, None),
                Err(e) => (None, Some(e)),
            };
            // The top's index, with the project's part of it.
            if let (None, None, Some((top, rel))) = (&tracked, &problem, &self.index_top) {
                match read_tracked(top) {
                    Ok(t) => tracked = t.map(|t| t.below(rel)),
                    Err(e) => problem = Some(e),
                }
            }
            self.index_problem = problem;
            self.tracked = Some(tracked);
        }
        self.tracked.as_ref().and_then(Option::as_ref)
    }

    fn is_tracked_file(&mut self, rel: &str) -> bool {
        self.tracked().is_some_and(|t| t.files.contains(rel))
    }

    fn holds_tracked(&mut self, dir: &str) -> bool {
        self.tracked().is_some_and(|t| t.dirs.contains(dir))
    }

    /// Rules of a full copy `tree` of `lower` (the post-step tree itself): `.gitignore` files
    /// are read from `tree`, `.git/info/exclude` from `lower`, as for an overlay.
    pub(crate) fn for_tree(lower: &'a Path, tree: &'a Path, enabled: bool) -> Self {
        IgnoreRules {
            whole_tree: true,
            ..IgnoreRules::new(lower, tree, enabled)
        }
    }

    fn matcher(&mut self, dir: &str) -> Result<Option<&Gitignore>, PatchError> {
        if !self.matchers.contains_key(dir) {
            let built = self.build(dir)?;
            self.matchers.insert(dir.to_string(), built);
        }
        Ok(self.matchers.get(dir).and_then(|m| m.as_ref()))
    }

    fn build(&self, dir: &str) -> Result<Option<Gitignore>, PatchError> {
        let mut sources: Vec<(PathBuf, String)> = Vec::new();
        if dir.is_empty() {
            let exclude = self.lower.join(".git/info/exclude");
            if let Some(md) = crate::overlay::lstat(&exclude)? {
                if md.is_file() {
                    sources.push((exclude.clone(), read_text(&exclude)?));
                }
            }
        }
        let rel = if dir.is_empty() {
            ".gitignore".to_string()
        } else {
            format!("{dir}/.gitignore")
        };
        let merged = if self.whole_tree {
            tree_regular_file(self.upper, &rel)?
        } else {
            merged_regular_file(self.lower, self.upper, &rel)?
        };
        if let Some(p) = merged {
            sources.push((p.clone(), read_text(&p)?));
        }
        if sources.is_empty() {
            return Ok(None);
        }
        let mut b = GitignoreBuilder::new(virtual_root(dir));
        for (from, text) in &sources {
            for line in text.lines() {
                // A malformed glob is ignored line by line, like git does.
                let _ = b.add_line(Some(from.clone()), line);
            }
        }
        Ok(b.build().ok())
    }

    /// The decision of the nearest `.gitignore` (deepest first) for `rel` alone, ignoring
    /// whether an ancestor directory is excluded.
    fn own_decision(&mut self, rel: &str, is_dir: bool) -> Result<bool, PatchError> {
        let abs = virtual_root(rel);
        let mut dir = parent(rel);
        loop {
            if let Some(m) = self.matcher(dir)? {
                match m.matched(&abs, is_dir) {
                    Match::Ignore(_) => return Ok(true),
                    Match::Whitelist(_) => return Ok(false),
                    Match::None => {}
                }
            }
            if dir.is_empty() {
                return Ok(self.outer_decision(rel, is_dir));
            }
            dir = parent(dir);
        }
    }

    /// The decision of the rules above the project (see [`IgnoreRules::outer`]).
    fn outer_decision(&self, rel: &str, is_dir: bool) -> bool {
        if self.outer.is_empty() {
            return false;
        }
        let Some(top) = self.lower.ancestors().nth(self.prefix.split('/').count()) else {
            return false;
        };
        let abs = top.join(&self.prefix).join(rel);
        for m in &self.outer {
            match m.matched(&abs, is_dir) {
                Match::Ignore(_) => return true,
                Match::Whitelist(_) => return false,
                Match::None => {}
            }
        }
        false
    }

    /// Whether directory `rel` is ignored as a whole, so that a walk need not look inside:
    /// excluded by a pattern (itself or through an ancestor) and holding no tracked file.
    pub(crate) fn is_dir_ignored(&mut self, rel: &str) -> Result<bool, PatchError> {
        Ok(self.dir_excluded(rel)? && !self.holds_tracked(rel))
    }

    /// Whether directory `rel` is excluded by a pattern, itself or because an ancestor is
    /// (git never looks inside an excluded directory for untracked files, so nothing below it
    /// can be re-included).
    fn dir_excluded(&mut self, rel: &str) -> Result<bool, PatchError> {
        if !self.enabled || rel.is_empty() {
            return Ok(false);
        }
        if let Some(v) = self.dir_ignored.get(rel) {
            return Ok(*v);
        }
        let p = parent(rel);
        let v = (!p.is_empty() && self.dir_excluded(p)?) || self.own_decision(rel, true)?;
        self.dir_ignored.insert(rel.to_string(), v);
        Ok(v)
    }

    /// Whether the non-directory `rel` is ignored: excluded by a pattern, and untracked (the
    /// index is read only for a path a pattern excludes).
    pub(crate) fn is_file_ignored(&mut self, rel: &str) -> Result<bool, PatchError> {
        if !self.enabled {
            return Ok(false);
        }
        let p = parent(rel);
        let excluded = (!p.is_empty() && self.dir_excluded(p)?) || self.own_decision(rel, false)?;
        Ok(excluded && !self.is_tracked_file(rel))
    }
}

/// `root/rel` when it is a regular file reached through real directories only (a symlinked
/// component or `.gitignore` is not followed, as for the overlay's merged view).
fn tree_regular_file(root: &Path, rel: &str) -> Result<Option<PathBuf>, PatchError> {
    let mut p = root.to_path_buf();
    let comps: Vec<&str> = rel.split('/').collect();
    let (file, dirs) = comps.split_last().expect("split never yields nothing");
    for d in dirs {
        p.push(d);
        match crate::overlay::lstat(&p)? {
            Some(md) if md.is_dir() => {}
            _ => return Ok(None),
        }
    }
    p.push(file);
    Ok(match crate::overlay::lstat(&p)? {
        Some(md) if md.is_file() => Some(p),
        _ => None,
    })
}

fn parent(rel: &str) -> &str {
    rel.rfind('/').map_or("", |i| &rel[..i])
}

fn read_text(p: &Path) -> Result<String, PatchError> {
    std::fs::read(p)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .map_err(|source| PatchError::ReadLayer {
            path: p.to_path_buf(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A project below its repository's top gets the rules of the directories above it
    /// (and of the top's exclude file) and the top's index; one inside an ignored directory
    /// of that repository is not part of it.
    #[test]
    fn rules_above_a_project_below_the_repository_top_apply() {
        let repo = tempfile::tempdir().unwrap();
        let top = repo.path();
        std::fs::create_dir_all(top.join(".git/info")).unwrap();
        std::fs::write(
            top.join(".gitignore"),
            "*.log\n/sub/built/\nignored-tree/\n",
        )
        .unwrap();
        std::fs::write(top.join(".git/info/exclude"), "*.tmp\n").unwrap();
        let sub = top.join("sub");
        std::fs::create_dir_all(sub.join("built")).unwrap();
        let upper = tempfile::tempdir().unwrap();
        let mut rules = IgnoreRules::new(&sub, upper.path(), true);
        assert!(rules.is_file_ignored("x.log").unwrap());
        assert!(rules.is_file_ignored("deep/y.tmp").unwrap());
        assert!(rules.is_dir_ignored("built").unwrap());
        assert!(!rules.is_file_ignored("main.rs").unwrap());
        // Inside a directory the repository ignores: its own project, no outer rules.
        let inner = top.join("ignored-tree/proj");
        std::fs::create_dir_all(&inner).unwrap();
        let mut rules = IgnoreRules::new(&inner, upper.path(), true);
        assert!(!rules.is_file_ignored("x.log").unwrap());
    }

    #[test]
    fn nested_rules_and_negation() {
        let lower = tempfile::tempdir().unwrap();
        let upper = tempfile::tempdir().unwrap();
        std::fs::write(
            lower.path().join(".gitignore"),
            "*.log\nbuild/\n!keep.log\n",
        )
        .unwrap();
        std::fs::create_dir_all(lower.path().join("sub")).unwrap();
        std::fs::write(
            lower.path().join("sub/.gitignore"),
            "!important.log\nsecret\n",
        )
        .unwrap();
        // The step rewrote the nested file in upper: upper wins.
        std::fs::create_dir_all(upper.path().join("sub")).unwrap();
        std::fs::write(
            upper.path().join("sub/.gitignore"),
            "!important.log\nsecret2\n",
        )
        .unwrap();
        let mut r = IgnoreRules::new(lower.path(), upper.path(), true);
        assert!(r.is_file_ignored("a.log").unwrap());
        assert!(!r.is_file_ignored("keep.log").unwrap());
        assert!(r.is_file_ignored("sub/x.log").unwrap());
        assert!(!r.is_file_ignored("sub/important.log").unwrap());
        assert!(r.is_file_ignored("sub/secret2").unwrap());
        assert!(!r.is_file_ignored("sub/secret").unwrap());
        assert!(r.is_dir_ignored("build").unwrap());
        assert!(r.is_file_ignored("build/keep.log").unwrap());
        assert!(r.is_file_ignored("x/build/y.rs").unwrap());
        assert!(!r.is_file_ignored("build.rs").unwrap());
        assert!(!r.is_file_ignored("src/main.rs").unwrap());
        let mut off = IgnoreRules::new(lower.path(), upper.path(), false);
        assert!(!off.is_file_ignored("a.log").unwrap());
    }
}
