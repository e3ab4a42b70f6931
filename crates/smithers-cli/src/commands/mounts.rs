//! `run --mount HOST[:DEST][:ro|rw]` and `run --toolchain NAME`: host paths brought into the
//! sandbox (the runtime's `volumes`). Read-only unless `:rw` is said; a sensitive host path
//! (credentials, system trees, a whole home) is refused by the runtime unless
//! `--allow-sensitive-mount` is given (`smithers_runtime::mounts`).
//!
//! A toolchain is a set of such mounts, read-only and at the same path as on the host (the
//! tools inside keep the absolute paths they were installed with), plus the variables and
//! `PATH` entries that make them found. What each brings is in [`TOOLCHAIN_HELP`].

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde_json::Value;
use smithers_errors::ErrorCode;
use smithers_runtime::VolumeMount;

use crate::output::coded_error;

/// What `--toolchain` brings (shown in `run --help`).
pub const TOOLCHAIN_HELP: &str = "\
Toolchains (--toolchain NAME, repeatable), each read-only at its host path:
  rustup  $RUSTUP_HOME (~/.rustup) and $CARGO_HOME/bin (~/.cargo/bin); RUSTUP_HOME set,
          cargo's bin first on PATH; CARGO_HOME stays the sandbox's own ~/.cargo (caches)
  pyenv   $PYENV_ROOT (~/.pyenv); PYENV_ROOT set, its shims and bin on PATH
  nvm     $NVM_DIR (~/.nvm); NVM_DIR set, the host's active node (from its PATH, else the
          newest installed) on PATH
  pipx    $PIPX_HOME (~/.local/share/pipx or ~/.local/pipx) and $PIPX_BIN_DIR (~/.local/bin),
          the bin directory on PATH
The step's $HOME is its own writable, empty directory (/home/sandbox on the native runtime).";

fn invalid(message: String) -> anyhow::Error {
    coded_error(ErrorCode::InvalidInput, message, Value::Null)
}

fn home() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|h| h.is_absolute())
}

/// `~` or `~/x` expanded with `$HOME`, a relative path made absolute from the current
/// directory, then resolved through its links (the runtime judges what it points at).
fn host_path(flag: &str, text: &str) -> anyhow::Result<PathBuf> {
    let expanded = match text.strip_prefix('~') {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => {
            let home =
                home().ok_or_else(|| invalid(format!("{flag} {text:?}: $HOME is not set")))?;
            home.join(rest.trim_start_matches('/'))
        }
        _ => PathBuf::from(text),
    };
    let absolute = if expanded.is_absolute() {
        expanded
    } else {
        std::env::current_dir()
            .context("current directory")?
            .join(expanded)
    };
    std::fs::canonicalize(&absolute)
        .map_err(|e| invalid(format!("{flag} {text:?}: {}: {e}", absolute.display())))
}

/// Parses one `--mount HOST[:DEST][:ro|rw]` (read-only unless `:rw`; DEST defaults to the
/// host path). A path with a `:` of its own cannot be said this way.
pub fn parse_mount(text: &str) -> anyhow::Result<VolumeMount> {
    let mut parts: Vec<&str> = text.split(':').collect();
    let readonly = match parts.last().copied() {
        Some("ro") if parts.len() > 1 => {
            parts.pop();
            true
        }
        Some("rw") if parts.len() > 1 => {
            parts.pop();
            false
        }
        _ => true,
    };
    let (host, dest) = match parts.as_slice() {
        [host] => (*host, None),
        [host, dest] => (*host, Some(*dest)),
        _ => {
            return Err(invalid(format!(
                "--mount {text:?} is not HOST[:DEST][:ro|rw] (a path with ':' in it cannot be mounted this way)"
            )))
        }
    };
    if host.is_empty() || dest.is_some_and(str::is_empty) {
        return Err(invalid(format!(
            "--mount {text:?}: HOST and DEST must not be empty"
        )));
    }
    let host = host_path("--mount", host)?;
    let container = match dest {
        Some(d) if !d.starts_with('/') => {
            return Err(invalid(format!(
                "--mount {text:?}: DEST {d:?} must be an absolute path inside the sandbox"
            )))
        }
        Some(d) => PathBuf::from(d),
        None => host.clone(),
    };
    Ok(VolumeMount {
        host,
        container,
        readonly,
    })
}

/// What one toolchain adds to a step: read-only mounts, variables, `PATH` entries.
#[derive(Debug, Default)]
pub struct Toolchain {
    pub mounts: Vec<VolumeMount>,
    pub env: Vec<(String, String)>,
    pub path: Vec<PathBuf>,
}

impl Toolchain {
    fn mount(&mut self, dir: &Path) {
        self.mounts.push(VolumeMount {
            host: dir.to_path_buf(),
            container: dir.to_path_buf(),
            readonly: true,
        });
    }
}

