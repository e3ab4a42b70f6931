//! One truth for a step's commits and its patches.
//!
//! Accept writes two things from a step that committed: the working-tree patches (which the
//! review shows line by line) and the commit series (the branch moved to its tip, the index
//! set from the tip's tree). A series whose tip holds content the patches do not show would
//! let a step put a file in HEAD and the index that no person reviewed: commit a CI
//! workflow, delete it from the working tree, and `git reset --hard` or `git push` later
//! brings it back. So a series is brought back, and later accepted, only when every file it
//! changes from its base ends, at its tip, exactly as the reviewed patches leave that file
//! (same mode, same blob): then the tip's tree is the base plus reviewed changes, and the
//! review's findings (control characters, files the host runs) cover it.
//!
//! Every commit of the series, not only the tip, is also held to the patch applier's path
//! rules: no `.git` or `.smithers` component at any depth (git's own fsck only warns about a
//! `.git` entry in a tree), and for a project below its repository's top nothing outside it.

/// How the reviewed patches leave one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReviewedState {
    /// The patches delete it.
    Absent,
    /// The patches leave it with this git mode (`100644`, `100755`, `120000`) and blob id;
    /// `oid: None` for a mode-only change, whose content the step did not touch.
    Present { mode: String, oid: Option<String> },
}

/// One file the reviewed patches change, by its path from the project (raw bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReviewedFile {
    pub path: Vec<u8>,
    pub state: ReviewedState,
}

/// One file a series changes from its base to its tip (`diff-tree --raw`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeriesChange {
    /// From the project (or, before [`SeriesChange::within`], the repository's top).
    pub path: Vec<u8>,
    pub new_mode: String,
    /// The blob before, or `None` for an addition.
    pub before: Option<String>,
    /// The blob after, or `None` for a deletion.
    pub after: Option<String>,
}

/// The null object id `diff-tree --raw` prints for a side that does not exist.
fn present(oid: &str) -> Option<String> {
    (!oid.bytes().all(|b| b == b'0')).then(|| oid.to_string())
}

/// Parses `diff-tree -r -z --raw` output: `:oldmode newmode oldoid newoid status\0path\0`.
pub(crate) fn parse_raw(raw: &[u8]) -> Vec<SeriesChange> {
    let mut out = Vec::new();
    let mut fields = raw.split(|b| *b == 0);
    while let (Some(meta), Some(path)) = (fields.next(), fields.next()) {
        let meta = String::from_utf8_lossy(meta);
        let parts: Vec<&str> = meta.trim_start_matches(':').split(' ').collect();
        let [_, new_mode, old_oid, new_oid, status] = parts.as_slice() else {
            continue;
        };
        out.push(SeriesChange {
            path: path.to_vec(),
            new_mode: new_mode.to_string(),
            before: (!status.starts_with('A'))
                .then(|| present(old_oid))
                .flatten(),
            after: (!status.starts_with('D'))
                .then(|| present(new_oid))
                .flatten(),
        });
    }
    out
}

impl SeriesChange {
    /// The change with its path made relative to the project `prefix` (`dir/`, from the
    /// repository's top), or `None` when it lies outside the project.
    pub fn within(mut self, prefix: &[u8]) -> Option<SeriesChange> {
        if prefix.is_empty() {
            return Some(self);
        }
        let rest = self.path.strip_prefix(prefix)?.to_vec();
        self.path = rest;
        Some(self)
    }
}

/// Shows a path from git in a message (lossy is fine: it is only named, never used).
fn shown(path: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(path))
}

/// Why the series' change of one file differs from the reviewed patches, or `None`.
fn differs(change: &SeriesChange, reviewed: Option<&ReviewedState>) -> Option<String> {
    let path = shown(&change.path);
    match (reviewed, &change.after) {
        (None, _) => Some(format!(
            "a commit changes {path}, which the reviewed patches do not (its content in the commits was never shown)"
        )),
        (Some(ReviewedState::Absent), None) => None,
        (Some(ReviewedState::Absent), Some(_)) => Some(format!(
            "the commits keep {path}, which the reviewed patches delete"
        )),
        (Some(ReviewedState::Present { .. }), None) => Some(format!(
            "the commits delete {path}, which the reviewed patches keep"
        )),
        (Some(ReviewedState::Present { mode, oid }), Some(after)) => {
            if *mode != change.new_mode {
                return Some(format!(
                    "the commits leave {path} with mode {}, the reviewed patches with {mode}",
                    change.new_mode
                ));
            }
            let same = match oid {
                Some(oid) => oid == after,
                // A mode-only patch: the commits must not have changed the content either.
                None => change.before.as_deref() == Some(after.as_str()),
            };
            (!same).then(|| {
                format!("the commits leave {path} with content other than the reviewed patches show")
            })
        }
    }
}

