//! The part of `collect` every backend whose workspace is a copy-on-write view of the project
//! shares (behind the `collect` feature): the bundle status rule, and the workspace changes
//! turned into bundle patches plus the `diffBundle`. The native and the docker runtime call
//! [`workspace_bundle`], so the same workspace gives byte-identical patches whichever ran it.
//!
//! Nothing fails a step for its size: a change over the changed-content bound, or whose
//! patch does not fit the bundle, is left out (largest first, [`fit_patches`]), named with
//! its reason in `changeNotes.leftOut` and the log, and the rest is kept;
//! [`write_workspace_bundle_with`] tells the backend to keep its workspace layer then
//! (`changeNotes.keptLayer`, see [`crate::kept_layer`]).

use std::path::Path;

use serde_json::Value;
use smithers_bundle::{
    write_bundle, BundleFile, BundleStatus, ChangeNotes, DiffBundle, DiffOperation, DiffPatch,
    WriteParams, SANDBOX_MAX_BUNDLE_BYTES, SANDBOX_MAX_PATCH_FILES, SANDBOX_MAX_README_BYTES,
};
use smithers_patch::{
    build_patch_files, detect_changes, detect_changes_by_compare, leave_out_largest, ChangeSet,
    DetectOptions, IgnoreReason, Operation, SkippedEntry,
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
        /// The copy's manifest (`smithers_patch::CopyManifest`, written by ship): a copy entry
        /// it lists with the same inode and ctime was not touched by the step, so its
        /// difference from the project is the host's edit and not a change (see
        /// `DetectOptions::copy_manifest`). `None`, or a manifest that cannot be read (said in
        /// the change set's notes): every difference counts.
        manifest: Option<&'a Path>,
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
    /// Binary files whose `diffBundle` entry carries no `binaryContent` (path, bytes): over
    /// `smithers_patch::MAX_BINARY_CONTENT_BYTES`. Their patch files carry the change.
    pub binary_content_left_out: Vec<(String, u64)>,
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
    workspace_bundle_with(
        project,
        layer,
        outcome,
        result_rejected,
        DetectOptions::default(),
    )
}

/// [`workspace_bundle`] with explicit detection options (a caller or a test may bound the
/// changed content lower; `copy_manifest` is set here from `layer`).
pub fn workspace_bundle_with(
    project: &Path,
    layer: WorkspaceLayer<'_>,
    outcome: Option<&ExecOutcome>,
    result_rejected: bool,
    mut opts: DetectOptions,
) -> Result<WorkspaceBundle, RuntimeError> {
    let changes = match layer {
        WorkspaceLayer::Upper(upper) => detect_changes(project, upper, &opts),
        WorkspaceLayer::Copy { tree, manifest } => {
            let mut unread = None;
            if let Some(path) = manifest {
                match smithers_patch::CopyManifest::read(path) {
                    Ok(m) => opts.copy_manifest = Some(std::sync::Arc::new(m)),
                    Err(e) => unread = Some(format!(
                        "the copy's manifest could not be read ({e}): the host's edits made while the step ran may show as changes (flagged as changed on the host)"
                    )),
                }
            }
            detect_changes_by_compare(project, tree, &opts).map(|mut c| {
                c.notes.extend(unread);
                c
            })
        }
    }
    .map_err(|e| RuntimeError::inner("detect the workspace changes", &e))?;
    Ok(render_changes(
        project,
        changes,
        bundle_status(outcome, result_rejected),
    ))
}