/// A directory from `$var`, else the first of `defaults` (under `$HOME`) that exists,
/// resolved; an error naming the toolchain and where it looked when there is none.
fn toolchain_dir(name: &str, var: &str, defaults: &[&str]) -> anyhow::Result<PathBuf> {
    let mut tried = Vec::new();
    let candidates: Vec<PathBuf> = match std::env::var_os(var) {
        Some(v) if !v.is_empty() => vec![PathBuf::from(v)],
        _ => match home() {
            Some(h) => defaults.iter().map(|d| h.join(d)).collect(),
            None => Vec::new(),
        },
    };
    for c in candidates {
        if let Ok(dir) = std::fs::canonicalize(&c) {
            if dir.is_dir() {
                return Ok(dir);
            }
        }
        tried.push(c.display().to_string());
    }
    Err(invalid(format!(
        "--toolchain {name}: no installation found (${var}, or under $HOME: {}); looked at {}",
        defaults.join(", "),
        if tried.is_empty() {
            "nothing ($HOME is not set)".to_string()
        } else {
            tried.join(", ")
        }
    )))
}

/// The host's `PATH` entries under `dir` (the versions a version manager made active).
fn host_path_entries_under(dir: &Path) -> Vec<PathBuf> {
    std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .filter_map(|e| std::fs::canonicalize(e).ok())
                .filter(|e| e.starts_with(dir) && e.is_dir())
                .collect()
        })
        .unwrap_or_default()
}

/// The toolchain `name` of this host (see [`TOOLCHAIN_HELP`]).
pub fn toolchain(name: &str) -> anyhow::Result<Toolchain> {
    let mut t = Toolchain::default();
    match name {
        "rustup" => {
            let rustup = toolchain_dir(name, "RUSTUP_HOME", &[".rustup"])?;
            let cargo = toolchain_dir(name, "CARGO_HOME", &[".cargo"])?;
            let bin = cargo.join("bin");
            t.mount(&rustup);
            t.env
                .push(("RUSTUP_HOME".into(), rustup.display().to_string()));
            if bin.is_dir() {
                t.mount(&bin);
                t.path.push(bin);
            }
        }
        "pyenv" => {
            let root = toolchain_dir(name, "PYENV_ROOT", &[".pyenv"])?;
            t.mount(&root);
            t.env.push(("PYENV_ROOT".into(), root.display().to_string()));
            t.path.push(root.join("shims"));
            t.path.push(root.join("bin"));
        }
        "nvm" => {
            let root = toolchain_dir(name, "NVM_DIR", &[".nvm"])?;
            t.mount(&root);
            t.env.push(("NVM_DIR".into(), root.display().to_string()));
            let active = host_path_entries_under(&root);
            if active.is_empty() {
                // The newest installed version (by name: v20.11.0 > v18.19.1).
                let mut versions: Vec<PathBuf> = std::fs::read_dir(root.join("versions/node"))
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.path().join("bin"))
                    .filter(|p| p.is_dir())
                    .collect();
                versions.sort_by_key(|p| version_key(p));
                t.path.extend(versions.pop());
            } else {
                t.path.extend(active);
            }
        }
        "pipx" => {
            let home_dir = toolchain_dir(name, "PIPX_HOME", &[".local/share/pipx", ".local/pipx"])?;
            let bin = toolchain_dir(name, "PIPX_BIN_DIR", &[".local/bin"])?;
            t.mount(&home_dir);
            t.mount(&bin);
            t.path.push(bin);
        }
        other => {
            return Err(invalid(format!(
                "--toolchain {other:?} is not one of rustup, pyenv, nvm, pipx (anything else: --mount DIR and --env PATH=...)"
            )))
        }
    }
    Ok(t)
}

/// `v20.11.0/bin` → [20, 11, 0], so versions sort by number, not by text.
fn version_key(bin: &Path) -> Vec<u64> {
    bin.parent()
        .and_then(Path::file_name)
        .and_then(|n| n.to_str())
        .map(|n| {
            n.trim_start_matches('v')
                .split('.')
                .map(|x| x.parse().unwrap_or(0))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_flags_parse_with_read_only_by_default() {
        let dir = tempfile::tempdir().unwrap();
        let d = std::fs::canonicalize(dir.path()).unwrap();
        let s = d.display().to_string();
        let m = parse_mount(&s).unwrap();
        assert_eq!(
            (m.host.clone(), m.container.clone(), m.readonly),
            (d.clone(), d.clone(), true)
        );
        let m = parse_mount(&format!("{s}:/opt/x")).unwrap();
        assert_eq!((m.container, m.readonly), (PathBuf::from("/opt/x"), true));
        let m = parse_mount(&format!("{s}:/opt/x:rw")).unwrap();
        assert!(!m.readonly);
        let m = parse_mount(&format!("{s}:rw")).unwrap();
        assert_eq!((m.container, m.readonly), (d.clone(), false));
        for bad in [
            format!("{s}:opt"),
            format!("{s}:/a:/b:ro"),
            format!("{s}/missing"),
            ":/x".to_string(),
            format!("{s}::ro"),
        ] {
            assert!(parse_mount(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn versions_sort_by_number() {
        let mut v = [
            PathBuf::from("/n/v9.1.0/bin"),
            PathBuf::from("/n/v20.11.0/bin"),
            PathBuf::from("/n/v18.19.1/bin"),
        ];
        v.sort_by_key(|p| version_key(p));
        assert_eq!(v.last().unwrap(), &PathBuf::from("/n/v20.11.0/bin"));
    }
}
