//! Big binaries keep their delta, through the real CLI: a step flips one byte of a 120 MB
//! database-like file of the project (random bytes, which deflate to nothing smaller). The
//! bundle's patch is a small git `delta` (not a 150 MB literal past the bundle's 100 MiB, left
//! out), `review` shows the change, and `accept` writes exactly the step's bytes (sha256). The
//! CLI process's peak RSS (from `wait4`) stays under a loose 512 MiB for `run` (which finds and
//! encodes the change) and for `accept` (which applies it): neither holds the file.
//!
//! Real native sandboxes through the CLI binary; prints `SKIP <reason>` without them (fails
//! under `CI=true`). No timing assertion.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

mod support;

use support::native::{bin, sandboxes_usable as usable};

/// Size of the project's file: past the 100 MiB bundle limit as a literal.
const SIZE: u64 = 120_000_000;
/// The byte the step flips.
const AT: u64 = 77_777_777;

/// Deterministic random bytes (xorshift64*), written in 1 MiB chunks.
fn write_noise(path: &Path, size: u64, mut seed: u64) {
    let mut w = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut chunk = Vec::with_capacity(1 << 20);
    let mut left = size;
    seed |= 1;
    while left > 0 {
        chunk.clear();
        while chunk.len() < (1 << 20) {
            seed ^= seed >> 12;
            seed ^= seed << 25;
            seed ^= seed >> 27;
            chunk.extend_from_slice(&seed.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
        }
        let n = left.min(chunk.len() as u64) as usize;
        w.write_all(&chunk[..n]).unwrap();
        left -= n as u64;
    }
    w.flush().unwrap();
}

/// A temporary directory on disk, like a user's project (/tmp may be a small tmpfs).
fn disk_dir() -> tempfile::TempDir {
    option_env!("CARGO_TARGET_TMPDIR")
        .and_then(|base| tempfile::tempdir_in(base).ok())
        .unwrap_or_else(|| tempfile::tempdir().unwrap())
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    assert!(out.status.success(), "sha256sum: {out:?}");
    String::from_utf8(out.stdout).unwrap()[..64].to_string()
}

/// Runs the CLI with `args` to its end; (status, stdout, stderr, peak RSS in KiB of the CLI
/// process alone: `wait4`'s `ru_maxrss`, which does not fold in the sandbox's processes).
fn measured(args: &[&str]) -> (i32, Vec<u8>, String, u64) {
    // Waited for below with wait4 (for its rusage), which `Child` does not offer.
    #[allow(clippy::zombie_processes)]
    let child = bin()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    // Read the pipes on threads while the child runs (a full pipe would stall it).
    let mut stdout = child.stdout.unwrap();
    let mut stderr = child.stderr.unwrap();
    let out = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut stdout, &mut v).unwrap();
        v
    });
    let err = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut stderr, &mut v).unwrap();
        v
    });
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value of this plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our own child, not yet waited for (the `Child` was consumed for its
    // pipes and never waits); `status` and `usage` are valid for writes.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(r, pid, "wait4: {}", std::io::Error::last_os_error());
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -1
    };
    let stdout = out.join().unwrap();
    let stderr = String::from_utf8_lossy(&err.join().unwrap()).into_owned();
    (code, stdout, stderr, usage.ru_maxrss as u64)
}

