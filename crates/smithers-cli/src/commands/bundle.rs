//! `smithers-sandbox bundle validate | write | show`.
//!
//! A bundle is written by an untrusted step: its run id, outputs, file names and diffBundle
//! fields are shown inert (`crate::output::{inert, name}`) in the human summaries.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::{json, Value};
use smithers_bundle::{js_json, validate_bundle, write_bundle, ValidatedBundle, WriteParams};
use smithers_errors::ErrorCode;

use crate::output::{coded_error, inert, name, Coded};

/// Arguments of `smithers-sandbox bundle`.
#[derive(Debug, Args)]
pub struct BundleArgs {
    #[command(subcommand)]
    command: BundleCommand,
}

#[derive(Debug, Subcommand)]
enum BundleCommand {
    /// Check a bundle directory against every rule of the bundle format.
    ///
    /// Prints the validated bundle (with --json: {manifest, bundleSizeBytes, patchFiles,
    /// logsPath, bundlePath}, as the JavaScript package returns it). Exits 0 when valid, 1 with
    /// the error ({code, message, details} under --json) when not.
    Validate {
        /// The bundle directory.
        dir: PathBuf,
    },
    /// Write a bundle from a JSON spec (the fields of JS writeSandboxBundle).
    ///
    /// Spec: {"output": <any JSON>, "status": "finished"|"failed"|"cancelled", "runId"?: "...",
    /// "patches"?: [{"path": "patches/0001.patch", "content": "..."}], "artifacts"?: [{"path",
    /// "content"}], "streamLogPath"?: "/host/log.ndjson", "diffBundle"?: {...}}. Everything is
    /// checked first; nothing is written when a rule fails. README.md is written last.
    Write {
        /// The bundle directory (created if absent).
        dir: PathBuf,
        /// The spec file, or `-` for standard input.
        #[arg(long)]
        spec: String,
    },
    /// Validate a bundle, then print a readable summary: status, run id, outputs preview,
    /// patches (size, +/- lines), artifacts, log lines.
    Show {
        /// The bundle directory.
        dir: PathBuf,
    },
}

/// Runs a `bundle` subcommand.
pub fn run(args: &BundleArgs, json: bool) -> anyhow::Result<ExitCode> {
    match &args.command {
        BundleCommand::Validate { dir } => validate(dir, json),
        BundleCommand::Write { dir, spec } => write(dir, spec, json),
        BundleCommand::Show { dir } => show(dir, json),
    }
}

