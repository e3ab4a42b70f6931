//! Part B: atomic, conflict-checked, confined apply with crash recovery, on real files.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::*;
use smithers_errors::{CodedError, ErrorCode};
use smithers_patch::*;

fn version(content: &[u8], mode: GitMode) -> FileVersion {
    FileVersion {
        mode,
        oid: git_blob_oid(content),
        size: content.len() as u64,
        symlink_target: mode
            .is_symlink()
            .then(|| String::from_utf8(content.to_vec()).unwrap()),
        is_binary: !mode.is_symlink() && is_binary_content(content),
        content: content.to_vec(),
        encoded: None,
    }
}

/// A change as detect_changes would report it.
fn change(path: &str, old: Option<(&[u8], GitMode)>, new: Option<(&[u8], GitMode)>) -> FileChange {
    let old = old.map(|(c, m)| version(c, m));
    let new = new.map(|(c, m)| version(c, m));
    let kind = match (&old, &new) {
        (None, _) => ChangeKind::Added,
        (_, None) => ChangeKind::Deleted,
        (Some(o), Some(n)) if o.mode.is_symlink() != n.mode.is_symlink() => ChangeKind::TypeChanged,
        (Some(o), Some(n)) if o.oid == n.oid => ChangeKind::ModeChanged,
        _ => ChangeKind::Modified,
    };
    FileChange {
        path: path.into(),
        kind,
        old,
        new,
    }
}

/// Renders and parses back, as an apply from a stored bundle does.
fn via_text(changes: &[FileChange]) -> Vec<FilePatch> {
    let set = ChangeSet {
        changes: changes.to_vec(),
        ..Default::default()
    };
    let files = build_patch_files(&set);
    files
        .files
        .iter()
        .flat_map(|f| parse_patch(&f.content).unwrap())
        .collect()
}

fn tree(root: &Path) -> BTreeMap<String, Snap> {
    snapshot(root, &|r| r == ".smithers" || r.starts_with(".smithers/"))
}

fn numbered(n: usize) -> String {
    (1..=n).map(|i| format!("line {i}\n")).collect()
}

const F: GitMode = GitMode::File;
const X: GitMode = GitMode::Executable;
const L: GitMode = GitMode::Symlink;

/// A project and a change set touching every kind of operation.
fn scenario(root: &Path) -> Vec<FilePatch> {
    sh(
        root,
        &format!(
            "set -e; mkdir -p src d2/sub gone; printf '{}' > src/big.txt; printf 'x\\n' > mod.txt; \
             printf 'del\\n' > del.txt; printf 'run\\n' > run.sh; ln -s old lnk; printf 'tc\\n' > tc; \
             printf 'a\\n' > d2/a; printf 'b\\n' > d2/sub/b; printf 'g\\n' > gone/g; printf 'BIN\\000' > img; \
             printf 'file\\n' > fd; ln -s /tmp sl",
            numbered(40).replace('\n', "\\n")
        ),
    );
    let big = numbered(40);
    let big_new = big.replace("line 30\n", "THIRTY\n");
    via_text(&[
        change(
            "src/big.txt",
            Some((big.as_bytes(), F)),
            Some((big_new.as_bytes(), F)),
        ),
        change("mod.txt", Some((b"x\n", F)), Some((b"y\n", F))),
        change("del.txt", Some((b"del\n", F)), None),
        change("run.sh", Some((b"run\n", F)), Some((b"run\n", X))),
        change("lnk", Some((b"old", L)), Some((b"/etc/passwd", L))),
        change("tc", Some((b"tc\n", F)), Some((b"elsewhere", L))),
        change("d2/a", Some((b"a\n", F)), None),
        change("d2/sub/b", Some((b"b\n", F)), None),
        change("d2", None, Some((b"now a file\n", F))),
        change("gone/g", Some((b"g\n", F)), None),
        change("new/deep/file.txt", None, Some((b"new\n", F))),
        change("img", Some((b"BIN\0", F)), Some((b"BIN\0\x01\x02", F))),
        change("empty", None, Some((b"", F))),
        // A file and a symlink (to a directory outside!) that become directories.
        change("fd", Some((b"file\n", F)), None),
        change("fd/inner.txt", None, Some((b"inner\n", F))),
        change("sl", Some((b"/tmp", L)), None),
        change("sl/x", None, Some((b"x\n", F))),
    ])
}