fn json(stdout: &[u8], stderr: &str) -> Value {
    serde_json::from_slice(stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\nstderr: {stderr}", String::from_utf8_lossy(stdout)))
}

/// Bytes of the bundle's patch files.
fn patch_bytes(bundle: &Path) -> u64 {
    std::fs::read_dir(bundle.join("patches"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

#[test]
fn one_byte_flipped_in_a_120mb_file_is_a_small_patch_reviewed_and_accepted_exactly() {
    if !usable() {
        return;
    }
    if Command::new("sha256sum").arg("--version").output().is_err() {
        smithers_test_support::skip_or_fail("sha256sum not found");
        return;
    }
    let project = disk_dir();
    let root = project.path();
    let db = root.join("data.db");
    write_noise(&db, SIZE, 120);
    std::fs::write(root.join("notes.txt"), "kept\n").unwrap();
    // The expected result, made outside the project by the same flip.
    let reference = disk_dir();
    let expected: PathBuf = reference.path().join("expected.db");
    std::fs::copy(&db, &expected).unwrap();
    let old_byte = {
        use std::os::unix::fs::FileExt;
        let mut b = [0u8];
        std::fs::File::open(&db)
            .unwrap()
            .read_exact_at(&mut b, AT)
            .unwrap();
        b[0]
    };
    let new_byte = !old_byte;
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&expected)
            .unwrap();
        f.write_all_at(&[new_byte], AT).unwrap();
    }
    // The step writes the byte in place, as a database engine would (no truncation).
    let script = format!(
        "printf '\\{new_byte:03o}' | dd of=data.db bs=1 seek={AT} conv=notrunc status=none"
    );
    let root_arg = root.to_str().unwrap();

    let (code, stdout, stderr, run_kib) = measured(&[
        "run", "--json", "--root", root_arg, "--", "sh", "-c", &script,
    ]);
    println!("peak RSS of run: {} MiB", run_kib / 1024);
    let doc = json(&stdout, &stderr);
    assert_eq!(code, 0, "{doc}\n{stderr}");
    assert!(
        doc["changeNotes"]["leftOut"]
            .as_array()
            .is_none_or(Vec::is_empty),
        "the file was left out: {}",
        doc["changeNotes"]
    );
    let patched: Vec<&str> = doc["patches"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["path"].as_str())
        .collect();
    assert_eq!(patched, ["data.db"], "{doc}");
    assert!(
        run_kib < 512 * 1024,
        "run held {} MiB collecting a 1-byte edit of a 120 MB file",
        run_kib / 1024
    );
    let id = doc["sandboxId"].as_str().unwrap().to_string();

    // The review shows it; its patch is the bundle's, small, a git delta.
    let (code, stdout, stderr, _) = measured(&["review", &id, "--root", root_arg]);
    assert_eq!(code, 0, "review: {stderr}");
    let text = String::from_utf8(stdout).unwrap();
    assert!(text.contains("data.db"), "{text}");
    let (code, stdout, stderr, review_kib) =
        measured(&["review", &id, "--json", "--root", root_arg]);
    assert_eq!(code, 0, "review --json: {stderr}");
    let review = json(&stdout, &stderr);
    let diff = review["diff"].as_str().unwrap();
    assert!(diff.contains("GIT binary patch\ndelta "), "{diff}");
    let bytes = patch_bytes(Path::new(review["bundlePath"].as_str().unwrap()));
    println!(
        "patch: {bytes} bytes; peak RSS of review: {} MiB",
        review_kib / 1024
    );
    assert!(
        bytes <= 200 << 10,
        "the bundle's patches hold {bytes} bytes"
    );
    assert!(
        review_kib < 512 * 1024,
        "review held {} MiB",
        review_kib / 1024
    );

    // Accept writes exactly the step's bytes, without holding the file.
    let (code, _, stderr, accept_kib) = measured(&["accept", &id, "--root", root_arg]);
    println!("peak RSS of accept: {} MiB", accept_kib / 1024);
    assert_eq!(code, 0, "accept: {stderr}");
    assert_eq!(std::fs::metadata(&db).unwrap().len(), SIZE);
    assert_eq!(sha256(&db), sha256(&expected), "accepted bytes differ");
    assert_eq!(
        std::fs::read_to_string(root.join("notes.txt")).unwrap(),
        "kept\n"
    );
    assert!(
        accept_kib < 512 * 1024,
        "accept held {} MiB applying a 1-byte edit of a 120 MB file",
        accept_kib / 1024
    );
}
