//! Our rendering is byte-identical to `git diff --binary --full-index` for the same change
//! (cases where the diff is unambiguous, so both Myers implementations agree).

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use smithers_patch::*;

fn git(dir: &Path, args: &[&str]) -> Vec<u8> {
    let out = Command::new("git")
        .args([
            "-c",
            "core.quotepath=true",
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "-c",
            "diff.noprefix=false",
            "-c",
            "diff.mnemonicprefix=false",
        ])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Lower state, then the step as (upper entries written by hand, matching overlayfs' on-disk
/// form) and the same step applied to a git work tree.
#[test]
fn rendering_matches_git_diff_byte_for_byte() {
    if !rustix::process::geteuid().is_root() {
        // Whiteouts are character devices 0:0: creating one needs CAP_MKNOD.
        skip("whiteouts (mknod c 0 0) need root");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (lower, upper, repo) = (
        tmp.path().join("lower"),
        tmp.path().join("upper"),
        tmp.path().join("repo"),
    );
    for d in [&lower, &upper, &repo] {
        std::fs::create_dir_all(d).unwrap();
    }
    let setup = r#"set -e
mkdir -p src
i=1; while [ $i -le 30 ]; do echo "line $i"; i=$((i+1)); done > src/a.txt
printf 'gone\n' > deleted.txt
printf 'run\n' > run.sh
printf 'BIN\000\001\002' > img.bin
printf 'old\n' > 'with space.txt'
printf 'x\ny' > nonl.txt
"#;
    sh(&lower, setup);
    sh(&repo, setup);
    git(&repo, &["init", "-q"]);
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-q", "-m", "base"]);
    let step = r#"set -e
sed -i 's/^line 15$/LINE 15/' src/a.txt
printf 'new\n' > src/new.txt
chmod +x run.sh
printf 'BIN\000\001\003more' > img.bin
printf 'new\n' > 'with space.txt'
printf 'x\nz' > nonl.txt
printf 'ü\n' > 'ünï.txt'
ln -s ../target link
"#;
    sh(&repo, &format!("{step}rm deleted.txt\n"));
    // The upper layer overlayfs would leave: full copies of changed files, a whiteout.
    sh(
        &upper,
        &format!(
            "cp -a {}/src {}/run.sh {}/img.bin {}/nonl.txt . && cp -a '{}/with space.txt' . && {step}mknod deleted.txt c 0 0\n",
            lower.display(), lower.display(), lower.display(), lower.display(), lower.display()
        ),
    );
    git(&repo, &["add", "-A"]);
    let set = detect_changes(&lower, &upper, &DetectOptions::default()).unwrap();
    assert_eq!(
        set.changes.len(),
        9,
        "{:#?}",
        set.changes
            .iter()
            .map(|c| (&c.path, c.kind))
            .collect::<Vec<_>>()
    );
    for c in &set.changes {
        let ours = render_patches(&file_patches(c));
        let theirs = git(
            &repo,
            &[
                "diff",
                "--cached",
                "--binary",
                "--full-index",
                "--no-color",
                "--",
                &c.path,
            ],
        );
        let theirs = String::from_utf8(theirs).unwrap();
        if c.is_binary() {
            // zlib output may differ between implementations; the headers and literal sizes
            // must agree, and git must accept ours (checked by the overlay round-trip test).
            let strip = |s: &str| {
                s.lines()
                    .filter(|l| {
                        l.starts_with("diff")
                            || l.starts_with("index")
                            || l.starts_with("literal")
                            || l.starts_with("GIT")
                            || l.contains("mode")
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            assert_eq!(strip(&ours), strip(&theirs), "{}", c.path);
        } else {
            assert_eq!(ours, theirs, "rendering of {} differs from git", c.path);
        }
    }
}

/// Random edits (a fixed-seed generator, so failures reproduce): git applies every patch we
/// render and gets exactly the new text.
#[test]
fn git_applies_random_text_patches() {
    let mut seed: u64 = 0x5eed_1234_abcd_0001;
    let mut next = move |n: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    let pool = ["a", "b", "c", "fn main() {", "}", "", "    x += 1;", "é"];
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    git(dir, &["init", "-q"]);
    for case in 0..150 {
        let mut gen = |len: u64| {
            let mut s: String = (0..next(len))
                .map(|_| format!("{}\n", pool[next(pool.len() as u64) as usize]))
                .collect();
            if next(3) == 0 {
                s.pop();
            }
            s
        };
        let old = gen(30);
        let new = gen(30);
        if old == new {
            continue;
        }
        std::fs::write(dir.join("f.txt"), &old).unwrap();
        let fp = FilePatch {
            path: "f.txt".into(),
            old_mode: Some(GitMode::File),
            new_mode: Some(GitMode::File),
            old_oid: Some(git_blob_oid(old.as_bytes())),
            new_oid: Some(git_blob_oid(new.as_bytes())),
            body: PatchBody::Text(text_hunks(&old, &new)),
        };
        std::fs::write(dir.join("p.patch"), fp.render()).unwrap();
        git(dir, &["apply", "p.patch"]);
        assert_eq!(
            std::fs::read_to_string(dir.join("f.txt")).unwrap(),
            new,
            "case {case}: old {old:?}\npatch:\n{}",
            fp.render()
        );
    }
}
