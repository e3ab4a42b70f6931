//! The manifest (README.md) and validation result types, with the JavaScript field names.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// The step's own verdict, `status` in the manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BundleStatus {
    /// The step ran to completion.
    Finished,
    /// The step reported failure (its outputs are still returned).
    Failed,
    /// The step was cancelled.
    Cancelled,
}

impl BundleStatus {
    /// The manifest string.
    pub const fn as_str(self) -> &'static str {
        match self {
            BundleStatus::Finished => "finished",
            BundleStatus::Failed => "failed",
            BundleStatus::Cancelled => "cancelled",
        }
    }

    /// Parses a manifest string (exact, case-sensitive, as in JS).
    pub fn parse(s: &str) -> Option<BundleStatus> {
        match s {
            "finished" => Some(BundleStatus::Finished),
            "failed" => Some(BundleStatus::Failed),
            "cancelled" => Some(BundleStatus::Cancelled),
            _ => None,
        }
    }
}

/// Deserialises a key that is present (even as `null`) to `Some`, so that an absent key
/// (`None`, via `default`) and `null` (`Some(Value::Null)`) stay distinct, as in JS.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

/// The normalised manifest of a validated bundle (`SandboxBundleManifest`).
///
/// Absent keys are omitted when serialised, never `null`: `outputs` is `None` when the README
/// has no `outputs` key and `Some(Value::Null)` when it says `null`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// The step's outputs, any JSON.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub outputs: Option<Value>,
    /// The step's status.
    pub status: BundleStatus,
    /// The run id, kept only when the README has a string there.
    #[serde(rename = "runId", default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// Bundle-relative patch paths, kept only when the README has an array (non-strings dropped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patches: Option<Vec<String>>,
    /// The diff bundle as found (any object or array, as in JS); see [`Manifest::diff_bundle`].
    #[serde(
        rename = "diffBundle",
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub diff_bundle: Option<Value>,
}

impl Manifest {
    /// The diff bundle parsed into its typed form; `None` when absent, `Some(Err)` when it
    /// does not have the documented shape.
    pub fn diff_bundle(&self) -> Option<Result<DiffBundle, serde_json::Error>> {
        self.diff_bundle
            .as_ref()
            .map(|v| DiffBundle::deserialize(v.clone()))
    }
}

/// What a diff-bundle entry does to its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DiffOperation {
    /// A new file.
    Add,
    /// A changed file.
    Modify,
    /// A removed file.
    Delete,
}

/// One file of a [`DiffBundle`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiffPatch {
    /// Workspace-relative path of the file.
    pub path: String,
    /// What happens to it.
    pub operation: DiffOperation,
    /// The unified diff text.
    pub diff: String,
    /// Base64 content for binary files.
    #[serde(
        rename = "binaryContent",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub binary_content: Option<String>,
}

/// The 0.32 `diffBundle` (`SandboxDiffBundleLike`): for Smithers callers that apply one.
/// The patch files remain the source of truth.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiffBundle {
    /// Sequence number of the diff.
    pub seq: u64,
    /// The revision the diffs apply to.
    #[serde(rename = "baseRef")]
    pub base_ref: String,
    /// The file diffs.
    pub patches: Vec<DiffPatch>,
}

fn lossy_path<S: Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&p.to_string_lossy())
}

fn lossy_opt_path<S: Serializer>(p: &Option<PathBuf>, s: S) -> Result<S::Ok, S::Error> {
    match p {
        Some(p) => s.serialize_str(&p.to_string_lossy()),
        None => s.serialize_none(),
    }
}

/// Our own key of README.md, `changeNotes` (the JavaScript package ignores keys it does not
/// know): what a reviewer and `accept` must know beyond the patches. Written only when it has
/// something to say, so an ordinary bundle's README.md is byte-identical to the JavaScript
/// writer's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ChangeNotes {
    /// Paths the step changed whose host file changed too while the step ran: the base the
    /// step saw is lost, so their patch (made against the host's newer version) would undo
    /// the host's edit. `accept` refuses them as conflicts; they are not in the `diffBundle`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_changed: Vec<String>,
    /// Changes of the step that no patch carries, each with the reason (ignored by
    /// `.gitignore`, excluded, not representable, over a limit).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<LeftOut>,
    /// How many more left-out entries there were than `left_out` lists (it is capped at
    /// [`ChangeNotes::MAX_LISTED`] so that README.md stays small).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub left_out_unlisted: u64,
    /// Where the step's workspace layer (the overlay's upper directory, or the copy) is kept
    /// because changes of the step were left out for a size limit: the left-out files are
    /// there, so nothing is lost. It is the sandbox's own directory
    /// `<rootDir>/.smithers/sandboxes/<runId>/<sandboxId>/kept-layer`, removed when the review
    /// is accepted or rejected. Informational: what is removed is always that path derived
    /// from the ids, never this string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_layer: Option<String>,
    /// The commits the step made in the project's repository (`git commit` inside the
    /// sandbox), as a series on top of the host's HEAD: their objects are in the bundle's
    /// `git/commits.bundle` (a git bundle), and `accept` adds them to the host's repository
    /// and moves its branch to `tip`. The working-tree patches still carry the files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commits: Option<CommitSeries>,
    /// Paths whose change the step staged (`git add`, `git rm`) without committing, at
    /// exactly the content the patches leave: `accept` stages them as the step did, with the
    /// mode and blob of the reviewed patch (a path the patches do not change is refused).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub staged: Vec<String>,
}

