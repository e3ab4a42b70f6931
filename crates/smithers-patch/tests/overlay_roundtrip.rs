//! THE key test: real overlayfs mounts, real changes made through the merged view, then
//! detect → render → `git apply` (the real git CLI) on a copy of lower must reproduce the
//! merged view byte for byte (contents, exec bits, symlink targets, file set).

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use common::*;
use smithers_patch::*;

/// The project before the step.
const SETUP_LOWER: &str = r#"set -e
mkdir -p src olddir/sub olddir2/a/b recreated d2 sub
printf 'fn main() {\n    println!("hi");\n}\n' > src/main.rs
printf 'pub fn lib() {}\n' > src/lib.rs
printf '# readme\n' > README.md
printf '#!/bin/sh\necho script\n' > script.sh
printf '#!/bin/sh\necho old\n' > tool.sh
printf 'BIN\000\001\002original' > data.bin
printf 'a\n' > olddir/a.txt
printf 'b\n' > olddir/sub/b.txt
printf 'deep\n' > olddir2/a/b/deep.txt
printf 'top\n' > olddir2/top.txt
printf 'same x\n' > recreated/x.txt
printf 'y\n' > recreated/y.txt
ln -s src/main.rs lnk
printf 'tc\n' > tc
ln -s somewhere tc2
printf 'in d2\n' > d2/f1
printf 'in d2 too\n' > d2/f2
printf 'spaced\n' > 'name with space.txt'
printf 'a\nb' > nonl.txt
: > empty_old
i=1; while [ $i -le 200 ]; do echo "line $i"; i=$((i+1)); done > big.txt
printf 'caf\351 latin1\n' > latin1.txt
printf 'a\r\nb\r\n' > crlf.txt
printf '*.log\ntarget/\n' > .gitignore
printf '*.tmp\n' > sub/.gitignore
printf 'keep\n' > sub/existing.txt
printf 'old log\n' > kept.log
printf 'f\n' > f2d
ln -s src s2d
"#;

/// What the step does, through the merged view.
const STEP: &str = r#"set -e
printf 'fn main() {\n    println!("changed");\n}\n' > src/main.rs
: >> src/lib.rs
rm README.md
chmod +x script.sh
printf '#!/bin/sh\necho new\n' > tool.sh && chmod +x tool.sh
printf 'BIN\000\001\002changed!' > data.bin
head -c 3000 /dev/urandom > new.bin
mv olddir newdir
rm -rf olddir2
rm -rf recreated && mkdir recreated && printf 'same x\n' > recreated/x.txt && printf 'z\n' > recreated/z.txt
ln -s /etc/passwd evil_link
ln -sfn src/lib.rs lnk
rm tc && ln -s target_of_tc tc
rm tc2 && printf 'now a file\n' > tc2
rm -rf d2 && printf 'file replacing dir\n' > d2
mkdir -p 'dir with space' && printf 'x\n' > 'dir with space/ünïcödé file.txt'
printf 'modified\n' >> 'name with space.txt'
printf 'a\nc' > nonl.txt
printf 'x' > added_nonl.txt
printf 'log\n' > debug.log
mkdir -p target && printf 'o' > target/out.o
printf 'scratch\n' > sub/x.tmp
printf 'new in existing dir\n' > sub/new.txt
mkdir -p .smithers && echo x > .smithers/state
mkdir -p .git && echo x > .git/config
mkdir -p nested/.git && echo x > nested/.git/HEAD && echo 'nested\n' > nested/file.txt
: > empty_new
rm empty_old
sed -i 's/^line 50$/LINE 50/; s/^line 150$/LINE 150/' big.txt
printf 'caf\351 changed\n' > latin1.txt
printf 'a\r\nB\r\n' > crlf.txt
printf 'q\n' > 'quote"name.txt'
printf 'tab\n' > "$(printf 'tab\tname.txt')"
mkfifo fifo1
mkdir emptydir
rm f2d && mkdir f2d && printf 'in\n' > f2d/in.txt
rm s2d && mkdir s2d && printf 's\n' > s2d/s.txt
"#;

