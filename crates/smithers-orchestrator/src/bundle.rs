//! What the orchestrator needs from a collected bundle and from the patch applier.
//!
//! Both sit behind small traits whose real implementations are [`BundleValidator`]
//! (`smithers-bundle`) and [`AtomicPatchApplier`] (`smithers-patch`); the traits let a caller
//! add checks around them. Counting diff lines is pure bookkeeping and lives here.

use std::path::{Path, PathBuf};

use serde_json::Value;
use smithers_errors::{ErrorCode, ErrorReport};
use smithers_store::{PatchOperation, PatchRecord};

/// A result bundle that passed validation (spec section 2, "Validating").
#[derive(Debug, Clone, PartialEq)]
pub struct InspectedBundle {
    pub bundle_path: PathBuf,
    /// `finished`, `failed` or `cancelled` from the manifest.
    pub status: String,
    /// The manifest's `outputs`; `None` when the key is absent.
    pub outputs: Option<Value>,
    /// The manifest's `runId` (the remote run id).
    pub run_id: Option<String>,
    pub bundle_size_bytes: u64,
    /// Bundle-relative patch files (`patches/...patch`), sorted, confined to the bundle.
    pub patch_files: Vec<String>,
    /// The manifest's `diffBundle`, when present.
    pub diff_bundle: Option<Value>,
    /// README.md's `changeNotes`: paths whose base the host changed while the step ran
    /// (conflicts at accept) and the changes no patch carries.
    pub change_notes: smithers_bundle::ChangeNotes,
}

impl InspectedBundle {
    /// Patches in this bundle: the patch files (the source of truth). Only when there are
    /// none, the entries of a `diffBundle`. (0.32 added both together, counting every change
    /// twice when a bundle carried both.)
    pub fn patch_count(&self) -> u64 {
        if !self.patch_files.is_empty() {
            return self.patch_files.len() as u64;
        }
        self.diff_bundle
            .as_ref()
            .and_then(|d| d.get("patches"))
            .and_then(Value::as_array)
            .map_or(0, |a| a.len() as u64)
    }

    /// Real `totalDiffLines`: lines starting with `+`/`-` but not `+++`/`---`, over the same
    /// patches [`InspectedBundle::patch_count`] counts.
    pub fn total_diff_lines(&self) -> Result<u64, ErrorReport> {
        if !self.patch_files.is_empty() {
            let mut total = 0;
            for rel in &self.patch_files {
                let text = read_patch(&self.bundle_path, rel)?;
                total += diff_line_count(&text);
            }
            return Ok(total);
        }
        Ok(self
            .diff_bundle
            .as_ref()
            .and_then(|d| d.get("patches"))
            .and_then(Value::as_array)
            .map_or(0, |a| {
                a.iter()
                    .filter_map(|p| p.get("diff").and_then(Value::as_str))
                    .map(diff_line_count)
                    .sum()
            }))
    }
}