/// Where a bundle keeps the objects of its [`CommitSeries`].
pub const COMMITS_BUNDLE_FILE: &str = "git/commits.bundle";

/// The step's commits (see [`ChangeNotes::commits`]). Object ids are git's (40 hex digits):
/// what accept adds is exactly what was reviewed, since an id names its content.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommitSeries {
    /// The branch the sandbox's HEAD was on (`main`), or `None` for a detached HEAD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// The host's HEAD commit the step started from; accept requires it still is.
    pub base: String,
    /// The sandbox's HEAD commit at the end of the step.
    pub tip: String,
    /// The commits from `base` (excluded) to `tip`, oldest first.
    pub commits: Vec<CommitInfo>,
    /// Files the series leaves at its tip otherwise than the working-tree patches do (the
    /// step committed them, then changed them again): HEAD and the index get the tip's
    /// version, which the bundle's [`SERIES_PATCH_FILE`] shows (base to tip, for these
    /// files only), and the working tree the patches'.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tip_differs: Vec<String>,
}

/// The diff from the series' base to its tip of [`CommitSeries::tip_differs`] (git's
/// `diff-tree -p --binary --full-index`), for the review; covered by the review's digest.
pub const SERIES_PATCH_FILE: &str = "git/series.patch";

/// The largest [`SERIES_PATCH_FILE`]: a larger diff leaves the series out.
pub const MAX_SERIES_PATCH_BYTES: u64 = 16 << 20;

/// One commit of a [`CommitSeries`] (texts bounded: see `smithers-git`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommitInfo {
    pub oid: String,
    pub parents: Vec<String>,
    pub author: String,
    pub author_email: String,
    /// ISO 8601, as the commit says.
    pub author_date: String,
    pub committer: String,
    pub committer_email: String,
    pub subject: String,
    /// The message after the subject line (cut at 4 KiB, said with a trailing note).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub body: String,
    /// Files changed against the first parent: (path, lines added, lines removed; `None`
    /// for a binary file).
    pub files: Vec<CommitFile>,
    /// How many more changed files than `files` lists.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub files_unlisted: u64,
}

/// A file a commit changed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommitFile {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub added: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removed: Option<u64>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl ChangeNotes {
    /// At most this many `left_out` (and `host_changed`) entries are listed.
    pub const MAX_LISTED: usize = 1000;

    /// Nothing to say.
    pub fn is_empty(&self) -> bool {
        self.host_changed.is_empty()
            && self.left_out.is_empty()
            && self.left_out_unlisted == 0
            && self.kept_layer.is_none()
            && self.commits.is_none()
    }

    /// Adds a left-out entry, counting it past [`ChangeNotes::MAX_LISTED`].
    pub fn leave_out(&mut self, path: impl Into<String>, reason: impl Into<String>) {
        if self.left_out.len() < Self::MAX_LISTED {
            self.left_out.push(LeftOut {
                path: path.into(),
                reason: reason.into(),
            });
        } else {
            self.left_out_unlisted += 1;
        }
    }
}

/// One change a bundle leaves out (a directory ends with `/`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeftOut {
    pub path: String,
    pub reason: String,
}

/// A bundle that passed validation (`ValidatedSandboxBundle`). Serialises with the JS field
/// names: `{manifest, bundleSizeBytes, patchFiles, logsPath, bundlePath}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ValidatedBundle {
    /// The normalised manifest.
    pub manifest: Manifest,
    /// Total size of the bundle's regular files, README.md included.
    #[serde(rename = "bundleSizeBytes")]
    pub bundle_size_bytes: u64,
    /// Bundle-relative POSIX paths of the files under `patches/` ending in `.patch`, sorted
    /// (byte order). The JavaScript package returns them in directory-walk order.
    #[serde(rename = "patchFiles")]
    pub patch_files: Vec<String>,
    /// Absolute path of `logs/stream.ndjson` when it is a regular file, else `null`.
    #[serde(rename = "logsPath", serialize_with = "lossy_opt_path")]
    pub logs_path: Option<PathBuf>,
    /// The bundle directory as given.
    #[serde(rename = "bundlePath", serialize_with = "lossy_path")]
    pub bundle_path: PathBuf,
    /// README.md's `changeNotes` (empty when absent). Not part of the JavaScript shape.
    #[serde(skip)]
    pub change_notes: ChangeNotes,
}

impl ValidatedBundle {
    /// The JSON value, with JS field names.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// The manifest's `patches` entries as bundle-relative POSIX paths, normalised lexically
    /// (`./patches/a.patch` and `<bundle>/patches/a.patch` both give `patches/a.patch`), so
    /// they compare with [`ValidatedBundle::patch_files`]. Validation guarantees every entry
    /// resolves inside `patches/`; an entry that somehow does not is left out.
    pub fn manifest_patch_files(&self) -> Vec<String> {
        let Ok(root) = smithers_paths::resolve(&self.bundle_path, ".") else {
            return Vec::new();
        };
        self.manifest
            .patches
            .iter()
            .flatten()
            .filter_map(|entry| {
                let resolved = smithers_paths::resolve(&root, entry).ok()?;
                let rel = resolved.strip_prefix(&root).ok()?;
                let parts: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                Some(parts.join("/"))
            })
            .collect()
    }
}
