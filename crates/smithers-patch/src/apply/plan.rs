//! Host state and planning: what each path holds on the host and what the patches make of it.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;

use smithers_paths::{Beneath, EntryKind, PathError};

use super::content::Content;
use super::fsops::{list_dir, read_file_beneath, ENOTDIR};
use super::journal::DirRecord;
use super::paths::{ancestors, join_path, p, path_error};
use super::report::{AppliedAction, ApplyOptions, HOST_CHANGED};
use crate::error::{Conflict, PatchError};
use crate::merge::apply_hunks;
use crate::model::{git_blob_oid, GitMode};
use crate::patch::{FilePatch, PatchBody};

#[derive(Debug, Clone)]
pub(super) enum Host {
    Absent,
    File {
        content: Content,
        perms: u32,
        uid: u32,
        gid: u32,
    },
    Symlink(Vec<u8>),
    Dir,
    Other,
    /// A parent component is a non-directory (`symlink`: a symlink) on the host.
    Blocked {
        symlink: bool,
    },
}

pub(super) fn read_host(b: &Beneath, rel: &str) -> Result<Host, PatchError> {
    match b.metadata(&p(rel)) {
        Ok(None) => Ok(Host::Absent),
        Ok(Some(m)) => match m.kind {
            EntryKind::File => {
                let (content, md) = read_file_beneath(b, rel)?;
                Ok(Host::File {
                    content,
                    perms: m.mode & 0o7777,
                    uid: md.uid(),
                    gid: md.gid(),
                })
            }
            EntryKind::Symlink => {
                let t = b
                    .read_link(&p(rel))
                    .map_err(|e| path_error(rel, "readlink", e))?;
                Ok(Host::Symlink(t.as_os_str().as_bytes().to_vec()))
            }
            EntryKind::Dir => Ok(Host::Dir),
            EntryKind::Other => Ok(Host::Other),
        },
        Err(PathError::EscapeViaSymlink { .. }) => Ok(Host::Blocked { symlink: true }),
        Err(e) if e.raw_os_error() == Some(ENOTDIR) => Ok(Host::Blocked { symlink: false }),
        Err(e) => Err(path_error(rel, "stat", e)),
    }
}

/// The state of a path in memory while patches are applied to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum State {
    Absent,
    File { content: Content, mode: GitMode },
    Symlink(Vec<u8>),
}

impl State {
    fn oid(&self) -> Option<String> {
        match self {
            State::Absent => None,
            State::File { content, .. } => Some(content.oid()),
            State::Symlink(target) => Some(git_blob_oid(target)),
        }
    }
    /// What a patch's body applies to (a symlink's target as bytes, nothing for a new path).
    fn content(&self) -> Cow<'_, Content> {
        match self {
            State::Absent => Cow::Owned(Content::Held(Vec::new())),
            State::File { content, .. } => Cow::Borrowed(content),
            State::Symlink(target) => Cow::Owned(Content::Held(target.clone())),
        }
    }
}

pub(super) enum StepError {
    /// The state does not match the patch's base: a conflict unless it can be merged.
    Mismatch(String),
    /// The patch contradicts itself (base matched, hunks or result hash did not).
    Inconsistent(String),
}

