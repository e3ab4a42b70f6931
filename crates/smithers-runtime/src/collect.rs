//! The part of `collect` every backend whose workspace is a copy-on-write view of the project
//! shares (behind the `collect` feature): the bundle status rule, and the workspace changes
//! turned into bundle patches plus the `diffBundle`. The native and the docker runtime call
//! [`workspace_bundle`], so the same workspace gives byte-identical patches whichever ran it.

use std::path::Path;

use serde_json::Value;
use smithers_bundle::{
    write_bundle, BundleFile, BundleStatus, ChangeNotes, DiffBundle, DiffOperation, DiffPatch,
    WriteParams, SANDBOX_MAX_BUNDLE_BYTES, SANDBOX_MAX_PATCH_FILES,
};
use smithers_patch::{
    build_patch_files, detect_changes, detect_changes_by_compare, ChangeSet, DetectOptions,
    IgnoreReason, Operation,
};

use crate::{CollectReport, ExecOutcome, RuntimeError, SandboxHandle, Termination};

/// Where the step's writes are, relative to the project (the untouched lower tree).
#[derive(Debug, Clone, Copy)]
pub enum WorkspaceLayer<'a> {
    /// The upper layer of an overlayfs whose lower layer is the project: only it is walked.
    Upper(&'a Path),
    /// A full copy of the project that the step wrote (the fallback where no overlay can be
    /// mounted): both trees are compared, with the same result an overlay would give.
    Copy {
        tree: &'a Path,
        /// When the copy was complete, before the step could write it (a ctime): a copy entry
        /// older than that was not touched by the step, so its difference from the project is
        /// the host's edit and not a change (see `DetectOptions::copy_finished`).
        finished: Option<(i64, u32)>,
    },
}

/// What [`workspace_bundle`] produced.
#[derive(Debug, Clone)]
pub struct WorkspaceBundle {
    /// The bundle status (see [`bundle_status`]).
    pub status: BundleStatus,
    /// `patches/*.patch`, ready for `WriteParams::patches`.
    pub patches: Vec<BundleFile>,
    /// The `diffBundle` of the manifest; `None` when nothing changed.
    pub diff_bundle: Option<DiffBundle>,
    /// Bytes of all patch files (what is left of the bundle budget goes to artifacts).
    pub patch_bytes: u64,
    /// The change set the patches come from (ignored and skipped paths for the report).
    pub changes: ChangeSet,
    /// README.md's `changeNotes`: host-changed bases and what was left out.
    pub notes: ChangeNotes,
}

/// The bundle status: cancelled when cancelled; else the step's own word (`status` of its
/// result JSON); else finished only when the command exited 0. No outcome (execute never
/// finished) is failed. A result the step gave but that broke a limit (`result_rejected`)
/// makes a step that is not cancelled failed: it is never reported as finished.
pub fn bundle_status(outcome: Option<&ExecOutcome>, result_rejected: bool) -> BundleStatus {
    let Some(outcome) = outcome else {
        return BundleStatus::Failed;
    };
    if outcome.termination == Termination::Cancelled {
        return BundleStatus::Cancelled;
    }
    if result_rejected {
        return BundleStatus::Failed;
    }
    if let Some(status) = outcome
        .result
        .as_ref()
        .and_then(|r| r.get("status"))
        .and_then(Value::as_str)
        .and_then(BundleStatus::parse)
    {
        return status;
    }
    if outcome.succeeded() {
        BundleStatus::Finished
    } else {
        BundleStatus::Failed
    }
}

/// The commit the project is at, for the diff bundle's `baseRef` (empty when not a git repo).
/// The project is untrusted (on a server it is a client's upload): only `.git/HEAD` and the
/// ref it names are read, each through no link and size-capped, and the ref only when it is
/// a valid git ref name under `refs/` (an absolute or climbing "ref" would name any host file
/// and put its first line in the bundle). A ref file that holds no object id is not used.
pub fn base_ref(root: &Path) -> String {
    const MAX_REF_FILE: u64 = 4096;
    let Ok(beneath) = smithers_paths::Beneath::open(root) else {
        return String::new();
    };
    let read = |rel: &str| {
        beneath
            .read_regular(Path::new(rel), MAX_REF_FILE)
            .ok()
            .flatten()
            .and_then(|b| String::from_utf8(b).ok())
            .map(|s| s.trim().to_string())
    };
    let Some(head) = read(".git/HEAD") else {
        return String::new();
    };
    match head.strip_prefix("ref: ") {
        Some(r) if r.starts_with("refs/") && crate::git_ref::ref_name_problem(r).is_none() => {
            read(&format!(".git/{r}"))
                .filter(|id| is_object_id(id))
                .unwrap_or_else(|| r.to_string())
        }
        // Not a ref we may follow: named as such, never read.
        Some(_) => String::new(),
        None if is_object_id(&head) => head,
        None => String::new(),
    }
}

