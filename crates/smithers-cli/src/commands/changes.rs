//! The changes of a bundle as the commands show them: its patches and file changes, its
//! patch series and commits, its log's and change notes, and the stat lines of a summary.

use std::path::Path;

use anyhow::Context as _;
use serde_json::{json, Value};
use smithers_orchestrator::{BundleInspector, BundleValidator};
use smithers_store::PatchRecord;

use crate::output::{inert, name, Coded};

/// One file's change, for summaries.
#[derive(Debug, Clone)]
pub struct FileChange {
    pub path: String,
    pub operation: &'static str,
    pub added: usize,
    pub removed: usize,
    pub binary: bool,
    /// For a deletion and an addition of the same content (git's exact rename): the other
    /// path. The patches still carry a deletion and an addition; this is how they are shown.
    pub renamed: Option<String>,
}

impl FileChange {
    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "path": self.path,
            "operation": self.operation,
            "added": self.added,
            "removed": self.removed,
            "binary": self.binary,
        });
        if let Some(other) = &self.renamed {
            let key = if self.operation == "add" {
                "renamedFrom"
            } else {
                "renamedTo"
            };
            v[key] = json!(other);
        }
        v
    }
}

/// The parsed patches of a bundle (validated first: a bundle waiting on disk may have been
/// tampered with), in bundle order.
pub fn bundle_patches(bundle_path: &Path) -> anyhow::Result<Vec<smithers_patch::FilePatch>> {
    bundle_contents(bundle_path).map(|(patches, _)| patches)
}

/// [`bundle_patches`] and the bundle's `changeNotes`, from one validation.
pub fn bundle_contents(
    bundle_path: &Path,
) -> anyhow::Result<(Vec<smithers_patch::FilePatch>, smithers_bundle::ChangeNotes)> {
    let bundle = BundleValidator
        .inspect(bundle_path)
        .map_err(anyhow::Error::new)?;
    let mut out = Vec::new();
    for rel in &bundle.patch_files {
        let path = bundle.bundle_path.join(rel);
        let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        let text = String::from_utf8_lossy(&bytes);
        out.extend(smithers_patch::parse_patch(&text).coded()?);
    }
    Ok((out, bundle.change_notes))
}

/// The bundle's `git/series.patch` (what the commits leave of the files they leave
/// otherwise than the patches), read through no link and bounded; `None` without one.
fn read_series_patch(bundle_path: &Path) -> Option<Vec<u8>> {
    use std::io::Read;
    let beneath = smithers_paths::Beneath::open(bundle_path).ok()?;
    let file = beneath
        .open_read(Path::new(smithers_bundle::SERIES_PATCH_FILE))
        .ok()?;
    let mut bytes = Vec::new();
    file.take(smithers_bundle::MAX_SERIES_PATCH_BYTES)
        .read_to_end(&mut bytes)
        .ok()?;
    Some(bytes)
}

/// [`read_series_patch`], rendered for the review: a diff with the review's findings (files
/// the host runs, control characters), inert; bytes that are not UTF-8 are shown escaped
/// line by line. `None` when the bundle has none.
pub fn render_series_patch(
    bundle_path: &Path,
    hooks_dirs: &[String],
    color: bool,
) -> Option<String> {
    let bytes = read_series_patch(bundle_path)?;
    let parsed = std::str::from_utf8(&bytes)
        .ok()
        .and_then(|t| smithers_patch::parse_patch(t).ok());
    Some(match parsed {
        Some(patches) => {
            let shown = smithers_patch::PatchReview::new(&patches, None);
            let findings = shown.findings(hooks_dirs);
            shown.render(&smithers_patch::ReviewOptions { color }, &findings)
        }
        None => escaped_lines(&bytes),
    })
}

/// Bytes shown line by line with everything that is not plain text escaped.
fn escaped_lines(bytes: &[u8]) -> String {
    bytes
        .split_inclusive(|b| *b == b'\n')
        .map(|l| smithers_terminal::escape_bytes(l, smithers_terminal::Inert::BODY) + "\n")
        .collect()
}

