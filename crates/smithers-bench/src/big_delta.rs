//! Scenario 11, big binaries keep their delta: one byte flipped in place (as a database engine
//! rewrites a page) in a 32 MB, a 120 MB and a 1 GiB file of random bytes (which no literal
//! can deflate), through the whole CLI, against git on the same change.
//!
//! - Making the patch. Ours: `run`'s own clock from `child-finished` to its last line (collect:
//!   the change found in the overlay's upper layer, both deltas, the bundle written durably,
//!   the review rows) and the CLI process's peak RSS (`wait4`); the patch is the bundle's
//!   patch files. Git: `git diff --binary --output=FILE` of the worktree against the committed
//!   base, its wall time and peak RSS; the patch is that file.
//! - Applying it. Ours: `accept` (conflict checks, the result staged and checked, the
//!   journal, the rename). Git: `git apply --binary` of its own patch onto the base (the
//!   worktree restored with `git checkout` first, untimed).
//!
//! Both results are compared byte for byte with the expected file before anything is
//! reported.

use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::Context;

use crate::measure::{fmt_ms, median_ratio, Series};
use crate::report::{machine_line, Table};
use crate::whole_cli::{after_the_step, cli_binary, run_measured};

/// The files of the scenario: (name, size in bytes).
const SIZES: [(&str, u64); 3] = [
    ("32 MB", 32_000_000),
    ("120 MB", 120_000_000),
    ("1 GiB", 1 << 30),
];

/// Writes `size` deterministic random bytes (xorshift64*) to `path`.
fn write_random(path: &Path, size: u64, mut seed: u64) -> anyhow::Result<()> {
    let mut w = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut chunk = vec![0u8; 1 << 20];
    let mut left = size;
    seed |= 1;
    while left > 0 {
        for word in chunk.chunks_exact_mut(8) {
            seed ^= seed >> 12;
            seed ^= seed << 25;
            seed ^= seed >> 27;
            word.copy_from_slice(&seed.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
        }
        let n = left.min(chunk.len() as u64) as usize;
        w.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    w.flush()?;
    Ok(())
}

/// Whether two files hold the same bytes.
fn same_bytes(a: &Path, b: &Path) -> anyhow::Result<bool> {
    let (mut fa, mut fb) = (std::fs::File::open(a)?, std::fs::File::open(b)?);
    if fa.metadata()?.len() != fb.metadata()?.len() {
        return Ok(false);
    }
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let n = fa.read(&mut ba)?;
        if n == 0 {
            return Ok(true);
        }
        fb.read_exact(&mut bb[..n])?;
        if ba[..n] != bb[..n] {
            return Ok(false);
        }
    }
}

/// One file of the scenario, made once: the base, where the byte is flipped and to what, and
/// the expected result.
struct Case {
    name: &'static str,
    base: std::path::PathBuf,
    expected: std::path::PathBuf,
    /// `sh -c` script that flips the byte in place in `big.bin` of the current directory.
    script: String,
}

fn prepare(scratch: &Path, name: &'static str, size: u64) -> anyhow::Result<Case> {
    let base = scratch.join(format!("big-delta-{size}.bin"));
    if std::fs::metadata(&base).map(|m| m.len()).ok() != Some(size) {
        write_random(&base, size, size)?;
    }
    let at = size / 3 * 2 + 12_345;
    let mut old = [0u8];
    std::fs::File::open(&base)?.read_exact_at(&mut old, at)?;
    let new = !old[0];
    let expected = scratch.join(format!("big-delta-{size}.expected"));
    std::fs::copy(&base, &expected)?;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&expected)?
        .write_all_at(&[new], at)?;
    Ok(Case {
        name,
        base,
        expected,
        script: format!(
            "printf '\\{new:03o}' | dd of=big.bin bs=1 seek={at} conv=notrunc status=none"
        ),
    })
}