/// The patches, `diffBundle` and notes of a change set.
fn render_changes(project: &Path, changes: ChangeSet, status: BundleStatus) -> WorkspaceBundle {
    let rendered = build_patch_files(&changes);
    let notes = change_notes(&changes);
    let patch_bytes = rendered.total_bytes();
    let has_diff_bundle = !rendered.diff_bundle.is_empty();
    // Moved, not cloned: with 100k changed files each copy of the patch texts is tens of MB.
    let patches = rendered
        .files
        .into_iter()
        .map(|f| BundleFile::new(f.bundle_path, f.content))
        .collect();
    // A JavaScript consumer applies the diffBundle without our hostChanged check: a patch
    // whose base is lost would undo the host's edit there, so it is left out (named in
    // changeNotes.hostChanged) and only our accept, which refuses it, sees it in the patch
    // files.
    let host_changed: std::collections::HashSet<&str> =
        notes.host_changed.iter().map(String::as_str).collect();
    let entries: Vec<DiffPatch> = rendered
        .diff_bundle
        .into_iter()
        .filter(|d| !host_changed.contains(d.path.as_str()))
        .map(|d| DiffPatch {
            path: d.path,
            operation: match d.operation {
                Operation::Add => DiffOperation::Add,
                Operation::Modify => DiffOperation::Modify,
                Operation::Delete => DiffOperation::Delete,
            },
            diff: d.diff,
            binary_content: d.binary_content,
        })
        .collect();
    let diff_bundle = has_diff_bundle.then(|| DiffBundle {
        seq: 0,
        base_ref: base_ref(project),
        patches: entries,
    });
    WorkspaceBundle {
        status,
        patches,
        diff_bundle,
        patch_bytes,
        notes,
        binary_content_left_out: rendered.binary_content_left_out,
        changes,
    }
}

/// Makes the patches fit `budget` bytes: while they do not, the changes with the largest
/// patches are left out ([`leave_out_largest`]), each moved to `changes.over_limit` with the
/// limit and its size, and the rest is rendered again. Everything else is kept.
pub fn fit_patches(project: &Path, bundle: WorkspaceBundle, budget: u64) -> WorkspaceBundle {
    if bundle.patch_bytes <= budget {
        return bundle;
    }
    // Each change's patch text is its diffBundle entry's diff (a patch file is the
    // concatenation of its members' diffs), so these sizes add up to the patch bytes.
    let rendered = build_patch_files(&bundle.changes);
    let sizes: Vec<u64> = rendered
        .diff_bundle
        .iter()
        .map(|d| d.diff.len() as u64)
        .collect();
    let out: std::collections::BTreeMap<String, u64> = leave_out_largest(&sizes, budget)
        .into_iter()
        .map(|i| (rendered.diff_bundle[i].path.clone(), sizes[i]))
        .collect();
    let status = bundle.status;
    let mut changes = bundle.changes;
    changes.changes.retain(|c| !out.contains_key(&c.path));
    changes.stale_base.retain(|p| !out.contains_key(p));
    changes
        .over_limit
        .extend(out.into_iter().map(|(path, bytes)| SkippedEntry {
            reason: format!(
                "over a size limit: its {bytes}-byte patch does not fit the result bundle's {SANDBOX_MAX_BUNDLE_BYTES}-byte limit (SANDBOX_MAX_BUNDLE_BYTES; {budget} bytes were left for patches); left out, largest first, so that the rest of the change is kept"
            ),
            path,
        }));
    changes.over_limit.sort_by(|a, b| a.path.cmp(&b.path));
    render_changes(project, changes, status)
}

/// Whether the review marks a file a commit changes as one the host runs by itself (so it
/// is listed past the per-commit cap).
fn runs_on_host(path: &str) -> bool {
    smithers_patch::runs_on_host(path, &[]).is_some()
}

/// A series [`smithers_git::collect_from`] read: the series, its changes from base to tip,
/// and the scratch repository it was read in.
type CollectedSeries = (
    smithers_bundle::CommitSeries,
    Vec<smithers_git::SeriesChange>,
    Box<smithers_git::SeriesRepo>,
);