/// [`read_series_patch`] for `--json`: `{diff, exact, findings}` (`diff` the patch text as
/// it is when it is UTF-8, else escaped with `exact: false`), or `Null` without one.
pub fn series_patch_json(bundle_path: &Path, hooks_dirs: &[String]) -> Value {
    let Some(bytes) = read_series_patch(bundle_path) else {
        return Value::Null;
    };
    match std::str::from_utf8(&bytes) {
        Ok(text) => {
            let findings = smithers_patch::parse_patch(text)
                .ok()
                .map(|patches| {
                    let shown = smithers_patch::PatchReview::new(&patches, None);
                    serde_json::to_value(shown.findings(hooks_dirs)).unwrap_or(Value::Null)
                })
                .unwrap_or(Value::Null);
            json!({ "diff": text, "exact": true, "findings": findings })
        }
        Err(_) => json!({ "diff": escaped_lines(&bytes), "exact": false, "findings": Value::Null }),
    }
}

/// What the bundle's log says happened to the step's result and output (a result file that
/// was refused, a stream cut off at a cap, egress records past their bound): at most 20
/// records, read through no link, a bounded line at a time.
pub fn log_notes(bundle_path: &Path) -> Vec<Value> {
    use std::io::{BufRead, Read};
    const MAX_LINE: u64 = 1 << 20;
    let Ok(beneath) = smithers_paths::Beneath::open(bundle_path) else {
        return Vec::new();
    };
    let Ok(file) = beneath.open_read(Path::new("logs/stream.ndjson")) else {
        return Vec::new();
    };
    let mut reader = std::io::BufReader::new(file);
    let mut out = Vec::new();
    let mut buf = Vec::new();
    while out.len() < 20 {
        buf.clear();
        match Read::take(&mut reader, MAX_LINE + 1).read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) if buf.len() as u64 > MAX_LINE => {
                let mut rest = Vec::new();
                let _ = reader.read_until(b'\n', &mut rest);
                continue;
            }
            Ok(_) => {}
        }
        let Ok(record) = serde_json::from_slice::<Value>(&buf) else {
            continue;
        };
        if [
            "resultRejected",
            "outputTruncated",
            "egressRecordsDropped",
            "logCut",
        ]
        .contains(&record["type"].as_str().unwrap_or(""))
        {
            out.push(record);
        }
    }
    out
}

/// The bundle's `changeNotes`; empty when the bundle has none or no longer validates
/// (reading its patches says why).
pub fn bundle_notes(bundle_path: &Path) -> smithers_bundle::ChangeNotes {
    BundleValidator
        .inspect(bundle_path)
        .map(|b| b.change_notes)
        .unwrap_or_default()
}

/// Adds the bundle's `changeNotes` (host-changed bases, left-out changes) to the review's
/// findings.
pub fn add_change_notes(
    findings: &mut smithers_patch::ReviewFindings,
    notes: &smithers_bundle::ChangeNotes,
) {
    findings.host_changed = notes.host_changed.clone();
    findings.left_out = notes
        .left_out
        .iter()
        .map(|l| smithers_patch::RiskyPath {
            path: l.path.clone(),
            reason: l.reason.clone(),
        })
        .collect();
    findings.left_out_unlisted = notes.left_out_unlisted;
}