fn validate(dir: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let bundle = validate_bundle(dir).coded()?;
    if json {
        println!("{}", js_json::to_string(&bundle.to_json()));
    } else {
        let m = &bundle.manifest;
        println!("valid bundle: {}", inert(&dir.display().to_string()));
        println!("  status: {}", m.status.as_str());
        if let Some(r) = &m.run_id {
            println!("  run id: {}", inert(r));
        }
        println!("  size: {} bytes", bundle.bundle_size_bytes);
        println!("  patch files: {}", bundle.patch_files.len());
        match &bundle.logs_path {
            Some(p) => println!("  log: {}", inert(&p.display().to_string())),
            None => println!("  log: none"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn write(dir: &Path, spec_arg: &str, json: bool) -> anyhow::Result<ExitCode> {
    let text = if spec_arg == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s).map_err(|e| {
            coded_error(
                ErrorCode::InvalidInput,
                format!("spec could not be read from standard input: {e}"),
                Value::Null,
            )
        })?;
        s
    } else {
        fs::read_to_string(spec_arg).map_err(|e| {
            coded_error(
                ErrorCode::InvalidInput,
                format!("spec could not be read: {spec_arg}: {e}"),
                json!({ "path": spec_arg }),
            )
        })?
    };
    let spec: Value = serde_json::from_str(&text).map_err(|e| {
        coded_error(
            ErrorCode::InvalidInput,
            format!("spec must be valid JSON: {e}"),
            json!({ "path": spec_arg }),
        )
    })?;
    let params = WriteParams::from_js_spec(dir, &spec).coded()?;
    let written = write_bundle(&params).coded()?;
    if json {
        println!(
            "{}",
            json!({
                "ok": true,
                "bundlePath": written.bundle_path.to_string_lossy(),
                "readmeBytes": written.readme_bytes,
                "totalBytes": written.total_bytes,
                "diffBundleIncluded": written.diff_bundle_included,
            })
        );
    } else {
        println!(
            "wrote bundle {} ({} bytes, {} patches, {} artifacts{})",
            inert(&written.bundle_path.display().to_string()),
            written.total_bytes,
            params.patches.len(),
            params.artifacts.len(),
            if params.diff_bundle.is_some() && !written.diff_bundle_included {
                "; diffBundle left out: README.md would exceed its limit"
            } else {
                ""
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Per-patch facts for `show`.
struct PatchInfo {
    path: String,
    bytes: u64,
    added: usize,
    removed: usize,
    listed: bool,
}

/// Lines starting `+`/`-` but not `+++`/`---` (the spec's totalDiffLines rule).
fn count_diff_lines(text: &str) -> (usize, usize) {
    let mut added = 0;
    let mut removed = 0;
    for line in text.lines() {
        if line.starts_with('+') && !line.starts_with("+++") {
            added += 1;
        } else if line.starts_with('-') && !line.starts_with("---") {
            removed += 1;
        }
    }
    (added, removed)
}

fn patch_infos(bundle: &ValidatedBundle) -> anyhow::Result<Vec<PatchInfo>> {
    let listed = bundle.manifest_patch_files();
    let mut out = Vec::new();
    for rel in &bundle.patch_files {
        let path = bundle.bundle_path.join(rel);
        let bytes =
            fs::read(&path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
        let (added, removed) = count_diff_lines(&String::from_utf8_lossy(&bytes));
        out.push(PatchInfo {
            path: rel.clone(),
            bytes: bytes.len() as u64,
            added,
            removed,
            listed: listed.contains(rel),
        });
    }
    Ok(out)
}

/// Regular files under `artifacts/`, relative, sorted, with sizes (metadata only).
fn artifact_list(root: &Path) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut pending = vec![(root.join("artifacts"), "artifacts".to_string())];
    while let Some((dir, rel)) = pending.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = format!("{rel}/{}", entry.file_name().to_string_lossy());
            match entry.file_type() {
                Ok(t) if t.is_dir() => pending.push((entry.path(), name)),
                Ok(t) if t.is_file() => {
                    out.push((name, entry.metadata().map(|m| m.len()).unwrap_or(0)))
                }
                _ => {}
            }
        }
    }
    out.sort();
    out
}

/// The start of a JSON value, inert (JSON leaves C1 and bidi characters raw).
fn preview(value: &Value, max: usize) -> String {
    let s = inert(&js_json::to_string(value));
    if s.chars().count() <= max {
        s
    } else {
        let cut: String = s.chars().take(max).collect();
        format!("{cut}… ({} bytes)", s.len())
    }
}

fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

const LIST_MAX: usize = 50;

fn show(dir: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let bundle = validate_bundle(dir).coded()?;
    let patches = patch_infos(&bundle)?;
    let artifacts = artifact_list(&bundle.bundle_path);
    let log_lines = match &bundle.logs_path {
        Some(p) => {
            Some(fs::read(p).map(|b| b.split(|c| *c == b'\n').filter(|l| !l.is_empty()).count())?)
        }
        None => None,
    };
    if json {
        let out = json!({
            "bundle": bundle.to_json(),
            "patches": patches.iter().map(|p| json!({"path": p.path, "bytes": p.bytes, "added": p.added, "removed": p.removed, "listed": p.listed})).collect::<Vec<_>>(),
            "artifacts": artifacts.iter().map(|(p, b)| json!({"path": p, "bytes": b})).collect::<Vec<_>>(),
            "logLines": log_lines,
        });
        println!("{}", js_json::to_string(&out));
        return Ok(ExitCode::SUCCESS);
    }
    let m = &bundle.manifest;
    println!(
        "Bundle     {}",
        inert(&bundle.bundle_path.display().to_string())
    );
    println!("Status     {}", m.status.as_str());
    println!(
        "Run id     {}",
        inert(m.run_id.as_deref().unwrap_or("(none)"))
    );
    println!(
        "Size       {} ({} bytes)",
        human_bytes(bundle.bundle_size_bytes),
        bundle.bundle_size_bytes
    );
    match &m.outputs {
        Some(v) => println!("Outputs    {}", preview(v, 200)),
        None => println!("Outputs    (none)"),
    }
    let (added, removed) = patches
        .iter()
        .fold((0, 0), |(a, r), p| (a + p.added, r + p.removed));
    println!("Patches    {} files, +{added} -{removed}", patches.len());
    for p in patches.iter().take(LIST_MAX) {
        println!(
            "  {:<48} {:>10}  +{} -{}{}",
            name(&p.path),
            human_bytes(p.bytes),
            p.added,
            p.removed,
            if p.listed { "" } else { "  (not in manifest)" }
        );
    }
    if patches.len() > LIST_MAX {
        println!("  … and {} more", patches.len() - LIST_MAX);
    }
    let missing: Vec<String> = bundle
        .manifest_patch_files()
        .into_iter()
        .filter(|l| !bundle.patch_files.contains(l))
        .collect();
    for m in missing.iter().take(LIST_MAX) {
        println!("  {:<48} (in manifest, no such patch file)", name(m));
    }
    let total_artifacts: u64 = artifacts.iter().map(|(_, b)| b).sum();
    println!(
        "Artifacts  {} files, {}",
        artifacts.len(),
        human_bytes(total_artifacts)
    );
    for (p, b) in artifacts.iter().take(LIST_MAX) {
        println!("  {:<48} {:>10}", name(p), human_bytes(*b));
    }
    if artifacts.len() > LIST_MAX {
        println!("  … and {} more", artifacts.len() - LIST_MAX);
    }
    match log_lines {
        Some(n) => println!("Log        logs/stream.ndjson, {n} lines"),
        None => println!("Log        (none)"),
    }
    if let Some(d) = m.diff_bundle() {
        match d {
            Ok(d) => println!(
                "DiffBundle seq {}, base {}, {} files",
                d.seq,
                inert(&d.base_ref),
                d.patches.len()
            ),
            Err(e) => println!(
                "DiffBundle (not in the documented shape: {})",
                inert(&e.to_string())
            ),
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_lines_skip_file_headers() {
        let patch = "--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n-old\n+new\n+more\n context\n";
        assert_eq!(count_diff_lines(patch), (2, 1));
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human_bytes(12), "12 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
    }
}
