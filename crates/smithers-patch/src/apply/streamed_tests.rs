//! The hunks of large files as detection makes them (both sides read in place, each direction
//! the streamed best hunk) through our apply and `git apply`: random edits, insertions that
//! shift content, deletions, appends and truncations of files of a few MB; and large `delta`
//! hunks parsed (kept deflated, checked as they inflate) and applied as they are made.

use std::path::Path;
use std::process::Command;

use crate::apply::{apply_patch_texts, apply_patches, ApplyOptions};
use crate::binary::{best_streamed, index_and_oid, BinaryHunk, Streamed};
use crate::delta::{self, DeltaSizes, FileSource};
use crate::model::{git_blob_oid, GitMode};
use crate::parse::parse_patch;
use crate::patch::{FilePatch, PatchBody};

/// Deterministic random bytes (xorshift64*).
fn noise(n: usize, mut seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(n + 8);
    seed |= 1;
    while out.len() < n {
        seed ^= seed >> 12;
        seed ^= seed << 25;
        seed ^= seed >> 27;
        out.extend_from_slice(&seed.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(n);
    out
}

/// `old` → `new` as detection makes the patch of a large file: both written to files and read
/// in place, each direction [`best_streamed`] against the other.
fn streamed_patch(dir: &Path, old: &[u8], new: &[u8]) -> FilePatch {
    std::fs::write(dir.join("old"), old).unwrap();
    std::fs::write(dir.join("new"), new).unwrap();
    let (of, nf) = (
        std::fs::File::open(dir.join("old")).unwrap(),
        std::fs::File::open(dir.join("new")).unwrap(),
    );
    let os = FileSource {
        file: &of,
        len: old.len() as u64,
    };
    let ns = FileSource {
        file: &nf,
        len: new.len() as u64,
    };
    let (index, old_oid) = index_and_oid(&os).unwrap();
    let Streamed::Done {
        oid: new_oid,
        hunk: forward,
    } = best_streamed(&os, &index, &ns, u64::MAX, None).unwrap()
    else {
        panic!("no forward hunk");
    };
    let index = delta::Index::build(&ns, &mut |_| {}).unwrap();
    let Streamed::Done {
        oid: back,
        hunk: reverse,
    } = best_streamed(&ns, &index, &os, u64::MAX, Some(&old_oid)).unwrap()
    else {
        panic!("no reverse hunk");
    };
    assert_eq!(old_oid, git_blob_oid(old));
    assert_eq!(back, old_oid);
    assert_eq!(new_oid, git_blob_oid(new));
    FilePatch {
        path: "data.bin".into(),
        old_mode: Some(GitMode::File),
        new_mode: Some(GitMode::File),
        old_oid: Some(old_oid),
        new_oid: Some(new_oid),
        body: PatchBody::Binary {
            forward: BinaryHunk::Encoded(forward),
            reverse: Some(BinaryHunk::Encoded(reverse)),
        },
    }
}

fn have_git() -> bool {
    Command::new("git").arg("--version").output().is_ok()
}

/// `git apply ARGS` in `dir`, outside any repository (the search stops at its parent).
fn git_apply(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .arg("apply")
        .args(args)
        .current_dir(dir)
        .env("GIT_CEILING_DIRECTORIES", dir.parent().unwrap())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git apply {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The streamed patch of `old` → `new`, applied by ours (as text, and as the hunks detection
/// made, kept deflated) and by `git apply` (and back with `-R`); its text.
fn round_trip(old: &[u8], new: &[u8]) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let fp = streamed_patch(tmp.path(), old, new);
    let text = fp.render();
    for (name, as_text) in [("ours-text", true), ("ours-hunks", false)] {
        let root = tmp.path().join(name);
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("data.bin"), old).unwrap();
        if as_text {
            apply_patch_texts(&root, &[&text], &ApplyOptions::default()).unwrap();
        } else {
            apply_patches(&root, std::slice::from_ref(&fp), &ApplyOptions::default()).unwrap();
        }
        assert!(
            std::fs::read(root.join("data.bin")).unwrap() == new,
            "{name}"
        );
    }
    if have_git() {
        let root = tmp.path().join("git");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("data.bin"), old).unwrap();
        std::fs::write(tmp.path().join("p.patch"), &text).unwrap();
        git_apply(&root, &["--binary", "../p.patch"]);
        assert!(
            std::fs::read(root.join("data.bin")).unwrap() == new,
            "git apply"
        );
        git_apply(&root, &["--binary", "-R", "../p.patch"]);
        assert!(
            std::fs::read(root.join("data.bin")).unwrap() == old,
            "git apply -R"
        );
    }
    text
}

fn forward_kind(text: &str) -> &'static str {
    let fp = &parse_patch(text).unwrap()[0];
    match &fp.body {
        PatchBody::Binary {
            forward: BinaryHunk::Delta(_),
            ..
        } => "delta",
        PatchBody::Binary {
            forward: BinaryHunk::Literal(_),
            ..
        } => "literal",
        _ => "other",
    }
}

/// Bytes of the forward hunk's text (header, base85 lines).
fn forward_len(text: &str) -> usize {
    let start = text.find("GIT binary patch\n").unwrap() + "GIT binary patch\n".len();
    text[start..].find("\n\n").unwrap()
}

const MB: usize = 1 << 20;

#[test]
fn one_byte_edit_of_a_few_mb_is_a_small_delta_both_ways() {
    let old = noise(3 * MB, 1);
    let mut new = old.clone();
    new[1_234_567] ^= 0xff;
    let text = round_trip(&old, &new);
    assert!(text.len() < 1024, "{} bytes:\n{text}", text.len());
    assert_eq!(forward_kind(&text), "delta");
}

#[test]
fn insertions_that_shift_content_deletions_and_appends_stay_deltas() {
    let old = noise(3 * MB, 2);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("insertion", {
            let mut v = old.clone();
            v.splice(MB..MB, noise(1000, 3));
            v.splice(3 * MB - 10..3 * MB - 10, *b"abc");
            v
        }),
        ("deletion", {
            let mut v = old.clone();
            v.drain(500_000..510_000);
            v.remove(2 * MB);
            v
        }),
        ("append", [&old[..], &noise(5000, 4)].concat()),
        ("prepend", [&noise(7, 5)[..], &old[..]].concat()),
    ];
    for (name, new) in cases {
        let text = round_trip(&old, &new);
        println!("{name}: {} bytes", text.len());
        assert_eq!(forward_kind(&text), "delta", "{name}");
        // Both ways: the reverse hunk carries what was deleted (10 KB of random bytes).
        assert!(text.len() < 32 << 10, "{name}: {} bytes", text.len());
    }
    // A truncation: the forward hunk is a copy, the reverse one carries the cut half.
    let text = round_trip(&old, &old[..old.len() / 2]);
    assert_eq!(forward_kind(&text), "delta");
    assert!(forward_len(&text) < 64, "{} bytes", forward_len(&text));
}