fn expected_after(root: &Path) {
    let t = tree(root);
    let file = |p: &str| match t.get(p) {
        Some(Snap::File { content, exec }) => (content.clone(), *exec),
        other => panic!("{p}: {other:?}"),
    };
    assert_eq!(
        file("src/big.txt").0,
        numbered(40).replace("line 30\n", "THIRTY\n").into_bytes()
    );
    assert_eq!(file("mod.txt").0, b"y\n");
    assert!(!t.contains_key("del.txt"));
    assert_eq!(file("run.sh"), (b"run\n".to_vec(), true));
    assert_eq!(t["lnk"], Snap::Symlink("/etc/passwd".into()));
    assert_eq!(t["tc"], Snap::Symlink("elsewhere".into()));
    assert_eq!(file("d2").0, b"now a file\n");
    assert!(
        !root.join("gone").exists(),
        "emptied directory removed like git does: {:?}",
        std::fs::read_dir(root.join("gone"))
            .map(|d| d.map(|e| e.unwrap().file_name()).collect::<Vec<_>>())
    );
    assert_eq!(file("new/deep/file.txt").0, b"new\n");
    assert_eq!(file("img").0, b"BIN\0\x01\x02");
    assert_eq!(file("empty").0, b"");
    assert_eq!(file("fd/inner.txt").0, b"inner\n");
    assert_eq!(file("sl/x").0, b"x\n");
    assert!(std::fs::symlink_metadata(root.join("sl")).unwrap().is_dir());
}

#[test]
fn applies_every_kind_of_change() {
    let tmp = tempfile::tempdir().unwrap();
    let patches = scenario(tmp.path());
    let report = apply_patches(tmp.path(), &patches, &ApplyOptions::default()).unwrap();
    expected_after(tmp.path());
    assert!(report.applied.iter().all(|a| !a.merged));
    assert_eq!(
        report
            .applied
            .iter()
            .find(|a| a.path == "d2")
            .unwrap()
            .action,
        AppliedAction::Created
    );
    // Nothing left behind but the lock file.
    let leftovers: Vec<_> = std::fs::read_dir(tmp.path().join(".smithers/apply"))
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // Applying again: everything is already there.
    let again = apply_patches(tmp.path(), &patches, &ApplyOptions::default()).unwrap();
    assert!(again.applied.is_empty(), "{:?}", again.applied);
}

#[test]
fn conflicts_write_nothing_and_name_every_file() {
    let tmp = tempfile::tempdir().unwrap();
    let patches = scenario(tmp.path());
    // The host changed three files after the sandbox started, in ways that cannot merge.
    std::fs::write(tmp.path().join("mod.txt"), "host edit\n").unwrap();
    std::fs::write(tmp.path().join("img"), b"BIN\0host").unwrap();
    std::fs::remove_file(tmp.path().join("d2/sub/b")).unwrap();
    std::fs::write(tmp.path().join("d2/sub/host-file"), "mine\n").unwrap();
    let before = tree(tmp.path());
    let err = apply_patches(tmp.path(), &patches, &ApplyOptions::default()).unwrap_err();
    assert_eq!(err.code(), ErrorCode::ToolPatchFailed);
    let PatchError::Conflicts { conflicts } = &err else {
        panic!("{err}")
    };
    let paths: Vec<&str> = conflicts.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(paths, ["d2", "img", "mod.txt"], "{conflicts:?}");
    let details = err.details();
    assert_eq!(details["files"].as_array().unwrap().len(), 3);
    assert_eq!(
        tree(tmp.path()),
        before,
        "nothing may be written on conflict"
    );
}

#[test]
fn host_edits_elsewhere_are_merged() {
    let tmp = tempfile::tempdir().unwrap();
    let patches = scenario(tmp.path());
    // Host inserted lines at the top of big.txt and chmod'ed mod.txt: both merge.
    let host_big = format!("// host header\n{}", numbered(40));
    std::fs::write(tmp.path().join("src/big.txt"), &host_big).unwrap();
    std::fs::set_permissions(
        tmp.path().join("mod.txt"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let report = apply_patches(tmp.path(), &patches, &ApplyOptions::default()).unwrap();
    let big = report
        .applied
        .iter()
        .find(|a| a.path == "src/big.txt")
        .unwrap();
    assert!(big.merged);
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("src/big.txt")).unwrap(),
        host_big.replace("line 30\n", "THIRTY\n")
    );
    let md = std::fs::metadata(tmp.path().join("mod.txt")).unwrap();
    assert_eq!(md.permissions().mode() & 0o777, 0o755, "host chmod kept");
    assert_eq!(std::fs::read(tmp.path().join("mod.txt")).unwrap(), b"y\n");
}

