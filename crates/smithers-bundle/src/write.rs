//! Writing a bundle (spec §2, "Writing"): validate everything, then write the files, the
//! log, and README.md last, atomically.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::bounds::check_output_bounds;
use crate::error::BundleError;
use crate::js_json::{to_string_pretty, utf16_len, utf16_len_exceeds};
use crate::limits::{
    Limit, SANDBOX_BUNDLE_PATH_MAX_LENGTH, SANDBOX_BUNDLE_RUN_ID_MAX_LENGTH,
    SANDBOX_MAX_BUNDLE_BYTES, SANDBOX_MAX_PATCH_FILES, SANDBOX_MAX_README_BYTES,
};
use crate::manifest::{BundleStatus, ChangeNotes, DiffBundle};
use crate::validate::assert_patch_path_safe;
use smithers_paths::{resolve, Beneath, PathError};

/// A file to put in the bundle: a bundle-relative (or absolute, inside the bundle) path and
/// its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleFile {
    /// Where, e.g. `patches/0001.patch` or `artifacts/report.txt`.
    pub path: String,
    /// What.
    pub content: Vec<u8>,
}

impl BundleFile {
    /// A file from a path and text or bytes.
    pub fn new(path: impl Into<String>, content: impl Into<Vec<u8>>) -> Self {
        BundleFile {
            path: path.into(),
            content: content.into(),
        }
    }
}

/// The parameters of [`write_bundle`], mirroring JS `writeSandboxBundle`.
#[derive(Debug, Clone, PartialEq)]
pub struct WriteParams {
    /// The bundle directory (created if absent).
    pub bundle_path: PathBuf,
    /// The outputs; `None` omits the `outputs` key, `Some(Value::Null)` writes `null`.
    pub output: Option<Value>,
    /// The step's status.
    pub status: BundleStatus,
    /// The run id; `None` omits the key.
    pub run_id: Option<String>,
    /// Patch files; each must resolve strictly inside `patches/`.
    pub patches: Vec<BundleFile>,
    /// Artifact files; each must resolve inside the bundle.
    pub artifacts: Vec<BundleFile>,
    /// A host file copied to `logs/stream.ndjson`; a missing file gives an empty log (as JS).
    pub stream_log_path: Option<PathBuf>,
    /// Kept in the manifest only if README.md then fits [`SANDBOX_MAX_README_BYTES`].
    pub diff_bundle: Option<DiffBundle>,
    /// README.md's `changeNotes`, written only when not empty.
    pub change_notes: ChangeNotes,
}

impl WriteParams {
    /// Minimal parameters: a directory and a status, nothing else.
    pub fn new(bundle_path: impl Into<PathBuf>, status: BundleStatus) -> Self {
        WriteParams {
            bundle_path: bundle_path.into(),
            output: None,
            status,
            run_id: None,
            patches: Vec::new(),
            artifacts: Vec::new(),
            stream_log_path: None,
            diff_bundle: None,
            change_notes: ChangeNotes::default(),
        }
    }