/// Reads a bundle-relative patch file. The validator has already confined the path to
/// `patches/` and rejected symlinks; reading is lossy so a binary patch cannot fail counting.
fn read_patch(bundle: &Path, rel: &str) -> Result<String, ErrorReport> {
    let path = bundle.join(rel);
    std::fs::read(&path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .map_err(|e| {
            ErrorReport::new(
                ErrorCode::SandboxExecutionFailed,
                format!("cannot read patch file {}: {e}", path.display()),
            )
            .with_details(serde_json::json!({ "path": rel }))
        })
}

/// The digest a review records of the bundle it was opened on: SHA-256 over README.md (the
/// manifest, outputs and `changeNotes`) and every patch file, each preceded by its name and
/// length so that no two different bundles can hash alike by moving bytes between files.
/// Accept recomputes it and refuses a bundle that changed since (what is applied is exactly
/// what was reviewed). Artifacts and the log are not applied, so they are not covered.
pub fn bundle_digest(bundle: &InspectedBundle) -> Result<String, ErrorReport> {
    BundleBytes::read(bundle).map(|b| b.digest())
}

/// README.md and the patch files of a bundle, read once (no link followed, sizes bounded),
/// so that what is hashed is exactly what is parsed and applied.
#[derive(Debug)]
pub struct BundleBytes {
    pub readme: Vec<u8>,
    /// (bundle-relative path, bytes), in the bundle's patch order.
    pub patches: Vec<(String, Vec<u8>)>,
    /// The commits' diff of the files they leave otherwise than the patches
    /// (`git/series.patch`), when the bundle has one: the review shows it, so the digest
    /// covers it (and a bundle without it hashes as before).
    pub series_patch: Option<Vec<u8>>,
}

impl BundleBytes {
    /// Reads README.md and every patch file of `bundle`.
    pub fn read(bundle: &InspectedBundle) -> Result<BundleBytes, ErrorReport> {
        let readme = read_bounded(
            &bundle.bundle_path,
            "README.md",
            smithers_bundle::SANDBOX_MAX_README_BYTES,
        )?;
        let patches = bundle
            .patch_files
            .iter()
            .map(|rel| {
                read_bounded(
                    &bundle.bundle_path,
                    rel,
                    smithers_bundle::SANDBOX_MAX_BUNDLE_BYTES,
                )
                .map(|b| (rel.clone(), b))
            })
            .collect::<Result<_, _>>()?;
        let series_patch =
            std::fs::symlink_metadata(bundle.bundle_path.join(smithers_bundle::SERIES_PATCH_FILE))
                .is_ok()
                .then(|| {
                    read_bounded(
                        &bundle.bundle_path,
                        smithers_bundle::SERIES_PATCH_FILE,
                        smithers_git::MAX_SERIES_PATCH_BYTES,
                    )
                })
                .transpose()?;
        Ok(BundleBytes {
            readme,
            patches,
            series_patch,
        })
    }

    /// [`BundleBytes::read`], refused unless the bytes are those the review was opened on
    /// (`digest`): what is applied is exactly what was reviewed.
    pub fn read_reviewed(
        bundle: &InspectedBundle,
        digest: &str,
    ) -> Result<BundleBytes, ErrorReport> {
        let bytes = BundleBytes::read(bundle)?;
        let found = bytes.digest();
        if found != digest {
            return Err(changed_since_review(digest, &found));
        }
        Ok(bytes)
    }

    /// The digest a review records (see [`bundle_digest`]).
    pub fn digest(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        let mut add = |name: &str, bytes: &[u8]| {
            h.update((name.len() as u64).to_be_bytes());
            h.update(name.as_bytes());
            h.update((bytes.len() as u64).to_be_bytes());
            h.update(bytes);
        };
        add("README.md", &self.readme);
        for (rel, bytes) in &self.patches {
            add(rel, bytes);
        }
        if let Some(bytes) = &self.series_patch {
            add(smithers_bundle::SERIES_PATCH_FILE, bytes);
        }
        let digest = h.finalize();
        format!(
            "sha256:{}",
            digest
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        )
    }
}

/// A regular file of the bundle, opened without following a link, at most `max` bytes.
fn read_bounded(bundle: &Path, rel: &str, max: u64) -> Result<Vec<u8>, ErrorReport> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let path = bundle.join(rel);
    let fail = |e: std::io::Error| {
        ErrorReport::new(
            ErrorCode::SandboxExecutionFailed,
            format!("cannot read {} of the bundle: {e}", path.display()),
        )
        .with_details(serde_json::json!({ "path": rel }))
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc_o_nofollow_nonblock())
        .open(&path)
        .map_err(fail)?;
    if !f.metadata().map_err(fail)?.is_file() {
        return Err(fail(std::io::Error::other("not a regular file")));
    }
    let mut bytes = Vec::new();
    f.take(max + 1).read_to_end(&mut bytes).map_err(fail)?;
    if bytes.len() as u64 > max {
        return Err(fail(std::io::Error::other(format!(
            "larger than {max} bytes"
        ))));
    }
    Ok(bytes)
}

/// `O_NOFOLLOW | O_NONBLOCK` (a fifo planted in place of a file is not waited on).
fn libc_o_nofollow_nonblock() -> i32 {
    libc::O_NOFOLLOW | libc::O_NONBLOCK
}

/// Counts changed lines of a unified diff the way the JavaScript `unifiedDiffLineCount` does.
pub fn diff_line_count(diff: &str) -> u64 {
    diff.split('\n')
        .filter(|l| !l.starts_with("+++") && !l.starts_with("---"))
        .filter(|l| l.starts_with('+') || l.starts_with('-'))
        .count() as u64
}

/// Validates a collected bundle. [`BundleValidator`] is the real one; the trait exists so a
/// caller can add checks of its own around it.
pub trait BundleInspector: Send + Sync + std::fmt::Debug {
    /// Validates the bundle at `bundle_path` and returns what it holds.
    fn inspect(&self, bundle_path: &Path) -> Result<InspectedBundle, ErrorReport>;
}

