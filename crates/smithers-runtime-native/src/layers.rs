//! A session's stack of frozen layers: its checkpoints, restores and forks are layer flips
//! (see `engine::snapshot`), and this module keeps what they leave.
//!
//! A workspace is `lower = project, upper = its layer`. A checkpoint moves the upper
//! directory, as it is, into the **store** (a directory of frozen layers beside the layers of
//! every sandbox, on the same file system, so the move is a rename) under a fresh id, and the
//! sandbox goes on over `lower = frozen:project` with a new empty upper directory at the same
//! path as before. Nothing is copied. A fork starts another sandbox over the same frozen
//! layers; a restore puts a sandbox back over an earlier stack. A frozen layer is never
//! written again: every sandbox that has it has it as a lower layer.
//!
//! Each sandbox records its stack (top first) and every layer it may still need (its
//! checkpoints') in `layers.json` in its state directory, which only the runtime writes. A
//! frozen layer is removed when no sandbox's record names it any more
//! ([`collect_garbage`], at every cleanup). Ids are checked (32 hex digits) wherever they are
//! read, so a record can never name a path.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use smithers_runtime::RuntimeError;

use crate::backend::{Backend, WorkspaceState};
use crate::files::{remove_tree, write_private};

/// The record's file name in a state directory.
pub(crate) const RECORD: &str = "layers.json";

/// How many frozen layers a workspace may stack: the overlay's options (all layer paths)
/// must fit one page.
pub(crate) const MAX_DEPTH: usize = 32;

/// The most a record may hold (it is read from every sandbox's state at a cleanup).
const MAX_RECORD: u64 = 64 * 1024;

/// How many frozen layers one sandbox may keep (its record then stays well within
/// [`MAX_RECORD`]: 33 bytes an id).
pub(crate) const MAX_KEPT: usize = 1024;

/// A sandbox's stack and the layers it keeps.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct LayerRecord {
    /// The frozen layers under the upper directory, top first.
    pub(crate) stack: Vec<String>,
    /// Every frozen layer this sandbox may still use (its stack and its checkpoints').
    pub(crate) refs: Vec<String>,
}

impl LayerRecord {
    /// The sandbox's record; an empty one when it has none (never flipped).
    pub(crate) fn load(backend: &Backend) -> Result<LayerRecord, RuntimeError> {
        let path = backend.state_dir.join(RECORD);
        match read_record(&path) {
            Ok(Some(record)) => Ok(record),
            Ok(None) => Ok(LayerRecord::default()),
            Err(reason) => Err(RuntimeError::OutOfOrder {
                verb: "layers",
                reason: format!("{}: {reason}", path.display()),
            }),
        }
    }

    pub(crate) fn save(&self, backend: &Backend) -> Result<(), RuntimeError> {
        let path = backend.state_dir.join(RECORD);
        let next = backend.state_dir.join(format!("{RECORD}.next"));
        write_private(&next, &serde_json::to_vec(self).unwrap_or_default())?;
        std::fs::rename(&next, &path).map_err(|e| RuntimeError::io("record the layers", &path, e))
    }

    /// Adds `id` to the layers kept (once).
    pub(crate) fn keep(&mut self, id: &str) {
        if !self.refs.iter().any(|r| r == id) {
            self.refs.push(id.to_string());
        }
    }
}

