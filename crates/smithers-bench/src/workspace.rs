//! Generated project trees for the workspace-scaling scenario: `n` small source-like files
//! spread over directories of 100, cached between runs (generating 100k files takes a while);
//! and that scenario's runs of the CLI on them.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

/// A generated project of `files` files under `base/ws-<files>`, with a git repository whose
/// single commit holds every file (so `git status`/`git diff` have something to compare).
pub fn generated(base: &Path, files: usize) -> anyhow::Result<PathBuf> {
    let root = base.join(format!("ws-{files}"));
    let marker = root.join(".generated-complete");
    if marker.exists() {
        return Ok(root);
    }
    if root.exists() {
        std::fs::remove_dir_all(&root)?;
    }
    for i in 0..files {
        let dir = root.join(format!("src/d{:04}", i / 100));
        if i % 100 == 0 {
            std::fs::create_dir_all(&dir)?;
        }
        std::fs::write(
            dir.join(format!("f{i:06}.rs")),
            format!("// file {i}\npub fn f{i}() -> u64 {{\n    {i}\n}}\n"),
        )?;
    }
    std::fs::write(root.join(".gitignore"), "target/\n")?;
    git(&root, &["init", "-q"])?;
    git(&root, &["add", "-A"])?;
    // Commit without the automatic background `git gc`, then pack in the foreground: a
    // detached gc deleting loose objects would race the `cp -a` contender.
    git(&root, &["config", "gc.auto", "0"])?;
    git(
        &root,
        &[
            "-c",
            "user.name=bench",
            "-c",
            "user.email=bench@localhost",
            "commit",
            "-qm",
            "generated",
        ],
    )?;
    git(&root, &["gc", "-q"])?;
    std::fs::write(&marker, "")?;
    // The marker must not show up as a change.
    std::fs::write(root.join(".git/info/exclude"), ".generated-complete\n")?;
    Ok(root)
}

/// The shell snippet a step runs to change 10 files of a generated workspace.
pub fn change_ten_files_script() -> String {
    (0..10)
        .map(|i| format!("echo '// changed' >> src/d{:04}/f{:06}.rs", i, i * 100))
        .collect::<Vec<_>>()
        .join(" && ")
}

fn git(dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    let status = Command::new("git").arg("-C").arg(dir).args(args).status()?;
    anyhow::ensure!(status.success(), "git {args:?} failed in {}", dir.display());
    Ok(())
}

/// The lines of `run`'s progress clock the scenario reports, in order.
pub const CLOCK_PHASES: [&str; 5] = [
    "created",
    "shipped",
    "child-finished",
    "bundle-collected",
    "review",
];

/// Whole `smithers-sandbox run` processes of one step on one tree, on their own (no resident
/// service), each leaving its review pending; the progress clock of each is kept.
pub struct CliRuns {
    bin: PathBuf,
    root: PathBuf,
    script: String,
    /// Per run, the clock's time of each of [`CLOCK_PHASES`].
    clocks: Mutex<Vec<[Duration; 5]>>,
}

impl CliRuns {
    pub fn new(bin: &Path, root: &Path, script: &str) -> Self {
        CliRuns {
            bin: bin.to_path_buf(),
            root: root.to_path_buf(),
            script: script.to_string(),
            clocks: Mutex::new(Vec::new()),
        }
    }

    /// One run; fails unless it exits 0 with `patches` patch files pending review.
    pub fn run(&self, patches: usize) -> anyhow::Result<()> {
        let out = Command::new(&self.bin)
            .env("SMITHERS_RESIDENT", "off")
            .env("NO_COLOR", "1")
            .env_remove("SMITHERS_DB")
            .args(["run", "--root"])
            .arg(&self.root)
            .args(["--", "sh", "-c", &self.script])
            .stdin(Stdio::null())
            .output()?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        anyhow::ensure!(out.status.success(), "run failed: {text}");
        anyhow::ensure!(
            text.contains(&format!("pending: {patches} patch file(s)")),
            "expected {patches} patch files pending review: {text}"
        );
        let mut clock = [Duration::ZERO; 5];
        for line in text.lines() {
            let Some((time, event)) = line.strip_prefix('[').and_then(|l| l.split_once(']')) else {
                continue;
            };
            let Some(secs) = time
                .trim()
                .strip_suffix('s')
                .and_then(|t| t.parse::<f64>().ok())
            else {
                continue;
            };
            if let Some(i) = CLOCK_PHASES.iter().position(|p| *p == event.trim()) {
                clock[i] = Duration::from_secs_f64(secs);
            }
        }
        self.clocks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(clock);
        Ok(())
    }

    /// Removes the bundles kept for review (untimed: in real use they wait for a decision).
    pub fn discard_bundles(&self) {
        let _ = std::fs::remove_dir_all(self.root.join(".smithers/sandboxes"));
    }

    /// The median time of clock line `i` over the runs after `warm_up`.
    pub fn phase_median(&self, i: usize, warm_up: usize) -> Duration {
        let clocks = self.clocks.lock().unwrap_or_else(|p| p.into_inner());
        let samples: Vec<Duration> = clocks.iter().skip(warm_up).map(|c| c[i]).collect();
        crate::measure::percentile(&samples, 50.0)
    }
}