    /// Parses the JSON form the JavaScript `writeSandboxBundle` takes (minus `bundlePath`):
    /// `{output?, status, runId?, patches?: [{path, content}], artifacts?: [...],
    /// streamLogPath?, diffBundle?}`. `content` is a UTF-8 string. Type errors use the JS
    /// messages (`runId must be a string.`) and the JS order of checks; unknown keys are
    /// ignored, as in JS. Unlike JS, `status` is checked here, `runId: null` is treated as
    /// absent, and a malformed `diffBundle` is rejected.
    pub fn from_js_spec(
        bundle_path: impl Into<PathBuf>,
        spec: &Value,
    ) -> Result<Self, BundleError> {
        let bundle_path = bundle_path.into();
        let spec_err = |field: &str, message: String| BundleError::SpecInvalid {
            field: field.to_string(),
            message,
        };
        let Value::Object(spec) = spec else {
            return Err(spec_err("spec", "spec must be a JSON object.".into()));
        };
        check_len(
            "bundlePath",
            &bundle_path.to_string_lossy(),
            SANDBOX_BUNDLE_PATH_MAX_LENGTH,
            Limit::PathMaxLength,
        )?;
        let run_id = match spec.get("runId") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err(spec_err("runId", "runId must be a string.".into())),
        };
        if let Some(r) = &run_id {
            check_len(
                "runId",
                r,
                SANDBOX_BUNDLE_RUN_ID_MAX_LENGTH,
                Limit::RunIdMaxLength,
            )?;
        }
        let patches = spec_array(spec, "patches")?;
        let artifacts = spec_array(spec, "artifacts")?;
        let output = spec.get("output").cloned();
        if let Some(o) = &output {
            check_output_bounds("output", o)?;
        }
        let patches = spec_files(patches, "patch")?;
        let artifacts = spec_files(artifacts, "artifact")?;
        let status = match spec.get("status") {
            Some(Value::String(s)) => BundleStatus::parse(s),
            _ => None,
        }
        .ok_or_else(|| {
            spec_err(
                "status",
                "status must be one of: finished | failed | cancelled.".into(),
            )
        })?;
        let stream_log_path = match spec.get("streamLogPath") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.is_empty() => None,
            Some(Value::String(s)) => Some(PathBuf::from(s)),
            Some(_) => {
                return Err(spec_err(
                    "streamLogPath",
                    "streamLogPath must be a string.".into(),
                ))
            }
        };
        let diff_bundle = match spec.get("diffBundle") {
            None | Some(Value::Null) => None,
            Some(v) => Some(DiffBundle::deserialize(v).map_err(|e| {
                spec_err(
                    "diffBundle",
                    format!("diffBundle must be {{seq, baseRef, patches: [{{path, operation, diff, binaryContent?}}]}}: {e}"),
                )
            })?),
        };
        Ok(WriteParams {
            bundle_path,
            output,
            status,
            run_id,
            patches,
            artifacts,
            stream_log_path,
            diff_bundle,
            change_notes: ChangeNotes::default(),
        })
    }
}

fn spec_array<'a>(
    spec: &'a Map<String, Value>,
    field: &'static str,
) -> Result<&'a [Value], BundleError> {
    match spec.get(field) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(items)) => {
            check_count(field, items.len())?;
            Ok(items)
        }
        Some(_) => Err(BundleError::SpecInvalid {
            field: field.to_string(),
            message: format!("{field} must be an array."),
        }),
    }
}

fn spec_files(items: &[Value], what: &'static str) -> Result<Vec<BundleFile>, BundleError> {
    let err = |field: String, message: String| BundleError::SpecInvalid { field, message };
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let Value::Object(obj) = item else {
            return Err(err(
                what.into(),
                format!("{what} must be an object with path and content."),
            ));
        };
        // A missing path becomes "" and fails later with TOOL_PATH_INVALID, as in JS.
        let path = match obj.get("path") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(_) => {
                return Err(err(
                    format!("{what}.path"),
                    format!("{what}.path must be a string."),
                ))
            }
        };
        let content = match obj.get("content") {
            Some(Value::String(s)) => s.clone().into_bytes(),
            _ => {
                return Err(err(
                    format!("{what}.content"),
                    format!("{what}.content must be a string."),
                ))
            }
        };
        out.push(BundleFile { path, content });
    }
    Ok(out)
}

fn check_len(field: &'static str, s: &str, max: usize, limit: Limit) -> Result<(), BundleError> {
    if utf16_len_exceeds(s, max) {
        return Err(BundleError::FieldTooLong {
            field,
            limit,
            max,
            actual: utf16_len(s),
        });
    }
    Ok(())
}

fn check_count(field: &'static str, n: usize) -> Result<(), BundleError> {
    if n > SANDBOX_MAX_PATCH_FILES {
        return Err(BundleError::TooManyEntries {
            field,
            max: SANDBOX_MAX_PATCH_FILES,
            actual: n,
        });
    }
    Ok(())
}

/// What [`write_bundle`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenBundle {
    /// The bundle directory.
    pub bundle_path: PathBuf,
    /// Size of README.md.
    pub readme_bytes: u64,
    /// Total bytes written (README, patches, artifacts, log).
    pub total_bytes: u64,
    /// Whether the diff bundle made it into the manifest (false when absent or too big).
    pub diff_bundle_included: bool,
}

