//! What a server that died leaves behind, cleaned up by the next one on the same data
//! directory: hosted sandboxes live only in a server's memory, so a server killed by SIGKILL
//! or a power cut forgot them while their runtime state (the native runtime's state
//! directory, its overlay layers, a step's processes) stayed, and a client resuming its run
//! could not make the same `runId:sandboxId` again.
//!
//! Each sandbox's directory (`<data_dir>/sandboxes/<id>/`) holds `handle.json`, written right
//! after the runtime made it: the runtime's handle and the boot it was made under. At start,
//! before listening, [`recover`] takes every directory there: a handle of this boot whose
//! project is that very directory's `workspace` is cleaned up through the runtime (it kills
//! what still runs and removes the state); one of another boot names nothing that still runs
//! and is not acted on; then the directory goes. The data directory is the operator's, but a
//! handle is still checked to name only what this server made for that directory.

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use smithers_runtime::{Runtime, SandboxHandle};

/// The file in a sandbox's directory.
pub const HANDLE_FILE: &str = "handle.json";
/// A handle is a few hundred bytes; anything far larger was not written by us.
const MAX_HANDLE_BYTES: u64 = 64 * 1024;

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Recorded {
    boot_id: Option<String>,
    handle: SandboxHandle,
}

fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Writes `dir/handle.json` (whole, through a rename).
pub(crate) async fn record_handle(dir: &Path, handle: &SandboxHandle) -> io::Result<()> {
    let recorded = Recorded {
        boot_id: boot_id(),
        handle: handle.clone(),
    };
    let bytes = serde_json::to_vec(&recorded).map_err(io::Error::other)?;
    let tmp = dir.join(format!(".{HANDLE_FILE}.tmp"));
    tokio::fs::write(&tmp, &bytes).await?;
    tokio::fs::rename(&tmp, dir.join(HANDLE_FILE)).await
}

/// What [`recover`] did with one directory left behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovered {
    pub id: String,
    /// `runId:sandboxId`, when its handle could be read.
    pub name: Option<String>,
    /// True when the runtime cleaned up what the handle names.
    pub cleaned_up: bool,
    /// Why it was not (another boot, no handle, an unreadable or foreign one, the runtime's
    /// error); the directory is removed either way.
    pub note: Option<String>,
}

/// A hosted sandbox's id, as `routes::create` makes them (`sbx-` and 32 hex digits).
fn is_sandbox_id(name: &str) -> bool {
    name.strip_prefix("sbx-")
        .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn read_recorded(dir: &Path) -> Result<Recorded, String> {
    use std::io::Read as _;
    let path = dir.join(HANDLE_FILE);
    let meta = std::fs::symlink_metadata(&path).map_err(|e| format!("no handle ({e})"))?;
    if !meta.is_file() || meta.len() > MAX_HANDLE_BYTES {
        return Err("the handle file is not one this server wrote".into());
    }
    let mut text = String::new();
    std::fs::File::open(&path)
        .and_then(|f| f.take(MAX_HANDLE_BYTES).read_to_string(&mut text))
        .map_err(|e| format!("handle unreadable: {e}"))?;
    serde_json::from_str(&text).map_err(|e| format!("handle unreadable: {e}"))
}

/// Cleans up every sandbox directory a previous server left in `data_dir/sandboxes`.
pub async fn recover(data_dir: &Path, runtime: &dyn Runtime) -> Vec<Recovered> {
    let root = data_dir.join("sandboxes");
    let Ok(entries) = std::fs::read_dir(&root) else {
        return Vec::new();
    };
    let mut dirs: Vec<(String, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            is_sandbox_id(&name).then(|| (name, e.path()))
        })
        .collect();
    dirs.sort();
    let this_boot = boot_id();
    let mut out = Vec::new();
    for (id, dir) in dirs {
        let mut done = Recovered {
            id: id.clone(),
            name: None,
            cleaned_up: false,
            note: None,
        };
        match read_recorded(&dir) {
            Err(why) => done.note = Some(why),
            Ok(recorded) => {
                let handle = recorded.handle;
                done.name = Some(format!("{}:{}", handle.run_id, handle.sandbox_id));
                let ours = handle
                    .project_root()
                    .map(|p| p == dir.join("workspace"))
                    .unwrap_or(false);
                if !ours {
                    done.note = Some("its handle names another directory: not acted on".into());
                } else if recorded.boot_id.is_none() || recorded.boot_id != this_boot {
                    done.note = Some(
                        "made under another boot: nothing of it still runs, and what its handle names is not acted on"
                            .into(),
                    );
                } else if handle.runtime != runtime.kind() {
                    done.note = Some(format!(
                        "made by the {} runtime, not this server's {}",
                        handle.runtime,
                        runtime.kind()
                    ));
                } else {
                    match runtime.cleanup(&handle).await {
                        Ok(()) => done.cleaned_up = true,
                        Err(e) => done.note = Some(format!("cleanup failed: {e}")),
                    }
                }
            }
        }
        if let Err(e) = tokio::fs::remove_dir_all(&dir).await {
            if e.kind() != io::ErrorKind::NotFound {
                let note = done
                    .note
                    .take()
                    .map(|n| format!("{n}; "))
                    .unwrap_or_default();
                done.note = Some(format!("{note}removing {} failed: {e}", dir.display()));
            }
        }
        out.push(done);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_ids_are_taken() {
        assert!(is_sandbox_id("sbx-0123456789abcdef0123456789abcdef"));
        for bad in [
            "sbx-0123",
            "sbx-0123456789abcdef0123456789abcdeg",
            "../sbx-0123456789abcdef0123456789abcdef",
            "other",
        ] {
            assert!(!is_sandbox_id(bad), "{bad}");
        }
    }
}