/// A git object id: 40 (SHA-1) or 64 (SHA-256) hex digits.
fn is_object_id(s: &str) -> bool {
    matches!(s.len(), 40 | 64) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The status, patches and `diffBundle` of a sandbox whose workspace was `project` (never
/// written) plus the step's writes in `layer`. Changes are detected with the default
/// [`DetectOptions`] (`.gitignore` honoured, `.git` and `.smithers` excluded).
pub fn workspace_bundle(
    project: &Path,
    layer: WorkspaceLayer<'_>,
    outcome: Option<&ExecOutcome>,
    result_rejected: bool,
) -> Result<WorkspaceBundle, RuntimeError> {
    let mut opts = DetectOptions::default();
    let changes = match layer {
        WorkspaceLayer::Upper(upper) => detect_changes(project, upper, &opts),
        WorkspaceLayer::Copy { tree, finished } => {
            opts.copy_finished = finished;
            detect_changes_by_compare(project, tree, &opts)
        }
    }
    .map_err(|e| RuntimeError::inner("detect the workspace changes", &e))?;
    let rendered = build_patch_files(&changes);
    let notes = change_notes(&changes);
    let patches = rendered
        .files
        .iter()
        .map(|f| BundleFile::new(f.bundle_path.clone(), f.content.clone()))
        .collect();
    let diff_bundle = (!rendered.diff_bundle.is_empty()).then(|| DiffBundle {
        seq: 0,
        base_ref: base_ref(project),
        patches: rendered
            .diff_bundle
            .iter()
            // A JavaScript consumer applies the diffBundle without our hostChanged check:
            // a patch whose base is lost would undo the host's edit there, so it is left out
            // (named in changeNotes.hostChanged) and only our accept, which refuses it, sees
            // it in the patch files.
            .filter(|d| !notes.host_changed.contains(&d.path))
            .map(|d| DiffPatch {
                path: d.path.clone(),
                operation: match d.operation {
                    Operation::Add => DiffOperation::Add,
                    Operation::Modify => DiffOperation::Modify,
                    Operation::Delete => DiffOperation::Delete,
                },
                diff: d.diff.clone(),
                binary_content: d.binary_content.clone(),
            })
            .collect(),
    });
    Ok(WorkspaceBundle {
        status: bundle_status(outcome, result_rejected),
        patches,
        diff_bundle,
        patch_bytes: rendered.total_bytes(),
        notes,
        changes,
    })
}

/// What the bundle's README.md says beyond the patches: the paths whose base the host
/// changed meanwhile, and every change of the step that no patch carries, with why.
pub fn change_notes(changes: &ChangeSet) -> ChangeNotes {
    let mut notes = ChangeNotes {
        host_changed: changes.stale_base.clone(),
        ..ChangeNotes::default()
    };
    for i in &changes.ignored {
        let reason = match i.reason {
            IgnoreReason::Gitignore => "ignored by .gitignore (untracked)",
            IgnoreReason::Excluded => "excluded: .git and .smithers are never patched",
        };
        notes.leave_out(i.path.clone(), reason);
    }
    for s in &changes.skipped {
        notes.leave_out(s.path.clone(), s.reason.clone());
    }
    notes
}

/// Where a copy-on-write backend's sandbox left what goes into its result bundle.
#[derive(Debug, Clone, Copy)]
pub struct BundleSources<'a> {
    /// The project (the overlay's lower layer, never written).
    pub project: &'a Path,
    pub layer: WorkspaceLayer<'a>,
    pub outcome: Option<&'a ExecOutcome>,
    /// The step gave a result that broke a limit (the log says which): the step failed.
    pub result_rejected: bool,
    /// What the step left in `/result` (untrusted).
    pub artifacts: &'a Path,
    /// The NDJSON log of the run, appended to here with what the bundle had to leave out.
    pub log: &'a Path,
    /// More notes for the end of the log.
    pub notes: &'a [String],
}

/// Writes the result bundle of a copy-on-write backend's sandbox at `handle.result_path`
/// (which the caller has cleared of an earlier bundle): status and patches from
/// [`workspace_bundle`], the step's outputs, its artifacts (within the bundle's limits) and
/// the log. What cannot go in (an artifact over a limit or not a regular file, a change no
/// patch can carry) is noted at the end of the log, never silently dropped.
pub fn write_workspace_bundle(
    handle: &SandboxHandle,
    from: BundleSources<'_>,
) -> Result<CollectReport, RuntimeError> {
    let bundle = workspace_bundle(from.project, from.layer, from.outcome, from.result_rejected)?;
    let budget = SANDBOX_MAX_BUNDLE_BYTES.saturating_sub(bundle.patch_bytes);
    let (artifacts, skipped) = collect_artifacts(from.artifacts, SANDBOX_MAX_PATCH_FILES, budget);
    let mut notes: Vec<String> = from.notes.to_vec();
    notes.extend(
        skipped
            .into_iter()
            .map(|s| format!("artifact skipped: {s}")),
    );
    notes.extend(bundle.changes.skipped.iter().map(|s| {
        format!(
            "change not representable as a patch: {}: {}",
            s.path, s.reason
        )
    }));
    notes.extend(
        bundle
            .changes
            .ignored
            .iter()
            .map(|i| format!("change left out ({:?}): {}", i.reason, i.path)),
    );
    notes.extend(bundle.changes.stale_base.iter().map(|p| {
        format!("changed on the host while the step ran (accept refuses it as a conflict): {p}")
    }));
    notes.extend(bundle.changes.notes.iter().cloned());
    if !notes.is_empty() {
        append_notes(from.log, &notes)?;
    }
    let patch_count = bundle.patches.len();
    let mut params = WriteParams::new(&handle.result_path, bundle.status);
    params.run_id = Some(handle.run_id.clone());
    params.output = from
        .outcome
        .and_then(|o| o.result.as_ref())
        .and_then(|r| r.get("outputs").cloned());
    params.patches = bundle.patches;
    params.artifacts = artifacts;
    params.stream_log_path = from.log.is_file().then(|| from.log.to_path_buf());
    params.diff_bundle = bundle.diff_bundle;
    params.change_notes = bundle.notes;
    write_bundle(&params).map_err(|e| RuntimeError::inner("write the result bundle", &e))?;
    Ok(CollectReport {
        bundle_path: handle.result_path.clone(),
        patch_count,
        ignored_paths: bundle
            .changes
            .ignored
            .iter()
            .map(|i| i.path.clone())
            .collect(),
    })
}

fn append_notes(log: &Path, notes: &[String]) -> Result<(), RuntimeError> {
    use std::io::Write;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| RuntimeError::io("append log", log, e))?;
    for n in notes {
        let rec = serde_json::json!({"kind": "note", "message": n, "timestampMs": now});
        writeln!(f, "{rec}").map_err(|e| RuntimeError::io("append log", log, e))?;
    }
    Ok(())
}