/// The step's commits as the review lists them: the branch, then each commit oldest first
/// (short id, subject, author, date, its files' +/-), everything from the step made inert.
pub fn render_commits(
    series: &smithers_bundle::CommitSeries,
    hooks_dirs: &[String],
    bold: &str,
    reset: &str,
) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{bold}{} commit(s) on {}{reset}, on top of {} (accept adds them and moves the branch; what they leave at their tip is exactly the patches below, checked when the step ended and again at accept)",
        series.commits.len(),
        inert(series.branch.as_deref().unwrap_or("a detached HEAD")),
        &series.base[..12.min(series.base.len())]
    );
    let mut runs = 0usize;
    for c in &series.commits {
        let _ = writeln!(
            out,
            "  {} {}",
            &c.oid[..12.min(c.oid.len())],
            inert(&c.subject)
        );
        let _ = writeln!(
            out,
            "      {} <{}>, {}",
            inert(&c.author),
            inert(&c.author_email),
            inert(&c.author_date)
        );
        // The body is part of what goes into the history: shown, inert.
        for line in c.body.lines().filter(|l| !l.trim().is_empty()) {
            let _ = writeln!(out, "      | {}", inert(line));
        }
        for f in &c.files {
            let stat = match (f.added, f.removed) {
                (Some(a), Some(r)) => format!("+{a} -{r}"),
                _ => "binary".to_string(),
            };
            let _ = writeln!(
                out,
                "      {stat:>12}  {}",
                smithers_terminal::quote_path(&f.path)
            );
            if let Some(why) = smithers_patch::runs_on_host(&f.path, hooks_dirs) {
                runs += 1;
                let _ = writeln!(
                    out,
                    "      {:>12}  ^ runs on the host: {}",
                    "!",
                    inert(&why)
                );
            }
        }
        if c.files_unlisted > 0 {
            let _ = writeln!(out, "      ... and {} more file(s)", c.files_unlisted);
        }
    }
    if runs > 0 {
        let _ = writeln!(
            out,
            "{bold}warning:{reset} {runs} file(s) the host runs by itself are in the commits' history (marked !); a later checkout, revert or push of those commits brings them back"
        );
    }
    out
}

/// The bundle's `changeNotes` as JSON, for `run --json` and `show --json`: what the bundle
/// left out, and why, is never only in a log.
pub fn change_notes_json(notes: &smithers_bundle::ChangeNotes) -> Value {
    serde_json::to_value(notes).unwrap_or_else(|_| json!({}))
}

/// Per-file +/- statistics of parsed patches.
pub fn changes(patches: &[smithers_patch::FilePatch]) -> Vec<FileChange> {
    changes_from(patches, smithers_patch::diff_stats(patches))
}

/// [`changes`] with the statistics already made (a review's, read against the host tree).
pub fn changes_from(
    patches: &[smithers_patch::FilePatch],
    stats: Vec<smithers_patch::FileStat>,
) -> Vec<FileChange> {
    // The first section of each path (a type change has two), found through a map: a search
    // of `patches` per path made 40k changed files take seconds (quadratic).
    let mut first: std::collections::HashMap<&str, &smithers_patch::FilePatch> =
        std::collections::HashMap::with_capacity(patches.len());
    for p in patches {
        first.entry(p.path.as_str()).or_insert(p);
    }
    let mut out = stats
        .into_iter()
        .map(|s| {
            let operation = first
                .get(s.path.as_str())
                .map(|p| match p.operation() {
                    smithers_patch::Operation::Add => "add",
                    smithers_patch::Operation::Modify => "modify",
                    smithers_patch::Operation::Delete => "delete",
                })
                .unwrap_or("modify");
            FileChange {
                path: s.path,
                operation,
                added: s.added,
                removed: s.removed,
                binary: s.binary.is_some(),
                renamed: None,
            }
        })
        .collect::<Vec<_>>();
    mark_renames(&mut out, patches);
    out
}

/// The per-file changes of a bundle, or of the recorded patches when the bundle is gone.
pub fn changes_of(bundle_path: Option<&str>, recorded: &[PatchRecord]) -> Vec<FileChange> {
    if let Some(p) = bundle_path {
        if let Ok(patches) = bundle_patches(Path::new(p)) {
            return changes(&patches);
        }
    }
    recorded
        .iter()
        .map(|r| FileChange {
            path: r.path.clone(),
            operation: r.operation.as_str(),
            added: 0,
            removed: 0,
            binary: false,
            renamed: None,
        })
        .collect()
}