/// What of a step's commit series comes back (one truth: the review must show everything
/// the series writes): the series, when every file it changes ends at its tip as the
/// patches leave it, or the patches change it too and the tip's version is shown from
/// [`smithers_git::SERIES_PATCH_FILE`] (a file committed, then changed again); else nothing,
/// and the bundle says why (`leftOut`, the log). Returns the series, the paths it changes
/// (from the project), and the bytes of the series patch it added to `git_files` (`room`
/// at most).
fn settle_series(
    collected: Option<CollectedSeries>,
    bundle: &mut WorkspaceBundle,
    git_files: &mut Vec<smithers_bundle::BundleFile>,
    git_notes: &mut Vec<String>,
    room: u64,
) -> (
    Option<smithers_bundle::CommitSeries>,
    std::collections::HashSet<Vec<u8>>,
    u64,
) {
    let Some((mut series, changes, repo)) = collected else {
        return (None, Default::default(), 0);
    };
    let settled = smithers_git::tip_only_differences(&changes, &reviewed_files(&bundle.changes))
        .and_then(|differing| {
            if differing.is_empty() {
                return Ok(None);
            }
            let diff = repo.tip_diff(&differing)?;
            if diff.len() as u64 > room {
                return Err(format!(
                    "the diff of the {} file(s) the commits leave otherwise than the patches takes {} bytes, over the {room} left in the bundle",
                    differing.len(),
                    diff.len()
                ));
            }
            Ok(Some((differing, diff)))
        });
    match settled {
        Ok(shown) => {
            let mut extra = 0;
            if let Some((differing, diff)) = shown {
                series.tip_differs = differing
                    .iter()
                    .map(|p| smithers_patch::path_from_bytes(p))
                    .collect();
                extra = diff.len() as u64;
                git_files.push(smithers_bundle::BundleFile::new(
                    smithers_git::SERIES_PATCH_FILE,
                    diff,
                ));
            }
            let committed = changes.into_iter().map(|c| c.path).collect();
            (Some(series), committed, extra)
        }
        Err(why) => {
            git_files.clear();
            let said = format!(
                "the step's commits are not brought back: {why}; its files come back as patches"
            );
            // The review lists what was left out: it says why here too, not only in the log.
            for l in bundle
                .notes
                .left_out
                .iter_mut()
                .filter(|l| l.path == ".git/")
            {
                l.reason = said.clone();
            }
            git_notes.push(said);
            (None, Default::default(), 0)
        }
    }
}