/// The manifest JSON value, keys in the JS order `outputs, status, runId, patches,
/// diffBundle`, absent ones omitted.
fn manifest_value(params: &WriteParams, with_diff: bool) -> Value {
    let mut m = Map::new();
    if let Some(o) = &params.output {
        m.insert("outputs".into(), o.clone());
    }
    m.insert("status".into(), params.status.as_str().into());
    if let Some(r) = &params.run_id {
        m.insert("runId".into(), r.clone().into());
    }
    m.insert(
        "patches".into(),
        params
            .patches
            .iter()
            .map(|p| Value::from(p.path.clone()))
            .collect::<Vec<_>>()
            .into(),
    );
    if !params.change_notes.is_empty() {
        m.insert(
            "changeNotes".into(),
            serde_json::to_value(&params.change_notes).unwrap_or(Value::Null),
        );
    }
    if with_diff {
        if let Some(d) = &params.diff_bundle {
            m.insert(
                "diffBundle".into(),
                serde_json::to_value(d).unwrap_or(Value::Null),
            );
        }
    }
    Value::Object(m)
}

/// Writes a bundle. Every rule is checked before the first byte is written (JS order for the
/// checks JS has: bundlePath, runId, counts, output bounds, path lengths, estimated size; then
/// ours: README size, path confinement, conflicting targets); on failure nothing is written.
///
/// Then: directories `patches/`, `artifacts/`, `logs/`; patches; artifacts; the log; and
/// README.md last, via a temporary file, a sync and a rename, so a README.md on disk always
/// means a complete bundle whose files are durable. Files are created with `O_NOFOLLOW` after a symlink-aware
/// confinement check, so a reused directory with planted links cannot redirect a write. If an
/// I/O error happens during the write phase, a directory we created is removed again.
pub fn write_bundle(params: &WriteParams) -> Result<WrittenBundle, BundleError> {
    write_bundle_with(params, &WriteOptions::default())
}

/// How [`write_bundle_with`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteOptions {
    /// Make the files durable before README.md is renamed into place, so that after a host
    /// crash a README.md on disk still means a complete bundle (the rename itself becomes
    /// durable with the file system's next journal commit). Default: true. Up to [`PER_FILE_SYNC_MAX`] files each file and directory is
    /// fsync'd; a larger bundle uses one `syncfs`, which also flushes other dirty data of that
    /// file system and can take a while on a busy host. A caller that does not rely on bundles
    /// surviving a crash (tests, throughput runs) may turn durability off.
    pub durable: bool,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions { durable: true }
    }
}