/// Pairs each deleted file with an added file of the same content (the same blob id, and
/// each used once), as git's exact rename detection does, so that a move is shown as one.
fn mark_renames(changes: &mut [FileChange], patches: &[smithers_patch::FilePatch]) {
    use smithers_patch::Operation;
    let mut deleted: std::collections::HashMap<&str, Vec<&str>> = Default::default();
    for p in patches
        .iter()
        .filter(|p| p.operation() == Operation::Delete)
    {
        if let Some(oid) = p.old_oid.as_deref() {
            deleted.entry(oid).or_default().push(p.path.as_str());
        }
    }
    let mut pairs: Vec<(String, String)> = Vec::new();
    for p in patches.iter().filter(|p| p.operation() == Operation::Add) {
        let from = p
            .new_oid
            .as_deref()
            .and_then(|oid| deleted.get_mut(oid))
            .and_then(Vec::pop);
        if let Some(from) = from {
            pairs.push((from.to_string(), p.path.clone()));
        }
    }
    let index: std::collections::HashMap<&str, usize> = changes
        .iter()
        .enumerate()
        .map(|(i, c)| (c.path.as_str(), i))
        .collect();
    let found: Vec<(usize, usize, String, String)> = pairs
        .into_iter()
        .filter_map(|(from, to)| {
            Some((
                *index.get(from.as_str())?,
                *index.get(to.as_str())?,
                from,
                to,
            ))
        })
        .collect();
    for (i, j, from, to) in found {
        if changes[i].operation == "delete" && changes[j].operation == "add" {
            changes[i].renamed = Some(to);
            changes[j].renamed = Some(from);
        }
    }
}

/// `git diff --stat`-like lines plus the summary line; names quoted as git quotes them, so a
/// name cannot break a line or forge one.
pub fn stat_lines(changes: &[FileChange]) -> Vec<String> {
    let names: Vec<String> = changes.iter().map(|c| name(&c.path)).collect();
    let w = names.iter().map(|n| n.chars().count()).max().unwrap_or(0);
    let mut lines = Vec::new();
    let (mut ins, mut del) = (0, 0);
    for (c, shown) in changes.iter().zip(&names) {
        ins += c.added;
        del += c.removed;
        let pad = w - shown.chars().count();
        let tag = match (c.operation, &c.renamed) {
            ("add", Some(from)) => format!(" (renamed from {})", name(from)),
            ("delete", Some(to)) => format!(" (renamed to {})", name(to)),
            ("add", None) => " (new)".to_string(),
            ("delete", None) => " (deleted)".to_string(),
            _ => String::new(),
        };
        if c.binary {
            lines.push(format!("{shown}{} | Bin{tag}", " ".repeat(pad)));
        } else {
            let bar_total = (c.added + c.removed).max(1);
            let scale = |n: usize| {
                if bar_total > 30 {
                    n * 30 / bar_total
                } else {
                    n
                }
            };
            lines.push(format!(
                "{shown}{} | {:>3} {}{}{tag}",
                " ".repeat(pad),
                c.added + c.removed,
                "+".repeat(scale(c.added)),
                "-".repeat(scale(c.removed)),
            ));
        }
    }
    lines.push(format!(
        "{} file{} changed, {ins} insertion{}(+), {del} deletion{}(-)",
        changes.len(),
        if changes.len() == 1 { "" } else { "s" },
        if ins == 1 { "" } else { "s" },
        if del == 1 { "" } else { "s" },
    ));
    lines
}

/// The outputs recorded in a bundle's manifest (`README.md` is JSON), if readable.
pub fn bundle_outputs(bundle_path: &str) -> Option<Value> {
    BundleValidator
        .inspect(Path::new(bundle_path))
        .ok()
        .and_then(|b| b.outputs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_summary() {
        let lines = stat_lines(&[
            FileChange {
                path: "app.py".into(),
                operation: "modify",
                added: 1,
                removed: 1,
                binary: false,
                renamed: None,
            },
            FileChange {
                path: "NOTES.md".into(),
                operation: "add",
                added: 2,
                removed: 0,
                binary: false,
                renamed: None,
            },
        ]);
        assert_eq!(lines[0], "app.py   |   2 +-");
        assert_eq!(lines[1], "NOTES.md |   2 ++ (new)");
        assert_eq!(lines[2], "2 files changed, 3 insertions(+), 1 deletion(-)");
    }

    /// A name with a newline and fake stat text is one quoted line.
    #[test]
    fn stat_lines_quote_forged_names() {
        let lines = stat_lines(&[FileChange {
            path: "x\n y.txt | 9 +++++++++\x1b[1A".into(),
            operation: "add",
            added: 1,
            removed: 0,
            binary: false,
            renamed: None,
        }]);
        assert_eq!(
            lines,
            [
                "\"x\\n y.txt | 9 +++++++++\\033[1A\" |   1 + (new)",
                "1 file changed, 1 insertion(+), 0 deletions(-)"
            ]
        );
    }
}
