//! `session diff`: the change so far, collected into a bundle of its own while the sandbox is
//! held still. Reading a running sandbox's workspace would race its processes (one can swap a
//! directory for a link to a host path between our look and our read), so the engine pauses
//! every process first (`Engine::pause`: none runs, none writes; commands asked for meanwhile
//! start at the resume) and lets them go once the bundle is made. An engine that cannot pause
//! gets no diff: the change is shown at the stop, when no process is left.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::{json, Value};

use super::runtime::Started;
use super::wire::{error_json, SessionInfo};

/// How many diff bundles a session keeps (a client reads one after its answer; older ones
/// go as newer are made).
const KEPT: u64 = 4;

/// One diff at a time, each in a directory of its own.
#[derive(Default)]
pub(super) struct Diffs {
    made: Mutex<u64>,
}

/// `<sessions dir>/<id>.diff-<n>`.
fn dir_of(sessions: &Path, id: &str, n: u64) -> PathBuf {
    sessions.join(format!("{id}.diff-{n}"))
}

/// Collects the change so far; the answer names the bundle.
pub(super) fn diff(
    started: &Started,
    rt: &tokio::runtime::Handle,
    info: &SessionInfo,
    diffs: &Diffs,
) -> Value {
    if !started.engine.capabilities().pause {
        return error_json(
            "TASK_RUNTIME_UNAVAILABLE",
            &format!(
                "the {} engine cannot hold a sandbox still, so its change is shown when the session stops",
                started.engine.backend()
            ),
            json!({}),
        );
    }
    let sessions = match super::wire::sessions_dir(false) {
        Ok(dir) => dir,
        Err(e) => return error_json("INTERNAL", &e.to_string(), json!({})),
    };
    let mut made = diffs.made.lock().unwrap_or_else(|p| p.into_inner());
    *made += 1;
    let n = *made;
    let dir = dir_of(&sessions, &info.session_id, n);
    if n > KEPT {
        let _ = std::fs::remove_dir_all(dir_of(&sessions, &info.session_id, n - KEPT));
    }
    let mut handle = started.handle.clone();
    handle.result_path = dir.clone();
    let collected = rt.block_on(async {
        started.engine.pause(&started.handle).await?;
        let collected = started.runtime.collect(&handle).await;
        // Let go whatever came of the collect; a resume that fails leaves the sandbox
        // paused, which the next pause, resume or the stop ends.
        let resumed = started.engine.resume(&started.handle).await;
        let report = collected?;
        resumed.map(|()| report)
    });
    match collected {
        Ok(_) => json!({ "ok": true, "bundlePath": dir, "rootDir": info.root_dir }),
        Err(e) => error_json("SANDBOX_EXECUTION_FAILED", &e.to_string(), json!({})),
    }
}

/// Removes every diff bundle of session `id` (at its end).
pub(super) fn remove_all(sessions: &Path, id: &str, diffs: &Diffs) {
    let made = *diffs.made.lock().unwrap_or_else(|p| p.into_inner());
    for n in made.saturating_sub(KEPT)..=made {
        let _ = std::fs::remove_dir_all(dir_of(sessions, id, n));
    }
}