/// Applies one patch to a state. `exact`: the base must match the recorded blob id.
pub(super) fn step(state: &State, fp: &FilePatch, exact: bool) -> Result<State, StepError> {
    match (fp.old_mode, state) {
        (None, State::Absent) => {}
        (None, _) => return Err(StepError::Mismatch("already exists on the host".into())),
        (Some(_), State::Absent) => {
            return Err(StepError::Mismatch("was deleted on the host".into()))
        }
        (Some(GitMode::Symlink), State::File { .. }) => {
            return Err(StepError::Mismatch(
                "is a regular file on the host, the patch expects a symlink".into(),
            ))
        }
        (Some(GitMode::File | GitMode::Executable), State::Symlink(_)) => {
            return Err(StepError::Mismatch(
                "is a symlink on the host, the patch expects a regular file".into(),
            ))
        }
        (Some(_), _) => {
            if let Some(o) = &fp.old_oid {
                let found = state.oid().unwrap_or_default();
                if exact && *o != found {
                    return Err(StepError::Mismatch(format!(
                        "changed on the host (patch made against {o}, host has {found})"
                    )));
                }
            }
        }
    }
    let Some(new_mode) = fp.new_mode else {
        return Ok(State::Absent);
    };
    let content = match &fp.body {
        PatchBody::Empty => state.content().into_owned(),
        PatchBody::Binary { forward, .. } => {
            if !exact && fp.old_mode.is_some() {
                return Err(StepError::Mismatch(
                    "binary file changed on the host".into(),
                ));
            }
            // The base matched the patch's old id: a delta that does not apply to it, or a
            // result that does not hash to the new id (checked below), is the patch's fault.
            state
                .content()
                .apply(forward)
                .map_err(|e| StepError::Inconsistent(format!("binary delta does not apply: {e}")))?
        }
        PatchBody::Text(hunks) => {
            let content = state.content();
            let bytes = content.held().map_err(StepError::Mismatch)?;
            let Ok(text) = std::str::from_utf8(&bytes) else {
                return Err(StepError::Mismatch(
                    "host file is not UTF-8 text; cannot merge".into(),
                ));
            };
            match apply_hunks(text, hunks, exact) {
                Ok(t) => Content::Held(t.into_bytes()),
                Err(f) if exact => {
                    return Err(StepError::Inconsistent(format!(
                        "hunk {} does not match the base the patch names",
                        f.hunk
                    )))
                }
                Err(f) if f.ambiguous => {
                    return Err(StepError::Mismatch(format!(
                        "changed on the host and hunk {}'s context occurs more than once in the \
                         host version (which one the change belongs to cannot be known)",
                        f.hunk
                    )))
                }
                Err(f) => {
                    return Err(StepError::Mismatch(format!(
                        "changed on the host and hunk {} does not apply to the host version",
                        f.hunk
                    )))
                }
            }
        }
    };
    if exact {
        if let Some(n) = &fp.new_oid {
            let got = content.oid();
            if *n != got {
                return Err(StepError::Inconsistent(format!(
                    "result has blob id {got}, the patch says {n}"
                )));
            }
        }
    }
    Ok(match new_mode {
        GitMode::Symlink => State::Symlink(
            content
                .held()
                .map_err(StepError::Inconsistent)?
                .into_owned(),
        ),
        m => {
            // Three-way on the mode too: keep a host chmod unless the sandbox changed the mode.
            let mode = match (fp.old_mode, state) {
                (Some(om), State::File { mode: hm, .. }) if om == m => *hm,
                _ => m,
            };
            State::File { content, mode }
        }
    })
}

pub(super) struct Planned {
    pub(super) host: Host,
    pub(super) want: State,
    pub(super) merged: bool,
    pub(super) action: AppliedAction,
    /// Written with conflict markers.
    pub(super) marked: bool,
}

pub(super) fn host_state(h: &Host) -> State {
    match h {
        Host::File { content, perms, .. } => State::File {
            content: content.clone(),
            mode: GitMode::from_regular_permissions(*perms),
        },
        Host::Symlink(t) => State::Symlink(t.clone()),
        // Directories and blocked paths count as "absent" here; whether they can really be
        // made room for is checked against the whole plan afterwards.
        Host::Absent | Host::Dir | Host::Blocked { .. } | Host::Other => State::Absent,
    }
}

pub(super) fn plan_path(
    path: &str,
    host: Host,
    patches: &[&FilePatch],
) -> Result<Result<Planned, String>, PatchError> {
    if matches!(host, Host::Other) {
        return Ok(Err(
            "is a special file (fifo, socket, device) on the host".into()
        ));
    }
    let start = host_state(&host);
    if let (Host::Dir, Some(first), Some(last)) = (&host, patches.first(), patches.last()) {
        if last.new_mode.is_none() {
            // Deleting a file where a directory stands: nothing of ours to delete.
            return Ok(Ok(Planned {
                host,
                want: State::Absent,
                merged: false,
                action: AppliedAction::Deleted,
                marked: false,
            }));
        }
        if first.old_mode.is_some() {
            return Ok(Err("is a directory on the host".into()));
        }
    }
    let mut merged = false;
    let mut state = start.clone();
    for (i, fp) in patches.iter().enumerate() {
        state = match step(&state, fp, true) {
            Ok(s) => s,
            Err(StepError::Inconsistent(r)) => {
                return Err(PatchError::InconsistentPatch {
                    path: path.to_string(),
                    reason: r,
                })
            }
            Err(StepError::Mismatch(reason)) => {
                // Already in the patched state on the host (the same change made twice)?
                let last = patches.last().unwrap_or(fp);
                if i == 0 && already_applied(&start, last) {
                    return Ok(Ok(Planned {
                        want: start.clone(),
                        host,
                        merged: false,
                        action: AppliedAction::Modified,
                        marked: false,
                    }));
                }
                if i != 0 {
                    return Ok(Err(reason));
                }
                match step(&state, fp, false) {
                    Ok(s) => {
                        merged = true;
                        s
                    }
                    // Why the merge failed too (e.g. an ambiguous hunk), when it says more.
                    Err(StepError::Mismatch(why)) if why != reason => {
                        return Ok(Err(format!("{reason}; {why}")))
                    }
                    Err(StepError::Mismatch(_)) | Err(StepError::Inconsistent(_)) => {
                        return Ok(Err(reason))
                    }
                }
            }
        };
    }
    let action = match (&start, &state) {
        (State::Absent, _) => AppliedAction::Created,
        (_, State::Absent) => AppliedAction::Deleted,
        (State::File { .. }, State::Symlink(_)) | (State::Symlink(_), State::File { .. }) => {
            AppliedAction::TypeChanged
        }
        (State::File { content: a, .. }, State::File { content: b, .. }) if a == b => {
            AppliedAction::ModeChanged
        }
        _ => AppliedAction::Modified,
    };
    Ok(Ok(Planned {
        host,
        want: state,
        merged,
        action,
        marked: false,
    }))
}