/// [`write_bundle`] with explicit [`WriteOptions`].
pub fn write_bundle_with(
    params: &WriteParams,
    options: &WriteOptions,
) -> Result<WrittenBundle, BundleError> {
    let root = &params.bundle_path;
    check_len(
        "bundlePath",
        &root.to_string_lossy(),
        SANDBOX_BUNDLE_PATH_MAX_LENGTH,
        Limit::PathMaxLength,
    )?;
    if let Some(r) = &params.run_id {
        check_len(
            "runId",
            r,
            SANDBOX_BUNDLE_RUN_ID_MAX_LENGTH,
            Limit::RunIdMaxLength,
        )?;
    }
    check_count("patches", params.patches.len())?;
    check_count("artifacts", params.artifacts.len())?;
    if let Some(o) = &params.output {
        check_output_bounds("output", o)?;
    }
    for p in &params.patches {
        check_len(
            "patch.path",
            &p.path,
            SANDBOX_BUNDLE_PATH_MAX_LENGTH,
            Limit::PathMaxLength,
        )?;
    }
    for a in &params.artifacts {
        check_len(
            "artifact.path",
            &a.path,
            SANDBOX_BUNDLE_PATH_MAX_LENGTH,
            Limit::PathMaxLength,
        )?;
    }

    let mut diff_included = params.diff_bundle.is_some();
    let mut readme = to_string_pretty(&manifest_value(params, diff_included));
    if diff_included && readme.len() as u64 > SANDBOX_MAX_README_BYTES {
        // The patch files are the source of truth; the diff bundle is a convenience that
        // must not make the bundle invalid.
        diff_included = false;
        readme = to_string_pretty(&manifest_value(params, false));
    }

    let log_len = match &params.stream_log_path {
        None => None,
        Some(p) => match fs::metadata(p) {
            Ok(m) if m.is_file() => Some(m.len()),
            Ok(_) => return Err(BundleError::StreamLogNotFile { path: p.clone() }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Some(0),
            Err(e) => {
                return Err(BundleError::ReadBundle {
                    path: p.clone(),
                    source: e,
                })
            }
        },
    };

    let mut contributors: Vec<(String, u64)> = Vec::new();
    contributors.push(("README.md".into(), readme.len() as u64));
    for f in params.patches.iter().chain(&params.artifacts) {
        contributors.push((f.path.clone(), f.content.len() as u64));
    }
    if let Some(n) = log_len {
        contributors.push(("logs/stream.ndjson".into(), n));
    }
    let total: u64 = contributors.iter().map(|(_, n)| *n).sum();
    if total > SANDBOX_MAX_BUNDLE_BYTES {
        contributors.sort_by_key(|c| std::cmp::Reverse(c.1));
        contributors.truncate(5);
        return Err(BundleError::BundleTooLarge {
            actual: total,
            estimated: true,
            largest: contributors,
        });
    }
    if readme.len() as u64 > SANDBOX_MAX_README_BYTES {
        return Err(BundleError::ReadmeTooLarge {
            bundle_path: root.clone(),
            actual: readme.len() as u64,
        });
    }

    let targets = plan_targets(params)?;

    let existed = fs::symlink_metadata(root).is_ok();
    let result = write_files(params, &targets, &readme, log_len, options.durable);
    if result.is_err() && !existed {
        let _ = fs::remove_dir_all(root);
    }
    result?;
    Ok(WrittenBundle {
        bundle_path: root.clone(),
        readme_bytes: readme.len() as u64,
        total_bytes: total,
        diff_bundle_included: diff_included,
    })
}

/// Resolves every patch and artifact path, and refuses targets that would collide: the same
/// file twice, one entry inside another's path, the bundle itself, README.md, the layout
/// directories, or the log file when a log is copied.
fn plan_targets(params: &WriteParams) -> Result<Vec<PathBuf>, BundleError> {
    let root = &params.bundle_path;
    let path_err = |path: &str, source| BundleError::Path {
        path: path.to_string(),
        source,
    };
    let abs_root = resolve(root, ".").map_err(|e| path_err(".", e))?;
    let mut reserved: Vec<(PathBuf, &'static str)> = vec![
        (abs_root.clone(), "names the bundle directory"),
        (abs_root.join("README.md"), "README.md is the manifest"),
        (abs_root.join("patches"), "names a bundle layout directory"),
        (
            abs_root.join("artifacts"),
            "names a bundle layout directory",
        ),
        (abs_root.join("logs"), "names a bundle layout directory"),
    ];
    if params.stream_log_path.is_some() {
        reserved.push((abs_root.join("logs/stream.ndjson"), "is the stream log"));
    }
    let mut targets = Vec::with_capacity(params.patches.len() + params.artifacts.len());
    let mut by_target: Vec<(PathBuf, &str)> = Vec::with_capacity(targets.capacity());
    for p in &params.patches {
        let t = resolve(root, &p.path).map_err(|e| path_err(&p.path, e))?;
        assert_patch_path_safe(root, &p.path)?;
        by_target.push((t.clone(), &p.path));
        targets.push(t);
    }
    for a in &params.artifacts {
        let t = resolve(root, &a.path).map_err(|e| path_err(&a.path, e))?;
        by_target.push((t.clone(), &a.path));
        targets.push(t);
    }
    for (t, given) in &by_target {
        if let Some((_, reason)) = reserved.iter().find(|(r, _)| r == t) {
            return Err(BundleError::WriteTargetConflict {
                path: given.to_string(),
                reason,
            });
        }
    }
    let mut seen = HashSet::with_capacity(by_target.len());
    for (t, given) in &by_target {
        if !seen.insert(t) {
            return Err(BundleError::WriteTargetConflict {
                path: given.to_string(),
                reason: "is written twice",
            });
        }
    }
    // Path's Ord is component-wise, so every path below X sorts right after X.
    by_target.sort_by(|a, b| a.0.cmp(&b.0));
    for pair in by_target.windows(2) {
        if pair[1].0.starts_with(&pair[0].0) {
            return Err(BundleError::WriteTargetConflict {
                path: pair[0].1.to_string(),
                reason: "is a directory of another entry",
            });
        }
    }
    Ok(targets)
}

/// The directories a bundle is written into, below its root.
const BUNDLE_DIRS: [&str; 3] = ["patches", "artifacts", "logs"];

/// Makes a bundle's directories ahead of its writing (a runtime does it while its step runs:
/// four `mkdir`s are ~0.25 ms of a short step's collect on ext4). The root is the caller's
/// (trusted), as in [`write_bundle`]; the rest is made through `Beneath`. Writing the bundle
/// later keeps them; [`holds_only_prepared_dirs`] tells them from an earlier bundle.
pub fn prepare_bundle_dirs(root: &Path) -> Result<(), BundleError> {
    let werr = |source| BundleError::WriteBundle {
        path: root.to_path_buf(),
        source,
    };
    // Anything there already that is not a real directory (a link the project tree brought,
    // say) is left alone, not followed: the bundle's writing replaces it.
    match fs::symlink_metadata(root) {
        Ok(meta) if !meta.is_dir() => return Ok(()),
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => fs::create_dir_all(root).map_err(werr)?,
        Err(e) => return Err(werr(e)),
    }
    let beneath = Beneath::open(root).map_err(|e| confined_err(".", e))?;
    for dir in BUNDLE_DIRS {
        beneath
            .create_dir_all(Path::new(dir), 0o755)
            .map_err(|e| confined_err(dir, e))?;
    }
    Ok(())
}

/// Whether `root` holds nothing but what [`prepare_bundle_dirs`] made: a real directory
/// whose entries are among the bundle's directories, each real and empty. Anything else
/// (a bundle, a partial one, a link) is not.
pub fn holds_only_prepared_dirs(root: &Path) -> bool {
    let real_dir = |p: &Path| fs::symlink_metadata(p).is_ok_and(|m| m.is_dir());
    // A link is not listed (read_dir would follow it).
    if !real_dir(root) {
        return false;
    }
    let Ok(entries) = fs::read_dir(root) else {
        return false;
    };
    for entry in entries {
        let Ok(entry) = entry else { return false };
        let name = entry.file_name();
        if !BUNDLE_DIRS.iter().any(|d| name == *d) {
            return false;
        }
        let path = entry.path();
        let empty = fs::read_dir(&path).is_ok_and(|mut d| d.next().is_none());
        if !real_dir(&path) || !empty {
            return false;
        }
    }
    true
}

/// Up to this many files a bundle is made durable file by file (fsync of each file and of
/// each directory that received one); beyond it, by one `syncfs`.
pub const PER_FILE_SYNC_MAX: usize = 64;

fn write_files(
    params: &WriteParams,
    targets: &[PathBuf],
    readme: &str,
    log_len: Option<u64>,
    durable: bool,
) -> Result<(), BundleError> {
    let root = &params.bundle_path;
    let werr = |path: &Path, source: io::Error| BundleError::WriteBundle {
        path: path.to_path_buf(),
        source,
    };
    // The bundle directory itself is the caller's (trusted); everything below it is created
    // through `Beneath`, so a link planted in a reused directory cannot redirect a write.
    fs::create_dir_all(root).map_err(|e| werr(root, e))?;
    let abs_root = resolve(root, ".").map_err(|e| confined_err(".", e))?;
    let beneath = Beneath::open(root).map_err(|e| confined_err(".", e))?;
    // An old README.md would mark a half-rewritten directory as complete.
    remove_if_present(&beneath, Path::new("README.md"))?;
    for dir in BUNDLE_DIRS {
        beneath
            .create_dir_all(Path::new(dir), 0o755)
            .map_err(|e| confined_err(dir, e))?;
    }
    // How durability is reached: a small bundle (the common case) fsyncs its own files and
    // directories; a large one makes a single syncfs, which is far cheaper than thousands of
    // fsyncs but also flushes every other process's dirty data on the file system (a build
    // writing next to us made one small bundle wait for hundreds of megabytes).
    let file_count = targets.len() + usize::from(log_len.is_some()) + 1;
    let per_file_sync = durable && file_count <= PER_FILE_SYNC_MAX;
    // One file per directory that received entries, to fsync that directory afterwards.
    let mut synced_dirs: std::collections::BTreeMap<PathBuf, PathBuf> = Default::default();
    // Files written, kept open to be fsync'd together once everything is written.
    let mut unsynced: Vec<(File, PathBuf)> = Vec::new();
    let mut finish_file = |out: File, rel: &Path| {
        if per_file_sync {
            let parent = rel.parent().unwrap_or(Path::new("")).to_path_buf();
            synced_dirs
                .entry(parent)
                .or_insert_with(|| rel.to_path_buf());
            unsynced.push((out, rel.to_path_buf()));
        }
    };
    let files = params.patches.iter().chain(&params.artifacts);
    for (file, target) in files.zip(targets) {
        let rel = target.strip_prefix(&abs_root).unwrap_or(target);
        let mut out = create_beneath(&beneath, rel)?;
        out.write_all(&file.content).map_err(|e| werr(target, e))?;
        finish_file(out, rel);
    }
    if let (Some(src), Some(len)) = (&params.stream_log_path, log_len) {
        let rel = Path::new("logs/stream.ndjson");
        let mut out = create_beneath(&beneath, rel)?;
        match File::open(src) {
            // Copy at most what was estimated: a log still growing cannot push the bundle
            // past the limit checked above.
            Ok(f) => {
                io::copy(&mut f.take(len), &mut out).map_err(|e| werr(src, e))?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(werr(src, e)),
        }
        finish_file(out, rel);
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let tmp_name = PathBuf::from(format!(".README.md.{}.{nanos}.tmp", std::process::id()));
    let mut tmp = create_beneath(&beneath, &tmp_name)?;
    tmp.write_all(readme.as_bytes())
        .map_err(|e| werr(&root.join(&tmp_name), e))?;
    finish_file(tmp, &tmp_name);
    if per_file_sync {
        // The files, the directories holding the new entries, and the root holding the new
        // directories, before the rename publishes the bundle. Files first: on ext4 (journal
        // or not) a new file's fsync also writes its new parent directories, so the directory
        // fsyncs that follow find little left to do.
        synced_dirs
            .entry(PathBuf::new())
            .or_insert_with(|| PathBuf::from("patches"));
        let mut jobs: Vec<SyncJob> = Vec::new();
        for (file, rel) in unsynced {
            let path = root.join(&rel);
            jobs.push(Box::new(move || {
                file.sync_all().map_err(|e| werr(&path, e))
            }));
        }
        for any_entry in synced_dirs.values() {
            let dir = File::from(
                beneath
                    .open_parent(any_entry)
                    .map_err(|e| confined_err(any_entry, e))?,
            );
            let path = root.join(any_entry);
            jobs.push(Box::new(move || {
                dir.sync_all().map_err(|e| BundleError::WriteBundle {
                    path: path.parent().unwrap_or(&path).to_path_buf(),
                    source: e,
                })
            }));
        }
        run_concurrently(jobs)?;
    } else if durable {
        let dir = File::open(root).map_err(|e| werr(root, e))?;
        // One syncfs makes every file written above durable before the rename publishes the
        // bundle: measured here, 1000 small files cost ~8 s with an fsync each and well under
        // a second with one syncfs.
        rustix::fs::syncfs(&dir).map_err(|e| werr(root, e.into()))?;
    }
    // No fsync of the directory after the rename: what a crash may lose here is the
    // publication, never integrity (a README.md that survives means every file before it did).
    // The next journal commit of the file system makes the rename durable; the orchestrator's
    // store commit that records the bundle is one when the store is on the same file system,
    // and a bundle whose README.md was lost is refused by validation and recorded as failed.
    beneath
        .rename(&tmp_name, Path::new("README.md"))
        .map_err(|e| confined_err("README.md", e))?;
    Ok(())
}

type SyncJob = Box<dyn FnOnce() -> Result<(), BundleError> + Send + 'static>;

/// Threads kept for fsyncs, started at the first bundle that needs them and shared by every
/// bundle the process writes. Measured on this project's machines (ext4 without a journal,
/// virtio disk), the smallest bundle's four fsyncs: 0.93 ms in a row, 0.80 ms spread over
/// kept threads (the device merges the concurrent cache flushes), 1.2–1.5 ms over threads
/// started for the occasion.
const SYNC_THREADS: usize = 3;

type PoolJob = Box<dyn FnOnce() + Send + 'static>;

fn sync_pool() -> &'static std::sync::mpsc::Sender<PoolJob> {
    static POOL: std::sync::OnceLock<std::sync::mpsc::Sender<PoolJob>> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<PoolJob>();
        let rx = std::sync::Arc::new(std::sync::Mutex::new(rx));
        for i in 0..SYNC_THREADS {
            let rx = rx.clone();
            let _ = std::thread::Builder::new()
                .name(format!("bundle-sync-{i}"))
                .spawn(move || loop {
                    let job = match rx.lock() {
                        Ok(rx) => rx.recv(),
                        Err(_) => return,
                    };
                    match job {
                        Ok(job) => job(),
                        Err(_) => return,
                    }
                });
        }
        tx
    })
}