/// Refuses a series that changes any file otherwise than the reviewed patches leave it.
/// `changes` are the series' changes from its base to its tip, paths from the project;
/// `reviewed` every file the patches change. Patches may change more files than the
/// commits (changes the step did not commit); the commits may change nothing the patches
/// do not show.
pub fn compare_with_review(
    changes: &[SeriesChange],
    reviewed: &[ReviewedFile],
) -> Result<(), String> {
    let by_path: std::collections::HashMap<&[u8], &ReviewedState> = reviewed
        .iter()
        .map(|r| (r.path.as_slice(), &r.state))
        .collect();
    let found: Vec<String> = changes
        .iter()
        .filter_map(|c| differs(c, by_path.get(c.path.as_slice()).copied()))
        .collect();
    if found.is_empty() {
        return Ok(());
    }
    let more = found.len().saturating_sub(5);
    let mut why = found.into_iter().take(5).collect::<Vec<_>>().join("; ");
    if more > 0 {
        why.push_str(&format!("; and {more} more"));
    }
    Err(format!(
        "the commits' files are not the reviewed ones: {why}"
    ))
}

/// At most this many files may differ between the series' tip and the patches (each is
/// named in README.md and shown from [`crate::SERIES_PATCH_FILE`]).
pub const MAX_TIP_DIFFERS: usize = 1000;

/// The files the series leaves at its tip otherwise than the patches, when every one of
/// them is a file the patches change too (the step committed it, then changed it again):
/// those are shown from the tip's diff in the review, so HEAD and the index get only shown
/// content. Refused (`Err`, naming them) when the series changes a file the patches do not
/// change at all (its committed content would be in no patch: a file committed and then
/// deleted from the working tree), or when there are too many.
pub fn tip_only_differences(
    changes: &[SeriesChange],
    reviewed: &[ReviewedFile],
) -> Result<Vec<Vec<u8>>, String> {
    let by_path: std::collections::HashMap<&[u8], &ReviewedState> = reviewed
        .iter()
        .map(|r| (r.path.as_slice(), &r.state))
        .collect();
    let unshown: Vec<&SeriesChange> = changes
        .iter()
        .filter(|c| !by_path.contains_key(c.path.as_slice()))
        .collect();
    if !unshown.is_empty() {
        let owned: Vec<SeriesChange> = unshown.into_iter().cloned().collect();
        return compare_with_review(&owned, reviewed).map(|()| Vec::new());
    }
    let differing: Vec<Vec<u8>> = changes
        .iter()
        .filter(|c| differs(c, by_path.get(c.path.as_slice()).copied()).is_some())
        .map(|c| c.path.clone())
        .collect();
    if differing.len() > MAX_TIP_DIFFERS {
        return Err(format!(
            "{} files are committed otherwise than the working tree leaves them, over {MAX_TIP_DIFFERS}",
            differing.len()
        ));
    }
    Ok(differing)
}

/// [`compare_with_review`], allowing differences in exactly the files `allowed` (as
/// [`tip_only_differences`] found them at collect): refused when another file differs or a
/// listed one no longer does.
pub fn compare_allowing(
    changes: &[SeriesChange],
    reviewed: &[ReviewedFile],
    allowed: &[Vec<u8>],
) -> Result<(), String> {
    let found = tip_only_differences(changes, reviewed)?;
    let found: std::collections::BTreeSet<&[u8]> = found.iter().map(Vec::as_slice).collect();
    let listed: std::collections::BTreeSet<&[u8]> = allowed.iter().map(Vec::as_slice).collect();
    if found != listed {
        let odd: Vec<String> = found
            .symmetric_difference(&listed)
            .take(5)
            .map(|p| shown(p))
            .collect();
        return Err(format!(
            "the files the commits leave otherwise than the patches are not those the review showed ({})",
            odd.join(", ")
        ));
    }
    Ok(())
}

