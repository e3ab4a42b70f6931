//! Change detection on hand-built layers (no mount needed): what overlayfs leaves in upper is
//! written directly, so these run anywhere (whiteouts need CAP_MKNOD and are covered by the
//! overlay round-trip tests).

mod common;

use std::os::unix::fs::PermissionsExt;

use common::*;
use smithers_patch::*;

fn kinds(set: &ChangeSet) -> Vec<(&str, ChangeKind)> {
    set.changes
        .iter()
        .map(|c| (c.path.as_str(), c.kind))
        .collect()
}

#[test]
fn copy_up_mode_symlink_and_gitignore() {
    let l = Layers::new();
    sh(
        &l.lower,
        "mkdir -p src && printf 'same\\n' > src/same.rs && printf 'run\\n' > run.sh && \
         ln -s a lnk && printf '*.o\\n' > .gitignore",
    );
    // Upper: an untouched copy-up, a chmod +x, a re-pointed symlink, an ignored object file,
    // and a .gitignore rewritten by the step (the merged view's rules apply).
    sh(
        &l.upper,
        "mkdir -p src && printf 'same\\n' > src/same.rs && printf 'run\\n' > run.sh && chmod +x run.sh && \
         ln -s b lnk && printf 'x' > main.o && printf 'y' > keep.log && printf '*.o\\n*.log\\n' > .gitignore",
    );
    let set = detect_changes(&l.lower, &l.upper, &DetectOptions::default()).unwrap();
    assert_eq!(
        kinds(&set),
        [
            (".gitignore", ChangeKind::Modified),
            ("lnk", ChangeKind::Modified),
            ("run.sh", ChangeKind::ModeChanged),
        ]
    );
    let ignored: Vec<&str> = set.ignored.iter().map(|i| i.path.as_str()).collect();
    assert_eq!(ignored, ["keep.log", "main.o"]);
    let lnk = &set.changes[1];
    assert_eq!(
        lnk.old.as_ref().unwrap().symlink_target.as_deref(),
        Some("a")
    );
    assert_eq!(
        lnk.new.as_ref().unwrap().symlink_target.as_deref(),
        Some("b")
    );

    let all = DetectOptions {
        respect_gitignore: false,
        ..Default::default()
    };
    let set = detect_changes(&l.lower, &l.upper, &all).unwrap();
    assert_eq!(set.changes.len(), 5);
}

#[test]
fn opaque_directory_in_user_xattr_form() {
    let l = Layers::new();
    sh(&l.lower, "mkdir -p d/sub && printf 'a\\n' > d/a && printf 'b\\n' > d/sub/b && printf 'k\\n' > d/keep");
    sh(
        &l.upper,
        "mkdir -p d && printf 'k\\n' > d/keep && printf 'n\\n' > d/new",
    );
    if let Err(e) = rustix::fs::lsetxattr(
        l.upper.join("d"),
        "user.overlay.opaque",
        b"y",
        rustix::fs::XattrFlags::empty(),
    ) {
        skip_or_fail(&format!("user xattrs unsupported here: {e}"));
        return;
    }
    let set = detect_changes(&l.lower, &l.upper, &DetectOptions::default()).unwrap();
    // Re-created with the same content: d/keep is not a change.
    assert_eq!(
        kinds(&set),
        [
            ("d/a", ChangeKind::Deleted),
            ("d/new", ChangeKind::Added),
            ("d/sub/b", ChangeKind::Deleted),
        ]
    );
    // The deleted files carry their old content for the patch.
    assert_eq!(set.changes[0].old.as_ref().unwrap().content, b"a\n");
}

