//! Host paths a caller brings into a sandbox (`volumes`, the CLI's `--mount` and
//! `--toolchain`): what they are, and which must not be brought in without an explicit choice.
//!
//! A mount is the one way a step sees the host beyond its read-only root and its copy-on-write
//! `/workspace`, so it is where a caller can hand a hostile step their keys by mistake: `--mount
//! ~` carries `~/.ssh`, `--mount /run` carries the Docker socket (root on the host). Such a
//! mount is refused unless the caller says `allowSensitiveMounts`; a writable mount of (or
//! over, or under) the project is refused always, because the project is written only by an
//! accepted review.

use std::path::{Component, Path, PathBuf};

use crate::{Controls, Protection, ProtectionStatus};

/// The name of the enforcement report's row about mounts ([`report_row`]).
pub const HOST_MOUNTS: &str = "host-mounts";

/// Directory or file names that hold credentials, wherever they are: a mount that is one, is
/// inside one, or contains one is sensitive.
const SECRET_NAMES: &[(&str, &str)] = &[
    (".ssh", "SSH keys"),
    (".gnupg", "GnuPG keys"),
    (".aws", "AWS credentials"),
    (".azure", "Azure credentials"),
    (".kube", "Kubernetes credentials"),
    (".docker", "Docker credentials"),
    (".netrc", "netrc passwords"),
    (".git-credentials", "git credentials"),
    (".npmrc", "npm tokens"),
    (".pypirc", "PyPI tokens"),
    (".password-store", "a password store"),
    (".vault-token", "a Vault token"),
    (".config/gcloud", "Google Cloud credentials"),
    (".config/gh", "GitHub CLI tokens"),
    (".cargo/credentials.toml", "cargo registry tokens"),
    (".cargo/credentials", "cargo registry tokens"),
];

/// Whether `path` has the components of `pattern` (`.config/gh`) one after the other.
fn has_components(path: &Path, pattern: &str) -> bool {
    let want: Vec<&std::ffi::OsStr> = Path::new(pattern).iter().collect();
    let have: Vec<&std::ffi::OsStr> = path.iter().collect();
    have.windows(want.len()).any(|w| w == want.as_slice())
}

/// Host directories a mount may not be, contain, or lie inside: kernel and device trees,
/// daemons' sockets, the host's own configuration and boot files.
const SYSTEM_TREES: &[(&str, &str)] = &[
    ("/proc", "the host's processes and kernel settings"),
    ("/sys", "the host's kernel and devices"),
    ("/dev", "the host's devices"),
    ("/boot", "the host's kernel and boot loader"),
    ("/etc", "the host's configuration (passwords, sudoers)"),
    ("/run", "daemons' sockets (Docker, D-Bus, systemd)"),
    ("/var/run", "daemons' sockets (Docker, D-Bus, systemd)"),
    ("/var/lib/docker", "every container's files"),
];

/// `path` made absolute without touching the file system: `.` and `..` resolved by name.
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(name) => out.push(name),
            _ => {}
        }
    }
    out
}

/// Why mounting the host path `host` is sensitive, or `None`. `host` is resolved through its
/// links first (a link named `tools` to `~/.ssh` is `~/.ssh`); `home` is the caller's home.
/// A socket or a device node is sensitive wherever it is (a daemon's socket is its whole API).
pub fn sensitive_reason(host: &Path, home: Option<&Path>) -> Option<String> {
    use std::os::unix::fs::FileTypeExt;
    let resolved = std::fs::canonicalize(host).unwrap_or_else(|_| lexical(host));
    let shown = resolved.display();
    if let Ok(meta) = std::fs::metadata(&resolved) {
        let t = meta.file_type();
        if t.is_socket() {
            return Some(format!("{shown} is a socket (a daemon's whole API)"));
        }
        if t.is_block_device() || t.is_char_device() {
            return Some(format!("{shown} is a device"));
        }
    }
    if resolved == Path::new("/") {
        return Some("/ is the whole host".into());
    }
    for (tree, what) in SYSTEM_TREES {
        let tree = Path::new(tree);
        if resolved.starts_with(tree) || tree.starts_with(&resolved) {
            return Some(format!("{shown} overlaps {} ({what})", tree.display()));
        }
    }
    if let Some(home) = home.filter(|h| h.is_absolute() && *h != Path::new("/")) {
        if home.starts_with(&resolved) {
            return Some(format!(
                "{shown} holds the home directory {} (its keys and credentials)",
                home.display()
            ));
        }
    }
    for (name, what) in SECRET_NAMES {
        if has_components(&resolved, name) {
            return Some(format!("{shown} is or is inside a {name} ({what})"));
        }
    }
    None
}