#[test]
fn random_edits_round_trip() {
    let mut seed = 0x5eed_u64;
    let mut next = |m: usize| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) as usize % m.max(1)
    };
    for round in 0..8 {
        let old = noise(MB + next(MB), round);
        let mut new = old.clone();
        for _ in 0..1 + next(6) {
            let at = next(new.len());
            let end = (at + next(2000)).min(new.len());
            let inserted = noise(next(300), round * 100 + at as u64);
            new.splice(at..end, inserted);
        }
        round_trip(&old, &new);
    }
}

#[test]
fn unrelated_or_empty_sides_round_trip() {
    let old = noise(2 * MB, 6);
    // Unrelated random content: no copy helps; whichever hunk is smaller.
    round_trip(&old, &noise(2 * MB, 7));
    // Compressible new content: a literal deflates far below a delta of inserts.
    let zeros = vec![0u8; 2 * MB];
    let text = round_trip(&old, &zeros);
    assert_eq!(forward_kind(&text), "literal");
    assert!(
        forward_len(&text) < 64 << 10,
        "{} bytes",
        forward_len(&text)
    );
    // An empty side: literals, as git writes them.
    let text = round_trip(b"", &old[..MB]);
    assert_eq!(forward_kind(&text), "literal");
    round_trip(&old[..MB], b"");
}