#[test]
fn paths_are_confined() {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let root = tmp.path();
    std::fs::write(outside.path().join("target"), "outside\n").unwrap();
    std::os::unix::fs::symlink(outside.path(), root.join("linkdir")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("target"), root.join("linkfile")).unwrap();
    let add = |p: &str| change(p, None, Some((b"pwned\n", F)));
    for (patch, code) in [
        (add("../escape"), ErrorCode::ToolPathEscape),
        (add("/abs"), ErrorCode::ToolPathEscape),
        (add(".git/hooks/pre-commit"), ErrorCode::ToolPathEscape),
        (add("sub/.git/config"), ErrorCode::ToolPathEscape),
        (add(".smithers/db.sqlite"), ErrorCode::ToolPathEscape),
        (add("linkdir/new"), ErrorCode::ToolPathEscape),
    ] {
        let fps = file_patches(&patch);
        let err = apply_patches(root, &fps, &ApplyOptions::default()).unwrap_err();
        assert_eq!(err.code(), code, "{}: {err}", patch.path);
    }
    // Writing "through" a host symlink as if it were the file it points at: refused.
    let fps = file_patches(&change(
        "linkfile",
        Some((b"outside\n", F)),
        Some((b"pwned\n", F)),
    ));
    let err = apply_patches(root, &fps, &ApplyOptions::default()).unwrap_err();
    assert_eq!(err.code(), ErrorCode::ToolPatchFailed, "{err}");
    assert_eq!(
        std::fs::read_to_string(outside.path().join("target")).unwrap(),
        "outside\n"
    );
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1);
    // A symlink to /etc/passwd is created as a symlink, never followed.
    let fps = file_patches(&change("evil", None, Some((b"/etc/passwd", L))));
    apply_patches(root, &fps, &ApplyOptions::default()).unwrap();
    assert_eq!(
        std::fs::read_link(root.join("evil")).unwrap(),
        Path::new("/etc/passwd")
    );
    // Replacing that symlink with a file replaces the link, not /etc/passwd.
    let passwd = std::fs::read("/etc/passwd").unwrap();
    let fps = file_patches(&change(
        "evil",
        Some((b"/etc/passwd", L)),
        Some((b"x\n", F)),
    ));
    apply_patches(root, &fps, &ApplyOptions::default()).unwrap();
    assert_eq!(std::fs::read("/etc/passwd").unwrap(), passwd);
    assert_eq!(std::fs::read(root.join("evil")).unwrap(), b"x\n");
}

#[test]
fn crash_at_every_step_recovers_to_all_or_nothing() {
    crash_at_every_step(false);
}

#[test]
fn crash_at_every_step_with_copied_backups() {
    crash_at_every_step(true);
}

fn crash_at_every_step(force_copy_backups: bool) {
    let mut n = 0;
    loop {
        let tmp = tempfile::tempdir().unwrap();
        let patches = scenario(tmp.path());
        let before = tree(tmp.path());
        let opts = ApplyOptions {
            crash_after_steps: Some(n),
            force_copy_backups,
            ..Default::default()
        };
        match apply_patches(tmp.path(), &patches, &opts) {
            Err(PatchError::SimulatedCrash { .. }) => {
                let r = recover_apply(tmp.path()).unwrap();
                assert_eq!(r.rolled_back.len(), 1, "step {n}: {r:?}");
                assert_eq!(
                    tree(tmp.path()),
                    before,
                    "rollback after {n} steps is incomplete"
                );
                // Recovery is idempotent and the apply can then run to completion.
                assert_eq!(
                    recover_apply(tmp.path()).unwrap(),
                    RecoveryReport::default()
                );
                apply_patches(tmp.path(), &patches, &ApplyOptions::default()).unwrap();
                expected_after(tmp.path());
                n += 1;
            }
            Ok(_) => {
                expected_after(tmp.path());
                break;
            }
            Err(e) => panic!("step {n}: {e}"),
        }
    }
    assert!(n >= 10, "the scenario has many commit steps ({n})");

    // A crash after the commit marker rolls forward.
    let tmp = tempfile::tempdir().unwrap();
    let patches = scenario(tmp.path());
    let opts = ApplyOptions {
        crash_before_cleanup: true,
        force_copy_backups,
        ..Default::default()
    };
    assert!(matches!(
        apply_patches(tmp.path(), &patches, &opts),
        Err(PatchError::SimulatedCrash { .. })
    ));
    let r = recover_apply(tmp.path()).unwrap();
    assert_eq!(r.rolled_forward.len(), 1);
    expected_after(tmp.path());
}

