//! Scenarios measured on the `smithers-sandbox` binary as a user runs it, whole processes:
//!
//! - 6, the whole CLI: `smithers-sandbox run -- true` (store, lifecycle, durable bundle)
//!   against bare `bwrap` with the same isolation, interleaved; on its own and through the
//!   resident service (`smithers-sandbox daemon`, started by the bench in its scratch space).
//! - 8, the cost of what a step changed: 1k, 10k and 100k new files, one 300 MB new file and a
//!   4 GiB sparse one. The time after the step ends (collect, patches, bundle, review rows:
//!   `run`'s own progress clock, from `child-finished` to its last line) and the CLI's peak RSS,
//!   against `git add -A && git diff --cached --binary` on the same change in a git
//!   repository (time and peak RSS of both git processes).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::measure::{fmt_ms, interleaved, median_ratio, Contender, Series};
use crate::report::{machine_line, Table};

/// The CLI binary built with this bench (same profile, same target directory).
pub fn cli_binary() -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe()?;
    let bin = me
        .parent()
        .context("the bench binary has no directory")?
        .join("smithers-sandbox");
    anyhow::ensure!(
        bin.is_file(),
        "{} not found: cargo build --release -p smithers-cli",
        bin.display()
    );
    Ok(bin)
}

/// Runs `cmd` to the end with its output discarded; its wall time and peak RSS (KiB, from
/// `wait4`: the process itself, whichever of its children was largest is not folded in).
pub(crate) fn run_measured(cmd: &mut Command) -> anyhow::Result<(Duration, u64, String)> {
    let started = Instant::now();
    // Waited for below with wait4 (for its rusage), which `Child` does not offer.
    #[allow(clippy::zombie_processes)]
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("spawn")?;
    let mut stderr = child.stderr.take().context("stderr")?;
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut s);
        s
    });
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value of this plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our child, not waited for yet; `status` and `usage` are writable.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    anyhow::ensure!(r == pid, "wait4: {}", std::io::Error::last_os_error());
    let took = started.elapsed();
    let err = reader.join().unwrap_or_default();
    anyhow::ensure!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{cmd:?} failed: {err}"
    );
    Ok((took, usage.ru_maxrss as u64, err))
}

/// The resident service of the CLI binary under test, in a private directory of the bench's
/// scratch space; stopped when dropped.
struct Resident {
    dir: PathBuf,
    bin: PathBuf,
    child: std::process::Child,
}