/// Paths that the step changed but that must not travel (ignored, excluded, unrepresentable).
fn not_transported(rel: &str) -> bool {
    rel == ".git"
        || rel.starts_with(".git/")
        || rel == ".smithers"
        || rel.starts_with(".smithers/")
        || rel == "debug.log"
        || rel == "target"
        || rel.starts_with("target/")
        || rel == "sub/x.tmp"
        || rel == "fifo1"
        || rel.starts_with("nested/.git")
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("git");
    assert!(
        out.status.success(),
        "git {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Checks the change set's key facts, renders it, then applies the patches with real git on a
/// copy of lower and compares with the merged snapshot.
fn check_round_trip(l: &Layers, set: &ChangeSet) {
    let by_path: BTreeMap<&str, &FileChange> =
        set.changes.iter().map(|c| (c.path.as_str(), c)).collect();
    let kind = |p: &str| by_path.get(p).map(|c| c.kind);

    // Copied up but unchanged (append of nothing; rm -rf + re-create with the same content).
    assert_eq!(
        kind("src/lib.rs"),
        None,
        "copy-up without change is not a change"
    );
    assert_eq!(kind("recreated/x.txt"), None);
    assert_eq!(kind("recreated/y.txt"), Some(ChangeKind::Deleted));
    assert_eq!(kind("recreated/z.txt"), Some(ChangeKind::Added));
    assert_eq!(kind("src/main.rs"), Some(ChangeKind::Modified));
    assert_eq!(kind("README.md"), Some(ChangeKind::Deleted));
    assert_eq!(kind("script.sh"), Some(ChangeKind::ModeChanged));
    let tool = by_path["tool.sh"];
    assert_eq!(tool.kind, ChangeKind::Modified);
    assert_eq!(
        (tool.old_mode(), tool.new_mode()),
        (Some(GitMode::File), Some(GitMode::Executable))
    );
    assert!(by_path["data.bin"].is_binary());
    assert!(
        by_path["latin1.txt"].is_binary(),
        "non-UTF-8 text travels as binary"
    );
    assert_eq!(kind("olddir/a.txt"), Some(ChangeKind::Deleted));
    assert_eq!(kind("olddir/sub/b.txt"), Some(ChangeKind::Deleted));
    assert_eq!(kind("newdir/sub/b.txt"), Some(ChangeKind::Added));
    assert_eq!(kind("olddir2/a/b/deep.txt"), Some(ChangeKind::Deleted));
    let evil = by_path["evil_link"];
    assert_eq!(evil.kind, ChangeKind::Added);
    assert_eq!(evil.new_mode(), Some(GitMode::Symlink));
    assert_eq!(
        evil.new.as_ref().unwrap().symlink_target.as_deref(),
        Some("/etc/passwd")
    );
    assert_eq!(kind("lnk"), Some(ChangeKind::Modified));
    assert_eq!(kind("tc"), Some(ChangeKind::TypeChanged));
    assert_eq!(kind("tc2"), Some(ChangeKind::TypeChanged));
    assert_eq!(kind("d2"), Some(ChangeKind::Added));
    assert_eq!(kind("d2/f1"), Some(ChangeKind::Deleted));
    assert_eq!(kind("kept.log"), None);
    assert_eq!(kind("f2d"), Some(ChangeKind::Deleted));
    assert_eq!(kind("f2d/in.txt"), Some(ChangeKind::Added));
    assert_eq!(kind("s2d"), Some(ChangeKind::Deleted));
    assert_eq!(kind("s2d/s.txt"), Some(ChangeKind::Added));
    assert_eq!(kind("nested/file.txt"), Some(ChangeKind::Added));
    for p in [
        "debug.log",
        "target/",
        "sub/x.tmp",
        ".git/",
        ".smithers/",
        "nested/.git/",
    ] {
        assert!(
            set.ignored.iter().any(|i| i.path == p),
            "{p} should be reported as ignored: {:?}",
            set.ignored
        );
    }
    assert!(set.changes.iter().all(|c| !not_transported(&c.path)));
    assert!(
        set.skipped.iter().any(|s| s.path == "fifo1"),
        "{:?}",
        set.skipped
    );
    assert!(
        set.skipped.iter().any(|s| s.path == "emptydir/"),
        "{:?}",
        set.skipped
    );

    let files = build_patch_files(set);
    assert_eq!(files.files.len(), set.changes.len());
    assert!(files.total_diff_lines() > 0);

    // Every patch parses back and re-renders byte-identically.
    for f in &files.files {
        let parsed = parse_patch(&f.content).expect("our own patch parses");
        assert_eq!(
            render_patches(&parsed),
            f.content,
            "round trip of {}",
            f.bundle_path
        );
    }

    // Real git applies them to a copy of lower.
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("copy");
    sh(
        tmp.path(),
        &format!("cp -a {} {}", l.lower.display(), copy.display()),
    );
    git(&copy, &["init", "-q"]);
    let pdir = tmp.path().join("patches");
    std::fs::create_dir_all(pdir.join("patches")).unwrap();
    let mut args: Vec<String> = vec!["apply".into(), "--whitespace=nowarn".into()];
    for f in &files.files {
        let p = pdir.join(&f.bundle_path);
        std::fs::write(&p, &f.content).unwrap();
        args.push(p.to_str().unwrap().to_string());
    }
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    git(&copy, &argv);

    let expected = snapshot(&l.snapshot, &not_transported);
    let actual = snapshot(&copy, &|r| r == ".git" || r.starts_with(".git/"));
    assert_same_tree(&expected, &actual);

    // Our own apply (from the patch texts, as from a stored bundle) gives the same tree.
    let ours = tmp.path().join("ours");
    sh(
        tmp.path(),
        &format!("cp -a {} {}", l.lower.display(), ours.display()),
    );
    let texts: Vec<&str> = files.files.iter().map(|f| f.content.as_str()).collect();
    let report = apply_patch_texts(&ours, &texts, &ApplyOptions::default()).expect("apply");
    assert_eq!(report.applied.len(), set.changes.len());
    let ours_tree = snapshot(&ours, &|r| r == ".smithers" || r.starts_with(".smithers/"));
    assert_same_tree(&expected, &ours_tree);

    // Our hashes are git's.
    for c in set
        .changes
        .iter()
        .filter(|c| c.new_mode() == Some(GitMode::File))
    {
        let oid = git(&copy, &["hash-object", "--", &c.path]);
        assert_eq!(oid.trim(), c.new_oid().unwrap(), "{}", c.path);
    }
}

#[test]
fn root_overlay_changes_round_trip_through_git_apply() {
    if !require_root_overlay() {
        return;
    }
    let l = Layers::new();
    sh(&l.lower, SETUP_LOWER);
    sh(
        &l.lower,
        &format!(
            "mount -t overlay overlay -o {} {}",
            l.mount_opts(""),
            l.merged.display()
        ),
    );
    let (ok, err) = try_sh(&l.merged, STEP);
    // Snapshot the merged view before unmounting (fifo excluded: cp would copy it as a fifo).
    if ok {
        sh(
            &l.merged,
            &format!(
                "cp -a . {} && rm -f {}/fifo1",
                l.snapshot.display(),
                l.snapshot.display()
            ),
        );
    }
    sh(&l.lower, &format!("umount {}", l.merged.display()));
    assert!(ok, "step failed: {err}");
    let set = detect_changes(&l.lower, &l.upper, &DetectOptions::default()).expect("detect");
    check_round_trip(&l, &set);
}

#[test]
fn userxattr_overlay_in_user_namespace_round_trips() {
    if !require_root_overlay() {
        return;
    }
    let (ok, err) = try_sh(Path::new("/"), "unshare -Urm true");
    if !ok {
        skip_or_fail(&format!("user namespaces unavailable: {err}"));
        return;
    }
    let l = Layers::new();
    sh(&l.lower, SETUP_LOWER);
    let script = format!(
        "set -e\nmount -t overlay overlay -o {} {m}\ncd {m}\n{STEP}\ncp -a . {s}\nrm -f {s}/fifo1\n",
        l.mount_opts(",userxattr"),
        m = l.merged.display(),
        s = l.snapshot.display()
    );
    let path = l.snapshot.parent().unwrap().join("step.sh");
    std::fs::write(&path, script).unwrap();
    sh(
        Path::new("/"),
        &format!("unshare -Urm sh {}", path.display()),
    );
    // The opaque marker really is the user.* flavour here (and not the trusted.* one).
    let dir = l.upper.join("recreated");
    let mut buf = [0u8; 8];
    let n = rustix::fs::lgetxattr(&dir, "user.overlay.opaque", &mut buf[..])
        .expect("user.overlay.opaque on the re-created directory");
    assert_eq!(&buf[..n], b"y");
    assert!(rustix::fs::lgetxattr(&dir, "trusted.overlay.opaque", &mut buf[..]).is_err());
    let set = detect_changes(&l.lower, &l.upper, &DetectOptions::default()).expect("detect");
    check_round_trip(&l, &set);
}

/// A fresh copy of lower, made after lower's last write (as a runtime's ship makes it).
fn copy_of_lower(l: &Layers) -> std::path::PathBuf {
    fs_clock_tick(&l.snapshot);
    let copy = l.snapshot.parent().unwrap().join("copy");
    sh(
        &l.lower,
        &format!("mkdir {c} && cp -a . {c}", c = copy.display()),
    );
    copy
}

/// The copy fallback: the same step run in a full copy of the project (no overlay, no root),
/// detected by comparing the trees, round-trips through `git apply` exactly as the overlay
/// does, with the same change kinds, ignored and skipped paths.
#[test]
fn full_copy_changes_round_trip_through_git_apply() {
    let l = Layers::new();
    sh(&l.lower, SETUP_LOWER);
    let copy = copy_of_lower(&l);
    sh(&copy, STEP);
    sh(
        &copy,
        &format!("cp -a . {s} && rm -f {s}/fifo1", s = l.snapshot.display()),
    );
    let set = detect_changes_by_compare(&l.lower, &copy, &DetectOptions::default())
        .expect("detect by compare");
    check_round_trip(&l, &set);
    assert!(set.stale_base.is_empty(), "{:?}", set.stale_base);
}

/// The same post-step tree seen as an overlay (upper layer) and as a full copy (the merged
/// view copied out) gives the same change set: same changes (kinds, modes, blob ids,
/// contents), same ignored and skipped paths.
#[test]
fn full_copy_and_overlay_detect_the_same_changes() {
    if !require_root_overlay() {
        return;
    }
    let l = Layers::new();
    sh(&l.lower, SETUP_LOWER);
    fs_clock_tick(&l.snapshot);
    let copy = l.snapshot.parent().unwrap().join("copy");
    sh(
        &l.lower,
        &format!(
            "mount -t overlay overlay -o {} {}",
            l.mount_opts(""),
            l.merged.display()
        ),
    );
    let (ok, err) = try_sh(&l.merged, STEP);
    if ok {
        sh(
            &l.merged,
            &format!("mkdir {c} && cp -a . {c}", c = copy.display()),
        );
    }
    sh(&l.lower, &format!("umount {}", l.merged.display()));
    assert!(ok, "step failed: {err}");
    let overlay = detect_changes(&l.lower, &l.upper, &DetectOptions::default()).expect("overlay");
    let compared =
        detect_changes_by_compare(&l.lower, &copy, &DetectOptions::default()).expect("compare");
    assert!(!overlay.changes.is_empty());
    assert_eq!(overlay.changes, compared.changes);
    assert_eq!(overlay.ignored, compared.ignored);
    assert_eq!(overlay.skipped, compared.skipped);
    // And the patches are byte for byte the same.
    let (a, b) = (build_patch_files(&overlay), build_patch_files(&compared));
    assert_eq!(a.files, b.files);
}

#[test]
fn redirect_and_metacopy_xattrs_are_refused() {
    let l = Layers::new();
    std::fs::create_dir_all(l.upper.join("d")).unwrap();
    std::fs::write(l.upper.join("f"), b"x").unwrap();
    for (target, name) in [
        ("d", "user.overlay.redirect"),
        ("f", "user.overlay.metacopy"),
    ] {
        let p = l.upper.join(target);
        if let Err(e) = rustix::fs::lsetxattr(&p, name, b"/x", rustix::fs::XattrFlags::empty()) {
            skip_or_fail(&format!("cannot set user xattrs on {}: {e}", p.display()));
            return;
        }
        let err = detect_changes(&l.lower, &l.upper, &DetectOptions::default()).unwrap_err();
        assert!(
            matches!(err, PatchError::UnsupportedOverlayFeature { ref xattr, .. } if xattr == name),
            "{err}"
        );
        rustix::fs::lremovexattr(&p, name).unwrap();
    }
    assert!(detect_changes(&l.lower, &l.upper, &DetectOptions::default()).is_ok());
}