/// The plan of a conflicting text file written with conflict markers, when markers can say
/// it: one patch modifying a regular UTF-8 text file that is a regular UTF-8 text file on the
/// host. `host_changed`: the patch's base is the host's version as of collect, not what the
/// step saw, so the step's whole version is set against the host's, difference by
/// difference; otherwise the hunks that fit are applied and each one that does not becomes a
/// block. `None`: markers cannot express this conflict (the caller refuses it).
pub(super) fn plan_with_markers(
    host: &Host,
    patches: &[&FilePatch],
    host_changed: bool,
) -> Option<Planned> {
    let [fp] = patches else { return None };
    let (Some(om), Some(nm)) = (fp.old_mode, fp.new_mode) else {
        return None;
    };
    if om.is_symlink() || nm.is_symlink() {
        return None;
    }
    let PatchBody::Text(hunks) = &fp.body else {
        return None;
    };
    let Host::File {
        content: Content::Held(content),
        perms,
        ..
    } = host
    else {
        return None;
    };
    let text = std::str::from_utf8(content).ok()?;
    let (marked, blocks) = if host_changed {
        // The hunks were made against the host's version as of collect: relocated onto a
        // newer one they would put back what the host had edited. Only when the host still
        // holds that version is the step's whole version known, and set against it; else it
        // stays a conflict.
        match step(&host_state(host), fp, true).ok()? {
            State::File {
                content: Content::Held(theirs),
                ..
            } => crate::merge::mark_differences(text, &String::from_utf8(theirs).ok()?),
            _ => return None,
        }
    } else {
        crate::merge::apply_hunks_marking(text, hunks)?
    };
    Some(Planned {
        host: host.clone(),
        want: State::File {
            content: Content::Held(marked.into_bytes()),
            // The host's mode: which side's mode wins is part of what the person resolves.
            mode: GitMode::from_regular_permissions(*perms),
        },
        merged: true,
        action: AppliedAction::Modified,
        marked: blocks > 0,
    })
}

/// Whether the host already holds what the patch produces.
pub(super) fn already_applied(host: &State, fp: &FilePatch) -> bool {
    match (fp.new_mode, host) {
        (None, State::Absent) => true,
        (Some(GitMode::Symlink), State::Symlink(t)) => {
            fp.new_oid.as_deref() == Some(git_blob_oid(t).as_str())
        }
        (Some(m), State::File { content, mode }) if !m.is_symlink() => {
            *mode == m
                && match &fp.new_oid {
                    Some(n) => *n == content.oid(),
                    // Mode-only patch: the mode is what matters.
                    None => matches!(fp.body, PatchBody::Empty),
                }
        }
        _ => false,
    }
}

/// Collects a host directory's subtree: (non-directories, directories bottom-up).
pub(super) fn host_subtree(
    b: &Beneath,
    dir: &str,
    files: &mut Vec<String>,
    dirs: &mut Vec<DirRecord>,
) -> Result<(), PatchError> {
    for (name, ft) in list_dir(b, dir)? {
        let child = join_path(dir, &name);
        if ft == rustix::fs::FileType::Directory {
            host_subtree(b, &child, files, dirs)?;
        } else {
            files.push(child);
        }
    }
    let perms = b
        .metadata(&p(dir))
        .map_err(|e| path_error(dir, "stat", e))?
        .map_or(0o755, |m| m.mode);
    dirs.push(DirRecord {
        path: dir.to_string(),
        perms,
    });
    Ok(())
}

/// A path's plan and the host directories (bottom-up) a file replaces, removed at commit.
pub(super) type Plans = (BTreeMap<String, Planned>, BTreeMap<String, Vec<DirRecord>>);

