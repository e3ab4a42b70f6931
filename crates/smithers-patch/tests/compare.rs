//! `detect_changes_by_compare` on hand-built trees: what only the full-tree comparison does
//! (streamed comparison of unchanged files, entries present on both sides, stale bases of a
//! copy). The change kinds themselves, and equality with the overlay walk, are in
//! `overlay_roundtrip.rs`.

mod common;

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use common::*;
use smithers_patch::*;

fn kinds(set: &ChangeSet) -> Vec<(&str, ChangeKind)> {
    set.changes
        .iter()
        .map(|c| (c.path.as_str(), c.kind))
        .collect()
}

/// A project tree and, made afterwards, its copy (`cp -a`, as ship makes it).
struct Trees {
    _tmp: tempfile::TempDir,
    lower: PathBuf,
    copy: PathBuf,
}

fn trees(setup: &str) -> Trees {
    let tmp = tempfile::tempdir().unwrap();
    let lower = tmp.path().join("lower");
    std::fs::create_dir(&lower).unwrap();
    sh(&lower, setup);
    fs_clock_tick(tmp.path());
    let copy = tmp.path().join("copy");
    sh(
        &lower,
        &format!("mkdir {c} && cp -a . {c}", c = copy.display()),
    );
    Trees {
        _tmp: tmp,
        lower,
        copy,
    }
}

fn compare(t: &Trees) -> ChangeSet {
    detect_changes_by_compare(&t.lower, &t.copy, &DetectOptions::default()).expect("compare")
}

#[test]
fn an_untouched_copy_has_no_changes() {
    let t = trees(
        "mkdir -p src empty .git && printf 'x\\n' > src/a.rs && chmod +x src/a.rs && \
         ln -s src/a.rs lnk && ln -s /nowhere dangling && mkfifo pipe && \
         printf 'target/\\n' > .gitignore && mkdir -p target && printf 'o' > target/x.o && \
         printf 'ref: refs/heads/main\\n' > .git/HEAD",
    );
    let set = compare(&t);
    assert!(set.changes.is_empty(), "{:?}", kinds(&set));
    assert!(set.ignored.is_empty(), "{:?}", set.ignored);
    assert!(set.skipped.is_empty(), "{:?}", set.skipped);
    assert!(set.stale_base.is_empty(), "{:?}", set.stale_base);
}

/// Sizes first, then contents block by block: equal big files are not changes (and are never
/// loaded: the content bound would be exceeded otherwise), a difference in the last byte or
/// in the size is found.
#[test]
fn big_files_are_compared_by_content_without_being_loaded() {
    // The last byte is fixed ('A'), so that writing 'Z' there always changes it (a random one
    // was 'Z' already once in 256 runs, and CI saw it).
    let t = trees(
        "head -c 2999999 /dev/urandom > same.bin && printf 'A' >> same.bin && \
         cp same.bin last.bin && cp same.bin grown.bin",
    );
    sh(
        &t.copy,
        "printf 'Z' | dd of=last.bin bs=1 seek=2999999 conv=notrunc 2>/dev/null && printf 'more' >> grown.bin",
    );
    let small = DetectOptions {
        max_content_bytes: 13_000_000,
        ..Default::default()
    };
    let set = detect_changes_by_compare(&t.lower, &t.copy, &small).unwrap();
    assert_eq!(
        kinds(&set),
        [
            ("grown.bin", ChangeKind::Modified),
            ("last.bin", ChangeKind::Modified)
        ]
    );
    // The bound counts only the two changed files (old + new of each), not the unchanged one.
    let tight = DetectOptions {
        max_content_bytes: 11_000_000,
        ..Default::default()
    };
    // Over it, the larger of the two (grown.bin, 4 bytes more) is left out, named, and the
    // other is kept.
    let set = detect_changes_by_compare(&t.lower, &t.copy, &tight).unwrap();
    assert_eq!(kinds(&set), [("last.bin", ChangeKind::Modified)]);
    let left: Vec<&str> = set.over_limit.iter().map(|s| s.path.as_str()).collect();
    assert_eq!(left, ["grown.bin"]);
}

