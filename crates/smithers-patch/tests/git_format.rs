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
        skip_or_fail("whiteouts (mknod c 0 0) need root");
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

/// One byte-level case: a file's content before and after (`None`: absent).
struct ByteCase {
    name: &'static str,
    old: Option<&'static [u8]>,
    new: Option<&'static [u8]>,
}

const BYTE_CASES: &[ByteCase] = &[
    ByteCase {
        name: "lone-cr-middle",
        old: Some(b"a\rb\nc\nd\n"),
        new: Some(b"a\rB\nc\nd\n"),
    },
    ByteCase {
        name: "lone-cr-added",
        old: Some(b"one\ntwo\n"),
        new: Some(b"one\ntw\ro\n"),
    },
    ByteCase {
        name: "lone-cr-eof",
        old: Some(b"x\ny\r"),
        new: Some(b"x\nz\r"),
    },
    ByteCase {
        name: "lone-cr-only",
        old: None,
        new: Some(b"\r"),
    },
    ByteCase {
        name: "cr-then-lf-lines",
        old: Some(b"\r\n\r\r\n"),
        new: Some(b"\r\n\r\n\r"),
    },
    ByteCase {
        name: "mixed-endings",
        old: Some(b"a\r\nb\nc\r\nd\n"),
        new: Some(b"a\r\nB\nc\r\nd\n"),
    },
    ByteCase {
        name: "crlf-to-lf",
        old: Some(b"a\r\nb\r\nc\r\n"),
        new: Some(b"a\nb\nc\n"),
    },
    ByteCase {
        name: "lf-to-crlf",
        old: Some(b"a\nb\nc\n"),
        new: Some(b"a\r\nb\r\nc\r\n"),
    },
    ByteCase {
        name: "drop-final-newline",
        old: Some(b"a\nb\n"),
        new: Some(b"a\nb"),
    },
    ByteCase {
        name: "add-final-newline",
        old: Some(b"a\nb"),
        new: Some(b"a\nb\n"),
    },
    ByteCase {
        name: "crlf-drop-final",
        old: Some(b"a\r\nb\r\n"),
        new: Some(b"a\r\nb\r"),
    },
    ByteCase {
        name: "empty-created",
        old: None,
        new: Some(b""),
    },
    ByteCase {
        name: "empty-deleted",
        old: Some(b""),
        new: None,
    },
    ByteCase {
        name: "emptied",
        old: Some(b"x\r\n"),
        new: Some(b""),
    },
    ByteCase {
        name: "filled",
        old: Some(b""),
        new: Some(b"x\ry"),
    },
    ByteCase {
        name: "heading-keeps-unicode-space",
        old: Some("head\u{a0}\n1\n2\n3\n4\n5\n6\n7\n".as_bytes()),
        new: Some("head\u{a0}\n1\n2\n3\n4\nfive\n6\n7\n".as_bytes()),
    },
    ByteCase {
        name: "heading-trims-cr-and-tab",
        old: Some(b"head \t\r\n1\n2\n3\n4\n5\n6\n7\n"),
        new: Some(b"head \t\r\n1\n2\n3\n4\nfive\n6\n7\n"),
    },
    ByteCase {
        name: "lone-cr-deleted",
        old: Some(b"q\rq"),
        new: None,
    },
];

fn write_side(dir: &Path, name: &str, content: Option<&[u8]>) {
    let p = dir.join(name);
    match content {
        Some(c) => std::fs::write(&p, c).unwrap(),
        None => {
            let _ = std::fs::remove_file(&p);
        }
    }
}