/// A change set over the content bound keeps everything that fits: the largest change is
/// left out (named, with its size and the limit), the small edit stays.
#[test]
fn oversized_changes_are_left_out_and_the_rest_is_kept() {
    let l = Layers::new();
    std::fs::write(l.upper.join("big"), vec![b'x'; 4096]).unwrap();
    std::fs::write(l.upper.join("small"), b"s").unwrap();
    let opts = DetectOptions {
        max_content_bytes: 1000,
        ..Default::default()
    };
    let set = detect_changes(&l.lower, &l.upper, &opts).unwrap();
    assert_eq!(kinds(&set), [("small", ChangeKind::Added)]);
    assert_eq!(set.over_limit.len(), 1, "{:?}", set.over_limit);
    assert_eq!(set.over_limit[0].path, "big");
    let reason = &set.over_limit[0].reason;
    assert!(
        reason.contains("4096 bytes") && reason.contains("1000-byte"),
        "{reason}"
    );
    assert!(reason.contains("max_content_bytes"), "{reason}");
    // Within the bound nothing is left out.
    let set = detect_changes(&l.lower, &l.upper, &DetectOptions::default()).unwrap();
    assert_eq!(set.changes.len(), 2);
    assert!(set.over_limit.is_empty());
}

#[test]
fn special_files_and_empty_dirs_are_reported_not_dropped() {
    let l = Layers::new();
    sh(&l.upper, "mkfifo pipe && mkdir -p empty/inner");
    let set = detect_changes(&l.lower, &l.upper, &DetectOptions::default()).unwrap();
    assert!(set.changes.is_empty());
    let skipped: Vec<&str> = set.skipped.iter().map(|s| s.path.as_str()).collect();
    assert_eq!(skipped, ["empty/inner/", "pipe"]);
}

