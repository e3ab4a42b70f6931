//! How many sessions a user holds at once: at most `SMITHERS_SESSIONS_MAX` (64 by default),
//! counted over the user's private sessions directory (the sessions held, and those whose
//! holder is starting), under a lock there so that holders starting together are counted
//! one after another. (How many a project holds is its store's gate, as for runs:
//! `SMITHERS_MAX_HOST_SANDBOXES`.)

use std::path::{Path, PathBuf};

use smithers_errors::ErrorCode;

use crate::output::coded_error;

/// The default bound on a user's sessions.
const DEFAULT_MAX: usize = 64;

/// A session admitted and not yet bound: its mark (`<id>.starting`, holding the holder's
/// pid) counts it until the holder's socket does; dropped once the socket is bound.
pub(super) struct Admitted {
    mark: PathBuf,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.mark);
    }
}

/// Admits session `id` in `dir` (the sessions directory), or refuses when the user holds
/// the most already.
pub(super) fn admit(dir: &Path, id: &str) -> anyhow::Result<Admitted> {
    let max = std::env::var("SMITHERS_SESSIONS_MAX")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(DEFAULT_MAX);
    // Released when closed, at the end of this function.
    let _lock = smithers_resident::session::admission_lock(dir)?;
    let held = count(dir, id);
    if held >= max {
        return Err(coded_error(
            ErrorCode::Busy,
            format!("you hold {held} sessions, the most at once (SMITHERS_SESSIONS_MAX={max}): stop one first"),
            serde_json::json!({ "held": held, "max": max }),
        ));
    }
    let mark = dir.join(format!("{id}.starting"));
    std::fs::write(&mark, std::process::id().to_string())?;
    Ok(Admitted { mark })
}

/// The sessions held (a socket that takes a connection) and starting (a mark whose holder
/// lives), but `id`'s own.
fn count(dir: &Path, id: &str) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut n = 0;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(other) = name.strip_suffix(".sock") {
            if other != id && std::os::unix::net::UnixStream::connect(entry.path()).is_ok() {
                n += 1;
            }
        } else if let Some(other) = name.strip_suffix(".starting") {
            let alive = std::fs::read_to_string(entry.path())
                .ok()
                .and_then(|p| p.trim().parse::<i32>().ok())
                .is_some_and(|pid| pid > 0 && Path::new(&format!("/proc/{pid}")).exists());
            if other != id && alive {
                n += 1;
            }
        }
    }
    n
}