/// The record at `path`: `None` when there is none; `Err` when it is not one we wrote.
fn read_record(path: &Path) -> Result<Option<LayerRecord>, String> {
    use std::io::Read;
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let mut bytes = Vec::new();
    file.take(MAX_RECORD + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_RECORD {
        return Err(format!("over {MAX_RECORD} bytes"));
    }
    let record: LayerRecord = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
    match record
        .stack
        .iter()
        .chain(&record.refs)
        .find(|id| !is_id(id))
    {
        Some(bad) => Err(format!("{bad:?} is not a layer id")),
        None => Ok(Some(record)),
    }
}

/// A frozen layer's id: 32 lowercase hex digits.
pub(crate) fn is_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A fresh id.
pub(crate) fn new_id() -> String {
    let mut bytes = [0u8; 16];
    // getrandom(2) for 16 bytes does not block once the pool is ready (always, after boot).
    // SAFETY: `bytes` is a valid buffer of its length.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if n != bytes.len() as isize {
        // Unique enough for a directory name that a create then checks is new.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        bytes = (t ^ u128::from(std::process::id())).to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Where this sandbox's frozen layers are: beside the layers of every sandbox of its kind, on
/// the same file system as its upper directory.
pub(crate) fn store(backend: &Backend) -> Option<PathBuf> {
    let root = match &backend.layer_dir {
        Some(layer) => layer.parent()?.to_path_buf(),
        None => backend.state_dir.parent()?.to_path_buf(),
    };
    Some(root.join(".frozen"))
}

/// The frozen layer `id`'s directory (the id checked).
pub(crate) fn frozen_path(backend: &Backend, id: &str) -> Result<PathBuf, RuntimeError> {
    let store = store(backend).ok_or_else(|| unsupported("the sandbox has no layer store"))?;
    if !is_id(id) {
        return Err(RuntimeError::InvalidControl {
            control: "layers",
            reason: format!("{id:?} is not a layer id"),
        });
    }
    Ok(store.join(id))
}

/// The paths of the frozen layers of the sandbox's stack, top first, each checked to be a
/// directory (not a link) of the store.
pub(crate) fn stack_paths(backend: &Backend) -> Result<Vec<PathBuf>, RuntimeError> {
    let record = LayerRecord::load(backend)?;
    record
        .stack
        .iter()
        .map(|id| existing_frozen(backend, id))
        .collect()
}

/// [`frozen_path`], checked to be a directory of the store (never a link).
pub(crate) fn existing_frozen(backend: &Backend, id: &str) -> Result<PathBuf, RuntimeError> {
    let path = frozen_path(backend, id)?;
    match std::fs::symlink_metadata(&path) {
        Ok(md) if md.is_dir() => Ok(path),
        _ => Err(RuntimeError::InvalidControl {
            control: "layers",
            reason: format!("layer {id} is not in the store (removed with its last session?)"),
        }),
    }
}

/// Whether this sandbox's workspace can have its layers flipped: an overlay (not a copy) whose
/// layer is on the disk (a size-capped layer is a tmpfs of its own, from which nothing can be
/// moved into the store), with no layer over a worktree's git directory (it would not flip
/// with the workspace).
pub(crate) fn check_flippable(backend: &Backend) -> Result<(), RuntimeError> {
    if let WorkspaceState::Copy { reason } = &backend.workspace {
        return Err(unsupported(format!(
            "the workspace is a copy ({reason}), not an overlay"
        )));
    }
    if backend.layer_tmpfs {
        return Err(unsupported(
            "the workspace layer is size-capped (--disk): it is a file system of its own",
        ));
    }
    if std::fs::symlink_metadata(backend.git_common_upper()).is_ok() {
        return Err(unsupported(
            "the project is a git worktree (or below its repository's top), whose git layer would not follow",
        ));
    }
    Ok(())
}

fn unsupported(reason: impl Into<String>) -> RuntimeError {
    RuntimeError::ControlUnsupported {
        runtime: "native",
        control: "checkpoint",
        reason: reason.into(),
    }
}

/// A new sandbox's stack: `ids` (top first), each checked to be in the store, recorded before
/// anything else can see them.
pub(crate) fn adopt(backend: &Backend, ids: &[String]) -> Result<(), RuntimeError> {
    if ids.is_empty() {
        return Ok(());
    }
    check_flippable(backend)?;
    if ids.len() > MAX_DEPTH {
        return Err(RuntimeError::InvalidControl {
            control: "layers",
            reason: format!(
                "{} layers, over the {MAX_DEPTH} a workspace may stack",
                ids.len()
            ),
        });
    }
    for id in ids {
        existing_frozen(backend, id)?;
    }
    LayerRecord {
        stack: ids.to_vec(),
        refs: ids.to_vec(),
    }
    .save(backend)
}

/// Whether the upper directory holds nothing but the whiteouts of `hidden` (what every
/// mount puts there): a checkpoint of it would be the stack as it is.
pub(crate) fn upper_is_empty(upper: &Path, hidden: &[&str]) -> Result<bool, RuntimeError> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let entries = std::fs::read_dir(upper).map_err(|e| RuntimeError::io("read", upper, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| RuntimeError::io("read", upper, e))?;
        let md = entry
            .metadata()
            .map_err(|e| RuntimeError::io("read", entry.path(), e))?;
        let whiteout = md.file_type().is_char_device() && md.rdev() == 0;
        let name = entry.file_name();
        if !(whiteout && hidden.iter().any(|h| name == std::ffi::OsStr::new(h))) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Removes every frozen layer of `store` that no record in `state_root` names. Run at each
/// cleanup; a layer moved into the store is named by its sandbox's record before the move, so
/// none is taken from under a flip.
pub(crate) fn collect_garbage(state_root: &Path, store: &Path) {
    let Ok(frozen) = std::fs::read_dir(store) else {
        return;
    };
    let mut named = std::collections::HashSet::new();
    if let Ok(states) = std::fs::read_dir(state_root) {
        for state in states.flatten() {
            // A sandbox's state is a directory; the root holds a few files of its own.
            if !state.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            match read_record(&state.path().join(RECORD)) {
                Ok(Some(record)) => named.extend(record.refs.into_iter().chain(record.stack)),
                Ok(None) => {}
                // A record we cannot read could name anything: keep every layer.
                Err(_) => return,
            }
        }
    }
    for layer in frozen.flatten() {
        let name = layer.file_name();
        let Some(name) = name.to_str() else { continue };
        if is_id(name) && !named.contains(name) {
            let _ = remove_tree(&layer.path());
        }
    }
}

/// The directory of a sandbox's flips' leftovers (the work directories of unmounted
/// overlays, a discarded upper directory, the helper's mount point): beside its upper
/// directory, removed with it.
pub(crate) fn flips_dir(backend: &Backend) -> PathBuf {
    let mut name = backend.upper().into_os_string();
    name.push(".flips");
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_hex_of_one_length_only() {
        let id = new_id();
        assert!(is_id(&id), "{id}");
        assert_ne!(new_id(), id);
        for bad in [
            "",
            "../x",
            &"a".repeat(31),
            &"A".repeat(32),
            &"g".repeat(32),
        ] {
            assert!(!is_id(bad), "{bad}");
        }
    }

    #[test]
    fn a_record_naming_a_path_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(RECORD);
        std::fs::write(&path, br#"{"stack":["../../etc"],"refs":[]}"#).unwrap();
        assert!(read_record(&path).is_err());
        std::fs::write(
            &path,
            br#"{"stack":[],"refs":["0123456789abcdef0123456789abcdef"]}"#,
        )
        .unwrap();
        assert_eq!(read_record(&path).unwrap().unwrap().refs.len(), 1);
    }

    #[test]
    fn garbage_is_what_no_record_names() {
        let dir = tempfile::tempdir().unwrap();
        let (states, store) = (dir.path().join("states"), dir.path().join("store"));
        let (kept, gone) = (new_id(), new_id());
        for d in [states.join("s1"), store.join(&kept), store.join(&gone)] {
            std::fs::create_dir_all(d).unwrap();
        }
        // The state root's own files are no sandbox's.
        std::fs::write(states.join("container-probe.json"), b"{}").unwrap();
        std::fs::write(
            states.join("s1").join(RECORD),
            serde_json::to_vec(&LayerRecord {
                stack: vec![],
                refs: vec![kept.clone()],
            })
            .unwrap(),
        )
        .unwrap();
        collect_garbage(&states, &store);
        assert!(store.join(&kept).is_dir());
        assert!(!store.join(&gone).exists());
    }
}