impl Resident {
    fn start(bin: &Path, scratch: &Path) -> anyhow::Result<Resident> {
        use std::os::unix::fs::PermissionsExt;
        let dir = scratch.join("resident");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        let child = Command::new(bin)
            .env("SMITHERS_RESIDENT_DIR", &dir)
            .args(["daemon", "serve", "--idle", "10m"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the resident service")?;
        let service = Resident {
            dir,
            bin: bin.to_path_buf(),
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let status = service
                .command(bin)
                .args(["daemon", "status"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()?;
            if status.success() {
                return Ok(service);
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "the resident service did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits (up to 2 s) until the service has its next sandbox ready again: it prepares it
    /// once a step is answered, and that work must not be timed as another contender's.
    fn wait_ready(&self, bin: &Path) {
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            let out = self
                .command(bin)
                .args(["--json", "daemon", "status"])
                .output();
            let ready = out.ok().and_then(|o| {
                let doc: serde_json::Value = serde_json::from_slice(&o.stdout).ok()?;
                let project = doc["status"]["projects"].get(0)?.clone();
                Some(project["warm"]["ready"].as_u64()? >= 1 && doc["status"]["busy"] == false)
            });
            if ready == Some(true) {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// `bin` as a client that must be served by this service.
    fn command(&self, bin: &Path) -> Command {
        let mut c = Command::new(bin);
        c.env("SMITHERS_RESIDENT_DIR", &self.dir)
            .env("SMITHERS_RESIDENT", "require");
        c
    }
}

impl Drop for Resident {
    /// Stops the service as a user would (`daemon stop`), so that it removes its prepared
    /// sandbox and the sandbox's cgroups: killed, it left one set of cgroups per bench run,
    /// which the next runs then paid for. Killed only if it has not ended after that.
    fn drop(&mut self) {
        let _ = Command::new(&self.bin)
            .env("SMITHERS_RESIDENT_DIR", &self.dir)
            .args(["daemon", "stop"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Scenario 6.
pub fn whole_cli(scratch: &Path, rounds: usize, bwrap_args: &[&str]) -> anyhow::Result<String> {
    let bin = cli_binary()?;
    let project = |name: &str| -> anyhow::Result<(PathBuf, String)> {
        let dir = scratch.join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("README"), "a tiny project\n")?;
        let root = dir.to_str().context("project path")?.to_string();
        Ok((dir, root))
    };
    let (project_dir, root) = project("whole-cli-project")?;
    let (served_dir, served_root) = project("whole-cli-served-project")?;
    let resident = Resident::start(&bin, scratch)?;
    let quiet = |mut cmd: Command, args: &[&str]| -> anyhow::Result<()> {
        let status = cmd
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        anyhow::ensure!(status.success(), "smithers-sandbox {args:?}: {status}");
        Ok(())
    };
    // The process on its own: no service asked, whatever runs on this machine.
    let alone = || {
        let mut c = Command::new(&bin);
        c.env("SMITHERS_RESIDENT", "off");
        c
    };
    let sandboxes = project_dir.join(".smithers/sandboxes");
    let served_sandboxes = served_dir.join(".smithers/sandboxes");
    let mut contenders = vec![
        Contender::new("smithers-sandbox run -- true (whole process)", || {
            quiet(alone(), &["run", "--root", &root, "--", "true"])
        })
        // Untimed: the bundles a user keeps for review until accepted or rejected.
        .with_after(|| {
            let _ = std::fs::remove_dir_all(&sandboxes);
        }),
        Contender::new("bare bwrap --unshare-all ... true", || {
            crate::measure::run_quiet("bwrap", bwrap_args)
        }),
        Contender::new("smithers-sandbox --version (process start only)", || {
            quiet(alone(), &["--version"])
        }),
        Contender::new(
            "smithers-sandbox run -- true through the resident service (`daemon`)",
            || {
                quiet(
                    resident.command(&bin),
                    &["run", "--root", &served_root, "--", "true"],
                )
            },
        )
        .with_after(|| {
            let _ = std::fs::remove_dir_all(&served_sandboxes);
            resident.wait_ready(&bin);
        }),
    ];
    let series: Vec<Series> = interleaved(&mut contenders, 5, rounds)?;
    drop(contenders);
    drop(resident);
    let bwrap = &series[1];
    let mut table = Table::new(&["contender", "p50", "p95", "ratio to bare bwrap"]);
    for s in &series {
        table.row(vec![
            s.name.clone(),
            fmt_ms(s.median()),
            fmt_ms(s.p95()),
            format!("{:.2}×", median_ratio(s, bwrap)),
        ]);
    }
    Ok(format!(
        "Machine: {}. {rounds} interleaved rounds after 5 warm-up rounds, whole processes \
         (`run` opens the project's SQLite store, records every state change and event, \
         writes the bundle durably — its files and directories fsync'd — and opens the \
         review). Ratios are medians of per-round pairs. Through the resident service, `run` \
         is a client that hands the step (and its stdio) to `smithers-sandbox daemon`, which \
         keeps the project's store open and its next sandbox armed; it does the same work, in \
         the same code. The service prepares the next sandbox once a step is answered; each \
         round waits for that (untimed) before the next contender runs.\n\n{}\n\
         Ours / bare bwrap = **{:.2}×** on its own, **{:.2}×** through the resident service. \
         Command: `cargo build --release -p smithers-cli -p smithers-bench && \
         cargo run --release -p smithers-bench -- whole-cli`\n",
        machine_line(),
        table.to_markdown(),
        median_ratio(&series[0], bwrap),
        median_ratio(&series[3], bwrap),
    ))
}

/// One change of scenario 8: a name and the shell script that makes it in the current
/// directory (run inside the sandbox by `run`, and on the host for git).
struct Change {
    name: &'static str,
    script: String,
}

fn changes() -> Vec<Change> {
    let files = |n: u32| {
        Change {
        name: match n {
            1_000 => "1k new files",
            10_000 => "10k new files",
            _ => "100k new files",
        },
        // 100 directories of small text files, one line each.
        script: format!(
            "python3 -c 'import os\nfor i in range({n}):\n    d=\"d%02d\" % (i % 100)\n    \
             os.makedirs(d, exist_ok=True)\n    open(\"%s/f%d.txt\" % (d, i), \"w\").write(\"line %d\\n\" % i)'"
        ),
    }
    };
    vec![
        files(1_000),
        files(10_000),
        files(100_000),
        Change {
            name: "one 300 MB new file (random)",
            script: "head -c 300000000 /dev/urandom > big.bin".into(),
        },
        Change {
            name: "one 4 GiB sparse file",
            script: "truncate -s 4G sparse.img".into(),
        },
    ]
}

/// Time from `run`'s `child-finished` progress line (`[   0.72s] child-finished`) to its last
/// one (`review`, or `completed` when nothing changed). The clock shows hundredths.
pub(crate) fn after_the_step(stderr: &str) -> Option<Duration> {
    let clock: Vec<(f64, &str)> = stderr
        .lines()
        .filter_map(|l| {
            let (time, event) = l.strip_prefix('[')?.split_once(']')?;
            Some((time.trim().strip_suffix('s')?.parse().ok()?, event.trim()))
        })
        .collect();
    let finished = clock.iter().find(|(_, e)| *e == "child-finished")?.0;
    let last = clock.last()?.0;
    (last >= finished).then(|| Duration::from_secs_f64(last - finished))
}

fn fresh_dir(path: &Path) -> anyhow::Result<()> {
    let _ = std::fs::remove_dir_all(path);
    std::fs::create_dir_all(path)?;
    std::fs::write(path.join("README"), "a project\n")?;
    Ok(())
}

/// Scenario 8.
pub fn change_cost(scratch: &Path, rounds: usize) -> anyhow::Result<String> {
    let bin = cli_binary()?;
    let mut table = Table::new(&[
        "change",
        "ours: after the step (p50)",
        "ours: peak RSS",
        "git add -A && git diff --cached --binary (p50)",
        "git: peak RSS",
        "ours / git (median of pairs)",
    ]);
    let ours_dir = scratch.join("change-cost-ours");
    let git_dir = scratch.join("change-cost-git");
    for change in changes() {
        let (mut ours, mut git) = (Vec::new(), Vec::new());
        let (mut ours_rss, mut git_rss) = (0u64, 0u64);
        for _ in 0..rounds {
            fresh_dir(&ours_dir)?;
            let (_, rss, err) = run_measured(
                Command::new(&bin)
                    .args(["run", "--root"])
                    .arg(&ours_dir)
                    .args(["--", "sh", "-c", &change.script]),
            )?;
            let after = after_the_step(&err)
                .with_context(|| format!("no progress clock in run's output: {err}"))?;
            ours.push(after);
            ours_rss = ours_rss.max(rss);

            fresh_dir(&git_dir)?;
            let git_in = |args: &[&str]| {
                let mut c = Command::new("git");
                c.current_dir(&git_dir).args(args);
                c
            };
            run_measured(&mut git_in(&["init", "-q"]))?;
            run_measured(&mut git_in(&["add", "-A"]))?;
            run_measured(&mut git_in(&[
                "-c",
                "user.name=b",
                "-c",
                "user.email=b@b",
                "commit",
                "-qm",
                "base",
            ]))?;
            run_measured(
                Command::new("sh")
                    .current_dir(&git_dir)
                    .args(["-c", &change.script]),
            )?;
            let (t_add, r_add, _) = run_measured(&mut git_in(&["add", "-A"]))?;
            let (t_diff, r_diff, _) = run_measured(&mut git_in(&[
                "diff",
                "--cached",
                "--binary",
                "--output=/dev/null",
            ]))?;
            git.push(t_add + t_diff);
            git_rss = git_rss.max(r_add.max(r_diff));
        }
        let ours = Series {
            name: change.name.to_string(),
            samples: ours,
        };
        let git = Series {
            name: format!("git: {}", change.name),
            samples: git,
        };
        table.row(vec![
            change.name.to_string(),
            fmt_ms(ours.median()),
            format!("{} MiB", ours_rss / 1024),
            fmt_ms(git.median()),
            format!("{} MiB", git_rss / 1024),
            format!("{:.2}×", median_ratio(&ours, &git)),
        ]);
        println!("{}: done", change.name);
    }
    let _ = std::fs::remove_dir_all(&ours_dir);
    let _ = std::fs::remove_dir_all(&git_dir);
    Ok(format!(
        "Machine: {}. {rounds} rounds per change, ours and git alternating. Ours: `run`'s own \
         clock (hundredths of a second) from `child-finished` to its last line, `review` (collect: the changes found in the \
         overlay's upper layer, patches, `diffBundle`, bundle written durably, review rows), \
         and the CLI process's peak RSS (`wait4`). Git: `git add -A` then `git diff --cached \
         --binary --output=/dev/null` on the same change in a fresh repository, the two \
         processes' times summed and the larger peak RSS. Our bundle carries at most 100 MiB \
         of patches: the 300 MB random file is left out (named, its layer kept) once its \
         patch passes that, the 4 GiB sparse file before any of it is read (over the 1 GiB \
         bound on changed content); git hashes and stores all of both.\n\n{}\n\
         Command: `cargo build --release -p smithers-cli -p smithers-bench && \
         cargo run --release -p smithers-bench -- change-cost`\n",
        machine_line(),
        table.to_markdown()
    ))
}
