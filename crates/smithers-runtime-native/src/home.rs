//! Persistent homes (`Controls::home`): a step's `$HOME` bound from a directory this runtime
//! keeps for its user, `<homes root>/<NAME>`, instead of an empty tmpfs. The root is
//! `$SMITHERS_HOMES_DIR`, else `$XDG_DATA_HOME/smithers-sandbox/homes`, else
//! `~/.local/share/smithers-sandbox/homes`: the user's own, never the host's home itself,
//! and outside every project (so nothing in it is ever part of a patch). Made private (0700)
//! on first use; a home that is not a directory of this user (a link, another owner's) is
//! refused rather than bound.

use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use smithers_runtime::RuntimeError;

/// The directory every home of this user is in.
pub fn homes_root(host_env: &std::collections::BTreeMap<String, String>) -> Option<PathBuf> {
    let abs = |v: &String| Some(PathBuf::from(v)).filter(|p| p.is_absolute());
    if let Some(dir) = host_env.get("SMITHERS_HOMES_DIR").and_then(abs) {
        return Some(dir);
    }
    if let Some(data) = host_env.get("XDG_DATA_HOME").and_then(abs) {
        return Some(data.join("smithers-sandbox/homes"));
    }
    host_env
        .get("HOME")
        .and_then(abs)
        .map(|home| home.join(".local/share/smithers-sandbox/homes"))
}

/// The home `name` (checked), made if it is not there, checked to be a directory of `uid`
/// (the runtime's user).
pub(crate) fn prepare(root: Option<&Path>, name: &str, uid: u32) -> Result<PathBuf, RuntimeError> {
    smithers_runtime::config::validate_id("home", name)?;
    let Some(root) = root else {
        return Err(RuntimeError::ControlUnsupported {
            runtime: "native",
            control: "home",
            reason: "no place for homes: set $SMITHERS_HOMES_DIR, $XDG_DATA_HOME or $HOME".into(),
        });
    };
    let dir = root.join(name);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| RuntimeError::io("make the home", &dir, e))?;
    check_ours(root, uid)?;
    check_ours(&dir, uid)?;
    Ok(dir)
}

/// A directory (never a link) owned by `uid`.
fn check_ours(dir: &Path, uid: u32) -> Result<(), RuntimeError> {
    let md = std::fs::symlink_metadata(dir).map_err(|e| RuntimeError::io("look at", dir, e))?;
    if !md.is_dir() || md.uid() != uid {
        return Err(RuntimeError::InvalidControl {
            control: "home",
            reason: format!(
                "{} is not a directory of this user (a link, or another owner's): not used as a home",
                dir.display()
            ),
        });
    }
    Ok(())
}