/// A raw delta against a 10-byte source: `target` zero bytes as inserts (raw ~1.008 × target,
/// which deflates to almost nothing), followed by `tail` ops.
fn inserts_delta(target: u64, tail: &[u8], tail_len: u64) -> Vec<u8> {
    let mut d = Vec::new();
    delta::format::put_varint(&mut d, 10);
    delta::format::put_varint(&mut d, target + tail_len);
    let mut left = target;
    while left > 0 {
        let n = left.min(127);
        d.push(n as u8);
        d.extend(std::iter::repeat_n(0u8, n as usize));
        left -= n;
    }
    d.extend_from_slice(tail);
    d
}

fn delta_patch(raw: Vec<u8>, new_oid: &str) -> String {
    FilePatch {
        path: "data.bin".into(),
        old_mode: Some(GitMode::File),
        new_mode: Some(GitMode::File),
        old_oid: Some(git_blob_oid(b"0123456789")),
        new_oid: Some(new_oid.to_string()),
        body: PatchBody::Binary {
            forward: BinaryHunk::Delta(raw),
            reverse: None,
        },
    }
    .render()
}

#[test]
fn large_delta_hunks_are_checked_as_they_inflate_kept_deflated_and_applied_streaming() {
    let target = crate::limit::STREAM_THRESHOLD_BYTES + 1000;
    // The result: `target` zeros, then "89" copied from the source.
    let result = [vec![0u8; target as usize], b"89".to_vec()].concat();
    let new_oid = git_blob_oid(&result);
    let good = delta_patch(inserts_delta(target, &[0x91, 8, 2], 2), &new_oid);
    assert!(good.len() < 1 << 20, "{} bytes", good.len());
    let fps = parse_patch(&good).unwrap();
    let PatchBody::Binary {
        forward: BinaryHunk::Encoded(e),
        ..
    } = &fps[0].body
    else {
        panic!("a large delta was inflated whole");
    };
    assert!(e.lines.len() < 1 << 20);
    assert_eq!(
        e.delta,
        Some(DeltaSizes {
            source: 10,
            target: target + 2
        })
    );
    let mut rendered = String::new();
    BinaryHunk::Encoded(e.clone()).render(&mut rendered);
    assert!(good.contains(&rendered));
    // Applied as it is made: the result is past the threshold, never held by apply.
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("data.bin"), b"0123456789").unwrap();
    apply_patch_texts(tmp.path(), &[&good], &ApplyOptions::default()).unwrap();
    assert!(std::fs::read(tmp.path().join("data.bin")).unwrap() == result);

    // Hostile: a copy past the source's end, a result other than declared, a reserved op.
    let err = |text: String| parse_patch(&text).unwrap_err().to_string();
    let past = delta_patch(inserts_delta(target, &[0x91, 8, 5], 5), &new_oid);
    assert!(err(past).contains("past"));
    let mut longer = inserts_delta(target, &[0x91, 8, 2], 2);
    longer[1..5].copy_from_slice(&inserts_delta(target + 1, &[], 2)[1..5]);
    assert!(err(delta_patch(longer, &new_oid)).contains("produces"));
    let reserved = delta_patch(inserts_delta(target, &[0], 0), &new_oid);
    assert!(err(reserved).contains("reserved"));
    // A wrong result id: parsed (the result depends on the base), refused by apply.
    let other = delta_patch(inserts_delta(target, &[0x91, 8, 2], 2), &git_blob_oid(b"x"));
    std::fs::write(tmp.path().join("data.bin"), b"0123456789").unwrap();
    assert!(apply_patch_texts(tmp.path(), &[&other], &ApplyOptions::default()).is_err());
    assert_eq!(
        std::fs::read(tmp.path().join("data.bin")).unwrap(),
        b"0123456789"
    );
}
