//! The differential test against git: for each of a table of agent-style edits on a real
//! (generated) git project, the patches that copy mode makes (`detect_changes_by_compare` +
//! `build_patch_files`)
//!
//! (a) applied by us (`apply_patch_texts`) onto a pristine copy give exactly the edited tree,
//! (b) applied by `git apply`, patch file after patch file in bundle order, onto another
//!     pristine copy give exactly the same tree,
//!
//! comparing every non-directory: bytes, executable bit, symlink targets. `.git` is git's own
//! state and never part of a patch, so it is left out of the comparison.

mod common;

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::*;
use smithers_patch::*;

/// The project: nested directories, text with every line-ending style (LF, CRLF, mixed, lone
/// CR, no final newline), a binary file, a symlink, an executable, an empty file, names with
/// spaces, non-ASCII and characters git quotes; committed to a git repository.
const PROJECT: &str = r#"set -e
mkdir -p src/lib docs 'dir with space'
i=1; while [ $i -le 30 ]; do echo "line $i"; i=$((i+1)); done > src/lib/a.txt
printf 'b\n' > src/lib/b.txt
printf '# readme\n\nSome text.\n' > README.md
printf '#!/bin/sh\necho hi\n' > run.sh && chmod +x run.sh
printf 'print(1)\n' > tool.py
printf 'guide\n' > docs/guide.md
printf 'api\n' > docs/api.md
ln -s src link
printf 'a\r\nb\r\nc\r\n' > dos.txt
printf 'a\nb\nc\n' > unix.txt
printf 'a\r\nb\nc\r\nd\n' > mixed.txt
printf 'x\ry\rz\n' > src/cr.txt
printf 'one\ntwo\nthree\n' > notes.txt
printf 'no newline' > nonl.txt
i=0; while [ $i -lt 300 ]; do printf 'chunk\000%03d' $i; i=$((i+1)); done > img.bin
: > empty.txt
printf 'old\n' > 'with space.txt'
printf 'inner\n' > 'dir with space/f.txt'
printf 'é\n' > 'ünï.txt'
printf 'latin1 name\n' > "$(printf 'caf\351.txt')"
mkdir "$(printf 'dir\377')" && printf 'in a dir\n' > "$(printf 'dir\377/f')"
git init -q
git add -A
git -c user.name=t -c user.email=t@t commit -q -m base
"#;