/// Starts the threads durable bundles are fsync'd on, ahead of the first bundle, which would
/// otherwise start them on its own critical path (three thread spawns): for a process that
/// knows it will write one, such as the CLI's `run`. Does nothing the second time.
pub fn start_sync_threads() {
    sync_pool();
}

/// Runs the first job on the calling thread and the others on the kept threads (a job the
/// pool cannot take runs here too); returns the first error.
fn run_concurrently(jobs: Vec<SyncJob>) -> Result<(), BundleError> {
    let mut jobs = jobs.into_iter();
    let Some(first) = jobs.next() else {
        return Ok(());
    };
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let mut queued = 0;
    let mut result = Ok(());
    for job in jobs {
        let done = done_tx.clone();
        let pool_job: PoolJob = Box::new(move || {
            let _ = done.send(job());
        });
        match sync_pool().send(pool_job).map_err(|e| e.0) {
            Ok(()) => queued += 1,
            // No pool: run it here (it reports through the channel like the others).
            Err(job) => {
                job();
                queued += 1;
            }
        }
    }
    drop(done_tx);
    if let Err(e) = first() {
        result = Err(e);
    }
    for _ in 0..queued {
        match done_rx.recv() {
            Ok(Err(e)) if result.is_ok() => result = Err(e),
            Ok(_) => {}
            // A job that panicked dropped its sender without a result.
            Err(_) => {
                if result.is_ok() {
                    result = Err(BundleError::WriteBundle {
                        path: PathBuf::new(),
                        source: io::Error::other("a bundle fsync panicked"),
                    });
                }
                break;
            }
        }
    }
    result
}