#[test]
fn a_held_lock_refuses_a_second_apply() {
    let tmp = tempfile::tempdir().unwrap();
    let patches = scenario(tmp.path());
    std::fs::create_dir_all(tmp.path().join(".smithers")).unwrap();
    let f = std::fs::File::create(tmp.path().join(".smithers/apply.lock")).unwrap();
    rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive).unwrap();
    let err = apply_patches(tmp.path(), &patches, &ApplyOptions::default()).unwrap_err();
    assert!(matches!(err, PatchError::Locked { .. }), "{err}");
    drop(f);
    apply_patches(tmp.path(), &patches, &ApplyOptions::default()).unwrap();
}

#[test]
fn malformed_patches_are_invalid_input() {
    for text in [
        "",
        "garbage\n",
        "diff --git a/x b/x\nindex abc..def 100644\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n",
        "diff --git a/x b/y\nsimilarity index 90%\nrename from x\nrename to y\n",
        "diff --git a/x b/x\nnew file mode 100644\nindex 0000000000000000000000000000000000000000..ce013625030ba8dba906f756967f9e9ca394464a\n--- /dev/null\n+++ b/x\n@@ -0,0 +1,2 @@\n+hello\n",
    ] {
        let err = parse_patch(text).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidInput, "{text:?}: {err}");
    }
}

#[test]
fn review_rendering_and_counts() {
    let tmp = tempfile::tempdir().unwrap();
    let patches = scenario(tmp.path());
    let review = render_review(&patches, &ReviewOptions { color: false });
    assert!(review.contains(" img "), "{review}");
    assert!(review.contains("Bin 4 -> 6 bytes"), "{review}");
    assert!(review.contains(" 17 files changed"), "{review}");
    let text = render_patches(&patches);
    assert_eq!(
        total_diff_lines(&text),
        patches
            .iter()
            .map(|p| {
                let (a, d) = p.line_stats();
                a + d
            })
            .sum::<usize>()
    );
}

/// Deliverable 9: the host duplicated the block the step edited; the hunk's context now fits
/// in two places, so accept names a conflict and writes nothing instead of editing one copy.
#[test]
fn ambiguous_relocation_is_a_conflict_not_a_guess() {
    let tmp = tempfile::tempdir().unwrap();
    let block: String = (1..=7).map(|i| format!("    step {i}\n")).collect();
    let old = format!("top\n{block}bottom\n");
    let new = old.replace("    step 4\n", "    STEP 4\n");
    let fps = via_text(&[change(
        "f.txt",
        Some((old.as_bytes(), F)),
        Some((new.as_bytes(), F)),
    )]);
    let host = format!("top\n{block}middle\n{block}bottom\n");
    std::fs::write(tmp.path().join("f.txt"), &host).unwrap();
    let err = apply_patches(tmp.path(), &fps, &ApplyOptions::default()).unwrap_err();
    let PatchError::Conflicts { conflicts } = &err else {
        panic!("{err}")
    };
    assert_eq!(conflicts.len(), 1, "{conflicts:?}");
    assert_eq!(conflicts[0].path, "f.txt");
    assert!(
        conflicts[0].reason.contains("more than once"),
        "{conflicts:?}"
    );
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("f.txt")).unwrap(),
        host
    );
}