/// Every file the patches of `changes` change, and how they leave it, for
/// [`smithers_git::compare_with_review`].
fn reviewed_files(changes: &ChangeSet) -> Vec<smithers_git::ReviewedFile> {
    changes
        .changes
        .iter()
        .map(|c| smithers_git::ReviewedFile {
            path: smithers_patch::path_to_bytes(&c.path)
                .unwrap_or_else(|| c.path.as_bytes().to_vec()),
            state: match &c.new {
                Some(v) => smithers_git::ReviewedState::Present {
                    mode: v.mode.as_str().to_string(),
                    oid: Some(v.oid.clone()),
                },
                None => smithers_git::ReviewedState::Absent,
            },
        })
        .collect()
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
    for s in changes.skipped.iter().chain(&changes.over_limit) {
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
    /// When the project is a git worktree, or lies below its repository's top: the layer over
    /// that repository's (common) git directory, which the sandbox saw writable at its own
    /// path (`smithers-git`).
    pub git_common_layer: Option<&'a Path>,
}

/// Room kept in the bundle for the notes appended to the log at collect; the notes are cut
/// to fit it (what they would have named is in README.md's `changeNotes` too).
const NOTES_RESERVE: u64 = 2 << 20;

/// Writes the result bundle of a copy-on-write backend's sandbox at `handle.result_path`
/// (which the caller has cleared of an earlier bundle): see [`write_workspace_bundle_with`];
/// this backend keeps no workspace layer after cleanup.
pub fn write_workspace_bundle(
    handle: &SandboxHandle,
    from: BundleSources<'_>,
) -> Result<CollectReport, RuntimeError> {
    write_workspace_bundle_with(handle, from, &CollectOptions::default()).map(|w| w.report)
}

/// How [`write_workspace_bundle_with`] collects.
#[derive(Debug, Clone, Default)]
pub struct CollectOptions {
    /// Where the backend will keep the step's workspace layer, past cleanup, when changes
    /// of the step were left out for a size limit (said in `changeNotes.keptLayer`); `None`:
    /// this backend keeps none, and the log says that the left-out content is lost.
    pub kept_layer: Option<std::path::PathBuf>,
    /// Change detection options (default: [`DetectOptions::default`]); a test may bound the
    /// changed content lower than the default 1 GiB.
    pub detect: Option<DetectOptions>,
}

/// Environment variable that lowers the bound on changed content held at collect
/// (`DetectOptions::max_content_bytes`, default 1 GiB), in bytes: for tests and for hosts
/// with little memory. It can only lower the bound; a value that is not a number is ignored.
pub const MAX_CHANGE_BYTES_ENV: &str = "SMITHERS_SANDBOX_MAX_CHANGE_BYTES";

/// The default [`DetectOptions`], with [`MAX_CHANGE_BYTES_ENV`] applied.
pub fn detect_options_from_env() -> DetectOptions {
    let mut opts = DetectOptions::default();
    if let Some(n) = std::env::var(MAX_CHANGE_BYTES_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
    {
        opts.max_content_bytes = opts.max_content_bytes.min(n);
    }
    opts
}

/// What [`write_workspace_bundle_with`] did.
#[derive(Debug, Clone)]
pub struct WorkspaceCollect {
    pub report: CollectReport,
    /// Changes of the step were left out for a size limit: the backend must keep the layer
    /// (at `CollectOptions::kept_layer`, as the bundle says) when it cleans up.
    pub keep_layer: bool,
}

/// Writes the result bundle: status and patches from [`workspace_bundle_with`], the step's
/// outputs, its artifacts (within the bundle's limits) and the log. Nothing fails the step
/// for its size: changes over the content bound, or whose patches do not fit the bundle
/// (largest first, [`fit_patches`]), are left out and named in `changeNotes.leftOut` and in
/// the log, and the rest is kept; artifacts get what is left of the bundle's budget. What
/// cannot go in (an artifact over a limit or not a regular file, a change no patch can carry)
/// is noted at the end of the log, never silently dropped.
pub fn write_workspace_bundle_with(
    handle: &SandboxHandle,
    from: BundleSources<'_>,
    options: &CollectOptions,
) -> Result<WorkspaceCollect, RuntimeError> {
    let opts = options.detect.clone().unwrap_or_default();
    let bundle = workspace_bundle_with(
        from.project,
        from.layer,
        from.outcome,
        from.result_rejected,
        opts,
    )?;
    // A log past what the bundle may spend on it (output kept under raised caps) is cut, its
    // start and end kept and a `logCut` record between, so that the patches keep their room.
    match crate::output::fit_log(from.log, crate::output::MAX_BUNDLE_LOG_BYTES) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(RuntimeError::io(
                "cut the log to the bundle's room",
                from.log,
                e,
            ))
        }
    }
    // README.md at its largest, the log as it is and the notes still to come are held back;
    // the patches get the rest, the artifacts what the patches leave.
    let log_len = std::fs::metadata(from.log).map_or(0, |m| m.len());
    // The commits the step made in the project's repository, before the patches' budget is
    // set.
    let (mut git_notes, mut git_files, commits) = collect_commits(&from);
    let git_bytes: u64 = git_files.iter().map(|f| f.content.len() as u64).sum();
    let patch_budget = SANDBOX_MAX_BUNDLE_BYTES
        .saturating_sub(SANDBOX_MAX_README_BYTES)
        .saturating_sub(log_len)
        .saturating_sub(NOTES_RESERVE)
        .saturating_sub(git_bytes);
    let mut bundle = fit_patches(from.project, bundle, patch_budget);
    // One truth: the series comes back only when its tip leaves every file it changes as
    // the patches (what the review shows) do; else the patches alone come back.
    let room = patch_budget.saturating_sub(bundle.patch_bytes);
    let (commits, committed, series_patch_bytes) =
        settle_series(commits, &mut bundle, &mut git_files, &mut git_notes, room);
    if commits.is_some() {
        // The repository's own files are never patched; what of them comes back is the
        // series, which the left-out entry then points at.
        for l in bundle
            .notes
            .left_out
            .iter_mut()
            .filter(|l| l.path == ".git/")
        {
            l.reason = "the repository's own files (config, hooks, index, other branches, stashes) are not applied; the commits on the step's branch are (changeNotes.commits)".into();
        }
    }
    bundle.notes.commits = commits;
    note_staged(&mut bundle, &from, &committed);
    let keep_layer = !bundle.changes.over_limit.is_empty();
    if keep_layer {
        bundle.notes.kept_layer = options
            .kept_layer
            .as_ref()
            .map(|p| p.to_string_lossy().into_owned());
        note_where_kept(&mut bundle, options.kept_layer.as_deref());
    }
    let budget = patch_budget
        .saturating_sub(bundle.patch_bytes)
        .saturating_sub(series_patch_bytes);
    let (artifacts, skipped) = collect_artifacts(
        from.artifacts,
        SANDBOX_MAX_PATCH_FILES.saturating_sub(git_files.len()),
        budget,
    );
    let notes = collect_notes(
        from.notes,
        git_notes,
        skipped,
        &bundle,
        keep_layer,
        options.kept_layer.as_deref(),
    );
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
    params.artifacts.extend(git_files);
    params.stream_log_path = from.log.is_file().then(|| from.log.to_path_buf());
    params.diff_bundle = bundle.diff_bundle;
    params.change_notes = bundle.notes;
    write_bundle(&params).map_err(|e| RuntimeError::inner("write the result bundle", &e))?;
    Ok(WorkspaceCollect {
        report: CollectReport {
            bundle_path: handle.result_path.clone(),
            patch_count,
            ignored_paths: bundle
                .changes
                .ignored
                .iter()
                .map(|i| i.path.clone())
                .collect(),
        },
        keep_layer,
    })
}