/// A `Beneath` failure: a symlink in the way (ELOOP, or EXDEV from RESOLVE_BENEATH) is the
/// escape it is (TOOL_PATH_ESCAPE); anything else keeps the path crate's code.
fn confined_err(path: impl AsRef<Path>, e: PathError) -> BundleError {
    let path = path.as_ref().to_string_lossy().into_owned();
    let source = match e.raw_os_error() {
        Some(libc::ELOOP) | Some(libc::EXDEV) => PathError::EscapeViaSymlink {
            path: path.clone(),
            root: String::new(),
        },
        _ => e,
    };
    BundleError::Path { path, source }
}

fn remove_if_present(beneath: &Beneath, rel: &Path) -> Result<(), BundleError> {
    match beneath.remove_file(rel) {
        Ok(()) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(confined_err(rel, e)),
    }
}

/// Creates `rel` (replacing a file already there) and its parents, beneath the root.
fn create_beneath(beneath: &Beneath, rel: &Path) -> Result<File, BundleError> {
    if let Some(parent) = rel.parent().filter(|p| !p.as_os_str().is_empty()) {
        beneath
            .create_dir_all(parent, 0o755)
            .map_err(|e| confined_err(rel, e))?;
    }
    remove_if_present(beneath, rel)?;
    beneath
        .create_new(rel, 0o644)
        .map_err(|e| confined_err(rel, e))
}