/// The artifacts under `root` (the step's `/result`, untrusted) as `artifacts/<relative>`
/// bundle files, in path order, and what was left out. No link is followed: symlinks and
/// special files are not artifacts. Past `max_files` files or `max_bytes` bytes the rest is
/// left out too; each is said in the second list.
pub fn collect_artifacts(
    root: &Path,
    max_files: usize,
    max_bytes: u64,
) -> (Vec<BundleFile>, Vec<String>) {
    let mut found: Vec<BundleFile> = Vec::new();
    let mut skipped = Vec::new();
    match std::fs::symlink_metadata(root) {
        Ok(md) if md.file_type().is_dir() => {}
        _ => return (found, skipped),
    }
    let Ok(beneath) = smithers_paths::Beneath::open(root) else {
        return (found, skipped);
    };
    let mut total = 0u64;
    let mut stack: Vec<std::path::PathBuf> = vec![std::path::PathBuf::new()];
    while let Some(rel_dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(root.join(&rel_dir)) else {
            continue;
        };
        let mut entries: Vec<_> = entries.filter_map(Result::ok).collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let rel = rel_dir.join(entry.file_name());
            let rel_text = rel.to_string_lossy().into_owned();
            let Ok(ft) = entry.file_type() else { continue };
            if ft.is_dir() {
                stack.push(rel);
            } else if ft.is_file() {
                if found.len() >= max_files {
                    skipped.push(format!(
                        "{rel_text}: more than {max_files} artifacts (SANDBOX_MAX_PATCH_FILES limit)"
                    ));
                    continue;
                }
                match beneath.read_regular(&rel, max_bytes.saturating_sub(total)) {
                    Ok(Some(content)) => {
                        total += content.len() as u64;
                        found.push(BundleFile::new(format!("artifacts/{rel_text}"), content));
                    }
                    Ok(None) | Err(_) => skipped.push(format!(
                        "{rel_text}: unreadable, replaced during the walk, or over the bundle size limit"
                    )),
                }
            } else {
                skipped.push(format!(
                    "{rel_text}: not a regular file (symlinks and special files are not artifacts)"
                ));
            }
        }
    }
    found.sort_by(|a, b| a.path.cmp(&b.path));
    (found, skipped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn artifacts_never_follow_links_and_keep_to_the_limits() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, b"host secret").unwrap();
        let out = dir.path().join("out");
        std::fs::create_dir_all(out.join("artifacts/sub")).unwrap();
        std::fs::write(out.join("artifacts/sub/a.txt"), b"a").unwrap();
        std::os::unix::fs::symlink(&secret, out.join("artifacts/leak")).unwrap();
        let (found, skipped) = collect_artifacts(&out.join("artifacts"), 10, 1 << 20);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].path, "artifacts/sub/a.txt");
        assert!(skipped.iter().any(|s| s.starts_with("leak")));
        std::fs::write(out.join("artifacts/b.txt"), b"bb").unwrap();
        let (found, skipped) = collect_artifacts(&out.join("artifacts"), 1, 1 << 20);
        assert_eq!(found.len(), 1);
        assert!(skipped.iter().any(|s| s.contains("more than 1 artifacts")));
        let (found, _) = collect_artifacts(&out.join("artifacts"), 10, 1);
        assert!(found.iter().all(|f| f.content.len() <= 1), "{found:?}");
    }

    use crate::{EnforcementReport, ResourceUsage};
    use std::time::Duration;

    fn outcome(termination: Termination, code: Option<i32>, result: Option<Value>) -> ExecOutcome {
        ExecOutcome {
            termination,
            exit_code: code,
            signal: None,
            duration: Duration::from_millis(1),
            stdout_bytes: 0,
            stderr_bytes: 0,
            stdout_truncated: false,
            stderr_truncated: false,
            usage: ResourceUsage::default(),
            enforcement: EnforcementReport::default(),
            result,
        }
    }

    #[test]
    fn status_rules() {
        let status = |o: &ExecOutcome| bundle_status(Some(o), false);
        assert_eq!(bundle_status(None, false), BundleStatus::Failed);
        assert_eq!(
            status(&outcome(Termination::Exited, Some(0), None)),
            BundleStatus::Finished
        );
        assert_eq!(
            status(&outcome(Termination::Exited, Some(3), None)),
            BundleStatus::Failed
        );
        assert_eq!(
            status(&outcome(Termination::Memory, None, None)),
            BundleStatus::Failed
        );
        let said_failed = Some(serde_json::json!({"status": "failed"}));
        assert_eq!(
            status(&outcome(Termination::Exited, Some(0), said_failed)),
            BundleStatus::Failed
        );
        let said_finished = Some(serde_json::json!({"status": "finished"}));
        assert_eq!(
            status(&outcome(
                Termination::Exited,
                Some(1),
                said_finished.clone()
            )),
            BundleStatus::Finished
        );
        assert_eq!(
            status(&outcome(
                Termination::Cancelled,
                None,
                said_finished.clone()
            )),
            BundleStatus::Cancelled
        );
        // A rejected result fails the step, whatever it said, unless it was cancelled.
        let ok = outcome(Termination::Exited, Some(0), said_finished.clone());
        assert_eq!(bundle_status(Some(&ok), true), BundleStatus::Failed);
        let cancelled = outcome(Termination::Cancelled, None, said_finished);
        assert_eq!(
            bundle_status(Some(&cancelled), true),
            BundleStatus::Cancelled
        );
        assert_eq!(bundle_status(None, true), BundleStatus::Failed);
    }

    #[test]
    fn base_ref_reads_head_and_never_climbs() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(base_ref(dir.path()), "");
        let git = dir.path().join(".git");
        std::fs::create_dir_all(git.join("refs/heads")).unwrap();
        std::fs::write(git.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        // A ref not written yet (fresh repository): the ref name itself.
        assert_eq!(base_ref(dir.path()), "refs/heads/main");
        let id = "0123456789abcdef0123456789abcdef01234567";
        std::fs::write(git.join("refs/heads/main"), format!("{id}\n")).unwrap();
        assert_eq!(base_ref(dir.path()), id);
        std::fs::write(git.join("HEAD"), "ref: ../../etc/passwd\n").unwrap();
        assert_eq!(base_ref(dir.path()), "");
        std::fs::write(git.join("HEAD"), format!("{id}\n")).unwrap();
        assert_eq!(base_ref(dir.path()), id);
        std::fs::write(git.join("HEAD"), "not an id\n").unwrap();
        assert_eq!(base_ref(dir.path()), "");
    }

    /// The project is a client's upload on a server: its HEAD must not make us read a host
    /// file (absolute "ref", a link, a device) into the bundle's baseRef.
    #[test]
    fn base_ref_reads_no_host_file_a_project_names() {
        let host = tempfile::tempdir().unwrap();
        let secret = host.path().join("secret");
        std::fs::write(&secret, "0123456789abcdef0123456789abcdef01234567\n").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let git = dir.path().join(".git");
        std::fs::create_dir_all(git.join("refs/heads")).unwrap();
        std::fs::write(git.join("HEAD"), format!("ref: {}\n", secret.display())).unwrap();
        assert_eq!(base_ref(dir.path()), "", "an absolute ref is not read");
        std::fs::write(git.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        std::os::unix::fs::symlink(&secret, git.join("refs/heads/main")).unwrap();
        assert_eq!(
            base_ref(dir.path()),
            "refs/heads/main",
            "a linked ref is not read"
        );
        std::fs::remove_file(git.join("HEAD")).unwrap();
        std::os::unix::fs::symlink(&secret, git.join("HEAD")).unwrap();
        assert_eq!(base_ref(dir.path()), "", "a linked HEAD is not read");
        std::fs::remove_file(git.join("HEAD")).unwrap();
        std::fs::write(git.join("HEAD"), "ref: refs/heads/zero\n").unwrap();
        std::os::unix::fs::symlink("/dev/zero", git.join("refs/heads/zero")).unwrap();
        assert_eq!(
            base_ref(dir.path()),
            "refs/heads/zero",
            "a device is never read"
        );
    }

    #[test]
    fn workspace_bundle_turns_upper_changes_into_patches() {
        let dir = tempfile::tempdir().unwrap();
        let (lower, upper) = (dir.path().join("lower"), dir.path().join("upper"));
        std::fs::create_dir_all(&lower).unwrap();
        std::fs::create_dir_all(&upper).unwrap();
        std::fs::write(lower.join("a.txt"), "one\n").unwrap();
        // The step's copy-up comes a clock tick after the project was last changed (as in a
        // real run): a tie would rightly flag a.txt as changed on the host meanwhile.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(upper.join("a.txt"), "two\n").unwrap();
        std::fs::write(upper.join("b.txt"), "new\n").unwrap();
        let ok = outcome(Termination::Exited, Some(0), None);
        let b = workspace_bundle(&lower, WorkspaceLayer::Upper(&upper), Some(&ok), false).unwrap();
        assert!(b.notes.host_changed.is_empty(), "{:?}", b.notes);
        assert_eq!(b.status, BundleStatus::Finished);
        assert_eq!(b.patches.len(), 2);
        assert_eq!(
            b.patch_bytes,
            b.patches
                .iter()
                .map(|p| p.content.len() as u64)
                .sum::<u64>()
        );
        let diff = b.diff_bundle.clone().expect("a diff bundle");
        assert_eq!(diff.base_ref, "");
        let ops: Vec<(&str, DiffOperation)> = diff
            .patches
            .iter()
            .map(|p| (p.path.as_str(), p.operation))
            .collect();
        assert_eq!(
            ops,
            [
                ("a.txt", DiffOperation::Modify),
                ("b.txt", DiffOperation::Add)
            ]
        );
        // The same post-step tree as a full copy gives the same patches.
        let copy = dir.path().join("copy");
        std::fs::create_dir_all(&copy).unwrap();
        std::fs::write(copy.join("a.txt"), "two\n").unwrap();
        std::fs::write(copy.join("b.txt"), "new\n").unwrap();
        let c = workspace_bundle(
            &lower,
            WorkspaceLayer::Copy {
                tree: &copy,
                finished: None,
            },
            Some(&ok),
            false,
        )
        .unwrap();
        assert_eq!(c.patches, b.patches);
        assert_eq!(c.diff_bundle, Some(diff));
        // Nothing changed: no diff bundle at all.
        let same = dir.path().join("same");
        std::fs::create_dir_all(&same).unwrap();
        let b = workspace_bundle(&lower, WorkspaceLayer::Upper(&same), None, false).unwrap();
        assert!(b.patches.is_empty() && b.diff_bundle.is_none());
        assert_eq!(b.status, BundleStatus::Failed);
    }
}