/// Plans every path and checks that the host has room for the plan; any conflict fails with
/// every conflicting file, before anything is written.
pub(super) fn check_plans(
    b: &Beneath,
    by_path: &BTreeMap<&str, Vec<&FilePatch>>,
    opts: &ApplyOptions,
) -> Result<Plans, PatchError> {
    let mut conflicts = Vec::new();
    let plans = plan_each(b, by_path, opts, &mut conflicts)?;
    let removed_dirs = make_room(b, &plans, &mut conflicts)?;
    if !conflicts.is_empty() {
        conflicts.sort_by(|a, b| a.path.cmp(&b.path));
        return Err(PatchError::Conflicts { conflicts });
    }
    Ok((plans, removed_dirs))
}

/// Each path's plan (with conflict markers where asked for and possible); the paths that
/// conflict go to `conflicts`.
fn plan_each(
    b: &Beneath,
    by_path: &BTreeMap<&str, Vec<&FilePatch>>,
    opts: &ApplyOptions,
    conflicts: &mut Vec<Conflict>,
) -> Result<BTreeMap<String, Planned>, PatchError> {
    let mut plans: BTreeMap<String, Planned> = BTreeMap::new();
    for (path, list) in by_path {
        let host = read_host(b, path)?;
        if opts.host_changed.contains(*path) {
            let done = list
                .last()
                .is_some_and(|last| already_applied(&host_state(&host), last));
            if !done {
                match opts
                    .conflict_markers
                    .then(|| plan_with_markers(&host, list, true))
                    .flatten()
                {
                    Some(pl) => {
                        plans.insert(path.to_string(), pl);
                    }
                    None => conflicts.push(Conflict {
                        path: path.to_string(),
                        reason: HOST_CHANGED.into(),
                    }),
                }
                continue;
            }
        }
        match plan_path(path, host, list)? {
            Ok(pl) => {
                plans.insert(path.to_string(), pl);
            }
            Err(reason) => {
                let marked = if opts.conflict_markers {
                    plan_with_markers(&read_host(b, path)?, list, false)
                } else {
                    None
                };
                match marked {
                    Some(pl) => {
                        plans.insert(path.to_string(), pl);
                    }
                    None => conflicts.push(Conflict {
                        path: path.to_string(),
                        reason,
                    }),
                }
            }
        }
    }
    Ok(plans)
}

/// Checks that the host has room for every plan: a parent that is a file or symlink on the
/// host, or a directory where a file goes, is fine only if this apply deletes what is there.
/// Returns the directories a file replaces (by path); what blocks goes to `conflicts`.
fn make_room(
    b: &Beneath,
    plans: &BTreeMap<String, Planned>,
    conflicts: &mut Vec<Conflict>,
) -> Result<BTreeMap<String, Vec<DirRecord>>, PatchError> {
    let deleted: BTreeSet<&str> = plans
        .iter()
        .filter(|(_, pl)| {
            pl.want == State::Absent && matches!(pl.host, Host::File { .. } | Host::Symlink(_))
        })
        .map(|(k, _)| k.as_str())
        .collect();
    let mut removed_dirs: BTreeMap<String, Vec<DirRecord>> = BTreeMap::new();
    for (path, pl) in plans {
        match (&pl.host, &pl.want) {
            // A parent is a file or symlink on the host: fine only if this apply deletes it.
            (Host::Blocked { symlink }, want)
                if *want != State::Absent
                    && !ancestors(path).iter().any(|a| deleted.contains(a.as_str())) =>
            {
                if *symlink {
                    return Err(PatchError::PathEscape {
                        path: path.clone(),
                        reason: "a parent directory is a symlink on the host".into(),
                    });
                }
                conflicts.push(Conflict {
                    path: path.clone(),
                    reason: "a parent directory is a file on the host".into(),
                });
            }
            (Host::Dir, want) if *want != State::Absent => {
                let (mut files, mut dirs) = (Vec::new(), Vec::new());
                host_subtree(b, path, &mut files, &mut dirs)?;
                let kept: Vec<&String> = files
                    .iter()
                    .filter(|f| !deleted.contains(f.as_str()))
                    .collect();
                if kept.is_empty() {
                    removed_dirs.insert(path.clone(), dirs);
                } else {
                    conflicts.push(Conflict {
                        path: path.clone(),
                        reason: format!(
                            "is a directory on the host holding files the patch does not delete: {}",
                            kept.iter().take(5).map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
                        ),
                    });
                }
            }
            _ => {}
        }
    }
    Ok(removed_dirs)
}