/// The spec's bundle validation (`smithers_bundle::validate_bundle`: README.md not a symlink
/// and within 5 MiB, valid manifest, no symlink anywhere, size and patch-count limits, every
/// patch path confined to `patches/` by components).
#[derive(Debug, Default, Clone, Copy)]
pub struct BundleValidator;

impl BundleInspector for BundleValidator {
    fn inspect(&self, bundle_path: &Path) -> Result<InspectedBundle, ErrorReport> {
        use smithers_errors::CodedError;
        let v = smithers_bundle::validate_bundle(bundle_path).map_err(|e| e.report())?;
        Ok(InspectedBundle {
            bundle_path: v.bundle_path,
            status: v.manifest.status.as_str().to_string(),
            outputs: v.manifest.outputs,
            run_id: v.manifest.run_id,
            bundle_size_bytes: v.bundle_size_bytes,
            patch_files: v.patch_files,
            diff_bundle: v.manifest.diff_bundle,
            change_notes: v.change_notes,
        })
    }
}

/// Applies accepted patches to the root directory (implemented for real by `smithers-patch`:
/// all-or-nothing, conflict-checked against the recorded base hashes).
pub trait PatchApplier: Send + Sync + std::fmt::Debug {
    /// Applies every patch of `bundle` to `root_dir`, or nothing.
    fn apply(&self, root_dir: &Path, bundle: &InspectedBundle) -> Result<(), ErrorReport>;

    /// Applies the bundle only if it is byte for byte the reviewed one (`digest`, recorded
    /// when the review opened), with conflict markers on request; the paths written with
    /// markers. The default checks the digest, then applies (a second read of the files);
    /// [`AtomicPatchApplier`] hashes and applies the very same bytes.
    fn apply_reviewed(
        &self,
        root_dir: &Path,
        bundle: &InspectedBundle,
        digest: &str,
        conflict_markers: bool,
    ) -> Result<Vec<String>, ErrorReport> {
        let found = bundle_digest(bundle)?;
        if found != digest {
            return Err(changed_since_review(digest, &found));
        }
        if conflict_markers {
            self.apply_marking_conflicts(root_dir, bundle)
        } else {
            self.apply(root_dir, bundle).map(|()| Vec::new())
        }
    }

    /// [`PatchApplier::apply_reviewed`], but the step's commits go onto a new branch
    /// `branch` of the host's repository and nothing else is applied (`accept --branch`).
    /// The default cannot and refuses.
    fn apply_reviewed_onto_branch(
        &self,
        root_dir: &Path,
        bundle: &InspectedBundle,
        digest: &str,
        branch: &str,
    ) -> Result<(), ErrorReport> {
        let _ = (root_dir, bundle, digest, branch);
        Err(ErrorReport::new(
            ErrorCode::InvalidInput,
            "this patch applier cannot put commits on a branch",
        ))
    }

    /// [`PatchApplier::apply`], writing text conflicts with conflict markers instead of
    /// refusing them (on request, to resolve a conflicted review by hand). Returns the paths
    /// written with markers. The default cannot write markers and refuses.
    fn apply_marking_conflicts(
        &self,
        root_dir: &Path,
        bundle: &InspectedBundle,
    ) -> Result<Vec<String>, ErrorReport> {
        let _ = (root_dir, bundle);
        Err(ErrorReport::new(
            ErrorCode::InvalidInput,
            "this patch applier cannot write conflict markers",
        ))
    }

    /// Describes each file a bundle's patches touch, for the review record. The default reads
    /// the git headers of the patch files (`diff --git`, `new file mode`, `deleted file
    /// mode`, `index <base>..<new>`).
    fn describe(&self, bundle: &InspectedBundle) -> Result<Vec<PatchRecord>, ErrorReport> {
        let mut out = Vec::new();
        for rel in &bundle.patch_files {
            let text = read_patch(&bundle.bundle_path, rel)?;
            out.extend(describe_patch_text(&text, rel));
        }
        Ok(out)
    }
}