/// What one round measured of one side.
struct Round {
    /// Bytes of the patch.
    patch: u64,
    /// Time to make it, and the peak RSS (KiB) of the process that did.
    make: Duration,
    make_rss: u64,
    /// Time to apply it, and the peak RSS (KiB) of the process that did.
    apply: Duration,
    apply_rss: u64,
}

/// One round of ours: `run` (the step flips the byte), then `accept`.
fn ours_round(bin: &Path, dir: &Path, case: &Case) -> anyhow::Result<Round> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    std::fs::copy(&case.base, dir.join("big.bin"))?;
    let root = dir.to_str().context("scratch path is not UTF-8")?;
    let (_, run_rss, err) = run_measured(
        Command::new(bin)
            .args(["run", "--root", root, "--", "sh", "-c"])
            .arg(&case.script),
    )?;
    let after = after_the_step(&err).with_context(|| format!("no progress clock: {err}"))?;
    let out = Command::new(bin)
        .args(["ls", "--json", "--root", root])
        .output()?;
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let sandbox = &listed[0];
    let id = sandbox["sandboxId"].as_str().context("ls: no sandbox")?;
    let bundle = Path::new(sandbox["bundlePath"].as_str().context("ls: no bundle")?);
    let mut patch = 0;
    for e in std::fs::read_dir(bundle.join("patches"))? {
        patch += e?.metadata()?.len();
    }
    anyhow::ensure!(patch > 0, "{}: the bundle holds no patch: {err}", case.name);
    let (accept, accept_rss, _) =
        run_measured(Command::new(bin).args(["accept", id, "--root", root]))?;
    anyhow::ensure!(
        same_bytes(&dir.join("big.bin"), &case.expected)?,
        "{}: accept did not write the step's bytes",
        case.name
    );
    Ok(Round {
        patch,
        make: after,
        make_rss: run_rss,
        apply: accept,
        apply_rss: accept_rss,
    })
}

/// One round of git: the base committed, the byte flipped, `git diff --binary`, then
/// `git apply --binary` of that patch onto the base.
fn git_round(dir: &Path, case: &Case) -> anyhow::Result<Round> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    std::fs::copy(&case.base, dir.join("big.bin"))?;
    let git = |args: &[&str]| {
        let mut c = Command::new("git");
        c.current_dir(dir)
            .args(["-c", "user.name=b", "-c", "user.email=b@b"])
            .args(args);
        c
    };
    run_measured(&mut git(&["init", "-q"]))?;
    run_measured(&mut git(&["add", "big.bin"]))?;
    run_measured(&mut git(&["commit", "-qm", "base"]))?;
    run_measured(
        Command::new("sh")
            .current_dir(dir)
            .args(["-c", &case.script]),
    )?;
    let patch_file = dir.join(".git/big.patch");
    let output = format!("--output={}", patch_file.display());
    let (diff, diff_rss, _) = run_measured(&mut git(&["diff", "--binary", &output]))?;
    let patch = std::fs::metadata(&patch_file)?.len();
    run_measured(&mut git(&["checkout", "--", "big.bin"]))?;
    let patch_arg = patch_file.to_str().context("scratch path is not UTF-8")?;
    let (apply, apply_rss, _) = run_measured(&mut git(&["apply", "--binary", patch_arg]))?;
    anyhow::ensure!(
        same_bytes(&dir.join("big.bin"), &case.expected)?,
        "{}: git apply did not write the step's bytes",
        case.name
    );
    Ok(Round {
        patch,
        make: diff,
        make_rss: diff_rss,
        apply,
        apply_rss,
    })
}

fn series(name: String, samples: Vec<Duration>) -> Series {
    Series { name, samples }
}

fn bytes(n: u64) -> String {
    match n {
        n if n < 10 << 10 => format!("{n} B"),
        n if n < 10 << 20 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{:.1} MiB", n as f64 / (1 << 20) as f64),
    }
}