/// The commits the step made in the project's repository (overlay layers only: a copy
/// workspace binds the host's `.git` read-only). Returns the log's notes on them (why they do
/// not come back), the git bundle file of their series, and the series read.
fn collect_commits(
    from: &BundleSources<'_>,
) -> (
    Vec<String>,
    Vec<smithers_bundle::BundleFile>,
    Option<CollectedSeries>,
) {
    let mut git_notes = Vec::new();
    let mut git_files = Vec::new();
    let mut commits = None;
    if let WorkspaceLayer::Upper(upper) = from.layer {
        let collected = match from.git_common_layer {
            // A worktree, or a project below its repository's top: the repository's git
            // directory was a layer of its own.
            Some(git_upper) => match smithers_git::GitLayers::worktree(from.project, git_upper)
                .or_else(|| smithers_git::GitLayers::enclosing(from.project, git_upper))
            {
                Some(layers) => smithers_git::collect_from(&layers, &runs_on_host),
                None => Ok(smithers_git::Collected::Nothing),
            },
            None => smithers_git::collect(from.project, upper, &runs_on_host),
        };
        match collected {
            Ok(smithers_git::Collected::Nothing) => {}
            Ok(smithers_git::Collected::Series {
                series,
                bundle,
                changes,
                repo,
            }) => {
                git_files.push(smithers_bundle::BundleFile::new(
                    smithers_bundle::COMMITS_BUNDLE_FILE,
                    bundle,
                ));
                commits = Some((series, changes, repo));
            }
            Ok(smithers_git::Collected::LeftOut(why)) => git_notes.push(format!(
                "the step's commits are not brought back: {why}; its files come back as patches"
            )),
            Err(e) => git_notes.push(format!(
                "the step's commits could not be read: {e}; its files come back as patches"
            )),
        }
    }
    (git_notes, git_files, commits)
}

/// What the step staged without committing (a plain repository at the project's top):
/// accept stages it too, so a `git add`ed new file does not come back untracked. The
/// series' own files are set in the index from its tip anyway.
fn note_staged(
    bundle: &mut WorkspaceBundle,
    from: &BundleSources<'_>,
    committed: &std::collections::HashSet<Vec<u8>>,
) {
    if let WorkspaceLayer::Upper(upper) = from.layer {
        if from.git_common_layer.is_none() {
            bundle.notes.staged = smithers_patch::staged_paths(
                &bundle.changes,
                from.project,
                &upper.join(".git").join("index"),
            )
            .into_iter()
            .filter(|p| {
                let raw = smithers_patch::path_to_bytes(p).unwrap_or_else(|| p.as_bytes().to_vec());
                !committed.contains(&raw)
            })
            .collect();
        }
    }
}