/// An ignored directory that was already there is neither walked nor reported (it may be
/// huge); one the step created is reported. An ignored file rewritten with the same bytes is
/// not reported; one with new bytes is.
#[test]
fn ignored_paths_are_reported_only_when_the_step_changed_them() {
    let t = trees(
        "printf 'target/\\nbuild/\\n*.log\\n' > .gitignore && mkdir -p target && printf 'o' > target/old.o && \
         printf 'same\\n' > same.log && printf 'old\\n' > changed.log",
    );
    sh(
        &t.copy,
        "printf 'new' > target/new.o && rm target/old.o && mkdir build && printf 'b' > build/b.o && \
         printf 'same\\n' > same.log && printf 'new\\n' > changed.log && printf 'x\\n' > added.log",
    );
    let set = compare(&t);
    assert!(set.changes.is_empty(), "{:?}", kinds(&set));
    let ignored: Vec<&str> = set.ignored.iter().map(|i| i.path.as_str()).collect();
    assert_eq!(ignored, ["added.log", "build/", "changed.log"]);
}

/// Special files: unchanged when both sides have the same kind; new or deleted ones are
/// reported as not representable. Names that are not UTF-8 are ordinary changes (their path
/// strings in git's quoted form), silent when identical on both sides, also in and below a
/// directory whose name is not UTF-8.
#[test]
fn special_files_and_non_utf8_names() {
    let t = trees(
        "mkfifo same_fifo gone_fifo && printf 'a' > \"$(printf 'caf\\351')\" && \
         mkdir \"$(printf 'd\\377')\" && printf 'b' > \"$(printf 'd\\377/old')\"",
    );
    sh(&t.copy, "rm gone_fifo && mkfifo new_fifo");
    let bad = std::ffi::OsStr::from_bytes(b"new\xff");
    std::fs::write(t.copy.join(bad), "x").unwrap();
    std::fs::write(
        t.copy.join(std::ffi::OsStr::from_bytes(b"d\xff/n\xe9w")),
        "y",
    )
    .unwrap();
    let set = compare(&t);
    assert_eq!(
        kinds(&set),
        [
            ("\"d\\377/n\\351w\"", ChangeKind::Added),
            ("\"new\\377\"", ChangeKind::Added),
        ]
    );
    assert_eq!(
        path_to_bytes(&set.changes[0].path).unwrap(),
        b"d\xff/n\xe9w"
    );
    let skipped: Vec<&str> = set.skipped.iter().map(|s| s.path.as_str()).collect();
    assert_eq!(skipped, ["gone_fifo", "new_fifo"], "{:?}", set.skipped);
}

/// The host edits its tree while the step runs on the copy: every change whose lower side
/// changed after the copy was made is flagged — a file the step edited, one it deleted, and
/// one it never touched (which the comparison sees as the step reverting the host's edit).
#[test]
fn host_edits_after_the_copy_are_flagged_as_stale_base() {
    let t = trees(
        "printf 'v1\\n' > edited && printf 'v1\\n' > deleted && printf 'v1\\n' > untouched && \
         printf 'v1\\n' > quiet",
    );
    sh(
        &t.copy,
        "printf 'step\\n' > edited && rm deleted && printf 'step\\n' > quiet",
    );
    fs_clock_tick(&t.copy);
    sh(
        &t.lower,
        "printf 'v2\\n' > edited && printf 'v2\\n' > deleted && printf 'v2\\n' > untouched",
    );
    let set = compare(&t);
    assert_eq!(
        kinds(&set),
        [
            ("deleted", ChangeKind::Deleted),
            ("edited", ChangeKind::Modified),
            ("quiet", ChangeKind::Modified),
            ("untouched", ChangeKind::Modified),
        ]
    );
    if !set.stale_base_checked {
        skip_or_fail("this filesystem reports no birth times");
        return;
    }
    assert_eq!(set.stale_base, ["deleted", "edited", "untouched"]);
}

#[test]
fn roots_must_be_directories() {
    let t = trees("printf 'x' > f");
    for (lower, copy) in [
        (t.lower.join("f"), t.copy.clone()),
        (t.lower.clone(), t.copy.join("missing")),
    ] {
        let err = detect_changes_by_compare(Path::new(&lower), &copy, &DetectOptions::default())
            .unwrap_err();
        assert!(matches!(err, PatchError::ReadLayer { .. }), "{err}");
    }
}