#[test]
fn executable_new_file_and_binary() {
    let l = Layers::new();
    std::fs::write(l.upper.join("tool"), b"#!/bin/sh\n").unwrap();
    std::fs::set_permissions(l.upper.join("tool"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(l.upper.join("blob"), b"\x00\x01\x02").unwrap();
    let set = detect_changes(&l.lower, &l.upper, &DetectOptions::default()).unwrap();
    let files = build_patch_files(&set);
    let text: String = files.files.iter().map(|f| f.content.as_str()).collect();
    assert!(text.contains("new file mode 100755"), "{text}");
    assert!(text.contains("GIT binary patch\nliteral 3\n"), "{text}");
    let blob = files.diff_bundle.iter().find(|e| e.path == "blob").unwrap();
    assert_eq!(blob.binary_content.as_deref(), Some("AAEC"));
    let json = serde_json::to_value(blob).unwrap();
    assert_eq!(json["operation"], "add");
    assert_eq!(json["binaryContent"], "AAEC");
}

/// More than 1000 changed files: grouped patch files, every change kept, and git applies them.
#[test]
fn more_than_a_thousand_changes_are_grouped_and_apply() {
    let l = Layers::new();
    for i in 0..1200 {
        let d = l.upper.join(format!("dir{:02}", i % 12));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(format!("f{i:04}.txt")), format!("file {i}\n")).unwrap();
    }
    std::fs::write(l.upper.join("root.txt"), "root\n").unwrap();
    let set = detect_changes(&l.lower, &l.upper, &DetectOptions::default()).unwrap();
    assert_eq!(set.changes.len(), 1201);
    let files = build_patch_files(&set);
    assert_eq!(files.files.len(), 13, "12 directories + the root file");
    assert_eq!(files.diff_bundle.len(), 1201);
    assert!(files.files.iter().all(|f| f.bundle_path.len() <= 1024));
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("t");
    std::fs::create_dir_all(&target).unwrap();
    let mut args = vec!["apply".to_string()];
    for f in &files.files {
        let p = tmp.path().join(f.bundle_path.replace('/', "_"));
        std::fs::write(&p, &f.content).unwrap();
        args.push(p.to_str().unwrap().to_string());
    }
    let out = std::process::Command::new("git")
        .args(&args)
        .current_dir(&target)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_same_tree(
        &snapshot(&l.upper, &|_| false),
        &snapshot(&target, &|_| false),
    );
}

/// A host edit to a lower file after the step copied it up is flagged: applying that patch
/// would undo the host's edit.
#[test]
fn host_edits_after_copy_up_are_flagged_as_stale_base() {
    let l = Layers::new();
    std::fs::write(l.lower.join("before.txt"), "host v1\n").unwrap();
    std::fs::write(l.lower.join("after.txt"), "host v1\n").unwrap();
    fs_clock_tick(&l.upper);
    // The step copies both up and edits them...
    std::fs::write(l.upper.join("before.txt"), "sandbox\n").unwrap();
    std::fs::write(l.upper.join("after.txt"), "sandbox\n").unwrap();
    fs_clock_tick(&l.upper);
    // ...then the host edits one of them (the lower layer is the live host tree).
    std::fs::write(l.lower.join("after.txt"), "host v2\n").unwrap();
    let set = detect_changes(&l.lower, &l.upper, &DetectOptions::default()).unwrap();
    assert_eq!(set.changes.len(), 2);
    if !set.stale_base_checked {
        skip_or_fail("this filesystem reports no birth times");
        return;
    }
    assert_eq!(set.stale_base, ["after.txt"]);
}

/// A step writes our state directory or git's below the top level, in any case spelling: no
/// patch is made for it (apply would refuse it, failing the whole accept) and each is listed
/// as left out, excluded.
#[test]
fn nested_smithers_and_git_dirs_are_excluded_and_listed() {
    let l = Layers::new();
    sh(&l.lower, "mkdir -p sub && printf 'k\\n' > sub/keep");
    sh(
        &l.upper,
        "mkdir -p sub/.smithers a/b/.SMITHERS c/.Git && printf 'db' > sub/.smithers/sandbox.db && \
         printf 'x' > a/b/.SMITHERS/x && printf 'h' > c/.Git/config && printf 'ok\\n' > a/real",
    );
    let set = detect_changes(&l.lower, &l.upper, &DetectOptions::default()).unwrap();
    assert_eq!(kinds(&set), [("a/real", ChangeKind::Added)]);
    let ignored: Vec<(&str, IgnoreReason)> = set
        .ignored
        .iter()
        .map(|i| (i.path.as_str(), i.reason))
        .collect();
    assert_eq!(
        ignored,
        [
            ("a/b/.SMITHERS/", IgnoreReason::Excluded),
            ("c/.Git/", IgnoreReason::Excluded),
            ("sub/.smithers/", IgnoreReason::Excluded),
        ]
    );
}

/// The project's `.smithers` is hidden from the step by a whiteout the runtime puts in the
/// upper layer: that whiteout is no change (nothing listed); a `.smithers` the step made in its
/// place (an opaque directory over the whiteout) is excluded and listed. A whiteout of `.git`
/// (the step removed it) is still listed. Whiteouts need no privilege since Linux 5.8.
#[test]
fn the_hidden_state_whiteout_is_no_change_and_a_made_smithers_is_listed() {
    let whiteout = |path: &std::path::Path| {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            path,
            rustix::fs::FileType::CharacterDevice,
            rustix::fs::Mode::empty(),
            0,
        )
    };
    let l = Layers::new();
    sh(
        &l.lower,
        "mkdir -p .smithers .git && printf 'db' > .smithers/sandbox.db",
    );
    if let Err(e) = whiteout(&l.upper.join(".smithers")) {
        smithers_test_support::skip_optional(&format!("mknod of a whiteout refused: {e}"));
        return;
    }
    sh(&l.upper, "printf 'x\\n' > a");
    let set = detect_changes(&l.lower, &l.upper, &DetectOptions::default()).unwrap();
    assert_eq!(kinds(&set), [("a", ChangeKind::Added)]);
    assert!(set.ignored.is_empty(), "{:?}", set.ignored);

    whiteout(&l.upper.join(".git")).unwrap();
    std::fs::remove_file(l.upper.join(".smithers")).unwrap();
    sh(
        &l.upper,
        "mkdir .smithers && printf 'mine' > .smithers/notes",
    );
    let set = detect_changes(&l.lower, &l.upper, &DetectOptions::default()).unwrap();
    let ignored: Vec<&str> = set.ignored.iter().map(|i| i.path.as_str()).collect();
    assert_eq!(ignored, [".git/", ".smithers/"]);
}