/// Applies a bundle's working-tree patches (`apply`) and, when the step made commits, adds
/// them to the host's repository: refused before anything is written when the host's HEAD
/// is no longer the series' base; the objects added (git-checked) before the files, the
/// branch moved after them.
fn with_commits<T>(
    root_dir: &Path,
    bundle_path: &Path,
    commits: Option<&smithers_bundle::CommitSeries>,
    texts: &[String],
    series_patch: Option<&[u8]>,
    apply: impl FnOnce() -> Result<T, ErrorReport>,
) -> Result<T, ErrorReport> {
    let Some(series) = commits else {
        return apply();
    };
    let refused = |e: String| {
        ErrorReport::new(
            ErrorCode::ToolPatchFailed,
            format!("the step's commits cannot be added: {e}"),
        )
        .with_details(serde_json::json!({ "base": series.base, "tip": series.tip }))
    };
    smithers_git::check(root_dir, series).map_err(refused)?;
    smithers_git::fetch(root_dir, series, &smithers_git::bundle_file(bundle_path))
        .map_err(refused)?;
    // Nothing the review did not show: the series' tip must leave every file it changes as
    // the patches about to be applied leave it (checked again here, not only at collect: the
    // bundle may come from a remote host).
    let tip_differs: Vec<Vec<u8>> = series
        .tip_differs
        .iter()
        .map(|p| smithers_patch::path_to_bytes(p).unwrap_or_else(|| p.as_bytes().to_vec()))
        .collect();
    smithers_git::verify_against_review(
        root_dir,
        series,
        &reviewed_files(texts)?,
        &tip_differs,
        series_patch,
    )
    .map_err(refused)?;
    let applied = apply()?;
    smithers_git::advance(root_dir, series, "smithers-sandbox: accept the step's commits")
        .map_err(|e| {
            ErrorReport::new(
                ErrorCode::ToolPatchFailed,
                format!(
                    "the step's files were applied, but its commits were not put on the branch: {e}; `git update-ref HEAD {} {}` then `git reset -q` does it by hand",
                    series.tip, series.base
                ),
            )
        })?;
    Ok(applied)
}

/// The reviewed files the step staged (`changeNotes.staged`), refused before anything is
/// written when one is not among the reviewed patches' files.
fn staged_files(
    staged: &[String],
    texts: &[String],
) -> Result<Vec<smithers_git::ReviewedFile>, ErrorReport> {
    if staged.is_empty() {
        return Ok(Vec::new());
    }
    let reviewed = reviewed_files(texts)?;
    staged
        .iter()
        .map(|p| {
            let raw = smithers_patch::path_to_bytes(p).unwrap_or_else(|| p.as_bytes().to_vec());
            reviewed
                .iter()
                .rev()
                .find(|f| f.path == raw)
                .cloned()
                .ok_or_else(|| {
                    ErrorReport::new(
                        ErrorCode::ToolPatchFailed,
                        format!("the bundle stages {p:?}, which its patches do not change; nothing was applied"),
                    )
                })
        })
        .collect()
}

/// Every file `texts` (git-format patches) change, and how they leave it.
fn reviewed_files(texts: &[String]) -> Result<Vec<smithers_git::ReviewedFile>, ErrorReport> {
    use smithers_errors::CodedError;
    let mut out = Vec::new();
    for text in texts {
        for fp in smithers_patch::parse_patch(text).map_err(|e| e.report())? {
            out.push(smithers_git::ReviewedFile {
                path: fp.path_bytes(),
                state: match fp.new_mode {
                    Some(mode) => smithers_git::ReviewedState::Present {
                        mode: mode.as_str().to_string(),
                        oid: fp.new_oid.clone(),
                    },
                    None => smithers_git::ReviewedState::Absent,
                },
            });
        }
    }
    Ok(out)
}

/// The real applier: `smithers_patch::apply_patch_texts`, all or nothing, confined to the
/// root (no `..`, no symlinks, never into `.git/` or `.smithers/`), conflict-checked against
/// the base blob ids the patches carry, journaled so a crash mid-apply is rolled back or
/// forward by the next apply.
#[derive(Debug, Default, Clone, Copy)]
pub struct AtomicPatchApplier;

