//! Measures change detection and apply against their natural baselines, side by side, and
//! prints a Markdown table. Needs root (overlayfs) and git.
//!
//! `cargo run --release -p smithers-patch --example measure [-- 1000,10000,100000]`
//!
//! 1. Workspace scaling: a lower tree of N files, 10 files changed through an overlay mount;
//!    `detect_changes` (walks upper only) vs `git status --porcelain` on a git work tree of
//!    the same merged content vs a plain lstat walk of the lower tree.
//! 2. Apply: 1000 changed files, our atomic journaled apply vs `git apply` of the same patches.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use smithers_patch::*;

fn sh(dir: &Path, script: &str) {
    let st = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .status()
        .expect("sh");
    assert!(st.success(), "{script}");
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn walk(dir: &Path) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let md = std::fs::symlink_metadata(e.path()).unwrap();
        n += 1;
        if md.is_dir() {
            n += walk(&e.path());
        }
    }
    n
}

fn make_tree(root: &Path, n: usize) {
    for i in 0..n {
        let d = root.join(format!("d{:03}/e{:03}", i / 1000, (i / 100) % 10));
        if i % 100 == 0 {
            std::fs::create_dir_all(&d).unwrap();
        }
        std::fs::write(d.join(format!("f{i}.txt")), format!("file {i}\nline two\n")).unwrap();
    }
}

fn scaling(n: usize) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    for d in ["lower", "upper", "work", "merged"] {
        std::fs::create_dir_all(t.join(d)).unwrap();
    }
    make_tree(&t.join("lower"), n);
    sh(
        t,
        "mount -t overlay overlay -o lowerdir=lower,upperdir=upper,workdir=work merged",
    );
    for i in 0..10 {
        let i = i * (n / 10);
        let p = t.join(format!(
            "merged/d{:03}/e{:03}/f{i}.txt",
            i / 1000,
            (i / 100) % 10
        ));
        std::fs::write(p, format!("changed {i}\n")).unwrap();
    }
    sh(t, "cp -a merged gitcopy && umount merged");
    sh(
        &t.join("gitcopy"),
        "git init -q && git add -A && git -c user.name=m -c user.email=m@m commit -q -m base && git status --porcelain >/dev/null",
    );
    // After the commit the work tree equals HEAD; re-apply the 10 edits so status has work.
    for i in 0..10 {
        let i = i * (n / 10);
        let p = t.join(format!(
            "gitcopy/d{:03}/e{:03}/f{i}.txt",
            i / 1000,
            (i / 100) % 10
        ));
        std::fs::write(p, format!("changed again {i}\n")).unwrap();
    }
    let (mut ours, mut git, mut lstat) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..7 {
        let s = Instant::now();
        let set = detect_changes(
            &t.join("lower"),
            &t.join("upper"),
            &DetectOptions::default(),
        )
        .unwrap();
        let files = build_patch_files(&set);
        ours.push(s.elapsed());
        assert_eq!(set.changes.len(), 10);
        assert_eq!(files.files.len(), 10);
        let s = Instant::now();
        let out = Command::new("git")
            .args(["status", "--porcelain"])
            .current_dir(t.join("gitcopy"))
            .output()
            .unwrap();
        git.push(s.elapsed());
        assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 10);
        let s = Instant::now();
        walk(&t.join("lower"));
        lstat.push(s.elapsed());
    }
    let (o, g, l) = (median(ours), median(git), median(lstat));
    format!(
        "| {n} | {} | {} | {} | {:.1}x |\n",
        ms(o),
        ms(g),
        ms(l),
        g.as_secs_f64() / o.as_secs_f64()
    )
}

fn apply_bench() -> String {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let base: String = (1..=60).map(|i| format!("line {i}\n")).collect();
    let changes: Vec<FileChange> = (0..1000)
        .map(|i| {
            let new = base.replace("line 30\n", &format!("changed {i}\n"));
            let v = |c: &str| FileVersion {
                mode: GitMode::File,
                oid: git_blob_oid(c.as_bytes()),
                size: c.len() as u64,
                symlink_target: None,
                is_binary: false,
                content: c.as_bytes().to_vec(),
                encoded: None,
            };
            FileChange {
                path: format!("d{:02}/f{i:04}.txt", i / 100),
                kind: ChangeKind::Modified,
                old: Some(v(&base)),
                new: Some(v(&new)),
            }
        })
        .collect();
    let set = ChangeSet {
        changes,
        ..Default::default()
    };
    let files = build_patch_files(&set);
    let texts: Vec<&str> = files.files.iter().map(|f| f.content.as_str()).collect();
    let patch_path = t.join("all.patch");
    std::fs::write(&patch_path, texts.concat()).unwrap();
    let (mut ours, mut git) = (Vec::new(), Vec::new());
    for round in 0..5 {
        for (name, v) in [("ours", &mut ours), ("git", &mut git)] {
            let dir = t.join(format!("{name}{round}"));
            for i in 0..1000 {
                let d = dir.join(format!("d{:02}", i / 100));
                std::fs::create_dir_all(&d).unwrap();
                std::fs::write(d.join(format!("f{i:04}.txt")), &base).unwrap();
            }
            let s = Instant::now();
            if name == "ours" {
                let r = apply_patch_texts(&dir, &texts, &ApplyOptions::default()).unwrap();
                assert_eq!(r.applied.len(), 1000);
            } else {
                let st = Command::new("git")
                    .arg("apply")
                    .arg(&patch_path)
                    .current_dir(&dir)
                    .status()
                    .unwrap();
                assert!(st.success());
            }
            v.push(s.elapsed());
        }
    }
    let (o, g) = (median(ours), median(git));
    format!(
        "| 1000 files, 1 hunk each | {} | {} | {:.2}x |\n",
        ms(o),
        ms(g),
        o.as_secs_f64() / g.as_secs_f64()
    )
}

fn main() {
    // `measure apply` runs only the apply comparison.
    let arg = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "1000,10000,100000".into());
    let sizes: Vec<usize> = if arg == "apply" {
        Vec::new()
    } else {
        arg.split(',').map(|s| s.parse().expect("sizes")).collect()
    };
    let uname = Command::new("uname").arg("-r").output().unwrap();
    println!(
        "machine: {} cores, kernel {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        String::from_utf8_lossy(&uname.stdout).trim()
    );
    if !sizes.is_empty() {
        println!("\n| files in lower | detect+render (10 changed) | git status | lstat walk of lower | git status / ours |");
        println!("|---|---|---|---|---|");
    }
    for n in sizes {
        print!("{}", scaling(n));
    }
    println!("\n| apply | ours (journaled, fsynced) | git apply | ours / git |");
    println!("|---|---|---|---|");
    print!("{}", apply_bench());
}