/// Every byte sequence round-trips: for each case the patch we make (by comparing trees, as
/// copy mode does) is byte-identical to `git diff --full-index`, `git apply` applies it, and
/// our apply does too, both giving exactly the new bytes.
#[test]
fn byte_cases_match_git_and_apply_both_ways() {
    let tmp = tempfile::tempdir().unwrap();
    for case in BYTE_CASES {
        let base = tmp.path().join(case.name);
        let (lower, copy, repo, ours) = (
            base.join("lower"),
            base.join("copy"),
            base.join("repo"),
            base.join("ours"),
        );
        for d in [&lower, &copy, &repo, &ours] {
            std::fs::create_dir_all(d).unwrap();
        }
        for d in [&lower, &copy, &repo, &ours] {
            write_side(d, "f", case.old);
            // Something unchanged, so no tree is empty.
            std::fs::write(d.join("keep"), "k\n").unwrap();
        }
        git(&repo, &["init", "-q"]);
        git(&repo, &["add", "-A"]);
        git(&repo, &["commit", "-q", "-m", "base"]);
        write_side(&copy, "f", case.new);
        let set = detect_changes_by_compare(&lower, &copy, &DetectOptions::default()).unwrap();
        assert_eq!(set.changes.len(), 1, "{}: {:?}", case.name, set.changes);
        let text = render_patches(&file_patches(&set.changes[0]));

        write_side(&repo, "f", case.new);
        git(&repo, &["add", "-A"]);
        let theirs = git(
            &repo,
            &["diff", "--cached", "--binary", "--full-index", "--no-color"],
        );
        assert_eq!(
            text.as_bytes(),
            &theirs[..],
            "{}: ours {text:?}\ngit {:?}",
            case.name,
            String::from_utf8_lossy(&theirs)
        );

        // git apply onto the old state.
        git(&repo, &["reset", "-q", "--hard"]);
        std::fs::write(base.join("p.patch"), &text).unwrap();
        git(&repo, &["apply", "--whitespace=nowarn", "../p.patch"]);
        assert_eq!(
            std::fs::read(repo.join("f")).ok().as_deref(),
            case.new,
            "{}: git apply",
            case.name
        );

        // Our apply onto the old state.
        apply_patch_texts(&ours, &[&text], &ApplyOptions::default())
            .unwrap_or_else(|e| panic!("{}: our apply: {e}\n{text:?}", case.name));
        assert_eq!(
            std::fs::read(ours.join("f")).ok().as_deref(),
            case.new,
            "{}: our apply",
            case.name
        );
    }
}

/// Names are rendered as git renders them (core.quotePath: C-quoted, octal escapes for every
/// byte from 0x80, which keeps the patch valid UTF-8 even for a name that is not), parse back
/// to the same bytes, and apply (ours and `git apply`) to the file with exactly that name.
#[test]
fn names_render_like_git_and_apply_byte_exact() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let names: &[&[u8]] = &[
        b"caf\xe9.txt",
        b"d\xff\xfe/inner",
        "ünï cødé.txt".as_bytes(),
        b"\"starts-with-quote",
        b"tab\there",
        b"new\nline",
        b"back\\slash",
        b"sp ace/x y",
        b"ctl\x01\x7f",
    ];
    let tmp = tempfile::tempdir().unwrap();
    let (lower, copy, repo, ours) = (
        tmp.path().join("lower"),
        tmp.path().join("copy"),
        tmp.path().join("repo"),
        tmp.path().join("ours"),
    );
    for d in [&lower, &copy, &repo, &ours] {
        std::fs::create_dir_all(d).unwrap();
        std::fs::write(d.join("keep"), "k\n").unwrap();
    }
    git(&repo, &["init", "-q"]);
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-q", "-m", "base"]);
    for d in [&copy, &repo] {
        for n in names {
            let p = d.join(OsStr::from_bytes(n));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, b"content\n").unwrap();
        }
    }
    git(&repo, &["add", "-A"]);
    let set = detect_changes_by_compare(&lower, &copy, &DetectOptions::default()).unwrap();
    assert!(set.skipped.is_empty(), "{:?}", set.skipped);
    assert_eq!(set.changes.len(), names.len());
    let mut texts = Vec::new();
    for c in &set.changes {
        let raw = path_to_bytes(&c.path).unwrap();
        assert!(names.contains(&&raw[..]), "{:?}", c.path);
        let ours_text = render_patches(&file_patches(c));
        let mut pathspec = b":(literal)".to_vec();
        pathspec.extend_from_slice(&raw);
        let out = Command::new("git")
            .args([
                "-c",
                "core.quotepath=true",
                "diff",
                "--cached",
                "--full-index",
                "--",
            ])
            .arg(OsStr::from_bytes(&pathspec))
            .current_dir(&repo)
            .output()
            .unwrap();
        assert_eq!(
            ours_text,
            String::from_utf8(out.stdout).unwrap(),
            "rendering of {:?}",
            c.path
        );
        let parsed = parse_patch(&ours_text).unwrap();
        assert_eq!(parsed[0].path, c.path);
        texts.push(ours_text);
    }
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    apply_patch_texts(&ours, &refs, &ApplyOptions::default()).unwrap();
    git(&repo, &["reset", "-q", "--hard"]);
    std::fs::write(tmp.path().join("all.patch"), texts.concat()).unwrap();
    git(&repo, &["apply", "../all.patch"]);
    for n in names {
        for d in [&ours, &repo] {
            assert_eq!(
                std::fs::read(d.join(OsStr::from_bytes(n))).unwrap(),
                b"content\n",
                "{} in {}",
                String::from_utf8_lossy(n),
                d.display()
            );
        }
    }
}