/// The notes appended to the log at collect (bounded to [`NOTES_RESERVE`]): the caller's,
/// then what of the step's commits, artifacts and changes the bundle left out or could not
/// say, and where a kept workspace layer is.
fn collect_notes(
    from_notes: &[String],
    git_notes: Vec<String>,
    skipped: Vec<String>,
    bundle: &WorkspaceBundle,
    keep_layer: bool,
    kept_layer: Option<&Path>,
) -> Vec<String> {
    let mut notes: Vec<String> = from_notes.to_vec();
    notes.extend(git_notes);
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
            .over_limit
            .iter()
            .map(|s| format!("change left out: {}: {}", s.path, s.reason)),
    );
    if keep_layer {
        notes.push(match kept_layer {
            Some(p) => format!(
                "the step's workspace layer, with the changes left out for a size limit, is kept at {} (accept applies none of it; reject removes it)",
                p.display()
            ),
            None => "this runtime keeps no workspace layer: the content of the changes left out for a size limit is lost at cleanup".to_string(),
        });
    }
    notes.extend(
        bundle
            .binary_content_left_out
            .iter()
            .map(|(path, bytes)| {
                format!(
                    "diffBundle: binaryContent of {path} left out ({bytes} bytes, over {} bytes); its patch carries the change",
                    smithers_patch::MAX_BINARY_CONTENT_BYTES
                )
            }),
    );
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
    bound_notes(&mut notes, NOTES_RESERVE);
    notes
}

/// Each change left out for a limit says, in its `leftOut` reason (which the review shows),
/// where its content is: in the kept layer, or lost when the backend keeps none.
fn note_where_kept(bundle: &mut WorkspaceBundle, kept_layer: Option<&Path>) {
    let tail = match kept_layer {
        Some(p) => format!(
            "; the step's file is in the workspace layer kept at {} (accept applies none of it; reject removes it)",
            p.display()
        ),
        None => "; this runtime keeps no workspace layer, so its content is not kept".to_string(),
    };
    let over: std::collections::BTreeSet<&str> = bundle
        .changes
        .over_limit
        .iter()
        .map(|s| s.path.as_str())
        .collect();
    for l in &mut bundle.notes.left_out {
        if over.contains(l.path.as_str()) {
            l.reason.push_str(&tail);
        }
    }
}