/// Why a path a commit changes is refused, or `None`: a `.git` or `.smithers` component at
/// any depth (compared as git compares on case-insensitive file systems, trailing dots and
/// spaces ignored, so `.GIT` and `.git.` are caught too), or an empty or `..` component.
pub fn refused_path(path: &[u8]) -> Option<&'static str> {
    for part in path.split(|b| *b == b'/') {
        if part.is_empty() || part == b"." || part == b".." {
            return Some("an empty, '.' or '..' path component");
        }
        let mut end = part.len();
        while end > 0 && matches!(part[end - 1], b'.' | b' ') {
            end -= 1;
        }
        let core = &part[..end];
        if core.eq_ignore_ascii_case(b".git") {
            return Some("a .git path (the repository's own files are never written)");
        }
        if core.eq_ignore_ascii_case(b".smithers") {
            return Some("a .smithers path (this tool's state is never written by a step)");
        }
    }
    None
}

/// Parses `diff-tree --stdin --always -r -z --name-only` output over `commits` (one record
/// per commit: its id, then the paths it changes from the parent it was given) and refuses the
/// first path that is refused by [`refused_path`] or lies outside `prefix`.
pub(crate) fn check_commit_paths(
    listing: &[u8],
    commits: &[String],
    prefix: &[u8],
) -> Result<(), String> {
    let ids: std::collections::HashSet<&[u8]> = commits.iter().map(|c| c.as_bytes()).collect();
    let mut current = "";
    for token in listing.split(|b| *b == 0).filter(|t| !t.is_empty()) {
        // A commit's record starts with its id alone (`--always`: even one that changes
        // nothing). Only a token that is exactly an id is taken for one: a path named like an
        // id with more after it (`<id> .envrc`) is a path, and checked as one; a path that is
        // exactly 40 hex digits could only be skipped, and could not be refused anyway.
        if let Some(id) = ids.get(token) {
            current = std::str::from_utf8(id).unwrap_or("");
            continue;
        }
        let short = &current[..current.len().min(12)];
        if let Some(why) = refused_path(token) {
            return Err(format!("commit {short} changes {}: {why}", shown(token)));
        }
        if !token.starts_with(prefix) {
            return Err(format!(
                "commit {short} changes {}, outside the project {}",
                shown(token),
                String::from_utf8_lossy(prefix)
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "1111111111111111111111111111111111111111";
    const B: &str = "2222222222222222222222222222222222222222";
    const Z: &str = "0000000000000000000000000000000000000000";

    fn change(path: &str, before: Option<&str>, after: Option<&str>) -> SeriesChange {
        SeriesChange {
            path: path.as_bytes().to_vec(),
            new_mode: if after.is_some() { "100644" } else { "000000" }.into(),
            before: before.map(str::to_string),
            after: after.map(str::to_string),
        }
    }

    fn reviewed(path: &str, oid: Option<&str>) -> ReviewedFile {
        ReviewedFile {
            path: path.as_bytes().to_vec(),
            state: match oid {
                Some(o) => ReviewedState::Present {
                    mode: "100644".into(),
                    oid: Some(o.into()),
                },
                None => ReviewedState::Absent,
            },
        }
    }

    #[test]
    fn raw_diff_tree_parses_both_sides() {
        let raw = format!(
            ":100644 100644 {A} {B} M\0a.txt\0:000000 100755 {Z} {B} A\0dir/x\0:100644 000000 {A} {Z} D\0gone\0"
        );
        let got = parse_raw(raw.as_bytes());
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].before.as_deref(), Some(A));
        assert_eq!(got[0].after.as_deref(), Some(B));
        assert_eq!(got[1].before, None);
        assert_eq!(got[1].new_mode, "100755");
        assert_eq!(got[2].after, None);
    }

    #[test]
    fn a_commit_the_patches_do_not_show_is_refused() {
        // The step committed .envrc, then deleted it from the working tree and made a
        // harmless edit: the patches show only the edit.
        let changes = [
            change(".envrc", None, Some(A)),
            change("README", Some(A), Some(B)),
        ];
        let err = compare_with_review(&changes, &[reviewed("README", Some(B))]).unwrap_err();
        assert!(err.contains(".envrc"), "{err}");
        assert!(!err.contains("README"), "{err}");
    }

    #[test]
    fn equal_series_and_extra_uncommitted_patches_pass() {
        let changes = [change("a", Some(A), Some(B)), change("b", Some(A), None)];
        let files = [
            reviewed("a", Some(B)),
            reviewed("b", None),
            reviewed("uncommitted", Some(A)),
        ];
        compare_with_review(&changes, &files).unwrap();
    }

    #[test]
    fn content_mode_and_deletion_differences_are_named() {
        let other =
            compare_with_review(&[change("a", Some(A), Some(A))], &[reviewed("a", Some(B))]);
        assert!(other.unwrap_err().contains("content other"));
        let kept = compare_with_review(&[change("a", Some(A), Some(B))], &[reviewed("a", None)]);
        assert!(kept.unwrap_err().contains("keep"));
        let gone = compare_with_review(&[change("a", Some(A), None)], &[reviewed("a", Some(B))]);
        assert!(gone.unwrap_err().contains("delete"));
        let mut exec = change("a", Some(A), Some(B));
        exec.new_mode = "100755".into();
        let mode = compare_with_review(&[exec], &[reviewed("a", Some(B))]);
        assert!(mode.unwrap_err().contains("mode 100755"));
        // A mode-only patch: the commits may change the mode but not the content.
        let mode_only = |after| {
            compare_with_review(
                &[change("s", Some(A), Some(after))],
                &[ReviewedFile {
                    path: b"s".to_vec(),
                    state: ReviewedState::Present {
                        mode: "100644".into(),
                        oid: None,
                    },
                }],
            )
        };
        mode_only(A).unwrap();
        assert!(mode_only(B).is_err());
    }

    #[test]
    fn a_file_committed_then_edited_again_is_a_tip_difference_and_an_unshown_one_is_refused() {
        let changes = [change("a", Some(A), Some(B)), change("c", None, Some(A))];
        let files = [reviewed("a", Some(A)), reviewed("c", Some(A))];
        assert_eq!(
            tip_only_differences(&changes, &files).unwrap(),
            vec![b"a".to_vec()]
        );
        compare_allowing(&changes, &files, &[b"a".to_vec()]).unwrap();
        assert!(compare_allowing(&changes, &files, &[]).is_err());
        assert!(compare_allowing(&changes, &files, &[b"a".to_vec(), b"c".to_vec()]).is_err());
        // Committed, then deleted from the working tree: in no patch at all.
        let err = tip_only_differences(&[change(".envrc", None, Some(A))], &files).unwrap_err();
        assert!(err.contains(".envrc"), "{err}");
    }

    #[test]
    fn git_and_smithers_paths_are_refused_at_any_depth() {
        for bad in [
            ".smithers/sandbox.db",
            "a/b/.smithers/x",
            ".git/hooks/pre-commit",
            "sub/.GIT/config",
            "sub/.git./config",
            "x/.Smithers /y",
            "a//b",
            "a/../b",
        ] {
            assert!(refused_path(bad.as_bytes()).is_some(), "{bad}");
        }
        for ok in [
            ".github/workflows/ci.yml",
            ".gitignore",
            "a/.gitmodules",
            "smithers/x",
        ] {
            assert!(refused_path(ok.as_bytes()).is_none(), "{ok}");
        }
    }

    #[test]
    fn commit_paths_are_checked_per_commit_and_within_the_project() {
        let c1 = A.to_string();
        let c2 = B.to_string();
        let listing = format!("{A}\0sub/ok.txt\0{B}\0sub/.smithers/sandbox.db\0");
        let err =
            check_commit_paths(listing.as_bytes(), &[c1.clone(), c2.clone()], b"sub/").unwrap_err();
        assert!(
            err.contains("222222222222") && err.contains(".smithers"),
            "{err}"
        );
        let outside = format!("{A}\0other/x\0");
        let err =
            check_commit_paths(outside.as_bytes(), std::slice::from_ref(&c1), b"sub/").unwrap_err();
        assert!(err.contains("outside"), "{err}");
        // A path named after a commit id, with more after it, is a path all the same.
        let named = format!("{A}\0sub/a\0{B}\0{A} .envrc\0");
        let err =
            check_commit_paths(named.as_bytes(), &[c1.clone(), c2.clone()], b"sub/").unwrap_err();
        assert!(err.contains("outside"), "{err}");
        let fine = format!("{A}\0sub/a\0{B}\0sub/b\0");
        check_commit_paths(fine.as_bytes(), &[c1, c2], b"sub/").unwrap();
    }
}