/// git's semantics: ignore rules apply to untracked files only. A tracked file that matches
/// `.gitignore` (added with `git add -f`, or tracked before the rule) is a change when the
/// step edits or deletes it, also inside an ignored directory; a new ignored file is left
/// out and said so.
#[test]
fn tracked_files_matching_gitignore_are_still_changes() {
    let t = trees(
        "git init -q . && printf '*.log\\nbuild/\\n' > .gitignore && \
         printf 'tracked\\n' > keep.log && mkdir -p build && printf 'o\\n' > build/out.log && \
         printf 'gen\\n' > build/gen.txt && \
         git -c user.email=t@t -c user.name=t add -f .gitignore keep.log build/out.log && \
         git -c user.email=t@t -c user.name=t commit -qm init",
    );
    sh(
        &t.copy,
        "printf 'edited\\n' > keep.log && rm build/out.log && printf 'new\\n' > new.log && \
         printf 'gen2\\n' > build/gen.txt && printf 'x\\n' > build/untracked.log",
    );
    let set = compare(&t);
    assert_eq!(
        kinds(&set),
        [
            ("build/out.log", ChangeKind::Deleted),
            ("keep.log", ChangeKind::Modified)
        ]
    );
    let ignored: Vec<&str> = set.ignored.iter().map(|i| i.path.as_str()).collect();
    assert!(ignored.contains(&"new.log"), "{ignored:?}");
    assert!(ignored.contains(&"build/gen.txt"), "{ignored:?}");
    assert!(ignored.contains(&"build/untracked.log"), "{ignored:?}");
    assert!(set.notes.is_empty(), "{:?}", set.notes);
}

/// A corrupt index is said, never silently taken as "nothing tracked".
#[test]
fn an_unreadable_index_is_noted() {
    let t =
        trees("mkdir .git && printf 'DIRC garbage' > .git/index && printf '*.log\\n' > .gitignore");
    sh(&t.copy, "printf 'x\\n' > a.log");
    let set = compare(&t);
    assert_eq!(set.notes.len(), 1, "{:?}", set.notes);
    assert!(set.notes[0].contains(".git/index"), "{:?}", set.notes);
}

/// The comparison excludes `.smithers` and `.git` at any depth (any case) like the overlay
/// walk: listed as left out when the step made one, never a patch.
#[test]
fn nested_smithers_and_git_dirs_are_excluded_and_listed() {
    let t =
        trees("mkdir -p sub old/.git && printf 'k\\n' > sub/keep && printf 'h' > old/.git/HEAD");
    sh(
        &t.copy,
        "mkdir -p sub/.smithers x/.GIT && printf 'db' > sub/.smithers/sandbox.db && \
         printf 'h' > x/.GIT/config && printf 'changed' > old/.git/HEAD && printf 'ok\\n' > real",
    );
    let set = compare(&t);
    assert_eq!(kinds(&set), [("real", ChangeKind::Added)]);
    let ignored: Vec<(&str, IgnoreReason)> = set
        .ignored
        .iter()
        .map(|i| (i.path.as_str(), i.reason))
        .collect();
    assert_eq!(
        ignored,
        [
            ("sub/.smithers/", IgnoreReason::Excluded),
            ("x/.GIT/", IgnoreReason::Excluded),
        ]
    );
}

/// A copy never holds the project's `.smithers` (the runtime does not copy it): its absence
/// is no change; one the step made in the copy is excluded and listed.
#[test]
fn the_hidden_state_dir_is_no_change_until_the_step_makes_one() {
    let t = trees("mkdir .smithers && printf 'db' > .smithers/sandbox.db && printf 'a\\n' > a");
    sh(&t.copy, "rm -r .smithers");
    let set = compare(&t);
    assert!(set.changes.is_empty() && set.ignored.is_empty(), "{set:?}");
    sh(
        &t.copy,
        "mkdir .smithers && printf 'mine' > .smithers/notes",
    );
    let set = compare(&t);
    assert!(set.changes.is_empty(), "{:?}", kinds(&set));
    let ignored: Vec<&str> = set.ignored.iter().map(|i| i.path.as_str()).collect();
    assert_eq!(ignored, [".smithers/"]);
}