/// Our own state directory and git's are refused at every depth, in every case spelling, on
/// both the direct and the text path: a step must not plant `sub/.smithers/sandbox.db` (which
/// a later command run from `sub/` would trust) nor `sub/.git/hooks/*`.
#[test]
fn smithers_and_git_dirs_are_refused_at_any_depth() {
    let tmp = tempfile::tempdir().unwrap();
    for path in [
        ".smithers/sandbox.db",
        "sub/.smithers/sandbox.db",
        "a/b/.SMITHERS/x",
        "sub/.smithers",
        "x/.git/hooks/pre-commit",
        "x/.Git",
    ] {
        let fps = file_patches(&change(path, None, Some((b"planted\n", F))));
        let err = apply_patches(tmp.path(), &fps, &ApplyOptions::default()).unwrap_err();
        assert_eq!(err.code(), ErrorCode::ToolPathEscape, "{path}: {err}");
        let text = render_patches(&fps);
        let err = apply_patch_texts(tmp.path(), &[&text], &ApplyOptions::default()).unwrap_err();
        assert_eq!(err.code(), ErrorCode::ToolPathEscape, "{path}: {err}");
    }
    let entries: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        entries.iter().all(|n| n == ".smithers"),
        "nothing but the apply lock may exist: {entries:?}"
    );
    // Names that merely contain the word are ordinary files.
    let fps = file_patches(&change("sub/.smithersrc", None, Some((b"ok\n", F))));
    apply_patches(tmp.path(), &fps, &ApplyOptions::default()).unwrap();
}

/// Names that are not UTF-8 (path strings in git's quoted form) are applied to exactly those
/// bytes, through every step: a host directory holding such a file replaced by a file, a new
/// file in a new such directory, an edit; and a crash at any commit step rolls back to the
/// same bytes.
#[test]
fn non_utf8_names_apply_and_roll_back_byte_exact() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let setup = |root: &Path| {
        std::fs::create_dir(root.join("d")).unwrap();
        std::fs::write(root.join(OsStr::from_bytes(b"d/caf\xe9")), "in d\n").unwrap();
        std::fs::write(root.join(OsStr::from_bytes(b"e\xff")), "old\n").unwrap();
    };
    let changes = [
        change(&path_from_bytes(b"d/caf\xe9"), Some((b"in d\n", F)), None),
        change("d", None, Some((b"now a file\n", F))),
        change(
            &path_from_bytes(b"e\xff"),
            Some((b"old\n", F)),
            Some((b"new\n", X)),
        ),
        change(
            &path_from_bytes(b"n\xe4/s\xe4/f"),
            None,
            Some((b"deep\n", F)),
        ),
    ];
    let patches = via_text(&changes);
    let check_after = |root: &Path| {
        assert_eq!(std::fs::read(root.join("d")).unwrap(), b"now a file\n");
        let e = root.join(OsStr::from_bytes(b"e\xff"));
        assert_eq!(std::fs::read(&e).unwrap(), b"new\n");
        assert_ne!(
            std::fs::metadata(&e).unwrap().permissions().mode() & 0o100,
            0
        );
        let f = root.join(OsStr::from_bytes(b"n\xe4/s\xe4/f"));
        assert_eq!(std::fs::read(f).unwrap(), b"deep\n");
    };
    let read_all = |root: &Path| {
        let mut v = Vec::new();
        for n in [&b"d/caf\xe9"[..], b"e\xff", b"d", b"n\xe4"] {
            let p = root.join(OsStr::from_bytes(n));
            v.push((
                n.to_vec(),
                std::fs::symlink_metadata(&p).ok().map(|m| m.is_dir()),
                std::fs::read(&p).ok(),
            ));
        }
        v
    };
    let mut n = 0;
    loop {
        let tmp = tempfile::tempdir().unwrap();
        setup(tmp.path());
        let before = read_all(tmp.path());
        let opts = ApplyOptions {
            crash_after_steps: Some(n),
            ..Default::default()
        };
        match apply_patches(tmp.path(), &patches, &opts) {
            Err(PatchError::SimulatedCrash { .. }) => {
                recover_apply(tmp.path()).unwrap();
                assert_eq!(read_all(tmp.path()), before, "rollback after {n} steps");
                n += 1;
            }
            Ok(report) => {
                assert_eq!(report.applied.len(), 4, "{report:?}");
                check_after(tmp.path());
                break;
            }
            Err(e) => panic!("step {n}: {e}"),
        }
    }
    assert!(n >= 4, "{n} commit steps");
}