/// Scenario 11.
pub fn run(scratch: &Path, rounds: usize) -> anyhow::Result<String> {
    let bin = cli_binary()?;
    let mut making = Table::new(&[
        "file (1 byte flipped)",
        "ours: patch",
        "git diff --binary: patch",
        "git / ours (patch)",
        "ours: after the step (p50)",
        "git diff (p50)",
        "ours / git (time)",
        "ours: peak RSS",
        "git: peak RSS",
    ]);
    let mut applying = Table::new(&[
        "file",
        "ours: accept (p50)",
        "git apply --binary (p50)",
        "ours / git (time)",
        "ours: peak RSS",
        "git: peak RSS",
    ]);
    let (ours_dir, git_dir) = (
        scratch.join("big-delta-ours"),
        scratch.join("big-delta-git"),
    );
    for (name, size) in SIZES {
        let case = prepare(scratch, name, size)?;
        let (mut made, mut diffs, mut accepts, mut applies) = (vec![], vec![], vec![], vec![]);
        let (mut ours_patch, mut git_patch) = (0, 0);
        let (mut rss, mut git_rss, mut acc_rss, mut app_rss) = (0, 0, 0, 0);
        for _ in 0..rounds {
            let r = ours_round(&bin, &ours_dir, &case)?;
            (ours_patch, rss, acc_rss) = (r.patch, rss.max(r.make_rss), acc_rss.max(r.apply_rss));
            made.push(r.make);
            accepts.push(r.apply);
            let g = git_round(&git_dir, &case)?;
            git_patch = g.patch;
            (git_rss, app_rss) = (git_rss.max(g.make_rss), app_rss.max(g.apply_rss));
            diffs.push(g.make);
            applies.push(g.apply);
        }
        let _ = std::fs::remove_dir_all(&ours_dir);
        let _ = std::fs::remove_dir_all(&git_dir);
        let _ = std::fs::remove_file(&case.expected);
        let (made, diffs) = (series("ours".into(), made), series("git".into(), diffs));
        let (accepts, applies) = (
            series("ours".into(), accepts),
            series("git".into(), applies),
        );
        making.row(vec![
            name.to_string(),
            bytes(ours_patch),
            bytes(git_patch),
            format!("{:.0}×", git_patch as f64 / ours_patch.max(1) as f64),
            fmt_ms(made.median()),
            fmt_ms(diffs.median()),
            format!("{:.2}×", median_ratio(&made, &diffs)),
            format!("{} MiB", rss / 1024),
            format!("{} MiB", git_rss / 1024),
        ]);
        applying.row(vec![
            name.to_string(),
            fmt_ms(accepts.median()),
            fmt_ms(applies.median()),
            format!("{:.2}×", median_ratio(&accepts, &applies)),
            format!("{} MiB", acc_rss / 1024),
            format!("{} MiB", app_rss / 1024),
        ]);
        println!("{name}: done");
    }
    Ok(format!(
        "Machine: {}. {rounds} round(s) per file, ours and git alternating. Each file is random \
         bytes (no literal of it deflates) with one byte flipped in place by the step \
         (`dd conv=notrunc`, as a database engine rewrites a page); 32 MB is under the 32 MiB \
         past which a file is never held, 120 MB and 1 GiB are read in place. Ours: `run`'s own \
         clock from `child-finished` to its last line (collect: the change found in the \
         overlay's upper layer, forward and reverse deltas, the bundle written durably, the \
         review rows) and the CLI process's peak RSS (`wait4`); the patch is the bundle's patch \
         files. Git: `git diff --binary --output=FILE` of the worktree against the committed \
         base (wall time, peak RSS), the patch that file. Applying: `accept` against \
         `git apply --binary` of git's own patch onto the base; both results compared byte \
         for byte with the expected file.\n\nMaking the patch:\n\n{}\nApplying it:\n\n{}\n\
         Command: `cargo build --release -p smithers-cli -p smithers-bench && \
         cargo run --release -p smithers-bench -- big-delta`\n",
        machine_line(),
        making.to_markdown(),
        applying.to_markdown()
    ))
}