/// Cuts `notes` so that their log records fit `max` bytes (a margin of 100 bytes per record
/// for the JSON around the message), the last kept one saying how many more there were.
fn bound_notes(notes: &mut Vec<String>, max: u64) {
    const RECORD: u64 = 100;
    let mut used = 0u64;
    let mut keep = notes.len();
    for (i, n) in notes.iter().enumerate() {
        // Room for this note and for the closing one.
        used += n.len() as u64 * 2 + RECORD; // escaping can double a message's bytes
        if used + 2 * RECORD > max {
            keep = i;
            break;
        }
    }
    if keep < notes.len() {
        let more = notes.len() - keep;
        notes.truncate(keep);
        notes.push(format!(
            "{more} more notes not listed (to keep the bundle within its size limit); README.md's changeNotes names what was left out"
        ));
    }
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
            egress: None,
            command_started_after_us: None,
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
                manifest: None,
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

    fn layers() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let (lower, upper) = (dir.path().join("lower"), dir.path().join("upper"));
        std::fs::create_dir_all(&lower).unwrap();
        std::fs::create_dir_all(&upper).unwrap();
        // The small edit is a new file: a modification's host-changed check compares
        // timestamps that a coarse clock can make equal when both are written at once.
        std::fs::write(lower.join("keep.txt"), "one\n").unwrap();
        std::fs::write(upper.join("a.txt"), "two\n").unwrap();
        (dir, lower, upper)
    }

    /// Patches that do not fit the bundle's budget: the largest is left out (named with the
    /// limit and its size), the small text edit is kept and rendered again.
    #[test]
    fn fit_patches_leaves_out_the_largest_and_keeps_the_rest() {
        let (_dir, lower, upper) = layers();
        std::fs::write(upper.join("big.txt"), "x\n".repeat(50_000)).unwrap();
        let ok = outcome(Termination::Exited, Some(0), None);
        let b = workspace_bundle(&lower, WorkspaceLayer::Upper(&upper), Some(&ok), false).unwrap();
        assert_eq!(b.patches.len(), 2);
        let small = fit_patches(&lower, b.clone(), b.patch_bytes);
        assert_eq!(small.patches, b.patches, "what fits is left alone");
        let fitted = fit_patches(&lower, b, 10_000);
        assert_eq!(fitted.patches.len(), 1);
        let text = String::from_utf8(fitted.patches[0].content.clone()).unwrap();
        assert!(text.contains("+two"), "{text}");
        assert!(fitted.patch_bytes <= 10_000);
        let left: Vec<&str> = fitted
            .notes
            .left_out
            .iter()
            .map(|l| l.path.as_str())
            .collect();
        assert_eq!(left, ["big.txt"]);
        let reason = &fitted.notes.left_out[0].reason;
        assert!(reason.contains("SANDBOX_MAX_BUNDLE_BYTES"), "{reason}");
        let diff = fitted.diff_bundle.expect("the kept edit's diffBundle");
        assert_eq!(diff.patches.len(), 1);
        assert_eq!(diff.patches[0].path, "a.txt");
    }

    /// A change over the content bound is left out of a written bundle that still validates,
    /// with the small edit's patch; the notes say where the layer is kept (when the backend
    /// keeps one) and the log names what was left out.
    #[test]
    fn a_change_over_a_limit_keeps_the_rest_of_the_bundle() {
        let (dir, lower, upper) = layers();
        std::fs::write(upper.join("huge.bin"), vec![0u8; 64 * 1024]).unwrap();
        let root = dir.path().join("sandbox");
        let handle = SandboxHandle {
            runtime: crate::RuntimeKind::Bubblewrap,
            run_id: "r".into(),
            sandbox_id: "s".into(),
            sandbox_root: root.clone(),
            request_path: root.join("request"),
            result_path: root.join("result"),
            container_id: None,
            workspace_id: None,
            backend: Value::Null,
        };
        let log = dir.path().join("stream.ndjson");
        let ok = outcome(Termination::Exited, Some(0), None);
        let sources = BundleSources {
            project: &lower,
            layer: WorkspaceLayer::Upper(&upper),
            outcome: Some(&ok),
            result_rejected: false,
            artifacts: &dir.path().join("no-artifacts"),
            log: &log,
            notes: &[],
            git_common_layer: None,
        };
        let kept = root.join("kept-layer");
        let options = CollectOptions {
            kept_layer: Some(kept.clone()),
            detect: Some(DetectOptions {
                max_content_bytes: 1024,
                ..DetectOptions::default()
            }),
        };
        let done = write_workspace_bundle_with(&handle, sources, &options).unwrap();
        assert!(done.keep_layer);
        assert_eq!(done.report.patch_count, 1);
        let valid = smithers_bundle::validate_bundle(&handle.result_path).unwrap();
        assert_eq!(valid.patch_files.len(), 1);
        let notes = &valid.change_notes;
        assert_eq!(notes.left_out.len(), 1, "{notes:?}");
        assert_eq!(notes.left_out[0].path, "huge.bin");
        assert!(notes.left_out[0].reason.contains("65536 bytes"));
        assert!(
            notes.left_out[0].reason.contains("kept at"),
            "{}",
            notes.left_out[0].reason
        );
        assert_eq!(notes.kept_layer.as_deref(), Some(&*kept.to_string_lossy()));
        let log = std::fs::read_to_string(&log).unwrap();
        assert!(log.contains("change left out: huge.bin"), "{log}");
        assert!(log.contains("is kept at"), "{log}");
        // Within the limits nothing is left out and no layer is kept.
        std::fs::remove_dir_all(&handle.result_path).unwrap();
        let sources = BundleSources { ..sources };
        let done = write_workspace_bundle_with(
            &handle,
            sources,
            &CollectOptions {
                kept_layer: Some(kept),
                detect: None,
            },
        )
        .unwrap();
        assert!(!done.keep_layer);
        let valid = smithers_bundle::validate_bundle(&handle.result_path).unwrap();
        assert_eq!(valid.patch_files.len(), 2);
        assert!(valid.change_notes.is_empty(), "{:?}", valid.change_notes);
    }

    #[test]
    fn notes_are_bounded() {
        let mut notes: Vec<String> = (0..100).map(|i| format!("{i:0>100}")).collect();
        bound_notes(&mut notes, 10_000);
        assert!(notes.len() < 100);
        let total: usize = notes.iter().map(|n| n.len() * 2 + 100).sum();
        assert!(total <= 10_000, "{total}");
        assert!(notes.last().unwrap().contains("more notes not listed"));
        let mut few = vec!["a".to_string()];
        bound_notes(&mut few, 10_000);
        assert_eq!(few, ["a"]);
    }
}
