//! Generated project trees for the workspace-scaling scenario: `n` small source-like files
//! spread over directories of 100, cached between runs (generating 100k files takes a while).

use std::path::{Path, PathBuf};
use std::process::Command;

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
