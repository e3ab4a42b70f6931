//! What a sandbox's things are called: its directories under the state and layer roots, its
//! cgroups, and its directories in the project.

use std::path::{Path, PathBuf};

use smithers_runtime::SandboxConfig;

/// The runtime's name in its errors.
pub(crate) const RUNTIME: &str = "bubblewrap";

/// A sandbox's directory name under the state and layer roots: `<runId>+<sandboxId>`. Ids
/// are `[A-Za-z0-9._-]`, so the `+` makes the name unambiguous; one flat level, so that no
/// per-run directory is left behind once a run's last sandbox is cleaned up.
pub(crate) fn dir_name(config: &SandboxConfig) -> String {
    format!("{}+{}", config.run_id, config.sandbox_id)
}

/// A warm sandbox's cgroup name, of the same shape as [`cgroup_name`].
pub(crate) fn warm_cgroup_name() -> String {
    use std::hash::{Hash, Hasher};
    static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    "warm".hash(&mut h);
    MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        .hash(&mut h);
    std::process::id().hash(&mut h);
    std::time::SystemTime::now().hash(&mut h);
    format!("smithers-{:016x}", h.finish())
}

pub(crate) fn cgroup_name(config: &SandboxConfig) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    config.entity_id().hash(&mut h);
    std::process::id().hash(&mut h);
    std::time::SystemTime::now().hash(&mut h);
    format!("smithers-{:016x}", h.finish())
}

/// A sandbox's directories in its project: its root
/// (`<root>/.smithers/sandboxes/<runId>/<sandboxId>`), the request and the result directories.
pub(crate) fn project_dirs(root_dir: &Path, config: &SandboxConfig) -> (PathBuf, PathBuf, PathBuf) {
    let sandbox_root = root_dir
        .join(".smithers")
        .join("sandboxes")
        .join(&config.run_id)
        .join(&config.sandbox_id);
    let request = sandbox_root.join("request");
    let result = sandbox_root.join("result");
    (sandbox_root, request, result)
}