/// A conflicted accept can be resolved on request: the conflicting text file gets a conflict
/// block (both sides kept), the rest of the change applies, and the report names the file.
/// Without the option nothing is written; a binary conflict is never "resolved" by markers.
#[test]
fn conflict_markers_on_request_keep_both_sides() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    let base = numbered(12);
    let step = base.replace("line 6\n", "STEP SIX\n");
    let host = base.replace("line 6\n", "HOST SIX\n");
    std::fs::write(root.join("f.txt"), &host).unwrap();
    std::fs::write(root.join("other.txt"), "o\n").unwrap();
    let patches = via_text(&[
        change(
            "f.txt",
            Some((base.as_bytes(), GitMode::File)),
            Some((step.as_bytes(), GitMode::File)),
        ),
        change(
            "other.txt",
            Some((b"o\n", GitMode::File)),
            Some((b"o2\n", GitMode::File)),
        ),
    ]);
    assert!(matches!(
        apply_patches(root, &patches, &ApplyOptions::default()),
        Err(PatchError::Conflicts { .. })
    ));
    assert_eq!(std::fs::read_to_string(root.join("f.txt")).unwrap(), host);
    let opts = ApplyOptions {
        conflict_markers: true,
        ..Default::default()
    };
    let report = apply_patches(root, &patches, &opts).unwrap();
    let marked: Vec<&str> = report
        .applied
        .iter()
        .filter(|a| a.conflict_markers)
        .map(|a| a.path.as_str())
        .collect();
    assert_eq!(marked, ["f.txt"]);
    let got = std::fs::read_to_string(root.join("f.txt")).unwrap();
    assert!(
        got.contains("<<<<<<< host\n")
            && got.contains("=======\n")
            && got.contains(">>>>>>> sandbox\n"),
        "{got}"
    );
    assert!(
        got.contains("HOST SIX\n") && got.contains("STEP SIX\n"),
        "{got}"
    );
    assert!(
        got.starts_with("line 1\n") && got.ends_with("line 12\n"),
        "{got}"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("other.txt")).unwrap(),
        "o2\n"
    );

    // A binary conflict cannot be marked: the whole apply is refused, as before.
    let t2 = tempfile::tempdir().unwrap();
    std::fs::write(t2.path().join("b.bin"), b"\0host").unwrap();
    let bin = via_text(&[change(
        "b.bin",
        Some((b"\0base", GitMode::File)),
        Some((b"\0step", GitMode::File)),
    )]);
    assert!(matches!(
        apply_patches(t2.path(), &bin, &opts),
        Err(PatchError::Conflicts { .. })
    ));
    assert_eq!(std::fs::read(t2.path().join("b.bin")).unwrap(), b"\0host");
}

/// A file the host changed while the step ran (base lost) is refused; with markers, every
/// difference between the host's version and the step's becomes a block, and lines they
/// share stay as they are.
#[test]
fn host_changed_files_are_refused_or_marked() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    // The patch was made against the host's version as of collect (which already holds the
    // host's edit of line 9): applied, it would silently undo that edit.
    let host = numbered(10).replace("line 9\n", "HOST NINE\n");
    let step = numbered(10).replace("line 2\n", "STEP TWO\n");
    std::fs::write(root.join("ten.txt"), &host).unwrap();
    let patches = via_text(&[change(
        "ten.txt",
        Some((host.as_bytes(), GitMode::File)),
        Some((step.as_bytes(), GitMode::File)),
    )]);
    let mut opts = ApplyOptions::default();
    opts.host_changed.insert("ten.txt".into());
    match apply_patches(root, &patches, &opts) {
        Err(PatchError::Conflicts { conflicts }) => {
            assert_eq!(conflicts[0].path, "ten.txt");
            assert_eq!(conflicts[0].reason, HOST_CHANGED);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(std::fs::read_to_string(root.join("ten.txt")).unwrap(), host);
    opts.conflict_markers = true;
    // Changed again on the host after collect: the hunks (made against the collect-time
    // version) would revert line 9 if relocated, so even with markers it is a conflict.
    let again = format!("{host}line 11\n");
    std::fs::write(root.join("ten.txt"), &again).unwrap();
    assert!(matches!(
        apply_patches(root, &patches, &opts),
        Err(PatchError::Conflicts { .. })
    ));
    assert_eq!(
        std::fs::read_to_string(root.join("ten.txt")).unwrap(),
        again
    );
    std::fs::write(root.join("ten.txt"), &host).unwrap();
    let report = apply_patches(root, &patches, &opts).unwrap();
    assert!(report.applied[0].conflict_markers);
    let got = std::fs::read_to_string(root.join("ten.txt")).unwrap();
    assert_eq!(
        got,
        "line 1\n<<<<<<< host\nline 2\n=======\nSTEP TWO\n>>>>>>> sandbox\n\
         line 3\nline 4\nline 5\nline 6\nline 7\nline 8\n\
         <<<<<<< host\nHOST NINE\n=======\nline 9\n>>>>>>> sandbox\nline 10\n"
    );
}