/// (name, shell script run in the edited copy).
const EDITS: &[(&str, &str)] = &[
    ("edit a line", "sed -i 's/^line 15$/LINE 15/' src/lib/a.txt"),
    ("edit two far-apart lines", "sed -i -e 's/^line 2$/two/' -e 's/^line 28$/twenty-eight/' src/lib/a.txt"),
    ("append", "printf 'appended\\n' >> README.md"),
    ("prepend", "printf 'first\\n' | cat - notes.txt > t && mv t notes.txt"),
    ("delete a file", "rm src/lib/b.txt"),
    ("rename (delete + add)", "mv src/lib/a.txt src/lib/renamed.txt"),
    ("move across dirs", "mv docs/guide.md src/guide.md"),
    ("create nested new dirs", "mkdir -p new/deep/er && printf 'n\\n' > new/deep/er/f.txt && printf 'm\\n' > new/m.txt"),
    ("chmod +x", "chmod +x tool.py"),
    ("chmod -x", "chmod -x run.sh"),
    ("chmod +x and edit", "chmod +x tool.py && printf 'print(2)\\n' > tool.py"),
    ("replace a file with a symlink", "rm README.md && ln -s docs/guide.md README.md"),
    ("retarget a symlink", "rm link && ln -s docs link"),
    ("replace a symlink with a file", "rm link && printf 'now a file\\n' > link"),
    ("new dangling symlink", "ln -s ../../nowhere src/dangling"),
    ("dir to file", "rm -r docs && printf 'was a dir\\n' > docs"),
    ("file to dir", "rm tool.py && mkdir tool.py && printf 'x\\n' > tool.py/inner"),
    ("remove a whole dir", "rm -r src/lib"),
    ("file with lone CRs (new)", "printf 'a\\rb\\nc\\rd\\r' > src/new-cr.txt"),
    ("edit a file with lone CRs", "printf 'x\\ry\\rZ\\n' > src/cr.txt"),
    ("add a lone CR to a line", "printf 'one\\ntw\\ro\\nthree\\n' > notes.txt"),
    ("CR at end of file", "printf 'one\\ntwo\\nthree\\r' > notes.txt"),
    ("remove trailing newline", "printf 'one\\ntwo\\nthree' > notes.txt"),
    ("add trailing newline", "printf 'no newline\\n' > nonl.txt"),
    ("CRLF to LF", "sed -i 's/\\r$//' dos.txt"),
    ("LF to CRLF", "sed -i 's/$/\\r/' unix.txt"),
    ("edit a mixed-endings file", "printf 'a\\r\\nB\\nc\\r\\nd\\n' > mixed.txt"),
    ("binary edit", "printf 'Z' | dd of=img.bin bs=1 seek=100 conv=notrunc 2>/dev/null"),
    ("new binary", "i=0; while [ $i -lt 50 ]; do printf '\\000\\001\\377%02d' $i; i=$((i+1)); done > new.bin"),
    ("text to binary", "printf 'bin\\000ary' > notes.txt"),
    ("binary to text", "printf 'text now\\n' > img.bin"),
    ("non-UTF-8 content", "printf 'caf\\351\\n' > latin1.txt"),
    ("new empty file", ": > src/empty-new"),
    ("empty a file", ": > README.md"),
    ("fill an empty file", "printf 'filled\\n' > empty.txt"),
    ("delete an empty file", "rm empty.txt"),
    ("names with spaces and unicode", "printf 'u\\n' > 'dir with space/ünï cødé.txt' && mv 'with space.txt' 'ファイル.txt'"),
    ("names git quotes", "printf 'q\\n' > 'we\"ird\\\\name\ttab' && printf 'n\\n' > 'new\nline'"),
    ("edit in a dir with a space", "printf 'changed\\n' > 'dir with space/f.txt'"),
    ("new file with a non-UTF-8 name", "printf 'x\\n' > \"$(printf 'na\\357ve')\""),
    ("edit a file with a non-UTF-8 name", "printf 'edited\\n' > \"$(printf 'caf\\351.txt')\""),
    ("rename to a non-UTF-8 name", "mv notes.txt \"$(printf 'n\\366tes.txt')\""),
    ("delete a non-UTF-8 dir", "rm -r \"$(printf 'dir\\377')\""),
    ("new non-UTF-8 dir and file", "mkdir -p \"$(printf 'new\\344/sub\\344')\" && printf 'z\\n' > \"$(printf 'new\\344/sub\\344/f\\344')\""),
    ("chmod +x a non-UTF-8 name", "chmod +x \"$(printf 'caf\\351.txt')\""),
    ("a typical refactor", "sed -i 's/^line 3$/line three/' src/lib/a.txt && mv src/lib/b.txt src/b.txt && printf 'mod\\n' > src/mod.rs && rm docs/api.md && chmod +x tool.py"),
];

