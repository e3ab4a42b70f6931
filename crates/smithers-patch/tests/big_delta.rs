//! Big binaries keep their delta: a one-byte edit of a 120 MB file (past the 32 MiB under which
//! both sides are held) found in an overlay-style upper layer is a patch of a few kilobytes, a
//! git `delta` both ways, made and applied in bounded memory; `git apply` reproduces the
//! file (its blob id), `git apply -R` takes it back, and our apply writes the same bytes.
//! Alone in its test binary, so that the process's peak RSS is this test's.

mod common;

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

use common::*;
use smithers_patch::*;

const SIZE: u64 = 120_000_000;

/// A sparse-ish file: a 4 KiB island of random bytes every MiB, holes in between (as a
/// database with free pages, or a disk image).
fn write_sparse_ish(path: &Path) {
    let f = std::fs::File::create(path).unwrap();
    f.set_len(SIZE).unwrap();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut island = vec![0u8; 4096];
    let mut at = 0u64;
    while at + 4096 <= SIZE {
        for b in island.iter_mut() {
            seed ^= seed >> 12;
            seed ^= seed << 25;
            seed ^= seed >> 27;
            *b = (seed.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8;
        }
        f.write_all_at(&island, at).unwrap();
        at += 1 << 20;
    }
}

fn git_ok() -> bool {
    Command::new("git").arg("--version").output().is_ok() || skip_or_fail("git not found")
}

/// Runs git in `dir`, which is not in a repository: the search for one stops at its parent
/// (the test's directory may be inside the project's own checkout).
fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CEILING_DIRECTORIES", dir.parent().unwrap())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The file's git blob id, as git computes it.
fn blob_id(path: &Path) -> String {
    let out = Command::new("git")
        .arg("hash-object")
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// The process's peak resident set, in KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn one_byte_edit_of_a_120mb_sparse_file_is_a_small_delta_git_applies() {
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (lower, upper) = (tmp.path().join("lower"), tmp.path().join("upper"));
    std::fs::create_dir_all(&lower).unwrap();
    std::fs::create_dir_all(&upper).unwrap();
    write_sparse_ish(&lower.join("disk.img"));
    std::fs::copy(lower.join("disk.img"), upper.join("disk.img")).unwrap();
    // One byte, in a hole (a free page written).
    std::fs::OpenOptions::new()
        .write(true)
        .open(upper.join("disk.img"))
        .unwrap()
        .write_all_at(b"\x5a", 77_777_777)
        .unwrap();
    let (old_id, new_id) = (blob_id_or_ours(&lower), blob_id_or_ours(&upper));
    assert_ne!(old_id, new_id);
    if Command::new("git").arg("--version").output().is_ok() {
        assert_eq!(blob_id(&upper.join("disk.img")), new_id);
    }

    let set = detect_changes(&lower, &upper, &DetectOptions::default()).unwrap();
    assert_eq!(set.changes.len(), 1, "{:?}", set.over_limit);
    let files = build_patch_files(&set);
    drop(set);
    let patch = files.files[0].content.clone();
    println!("120 MB, 1-byte edit: patch of {} bytes", patch.len());
    assert!(patch.len() <= 200 << 10, "patch is {} bytes", patch.len());
    let fps = parse_patch(&patch).unwrap();
    assert!(
        matches!(
            fps[0].body,
            PatchBody::Binary {
                forward: BinaryHunk::Delta(_),
                reverse: Some(BinaryHunk::Delta(_)),
            }
        ),
        "{patch}"
    );

    // Ours, on a copy of the project: the new blob, and bounded memory all along.
    let ours = tmp.path().join("ours");
    std::fs::create_dir_all(&ours).unwrap();
    std::fs::copy(lower.join("disk.img"), ours.join("disk.img")).unwrap();
    apply_patch_texts(&ours, &[&patch], &ApplyOptions::default()).unwrap();
    assert_eq!(blob_id_or_ours(&ours), new_id, "our apply");
    let peak = peak_rss_kib();
    println!("peak RSS: {} MiB", peak / 1024);
    assert!(
        peak < 256 * 1024,
        "the test process held {} MiB",
        peak / 1024
    );

    if !git_ok() {
        return;
    }
    // git apply on the project's bytes makes the step's file; -R takes it back.
    let theirs = tmp.path().join("theirs");
    std::fs::create_dir_all(&theirs).unwrap();
    std::fs::copy(lower.join("disk.img"), theirs.join("disk.img")).unwrap();
    let patch_file = tmp.path().join("p.patch");
    std::fs::File::create(&patch_file)
        .unwrap()
        .write_all(patch.as_bytes())
        .unwrap();
    let patch_arg = patch_file.to_str().unwrap();
    git(&theirs, &["apply", "--binary", patch_arg]);
    assert_eq!(blob_id(&theirs.join("disk.img")), new_id, "git apply");
    git(&theirs, &["apply", "--binary", "-R", patch_arg]);
    assert_eq!(blob_id(&theirs.join("disk.img")), old_id, "git apply -R");
}

/// The git blob id of `dir/disk.img`, hashed as it is read (never held).
fn blob_id_or_ours(dir: &Path) -> String {
    use sha1::{Digest, Sha1};
    use std::io::Read;
    let mut f = std::fs::File::open(dir.join("disk.img")).unwrap();
    let mut hash = Sha1::new();
    hash.update(format!("blob {}\0", f.metadata().unwrap().len()).as_bytes());
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
    }
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// A side past the 4 GiB a binary patch may carry (what a delta's copy ops address, and what
/// apply accepts) is left out, named, before any of it is read: sparse files, so it costs no
/// disk.
#[test]
fn a_pair_past_4_gib_is_left_out_named_before_it_is_read() {
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (lower, upper) = (tmp.path().join("lower"), tmp.path().join("upper"));
    for dir in [&lower, &upper] {
        std::fs::create_dir_all(dir).unwrap();
        let f = std::fs::File::create(dir.join("huge.img")).unwrap();
        f.set_len((4 << 30) + 1).unwrap();
    }
    std::fs::OpenOptions::new()
        .write(true)
        .open(upper.join("huge.img"))
        .unwrap()
        .write_all_at(b"x", 1 << 20)
        .unwrap();
    let set = detect_changes(&lower, &upper, &DetectOptions::default()).unwrap();
    assert!(set.changes.is_empty(), "{:?}", set.changes);
    assert_eq!(set.over_limit.len(), 1);
    assert_eq!(set.over_limit[0].path, "huge.img");
    assert!(
        set.over_limit[0]
            .reason
            .contains("a binary patch may carry"),
        "{}",
        set.over_limit[0].reason
    );
}