impl AtomicPatchApplier {
    /// The patch texts of a bundle: its patch files, or (only when it has none) the `diff`
    /// texts of its `diffBundle`.
    fn texts(bundle: &InspectedBundle) -> Result<Vec<String>, ErrorReport> {
        if !bundle.patch_files.is_empty() {
            return bundle
                .patch_files
                .iter()
                .map(|rel| {
                    let path = bundle.bundle_path.join(rel);
                    let bytes = std::fs::read(&path).map_err(|e| {
                        ErrorReport::new(
                            ErrorCode::ToolPatchFailed,
                            format!("cannot read patch file {}: {e}", path.display()),
                        )
                    })?;
                    // Never apply a lossily decoded patch: it would write altered bytes.
                    String::from_utf8(bytes).map_err(|_| {
                        ErrorReport::new(
                            ErrorCode::ToolPatchFailed,
                            format!("patch file {rel} is not valid UTF-8"),
                        )
                        .with_details(serde_json::json!({ "path": rel }))
                    })
                })
                .collect();
        }
        let entries = bundle
            .diff_bundle
            .as_ref()
            .and_then(|d| d.get("patches"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        entries
            .iter()
            .map(|p| {
                if p.get("binaryContent").is_some() {
                    return Err(ErrorReport::new(
                        ErrorCode::ToolPatchFailed,
                        "diffBundle entries with binaryContent cannot be applied; ship patch files",
                    ));
                }
                p.get("diff")
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .ok_or_else(|| {
                        ErrorReport::new(ErrorCode::InvalidInput, "diffBundle entry without diff")
                    })
            })
            .collect()
    }
}

/// The error of a bundle that is not the reviewed one.
fn changed_since_review(recorded: &str, found: &str) -> ErrorReport {
    ErrorReport::new(
        ErrorCode::ToolPatchFailed,
        "the bundle changed since it was reviewed; nothing was applied",
    )
    .with_details(serde_json::json!({ "recordedDigest": recorded, "foundDigest": found }))
}

impl AtomicPatchApplier {
    /// Applies patch texts all or nothing (`smithers_patch::apply_patch_texts`); the paths
    /// written with conflict markers (only with `conflict_markers`).
    fn apply_texts(
        root_dir: &Path,
        texts: &[String],
        host_changed: std::collections::BTreeSet<String>,
        conflict_markers: bool,
    ) -> Result<Vec<String>, ErrorReport> {
        use smithers_errors::CodedError;
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let opts = smithers_patch::ApplyOptions {
            host_changed,
            conflict_markers,
            ..Default::default()
        };
        smithers_patch::apply_patch_texts(root_dir, &refs, &opts)
            .map(|r| {
                r.applied
                    .into_iter()
                    .filter(|a| a.conflict_markers)
                    .map(|a| a.path)
                    .collect()
            })
            .map_err(|e| e.report())
    }

    /// The patch texts and host-changed paths from bytes read once: the patch files, or
    /// (only when there are none) the `diffBundle` of that README.md.
    fn reviewed_texts(
        bytes: &BundleBytes,
    ) -> Result<(Vec<String>, std::collections::BTreeSet<String>), ErrorReport> {
        use smithers_errors::CodedError;
        let notes = smithers_bundle::parse_change_notes(&bytes.readme).map_err(|e| e.report())?;
        let host_changed = notes.host_changed.into_iter().collect();
        let texts = if bytes.patches.is_empty() {
            let manifest =
                smithers_bundle::parse_manifest(&bytes.readme).map_err(|e| e.report())?;
            let as_bundle = InspectedBundle {
                bundle_path: PathBuf::new(),
                status: String::new(),
                outputs: None,
                run_id: None,
                bundle_size_bytes: 0,
                patch_files: Vec::new(),
                diff_bundle: manifest.diff_bundle,
                change_notes: Default::default(),
            };
            Self::texts(&as_bundle)?
        } else {
            bytes
                .patches
                .iter()
                .map(|(rel, b)| {
                    // Never apply a lossily decoded patch: it would write altered bytes.
                    String::from_utf8(b.clone()).map_err(|_| {
                        ErrorReport::new(
                            ErrorCode::ToolPatchFailed,
                            format!("patch file {rel} is not valid UTF-8"),
                        )
                        .with_details(serde_json::json!({ "path": rel }))
                    })
                })
                .collect::<Result<_, _>>()?
        };
        Ok((texts, host_changed))
    }
}

impl PatchApplier for AtomicPatchApplier {
    fn apply_reviewed(
        &self,
        root_dir: &Path,
        bundle: &InspectedBundle,
        digest: &str,
        conflict_markers: bool,
    ) -> Result<Vec<String>, ErrorReport> {
        let bytes = BundleBytes::read_reviewed(bundle, digest)?;
        let (texts, host_changed) = Self::reviewed_texts(&bytes)?;
        // The commits are those of the reviewed README.md (its digest was just checked);
        // their objects are named by id, so the git bundle file needs no digest of its own.
        let notes = smithers_bundle::parse_change_notes(&bytes.readme).unwrap_or_default();
        let staged = staged_files(&notes.staged, &texts)?;
        let marked = with_commits(
            root_dir,
            &bundle.bundle_path,
            notes.commits.as_ref(),
            &texts,
            bytes.series_patch.as_deref(),
            || Self::apply_texts(root_dir, &texts, host_changed, conflict_markers),
        )?;
        // A file written with conflict markers is not what the step staged.
        let staged: Vec<_> = staged
            .into_iter()
            .filter(|f| !marked.iter().any(|m| m.as_bytes() == f.path.as_slice()))
            .collect();
        smithers_git::stage(root_dir, &staged).map_err(|e| {
            ErrorReport::new(
                ErrorCode::ToolPatchFailed,
                format!("the step's files were applied, but what it staged was not staged: {e}"),
            )
        })?;
        Ok(marked)
    }

    fn apply_reviewed_onto_branch(
        &self,
        root_dir: &Path,
        bundle: &InspectedBundle,
        digest: &str,
        branch: &str,
    ) -> Result<(), ErrorReport> {
        let bytes = BundleBytes::read_reviewed(bundle, digest)?;
        let refused = |e: String| {
            ErrorReport::new(
                ErrorCode::InvalidInput,
                format!("the step's commits cannot go onto branch {branch}: {e}"),
            )
        };
        let Some(series) = smithers_bundle::parse_change_notes(&bytes.readme)
            .ok()
            .and_then(|n| n.commits)
        else {
            return Err(refused(
                "the step made no commits (accept without --branch applies its files)".into(),
            ));
        };
        // What the reviewed patches change (from the bytes whose digest was just checked),
        // each file with its mode and blob after.
        let (texts, _) = Self::reviewed_texts(&bytes)?;
        let files = reviewed_files(&texts)?;
        smithers_git::onto_branch(
            root_dir,
            &series,
            &smithers_git::bundle_file(&bundle.bundle_path),
            branch,
            &files,
        )
        .map_err(refused)
    }

    fn apply(&self, root_dir: &Path, bundle: &InspectedBundle) -> Result<(), ErrorReport> {
        let host_changed = bundle.change_notes.host_changed.iter().cloned().collect();
        let texts = Self::texts(bundle)?;
        let series_patch = BundleBytes::read(bundle)?.series_patch;
        with_commits(
            root_dir,
            &bundle.bundle_path,
            bundle.change_notes.commits.as_ref(),
            &texts,
            series_patch.as_deref(),
            || Self::apply_texts(root_dir, &texts, host_changed, false),
        )
        .map(|_| ())
    }

    fn apply_marking_conflicts(
        &self,
        root_dir: &Path,
        bundle: &InspectedBundle,
    ) -> Result<Vec<String>, ErrorReport> {
        let host_changed = bundle.change_notes.host_changed.iter().cloned().collect();
        Self::apply_texts(root_dir, &Self::texts(bundle)?, host_changed, true)
    }

    fn describe(&self, bundle: &InspectedBundle) -> Result<Vec<PatchRecord>, ErrorReport> {
        use smithers_errors::CodedError;
        let mut out = Vec::new();
        for rel in &bundle.patch_files {
            let text = read_patch(&bundle.bundle_path, rel)?;
            for fp in smithers_patch::parse_patch(&text).map_err(|e| e.report())? {
                out.push(PatchRecord {
                    operation: match fp.operation() {
                        smithers_patch::Operation::Add => PatchOperation::Add,
                        smithers_patch::Operation::Modify => PatchOperation::Modify,
                        smithers_patch::Operation::Delete => PatchOperation::Delete,
                    },
                    path: fp.path,
                    base_hash: fp.old_oid,
                    new_hash: fp.new_oid,
                    patch_path: rel.clone(),
                });
            }
        }
        Ok(out)
    }
}

/// Per-file records from one git-format (or plain unified) patch file.
pub fn describe_patch_text(text: &str, patch_path: &str) -> Vec<PatchRecord> {
    let mut out: Vec<PatchRecord> = Vec::new();
    let mut current: Option<PatchRecord> = None;
    let mut in_hunk = false;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("diff --git ") {
            out.extend(current.take());
            in_hunk = false;
            current = Some(PatchRecord {
                path: git_header_path(rest),
                operation: PatchOperation::Modify,
                base_hash: None,
                new_hash: None,
                patch_path: patch_path.to_string(),
            });
            continue;
        }
        if line.starts_with("@@") {
            in_hunk = true;
            continue;
        }
        if in_hunk {
            continue;
        }
        if line.starts_with("--- ") && current.is_none() {
            // A plain unified diff without a git header.
            current = Some(PatchRecord {
                path: String::new(),
                operation: PatchOperation::Modify,
                base_hash: None,
                new_hash: None,
                patch_path: patch_path.to_string(),
            });
        }
        let Some(rec) = current.as_mut() else {
            continue;
        };
        if line.starts_with("new file mode") {
            rec.operation = PatchOperation::Add;
        } else if line.starts_with("deleted file mode") {
            rec.operation = PatchOperation::Delete;
        } else if let Some(rest) = line.strip_prefix("index ") {
            let range = rest.split_whitespace().next().unwrap_or("");
            if let Some((base, new)) = range.split_once("..") {
                // An all-zero object id means "no such file" (add: no base, delete: no new).
                rec.base_hash = (!base.chars().all(|c| c == '0')).then(|| base.to_string());
                rec.new_hash = (!new.chars().all(|c| c == '0')).then(|| new.to_string());
            }
        } else if let Some(p) = line.strip_prefix("+++ ") {
            if p.trim() == "/dev/null" {
                rec.operation = PatchOperation::Delete;
            } else if rec.path.is_empty() {
                rec.path = strip_prefix_dir(unquote(p.trim()));
            }
        } else if let Some(p) = line.strip_prefix("--- ") {
            if p.trim() == "/dev/null" {
                rec.operation = PatchOperation::Add;
            } else if rec.path.is_empty() {
                rec.path = strip_prefix_dir(unquote(p.trim()));
            }
        }
    }
    out.extend(current);
    out
}

/// The `b/` path of `diff --git a/x b/x` (quoted forms unquoted).
fn git_header_path(rest: &str) -> String {
    let rest = rest.trim();
    if let Some(idx) = rest.rfind(" b/").or_else(|| rest.rfind(" \"b/")) {
        return strip_prefix_dir(unquote(rest[idx + 1..].trim()));
    }
    String::new()
}

fn unquote(s: &str) -> &str {
    s.strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(s)
}

fn strip_prefix_dir(p: &str) -> String {
    p.strip_prefix("a/")
        .or_else(|| p.strip_prefix("b/"))
        .unwrap_or(p)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_like_javascript() {
        let diff = "--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n-old\n+new\n context\n+added\n";
        assert_eq!(diff_line_count(diff), 3);
        assert_eq!(diff_line_count(""), 0);
    }

    #[test]
    fn describes_git_patches_per_file() {
        let text = "diff --git a/src/a.rs b/src/a.rs\nindex 1111111..2222222 100644\n--- a/src/a.rs\n+++ b/src/a.rs\n@@ -1 +1 @@\n-a\n+b\n\
diff --git a/new.txt b/new.txt\nnew file mode 100644\nindex 0000000..3333333\n--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1 @@\n+hi\n\
diff --git a/gone.txt b/gone.txt\ndeleted file mode 100644\nindex 4444444..0000000\n--- a/gone.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-bye\n";
        let recs = describe_patch_text(text, "patches/0001.patch");
        assert_eq!(recs.len(), 3);
        assert_eq!(recs[0].path, "src/a.rs");
        assert_eq!(recs[0].operation, PatchOperation::Modify);
        assert_eq!(recs[0].base_hash.as_deref(), Some("1111111"));
        assert_eq!(recs[0].new_hash.as_deref(), Some("2222222"));
        assert_eq!(recs[1].path, "new.txt");
        assert_eq!(recs[1].operation, PatchOperation::Add);
        assert_eq!(recs[1].base_hash, None);
        assert_eq!(recs[2].operation, PatchOperation::Delete);
        assert_eq!(recs[2].new_hash, None);
        assert_eq!(recs[2].base_hash.as_deref(), Some("4444444"));
    }

    #[test]
    fn describes_plain_unified_diffs() {
        let recs = describe_patch_text("--- a/x.txt\n+++ b/x.txt\n@@ -1 +1 @@\n-a\n+b\n", "p");
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].path, "x.txt");
    }
}