fn have_git() -> bool {
    Command::new("git")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Every non-directory below `root` except `.git/`.
/// Every non-directory below `root` except `.git/` and `.smithers/`, keyed by its raw name
/// (names need not be UTF-8 here).
fn tree(root: &Path) -> BTreeMap<Vec<u8>, Snap> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<Vec<u8>, Snap>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p
                .strip_prefix(root)
                .unwrap()
                .as_os_str()
                .as_bytes()
                .to_vec();
            if rel == b".git" || rel == b".smithers" {
                continue;
            }
            let md = std::fs::symlink_metadata(&p).unwrap();
            if md.is_dir() {
                walk(root, &p, out);
            } else if md.file_type().is_symlink() {
                out.insert(rel, Snap::Symlink(std::fs::read_link(&p).unwrap()));
            } else {
                assert!(md.is_file(), "{}: special file in a test tree", p.display());
                let exec = md.permissions().mode() & 0o100 != 0;
                out.insert(
                    rel,
                    Snap::File {
                        exec,
                        content: std::fs::read(&p).unwrap(),
                    },
                );
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn copy_of(src: &Path, dst: &Path) {
    sh(
        src,
        &format!("mkdir -p '{d}' && cp -a . '{d}'", d = dst.display()),
    );
}

/// Applies the patch files one after another with `git apply`, as a user (or a Smithers
/// provider without our apply) would.
fn git_apply_each(dir: &Path, files: &PatchFiles) -> Result<(), String> {
    let pdir = dir.parent().unwrap().join("patches");
    std::fs::create_dir_all(&pdir).unwrap();
    for f in &files.files {
        let file = pdir.join(f.bundle_path.replace('/', "_"));
        std::fs::write(&file, &f.content).unwrap();
        let out = Command::new("git")
            .args(["apply", "--whitespace=nowarn"])
            .arg(&file)
            .current_dir(dir)
            .output()
            .expect("git apply");
        if !out.status.success() {
            return Err(format!(
                "git apply {} failed: {}\n{:?}",
                f.bundle_path,
                String::from_utf8_lossy(&out.stderr),
                f.content
            ));
        }
    }
    Ok(())
}

#[test]
fn every_edit_applies_like_git_and_like_the_edit_itself() {
    if !have_git() {
        skip_or_fail("git not found");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let pristine = tmp.path().join("pristine");
    std::fs::create_dir(&pristine).unwrap();
    sh(&pristine, PROJECT);
    let base_tree = tree(&pristine);
    let mut failures = Vec::new();
    for (n, (name, script)) in EDITS.iter().enumerate() {
        let dir = tmp.path().join(format!("case{n}"));
        let (edited, ours, theirs) = (dir.join("edited"), dir.join("ours"), dir.join("theirs"));
        for d in [&edited, &ours, &theirs] {
            copy_of(&pristine, d);
        }
        sh(&edited, script);
        let want = tree(&edited);
        assert_ne!(want, base_tree, "{name}: the edit changed nothing");

        let set = detect_changes_by_compare(&pristine, &edited, &DetectOptions::default())
            .unwrap_or_else(|e| panic!("{name}: detect: {e}"));
        assert!(!set.changes.is_empty(), "{name}: no changes detected");
        assert!(set.skipped.is_empty(), "{name}: skipped {:?}", set.skipped);
        assert!(set.ignored.is_empty(), "{name}: ignored {:?}", set.ignored);
        let files = build_patch_files(&set);
        let texts: Vec<&str> = files.files.iter().map(|f| f.content.as_str()).collect();

        // (a) our apply.
        match apply_patch_texts(&ours, &texts, &ApplyOptions::default()) {
            Err(e) => failures.push(format!("{name}: our apply failed: {e}")),
            Ok(_) => {
                let got = tree(&ours);
                if got != want {
                    failures.push(format!("{name}: our apply differs:\n{}", diff(&want, &got)));
                }
                let journals = std::fs::read_dir(ours.join(".smithers/apply"))
                    .map(|d| d.count())
                    .unwrap_or(0);
                assert_eq!(journals, 0, "{name}: apply left a journal behind");
            }
        }

        // (b) git apply, in bundle order.
        match git_apply_each(&theirs, &files) {
            Err(e) => failures.push(format!("{name}: {e}")),
            Ok(()) => {
                let got = tree(&theirs);
                if got != want {
                    failures.push(format!("{name}: git apply differs:\n{}", diff(&want, &got)));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

fn diff(want: &BTreeMap<Vec<u8>, Snap>, got: &BTreeMap<Vec<u8>, Snap>) -> String {
    let name = |k: &[u8]| String::from_utf8_lossy(k).into_owned();
    let mut out = Vec::new();
    for (k, v) in want {
        match got.get(k) {
            None => out.push(format!("  missing {:?}", name(k))),
            Some(g) if g != v => out.push(format!("  {:?}: want {v:?}, got {g:?}", name(k))),
            _ => {}
        }
    }
    for k in got.keys().filter(|k| !want.contains_key(*k)) {
        out.push(format!("  unexpected {:?}", name(k)));
    }
    out.join("\n")
}