/// Why a writable mount of `host` would let the step write the project (`root`) behind the
/// review's back, or `None`. The project is written only by an accepted review, so this is
/// refused whatever the caller allows; a read-only mount of the project is harmless.
pub fn project_overlap(host: &Path, root: &Path) -> Option<String> {
    let resolved = std::fs::canonicalize(host).unwrap_or_else(|_| lexical(host));
    let root = std::fs::canonicalize(root).unwrap_or_else(|_| lexical(root));
    (resolved.starts_with(&root) || root.starts_with(&resolved)).then(|| {
        format!(
            "a writable mount of {} overlaps the project {}: the project is written only by an accepted review (mount it read-only, or let the step change /workspace)",
            resolved.display(),
            root.display()
        )
    })
}

/// The `host-mounts` row of an enforcement report: every host path the caller brought in
/// and how. Enforced when there is none or all are read-only; degraded when the step can
/// write a host path (what it writes there is not reviewed) or a sensitive mount was allowed.
pub fn report_row(c: &Controls) -> Protection {
    let row = |status, detail: String| Protection {
        name: HOST_MOUNTS.to_string(),
        status,
        detail,
        fix: None,
    };
    if c.volumes.is_empty() {
        return row(
            ProtectionStatus::Enforced,
            "no host path mounted beyond the read-only root".into(),
        );
    }
    let list: Vec<String> = c
        .volumes
        .iter()
        .map(|v| {
            format!(
                "{} at {} ({})",
                v.host.display(),
                v.container.display(),
                if v.readonly { "ro" } else { "rw" }
            )
        })
        .collect();
    let writable = c.volumes.iter().any(|v| !v.readonly);
    let mut detail = list.join("; ");
    if writable {
        detail
            .push_str("; a writable mount is written by the step directly, not through the review");
    }
    if c.allow_sensitive_mounts {
        detail.push_str("; sensitive host paths allowed by the caller (allowSensitiveMounts)");
    }
    let status = if writable || c.allow_sensitive_mounts {
        ProtectionStatus::Degraded
    } else {
        ProtectionStatus::Enforced
    };
    row(status, detail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_system_trees_and_homes_are_sensitive() {
        let home = Path::new("/home/u");
        for p in [
            "/",
            "/home",
            "/home/u",
            "/home/u/.ssh",
            "/home/u/.ssh/id_ed25519",
            "/home/other/.aws",
            "/home/u/.config/gcloud",
            "/home/u/.cargo/credentials.toml",
            "/etc",
            "/etc/shadow",
            "/run",
            "/var/run/docker.sock",
            "/proc/1/root",
            "/dev/sda",
            "/home/u/x/../.ssh",
        ] {
            assert!(
                sensitive_reason(Path::new(p), Some(home)).is_some(),
                "{p} should be sensitive"
            );
        }
        for p in [
            "/home/u/.rustup",
            "/root/.rustup",
            "/home/u/.cargo/bin",
            "/home/u/.nvm",
            "/opt/toolchain",
            "/home/u/src/gh/tools",
            "/home/u/credentials",
            "/usr/local/go",
        ] {
            assert_eq!(sensitive_reason(Path::new(p), Some(home)), None, "{p}");
        }
    }

    #[test]
    fn a_link_is_judged_by_what_it_points_at() {
        let dir = tempfile::tempdir().unwrap();
        let ssh = dir.path().join(".ssh");
        std::fs::create_dir(&ssh).unwrap();
        let link = dir.path().join("tools");
        std::os::unix::fs::symlink(&ssh, &link).unwrap();
        assert!(sensitive_reason(&link, None).is_some());
    }

    #[test]
    fn writable_mounts_over_the_project_are_named() {
        let root = Path::new("/srv/project");
        assert!(project_overlap(Path::new("/srv/project"), root).is_some());
        assert!(project_overlap(Path::new("/srv/project/target"), root).is_some());
        assert!(project_overlap(Path::new("/srv"), root).is_some());
        assert_eq!(project_overlap(Path::new("/srv/cache"), root), None);
    }
}
